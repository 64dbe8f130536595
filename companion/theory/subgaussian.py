r"""Sub-Gaussian tails: optimal variance proxies, Chernoff bounds, :math:`\psi_2` norms.

Definitions (:math:`K(\lambda)`, :math:`\sigma^2_{\rm opt}`) and theory: :doc:`/book/subgaussian_tails`.
A law is a frozen ``scipy.stats`` distribution, evaluated on weighted nodes (``companion.theory._cgf``).
Laws whose spread (interquartile range, width of the atoms) lies outside :math:`[10^{-150},10^{150}]`,
or continuous laws whose mean lies more than :math:`10^8` spreads from 0 when quadrature is needed,
are refused with a ``ValueError`` (rescale, or centre the law); so are laws whose scipy moments are
NaN on a bounded support or a negative variance, laws whose quadrature misses more than :math:`10^{-9}`
of the mass (a density singular at both ends beyond float64, a peak no node resolves), and integer
supports beyond :math:`2^{53}` where nodes are needed.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

from companion.theory import _cgf
from companion.theory.empirical import monte_carlo_tail
from companion._validation import (
    as_real_array, check_bool, check_choice, check_dist, check_sigma2, check_t, is_discrete)

__all__ = [
    "ProxyResult", "bernoulli_optimal_proxy", "chernoff_lambda", "hoeffding_proxy", "linear_map_proxy",
    "log_mgf", "monte_carlo_tail", "optimal_variance_proxy", "proxy_profile", "psi2_norm",
    "subgaussian_tail_bound"]

#: On a side with bounded support lambda is searched up to at most this / reach (lambda^2 finite).
_LAM_CAP = 1e153

_TINY = float(np.finfo(float).tiny)  # smallest normal float64, 2.2e-308
_HUGE = float(np.finfo(float).max)
_SQRT_TINY = math.sqrt(_TINY)
_SQRT_HUGE = math.sqrt(_HUGE)
_METHODS = ("auto", "numeric", "closed_form")


class ProxyResult(NamedTuple):
    """Full output of :func:`optimal_variance_proxy`."""

    proxy: float  #: The optimal variance proxy (``math.inf`` if none is finite).
    variance: float  #: The variance, the limit of 2K(lambda)/lambda^2 at 0.
    argmax: float  #: Maximiser: ``0.0`` (proxy = variance), ``+-inf`` (a limit), finite, or ``nan``.
    method: str  #: ``"closed_form"`` or ``"numeric"``.


def _check_no_overflow(out: np.ndarray, what: str) -> None:
    """ValueError if a result computed from finite inputs left the float64 range."""
    if not np.isfinite(out).all():
        raise ValueError(f"{what} exceeds the float64 range (1.8e308); rescale the inputs "
                         "(a proxy scales like the square of the variable)")


def _log_sinhc(z: np.ndarray) -> np.ndarray:
    """log(sinh(z) / z), accurate for every real z (0 at z = 0)."""
    a = np.abs(np.asarray(z, dtype=float))
    out = np.empty_like(a)
    small = a < 0.5
    if small.any():
        z2 = a[small] ** 2
        poly = np.zeros_like(z2)
        for k in range(12, 0, -1):  # sum_{k>=1} z^{2k} / (2k+1)!
            poly = (poly + 1.0 / math.factorial(2 * k + 1)) * z2
        out[small] = np.log1p(poly)
    if not small.all():
        al = a[~small]
        out[~small] = al + np.log1p(-np.exp(-2.0 * al)) - np.log(2.0 * al)
    return out


#: Spreads (IQR, width of the atoms) for which the variance, proxy and lambda**2 stay far from float64 limits.
_SPREAD_RANGE = (1e-150, 1e150)
#: Nodes ``mean + y`` lose the digits of ``mean`` (proxy error 4e-11 for norm at mean 1e8 sd, 2.5e-9 for
#: beta(2, 5) at 5e8 IQR, 4e-6 for norm at 1e12 sd): a mean beyond this many spreads is refused.
_MAX_LOCATION_RATIO = 1e8


def _spread(dist, var: float) -> float:
    """A width of the law that does not under/overflow like the variance (0 for a point mass)."""
    if _cgf.family(dist) == "rv_sample":
        return float(np.ptp(_cgf.atoms(dist)[0]))
    if is_discrete(dist):  # integer lattice: spacing 1
        return 0.0 if var == 0 else max(1.0, math.sqrt(var)) if np.isfinite(var) else 1.0
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        iqr = float(dist.ppf(0.75) - dist.ppf(0.25))
    if np.isfinite(iqr) and iqr > 0:
        return iqr
    return math.sqrt(var) if np.isfinite(var) else 1.0


def _check_representable(dist, mean: float, var: float, *, centred_nodes: bool) -> None:
    """ValueError when float64 cannot carry the law's second-order quantities."""
    spread = _spread(dist, var)
    lo, hi = _SPREAD_RANGE
    if spread != 0 and not lo <= spread <= hi:
        raise ValueError(f"dist has a spread (interquartile range or width of its atoms) of {spread:.3g}, "
                         f"outside [{lo:g}, {hi:g}]: its variance under- or overflows float64.  Rescale X "
                         f"first (sigma2_opt(cX) = c^2 sigma2_opt(X), ||cX||_psi2 = |c| ||X||_psi2, "
                         f"K_cX(lam) = K_X(c lam))")
    ends = np.abs(np.asarray(dist.support(), dtype=float))
    lattice = is_discrete(dist) and _cgf.family(dist) != "rv_sample"
    if centred_nodes and lattice and (ends[np.isfinite(ends)] > 2.0**53).any():
        raise ValueError(f"dist has integer support {dist.support()} beyond 2**53, where float64 "
                         "nodes do not hold every integer; pass the law shifted towards 0 (loc); the "
                         "variance proxy and K(lambda) do not depend on the mean")
    # the IQR alone misreads a law with most mass in a spike (chi(0.01): IQR 3.4e-13, sd 0.1)
    width = max(spread, math.sqrt(var)) if np.isfinite(var) else spread
    far = np.isfinite(mean) and abs(mean) > _MAX_LOCATION_RATIO * width
    if centred_nodes and not is_discrete(dist) and far:
        raise ValueError(f"dist has its mean {mean:.6g} more than {_MAX_LOCATION_RATIO:g} spreads "
                         f"({width:.3g}) from 0: float64 quadrature nodes mean + y cannot resolve the "
                         "centred variable.  Pass the centred law (e.g. loc=0); the variance proxy and "
                         "K(lambda) do not depend on the mean")


