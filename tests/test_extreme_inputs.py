"""Degenerate and extreme-but-valid inputs: a correct result or a clear ValueError, never a
silently wrong number.

Each explicit case below is the falsifying input of a bug (the value the code returned before
the fix is given in a comment); the Hypothesis tests reach the same corners systematically:
probabilities within 1e-12 of 0 and 1, magnitudes near the ends of the float64 range, counts
beyond int64, float16 values near 65504 and vectors that overflow only after a cast.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import special, stats

from companion.theory import exceedance as ex
from companion.theory import subgaussian

LN2 = math.log(2.0)
F64_MAX = float(np.finfo(np.float64).max)
FEW = settings(max_examples=40, deadline=None)
MANY = settings(max_examples=200, deadline=None)

# --------------------------------------------------------------------------- strategies
#: Probabilities within 1e-12 of 0 or of 1 (down to the smallest subnormal), and ordinary ones.
tiny_p = st.floats(min_value=5e-324, max_value=1e-12)
near_one_p = st.floats(min_value=1.0 - 1e-12, max_value=1.0, exclude_max=True)
extreme_p = st.one_of(tiny_p, near_one_p, st.floats(1e-6, 1.0 - 1e-6))
#: Exact powers of two that rescale a problem across the whole float64 range.
log2_scales = st.integers(-1000, 1000)
#: Every finite double, the extremes included.
any_float = st.floats(allow_nan=False, allow_infinity=False)


def approx(expected, rel=1e-12, abs=0.0, **kw):
    """pytest.approx without its default absolute tolerance of 1e-12 (the values here are tiny)."""
    return pytest.approx(expected, rel=rel, abs=abs, **kw)


def _law(x, p):
    return stats.rv_discrete(values=(np.asarray(x, dtype=float), np.asarray(p, dtype=float)))()


@pytest.fixture(autouse=True)
def _no_numerical_warnings():
    """A fix that only hides a NaN behind a warning is not a fix: RuntimeWarnings are errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


# =========================================================================== tails
def test_psi2_of_a_point_mass_whose_scipy_variance_is_negative():
    # scipy gives Var = -1.7e-18 for this law: math.sqrt raised "math domain error"
    # (tests/test_tails.py::test_property_psi2_definition, --hypothesis-seed=1)
    law = _law([0.1], [1.0])
    assert subgaussian.psi2_norm(law) == 0.1 / math.sqrt(LN2)
    assert subgaussian.psi2_norm(law, centred=True) == 0.0
    assert subgaussian.optimal_variance_proxy(law, method="numeric") == 0.0
    assert subgaussian.optimal_variance_proxy(law) == 0.0
    assert subgaussian.log_mgf(law, [1.0, -2.0], method="numeric").tolist() == [0.0, 0.0]


def test_point_mass_far_from_zero():
    # scipy's variance is NaN (inf - inf): psi2_norm returned inf, the numeric proxy inf
    law = _law([1e300], [1.0])
    assert subgaussian.psi2_norm(law) == approx(1e300 / math.sqrt(LN2), rel=1e-15)
    assert subgaussian.optimal_variance_proxy(law, method="numeric") == 0.0


@pytest.mark.parametrize("shift", [1e8, 1e15])
def test_finite_law_far_from_zero_keeps_its_variance(shift):
    # scipy computes E X^2 - (E X)^2: at 1e8 it is negative (math domain error), at 1e15 it is
    # 0 and the proxy came out as 0.0 instead of 1.15
    x, p = np.array([0.0, 1.0, 3.0]), np.array([0.2, 0.5, 0.3])
    ref = subgaussian.optimal_variance_proxy(_law(x, p), method="numeric", full_output=True)
    res = subgaussian.optimal_variance_proxy(_law(shift + x, p), method="numeric", full_output=True)
    assert res.variance == approx(ref.variance, rel=1e-12)
    assert res.proxy == approx(ref.proxy, rel=1e-9)


@pytest.mark.parametrize("p", [1e-13, 1e-12, 1.0 - 1e-13, 1.0 - 2**-53, 1e-300, 5e-324])
def test_bernoulli_numeric_proxy_near_zero_and_one(p):
    # the lambda grid started at 1e-4/sd = 316 > lambda* = 60 for p = 1e-13: the numeric proxy
    # was 0.00573 instead of 0.0167 (and raised overflow warnings for p <= 1e-300)
    closed = subgaussian.optimal_variance_proxy(stats.bernoulli(p), full_output=True)
    numeric = subgaussian.optimal_variance_proxy(stats.bernoulli(p), method="numeric", full_output=True)
    assert numeric.proxy == approx(closed.proxy, rel=1e-9)
    assert math.isfinite(closed.argmax) and numeric.argmax == approx(closed.argmax, rel=1e-6)


