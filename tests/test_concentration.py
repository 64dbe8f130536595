"""Tests of companion.theory.concentration: closed forms, Monte Carlo, properties and every bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, special, stats

from companion.theory import concentration as conc
from companion.theory import subgaussian

SQRT_PI = math.sqrt(math.pi)


# ----------------------------------------------------------------------------------------------
# dot_product_law
# ----------------------------------------------------------------------------------------------
def test_dot_law_d1_density_is_bessel_k0_over_pi():
    x = np.array([0.01, 0.5, 1.0, 3.0, 20.0])
    law = conc.dot_product_law(1)
    np.testing.assert_allclose(law.pdf(x), special.k0(x) / math.pi, rtol=1e-12)
    np.testing.assert_allclose(law.pdf(-x), law.pdf(x), rtol=0)
    assert law.pdf(0.0) == math.inf


def test_dot_law_d2_is_laplace():
    x = np.array([-7.0, -1.0, 0.0, 0.3, 4.0])
    law = conc.dot_product_law(2)
    np.testing.assert_allclose(law.pdf(x), stats.laplace.pdf(x), rtol=1e-12)
    np.testing.assert_allclose(law.sf(x), stats.laplace.sf(x), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("d_k", [1, 3, 16, 64])
def test_dot_law_moments_and_total_mass(d_k):
    law = conc.dot_product_law(d_k)
    assert law.mean() == 0.0 and law.var() == d_k
    scaled = conc.dot_product_law(d_k, scaled=True)
    assert abs(scaled.var() - 1.0) < 1e-12
    mass = sum(integrate.quad(law.pdf, a, b, limit=200)[0]
               for a, b in [(-np.inf, 0.0), (0.0, np.inf)])
    assert abs(mass - 1.0) < 1e-8
    x = np.array([-2.0, 0.0, 0.7, 3.0])
    np.testing.assert_allclose(law.cdf(x) + law.sf(x), 1.0, atol=1e-12)
    np.testing.assert_allclose(law.sf(-x), law.cdf(x), atol=1e-12)


@pytest.mark.parametrize("d_k", [1, 16])
def test_dot_law_tail_against_monte_carlo(d_k):
    gen = np.random.default_rng(7)
    n = 400_000
    q = gen.standard_normal((n, d_k))
    k = gen.standard_normal((n, d_k))
    s = np.einsum("ij,ij->i", q, k) / math.sqrt(d_k)
    t = np.array([0.5, 1.5, 3.0])
    emp = (np.abs(s)[:, None] >= t).mean(axis=0)
    exact = 2 * conc.dot_product_law(d_k, scaled=True).sf(t)
    assert np.all(np.abs(emp - exact) < 5 * np.sqrt(exact * (1 - exact) / n) + 1e-6)


def test_dot_law_cgf_closed_form_for_smooth_densities():
    lam = np.array([-0.9, -0.3, 0.5, 0.95])
    for d_k in (4, 7):
        got = subgaussian.log_mgf(conc.dot_product_law(d_k), lam)
        np.testing.assert_allclose(got, -d_k / 2 * np.log1p(-(lam**2)), rtol=1e-8)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                      (True, TypeError), ("4", TypeError), (None, TypeError)])
def test_dot_law_rejects_bad_dimension(bad, exc):
    with pytest.raises(exc, match="d_k"):
        conc.dot_product_law(bad)


def test_dot_law_rejects_non_bool_scaled():
    with pytest.raises(TypeError, match="scaled"):
        conc.dot_product_law(4, scaled="yes")


# ----------------------------------------------------------------------------------------------
# psi1_norm
# ----------------------------------------------------------------------------------------------
def _gaussian_psi1():
    return optimize.brentq(lambda s: math.exp(0.5 / s**2) * stats.norm.cdf(1 / s) - 1, 0.5, 5.0)


def _product_psi1():
    # E e^{|G G'|/s} = 2 E_G'[e^{G'^2/(2 s^2)} Phi(|G'|/s)], one quadrature
    def excess(s):
        def f(y):
            return 4 * math.exp(-y * y / 2 * (1 - 1 / s**2) + special.log_ndtr(y / s))
        return integrate.quad(f, 0, np.inf, epsrel=1e-12)[0] / math.sqrt(2 * math.pi) - 2
    return optimize.brentq(excess, 1.05, 5.0, xtol=1e-13)


@pytest.mark.parametrize("law, exact", [
    (stats.expon(), 2.0),                    # E e^{X/s} = s / (s - 1)
    (stats.expon(scale=3.0), 6.0),
    (stats.laplace(), 2.0),
    (stats.chi2(1), 8.0 / 3.0),              # ||G^2||_psi1 = ||G||_psi2^2
    (stats.norm(), None),
    (stats.uniform(-1, 2), None),            # E e^{|U|/s} = s (e^{1/s} - 1)
])
def test_psi1_closed_forms(law, exact):
    if exact is None:
        if law.dist.name == "norm":
            exact = _gaussian_psi1()
        else:
            exact = optimize.brentq(lambda s: s * math.expm1(1 / s) - 2, 0.1, 10.0, xtol=1e-14)
    assert abs(conc.psi1_norm(law) - exact) < 1e-9 * exact


def test_psi1_of_the_gaussian_product_has_no_mass_lost_at_the_singularity():
    assert abs(conc.psi1_norm(conc.dot_product_law(1)) - _product_psi1()) < 1e-8


def test_psi1_of_products_and_squares_against_psi2():
    psi2 = subgaussian.psi2_norm(stats.norm())
    assert conc.psi1_norm(conc.dot_product_law(1)) <= psi2**2
    assert abs(conc.psi1_norm(stats.chi2(1)) - psi2**2) < 1e-9


@pytest.mark.parametrize("law", [stats.poisson(3), stats.geom(0.3), stats.binom(10, 0.3)])
def test_psi1_of_discrete_laws_against_direct_sums(law):
    k = np.arange(0, 400)
    p = law.pmf(k)
    for centred in (False, True):
        vals = np.abs(k - law.mean()) if centred else np.abs(k)
        logp = np.log(p[p > 0])

        def excess(s):
            return special.logsumexp(logp + vals[p > 0] / s) - math.log(2)

        exact = optimize.brentq(excess, 0.5, 50.0, xtol=1e-14)
        assert abs(conc.psi1_norm(law, centred=centred) - exact) < 1e-8 * exact


def test_psi1_constant_and_heavy_laws():
    const = stats.rv_discrete(values=([2.5], [1.0]))()
    assert abs(conc.psi1_norm(const) - 2.5 / math.log(2)) < 1e-12
    assert conc.psi1_norm(const, centred=True) == 0.0
    for heavy in (stats.t(5), stats.lognorm(1.0), stats.cauchy(), stats.pareto(3)):
        assert conc.psi1_norm(heavy) == math.inf


def test_psi1_of_samples():
    assert abs(conc.psi1_norm([1.0, -1.0]) - 1 / math.log(2)) < 1e-12
    assert conc.psi1_norm(np.zeros(5)) == 0.0
    assert abs(conc.psi1_norm([3.0, 3.0], centred=False) - 3 / math.log(2)) < 1e-12
    assert conc.psi1_norm([3.0, 3.0], centred=True) == 0.0
    gen = np.random.default_rng(3)
    sample = gen.exponential(size=200_000)
    assert abs(conc.psi1_norm(sample) - 2.0) < 0.1     # plug-in estimate, exact value 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=40), st.floats(0.01, 100))
def test_psi1_sample_is_homogeneous_and_bracketed(values, c):
    x = np.array(values)
    base = conc.psi1_norm(x)
    assert math.isclose(conc.psi1_norm(c * x), c * base, rel_tol=1e-9, abs_tol=1e-12)
    mean_abs, max_abs = np.abs(x).mean(), np.abs(x).max()
    assert mean_abs / math.log(2) * (1 - 1e-9) <= base <= max_abs / math.log(2) * (1 + 1e-9)


def test_psi1_sample_of_subnormal_values_is_not_zero():
    # found by the explore profile (seed 6): E|X| of [5e-324, 5e-324] rounded to 0, so the norm was 0
    for x in ([5e-324, 5e-324], [5e-324, -5e-324, 0.0], [1e-310] * 7):
        base = conc.psi1_norm(x)
        assert base > 0
        assert np.abs(x).mean() / math.log(2) * (1 - 1e-9) <= base <= np.abs(x).max() / math.log(2) * (1 + 1e-9)
    assert math.isclose(conc.psi1_norm([1e-310, -1e-310]), 1e-310 / math.log(2), rel_tol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-20, 20), st.floats(-20, 20)), min_size=1, max_size=30))
def test_psi1_sample_triangle_inequality_and_centring(pairs):
    x, y = np.array(pairs).T
    lhs = conc.psi1_norm(x + y)
    assert lhs <= (conc.psi1_norm(x) + conc.psi1_norm(y)) * (1 + 1e-9) + 1e-12
    assert conc.psi1_norm(x, centred=True) <= 2 * conc.psi1_norm(x) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("bad, exc, match", [
    ([], ValueError, "non-empty"),
    (np.ones((2, 2)), ValueError, "1-D"),
    ([1.0, np.nan], ValueError, "NaN"),
    ([1.0, np.inf], ValueError, "NaN or infinite"),
    ("abc", TypeError, "real"),
    ([1 + 1j], TypeError, "real"),
    ([True, False], TypeError, "real"),
    (stats.bernoulli, TypeError, "frozen"),
])
def test_psi1_rejects_bad_input(bad, exc, match):
    with pytest.raises(exc, match=match):
        conc.psi1_norm(bad)


def test_psi1_rejects_bad_centred_and_array_parameters():
    with pytest.raises(TypeError, match="centred"):
        conc.psi1_norm(stats.expon(), centred="yes")
    with pytest.raises(ValueError, match="array-valued"):
        conc.psi1_norm(stats.norm([0.0, 1.0]))


# ----------------------------------------------------------------------------------------------
# subexponential_nu2
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b", [2.2, 4.0, 8.0, 100.0])
def test_nu2_of_chi_square_is_the_edge_value(b):
    closed = 2 * b**2 * (-1 / b - 0.5 * math.log1p(-2 / b))
    assert abs(conc.subexponential_nu2(stats.chi2(1), b) - closed) < 1e-7 * closed


@pytest.mark.parametrize("b", [1.1, math.sqrt(2.0), 3.0, 50.0])
def test_nu2_of_gaussian_product_is_the_edge_value(b):
    closed = -(b**2) * math.log1p(-1 / b**2)
    assert abs(conc.subexponential_nu2(conc.dot_product_law(1), b) - closed) < 1e-7 * closed


def test_nu2_validates_the_textbook_pairs():
    assert conc.subexponential_nu2(stats.chi2(1), 4.0) <= 4.0
    assert conc.subexponential_nu2(conc.dot_product_law(1), math.sqrt(2.0)) <= 2.0
    assert abs(conc.subexponential_nu2(conc.dot_product_law(1), math.sqrt(2.0))
               - 2 * math.log(2)) < 1e-8


def test_nu2_limits():
    assert abs(conc.subexponential_nu2(stats.norm(0, 2), 0.01) - 4.0) < 1e-8
    assert abs(conc.subexponential_nu2(stats.norm(0, 2), 10.0) - 4.0) < 1e-8
    bern = stats.bernoulli(0.1)
    assert abs(conc.subexponential_nu2(bern, 1e-3) - subgaussian.optimal_variance_proxy(bern)) < 1e-8
    assert abs(conc.subexponential_nu2(bern, 1e6) - bern.var()) < 1e-6
    assert abs(conc.subexponential_nu2(stats.uniform(0, 1), 0.5) - 1 / 12) < 1e-10
    assert conc.subexponential_nu2(stats.rv_discrete(values=([1.0], [1.0]))(), 1.0) == 0.0


@pytest.mark.parametrize("law, b", [(stats.chi2(1), 2.0), (stats.chi2(1), 1.0),
                                    (stats.expon(), 1.0), (stats.t(5), 100.0),
                                    (conc.dot_product_law(1), 1.0)])
def test_nu2_is_infinite_when_the_window_reaches_the_tail(law, b):
    assert conc.subexponential_nu2(law, b) == math.inf


def test_nu2_decreases_in_b_and_stays_above_the_variance():
    bs = [2.05, 2.5, 3.0, 5.0, 10.0, 40.0]
    values = [conc.subexponential_nu2(stats.chi2(1), b) for b in bs]
    assert all(v1 >= v2 for v1, v2 in zip(values, values[1:]))
    assert min(values) >= 2.0


def test_nu2_warns_beyond_the_accurate_range():
    with pytest.warns(RuntimeWarning, match="beyond the range"):
        conc.subexponential_nu2(stats.gennorm(1.5), 0.01)


@pytest.mark.parametrize("b, exc", [(0.0, ValueError), (-1.0, ValueError),
                                    (math.nan, ValueError), (math.inf, ValueError),
                                    ("1", TypeError), (True, TypeError)])
def test_nu2_rejects_bad_b(b, exc):
    with pytest.raises(exc, match="b"):
        conc.subexponential_nu2(stats.chi2(1), b)


def test_nu2_rejects_bad_dist():
    with pytest.raises(TypeError, match="frozen"):
        conc.subexponential_nu2(stats.chi2, 1.0)
    with pytest.raises(ValueError, match="finite mean"):
        conc.subexponential_nu2(stats.cauchy(), 1.0)


# ----------------------------------------------------------------------------------------------
# bernstein_bound and hoeffding_bound
# ----------------------------------------------------------------------------------------------
def test_bernstein_closed_form_and_regimes():
    # chi^2_d - d: n = d terms with (4, 4); Gaussian part for t <= n nu^2 / b = d
    d = 100
    assert abs(conc.bernstein_bound(50.0, 4.0, 4.0, n=d) - 2 * math.exp(-2500 / 800)) < 1e-15
    assert abs(conc.bernstein_bound(400.0, 4.0, 4.0, n=d) - 2 * math.exp(-50.0)) < 1e-30
    assert conc.bernstein_bound(3.0, 1.0, 0.0, two_sided=False) == math.exp(-4.5)
    np.testing.assert_allclose(conc.bernstein_bound([0.0, 1.0, 2.0], 2.0, 0.0, n=3),
                               subgaussian.subgaussian_tail_bound([0.0, 1.0, 2.0], 6.0))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 400), st.floats(0.0, 3.0))
def test_bernstein_never_below_the_exact_chi_square_tail(d, eps):
    exact = stats.chi2(d).sf(d * (1 + eps)) + stats.chi2(d).cdf(d * (1 - eps))
    assert exact <= conc.bernstein_bound(d * eps, 4.0, 4.0, n=d) * (1 + 1e-12)
    nu2 = 3.0903548889591246                          # optimal nu^2 for b = 4
    assert exact <= conc.bernstein_bound(d * eps, nu2, 4.0, n=d) * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 8, 64]), st.floats(0.0, 12.0))
def test_bernstein_never_below_the_exact_logit_tail(d_k, t):
    exact = 2 * conc.dot_product_law(d_k, scaled=True).sf(t)
    assert exact <= conc.bernstein_bound(t, 2.0 / d_k, math.sqrt(2.0 / d_k), n=d_k) + 1e-12


def test_bernstein_broadcasts_and_decreases():
    out = conc.bernstein_bound(np.linspace(0, 20, 11)[:, None], [1.0, 2.0], 0.5, n=4)
    assert out.shape == (11, 2) and np.all(np.diff(out, axis=0) <= 0)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(t=-1.0, nu2=1.0, b=1.0), ValueError, "t must be >= 0"),
    (dict(t=1.0, nu2=0.0, b=1.0), ValueError, "nu2"),
    (dict(t=1.0, nu2=1.0, b=-1.0), ValueError, "b must be"),
    (dict(t=1.0, nu2=1.0, b=np.nan), ValueError, "b must be"),
    (dict(t=1.0, nu2=1.0, b=1.0, n=0), ValueError, "n must be"),
    (dict(t=1.0, nu2=1.0, b=1.0, n=2.0), TypeError, "n must be"),
    (dict(t=1.0, nu2=1.0, b=1.0, two_sided="no"), TypeError, "two_sided"),
    (dict(t=[1.0, 2.0], nu2=[1.0, 2.0, 3.0], b=1.0), ValueError, "broadcast"),
    (dict(t="1", nu2=1.0, b=1.0), TypeError, "t must be"),
])
def test_bernstein_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        conc.bernstein_bound(**kwargs)


def test_hoeffding_closed_forms():
    assert abs(conc.hoeffding_bound(10.0, 0.0, 1.0, n=100) - 2 * math.exp(-2.0)) < 1e-15
    got = conc.hoeffding_bound(1.0, [0.0, -1.0], [1.0, 1.0], two_sided=False)
    assert abs(got - math.exp(-2 / 5)) < 1e-15
    np.testing.assert_allclose(conc.hoeffding_bound([0.0, 3.0], -1.0, 1.0, n=9),
                               2 * np.exp(-2 * np.array([0.0, 9.0]) / 36))


@pytest.mark.parametrize("p", [0.5, 0.1, 0.01])
def test_hoeffding_never_below_the_exact_binomial_tail(p):
    n = 200
    t = np.arange(1.0, 60.0)
    law = stats.binom(n, p)
    exact = law.sf(np.ceil(n * p + t) - 1) + law.cdf(np.floor(n * p - t))
    assert np.all(exact <= conc.hoeffding_bound(t, 0.0, 1.0, n=n) * (1 + 1e-12))


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((1.0, [0.0, 0.0], [1.0]), {}, ValueError, "same length"),
    ((1.0, [[0.0]], [[1.0]]), {}, ValueError, "1-D"),
    ((1.0, [0.0, 0.0], [1.0, 1.0]), {"n": 3}, ValueError, "either"),
    ((1.0, 1.0, 0.0), {}, ValueError, "b must be >= a"),
    ((1.0, 1.0, 1.0), {}, ValueError, "zero width"),
    ((1.0, 0.0, np.inf), {}, ValueError, "finite"),
    ((1.0, 0.0, 1.0), {"n": 0}, ValueError, "n must be"),
    ((1.0, 0.0, 1.0), {"n": 1.5}, TypeError, "n must be"),
    ((-1.0, 0.0, 1.0), {}, ValueError, "t must be"),
    ((1.0, "0", 1.0), {}, TypeError, "lower"),
])
def test_hoeffding_rejects_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        conc.hoeffding_bound(*args, **kwargs)


# ----------------------------------------------------------------------------------------------
# maxima
# ----------------------------------------------------------------------------------------------
def test_maximal_bound_closed_forms():
    assert abs(conc.maximal_bound(10**6) - math.sqrt(2 * math.log(2e6))) < 1e-12
    assert conc.maximal_bound(1, two_sided=False) == 0.0
    assert abs(conc.maximal_bound(50, 4.0, two_sided=False) - 2 * math.sqrt(2 * math.log(50))) \
        < 1e-12
    # sub-exponential: the linear term wins for large N
    big = conc.maximal_bound(10**12, 1.0, b=1.0)
    assert abs(big - 2 * math.log(2e12)) < 1e-9
    tail = conc.maximal_bound(1000, 2.0, delta=0.05)
    assert abs(tail - math.sqrt(4 * math.log(2000 / 0.05))) < 1e-12
    np.testing.assert_allclose(conc.maximal_bound(np.array([1, 10])),
                               np.sqrt(2 * np.log([2.0, 20.0])))


def test_maximal_bound_holds_for_dependent_and_independent_rows():
    gen = np.random.default_rng(11)
    g = gen.standard_normal((2000, 256))
    independent = np.abs(g).max(axis=1).mean()
    dependent = np.abs(g[:, :1]).max(axis=1).mean()           # all rows equal
    assert dependent < independent < conc.maximal_bound(256)
    # the tail version at delta = 0.05 is exceeded in at most ~5% of the trials
    assert (np.abs(g).max(axis=1) >= conc.maximal_bound(256, delta=0.05)).mean() <= 0.05


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(N=0), ValueError, "N must be"),
    (dict(N=1.5), TypeError, "N must be"),
    (dict(N=10, sigma2=0.0), ValueError, "sigma2"),
    (dict(N=10, b=-1.0), ValueError, "b must be"),
    (dict(N=10, delta=1.0), ValueError, "delta"),
    (dict(N=10, delta=0.0), ValueError, "delta"),
    (dict(N=10, delta="0.1"), TypeError, "delta"),
    (dict(N=10, two_sided=1), TypeError, "two_sided"),
    (dict(N=10, sigma2=np.inf), ValueError, "sigma2"),
])
def test_maximal_bound_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        conc.maximal_bound(**kwargs)


def test_gaussian_max_expectation_known_values():
    signed = conc.gaussian_max_expectation(np.array([2, 3, 4, 5]), absolute=False)
    np.testing.assert_allclose(signed, [1 / SQRT_PI, 1.5 / SQRT_PI, 1.0293753730039641,
                                        1.1629644736405196], rtol=1e-9)
    assert abs(conc.gaussian_max_expectation(1, absolute=False)) < 1e-12
    np.testing.assert_allclose(conc.gaussian_max_expectation(np.array([1, 2])),
                               [math.sqrt(2 / math.pi), 2 / SQRT_PI], rtol=1e-9)


@pytest.mark.parametrize("n", [7, 300, 20_000])
def test_gaussian_max_expectation_against_the_density_of_the_maximum(n):
    # independent method: E M = int x n f(x) F(x)^(n-1) dx with F(x) = 2 Phi(x) - 1 on x >= 0
    def integrand(x):
        return x * n * 2 * stats.norm.pdf(x) * math.exp((n - 1) * math.log1p(-math.erfc(
            x / math.sqrt(2))))
    direct = integrate.quad(integrand, 0, 40, points=[math.sqrt(2 * math.log(n))], limit=200,
                            epsabs=1e-13)[0]
    assert abs(conc.gaussian_max_expectation(n) - direct) < 1e-8


def test_gaussian_max_expectation_is_bracketed_and_increasing():
    N = np.unique(np.logspace(0, 15, 60).astype(np.int64))
    ex = conc.gaussian_max_expectation(N)
    assert np.all(np.diff(ex) > 0)
    assert np.all(ex <= conc.maximal_bound(N))
    for a in (0.0, 0.5, 1.0, 3.0):
        assert np.all(conc.gaussian_max_lower_bound(N, a) <= ex)
    t_n = stats.norm.isf(1 / (2.0 * N))
    assert np.all((1 - (1 - 1.0 / N) ** N) * t_n <= ex)


def test_gaussian_max_lower_bound_values():
    assert conc.gaussian_max_lower_bound(5) == 0.0              # t_a < 1: trivial bound
    t = math.sqrt(2 * math.log(1e6) - math.log(4 * math.pi * math.log(1e6)))
    assert abs(conc.gaussian_max_lower_bound(10**6) - (1 - math.exp(-1)) * t) < 1e-12
    # a = ln ln N makes the ratio to sqrt(2 ln N) increase towards 1
    N = np.array([10**4, 10**8, 10**15])
    ratio = np.array([conc.gaussian_max_lower_bound(int(n), math.log(math.log(n)))
                      for n in N]) / np.sqrt(2 * np.log(N))
    assert np.all(np.diff(ratio) > 0) and ratio[-1] > 0.75


@pytest.mark.parametrize("fn", [conc.gaussian_max_expectation, conc.gaussian_max_lower_bound])
def test_gaussian_max_functions_reject_bad_N(fn):
    with pytest.raises(ValueError, match="N must be"):
        fn(0)
    with pytest.raises(TypeError, match="N must be"):
        fn(1e6)


def test_gaussian_max_functions_reject_bad_options():
    with pytest.raises(TypeError, match="absolute"):
        conc.gaussian_max_expectation(10, absolute="yes")
    with pytest.raises(ValueError, match="a must be"):
        conc.gaussian_max_lower_bound(10, a=-1.0)
    with pytest.raises(TypeError, match="a must be"):
        conc.gaussian_max_lower_bound(10, a="1")


def test_simulate_max_matches_the_exact_mean():
    sims = conc.simulate_max([100, 10_000], 400, 5)
    exact = conc.gaussian_max_expectation(np.array([100, 10_000]))
    se = sims.std(axis=1, ddof=1) / math.sqrt(400)
    assert np.all(np.abs(sims.mean(axis=1) - exact) < 4 * se)
    signed = conc.simulate_max(1000, 400, 6, absolute=False)
    se1 = signed.std(ddof=1) / math.sqrt(400)
    assert abs(signed.mean() - conc.gaussian_max_expectation(1000, absolute=False)) < 4 * se1


def test_simulate_max_checkpoints_and_chunks_do_not_change_the_draws():
    full = conc.simulate_max([10, 100, 1000], 16, 3)
    assert np.array_equal(full[-1], conc.simulate_max(1000, 16, 3))
    assert np.array_equal(full[0], conc.simulate_max(10, 16, 3))
    assert np.array_equal(full, conc.simulate_max([10, 100, 1000], 16, 3, chunk_size=48))
    assert np.all(np.diff(full, axis=0) >= 0)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 60), st.integers(1, 8), st.integers(1, 50), st.integers(0, 2**31))
def test_simulate_max_does_not_depend_on_chunk_size(N, trials, extra, seed):
    a = conc.simulate_max(N, trials, seed)
    b = conc.simulate_max(N, trials, seed, chunk_size=trials + extra)
    assert np.array_equal(a, b)


def test_simulate_max_loc_and_scale():
    base = conc.simulate_max(500, 32, 9, absolute=False)
    shifted = conc.simulate_max(500, 32, 9, absolute=False, loc=3.0, scale=2.0)
    np.testing.assert_allclose(shifted, 3.0 + 2.0 * base, rtol=1e-12)
    both = conc.simulate_max(500, 32, 9, loc=-1.0)
    assert np.all(both >= np.abs(-1.0 + base) - 1e-12)


def test_simulate_max_with_a_sampler():
    def uniform(gen, shape):
        return gen.uniform(-1.0, 1.0, shape)

    m = conc.simulate_max(2000, 50, 1, sampler=uniform)
    assert np.all(m <= 1.0) and m.mean() > 0.99


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(N=0, n_trials=3, rng=0), ValueError, "N must be"),
    (dict(N=[10, 5], n_trials=3, rng=0), ValueError, "increasing"),
    (dict(N=10, n_trials=0, rng=0), ValueError, "n_trials"),
    (dict(N=10, n_trials=2.0, rng=0), TypeError, "n_trials"),
    (dict(N=10, n_trials=3, rng=None), TypeError, "rng"),
    (dict(N=10, n_trials=3, rng="seed"), TypeError, "rng"),
    (dict(N=10, n_trials=3, rng=0, scale=0.0), ValueError, "scale"),
    (dict(N=10, n_trials=3, rng=0, loc=np.nan), ValueError, "loc"),
    (dict(N=10, n_trials=3, rng=0, absolute="yes"), TypeError, "absolute"),
    (dict(N=10, n_trials=3, rng=0, sampler=3), TypeError, "sampler"),
    (dict(N=10, n_trials=8, rng=0, chunk_size=4), ValueError, "chunk_size"),
    (dict(N=10, n_trials=3, rng=0, chunk_size=0), ValueError, "chunk_size"),
])
def test_simulate_max_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        conc.simulate_max(**kwargs)


def test_simulate_max_rejects_a_broken_sampler():
    with pytest.raises(ValueError, match="shape"):
        conc.simulate_max(10, 3, 0, sampler=lambda gen, shape: np.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        conc.simulate_max(10, 3, 0, sampler=lambda gen, shape: np.full(shape, np.nan))


# ----------------------------------------------------------------------------------------------
# norm concentration
# ----------------------------------------------------------------------------------------------
def test_norm_bounds_closed_forms():
    t = np.array([0.0, 1.0, 2.5])
    np.testing.assert_allclose(conc.norm_concentration_bound(t), 2 * np.exp(-(t**2) / 2))
    np.testing.assert_allclose(conc.norm_concentration_bound(t, method="interpolation"),
                               2 * np.exp(-2 * t**2 / math.pi**2))
    np.testing.assert_allclose(conc.norm_concentration_bound(t, 4.0, method="bernstein",
                                                             two_sided=False),
                               np.exp(-(t**2) / 32))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.floats(0.0, 6.0))
def test_norm_bounds_hold_for_the_chi_law(d, t):
    chi = stats.chi(d)
    m = chi.mean()
    assert chi.sf(m + t) + chi.cdf(m - t) <= conc.norm_concentration_bound(t) + 1e-12
    root = math.sqrt(d)
    exact_root = chi.sf(root + t) + chi.cdf(root - t)
    assert exact_root <= conc.norm_concentration_bound(t, method="bernstein") + 1e-12


@pytest.mark.parametrize("d", [1, 3, 50, 700])
def test_norm_is_one_sub_gaussian_as_the_lipschitz_theorem_says(d):
    lam = np.linspace(-15.0, 15.0, 61)
    assert subgaussian.proxy_profile(stats.chi(d), lam).max() <= 1.0 + 1e-9


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(t=-1.0), ValueError, "t must be"),
    (dict(t=1.0, sigma2=0.0), ValueError, "sigma2"),
    (dict(t=1.0, sigma2="1"), TypeError, "sigma2"),
    (dict(t=1.0, method="sharp"), ValueError, "method"),
    (dict(t=1.0, method=2), TypeError, "method"),
    (dict(t=1.0, two_sided=None), TypeError, "two_sided"),
])
def test_norm_bound_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        conc.norm_concentration_bound(**kwargs)
