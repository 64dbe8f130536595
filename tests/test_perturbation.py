"""Tests for companion.injection.metrics: metrics, output effects, the Post-LN / Pre-LN predictions, the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.injection import metrics as fw


# --------------------------------------------------------------------------------------------
# perturbation_metrics
# --------------------------------------------------------------------------------------------
def _reference_metrics(base, inj, v):
    """Plain per-vector loop: the definitions, written out one position at a time."""
    out = {k: np.empty(base.shape[:-1]) for k in fw.METRIC_NAMES}
    vv = np.broadcast_to(v, base.shape[1:])
    for idx in np.ndindex(base.shape[:-1]):
        hb, hi = base[idx], inj[idx]
        vec = vv[idx[1:]]
        d = hi - hb
        vhat = vec / np.sqrt(vec @ vec)
        out["projection"][idx] = d @ vhat
        out["delta_norm"][idx] = np.sqrt(d @ d)
        out["cos_delta_v"][idx] = (d @ vhat) / np.sqrt(d @ d) if d @ d > 0 else np.nan
        out["relative_size"][idx] = np.sqrt(d @ d) / np.sqrt(hb @ hb)
        out["norm_ratio"][idx] = np.sqrt(hi @ hi) / np.sqrt(hb @ hb)
        out["cos_inj_base"][idx] = (hb @ hi) / np.sqrt((hb @ hb) * (hi @ hi))
    return out


def test_metrics_match_reference_loop():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((5, 2, 3, 7))
    inj = base.copy()
    inj[2:] += 0.3 * rng.standard_normal((3, 2, 3, 7))
    v = rng.standard_normal(7)
    got = fw.perturbation_metrics(base, inj, v)
    ref = _reference_metrics(base, inj, v)
    assert tuple(got) == fw.METRIC_NAMES
    for k in fw.METRIC_NAMES:
        assert got[k].shape == (5, 2, 3)
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-12, atol=1e-12, equal_nan=True)
    # before the injection the runs agree: delta = 0, cosine to v undefined, cos(h_inj, h_base) = 1
    assert np.all(got["delta_norm"][:2] == 0)
    assert np.all(np.isnan(got["cos_delta_v"][:2]))
    np.testing.assert_allclose(got["cos_inj_base"][:2], 1.0)


def test_metrics_accept_torch_and_per_position_directions():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 3, 6, generator=g)
    inj = base + 0.1 * torch.randn(4, 3, 6, generator=g)
    v = torch.randn(3, 6, generator=g)  # one direction per position
    got = fw.perturbation_metrics(base, inj, v)
    ref = _reference_metrics(base.double().numpy(), inj.double().numpy(), v.double().numpy())
    for k in fw.METRIC_NAMES:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-12)


def test_metrics_scale_invariance_of_v_and_sign():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((3, 8))
    inj = base + rng.standard_normal((3, 8))
    v = rng.standard_normal(8)
    a = fw.perturbation_metrics(base, inj, v)
    b = fw.perturbation_metrics(base, inj, -3.0 * v)
    np.testing.assert_allclose(b["projection"], -a["projection"])
    np.testing.assert_allclose(b["delta_norm"], a["delta_norm"])


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 20), st.floats(0.01, 10.0))
def test_metrics_bounds_property(d, scale):
    rng = np.random.default_rng(d)
    base = rng.standard_normal((3, 4, d))
    inj = base + scale * rng.standard_normal((3, 4, d))
    m = fw.perturbation_metrics(base, inj, rng.standard_normal(d))
    assert np.all(np.abs(m["projection"]) <= m["delta_norm"] * (1 + 1e-12))
    assert np.all(np.abs(m["cos_delta_v"]) <= 1) and np.all(np.abs(m["cos_inj_base"]) <= 1)
    # triangle inequality: | ||h_inj|| - ||h_base|| | <= ||delta||
    assert np.all(np.abs(m["norm_ratio"] - 1) <= m["relative_size"] * (1 + 1e-12))


def test_metrics_zero_baseline_gives_nan_not_error():
    base = np.zeros((2, 3))
    inj = np.array([[0.0, 0, 0], [1.0, 0, 0]])
    m = fw.perturbation_metrics(base, inj, [1.0, 0, 0])
    assert np.isnan(m["relative_size"][1]) and np.isnan(m["cos_inj_base"][1])
    assert m["projection"][1] == 1.0


@pytest.mark.parametrize(
    "base, inj, v, err, match",
    [
        (np.zeros(4), np.zeros(4), np.ones(4), ValueError, "at least 2"),
        (np.zeros((2, 4)), np.zeros((3, 4)), np.ones(4), ValueError, "must match"),
        (np.zeros((2, 4)), np.zeros((2, 4)), np.ones(5), ValueError, "last dimension"),
        (np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), np.ones((2, 4)), ValueError, "broadcast"),
        (np.zeros((2, 4)), np.zeros((2, 4)), np.ones((2, 4)), ValueError, "must not add"),
        (np.zeros((2, 4)), np.zeros((2, 4)), np.zeros(4), ValueError, "non-zero"),
        (np.full((2, 4), np.nan), np.zeros((2, 4)), np.ones(4), ValueError, "NaN"),
        (np.zeros((2, 4)), np.zeros((2, 4)), np.array([1.0, np.inf, 0, 0]), ValueError, "NaN"),
        (np.array([["a", "b"]]), np.zeros((1, 2)), np.ones(2), TypeError, "real numbers"),
        (None, np.zeros((2, 4)), np.ones(4), TypeError, "None"),
        (np.zeros((2, 2)), np.zeros((2, 2)), np.ones(2, dtype=complex), TypeError, "real"),
    ],
)
def test_metrics_errors(base, inj, v, err, match):
    with pytest.raises(err, match=match):
        fw.perturbation_metrics(base, inj, v)


def test_metrics_rejects_complex_tensor():
    with pytest.raises(TypeError, match="complex"):
        fw.perturbation_metrics(torch.zeros(2, 2, dtype=torch.cfloat), np.zeros((2, 2)), [1.0, 0])


# --------------------------------------------------------------------------------------------
# normalisation_scale and the Post-LN factors
# --------------------------------------------------------------------------------------------
def test_normalisation_scale_matches_torch_norms():
    x = torch.randn(5, 16, dtype=torch.float64) * 3 + 1
    for eps in (0.0, 1e-5, 0.5):
        s = fw.normalisation_scale(x, eps)
        y = torch.nn.functional.layer_norm(x, (16,), eps=eps)
        np.testing.assert_allclose(y.numpy() * s[:, None], (x - x.mean(-1, keepdim=True)).numpy(),
                                   rtol=1e-10, atol=1e-10)
        s_rms = fw.normalisation_scale(x, eps, norm="rmsnorm")
        y_rms = torch.nn.functional.rms_norm(x, (16,), eps=eps)
        np.testing.assert_allclose(y_rms.numpy() * s_rms[:, None], x.numpy(), rtol=1e-10)


@pytest.mark.parametrize(
    "x, eps, err, match",
    [
        (np.ones(1), 0.0, ValueError, "d >= 2"),
        (np.float64(3.0), 0.0, ValueError, "d >= 2"),
        (np.ones(3), -1.0, ValueError, "eps must be >= 0"),
        (np.ones(3), "a", TypeError, "real number"),
        (np.array([1.0, np.nan]), 0.0, ValueError, "NaN"),
        (np.ones(3), float("nan"), ValueError, "finite"),
    ],
)
def test_normalisation_scale_errors(x, eps, err, match):
    with pytest.raises(err, match=match):
        fw.normalisation_scale(x, eps)
    with pytest.raises(ValueError, match="rmsnorm"):
        fw.normalisation_scale(np.ones(3), norm="batchnorm")


def test_postln_factor_is_first_order_exact_for_one_layernorm():
    """One Post-LN step with F = 0: d(v.LN(u + t v))/dt at t = 0 equals 1/s when v is
    orthogonal to 1 and to the centred input (the proposition's assumptions)."""
    g = torch.Generator().manual_seed(3)
    d = 32
    u = 2.5 * torch.randn(d, generator=g, dtype=torch.float64) + 0.7
    y = u - u.mean()
    v = torch.randn(d, generator=g, dtype=torch.float64)
    for w in (torch.ones(d, dtype=torch.float64), y):  # remove the 1 and y components
        v = v - (v @ w) / (w @ w) * w
    v = v / v.norm()
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.layer_norm(u + t * v, (d,), eps=1e-5)
    (grad,) = torch.autograd.grad(v @ out, t)
    f = fw.postln_contraction_factors(u[None, None].numpy(), eps=1e-5)
    np.testing.assert_allclose(float(grad), float(f.ravel()[0]), rtol=1e-10)


def test_postln_factor_with_gain_and_residual_scale():
    rng = np.random.default_rng(0)
    u = rng.standard_normal((3, 2, 10))
    v = rng.standard_normal(10)
    gamma = rng.uniform(0.5, 2.0, size=(3, 1, 10))
    f = fw.postln_contraction_factors(u, residual_scale=0.8, ln_weight=gamma, v=v)
    vhat2 = (v / np.linalg.norm(v)) ** 2
    expected = 0.8 * (gamma[:, 0] @ vhat2)[:, None] / np.std(u, axis=-1)
    np.testing.assert_allclose(f, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="as many axes"):  # [L, d] would align L with tokens
        fw.postln_contraction_factors(u, ln_weight=gamma[:, 0], v=v)
    with pytest.raises(ValueError, match="does not broadcast"):
        fw.postln_contraction_factors(u, ln_weight=np.ones((2, 1, 10)), v=v)
    # RMSNorm divides by the root mean square instead of the centred scale
    f_rms = fw.postln_contraction_factors(u, norm="rmsnorm")
    np.testing.assert_allclose(f_rms, 1 / np.sqrt(np.mean(u**2, axis=-1)))
    # a shared gain vector broadcasts over layers
    f1 = fw.postln_contraction_factors(u, ln_weight=np.full(10, 2.0), v=v)
    np.testing.assert_allclose(f1, 2.0 / np.std(u, axis=-1))


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(ln_inputs=np.ones(4)), ValueError, "at least 2"),
        (dict(ln_inputs=np.ones((2, 4)), residual_scale=0.0), ValueError, "lambda"),
        (dict(ln_inputs=np.ones((2, 4)), residual_scale=True), TypeError, "real number"),
        (dict(ln_inputs=np.ones((2, 4)), ln_weight=np.ones(4)), ValueError, "without v"),
        (dict(ln_inputs=np.ones((2, 4)), ln_weight=np.ones(3), v=np.ones(4)), ValueError, "ln_weight must"),
        (dict(ln_inputs=np.ones((2, 4)), norm="layer"), ValueError, "rmsnorm"),
        (dict(ln_inputs=np.ones((2, 4)), ln_weight=np.ones(4), v=np.ones(3)), ValueError, "v must have"),
        (dict(ln_inputs=np.ones((2, 4)), ln_weight=np.ones(4), v=np.zeros(4)), ValueError, "non-zero"),
        (dict(ln_inputs=np.ones((2, 4)), ln_weight=np.full(4, np.nan), v=np.ones(4)), ValueError, "NaN"),
    ],
)
def test_postln_factor_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        fw.postln_contraction_factors(**kwargs)


