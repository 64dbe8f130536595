r"""Concentration beyond one sub-Gaussian variable: sub-exponential laws, sums, maxima, norms.

Theory, notation and the proof of every bound: chapter :doc:`/book/concentration` (:math:`N` variables
of a maximum, :math:`n` summands, :math:`d` coordinates).  Laws are evaluated with the node sets of
``companion.theory._cgf``, a continuous law split at its mean (where the density of a Gaussian dot
product is singular).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import integrate, special, stats

from companion.theory import _cgf, exceedance, subgaussian
from companion.theory.empirical import _check_sample, _is_law
from companion._validation import (
    as_generator, as_real_array, check_bool, check_choice, check_dist, check_int, check_real,
    check_sigma2, check_t, checkpoints, freeze, is_discrete, real_array, real_vector)

__all__ = [
    "dot_product_law", "psi1_norm", "subexponential_nu2", "bernstein_bound", "bernstein_variance_bound",
    "bennett_bound", "hoeffding_bound", "bounded_differences_bound", "efron_stein_bound",
    "laurent_massart_bound", "maximal_bound", "gaussian_max_expectation",
    "gaussian_max_lower_bound", "simulate_max", "gaussian_norm_mean", "norm_concentration_bound"]

_LAM_MAX = _cgf.LAM_MAX_UNBOUNDED
#: ``1/b`` within this relative distance of an exponential tail's rate counts as "at the edge",
#: where the supremum defining nu^2 is infinite (the measured rate carries a log correction).
_EDGE_RTOL = 1e-3
_NORM_METHODS = ("bernstein", "interpolation", "lipschitz")


class _GaussianDot(stats.rv_continuous):
    r"""Law of :math:`q\cdot k`, :math:`q,k\sim N(0,I_d)` independent (symmetric variance-gamma)."""

    def _argcheck(self, d):
        return np.asarray(d) > 0

    def _logpdf(self, x, d):
        """Log-density through the exponentially scaled Bessel function kve."""
        nu = (d - 1.0) / 2.0
        ax = np.abs(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_pow = np.where(nu == 0, 0.0, nu * np.log(ax))
            kve = special.kve(nu, ax)
            # K_nu(x) beyond 1.8e308 (nu >> x, e.g. d_k >= 1000 in the bulk): the pdf was inf
            log_k = np.where(np.isfinite(kve), np.log(kve) - ax, _log_bessel_k_debye(nu, ax))
            out = log_pow + log_k - 0.5 * math.log(math.pi) - nu * _cgf.LOG2 - special.gammaln(d / 2.0)
        # at x = 0 the density is finite for d > 1 and infinite (log singularity) for d <= 1
        at0 = ax == 0
        if np.any(at0):
            finite0 = special.gammaln(nu) - 0.5 * math.log(math.pi) - _cgf.LOG2 - special.gammaln(d / 2.0)
            out = np.where(at0, np.where(d > 1, finite0, np.inf), out)
        return out

    def _pdf(self, x, d):
        return np.exp(self._logpdf(x, d))

    def _sf(self, x, d):
        return np.vectorize(_dot_sf, otypes=[float])(x, d)

    def _cdf(self, x, d):
        return np.vectorize(_dot_sf, otypes=[float])(-np.asarray(x), d)

    def _stats(self, d):
        return 0.0, d, 0.0, 6.0 / d


def _log_bessel_k_debye(nu, x):
    """ln K_nu(x) by Debye's uniform expansion to 1/nu**4 (absolute error < 1e-9 for nu >= 20)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = x / nu
        root = np.sqrt(1.0 + z * z)
        t, t2 = 1.0 / root, 1.0 / (1.0 + z * z)
        u1 = t * (3.0 - 5.0 * t2) / 24.0
        u2 = t2 * (81.0 - t2 * (462.0 - 385.0 * t2)) / 1152.0
        u3 = t * t2 * (30375.0 - t2 * (369603.0 - t2 * (765765.0 - 425425.0 * t2))) / 414720.0
        u4 = t2 * t2 * (4465125.0 - t2 * (94121676.0 - t2 * (349922430.0 - t2 * (446185740.0
                                                                            - 185910725.0 * t2)))) / 39813120.0
        series = 1.0 - u1 / nu + u2 / nu**2 - u3 / nu**3 + u4 / nu**4
        eta = root + np.log(x) - np.log(nu) - np.log1p(root)  # x / nu may underflow
        return 0.5 * np.log(np.pi / (2.0 * nu)) - nu * eta - 0.5 * np.log(root) + np.log(series)


def _dot_sf(x: float, d: float) -> float:
    """P(q.k > x) = P(A - B > 2x) for A, B ~ chi2(d) independent, by one quadrature over chi(d)."""
    if x < 0:
        return 1.0 - _dot_sf(-x, d)
    half = 0.5 * d
    log_norm = (half - 1.0) * _cgf.LOG2 + math.lgamma(half)   # chi(d) density normaliser

    def integrand(u: float) -> float:  # chi(d) density times the chi2(d) survival function
        if u <= 0.0:
            return 0.0
        upper = special.gammaincc(half, 0.5 * (u * u + 2.0 * x))
        if upper <= 0.0:
            return 0.0
        return math.exp((d - 1.0) * math.log(u) - 0.5 * u * u - log_norm) * upper

    peak = math.sqrt(max(d - 1.0, 0.0))
    val, _ = integrate.quad(integrand, 0.0, peak + 40.0, points=[peak], limit=200,
                            epsabs=0.0, epsrel=1e-11)
    return min(1.0, val)