def test_bernoulli_closed_form_at_the_smallest_subnormal():
    # (1 - 2p)/p overflowed: the proxy was 0 (and argmax inf) instead of 1/(2 ln(1/p))
    p = 5e-324
    expected = 1.0 / (2.0 * -math.log(p))
    assert float(subgaussian.bernoulli_optimal_proxy(p)) == approx(expected, rel=1e-15)


@pytest.mark.parametrize("gap", [1e-6, 1e-8, 1e-10])
def test_bernoulli_closed_form_near_one_is_as_accurate_as_near_zero(gap):
    # symmetric in p <-> 1 - p; near 1 the old form lost digits (6e-11 relative at 1 - 1e-8)
    p = 1.0 - gap
    q = 1.0 - p  # exact
    assert float(subgaussian.bernoulli_optimal_proxy(p)) == approx(
        float(subgaussian.bernoulli_optimal_proxy(q)), rel=2e-16
    )


@settings(max_examples=30, deadline=None)
@given(extreme_p)
def test_property_bernoulli_extreme_p_numeric_equals_closed_form(p):
    law = stats.bernoulli(p)
    closed = subgaussian.optimal_variance_proxy(law, full_output=True)
    numeric = subgaussian.optimal_variance_proxy(law, method="numeric", full_output=True)
    assert numeric.proxy == approx(closed.proxy, rel=1e-8)
    assert closed.proxy >= p * (1.0 - p) * (1.0 - 1e-12)


@FEW
@given(extreme_p)
def test_property_psi2_of_bernoulli_solves_its_definition(p):
    # E exp(X^2/s^2) = 1 - p + p e^{1/s^2} = 2, i.e. 1/s^2 = ln((1 + p)/p), checked in logs
    s = subgaussian.psi2_norm(stats.bernoulli(p))
    assert 1.0 / s**2 == approx(math.log1p(p) - math.log(p), rel=1e-9)


def test_psi2_of_bernoulli_at_the_smallest_subnormal():
    # exp(-2 log s) overflowed in the bracket of the root: OverflowError "math range error"
    s = subgaussian.psi2_norm(stats.bernoulli(5e-324))
    assert 1.0 / s**2 == approx(-math.log(5e-324), rel=1e-9)


@MANY
@given(any_float)
def test_property_point_masses_anywhere(x):
    law = _law([x], [1.0])
    assert subgaussian.psi2_norm(law) == approx(abs(x) / math.sqrt(LN2), rel=1e-15)
    assert subgaussian.psi2_norm(law, centred=True) == 0.0
    assert subgaussian.optimal_variance_proxy(law) == 0.0
    assert subgaussian.optimal_variance_proxy(law, method="numeric") == 0.0


#: Decimal exponents over the whole float64 range, with the edges of the handled range (spread
#: 1e-150 .. 1e150) drawn often.
decades = st.one_of(st.integers(-300, 300), st.integers(-160, -140), st.integers(140, 160))


@FEW
@given(decades, st.sampled_from([(0.0, 1.0, 3.0), (-1.0, 2.0), (-2.0, 0.5, 1.0, 4.0)]))
def test_property_proxy_and_psi2_scale_across_the_float_range(k, atoms):
    # sigma2_opt(cX) = c^2 sigma2_opt(X) and ||cX|| = |c| ||X|| with c = 10^k, or a ValueError
    # when the spread of cX leaves [1e-150, 1e150]; never a wrong number
    x = np.array(atoms)
    p = np.linspace(1.0, 2.0, x.size)
    p /= p.sum()
    c = 10.0**k
    base, scaled = _law(x, p), _law(c * x, p)
    if not 1e-150 <= c * np.ptp(x) <= 1e150:
        with pytest.raises(ValueError, match="spread"):
            subgaussian.optimal_variance_proxy(scaled, method="numeric")
        with pytest.raises(ValueError, match="spread"):
            subgaussian.psi2_norm(scaled, centred=True)
        return
    assert subgaussian.optimal_variance_proxy(scaled, method="numeric") == approx(
        c * c * subgaussian.optimal_variance_proxy(base, method="numeric"), rel=1e-8
    )
    assert subgaussian.psi2_norm(scaled, centred=True) == approx(
        c * subgaussian.psi2_norm(base, centred=True), rel=1e-8
    )


