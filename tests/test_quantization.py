"""Tests for companion.applications.quantization: every function against a direct NumPy computation, the
rounding-error bound as a property, the exact bias folding, the hooks, and every bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from companion.applications.quantization import (
    GRANULARITIES, channel_mse, fake_quantize, fold_center_into_bias, _max_rounding_error, qmax,
    quantization_scale,
)
from companion.applications.model_quantization import quantize_linear_inputs


# ----------------------------------------------------------------------------- reference
def reference_fake_quantize(x, bits, granularity, center=None, keep=None):
    """Plain NumPy loop-free reference written independently of the package."""
    x = np.asarray(x, dtype=np.float64)
    q = 2 ** (bits - 1) - 1
    y = x - (0 if center is None else np.asarray(center, dtype=np.float64))
    a = np.abs(y).copy()
    if keep is not None:
        a[..., list(keep)] = 0.0
    if granularity == "tensor":
        m = a.max()
    elif granularity == "channel":
        m = a.reshape(-1, x.shape[-1]).max(axis=0)
    else:
        m = a.max(axis=-1, keepdims=True)
    scale = np.where(m > 0, m / q, 1.0)
    out = np.clip(np.round(y / scale), -q, q) * scale
    out = out + (0 if center is None else center)
    if keep is not None:
        out[..., list(keep)] = x[..., list(keep)]
    return out, scale


@pytest.fixture
def x64():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7, 6)) * np.array([0.1, 1.0, 3.0, 0.5, 10.0, 1.0]) + np.array([0, 2, 0, -1, 0, 5])
    return x


# ----------------------------------------------------------------------------- values
def test_qmax_values():
    assert [qmax(b) for b in (2, 4, 8, 16)] == [1, 7, 127, 32767]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_scale_and_quantize_match_reference(x64, granularity, bits):
    got = fake_quantize(x64, bits, granularity)
    ref, ref_scale = reference_fake_quantize(x64, bits, granularity)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    scale = quantization_scale(x64, bits, granularity)
    np.testing.assert_allclose(scale, np.squeeze(ref_scale) if granularity == "tensor" else ref_scale, rtol=1e-14)
    expected_shape = {"tensor": (), "channel": (6,), "token": (5, 7, 1)}[granularity]
    assert np.shape(scale) == expected_shape


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_center_and_keep_match_reference(x64, granularity):
    center = x64.reshape(-1, 6).mean(axis=0)
    keep = [4, 1]
    got = fake_quantize(x64, 4, granularity, center=center, keep_channels=keep)
    ref, _ = reference_fake_quantize(x64, 4, granularity, center=center, keep=keep)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[..., keep], x64[..., keep])  # kept channels bit-exact


def test_keep_channels_excluded_from_range():
    x = np.array([[100.0, 1.0, -0.5], [-50.0, 0.25, 0.75]])
    assert quantization_scale(x, 8, keep_channels=[0]) == pytest.approx(1.0 / 127)
    assert quantization_scale(x, 8) == pytest.approx(100.0 / 127)
    # without the outlier in the range, the small channels are nearly exact at int8
    err = np.abs(fake_quantize(x, 8, keep_channels=[0]) - x)
    assert err[:, 1:].max() <= 0.5 / 127 + 1e-15


def test_center_equals_quantizing_the_shift(x64):
    c = np.linspace(-2, 2, 6)
    got = fake_quantize(x64, 4, "channel", center=c)
    np.testing.assert_allclose(got, c + fake_quantize(x64 - c, 4, "channel"), atol=1e-12)


def test_zero_tensor_is_exact():
    z = np.zeros((3, 4))
    np.testing.assert_array_equal(fake_quantize(z, 4, "channel"), z)
    np.testing.assert_array_equal(quantization_scale(z, 4, "token"), np.ones((3, 1)))


def test_types_and_dtypes_preserved():
    xt = torch.randn(3, 4, dtype=torch.float32)
    yt = fake_quantize(xt, 8, "token")
    assert isinstance(yt, torch.Tensor) and yt.dtype == torch.float32 and yt.shape == xt.shape
    xn = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    yn = fake_quantize(xn, 8)
    assert isinstance(yn, np.ndarray) and yn.dtype == np.float32
    np.testing.assert_allclose(fake_quantize(torch.from_numpy(xn), 8).numpy(), yn)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 5)),
           elements=st.floats(-1e3, 1e3, allow_nan=False, width=64)),
    st.integers(2, 10),
    st.sampled_from(GRANULARITIES),
)
def test_error_bound_grid_and_idempotence(x, bits, granularity):
    """|x - Q(x)| ≤ Δ/2, Q(x)/Δ is an integer in [-q, q], and Q(Q(x)) = Q(x)."""
    y = fake_quantize(x, bits, granularity)
    half = _max_rounding_error(x, bits, granularity)
    assert np.all(np.abs(y - x) <= half * (1 + 1e-9) + 1e-300)
    scale = quantization_scale(x, bits, granularity)
    k = y / scale
    assert np.allclose(k, np.round(k), atol=1e-6) and np.all(np.abs(k) <= qmax(bits) + 1e-6)
    np.testing.assert_allclose(fake_quantize(y, bits, granularity), y, rtol=1e-9, atol=1e-12)


def test_mse_close_to_step_squared_over_12():
    """Many levels per value: the rounding error is nearly uniform, MSE ≈ Δ²/12 (±3 %)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200_000, 2))
    mse = channel_mse(x, fake_quantize(x, 8, "channel"))
    delta = quantization_scale(x, 8, "channel")
    np.testing.assert_allclose(mse / (delta**2 / 12), 1.0, rtol=0.03)