def _bernoulli_argmax(p: float) -> float:
    """Maximiser 2 ln((1 - p)/p) of the Bernoulli proxy profile (0 at p in {0, 1/2, 1})."""
    if p in (0.0, 1.0) or p == 0.5:
        return 0.0
    if p < 1e-300:  # (1 - p)/p overflows below 5.6e-309
        return 2.0 * (math.log1p(-p) - math.log(p))
    return 2.0 * math.log((1.0 - p) / p)


def _binomial_params(dist) -> tuple[float, float]:
    """(n, p) of a Bernoulli or binomial law, from its parameters (not from mean - loc, which cancels)."""
    shapes, _ = _cgf.params(dist)
    return (1.0, shapes[0]) if len(shapes) == 1 else (shapes[0], shapes[1])


def _is_normal_limit(dist) -> bool:
    """Whether ``dist`` is a family's limit that is exactly a normal law (Student t with df = inf)."""
    return _cgf.family(dist) == "t_gen" and _cgf.params(dist)[0][0] == math.inf


def _closed_form_proxy(dist) -> ProxyResult | None:
    """The proxy of a family with a closed form, or None."""
    fam = _cgf.family(dist)
    mean, var = _cgf.moments(dist)
    lower, upper = (float(v) for v in dist.support())
    if fam in ("norm_gen", "randint_gen") or _is_normal_limit(dist):  # strictly sub-Gaussian laws
        return ProxyResult(var, var, 0.0, "closed_form")
    if fam == "betabinom_gen" and _cgf.params(dist)[0][1:] == [1.0, 1.0]:  # uniform on {0, ..., n}
        n = int(_cgf.params(dist)[0][0])
        var = float((n + 1) * (n + 1) - 1) / 12.0
        return ProxyResult(var, var, 0.0, "closed_form")
    if fam == "uniform_gen":
        return ProxyResult((upper - lower) ** 2 / 12.0, var, 0.0, "closed_form")
    if fam in ("bernoulli_gen", "binom_gen"):
        n, p = _binomial_params(dist)
        return ProxyResult(n * _bernoulli_proxy(np.asarray(p)), var, _bernoulli_argmax(p), "closed_form")
    if fam == "rv_sample":
        xk = np.asarray(dist.dist.xk, dtype=float)
        if xk.size == 1:
            return ProxyResult(0.0, 0.0, 0.0, "closed_form")
        if xk.size == 2:  # two-point law = x1 + (x2 - x1) Bernoulli(p2)
            width, p = float(xk[1] - xk[0]), float(dist.dist.pk[1])
            proxy = width**2 * _bernoulli_proxy(np.asarray(p))
            return ProxyResult(proxy, var, _bernoulli_argmax(p) / width, "closed_form")
    if fam in ("laplace_gen", "t_gen", "expon_gen", "logistic_gen", "poisson_gen", "cauchy_gen",
               "skellam_gen"):
        return ProxyResult(math.inf, var, math.nan, "closed_form")
    return None


