"""Tests for companion.theory.exceedance: bounds against exact values, exact values against scipy.stats,
simulations against binomial intervals, streaming invariants, and every bad input."""

from __future__ import annotations

import doctest
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

import companion.theory.exceedance as ex
from companion.theory.exceedance import (
    NOISE_LAWS, SUBGAUSSIAN_NOISE_LAWS, count_interval, exceedance_probability,
    exceedance_probability_gaussian, expected_count_gaussian, half_exceedance_margin, simulate_counts,
    theorem1_lower_bound, theorem2_bounds,
)

SQRT3 = math.sqrt(3.0)
finite = dict(allow_nan=False, allow_infinity=False)
means = st.floats(-8.0, 8.0, **finite)
thresholds = st.floats(0.0, 8.0, **finite)
scales = st.floats(0.05, 4.0, **finite)


def frozen_noise(noise: str, sigma: float):
    """The convention of the module written as scipy.stats frozen laws (independent of the code)."""
    if noise == "gaussian":
        return stats.norm(scale=sigma)
    if noise == "uniform":
        return stats.uniform(loc=-SQRT3 * sigma, scale=2 * SQRT3 * sigma)
    if noise == "laplace":
        return stats.laplace(scale=sigma / math.sqrt(2.0))
    raise ValueError(noise)


def reference_probability(mu: float, t: float, sigma: float, noise: str) -> float:
    """P(|mu + Z| > t) by scipy.stats (continuous laws) or by enumeration (Rademacher)."""
    if noise == "rademacher":
        return 0.5 * (abs(mu + sigma) > t) + 0.5 * (abs(mu - sigma) > t)
    law = frozen_noise(noise, sigma)
    return float(law.sf(t - mu) + law.cdf(-t - mu))


# ----------------------------------------------------------------------------- conventions
@pytest.mark.parametrize("noise", ["gaussian", "uniform", "laplace"])
def test_every_noise_law_has_variance_sigma_squared(noise):
    assert frozen_noise(noise, 1.7).var() == pytest.approx(1.7**2, rel=1e-12)


@pytest.mark.parametrize("noise", SUBGAUSSIAN_NOISE_LAWS)
def test_subgaussian_laws_satisfy_the_mgf_bound_with_proxy_sigma_squared(noise):
    lam = np.linspace(-6, 6, 241)
    sigma = 0.8
    if noise == "gaussian":
        log_mgf = lam**2 * sigma**2 / 2
    elif noise == "uniform":  # E e^{lam Z} = sinh(a lam)/(a lam), a = sqrt(3) sigma
        x = SQRT3 * sigma * lam
        log_mgf = np.log(np.where(x == 0, 1.0, np.sinh(x) / np.where(x == 0, 1.0, x)))
    else:
        log_mgf = np.log(np.cosh(sigma * lam))
    assert np.all(log_mgf <= lam**2 * sigma**2 / 2 + 1e-12)


def test_laplace_has_no_variance_proxy_sigma_squared():
    # E e^{lam Z} = 1 / (1 - lam^2 b^2) with b = sigma / sqrt(2) blows up at lam = 1/b
    sigma = 1.0
    b = sigma / math.sqrt(2)
    lam = 0.99 / b
    assert -math.log(1 - (lam * b) ** 2) > lam**2 * sigma**2 / 2


# ----------------------------------------------------------------------------- Theorem 1
def test_theorem1_values_match_the_formulas():
    u = 3.0 - 1.0
    assert theorem1_lower_bound(3.0, 1.0, 1.0) == pytest.approx(1 - 2 * math.exp(-u * u / 2))
    assert theorem1_lower_bound(-3.0, 1.0, 1.0, sharp=True) == pytest.approx(1 - math.exp(-u * u / 2))
    assert theorem1_lower_bound(5.0, 1.0, 2.0, sharp=True) == pytest.approx(1 - math.exp(-16 / 8))
    assert isinstance(theorem1_lower_bound(3.0, 1.0, 1.0), float)


