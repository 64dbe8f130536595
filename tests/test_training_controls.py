"""Tests for companion.applications.training_controls: the tail clipping threshold, the regulariser, the
controlled training loop (precision, callback), the stream drift with its per-channel peaks, the
interval over seeds, and every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytest import approx
from scipy import stats

from companion.stacks.residual import StackConfig
from companion.stacks.tinylm import TinyLM, byte_tokenize
from companion.theory.subgaussian import subgaussian_tail_bound
from companion.applications.training_controls import (
    TailClipper, TrainingControls, column_means, mean_frobenius_penalty, regularised_weights, seed_interval,
    stream_drift, tail_clip_threshold, tiny_lm_loss, train_with_controls,
)


@pytest.fixture
def tiny_cfg():
    return StackConfig(d_model=16, n_layers=2, n_heads=2, vocab_size=256, max_len=32)


TEXT = "In the beginning God created the heaven and the earth. " * 40


# ----------------------------------------------------------------------------- clipping
def test_tail_clip_threshold_inverts_the_subgaussian_tail():
    for delta in (0.5, 0.1, 0.01, 1e-6):
        tau = tail_clip_threshold(2.0, 0.7, delta)
        u = tau - 2.0
        assert math.exp(-(u**2) / (2 * 0.7**2)) == pytest.approx(delta, rel=1e-12)
        # the same statement through the book's tail module (one-sided Chernoff bound)
        assert subgaussian_tail_bound(u, 0.7**2, two_sided=False) == pytest.approx(delta, rel=1e-12)
    np.testing.assert_allclose(tail_clip_threshold([0.0, 1.0], [1.0, 0.0], 0.05),
                               [math.sqrt(2 * math.log(20)), 1.0])


def test_tail_threshold_holds_for_gaussian_samples():
    """For Gaussian norms the exceedance rate must stay below δ (the one-sided bound is valid)."""
    rng = np.random.default_rng(0)
    g = 5 + 0.3 * rng.standard_normal(400_000)
    for delta in (0.1, 0.01):
        rate = np.mean(g > tail_clip_threshold(5.0, 0.3, delta))
        assert rate <= delta
        assert rate >= delta / 20  # not vacuous: within a small factor of δ


def test_tail_clipper_window():
    c = TailClipper(delta=0.05, window=4, min_history=3)
    vals = [1.0, 2.0, 4.0, 8.0, 16.0]
    c.update(vals[0]); c.update(vals[1])
    assert c.threshold == math.inf
    for v in vals[2:]:
        c.update(v)
    w = np.array(vals[-4:])
    assert c.threshold == pytest.approx(tail_clip_threshold(w.mean(), w.std(), 0.05))


# ----------------------------------------------------------------------------- regulariser
def test_column_means_and_penalty():
    W1 = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]], requires_grad=True)
    W2 = torch.tensor([[2.0], [-2.0]], requires_grad=True)
    torch.testing.assert_close(column_means(W1), torch.tensor([2.0, 1.0]))
    p = mean_frobenius_penalty([W1, W2], 0.5, 2.0)
    ref = 0.5 * (W1.detach() ** 2).sum() + 2.0 * (torch.tensor([2.0, 1.0]) ** 2).sum() + 0.5 * 8 + 2.0 * 8
    torch.testing.assert_close(p.detach(), ref)
    p.backward()
    # d/dW [λ_μ Σ_j c_j²] = 2 λ_μ c_j / in for each entry of row j
    torch.testing.assert_close(W1.grad, 2 * 0.5 * W1.detach() + 2 * 2.0 * torch.tensor([[2.0], [1.0]]) / 3 * torch.ones(2, 3))


def test_colmean_transfers_a_uniform_input_mean():
    """The docstring's claim: inputs with common mean m̄ give output means in·m̄·c_j."""
    torch.manual_seed(0)
    W = torch.randn(4, 50, dtype=torch.float64)
    z = torch.randn(100_000, 50, dtype=torch.float64) * 0.1 + 2.0
    out_mean = (z @ W.T).mean(0)
    torch.testing.assert_close(out_mean, 50 * 2.0 * column_means(W), rtol=0.02, atol=0.02)


