"""Experiment suites: many configurations, one submitit job each (local, SLURM or debug executor).

Each job calls :func:`~companion.experiments.run_cached`, so its Result lands in the
(concurrency-safe) store; configurations whose valid Result is stored are skipped, so running a
suite again resumes it.  Command line: ``python -m companion run-suite``.  The suite file format
(JSON or YAML) and the named suites: chapter :doc:`/book/running_experiments`, section *Suites*.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import stat
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from companion import experiments as xp

__all__ = ["EXECUTORS", "NAMED_SUITES", "SuiteEntry", "JobOutcome", "SuiteReport", "load_suite",
           "run_suite"]

logger = logging.getLogger(__name__)

#: submitit's executors by the names ``--executor`` accepts.
EXECUTORS = ("local", "slurm", "debug")


@dataclass(frozen=True)
class SuiteEntry:
    """One configuration of a suite: a label (unique within the suite) and a registered config."""

    label: str  #: A name for the summary.
    config: Any  #: A registered experiment's config.

    @property
    def experiment(self) -> str:
        """The experiment's registered name."""
        return type(self.config).experiment_name

    @property
    def config_hash(self) -> str:
        """The config hash, the key of its Result."""
        return xp.config_hash(self.config)


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one entry of a suite."""

    entry: SuiteEntry  #: The entry.
    #: ``"skipped"`` (a valid Result was stored), ``"done"``, ``"failed"`` (the job raised or did not
    #: complete) or ``"submitted"`` (not waited for).
    status: str
    path: str | None = None  #: The Result's JSON file (skipped or done).
    job_id: str | None = None  #: submitit's job id (names its logs).
    error: str | None = None  #: The job's exception line, for a failure.
    log: str | None = None  #: The job's error log (submitit's ``<job id>_0_log.err``), for a failure.
    wall_time: float | None = None  #: The Result's wall time in seconds.


@dataclass
class SuiteReport:
    """The outcome of :func:`run_suite`, entry by entry, in the suite's order."""

    outcomes: list[JobOutcome] = field(default_factory=list)  #: One JobOutcome per entry.
    #: submitit's folder (pickled jobs, ``<job id>_log.out`` / ``.err``); None if nothing ran.
    log_folder: Path | None = None

    def count(self, status: str) -> int:
        """Number of entries with this status."""
        return sum(o.status == status for o in self.outcomes)

    @property
    def failed(self) -> list[JobOutcome]:
        """The failed entries."""
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def ok(self) -> bool:
        """True when no entry failed."""
        return not self.failed

    def summary(self) -> str:
        """A table, one line per entry, then the counts; failures repeat their error."""
        width = max([len(o.entry.label) for o in self.outcomes] + [5])
        lines = [f"{'label':{width}s}  {'experiment':20s} {'hash':16s}  {'status':9s}  detail"]
        for o in self.outcomes:
            if o.status == "failed":
                detail = (o.error or "failed") + (f"  (log: {o.log})" if o.log else "")
            elif o.status == "submitted":
                detail = f"job {o.job_id}"
            else:
                detail = o.path or ""
                if o.status == "done" and o.wall_time is not None:
                    detail = f"{o.wall_time:.1f} s  {detail}"
            lines.append(f"{o.entry.label:{width}s}  {o.entry.experiment:20s} {o.entry.config_hash:16s}  "
                         f"{o.status:9s}  {detail}")
        counts = ", ".join(f"{self.count(s)} {s}" for s in ("skipped", "done", "submitted", "failed")
                           if self.count(s))
        lines.append(f"{len(self.outcomes)} configurations: {counts or 'none'}")
        if self.failed and self.log_folder is not None:
            lines.append(f"logs of the failed jobs: {self.log_folder}/<job id>_log.err")
        return "\n".join(lines)


def _entries_from_configs(configs) -> list[SuiteEntry]:
    """Entries from ``label -> config`` or a sequence of configs (labelled ``<experiment>-<hash>``)."""
    items = list(configs.items()) if isinstance(configs, dict) else [(None, c) for c in configs]
    entries = []
    for label, config in items:
        if not hasattr(type(config), "experiment_name"):
            raise TypeError(f"suite entries must be registered experiment configs, got {type(config).__name__}")
        if label is None:
            label = f"{type(config).experiment_name}-{xp.config_hash(config)[:8]}"
        entries.append(SuiteEntry(str(label), config))
    labels = [e.label for e in entries]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ValueError(f"suite labels must be unique; repeated: {', '.join(dupes)}")
    return entries