@FEW
@given(decades)
def test_property_normal_law_at_every_scale(k):
    sigma = 10.0**k
    law = stats.norm(0, sigma)
    if not 1e-150 <= 1.349 * sigma <= 1e150:  # the interquartile range
        for call in (subgaussian.optimal_variance_proxy, subgaussian.psi2_norm):
            with pytest.raises(ValueError, match="spread"):
                call(law)
        return
    assert subgaussian.optimal_variance_proxy(law) == approx(sigma**2, rel=1e-12)
    assert subgaussian.psi2_norm(law) == approx(sigma * math.sqrt(8 / 3), rel=1e-8)
    assert subgaussian.log_mgf(law, 1.0 / sigma) == approx(0.5, rel=1e-12)


def test_psi2_of_a_normal_law_at_the_top_of_the_range():
    # nodes beyond |x| = 1e150 (10 sd here) were dropped: 1.6329929e149 instead of 1.6329932e149
    # (found by test_property_normal_law_at_every_scale under the explore profile, seed 1)
    assert subgaussian.psi2_norm(stats.norm(0, 1e149)) == approx(1e149 * math.sqrt(8 / 3), rel=1e-12)


def test_numeric_proxy_at_the_bottom_of_the_range():
    # guards the float64 cap of the lambda search added for Bernoulli(p -> 0): a first cap at
    # 1e150 < 2 reach / Var = 1.7e150 raised a RuntimeWarning here (found by
    # test_property_proxy_and_psi2_scale_across_the_float_range, explore profile, seed 2)
    x, p = np.array([0.0, 1.0, 3.0]), np.array([1.0, 1.5, 2.0]) / 4.5
    ref = subgaussian.optimal_variance_proxy(_law(x, p), method="numeric")
    got = subgaussian.optimal_variance_proxy(_law(1e-150 * x, p), method="numeric")
    assert got == approx(1e-300 * ref, rel=1e-12)


@pytest.mark.parametrize("sigma", [1e-300, 1e-160, 1e160, 1e300])
def test_laws_whose_variance_leaves_the_float_range_are_refused(sigma):
    # before: norm(0, 1e-300) had proxy 0, psi2 0 and K(1e300) = nan; norm(0, 1e300) had proxy
    # and psi2 inf ("no finite proxy") and uniform(0, 1e300) raised OverflowError
    for law in (stats.norm(0, sigma), stats.uniform(0, sigma), _law([-sigma, sigma], [0.5, 0.5])):
        for call in (
            lambda: subgaussian.optimal_variance_proxy(law),
            lambda: subgaussian.optimal_variance_proxy(law, method="numeric"),
            lambda: subgaussian.psi2_norm(law),
            lambda: subgaussian.log_mgf(law, 1.0 / sigma),
        ):
            with pytest.raises(ValueError, match="spread"):
                call()


def test_continuous_law_far_from_zero_is_refused_by_the_quadrature():
    # norm(1e12, 1): the nodes 1e12 + y kept 4 digits of y, the numeric proxy was 1.0000038
    with pytest.raises(ValueError, match="centred law"):
        subgaussian.optimal_variance_proxy(stats.norm(1e12, 1.0), method="numeric")
    assert subgaussian.optimal_variance_proxy(stats.norm(1e12, 1.0)) == 1.0  # the closed form is exact
    near = subgaussian.optimal_variance_proxy(stats.norm(1e4, 1.0), method="numeric")
    assert near == approx(1.0, rel=1e-9)


def test_normal_cgf_where_lambda_squared_overflows():
    # 0.5 * var * lam**2 = 0.5 * 1e-200 * inf: K was inf instead of 5e199
    assert subgaussian.log_mgf(stats.norm(0, 1e-100), 1e200) == approx(5e199, rel=1e-14)


