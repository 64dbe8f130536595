"""companion.theory.norms: norm concentration with explicit constants, Khintchine's constants and exact
Rademacher moments, Sudakov–Fernique factors for correlated Gaussian maxima (issue 28 item 4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special, stats

from companion.theory import concentration as conc
from companion.theory import norms


def test_norm_square_bound_closed_form_and_gaussian_tails():
    d, s = 100, np.array([10.0, 30.0, 60.0])
    up = norms.norm_square_bound(s, d)
    np.testing.assert_allclose(up, np.exp(-s ** 2 / (2 * (32 * math.sqrt(2) * d + 4 * s))), rtol=1e-14)
    # Gaussian coordinates: proxy 1, E X^4 = 3; the bounds must hold for chi^2_d
    assert np.all(stats.chi2(d).sf(d + s) <= up)
    assert np.all(stats.chi2(d).cdf(d - s) <= norms.norm_square_bound(s, d, tail="lower", m4=3.0))


def test_subgaussian_norm_bound_holds_for_uniform_and_sparse_coordinates():
    rng = np.random.default_rng(3)
    d = 256
    x_u = rng.uniform(-math.sqrt(3), math.sqrt(3), (20_000, d))
    x_s = rng.choice([-1.0, 0.0, 1.0], size=(20_000, d), p=[0.05, 0.9, 0.05]) / math.sqrt(0.1)
    for x, proxy in ((x_u, 1.0), (x_s, 1.5)):
        dev = np.abs(np.linalg.norm(x, axis=1) - math.sqrt(d))
        for t in (0.5, 1.0, 2.0):
            assert (dev >= t).mean() <= norms.subgaussian_norm_bound(t, proxy)
    assert norms.subgaussian_norm_bound(10.0) == pytest.approx(2 * math.exp(-100 / (2 * (4 + 32 * math.sqrt(2)))))


@pytest.mark.parametrize("call", [lambda: norms.subgaussian_norm_bound(1.0, 0.5),
                                  lambda: norms.subgaussian_norm_bound(-1.0),
                                  lambda: norms.norm_square_bound(1.0, 0),
                                  lambda: norms.norm_square_bound(1.0, 10, tail="both"),
                                  lambda: norms.norm_square_bound(1.0, 10, sigma2=0.5),
                                  lambda: norms.norm_square_bound(1.0, 10, tail="lower", m4=0.5)])
def test_norm_bounds_reject_bad_input(call):
    with pytest.raises(ValueError):
        call()


def _moment_by_hand(a, p):
    total = 0.0
    for signs in itertools.product((-1, 1), repeat=len(a)):
        total += abs(sum(s * w for s, w in zip(signs, a))) ** p
    return total / 2 ** len(a)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, 4.0])
def test_rademacher_moment_matches_a_second_enumeration(p):
    a = [0.3, -1.2, 2.0, 0.7, 0.1]
    assert norms.rademacher_moment(a, p) == pytest.approx(_moment_by_hand(a, p), rel=1e-12)
    if p == 2.0:
        assert norms.rademacher_moment(a, p) == pytest.approx(sum(w * w for w in a), rel=1e-12)


@pytest.mark.parametrize("p", [0.3, 0.5, 1.0, 1.5, 1.9, 2.0, 3.0, 4.0, 8.0])
def test_khintchine_constants_bracket_exact_moments(p):
    a_p, b_p = norms.khintchine_constants(p)
    a_h, b_h = norms.khintchine_constants(p, "haagerup")
    assert a_p <= a_h + 1e-12 and b_h <= b_p + 1e-12
    rng = np.random.default_rng(int(10 * p))
    for w in (np.ones(12), rng.standard_normal(12), np.array([1.0, 1.0]), np.array([1.0])):
        v = norms.rademacher_moment(w / np.linalg.norm(w), p) ** (1 / p)
        assert a_h - 1e-12 <= v <= b_h + 1e-12


def test_khintchine_known_values():
    assert norms.khintchine_constants(1.0, "haagerup")[0] == pytest.approx(1 / math.sqrt(2))   # Szarek
    # two equal weights attain Szarek's constant: E|xi_1 + xi_2| / sqrt 2 = 1 / sqrt 2
    assert norms.rademacher_moment([1.0, 1.0], 1.0) / math.sqrt(2) == pytest.approx(1 / math.sqrt(2))
    # Gaussian moment for p = 4: 3^(1/4)
    assert norms.khintchine_constants(4.0, "haagerup")[1] == pytest.approx(3 ** 0.25, rel=1e-12)
    # proved upper constant for p = 2: (2 * 2 * Gamma(1))^(1/2) = 2
    assert norms.khintchine_constants(2.0)[1] == pytest.approx(2.0, rel=1e-12)
    assert norms.khintchine_constants(1.0)[0] == pytest.approx(3 ** -0.5, rel=1e-12)


@pytest.mark.parametrize("call, exc", [(lambda: norms.khintchine_constants(0.0), ValueError),
                                       (lambda: norms.khintchine_constants("2"), TypeError),
                                       (lambda: norms.khintchine_constants(2.0, "optimal"), ValueError),
                                       (lambda: norms.rademacher_moment(np.ones(21), 1.0), ValueError),
                                       (lambda: norms.rademacher_moment([[1.0, 2.0]], 1.0), ValueError),
                                       (lambda: norms.rademacher_moment([1.0, np.nan], 1.0), ValueError),
                                       (lambda: norms.rademacher_moment([1.0], -1.0), ValueError)])
def test_khintchine_rejects_bad_input(call, exc):
    with pytest.raises(exc):
        call()


def test_equicorrelated_max_against_simulation():
    rng = np.random.default_rng(5)
    for rho in (0.0, 0.3, 0.8):
        y = math.sqrt(rho) * rng.standard_normal((50_000, 1)) + math.sqrt(1 - rho) * rng.standard_normal((50_000, 50))
        m = y.max(axis=1)
        assert abs(m.mean() - norms.equicorrelated_max_expectation(50, rho)) < 4 * m.std() / math.sqrt(m.size)
    assert norms.equicorrelated_max_expectation(2, 0.0) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-8)
    assert norms.equicorrelated_max_expectation(10, 1.0) == 0.0


def test_correlated_max_factors_bracket_simulation():
    rng = np.random.default_rng(6)
    n = 40
    a = rng.standard_normal((n, 5))
    cov = a @ a.T + np.eye(n)
    sd = np.sqrt(np.diag(cov))
    r = cov / np.outer(sd, sd)
    lo, hi = norms.correlated_max_factors(r)
    y = rng.standard_normal((40_000, n)) @ np.linalg.cholesky(r).T
    e_iid = float(conc.gaussian_max_expectation(n, absolute=False))
    assert lo * e_iid <= y.max(axis=1).mean() <= hi * e_iid
    off = r[~np.eye(n, dtype=bool)]
    assert lo == pytest.approx(math.sqrt(1 - off.max()))
    assert hi == pytest.approx(math.sqrt(1 + max(0.0, -off.min())))


@pytest.mark.parametrize("corr", [np.eye(1), [[1.0, 0.5], [0.4, 1.0]], [[2.0, 0.0], [0.0, 1.0]],
                                  [[1.0, 1.5], [1.5, 1.0]], np.ones(3)])
def test_correlated_max_factors_reject_bad_matrices(corr):
    with pytest.raises(ValueError):
        norms.correlated_max_factors(corr)


@pytest.mark.parametrize("args", [(0, 0.5), (10, -0.1), (10, 1.5)])
def test_equicorrelated_rejects_bad_input(args):
    with pytest.raises(ValueError):
        norms.equicorrelated_max_expectation(*args)