def test_predicted_projection_is_cumulative_product():
    rng = np.random.default_rng(4)
    f = rng.uniform(0.5, 1.5, size=(6, 3))
    p0 = rng.standard_normal(3)
    out = fw.predicted_projection(f, 2, p0)
    assert out.shape == (7, 3)
    assert np.all(out[:2] == 0)
    for m in range(3, 7):
        np.testing.assert_allclose(out[m], p0 * np.prod(f[2:m], axis=0))
    np.testing.assert_allclose(fw.predicted_projection(f, 6, p0)[6], p0)


@pytest.mark.parametrize(
    "factors, layer, initial, err, match",
    [
        (np.ones(0), 0, 1.0, ValueError, "L >= 1"),
        (np.ones(3), 4, 1.0, ValueError, r"\[0, 3\]"),
        (np.ones(3), -1, 1.0, ValueError, ">= 0"),
        (np.ones(3), 1.0, 1.0, TypeError, "integer"),
        (np.ones((3, 2)), 0, np.ones(3), ValueError, "broadcast"),
        (np.array([1.0, np.inf]), 0, 1.0, ValueError, "NaN"),
        (np.ones(3), 0, np.nan, ValueError, "NaN"),
    ],
)
def test_predicted_projection_errors(factors, layer, initial, err, match):
    with pytest.raises(err, match=match):
        fw.predicted_projection(factors, layer, initial)