def test_channel_mse_matches_direct():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5))
    np.testing.assert_allclose(channel_mse(a, b), ((a - b) ** 2).reshape(-1, 5).mean(axis=0), rtol=1e-13)
    t = channel_mse(torch.from_numpy(a), torch.from_numpy(b))
    assert isinstance(t, torch.Tensor) and t.shape == (5,)


def test_fold_center_into_bias_is_exact():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4).double()
    x = torch.randn(10, 6, dtype=torch.float64) + torch.arange(6.0, dtype=torch.float64)
    c = x.mean(dim=0)
    lhs = lin(fake_quantize(x, 4, "tensor", center=c))
    folded = fold_center_into_bias(lin.weight, lin.bias, c)
    rhs = fake_quantize(x - c, 4, "tensor") @ lin.weight.T + folded
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fold_center_into_bias(lin.weight, None, c), lin.weight @ c)


def test_hooks_quantize_inputs_and_are_removed():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x = torch.randn(2, 7, 4)
    clean = net(x)
    c0 = torch.full((4,), 0.3)
    with quantize_linear_inputs(net, 4, "token", centers={"0": c0}, keep_channels={"2": [1]}) as handles:
        assert set(handles) == {"0", "2"}
        y = net(x)
    h = torch.relu(net[0](fake_quantize(x, 4, "token", center=c0)))
    ref = net[2](fake_quantize(h, 4, "token", keep_channels=[1]))
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(net(x), clean)  # hooks removed


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_hooks_equal_fake_quantize_exactly(granularity):
    torch.manual_seed(1)
    lin = torch.nn.Linear(6, 2)
    x = torch.randn(3, 5, 6) * torch.tensor([1.0, 50.0, 0.1, 1.0, 2.0, 1.0]) + 3.0
    c, keep = torch.linspace(-1.0, 1.0, 6), [1, 4]
    with quantize_linear_inputs(lin, 4, granularity, modules={"lin": lin}, centers={"lin": c}, keep_channels={"lin": keep}):
        y = lin(x)
    assert torch.equal(y, lin(fake_quantize(x, 4, granularity, center=c, keep_channels=keep)))


def test_hook_rejects_non_finite_input():
    lin = torch.nn.Linear(2, 1)
    with quantize_linear_inputs(lin, 8, modules={"lin": lin}):
        with pytest.raises(ValueError, match="the input of 'lin' contains 1 NaN"):
            lin(torch.tensor([[1.0, float("nan")]]))
    assert not lin._forward_pre_hooks


