"""companion.theory.random_matrices: closed forms, Monte Carlo coverage with fixed seeds, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion.theory import random_matrices as rm


def test_net_bound_closed_form_at_quarter():
    m, n, s, delta = 30, 50, 0.2, 1e-3
    want = 2 * s * math.sqrt(2 * math.log(9) * (m + n) + 2 * math.log(1 / delta))
    assert rm.operator_norm_net_bound(m, n, s, delta) == pytest.approx(want, rel=1e-12)


def test_net_bound_optimised_theta_is_a_grid_minimum():
    grid = np.linspace(0.001, 0.499, 4000)
    best = min(rm.operator_norm_net_bound(40, 40, 1.0, 0.05, theta=float(th)) for th in grid)
    opt = rm.operator_norm_net_bound(40, 40, 1.0, 0.05, theta=None)
    assert opt <= best + 1e-9 and opt >= best - 1e-3


def test_sharp_bound_closed_form_and_below_net():
    assert rm.operator_norm_sharp_bound(4, 9, 0.5, math.exp(-2)) == pytest.approx(0.5 * (2 + 3 + 2))
    for m, n in ((1, 1), (10, 300), (256, 256)):
        assert rm.operator_norm_sharp_bound(m, n, 1.0, 0.01) < rm.operator_norm_net_bound(m, n, 1.0, 0.01)


@pytest.mark.parametrize("entries", ["gauss", "rademacher"])
def test_operator_norm_coverage(entries):
    rng = np.random.default_rng(7)
    m, n, delta, reps = 20, 35, 0.2, 400
    draw = (lambda: rng.standard_normal((m, n))) if entries == "gauss" else (
        lambda: rng.choice([-1.0, 1.0], size=(m, n)))
    norms = np.array([np.linalg.norm(draw(), 2) for _ in range(reps)])
    assert np.all(norms <= rm.operator_norm_net_bound(m, n, 1.0, delta))  # Rademacher: proxy 1
    if entries == "gauss":
        assert np.mean(norms > rm.operator_norm_sharp_bound(m, n, 1.0, delta)) <= delta
        assert norms.mean() <= math.sqrt(m) + math.sqrt(n)


def test_bilinear_rank_one_chernoff_matches_product_of_gaussians():
    # Z = G G': E exp(lam Z) = (1 - lam^2)^(-1/2); minimise the exponent by brute force
    t = 4.0
    lam = np.linspace(1e-6, 1 - 1e-9, 200_001)
    brute = np.exp(np.min(-lam * t - 0.5 * np.log1p(-lam ** 2)))
    assert rm.bilinear_tail_bound(t, [1.0], method="chernoff") == pytest.approx(brute, rel=1e-6)


def test_bilinear_bounds_cover_monte_carlo():
    rng = np.random.default_rng(3)
    M = rng.standard_normal((12, 8)) / 4
    sv = np.linalg.svd(M, compute_uv=False)
    tq, tk = 1.5, 0.7
    q = tq * rng.standard_normal((200_000, 12))
    k = tk * rng.standard_normal((200_000, 8))
    z = np.einsum("ij,jk,ik->i", q, M, k)
    assert z.var() == pytest.approx((tq * tk) ** 2 * np.sum(sv ** 2), rel=0.02)
    for t in (1.0, 3.0, 6.0):
        chern = rm.bilinear_tail_bound(t, sv, tq * tk, method="chernoff")
        hw = rm.bilinear_tail_bound(t, sv, tq * tk)
        assert chern <= hw + 1e-12
        assert np.mean(z >= t) <= chern


def test_bilinear_edge_values():
    assert rm.bilinear_tail_bound(0.0, [1.0, 2.0]) == 1.0
    assert rm.bilinear_tail_bound(1.0, [0.0, 0.0]) == 0.0
    assert rm.bilinear_tail_bound(0.0, [0.0]) == 1.0


def test_backward_growth_closed_form():
    b = rm.operator_norm_sharp_bound(16, 32, math.sqrt(2 / 48), 0.1 / 2)
    out = rm.backward_growth_bound(1, 16, 32, 2.0, [0.5], 0.1)
    assert out == pytest.approx([1 + 2.0 * b * b / 0.5, 1.0])
    out = rm.backward_growth_bound(5, 16, 16, 1.0, [1, 2, 3, 4, 5], 0.1)
    assert out[-1] == 1.0 and np.all(np.diff(out) < 0)


def test_backward_growth_covers_a_simulated_stack():
    rng = np.random.default_rng(11)
    L, d = 6, 24
    s = 1.0
    grad = rng.standard_normal(d)
    ratio, g0 = [1.0], np.linalg.norm(grad)
    for _ in range(L):  # worst case over inputs: J = I / s, D = I
        w1 = rng.standard_normal((d, d)) / math.sqrt(d)
        w2 = rng.standard_normal((d, d)) / math.sqrt(d)
        grad = grad + grad @ w2.T @ w1.T / s
        ratio.append(np.linalg.norm(grad) / g0)
    bound = rm.backward_growth_bound(L, d, d, 1.0, np.full(L, s), 0.01)
    assert np.all(np.array(ratio)[::-1] <= bound)


@pytest.mark.parametrize("call, exc", [
    (lambda: rm.operator_norm_net_bound(0, 3, 1.0, 0.1), ValueError),
    (lambda: rm.operator_norm_net_bound(3.0, 3, 1.0, 0.1), TypeError),
    (lambda: rm.operator_norm_net_bound(3, 3, -1.0, 0.1), ValueError),
    (lambda: rm.operator_norm_net_bound(3, 3, 1.0, 1.0), ValueError),
    (lambda: rm.operator_norm_net_bound(3, 3, 1.0, 0.1, theta=0.5), ValueError),
    (lambda: rm.operator_norm_sharp_bound(3, 3, "1", 0.1), TypeError),
    (lambda: rm.operator_norm_sharp_bound(3, 3, 1.0, 0.0), ValueError),
    (lambda: rm.bilinear_tail_bound(-1.0, [1.0]), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, [-1.0]), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, []), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, [np.nan]), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, [1.0], scale=0.0), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, [1.0], method="exact"), ValueError),
    (lambda: rm.bilinear_tail_bound(1.0, "abc"), TypeError),
    (lambda: rm.backward_growth_bound(2, 4, 4, 1.0, [1.0], 0.1), ValueError),
    (lambda: rm.backward_growth_bound(2, 4, 4, 1.0, [1.0, 0.0], 0.1), ValueError),
    (lambda: rm.backward_growth_bound(2, 4, 4, 0.0, [1.0, 1.0], 0.1), ValueError),
    (lambda: rm.backward_growth_bound(0, 4, 4, 1.0, [], 0.1), ValueError),
])
def test_errors(call, exc):
    with pytest.raises(exc):
        call()