def _log1p_minus(a: np.ndarray) -> np.ndarray:
    """a - log1p(a) for a > -1, accurate for small |a| (series below 0.1)."""
    a = np.asarray(a, dtype=float)
    out = a - np.log1p(a)
    small = np.abs(a) < 0.1
    if small.any():
        s = a[small]
        acc = np.zeros_like(s)
        for k in range(18, 1, -1):  # sum_{k>=2} (-1)^k a^k / k
            acc = acc * s + (-1.0) ** k / k
        out[small] = acc * s * s
    return out


def _bernoulli_cgf(p: float, lam: np.ndarray) -> np.ndarray:
    """log(1 - p + p e^lam) - p lam without cancellation for small lam."""
    lam = np.asarray(lam, dtype=float)
    small = np.abs(lam) < 1.0
    out = np.logaddexp(math.log1p(-p), math.log(p) + lam) - p * lam
    if small.any():
        ls = lam[small]
        out[small] = p * np.exp(_cgf.log_phi(ls)) - _log1p_minus(p * np.expm1(ls))
    return out


def _closed_form_cgf(dist, lam: np.ndarray) -> np.ndarray | None:
    """K(lam) of a family with a closed form, or None."""
    fam = _cgf.family(dist)
    mean, var = _cgf.moments(dist)
    lower, upper = (float(v) for v in dist.support())
    with np.errstate(all="ignore"):
        if fam == "norm_gen" or _is_normal_limit(dist):
            out = 0.5 * var * lam**2
            # lam**2 overflows before var * lam**2 does (|lam| > 1.3e154): use (sd lam)^2 there
            big = ~np.isfinite(out)
            out[big] = 0.5 * (math.sqrt(var) * lam[big]) ** 2
            return out
        if fam == "uniform_gen":
            return _log_sinhc(0.5 * (upper - lower) * lam)
        if fam == "laplace_gen":
            z = math.sqrt(var / 2.0) * lam
            return np.where(np.abs(z) < 1.0, -np.log1p(-np.minimum(z * z, 1.0)), np.inf)
        if fam == "expon_gen":
            z = math.sqrt(var) * lam
            return np.where(z < 1.0, -np.log1p(-np.minimum(z, 1.0)) - z, np.inf)
        if fam in ("bernoulli_gen", "binom_gen"):
            n, p = _binomial_params(dist)
            if p <= 0.0 or p >= 1.0:
                return np.zeros_like(lam)
            return n * _bernoulli_cgf(p, lam)
        if fam == "poisson_gen":
            return var * np.exp(_cgf.log_phi(lam))  # Poisson: mean = variance
        if fam == "skellam_gen":  # Poisson(mu1) - Poisson(mu2); scipy's pmf takes minutes on a lattice
            mu1, mu2 = _cgf.params(dist)[0]
            return mu1 * np.exp(_cgf.log_phi(lam)) + mu2 * np.exp(_cgf.log_phi(-lam))
        if fam == "t_gen":
            return np.where(lam == 0.0, 0.0, np.inf)
    return None


def log_mgf(dist, lam, *, method: str = "auto"):
    r"""Centred cumulant generating function :math:`K(\lambda)=\log\mathbb E\,e^{\lambda(X-\mathbb EX)}`.

    Parameters
    ----------
    dist, lam : frozen scipy.stats distribution, float or array_like
        The law of :math:`X` (continuous or discrete) and finite values of :math:`\lambda` (any shape).
    method : {"auto", "numeric", "closed_form"}, default "auto"
        ``"auto"``: a closed form where implemented (normal, uniform, Laplace, exponential, Bernoulli,
        binomial, Poisson, Skellam, Student-t), quadrature otherwise; ``"closed_form"`` raises if none exists.

    Returns
    -------
    float or numpy.ndarray
        :math:`K(\lambda)`, shape of ``lam``; ``inf`` where the MGF is infinite.  Quadrature is accurate
        to about :math:`10^{-8}` relative for :math:`|\lambda|\,\mathrm{sd}\lesssim20`.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type, ``lam`` is not finite, ``dist`` has no finite mean or is not
        representable (module docstring), or ``method`` is unknown or has no closed form for this family.

    Examples
    --------
    >>> from scipy import stats
    >>> np.round(log_mgf(stats.laplace(0, 1), [0.5, 1.0]), 4)   # -log(1 - lam^2), infinite at 1
    array([0.2877,    inf])
    """
    dist = check_dist(dist)
    return _log_mgf(dist, _check_lam(lam), check_choice(method, "method", _METHODS))