_gaussian_dot = _GaussianDot(name="gaussian_dot", shapes="d")


def dot_product_law(d_k, scaled: bool = False):
    r"""Law of :math:`q\cdot k` for independent :math:`q,k\sim N(0,I_{d_k})`, as a scipy law.

    Parameters
    ----------
    d_k : int
        Dimension :math:`d_k\ge1` of the query and key.
    scaled : bool, default False
        If True, the law of :math:`q\cdot k/\sqrt{d_k}` (unit variance), an attention logit.

    Returns
    -------
    scipy.stats frozen distribution
        Mean 0, variance :math:`d_k` (1 if scaled); ``pdf``, ``sf``, ``cdf`` to about 1e-11 relative
        (:func:`~companion.theory.subgaussian.log_mgf` to 1e-6 only for :math:`d_k\le3`).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(float(dot_product_law(64, scaled=True).sf(2.0)), 4)
    0.0232
    """
    d = check_int(d_k, "d_k", 1)
    sc = check_bool(scaled, "scaled")
    return _gaussian_dot(d, scale=1.0 / math.sqrt(d) if sc else 1.0)


def _split_nodes(dist, mean: float, var: float, lam_abs: float):
    """Weighted nodes of ``dist``; continuous laws get an extra panel boundary at the mean."""
    return _cgf.law_nodes(dist, mean, var, lam_range=(lam_abs, lam_abs), split_at_mean=True)


def _exponential_edge(dist, mean: float, var: float) -> tuple[float, bool]:
    """(smallest exponential tail rate over the unbounded sides, heavier-than-exponential?)."""
    rate, heavy = math.inf, False
    for tail in _cgf.both_tails(dist, mean, _cgf.length_scale(dist, var)).values():
        if tail is None:
            continue
        if tail.beta < 1.0 - _cgf.TAIL_TOL or not tail.rate > 0:
            heavy = True
        elif tail.beta <= 1.0 + _cgf.TAIL_TOL:
            rate = min(rate, float(tail.rate))
    return rate, heavy


def _psi1_from_values(absx: np.ndarray, logw: np.ndarray, lo_edge: float) -> float:
    """Root in s of log E e^{|X|/s} = log 2 over weighted values (rescaled by E|X|); s > lo_edge."""
    big = float(absx.max())
    if big == 0.0:
        return 0.0
    # E|X| computed on values rescaled by their maximum: no overflow (huge values) and no underflow
    # (subnormal values times weights, which would round E|X| to 0 and give a norm of 0)
    mean_abs = float(np.dot(np.exp(logw), absx / big)) * big
    scaled = absx / mean_abs
    keep = scaled < 1e150  # far nodes carry a negligible weight for any finite norm
    scaled, logw = scaled[keep], logw[keep]
    lo = max(0.999 / _cgf.LOG2, lo_edge / mean_abs * (1.0 + 1e-9))
    root = _cgf.orlicz_log_root(logw, scaled, 1.0, math.log(lo))
    return lo * mean_abs if root is None else math.exp(root) * mean_abs  # None: at the edge


def psi1_norm(x, *, centred: bool = False) -> float:
    r"""Orlicz norm :math:`\|X\|_{\psi_1}=\inf\{s>0:\mathbb E\,e^{|X|/s}\le2\}` of a law or a sample.

    Parameters
    ----------
    x : frozen scipy.stats distribution or array_like, shape (n,)
        The law of :math:`X`, or a sample (plug-in estimate).
    centred : bool, default False
        Compute :math:`\|X-\mathbb EX\|_{\psi_1}` (the sample mean for a sample).

    Returns
    -------
    float
        The norm; ``math.inf`` for tails heavier than exponential or an infinite mean or variance.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or a sample is not a finite, non-empty 1-D array.

    Examples
    --------
    >>> round(psi1_norm([1.0, -1.0]), 6)              # 1 / ln 2
    1.442695
    """
    cen = check_bool(centred, "centred")
    x = freeze(x, "x")
    if _is_law(x):
        return _psi1_dist(x, cen)
    arr = _check_sample(x, "x")
    if cen:
        arr = arr - arr.mean()
    return _psi1_from_values(np.abs(arr), np.full(arr.size, -math.log(arr.size)), 0.0)


def _psi1_dist(dist, centred: bool) -> float:
    """:func:`psi1_norm` of a law."""
    dist = check_dist(dist, "x")
    mean, var = _cgf.moments(dist)
    if not (np.isfinite(mean) and np.isfinite(var)):
        return math.inf
    if var == 0:
        return 0.0 if centred else abs(mean) / _cgf.LOG2
    rate, heavy = _exponential_edge(dist, mean, var)
    if heavy:
        return math.inf
    lo_edge = 1.0 / rate if np.isfinite(rate) else 0.0
    nodes = _split_nodes(dist, mean, var, 0.0)
    if is_discrete(dist) and not hasattr(dist.dist, "xk"):
        # a lattice with infinite support must reach where e^{|x|/s} times the pmf has decayed,
        # for every s the root search visits: s >= 0.999 E|X| / ln 2 (Jensen)
        vals = nodes.y if centred else nodes.y + nodes.mean
        mean_abs = float(np.dot(np.exp(nodes.logw), np.abs(vals)))
        nodes = _split_nodes(dist, mean, var, _cgf.LOG2 / (0.999 * mean_abs))
    vals = nodes.y if centred else nodes.y + nodes.mean
    near = np.abs(vals) < 1e150
    return _psi1_from_values(np.abs(vals[near]), nodes.logw[near], lo_edge)


