"""Command line of the companion package: ``python -m companion`` (or ``companion``).

``--help`` explains every option of ``models``, ``experiments``, ``run``, ``show`` and ``run-suite``
(:func:`~companion.suites.run_suite`); the README and the chapter *Running experiments* show them at work.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import typing
import warnings

from companion import __version__, experiments, suites
from companion._aliases import renamed_getattr as _renamed_getattr

__all__ = ["main"]
__getattr__ = _renamed_getattr("companion.__main__")  # 0.1 names made private (companion._aliases)

_EPILOG = """\
Results are written as <out>/<experiment>/<config hash>.json + .npz; without --out, to the cache:
results/cache/ in a clone of the repository (git-ignored), else ~/.cache/companion/results/cache/
($COMPANION_RESULTS/cache if that is set).  The stored Results that chapters read are installed with
the package (companion/data/results/); in a clone, write new ones there with --out and commit them.
A Result whose config hash or schema does not match, or whose files are damaged (checksums in the
JSON), is recomputed, never reused; run checks that --out is writable before computing anything.
Progress bars are tqdm's (TQDM_DISABLE=1 or --quiet hides them).  The 'companion' logger writes to
stderr: warnings by default, -v progress messages (INFO), -vv details (DEBUG), --quiet errors only.
"""


def _verbosity_options(parser: argparse.ArgumentParser, top: bool) -> None:
    # On the top-level parser and on every command (`-v run ...` and `run ... -v`); a command's
    # copies default to SUPPRESS, so they never overwrite what came before the command.
    parser.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                        help="log more: -v progress messages (INFO), -vv details (DEBUG)")
    parser.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="errors only and no progress bars")


def _build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="python -m companion", description="Run the real-model experiments of the book and manage "
        "their Results.", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"companion {__version__}",
                        help="print the version of the companion package and exit")
    _verbosity_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p_models = sub.add_parser("models", help="list the offline models and example hub ids",
                              description="List the models companion.transformers.models.load accepts: the offline models "
                                          "(installed with the book) and examples of hub ids (need network).")
    p_models.add_argument("--json", action="store_true", help="print the list as JSON")

    p_exps = sub.add_parser("experiments", help="list the experiments and their options with defaults",
                            description="List every registered experiment with its options (dataclass fields), "
                                        "their types and default values.")
    p_exps.add_argument("names", nargs="*", metavar="NAME", help="show only these experiments (default: all)")
    p_exps.add_argument("--json", action="store_true", help="print the list as JSON")

    p_run = sub.add_parser(
        "run", help="run an experiment and write its Result",
        description="Run the experiment NAME with its default config changed by --model and --set, "
                    "then write the Result (JSON + .npz) keyed by the config's hash.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_run.add_argument("name", help="experiment name (see: python -m companion experiments)")
    p_run.add_argument("--model", help="model to run on: an offline model or a hub id (same as --set model=...)")
    p_run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config option, typed by the dataclass field (repeatable); "
                            "tuples as 1,5,20 or [1,5,20]; booleans as true/false; e.g. --set n_texts=512")
    p_run.add_argument("--device", default=None,
                       help="cpu, cuda, cuda:N or mps (default: CUDA if available, then MPS, then CPU)")
    p_run.add_argument("--out", default=None, metavar="DIR",
                       help="results folder (default: the cache folder below; in a clone, use "
                            "companion/data/results for Results to commit)")
    p_run.add_argument("--force", action="store_true", help="recompute even if a valid Result is stored")
    p_run.add_argument("--dry-run", action="store_true",
                       help="print the resolved config, its hash and the output path, and run nothing")

    p_show = sub.add_parser("show", help="summarise a stored Result", description=(
        "Print the metadata of a Result JSON file and the shapes of its arrays, after checking the "
        "pair (fields, shapes, dtypes, checksums); a damaged Result is an error (exit code 2)."))
    p_show.add_argument("path", help="path of the Result's .json file")

    p_suite = sub.add_parser(
        "run-suite", help="run a suite of configurations, one submitit job each (local or SLURM)",
        description="Submit one job per configuration of SUITE through submitit (see --executor).  "
                    "Configurations whose valid Result is stored are skipped, so running a suite again "
                    "resumes it.  Ends with a summary; the exit code is 1 if any configuration failed.",
        epilog="SUITE is a named suite (" + ", ".join(suites.NAMED_SUITES) + ") or a JSON/YAML file: a list "
               "of {experiment: NAME, config: {field: value}, label: optional}.  See companion.suites.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p_suite.add_argument("suite", nargs="?", help="a named suite or a suite file (.json, .yaml)")
    p_suite.add_argument("--list", action="store_true",
                         help="print the named suites, or the configurations of SUITE, and run nothing")
    p_suite.add_argument("--executor", choices=("local", "slurm", "debug"), default="local",
                         help="local subprocesses (default), a SLURM job array (from the login node), "
                              "or this process (pdb on failure)")
    p_suite.add_argument("--partition", default=None, help="SLURM partition (sbatch --partition)")
    p_suite.add_argument("--gpus", type=int, default=0, help="GPUs per job (default 0)")
    p_suite.add_argument("--time", default="60", metavar="LIMIT",
                         help="time limit per job: minutes (90) or h:mm[:ss] (default 60 minutes)")
    p_suite.add_argument("--cpus", type=int, default=None, help="CPUs per job")
    p_suite.add_argument("--mem-gb", type=float, default=None, help="memory per job in GB")
    p_suite.add_argument("--parallel", type=int, default=None,
                         help="jobs at a time (SLURM array parallelism; local: default 1)")
    p_suite.add_argument("--slurm-arg", dest="slurm_args", action="append", default=[], metavar="KEY=VALUE",
                         help="another sbatch option, e.g. --slurm-arg account=myproject (repeatable)")
    p_suite.add_argument("--device", default=None,
                         help="device for every job (default: CUDA if the job sees a GPU, else CPU)")
    p_suite.add_argument("--out", default=None, metavar="DIR",
                         help="results folder (as for run; on a cluster, a shared file system)")
    p_suite.add_argument("--logs", default=None, metavar="DIR",
                         help="submitit's folder for job files and logs "
                              "(default: ~/.cache/companion/suite-logs, private)")
    p_suite.add_argument("--force", action="store_true",
                         help="run every configuration, even those with a stored Result")
    p_suite.add_argument("--no-wait", action="store_true",
                         help="submit and exit; once the jobs have ended, run the suite again to collect "
                              "(a job still running would be submitted twice)")
    for p in (p_models, p_exps, p_run, p_show, p_suite):
        _verbosity_options(p, top=False)
    return parser


def _parse_overrides(items: list[str], model: str | None) -> dict:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        values[key.strip()] = value
    if model is not None:
        values["model"] = model
    return values


def _type_name(tp) -> str:
    if typing.get_origin(tp) is None and hasattr(tp, "__name__"):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def _cmd_models(args) -> int:
    from companion.transformers import models

    rows = models.available_models()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':24s} {'source':8s} {'installed':9s} {'norm':17s} {'L':>3s} {'d':>5s}  description")
    for r in rows:
        inst = {True: "yes", False: "NO", None: "-"}[r["installed"]]
        norm = f"{r['placement']}-{r['norm']}"
        L, d = ("" if r[key] is None else str(r[key]) for key in ("n_layers", "d_model"))
        print(f"{r['name']:24s} {r['source']:8s} {inst:9s} {norm:17s} {L:>3s} {d:>5s}  {r['description']}")
        if r["installed"] is False:
            print(f"{'':24s} install with: {r['install']}")
    print("\nAny other Hugging Face hub id works when this machine has network.")
    return 0


def _cmd_experiments(args) -> int:
    out = []
    for name in args.names or experiments.experiment_names():
        cls = experiments.get_experiment(name)
        hints = typing.get_type_hints(cls)
        fields = [{"name": f.name, "type": _type_name(hints[f.name]), "default": f.default}
                  for f in dataclasses.fields(cls)]
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        out.append({"name": name, "schema": cls.schema, "summary": doc, "options": fields})
    if args.json:
        print(json.dumps(out, indent=1, default=list))
        return 0
    for e in out:
        print(f"{e['name']}  (schema {e['schema']}): {e['summary']}")
        for f in e["options"]:
            default = list(f["default"]) if isinstance(f["default"], tuple) else f["default"]
            print(f"    {f['name']:16s} {f['type']:18s} default {default!r}")
    return 0


def _cmd_run(args) -> int:
    cls = experiments.get_experiment(args.name)
    config = experiments.make_config(cls, _parse_overrides(args.overrides, args.model))
    target = experiments.result_path(config, args.out)
    if args.dry_run:
        print(json.dumps({"experiment": args.name, "config": dataclasses.asdict(config),
                          "config_hash": experiments.config_hash(config), "path": str(target)},
                         indent=1, default=list))
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("always", experiments.StaleResultWarning)
        result = experiments.run_cached(config, device=args.device, results_dir=args.out, force=args.force,
                                        progress=not args.quiet)  # tqdm also honours TQDM_DISABLE
    print(f"{result.name} {result.config_hash}: {result.path}")
    print(f"device {result.device}, wall time {result.wall_time:.1f} s, arrays "
          + ", ".join(f"{k}{list(v.shape)}" for k, v in result.arrays.items()))
    return 0


def _cmd_show(args) -> int:
    r = experiments.load_result(args.path)
    print(f"{r.name}  hash {r.config_hash}  schema {r.schema}  created {r.created}")
    print(f"device {r.device}  wall time {r.wall_time:.1f} s")
    print("versions " + ", ".join(f"{k} {v}" for k, v in r.versions.items() if k != "platform"))
    print("config " + json.dumps(r.config))
    for k, v in r.arrays.items():
        print(f"  {k:14s} {str(v.dtype):8s} {list(v.shape)}")
    for k, v in r.scalars.items():
        print(f"  {k:14s} {v!r}")
    return 0


def _cmd_run_suite(args) -> int:
    if args.suite is None:
        if not args.list:
            raise ValueError("name a suite (" + ", ".join(suites.NAMED_SUITES) + ") or a suite file")
        for name, (text, _) in suites.NAMED_SUITES.items():
            print(f"{name:14s} {text}")
        return 0
    entries = suites.load_suite(args.suite)
    if args.list:
        for e in entries:
            print(f"{e.label:28s} {e.experiment:20s} {e.config_hash}  {json.dumps(dataclasses.asdict(e.config))}")
        return 0
    report = suites.run_suite(
        entries, executor=args.executor, results_dir=args.out, device=args.device, log_folder=args.logs,
        partition=args.partition, gpus=args.gpus, time_limit=args.time, cpus=args.cpus, mem_gb=args.mem_gb,
        parallel=args.parallel, slurm_args=_parse_overrides(args.slurm_args, None), force=args.force,
        wait=not args.no_wait, progress=not args.quiet)
    print(report.summary())
    return 0 if report.ok else 1


@contextlib.contextmanager
def _logging(verbose: int, quiet: bool):
    """Log 'companion' to stderr while a command runs; undone on return, as main() may run again."""
    log = logging.getLogger("companion")
    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = (log.level, log.propagate)
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    saved_tqdm = os.environ.get("TQDM_DISABLE")
    if quiet:
        os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
        if quiet:
            if saved_tqdm is None:
                os.environ.pop("TQDM_DISABLE", None)
            else:
                os.environ["TQDM_DISABLE"] = saved_tqdm


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run the command.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success; 2 for a bad argument or option value, an unwritable ``--out`` folder or a
        damaged Result file; 1 for another operating-system error (the reason on stderr, no
        traceback).
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    handlers = {"models": _cmd_models, "experiments": _cmd_experiments, "run": _cmd_run, "show": _cmd_show,
                "run-suite": _cmd_run_suite}
    with _logging(args.verbose, args.quiet):
        try:
            return handlers[args.command](args)
        except (ValueError, TypeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except ImportError as exc:  # an optional dependency (submitit for run-suite)
            print(f"error: {exc}; install the extra: pip install 'fading-outliers-companion[suite]'",
                  file=sys.stderr)
            return 2
        except OSError as exc:  # e.g. the disk filled up while a Result was written
            print(f"error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