def test_regularised_weights(tiny_cfg):
    lm = TinyLM(tiny_cfg)
    names = [n for n, _ in regularised_weights(lm, ("w_v", "w_out"))]
    assert names == ["stack.blocks.0.sublayers.0.f.w_v", "stack.blocks.0.sublayers.1.f.w_out",
                     "stack.blocks.1.sublayers.0.f.w_v", "stack.blocks.1.sublayers.1.f.w_out"]


# ----------------------------------------------------------------------------- training
def test_training_records_and_controls(tiny_cfg):
    ids = byte_tokenize(TEXT)
    base = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none"), steps=12, batch_size=4, seq_len=16)
    assert base.losses.shape == base.grad_norms.shape == (12,)
    assert not base.clipped.any() and np.isinf(base.thresholds).all()
    assert base.losses[-3:].mean() < base.losses[:3].mean()  # it learns
    fixed = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="fixed", clip_value=1e-3), steps=5,
                                batch_size=4, seq_len=16)
    assert fixed.clipped.all() and fixed.clip_rate == 1.0  # every gradient is larger than 1e-3
    tail = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="tail", tail_window=4, tail_min_history=3),
                               steps=8, batch_size=4, seq_len=16)
    assert np.isinf(tail.thresholds[:3]).all() and np.isfinite(tail.thresholds[3:]).all()
    w = tail.grad_norms[:3]
    assert tail.thresholds[3] == pytest.approx(tail_clip_threshold(w.mean(), w.std(), 0.01))
    np.testing.assert_array_equal(tail.clipped, tail.grad_norms > tail.thresholds)
    # determinism: same seed, same run
    again = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none"), steps=12, batch_size=4, seq_len=16)
    np.testing.assert_array_equal(base.losses, again.losses)


def test_regulariser_shrinks_column_means(tiny_cfg):
    ids = byte_tokenize(TEXT)
    kw = dict(steps=40, batch_size=4, seq_len=16, lr=1e-2)
    plain = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none", reg_targets=("w_out",)), **kw)
    reg = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none", lam_colmean=100.0, reg_targets=("w_out",)), **kw)

    def colmean_norm(model):
        return sum(float(column_means(w.detach()).norm()) for _, w in regularised_weights(model, ("w_out",)))

    assert colmean_norm(reg.model) < 0.5 * colmean_norm(plain.model)


def test_tiny_lm_loss_matches_direct(tiny_cfg):
    lm = TinyLM(tiny_cfg)
    ids = byte_tokenize(TEXT[:200])
    T = 16
    n = (ids.numel() - 1) // T
    total = 0.0
    with torch.no_grad():
        for i in range(n):
            w = ids[i * T: i * T + T + 1][None]
            logits, _ = lm(w[:, :-1])
            total += float(torch.nn.functional.cross_entropy(logits[0], w[0, 1:], reduction="sum"))
    assert tiny_lm_loss(lm, ids, T, batch_size=3) == pytest.approx(total / (n * T), rel=1e-6)


def test_stream_drift_matches_direct(tiny_cfg):
    lm = TinyLM(tiny_cfg)
    ids = byte_tokenize(TEXT[:320])
    sd = stream_drift(lm, ids, 16, multiples=(0.5, 2.0), max_windows=5)
    with torch.no_grad():
        _, out = lm(ids[:80].view(5, 16))
    x = out.stream.double().reshape(3, -1, 16).numpy()
    np.testing.assert_allclose(sd.mean, x.mean(1), atol=1e-12)
    np.testing.assert_allclose(sd.std, x.std(1), atol=1e-12)
    rms = np.sqrt((x**2).mean(axis=(1, 2)))
    np.testing.assert_allclose(sd.rms, rms, rtol=1e-12)
    np.testing.assert_allclose(sd.max_abs, np.abs(x).max(axis=(1, 2)), rtol=0)
    np.testing.assert_allclose(sd.exceed_frac[:, 1], (np.abs(x) > 2 * rms[:, None, None]).mean(axis=(1, 2)))
    np.testing.assert_array_equal(sd.mean_dominated[:, 0], (np.abs(x.mean(1)) > 0.5 * rms[:, None]).sum(1))
    np.testing.assert_allclose(sd.drift, np.linalg.norm(x.mean(1), axis=1) / (4 * rms))
    assert sd.n_tokens == 80


