"""Issue 30, item 2: count intervals and the package's own laws and bounds at extreme arguments.

Every call either returns a value checked against an independent computation (mpmath at 60 digits,
or a simulation) or raises a ValueError that names the limit; none may hang (each interval call
runs under a time bound).
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.theory import exceedance as ex
from forked import within
from companion.theory import concentration as cc
from companion.theory import normalisation as nm

FEW = settings(max_examples=60, deadline=None)
N_MAX = 2**63 - 1
SECONDS = 10.0  # a call of count_interval takes milliseconds; the old "exact" never returned


def kl(q, p):
    """kl(q || p) of two Bernoulli laws in mpmath (60 digits)."""
    q, p = mpmath.mpf(q), mpmath.mpf(p)
    left = q * mpmath.log(q / p) if q > 0 else mpmath.mpf(0)
    right = (1 - q) * mpmath.log((1 - q) / (1 - p)) if q < 1 else mpmath.mpf(0)
    return left + right


def kl_root(N, p, delta, upper):
    """The q on the side ``upper`` of p with N kl(q || p) = ln(2/delta), by 400 bisection steps in mpmath."""
    with mpmath.workdps(60):
        level = mpmath.log(2 / mpmath.mpf(delta)) / N
        near, far = mpmath.mpf(p), mpmath.mpf(1 if upper else 0)
        if kl(far, p) <= level:
            return far
        for _ in range(400):
            mid = (near + far) / 2
            near, far = (near, mid) if kl(mid, p) > level else (mid, far)
        return far


@pytest.mark.parametrize(
    "N, p",
    [(N_MAX, 1e-17), (N_MAX, 1e-15), (N_MAX, 0.3), (N_MAX, 1e-300), (N_MAX, 5e-324), (10**16, 1e-12),
     (10, 5e-324), (10**6, 1e-3), (N_MAX, 1 - 1e-15)],
)
def test_chernoff_interval_matches_a_60_digit_solution(N, p):
    # N = 2**63 - 1, p = 1e-17: the upper end was 95.9 (the root is 119.5), breaking the 1 - delta
    # guarantee; p = 0.3: an interval 1e3 wide instead of 7.6e9 (1 - q rounded to 1 - p)
    lo, hi = within(SECONDS, ex.count_interval, N, p, 0.05, "chernoff")
    with mpmath.workdps(60):
        q_lo, q_hi = kl_root(N, p, 0.05, False), kl_root(N, p, 0.05, True)
        want_lo, want_hi = float(N * q_lo), float(N * q_hi)
    scale = N * 2.0**-52 * max(p, 1e-300) * 8 + 1e-300  # the float resolution of N q near N p
    assert hi >= want_hi * (1 - 1e-12) - scale and lo <= want_lo * (1 + 1e-12) + scale   # valid
    assert hi == pytest.approx(want_hi, rel=1e-9, abs=scale)                             # and tight
    assert lo == pytest.approx(want_lo, rel=1e-9, abs=scale)


@FEW
@given(e=st.floats(0.0, 63.0), p=st.one_of(st.floats(0.0, 1.0), st.floats(5e-324, 1e-12), st.floats(0.999, 1.0)),
       delta=st.floats(1e-12, 0.9))
def test_property_chernoff_ends_keep_their_guarantee_for_any_n(e, p, delta):
    N = min(int(2.0**e), N_MAX)
    lo, hi = within(SECONDS, ex.count_interval, N, p, delta, "chernoff")
    assert 0.0 <= lo <= N * p * (1 + 1e-15) and N * p * (1 - 1e-15) <= hi <= N
    with mpmath.workdps(60):
        level = mpmath.log(2 / mpmath.mpf(delta)) / N
        # each end is at or beyond the root of N kl(q || p) = ln(2/delta), so P(C > hi) <= delta/2,
        # up to the rounding of the product N q (one ulp of the end, taken outward here)
        if 0 < p and hi < N:
            assert kl(mpmath.mpf(np.nextafter(hi, math.inf)) / N, p) >= level * (1 - 1e-9)
        if p < 1 and lo > 0:
            assert kl(mpmath.mpf(np.nextafter(lo, -math.inf)) / N, p) >= level * (1 - 1e-9)


@pytest.mark.parametrize("N, p", [(N_MAX, 0.3), (N_MAX, 1e-15), (2**53, 0.5), (9007199254740948, 0.42),
                                  (10**20, 0.3)])
def test_exact_method_is_refused_beyond_its_limit_without_hanging(N, p):
    # (2**63-1, 0.3) never returned; (2**53, 0.5) and (9007199254740948, 0.42) gave (nan, nan);
    # (2**63-1, 1e-15) returned numbers from quantiles that are NaN a few p further
    with pytest.raises(ValueError, match=r"2\*\*50.*method='chernoff'"):
        within(SECONDS, ex.count_interval, N, p, 0.05, "exact")
    lo, hi = within(SECONDS, ex.count_interval, N, p, 0.05, "chernoff")
    assert lo <= N * p <= hi


@FEW
@given(e=st.floats(0.0, 50.0), p=st.one_of(st.floats(0.0, 1.0), st.floats(5e-324, 1e-12), st.floats(0.999, 1.0)),
       delta=st.floats(1e-9, 0.9))
def test_property_exact_interval_is_finite_fast_and_inside_chernoff(e, p, delta):
    N = int(2.0**e)
    lo, hi = within(SECONDS, ex.count_interval, N, p, delta, "exact")
    c_lo, c_hi = ex.count_interval(N, p, delta, "chernoff")
    assert math.isfinite(lo) and math.isfinite(hi)
    assert math.floor(c_lo * (1 - 1e-12)) - 1 <= lo <= hi <= math.ceil(c_hi * (1 + 1e-12)) + 1


@pytest.mark.parametrize("method", ["chernoff", "exact", "hoeffding"])
@pytest.mark.parametrize("N, p", [(40, 0.02), (1000, 0.3), (5000, 1e-3)])
def test_intervals_cover_at_their_nominal_rate_in_a_simulation(method, N, p):
    delta, reps = 0.1, 40_000
    counts = np.random.default_rng(30).binomial(N, p, size=reps)
    lo, hi = ex.count_interval(N, p, delta, method)
    miss = np.mean((counts < lo) | (counts > hi))
    assert miss <= delta + 4 * math.sqrt(delta * (1 - delta) / reps)


def test_expected_counts_and_bounds_beyond_int64_stay_exact():
    # N = 10**40 and a probability below 1e-300: the product stays a float (no overflow, no 0)
    p = ex.exceedance_probability_gaussian(0.0, 37.0, 1.0)
    assert 0 < p < 1e-298
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ex.expected_count_gaussian(10**40, 0.0, 37.0, 1.0) == pytest.approx(1e40 * p, rel=1e-14)
        lo, hi = ex.count_interval(10**40, 1e-30, 0.01)
    assert lo < 1e10 < hi


# ------------------------------------------------------------------ normalisation at the float range
@pytest.mark.parametrize("x", [[1e200, -1e200, 0.0], [1e-200, -1e-200, 0.0], [1.7e308, 1.7e308, -1.7e308],
                               [1e160, -1e160, 3e159]])
def test_normalisation_of_rows_beyond_the_square_range(x):
    # [1e200, -1e200, 0] gave [0, -0, 0] (y * y overflowed, with only a RuntimeWarning);
    # [1e-200, -1e-200, 0] raised "input is constant (zero variance)"
    x = np.array(x)
    unit = x / np.max(np.abs(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nm.layernorm(x, eps=0.0) == pytest.approx(nm.layernorm(unit, eps=0.0), rel=1e-14)
        assert nm.rmsnorm(x, eps=0.0) == pytest.approx(nm.rmsnorm(unit, eps=0.0), rel=1e-14)
        c = float(np.max(np.abs(x)))
        for f in (nm.layernorm_jacobian, nm.rmsnorm_jacobian):
            assert f(x) * c == pytest.approx(f(unit), rel=1e-12, abs=1e-12)
        lo, hi = nm.gain_jacobian_norm_bounds(x, [2.0, 1.0, 0.5], "rmsnorm")
        lo1, hi1 = nm.gain_jacobian_norm_bounds(unit, [2.0, 1.0, 0.5], "rmsnorm")
        assert (lo * c, hi * c) == pytest.approx((lo1, hi1), rel=1e-14)
    with pytest.raises(ValueError, match="layernorm_jacobian"):   # PyTorch's own gave 0 or NaN
        nm.autograd_jacobian(x)


def test_normalisation_of_tiny_rows_with_eps_is_unchanged():
    x = np.array([1e-200, -1e-200, 0.0])
    assert nm.layernorm(x, eps=1e-5) == pytest.approx(x / math.sqrt(1e-5), rel=1e-14)
    assert np.allclose(nm.autograd_jacobian(x, eps=1e-5), nm.layernorm_jacobian(x, eps=1e-5))


@FEW
@given(row=st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=6), k=st.integers(-300, 300))
def test_property_normalisation_is_scale_invariant_over_the_float_range(row, k):
    x = np.array(row)
    assume_ok = np.ptp(x) > 1e-3
    if not assume_ok:
        return
    c = 10.0**k
    out, ref = nm.layernorm(x * c, eps=0.0), nm.layernorm(x, eps=0.0)
    assert out == pytest.approx(ref, rel=1e-9, abs=1e-9)
    assert nm.rmsnorm(x * c, eps=0.0) == pytest.approx(nm.rmsnorm(x, eps=0.0), rel=1e-9, abs=1e-9)


# ------------------------------------------------------------------ the law of q . k at large d_k
def dot_pdf_reference(d, x):
    """Density of q . k at x (unscaled) in mpmath: |x|^nu K_nu(|x|) / (sqrt(pi) 2^nu Gamma(d/2))."""
    with mpmath.workdps(40):
        nu, x = mpmath.mpf(d - 1) / 2, mpmath.mpf(x)
        return float(x**nu * mpmath.besselk(nu, x) / (mpmath.sqrt(mpmath.pi) * 2**nu * mpmath.gamma(mpmath.mpf(d) / 2)))


@pytest.mark.parametrize("d, x", [(201, 0.01), (1000, 0.5), (1000, 6.0), (4001, 1.0), (4001, 0.01)])
def test_dot_product_density_at_large_dimension_matches_mpmath(d, x):
    # d = 1000, x = 0.5 (scaled): the density was inf (K_nu overflowed in kve)
    unscaled = x * math.sqrt(d)
    assert cc.dot_product_law(d).pdf(unscaled) == pytest.approx(dot_pdf_reference(d, unscaled), rel=1e-10)


@FEW
@given(d=st.integers(1000, 10**6), x=st.floats(0.0, 6.0))
def test_property_scaled_dot_product_density_is_close_to_the_normal_one(d, x):
    # the scaled logit has excess kurtosis 6/d: its density is within a few / d of phi
    f = float(cc.dot_product_law(d, scaled=True).pdf(x))
    phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    assert math.isfinite(f) and abs(f - phi) <= 2.0 / d


# ------------------------------------------------------------------ maxima and counts beyond int64
def gauss_max_reference(N):
    """E max_{i<=N} |G_i| in mpmath, with enough digits for (1 - erfc)^N."""
    with mpmath.workdps(int(math.log10(N)) + 40):
        f = lambda x: -mpmath.expm1(N * mpmath.log1p(-mpmath.erfc(x / mpmath.sqrt(2))))  # noqa: E731
        c = mpmath.sqrt(2 * mpmath.log(2 * mpmath.mpf(N)))
        return float(mpmath.quad(f, [0, c - 2, c, c + 1, c + 40]))


@pytest.mark.parametrize("N", [10**20, 10**25])
def test_maxima_of_more_than_int64_variables(N):
    # they raised "a simulation cannot draw that many rows" for exact formulas
    assert cc.gaussian_max_expectation(N) == pytest.approx(gauss_max_reference(N), abs=1e-10)
    assert cc.maximal_bound(N) == pytest.approx(math.sqrt(2 * math.log(2 * N)), rel=1e-15)
    t = math.sqrt(2 * math.log(N) - math.log(4 * math.pi * math.log(N)))
    assert cc.gaussian_max_lower_bound(N) == pytest.approx((1 - math.exp(-1)) * t, rel=1e-14)


def test_maximal_bound_with_a_huge_proxy_is_finite():
    # 2 sigma2 ln(2N) overflowed: the bound was inf instead of 2.45e154
    assert cc.maximal_bound(10, sigma2=1e308) == pytest.approx(1e154 * math.sqrt(2 * math.log(20)), rel=1e-15)


@pytest.mark.parametrize("call", [lambda: ex.expected_count_gaussian(10**400, 0.0, 1.0, 1.0),
                                  lambda: ex.count_interval(10**400, 0.3), lambda: ex.theorem2_bounds(10**400, 0, 1, 1),
                                  lambda: cc.maximal_bound(10**400)], ids=["expected", "interval", "theorem2", "max"])
def test_counts_beyond_the_float_range_are_refused(call):
    # raw OverflowError ("int too large to convert to float")
    with pytest.raises(ValueError, match="float64 range"):
        call()