def _check_lam(lam) -> np.ndarray:
    """The checked array of finite real lambdas."""
    lam_arr = as_real_array(lam, "lam")
    if not np.isfinite(lam_arr).all():
        raise ValueError("lam contains NaN or infinite values; K(lambda) is defined for finite real lambda")
    return lam_arr


def _log_mgf(dist, lam_arr: np.ndarray, method: str):
    """Compute :func:`log_mgf` for checked arguments."""
    mean, var = _cgf.moments(dist)
    if not np.isfinite(mean):
        raise ValueError("dist has no finite mean, so the centred cumulant generating function is undefined")
    _check_representable(dist, mean, var, centred_nodes=False)
    flat = lam_arr.ravel()
    if method != "numeric":
        closed = _closed_form_cgf(dist, flat)
        if closed is not None:
            return _cgf.scalar_or_array(np.asarray(closed, dtype=float).reshape(lam_arr.shape))
        if method == "closed_form":
            raise ValueError(f"no closed-form CGF is implemented for {dist.dist.name}; use method='numeric'")
    out = np.zeros(flat.shape)
    if var == 0 or flat.size == 0:
        return _cgf.scalar_or_array(out.reshape(lam_arr.shape))
    tails = _cgf.both_tails(dist, mean, _cgf.length_scale(dist, var))
    infinite = np.zeros(flat.shape, dtype=bool)
    for side, tail in tails.items():
        if tail is None:
            continue
        pointing = side * flat > 0
        if tail.beta < 1.0 - _cgf.TAIL_TOL:
            infinite |= pointing
        elif tail.beta <= 1.0 + _cgf.TAIL_TOL:
            # the measured rate carries ~1e-11 relative rounding: lambda within 1e-9 of it is "at" it
            infinite |= pointing & (np.abs(flat) >= tail.rate * (1.0 - 1e-9))
    finite = ~infinite & (flat != 0)
    out[infinite] = np.inf
    if finite.any():
        _check_representable(dist, mean, var, centred_nodes=True)
        fin = flat[finite]
        lam_range = (float(max(0.0, -fin.min())), float(max(0.0, fin.max())))
        nodes = _cgf.law_nodes(dist, mean, var, lam_range=lam_range)
        nodes = _cgf.prune(nodes, _cgf.max_tilt(nodes.y, lam_range))
        out[finite] = _cgf.cgf_nodes(nodes, flat[finite])
        _cgf.check_cut(nodes, flat[finite], out[finite])
    return _cgf.scalar_or_array(out.reshape(lam_arr.shape))


def proxy_profile(dist, lam, *, method: str = "auto"):
    r"""The curve :math:`\lambda\mapsto 2K(\lambda)/\lambda^2` whose supremum is the optimal proxy.

    Parameters
    ----------
    dist, lam, method : frozen scipy.stats distribution, array_like, str
        As in :func:`log_mgf`; at :math:`\lambda=0` the limit :math:`\operatorname{Var}X` is returned.

    Returns
    -------
    float or numpy.ndarray
        :math:`2K(\lambda)/\lambda^2`, shape of ``lam`` (``inf`` where the MGF is infinite).

    Raises
    ------
    TypeError, ValueError
        As :func:`log_mgf`.

    Examples
    --------
    >>> from scipy import stats
    >>> np.round(proxy_profile(stats.uniform(0, 1), [0.0, 6.0]), 4)
    array([0.0833, 0.067 ])
    """
    dist = check_dist(dist)
    lam_arr = _check_lam(lam)
    k = _log_mgf(dist, lam_arr, check_choice(method, "method", _METHODS))
    _, var = _cgf.moments(dist)
    with np.errstate(divide="ignore", invalid="ignore"):
        prof = np.where(lam_arr == 0, var, 2.0 * np.asarray(k) / np.where(lam_arr == 0, 1.0, lam_arr) ** 2)
    return _cgf.scalar_or_array(np.asarray(prof, dtype=float))