def test_bad_penalty_elements():
    with pytest.raises(TypeError, match=r"weights\[1\] must be a floating torch.Tensor"):
        mean_frobenius_penalty([torch.ones(2, 2), np.ones((2, 2))], 0.1, 0.1)
    with pytest.raises(TypeError, match=r"weights\[0\]"):
        mean_frobenius_penalty([torch.ones(2, 2, dtype=torch.int64)], 0.1, 0.1)
    with pytest.raises(ValueError, match=r"weights\[0\] must be 2-D"):
        mean_frobenius_penalty([torch.ones(3)], 0.1, 0.1)


@pytest.mark.parametrize("mean,std,delta,exc", [(0.0, -1.0, 0.1, ValueError), (0.0, 1.0, 0.0, ValueError),
                                                (0.0, 1.0, 1.0, ValueError), (0.0, 1.0, "0.1", TypeError),
                                                (np.nan, 1.0, 0.1, ValueError), ("a", 1.0, 0.1, TypeError)])
def test_bad_tail_threshold(mean, std, delta, exc):
    with pytest.raises(exc):
        tail_clip_threshold(mean, std, delta)


def test_bad_tail_clipper():
    with pytest.raises(ValueError, match="min_history"):
        TailClipper(window=5, min_history=6)
    with pytest.raises(ValueError, match="window"):
        TailClipper(window=1, min_history=1)
    with pytest.raises(TypeError, match="window"):
        TailClipper(window=5.0)
    with pytest.raises(ValueError, match="delta"):
        TailClipper(delta=1.5)
    c = TailClipper()
    with pytest.raises(ValueError, match="grad_norm"):
        c.update(-1.0)
    with pytest.raises(ValueError, match="grad_norm"):
        c.update(float("inf"))


def test_bad_regulariser_inputs(tiny_cfg):
    W = torch.ones(2, 3)
    with pytest.raises(TypeError, match="weight"):
        column_means(np.ones((2, 3)))
    with pytest.raises(ValueError, match="2-D"):
        column_means(torch.ones(3))
    with pytest.raises(ValueError, match="lam_frobenius"):
        mean_frobenius_penalty([W], -1.0, 0.0)
    with pytest.raises(ValueError, match="lam_colmean"):
        mean_frobenius_penalty([W], 0.0, float("inf"))
    with pytest.raises(ValueError, match="empty"):
        mean_frobenius_penalty([], 0.1, 0.1)
    with pytest.raises(TypeError, match="list of weight"):
        mean_frobenius_penalty(W, 0.1, 0.1)
    lm = TinyLM(tiny_cfg)
    with pytest.raises(ValueError, match="no linear layer"):
        regularised_weights(lm, ("w_values",))
    with pytest.raises(TypeError, match="list of attribute"):
        regularised_weights(lm, "w_o")
    with pytest.raises(ValueError, match="empty"):
        regularised_weights(lm, ())


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(clip="adaptive"), ValueError, "clip must be"), (dict(clip_value=0.0), ValueError, "clip_value"),
    (dict(tail_delta=0.0), ValueError, "delta"), (dict(lam_colmean=-1.0), ValueError, "lam_colmean"),
    (dict(reg_targets=["w_o"]), TypeError, "tuple"), (dict(tail_window=10, tail_min_history=20), ValueError, "min_history"),
])
def test_bad_training_controls(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        TrainingControls(**kw)


def test_bad_training_arguments(tiny_cfg):
    ids = byte_tokenize(TEXT)
    with pytest.raises(TypeError, match="StackConfig"):
        train_with_controls({"d_model": 16}, ids, ids)
    with pytest.raises(ValueError, match="256"):
        train_with_controls(StackConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=100), ids, ids)
    with pytest.raises(TypeError, match="TrainingControls"):
        train_with_controls(tiny_cfg, ids, ids, {"clip": "none"})
    with pytest.raises(ValueError, match="max_len"):
        train_with_controls(tiny_cfg, ids, ids, seq_len=64)
    with pytest.raises(ValueError, match="need at least"):
        train_with_controls(tiny_cfg, ids[:10], ids, seq_len=16)
    with pytest.raises(TypeError, match="integer tensor"):
        train_with_controls(tiny_cfg, ids.float(), ids, seq_len=16)
    with pytest.raises(ValueError, match="steps"):
        train_with_controls(tiny_cfg, ids, ids, steps=0, seq_len=16)
    with pytest.raises(ValueError, match="lr"):
        train_with_controls(tiny_cfg, ids, ids, lr=-1.0, seq_len=16)
    with pytest.raises(ValueError, match="became"):
        train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none"), steps=30, seq_len=16, lr=1e12, warmup=0)