def test_theorem1_broadcasts():
    mu = np.array([[2.0], [3.0], [-4.0]])
    t = np.array([0.0, 0.5, 1.0, 1.5])
    out = theorem1_lower_bound(mu, t, 1.0, sharp=True)
    assert out.shape == (3, 4)
    assert out[2, 3] == pytest.approx(1 - math.exp(-(2.5**2) / 2))


def test_notes_bound_is_negative_exactly_below_sigma_sqrt_2ln2():
    sigma, t = 1.3, 2.0
    edge = sigma * math.sqrt(2 * math.log(2))
    assert theorem1_lower_bound(t + 0.999 * edge, t, sigma) < 0 < theorem1_lower_bound(t + 1.001 * edge, t, sigma)
    assert theorem1_lower_bound(t + edge, t, sigma) == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(mu=means, t=thresholds, sigma=scales, noise=st.sampled_from(SUBGAUSSIAN_NOISE_LAWS))
def test_theorem1_bounds_hold_for_every_subgaussian_law(mu, t, sigma, noise):
    assume(abs(mu) > t + 1e-9)
    exact = exceedance_probability(mu, t, sigma, noise=noise)
    sharp = theorem1_lower_bound(mu, t, sigma, sharp=True)
    notes = theorem1_lower_bound(mu, t, sigma)
    assert notes <= sharp <= exact + 1e-12


def test_theorem1_fails_for_laplace_noise():
    # u = 4 sigma: Laplace P(Z <= -u) = exp(-4 sqrt 2)/2 = 1.7e-3 > exp(-8) = 3.4e-4
    mu, t, sigma = 6.0, 2.0, 1.0
    assert exceedance_probability(mu, t, sigma, noise="laplace") < theorem1_lower_bound(mu, t, sigma, sharp=True)


