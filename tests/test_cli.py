"""The command line: python -m companion models | experiments | run | show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion import experiments as ex
from companion.__main__ import _build_parser, main

REPO = Path(__file__).resolve().parents[1]


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    top = capsys.readouterr().out
    for word in ("models", "experiments", "run", "show", "companion/data/results", "TQDM_DISABLE"):
        assert word in top
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    run_parser = _build_parser()._subparsers._group_actions[0].choices["run"]
    for action in run_parser._actions:
        assert action.help, f"option {action.dest} has no help text"
        for flag in action.option_strings:
            assert flag in text


def test_models_lists_offline_models(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "minilm-l6" in out and "pre-rmsnorm" in out and "post-layernorm" in out
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"smollm2-135m", "minilm-l6", "gpt2"}


def test_experiments_lists_options_with_defaults(capsys):
    assert main(["experiments"]) == 0
    out = capsys.readouterr().out
    assert "channel_statistics" in out and "injection_sweep" in out and "thresholds" in out
    assert main(["experiments", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    opts = {o["name"]: o for o in listed["channel_statistics"]["options"]}
    assert opts["n_texts"]["default"] == 64 and opts["model"]["type"] == "str"


def test_dry_run_resolves_overrides(capsys, tmp_path):
    code = main(["run", "channel_statistics", "--model", "minilm-l6", "--set", "n_texts=12",
                 "--set", "thresholds=1,2", "--out", str(tmp_path), "--dry-run"])
    assert code == 0
    info = json.loads(capsys.readouterr().out)
    cfg = ex.make_config("channel_statistics", model="minilm-l6", n_texts=12, thresholds=(1.0, 2.0))
    assert info["config_hash"] == ex.config_hash(cfg) and info["config"]["n_texts"] == 12
    assert info["path"] == str(ex.result_path(cfg, tmp_path))
    assert not Path(info["path"]).exists()


@pytest.mark.slow
def test_run_writes_and_reuses_a_result(capsys, tmp_path):
    args = ["run", "channel_statistics", "--model", "minilm-l6", "--set", "n_texts=4", "--set", "batch_size=2",
            "--device", "cpu", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    first = capsys.readouterr().out
    path = Path(first.split(": ", 1)[1].splitlines()[0])
    assert path.exists() and path.parent == tmp_path / "channel_statistics"
    stamp = path.stat().st_mtime_ns
    assert main(args) == 0  # valid Result: read back, not recomputed
    assert path.stat().st_mtime_ns == stamp and str(path) in capsys.readouterr().out
    assert main(["show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "counts" in shown and "minilm-l6" in shown and "n_tokens" in shown


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "nope"], "unknown experiment"),
        (["run", "channel_statistics", "--set", "n_texts"], "KEY=VALUE"),
        (["run", "channel_statistics", "--set", "=3"], "KEY=VALUE"),
        (["run", "channel_statistics", "--set", "size=3"], "no option size"),
        (["run", "channel_statistics", "--set", "n_texts=many"], "must be a int"),
        (["run", "channel_statistics", "--device", "tpu", "--out", "{tmp}", "--force"], "unknown device"),
        (["show", "{tmp}/missing.json"], "cannot read"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(capsys, tmp_path, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


def test_module_entry_point_runs():
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "companion", "experiments"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "injection_sweep" in out.stdout
