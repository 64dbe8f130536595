"""Tests of companion.theory.normalisation: values against PyTorch, Jacobians against autograd and finite
differences, the spectral and geometric properties the chapter states, and every input error."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from companion.theory.normalisation import (
    autograd_jacobian, layernorm, layernorm_jacobian, rmsnorm, rmsnorm_jacobian,
)

EPS_VALUES = [0.0, 1e-5, 0.3]


def _vectors(min_d=3, max_d=24):
    """Random vectors whose spread is not tiny (so eps = 0 is well conditioned)."""
    elems = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
    return st.integers(min_d, max_d).flatmap(lambda d: arrays(np.float64, d, elements=elems)).filter(
        lambda x: np.std(x) > 1e-2
    )


def _finite_difference_jacobian(f, x, h=1e-6):
    cols = [(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)]
    return np.stack(cols, axis=1)


# ----------------------------------------------------------------------------- values
@pytest.mark.parametrize("eps", EPS_VALUES)
def test_layernorm_matches_torch(eps):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 10)) * 2 + 1
    gamma, beta = rng.normal(size=10), rng.normal(size=10)
    ref = torch.nn.functional.layer_norm(
        torch.tensor(x), (10,), torch.tensor(gamma), torch.tensor(beta), eps=eps
    ).numpy()
    np.testing.assert_allclose(layernorm(x, eps, gamma, beta), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_rmsnorm_matches_torch(eps):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 7)) + 0.5
    gamma = rng.normal(size=7)
    ref = torch.nn.functional.rms_norm(torch.tensor(x), (7,), torch.tensor(gamma), eps=eps).numpy()
    np.testing.assert_allclose(rmsnorm(x, eps, gamma), ref, rtol=1e-12, atol=1e-12)


@given(_vectors())
@settings(max_examples=40, deadline=None)
def test_layernorm_image_is_sphere_in_mean_zero_hyperplane(x):
    y = layernorm(x, eps=0.0)
    d = x.size
    assert abs(y.mean()) < 1e-9
    assert np.linalg.norm(y) == pytest.approx(np.sqrt(d), rel=1e-9)


@given(_vectors())
@settings(max_examples=40, deadline=None)
def test_rmsnorm_image_is_sphere_not_centred(x):
    y = rmsnorm(x, eps=0.0)
    assert np.linalg.norm(y) == pytest.approx(np.sqrt(x.size), rel=1e-9)


@given(_vectors(), st.floats(0.01, 100), st.floats(-50, 50))
@settings(max_examples=40, deadline=None)
def test_layernorm_zero_homogeneous_and_shift_invariant(x, alpha, c):
    base = layernorm(x, eps=0.0)
    np.testing.assert_allclose(layernorm(alpha * x, eps=0.0), base, atol=1e-9)
    np.testing.assert_allclose(layernorm(-alpha * x, eps=0.0), -base, atol=1e-9)
    np.testing.assert_allclose(layernorm(x + c, eps=0.0), base, atol=1e-7)


def test_eps_breaks_homogeneity_for_small_inputs():
    x = np.array([1.0, -2.0, 0.5, 3.0])
    big, small = layernorm(1e3 * x, eps=1e-5), layernorm(1e-3 * x, eps=1e-5)
    np.testing.assert_allclose(big, layernorm(x, eps=0.0), rtol=1e-8)
    # std(1e-3 x) ~ 1.9e-3, so var ~ 3.7e-6 < eps: the output shrinks by sqrt(var / (var + eps))
    var = np.var(1e-3 * x)
    np.testing.assert_allclose(np.linalg.norm(small), 2 * np.sqrt(var / (var + 1e-5)), rtol=1e-10)
    assert np.linalg.norm(small) < 0.6 * np.linalg.norm(big)


def test_affine_gain_and_bias():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    g, b = np.array([2.0, 1.0, 0.5, 3.0]), np.array([0.0, 1.0, -1.0, 2.0])
    np.testing.assert_allclose(layernorm(x, 0.0, g, b), g * layernorm(x, 0.0) + b)
    np.testing.assert_allclose(rmsnorm(x, 0.0, g), g * rmsnorm(x, 0.0))


# ----------------------------------------------------------------------------- Jacobians
@pytest.mark.parametrize("eps", EPS_VALUES)
@given(x=_vectors())
@settings(max_examples=25, deadline=None)
def test_layernorm_jacobian_matches_autograd(eps, x):
    np.testing.assert_allclose(layernorm_jacobian(x, eps), autograd_jacobian(x, "layernorm", eps),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("eps", EPS_VALUES)
@given(x=_vectors())
@settings(max_examples=25, deadline=None)
def test_rmsnorm_jacobian_matches_autograd(eps, x):
    np.testing.assert_allclose(rmsnorm_jacobian(x, eps), autograd_jacobian(x, "rmsnorm", eps),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_jacobians_match_finite_differences(eps):
    x = np.random.default_rng(3).normal(size=9) * 1.5
    fd_ln = _finite_difference_jacobian(lambda v: layernorm(v, eps), x)
    fd_rms = _finite_difference_jacobian(lambda v: rmsnorm(v, eps), x)
    np.testing.assert_allclose(layernorm_jacobian(x, eps), fd_ln, atol=1e-7)
    np.testing.assert_allclose(rmsnorm_jacobian(x, eps), fd_rms, atol=1e-7)


@given(_vectors())
@settings(max_examples=40, deadline=None)
def test_layernorm_jacobian_spectrum(x):
    d = x.size
    J = layernorm_jacobian(x, eps=0.0)
    y = x - x.mean()
    inv_std = np.sqrt(d) / np.linalg.norm(y)
    np.testing.assert_allclose(J, J.T, atol=1e-12)                     # symmetric
    np.testing.assert_allclose(J.sum(axis=1), 0.0, atol=1e-9 * inv_std)  # rows sum to zero: J 1 = 0
    np.testing.assert_allclose(J @ y, 0.0, atol=1e-9 * inv_std * np.linalg.norm(y))
    ev = np.sort(np.linalg.eigvalsh(J))
    np.testing.assert_allclose(ev[:2], 0.0, atol=1e-9 * inv_std)       # null space {1, y}
    np.testing.assert_allclose(ev[2:], inv_std, rtol=1e-9)             # 1/std on the rest
    assert np.linalg.norm(J, 2) == pytest.approx(inv_std, rel=1e-9)    # = sqrt(d)/||y||
    # J * std is an orthogonal projector of rank d - 2
    Pm = J / inv_std
    np.testing.assert_allclose(Pm @ Pm, Pm, atol=1e-9)
    assert np.linalg.matrix_rank(Pm, tol=1e-8) == d - 2


def test_layernorm_jacobian_with_eps_along_centred_input():
    x = np.array([0.1, -0.3, 0.2, 0.05, -0.01])
    eps = 0.05
    y = x - x.mean()
    s = np.sqrt(np.mean(y**2) + eps)
    J = layernorm_jacobian(x, eps)
    np.testing.assert_allclose(J @ y, eps / s**3 * y, rtol=1e-10)
    np.testing.assert_allclose(J @ np.ones(5), 0.0, atol=1e-12)
    assert np.linalg.norm(J, 2) == pytest.approx(1 / s, rel=1e-10)


def test_constant_input_with_eps_has_projector_jacobian():
    x = np.full(6, 2.5)
    J = layernorm_jacobian(x, eps=0.01)
    np.testing.assert_allclose(J, (np.eye(6) - 1 / 6) / 0.1, atol=1e-12)


@given(_vectors())
@settings(max_examples=40, deadline=None)
def test_rmsnorm_jacobian_spectrum(x):
    d = x.size
    J = rmsnorm_jacobian(x, eps=0.0)
    inv_r = np.sqrt(d) / np.linalg.norm(x)
    np.testing.assert_allclose(J @ x, 0.0, atol=1e-9 * inv_r * np.linalg.norm(x))
    ev = np.sort(np.linalg.eigvalsh(J))
    np.testing.assert_allclose(ev[0], 0.0, atol=1e-9 * inv_r)
    np.testing.assert_allclose(ev[1:], inv_r, rtol=1e-9)


def test_rmsnorm_rows_do_not_sum_to_zero():
    x = np.array([1.0, 2.0, 3.0])
    assert np.abs(rmsnorm_jacobian(x).sum(axis=1)).max() > 0.1


@given(_vectors(), st.floats(0.05, 20))
@settings(max_examples=30, deadline=None)
def test_jacobian_is_homogeneous_of_degree_minus_one(x, alpha):
    np.testing.assert_allclose(layernorm_jacobian(alpha * x), layernorm_jacobian(x) / alpha,
                               rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(rmsnorm_jacobian(alpha * x), rmsnorm_jacobian(x) / alpha,
                               rtol=1e-8, atol=1e-10)


def test_spectral_norm_below_one_when_std_above_one():
    x = np.random.default_rng(4).normal(size=64) * 3.0
    assert np.linalg.norm(layernorm_jacobian(x), 2) < 0.5


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("fn", [layernorm_jacobian, rmsnorm_jacobian])
def test_jacobian_rejects_non_1d(fn):
    with pytest.raises(ValueError, match="1-D"):
        fn(np.ones((2, 3)))
    with pytest.raises(ValueError, match="1-D"):
        fn(3.0)


@pytest.mark.parametrize("fn", [layernorm, rmsnorm, layernorm_jacobian, rmsnorm_jacobian])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nan_and_inf(fn, bad):
    with pytest.raises(ValueError, match="NaN or infinite"):
        fn(np.array([1.0, bad, 2.0]))


@pytest.mark.parametrize("fn", [layernorm, layernorm_jacobian])
def test_layernorm_constant_input_with_zero_eps(fn):
    with pytest.raises(ValueError, match="constant"):
        fn(np.full(5, 3.0), eps=0.0)


def test_layernorm_batch_with_one_constant_row():
    with pytest.raises(ValueError, match="constant"):
        layernorm(np.array([[1.0, 2.0], [4.0, 4.0]]), eps=0.0)


@pytest.mark.parametrize("fn", [rmsnorm, rmsnorm_jacobian])
def test_rmsnorm_zero_input_with_zero_eps(fn):
    with pytest.raises(ValueError, match="all zero"):
        fn(np.zeros(4), eps=0.0)


@pytest.mark.parametrize("fn", [layernorm, rmsnorm, layernorm_jacobian, rmsnorm_jacobian])
def test_eps_errors(fn):
    with pytest.raises(ValueError, match="eps"):
        fn(np.arange(3.0), eps=-1e-3)
    with pytest.raises(ValueError, match="eps"):
        fn(np.arange(3.0), eps=float("nan"))
    with pytest.raises(TypeError, match="eps"):
        fn(np.arange(3.0), eps="small")
    with pytest.raises(TypeError, match="eps"):
        fn(np.arange(3.0), eps=True)


@pytest.mark.parametrize("fn", [layernorm, rmsnorm, layernorm_jacobian])
def test_non_numeric_input(fn):
    with pytest.raises(TypeError, match="array of real numbers"):
        fn(["a", "b"])


def test_scalar_and_empty_inputs():
    with pytest.raises(ValueError, match="scalar"):
        layernorm(3.0)
    with pytest.raises(ValueError, match="empty"):
        rmsnorm(np.zeros((2, 0)))


def test_affine_shape_errors():
    with pytest.raises(ValueError, match="gamma must have shape"):
        layernorm(np.arange(4.0), gamma=np.ones(3))
    with pytest.raises(ValueError, match="beta must have shape"):
        layernorm(np.arange(4.0), beta=np.ones((4, 1)))
    with pytest.raises(ValueError, match="gamma must have shape"):
        rmsnorm(np.arange(4.0), gamma=np.ones(5))
    with pytest.raises(ValueError, match="NaN"):
        layernorm(np.arange(4.0), gamma=np.array([1.0, np.nan, 1.0, 1.0]))


def test_autograd_jacobian_errors():
    with pytest.raises(ValueError, match="kind"):
        autograd_jacobian(np.arange(3.0), kind="batchnorm")
    with pytest.raises(ValueError, match="constant"):
        autograd_jacobian(np.ones(3), kind="layernorm", eps=0.0)
    with pytest.raises(ValueError, match="all zero"):
        autograd_jacobian(np.zeros(3), kind="rmsnorm", eps=0.0)
    with pytest.raises(ValueError, match="1-D vector or a 2-D batch"):
        autograd_jacobian(np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="constant"):
        autograd_jacobian(np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]]))


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_autograd_jacobian_batch_matches_rows(eps):
    X = np.random.default_rng(5).normal(size=(6, 11)) * 2 + 1
    ln = autograd_jacobian(X, "layernorm", eps)
    rms = autograd_jacobian(X, "rmsnorm", eps)
    assert ln.shape == rms.shape == (6, 11, 11)
    for k in range(6):
        np.testing.assert_allclose(ln[k], layernorm_jacobian(X[k], eps), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(rms[k], rmsnorm_jacobian(X[k], eps), rtol=1e-10, atol=1e-12)