def test_theorem1_exponent_is_sharp_for_gaussian_noise():
    # -log P(|X| <= t) / (u^2 / 2 sigma^2) -> 1 as u grows: the one-sided bound has the right exponent
    u = np.array([5.0, 10.0, 20.0, 30.0])
    ratio = -np.log(exceedance_probability_gaussian(2.0 + u, 2.0, 1.0, complement=True)) / (u**2 / 2)
    assert np.all(np.diff(ratio) < 0) and 1.0 < ratio[-1] < 1.01


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mu=1.0, t=1.0, sigma=1.0), r"needs \|mu\| > t"),
        (dict(mu=[3.0, 0.5], t=1.0, sigma=1.0), r"1 of 2 entries"),
        (dict(mu=3.0, t=1.0, sigma=0.0), "sigma must be > 0"),
        (dict(mu=3.0, t=1.0, sigma=-1.0), "sigma must be > 0"),
        (dict(mu=3.0, t=-1.0, sigma=1.0), "t must be >= 0"),
        (dict(mu=float("nan"), t=1.0, sigma=1.0), "mu contains 1 NaN or infinite"),
        (dict(mu=3.0, t=float("inf"), sigma=1.0), "t contains 1 NaN or infinite"),
        (dict(mu=[3.0, 4.0], t=[1.0, 2.0, 0.5], sigma=1.0), "incompatible shapes"),
        (dict(mu=[[3.0, 4.0], [5.0]], t=1.0, sigma=1.0), "could not be read as an array"),
    ],
)
def test_theorem1_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        theorem1_lower_bound(**kwargs)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("3", 1.0, 1.0), {}, "mu must be a real number"),
        ((3.0, 1.0, True), {}, "sigma must be a real number"),
        ((3.0, 1.0, 1.0 + 1j), {}, "sigma must be a real number"),
        ((3.0, 1.0, 1.0), dict(sharp="yes"), "sharp must be True or False"),
    ],
)
def test_theorem1_rejects_bad_types(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        theorem1_lower_bound(*args, **kwargs)


# ----------------------------------------------------------------------------- exact values
@settings(max_examples=200, deadline=None)
@given(mu=means, t=thresholds, sigma=scales, noise=st.sampled_from(NOISE_LAWS))
def test_exceedance_probability_matches_scipy(mu, t, sigma, noise):
    if noise == "rademacher":  # avoid ties |mu +- sigma| == t where float rounding decides
        assume(min(abs(abs(mu + sigma) - t), abs(abs(mu - sigma) - t)) > 1e-9)
    assert exceedance_probability(mu, t, sigma, noise=noise) == pytest.approx(
        reference_probability(mu, t, sigma, noise), abs=1e-12
    )


def test_gaussian_function_is_the_gaussian_law_and_complement_adds_to_one():
    mu = np.linspace(-5, 5, 41)[:, None]
    t = np.linspace(0, 4, 17)[None, :]
    p = exceedance_probability_gaussian(mu, t, 0.7)
    q = exceedance_probability_gaussian(mu, t, 0.7, complement=True)
    assert np.allclose(p, exceedance_probability(mu, t, 0.7, noise="gaussian"), atol=1e-15)
    assert np.allclose(p + q, 1.0, atol=1e-14)


def test_gaussian_complement_keeps_relative_accuracy_deep_in_the_tail():
    q = exceedance_probability_gaussian(-12.0, 2.0, 1.0, complement=True)
    reference = stats.norm.sf(10.0) - stats.norm.sf(14.0)
    assert q == pytest.approx(reference, rel=1e-10) and q < 1e-22


@settings(max_examples=100, deadline=None)
@given(mu=means, t=thresholds, sigma=scales, dmu=st.floats(0.01, 2.0), dt=st.floats(0.01, 2.0))
def test_gaussian_probability_increases_with_abs_mu_and_decreases_with_t(mu, t, sigma, dmu, dt):
    p = exceedance_probability_gaussian(abs(mu), t, sigma)
    assert exceedance_probability_gaussian(abs(mu) + dmu, t, sigma) >= p - 1e-15
    assert exceedance_probability_gaussian(-abs(mu), t, sigma) == pytest.approx(p, abs=1e-15)
    assert exceedance_probability_gaussian(mu, t + dt, sigma) <= exceedance_probability_gaussian(mu, t, sigma) + 1e-15


def test_expected_count_is_n_times_p_and_broadcasts_over_n():
    N = np.array([10, 1000, 10**6])
    out = expected_count_gaussian(N, 0.5, 2.0, 1.0)
    assert out.shape == (3,)
    assert np.allclose(out, N * (stats.norm.sf(1.5) + stats.norm.cdf(-2.5)), rtol=1e-12)
    assert expected_count_gaussian(10**6, 0.0, 3.0, 1.0) == pytest.approx(2e6 * stats.norm.sf(3.0))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: exceedance_probability(0.0, 1.0, 1.0, noise="cauchy"), ValueError, "noise must be one of"),
        (lambda: exceedance_probability(0.0, 1.0, 1.0, noise=3), TypeError, "noise must be a string"),
        (lambda: exceedance_probability(0.0, -1.0, 1.0), ValueError, "t must be >= 0"),
        (lambda: exceedance_probability_gaussian(0.0, 1.0, -2.0), ValueError, "sigma must be > 0"),
        (lambda: exceedance_probability_gaussian(0.0, 1.0, 1.0, complement=1), TypeError, "complement"),
        (lambda: expected_count_gaussian(1e6, 0.0, 1.0, 1.0), TypeError, "write e.g. 10\\*\\*6"),
        (lambda: expected_count_gaussian(0, 0.0, 1.0, 1.0), ValueError, "N must be >= 1"),
        (lambda: expected_count_gaussian(True, 0.0, 1.0, 1.0), TypeError, "N must be a positive integer"),
        (lambda: expected_count_gaussian([1, 2], 0.0, [1.0, 2.0, 3.0], 1.0), ValueError, "incompatible"),
    ],
)
def test_exact_values_reject_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------- Theorem 2
@settings(max_examples=300, deadline=None)
@given(
    N=st.integers(1, 10**9),
    mu=means,
    t=thresholds,
    sigma=scales,
    noise=st.sampled_from(SUBGAUSSIAN_NOISE_LAWS),
)
def test_theorem2_bounds_bracket_the_exact_expectation(N, mu, t, sigma, noise):
    b = theorem2_bounds(N, mu, t, sigma)
    exact = N * exceedance_probability(mu, t, sigma, noise=noise)
    assert b.lower <= exact * (1 + 1e-12) + 1e-9
    assert exact <= b.upper * (1 + 1e-12) + 1e-9
    if not math.isnan(b.notes_lower):
        assert b.notes_lower <= b.lower + 1e-9
    if not math.isnan(b.notes_upper):
        assert b.notes_upper >= b.upper - 1e-9