@MANY
@given(
    st.floats(1e-3, 1e3),
    st.floats(1e-3, 1e3),
    st.one_of(log2_scales, st.integers(495, 520), st.integers(-530, -505)),  # t^2 at the edges
)
def test_property_chernoff_bound_depends_only_on_t_over_sigma(t, sigma2, k):
    # bound(c t, c^2 sigma2) = bound(t, sigma2) for c = 2^k: exact in real arithmetic
    c = 2.0**k
    s2 = sigma2 * c * c
    assume(np.finfo(np.float64).tiny <= s2 < F64_MAX and t * c < F64_MAX)  # s2 exactly c^2 sigma2
    ref = subgaussian.subgaussian_tail_bound(t, sigma2)
    assert subgaussian.subgaussian_tail_bound(t * c, s2) == approx(ref, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("t, s2", [(1.5e154, 1.7e308), (1e-160, 1e-321)])
def test_chernoff_bound_where_t_squared_leaves_the_normal_range(t, s2):
    # t^2 = inf and 2 sigma2 = inf: exp(-inf/inf) was 0 (or NaN) instead of 2 exp(-0.66);
    # t^2 = 1e-320 is subnormal (3 digits): the bound was off by 1e-3 relative
    assert subgaussian.subgaussian_tail_bound(t, s2) == approx(
        2.0 * math.exp(-0.5 * (t / math.sqrt(s2)) ** 2), rel=1e-14
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: subgaussian.hoeffding_proxy(-1e160, 1e160),
        lambda: subgaussian.linear_map_proxy([1e160, 1.0], 1.0),
        lambda: subgaussian.linear_map_proxy([1.0, 1.0], 1e308, dependent=True),
        lambda: subgaussian.chernoff_lambda(1e300, 1e-10),
    ],
    ids=["hoeffding", "linear_map", "linear_map_dependent", "chernoff_lambda"],
)
def test_proxies_beyond_the_float_range_raise(call):
    # they returned inf with an overflow warning; inf means "no finite proxy" in tails
    with pytest.raises(ValueError, match="float64 range"):
        call()


# =========================================================================== extremes
@pytest.mark.parametrize("N", [2**63, np.uint64(2**63), 10**20, 10**30])
def test_expected_counts_beyond_int64(N):
    # 2**63 wrapped to -2**63 (a negative expected count); 10**20 raised a TypeError
    p = ex.exceedance_probability_gaussian(0.0, 1.0, 1.0)
    assert ex.expected_count_gaussian(N, 0.0, 1.0, 1.0) == approx(float(int(N)) * p, rel=1e-15)
    b = ex.theorem2_bounds(N, 3.0, 1.0, 1.0)
    assert 0.0 < b.lower <= b.upper == approx(float(int(N)))
    lo, hi = ex.count_interval(N, 0.3, 0.01, "chernoff")
    assert lo < 0.3 * float(int(N)) < hi


def test_simulation_beyond_int64_is_refused():
    # 2**63 wrapped to a negative N and the simulation returned the count 0
    with pytest.raises(ValueError, match="int64"):
        ex.simulate_counts(2**63, 0.0, 1.0, 1.0, rng=0)


@MANY
@given(st.integers(1, 10**40))
def test_property_exact_functions_accept_any_row_count(N):
    p = ex.exceedance_probability_gaussian(0.5, 1.0, 1.0)
    assert ex.expected_count_gaussian(N, 0.5, 1.0, 1.0) == approx(float(N) * p, rel=1e-15)


@pytest.mark.parametrize(
    "mu, t, sigma",
    [(1.0, 1.0, 1e-200), (0.0, 0.0, 1e-200), (3e200, 1e200, 1e200), (1e-170, 0.0, 1e-170)],
)
def test_theorem2_bounds_at_extreme_scales(mu, t, sigma):
    # 0/0 (sigma^2 underflows) and inf/inf (u^2 overflows) made the bounds NaN
    b = ex.theorem2_bounds(10, mu, t, sigma)
    k = 2.0**-600 if sigma > 1 else 2.0**600  # the same problem at an ordinary scale
    ref = ex.theorem2_bounds(10, mu * k, t * k, sigma * k)
    for got, want in zip(b[:4], ref[:4]):
        assert got == approx(want, rel=1e-12, abs=0.0, nan_ok=True)


def test_theorem1_at_extreme_scales():
    # u = sigma = 1e200: inf/inf gave NaN; the bound is 1 - 2 exp(-1/2)
    assert ex.theorem1_lower_bound(2e200, 1e200, 1e200) == approx(1 - 2 * math.exp(-0.5))