def optimal_variance_proxy(dist, *, method: str = "auto", full_output: bool = False):
    r"""Optimal variance proxy :math:`\sigma^2_{\rm opt}=\sup_{\lambda\ne0}2K(\lambda)/\lambda^2`.

    Maximised on a log grid refined by Brent's method, its limits at 0 and :math:`\pm\infty` added
    exactly (about :math:`10^{-9}` relative; a ``RuntimeWarning`` if the search may stop short).

    Parameters
    ----------
    dist, method : frozen scipy.stats distribution, {"auto", "numeric", "closed_form"}, default "auto"
        As in :func:`log_mgf` (closed forms: normal, uniform, Bernoulli, binomial, two-point laws,
        ``inf`` for heavy tails).
    full_output : bool, default False
        Return a :class:`ProxyResult` instead of a float.

    Returns
    -------
    float or ProxyResult
        :math:`\sigma^2_{\rm opt}`; ``math.inf`` when no finite proxy exists.

    Raises
    ------
    TypeError, ValueError
        As :func:`log_mgf`, or if ``full_output`` is not a bool.

    Examples
    --------
    >>> from scipy import stats
    >>> round(optimal_variance_proxy(stats.bernoulli(0.1)), 4)
    0.182
    """
    dist = check_dist(dist)
    method = check_choice(method, "method", _METHODS)
    full_output = check_bool(full_output, "full_output")
    mean, var = _cgf.moments(dist)
    _check_representable(dist, mean, var, centred_nodes=False)
    result = None if method == "numeric" else _closed_form_proxy(dist)
    if result is None and method == "closed_form":
        raise ValueError(f"no closed-form proxy is implemented for {dist.dist.name}; use method='numeric'")
    if result is None:
        result = _numeric_proxy(dist)
    # the invariant sigma^2_opt >= Var X (the limit lambda -> 0 of 2K/lambda^2): a proxy below the
    # variance means the nodes lost mass; never return one
    if np.isfinite(var) and not result.proxy >= var * (1.0 - 1e-9):
        raise ValueError(f"the optimal proxy found, {result.proxy:.12g}, is below the variance "
                         f"{var:.12g}: the quadrature lost mass (a density too singular for float64?)")
    return result if full_output else result.proxy


def _too_many_points(count: float) -> None:
    """ValueError: a lattice too large for the search over lambda."""
    raise ValueError(f"dist has {count:.6g} support points with positive mass, more than {_cgf.PROXY_LATTICE}: the search over "
                     "lambda would take minutes.  Use a continuous approximation of the law, or bound "
                     "its proxy (hoeffding_proxy for a bounded support)")


def _numeric_proxy(dist) -> ProxyResult:
    """The proxy by numerical maximisation of 2K(lam)/lam^2 (see :func:`optimal_variance_proxy`)."""
    mean, var = _cgf.moments(dist)
    if not (np.isfinite(mean) and np.isfinite(var)):
        return ProxyResult(math.inf, var, math.nan, "numeric")
    if var == 0:
        return ProxyResult(0.0, 0.0, 0.0, "numeric")
    _check_representable(dist, mean, var, centred_nodes=True)
    sd = math.sqrt(var)
    tails = _cgf.both_tails(dist, mean, sd)
    if any(t is not None and not np.isfinite(t.s2) for t in tails.values()):
        return ProxyResult(math.inf, var, math.nan, "numeric")
    lower, upper = (float(v) for v in dist.support())
    lam_max = _cgf.LAM_MAX_UNBOUNDED / sd
    nodes = _cgf.law_nodes(dist, mean, var, lam_range=(lam_max, lam_max))
    v = nodes.var
    if is_discrete(dist) and nodes.y.size > _cgf.PROXY_LATTICE:
        _too_many_points(nodes.y.size)
    if not (is_discrete(dist) or abs(v - var) <= 1e-9 * var):  # proxy >= v: never below the variance
        raise ValueError(f"the quadrature variance of dist, {v:.12g}, differs from scipy's {var:.12g} "
                         "by more than 1e-9 relative; its density or moments are not accurate enough "
                         "(parameters near a limit of the family?)")
    candidates = [(v, 0.0)]
    ranges, reaches = {}, {}
    for side in (+1, -1):
        tail = tails[side]
        if tail is None:
            reach = side * ((upper if side > 0 else lower) - nodes.mean)
            if reach > 0:
                reaches[side] = reach
                # rigorous: R(lam) < Var beyond it.  A law with Var << reach^2 (Bernoulli(p),
                # p -> 0) has it near 2/p; it is capped where lam^2 and lam * reach stay finite
                ranges[side] = min(2.0 * reach / v, _LAM_CAP / max(reach, 1.0))
        else:
            ranges[side] = lam_max
            candidates.append((tail.s2, side * math.inf))
    nodes = _cgf.prune(nodes, _cgf.max_tilt(nodes.y, (ranges.get(-1, 0.0), ranges.get(+1, 0.0))))
    for side, lam_hi in ranges.items():
        tail = tails[side]
        lam_lo = min(_cgf.LAM_MIN / sd, lam_hi / 10.0)
        if side in reaches:
            # lam * reach must be small at the start of the grid, or the maximiser of a skewed
            # law (2 ln((1-p)/p) for Bernoulli(p)) can lie below it; unchanged while reach < 100 sd
            lam_lo = min(lam_lo, 1e-2 / reaches[side])
        value, arg, at_end = _cgf.maximise_side(nodes, lam_lo, lam_hi, side)
        candidates.append((value, arg))
        if tail is not None and at_end and value > tail.s2:
            warnings.warn(f"2K(lambda)/lambda^2 still increases at lambda = {arg:.4g}, the end of the "
                          "search range; the supremum may lie beyond it", RuntimeWarning, stacklevel=3)
    proxy, argmax = max(candidates, key=lambda c: c[0])
    for side, reach in reaches.items():
        if ranges[side] < 2.0 * reach / v and proxy < 2.0 * reach / ranges[side]:
            warnings.warn(f"the search for lambda stopped at {side * ranges[side]:.4g} (float64 range) "
                          f"before the rigorous end {side * 2.0 * reach / v:.4g}; the supremum may lie "
                          "beyond", RuntimeWarning, stacklevel=3)
    if proxy <= v * (1.0 + 1e-9):
        argmax = 0.0
    return ProxyResult(float(proxy), float(v), float(argmax), "numeric")