def test_hooks_removed_after_error():
    lin = torch.nn.Linear(3, 2)
    with pytest.raises(RuntimeError):
        with quantize_linear_inputs(lin, 8, modules={"lin": lin}):
            raise RuntimeError("boom")
    assert not lin._forward_pre_hooks


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("bits,exc", [(1, ValueError), (17, ValueError), (8.0, TypeError), (True, TypeError), ("8", TypeError)])
def test_bad_bits(bits, exc):
    with pytest.raises(exc, match="bits"):
        fake_quantize(np.ones((2, 2)), bits)
    with pytest.raises(exc, match="bits"):
        qmax(bits)


@pytest.mark.parametrize("g,exc", [("row", ValueError), (3, TypeError), (None, TypeError)])
def test_bad_granularity(g, exc):
    with pytest.raises(exc, match="granularity"):
        fake_quantize(np.ones((2, 2)), 8, g)
    with pytest.raises(exc, match="granularity"):
        quantization_scale(np.ones((2, 2)), 8, g)


@pytest.mark.parametrize(
    "x,exc,msg",
    [
        ([[1.0, 2.0]], TypeError, "torch.Tensor or numpy"),
        (np.ones((2, 2), dtype=np.int64), TypeError, "floating"),
        (torch.ones(2, 2, dtype=torch.int32), TypeError, "floating"),
        (np.array([[1.0, np.nan]]), ValueError, "NaN"),
        (np.array([[1.0, np.inf]]), ValueError, "NaN or infinite"),
        (np.zeros((0, 3)), ValueError, "empty"),
        (np.array(1.0), ValueError, "at least one axis"),
    ],
)
def test_bad_x(x, exc, msg):
    with pytest.raises(exc, match=msg):
        fake_quantize(x, 8)
    with pytest.raises(exc, match=msg):
        _max_rounding_error(x, 8)


@pytest.mark.parametrize(
    "center,exc,msg",
    [(np.ones(3), ValueError, r"shape \(2,\)"), (np.array([0.0, np.nan]), ValueError, "NaN"),
     ([0.0, 1.0], TypeError, "torch.Tensor or numpy"), (np.array([1, 2]), TypeError, "floating")],
)
def test_bad_center(center, exc, msg):
    with pytest.raises(exc, match=msg):
        fake_quantize(np.ones((3, 2)), 8, center=center)


@pytest.mark.parametrize(
    "keep,exc,msg",
    [([2], ValueError, "lie in"), ([-1], ValueError, "lie in"), ([0, 0], ValueError, "repeated"),
     ([0.5], TypeError, "integer"), ([[0]], ValueError, "1-D")],
)
def test_bad_keep_channels(keep, exc, msg):
    with pytest.raises(exc, match=msg):
        fake_quantize(np.ones((3, 2)), 8, keep_channels=keep)


