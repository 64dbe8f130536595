"""Tests for companion.applications: statistics against direct computation, pruning scores and
the removal-error bounds, the tail clipping threshold, the regulariser, the controlled training
loop, the stream drift, and every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from companion.applications import (
    PRUNING_SCORES,
    LinearInputStatistics,
    TailClipper,
    TrainingControls,
    capture_linear_inputs,
    linear_input_medians,
    column_means,
    linear_input_statistics,
    lowest_fraction,
    mean_frobenius_penalty,
    neuron_scores,
    regularised_weights,
    removal_error,
    stream_drift,
    tail_clip_threshold,
    tiny_lm_loss,
    top_channels,
    train_with_controls,
    zero_linear_inputs,
)
from companion.stacks import StackConfig, TinyLM, byte_tokenize
from companion.tails import subgaussian_tail_bound


@pytest.fixture
def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).double()


@pytest.fixture
def tiny_cfg():
    return StackConfig(d_model=16, n_layers=2, n_heads=2, vocab_size=256, max_len=32)


TEXT = "In the beginning God created the heaven and the earth. " * 40


# ----------------------------------------------------------------------------- statistics
def test_streamed_statistics_match_direct(net):
    rng = np.random.default_rng(0)
    batches = [torch.from_numpy(rng.standard_normal((n, 5, 4)) * 3 + 1) for n in (2, 1, 4)]
    mods = {"0": net[0], "2": net[2]}
    got = linear_input_statistics(net, batches, mods)
    x0 = torch.cat([b.reshape(-1, 4) for b in batches]).numpy()
    x2 = torch.relu(net[0](torch.from_numpy(x0))).detach().numpy()
    for name, x in (("0", x0), ("2", x2)):
        np.testing.assert_allclose(got[name].mean, x.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[name].var, x.var(0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[name].max_abs, np.abs(x).max(0), rtol=0)
        np.testing.assert_allclose(got[name].second_moment, (x**2).mean(0), rtol=1e-10)
        assert got[name].n_tokens == 35
    assert not net[0]._forward_pre_hooks  # hooks removed


def test_statistics_exclude_pad_tokens():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x, attention_mask=None):
            return self.lin(x)

    w = Wrapper()
    x = torch.tensor([[[1.0, 2.0], [100.0, 100.0]], [[3.0, 4.0], [5.0, 6.0]]])
    mask = torch.tensor([[1, 0], [1, 1]])
    st_ = linear_input_statistics(w, [{"x": x, "attention_mask": mask}], {"lin": w.lin})["lin"]
    np.testing.assert_allclose(st_.mean, [3.0, 4.0])
    np.testing.assert_allclose(st_.max_abs, [5.0, 6.0])
    assert st_.n_tokens == 3
    cap = capture_linear_inputs(w, {"x": x, "attention_mask": mask}, {"lin": w.lin})["lin"]
    torch.testing.assert_close(cap, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))


def test_capture_matches_manual(net):
    x = torch.randn(3, 4, dtype=torch.float64)
    cap = capture_linear_inputs(net, x, {"2": net[2]})
    torch.testing.assert_close(cap["2"], torch.relu(net[0](x)).detach())


def test_medians_match_direct(net):
    x = torch.randn(2, 5, 4, dtype=torch.float64) * 3
    med = linear_input_medians(net, x, {"0": net[0], "2": net[2]})
    np.testing.assert_allclose(med["0"], np.median(x.reshape(-1, 4).numpy(), axis=0), rtol=1e-12)
    h = torch.relu(net[0](x.reshape(-1, 4))).detach().numpy()
    np.testing.assert_allclose(med["2"], np.median(h, axis=0), rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="ran 0 times"):
        linear_input_medians(net, x, {"x": torch.nn.Linear(4, 4)})
    with pytest.raises(TypeError, match="nn.Module"):
        linear_input_medians([], x, {"0": net[0]})


@pytest.mark.parametrize("n_tokens", [1, 2, 7, 10])
def test_medians_match_quantile_for_odd_and_even_counts(n_tokens):
    lin = torch.nn.Linear(5, 2).double()
    x = torch.randn(n_tokens, 5, dtype=torch.float64)
    x[:, 0] = 1.5                                               # ties
    med = linear_input_medians(lin, x, {"lin": lin})["lin"]
    np.testing.assert_allclose(med, torch.quantile(x, 0.5, dim=0).numpy(), rtol=1e-15, atol=1e-300)


def test_medians_exclude_pads_and_reject_all_pad_batches():
    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2).double()

        def forward(self, input_ids, attention_mask):
            return self.lin(input_ids)

    model = Wrap()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    med = linear_input_medians(model, {"input_ids": x, "attention_mask": mask}, {"lin": model.lin})["lin"]
    np.testing.assert_allclose(med, np.median(x[mask.bool()].numpy(), axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="no \\(unpadded\\) tokens"):
        linear_input_medians(model, {"input_ids": x, "attention_mask": torch.zeros(2, 4)}, {"lin": model.lin})


def test_top_channels():
    v = np.array([1.0, 5.0, 3.0, 5.0, -2.0])
    assert top_channels(v, 3).tolist() == [1, 3, 2]
    assert top_channels(v, 0).tolist() == []


# ----------------------------------------------------------------------------- pruning
def _stats_from(x):
    return LinearInputStatistics(mean=x.mean(0), var=x.var(0), max_abs=np.abs(x).max(0), n_tokens=x.shape[0])


def test_neuron_scores_match_formulas():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 5)) * np.array([0.1, 1, 2, 0.5, 3]) + np.array([1, 0, -2, 0, 0.5])
    W = rng.standard_normal((4, 5))
    s = _stats_from(x)
    np.testing.assert_allclose(neuron_scores("activation", s), np.abs(x.mean(0)) + x.std(0))
    np.testing.assert_allclose(neuron_scores("weight", weight=W), np.sqrt((W**2).sum(0)))
    np.testing.assert_allclose(neuron_scores("contribution", s, torch.from_numpy(W)),
                               np.sqrt((x**2).mean(0)) * np.sqrt((W**2).sum(0)))
    r1, r2 = neuron_scores("random", s, seed=1), neuron_scores("random", weight=W, seed=1)
    np.testing.assert_array_equal(r1, r2)
    assert not np.array_equal(r1, neuron_scores("random", s, seed=2))


def test_lowest_fraction():
    s = [5.0, 1.0, 1.0, 0.0, 9.0]
    assert lowest_fraction(s, 0.6).tolist() == [1, 2, 3]
    assert lowest_fraction(s, 0.0).tolist() == []
    assert lowest_fraction(s, 1.0).tolist() == [0, 1, 2, 3, 4]
    assert lowest_fraction(s, 0.3).tolist() == [1, 3]  # round(1.5) = 2 neurons; tie 1 vs 2 -> index 1
    assert lowest_fraction([2.0, 1.0, 1.0], 1 / 3).tolist() == [1]  # tie broken by lower index


def test_zero_linear_inputs_equals_deleting_columns(net):
    x = torch.randn(7, 4, dtype=torch.float64)
    with zero_linear_inputs({"2": net[2]}, {"2": [0, 4]}):
        y = net(x)
    h = torch.relu(net[0](x))
    keep = [1, 2, 3, 5]
    ref = h[:, keep] @ net[2].weight[:, keep].T + net[2].bias
    torch.testing.assert_close(y, ref)
    assert not net[2]._forward_pre_hooks


def test_removal_error_exact_and_bounds():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 8)) + rng.standard_normal(8)
    W = rng.standard_normal((3, 8))
    S = [1, 4, 6]
    r = removal_error(torch.from_numpy(x), W, S)
    e = x[:, S] @ W[:, S].T
    assert r["exact"] == pytest.approx(float((e**2).sum(1).mean()), rel=1e-12)
    ea2 = (x[:, S] ** 2).mean(0)
    wn = np.linalg.norm(W[:, S], axis=0)
    assert r["diagonal"] == pytest.approx(float((ea2 * wn**2).sum()), rel=1e-12)
    assert r["exact"] <= r["minkowski"] * (1 + 1e-12)
    # equality in Minkowski when the contributions are proportional: one neuron
    r1 = removal_error(x, W, [2])
    assert r1["exact"] == pytest.approx(r1["minkowski"], rel=1e-12) == r1["diagonal"]
    assert removal_error(x, W, np.array([], dtype=int)) == {"exact": 0.0, "diagonal": 0.0, "minkowski": 0.0}


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (12, 5), elements=st.floats(-10, 10)), arrays(np.float64, (3, 5), elements=st.floats(-10, 10)),
       st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True))
def test_minkowski_bound_property(x, W, S):
    r = removal_error(x, W, S)
    assert r["exact"] <= r["minkowski"] * (1 + 1e-9) + 1e-9


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


# ----------------------------------------------------------------------------- bad inputs
def test_bad_statistics_inputs(net):
    with pytest.raises(TypeError, match="nn.Module"):
        linear_input_statistics("net", [], {"0": net[0]})
    with pytest.raises(TypeError, match="mapping"):
        linear_input_statistics(net, [torch.zeros(1, 4)], [net[0]])
    with pytest.raises(ValueError, match="modules is empty"):
        linear_input_statistics(net, [torch.zeros(1, 4)], {})
    with pytest.raises(TypeError, match="not torch.nn.Linear"):
        linear_input_statistics(net, [torch.zeros(1, 4)], {"1": net[1]})
    with pytest.raises(ValueError, match="batches is empty"):
        linear_input_statistics(net, [], {"0": net[0]})
    with pytest.raises(TypeError, match="each batch"):
        linear_input_statistics(net, [[1.0, 2.0]], {"0": net[0]})
    with pytest.raises(ValueError, match="NaN"):
        linear_input_statistics(net, [torch.full((1, 4), float("nan"), dtype=torch.float64)], {"0": net[0]})
    other = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="never ran"):
        linear_input_statistics(net, [torch.zeros(1, 4, dtype=torch.float64)], {"x": other})
    assert not net[0]._forward_pre_hooks
    with pytest.raises(ValueError, match="ran 0 times"):
        capture_linear_inputs(net, torch.zeros(1, 4, dtype=torch.float64), {"x": other})
    with pytest.raises(TypeError, match="nn.Module"):
        capture_linear_inputs(None, torch.zeros(1, 4), {"0": net[0]})


@pytest.mark.parametrize("values,k,exc", [([1.0, 2.0], 3, ValueError), ([1.0, 2.0], -1, ValueError),
                                          ([1.0, 2.0], 1.0, TypeError), ([[1.0]], 1, ValueError),
                                          ([1.0, np.nan], 1, ValueError), ([], 0, ValueError)])
def test_bad_top_channels(values, k, exc):
    with pytest.raises(exc):
        top_channels(values, k)


def test_bad_neuron_scores():
    s = LinearInputStatistics(np.zeros(3), np.ones(3), np.ones(3), 5)
    with pytest.raises(ValueError, match="unknown pruning score"):
        neuron_scores("magnitude", s)
    with pytest.raises(TypeError, match="method"):
        neuron_scores(3, s)
    with pytest.raises(ValueError, match="needs stats"):
        neuron_scores("activation")
    with pytest.raises(ValueError, match="needs the weight"):
        neuron_scores("contribution", s)
    with pytest.raises(ValueError, match="3 channels but weight has 2"):
        neuron_scores("contribution", s, np.ones((2, 2)))
    with pytest.raises(ValueError, match="2-D"):
        neuron_scores("weight", weight=np.ones(3))
    with pytest.raises(TypeError, match="weight must be"):
        neuron_scores("weight", weight=[[1.0]])
    with pytest.raises(TypeError, match="LinearInputStatistics"):
        neuron_scores("activation", {"mean": 0})
    with pytest.raises(ValueError, match="number of neurons"):
        neuron_scores("random")
    with pytest.raises(ValueError, match="seed"):
        neuron_scores("random", s, seed=-1)
    assert set(PRUNING_SCORES) == {"activation", "weight", "contribution", "random"}


def test_bad_neuron_score_weight_values():
    st_ = LinearInputStatistics(np.zeros(2), np.ones(2), np.ones(2), 4)
    with pytest.raises(ValueError, match="NaN or infinite"):
        neuron_scores("weight", st_, np.array([[1.0, np.nan]]))


def test_bad_penalty_elements():
    with pytest.raises(TypeError, match=r"weights\[1\] must be a floating torch.Tensor"):
        mean_frobenius_penalty([torch.ones(2, 2), np.ones((2, 2))], 0.1, 0.1)
    with pytest.raises(TypeError, match=r"weights\[0\]"):
        mean_frobenius_penalty([torch.ones(2, 2, dtype=torch.int64)], 0.1, 0.1)
    with pytest.raises(ValueError, match=r"weights\[0\] must be 2-D"):
        mean_frobenius_penalty([torch.ones(3)], 0.1, 0.1)


@pytest.mark.parametrize("fraction,exc", [(1.5, ValueError), (-0.1, ValueError), ("half", TypeError),
                                          (float("nan"), ValueError)])
def test_bad_lowest_fraction(fraction, exc):
    with pytest.raises(exc, match="fraction"):
        lowest_fraction([1.0, 2.0], fraction)


def test_bad_zero_linear_inputs(net):
    with pytest.raises(ValueError, match="not in modules"):
        with zero_linear_inputs({"0": net[0]}, {"2": [0]}):
            pass
    with pytest.raises(ValueError, match="lie in"):
        with zero_linear_inputs({"0": net[0]}, {"0": [4]}):
            pass
    with pytest.raises(ValueError, match="repeated"):
        with zero_linear_inputs({"0": net[0]}, {"0": [1, 1]}):
            pass
    with pytest.raises(TypeError, match="integers"):
        with zero_linear_inputs({"0": net[0]}, {"0": [0.5]}):
            pass
    with pytest.raises(TypeError, match="mapping"):
        with zero_linear_inputs({"0": net[0]}, [0]):
            pass


def test_bad_removal_error():
    x, W = np.ones((4, 3)), np.ones((2, 3))
    with pytest.raises(ValueError, match="shape"):
        removal_error(x, np.ones((2, 4)), [0])
    with pytest.raises(ValueError, match="distinct indices"):
        removal_error(x, W, [3])
    with pytest.raises(ValueError, match="distinct indices"):
        removal_error(x, W, [0, 0])
    with pytest.raises(TypeError, match="integer"):
        removal_error(x, W, [0.5])
    with pytest.raises(ValueError, match="finite"):
        removal_error(np.full((4, 3), np.nan), W, [0])
    with pytest.raises(TypeError, match="x must be"):
        removal_error([[1.0]], W, [0])


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
