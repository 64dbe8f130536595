r"""Theorems 1 and 2 of the outlier note: bounds, exact values and streamed simulations.

Theory and proofs: chapters :doc:`/book/theorem1` and :doc:`/book/theorem2`.  Rows :math:`X_{ij}=\mu_j+Z_{ij}`
(:math:`i\le N`, channel :math:`j`); :math:`C_j(t)=\#\{i\le N:|X_{ij}|>t\}`.  The noise is centred and
symmetric with variance :math:`\sigma^2` (``sigma`` its scale): ``gaussian`` :math:`\sigma G`; ``uniform``
on :math:`[-\sqrt3\sigma,\sqrt3\sigma]`; ``rademacher`` :math:`\pm\sigma`; the first three have optimal
proxy :math:`\sigma^2`; ``laplace`` (scale :math:`\sigma/\sqrt2`) is **not** sub-Gaussian and shows what
breaks without the assumption.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import special, stats

from companion.theory import _cgf
from companion._validation import (
    as_generator, as_real_array, check_bool, check_choice, check_int, check_real, checkpoints, integer_counts,
    is_real, real_array, real_vector)

__all__ = [
    "NOISE_LAWS", "SUBGAUSSIAN_NOISE_LAWS", "CountBounds", "theorem1_lower_bound",
    "exceedance_probability", "exceedance_probability_gaussian", "expected_count_gaussian",
    "theorem2_bounds", "half_exceedance_margin", "count_interval", "simulate_counts",
    "DesignEffect", "design_effect", "dependent_count_pvalue", "holm_reject", "variance_inflation",
    "mdependent_count_bound", "mdependent_count_halfwidth"]

#: Noise laws understood by :func:`exceedance_probability` and :func:`simulate_counts`.
NOISE_LAWS = ("gaussian", "uniform", "rademacher", "laplace")
#: The laws among :data:`NOISE_LAWS` that are ``sigma**2``-sub-Gaussian under the convention above.
SUBGAUSSIAN_NOISE_LAWS = ("gaussian", "uniform", "rademacher")

_SQRT3 = math.sqrt(3.0)
_SQRT2 = math.sqrt(2.0)
#: Default number of float32 draws held in memory at once (256 KiB: stays in the L2 cache).
_DEFAULT_CHUNK = 1 << 16
#: Above this many threshold comparisons per draw, sorting the chunk once is cheaper.
_SORT_ABOVE_COMPARISONS = 32
#: Thresholds are clipped to this magnitude before the float32 cast (avoids overflow to inf).
_F32_CLIP = 1.0e30
#: Squares of magnitudes in [_SQRT_TINY, _SQRT_HUGE] are normal float64 numbers.
_SQRT_TINY = math.sqrt(float(np.finfo(np.float64).tiny))
_SQRT_HUGE = math.sqrt(float(np.finfo(np.float64).max)) / 2.0
_F64_MAX = float(np.finfo(np.float64).max)


def _positive_sigma(sigma) -> np.ndarray:
    """sigma checked: real, finite, > 0."""
    s = real_array("sigma", sigma)
    if (s <= 0).any():
        raise ValueError(f"sigma must be > 0 (it is the sub-Gaussian scale of the noise), got min(sigma) "
                         f"= {s.min():.4g}; for noiseless data the count is simply N * (|mu| > t)")
    return s


def _nonnegative_t(t) -> np.ndarray:
    """t checked: real, finite, >= 0."""
    tt = real_array("t", t)
    if (tt < 0).any():
        raise ValueError(f"t must be >= 0 (it is a threshold on |X|), got min(t) = {tt.min():.4g}; "
                         "for t < 0 every row exceeds it")
    return tt


def _float_counts(N) -> np.ndarray:
    """Row counts ``N`` (integers >= 1, any size up to 1.8e308) as float64."""
    arr = integer_counts("N", N)
    if arr.dtype == object and arr.size and max(arr.flat) > _F64_MAX:
        raise ValueError(f"N ~ 10**{len(str(max(arr.flat))) - 1} exceeds the float64 range (1.8e308): no count "
                         "of that size can be represented; use a smaller N")
    return arr.astype(np.float64)


def _mts(mu, t, sigma) -> list[np.ndarray]:
    """``mu``, ``t`` and ``sigma`` checked and broadcast together."""
    return _cgf.broadcast(mu=real_array("mu", mu), t=_nonnegative_t(t), sigma=_positive_sigma(sigma))


def _half_square_ratio(u: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``u**2 / (2 s**2)``, also where a square leaves the normal float64 range (0 where u == 0)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        r = (u * u) / (2.0 * s * s)
        au, as_ = np.abs(u), np.abs(s)
        normal = (au >= _SQRT_TINY) & (au <= _SQRT_HUGE) & (as_ >= _SQRT_TINY) & (as_ <= _SQRT_HUGE)
        odd = ~normal & (u != 0)
        if odd.any():
            r = np.where(odd, 0.5 * (u / s) ** 2, r)
        return np.where(u == 0, 0.0, r)


def _noise_name(noise) -> str:
    """The checked noise law (case-insensitive)."""
    return check_choice(noise.lower() if isinstance(noise, str) else noise, "noise", NOISE_LAWS)


def theorem1_lower_bound(mu, t, sigma, sharp: bool = False):
    r"""Lower bound of Theorem 1 on :math:`P(|\mu+Z|>t)` when :math:`|\mu|>t`.

    Parameters
    ----------
    mu, t, sigma : float or array_like
        Channel mean(s) with :math:`|\mu|>t`, threshold(s) :math:`t\ge0`, sub-Gaussian scale :math:`\sigma>0`.
    sharp : bool, default False
        False: the note's :math:`1-2e^{-u^2/(2\sigma^2)}`; True: the one-sided :math:`1-e^{-u^2/(2\sigma^2)}`.

    Returns
    -------
    float or numpy.ndarray
        The bound with :math:`u=|\mu|-t`, broadcast; unclipped (vacuous below :math:`u=\sigma\sqrt{2\ln2}`).

    Raises
    ------
    TypeError, ValueError
        As :func:`exceedance_probability`, if ``sharp`` is not a bool, or if an entry has :math:`|\mu|\le t`.

    Examples
    --------
    >>> round(theorem1_lower_bound(3.0, 1.0, 1.0), 4)
    0.7293
    >>> round(theorem1_lower_bound(3.0, 1.0, 1.0, sharp=True), 4)
    0.8647
    >>> theorem1_lower_bound(1.5, 1.0, 1.0) < 0      # vacuous: u < sigma * sqrt(2 ln 2)
    True
    """
    sharp = check_bool(sharp, "sharp")
    m, tt, s = _mts(mu, t, sigma)
    u = np.abs(m) - tt
    if (u <= 0).any():
        k = int((u <= 0).sum())
        raise ValueError(f"Theorem 1 needs |mu| > t, but {k} of {u.size} entries have |mu| <= t (max of "
                         f"t - |mu| is {(-u).max():.4g}); use theorem2_bounds for the other regimes")
    return _cgf.scalar_or_array(1.0 - (1.0 if sharp else 2.0) * np.exp(-_half_square_ratio(u, s)))


def _survival(x: np.ndarray, sigma: np.ndarray, noise: str) -> np.ndarray:
    """:math:`P(Z > x)` (strict) for the noise law ``noise`` with scale ``sigma``."""
    if noise == "gaussian":
        return special.ndtr(-x / sigma)
    if noise == "uniform":
        a = _SQRT3 * sigma
        return np.clip((a - x) / (2.0 * a), 0.0, 1.0)
    if noise == "rademacher":
        return np.where(x < -sigma, 1.0, np.where(x < sigma, 0.5, 0.0))
    # laplace with variance sigma**2: scale b = sigma / sqrt(2)
    z = _SQRT2 * x / sigma
    half = 0.5 * np.exp(-np.abs(z))
    return np.where(z >= 0, half, 1.0 - half)


def exceedance_probability(mu, t, sigma, noise: str = "gaussian"):
    r"""Exact :math:`P(|\mu+Z|>t)` for each noise law of :data:`NOISE_LAWS`.

    Parameters
    ----------
    mu, t, sigma : float or array_like
        Channel mean(s), threshold(s) :math:`t\ge0` and noise scale :math:`\sigma>0` (module docstring).
    noise : {"gaussian", "uniform", "rademacher", "laplace"}, default "gaussian"

    Returns
    -------
    float or numpy.ndarray
        :math:`S(t-\mu)+S(t+\mu)` with :math:`S(x)=P(Z>x)`, broadcast over ``mu``, ``t``, ``sigma``.

    Raises
    ------
    TypeError, ValueError
        If an input is not real (TypeError), is out of range (Parameters), or shapes do not broadcast.

    Examples
    --------
    >>> round(exceedance_probability(0.0, 2.0, 1.0), 4)           # 2 * Phi(-2)
    0.0455
    >>> exceedance_probability(0.0, 2.0, 1.0, noise="uniform")   # |Z| <= sqrt(3) < 2
    0.0
    >>> exceedance_probability(0.75, 1.0, 1.0, noise="rademacher")
    0.5
    """
    law = _noise_name(noise)
    m, tt, s = _mts(mu, t, sigma)
    with np.errstate(over="ignore", invalid="ignore"):
        below, above = tt - m, tt + m
        p = _survival(below, s, law) + _survival(above, s, law)
        # t -+ mu or sqrt(3) sigma beyond 1.8e308: the same survival in units of sigma
        odd = ~(np.isfinite(below) & np.isfinite(above) & (_SQRT3 * s <= _F64_MAX))
        if odd.any():
            ones = np.ones_like(s)
            scaled = _survival(tt / s - m / s, ones, law) + _survival(tt / s + m / s, ones, law)
            p = np.where(odd, scaled, p)
    return _cgf.scalar_or_array(np.minimum(p, 1.0))


def exceedance_probability_gaussian(mu, t, sigma, complement: bool = False):
    r"""Exact :math:`P(|\mu+\sigma G|>t)` for :math:`G\sim N(0,1)`.

    Parameters
    ----------
    mu, t, sigma : float or array_like
        Mean(s), threshold(s) :math:`t\ge0` and standard deviation(s) :math:`\sigma>0`.
    complement : bool, default False
        Return :math:`P(|\mu+\sigma G|\le t)` instead, without cancellation (for log scales).

    Returns
    -------
    float or numpy.ndarray
        The probability, broadcast over the inputs.

    Raises
    ------
    TypeError, ValueError
        If ``complement`` is not a bool, or as :func:`exceedance_probability`.

    Examples
    --------
    >>> round(exceedance_probability_gaussian(3.0, 1.0, 1.0), 4)
    0.9773
    >>> f"{exceedance_probability_gaussian(9.0, 1.0, 1.0, complement=True):.4g}"
    '6.221e-16'
    """
    complement = check_bool(complement, "complement")
    return _cgf.scalar_or_array(_prob_gaussian(*_mts(mu, t, sigma), complement))


def _prob_gaussian(m: np.ndarray, tt: np.ndarray, s: np.ndarray, complement: bool) -> np.ndarray:
    """Compute :func:`exceedance_probability_gaussian` for checked, broadcast arrays."""
    with np.errstate(over="ignore", invalid="ignore"):
        if complement:
            a = np.abs(m)
            hi, lo = (tt - a) / s, (-tt - a) / s
            inside = special.ndtr(hi) - special.ndtr(lo)
            # both ends rounded to the same digits of Phi (t << sigma): integrate the density
            # over the narrow interval instead, (hi - lo) phi(c) (1 + (c^2-1) w^2/24 + ...)
            w, c = 2.0 * tt / s, -a / s
            narrow = (w * np.maximum(1.0, np.abs(c)) < 1e-2) & (tt > 0)
            if narrow.any():
                inside = np.where(narrow, _narrow_normal_mass(w, c), inside)
            return inside
        below, above = (m - tt) / s, -(m + tt) / s
        odd = ~(np.isfinite(m - tt) & np.isfinite(m + tt))  # m -+ t beyond 1.8e308
        if odd.any():
            below = np.where(odd, m / s - tt / s, below)
            above = np.where(odd, -(m / s) - tt / s, above)
        return special.ndtr(below) + special.ndtr(above)


def _narrow_normal_mass(w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """P(c - w/2 < G <= c + w/2) for w (1 + |c|) < 1e-2: midpoint rule with Taylor corrections."""
    w2, c2 = w * w, c * c
    series = 1.0 + (c2 - 1.0) * w2 / 24.0 + (c2 * c2 - 6.0 * c2 + 3.0) * w2 * w2 / 1920.0
    return w * np.exp(-0.5 * c2) / math.sqrt(2.0 * math.pi) * series


def expected_count_gaussian(N, mu, t, sigma):
    r"""Exact :math:`E[C(t)]=N\,P(|\mu+\sigma G|>t)` for Gaussian noise (any dependence between rows).

    Parameters
    ----------
    N, mu, t, sigma : int or array_like of int, then float or array_like
        Number(s) of rows :math:`N\ge1` (any size, used as float64); the rest as in
        :func:`exceedance_probability_gaussian`.

    Returns
    -------
    float or numpy.ndarray
        The expected count, broadcast over the four inputs.

    Raises
    ------
    TypeError, ValueError
        If ``N`` is not an integer >= 1, or as :func:`exceedance_probability`.

    Examples
    --------
    >>> round(expected_count_gaussian(10**6, 0.0, 3.0, 1.0), 1)
    2699.8
    """
    n = _float_counts(N)
    n, p = _cgf.broadcast(N=n, probability=_prob_gaussian(*_mts(mu, t, sigma), False))
    return _cgf.scalar_or_array(n * p)


class CountBounds(NamedTuple):
    """Bounds on :math:`E[C(t)]` returned by :func:`theorem2_bounds` (arrays or floats)."""

    lower: object  #: Best lower bound valid for every ``sigma**2``-sub-Gaussian noise (one-sided Theorem 1).
    upper: object  #: Best upper bound valid for every such noise (two Chernoff tails, <= N).
    notes_lower: object  #: The note's bound ``N(1 - 2exp(-u^2/2sigma^2))`` (unclipped); NaN if ``|mu| <= t``.
    notes_upper: object  #: The note's pure-variance bound ``2N exp(-t^2/2sigma^2)``; NaN unless ``mu == 0``.
    regime: object  #: "mean-dominated" (``|mu| > t``), "pure-variance" (``mu == 0``) or "intermediate".


def theorem2_bounds(N, mu, t, sigma) -> CountBounds:
    r"""Lower and upper bounds on :math:`E[C(t)]` for :math:`\sigma^2`-sub-Gaussian noise, all regimes.

    Parameters
    ----------
    N, mu, t, sigma : int or array_like of int, then float or array_like
        As in :func:`expected_count_gaussian`, ``sigma`` being the sub-Gaussian parameter :math:`\sigma>0`.

    Returns
    -------
    CountBounds
        ``(lower, upper, notes_lower, notes_upper, regime)``, broadcast (floats/str for scalars).

    Raises
    ------
    TypeError, ValueError
        If ``N`` is not an integer >= 1, or as :func:`exceedance_probability`.

    Examples
    --------
    >>> b = theorem2_bounds(1000, 4.0, 2.0, 1.0)
    >>> b.regime, round(b.lower, 1), round(b.notes_lower, 1), b.upper
    ('mean-dominated', 864.7, 729.3, 1000.0)
    """
    n = _float_counts(N)
    m, tt, s = _mts(mu, t, sigma)
    n, m, tt, s = _cgf.broadcast(N=n, mu=m, t=tt, sigma=s)
    a = np.abs(m)
    with np.errstate(over="ignore"):  # a + t beyond 1.8e308: its tail term is exp(-inf) = 0
        lower = n * -np.expm1(-_half_square_ratio(np.maximum(a - tt, 0.0), s))
        upper = n * np.minimum(1.0, np.exp(-_half_square_ratio(np.maximum(tt - a, 0.0), s))
                               + np.exp(-_half_square_ratio(tt + a, s)))
        dominated = a > tt
        notes_lower = n * (1.0 - 2.0 * np.exp(-_half_square_ratio(a - tt, s)))
        notes_lower = np.where(dominated, notes_lower, np.nan)
        notes_upper = np.where(m == 0, 2.0 * n * np.exp(-_half_square_ratio(tt, s)), np.nan)
    regime = np.where(dominated, "mean-dominated", np.where(m == 0, "pure-variance", "intermediate"))
    return CountBounds(*(_cgf.scalar_or_array(x) for x in (lower, upper, notes_lower, notes_upper, regime)))


_MARGIN_KINDS = ("two-sided", "one-sided", "gaussian")


def half_exceedance_margin(t, sigma, kind: str = "gaussian"):
    r"""Margin :math:`u=|\mu|-t` beyond which a row exceeds :math:`t` with probability > 1/2.

    Parameters
    ----------
    t, sigma : float or array_like
        Threshold(s) :math:`t\ge0` and noise scale :math:`\sigma>0`, broadcast together.
    kind : {"gaussian", "two-sided", "one-sided"}, default "gaussian"
        ``"two-sided"``: the note's bound, :math:`u=\sigma\sqrt{2\ln4}`; ``"one-sided"``: the sharp bound,
        :math:`u=\sigma\sqrt{2\ln2}`; ``"gaussian"``: the exact root of :math:`P(|\mu+\sigma G|>t)=1/2`.

    Returns
    -------
    float or numpy.ndarray
        The margin, broadcast.  ``"gaussian"`` gives a value in :math:`[-t,0]` (:math:`-t` when
        :math:`t\le\sigma\Phi^{-1}(3/4)`): the probability crosses 1/2 before the mean reaches :math:`t`.

    Raises
    ------
    TypeError, ValueError
        As :func:`exceedance_probability`, if ``kind`` is unknown, or if a bound's margin overflows.

    Examples
    --------
    >>> half_exceedance_margin(0.5, 1.0)          # 2 Phi(-0.5) > 1/2: mu = 0 already exceeds 1/2
    -0.5
    """
    check_choice(kind, "kind", _MARGIN_KINDS)
    tt, s = _cgf.broadcast(t=_nonnegative_t(t), sigma=_positive_sigma(sigma))
    if kind in ("two-sided", "one-sided"):
        factor = math.sqrt(2.0 * math.log(4.0 if kind == "two-sided" else 2.0))
        with np.errstate(over="ignore"):
            margin = s * factor + 0.0 * tt
        if not np.isfinite(margin).all():
            raise ValueError(f"the {kind} margin sigma * {factor:.4g} exceeds the float64 range for "
                             f"sigma = {s.max():.4g}; rescale t and sigma")
        return _cgf.scalar_or_array(margin)

    def excess(mu):
        with np.errstate(over="ignore"):
            total = mu + tt
            # mu + t beyond 1.8e308 (t near the float64 limit): divide first
            upper = np.where(np.isfinite(total), -total / s, -(mu / s) - tt / s)
        return special.ndtr((mu - tt) / s) + special.ndtr(upper) - 0.5

    lo, hi = np.zeros_like(tt), tt.copy()
    at_zero = excess(lo) >= 0

    def middle(lo, hi):
        with np.errstate(over="ignore"):  # lo + hi beyond 1.8e308 for t near the float64 limit
            mid = 0.5 * (lo + hi)
        return np.where(np.isfinite(mid), mid, 0.5 * lo + 0.5 * hi)

    for _ in range(200):
        mid = middle(lo, hi)
        if not np.any((mid > lo) & (mid < hi)):
            break
        up = excess(mid) >= 0
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid)
    root = np.where(at_zero, 0.0, middle(lo, hi))
    return _cgf.scalar_or_array(root - tt)


_INTERVAL_METHODS = ("chernoff", "hoeffding", "exact")
#: Largest N for method="exact": above ~3.6e15 scipy's binomial quantiles are NaN (2**63: they hang).
_EXACT_MAX_N = float(2**50)


def _kl_bernoulli(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """kl(q || p) of two Bernoulli laws as p f(d/p) + (1-p) f(-d/(1-p)), f(x) = (1+x) ln(1+x) - x, d = q-p.

    Both terms are >= 0: nothing cancels, unlike q ln(q/p) + (1-q) ln((1-q)/(1-p)) when 1 - q rounds to 1 - p.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = q - p
        x, y = d / p, -d / (1.0 - p)
        # q ln(1+x) - d = p f(x); x overflows for a subnormal p: ln(1+x) = ln q - ln p
        first = np.where(np.isfinite(x), special.xlog1py(q, x), q * (np.log(q) - np.log(p))) - d
        first = np.where(np.abs(x) < 0.01, p * _f_series(x), first)
        second = np.where(np.abs(y) < 0.01, (1.0 - p) * _f_series(y), special.xlog1py(1.0 - q, y) + d)
        return first + second