def test_bad_channel_mse_inputs():
    with pytest.raises(ValueError, match="same shape"):
        channel_mse(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        channel_mse(np.ones((2, 3)), np.full((2, 3), np.nan))
    with pytest.raises(TypeError, match="x_hat"):
        channel_mse(np.ones((2, 3)), [[1.0]])


def test_bad_fold_inputs():
    w = torch.ones(2, 3)
    with pytest.raises(TypeError, match="weight"):
        fold_center_into_bias(np.ones((2, 3)), None, torch.ones(3))
    with pytest.raises(ValueError, match="2-D"):
        fold_center_into_bias(torch.ones(3), None, torch.ones(3))
    with pytest.raises(ValueError, match=r"center must have shape \(3,\)"):
        fold_center_into_bias(w, None, torch.ones(2))
    with pytest.raises(ValueError, match=r"bias must have shape \(2,\)"):
        fold_center_into_bias(w, torch.ones(3), torch.ones(3))


def test_bad_hook_arguments():
    lin = torch.nn.Linear(3, 2)
    relu = torch.nn.ReLU()
    with pytest.raises(TypeError, match="nn.Module"):
        with quantize_linear_inputs("model", 8):
            pass
    with pytest.raises(TypeError, match="not torch.nn.Linear"):
        with quantize_linear_inputs(lin, 8, modules={"r": relu}):
            pass
    with pytest.raises(ValueError, match="not hooked"):
        with quantize_linear_inputs(lin, 8, modules={"lin": lin}, centers={"other": torch.zeros(3)}):
            pass
    with pytest.raises(ValueError, match="shape"):
        with quantize_linear_inputs(lin, 8, modules={"lin": lin}, centers={"lin": torch.zeros(2)}):
            pass
    with pytest.raises(ValueError, match="no linear layers"):
        with quantize_linear_inputs(relu, 8):
            pass
    with pytest.raises(ValueError, match="bits"):
        with quantize_linear_inputs(lin, 1):
            pass
    with pytest.raises(ValueError, match="lie in"):
        with quantize_linear_inputs(lin, 8, modules={"lin": lin}, keep_channels={"lin": [5]}):
            pass


# =========================================================================== deployable schemes
from companion.applications.model_quantization import (
    LinearQuantization, activation_bias_correction, mean_quantization_error, quantized_linears,
    weight_bias_correction,
)
from companion.applications.quantization import (
    _dynamic_range, quantize_weight, quantize_with_range, smoothquant_scales,
)


def test_range_quantiser_matches_the_dynamic_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 7, generator=g, dtype=torch.float64) * 3
    for gran in ("tensor", "channel", "token"):
        lo, hi = _dynamic_range(x, gran)
        torch.testing.assert_close(quantize_with_range(x, 4, lo, hi), fake_quantize(x, 4, gran), rtol=0, atol=0)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_asymmetric_grid(bits):
    rng = np.random.default_rng(bits)
    x = rng.uniform(-0.3, 5.0, size=(200, 3))
    lo, hi = _dynamic_range(x, "channel")
    xq = quantize_with_range(x, bits, lo, hi, symmetric=False)
    step = (hi - np.minimum(lo, 0)) / (2**bits - 1)
    assert (np.abs(xq - x) <= step / 2 * (1 + 1e-9) + 1e-12).all()   # inside the range: half a step
    assert len(np.unique(xq[:, 0])) <= 2**bits
    zero = quantize_with_range(np.zeros((1, 3)), bits, lo, hi, symmetric=False)
    assert (zero == 0).all()                                          # 0 is a grid point
    # an asymmetric grid is finer than the symmetric one on a one-signed range
    sym = quantize_with_range(x, bits, lo, hi)
    assert np.mean((xq - x) ** 2) < np.mean((sym - x) ** 2)


def test_static_range_clips_outside_values():
    x = np.array([[-3.0, 0.5, 2.0]])
    np.testing.assert_array_equal(quantize_with_range(x, 8, -1.0, 1.0)[0, [0, 2]], [-1.0, 1.0])
    np.testing.assert_array_equal(quantize_with_range(x, 8, 0.0, 1.0, symmetric=False)[0, [0, 2]], [0.0, 1.0])


def test_quantize_weight_per_row():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((4, 9)) * np.array([[0.01], [1.0], [10.0], [100.0]])
    Wq = quantize_weight(W, 4)
    step = np.abs(W).max(1, keepdims=True) / 7
    assert (np.abs(Wq - W) <= step / 2 * (1 + 1e-12)).all()
    Wt = quantize_weight(torch.from_numpy(W), 4, granularity="tensor")
    assert isinstance(Wt, torch.Tensor)
    assert np.abs(Wt.numpy()[0]).max() == 0.0        # a per-tensor grid wipes out the small row


def test_smoothquant_scales_and_the_exact_migration():
    rng = np.random.default_rng(2)
    W = rng.standard_normal((5, 4))
    a = np.array([100.0, 1.0, 0.1, 3.0])
    for alpha in (0.0, 0.5, 1.0):
        s = smoothquant_scales(a, W, alpha)
        np.testing.assert_allclose(s, a**alpha / np.abs(W).max(0) ** (1 - alpha))
    s = smoothquant_scales(a, W, 0.5)
    np.testing.assert_allclose(a / s, np.abs(W * s).max(0))         # alpha = 1/2 balances the ranges
    x = rng.standard_normal((3, 4))
    np.testing.assert_allclose((x / s) @ (W * s).T, x @ W.T)
    assert smoothquant_scales(np.array([0.0, 1.0]), np.array([[1.0, 0.0]]), 0.5).tolist() == [1.0, 1.0]


