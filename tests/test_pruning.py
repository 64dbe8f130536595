"""Tests for companion.applications.pruning: linear-input statistics against direct computation, the pruning
scores and the removal-error bounds, mean compensation, and every bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from companion.applications.pruning import (
    PRUNING_SCORES, LinearInputStatistics, capture_linear_inputs, compensated_bias, linear_input_medians,
    linear_input_statistics, lowest_fraction, neuron_scores, removal_error, top_channels, zero_linear_inputs,
)


@pytest.fixture
def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).double()


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
    with pytest.raises(ValueError, match="method must be one of"):
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
    assert set(PRUNING_SCORES) == {"activation", "weight", "contribution", "spread", "random"}


def test_bad_neuron_score_weight_values():
    st_ = LinearInputStatistics(np.zeros(2), np.ones(2), np.ones(2), 4)
    with pytest.raises(ValueError, match="NaN or infinite"):
        neuron_scores("weight", st_, np.array([[1.0, np.nan]]))


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



# ----------------------------------------------------------------------------- mean compensation
def test_statistics_record_min_and_max(net):
    x = torch.randn(30, 4, dtype=torch.float64)
    st_ = linear_input_statistics(net, [x[:10], x[10:]], {"0": net[0]})["0"]
    np.testing.assert_array_equal(st_.min, x.min(0).values.numpy())
    np.testing.assert_array_equal(st_.max, x.max(0).values.numpy())


def test_spread_score_is_std_times_column_norm():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((100, 3)) * [1.0, 2.0, 0.5] + [10.0, 0.0, -1.0]
    W = rng.standard_normal((2, 3))
    s = _stats_from(x)
    np.testing.assert_allclose(neuron_scores("spread", s, W), x.std(0) * np.linalg.norm(W, axis=0))
    with pytest.raises(ValueError, match="needs the weight"):
        neuron_scores("spread", s)


def test_mean_compensation_equals_folding_the_mean_into_the_bias(net):
    x = torch.randn(9, 4, dtype=torch.float64)
    h = torch.relu(net[0](x))
    mu = h.mean(0)
    S = [0, 4]
    with zero_linear_inputs({"2": net[2]}, {"2": S}, fill={"2": mu}):
        y = net(x)
    keep = [1, 2, 3, 5]
    b = torch.as_tensor(compensated_bias(net[2].weight, net[2].bias, S, mu))
    torch.testing.assert_close(y, h[:, keep] @ net[2].weight[:, keep].T + b)
    # on the tokens the mean came from, the output error has mean zero
    full = net(x)
    torch.testing.assert_close((y - full).mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)
    assert not net[2]._forward_pre_hooks


def test_removal_error_with_center_uses_the_spread():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 6)) * 0.5 + rng.standard_normal(6) * 5
    W = rng.standard_normal((3, 6))
    S = [0, 2, 5]
    mu = x.mean(0)
    r = removal_error(x, W, S, center=mu)
    e = (x[:, S] - mu[S]) @ W[:, S].T
    assert r["exact"] == pytest.approx(float((e**2).sum(1).mean()), rel=1e-12)
    assert r["diagonal"] == pytest.approx(float((x[:, S].var(0) * np.linalg.norm(W[:, S], axis=0) ** 2).sum()),
                                          rel=1e-12)
    assert r["exact"] < removal_error(x, W, S)["exact"]


def test_bad_mean_compensation(net):
    with pytest.raises(ValueError, match="without pruned channels"):
        with zero_linear_inputs({"0": net[0], "2": net[2]}, {"0": [1]}, fill={"2": np.zeros(6)}):
            pass
    with pytest.raises(ValueError, match=r"shape \(6,\)"):
        with zero_linear_inputs({"2": net[2]}, {"2": [1]}, fill={"2": np.zeros(5)}):
            pass
    with pytest.raises(ValueError, match="NaN"):
        with zero_linear_inputs({"2": net[2]}, {"2": [1]}, fill={"2": np.full(6, np.nan)}):
            pass
    with pytest.raises(TypeError, match="fill must be a mapping"):
        with zero_linear_inputs({"2": net[2]}, {"2": [1]}, fill=[0.0]):
            pass
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        compensated_bias(np.ones((2, 3)), None, [0], np.ones(2))
    with pytest.raises(ValueError, match="distinct"):
        compensated_bias(np.ones((2, 3)), None, [3], np.ones(3))
    with pytest.raises(ValueError, match="bias must have"):
        compensated_bias(np.ones((2, 3)), np.ones(3), [0], np.ones(3))
    with pytest.raises(TypeError, match="weight must be"):
        compensated_bias([[1.0]], None, [0], [1.0])
    with pytest.raises(ValueError, match="center must have"):
        removal_error(np.ones((4, 3)), np.ones((2, 3)), [0], center=np.ones(2))
