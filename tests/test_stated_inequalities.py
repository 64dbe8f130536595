"""Callables for inequalities the chapters state (issue 28, item 7), and the proxy invariant.

Each value is checked against a computation that does not use the formula: exact enumeration with
fractions, mpmath at 30 digits, exact binomial tails, simulation.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import product

import mpmath
import numpy as np
import pytest
from scipy import stats

from companion.theory.concentration import bounded_differences_bound, efron_stein_bound
from companion.theory.exceedance import (
    mdependent_count_bound, mdependent_count_halfwidth, variance_inflation)
from companion.theory.subgaussian import optimal_variance_proxy


# ---- Azuma-Hoeffding / McDiarmid -------------------------------------------------------------

def test_bounded_differences_value_in_30_digits():
    c = [0.5, 1.0, 2.0, 0.25]
    with mpmath.workdps(30):
        total = sum(mpmath.mpf(x) ** 2 for x in c)
        for s in (0.0, 0.7, 3.0, 9.0):
            exact = mpmath.exp(-2 * mpmath.mpf(s) ** 2 / total)
            assert bounded_differences_bound(s, c, two_sided=False) == pytest.approx(float(exact), rel=1e-13)
            assert bounded_differences_bound(s, c) == pytest.approx(float(2 * exact), rel=1e-13)


def test_bounded_differences_holds_for_the_binomial_count():
    # a count of n fair coins changes by 1 when one coin changes (c_k = 1): the exact binomial tail
    # lies below the bound, and within a factor 6 of it at 2 sd (Hoeffding is not loose for fair coins)
    n = 400
    s = np.arange(0, 81)
    exact = stats.binom.sf(n / 2 + s - 1, n, 0.5)           # P(C - n/2 >= s)
    bound = bounded_differences_bound(s.astype(float), np.ones(n), two_sided=False)
    assert (exact <= bound).all()
    assert bound[20] / exact[20] < 6   # 5.3; exp(-s^2/(2n)) would give 24


def test_mcdiarmid_by_simulation_on_the_maximum_of_uniforms():
    rng = np.random.default_rng(3)
    n, reps = 20, 20_000
    mx = rng.random((reps, n)).max(axis=1)                  # c_k = 1 for every coordinate
    mean = n / (n + 1)
    for s in (0.05, 0.1, 0.2):
        emp = np.mean(np.abs(mx - mean) >= s)
        assert emp <= bounded_differences_bound(s, np.ones(n))


@pytest.mark.parametrize("kwargs, exc", [
    (dict(s=-1.0, c=[1.0]), ValueError), (dict(s=float("nan"), c=[1.0]), ValueError),
    (dict(s=1.0, c=[]), ValueError), (dict(s=1.0, c=[[1.0]]), ValueError),
    (dict(s=1.0, c=[1.0, -0.5]), ValueError), (dict(s=1.0, c=[0.0, 0.0]), ValueError),
    (dict(s=1.0, c=[1.0, math.inf]), ValueError), (dict(s="1", c=[1.0]), TypeError),
    (dict(s=1.0, c=[1.0], two_sided=1), TypeError)])
def test_bounded_differences_errors(kwargs, exc):
    with pytest.raises(exc):
        bounded_differences_bound(**kwargs)


def test_bounded_differences_extreme_scales():
    assert bounded_differences_bound(1e300, [1e-300]) == 0.0
    assert bounded_differences_bound(1e-300, [1e300]) == 2.0


# ---- Efron-Stein -----------------------------------------------------------------------------

def _majority(z):
    return int(sum(z) >= 2)


def test_efron_stein_exact_by_enumeration():
    # f = majority of 3 fair bits.  Every (Z, Z'_k) pair equally likely: the estimator is exact.
    values, resampled, exact = [], [], Fraction(0)
    for z in product((0, 1), repeat=3):
        for zp in product((0, 1), repeat=3):
            row = []
            for k in range(3):
                y = list(z)
                y[k] = zp[k]
                row.append(_majority(y))
                exact += Fraction((_majority(z) - _majority(y)) ** 2, 2 * 64)
            values.append(_majority(z))
            resampled.append(row)
    assert exact == Fraction(3, 8)                          # each bit is pivotal w.p. 1/2, flips w.p. 1/2
    assert efron_stein_bound(values, resampled) == pytest.approx(float(exact), abs=1e-15)
    assert float(Fraction(1, 4)) <= efron_stein_bound(values, resampled)   # Var of a fair bit


def test_efron_stein_is_an_equality_for_sums():
    rng = np.random.default_rng(5)
    z, zp = rng.standard_normal((200_000, 4)), rng.standard_normal((200_000, 4))
    w = np.array([1.0, 2.0, 0.5, 3.0])
    f = z @ w
    res = np.stack([f + w[k] * (zp[:, k] - z[:, k]) for k in range(4)], axis=1)
    assert efron_stein_bound(f, res) == pytest.approx(float(w @ w), rel=0.02)   # Var f = |w|^2


@pytest.mark.parametrize("values, resampled, exc", [
    ([], [], ValueError), ([1.0, 2.0], [[1.0]], ValueError), ([1.0], [[]], ValueError),
    ([1.0, math.nan], [[1.0], [1.0]], ValueError), (["a"], [[1.0]], TypeError)])
def test_efron_stein_errors(values, resampled, exc):
    with pytest.raises(exc):
        efron_stein_bound(values, resampled)


# ---- variance inflation ----------------------------------------------------------------------

def test_variance_inflation_of_a_markov_chain_by_enumeration():
    # stationary two-state chain: P(1 -> 1) = 3/4, P(0 -> 1) = 1/8, p = 1/3, rho_k = (5/8)^k.
    a, b, N = Fraction(3, 4), Fraction(1, 8), 8
    p = b / (1 - a + b)
    mean, second = Fraction(0), Fraction(0)
    for path in product((0, 1), repeat=N):
        pr = p if path[0] else 1 - p
        for x, y in zip(path, path[1:]):
            up = a if x else b
            pr *= up if y else 1 - up
        c = sum(path)
        mean += pr * c
        second += pr * c * c
    var = second - mean**2
    rho = [float((a - b) ** k) for k in range(1, N)]
    assert mean == N * p
    assert float(var) == pytest.approx(N * float(p * (1 - p)) * variance_inflation(rho, N), rel=1e-13)


def test_variance_inflation_of_alternating_signs_is_zero():
    # B_i = (i + U) mod 2: rho_k = (-1)^k, and C = N/2 exactly for even N
    assert variance_inflation([(-1.0) ** k for k in range(1, 10)], 10) == pytest.approx(0.0, abs=1e-12)
    assert variance_inflation([0.0] * 5, 6) == 1.0


@pytest.mark.parametrize("rho, N, exc", [
    ([0.5], 1, ValueError), ([0.5, 0.5], 2, ValueError), ([1.5], 5, ValueError), ([], 5, ValueError),
    ([-1.0, -1.0, -1.0], 4, ValueError), ([0.5], 4.0, TypeError), ([math.nan], 4, ValueError)])
def test_variance_inflation_errors(rho, N, exc):
    with pytest.raises(exc):
        variance_inflation(rho, N)


# ---- counts over m-dependent tokens ----------------------------------------------------------

def test_mdependent_bound_values():
    # (m + 1) | N: the exponent is -2 s^2 / ((m + 1) N)
    for s in (0.0, 10.0, 55.5):
        assert mdependent_count_bound(s, 1000, 4, two_sided=False) == pytest.approx(
            5 * math.exp(-2 * s * s / 5000), rel=1e-14)
    assert mdependent_count_bound(10.0, 100, 0) == pytest.approx(2 * math.exp(-2.0), rel=1e-14)
    # N = 10, m = 2: n_- = 3 (not 10/3)
    assert mdependent_count_bound(5.0, 10, 2, two_sided=False) == pytest.approx(3 * math.exp(-1.5), rel=1e-14)


def test_mdependent_halfwidth_inverts_the_bound():
    for N, m, delta in ((1000, 0, 0.05), (10_000, 9, 0.01), (37, 5, 0.5)):
        h = mdependent_count_halfwidth(N, m, delta)
        assert mdependent_count_bound(h, N, m) == pytest.approx(delta, rel=1e-12)


def test_mdependent_bound_holds_by_simulation():
    # 2-dependent indicators B_i = 1{max(U_i, U_{i+1}, U_{i+2}) > 0.9}, p = 1 - 0.9^3
    rng = np.random.default_rng(11)
    N, m, reps = 300, 2, 4000
    u = rng.random((reps, N + m))
    win = np.maximum(np.maximum(u[:, :N], u[:, 1:N + 1]), u[:, 2:N + 2])
    dev = (win > 0.9).sum(axis=1) - N * (1 - 0.9**3)
    for s in (20.0, 30.0, 40.0):
        assert np.mean(np.abs(dev) >= s) <= mdependent_count_bound(s, N, m)
    assert np.mean(np.abs(dev) <= mdependent_count_halfwidth(N, m, 0.05)) >= 0.95


@pytest.mark.parametrize("args, exc", [
    ((-1.0, 10, 1), ValueError), ((1.0, 3, 3), ValueError), ((1.0, 10, -1), ValueError),
    ((1.0, 10.0, 1), TypeError), ((math.nan, 10, 1), ValueError)])
def test_mdependent_bound_errors(args, exc):
    with pytest.raises(exc):
        mdependent_count_bound(*args)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, math.nan])
def test_mdependent_halfwidth_errors(delta):
    with pytest.raises(ValueError):
        mdependent_count_halfwidth(100, 1, delta)


# ---- the proxy invariant ---------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [(0.5, 0.5), (0.3, 2.0), (2.0, 0.3), (0.1, 1.0)])
def test_proxy_is_never_below_the_variance(a, b):
    dist = stats.beta(a, b)
    assert optimal_variance_proxy(dist) >= dist.var()


def test_a_proxy_below_the_variance_is_refused(monkeypatch):
    # simulate nodes that lost mass: the numeric search returns less than the variance
    from companion.theory import subgaussian as sg
    monkeypatch.setattr(sg, "_numeric_proxy",
                        lambda dist: sg.ProxyResult(0.9 * dist.var(), dist.var(), 0.0, "numeric"))
    with pytest.raises(ValueError, match="below the variance"):
        sg.optimal_variance_proxy(stats.beta(0.3, 2.0))


# ---- the Weibull tail of a sub-Weibull variable (heavy_tails, ht-prop-tail) -------------------

def test_sub_weibull_tail_bound_against_the_weibull_law():
    # X ~ Weibull(alpha): P(X > t) = exp(-t^alpha) and E exp((X/s)^alpha) = 1/(1 - s^-alpha), so
    # ||X||_psi_alpha = 2^(1/alpha) exactly (mpmath checks the Orlicz integral at that s)
    from companion.theory.heavy_tails import psi_alpha_norm, sub_weibull_tail_bound
    for alpha in (0.5, 1.0, 2.0):
        K = 2.0 ** (1 / alpha)
        with mpmath.workdps(30):
            a = mpmath.mpf(alpha)
            orlicz = mpmath.quad(lambda x: mpmath.exp((x / K) ** a) * a * x ** (a - 1) * mpmath.exp(-x**a),
                                 [0, 1, mpmath.inf])
        assert float(orlicz) == pytest.approx(2.0, rel=1e-12)
        t = np.linspace(0.0, 20.0, 201)
        bound = sub_weibull_tail_bound(t, K, alpha)
        assert np.allclose(bound, 2 * np.exp(-t**alpha / 2), rtol=1e-13)
        assert (stats.weibull_min(alpha).sf(t) <= bound).all()
    x = stats.weibull_min(1.0).rvs(200_000, random_state=np.random.default_rng(2))
    assert psi_alpha_norm(x, 1.0) == pytest.approx(2.0, rel=0.05)      # the plug-in norm agrees


def test_sub_weibull_tail_bound_extremes_and_errors():
    from companion.theory.heavy_tails import sub_weibull_tail_bound
    assert sub_weibull_tail_bound(0.0, 1.0, 1.0) == 2.0
    assert sub_weibull_tail_bound(1e-300, 1e300, 0.5) == 2.0
    assert sub_weibull_tail_bound(1e300, 1.0, 2.0) == 0.0
    for t, K, alpha, exc in ((-1.0, 1.0, 1.0, ValueError), (math.nan, 1.0, 1.0, ValueError),
                             (1.0, 0.0, 1.0, ValueError), (1.0, 1.0, -2.0, ValueError),
                             (1.0, math.inf, 1.0, ValueError), ("1", 1.0, 1.0, TypeError),
                             (True, 1.0, 1.0, TypeError), (1.0, "K", 1.0, TypeError)):
        with pytest.raises(exc):
            sub_weibull_tail_bound(t, K, alpha)