def subexponential_nu2(dist, b) -> float:
    r"""Smallest :math:`\nu^2` with :math:`K(\lambda)\le\lambda^2\nu^2/2` on :math:`|\lambda|<1/b`.

    Parameters
    ----------
    dist : frozen scipy.stats distribution
        The law of :math:`X` (centred by its mean).
    b : float
        The range parameter :math:`b>0`.

    Returns
    -------
    float
        :math:`\sup_{0<|\lambda|<1/b}2K(\lambda)/\lambda^2` (at least the variance); ``math.inf`` if the
        MGF is infinite there or :math:`1/b` is within 0.1% of an exponential tail's rate.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type, ``b`` is not finite and positive, or ``dist`` has no finite mean.

    Examples
    --------
    >>> round(subexponential_nu2(stats.chi2(1), 4.0), 4)
    3.0904
    """
    dist = check_dist(dist)
    bb = check_real(b, "b", lo=0.0, lo_open=True)
    mean, var = _cgf.moments(dist)
    if not np.isfinite(mean):
        raise ValueError("dist has no finite mean, so its centred CGF is undefined")
    if not np.isfinite(var):
        return math.inf
    if var == 0:
        return 0.0
    rate, heavy = _exponential_edge(dist, mean, var)
    if heavy or 1.0 / bb >= rate * (1.0 - _EDGE_RTOL):
        return math.inf
    sd = math.sqrt(var)
    lower, upper = (float(v) for v in dist.support())
    side_tails = _cgf.both_tails(dist, mean, sd)
    ranges, candidates = {}, [float(var)]
    for side in (+1, -1):
        tail = side_tails[side]
        if tail is None:  # bounded side: beyond 2 * reach / Var the profile is below Var
            reach = side * ((upper if side > 0 else lower) - mean)
            if reach > 0:
                ranges[side] = min(1.0 / bb, 2.0 * reach / var)
        elif tail.beta > 1.0 + _cgf.TAIL_TOL and np.isfinite(tail.s2) and 1.0 / bb > _LAM_MAX / sd:
            # Gaussian-like tail: search as far as quadrature is accurate, add the limit there
            ranges[side] = _LAM_MAX / sd
            candidates.append(float(tail.s2))
        else:
            ranges[side] = 1.0 / bb
            if 1.0 / bb > _LAM_MAX / sd:
                warnings.warn(f"1/b = {1.0 / bb:.4g} is {sd / bb:.3g} inverse standard deviations, beyond "
                              f"the range where the quadrature is accurate ({_LAM_MAX:g}); the value may "
                              "be inexact", RuntimeWarning, stacklevel=2)
    lam_top = max(ranges.values(), default=0.0)
    if lam_top == 0.0:
        return float(var)
    nodes = _split_nodes(dist, mean, var, lam_top)
    nodes = _cgf.prune(nodes, _cgf.max_tilt(nodes.y, (ranges.get(-1, 0.0), ranges.get(+1, 0.0))))
    for side, lam_hi in ranges.items():
        lam_lo = min(_cgf.LAM_MIN / sd, lam_hi / 10.0)
        value, _, _ = _cgf.maximise_side(nodes, lam_lo, lam_hi, side)
        candidates.append(value)
    return max(candidates)


def bernstein_bound(t, nu2, b, n: int = 1, two_sided: bool = True):
    r"""Bound a sum of :math:`n` independent :math:`(\nu^2,b)`-sub-exponential terms (Bernstein).

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0` of :math:`S_n=\sum_{i\le n}(X_i-\mathbb EX_i)`.
    nu2, b : float or array_like
        :math:`\nu^2>0` and :math:`b\ge0` of each term (:math:`b=0`: sub-Gaussian), broadcast with ``t``.
    n : int, default 1
    two_sided : bool, default True
        Bound :math:`P(|S_n|\ge t)` (True) or :math:`P(S_n\ge t)` (False).

    Returns
    -------
    float or numpy.ndarray
        :math:`c\exp(-\min(\frac{t^2}{2n\nu^2},\frac{t}{2b}))`, :math:`c=2` or 1; not capped at 1.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, or shapes do not broadcast.

    Examples
    --------
    >>> round(bernstein_bound(10.0, 4.0, 4.0, n=100), 4)   # Gaussian part: 2 e^{-100/800}
    1.765
    """
    t_arr = check_t(t)
    s2 = check_sigma2(nu2, "nu2")
    b_arr = as_real_array(b, "b")
    if np.isnan(b_arr).any() or (b_arr < 0).any() or not np.isfinite(b_arr).all():
        raise ValueError("b must be finite and >= 0 (b = 0 is the sub-Gaussian case)")
    nn = check_int(n, "n", 1)
    two = check_bool(two_sided, "two_sided")
    t_b, s_b, b_b = _cgf.broadcast(t=t_arr, nu2=s2, b=b_arr)
    with np.errstate(divide="ignore"):
        linear = np.where(b_b > 0, t_b / (2.0 * np.where(b_b > 0, b_b, 1.0)), np.inf)
    exponent = np.minimum(_half_square_ratio(t_b, s_b, nn), linear)
    return _cgf.scalar_or_array((2.0 if two else 1.0) * np.exp(-exponent))


