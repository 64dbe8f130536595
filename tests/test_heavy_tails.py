"""Tests of companion.theory.heavy_tails: closed forms, simulations, extreme inputs and every bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from companion.theory import heavy_tails as ht


# ---- psi_alpha_norm
def test_psi_alpha_norm_of_two_point_sample_is_closed_form():
    # mean exp((1/s)^alpha) = 2  <=>  s = (ln 2)^(-1/alpha)
    for alpha in (0.5, 1.0, 2.0, 3.0):
        assert ht.psi_alpha_norm([1.0, -1.0], alpha) == pytest.approx(math.log(2) ** (-1 / alpha), rel=1e-12)


def test_psi_alpha_norm_solves_its_defining_equation():
    x = np.random.default_rng(1).standard_t(5, 2000)
    for alpha in (0.5, 1.0, 2.0):
        s = ht.psi_alpha_norm(x, alpha)
        assert np.mean(np.exp((np.abs(x) / s) ** alpha)) == pytest.approx(2.0, rel=1e-9)


def test_psi_alpha_norm_of_gaussian_sample_matches_exact_psi2():
    x = np.random.default_rng(0).standard_normal(400_000)
    assert ht.psi_alpha_norm(x, 2.0) == pytest.approx(math.sqrt(8 / 3), rel=0.02)


def test_psi_alpha_norm_of_exponential_sample_matches_quadrature():
    # an independent computation: solve E e^{X/s} = 2 by quadrature (exact value 2)
    s = optimize.brentq(lambda v: integrate.quad(lambda x: np.exp(x / v - x), 0, np.inf)[0] - 2, 1.2, 10)
    x = np.random.default_rng(2).exponential(size=400_000)
    assert ht.psi_alpha_norm(x, 1.0) == pytest.approx(s, rel=0.02)


def test_psi_alpha_norm_zero_and_constant_samples():
    assert ht.psi_alpha_norm(np.zeros(5), 1.0) == 0.0
    assert ht.psi_alpha_norm(np.full(7, -3.0), 2.0) == pytest.approx(3 / math.sqrt(math.log(2)), rel=1e-12)


def test_psi_alpha_norm_extreme_scales_are_scale_equivariant():
    x = np.random.default_rng(3).standard_normal(1000)
    base = ht.psi_alpha_norm(x, 1.0)
    for c in (1e-300, 1e300):
        assert ht.psi_alpha_norm(c * x, 1.0) == pytest.approx(c * base, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.sampled_from([0.5, 1.0, 2.0]))
def test_psi_alpha_norm_product_bound_holds_for_any_empirical_law(values, alpha):
    # the product proposition holds for every law, the empirical one included: ||XY||_1 <= ||X||_2 ||Y||_2
    x = np.array(values)
    y = np.roll(x, 1) + 1.0
    lhs = ht.psi_alpha_norm(x * y, 1.0)
    assert lhs <= ht.psi_alpha_norm(x, 2.0) * ht.psi_alpha_norm(y, 2.0) * (1 + 1e-9) + 1e-300


# ---- sub_weibull_max_quantile
def test_max_quantile_closed_form_and_coverage():
    assert ht.sub_weibull_max_quantile(1000, 1.0, 1.0, 0.05) == pytest.approx(math.log(40000), rel=1e-14)
    rng = np.random.default_rng(4)
    # |Z| has psi2 norm sqrt(8/3); the maximum of 1000 exceeds the level with probability <= 0.05
    level = ht.sub_weibull_max_quantile(1000, math.sqrt(8 / 3), 2.0, 0.05)
    assert (np.abs(rng.standard_normal((2000, 1000))).max(axis=1) >= level).mean() <= 0.05


def test_max_quantile_huge_N_is_finite():
    assert math.isfinite(ht.sub_weibull_max_quantile(2**63 - 1, 1.0, 0.25, 1e-300))


# ---- Hill
def test_hill_estimator_closed_form_and_vector_k():
    x = [1.0, 2.0, 4.0, 8.0]
    assert ht.hill_estimator(x, 2) == pytest.approx(math.log(8) / 2 + math.log(4) / 2 - math.log(2))
    np.testing.assert_allclose(ht.hill_estimator(x, [1, 3]), [math.log(2), (math.log(8) + math.log(4)
                                                                            + math.log(2)) / 3])


def test_hill_estimator_matches_a_full_sort():
    x = np.random.default_rng(5).pareto(2.0, 10_000) + 1
    logs = np.sort(np.log(x))[::-1]
    for k in (1, 17, 999):
        assert ht.hill_estimator(x, k) == pytest.approx(logs[:k].mean() - logs[k], rel=1e-12)


def test_hill_interval_covers_at_nominal_rate_for_pareto():
    rng = np.random.default_rng(6)
    gamma, k, reps = 0.5, 50, 1000
    hits = 0
    for _ in range(reps):
        lo, hi = ht.hill_interval((1 - rng.random(2000)) ** (-gamma), k, 0.9)
        hits += lo <= gamma <= hi
    assert abs(hits / reps - 0.9) < 4 * math.sqrt(0.09 / reps)


def test_hill_gamma_law_moments():
    # k * gamma_hat / gamma ~ Gamma(k, 1): mean k, variance k
    rng = np.random.default_rng(7)
    k = 20
    draws = np.array([k * ht.hill_estimator((1 - rng.random(500)) ** (-1.0), k) for _ in range(4000)])
    assert abs(draws.mean() - k) < 4 * math.sqrt(k / 4000)
    assert stats.kstest(draws, stats.gamma(k).cdf).pvalue > 1e-3


# ---- bad input at the public door
@pytest.mark.parametrize("call, exc", [
    (lambda: ht.psi_alpha_norm([1.0, np.nan], 1.0), ValueError),
    (lambda: ht.psi_alpha_norm([], 1.0), ValueError),
    (lambda: ht.psi_alpha_norm([[1.0, 2.0]], 1.0), ValueError),
    (lambda: ht.psi_alpha_norm([1.0], 0.0), ValueError),
    (lambda: ht.psi_alpha_norm([1.0], -1.0), ValueError),
    (lambda: ht.psi_alpha_norm([1.0], "2"), TypeError),
    (lambda: ht.psi_alpha_norm("abc", 1.0), TypeError),
    (lambda: ht.sub_weibull_max_quantile(0, 1.0, 1.0, 0.1), ValueError),
    (lambda: ht.sub_weibull_max_quantile(10, -1.0, 1.0, 0.1), ValueError),
    (lambda: ht.sub_weibull_max_quantile(10, 1.0, 1.0, 1.0), ValueError),
    (lambda: ht.sub_weibull_max_quantile(10.5, 1.0, 1.0, 0.1), TypeError),
    (lambda: ht.hill_estimator([1.0, -2.0, 3.0], 1), ValueError),
    (lambda: ht.hill_estimator([1.0, 2.0, 3.0], 3), ValueError),
    (lambda: ht.hill_estimator([1.0, 2.0, 3.0], 0), ValueError),
    (lambda: ht.hill_estimator([1.0, 2.0, 3.0], 1.5), TypeError),
    (lambda: ht.hill_estimator([1.0, np.inf, 3.0], 1), ValueError),
    (lambda: ht.hill_interval([1.0, 2.0, 3.0], 1, 1.5), ValueError),
    (lambda: ht.hill_interval([1.0, 2.0, 3.0], [1, 2]), TypeError),
])
def test_bad_input_raises_a_clear_error(call, exc):
    with pytest.raises(exc):
        call()
