"""Tests for companion.theory.subgaussian: closed forms, Monte Carlo, properties and every bad input."""

from __future__ import annotations

import doctest
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from companion.theory import subgaussian
from companion.theory.subgaussian import (
    bernoulli_optimal_proxy, chernoff_lambda, hoeffding_proxy, linear_map_proxy, log_mgf,
    monte_carlo_tail, optimal_variance_proxy, proxy_profile, psi2_norm, subgaussian_tail_bound,
)
from companion.theory.empirical import _empirical_tail

RADEMACHER = stats.rv_discrete(values=([-1, 1], [0.5, 0.5]))()
LN2 = math.log(2.0)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _no_numerical_warnings():
    """Every computation below must run without a RuntimeWarning (mass loss, overflow...)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


def numeric(dist, **kw):
    return optimal_variance_proxy(dist, method="numeric", **kw)


# ------------------------------------------------------------------------------------------------
# optimal_variance_proxy: closed forms reproduced by the numerical maximisation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dist, exact",
    [
        (stats.norm(0, 1), 1.0),
        (stats.norm(3, 2), 4.0),
        (stats.uniform(0, 1), 1 / 12),
        (stats.uniform(-2, 5), 25 / 12),
        (RADEMACHER, 1.0),
        (stats.rv_discrete(values=([-1, 1], [0.5, 0.5]))(loc=7), 1.0),
        (stats.randint(0, 6), 35 / 12),
        (stats.randint(-3, 10), (13**2 - 1) / 12),
        (stats.beta(2, 2), stats.beta(2, 2).var()),
        (stats.triang(0.5), stats.triang(0.5).var()),
        (stats.semicircular(), 0.25),
        (stats.gennorm(2), 0.5),  # density ~ exp(-x^2): N(0, 1/2)
        (stats.skewnorm(4), 1.0),  # sup attained only as lambda -> +infinity
        (stats.skewnorm(-2, scale=3), 9.0),  # ... and as lambda -> -infinity
        (stats.halfnorm(), 1.0),
    ],
    ids=lambda v: getattr(getattr(v, "dist", None), "name", None) or f"{v:.4g}",
)
def test_numeric_proxy_matches_closed_form(dist, exact):
    assert numeric(dist) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("p", [0.001, 0.01, 0.1, 0.25, 0.4, 0.5, 0.75, 0.99])
def test_bernoulli_numeric_against_kearns_saul(p):
    res = numeric(stats.bernoulli(p), full_output=True)
    assert res.proxy == pytest.approx(float(bernoulli_optimal_proxy(p)), rel=1e-9)
    assert res.variance == pytest.approx(p * (1 - p), rel=1e-12)
    if p == 0.5:
        assert res.argmax == 0.0
    else:  # the supremum sits at lambda* = 2 ln((1-p)/p)
        assert res.argmax == pytest.approx(2 * math.log((1 - p) / p), rel=1e-5)


def test_bernoulli_closed_form_table_values():
    # values quoted in the literature brief (4 significant digits)
    got = bernoulli_optimal_proxy([0.01, 0.1, 0.25, 0.5])
    np.testing.assert_allclose(got, [0.1066, 0.1820, 0.2276, 0.25], atol=5e-5)


def test_bernoulli_closed_form_is_continuous_at_one_half():
    near = bernoulli_optimal_proxy(0.5 - np.array([1e-3, 1e-6, 1e-10]))
    np.testing.assert_allclose(near, 0.25, rtol=1e-5)
    assert bernoulli_optimal_proxy(0.0) == 0.0 and bernoulli_optimal_proxy(1.0) == 0.0


def test_bernoulli_closed_form_is_the_maximum_of_the_profile():
    # independent of the optimiser: a dense grid of 2K/lam^2 never exceeds the closed form
    for p in (0.01, 0.2, 0.7):
        lam = np.concatenate([-np.geomspace(1e-3, 50, 4000), np.geomspace(1e-3, 50, 4000)])
        prof = proxy_profile(stats.bernoulli(p), lam)
        closed = float(bernoulli_optimal_proxy(p))
        assert prof.max() <= closed * (1 + 1e-12)
        assert prof.max() == pytest.approx(closed, rel=1e-6)


def test_binomial_and_two_point_closed_forms_agree_with_numeric():
    for dist in (stats.binom(10, 0.3), stats.binom(4, 0.9, loc=-2)):
        assert optimal_variance_proxy(dist) == pytest.approx(numeric(dist), rel=1e-9)
    two = stats.rv_discrete(values=([-1.0, 2.5], [0.8, 0.2]))()
    res = optimal_variance_proxy(two, full_output=True)
    assert res.method == "closed_form"
    assert res.proxy == pytest.approx(3.5**2 * float(bernoulli_optimal_proxy(0.2)), rel=1e-12)
    assert res.proxy == pytest.approx(numeric(two), rel=1e-9)


def test_closed_form_and_auto_methods():
    assert optimal_variance_proxy(stats.norm(0, 3)) == 9.0
    assert optimal_variance_proxy(stats.uniform(0, 2), method="closed_form") == pytest.approx(4 / 12)
    assert optimal_variance_proxy(stats.beta(2, 5), full_output=True).method == "numeric"
    assert optimal_variance_proxy(stats.laplace()) == math.inf


def test_uniform_is_three_times_below_hoeffding():
    a, b = -1.0, 3.0
    opt = numeric(stats.uniform(a, b - a))
    assert hoeffding_proxy(a, b) / opt == pytest.approx(3.0, rel=1e-6)


def test_degenerate_law_has_zero_proxy():
    one = stats.rv_discrete(values=([2.0], [1.0]))()
    assert numeric(one) == 0.0
    assert optimal_variance_proxy(one) == 0.0
    assert numeric(stats.bernoulli(0.0)) == 0.0


@pytest.mark.parametrize(
    "dist",
    [
        stats.laplace(0, 1),
        stats.t(5),
        stats.t(30),
        stats.t(1.5),  # infinite variance
        stats.expon(),
        stats.logistic(),
        stats.poisson(3),  # finite MGF everywhere, still not sub-Gaussian
        stats.geom(0.3),
        stats.lognorm(0.5),
        stats.gamma(2),
        stats.gennorm(1.5),
        stats.gennorm(1.95),
        stats.weibull_min(1.9),
        stats.cauchy(),  # no mean at all
    ],
    ids=lambda d: d.dist.name,
)
def test_heavier_than_gaussian_tails_have_no_finite_proxy(dist):
    res = numeric(dist, full_output=True)
    assert res.proxy == math.inf and math.isnan(res.argmax)
    assert psi2_norm(dist) == math.inf


@pytest.mark.parametrize("dist", [stats.gennorm(2.05), stats.gennorm(4), stats.truncnorm(-1, 2), stats.chi(3)])
def test_light_tails_have_a_finite_proxy_at_least_the_variance(dist):
    res = numeric(dist, full_output=True)
    assert math.isfinite(res.proxy)
    assert res.proxy >= dist.var() * (1 - 1e-9)


def test_skewed_bounded_law_is_not_strict_and_sup_is_interior():
    res = numeric(stats.beta(2, 5), full_output=True)
    assert res.proxy > 1.1 * res.variance
    assert 0 < res.argmax < math.inf
    prof = proxy_profile(stats.beta(2, 5), np.array([res.argmax * 0.9, res.argmax, res.argmax * 1.1]))
    assert prof[1] >= prof[0] and prof[1] >= prof[2]
    assert prof[1] == pytest.approx(res.proxy, rel=1e-9)


def test_arcsine_endpoint_singularities_are_integrated():
    assert numeric(stats.beta(0.5, 0.5)) == pytest.approx(0.125, rel=1e-6)


class _GaussianPdfOnly(stats.rv_continuous):
    """A Gaussian known only through _pdf (and its moments): logpdf underflows beyond ~38 sd."""

    def _pdf(self, x):
        return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)

    def _stats(self):
        return 0.0, 1.0, 0.0, 0.0


class _LaplacePdfOnly(stats.rv_continuous):
    def _pdf(self, x):
        return 0.5 * np.exp(-np.abs(x))

    def _stats(self):
        return 0.0, 2.0, 0.0, 3.0


def test_user_defined_distributions_without_logpdf():
    gauss = _GaussianPdfOnly(name="gauss_pdf_only")()
    assert numeric(gauss) == pytest.approx(1.0, rel=1e-6)
    assert optimal_variance_proxy(gauss) == pytest.approx(1.0, rel=1e-6)  # auto falls back to numeric
    assert numeric(_LaplacePdfOnly(name="laplace_pdf_only")()) == math.inf


def test_proxy_is_location_invariant_and_scales_quadratically():
    base = numeric(stats.beta(2, 5))
    assert numeric(stats.beta(2, 5, loc=10.0, scale=3.0)) == pytest.approx(9 * base, rel=1e-7)


# ------------------------------------------------------------------------------------------------
# log_mgf and proxy_profile
# ------------------------------------------------------------------------------------------------
LAMS = np.array([-20, -5, -1, -1e-3, -1e-6, 0, 1e-6, 1e-3, 0.5, 1, 3, 5, 20.0])


@pytest.mark.parametrize(
    "dist, lam",
    [
        (stats.norm(1, 2), LAMS / 2),
        (stats.uniform(-1, 3), LAMS),
        (stats.bernoulli(0.1), LAMS),
        (stats.binom(7, 0.3), LAMS),
        (stats.poisson(2.5), np.array([-20, -3, -1e-4, 0, 1e-4, 1, 3, 5])),
        (stats.laplace(1, 2), np.array([-0.45, -0.2, 1e-5, 0.3, 0.45, 0.5, 0.7])),
        (stats.expon(0, 2), np.array([-10, -1, -1e-5, 1e-5, 0.1, 0.4, 0.49, 0.5, 1.0])),
        (stats.t(5), np.array([-1.0, 0.0, 1e-3, 2.0])),
    ],
    ids=lambda v: getattr(getattr(v, "dist", None), "name", "lam"),
)
def test_log_mgf_numeric_matches_closed_form(dist, lam):
    a = log_mgf(dist, lam, method="numeric")
    b = log_mgf(dist, lam, method="closed_form")
    assert np.array_equal(np.isinf(a), np.isinf(b))
    fin = np.isfinite(b)
    np.testing.assert_allclose(a[fin], b[fin], rtol=1e-8, atol=0)


def test_log_mgf_against_independent_closed_forms():
    lam = np.array([-0.9, -0.3, 0.2, 0.7])
    # logistic: E e^{lam X} = pi lam / sin(pi lam) (mean 0)
    np.testing.assert_allclose(
        log_mgf(stats.logistic(), lam), np.log(np.pi * lam / np.sin(np.pi * lam)), rtol=1e-8
    )
    assert log_mgf(stats.logistic(), 1.0) == math.inf
    # geometric(p) on {1, 2, ...}: MGF p e^l / (1 - (1-p) e^l), finite for l < -log(1-p)
    p, lam2 = 0.3, np.array([-2.0, 0.1, 0.3])
    exact = np.log(p * np.exp(lam2) / (1 - (1 - p) * np.exp(lam2))) - lam2 / p
    np.testing.assert_allclose(log_mgf(stats.geom(p), lam2), exact, rtol=1e-8)
    assert log_mgf(stats.geom(p), 0.4) == math.inf
    # Rademacher: log cosh(l) = log1p(2 sinh(l/2)^2), written without cancellation near l = 0
    np.testing.assert_allclose(
        log_mgf(RADEMACHER, LAMS), np.log1p(2 * np.sinh(LAMS / 2) ** 2), rtol=1e-12, atol=1e-300
    )


def test_log_mgf_by_quadrature_for_a_smooth_bounded_law():
    dist = stats.beta(2, 5)
    mu = dist.mean()
    for lam in (-7.0, 0.3, 9.0):
        val, _ = integrate.quad(lambda x: np.exp(lam * (x - mu)) * dist.pdf(x), 0, 1, epsabs=0, epsrel=1e-13)
        assert log_mgf(dist, lam) == pytest.approx(math.log(val), rel=1e-9)


def test_log_mgf_keeps_relative_accuracy_near_zero():
    # K(l) = Var l^2/2 + k3 l^3/6 + O(l^4): check the cubic term is resolved at l = 1e-4
    dist = stats.beta(2, 5)
    var, k3 = dist.var(), dist.stats(moments="s") * dist.std() ** 3
    lam = 1e-4
    expected = var * lam**2 / 2 + k3 * lam**3 / 6
    assert log_mgf(dist, lam) == pytest.approx(expected, rel=1e-8)
    assert log_mgf(dist, -lam) == pytest.approx(var * lam**2 / 2 - k3 * lam**3 / 6, rel=1e-8)


def test_log_mgf_shapes_and_scalars():
    assert isinstance(log_mgf(stats.norm(), 1.0), float)
    out = log_mgf(stats.norm(), np.zeros((2, 3)))
    assert out.shape == (2, 3) and np.all(out == 0)
    assert log_mgf(stats.beta(2, 2), [0.0, 0.0]).tolist() == [0.0, 0.0]


def test_log_mgf_is_convex_and_vanishes_with_zero_slope_at_the_origin():
    lam = np.linspace(-6, 6, 241)
    k = log_mgf(stats.beta(2, 5), lam, method="numeric")
    assert k[120] == 0.0 and np.all(k >= 0)
    assert np.all(np.diff(k, 2) >= -1e-12)


def test_proxy_profile_limits():
    assert proxy_profile(stats.bernoulli(0.1), 0.0) == pytest.approx(0.09)
    prof = proxy_profile(stats.uniform(0, 1), np.array([1e-3, 1.0, 10.0]))
    assert np.all(prof <= 1 / 12) and prof[0] == pytest.approx(1 / 12, rel=1e-6)
    assert proxy_profile(stats.laplace(), 2.0) == math.inf


# ------------------------------------------------------------------------------------------------
# Hypothesis: random finite laws
# ------------------------------------------------------------------------------------------------
@st.composite
def finite_laws(draw, min_atoms=2, max_atoms=5):
    k = draw(st.integers(min_atoms, max_atoms))
    xs = draw(
        st.lists(st.integers(-50, 50), min_size=k, max_size=k, unique=True).map(sorted)
    )
    ws = draw(st.lists(st.integers(1, 100), min_size=k, max_size=k))
    p = np.array(ws, dtype=float) / sum(ws)
    return np.array(xs, dtype=float) / 10.0, p


def _law(xp):
    return stats.rv_discrete(values=xp)()


@SETTINGS
@given(finite_laws())
def test_property_proxy_between_variance_and_hoeffding(xp):
    x, p = xp
    res = numeric(_law(xp), full_output=True)
    var = float(np.dot(p, (x - np.dot(p, x)) ** 2))
    assert res.variance == pytest.approx(var, rel=1e-10)
    assert res.proxy >= var * (1 - 1e-10)
    assert res.proxy <= hoeffding_proxy(x.min(), x.max()) * (1 + 1e-9)


@SETTINGS
@given(finite_laws(), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_property_affine_maps(xp, a, c):
    x, p = xp
    base = numeric(_law(xp))
    moved = numeric(_law((a * x + c, p)))
    flipped = numeric(_law((np.sort(-x), p[::-1])))
    assert moved == pytest.approx(a * a * base, rel=1e-7)
    assert flipped == pytest.approx(base, rel=1e-7)


@SETTINGS
@given(finite_laws())
def test_property_chernoff_bound_dominates_exact_tails(xp):
    x, p = xp
    sigma2 = numeric(_law(xp))
    y = x - np.dot(p, x)
    t = np.linspace(0, np.abs(y).max() * 1.2, 50)
    two = (p[None, :] * (np.abs(y)[None, :] >= t[:, None])).sum(axis=1)
    up = (p[None, :] * (y[None, :] >= t[:, None])).sum(axis=1)
    assert np.all(two <= subgaussian_tail_bound(t, sigma2) * (1 + 1e-9))
    assert np.all(up <= subgaussian_tail_bound(t, sigma2, two_sided=False) * (1 + 1e-9))


@SETTINGS
@given(finite_laws())
def test_property_psi2_sandwich(xp):
    law = _law(xp)
    sigma = math.sqrt(numeric(law))
    psi = psi2_norm(law, centred=True)
    assert math.sqrt(3 / 8) * psi <= sigma * (1 + 1e-7)  # proved (Gaussian trick), sharp for N(0,1)
    assert sigma <= math.sqrt(1 + LN2) * psi * (1 + 1e-9)  # proved (e^x <= x + e^{x^2})
    assert sigma <= math.sqrt(LN2) * psi * (1 + 1e-7)  # sharper constant, sharp for Rademacher


@SETTINGS
@given(finite_laws(min_atoms=1, max_atoms=4))
def test_property_psi2_definition(xp):
    x, p = xp
    s = psi2_norm(_law(xp))
    if s == 0.0:  # only the constant 0 has norm 0
        assert np.all(x == 0)
        return
    assert float(np.dot(p, np.exp(x**2 / s**2))) == pytest.approx(2.0, rel=1e-9)


# ------------------------------------------------------------------------------------------------
# psi_2 norm
# ------------------------------------------------------------------------------------------------
def test_psi2_exact_values():
    assert psi2_norm(stats.norm(0, 1)) == pytest.approx(math.sqrt(8 / 3), rel=1e-9)
    assert psi2_norm(stats.norm(5, 3), centred=True) == pytest.approx(3 * math.sqrt(8 / 3), rel=1e-9)
    assert psi2_norm(RADEMACHER) == pytest.approx(1 / math.sqrt(LN2), rel=1e-12)
    # U[-1, 1]: E exp(X^2/s^2) = int_0^1 exp(x^2/s^2) dx = 2
    s = psi2_norm(stats.uniform(-1, 2))
    val, _ = integrate.quad(lambda x: math.exp(x * x / s**2), 0, 1, epsrel=1e-13)
    assert val == pytest.approx(2.0, rel=1e-9)
    # a constant c: ||c||_psi2 = |c| / sqrt(ln 2); centred: 0
    const = stats.rv_discrete(values=([3.0], [1.0]))()
    assert psi2_norm(const) == pytest.approx(3 / math.sqrt(LN2))
    assert psi2_norm(const, centred=True) == 0.0


def test_psi2_of_skew_normal_equals_gaussian_since_x_squared_is_chi2():
    # |SkewNormal(a)| has the law of |N(0,1)|, so the uncentred psi_2 norm is sqrt(8/3)
    assert psi2_norm(stats.skewnorm(3)) == pytest.approx(math.sqrt(8 / 3), rel=1e-8)


def test_psi2_sandwich_attained_at_both_ends():
    g, r = stats.norm(0, 1), RADEMACHER
    assert math.sqrt(optimal_variance_proxy(g)) / psi2_norm(g) == pytest.approx(math.sqrt(3 / 8), rel=1e-9)
    assert math.sqrt(optimal_variance_proxy(r)) / psi2_norm(r) == pytest.approx(math.sqrt(LN2), rel=1e-9)


# ------------------------------------------------------------------------------------------------
# Tail bounds, Chernoff, Hoeffding
# ------------------------------------------------------------------------------------------------
def test_subgaussian_tail_bound_values_and_broadcasting():
    t = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(subgaussian_tail_bound(t, 1.0), 2 * np.exp(-(t**2) / 2))
    np.testing.assert_allclose(subgaussian_tail_bound(t, 4.0, two_sided=False), np.exp(-(t**2) / 8))
    grid = subgaussian_tail_bound(t[:, None], np.array([1.0, 2.0])[None, :])
    assert grid.shape == (4, 2)
    assert subgaussian_tail_bound(0.0, 1.0) == 2.0  # raw, not capped at 1
    assert subgaussian_tail_bound(math.inf, 1.0) == 0.0


def test_gaussian_tails_respect_the_bound_and_chernoff_lambda_is_optimal():
    t = np.linspace(0, 8, 81)
    exact = 2 * stats.norm.sf(t)
    assert np.all(exact <= subgaussian_tail_bound(t, 1.0))
    for ti in (0.5, 1.0, 3.0):
        lam = np.linspace(0, 10, 100001)
        exponent = lam**2 * 2.0 / 2 - lam * ti  # sigma2 = 2
        assert lam[np.argmin(exponent)] == pytest.approx(chernoff_lambda(ti, 2.0), abs=1e-4)
    np.testing.assert_allclose(chernoff_lambda([0.0, 2.0], [1.0, 4.0]), [0.0, 0.5])


def test_hoeffding_proxy_values():
    assert hoeffding_proxy(0, 1) == 0.25
    assert hoeffding_proxy(2.0, 2.0) == 0.0
    np.testing.assert_allclose(hoeffding_proxy([0, -1], [1, 1]), [0.25, 1.0])
    # sharp: the symmetric two-point law on {a, b} attains it
    law = stats.rv_discrete(values=([-3.0, 5.0], [0.5, 0.5]))()
    assert numeric(law) == pytest.approx(hoeffding_proxy(-3.0, 5.0), rel=1e-9)


# ------------------------------------------------------------------------------------------------
# Linear maps
# ------------------------------------------------------------------------------------------------
def test_linear_map_proxy_formulas():
    w = np.array([1.0, -2.0, 0.5])
    s2 = np.array([1.0, 4.0, 0.25])
    assert linear_map_proxy(w, s2) == pytest.approx(1 + 16 + 0.0625)
    assert linear_map_proxy(w, s2, dependent=True) == pytest.approx((1 + 4 + 0.25) ** 2)
    W = np.stack([w, 2 * w], axis=1)
    np.testing.assert_allclose(linear_map_proxy(W, s2), [17.0625, 4 * 17.0625])
    np.testing.assert_allclose(linear_map_proxy(W, 1.0, dependent=True), [3.5**2, 49.0])


def test_linear_map_independent_rademacher_sum_is_exact():
    # w^T eps with independent signs: exact law by enumeration, optimal proxy = ||w||^2 (strict)
    w = np.array([0.3, -1.1, 0.7, 2.0, 0.05, -0.4])
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * w.size)).reshape(w.size, -1).T
    values, counts = np.unique(np.round(signs @ w, 12), return_counts=True)
    law = stats.rv_discrete(values=(values, counts / counts.sum()))()
    assert numeric(law) == pytest.approx(linear_map_proxy(w, 1.0), rel=1e-7)


def test_linear_map_dependent_bound_is_attained():
    # Z_i = sigma_i sign(w_i) G: w^T Z = (sum |w_i| sigma_i) G exactly
    rng = np.random.default_rng(3)
    w, s2 = rng.normal(size=8), rng.uniform(0.5, 2.0, size=8)
    g = rng.standard_normal(1000)
    z = np.sqrt(s2)[:, None] * np.sign(w)[:, None] * g[None, :]
    np.testing.assert_allclose(w @ z, np.sum(np.abs(w) * np.sqrt(s2)) * g)
    s = math.sqrt(linear_map_proxy(w, s2, dependent=True))
    assert optimal_variance_proxy(stats.norm(0, s)) == pytest.approx(linear_map_proxy(w, s2, dependent=True))
    # the shared-sign construction with Rademacher coordinates also attains it
    two = stats.rv_discrete(values=([-s, s], [0.5, 0.5]))()
    assert numeric(two) == pytest.approx(s * s, rel=1e-9)


@SETTINGS
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=20),
    st.floats(0.01, 10.0),
)
def test_property_dependent_between_independent_and_n_times(ws, s2):
    w = np.array(ws)
    ind = linear_map_proxy(w, s2)
    dep = linear_map_proxy(w, s2, dependent=True)
    assert ind * (1 - 1e-12) <= dep <= w.size * ind * (1 + 1e-12) + 1e-300


# ------------------------------------------------------------------------------------------------
# Empirical and Monte Carlo tails
# ------------------------------------------------------------------------------------------------
def test_empirical_tail_against_brute_force():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2000)
    t = np.array([0.0, 0.1, 1.0, 2.5, 10.0])
    np.testing.assert_array_equal(_empirical_tail(x, t), [(np.abs(x) >= ti).mean() for ti in t])
    np.testing.assert_array_equal(_empirical_tail(x, t, two_sided=False), [(x >= ti).mean() for ti in t])
    assert isinstance(_empirical_tail(x, 1.0), float)


def test_monte_carlo_tail_matches_exact_gaussian_tail():
    t = np.array([0.5, 1.0, 2.0, 3.0])
    n = 400_000
    est = monte_carlo_tail(stats.norm(2.0, 1.0), t, n, np.random.default_rng(1))
    exact = 2 * stats.norm.sf(t)
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(est - exact) < 5 * se)


def test_monte_carlo_tail_does_not_depend_on_chunk_size():
    t = np.linspace(0, 3, 7)
    a = monte_carlo_tail(stats.norm(), t, 50_000, np.random.default_rng(5), chunk_size=50_000)
    b = monte_carlo_tail(stats.norm(), t, 50_000, np.random.default_rng(5), chunk_size=3_333)
    np.testing.assert_array_equal(a, b)


def test_monte_carlo_tail_with_a_callable_sampler():
    w = np.array([1.0, -2.0, 0.5])

    def sampler(rng, size):
        return rng.choice([-1.0, 1.0], size=(size, 3)) @ w

    est = monte_carlo_tail(sampler, [0.0, 3.0, 3.4], 100_000, np.random.default_rng(2), chunk_size=10_000)
    # |w^T eps| takes values 0.5, 1.5, 2.5, 3.5 with probability 1/4 each
    assert est[0] == 1.0 and est[1] == pytest.approx(0.25, abs=0.01) and est[2] == est[1]


def test_monte_carlo_one_sided():
    est = monte_carlo_tail(stats.uniform(0, 1), [0.25, 0.5], 100_000, np.random.default_rng(4), two_sided=False)
    np.testing.assert_allclose(est, [0.25, 0.0], atol=0.01)


# ------------------------------------------------------------------------------------------------
# Every bad input
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("func", [optimal_variance_proxy, psi2_norm])
@pytest.mark.parametrize("bad", [stats.bernoulli, 3.0, "norm", np.array([1.0, 2.0]), None])
def test_non_distributions_raise_type_error(func, bad):
    with pytest.raises(TypeError, match="frozen scipy.stats distribution"):
        func(bad)


def test_log_mgf_and_profile_reject_non_distributions():
    for func in (log_mgf, proxy_profile):
        with pytest.raises(TypeError, match="frozen scipy.stats"):
            func(stats.bernoulli, 1.0)


def test_array_and_invalid_parameters_raise_value_error():
    with pytest.raises(ValueError, match="array-valued parameters"):
        optimal_variance_proxy(stats.norm([0.0, 1.0], 1.0))
    with pytest.raises(ValueError, match="invalid parameters"):
        optimal_variance_proxy(stats.norm(0.0, -1.0))
    with pytest.raises(ValueError, match="invalid parameters"):
        log_mgf(stats.bernoulli(1.5), 1.0)


def test_method_argument_errors():
    with pytest.raises(ValueError, match="method must be one of"):
        optimal_variance_proxy(stats.norm(), method="exact")
    with pytest.raises(TypeError, match="method must be a string"):
        optimal_variance_proxy(stats.norm(), method=1)
    with pytest.raises(ValueError, match="no closed-form proxy"):
        optimal_variance_proxy(stats.beta(2, 5), method="closed_form")
    with pytest.raises(ValueError, match="no closed-form CGF"):
        log_mgf(stats.beta(2, 5), 1.0, method="closed_form")
    with pytest.raises(TypeError, match="full_output"):
        optimal_variance_proxy(stats.norm(), full_output="yes")


def test_log_mgf_lambda_errors():
    with pytest.raises(ValueError, match="NaN"):
        log_mgf(stats.norm(), [0.0, math.nan])
    with pytest.raises(ValueError, match="finite"):
        log_mgf(stats.norm(), math.inf)
    with pytest.raises(TypeError, match="real"):
        log_mgf(stats.norm(), "1.0")
    with pytest.raises(TypeError, match="real"):
        log_mgf(stats.norm(), True)
    with pytest.raises(ValueError, match="no finite mean"):
        log_mgf(stats.cauchy(), 0.5)


def test_psi2_centred_must_be_bool():
    with pytest.raises(TypeError, match="centred"):
        psi2_norm(stats.norm(), centred=1)


@pytest.mark.parametrize("func", [subgaussian_tail_bound, chernoff_lambda])
def test_tail_bound_and_chernoff_errors(func):
    with pytest.raises(ValueError, match="t must be >= 0"):
        func(-1.0, 1.0)
    with pytest.raises(ValueError, match="t contains NaN"):
        func(math.nan, 1.0)
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        func(1.0, 0.0)
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        func(1.0, -2.0)
    with pytest.raises(ValueError, match="sigma2 contains NaN"):
        func(1.0, math.nan)
    with pytest.raises(ValueError, match="sigma2 must be finite"):
        func(1.0, math.inf)
    with pytest.raises(TypeError, match="t must be a real"):
        func("1", 1.0)
    with pytest.raises(TypeError, match="sigma2 must be a real"):
        func(1.0, None)
    with pytest.raises(ValueError, match="do not broadcast"):
        func(np.ones(3), np.ones(2))


def test_tail_bound_two_sided_must_be_bool():
    with pytest.raises(TypeError, match="two_sided"):
        subgaussian_tail_bound(1.0, 1.0, two_sided="yes")


def test_hoeffding_errors():
    with pytest.raises(ValueError, match="b must be >= a"):
        hoeffding_proxy(1.0, 0.0)
    with pytest.raises(ValueError, match="NaN"):
        hoeffding_proxy(math.nan, 1.0)
    with pytest.raises(ValueError, match="finite"):
        hoeffding_proxy(0.0, math.inf)
    with pytest.raises(TypeError, match="real"):
        hoeffding_proxy("0", 1.0)
    with pytest.raises(ValueError, match="broadcast"):
        hoeffding_proxy(np.zeros(2), np.ones(3))


def test_bernoulli_proxy_errors():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        bernoulli_optimal_proxy(1.5)
    with pytest.raises(ValueError, match="NaN"):
        bernoulli_optimal_proxy(math.nan)
    with pytest.raises(TypeError, match="real"):
        bernoulli_optimal_proxy("0.5")


def test_linear_map_errors():
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        linear_map_proxy([1.0, 2.0], 0.0)
    with pytest.raises(ValueError, match="sigma2 must be > 0"):
        linear_map_proxy([1.0, 2.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="shape"):
        linear_map_proxy([1.0, 2.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="vector"):
        linear_map_proxy(np.ones((2, 2, 2)), 1.0)
    with pytest.raises(ValueError, match="empty"):
        linear_map_proxy([], 1.0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        linear_map_proxy([1.0, math.nan], 1.0)
    with pytest.raises(TypeError, match="dependent"):
        linear_map_proxy([1.0], 1.0, dependent="no")
    with pytest.raises(TypeError, match="w must be"):
        linear_map_proxy("abc", 1.0)


def test_empirical_tail_errors():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        _empirical_tail(np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        _empirical_tail([], 1.0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        _empirical_tail([1.0, math.nan], 1.0)
    with pytest.raises(ValueError, match="t must be >= 0"):
        _empirical_tail([1.0], -0.1)
    with pytest.raises(TypeError, match="two_sided"):
        _empirical_tail([1.0], 0.1, two_sided=None)


def test_monte_carlo_tail_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="frozen"):
        monte_carlo_tail(stats.bernoulli, 1.0, 10, rng)
    with pytest.raises(TypeError, match="callable"):
        monte_carlo_tail(3.0, 1.0, 10, rng)
    with pytest.raises(TypeError, match="Generator"):
        monte_carlo_tail(stats.norm(), 1.0, 10, 0)
    with pytest.raises(TypeError, match="n_samples"):
        monte_carlo_tail(stats.norm(), 1.0, 10.5, rng)
    with pytest.raises(ValueError, match="n_samples must be >= 1"):
        monte_carlo_tail(stats.norm(), 1.0, 0, rng)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        monte_carlo_tail(stats.norm(), 1.0, 10, rng, chunk_size=0)
    with pytest.raises(ValueError, match="t must be >= 0"):
        monte_carlo_tail(stats.norm(), -1.0, 10, rng)
    with pytest.raises(ValueError, match="no finite mean"):
        monte_carlo_tail(stats.cauchy(), 1.0, 10, rng)
    with pytest.raises(ValueError, match="returned shape"):
        monte_carlo_tail(lambda r, m: np.zeros(m + 1), 1.0, 10, rng)
    with pytest.raises(ValueError, match="NaN or infinite"):
        monte_carlo_tail(lambda r, m: np.full(m, np.nan), 1.0, 10, rng)


# ------------------------------------------------------------------------------------------------
# Docstring examples run
# ------------------------------------------------------------------------------------------------
def test_docstring_examples():
    from companion.theory import empirical

    results = [doctest.testmod(m, optionflags=doctest.ELLIPSIS) for m in (subgaussian, empirical)]
    assert sum(r.attempted for r in results) > 15 and sum(r.failed for r in results) == 0


# ------------------------------------------------------------------------------------------------
# Numerical safeguards are reported, not hidden
# ------------------------------------------------------------------------------------------------
def test_quadrature_mass_loss_is_an_error():
    # vonmises(1e300): a peak of width 1e-150 that no node reaches (old: a warning and K = 0)
    with pytest.raises(ValueError, match="total mass"):
        log_mgf(stats.vonmises(1e300), 1.0)


def test_lattice_truncation_is_reported():
    # the tilt e^{20 k} moves Poisson(2.5) mass to k ~ 2.5 e^20 = 1.2e9: beyond the lattice cap
    # (old: a warning and K = 1.54e7, exact 1.21e9; issue 30: an error, not a wrong number)
    with pytest.raises(ValueError, match="has not decayed"):
        log_mgf(stats.poisson(2.5), 20.0, method="numeric")


class _BrokenMoments(stats.rv_continuous):
    def _pdf(self, x):
        return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)

    def _stats(self):
        raise RuntimeError("moment integration failed")


def test_law_whose_moments_scipy_cannot_compute_raises_value_error():
    with pytest.raises(ValueError, match="could not compute the mean"):
        optimal_variance_proxy(_BrokenMoments(name="broken_moments")(), method="numeric")