# --------------------------------------------------------------------------------------------
# Pre-LN dilution
# --------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.floats(0.0, 5.0), st.integers(1, 40), st.floats(0.1, 100.0))
def test_fit_norm_growth_recovers_exact_line(c, n_layers, h0):
    sq = h0 * (1 + c * np.arange(n_layers + 1))
    assert fw.fit_norm_growth(sq) == pytest.approx(c, rel=1e-9, abs=1e-12)


def test_dilution_factor_values():
    out = fw.dilution_factor(0.5, 2, np.arange(2, 7))
    np.testing.assert_allclose(out, np.sqrt(2.0 / (1 + 0.5 * np.arange(2, 7))))
    assert fw.dilution_factor(0.0, 3, [3, 10]).tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "sq, match",
    [(np.ones((2, 2)), "1-D"), ([1.0], "at least 2"), ([0.0, 1.0], "sq_norms\\[0\\]"),
     ([1.0, -1.0], "non-negative"), ([1.0, np.nan], "NaN")],
)
def test_fit_norm_growth_errors(sq, match):
    with pytest.raises(ValueError, match=match):
        fw.fit_norm_growth(sq)


@pytest.mark.parametrize(
    "c, layer, layers, err, match",
    [
        (-0.1, 0, [1], ValueError, "c must be >= 0"),
        (float("inf"), 0, [1], ValueError, "finite"),
        ("x", 0, [1], TypeError, "real number"),
        (1.0, -1, [1], ValueError, ">= 0"),
        (1.0, 2, [1, 3], ValueError, ">= inject_layer"),
        (1.0, 0, [0.5], TypeError, "integers"),
    ],
)
def test_dilution_factor_errors(c, layer, layers, err, match):
    with pytest.raises(err, match=match):
        fw.dilution_factor(c, layer, layers)