@MANY
@given(
    st.floats(-50, 50),
    st.floats(0, 50),
    st.floats(0.01, 10),
    log2_scales,
    st.sampled_from(ex.NOISE_LAWS),
)
def test_property_probabilities_and_bounds_are_scale_invariant(mu, t, sigma, k, noise):
    # (mu, t, sigma) -> c (mu, t, sigma), c = 2^k, changes none of them in exact arithmetic
    c = 2.0**k
    scaled = (mu * c, t * c, sigma * c)
    assume(all(abs(v) < F64_MAX / 4 for v in scaled) and sigma * c > 0)
    assume(t == 0 or t * c >= 1e-300)  # keep t itself representable relative to the others
    assume(mu == 0 or abs(mu * c) >= 1e-300)
    want = ex.exceedance_probability(mu, t, sigma, noise)
    got = ex.exceedance_probability(*scaled, noise)
    assert got == approx(want, rel=1e-9, abs=1e-300)
    want_g = ex.exceedance_probability_gaussian(mu, t, sigma)
    assert ex.exceedance_probability_gaussian(*scaled) == approx(want_g, rel=1e-9, abs=1e-300)
    b, b_ref = ex.theorem2_bounds(7, *scaled), ex.theorem2_bounds(7, mu, t, sigma)
    for got_b, want_b in zip(b[:4], b_ref[:4]):
        assert got_b == approx(want_b, rel=1e-9, abs=1e-300, nan_ok=True)
    margin = ex.half_exceedance_margin(t, sigma)
    assert ex.half_exceedance_margin(t * c, sigma * c) == approx(margin * c, rel=1e-9, abs=1e-300)


@FEW
@given(st.floats(1e-300, 1e-4), st.floats(0.1, 10.0))
def test_property_complement_keeps_its_digits_for_small_t(t, sigma):
    # Phi(t) - Phi(-t) cancels: 7.978845362e-11 instead of 7.978845608e-11 at t = 1e-10
    q = ex.exceedance_probability_gaussian(0.0, t, sigma, complement=True)
    assert q == approx(special.erf(t / (sigma * math.sqrt(2.0))), rel=1e-13)


def test_complement_in_a_narrow_tail_interval():
    # both ends of [-5 - 1e-10, -5 + 1e-10] round to the same 9 digits of Phi
    q = ex.exceedance_probability_gaussian(5.0, 1e-10, 1.0, complement=True)
    assert q == approx(2e-10 * math.exp(-12.5) / math.sqrt(2 * math.pi), rel=1e-12)


def test_exceedance_probabilities_when_t_minus_mu_overflows():
    # t - mu = inf while (t - mu)/sigma = 2: the uniform law gave NaN, the simulation counted
    # against an infinite threshold
    for noise in ex.NOISE_LAWS:
        assert ex.exceedance_probability(-1.7e308, 1.7e308, 1.7e308, noise) == approx(
            ex.exceedance_probability(-1.0, 1.0, 1.0, noise), rel=1e-14
        )
    counts = ex.simulate_counts(10**5, -1.7e308, 1.7e308, 1.7e308, rng=0)
    lo, hi = ex.count_interval(10**5, ex.exceedance_probability(-1.0, 1.0, 1.0), 1e-6, "exact")
    assert lo <= counts <= hi


def test_half_exceedance_margin_near_the_float_limit():
    # mu + t overflowed inside the bisection: the margin was 0 instead of -0.0667 t
    assert ex.half_exceedance_margin(1.7e308, 1.7e308) == approx(
        1.7e308 * ex.half_exceedance_margin(1.0, 1.0), rel=1e-12
    )
    with pytest.raises(ValueError, match="float64 range"):
        ex.half_exceedance_margin(1.0, 1.5e308, "two-sided")



# =========================================================================== quantization
from hypothesis.extra.numpy import arrays  # noqa: E402

from companion.applications import quantization as qz  # noqa: E402

F16_MAX = 65504.0


@pytest.mark.parametrize("granularity", qz.GRANULARITIES)
@pytest.mark.parametrize("bits", [4, 8])
def test_float16_maximum_is_not_quantised_to_inf(bits, granularity):
    # the grid point q * fl16(65504/q) = 127 * 516 = 65532 rounds to inf in float16
    x = np.array([[F16_MAX, -3.0, 1.0], [100.0, 0.5, -F16_MAX]], dtype=np.float16)
    y = qz.fake_quantize(x, bits, granularity)
    assert np.isfinite(y).all()
    assert y[0, 0] == F16_MAX and y[1, 2] == -F16_MAX


def _check_bound(x, y, half):
    """|x - Q(x)| <= Δ/2 (+ half an ulp of Q(x) in the storage dtype), all finite."""
    x64, y64, h64 = (np.asarray(a, dtype=np.float64) for a in (x, y, half))
    assert np.isfinite(y64).all()
    yd = np.asarray(y).astype(x.dtype)
    below = np.abs(yd - np.nextafter(yd, np.zeros_like(yd))).astype(np.float64)
    ulp = np.maximum(2.0 * below, float(np.finfo(x.dtype).smallest_subnormal))  # spacing above |y|
    assert np.all(np.abs(y64 - x64) <= h64 * (1 + 1e-6) + ulp / 2)