def test_theorem2_regimes_and_the_notes_bounds():
    b = theorem2_bounds(1000, np.array([0.0, 1.0, 2.0, 3.0, -3.0]), 2.0, 1.0)
    assert list(b.regime) == ["pure-variance", "intermediate", "intermediate", "mean-dominated", "mean-dominated"]
    assert b.notes_upper[0] == pytest.approx(2000 * math.exp(-2))
    assert np.isnan(b.notes_upper[1:]).all() and np.isnan(b.notes_lower[:3]).all()
    assert b.notes_lower[3] == pytest.approx(1000 * theorem1_lower_bound(3.0, 2.0, 1.0))
    assert b.lower[3] == pytest.approx(1000 * theorem1_lower_bound(3.0, 2.0, 1.0, sharp=True))
    assert np.all(b.lower[:3] == 0.0) and b.upper[3] == 1000.0
    # intermediate upper bound: the two Chernoff tails
    assert b.upper[1] == pytest.approx(1000 * (math.exp(-0.5) + math.exp(-4.5)))


def test_theorem2_bounds_are_linear_in_n():
    one = theorem2_bounds(1000, [0.0, 1.0, 3.0], 2.0, 1.0)
    two = theorem2_bounds(2000, [0.0, 1.0, 3.0], 2.0, 1.0)
    for a, b in zip(one[:4], two[:4]):
        assert np.allclose(2 * np.asarray(a), np.asarray(b), equal_nan=True)


def test_theorem2_lower_bound_zero_is_attained_by_rademacher_noise():
    # intermediate regime with sigma < t - |mu|: |mu +- sigma| <= t, no row ever exceeds t
    assert exceedance_probability(0.5, 2.0, 1.0, noise="rademacher") == 0.0
    assert theorem2_bounds(100, 0.5, 2.0, 1.0).lower == 0.0


def test_theorem2_upper_bound_fails_for_laplace_noise():
    b = theorem2_bounds(10**6, 0.0, 4.0, 1.0)
    assert 10**6 * exceedance_probability(0.0, 4.0, 1.0, noise="laplace") > 5 * b.upper


# ----------------------------------------------------------------------------- thresholds
def test_bound_based_margins():
    s = 1.7
    two = half_exceedance_margin(3.0, s, "two-sided")
    one = half_exceedance_margin(3.0, s, "one-sided")
    assert 1 - 2 * math.exp(-(two**2) / (2 * s * s)) == pytest.approx(0.5)
    assert 1 - math.exp(-(one**2) / (2 * s * s)) == pytest.approx(0.5)
    assert theorem1_lower_bound(3.0 + one, 3.0, s) == pytest.approx(0.0, abs=1e-12)


def test_gaussian_margin_is_where_the_exact_probability_is_one_half():
    t = np.array([0.7, 1.0, 2.0, 3.0, 4.0])
    m = half_exceedance_margin(t, 1.0)
    assert np.all((m < 0) & (m > -t))
    assert np.allclose(exceedance_probability_gaussian(t + m, t, 1.0), 0.5, atol=1e-12)
    assert np.all(np.diff(m) > 0)  # closer to 0 as t / sigma grows


