"""Experiment suites through submitit: one job per configuration, resumption, failures reported.

End to end with submitit's LocalExecutor (each job a subprocess of this machine) on CPU-sized
configurations that run in about a second each (most of it importing torch).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit")

from companion import experiments as xp  # noqa: E402
from companion import suites  # noqa: E402
from companion.__main__ import main  # noqa: E402

TINY = {"d_model": 8, "max_depth": 2, "depths": [2], "gains": [1.0], "blocks": ["mlp"], "batch": 1, "tokens": 4}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """The default log folder (``$XDG_CACHE_HOME/companion/suite-logs``) inside the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))


def _suite_file(folder: Path, failing: bool = True) -> Path:
    entries = [
        {"experiment": "framework_random", "label": "tiny-pre", "config": {**TINY, "placements": ["pre"]}},
        {"experiment": "framework_random", "label": "tiny-post", "config": {**TINY, "placements": ["post"]}},
    ]
    if failing:  # an unknown model: loading it raises ValueError inside the job
        entries.append({"experiment": "channel_statistics", "label": "no-such-model",
                        "config": {"model": "no-such-org/no-such-model", "n_texts": 2}})
    path = folder / "suite.json"
    path.write_text(json.dumps({"configs": entries}))
    return path


def _jobs(logs: Path) -> set[str]:
    return {p.name.split("_")[0] for p in logs.glob("*_submitted.pkl")}


def test_local_executor_end_to_end_with_resumption_and_a_failure(tmp_path, capsys):
    logs = tmp_path / "home-cache" / "companion" / "suite-logs"  # this user's, outside the store
    suite, out = _suite_file(tmp_path), tmp_path / "results"
    argv = ["run-suite", str(suite), "--executor", "local", "--out", str(out), "--parallel", "3", "--time", "5"]
    assert main(argv) == 1                                     # one configuration failed
    text = capsys.readouterr().out
    assert "3 configurations: 2 done, 1 failed" in text
    assert "ValueError: unknown model 'no-such-org/no-such-model'" in text
    assert f"(log: {logs}/" in text                            # the failed job's own log
    entries = suites.load_suite(suite)
    for e in entries[:2]:                                      # Results in the store, valid
        result = xp.load_result(xp.result_path(e.config, out))
        assert result.config_hash == e.config_hash and result.device.startswith("cpu")
    assert not xp.result_path(entries[2].config, out).exists()
    first_jobs = _jobs(logs)
    assert len(first_jobs) == 3                                # one job per configuration

    assert main(argv) == 1                                     # resumed: only the failure runs again
    text = capsys.readouterr().out
    assert "3 configurations: 2 skipped, 1 failed" in text
    assert len(_jobs(logs) - first_jobs) == 1

    assert main(["run-suite", str(_suite_file(tmp_path, failing=False)), "--out", str(out)]) == 0
    assert "2 configurations: 2 skipped" in capsys.readouterr().out
    assert len(_jobs(logs) - first_jobs) == 1    # nothing was submitted


def test_run_suite_api_reports_per_entry(tmp_path):
    configs = {"a": xp.make_config("framework_random", {**TINY, "placements": ("pre",), "seed": 1})}
    report = suites.run_suite(configs, executor="local", results_dir=tmp_path, time_limit="0:05")
    assert report.ok and [o.status for o in report.outcomes] == ["done"]
    assert Path(report.outcomes[0].path).exists() and report.outcomes[0].job_id
    again = suites.run_suite(configs, executor="local", results_dir=tmp_path)
    assert [o.status for o in again.outcomes] == ["skipped"] and again.log_folder is None
    forced = suites.run_suite(configs, executor="debug", results_dir=tmp_path, force=True)
    assert [o.status for o in forced.outcomes] == ["done"]      # debug: in this process


def test_no_wait_submits_and_a_later_run_collects(tmp_path):
    configs = {"a": xp.make_config("framework_random", {**TINY, "placements": ("pre",), "seed": 2})}
    report = suites.run_suite(configs, executor="local", results_dir=tmp_path, wait=False)
    assert [o.status for o in report.outcomes] == ["submitted"] and "job " in report.summary()
    target = xp.result_path(configs["a"], tmp_path)
    deadline = time.monotonic() + 120
    while not target.exists() and time.monotonic() < deadline:  # the job runs on without us
        time.sleep(0.5)
    assert [o.status for o in suites.run_suite(configs, results_dir=tmp_path).outcomes] == ["skipped"]


def test_slurm_parameters_are_passed_to_submitit(tmp_path, monkeypatch):
    import submitit

    seen = {}

    class FakeExecutor:
        def __init__(self, folder, cluster):
            seen.update(folder=folder, cluster=cluster)

        def update_parameters(self, **params):
            seen.update(params)

    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    suites._executor("slurm", tmp_path, "gpu", 1, suites._parse_time("2:00"), 8, 64, 4, {"account": "p"})
    assert seen == {"folder": tmp_path, "cluster": "slurm", "timeout_min": 120, "name": "companion-suite",
                    "gpus_per_node": 1, "cpus_per_task": 8, "mem_gb": 64.0, "slurm_partition": "gpu",
                    "slurm_array_parallelism": 4, "slurm_additional_parameters": {"account": "p"}}