def bernoulli_optimal_proxy(p):
    r"""Closed-form optimal variance proxy of Bernoulli(:math:`p`): :math:`\frac{1-2p}{2\ln((1-p)/p)}`.

    Attained at :math:`\lambda^\star=2\ln((1-p)/p)`; proof: chapter :doc:`/book/subgaussian_tails`.

    Parameters
    ----------
    p : float or array_like
        Success probabilities in :math:`[0, 1]`.

    Returns
    -------
    float or numpy.ndarray
        The proxy; :math:`1/4` at :math:`p=1/2`, 0 at :math:`p\in\{0,1\}`.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters).

    Examples
    --------
    >>> round(float(bernoulli_optimal_proxy(0.25)), 4)
    0.2276
    """
    arr = as_real_array(p, "p")
    if np.isnan(arr).any():
        raise ValueError("p contains NaN; pass probabilities in [0, 1]")
    if ((arr < 0) | (arr > 1)).any():
        raise ValueError(f"p must lie in [0, 1]; got values in [{arr.min():.4g}, {arr.max():.4g}]")
    return _bernoulli_proxy(arr)


def _bernoulli_proxy(arr: np.ndarray):
    """Compute :func:`bernoulli_optimal_proxy` for checked probabilities."""
    out = np.full(arr.shape, 0.25)
    inner = (arr > 0) & (arr < 1) & (arr != 0.5)
    q = arr[inner]
    # The proxy is symmetric in p <-> 1 - p.  Close to 1, (1 - 2q)/q loses the digits of 1 - q
    # (relative error 6e-11 at p = 1 - 1e-8), so p > 0.999 is evaluated at the exact 1 - p.
    q = np.where(q > 0.999, 1.0 - q, q)
    with np.errstate(over="ignore"):
        ratio = (1.0 - 2.0 * q) / q  # (1 - p)/p - 1: overflows only for p < 5.6e-309
    log_odds = np.where(np.isfinite(ratio), np.log1p(ratio), np.log1p(-q) - np.log(q))
    out[inner] = (1.0 - 2.0 * q) / (2.0 * log_odds)
    out[(arr == 0) | (arr == 1)] = 0.0
    return _cgf.scalar_or_array(out)


def subgaussian_tail_bound(t, sigma2, two_sided: bool = True):
    r"""Chernoff tail bound of a centred :math:`\sigma^2`-sub-Gaussian variable.

    Parameters
    ----------
    t, sigma2 : float or array_like
        Thresholds :math:`t\ge0` and variance proxy :math:`\sigma^2>0`, broadcast together.
    two_sided : bool, default True
        Bound :math:`2e^{-t^2/(2\sigma^2)}` on :math:`P(|X|\ge t)` (True) or half of it on one tail.

    Returns
    -------
    float or numpy.ndarray
        The raw bound (not capped at 1), broadcast shape of ``t`` and ``sigma2``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range, or shapes do not broadcast.

    Examples
    --------
    >>> round(subgaussian_tail_bound(2.0, 1.0), 4)
    0.2707
    """
    t_b, s_b = _cgf.broadcast(t=check_t(t), sigma2=check_sigma2(sigma2))
    return _tail_bound(t_b, s_b, check_bool(two_sided, "two_sided"))