def test_gaussian_margin_below_the_quartile_threshold_is_minus_t():
    t_star = stats.norm.ppf(0.75)
    t = np.array([0.0, 0.3, 0.99 * t_star])
    assert np.array_equal(half_exceedance_margin(t, 1.0), -t)
    assert half_exceedance_margin(1.01 * t_star, 1.0) > -1.01 * t_star


def test_a_uniform_guarantee_needs_a_margin_of_at_least_sigma():
    # Rademacher noise (1-sub-Gaussian): for margins u < sigma the probability is exactly 1/2
    for u in [0.2, 0.6, 0.99]:
        assert exceedance_probability(2.0 + u, 2.0, 1.0, noise="rademacher") == 0.5
    assert exceedance_probability(3.01, 2.0, 1.0, noise="rademacher") == 1.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(t=1.0, sigma=1.0, kind="exact"), ValueError, "kind must be one of"),
        (dict(t=1.0, sigma=1.0, kind=None), TypeError, "kind must be a string"),
        (dict(t=-1.0, sigma=1.0), ValueError, "t must be >= 0"),
        (dict(t=1.0, sigma=0.0), ValueError, "sigma must be > 0"),
    ],
)
def test_margin_rejects_bad_inputs(kwargs, error, match):
    with pytest.raises(error, match=match):
        half_exceedance_margin(**kwargs)


# ----------------------------------------------------------------------------- intervals
@settings(max_examples=150, deadline=None)
@given(N=st.integers(1, 10**7), p=st.floats(0.0, 1.0), delta=st.floats(1e-6, 0.5))
def test_intervals_are_nested_and_have_the_stated_tail_mass(N, p, delta):
    h_lo, h_hi = count_interval(N, p, delta, "hoeffding")
    c_lo, c_hi = count_interval(N, p, delta, "chernoff")
    e_lo, e_hi = count_interval(N, p, delta, "exact")
    tol = 1e-6 * N + 1e-6
    assert h_lo - tol <= c_lo <= N * p + tol and N * p - tol <= c_hi <= h_hi + tol  # Pinsker
    assert math.floor(c_lo + tol) <= e_lo + tol and e_hi <= math.ceil(c_hi - tol) + tol
    assert stats.binom.cdf(math.ceil(c_lo - tol) - 1, N, p) <= delta / 2 * (1 + 1e-6)
    assert stats.binom.sf(math.floor(c_hi + tol), N, p) <= delta / 2 * (1 + 1e-6)


def test_chernoff_interval_solves_the_kl_equation():
    N, p, delta = 10**5, 0.01, 0.01
    lo, hi = count_interval(N, p, delta)
    kl = lambda q: q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))  # noqa: E731
    assert N * kl(lo / N) == pytest.approx(math.log(2 / delta), rel=1e-9)
    assert N * kl(hi / N) == pytest.approx(math.log(2 / delta), rel=1e-9)


def test_degenerate_probabilities_give_degenerate_intervals():
    for method in ("chernoff", "exact"):
        assert count_interval(50, 0.0, 0.1, method) == (0.0, 0.0)
        assert count_interval(50, 1.0, 0.1, method) == (50.0, 50.0)


def test_hoeffding_is_vacuous_for_rare_events_where_chernoff_is_not():
    lo_h, _ = count_interval(10**6, 1e-4, 0.05, "hoeffding")
    lo_c, hi_c = count_interval(10**6, 1e-4, 0.05, "chernoff")
    assert lo_h < 0 < lo_c and hi_c < 130


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(N=10, p=1.5), ValueError, r"p must be a probability in \[0, 1\]"),
        (dict(N=10, p=-0.1), ValueError, "p must be a probability"),
        (dict(N=10, p=0.5, delta=0.0), ValueError, "delta must lie strictly between 0 and 1"),
        (dict(N=10, p=0.5, delta=1.0), ValueError, "delta must lie strictly"),
        (dict(N=10, p=0.5, delta="0.1"), TypeError, "delta must be a real number"),
        (dict(N=10, p=0.5, method="bernstein"), ValueError, "method must be one of"),
        (dict(N=10, p=0.5, method=1), TypeError, "method must be a string"),
        (dict(N=10.0, p=0.5), TypeError, "N must be a positive integer"),
        (dict(N=[10, 20], p=[0.1, 0.2, 0.3]), ValueError, "incompatible shapes"),
    ],
)
def test_count_interval_rejects_bad_inputs(kwargs, error, match):
    with pytest.raises(error, match=match):
        count_interval(**kwargs)