def _smoke() -> list[SuiteEntry]:
    tiny = dict(d_model=8, max_depth=2, depths=(2,), gains=(1.0,), blocks=("mlp",), placements=("pre",),
                batch=1, tokens=4)
    return _entries_from_configs({
        "random-pre": xp.make_config("framework_random", tiny),
        "random-post": xp.make_config("framework_random", {**tiny, "placements": ("post",)}),
        "minilm-4-texts": xp.make_config("channel_statistics", model="minilm-l6", n_texts=4, batch_size=2,
                                         thresholds=(1.0, 5.0))})


def _injection_gpu() -> list[SuiteEntry]:
    from companion.experiments.injection_window import GPU_CONFIGS

    return _entries_from_configs(dict(GPU_CONFIGS))


def _framework_gpu() -> list[SuiteEntry]:
    from companion.experiments.framework_random import GPU_RANDOM
    from companion.experiments.framework_trained import GPU_TRAINED

    return _entries_from_configs({"framework-random": GPU_RANDOM, "framework-trained": GPU_TRAINED})


#: Suites known by name: ``name -> (description, builder)``.
NAMED_SUITES: dict[str, tuple[str, Callable[[], list[SuiteEntry]]]] = {
    "smoke": ("three CPU-sized configurations (random stacks, MiniLM on 4 texts); seconds", _smoke),
    "injection-gpu": ("injection_window on 13 hub models (GPT-2, Pythia, SmolLM2-1.7B, Llama, BERT); "
                      "CUDA and network", _injection_gpu),
    "framework-gpu": ("the large random-stack and trained-LM framework configurations; CUDA", _framework_gpu),
}


def _read_file(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - PyYAML is in the 'suite' extra
            raise ValueError(f"{path}: reading YAML needs PyYAML (pip install PyYAML), or write JSON") from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); YAML files need the suffix .yaml or .yml") from exc