def _tail_bound(t_b: np.ndarray, s_b: np.ndarray, two: bool):
    """Compute :func:`subgaussian_tail_bound` for checked, broadcast arguments."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        expo = t_b**2 / (2.0 * s_b)
        # t^2 or 2 sigma2 outside the normal float64 range (t > 1.3e154, t < 1.5e-154,
        # sigma2 > 9e307 or subnormal) while their ratio is not: take the ratio first there
        odd = ~((np.abs(t_b) >= _SQRT_TINY) & (np.abs(t_b) <= _SQRT_HUGE) & (s_b >= _TINY)
                & (s_b <= _HUGE / 2.0)) & (t_b != 0)
        if odd.any():
            expo = np.where(odd, 0.5 * (t_b / np.sqrt(s_b)) ** 2, expo)
        bound = np.exp(-expo)
    return _cgf.scalar_or_array((2.0 if two else 1.0) * bound)


def chernoff_lambda(t, sigma2):
    r"""Optimal Chernoff parameter :math:`\lambda^\star=t/\sigma^2`, the minimiser of the exponent.

    Parameters
    ----------
    t, sigma2 : float or array_like
        As in :func:`subgaussian_tail_bound`.

    Returns
    -------
    float or numpy.ndarray
        :math:`\lambda^\star`, broadcast.

    Raises
    ------
    TypeError, ValueError
        As :func:`subgaussian_tail_bound`, or if :math:`t/\sigma^2` overflows.

    Examples
    --------
    >>> chernoff_lambda(3.0, 2.0)
    1.5
    """
    t_b, s_b = _cgf.broadcast(t=check_t(t), sigma2=check_sigma2(sigma2))
    with np.errstate(over="ignore"):
        lam = np.asarray(t_b / s_b, dtype=float)
    _check_no_overflow(lam, "lambda* = t / sigma2")
    return _cgf.scalar_or_array(lam)


def hoeffding_proxy(a, b):
    r"""Return Hoeffding's variance proxy :math:`(b-a)^2/4` of any variable with values in :math:`[a,b]`.

    Parameters
    ----------
    a, b : float or array_like
        Finite ends of the range, :math:`a\le b`, broadcast together.

    Returns
    -------
    float or numpy.ndarray
        :math:`(b-a)^2/4`.

    Raises
    ------
    TypeError, ValueError
        If an end is not real (TypeError) or not finite, ``b < a``, shapes do not broadcast, or it overflows.

    Examples
    --------
    >>> hoeffding_proxy(0.0, 1.0)
    0.25
    >>> hoeffding_proxy([0.0, -1.0], 1.0)
    array([0.25, 1.  ])
    """
    return _hoeffding_proxy(as_real_array(a, "a"), as_real_array(b, "b"))


def _hoeffding_proxy(a_arr: np.ndarray, b_arr: np.ndarray):
    """Check the finite range [a, b] and compute :func:`hoeffding_proxy`."""
    for name, arr in (("a", a_arr), ("b", b_arr)):
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinite values; pass the finite ends of the range "
                             "(an unbounded range has no Hoeffding proxy)")
    a_b, b_b = _cgf.broadcast(a=a_arr, b=b_arr)
    if (b_b < a_b).any():
        raise ValueError("b must be >= a (the range is [a, b])")
    with np.errstate(over="ignore"):
        out = (b_b - a_b) ** 2 / 4.0
    _check_no_overflow(out, "(b - a)^2 / 4")
    return _cgf.scalar_or_array(out)


def psi2_norm(dist, *, centred: bool = False) -> float:
    r"""Orlicz norm :math:`\|X\|_{\psi_2}=\inf\{s>0:\mathbb E\,e^{X^2/s^2}\le2\}`.

    Parameters
    ----------
    dist : frozen scipy.stats distribution
    centred : bool, default False
        Compute :math:`\|X-\mathbb EX\|_{\psi_2}` instead.

    Returns
    -------
    float
        The norm; ``math.inf`` if the tails are heavier than Gaussian.

    Raises
    ------
    TypeError, ValueError
        As :func:`log_mgf`, or if ``centred`` is False and the mean exceeds :math:`10^{150}` in magnitude.

    Examples
    --------
    >>> from scipy import stats
    >>> round(psi2_norm(stats.norm(0, 1)) ** 2, 6)    # 8/3
    2.666667
    """
    dist = check_dist(dist)
    centred = check_bool(centred, "centred")
    mean, var = _cgf.moments(dist)
    _check_representable(dist, mean, var, centred_nodes=var > 0 and np.isfinite(var))
    if not (np.isfinite(mean) and np.isfinite(var)):
        return math.inf
    if var == 0:
        return 0.0 if centred else abs(mean) / math.sqrt(_cgf.LOG2)
    if not centred and abs(mean) > 1e150:
        raise ValueError(f"dist has its mean at {mean:.4g}: X^2 leaves the float64 range.  Rescale X "
                         "first (||cX||_psi2 = |c| ||X||_psi2), or pass centred=True")
    closed = _closed_form_proxy(dist)
    if closed is not None and closed.proxy == math.inf:  # t(df < inf), Laplace, ...: tails not sub-Gaussian
        return math.inf
    sd = math.sqrt(var)
    s2_tails = [tail.s2 for tail in _cgf.both_tails(dist, mean, sd).values() if tail is not None]
    if not np.isfinite(s2_tails).all():
        return math.inf
    s2_tail = max(s2_tails, default=0.0)
    nodes = _cgf.law_nodes(dist, mean, var)
    x = nodes.y if centred else nodes.y + nodes.mean
    # nodes beyond 1e153 carry weight exp(-1e306 / (2 sd^2)) for a sub-Gaussian tail with sd <= 1e150:
    # drop them before squaring (a cut at 1e150 lost 1e-6 of E e^{X^2/s^2} for N(0, 1e149^2))
    near = np.abs(x) < (1e150 if sd < 1e140 else 1e153)
    x2, logw = x[near] ** 2, nodes.logw[near]
    second_moment = float(np.dot(np.exp(logw), x2))
    lo = math.log(0.999 * math.sqrt(second_moment / _cgf.LOG2))
    if s2_tail > 0:
        lo = max(lo, 0.5 * math.log(2.0 * s2_tail) + 1e-13)
    with np.errstate(divide="ignore", over="ignore"):
        log_x2 = np.log(x2)
        top = float(np.max(logw + np.exp(log_x2 - 2.0 * lo)))
    if top > 700.0:
        # Jensen's bracket is far below the root (mass p -> 0 at a far atom: E X^2 = p, root
        # 1/sqrt(ln(1/p))) and e^{x^2/s^2} overflows there.  Every term of E e^{X^2/s^2} <= 2
        # gives s^2 >= x_i^2 / (ln 2 - ln w_i): there no term exceeds 2 and their sum is >= 2.
        lo = max(lo, 0.5 * float(np.max(log_x2 - np.log(_cgf.LOG2 - logw))))
    keep = logw + x2 * math.exp(-2.0 * lo) > -60.0  # negligible for every s >= e^lo
    root = _cgf.orlicz_log_root(logw[keep], x2[keep], 2.0, lo)
    return math.exp(lo if root is None else root)


def linear_map_proxy(w, sigma2, dependent: bool = False):
    r"""Variance proxy of :math:`w^\top Z` (or of every coordinate of :math:`W^\top Z`).

    Parameters
    ----------
    w : array_like, shape (n,) or (n, m)
        Weights; a matrix gives one proxy per column.
    sigma2 : float or array_like, shape (n,)
        Variance proxies :math:`\sigma_i^2>0` of the centred coordinates :math:`Z_i`.
    dependent : bool, default False
        False: independent coordinates, :math:`\sum_i w_i^2\sigma_i^2`; True: any dependence,
        :math:`(\sum_i|w_i|\sigma_i)^2` (Hölder; attained by :math:`Z_i=\sigma_i\operatorname{sign}(w_i)G`).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D ``w``, shape (m,) for 2-D ``w``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (Parameters), or the proxy overflows.

    Examples
    --------
    >>> linear_map_proxy([3.0, 4.0], 1.0), linear_map_proxy([3.0, 4.0], 1.0, dependent=True)
    (25.0, 49.0)
    """
    w_arr = as_real_array(w, "w")
    dep = check_bool(dependent, "dependent")
    if w_arr.ndim not in (1, 2):
        raise ValueError(f"w must be a vector (n,) or a matrix (n, m); got shape {w_arr.shape}")
    if w_arr.shape[0] == 0 or w_arr.size == 0:
        raise ValueError("w is empty; pass at least one weight")
    if not np.isfinite(w_arr).all():
        raise ValueError("w contains NaN or infinite entries")
    s2 = check_sigma2(sigma2)
    if s2.ndim > 1 or (s2.ndim == 1 and s2.shape[0] != w_arr.shape[0]):
        raise ValueError(f"sigma2 must be a scalar or have shape ({w_arr.shape[0]},) to match w; "
                         f"got shape {s2.shape}")
    s2 = np.broadcast_to(s2, (w_arr.shape[0],))
    col = w_arr if w_arr.ndim == 2 else w_arr[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        if dep:
            out = (np.abs(col) * np.sqrt(s2)[:, None]).sum(axis=0) ** 2
        else:
            out = (col**2 * s2[:, None]).sum(axis=0)
    _check_no_overflow(out, "the proxy of w'Z")
    return float(out[0]) if w_arr.ndim == 1 else out