# ----------------------------------------------------------------------------- simulation
@pytest.mark.parametrize("noise", NOISE_LAWS)
def test_simulated_counts_lie_in_their_exact_binomial_intervals(noise):
    mu = np.array([0.0, 0.4, 1.1, 1.9, 2.6, -3.2, 4.5])
    t = np.array([0.25, 1.0, 2.0, 3.0, 4.0])
    N = 400_003  # not a multiple of the chunk size
    counts = simulate_counts(N, mu, t, 0.93, noise=noise, rng=11)
    p = exceedance_probability(mu[:, None], t[None, :], 0.93, noise=noise)
    lo, hi = count_interval(N, p, delta=1e-6, method="exact")
    assert counts.shape == (7, 5) and counts.dtype == np.int64
    assert np.all((lo <= counts) & (counts <= hi)), np.argwhere((counts < lo) | (counts > hi))


@pytest.mark.parametrize("noise", NOISE_LAWS)
def test_many_small_channels_match_their_exact_probabilities(noise):
    # N = 37 rows per channel: the channel-blocked code path; pool 3000 channels per mean
    mu = np.array([0.0, 0.8, 2.1, -1.5])
    t = np.array([0.5, 1.5, 2.5])
    counts = simulate_counts(37, np.repeat(mu, 3000), t, 1.1, noise=noise, rng=12)
    pooled = counts.reshape(4, 3000, 3).sum(axis=1)
    p = exceedance_probability(mu[:, None], t[None, :], 1.1, noise=noise)
    lo, hi = count_interval(37 * 3000, p, delta=1e-6, method="exact")
    assert np.all((lo <= pooled) & (pooled <= hi))
    assert np.all(counts <= 37)


@pytest.mark.parametrize("noise", NOISE_LAWS)
def test_every_draw_is_counted_exactly_once(noise):
    mu = 40.0 if noise == "laplace" else 10.0  # P(|X| <= 0) is 0 or below 1e-20
    N = [1, 63, 64, 65, 65_536, 65_537, 1_000_003]
    out = simulate_counts(N, mu, 0.0, 1.0, noise=noise, rng=13)
    assert out.tolist() == N
    assert simulate_counts(N, -mu, 0.0, 1.0, noise=noise, rng=13).tolist() == N
    assert simulate_counts(5, [mu, -mu, mu], 0.0, 1.0, noise=noise, rng=13).tolist() == [5, 5, 5]


@pytest.mark.parametrize("noise", ["gaussian", "uniform"])
def test_checkpoints_and_chunk_size_do_not_change_a_single_stream(noise):
    t = np.array([0.5, 1.5, 2.5])
    whole = simulate_counts(300_000, 0.3, t, 1.0, noise=noise, rng=14)
    parts = simulate_counts([1_000, 70_000, 300_000], 0.3, t, 1.0, noise=noise, rng=14)
    small_chunks = simulate_counts(300_000, 0.3, t, 1.0, noise=noise, rng=14, chunk_size=4_097)
    assert np.array_equal(parts[-1], whole) and np.array_equal(small_chunks, whole)
    assert np.all(np.diff(parts, axis=0) >= 0)


def test_sorted_and_compared_counting_agree_draw_for_draw():
    t = np.linspace(0.0, 4.0, 40)  # 80 comparisons per draw: the sort path
    by_sort = simulate_counts(200_000, 0.7, t, 1.0, rng=15)
    by_compare = np.concatenate([simulate_counts(200_000, 0.7, t[i : i + 8], 1.0, rng=15) for i in range(0, 40, 8)])
    assert np.array_equal(by_sort, by_compare)
    assert np.all(np.diff(by_sort) <= 0)  # non-increasing in t