def load_suite(source: str | Path) -> list[SuiteEntry]:
    """The entries of a suite file (JSON or YAML) or of a named suite (:data:`NAMED_SUITES`).

    Parameters
    ----------
    source : str or pathlib.Path
        A name in :data:`NAMED_SUITES`, or the path of a suite file: a list of ``{experiment: NAME,
        config: {field: value}, label: optional}``, or a mapping with that list under ``configs``.

    Returns
    -------
    list of SuiteEntry
        One per configuration, in the suite's order.

    Raises
    ------
    ValueError
        If the name, file, an experiment or a field is unknown or malformed, or a label repeats.

    Examples
    --------
    >>> [e.label for e in load_suite("smoke")]
    ['random-pre', 'random-post', 'minilm-4-texts']
    """
    if isinstance(source, str) and source in NAMED_SUITES:
        return NAMED_SUITES[source][1]()
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"{source!r} is neither a named suite ({', '.join(NAMED_SUITES)}) nor a file")
    data = _read_file(path)
    if isinstance(data, dict):
        if "configs" not in data:
            raise ValueError(f"{path}: a suite mapping needs a 'configs' list")
        data = data["configs"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: the suite must be a non-empty list of configurations")
    configs: dict = {}
    for k, item in enumerate(data):
        where = f"{path}, entry {k}"
        if not isinstance(item, dict) or not isinstance(item.get("experiment"), str):
            raise ValueError(f"{where}: each entry needs 'experiment: NAME' (and optionally 'config', 'label')")
        unknown = set(item) - {"experiment", "config", "label"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; use experiment, config, label")
        overrides = item.get("config") or {}
        if not isinstance(overrides, dict):
            raise ValueError(f"{where}: 'config' must be a mapping of field: value")
        overrides = {key: tuple(v) if isinstance(v, list) else v for key, v in overrides.items()}
        try:
            config = xp.make_config(item["experiment"], overrides)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
        label = item.get("label") or f"{item['experiment']}-{xp.config_hash(config)[:8]}"
        if label in configs:
            raise ValueError(f"{where}: the label {label!r} repeats")
        configs[str(label)] = config
    return _entries_from_configs(configs)


def _parse_time(value) -> float:
    """A time limit in minutes from ``90``, ``"90"``, ``"1:30"`` (h:mm) or ``"1:30:00"`` (h:mm:ss).

    >>> _parse_time("1:30"), _parse_time("0:00:30"), _parse_time(45)
    (90.0, 0.5, 45.0)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        minutes = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d*)?", value.strip()):
        minutes = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+:\d{1,2}(:\d{1,2})?", value.strip()):
        parts = [int(p) for p in value.strip().split(":")]
        minutes = parts[0] * 60.0 + parts[1] + (parts[2] / 60 if len(parts) == 3 else 0)
    else:
        raise ValueError(f"time must be minutes (90) or h:mm[:ss] (1:30), got {value!r}")
    if not minutes > 0:
        raise ValueError(f"time must be positive, got {value!r}")
    return minutes


def _valid_result(config, results_dir) -> Path | None:
    """The path of a valid stored Result of ``config`` (where run_cached would find it), or None."""
    candidates = [Path(results_dir)] if results_dir is not None else [xp.stored_root(), xp.cache_root()]
    for base in candidates:
        path = xp.result_path(config, base)
        if not path.exists():
            continue
        try:
            stored = xp.load_result(path)
        except ValueError:
            continue
        if xp.stale_reason(stored, config) is None:
            return path
    return None


def _job(experiment: str, config: dict, results_dir: str | None, device: str | None, force: bool,
         progress: bool) -> dict:
    """What one submitit job runs (in its own process, or in this one for ``debug``)."""
    cfg = xp.make_config(experiment, config)
    logger.info("job: %s %s on %s", experiment, xp.config_hash(cfg), device or "auto")
    result = xp.run_cached(cfg, device=device, results_dir=results_dir, force=force, progress=progress)
    return {"path": str(result.path), "wall_time": result.wall_time, "device": result.device}


def _executor(kind: str, folder: Path, partition, gpus, minutes, cpus, mem_gb, parallel, slurm_args):
    import submitit

    params: dict[str, Any] = {"timeout_min": max(1, int(round(minutes))), "name": "companion-suite"}
    wanted = {"gpus_per_node": (gpus, int), "cpus_per_task": (cpus, int), "mem_gb": (mem_gb, float)}
    if kind == "slurm":
        wanted.update(slurm_partition=(partition, str), slurm_array_parallelism=(parallel, int),
                      slurm_additional_parameters=(slurm_args, dict))
    params.update({key: cast(value) for key, (value, cast) in wanted.items() if value})
    ex = submitit.AutoExecutor(folder=folder, cluster=kind)
    ex.update_parameters(**params)
    return ex


def run_suite(entries, executor: str = "local", results_dir: str | Path | None = None,
              device: str | None = None, log_folder: str | Path | None = None,
              partition: str | None = None, gpus: int = 0, time_limit="60", cpus: int | None = None,
              mem_gb: float | None = None, parallel: int | None = None, slurm_args: dict | None = None,
              force: bool = False, wait: bool = True, progress: bool = False,
              poll_s: float = 1.0) -> SuiteReport:
    """Submit one job per suite entry, skipping entries whose Result is stored, and wait.

    Parameters
    ----------
    entries : list of SuiteEntry, dict label -> config, or a suite name or file
        What to run (:func:`load_suite`).
    executor : {"local", "slurm", "debug"}, default "local"
        Subprocesses here (``parallel`` at a time); one SLURM job array (run it on the login
        node); or this process, one job after another (pdb opens on a failure).
    results_dir : path or None
        Result store (as ``--out``); None: the stored Results and the cache, saving into the cache.
    device : str or None
        Passed to every job (None: CUDA if the job sees a GPU, else CPU).
    log_folder : path or None
        The submitit folder, private to this user (job results are unpickled from it): created with
        mode 0700, refused if others can write in it.  Default ``$XDG_CACHE_HOME/companion/suite-logs``
        (``~/.cache/...``), outside any shared results store.
    partition, gpus, cpus, mem_gb : optional
        SLURM partition; GPUs, CPUs and memory (GB) per job.
    time_limit : minutes or "h:mm[:ss]", default "60"
        Per job (SLURM's ``--time``; the local executor kills a job after it).
    parallel : int or None
        Jobs at a time (SLURM array parallelism; local default 1).
    slurm_args : dict or None
        More sbatch options, e.g. ``{"account": "proj"}``.
    force : bool, default False
        Recompute entries with a valid stored Result too.
    wait : bool, default True
        False returns after submitting; run the suite again later to collect (a job still running
        would be submitted twice).
    progress : bool, default False
        The tqdm bars in each job's log and over the suite here.
    poll_s : float, default 1.0
        Seconds between checks on running jobs.

    Returns
    -------
    SuiteReport
        ``report.ok`` is False if any entry failed; ``report.summary()`` is a table.

    Raises
    ------
    TypeError, ValueError
        Entries that are not SuiteEntry objects (TypeError); a bad executor, time, ``parallel``, suite,
        results folder (unwritable) or log folder (others can write).
    ImportError
        If submitit is not installed (``pip install fading-outliers-companion[suite]``).
    """
    if isinstance(entries, (str, Path)):
        entries = load_suite(entries)
    elif isinstance(entries, dict):
        entries = _entries_from_configs(entries)
    entries = list(entries)
    if not all(isinstance(e, SuiteEntry) for e in entries):
        raise TypeError("entries must be SuiteEntry objects (see load_suite)")
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    minutes = _parse_time(time_limit)
    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise ValueError(f"parallel must be a positive integer, got {parallel!r}")
    store = Path(results_dir) if results_dir is not None else None
    folder = Path(log_folder) if log_folder is not None else _default_log_folder()

    outcomes: dict[int, JobOutcome] = {}
    todo: list[int] = []
    for k, entry in enumerate(entries):
        found = None if force else _valid_result(entry.config, store)
        if found is not None:
            logger.info("skip %s: its Result is stored at %s", entry.label, found)
            outcomes[k] = JobOutcome(entry, "skipped", path=str(found))
        else:
            todo.append(k)
    if todo:
        for k in todo:  # fail before submitting anything if a Result could not be written
            target = store if store is not None else xp.cache_root()
            xp.check_writable(target / entries[k].experiment)
        _private_folder(folder)
        ex = _executor(executor, folder, partition, gpus, minutes, cpus, mem_gb, parallel, slurm_args)
        wave = len(todo) if executor == "slurm" else (parallel or 1)
        bar = xp.progress_bar(len(todo), progress and wait, "suite")
        for start in range(0, len(todo), wave):
            chunk = todo[start:start + wave]
            with ex.batch():
                jobs = [ex.submit(_job, entries[k].experiment, dataclasses.asdict(entries[k].config),
                                  None if store is None else str(store), device, force, progress)
                        for k in chunk]
            for k, job in zip(chunk, jobs):
                logger.info("submitted %s as job %s", entries[k].label, job.job_id)
            if not wait:
                for k, job in zip(chunk, jobs):
                    outcomes[k] = JobOutcome(entries[k], "submitted", job_id=str(job.job_id))
                continue
            pending = dict(zip(chunk, jobs))
            while pending:
                for k, job in list(pending.items()):
                    if executor != "debug" and not job.done():
                        continue
                    del pending[k]
                    outcomes[k] = _collect(entries[k], job)
                    if bar is not None:
                        bar.update()
                if pending:
                    time.sleep(poll_s)
        if bar is not None:
            bar.close()
    report = SuiteReport([outcomes[k] for k in range(len(entries))], folder if todo else None)
    for o in report.failed:
        logger.warning("%s failed: %s", o.entry.label, o.error)
    return report


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")


def _error_line(text: str) -> str | None:
    """The exception line of a traceback inside submitit's error message (e.g. ``ValueError: ...``)."""
    found = [line.strip() for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return found[-1] if found else None


def _default_log_folder() -> Path:
    """``$XDG_CACHE_HOME/companion/suite-logs``, else ``~/.cache/companion/suite-logs``: this user's."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "companion" / "suite-logs"


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (mode 0700), or check that no other user can write in it (ValueError)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise ValueError(f"the suite's log folder {folder} can be written by other users (owner uid "
                         f"{st.st_uid}, mode {stat.filemode(st.st_mode)}), and job results are unpickled from it: "
                         f"chmod go-w {folder}, or choose another folder (--logs DIR, log_folder=)")


def _collect(entry: SuiteEntry, job) -> JobOutcome:
    try:
        out = job.result()
    except Exception as exc:  # noqa: BLE001 - any failure of the job is reported, not raised
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        error = _error_line(text) or (
            f"the worker exited without a result (killed, out of memory, or crashed): {first}"
            if type(exc).__name__ == "UncompletedJobError" else f"{type(exc).__name__}: {first}")
        logger.debug("job %s of %s failed:\n%s", job.job_id, entry.label, text or traceback.format_exc())
        try:
            log = str(job.paths.stderr)
        except Exception:  # noqa: BLE001 - the debug executor has no log files
            log = None
        return JobOutcome(entry, "failed", job_id=str(job.job_id), error=error, log=log)
    return JobOutcome(entry, "done", path=out["path"], job_id=str(job.job_id), wall_time=out["wall_time"])
