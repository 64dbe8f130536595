"""Logging and progress bars: a 'companion' logger that the library never configures, -v/--quiet in
the command line, and tqdm bars that only the command line turns on."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import companion
from companion import experiments as xp
from companion.__main__ import main

REPO = Path(__file__).resolve().parents[1]


@xp.register("logging_probe", schema=1)
@dataclass(frozen=True)
class LoggingProbe:
    """A one-array experiment for these tests; records the progress flag it was given."""
    n: int = 3

    def compute(self, device, progress):
        return {"x": np.arange(self.n), "progress": bool(progress)}


def _modules():
    yield companion
    for info in pkgutil.walk_packages(companion.__path__, "companion."):
        yield importlib.import_module(info.name)


def test_the_library_has_a_null_handler_and_never_configures_logging():
    log = logging.getLogger("companion")
    assert any(isinstance(h, logging.NullHandler) for h in log.handlers)
    for path in (REPO / "companion").rglob("*.py"):
        text = path.read_text()
        assert "basicConfig" not in text, f"{path} configures logging"
        for m in re.finditer(r"getLogger\(([^)]*)\)", text):
            if path.name != "__main__.py" and path.parts[-2:] != ("companion", "__init__.py"):
                assert m.group(1) == "__name__", f"{path}: modules log to getLogger(__name__)"


def test_run_cached_logs_computing_and_reusing(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="companion")
    xp.run_cached(LoggingProbe(), device="cpu", results_dir=tmp_path)
    computed = [r for r in caplog.records if r.name == "companion.experiments"]
    assert any("computing logging_probe" in r.getMessage() for r in computed)
    assert any(r.getMessage().startswith("saved ") for r in computed)
    caplog.clear()
    xp.run_cached(LoggingProbe(), device="cpu", results_dir=tmp_path)
    assert [r.getMessage() for r in caplog.records if "stored Result" in r.getMessage()]
    assert not any(r.getMessage().startswith("computing") for r in caplog.records)


def _run(capsys, tmp_path, *flags, before=()):
    code = main([*before, "run", "logging_probe", "--device", "cpu", "--out", str(tmp_path), "--force", *flags])
    assert code == 0
    return capsys.readouterr()


def test_cli_verbosity(capsys, tmp_path):
    quiet_default = _run(capsys, tmp_path)
    assert "INFO" not in quiet_default.err and "logging_probe" in quiet_default.out
    verbose = _run(capsys, tmp_path, "-v")
    assert "INFO companion.experiments: computing logging_probe" in verbose.err
    assert "DEBUG" not in verbose.err
    assert "INFO companion.experiments: computing" in _run(capsys, tmp_path, before=["--verbose"]).err
    assert "INFO" in _run(capsys, tmp_path, "-vv").err
    quiet = _run(capsys, tmp_path, "--quiet")
    assert quiet.err == "" and "logging_probe" in quiet.out
    assert _run(capsys, tmp_path, before=["-q"]).err == ""


def test_cli_restores_the_logger_and_the_environment(capsys, tmp_path, monkeypatch):
    log = logging.getLogger("companion")
    before = (list(log.handlers), log.level, log.propagate)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    _run(capsys, tmp_path, "-v", "--quiet")
    assert (list(log.handlers), log.level, log.propagate) == before
    assert "TQDM_DISABLE" not in os.environ


def test_cli_turns_progress_bars_on_and_quiet_turns_them_off(capsys, tmp_path, monkeypatch):
    seen = []
    real = xp.run_cached

    def spy(*args, **kwargs):
        seen.append((kwargs["progress"], os.environ.get("TQDM_DISABLE")))
        return real(*args, **kwargs)

    monkeypatch.setattr(xp, "run_cached", spy)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    _run(capsys, tmp_path)
    _run(capsys, tmp_path, "--quiet")
    assert seen == [(True, None), (False, "1")]


def test_progress_bars_are_off_by_default_everywhere():
    """Every public function or compute method with a `progress` parameter defaults to off."""
    checked = []
    for module in _modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            funcs = [obj] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                funcs = [f for f in vars(obj).values() if inspect.isfunction(f)]
            for f in funcs:
                p = inspect.signature(f).parameters.get("progress")
                if p is None or p.default is inspect.Parameter.empty:
                    continue
                checked.append(f"{module.__name__}.{f.__qualname__}")
                assert p.default in (False, None), f"{checked[-1]} defaults to progress={p.default!r}"
    assert "companion.experiments.run_cached" in checked and "companion.outliers.channel_statistics.channel_statistics" in checked


def test_the_tests_and_the_book_run_without_bars():
    assert "export TQDM_DISABLE := 1" in (REPO / "Makefile").read_text()
