"""Callables for inequalities the chapters state (issue 28 item 7): Bernstein for bounded summands,
Laurent–Massart for chi-square, the mean norm of a Gaussian vector — against exact laws and simulation."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from companion.theory.concentration import (
    bernstein_variance_bound, gaussian_norm_mean, hoeffding_bound, laurent_massart_bound)


@pytest.mark.parametrize("n, p", [(100, 0.5), (1000, 0.01), (10_000, 1e-3)])
def test_bernstein_bounds_the_exact_binomial_tail(n, p):
    # X_i ~ Bernoulli(p): Var = p(1 - p), |X_i - p| <= 1 - p (p <= 1/2)
    t = np.linspace(0.0, 0.5 * n * (1 - p), 200)
    upper = stats.binom(n, p).sf(np.ceil(n * p + t) - 1)  # P(S - np >= t)
    lower = stats.binom(n, p).cdf(np.floor(n * p - t))  # P(np - S >= t)
    one = bernstein_variance_bound(t, p * (1 - p), 1 - p, n=n, two_sided=False)
    assert (upper <= one * (1 + 1e-12)).all() and (lower <= one * (1 + 1e-12)).all()
    assert (upper + lower <= bernstein_variance_bound(t, p * (1 - p), 1 - p, n=n) * (1 + 1e-12)).all()
    if p <= 0.01:  # small variance: far below Hoeffding's exp(-2t^2/n) in the bulk
        mid = t[len(t) // 10]
        bern = bernstein_variance_bound(mid, p * (1 - p), 1 - p, n=n)
        assert bern < 1e-3 * hoeffding_bound(mid, 0, 1, n=n)


def test_bernstein_against_a_simulation_and_its_formula():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, size=(200_000, 20))  # Var 1/3, range 1
    s = x.sum(axis=1)
    for t in (2.0, 4.0, 6.0):
        assert np.mean(np.abs(s) >= t) <= bernstein_variance_bound(t, 1 / 3, 1.0, n=20)
        with mpmath.workdps(30):
            exact = 2 * mpmath.exp(-mpmath.mpf(t) ** 2 / (2 * (20 * mpmath.mpf(1) / 3 + mpmath.mpf(t) / 3)))
        assert bernstein_variance_bound(t, 1 / 3, 1.0, n=20) == pytest.approx(float(exact), rel=1e-14)
    # t^2 under- or overflowing: the exponent is formed without it
    with mpmath.workdps(30):
        tiny = 2 * mpmath.exp(-mpmath.mpf(1e-162) ** 2 / (2 * mpmath.mpf(1e-323)))
    assert bernstein_variance_bound(1e-162, 1e-323, 0.0) == pytest.approx(float(tiny), rel=1e-12)
    assert bernstein_variance_bound(1e200, 1.0, 1.0) == 0.0
    assert bernstein_variance_bound(0.0, 1.0, 1.0) == 2.0


@pytest.mark.parametrize("kwargs, err", [
    (dict(t=-1.0, sigma2=1.0, b=1.0), ValueError), (dict(t=1.0, sigma2=0.0, b=1.0), ValueError),
    (dict(t=1.0, sigma2=1.0, b=-1.0), ValueError), (dict(t=1.0, sigma2=1.0, b=math.inf), ValueError),
    (dict(t=1.0, sigma2=1.0, b=1.0, n=0), ValueError), (dict(t=1.0, sigma2=1.0, b=1.0, n=2.5), TypeError),
    (dict(t=[1.0, 2.0], sigma2=[1.0, 2.0, 3.0], b=1.0), ValueError),
    (dict(t=math.nan, sigma2=1.0, b=1.0), ValueError),
    (dict(t=1.0, sigma2=1.0, b=1.0, two_sided=1), TypeError)])
def test_bernstein_input_checks(kwargs, err):
    with pytest.raises(err):
        bernstein_variance_bound(**kwargs)


@pytest.mark.parametrize("d", [1, 3, 10, 100, 10_000])
def test_laurent_massart_bounds_the_exact_chi_square_tails(d):
    t = np.geomspace(1e-3, 50.0 * math.sqrt(d) + 100.0, 300)
    law = stats.chi2(d)
    assert (law.sf(d + t) <= laurent_massart_bound(t, d) * (1 + 1e-12)).all()
    lower = laurent_massart_bound(t, d, tail="lower")
    assert (law.cdf(np.maximum(d - t, 0.0)) <= lower * (1 + 1e-12)).all()
    for x in (0.1, 1.0, 30.0):  # the lemma's own form: e^{-x} at t = 2 sqrt(dx) + 2x, resp. 2 sqrt(dx)
        upper = laurent_massart_bound(2 * math.sqrt(d * x) + 2 * x, d)
        assert upper == pytest.approx(math.exp(-x), rel=1e-12)
        assert laurent_massart_bound(2 * math.sqrt(d * x), d, tail="lower") == pytest.approx(
            math.exp(-x), rel=1e-12)


def test_laurent_massart_at_the_float_limits_and_checks():
    assert laurent_massart_bound(1e300, 1.0) == 0.0  # sqrt(d + 2t) and t^2 stay finite
    assert laurent_massart_bound(1e-170, 1e300) == 1.0
    assert laurent_massart_bound(1e-162, 1e-320, tail="lower") == pytest.approx(
        math.exp(-1e-324 / (4 * 1e-320)), rel=1e-3)
    for kwargs in (dict(t=-1.0, d=1.0), dict(t=1.0, d=0.0), dict(t=1.0, d=1.0, tail="both"),
                   dict(t=1.0, d=math.nan), dict(t=[1.0, 2.0], d=[1.0, 2.0, 3.0])):
        with pytest.raises(ValueError):
            laurent_massart_bound(**kwargs)


def test_gaussian_norm_mean_exact_and_simulated():
    for d in (1, 2, 3, 7, 100, 299, 300, 301, 1000, 10**6, 10**12):
        with mpmath.workdps(60):
            half = mpmath.mpf(d) / 2
            exact = mpmath.sqrt(2) * mpmath.exp(mpmath.loggamma(half + 0.5) - mpmath.loggamma(half))
        assert gaussian_norm_mean(d) == pytest.approx(float(exact), rel=4e-16)
    for d in (1e17, 2.0**63, 1e300):  # sqrt(d - 1/2) + O(d^{-3/2}): equal in float64
        assert gaussian_norm_mean(d) == pytest.approx(math.sqrt(d), rel=1e-15)
    assert gaussian_norm_mean(4, sigma2=9.0) == pytest.approx(3 * gaussian_norm_mean(4), rel=1e-15)
    np.testing.assert_allclose(gaussian_norm_mean([1, 2]), [math.sqrt(2 / math.pi), math.sqrt(math.pi / 2)])
    rng = np.random.default_rng(1)
    norms = np.linalg.norm(rng.standard_normal((200_000, 5)), axis=1)
    se = norms.std() / math.sqrt(norms.size)
    assert abs(norms.mean() - gaussian_norm_mean(5)) < 4 * se


@pytest.mark.parametrize("kwargs, err", [
    (dict(d=0), ValueError), (dict(d=-3), ValueError), (dict(d=math.nan), ValueError),
    (dict(d=math.inf), ValueError), (dict(d=3, sigma2=0.0), ValueError), (dict(d=3, sigma2="1"), TypeError),
    (dict(d=4, sigma2=1e308), None)])
def test_gaussian_norm_mean_input_checks(kwargs, err):
    if err is None:  # sigma sqrt(d) <= sqrt(max * max): the mean is always finite
        assert math.isfinite(gaussian_norm_mean(**kwargs))
        assert gaussian_norm_mean(1.7976931348623157e308, sigma2=1.7976931348623157e308) == pytest.approx(
            1.7976931348623157e308, rel=1e-15)
        return
    with pytest.raises(err):
        gaussian_norm_mean(**kwargs)


# --- Bennett's inequality (issue 28 item 4) ---------------------------------------------------------

from companion.theory.concentration import bennett_bound, bernstein_variance_bound as _bvb  # noqa: E402


@pytest.mark.parametrize("n, p", [(100, 0.5), (1000, 0.01), (10_000, 1e-3)])
def test_bennett_bounds_the_exact_binomial_tail_and_beats_bernstein(n, p):
    k = np.arange(math.ceil(n * p) + 1, math.ceil(n * p) + 60)
    t = k - n * p
    exact = stats.binom(n, p).sf(k - 1)
    ben = bennett_bound(t, p * (1 - p), 1 - p, n=n)
    assert np.all(exact <= ben * (1 + 1e-12))
    assert np.all(ben <= _bvb(t, p * (1 - p), 1 - p, n=n, two_sided=False) * (1 + 1e-12))


def test_bennett_poisson_limit_is_the_poisson_chernoff_bound():
    # b -> 0 relative to the mean: n p = 10 fixed, n -> infinity; the Poisson Chernoff bound by mpmath
    mu, t = 10.0, 15.0
    chernoff = float(mpmath.exp(-(mu * ((1 + t / mu) * mpmath.log(1 + t / mu) - t / mu))))
    val = bennett_bound(t, mu / 1e7 * (1 - 1e-7), 1 - 1e-7, n=10 ** 7)
    assert val == pytest.approx(chernoff, rel=1e-5)
    assert stats.poisson(mu).sf(mu + t - 1) <= chernoff


def test_bennett_closed_form_and_edges():
    assert bennett_bound(1.0, 1.0, 1.0) == pytest.approx(math.exp(-(2 * math.log(2) - 1)), rel=1e-14)
    assert bennett_bound(0.0, 1.0, 1.0) == 1.0
    assert bennett_bound(1e300, 1.0, 1.0) == 0.0
    np.testing.assert_allclose(bennett_bound([0.5, 2.0], 1.0, [1.0, 2.0]).shape, (2,))


@pytest.mark.parametrize("args, exc", [((-1.0, 1.0, 1.0), ValueError), ((1.0, 0.0, 1.0), ValueError),
                                       ((1.0, 1.0, 0.0), ValueError), ((1.0, 1.0, np.inf), ValueError),
                                       (("a", 1.0, 1.0), TypeError)])
def test_bennett_rejects_bad_input(args, exc):
    with pytest.raises(exc):
        bennett_bound(*args)


def test_bennett_rejects_bad_n():
    with pytest.raises((TypeError, ValueError)):
        bennett_bound(1.0, 1.0, 1.0, n=0)