# --------------------------------------------------------------------------------------------
# the window
# --------------------------------------------------------------------------------------------
def test_window_relative_and_absolute():
    e = np.array([0.1, 0.9, 1.0, 0.3, 0.55])
    w = fw.effect_window(e, layers=[0, 2, 4, 6, 8], n_layers=10, threshold=0.5, contiguous=False)
    assert w.layers.tolist() == [2, 4, 8] and w.best == 4
    assert (w.first, w.last) == (2, 8)
    assert w.best_fraction == 0.4 and w.first_fraction == 0.2 and w.last_fraction == 0.8
    assert w.size_fraction == pytest.approx(0.3)
    wc = fw.effect_window(e, layers=[0, 2, 4, 6, 8], n_layers=10, threshold=0.5)
    assert wc.layers.tolist() == [2, 4] and (wc.first, wc.last, wc.best) == (2, 4, 4)
    w_abs = fw.effect_window(e, threshold=0.95, relative=False)
    assert w_abs.layers.tolist() == [2] and w_abs.n_layers == 5
    empty = fw.effect_window(e, threshold=2.0, relative=False)
    assert empty.layers.size == 0 and empty.first == -1 and empty.last == -1
    zero = fw.effect_window(np.zeros(3))
    assert zero.layers.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(effect=np.ones((2, 2))), ValueError, "1-D"),
        (dict(effect=[]), ValueError, "non-empty"),
        (dict(effect=[1.0, -0.1]), ValueError, "non-negative"),
        (dict(effect=[1.0, np.nan]), ValueError, "NaN"),
        (dict(effect=[1.0, 2.0], relative=1), TypeError, "bool"),
        (dict(effect=[1.0, 2.0], contiguous=None), TypeError, "bool"),
        (dict(effect=[1.0, 2.0], layers=[0.0, 1.0]), TypeError, "integers"),
        (dict(effect=[1.0, 2.0], layers=[0]), ValueError, "shape"),
        (dict(effect=[1.0, 2.0], layers=[1, 1]), ValueError, "strictly increasing"),
        (dict(effect=[1.0, 2.0], layers=[0, 5], n_layers=4), ValueError, "n_layers = 4"),
        (dict(effect=[1.0, 2.0], n_layers=0), ValueError, ">= 1"),
        (dict(effect=[1.0, 2.0], threshold=1.5), ValueError, r"\(0, 1\]"),
        (dict(effect=[1.0, 2.0], threshold=0.0, relative=False), ValueError, "> 0"),
    ],
)
def test_window_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        fw.effect_window(**kwargs)


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(fw, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5 and result.failed == 0


def test_predicted_window_matches_the_laws():
    # Post-LN: brute force over l of f^(L-1-l) >= tau
    for f in (0.3, 0.7, 0.9, 0.97):
        for L in (4, 16, 64):
            first, last = fw.predicted_window("post", L, 0.5, factor=f)
            brute = [l for l in range(L) if f ** (L - 1 - l) >= 0.5]
            assert (first, last) == (brute[0], L - 1)
    # Pre-LN: brute force of sqrt((1 + c l) / (1 + c (L - 1))) >= tau
    for c in (0.05, 0.3, 1.2, 10.0):
        for L in (4, 16, 64):
            first, _ = fw.predicted_window("pre", L, 0.5, c=c)
            brute = [l for l in range(L) if np.sqrt((1 + c * l) / (1 + c * (L - 1))) >= 0.5 - 1e-12]
            assert first == brute[0]
    assert fw.predicted_window("pre", 8, c=0.0) == (0, 7)
    assert fw.predicted_window("post", 8, factor=1.0) == (0, 7)


@pytest.mark.parametrize(
    "args, kwargs, err, match",
    [
        (("mid", 8), dict(factor=0.5), ValueError, "placement"),
        (("post", 8), dict(), ValueError, "needs factor"),
        (("pre", 8), dict(), ValueError, "needs c"),
        (("post", 8), dict(factor=1.5), ValueError, r"\(0, 1\]"),
        (("pre", 8), dict(c=-1.0), ValueError, ">= 0"),
        (("pre", 0), dict(c=1.0), ValueError, ">= 1"),
        (("pre", 8, 0.0), dict(c=1.0), ValueError, "threshold"),
        (("pre", 8.0), dict(c=1.0), TypeError, "integer"),
    ],
)
def test_predicted_window_errors(args, kwargs, err, match):
    with pytest.raises(err, match=match):
        fw.predicted_window(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# next_token_kl
# --------------------------------------------------------------------------------------------
def test_kl_closed_form_two_tokens():
    # p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 log(2/3) + 1/2 log 2
    want = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)
    got = fw.next_token_kl([0.0, 0.0], [np.log(3.0), 0.0])
    assert got.shape == ()
    assert abs(float(got) - want) < 1e-12


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(-50, 50))
def test_kl_properties(seed, shift):
    rng = np.random.default_rng(seed)
    a = 3 * rng.standard_normal((4, 11))
    b = 3 * rng.standard_normal((4, 11))
    kl = fw.next_token_kl(a, b)
    assert kl.shape == (4,)
    assert np.all(kl >= 0)
    np.testing.assert_allclose(fw.next_token_kl(a, a), 0.0, atol=1e-12)
    # logits are defined up to an additive constant per row
    np.testing.assert_allclose(fw.next_token_kl(a + shift, b - shift), kl, rtol=1e-9, atol=1e-10)
    # reference: the definition with explicit probabilities
    p = np.exp(a - a.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    q = np.exp(b - b.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
    np.testing.assert_allclose(kl, np.sum(p * np.log(p / q), -1), rtol=1e-9, atol=1e-12)


def test_kl_accepts_torch_and_is_asymmetric():
    a = torch.tensor([[4.0, 0.0, 0.0]])
    b = torch.tensor([[0.0, 0.0, 0.0]])
    assert not np.isclose(fw.next_token_kl(a, b)[0], fw.next_token_kl(b, a)[0])


def test_kl_errors():
    with pytest.raises(ValueError, match="shape"):
        fw.next_token_kl(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="NaN"):
        fw.next_token_kl([0.0, np.nan], [0.0, 0.0])
    with pytest.raises(ValueError, match="vocabulary"):
        fw.next_token_kl(np.float64(1.0), np.float64(1.0))
    with pytest.raises(TypeError, match="real numbers"):
        fw.next_token_kl(["a", "b"], ["c", "d"])


# --------------------------------------------------------------------------------------------
# embedding_change
# --------------------------------------------------------------------------------------------
def test_embedding_change_values():
    e = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    f = np.array([[0.0, 3.0], [-1.0, -1.0], [5.0, 0.0]])
    np.testing.assert_allclose(fw.embedding_change(e, f), [1.0, 2.0, 0.0], atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 100))
def test_embedding_change_scale_invariant(seed, c):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((2, 5, 7))
    got = fw.embedding_change(a, b)
    np.testing.assert_allclose(fw.embedding_change(c * a, b / c), got, rtol=1e-9, atol=1e-12)
    assert np.all((got >= 0) & (got <= 2))


def test_embedding_change_errors():
    with pytest.raises(ValueError, match="shape"):
        fw.embedding_change(np.ones((2, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="zero vector"):
        fw.embedding_change(np.zeros((1, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="NaN"):
        fw.embedding_change([[np.inf, 1.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="last axis"):
        fw.embedding_change(np.float64(1.0), np.float64(1.0))


def test_metrics_centred_against_a_reference():
    g = np.random.default_rng(5)
    base = g.standard_normal((3, 2, 4, 6)) + 10.0       # a large shared mean
    inj = base + 0.3 * g.standard_normal(base.shape)
    v = g.standard_normal(6)
    mu = base.mean(axis=(1, 2))                          # [L+1, d]
    raw = fw.perturbation_metrics(base, inj, v)
    cen = fw.perturbation_metrics(base, inj, v, centre=mu)
    for name in ("projection", "cos_delta_v", "delta_norm"):
        np.testing.assert_array_equal(raw[name], cen[name])
    hb, hi = base - mu[:, None, None], inj - mu[:, None, None]
    dn = np.linalg.norm(inj - base, axis=-1)
    np.testing.assert_allclose(cen["relative_size"], dn / np.linalg.norm(hb, axis=-1), rtol=1e-12)
    cos = np.sum(hb * hi, -1) / np.linalg.norm(hb, axis=-1) / np.linalg.norm(hi, axis=-1)
    np.testing.assert_allclose(cen["cos_inj_base"], cos, rtol=1e-12)
    np.testing.assert_allclose(cen["norm_ratio"],
                               np.linalg.norm(hi, axis=-1) / np.linalg.norm(hb, axis=-1))
    # the shared mean hides the perturbation from the raw cosine, not from the centred one
    assert raw["cos_inj_base"].min() > cen["cos_inj_base"].max()
    with pytest.raises(ValueError, match="centre must have shape"):
        fw.perturbation_metrics(base, inj, v, centre=mu[0])
    with pytest.raises(ValueError, match="NaN|finite"):
        fw.perturbation_metrics(base, inj, v, centre=np.full_like(mu, np.nan))
