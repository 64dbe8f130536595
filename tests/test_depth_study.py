"""The depth study (companion.experiments.depth_study): config checks, a tiny run, the chance
level, the GPU script at CPU size, and the stored CPU-size Result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from companion import experiments as xp
from companion.experiments import depth_study as ds

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides, match", [
    ({"placements": ("pre", "sideways")}, "placements"),
    ({"placements": ("pre", "pre")}, "distinct"),
    ({"depths": (4, 0)}, "depths"),
    ({"depths": ()}, "non-empty"),
    ({"d_model": 30, "n_heads": 4}, "divide"),
    ({"prompt_len": 128, "seq_len": 64}, "exceeds"),
    ({"dtype": "float16"}, "dtype"),
    ({"scales": (1.0, -1.0)}, "scales"),
    ({"dslm_k": 100.0}, "dslm_k"),
    ({"warmup": -1}, "warmup"),
    ({"n_random": 0}, "n_random"),
    ({"lr": 0.0}, "lr"),
])
def test_config_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        ds.DepthStudy(**overrides)


def test_cli_strings_are_typed_and_checked():
    c = xp.make_config("depth_study", {"depths": "4,8", "placements": "pre,dslm", "steps": "10"})
    assert c.depths == (4, 8) and c.placements == ("pre", "dslm") and c.steps == 10
    with pytest.raises(ValueError, match="placements"):
        xp.make_config("depth_study", {"placements": "pre,middle"})


def test_members_share_everything_but_placement_and_depth():
    c = ds.DepthStudy()
    pre, post, dslm = (ds.member_config(c, p, 16) for p in ("pre", "post", "dslm"))
    assert pre.placement == "pre" and post.placement == dslm.placement == "post"
    assert post.residual_scale == 1.0 and dslm.residual_scale < 1.0
    assert dslm.residual_scale ** 2 + dslm.branch_scale ** 2 == pytest.approx(1.0)
    for cfg in (post, dslm):
        assert (cfg.d_model, cfg.n_heads, cfg.seed, cfg.vocab_size) == (pre.d_model, pre.n_heads, pre.seed, 256)


def test_inject_grid_and_window_helpers():
    assert ds.inject_layers(8, 8).tolist() == list(range(9))
    grid = ds.inject_layers(64, 8)
    assert grid[0] == 0 and grid[-1] == 64 and len(grid) == 9
    w = ds._window_from_success(np.array([0.0, 0.0, 0.5, 1.0]), np.array([0, 1, 2, 3]), 3, 0.2)
    np.testing.assert_allclose(w, [2 / 3, 1.0, 5 / 6, 0.5])
    assert np.isnan(ds._window_from_success(np.zeros(3), np.arange(3), 2, 0.1)[:3]).all()
    # the window threshold sits above chance and below certainty
    assert 1 / 17 < ds._chance_threshold(128, 16) < 0.2


def test_tiny_end_to_end():
    cfg = ds.tiny()
    r = xp.run(cfg, device="cpu")
    a = r.arrays
    P, D = len(cfg.placements), len(cfg.depths)
    assert a["train_loss"].shape == (P, D, cfg.steps) and np.isfinite(a["train_loss"]).all()
    assert a["window"].shape == (P, D, len(cfg.scales), 4)
    assert a["sq_norm"].shape == (P, D, max(cfg.depths) + 1)
    rate = a["success_rate"]
    assert np.nanmin(rate) >= 0 and np.nanmax(rate) <= 1
    assert r.scalars["chance"] == pytest.approx(1 / (cfg.n_random + 1))
    # a member of depth 2 has NaN beyond its last layer
    assert np.isnan(a["sq_norm"][:, 0, 3:]).all() and np.isfinite(a["sq_norm"][:, 0, :3]).all()
    # deterministic (float64 on the CPU)
    again = xp.run(cfg, device="cpu").arrays
    np.testing.assert_allclose(again["train_loss"], a["train_loss"], rtol=1e-10)


def test_chance_level_on_an_untrained_model():
    """Held-out random directions, scored as if they were targets, succeed at the chance rate.

    Chance is exact in expectation over the draw of the directions (they are exchangeable with
    the random ones), so the rate is averaged over four draws (seeds), each its own untrained model.
    """
    rates = []
    for seed in range(4):
        cfg = ds.tiny(n_prompts=8, n_targets=4, n_random=8, n_heldout=32, scales=(1.0,), d_model=16,
                      n_heads=2, seed=seed)
        model = ds.TinyLM(ds.member_config(cfg, "pre", 4)).to(torch.float64).eval()
        m = ds.measure_model(model, cfg)
        rates.append(m["null_success"].mean())
        # the targets' own directions, read at the last layer (logit lens), succeed far above chance
        assert m["success"][0, -1].mean() > 0.9
    assert np.mean(rates) == pytest.approx(1 / 9, abs=0.05)


def test_gpu_script_runs_tiny_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_depth_study.py"), "--tiny",
                           "--device", "cpu", "--out", str(tmp_path), "--set", "steps=3"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    r = xp.load_result(summary["path"])
    assert r.name == "depth_study" and r.device.startswith("cpu") and r.config["steps"] == 3
    assert r.arrays["train_loss"].shape[-1] == 3


def test_gpu_config_is_a_valid_bigger_member_of_the_same_family():
    g, c = ds.GPU_CONFIG, ds.DepthStudy()
    assert g.depths == c.depths and g.placements == c.placements and g.d_model > c.d_model
    assert (ds.GPU_CONFIG.steps * g.batch_size * g.seq_len) > 10 * (c.steps * c.batch_size * c.seq_len)


def test_stored_result_loads_with_metadata():
    cfg = ds.DepthStudy()
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), f"the CPU-size Result is not stored at {path}"
    r = xp.load_result(path)
    assert r.config_hash == xp.config_hash(cfg) and r.schema == f"{xp.FRAMEWORK_SCHEMA}.{ds.DepthStudy.schema}"
    assert r.device.startswith("cpu") and "torch" in r.versions
    a = r.arrays
    P, D, M = len(cfg.placements), len(cfg.depths), max(cfg.depths)
    assert a["train_loss"].shape == (P, D, cfg.steps)
    assert a["window"].shape == (P, D, len(cfg.scales), 4)
    assert a["max_over_rms"].shape == (P, D, M + 1)
    assert a["count_observed"].shape == (P, D, M + 1, 2)
    assert np.isfinite(a["eval_loss"]).all() and np.isfinite(a["train_loss"]).all()
    assert r.scalars["placements"] == list(cfg.placements) and r.scalars["depths"] == list(cfg.depths)


def test_docstring_examples():
    import doctest
    result = doctest.testmod(ds, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