def test_bad_eval_and_drift_inputs(tiny_cfg):
    lm = TinyLM(tiny_cfg)
    ids = byte_tokenize(TEXT[:100])
    with pytest.raises(TypeError, match="TinyLM"):
        tiny_lm_loss(torch.nn.Linear(2, 2), ids, 16)
    with pytest.raises(ValueError, match="need at least"):
        tiny_lm_loss(lm, ids[:5], 16)
    with pytest.raises(ValueError, match="seq_len"):
        tiny_lm_loss(lm, ids, 0)
    with pytest.raises(ValueError, match="multiples must be > 0"):
        stream_drift(lm, ids, 16, multiples=(0.0,))
    with pytest.raises(ValueError, match="non-empty"):
        stream_drift(lm, ids, 16, multiples=())
    with pytest.raises(TypeError, match="TinyLM"):
        stream_drift("lm", ids, 16)


# ----------------------------------------------------------------------------- extreme deltas
# (moved from tests/test_extreme_inputs.py with the function)
@pytest.mark.parametrize("delta", [1e-320, 5e-324, 1.0 - 1e-15, 1.0 - 2**-53])
def test_tail_clip_threshold_for_delta_near_0_and_1(delta):
    # 1/delta overflowed (tau = inf, NaN with std = 0); near 1, 1/delta kept 1 digit of 1 - delta
    tau = tail_clip_threshold(1.0, 0.5, delta)
    log_inv = -math.log(delta) if delta < 0.5 else -math.log1p(delta - 1.0)  # ln(1/delta)
    assert tau == approx(1.0 + 0.5 * math.sqrt(2.0 * log_inv), rel=1e-14)
    assert tail_clip_threshold(1.0, 0.0, delta) == 1.0


def test_tail_clip_threshold_beyond_the_float_range():
    with pytest.raises(ValueError, match="float64 range"):
        tail_clip_threshold(1.0, 1e308, 0.01)


# ----------------------------------------------------------------------------- precision, callback
def test_float64_training_and_callback(tiny_cfg):
    ids = byte_tokenize(TEXT)
    seen = []

    def cb(step, model):
        assert not model.training
        seen.append((step, next(model.parameters()).dtype))

    run = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none"), steps=4, batch_size=2,
                              seq_len=16, dtype=torch.float64, callback=cb)
    assert [s for s, _ in seen] == [1, 2, 3, 4] and all(d == torch.float64 for _, d in seen)
    assert next(run.model.parameters()).dtype == torch.float64
    # float64 and float32 start from the same weights: the first loss agrees to float32 precision
    run32 = train_with_controls(tiny_cfg, ids, ids, TrainingControls(clip="none"), steps=1, batch_size=2,
                                seq_len=16)
    assert run.losses[0] == approx(run32.losses[0], rel=1e-5)
    sd = stream_drift(run.model, ids, 16, max_windows=4)
    assert sd.mean.dtype == np.float64 and sd.channel_max_abs.shape == (3, 16)


def test_channel_peaks_match_direct(tiny_cfg):
    lm = TinyLM(tiny_cfg)
    ids = byte_tokenize(TEXT[:320])
    sd = stream_drift(lm, ids, 16, max_windows=5)
    with torch.no_grad():
        _, out = lm(ids[:80].view(5, 16))
    x = out.stream.double().reshape(3, -1, 16).numpy()
    rms = np.sqrt((x**2).mean(axis=(1, 2)))
    np.testing.assert_allclose(sd.channel_peak, np.abs(x).max(axis=1) / rms[:, None], rtol=1e-12)
    np.testing.assert_allclose(sd.channel_rms, np.sqrt((x**2).mean(axis=1)) / rms[:, None], rtol=1e-10)
    np.testing.assert_allclose(sd.max_abs, sd.channel_max_abs.max(axis=1), rtol=0)
    # the channel rms ratios average to 1 in the mean square
    np.testing.assert_allclose((sd.channel_rms**2).mean(axis=1), 1.0, rtol=1e-10)