def _lin(seed=0, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3, bias=bias).double()


def test_quantized_linears_computes_the_scheme_and_restores_the_weights():
    lin = _lin()
    w0 = lin.weight.detach().clone()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 6, generator=g, dtype=torch.float64) + 2.0
    s = torch.as_tensor(smoothquant_scales(x.abs().amax(0), lin.weight, 0.5))
    shift = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    spec = LinearQuantization(act_bits=4, act_granularity="token", act_symmetric=False, weight_bits=4)
    with quantized_linears({"l": lin}, spec, smooth={"l": s}, output_shift={"l": shift}):
        y = lin(x)
    xs = x / s
    lo, hi = _dynamic_range(xs, "token")
    ref = (quantize_with_range(xs, 4, lo, hi, symmetric=False) @ quantize_weight(w0 * s, 4).T
           + lin.bias - shift)
    torch.testing.assert_close(y, ref)
    assert torch.equal(lin.weight, w0) and not lin._forward_pre_hooks and not lin._forward_hooks
    # smoothing alone changes nothing but rounding
    with quantized_linears({"l": lin}, LinearQuantization(act_bits=None), smooth={"l": s}):
        torch.testing.assert_close(lin(x), x @ w0.T + lin.bias)
    # weights are restored after an error too
    with pytest.raises(RuntimeError):
        with quantized_linears({"l": lin}, LinearQuantization(act_bits=None, weight_bits=2)):
            raise RuntimeError
    assert torch.equal(lin.weight, w0)


def test_static_spec_uses_the_calibrated_range():
    lin = _lin(bias=False)
    x = torch.tensor([[0.5, -0.25, 4.0, 0.0, 0.1, 0.2]], dtype=torch.float64)
    with quantized_linears({"l": lin}, LinearQuantization(act_bits=8, static=True), ranges={"l": (-1.0, 1.0)}):
        y = lin(x)
    torch.testing.assert_close(y, quantize_with_range(x, 8, -1.0, 1.0) @ lin.weight.T)


def test_weight_bias_correction_removes_the_mean_output_shift():
    lin = _lin()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 6, generator=g, dtype=torch.float64) * 0.3 + torch.tensor([5.0, 0, 0, -3.0, 0, 1.0])
    Wq = quantize_weight(lin.weight.detach(), 3)
    shift = weight_bias_correction(lin.weight, Wq, x.mean(0))
    spec = LinearQuantization(act_bits=None, weight_bits=3)
    with quantized_linears({"l": lin}, spec, output_shift={"l": shift}):
        y = lin(x)
    with torch.no_grad():
        torch.testing.assert_close(y.mean(0), lin(x).mean(0), atol=1e-12, rtol=0)
        with quantized_linears({"l": lin}, spec):
            assert (lin(x).mean(0) - lin.weight.new_tensor(0)).sub(y.mean(0)).abs().max() > 1e-3


def test_activation_bias_correction_removes_the_mean_output_shift():
    lin = _lin()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64) + torch.tensor([8.0, 0, 0, 0, 0, 0])
    spec = LinearQuantization(act_bits=3, act_granularity="tensor")
    err = mean_quantization_error(lin, [x[:20], x[20:]], {"l": lin}, spec)
    np.testing.assert_allclose(err["l"], (fake_quantize(x[:20], 3) - x[:20]).mean(0) / 2
                               + (fake_quantize(x[20:], 3) - x[20:]).mean(0) / 2, atol=1e-12)
    shift = activation_bias_correction(lin.weight, err["l"])
    outs = []
    with torch.no_grad(), quantized_linears({"l": lin}, spec, output_shift={"l": shift}):
        outs = [lin(x[:20]), lin(x[20:])]
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(outs).mean(0), lin(x).mean(0), atol=1e-12, rtol=0)


def test_linear_quantization_spec():
    assert LinearQuantization(act_bits=4, act_granularity="token", act_symmetric=False,
                              weight_bits=8).describe() == "W8 per-channel | A4 per-token dynamic asymmetric"
    assert LinearQuantization(act_bits=None).describe() == "float"
    with pytest.raises(ValueError, match="per-token ranges are dynamic"):
        LinearQuantization(act_granularity="token", static=True)
    with pytest.raises(ValueError, match="bits"):
        LinearQuantization(act_bits=1)
    with pytest.raises(TypeError, match="static"):
        LinearQuantization(static=1)


