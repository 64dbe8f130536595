"""The depth study (companion.experiments.depth_study): config checks, a tiny run, the chance
level, the GPU script at CPU size, and the stored CPU-size Result."""

from __future__ import annotations

import dataclasses
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


def test_gpu_script_runs_the_family_tiny_on_cpu_and_resumes(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_depth_study.py"), "--family", "--tiny", "--device", "cpu",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["members"] == len(ds.MEMBER_PLACEMENTS) and all(d.startswith("cpu") for d in summary["devices"])
    paths = [Path(p) for p in summary["paths"]]
    assert all(p.parent == tmp_path / "depth_study" / "depth_member" and p.exists() for p in paths)
    mtimes = [p.stat().st_mtime_ns for p in paths]
    again = subprocess.run(cmd + ["--seeds", "0"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0 and [p.stat().st_mtime_ns for p in paths] == mtimes      # nothing retrained
    bad = subprocess.run(cmd[:-2] + ["--out", str(tmp_path), "--depths", "2,x"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "--depths must be comma-separated integers" in bad.stderr
    alone = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_depth_study.py"), "--seeds", "0",
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert alone.returncode != 0 and "belong to --family" in alone.stderr


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


# ------------------------------------------------------------------ per-member study (issue 29)
def _tiny_member(**kw):
    base = dict(depth=2, d_model=8, n_heads=2, steps=6, batch_size=2, seq_len=16, warmup=2, n_eval=4,
                n_prompts=4, span=2, n_read=2, context=2, n_targets=2, n_null=3, n_outlier_prompts=2,
                n_checkpoints=2)
    return ds.DepthMember(**{**base, **kw})


@pytest.mark.parametrize("overrides, err, match", [
    ({"placement": "dslm"}, ValueError, "placement"),
    ({"dtype": "float16"}, ValueError, "dtype"),
    ({"depth": 0}, ValueError, "depth"),
    ({"d_model": 30, "n_heads": 4}, ValueError, "divide"),
    ({"context": 60, "span": 4, "n_read": 4, "seq_len": 64}, ValueError, "exceeds"),
    ({"lr": 0.0}, ValueError, "lr"),
    ({"n_null": 0}, ValueError, "n_null"),
    ({"heldout_frac": 0.9}, ValueError, "heldout_frac"),
    ({"n_checkpoints": 700, "steps": 600}, ValueError, "n_checkpoints"),
    ({"alpha": "big"}, TypeError, "alpha"),
])
def test_member_config_validation(overrides, err, match):
    with pytest.raises(err, match=match):
        ds.DepthMember(**overrides)


def test_member_helper_and_bad_inputs():
    m = ds.member("post", 16, seed=2)
    assert (m.lr, m.warmup) == ds.TUNED["post"] and m.seed == 2 and m.depth == 16
    g = ds.member("pre", 4, base=ds.GPU_MEMBER)
    assert g.d_model == 128 and g.warmup == round(ds.TUNED["pre"][1] * ds.GPU_MEMBER.steps / 600)
    with pytest.raises(ValueError, match="placement"):
        ds.member("dslm", 4)
    with pytest.raises(TypeError, match="base"):
        ds.member("pre", 4, base=ds.DepthStudy())
    cfg = ds.member_stack_config(ds.member("post_scaled", 8))
    assert cfg.placement == "post" and cfg.residual_scale ** 2 + cfg.branch_scale ** 2 == pytest.approx(1.0)


def test_per_member_cache_resumes(tmp_path):
    """A family run stores every member on its own; a rerun loads them (no training) and a larger
    family computes only the members it lacks."""
    base = _tiny_member()
    first = ds.run_family(("pre",), (2,), (0,), base=base, device="cpu", results_dir=tmp_path)
    (r,) = first.values()
    assert r.path.exists() and r.device.startswith("cpu")
    mtime = r.path.stat().st_mtime_ns
    again = ds.run_family(("pre", "post"), (2,), (0,), base=base, device="cpu", results_dir=tmp_path)
    assert again[("pre", 2, 0)].path.stat().st_mtime_ns == mtime          # the cache was hit
    np.testing.assert_array_equal(again[("pre", 2, 0)].arrays["train_loss"], r.arrays["train_loss"])
    assert len(list((tmp_path / "depth_member").glob("*.json"))) == 2
    loaded = ds.run_family(("pre", "post"), (2,), (0,), base=base, results_dir=tmp_path, compute=False)
    assert set(loaded) == {("pre", 2, 0), ("post", 2, 0)}
    with pytest.raises(FileNotFoundError, match="not stored"):
        ds.run_family(("pre",), (2,), (1,), base=base, results_dir=tmp_path, compute=False)
    with pytest.raises(ValueError, match="at least one"):
        ds.run_family((), (2,), (0,), base=base, results_dir=tmp_path)


def _installed(monkeypatch, tmp_path, packaged):
    """Simulate an installed package: no clone, no $COMPANION_RESULTS, the packaged members in
    ``packaged`` (made read-only) and the user's home (its cache) under ``tmp_path / "home"``."""
    from companion.experiments import store
    monkeypatch.delenv("COMPANION_RESULTS", raising=False)
    monkeypatch.setattr(store, "source_checkout", lambda: None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ds, "family_root", lambda: packaged)
    for path in [packaged, *packaged.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def test_installed_family_computes_into_the_user_cache(tmp_path, monkeypatch):
    """Issue 29: with the packaged members read-only (an installed package), run_family(compute=True)
    loads the packaged members and computes the missing ones into the user's cache; loading without
    computing finds both; the packaged folder is not written to."""
    base, packaged = _tiny_member(), tmp_path / "pkg" / "depth_study"
    stored = ds.run_family(("pre",), (2,), (0,), base=base, device="cpu", results_dir=packaged)
    _installed(monkeypatch, tmp_path, packaged)
    before = {p: p.stat().st_mtime_ns for p in packaged.rglob("*")}
    try:
        out = ds.run_family(("pre", "post"), (2,), (0,), base=base, device="cpu")
        cache = xp.cache_root() / "depth_study"
        assert cache == tmp_path / "home" / ".cache" / "companion" / "results" / "cache" / "depth_study"
        assert out[("pre", 2, 0)].path == stored[("pre", 2, 0)].path          # the packaged member
        np.testing.assert_array_equal(out[("pre", 2, 0)].arrays["train_loss"],
                                      stored[("pre", 2, 0)].arrays["train_loss"])
        assert out[("post", 2, 0)].path.parent == cache / "depth_member"       # computed into the cache
        assert {p: p.stat().st_mtime_ns for p in packaged.rglob("*")} == before
        loaded = ds.run_family(("pre", "post"), (2,), (0,), base=base, compute=False)
        assert {k: r.path for k, r in loaded.items()} == {k: r.path for k, r in out.items()}
        with pytest.raises(FileNotFoundError, match="not stored"):
            ds.run_family(("pre",), (2,), (1,), base=base, compute=False)
    finally:
        for path in [packaged, *packaged.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_unwritable_target_raises_a_clear_error_before_computing(tmp_path, monkeypatch):
    """A member to compute whose folder cannot be created (the cache's parent is a file) raises a
    ValueError naming results_dir= and $COMPANION_RESULTS, before any training; an explicit
    unwritable results_dir does the same."""
    base, packaged = _tiny_member(), tmp_path / "pkg" / "depth_study"
    packaged.mkdir(parents=True)
    _installed(monkeypatch, tmp_path, packaged)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".cache").write_text("a file where the cache folder would be")
    calls = []
    monkeypatch.setattr(ds, "_run_member", lambda *a, **k: calls.append(a))
    for kwargs in ({}, {"results_dir": tmp_path / "home" / ".cache" / "members"}):
        with pytest.raises(ValueError, match=r"cannot write Results into .*results_dir=.*COMPANION_RESULTS"):
            ds.run_family(("pre",), (2,), (0,), base=base, device="cpu", **kwargs)
    assert calls == []


def test_gpu_member_config_runs_at_tiny_size(tmp_path):
    """The GPU configuration is a valid, bigger member; shrunk to seconds it runs end to end."""
    g, c = ds.GPU_MEMBER, ds.DepthMember()
    assert g.d_model > c.d_model and g.steps * g.batch_size * g.seq_len > 20 * c.steps * c.batch_size * c.seq_len
    assert len(ds.GPU_SEEDS) >= 5 and max(ds.GPU_DEPTHS) >= 64
    tiny_gpu = dataclasses.replace(g, **{f.name: getattr(_tiny_member(), f.name) for f in
                                         dataclasses.fields(g) if f.name not in ("dtype", "alpha")})
    out = ds.run_family(("post_scaled",), (2,), (0,), base=tiny_gpu, device="cpu", results_dir=tmp_path)
    r = out[("post_scaled", 2, 0)]
    assert r.config["dtype"] == "float32" and np.isfinite(r.arrays["train_loss"]).all()
    assert r.arrays["later_success"].shape == (3, 2, 4)
    assert r.arrays["outlier_kurtosis"].shape == (3, 3) and r.arrays["checkpoints"].tolist() == [0, 3, 6]


def _independent_later_score(model, ids, target, direction, alpha, spread, layer, span, n_read):
    """Mean change of log p(target) at the last n_read tokens, injecting by hand: the stream is
    rebuilt block by block with ``apply_block`` and the vector added before block ``layer``."""
    T = ids.shape[1]
    with torch.no_grad():
        def run(add):
            h = model.embed(ids)
            for i in range(model.config.n_layers + 1):
                if i == layer and add:
                    h = h.clone()
                    h[:, T - n_read - span:T - n_read] += torch.as_tensor(direction * alpha * spread,
                                                                         dtype=h.dtype)
                if i < model.config.n_layers:
                    h = model.stack.apply_block(i, h)
            lp = torch.log_softmax(model.unembed(model.stack.final_norm(h)).double(), -1)
            return lp[:, T - n_read:, target]
        return float((run(True) - run(False)).mean())


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_later_readout_against_an_independent_computation(placement):
    cfg = _tiny_member(placement=placement, depth=3, d_model=16, n_heads=2, seed=1)
    model = ds.TinyLM(ds.member_stack_config(cfg)).to(torch.float64).eval()
    _, held = ds.corpus_split()
    ids = ds._windows(held, 3, 10)
    targets = [101, 116]
    r = ds.readout_success(model, ids, targets, n_null=4, alpha=2.0, span=3, n_read=2, seed=5)
    dirs = ds._member_directions(model, np.array(targets), 3, 4, 5)
    L = cfg.depth
    assert r["success"].shape == (L + 1, 2, 3)
    for layer in (0, 1, L):
        for k, t in enumerate(targets):
            for p in range(3):
                want = _independent_later_score(model, ids[p:p + 1], t, dirs[k, p, 0], 2.0, r["spread"][layer],
                                                layer, 3, 2)
                assert r["score"][layer, k, p] == pytest.approx(want, abs=1e-10)
    # at the top, later tokens cannot see the injected ones: every score is 0 and every pair fails
    assert np.abs(r["score"][L]).max() < 1e-12 and not r["success"][L].any()
    same = ds.readout_success(model, ids, targets, n_null=4, alpha=2.0, span=3, n_read=2, readout="same")
    assert np.abs(same["score"][L]).min() > 0                               # the contrast moves at the top


def test_rank_chance_level_is_exact_by_simulation():
    rng = np.random.default_rng(0)
    for k in (1, 4, 9):
        target, nulls = rng.standard_normal(200_000), rng.standard_normal((k, 200_000))
        rate = ds.rank_success(target, nulls).mean()
        se = np.sqrt(1 / (k + 1) * (1 - 1 / (k + 1)) / 200_000)
        assert abs(rate - 1 / (k + 1)) < 4 * se
    # ties fail: with all scores equal the rate is 0, below chance
    assert not ds.rank_success(np.zeros(5), np.zeros((3, 5))).any()
    with pytest.raises(ValueError, match="shape"):
        ds.rank_success(np.zeros(5), np.zeros((3, 4)))


def test_threshold_and_power_against_simulation():
    n, k = 128, 9
    thr = ds.chance_threshold(n, k)
    rng = np.random.default_rng(1)
    rates = rng.binomial(n, 1 / (k + 1), 200_000) / n
    assert (rates >= thr).mean() <= 0.01 < (rates >= thr - 1 / n).mean()
    p = ds.detectable_rate(n, k)
    sims = rng.binomial(n, p, 200_000) / n
    assert (sims >= thr).mean() == pytest.approx(0.8, abs=0.02)
    with pytest.raises(ValueError, match="power"):
        ds.detectable_rate(n, k, power=1.5)
    with pytest.raises(ValueError, match="n_pairs"):
        ds.chance_threshold(0, k)


def test_null_direction_succeeds_at_chance_on_an_untrained_model():
    """The held-out null is exchangeable with the nulls: its rate is 1/(k+1) (binomial band)."""
    cfg = _tiny_member(depth=2, d_model=16, n_heads=2)
    model = ds.TinyLM(ds.member_stack_config(cfg)).to(torch.float64).eval()
    _, held = ds.corpus_split()
    ids = ds._windows(held, 16, 10)
    r = ds.readout_success(model, ids, [101, 116, 97, 111], n_null=4, alpha=2.0, span=3, n_read=2,
                           readout="same", seed=3)
    n = r["null_success"].size
    assert abs(r["null_success"].mean() - 0.2) < 4 * np.sqrt(0.2 * 0.8 / n)


def test_readout_bad_inputs():
    cfg = _tiny_member()
    model = ds.TinyLM(ds.member_stack_config(cfg)).eval()
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="cannot hold"):
        ds.readout_success(model, ids, [101], n_null=3, alpha=1.0, span=3, n_read=2)
    with pytest.raises(ValueError, match="readout"):
        ds.readout_success(model, ids, [101], n_null=3, alpha=1.0, span=1, n_read=1, readout="top")
    with pytest.raises(TypeError, match="TinyLM"):
        ds.readout_success(model.stack, ids, [101], n_null=3, alpha=1.0, span=1, n_read=1)
    with pytest.raises(ValueError, match="alpha"):
        ds.readout_success(model, ids, [101], n_null=3, alpha=-1.0, span=1, n_read=1)


def test_outlier_metrics_against_hand_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 1, 20000, 8))
    x[1, 0, :, 3] = 10.0                                                   # a massive channel
    m = ds.outlier_metrics(x)
    from scipy import stats
    want = [np.nanmean(stats.kurtosis(x[i, 0], axis=-1, fisher=False)) for i in range(2)]
    np.testing.assert_allclose(m["kurtosis"], want, rtol=1e-10)
    assert m["frac_int8"][0] == pytest.approx(8 * 2 * 9.87e-10, abs=1e-5)  # P(|Z| >= 6) ~ 2e-9
    assert m["frac_int8"][1] == pytest.approx(1 / 8, abs=1e-4) and m["dims_int8"].tolist() == [0.0, 1.0]
    assert m["top_to_median"][1] > m["top_to_median"][0]
    with pytest.raises(ValueError, match="shape"):
        ds.outlier_metrics(np.zeros((3, 4)))


def test_unigram_baseline_and_split():
    train, held = ds.corpus_split(0.1)
    counts = {}
    for b in "\n\n".join(train).encode():
        counts[b] = counts.get(b, 0) + 1
    total = sum(counts.values()) + 0.5 * 256
    want = -np.mean([np.log((counts.get(int(b), 0) + 0.5) / total) for b in held.tolist()])
    assert ds.unigram_heldout(0.1) == pytest.approx(want, rel=1e-10)
    assert 2.9 < want < 3.1


def test_stored_family_members():
    """The stored family (chapter §1-5): Pre-LN and scaled Post-LN at depths 4 to 64, plain Post-LN
    at 4 to 32, 3 seeds, each its own Result with its device; every member beats the unigram baseline
    on the held-out documents, and every (placement, depth) trains except plain Post-LN at 32."""
    assert ds.FAMILY_SEEDS == (0, 1, 2)
    fam = ds.run_family(compute=False)
    assert len(fam) == (5 + 4 + 5) * 3
    for p in ds.MEMBER_PLACEMENTS:
        for L in ds.FAMILY_DEPTHS[p]:
            assert ds.trained(fam[(p, L, s)] for s in ds.FAMILY_SEEDS) == ((p, L) != ("post", 32))
    uni = ds.unigram_heldout(0.1)
    for (p, L, s), r in fam.items():
        assert r.config_hash == xp.config_hash(ds.member(p, L, s)) and r.device.startswith("cpu")
        assert r.config["dtype"] == "float32" and "torch" in r.versions
        assert r.scalars["unigram_heldout"] == pytest.approx(uni, rel=1e-12)
        assert r.scalars["heldout_loss"] < uni and r.scalars["cpu_seconds"] > 0
        assert r.arrays["later_success"].shape == (L + 1, 8, 16)
        assert not r.arrays["later_success"][L].any()                        # the top cannot pass


def test_train_tiny_lm_callback_sees_every_step_and_changes_nothing():
    from companion.stacks.residual import StackConfig
    from companion.stacks.tinylm import train_tiny_lm
    cfg = StackConfig(d_model=8, n_layers=1, n_heads=2, vocab_size=256, max_len=16)
    calls = []
    _, with_cb = train_tiny_lm(cfg, "abcabcabc" * 20, steps=3, batch_size=2, seq_len=8, dtype=torch.float64,
                               callback=lambda step, model: calls.append((step, model.training)))
    _, without = train_tiny_lm(cfg, "abcabcabc" * 20, steps=3, batch_size=2, seq_len=8, dtype=torch.float64)
    assert calls == [(0, True), (1, True), (2, True), (3, True)]
    np.testing.assert_array_equal(with_cb, without)
    with pytest.raises(TypeError, match="callback"):
        train_tiny_lm(cfg, "abcabcabc" * 20, steps=3, batch_size=2, seq_len=8, callback=3)


def test_lr_sweep_points_are_the_members_it_would_train(tmp_path):
    """Each point of the learning-rate sweep is the held-out loss of the member trained at that
    (lr, warm-up): checked against run_family's own member, trained separately."""
    sizes = dict(depth=2, d_model=8, n_heads=2, steps=6, batch_size=2, seq_len=16, n_eval=4)
    sweep = ds.DepthLRSweep(placement="post", lrs=(1e-3, 3e-3), warmups=(0, 2), **sizes)
    r = xp.run_cached(sweep, device="cpu", results_dir=tmp_path)
    assert r.arrays["heldout_loss"].shape == (2, 2) and np.isfinite(r.arrays["heldout_loss"]).all()
    assert r.scalars["unigram_heldout"] == pytest.approx(ds.unigram_heldout(0.1), rel=1e-12)
    base = _tiny_member(**sizes, n_prompts=2, n_outlier_prompts=2)
    fam = ds.run_family(("post",), (2,), (0,), base=base, device="cpu", results_dir=tmp_path)
    member = fam[("post", 2, 0)]
    lr, warm = member.config["lr"], member.config["warmup"]
    assert (lr, warm) == (1e-3, 1)                 # TUNED["post"], warm-up scaled to 6 steps
    again = xp.run_cached(dataclasses.replace(sweep, lrs=(lr,), warmups=(warm,)), device="cpu",
                          results_dir=tmp_path)
    assert again.arrays["heldout_loss"][0, 0] == pytest.approx(member.scalars["heldout_loss"], rel=1e-6)
    assert sweep.member(3e-3, 2).lr == 3e-3 and sweep.member(3e-3, 2).placement == "post"


@pytest.mark.parametrize("overrides, err, match", [
    ({"lrs": ()}, ValueError, "non-empty"),
    ({"warmups": ()}, ValueError, "non-empty"),
    ({"lrs": (1e-3, -1.0)}, ValueError, "lrs"),
    ({"lrs": (float("nan"),)}, ValueError, "lrs"),
    ({"warmups": (-1,)}, ValueError, "warmups"),
    ({"placement": "dslm"}, ValueError, "placement"),
    ({"depth": 0}, ValueError, "depth"),
])
def test_lr_sweep_refuses_bad_grids(overrides, err, match):
    with pytest.raises(err, match=match):
        ds.DepthLRSweep(**overrides)


def test_stored_lr_sweep_agrees_with_the_stored_member():
    """The stored sweep of plain Post-LN at L = 32 (seed 0): its point at the tuned rate is the
    stored member's held-out loss (two separate runs), and no rate of the grid trains the model."""
    sweep = ds.DepthLRSweep()
    r = xp.load_result(xp.result_path(sweep, ds.family_root()))
    assert r.config_hash == xp.config_hash(sweep) and r.arrays["heldout_loss"].shape == (3, 2)
    m = ds.run_family(("post",), (32,), (0,), compute=False)[("post", 32, 0)]
    i, j = sweep.lrs.index(m.config["lr"]), sweep.warmups.index(m.config["warmup"])
    assert r.arrays["heldout_loss"][i, j] == pytest.approx(m.scalars["heldout_loss"], rel=1e-12)
    assert (r.arrays["heldout_loss"] > r.scalars["unigram_heldout"] - ds.TRAINED_MARGIN).all()


def test_trained_and_run_family_refuse_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        ds.trained([])
    with pytest.raises(ValueError, match="placement"):
        ds.run_family(("dslm",), compute=False)