def test_named_suites(capsys):
    assert [e.label for e in suites.load_suite("smoke")] == ["random-pre", "random-post", "minilm-4-texts"]
    gpu = suites.load_suite("injection-gpu")
    assert len(gpu) == 13 and {e.experiment for e in gpu} == {"injection_window"}
    assert "gpt2-xl" in [e.label for e in gpu]
    assert main(["run-suite", "--list"]) == 0
    assert "injection-gpu" in capsys.readouterr().out
    assert main(["run-suite", "framework-gpu", "--list"]) == 0
    assert "framework_trained" in capsys.readouterr().out


def test_yaml_suites(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("- experiment: framework_random\n  config: {d_model: 8, depths: [2], max_depth: 2}\n")
    [entry] = suites.load_suite(path)
    assert entry.config.depths == (2,) and entry.label.startswith("framework_random-")


@pytest.mark.parametrize(
    "content, message",
    [
        ("[]", "non-empty list"),
        ('{"runs": []}', "'configs' list"),
        ('[{"config": {}}]', "experiment: NAME"),
        ('[{"experiment": "nope"}]', "unknown experiment"),
        ('[{"experiment": "framework_random", "config": {"size": 3}}]', "no option size"),
        ('[{"experiment": "framework_random", "extra": 1}]', "unknown keys"),
        ('[{"experiment": "framework_random", "label": "x"}, {"experiment": "framework_random", "label": "x"}]',
         "repeats"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_suite_files_are_errors_before_anything_runs(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        suites.load_suite(path)
    assert main(["run-suite", str(path), "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "home-cache").exists() and not (tmp_path / "suite-logs").exists()


def test_bad_options(tmp_path, capsys):
    assert main(["run-suite", "no-such-suite"]) == 2
    assert "neither a named suite" in capsys.readouterr().err
    assert main(["run-suite", "smoke", "--time", "soon", "--out", str(tmp_path)]) == 2
    assert "h:mm" in capsys.readouterr().err
    assert main(["run-suite"]) == 2
    with pytest.raises(SystemExit):
        main(["run-suite", "smoke", "--executor", "kubernetes"])
    assert [suites._parse_time(x) for x in (90, "90", "1:30", "1:30:30")] == [90.0, 90.0, 90.0, 90.5]
    for bad in ("0", "-1", "1:2:3:4", True):
        with pytest.raises(ValueError):
            suites._parse_time(bad)


@pytest.mark.slow
def test_the_smoke_suite_runs_in_this_process(tmp_path):
    report = suites.run_suite("smoke", executor="debug", results_dir=tmp_path)
    assert report.ok and report.count("done") == 3
    stats = xp.load_result(report.outcomes[2].path)
    assert stats.name == "channel_statistics" and stats.scalars["n_texts"] == 4


def test_docstring_examples():
    import doctest

    result = doctest.testmod(suites)
    assert result.attempted >= 2 and result.failed == 0


# ------------------------------------------------------------------ issue 30: logs private, failures explained
def test_the_log_folder_is_private_and_outside_the_results_store(tmp_path):
    """[the default log folder was <store>/suite-logs: whoever can write the shared store can plant a
    *_result.pkl that run-suite unpickles]"""
    store = tmp_path / "shared-store"
    configs = {"a": xp.make_config("framework_random", {**TINY, "placements": ("pre",), "seed": 3})}
    report = suites.run_suite(configs, executor="debug", results_dir=store)
    assert report.ok and report.log_folder is not None
    assert store not in report.log_folder.parents and not (store / "suite-logs").exists()
    assert report.log_folder.stat().st_mode & 0o777 == 0o700


def test_a_log_folder_others_can_write_is_refused_before_submitting(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    configs = {"a": xp.make_config("framework_random", {**TINY, "placements": ("pre",), "seed": 4})}
    with pytest.raises(ValueError, match="other users.*chmod go-w"):
        suites.run_suite(configs, executor="local", results_dir=tmp_path / "out", log_folder=logs)
    assert list(logs.iterdir()) == []


def _crashing_job(message):
    def crash(*args):
        import os
        import sys

        if message:
            print(message, file=sys.stderr, flush=True)
        os._exit(3)  # no result: submitit raises UncompletedJobError

    return crash


@pytest.mark.parametrize("message, error", [
    ("RuntimeError: the worker ran out of luck", "RuntimeError: the worker ran out of luck"),
    ("", "the worker exited without a result (killed, out of memory, or crashed): ")])
def test_a_crashed_worker_is_reported_with_its_error_and_its_log(tmp_path, monkeypatch, message, error):
    """[a worker killed without a message was reported as 'UncompletedJobError: ...', without its log]"""
    monkeypatch.setattr(suites, "_job", _crashing_job(message))
    from submitit.core.core import Job

    monkeypatch.setattr(Job, "_results_timeout_s", 1)  # submitit waits 15 s for a result that never comes
    configs = {"a": xp.make_config("framework_random", {**TINY, "placements": ("pre",), "seed": 5})}
    report = suites.run_suite(configs, executor="local", results_dir=tmp_path / "out", time_limit="0:05")
    [failed] = report.failed
    assert failed.error.startswith(error)
    assert failed.log is not None and Path(failed.log).exists() and failed.log in report.summary()