@MANY
@given(
    arrays(np.float16, st.tuples(st.integers(1, 5), st.integers(1, 4)),
           elements=st.floats(-F16_MAX, F16_MAX, width=16)),
    st.integers(2, 16),
    st.sampled_from(qz.GRANULARITIES),
)
def test_property_float16_quantisation_keeps_its_error_bound(x, bits, granularity):
    # in float16, round(x/Δ)·Δ rounds twice: 8 bits, max|x| = 3.28 gave an error 0.0137 > Δ/2
    y = qz.fake_quantize(x, bits, granularity)
    _check_bound(x, y, qz._max_rounding_error(x, bits, granularity))


def test_float16_centre_at_the_opposite_end_of_the_range():
    # x - c = 65504 + 65504 overflowed float16: every output was NaN, the error bound inf
    x = np.array([[F16_MAX, -3.0, 1.0], [100.0, 0.5, -F16_MAX]], dtype=np.float16)
    c = np.array([-F16_MAX, 0.0, F16_MAX])
    y = qz.fake_quantize(x, 8, "tensor", center=c)
    _check_bound(x, y, qz._max_rounding_error(x, 8, center=c))


def test_float32_centre_at_the_opposite_end_of_the_range():
    x = torch.tensor([[3e38, -3e38], [1.0, 2.0]])
    c = torch.tensor([-3e38, 3e38])
    y = qz.fake_quantize(x, 8, "channel", center=c)  # was NaN
    _check_bound(x.numpy(), y.numpy(), qz._max_rounding_error(x, 8, "channel", center=c).numpy())
    with pytest.raises(ValueError, match="float64"):  # no wider dtype than float64
        qz.fake_quantize(np.array([[1.7e308, -1.7e308]]), 8, center=np.array([-1.7e308, 1.7e308]))


@pytest.mark.parametrize(
    "call",
    [
        lambda: qz.fake_quantize(np.ones((2, 3), np.float16), 8, center=np.array([1e5, 0.0, 0.0])),
        lambda: qz._max_rounding_error(np.ones((2, 3), np.float16), 8, center=np.array([0, 7e4, 0])),
        lambda: qz.fold_center_into_bias(
            torch.ones(2, 3, dtype=torch.float16), None, np.array([1e5, 1.0, 1.0])
        ),
    ],
    ids=["fake_quantize", "_max_rounding_error", "fold_center_into_bias"],
)
def test_centre_beyond_the_float16_range_is_refused(call):
    # the centre became inf in the cast and every output NaN
    with pytest.raises(ValueError, match="torch.float16"):
        call()


def test_results_that_overflow_float16_are_refused():
    x = np.array([[F16_MAX, 1.0], [-F16_MAX, 2.0]], dtype=np.float16)
    with pytest.raises(ValueError, match="torch.float16"):  # the MSE 4.3e9 was returned as inf
        qz.channel_mse(x, -x)
    w = torch.full((2, 3), 6e4, dtype=torch.float16)
    with pytest.raises(ValueError, match="torch.float16"):  # b + W c was inf
        qz.fold_center_into_bias(w, None, torch.tensor([6e4, 1.0, 1.0], dtype=torch.float16))


def test_hooks_refuse_a_centre_beyond_the_layer_dtype():
    lin = torch.nn.Linear(3, 2).half()
    centers = {"lin": np.array([1e5, 0.0, 0.0])}
    with pytest.raises(ValueError, match="torch.float16"):
        with model_quantization.quantize_linear_inputs(lin, 8, modules={"lin": lin}, centers=centers):
            pass


# =========================================================================== outliers
from companion.outliers import attention_logits as al  # noqa: E402
from companion.outliers import regimes as ol  # noqa: E402

_Z = np.random.default_rng(0).standard_normal((1000, 2)) * [1.0, 3.0] + [0.0, 1.0]


@pytest.mark.parametrize("value", [0.3, 1 / 3, 123.456])
def test_constant_channel_is_constant(value):
    # the rounded mean of 10 copies of 0.3 is not 0.3: std 5.6e-17, kurtosis -2, max_abs_z 1,
    # and empirical_variance_proxy returned a ratio of 40 instead of refusing the channel
    x = np.column_stack([np.full(10, value), np.arange(10.0)])
    d = ol.tail_diagnostics(x)
    assert d["mean"][0] == value and d["std"][0] == 0.0
    assert np.isnan(d["excess_kurtosis"][0]) and d["max_abs_z"][0] == 0.0
    with pytest.raises(ValueError, match="constant channel"):
        ol.empirical_variance_proxy(x)