def test_bad_deployable_inputs():
    lin = _lin()
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="lo must not exceed hi"):
        quantize_with_range(x, 8, 1.0, -1.0)
    with pytest.raises(ValueError, match="broadcast"):
        quantize_with_range(x, 8, np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="NaN"):
        quantize_with_range(x, 8, np.nan, 1.0)
    with pytest.raises(TypeError, match="symmetric"):
        quantize_with_range(x, 8, 0.0, 1.0, symmetric="no")
    with pytest.raises(ValueError, match="2-D"):
        quantize_weight(np.ones(3), 4)
    with pytest.raises(ValueError, match="granularity"):
        quantize_weight(np.ones((2, 2)), 4, granularity="token")
    with pytest.raises(ValueError, match="alpha"):
        smoothquant_scales(np.ones(2), np.ones((2, 2)), 1.5)
    with pytest.raises(ValueError, match="shape"):
        smoothquant_scales(np.ones(3), np.ones((2, 2)), 0.5)
    with pytest.raises(ValueError, match=">= 0"):
        smoothquant_scales(-np.ones(2), np.ones((2, 2)), 0.5)
    spec = LinearQuantization(act_bits=8, static=True)
    with pytest.raises(ValueError, match="missing"):
        with quantized_linears({"l": lin}, spec):
            pass
    with pytest.raises(ValueError, match="not in modules"):
        with quantized_linears({"l": lin}, LinearQuantization(), smooth={"m": np.ones(6)}):
            pass
    with pytest.raises(ValueError, match="positive"):
        with quantized_linears({"l": lin}, LinearQuantization(), smooth={"l": -np.ones(6)}):
            pass
    with pytest.raises(ValueError, match="shape"):
        with quantized_linears({"l": lin}, LinearQuantization(), output_shift={"l": np.ones(6)}):
            pass
    with pytest.raises(TypeError, match="LinearQuantization"):
        with quantized_linears({"l": lin}, "A8"):
            pass
    with pytest.raises(TypeError, match="not torch.nn.Linear"):
        with quantized_linears({"l": torch.nn.ReLU()}, LinearQuantization()):
            pass
    with pytest.raises(ValueError, match="shape"):
        weight_bias_correction(np.ones((2, 3)), np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        weight_bias_correction(np.ones((2, 3)), np.full((2, 3), np.nan), np.ones(3))
    with pytest.raises(ValueError, match="mean_error"):
        activation_bias_correction(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="act_bits"):
        mean_quantization_error(lin, [torch.ones(1, 6, dtype=torch.float64)], {"l": lin},
                                LinearQuantization(act_bits=None))
    with pytest.raises(ValueError, match="batches is empty"):
        mean_quantization_error(lin, [], {"l": lin}, LinearQuantization())
    assert not lin._forward_pre_hooks and not lin._forward_hooks


def test_compression_sweep_scheme_names_parse():
    from companion.experiments.compression_sweep import CompressionBench, _quantization_schemes

    bench = object.__new__(CompressionBench)
    bench.activation = lambda bits, gran, **kw: ("A", bits, gran, kw)
    bench.weights = lambda bits, **kw: ("W", bits, kw)
    got = {n: bench.scheme(n) for n in _quantization_schemes((0.5,))}
    assert got["A8 tensor static asym"] == ("A", 8, "tensor", {"symmetric": False, "static": True,
                                                                "weight_bits": None})
    assert got["W4 asym, bias corr"] == ("W", 4, {"symmetric": False, "bias_correction": True})
    assert got["W8A8 tensor static, SQ alpha=0.5"] == ("A", 8, "tensor", {"symmetric": True, "static": True,
                                                                          "weight_bits": 8, "alpha": 0.5})
    assert got["A8 tensor dynamic, top-4 float"][3]["keep"] == 4
    assert got["A4 token dynamic, centred on mean"][3]["center"] is True
    assert len(got) == len(set(got)) == 19 + 2 + 2