def _f_series(x: np.ndarray) -> np.ndarray:
    """(1+x) ln(1+x) - x for |x| < 0.01: its Taylor series to x**8 (relative error < 1e-15)."""
    return x * x * (1 / 2 - x * (1 / 6 - x * (1 / 12 - x * (1 / 20 - x * (1 / 30 - x * (1 / 42 - x / 56))))))


def _kl_end(p: np.ndarray, far: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The end of [p, far] (either order) where kl(q || p) crosses ``level``: 120 bisection steps."""
    near = p.copy()
    for _ in range(120):
        mid = 0.5 * (near + far)
        past = _kl_bernoulli(mid, p) > level
        far = np.where(past, mid, far)
        near = np.where(past, near, mid)
    return far


def count_interval(N, p, delta: float = 0.05, method: str = "chernoff"):
    r"""Interval containing :math:`C(t)\sim\mathrm{Binomial}(N,p)` with probability :math:`\ge1-\delta`.

    For independent rows (dependent rows need not concentrate).

    Parameters
    ----------
    N, p : int or array_like of int, float or array_like
        Row counts (as in :func:`expected_count_gaussian`) and the exceedance probability per row, in [0, 1].
    delta : float, default 0.05
        Total miss probability in :math:`(0,1)`, split equally between the tails.
    method : {"chernoff", "hoeffding", "exact"}, default "chernoff"
        ``"hoeffding"``: :math:`Np\pm\sqrt{N\ln(2/\delta)/2}`; ``"chernoff"``: :math:`[Nq_-,Nq_+]` with
        :math:`N\,\mathrm{kl}(q_\pm\|p)=\ln(2/\delta)` (tighter for small :math:`p`); ``"exact"``: binomial
        quantiles (scipy's), for :math:`N\le2^{50}` only.

    Returns
    -------
    tuple of float or numpy.ndarray
        ``(lower, upper)``, broadcast over ``N`` and ``p`` (Hoeffding's unclipped, others in :math:`[0,N]`).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, shapes do not broadcast, or ``"exact"``
        gets :math:`N>2^{50}` (use ``"chernoff"``).

    Examples
    --------
    >>> lo, hi = count_interval(10**6, 1e-3, delta=0.01, method="chernoff")
    >>> round(lo), round(hi)
    (899, 1105)
    >>> count_interval(10**6, 1e-3, delta=0.01, method="exact")
    (920.0, 1082.0)
    """
    check_choice(method, "method", _INTERVAL_METHODS)
    if not is_real(delta):
        raise TypeError(f"delta must be a real number in (0, 1), got {type(delta).__name__}")
    if not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    n = _float_counts(N)
    pp = real_array("p", p)
    if ((pp < 0) | (pp > 1)).any():
        raise ValueError(f"p must be a probability in [0, 1], got values in [{pp.min():.4g}, {pp.max():.4g}]")
    n, pp = _cgf.broadcast(N=n, p=pp)
    log_term = math.log(2.0 / float(delta))
    if method == "hoeffding":
        half = np.sqrt(n * log_term / 2.0)
        lo, hi = n * pp - half, n * pp + half
    elif method == "exact":
        if n.size and n.max() > _EXACT_MAX_N:
            raise ValueError(f"method='exact' needs N <= 2**50 (about 1.1e15), got N = {n.max():.4g}: beyond, "
                             "scipy's binomial quantiles return NaN or never finish; use method='chernoff' "
                             "(valid for every N)")
        lo, hi = stats.binom.ppf(delta / 2.0, n, pp), stats.binom.isf(delta / 2.0, n, pp)
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            raise ValueError("scipy's binomial quantiles returned NaN for these N and p; use method='chernoff'")
    else:
        level = log_term / n
        # upper end: q in [p, 1]; no solution below 1 when kl(1 || p) = -ln p <= level
        with np.errstate(divide="ignore"):
            cap_hi = -np.log(pp) <= level
            cap_lo = -np.log1p(-pp) <= level
        q_plus = np.where(cap_hi, 1.0, np.where(pp == 0.0, 0.0, _kl_end(pp, np.ones_like(pp), level)))
        q_minus = np.where(cap_lo, 0.0, np.where(pp == 1.0, 1.0, _kl_end(pp, np.zeros_like(pp), level)))
        lo, hi = n * q_minus, n * q_plus
    return tuple(_cgf.scalar_or_array(np.asarray(v, dtype=np.float64)) for v in (lo, hi))


def _to_f32(x: np.ndarray) -> np.ndarray:
    """Clip to +-1e30, then cast to float32."""
    return np.clip(x, -_F32_CLIP, _F32_CLIP).astype(np.float32)


class _BlockCounter:
    """Counter of the draws above ``hi`` or below ``lo``, channel by channel; a chunk has shape (rows, m)."""

    def __init__(self, noise: str, rng: np.random.Generator, chunk_size: int):
        self.noise, self.rng = noise, rng
        self.buf = np.empty(chunk_size, dtype=np.float32)
        self.mask = np.empty(chunk_size, dtype=bool)

    def _draw(self, n: int) -> np.ndarray:
        """n draws in draw space (standard normal, U[0, 1) or standard Laplace), in the float32 buffer."""
        z = self.buf[:n]
        if self.noise == "gaussian":
            self.rng.standard_normal(dtype=np.float32, out=z)
        elif self.noise == "uniform":
            self.rng.random(dtype=np.float32, out=z)
        else:  # laplace = exponential with an independent random sign (flip the sign bit)
            self.rng.standard_exponential(dtype=np.float32, out=z)
            signs = self.rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]
            signs &= np.uint32(0x80000000)
            z.view(np.uint32)[...] ^= signs
        return z

    def count(self, m: int, rows: int, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Counts of shape (m, thresholds) for ``rows`` new rows of each of the ``m`` channels."""
        if self.noise == "rademacher":
            return self._count_rademacher(m, rows, hi, lo)
        n = m * rows
        z = self._draw(n)
        T = hi.shape[1]
        out = np.empty((m, T), dtype=np.int64)
        if m == 1:
            if 2 * T > _SORT_ABOVE_COMPARISONS:  # one sort, then binary searches
                z.sort()
                above = rows - np.searchsorted(z, hi[0], side="right")
                out[0] = above + np.searchsorted(z, lo[0], side="left")
                return out
            mask = self.mask[:n]
            for k in range(T):
                above = np.count_nonzero(np.greater(z, hi[0, k], out=mask))
                out[0, k] = above + np.count_nonzero(np.less(z, lo[0, k], out=mask))
            return out
        z = z.reshape(rows, m)
        mask = self.mask[:n].reshape(rows, m)
        acc = np.uint16 if rows < 65536 else np.int64
        for k in range(T):
            above = np.add.reduce(np.greater(z, hi[None, :, k], out=mask).view(np.uint8), axis=0, dtype=acc)
            below = np.add.reduce(np.less(z, lo[None, :, k], out=mask).view(np.uint8), axis=0, dtype=acc)
            out[:, k] = above
            out[:, k] += below
        return out

    def _count_rademacher(self, m: int, rows: int, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The same counts for Rademacher rows, from random bits."""
        words = (rows + 63) // 64
        bits = self.rng.bit_generator.random_raw(m * words).reshape(m, words)
        rem = rows % 64
        if rem:
            bits[:, -1] &= np.uint64((1 << rem) - 1)
        plus = np.bitwise_count(bits).sum(axis=1, dtype=np.int64)[:, None]
        minus = rows - plus
        # in draw space a row is +1 or -1
        above = plus * (hi < 1.0) + minus * (hi < -1.0)
        below = plus * (lo > 1.0) + minus * (lo > -1.0)
        return above + below


def simulate_counts(N, mu, t, sigma, noise: str = "gaussian", rng=None, rho: float = 0.0,
                    chunk_size: int = _DEFAULT_CHUNK):
    r"""Monte-Carlo counts :math:`C_j(t)=\#\{i\le N:|\mu_j+Z_{ij}|>t\}`, streamed in chunks.

    Draws are float32: only their rounding (relative :math:`6\cdot10^{-8}`) separates these from exact counts.

    Parameters
    ----------
    N : int or 1-D sequence of int
        Rows per channel; an increasing sequence gives the counts of the first :math:`N_k` rows of one stream.
    mu, t, sigma : float or array_like
        Channel means and noise scales (broadcast together); thresholds :math:`t\ge0`, all on the same draws.
    noise : {"gaussian", "uniform", "rademacher", "laplace"}, default "gaussian"
    rng : None, int or numpy.random.Generator, optional
        Source of randomness (an int is a seed; None: fresh entropy).
    rho : float, default 0.0
        Correlation :math:`0\le\rho<1` of a channel's rows via one shared :math:`W_j` (Gaussian only).
    chunk_size : int, default 65536
        Draws held in memory at once.

    Returns
    -------
    int or numpy.ndarray of int64
        Counts of shape ``channels + t.shape`` (a leading ``len(N)`` axis for a sequence ``N``), or an int.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (``N`` beyond int64 included).

    Examples
    --------
    >>> simulate_counts(10**5, 0.0, 2.0, 1.0, rng=0)    # E[C] = 10**5 * 2 Phi(-2) = 4550
    4422
    """
    law = _noise_name(noise)
    sizes, scalar_n = checkpoints(N)
    m_arr, s_arr = _cgf.broadcast(mu=real_array("mu", mu), sigma=_positive_sigma(sigma))
    t_arr = _nonnegative_t(t)
    if not is_real(rho):
        raise TypeError(f"rho must be a real number in [0, 1), got {type(rho).__name__}")
    if not (0.0 <= float(rho) < 1.0):
        raise ValueError(f"rho must satisfy 0 <= rho < 1, got {rho!r}")
    if rho != 0 and law != "gaussian":
        raise ValueError(f"rho != 0 is only defined for Gaussian noise, got noise={law!r}")
    chunk_size = check_int(chunk_size, "chunk_size", 1)
    gen = as_generator(rng)

    channel_shape = m_arr.shape
    mus, sig = m_arr.reshape(-1), s_arr.reshape(-1)
    if rho:
        mus = mus + sig * math.sqrt(rho) * gen.standard_normal(mus.size)
        sig = sig * math.sqrt(1.0 - rho)
    ts = t_arr.reshape(-1)
    # thresholds in units of sigma: |X| > t  <=>  Z/sigma > hi  or  Z/sigma < lo
    with np.errstate(over="ignore"):
        hi = (ts[None, :] - mus[:, None]) / sig[:, None]
        lo = (-ts[None, :] - mus[:, None]) / sig[:, None]
        # t -+ mu beyond 1.8e308 (or a tiny sigma): divide first, then subtract
        for arr, sign in ((hi, 1.0), (lo, -1.0)):
            odd = ~np.isfinite(sign * ts[None, :] - mus[:, None])
            if odd.any():
                z = sign * ts[None, :] / sig[:, None] - mus[:, None] / sig[:, None]
                arr[odd] = z[odd]
    if law == "uniform":  # Z/sigma = sqrt(3) (2U - 1)
        hi, lo = (hi / _SQRT3 + 1.0) / 2.0, (lo / _SQRT3 + 1.0) / 2.0
    elif law == "laplace":  # Z/sigma = L / sqrt(2), L standard Laplace
        hi, lo = hi * _SQRT2, lo * _SQRT2
    # float32 thresholds for the float32 buffers; Rademacher draws are exact, keep float64
    hi_d, lo_d = (hi, lo) if law == "rademacher" else (_to_f32(hi), _to_f32(lo))

    J, T, K = mus.size, ts.size, sizes.size
    counts = np.zeros((K, J, T), dtype=np.int64)
    counter = _BlockCounter(law, gen, chunk_size)
    total = int(sizes[-1])
    block = 1 if total >= chunk_size else max(1, chunk_size // total)
    for j0 in range(0, J, block):
        j1 = min(J, j0 + block)
        m = j1 - j0
        rows_per_chunk = max(1, chunk_size // m)
        running = np.zeros((m, T), dtype=np.int64)
        pos, k = 0, 0
        while pos < total:
            rows = min(rows_per_chunk, int(sizes[k]) - pos)
            running += counter.count(m, rows, hi_d[j0:j1], lo_d[j0:j1])
            pos += rows
            if pos == sizes[k]:
                counts[k, j0:j1] = running
                k += 1
    out = counts.reshape((K,) + channel_shape + t_arr.shape)
    out = out[0] if scalar_n else out
    return int(out) if out.ndim == 0 else out


# ---------------------------------------------------------------------------------------------------
# Counts of dependent tokens: design effect, a beta-binomial tail, Holm's step-down rule
# ---------------------------------------------------------------------------------------------------

class DesignEffect(NamedTuple):
    """Between-block dispersion of exceedance counts (see :func:`design_effect`)."""

    rho: np.ndarray  #: intra-block correlation of the exceedance indicators (ANOVA estimate, clipped at 0)
    deff: np.ndarray  #: design effect ``Var(C) / (N p (1 - p))`` = ``1 + (n_w - 1) rho``
    n_eff: np.ndarray  #: effective number of independent tokens ``N / deff``


def design_effect(total, sum_sq_over_size, block_sizes) -> DesignEffect:
    r"""Design effect of a count summed over blocks of dependent tokens, from the blocks' sufficient statistics.

    Tokens come in :math:`k` blocks (texts) of sizes :math:`n_b`, :math:`N = \sum_b n_b`; a count
    :math:`C = \sum_b C_b` sums 0/1 indicators. The ANOVA estimator of the intra-block correlation
    :math:`\rho` of the indicators (Fleiss' estimator for unequal block sizes) needs only :math:`C`,
    :math:`S = \sum_b C_b^2/n_b` and the sizes. Then :math:`\mathrm{Var}\,C \approx Np(1-p)\,D` with the
    design effect :math:`D = 1 + (n_w - 1)\rho`, :math:`n_w = \sum_b n_b^2/N`, and :math:`N/D` is the
    effective number of independent tokens.

    Parameters
    ----------
    total : array_like of int
        The counts :math:`C` (any shape).
    sum_sq_over_size : array_like of float
        :math:`S = \sum_b C_b^2 / n_b`, same shape as ``total``.
    block_sizes : array_like of int, shape ``[k]``
        The block sizes :math:`n_b \ge 1`, :math:`k \ge 2`.

    Returns
    -------
    DesignEffect
        ``rho`` (clipped to ``[0, 1]``; 0 where every or no token exceeds), ``deff`` and ``n_eff``,
        each of the shape of ``total``.

    Raises
    ------
    ValueError
        If the shapes differ, fewer than two blocks are given, a size is < 1, a count is outside
        ``[0, N]``, or ``S`` is outside its attainable range ``[C^2/N, C]``.

    Examples
    --------
    >>> de = design_effect([20], [20.0], [10, 10, 10, 10])     # all exceedances in two whole blocks
    >>> float(de.rho[0]), float(de.deff[0])
    (1.0, 10.0)
    """
    n_b = integer_counts("block_sizes", block_sizes)
    if n_b.ndim != 1 or n_b.size < 2:
        raise ValueError(f"block_sizes must be a 1-d array of at least 2 block sizes, got shape {n_b.shape}")
    n_b = n_b.astype(np.float64)
    if (n_b < 1).any():
        raise ValueError("block_sizes must be >= 1 (a block without tokens carries no information)")
    c = real_array("total", total)
    s = real_array("sum_sq_over_size", sum_sq_over_size)
    if c.shape != s.shape:
        raise ValueError(f"total and sum_sq_over_size must have the same shape, got {c.shape} and {s.shape}")
    k, n = n_b.size, float(n_b.sum())
    if (c < 0).any() or (c > n).any() or (c != np.round(c)).any():
        raise ValueError(f"total must hold integer counts in [0, N = {n:.0f}]")
    tol = 1e-9 * np.maximum(c, 1.0)
    if (s < c * c / n - tol).any() or (s > c + tol).any():
        raise ValueError("sum_sq_over_size must lie in [C^2 / N, C] (sum_b C_b^2 / n_b with 0 <= C_b <= n_b)")
    n0 = (n - float((n_b * n_b).sum()) / n) / (k - 1)
    msb = (s - c * c / n) / (k - 1)
    msw = (c - s) / (n - k) if n > k else np.zeros_like(c)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (msb - msw) / (msb + (n0 - 1.0) * msw)
    rho = np.clip(np.nan_to_num(rho, nan=0.0), 0.0, 1.0)
    n_w = float((n_b * n_b).sum()) / n
    deff = 1.0 + (n_w - 1.0) * rho
    return DesignEffect(rho=rho, deff=deff, n_eff=n / deff)


def dependent_count_pvalue(count, n, p, deff=1.0, tail: str = "upper") -> np.ndarray:
    r"""P-value of a count of :math:`n` dependent 0/1 tokens against a per-token probability ``p``.

    The null law is the beta-binomial on :math:`n` trials with mean :math:`np` and variance
    :math:`np(1-p)\,D` (``deff`` :math:`= D`): its intra-class correlation is
    :math:`(D-1)/(n-1)`, i.e. parameters :math:`a = p\,\theta`, :math:`b = (1-p)\,\theta`,
    :math:`\theta = (n-1)/(D-1) - 1`. With :math:`D = 1` it is the binomial law of independent tokens.

    Parameters
    ----------
    count : array_like of int
        Observed counts in ``[0, n]``.
    n : int
        Number of tokens (>= 1).
    p : array_like of float
        Per-token probability under the null, in ``[0, 1]``.
    deff : array_like of float, default 1.0
        Design effect, in ``[1, n)`` (from :func:`design_effect`).
    tail : {"upper", "lower"}
        ``"upper"``: :math:`P(C \ge c)` (a count too large for ``p``); ``"lower"``: :math:`P(C \le c)`.

    Returns
    -------
    numpy.ndarray
        The p-values, broadcast over ``count``, ``p`` and ``deff``.

    Raises
    ------
    ValueError
        If a count is not an integer in ``[0, n]``, ``p`` is outside ``[0, 1]``, ``deff`` outside
        ``[1, n)``, or ``tail`` unknown.

    Examples
    --------
    >>> round(float(dependent_count_pvalue(30, 100, 0.2)), 4)            # binomial
    0.0112
    >>> round(float(dependent_count_pvalue(30, 100, 0.2, deff=4.0)), 3)   # four times the variance
    0.124
    """
    n = check_int(n, "n", 1)
    tail = check_choice(tail, "tail", ("upper", "lower"))
    c, pp, d = np.broadcast_arrays(real_array("count", count), real_array("p", p), real_array("deff", deff))
    if (c < 0).any() or (c > n).any() or (c != np.round(c)).any():
        raise ValueError(f"count must hold integers in [0, n = {n}]")
    if (pp < 0).any() or (pp > 1).any():
        raise ValueError("p must lie in [0, 1]")
    if (d < 1).any() or (n > 1 and (d >= n).any()):
        raise ValueError(f"deff must lie in [1, n = {n}) (D = n would put all tokens in one block)")
    out = np.empty(c.shape, dtype=np.float64)
    indep = (d <= 1.0) | (n == 1) | (pp <= 0) | (pp >= 1)
    if indep.any():
        ci, pi = c[indep], pp[indep]
        out[indep] = stats.binom.sf(ci - 1, n, pi) if tail == "upper" else stats.binom.cdf(ci, n, pi)
    dep = ~indep
    if dep.any():
        theta = (n - 1.0) / (d[dep] - 1.0) - 1.0
        a, b = pp[dep] * theta, (1.0 - pp[dep]) * theta
        law = stats.betabinom(n, a, b)
        out[dep] = law.sf(c[dep] - 1) if tail == "upper" else law.cdf(c[dep])
    return np.clip(out, 0.0, 1.0)


def holm_reject(pvalues, alpha: float = 0.05) -> np.ndarray:
    r"""Holm's step-down rule: which hypotheses of one family to reject at family-wise error ``alpha``.

    Sort the :math:`m` p-values, :math:`p_{(1)}\le\dots\le p_{(m)}`; reject :math:`H_{(1)},\dots,H_{(k)}`
    for the largest :math:`k` such that :math:`p_{(i)} \le \alpha/(m - i + 1)` for every :math:`i\le k`.
    The probability of any false rejection is at most ``alpha`` whatever the dependence between the
    tests (Holm 1979).

    Parameters
    ----------
    pvalues : array_like of float
        The family's p-values, any shape (the whole array is one family), each in ``[0, 1]``.
    alpha : float, default 0.05
        Family-wise error rate, in ``(0, 1)``.

    Returns
    -------
    numpy.ndarray of bool
        Rejections, of the shape of ``pvalues``.

    Raises
    ------
    ValueError
        If a p-value is outside ``[0, 1]`` or ``alpha`` outside ``(0, 1)``.

    Examples
    --------
    >>> holm_reject([0.01, 0.04, 0.03, 0.2], alpha=0.05).tolist()
    [True, False, False, False]
    """
    p = real_array("pvalues", pvalues)
    if (p < 0).any() or (p > 1).any():
        raise ValueError("pvalues must lie in [0, 1]")
    if not (is_real(alpha) and 0.0 < float(alpha) < 1.0):
        raise ValueError(f"alpha must be a real number in (0, 1), got {alpha!r}")
    flat = p.reshape(-1)
    m = flat.size
    order = np.argsort(flat, kind="stable")
    ok = flat[order] <= float(alpha) / (m - np.arange(m))
    k = m if ok.all() else int(np.argmin(ok))       # the first sorted p-value that fails stops the procedure
    rej = np.zeros(m, dtype=bool)
    rej[order[:k]] = True
    return rej.reshape(p.shape)


def variance_inflation(rho, N) -> float:
    r"""Variance inflation :math:`V_N=1+2\sum_{k<N}(1-k/N)\rho_k` of a count of stationary indicators.

    :math:`\operatorname{Var}C=Np(1-p)V_N` for :math:`C=\sum_{i\le N}B_i`, and :math:`N/V_N` is the
    effective number of tokens (chapter :doc:`/book/dependent_tokens`, :prf:ref:`dep-prop-variance`).

    Parameters
    ----------
    rho : array_like, shape (K,)
        Autocorrelations :math:`\rho_1,\dots,\rho_K` of the indicators at lags 1..K, :math:`K\le N-1`
        (lags beyond K count as 0).
    N : int
        Number of tokens, :math:`N\ge2`.

    Returns
    -------
    float
        :math:`V_N\ge0`.

    Raises
    ------
    TypeError, ValueError
        If ``N`` is not an integer ``>= 2``, ``rho`` is not a non-empty 1-D array of values in
        :math:`[-1,1]` with at most ``N - 1`` lags, or the result is negative (no stationary sequence
        has these autocorrelations).

    Examples
    --------
    >>> round(variance_inflation([0.5], 3), 6)      # 1 + 2 (2/3) 0.5
    1.666667
    """
    n = check_int(N, "N", 2)
    r = real_vector("rho", rho)
    if r.ndim != 1 or r.size > n - 1:
        raise ValueError(f"rho must hold the autocorrelations at lags 1..K with K <= N - 1 = {n - 1}, "
                         f"got {r.size}")
    if (np.abs(r) > 1).any():
        raise ValueError("autocorrelations must lie in [-1, 1]")
    k = np.arange(1, r.size + 1, dtype=np.float64)
    v = 1.0 + 2.0 * float(np.sum((1.0 - k / n) * r))
    if v < -1e-12:
        raise ValueError(f"V_N = {v:.4g} < 0: no stationary sequence has these autocorrelations")
    return max(v, 0.0)


def _blocks(N, m) -> tuple[int, int, int]:
    """(N, m, n_-) with n_- = floor(N / (m + 1)) >= 1, checked."""
    n, mm = check_int(N, "N", 1), check_int(m, "m", 0)
    if n // (mm + 1) < 1:
        raise ValueError(f"N = {n} tokens hold no class of the (m + 1) = {mm + 1} interleaved classes: "
                         "need N >= m + 1")
    return n, mm, n // (mm + 1)


def mdependent_count_bound(s, N, m, two_sided: bool = True):
    r"""Tail of a count over :math:`m`-dependent tokens: :math:`(m+1)\exp(-2s^2n_-/N^2)`.

    For :math:`m`-dependent indicators :math:`B_1,\dots,B_N` (any :math:`P(B_i=1)=p_i`),
    :math:`C=\sum_iB_i`, :math:`\mu=\mathbb EC` and :math:`n_-=\lfloor N/(m+1)\rfloor`, each of
    :math:`P(C-\mu\ge s)` and :math:`P(C-\mu\le-s)` is at most the bound (chapter
    :doc:`/book/dependent_tokens`, :prf:ref:`dep-thm-blocked`); :math:`m=0` is Hoeffding's inequality.

    Parameters
    ----------
    s : float or array_like
        Deviations :math:`s\ge0`.
    N, m : int
        Number of tokens and dependence range, :math:`N\ge m+1`, :math:`m\ge0`.
    two_sided : bool, default True
        Bound :math:`P(|C-\mu|\ge s)` (factor 2) or one tail.

    Returns
    -------
    float or numpy.ndarray
        The bound, not capped at 1, shape of ``s``.

    Raises
    ------
    TypeError, ValueError
        If ``s`` is negative or NaN, ``N``/``m`` are not integers with :math:`N\ge m+1\ge1`, or
        ``two_sided`` is not a bool.

    Examples
    --------
    >>> round(mdependent_count_bound(200.0, 1000, 9), 5)   # 2 * 10 exp(-2 * 4e4 * 100 / 1e6)
    0.00671
    """
    s_arr = as_real_array(s, "s")
    if np.isnan(s_arr).any() or (s_arr < 0).any():
        raise ValueError("s must be >= 0 and not NaN (a deviation of the count from its mean)")
    n, mm, n_minus = _blocks(N, m)
    two = check_bool(two_sided, "two_sided")
    with np.errstate(over="ignore", under="ignore"):
        exponent = 2.0 * (s_arr / n) ** 2 * n_minus
    return _cgf.scalar_or_array((2.0 if two else 1.0) * (mm + 1) * np.exp(-exponent))


def mdependent_count_halfwidth(N, m, delta: float = 0.05) -> float:
    r"""Half-width :math:`N\sqrt{\ln(2(m+1)/\delta)/(2n_-)}` of a :math:`1-\delta` interval for :math:`C-\mu`.

    The two-sided :func:`mdependent_count_bound` solved for :math:`s` at level :math:`\delta`.

    Parameters
    ----------
    N, m : int
        Number of tokens and dependence range, :math:`N\ge m+1`, :math:`m\ge0`.
    delta : float, default 0.05
        Failure probability in :math:`(0,1)`.

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        As :func:`mdependent_count_bound`, or if ``delta`` is not in :math:`(0,1)`.

    Examples
    --------
    >>> round(mdependent_count_halfwidth(1000, 0), 2)     # Hoeffding: sqrt(1000 ln 40 / 2)
    42.95
    """
    n, mm, n_minus = _blocks(N, m)
    d = check_real(delta, "delta", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    return n * math.sqrt(math.log(2.0 * (mm + 1) / d) / (2.0 * n_minus))