# ----------------------------------------------------------------------------- seeds
def test_seed_interval_matches_scipy():
    v = np.array([2.51, 2.47, 2.49, 2.55, 2.46, 2.50])
    m, lo, hi = seed_interval(v)
    ref = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
    assert float(m) == approx(v.mean()) and (float(lo), float(hi)) == approx(ref, rel=1e-12)
    m9, lo9, hi9 = seed_interval(v, level=0.99)
    assert lo9 < lo and hi9 > hi
    # along an axis: one interval per arm
    arr = np.stack([v, v + 1.0])
    m2, lo2, hi2 = seed_interval(arr, axis=1)
    np.testing.assert_allclose(m2, [v.mean(), v.mean() + 1.0])
    np.testing.assert_allclose(hi2 - lo2, [hi - lo, hi - lo])


def test_seed_interval_coverage():
    """About 95% of intervals from 5 normal draws contain the true mean."""
    rng = np.random.default_rng(0)
    draws = rng.normal(1.0, 0.3, size=(5, 4000))
    _, lo, hi = seed_interval(draws, axis=0)
    cover = np.mean((lo <= 1.0) & (1.0 <= hi))
    assert 0.94 < cover < 0.96


@pytest.mark.parametrize("values,kw,exc,msg", [
    ([1.0], {}, ValueError, "at least 2"), (3.0, {}, ValueError, "scalar"),
    ([1.0, np.nan], {}, ValueError, "NaN"), ("ab", {}, TypeError, "real numbers"),
    ([1.0, 2.0], {"level": 1.0}, ValueError, "level"), ([1.0, 2.0], {"level": "0.9"}, TypeError, "level"),
    ([[1.0, 2.0]], {"axis": 2}, ValueError, "out of range"), ([1.0, 2.0], {"axis": 0.5}, TypeError, "axis"),
    ([["a", "b"]], {}, TypeError, "real numbers"),
])
def test_bad_seed_interval(values, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        seed_interval(values, **kw)


def test_bad_precision_and_callback(tiny_cfg):
    ids = byte_tokenize(TEXT)
    with pytest.raises(ValueError, match="dtype"):
        train_with_controls(tiny_cfg, ids, ids, steps=1, seq_len=16, dtype=torch.float16)
    with pytest.raises(TypeError, match="callback"):
        train_with_controls(tiny_cfg, ids, ids, steps=1, seq_len=16, callback="every 10 steps")


# ----------------------------------------------------------------------------- the stored study
def test_study_config_checks_and_tiny_run(tmp_path):
    from companion import experiments as xp
    from companion.experiments import training_controls_study as tcs

    assert "training_controls_study" in xp.experiment_names()
    assert tcs.SHORT.steps == 100 and len(tcs.SHORT.seeds) >= 5 and len(tcs.TrainingControlsStudy().seeds) >= 5
    for kw, exc, msg in [(dict(arms=("none", "magic")), ValueError, "arms must be among"),
                         (dict(arms=("none", "none")), ValueError, "distinct"),
                         (dict(arms=()), ValueError, "non-empty"),
                         (dict(seeds=(0,)), ValueError, "at least 2"),
                         (dict(seeds=(0, 0)), ValueError, "at least 2"),
                         (dict(seeds=(0, -1)), ValueError, "seeds"),
                         (dict(steps=0), ValueError, "steps"), (dict(d_model=10, n_heads=4), ValueError, "divide"),
                         (dict(lr=0.0), ValueError, "lr"), (dict(dtype="float16"), ValueError, "dtype"),
                         (dict(steps=2.5), TypeError, "steps")]:
        with pytest.raises(exc, match=msg):
            tcs.tiny(**kw)
    with pytest.raises(ValueError, match="arm must be"):
        tcs.arm_controls("magic")
    with pytest.raises(TypeError, match="TrainingControlsStudy"):
        tcs._run_study({"steps": 3})
    cfg = tcs.tiny()
    r = xp.run(cfg)
    A, S = len(cfg.arms), len(cfg.seeds)
    assert r.arrays["eval_loss"].shape == (A, S) and r.arrays["channel_peak"].shape == (A, S, 3, 8)
    assert r.arrays["peak_trace"].shape == (A, S, 2, 3) and r.arrays["init_drift"].shape == (S, 3)
    np.testing.assert_array_equal(r.arrays["probe_steps"], [3, 6])
    # the regulariser arm acts on the MLP output column means only; the reference has none
    assert r.scalars["arms"] == ["none", "colmean_mlp"]
    # one run reproduced directly: same controls, seed and precision give the same losses
    train_ids, test_ids = tcs.corpus_split(cfg.held_out)
    run = train_with_controls(tcs.member_config(cfg, 1), train_ids, test_ids, tcs.arm_controls("colmean_mlp"),
                              steps=cfg.steps, batch_size=cfg.batch_size, seq_len=cfg.seq_len, lr=cfg.lr,
                              warmup=cfg.warmup, seed=1, dtype=getattr(torch, cfg.dtype))
    np.testing.assert_array_equal(run.losses, r.arrays["train_loss"][1, 1])
    assert run.eval_loss == r.arrays["eval_loss"][1, 1]
    sd = stream_drift(run.model, test_ids, cfg.seq_len, multiples=(6.0,), max_windows=cfg.eval_windows)
    np.testing.assert_allclose(sd.channel_peak, r.arrays["channel_peak"][1, 1])


def test_merge_arms_joins_results_of_disjoint_arms():
    import dataclasses

    from companion import experiments as xp
    from companion.experiments import training_controls_study as tcs

    a = xp.run(tcs.tiny(arms=("none",), steps=3))
    b = xp.run(tcs.tiny(arms=("fixed", "colmean_mlp"), steps=3))
    arms, arrays = tcs.merge_arms(a, b)
    assert arms == ["none", "fixed", "colmean_mlp"]
    assert arrays["eval_loss"].shape == (3, 2) and arrays["channel_peak"].shape[:2] == (3, 2)
    np.testing.assert_array_equal(arrays["train_loss"][1:], b.arrays["train_loss"])
    np.testing.assert_array_equal(arrays["init_drift"], a.arrays["init_drift"])
    assert set(tcs.PER_ARM) | {"init_drift", "init_drift_mlp0", "init_drift_vo0", "init_eval_loss",
                               "init_colmean_vo", "init_colmean_mlp", "init_peak",
                               "probe_steps"} == set(a.arrays)
    with pytest.raises(ValueError, match="twice"):
        tcs.merge_arms(a, a)
    other = dataclasses.replace(b, config=dict(b.config, lr=0.5))
    with pytest.raises(ValueError, match="more than their arms"):
        tcs.merge_arms(a, other)
    bad = dataclasses.replace(b, arrays=dict(b.arrays, init_drift=b.arrays["init_drift"] + 1))
    with pytest.raises(ValueError, match="disagree on 'init_drift'"):
        tcs.merge_arms(a, bad)
    with pytest.raises(ValueError, match="at least one"):
        tcs.merge_arms()
    with pytest.raises(TypeError, match="Results of the training_controls_study"):
        tcs.merge_arms(a, {"arms": ["x"]})


# ------------------------------------------------------------------ the study without normalisation
def test_tail_statistics_against_closed_forms_and_scipy():
    from companion.experiments.no_norm_study import STATISTICS, tail_statistics

    # n - 1 entries of 1 and one of a: every statistic in closed form
    n, a = 100, 12.0
    x = np.ones(n)
    x[7] = a
    ms = (n - 1 + a * a) / n
    mean = (n - 1 + a) / n
    m2 = ((n - 1) * (1 - mean) ** 2 + (a - mean) ** 2) / n
    m4 = ((n - 1) * (1 - mean) ** 4 + (a - mean) ** 4) / n
    got = dict(zip(STATISTICS, tail_statistics(x)))
    assert got["rms"] == approx(math.sqrt(ms)) and got["kurtosis"] == approx(m4 / m2 ** 2 - 3)
    assert got["peak"] == approx(a / math.sqrt(ms)) and got["top_median"] == approx(a)
    assert got["frac6"] == approx(1 / n)                           # 12 >= 6 rms = 6 * 1.52
    # a Gaussian sample: kurtosis as scipy computes it, the peak near E max|G|, frac6 zero
    g = np.random.default_rng(0).standard_normal((3, 20_000))
    s = tail_statistics(torch.from_numpy(g))
    np.testing.assert_allclose(s[:, 1], stats.kurtosis(g, axis=1, fisher=True, bias=True), rtol=1e-10)
    np.testing.assert_allclose(s[:, 3], np.abs(g).max(1) / np.median(np.abs(g), axis=1))
    assert (np.abs(s[:, 1]) < 0.1).all() and (s[:, 4] == 0).all() and (3.5 < s[:, 2]).all() and (s[:, 2] < 5.5).all()
    assert tail_statistics(x, multiple=20.0)[4] == 0.0


@pytest.mark.parametrize("x, kw, exc, match", [
    ("abc", {}, TypeError, "real numbers"),
    (np.array([True, False, True]), {}, TypeError, "real numbers"),
    ([1.0], {}, ValueError, "at least 2"),
    ([1.0, float("nan")], {}, ValueError, "NaN"),
    ([2.0, 2.0, 2.0], {}, ValueError, "positive variance"),
    ([0.0, 0.0, 5.0], {}, ValueError, "median"),
    ([1.0, 2.0], {"multiple": 0.0}, ValueError, "multiple"),
])
def test_tail_statistics_errors(x, kw, exc, match):
    from companion.experiments.no_norm_study import tail_statistics

    with pytest.raises(exc, match=match):
        tail_statistics(x, **kw)


def test_no_norm_study_config_checks_and_tiny_run():
    from companion import experiments as xp
    from companion.experiments import no_norm_study as nns
    from companion.stacks.tinylm import train_tiny_lm

    assert "no_norm_study" in xp.experiment_names()
    default = nns.NoNormStudy()
    assert len(default.seeds) >= 3 and default.branch_scale == approx(1 / math.sqrt(2 * default.n_layers))
    for kw, exc, msg in [(dict(variants=("none", "magic")), ValueError, "among"),
                         (dict(variants=("pre", "pre")), ValueError, "distinct"),
                         (dict(variants=()), ValueError, "non-empty"),
                         (dict(seeds=(0,)), ValueError, "at least 2"),
                         (dict(seeds=(1, 1)), ValueError, "at least 2"),
                         (dict(text_bytes=40), ValueError, "multiple of"),
                         (dict(branch_scale=0.0), ValueError, "branch_scale"),
                         (dict(lr=-1.0), ValueError, "lr"), (dict(dtype="float16"), ValueError, "dtype"),
                         (dict(d_model=10, n_heads=4), ValueError, "divide"), (dict(steps=1.5), TypeError, "steps")]:
        with pytest.raises(exc, match=msg):
            nns.tiny(**kw)
    with pytest.raises(ValueError, match="variant must be"):
        nns.member_config(nns.tiny(), "layernorm", 0)
    with pytest.raises(TypeError, match="NoNormStudy"):
        nns.member_config({"steps": 3}, "none", 0)
    with pytest.raises(TypeError, match="NoNormStudy"):
        nns._run_study({"steps": 3})
    cfg = nns.tiny()
    assert nns.member_config(cfg, "none", 1).norm == "none" and nns.member_config(cfg, "post", 1).placement == "post"
    r = xp.run(cfg)
    V, S, L, n = 3, 2, cfg.n_layers, 4
    assert r.arrays["stream"].shape == (V, S, L + 1, n, 5) and r.arrays["block_input"].shape == (V, S, L, n, 5)
    assert r.arrays["train_loss"].shape == (V, S, cfg.steps) and (r.arrays["cpu_seconds"] > 0).all()
    assert r.scalars["variants"] == ["none", "pre", "post"] and r.scalars["entries_per_text"] == 32 * 8
    # one run reproduced by hand: same seed and data order, statistics recomputed with scipy
    train_text, texts = nns.held_out_texts(cfg)
    model, losses = train_tiny_lm(nns.member_config(cfg, "none", 1), train_text, steps=cfg.steps,
                                  batch_size=cfg.batch_size, seq_len=cfg.seq_len, lr=cfg.lr, seed=1,
                                  warmup=cfg.warmup, dtype=torch.float64)
    np.testing.assert_array_equal(losses, r.arrays["train_loss"][0, 1])
    with torch.no_grad():
        _, rec = model(texts.reshape(-1, cfg.seq_len))
    h = rec.stream.reshape(L + 1, n, -1).numpy()                   # the two windows of a text together
    np.testing.assert_allclose(r.arrays["stream"][0, 1, :, :, 1], stats.kurtosis(h, axis=2), rtol=1e-9)
    # without normalisation the input of block l's attention branch is the stream itself
    np.testing.assert_allclose(r.arrays["block_input"][0, 1], r.arrays["stream"][0, 1, :L])