@FEW
@given(log2_scales, st.floats(-1e3, 1e3))
def test_property_tail_diagnostics_do_not_depend_on_the_unit(k, shift):
    # kurtosis and max |z| are scale-free: c^4 underflowed at 1e-80 (kurtosis 0.2904 -> 0.2900)
    # and at 1e-160 (NaN); it overflowed at 1e80
    c = 2.0**k
    x = (_Z + shift) * c
    assume(np.isfinite(x).all() and np.abs(x).max() < F64_MAX / 8)
    assume(np.abs(x).min() > 0 and np.abs(_Z * c).min() >= np.finfo(np.float64).tiny)  # exact
    ref, got = ol.tail_diagnostics(_Z + shift), ol.tail_diagnostics(x)
    for key in ("excess_kurtosis", "max_abs_z"):
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-12)
    np.testing.assert_allclose(got["std"], ref["std"] * c, rtol=1e-12)
    r_ref = ol.empirical_variance_proxy(_Z + shift)
    if ref["std"].max() * c < math.sqrt(F64_MAX):
        got_r = ol.empirical_variance_proxy(x)["ratio"]
        np.testing.assert_allclose(got_r, r_ref["ratio"], rtol=1e-12)
    else:  # the proxy, a variance, is not representable
        with pytest.raises(ValueError, match="float64 range"):
            ol.empirical_variance_proxy(x)


def test_empirical_variance_proxy_beyond_the_float_range():
    with pytest.raises(ValueError, match="float64 range"):  # std^2 overflowed with a warning
        ol.empirical_variance_proxy(_Z * 1e160)


@pytest.mark.parametrize("q, n", [(1e-300, 10), (1e-100, 1), (1e-20, 3)])
def test_gaussian_max_quantile_for_tiny_levels(q, n):
    # 1 - q^(1/n) rounded to 1: the quantile was -0.0 for q = 1e-300, n = 10
    r = math.exp(math.log(q) / n)
    m = ol.gaussian_max_abs_quantile(n, q)
    assert m > 0 and special.erf(m / math.sqrt(2.0)) == approx(r, rel=1e-12)


def test_gaussian_max_quantile_beyond_int64():
    # 10**30 raised a TypeError (a Python int beyond 64 bits)
    m = ol.gaussian_max_abs_quantile(10**30)
    # P(max_i |G_i| <= m) = (1 - 2 Phi(-m))^n = 1/2
    assert 1e30 * math.log1p(-2.0 * special.ndtr(-m)) == approx(math.log(0.5), rel=1e-9)


def test_dot_product_moments_beyond_the_float_range():
    with pytest.raises(ValueError, match="float64 range"):  # var was inf with a warning
        big = np.array([1e200])
        al.dot_product_moments(big, big, big, np.array([1.0]))


# =========================================================================== pruning


def test_linear_input_statistics_of_a_constant_channel():
    # the mean of three 0.1 is 0.10000000000000002 in torch: the variance came out 5.8e-34
    from companion.applications.pruning import linear_input_statistics

    lin = torch.nn.Linear(2, 1).double()
    batches = [torch.tensor([[0.1, float(i + j)] for j in range(3)], dtype=torch.float64)
               for i in range(3)]
    st_ = linear_input_statistics(lin, batches, {"lin": lin})["lin"]
    assert st_.mean[0] == 0.1 and st_.var[0] == 0.0
    assert st_.var[1] > 0


# =========================================================================== perturbation
from companion.injection import engine
from companion.injection import metrics as fw  # noqa: E402
from companion.injection.directions import random_direction  # noqa: E402
from companion.stacks.residual import ResidualStack, StackConfig  # noqa: E402


@FEW
@given(log2_scales, st.sampled_from(["layernorm", "rmsnorm"]))
def test_property_normalisation_scale_is_homogeneous(k, norm):
    # s(c x) = |c| s(x) for eps = 0: var overflowed beyond 1e154 (s = inf) and underflowed
    # below 1e-154 (s = 0, factors inf)
    x = np.array([[1.0, -2.0, 0.5, 3.0], [0.1, 0.2, -0.3, 0.25]])
    c = 2.0**k
    assume(np.abs(x * c).min() >= np.finfo(np.float64).tiny and np.abs(x * c).max() < F64_MAX / 8)
    np.testing.assert_allclose(fw.normalisation_scale(x * c, 0.0, norm),
                               c * fw.normalisation_scale(x, 0.0, norm), rtol=1e-14)
    eps = 1e-5  # with eps, tiny rows give sqrt(eps)
    assert fw.normalisation_scale(x * 2.0**-600, eps, norm) == approx(math.sqrt(eps), rel=1e-14)