def test_shapes_scalars_and_determinism():
    assert isinstance(simulate_counts(100, 0.0, 1.0, 1.0, rng=0), int)
    out = simulate_counts([10, 20, 30], np.zeros((2, 3)), [1.0, 2.0, 3.0, 4.0], [[1.0], [2.0]], rng=1)
    assert out.shape == (3, 2, 3, 4)
    assert simulate_counts(1000, [0.0, 1.0], 1.0, 1.0, rng=2).shape == (2,)
    a = simulate_counts(10_000, [0.0, 2.0], [0.5, 1.0], 1.0, noise="laplace", rng=np.random.default_rng(3))
    b = simulate_counts(10_000, [0.0, 2.0], [0.5, 1.0], 1.0, noise="laplace", rng=3)
    assert np.array_equal(a, b)


def test_dependent_rows_keep_the_mean_but_lose_concentration():
    N, R, mu, t = 1_000, 4_000, 1.0, 2.0
    p = exceedance_probability_gaussian(mu, t, 1.0)
    dependent = simulate_counts(N, np.full(R, mu), t, 1.0, rho=0.5, rng=16)
    independent = simulate_counts(N, np.full(R, mu), t, 1.0, rng=16)
    # same expectation (linearity needs no independence) ...
    assert abs(dependent.mean() - N * p) < 5 * dependent.std() / math.sqrt(R)
    assert abs(independent.mean() - N * p) < 5 * math.sqrt(N * p * (1 - p) / R)
    # ... but a spread that does not shrink like sqrt(N): far outside the binomial interval
    lo, hi = count_interval(N, p, delta=0.01, method="exact")
    assert np.mean((independent < lo) | (independent > hi)) < 0.02
    assert np.mean((dependent < lo) | (dependent > hi)) > 0.5
    assert dependent.var() > 30 * N * p * (1 - p)


def test_memory_stays_bounded_for_large_n():
    tracemalloc.start()
    simulate_counts(5 * 10**6, 0.5, 2.0, 1.0, rng=17)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2e6  # bytes: the 256 KiB float32 chunk and its mask, not 5e6 draws


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(N=1e5), TypeError, "N must be a positive integer"),
        (dict(N=0), ValueError, "N must be >= 1"),
        (dict(N=[10, 5]), ValueError, "strictly increasing"),
        (dict(N=[[10, 20]]), ValueError, "1-D increasing sequence"),
        (dict(N=np.array([], dtype=int)), ValueError, "empty sequence"),
        (dict(noise="student"), ValueError, "noise must be one of"),
        (dict(rng="seed"), TypeError, "rng must be None"),
        (dict(rng=np.random.RandomState(0)), TypeError, "legacy RandomState"),
        (dict(rng=-3), ValueError, "seed must be >= 0"),
        (dict(rho=1.0), ValueError, "0 <= rho < 1"),
        (dict(rho="0.5"), TypeError, "rho must be a real number"),
        (dict(rho=0.3, noise="uniform"), ValueError, "only defined for Gaussian"),
        (dict(chunk_size=0), ValueError, "chunk_size must be >= 1"),
        (dict(chunk_size=1e4), TypeError, "chunk_size must be an integer"),
        (dict(mu=[0.0, 1.0], sigma=[1.0, 1.0, 1.0]), ValueError, "incompatible shapes"),
        (dict(sigma=-1.0), ValueError, "sigma must be > 0"),
        (dict(t=-0.5), ValueError, "t must be >= 0"),
        (dict(mu=float("nan")), ValueError, "mu contains 1 NaN or infinite"),
    ],
)
def test_simulate_counts_rejects_bad_inputs(kwargs, error, match):
    args = dict(N=100, mu=0.0, t=1.0, sigma=1.0, rng=0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        simulate_counts(**args)


def test_docstring_examples_run():
    result = doctest.testmod(ex, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 15 and result.failed == 0