def _half_square_ratio(t: np.ndarray, s: np.ndarray, n: float = 1.0) -> np.ndarray:
    """t^2 / (2 n s) without under/overflow of t^2 or n s (t = 1e-162 with a subnormal s: t^2 is 0)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        out = t**2 / (2.0 * n * s)
        odd = ~((np.abs(t) >= 1.5e-154) & (np.abs(t) <= 1.3e154) & (s >= 2.3e-308) & (n * s <= 8e307))
        odd &= t != 0
        if odd.any():  # (t / sqrt s)^2 / 2n: inf (a bound of 0) only where the exponent itself overflows
            out = np.where(odd, 0.5 * (t / np.sqrt(s)) ** 2 / n, out)
    return out


def bernstein_variance_bound(t, sigma2, b, n: int = 1, two_sided: bool = True):
    r"""Bernstein's bound for bounded summands: :math:`P(S_n-\mathbb ES_n\ge t)\le
    \exp\bigl(-\frac{t^2}{2(n\sigma^2+bt/3)}\bigr)`.

    For independent :math:`X_i` with :math:`\operatorname{Var}X_i\le\sigma^2` and
    :math:`|X_i-\mathbb EX_i|\le b`, :math:`S_n=\sum_{i\le n}X_i` (Boucheron, Lugosi and Massart,
    *Concentration Inequalities*, Cor. 2.11).

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0`.
    sigma2, b : float or array_like
        A bound :math:`\sigma^2>0` on each variance and :math:`b\ge0` on each centred range, broadcast
        with ``t``.
    n : int, default 1
    two_sided : bool, default True
        Bound :math:`P(|S_n-\mathbb ES_n|\ge t)` (factor 2) or the upper tail alone.

    Returns
    -------
    float or numpy.ndarray
        The bound, not capped at 1.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, or shapes do not broadcast.

    Examples
    --------
    >>> round(bernstein_variance_bound(10.0, 0.01, 1.0, n=1000), 4)   # 2 exp(-100 / (20 + 20/3))
    0.047
    """
    t_arr, s2 = check_t(t), check_sigma2(sigma2)
    b_arr = as_real_array(b, "b")
    if not (np.isfinite(b_arr).all() and (b_arr >= 0).all()):
        raise ValueError("b must be finite and >= 0 (a bound on |X_i - E X_i|)")
    nn, two = check_int(n, "n", 1), check_bool(two_sided, "two_sided")
    t_b, s_b, b_b = _cgf.broadcast(t=t_arr, sigma2=s2, b=b_arr)
    with np.errstate(over="ignore", under="ignore"):
        # t^2 / (2 (n s + b t / 3)) = (t / 2) / (n s / t + b / 3): no t^2 to under- or overflow
        exponent = np.where(t_b > 0, 0.5 * t_b / (nn * s_b / np.where(t_b > 0, t_b, 1.0) + b_b / 3.0), 0.0)
    return _cgf.scalar_or_array((2.0 if two else 1.0) * np.exp(-exponent))


def bennett_bound(t, sigma2, b, n: int = 1):
    r"""Bennett's bound: :math:`P(S_n-\mathbb ES_n\ge t)\le\exp\bigl(-\frac{n\sigma^2}{b^2}
    h\bigl(\frac{bt}{n\sigma^2}\bigr)\bigr)`, :math:`h(u)=(1+u)\ln(1+u)-u`.

    For independent :math:`X_i` with :math:`\operatorname{Var}X_i\le\sigma^2` and
    :math:`X_i-\mathbb EX_i\le b` (one-sided), :math:`S_n=\sum_{i\le n}X_i` (Bennett, *J. Amer. Statist.
    Assoc.* 57 (1962); proof in chapter :doc:`/book/concentration`).  Upper tail only.

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0`.
    sigma2, b : float or array_like
        A bound :math:`\sigma^2>0` on each variance and :math:`b>0` on each centred summand from
        above, broadcast with ``t``.
    n : int, default 1

    Returns
    -------
    float or numpy.ndarray
        The bound (at most 1).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, or shapes do not broadcast.

    Examples
    --------
    >>> round(bennett_bound(1.0, 1.0, 1.0), 6)     # exp(-(2 ln 2 - 1))
    0.67957
    """
    t_arr, s2 = check_t(t), check_sigma2(sigma2)
    b_arr = as_real_array(b, "b")
    if not (np.isfinite(b_arr).all() and (b_arr > 0).all()):
        raise ValueError("b must be finite and > 0 (a bound on X_i - E X_i from above)")
    nn = check_int(n, "n", 1)
    t_b, s_b, b_b = _cgf.broadcast(t=t_arr, sigma2=s2, b=b_arr)
    v = nn * s_b
    u = b_b * t_b / v
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        h = (1.0 + u) * np.log1p(u) - u
        exponent = np.where(u > 0, v / b_b ** 2 * h, 0.0)
    return _cgf.scalar_or_array(np.exp(-np.nan_to_num(exponent, nan=np.inf, posinf=np.inf)))


def laurent_massart_bound(t, d, tail: str = "upper"):
    r"""Laurent–Massart deviation bounds for :math:`Z\sim\chi^2_d`.

    :math:`P(Z-d\ge2\sqrt{dx}+2x)\le e^{-x}` and :math:`P(d-Z\ge2\sqrt{dx})\le e^{-x}` (Laurent and
    Massart, *Ann. Statist.* 28 (2000), Lemma 1), solved for :math:`x` at the deviation :math:`t`.

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0`.
    d : float or array_like
        Degrees of freedom :math:`d>0`, broadcast with ``t``.
    tail : {"upper", "lower"}, default "upper"
        ``"upper"``: :math:`P(Z-d\ge t)\le\exp(-\frac{t^2}{(\sqrt{d+2t}+\sqrt d)^2})`;
        ``"lower"``: :math:`P(d-Z\ge t)\le e^{-t^2/(4d)}`.

    Returns
    -------
    float or numpy.ndarray
        The bound.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, or shapes do not broadcast.

    Examples
    --------
    >>> round(laurent_massart_bound(2 * 10 + 2 * 1.0, 100.0), 6)   # t = 2 sqrt(d x) + 2x at x = 1
    0.367879
    """
    t_b, d_b = _cgf.broadcast(t=check_t(t), d=check_sigma2(d, "d"))
    if check_choice(tail, "tail", ("upper", "lower")) == "lower":
        return _cgf.scalar_or_array(np.exp(-_half_square_ratio(t_b, d_b, 2.0)))
    with np.errstate(over="ignore", under="ignore"):  # x = (sqrt(d + 2t) - sqrt d)^2 / 4, no cancellation
        x = (t_b / (np.sqrt(d_b + 2.0 * t_b) + np.sqrt(d_b))) ** 2
        x = np.where(np.isfinite(x), x, (np.sqrt(0.5 * t_b) - np.sqrt(d_b / 4.0)) ** 2)
    return _cgf.scalar_or_array(np.exp(-x))


def gaussian_norm_mean(d, sigma2=1.0):
    r"""Mean of :math:`\|h\|` for :math:`h\sim N(0,\sigma^2I_d)`: :math:`\sigma\sqrt2\,
    \Gamma(\frac{d+1}2)/\Gamma(\frac d2)`.

    Exact to rounding for every dimension (the Gamma ratio directly below :math:`d=300`, its
    asymptotic series in :math:`1/d` above); :math:`\sigma\sqrt{d-1/2}` is within :math:`d^{-2}` of it.

    Parameters
    ----------
    d : float or array_like
        Dimensions :math:`d>0`.
    sigma2 : float, default 1.0
        Variance :math:`\sigma^2>0` of each coordinate.

    Returns
    -------
    float or numpy.ndarray
        :math:`\mathbb E\|h\|`, shape of ``d``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(gaussian_norm_mean(2), 6)    # sqrt(pi / 2)
    1.253314
    """
    x = 0.5 * check_sigma2(d, "d")
    sd = math.sqrt(check_real(sigma2, "sigma2", lo=0.0, lo_open=True))
    ratio = np.empty_like(x)  # Gamma(x + 1/2) / Gamma(x)
    small = x < 150.0
    ratio[small] = special.gamma(x[small] + 0.5) / special.gamma(x[small])
    r = 1.0 / x[~small]
    r2 = r * r
    series = r * (-1 / 8 + r2 * (1 / 192 + r2 * (-1 / 640 + r2 * 17 / 14336)))  # log ratio - log(x)/2
    ratio[~small] = np.sqrt(x[~small]) * np.exp(series)
    return _cgf.scalar_or_array(sd * (math.sqrt(2.0) * ratio))  # <= sqrt(max d * max sigma2): finite


def hoeffding_bound(t, lower, upper, n: int = 1, two_sided: bool = True):
    r"""Bound a sum of independent bounded variables (Hoeffding).

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0` of :math:`S=\sum_i(X_i-\mathbb EX_i)`.
    lower, upper : float or array_like, shape (m,)
        Ranges :math:`X_i\in[a_i,b_i]`, one per summand (or scalars).
    n : int, default 1
        With scalar ranges, the number of summands; 1 with per-summand ranges.
    two_sided : bool, default True
        Bound :math:`P(|S|\ge t)` (True) or :math:`P(S\ge t)` (False).

    Returns
    -------
    float or numpy.ndarray
        :math:`c\exp(-2t^2/\sum_i(b_i-a_i)^2)`, :math:`c=2` or 1, shape of ``t``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters), or every range has zero width.

    Examples
    --------
    >>> round(hoeffding_bound(10.0, 0.0, 1.0, n=100), 4)     # 2 exp(-2 * 100 / 100)
    0.2707
    """
    lo = as_real_array(lower, "lower")
    hi = as_real_array(upper, "upper")
    if lo.shape != hi.shape or lo.ndim > 1:
        raise ValueError("lower and upper must be scalars or 1-D arrays of the same length (one range "
                         f"per summand); got shapes {lo.shape} and {hi.shape}")
    nn = check_int(n, "n", 1)
    if lo.ndim == 1 and lo.size > 1 and nn != 1:
        raise ValueError("pass either one range per summand (and n = 1) or scalar ranges and n")
    proxies = np.atleast_1d(subgaussian._hoeffding_proxy(lo, hi))
    total = float(proxies.sum()) * nn
    if total == 0.0:
        raise ValueError("every range has zero width: the sum is constant, no bound is needed")
    t_arr = check_t(t)
    s2 = np.full(t_arr.shape, check_sigma2(total))  # a sum beyond float64 is refused
    return subgaussian._tail_bound(t_arr, s2, check_bool(two_sided, "two_sided"))


def bounded_differences_bound(s, c, two_sided: bool = True):
    r"""Azuma–Hoeffding and McDiarmid: :math:`P(f-\mathbb Ef\ge s)\le\exp\bigl(-2s^2/\sum_kc_k^2\bigr)`.

    One bound for two theorems of chapter :doc:`/book/dependent_tokens`: a martingale whose
    :math:`k`-th difference lies, given the past, in an interval of length :math:`c_k` (Azuma–Hoeffding,
    :math:`f=M_n`, :math:`\mathbb Ef=M_0`), and a function of independent inputs that changes by at most
    :math:`c_k` when the :math:`k`-th input alone changes (McDiarmid).

    Parameters
    ----------
    s : float or array_like
        Deviations :math:`s\ge0`.
    c : array_like, shape (n,)
        The bounded differences :math:`c_k\ge0`, not all 0.
    two_sided : bool, default True
        Bound :math:`P(|f-\mathbb Ef|\ge s)` (factor 2) or the upper tail alone (the lower tail has the
        same bound).

    Returns
    -------
    float or numpy.ndarray
        The bound, not capped at 1, shape of ``s``.

    Raises
    ------
    TypeError, ValueError
        If ``s`` is negative or NaN, ``c`` is not a non-empty 1-D array of finite values ``>= 0`` with
        one of them positive, or ``two_sided`` is not a bool.

    Examples
    --------
    >>> round(bounded_differences_bound(10.0, [1.0] * 100), 4)   # 2 exp(-200 / 100)
    0.2707
    """
    s_arr = as_real_array(s, "s")
    if np.isnan(s_arr).any() or (s_arr < 0).any():
        raise ValueError("s must be >= 0 and not NaN (a deviation from the mean)")
    c_arr = as_real_array(c, "c")
    if c_arr.ndim != 1 or c_arr.size == 0:
        raise ValueError("c must be a non-empty 1-D array (one bounded difference per input), "
                         f"got shape {c_arr.shape}")
    if not (np.isfinite(c_arr).all() and (c_arr >= 0).all()):
        raise ValueError("every bounded difference c_k must be finite and >= 0")
    top = float(c_arr.max())
    if top == 0.0:
        raise ValueError("every c_k is 0: f is constant and needs no bound")
    two = check_bool(two_sided, "two_sided")
    with np.errstate(over="ignore", under="ignore"):
        exponent = 2.0 * (s_arr / top) ** 2 / float(np.sum((c_arr / top) ** 2))
    return _cgf.scalar_or_array((2.0 if two else 1.0) * np.exp(-exponent))


def efron_stein_bound(values, resampled) -> float:
    r"""The Efron–Stein bound :math:`\frac12\sum_k\mathbb E(f-f^{(k)})^2\ge\operatorname{Var}f`, estimated.

    :math:`f^{(k)}` is :math:`f` with its :math:`k`-th independent input replaced by an independent copy
    (chapter :doc:`/book/dependent_tokens`); each expectation is replaced by the mean over the rows.
    Fed with every equally likely input pair of a finite law, the value is exact.

    Parameters
    ----------
    values : array_like, shape (n_samples,)
        :math:`f(Z)` for independent draws of the inputs :math:`Z`.
    resampled : array_like, shape (n_samples, n)
        Column :math:`k`: :math:`f` at the same draw with input :math:`k` redrawn.

    Returns
    -------
    float
        :math:`\frac12\sum_k\overline{(f-f^{(k)})^2}`.

    Raises
    ------
    TypeError, ValueError
        If an array is not real and finite, ``values`` is empty or not 1-D, or ``resampled`` does not
        have one row per value and at least one column.

    Examples
    --------
    >>> efron_stein_bound([0.0, 1.0], [[1.0], [0.0]])    # f = Z, a fair bit: Var f = 1/4 <= 1/2
    0.5
    """
    v = real_vector("values", values)
    r = real_array("resampled", resampled, shape=(v.size, None))
    if r.shape[1] == 0:
        raise ValueError("resampled needs at least one column (one per input of f)")
    return 0.5 * float(np.sum(np.mean((r - v[:, None]) ** 2, axis=0)))


def maximal_bound(N, sigma2=1.0, b=0.0, two_sided: bool = True, delta=None):
    r"""Bound on the largest of :math:`N` centred sub-Gaussian or sub-exponential variables.

    Parameters
    ----------
    N : int or array_like of int
        Number of variables :math:`N\ge1`; no independence is assumed.
    sigma2, b : float, default 1.0 and 0.0
        Variance proxy :math:`\sigma^2>0` (:math:`\nu^2` if ``b > 0``) and :math:`b\ge0` of each variable.
    two_sided : bool, default True
        Bound :math:`\max_i|X_i|` (:math:`M=2N`) or :math:`\max_iX_i` (:math:`M=N`).
    delta : float or None, default None
        None: bound the expectation; :math:`0<\delta<1`: a level :math:`u` with :math:`P(\max\ge u)\le\delta`.

    Returns
    -------
    float or numpy.ndarray
        :math:`\max(\sqrt{2\sigma^2L},\,2bL)`, :math:`L=\ln M` or :math:`\ln(M/\delta)` (exact Gaussian
        value: :func:`gaussian_max_expectation`).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(maximal_bound(10**6), 4)                 # sqrt(2 ln(2e6))
    5.3868
    """
    arr = exceedance._float_counts(N)
    s2 = check_real(sigma2, "sigma2", lo=0.0, lo_open=True)
    bb = check_real(b, "b", lo=0.0)
    two = check_bool(two_sided, "two_sided")
    big_l = np.log((2.0 if two else 1.0) * arr)
    if delta is not None:
        big_l = big_l - math.log(check_real(delta, "delta", lo=0.0, lo_open=True, hi=1.0, hi_open=True))
    with np.errstate(over="ignore"):
        gauss = np.sqrt(2.0 * s2 * big_l)
        gauss = np.where(np.isfinite(gauss), gauss, math.sqrt(s2) * np.sqrt(2.0 * big_l))  # 2 s2 L > 1.8e308
    return _cgf.scalar_or_array(np.maximum(gauss, 2.0 * bb * big_l))


def _gauss_max_mean(n: float, absolute: bool) -> float:
    """E max_{i<=n} G_i (or |G_i|) by quadrature of the survival function of the maximum."""
    if absolute:
        def below(x):  # log P(max |G| <= x) = n log(1 - erfc(x / sqrt 2))
            return n * math.log1p(-math.erfc(x / math.sqrt(2.0)))
    else:
        def below(x):  # log P(max G <= x) = n log Phi(x)
            return n * float(special.log_ndtr(x))
    centre = math.sqrt(2.0 * math.log(2.0 * n)) if n > 1 else 1.0

    def upper_part(x):
        return -math.expm1(below(x)) if x > 0 else 1.0

    total = 0.0
    edges = [0.0, max(centre - 2.0, 0.0), centre, centre + 1.0, centre + 40.0]
    for a, c in zip(edges[:-1], edges[1:]):
        if c > a:
            total += integrate.quad(upper_part, a, c, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    if not absolute:  # minus the integral of P(max G <= -x) = Phi(-x)^n over x > 0
        total -= integrate.quad(lambda x: math.exp(n * float(special.log_ndtr(-x))), 0.0, 40.0,
                                epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    return total


def gaussian_max_expectation(N, absolute: bool = True):
    r"""Exact :math:`\mathbb E\max_{i\le N}|G_i|` (or of :math:`\max_iG_i`), i.i.d. N(0, 1), by quadrature.

    Parameters
    ----------
    N : int or array_like of int
        Number of variables :math:`N\ge1` (absolute error below :math:`10^{-10}`; checked against mpmath up to :math:`10^{100}`).
    absolute : bool, default True
        Maximum of :math:`|G_i|` (True) or of :math:`G_i` (False).

    Returns
    -------
    float or numpy.ndarray
        The expectation (times :math:`\sigma` for :math:`N(0,\sigma^2)`).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(gaussian_max_expectation(2, absolute=False), 6)   # 1 / sqrt(pi)
    0.56419
    """
    arr = exceedance._float_counts(N)
    ab = check_bool(absolute, "absolute")
    out = np.array([_gauss_max_mean(float(n), ab) for n in arr.reshape(-1)]).reshape(arr.shape)
    return _cgf.scalar_or_array(out)


def gaussian_max_lower_bound(N, a=0.0):
    r"""Explicit lower bound on :math:`\mathbb E\max_{i\le N}|G_i|`, :math:`G_i` i.i.d. N(0, 1).

    Parameters
    ----------
    N : int or array_like of int
    a : float, default 0.0
        Free parameter :math:`a\ge0` of the bound.

    Returns
    -------
    float or numpy.ndarray
        :math:`(1-e^{-e^a})\,t`, :math:`t=\sqrt{2\ln N-\ln(4\pi\ln N)-2a}`, when :math:`t\ge1`; 0 otherwise.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(gaussian_max_lower_bound(10**6), 4)
    2.9967
    """
    arr = exceedance._float_counts(N)
    aa = check_real(a, "a", lo=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_n = np.log(arr)
        t2 = np.where(arr > 1, 2.0 * log_n - np.log(4.0 * math.pi * np.where(arr > 1, log_n, 1.0))
                      - 2.0 * aa, 0.0)
    ok = t2 >= 1.0
    out = np.where(ok, -math.expm1(-math.exp(aa)) * np.sqrt(np.where(ok, t2, 1.0)), 0.0)
    return _cgf.scalar_or_array(out)


def simulate_max(N, n_trials: int, rng, *, loc=0.0, scale=1.0, absolute: bool = True,
                 sampler=None, chunk_size: int = 1 << 20):
    r"""Streamed Monte Carlo of :math:`\max_{i\le N}|X_i|` (or :math:`\max_iX_i`), :math:`X=\mu+sZ`.

    Parameters
    ----------
    N : int or 1-D increasing sequence of int
        Rows per trial; a sequence reports the maximum of the first :math:`N_k` rows of one stream.
    n_trials : int
        Independent repetitions (:math:`\ge1`).
    rng : numpy.random.Generator or int
        Source of randomness (an int is a seed).
    loc, scale : float, default 0.0 and 1.0
        :math:`\mu` and :math:`s>0`.
    absolute : bool, default True
        Maximum of :math:`|X_i|` (True) or of :math:`X_i` (False).
    sampler : callable or None, default None
        ``sampler(rng, shape)`` drawing i.i.d. :math:`Z`; None: standard Gaussian (float32 ziggurat).
    chunk_size : int, default 2**20
        Draws held in memory at once (at least ``n_trials``).

    Returns
    -------
    numpy.ndarray (float64)
        Shape ``(n_trials,)``, or ``(len(N), n_trials)`` for a sequence ``N``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type (``rng`` None included) or range, or ``sampler`` returns bad draws.

    Examples
    --------
    >>> simulate_max([10, 100], 3, 0).shape
    (2, 3)
    """
    sizes, scalar_n = checkpoints(N)
    trials = check_int(n_trials, "n_trials", 1)
    if rng is None:
        raise TypeError("rng must be a numpy.random.Generator or a non-negative integer seed, "
                        "not None: the simulation must be reproducible")
    gen = as_generator(rng)
    mu = check_real(loc, "loc")
    s = check_real(scale, "scale", lo=0.0, lo_open=True)
    ab = check_bool(absolute, "absolute")
    if sampler is not None and not callable(sampler):
        raise TypeError(f"sampler must be None or a callable (rng, shape) -> array, got "
                        f"{type(sampler).__name__}")
    chunk = check_int(chunk_size, "chunk_size", 1)
    if chunk < trials:
        raise ValueError(f"chunk_size ({chunk}) must be >= n_trials ({trials})")

    rows_per_chunk = chunk // trials
    zmax, zmin = np.full(trials, -np.inf), np.full(trials, np.inf)
    out = np.empty((sizes.size, trials))
    buf = np.empty(rows_per_chunk * trials, dtype=np.float32) if sampler is None else None
    pos, k, total = 0, 0, int(sizes[-1])
    while pos < total:
        rows = min(rows_per_chunk, int(sizes[k]) - pos)
        if sampler is None:
            z = buf[: rows * trials]
            gen.standard_normal(dtype=np.float32, out=z)
            z = z.reshape(rows, trials)
        else:
            z = np.asarray(sampler(gen, (rows, trials)))
            if z.shape != (rows, trials):
                raise ValueError(f"sampler returned shape {z.shape}, expected {(rows, trials)}")
            if not np.isfinite(z).all():
                raise ValueError("sampler returned NaN or infinite values")
        np.maximum(zmax, z.max(axis=0), out=zmax)
        np.minimum(zmin, z.min(axis=0), out=zmin)
        pos += rows
        if pos == int(sizes[k]):
            top = mu + s * zmax
            out[k] = np.maximum(top, -(mu + s * zmin)) if ab else top
            k += 1
    return out[0] if scalar_n else out


def norm_concentration_bound(t, sigma2=1.0, method: str = "lipschitz", two_sided: bool = True):
    r"""Dimension-free bound on the deviation of :math:`\|h\|` for :math:`h\sim N(0,\sigma^2I_d)`.

    Parameters
    ----------
    t, sigma2 : float or array_like, float (default 1.0)
        Deviations :math:`t\ge0` and the variance :math:`\sigma^2>0` of each coordinate.
    method : {"lipschitz", "interpolation", "bernstein"}
        ``"bernstein"``: from :math:`\sigma\sqrt d`, :math:`2e^{-t^2/(8\sigma^2)}`; ``"interpolation"``:
        from :math:`\mathbb E\|h\|`, :math:`2e^{-2t^2/(\pi^2\sigma^2)}`; ``"lipschitz"``: from
        :math:`\mathbb E\|h\|`, :math:`2e^{-t^2/(2\sigma^2)}` (stated in the book, not proved).
    two_sided : bool, default True
        Two-sided (factor 2) or one-sided (factor 1) bound.

    Returns
    -------
    float or numpy.ndarray
        The raw bound (not capped at 1), shape of ``t``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(norm_concentration_bound(2.0), 4)
    0.2707
    """
    t_arr = check_t(t)
    s2 = check_real(sigma2, "sigma2", lo=0.0, lo_open=True)
    check_choice(method, "method", _NORM_METHODS)
    two = check_bool(two_sided, "two_sided")
    factor = {"bernstein": 4.0, "interpolation": math.pi**2 / 4.0, "lipschitz": 1.0}[method]
    exponent = _half_square_ratio(t_arr, np.asarray(s2, dtype=float), factor)  # t^2 / (2 factor s2)
    return _cgf.scalar_or_array((2.0 if two else 1.0) * np.exp(-exponent))
