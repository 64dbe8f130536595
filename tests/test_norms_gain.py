"""Tests of the gain versions of companion.theory.normalisation' Jacobians and of gain_jacobian_norm_bounds:
against PyTorch autograd with a weight, finite differences, the interlacing bounds, every error."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.theory.normalisation import (
    gain_jacobian_norm_bounds, layernorm, layernorm_jacobian, rmsnorm, rmsnorm_jacobian,
)


def _torch_jacobian(x, gamma, kind, eps):
    """Jacobian of PyTorch's normalisation with a weight, by autograd (independent of norms)."""
    xt, gt = torch.tensor(x), torch.tensor(gamma)
    d = x.size
    if kind == "rmsnorm":
        def f(v):
            return torch.nn.functional.rms_norm(v, (d,), gt, eps=eps)
    else:
        def f(v):
            return torch.nn.functional.layer_norm(v, (d,), gt, torch.zeros(d, dtype=gt.dtype),
                                                  eps=eps)
    return torch.autograd.functional.jacobian(f, xt).numpy()


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.3])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_gain_jacobian_matches_torch_autograd(kind, eps):
    rng = np.random.default_rng(3)
    x = rng.normal(size=9) * 1.7 + 0.4
    gamma = rng.normal(size=9)
    fn = rmsnorm_jacobian if kind == "rmsnorm" else layernorm_jacobian
    np.testing.assert_allclose(fn(x, eps, gamma), _torch_jacobian(x, gamma, kind, eps),
                               rtol=1e-10, atol=1e-12)


def test_gain_jacobian_matches_finite_differences_and_no_gain_default():
    rng = np.random.default_rng(4)
    x, gamma = rng.normal(size=6) + 1.0, rng.uniform(0.5, 2.0, size=6)
    h = 1e-6
    for f, jac in ((lambda v: rmsnorm(v, 1e-5, gamma), rmsnorm_jacobian),
                   (lambda v: layernorm(v, 1e-5, gamma), layernorm_jacobian)):
        fd = np.stack([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(6)], axis=1)
        np.testing.assert_allclose(jac(x, 1e-5, gamma), fd, atol=1e-7)
        np.testing.assert_array_equal(jac(x, 1e-5, np.ones(6)), jac(x, 1e-5))


@given(st.integers(3, 20), st.integers(0, 10_000), st.sampled_from(["rmsnorm", "layernorm"]),
       st.sampled_from([0.0, 1e-5, 0.5]))
@settings(max_examples=60, deadline=None)
def test_bounds_bracket_the_exact_spectral_norm(d, seed, kind, eps):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(d) * rng.uniform(0.1, 10) + rng.normal()
    gamma = rng.standard_normal(d) * rng.uniform(0.1, 5)
    fn = rmsnorm_jacobian if kind == "rmsnorm" else layernorm_jacobian
    exact = np.linalg.norm(fn(x, eps, gamma), 2)
    lo, hi = gain_jacobian_norm_bounds(x, gamma, kind, eps)
    assert lo <= exact * (1 + 1e-9) and exact <= hi * (1 + 1e-9)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_bounds_are_tight_for_equal_top_gains_and_vectorise(kind):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(4, 12)) * 3
    gamma = np.r_[np.full(3, 2.5), rng.uniform(0, 1, size=9)]     # three equal largest gains
    lo, hi = gain_jacobian_norm_bounds(X, gamma, kind)
    assert lo.shape == hi.shape == (4,)
    np.testing.assert_allclose(lo, hi)
    fn = rmsnorm_jacobian if kind == "rmsnorm" else layernorm_jacobian
    exact = [np.linalg.norm(fn(x, 0.0, gamma), 2) for x in X]
    np.testing.assert_allclose(exact, hi, rtol=1e-10)
    one_lo, one_hi = gain_jacobian_norm_bounds(X[0], gamma, kind)
    assert np.ndim(one_hi) == 0 and float(one_hi) == pytest.approx(hi[0])


def test_without_gain_variation_upper_bound_is_one_over_scale():
    x = np.array([1.0, 2.0, 3.0, 6.0])
    lo, hi = gain_jacobian_norm_bounds(x, np.ones(4), "layernorm")
    assert float(hi) == pytest.approx(1 / x.std()) and float(lo) == pytest.approx(1 / x.std())
    lo, hi = gain_jacobian_norm_bounds(x, np.ones(4), "rmsnorm")
    assert float(hi) == pytest.approx(1 / np.sqrt(np.mean(x ** 2)))


@pytest.mark.parametrize("bad, exc", [
    (dict(kind="batchnorm"), ValueError),
    (dict(eps=-1.0), ValueError),
    (dict(eps="0"), TypeError),
    (dict(eps=True), TypeError),
    (dict(eps=float("nan")), ValueError),
    (dict(gamma=np.ones(3)), ValueError),
    (dict(gamma=None), TypeError),
    (dict(gamma="abc"), TypeError),
    (dict(x=np.ones((2, 2, 4))), ValueError),
    (dict(x=np.array([1.0, np.nan, 0.0, 2.0])), ValueError),
    (dict(x=np.zeros(4)), ValueError),
    (dict(x=np.ones(2), gamma=np.ones(2), kind="layernorm"), ValueError),
])
def test_bounds_input_errors(bad, exc):
    args = dict(x=np.array([1.0, -2.0, 0.5, 3.0]), gamma=np.ones(4), kind="rmsnorm", eps=0.0)
    args.update(bad)
    with pytest.raises(exc):
        gain_jacobian_norm_bounds(args["x"], args["gamma"], args["kind"], args["eps"])


@pytest.mark.parametrize("fn", [rmsnorm_jacobian, layernorm_jacobian])
def test_gain_shape_is_checked(fn):
    with pytest.raises(ValueError, match="gamma must have shape"):
        fn(np.array([1.0, 2.0, 4.0]), 0.0, np.ones(2))