@pytest.mark.parametrize("size", [1e-200, 1e200])
def test_directions_of_any_size(size):
    # ||v|| underflowed ("v must be a non-zero vector") or overflowed (v / inf = 0: projection 0)
    base = np.zeros((2, 4))
    base[:, 0] = 1.0
    inj = base.copy()
    inj[1, 1] = 0.5
    v = np.array([0.0, 2.0, 0.0, 0.0]) * size
    m = fw.perturbation_metrics(base, inj, v)
    assert m["projection"].tolist() == [0.0, 0.5]
    u = np.array([[[2.0, -2.0, 2.0, -2.0]]])
    ref = fw.postln_contraction_factors(u, ln_weight=np.array([1.0, 2.0, 3.0, 4.0]), v=v / size)
    got = fw.postln_contraction_factors(u, ln_weight=np.array([1.0, 2.0, 3.0, 4.0]), v=v)
    np.testing.assert_allclose(got, ref, rtol=1e-15)
    stack = ResidualStack(StackConfig(d_model=8, n_layers=2, n_heads=2))
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(0))
    d = random_direction(8, seed=1)
    sw_ref = engine.sweep_stack_injections(stack, x, scale=0.1, direction=d)
    sw = engine.sweep_stack_injections(stack, x, scale=0.1, direction=d * size)
    np.testing.assert_allclose(sw.metrics["projection"], sw_ref.metrics["projection"], rtol=1e-12)


def test_stack_injection_beyond_the_stack_dtype():
    # 1e39 * v became inf in float32: "inject_vector contains NaN or infinite values"
    stack = ResidualStack(StackConfig(d_model=8, n_layers=2, n_heads=2))
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="torch.float32"):
        engine.sweep_stack_injections(stack, x, scale=1e39, relative=False)
    with pytest.raises(ValueError, match="torch.float32"):  # finite in float64, inf after the cast
        stack(x, inject_layer=1, inject_vector=np.full(8, 1e39))


def test_fit_norm_growth_and_dilution_at_the_float_limits():
    with pytest.raises(ValueError, match="float64 range"):  # c was inf
        fw.fit_norm_growth([1e-300, 1e10, 2e10])
    # 1 + c m overflowed: inf/inf = NaN instead of sqrt((1 + c l)/(1 + c m)) -> sqrt(l/m)
    np.testing.assert_allclose(fw.dilution_factor(1e308, 2, [2, 3, 8]),
                               np.sqrt([1.0, 2 / 3, 2 / 8]), rtol=1e-14)


# =========================================================================== injection
from companion.injection import metrics as inj_mod  # noqa: E402
from companion.applications import model_quantization


@pytest.mark.parametrize("size", [1e-200, 1e200])
def test_embedding_change_of_tiny_and_huge_embeddings(size):
    # the norms under/overflowed: "zero vector" for 1e-200, 1 - cos = 1 for 1e200
    a, b = np.array([[1.0, 0.0, 1.0]]), np.array([[1.0, 1.0, 0.0]])
    np.testing.assert_allclose(inj_mod.embedding_change(a * size, b * size),
                               inj_mod.embedding_change(a, b), rtol=1e-15)


def test_next_token_kl_when_a_token_has_probability_zero():
    # p_base = 0 times log p_base - log p_inj = -inf + ... gave 0 * inf = NaN
    a = np.array([1e308, -1e308, 0.0])
    b = np.array([0.0, 0.0, 0.0])
    kl = inj_mod.next_token_kl(a, b)
    assert kl == approx(math.log(3.0), rel=1e-14)  # KL(delta_0 || uniform on 3) = ln 3


@pytest.mark.parametrize(
    "kwargs, window",
    [
        (dict(placement="post", threshold=1e-320, factor=0.5), (0, 31)),  # ln(1/tau) = inf
        (dict(placement="pre", threshold=0.5, c=1e308), (8, 31)),  # c (L - 1) = inf: -> tau^2 L
        (dict(placement="pre", threshold=0.5, c=1e-320), (0, 31)),  # (tau^2 - 1)/c = -inf
    ],
)
def test_predicted_window_at_the_float_limits(kwargs, window):
    # each raised OverflowError: cannot convert float infinity to integer
    assert fw.predicted_window(n_layers=32, **kwargs) == window
