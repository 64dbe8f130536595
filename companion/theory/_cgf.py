"""Numerical core of the sub-Gaussian proxies (package-internal; its names carry no underscore).

Moments, quadrature nodes, tilted laws and the one-sided maximisations behind the optimal variance
proxy and ``K(lam) = log E exp(lam (X - mu))``, and the helpers the theory modules share.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
from scipy import optimize, special

from companion._validation import is_discrete

#: Tail probes sit at ``mean +- scale * 2**k`` for these k (4 to 16384 scales from the mean).
TAIL_PROBE_POWERS = np.arange(2, 15)
#: A log-log tail slope below ``2 - TAIL_TOL`` is "heavier than Gaussian"; within ``TAIL_TOL`` of 1 it
#: is an exponential tail (MGF finite only below the tail rate); below ``1 - TAIL_TOL`` the MGF is
#: infinite for every lambda pointing into that tail.
TAIL_TOL = 0.02
#: On a side with unbounded support, lambda is searched up to this many inverse standard deviations;
#: the limit lambda -> infinity is added from the tail curvature.
LAM_MAX_UNBOUNDED = 20.0
#: Smallest |lambda| * sd on the search grid; the limit lambda -> 0 (the variance) is added exactly.
LAM_MIN = 1e-4
#: Grid points per sign of lambda before the local refinement ...
GRID_POINTS = 256
#: ... fewer (not below 32) where points times nodes would exceed this.
GRID_BUDGET = 1 << 23
#: Most lattice points in the search for a discrete law's proxy (about 5 s; 2**22 points took 107 s).
PROXY_LATTICE = 1 << 18
#: Step of the double-exponential quadrature (bounded support / unbounded support).
H_BOUNDED = 1.0 / 128.0
H_UNBOUNDED = 1.0 / 256.0
#: At most this many (lambda, node) pairs are held in memory at once.
CHUNK_ELEMENTS = 1 << 21
#: Most panels of 32 sd between the mean and a far end of a continuous law's support.
MAX_PANELS = 256
#: Largest lattice (discrete law with infinite support) that is summed exactly.
MAX_LATTICE = 1 << 22

LOG2 = math.log(2.0)


def scalar_or_array(arr: np.ndarray):
    """A Python scalar for a 0-d array."""
    return arr.item() if arr.ndim == 0 else arr


def broadcast(**arrays) -> list[np.ndarray]:
    """Broadcast the named arrays, or a ValueError naming their shapes."""
    try:
        return list(np.broadcast_arrays(*arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise ValueError(f"incompatible shapes {shapes}: they do not broadcast together; pass scalars "
                         "or arrays that do (e.g. mu[:, None] with t[None, :])") from None


PHI_COEFFS = np.array([2.0 / math.factorial(k + 2) for k in range(10)])


def log_phi(z: np.ndarray) -> np.ndarray:
    """log(e^z - 1 - z), accurate for every real z (Taylor series below 0.1; -inf at 0)."""
    z = np.asarray(z, dtype=float)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        zc = np.minimum(z, 1.0)
        big = z + np.log1p(-(1.0 + z) * np.exp(-np.maximum(z, 1.0)))
        out = np.where(z > 1.0, big, np.log(np.expm1(zc) - zc))
        small = np.abs(z) < 0.1
        if small.any():
            zs = z[small]
            poly = np.zeros_like(zs)
            for c in PHI_COEFFS[::-1]:
                poly = poly * zs + c
            out[small] = 2.0 * np.log(np.abs(zs)) - LOG2 + np.log(poly)
    return out


def logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """log(sum(exp(a), axis=1)) for a 2-D array, -inf for rows that are entirely -inf."""
    m = np.max(a, axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(a - safe[:, None]), axis=1)) + safe


def log_cosh(u: np.ndarray) -> np.ndarray:
    """log(cosh(u)) without overflow."""
    a = np.abs(u)
    return a + np.log1p(np.exp(-2.0 * a)) - LOG2


def family(dist) -> str:
    """The class name of the law's generator (e.g. ``norm_gen``)."""
    return type(dist.dist).__name__


def atoms(dist) -> tuple[np.ndarray, np.ndarray]:
    """Atoms (location included) and positive probabilities of an ``rv_discrete(values=...)`` law."""
    xk, pk = (np.asarray(v, dtype=float) for v in (dist.dist.xk, dist.dist.pk))
    loc = float(dist.support()[0]) - float(np.min(xk))
    live = pk > 0
    return xk[live] + loc, pk[live]


def params(dist) -> tuple[list[float], float]:
    """The shape parameters (floats) and the location of a frozen law."""
    shapes, loc = dist.dist._parse_args(*dist.args, **dist.kwds)[:2]
    return [float(np.asarray(v)) for v in shapes], float(np.asarray(loc))


def moments(dist) -> tuple[float, float]:
    """Mean and variance (recomputed where scipy's E X^2 - (E X)^2 cancels or overflows; >= 0).

    A negative variance from scipy (integer overflow) is a ``ValueError``.
    """
    if family(dist) == "randint_gen":  # scipy's (high - low)^2 overflows int64 beyond 2**31 points
        lo, hi = (int(v) for v in dist.support())  # exact integers: float(2**62 + 2) - 2**62 is 0
        n = hi - lo + 1
        return float(lo) + 0.5 * (n - 1), float(n * n - 1) / 12.0
    if family(dist) == "kstwobign_gen":  # scipy's are 5e-12 and 1e-11 off: sqrt(pi/2) log 2, pi^2/12 - m^2
        loc, scale = (float(np.asarray(v)) for v in dist.dist._parse_args(*dist.args, **dist.kwds)[1:])
        m = math.sqrt(math.pi / 2.0) * math.log(2.0)
        return loc + scale * m, scale**2 * (math.pi**2 / 12.0 - m * m)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mean, var = float(dist.mean()), float(dist.var())
        except Exception as exc:  # a user-defined law whose generic moment integration fails
            raise ValueError(f"scipy could not compute the mean and variance of dist ({exc}); define "
                             "_stats (or _munp) on the distribution class") from exc
        if family(dist) == "rv_sample":
            x, p = atoms(dist)
            if x.size == 1:
                return float(x[0]), 0.0
            if not (np.isfinite(var) and var > 0 and mean * mean <= 1e4 * var):
                mean = float(np.dot(p, x))
                mean += float(np.dot(p, x - mean))
                var = float(np.dot(p, (x - mean) ** 2))
    if (math.isnan(mean) or math.isnan(var)) and not is_discrete(dist) and not np.isfinite(dist.support()).all():
        mean, var = _quadrature_moments(dist, mean, var)
    if (math.isnan(mean) or math.isnan(var)) and np.isfinite(dist.support()).all():
        raise ValueError(f"scipy returned mean {mean} and variance {var} for a law on the bounded support "
                         f"{tuple(float(v) for v in dist.support())} (its moment formula fails at these "
                         "parameters); pass parameters away from the family's limit, or its limit law")
    if var < 0:
        raise ValueError(f"scipy returned a negative variance ({var:.4g}) for dist (an overflow in its "
                         "moment formula); rescale or shift the law to smaller integers")
    return mean, var


def _quadrature_moments(dist, mean: float, var: float) -> tuple[float, float]:
    """Mean and variance by quadrature where scipy's are NaN on an unbounded support and no tail is
    heavier than Gaussian (rice(100): NaN from scipy was read as "no finite mean", proxy inf; it is 1);
    (mean, var) unchanged otherwise (Cauchy: NaN, no mean)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        centre = float(dist.median())
    scale = length_scale(dist, math.nan)
    if not (np.isfinite(centre) and np.isfinite(scale)):
        return mean, var
    if not all(t is None or np.isfinite(t.s2) for t in both_tails(dist, centre, scale).values()):
        return mean, var
    nodes = law_nodes(dist, centre, scale**2)
    return nodes.mean, nodes.var


def length_scale(dist, var: float) -> float:
    """A positive length scale: the standard deviation, or the IQR when the variance is infinite."""
    if np.isfinite(var) and var > 0:
        return math.sqrt(var)
    with np.errstate(all="ignore"):
        iqr = float(dist.ppf(0.75) - dist.ppf(0.25))
    return iqr if np.isfinite(iqr) and iqr > 0 else 1.0


class Tail(NamedTuple):
    """The far tail on one side: log-log slope ``beta`` of -log f, its ``rate``, and ``s2`` = lim 2K/lam^2."""

    beta: float
    rate: float
    s2: float


def neg_log_density(dist, x: np.ndarray) -> np.ndarray:
    """-log pdf (or pmf), +inf where scipy returns NaN."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if family(dist) == "betabinom_gen" and params(dist)[0][0] <= 10_000:
            val = -_betabinom_logpmf(dist, np.asarray(x, dtype=float))
        elif dist.dist.name in _LOG_DENSITIES:
            val = -_log_density(dist, np.asarray(x, dtype=float))
        else:
            val = -np.asarray(dist.logpmf(x) if is_discrete(dist) else dist.logpdf(x), dtype=float)
    return np.where(np.isnan(val), np.inf, val)


#: log densities of the standard law (shape c) for families whose scipy logpdf is log(pdf): the pdf
#: underflows near 38 sd, so the tail curvature was read there, 1e-4 off (rice(0.77): proxy 0.99996,
#: rice(0.1): 1.0007, foldnorm(0.3): 0.99978; the exact value is 1 for every shape)
_LOG_DENSITIES = {
    # x exp(-(x^2 + c^2)/2) I0(c x) = x exp(-(x - c)^2/2) i0e(c x)
    "rice": lambda z, c: np.log(z) - 0.5 * (z - c) ** 2 + np.log(special.i0e(c * z)),
    # phi(x - c) + phi(x + c) = phi(x - c) (1 + e^{-2 c x})
    "foldnorm": lambda z, c: (-0.5 * (z - c) ** 2 - 0.5 * math.log(2.0 * math.pi)
                              + np.log1p(np.exp(-2.0 * c * z))),
    "kstwobign": lambda z: _kolmogorov_logpdf(z),
}


def _kolmogorov_logpdf(z: np.ndarray) -> np.ndarray:
    """log density of the limiting Kolmogorov law, both theta series to 1e-16 (scipy's pdf is 3e-8
    too large just above 0.82, where it switches series: its quadrature summed to 1 + 9e-10)."""
    z = np.asarray(z, dtype=float)
    small = z < 1.0
    zs, zl = np.where(small, np.maximum(z, 1e-300), 1.0), np.where(small, 1.0, z)
    j2 = ((2.0 * np.arange(1, 9) - 1.0) ** 2)[:, None]  # odd squares; e^{-(j^2 - 1) pi^2/8} < 1e-80 at j = 17
    a = math.pi**2 / (8.0 * zs**2)
    lead = np.sum(np.exp(-(j2 - 1.0) * a) * (2.0 * j2 * a - 1.0), axis=0)
    low = 0.5 * math.log(2.0 * math.pi) - 2.0 * np.log(zs) - a + np.log(lead)
    k2 = (np.arange(1, 9) ** 2.0)[:, None]
    sign = np.where(np.arange(1, 9) % 2 == 1, 1.0, -1.0)[:, None]
    tail = np.sum(sign * k2 * np.exp(-2.0 * (k2 - 1.0) * zl**2), axis=0)  # k = 9: e^{-160} at z = 1
    high = math.log(8.0) + np.log(zl) - 2.0 * zl**2 + np.log(tail)
    return np.where(z > 0, np.where(small, low, high), -np.inf)


def _log_density(dist, x: np.ndarray) -> np.ndarray:
    """log pdf of a family in _LOG_DENSITIES (support [loc, inf))."""
    shapes, loc, scale = dist.dist._parse_args(*dist.args, **dist.kwds)
    loc, scale = float(np.asarray(loc)), float(np.asarray(scale))
    z = (x - loc) / scale
    inside = z >= 0
    out = _LOG_DENSITIES[dist.dist.name](np.where(inside, z, 1.0), *(float(np.asarray(v)) for v in shapes))
    return np.where(inside, out - math.log(scale), -np.inf)


def _betabinom_logpmf(dist, x: np.ndarray) -> np.ndarray:
    """log pmf of betabinom(n, a, b) as a product of ratios, each taken relative to a + b.

    scipy's betaln(k + a, n - k + b) - betaln(a, b) cancels: its pmf sums to 1 + 3e-9 at a = b = 1e6
    and to 11 at a = b = 1e300 (Binomial(10, 1/2) in the limit)."""
    (n, a, b), loc = params(dist)
    n_int, ab = int(n), a + b
    i = np.arange(n_int)
    zero = np.zeros(1)
    sa = np.concatenate([zero, np.cumsum(np.log(a / ab + i / ab))])  # sum_{i<k} log((a + i)/(a + b))
    sb = np.concatenate([zero, np.cumsum(np.log(b / ab + i / ab))])
    sc = float(np.sum(np.log1p(i / ab)))
    k = x - loc
    inside = (k >= 0) & (k <= n) & (k == np.round(k))
    kk = np.where(inside, k, 0).astype(np.int64)
    out = (special.gammaln(n + 1) - special.gammaln(kk + 1.0) - special.gammaln(n - kk + 1.0)
           + sa[kk] + sb[n_int - kk] - sc)
    return np.where(inside, out, -np.inf)


def side_tail(dist, side: int, mean: float, scale: float) -> Tail:
    """Classify the tail of ``dist`` on ``side`` (+1 right, -1 left); the support is unbounded there."""
    discrete = is_discrete(dist)
    unit = max(scale, 1.0) if discrete else scale
    x = mean + side * (unit * 2.0 ** TAIL_PROBE_POWERS)
    if discrete:
        x = np.round(x)
    ref = np.round(mean) if discrete else mean
    ell = neg_log_density(dist, x)
    ell_ref = neg_log_density(dist, np.array([ref]))[0]
    if not np.isfinite(ell_ref):
        finite = ell[np.isfinite(ell)]
        ell_ref = float(finite.min()) if finite.size else 0.0
    delta = ell - ell_ref
    dist_from_mean = np.abs(x - mean)
    good = np.flatnonzero(np.isfinite(delta) & (delta > 0))
    # the outermost pair of consecutive probes with a finite, positive excess
    pair = next(((i - 1, i) for i in good[::-1] if i - 1 in good), None)
    if pair is None:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = np.asarray(dist.logpmf(x) if discrete else dist.logpdf(x), dtype=float)
        if (raw == -np.inf).all() or (np.isinf(ell[-1]) and np.isfinite(ell[0])):
            # the density vanishes in the far tail: lighter than any Gaussian
            return Tail(beta=np.inf, rate=np.inf, s2=0.0)
        # no decay measurable (flat or increasing density far out): treat as heavy
        return Tail(beta=0.0, rate=0.0, s2=np.inf)
    i, j = pair
    beta = math.log(delta[j] / delta[i]) / math.log(dist_from_mean[j] / dist_from_mean[i])
    rate = (ell[j] - ell[i]) / (dist_from_mean[j] - dist_from_mean[i])
    if beta < 2.0 - TAIL_TOL:
        # a log term (the x^(df-1) of chi(1e-6), nakagami(1e-6), rice(1e-300)) can mask a Gaussian
        # tail at these probes: look again further out with a slope that ignores additive terms
        far = _far_tail(dist, side, mean, unit, discrete)
        if far is None:
            return Tail(beta=beta, rate=rate, s2=np.inf)
        beta, x, ell = far
        i, j = 0, 1
        dist_from_mean = np.abs(x - mean)
    if beta > 2.0 + TAIL_TOL:
        return Tail(beta=beta, rate=rate, s2=0.0)
    # Gaussian-like tail: the curvature of -log density gives lim 2K/lambda^2 = 1/ell''
    h = max(1.0, round(dist_from_mean[j] / 64.0)) if discrete else dist_from_mean[j] / 64.0
    def curvature(xc: float, h: float) -> float:
        e3 = neg_log_density(dist, np.array([xc - h, xc, xc + h]))
        return (e3[0] - 2.0 * e3[1] + e3[2]) / h**2

    far = curvature(x[j], h)
    # the step halves the distance from where a power factor sits (as in _far_tail): the support's
    # other end if finite, else the mean (chi(100) measured from its mean 10: proxy 1 - 1.7e-9)
    end = float(dist.support()[0 if side > 0 else 1])
    x_near = (end + 0.5 * (x[j] - end)) if np.isfinite(end) and not discrete else x[i]
    near = curvature(x_near, max(1.0, round(h / 2.0)) if discrete else h / 2.0)
    if not (np.isfinite(far) and far > 0):
        return Tail(beta=beta, rate=rate, s2=np.inf)
    # ell'' = 1/s2 + c/x^2 (e.g. a log x term): Richardson's step between x and 2x removes c
    extrapolated = (4.0 * far - near) / 3.0 if np.isfinite(near) else far
    second = extrapolated if extrapolated > 0 else far
    return Tail(beta=beta, rate=rate, s2=1.0 / second)


def _far_tail(dist, side: int, mean: float, unit: float, discrete: bool):
    """(beta, x, ell) at two points (d/2 and d from the mean) far out, if the tail beyond the usual
    probes is Gaussian or lighter, else None.

    Probes at d_k = unit q^k (q = sqrt 2, or 2 on a lattice); for ell = a d^b + c1 d + c2 log d + c0 the differences
    D_k = ell_{k+1} - ell_k, E_k = D_{k+1} - q D_k, F_k = E_{k+1} - E_k have F_{k+1}/F_k = q^b exactly,
    whatever c0, c1, c2 (a mean offset, the x^(df-1) factor of chi).  The first window where F
    exceeds 1e6 is used, else the outermost one with finite values.
    """
    q = 2.0 if discrete else math.sqrt(2.0)  # a lattice: integer probes, exact doubling from an integer
    if discrete:
        mean, unit = float(np.round(mean)), float(math.ceil(unit))
    with np.errstate(over="ignore"):
        d = unit * q ** np.arange(0, 2100)
        d = d[np.isfinite(mean + side * d) & (not discrete or d < 2.0**53)]
    x = mean + side * d
    ell = neg_log_density(dist, x)
    with np.errstate(all="ignore"):
        f = np.diff(np.diff(ell)[1:] - q * np.diff(ell)[:-1])  # F_k from ell_k .. ell_{k+3}
        # F must stand out of the rounding of ell (a linear ell, Laplace, has F = 0 up to 1e-13)
        floor = 1e-8 * np.abs(ell[4:])  # F_k, F_{k+1} come from ell_k .. ell_{k+4} (increasing)
        ok = np.isfinite(f[:-1]) & np.isfinite(f[1:]) & (f[:-1] > floor) & (f[1:] > floor)
    starts = np.flatnonzero(ok)
    if starts.size == 0:
        return None
    big = starts[f[starts] > 1e6]
    k = int(big[0] if big.size else starts[-1])
    beta = math.log(f[k + 1] / f[k]) / math.log(q)
    if beta < 2.0 - TAIL_TOL:
        return None
    far = d[k + 3]  # curvature probes at far +- far/64 stay inside the window's finite values
    # Richardson's step (x, 2x) removes c/x^2 from ell'' when x is measured from where the power
    # factor sits: the support's other end if finite (chi, rice: 0), else the mean
    end = float(dist.support()[0 if side > 0 else 1])
    origin = end if np.isfinite(end) else mean
    xs = origin + (mean + side * far - origin) * np.array([0.5, 1.0])
    if discrete:
        xs = np.round(xs)
    return beta, xs, neg_log_density(dist, xs)


def both_tails(dist, mean: float, scale: float) -> dict[int, Tail | None]:
    """The Tail of each unbounded side (+1, -1), None on a bounded side."""
    lower, upper = dist.support()
    return {+1: side_tail(dist, +1, mean, scale) if np.isinf(upper) else None,
            -1: side_tail(dist, -1, mean, scale) if np.isinf(lower) else None}


class Nodes(NamedTuple):
    """A law as weighted nodes: centred ``y``, log-weights ``logw`` (summing to 1), ``mean``, ``var``."""
    y: np.ndarray  # centred nodes, x - mean (mean taken over the nodes themselves)
    logw: np.ndarray  # log probability weights, logsumexp(logw) = 0
    mean: float  # mean over the nodes (the centring used)
    var: float  # variance over the nodes
    cut: tuple[float, float] | None = None  # a lattice cut short: (signed distance of its end, mass beyond)


def finalise(x: np.ndarray, logw: np.ndarray, what: str, whole: bool = False) -> Nodes:
    """Normalise the weights (a ValueError if more than 1e-9 of the mass is missed); centre the nodes.

    ``whole``: the nodes are every point of a finite lattice, so a wrong total is scipy's pmf's."""
    keep = np.isfinite(logw) & np.isfinite(x)
    x, logw = x[keep], logw[keep]
    if x.size == 0:
        raise ValueError(f"the {what} has no mass on its support; check the distribution's parameters")
    total = special.logsumexp(logw)
    if abs(math.expm1(total)) > 1e-9 and whole:
        raise ValueError(f"scipy's pmf of dist sums to {math.exp(total):.10g}, not 1, over its whole "
                         "(finite) support: its log-pmf loses accuracy at these parameters (large "
                         "integer shapes), so moments from it would be inaccurate; use a limit law "
                         "(binomial, Poisson or normal) or pass an rv_discrete of exactly computed "
                         "probabilities")
    if abs(math.expm1(total)) > 1e-9:
        raise ValueError(f"quadrature of the {what} recovers a total mass of {math.exp(total):.10g}, not 1, "
                         "so its moments would be inaccurate (a peak narrower than the nodes resolve, or "
                         "a density scipy cannot evaluate); rescale X or pass an rv_discrete of its atoms")
    logw = logw - total
    w = np.exp(logw)
    live = w > 0  # far nodes with underflowing weight must not meet x**2 = inf (0 * inf)
    mean = float(np.dot(w[live], x[live]))
    y = x - mean
    y = y - float(np.dot(w[live], y[live]))  # second pass removes the rounding of the first
    with np.errstate(over="ignore"):  # an infinite variance (crystalball(2, 3)) is inf, not a warning
        var = float(np.dot(w[live], y[live] ** 2))
    return Nodes(y=y, logw=logw, mean=mean, var=var)


def max_tilt(y: np.ndarray, lam_range: tuple[float, float]) -> np.ndarray:
    """Largest lambda * y over lambda in [-lam_range[0], lam_range[1]], node by node."""
    return lam_range[1] * np.maximum(y, 0.0) + lam_range[0] * np.maximum(-y, 0.0)


def prune(nodes: Nodes, tilt: np.ndarray) -> Nodes:
    """Keep the nodes whose tilted log-weight ``logw + tilt`` is above -60 (the rest add < 1e-26)."""
    keep = nodes.logw + tilt > -60.0
    return nodes._replace(y=nodes.y[keep], logw=nodes.logw[keep])


def check_cut(nodes: Nodes, lam: np.ndarray, k: np.ndarray) -> None:
    """ValueError where the tail beyond a cut lattice (``Nodes.cut``) could move K(lambda) by more than
    1e-10 relative: its tilted mass is at most ``mass e^{lambda d}`` (the atom of ``tail_atom`` holds the
    tail's mass and first moment exactly), which is not small for |lambda| below ~30 / d.  A lambda
    pointing towards the cut is not checked here: ``lattice_range`` found the tilted law decayed there."""
    if nodes.cut is None or nodes.cut[1] == 0.0:
        return
    d, mass = nodes.cut
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        bound = mass * np.exp(lam * d - k) / np.abs(k)
    bad = lam[(lam * d < 0) & ~(bound <= 1e-10)]
    if bad.size:
        raise ValueError(f"dist has a power-law tail beyond the {abs(d):.4g}-point lattice holding "
                         f"{mass:.3g} of its mass; at lambda = {bad[np.argmin(np.abs(bad))]:.4g} that "
                         f"tail could move K(lambda) by more than 1e-10 relative; use "
                         f"|lambda| >= {30.0 / abs(d):.2g}")


def lattice_range(dist, mean: float, scale: float, side: int, lam_abs: float) -> tuple[float, bool]:
    """Far end of the lattice on ``side`` where the pmf tilted by ``e^{lam_abs |k - mean|}`` has decayed,
    and whether the lattice was cut there (the pmf itself not yet 2000 nats down: a power-law tail).

    A ValueError if the tilted pmf has not decayed within the lattice budget (the omitted tail would
    change K(lambda) by an unknown amount)."""
    start = math.floor(mean) if side > 0 else math.ceil(mean)
    width = 64.0 * max(scale, 1.0)
    half = MAX_LATTICE // 2 - 1  # each side gets at most half of the lattice budget
    while True:
        capped = width >= half
        if capped:
            end = float(start + side * half)
        else:
            end = math.ceil(mean + width) if side > 0 else math.floor(mean - width)
        k = np.arange(min(start, end), max(start, end) + 1.0)
        logp = -neg_log_density(dist, k)
        tilted = logp + lam_abs * np.abs(k - mean)
        e, i = (-1, -2) if side > 0 else (0, 1)
        edge, inner, edge_p = tilted[e], tilted[i], logp[e]
        decayed = edge < np.max(tilted) - 60.0 and edge < inner
        if decayed and edge_p < np.max(logp) - 2000.0:
            return float(end), False
        if capped:
            if lam_abs > 0 and not decayed:
                raise ValueError(f"the law tilted by |lambda| = {lam_abs:.6g} has not decayed within {half} "
                                 "lattice points of the mean (|lambda| too large, or too close to the "
                                 "rate of the tail), so K(lambda) cannot be computed to 1e-9; use a "
                                 "smaller |lambda|")
            return float(end), True
        width *= 2.0


def tail_atom(dist, mean: float, x: np.ndarray, logw: np.ndarray, side: int):
    """Add the mass beyond the cut end of a lattice (scipy's sf or cdf there) as one atom, placed where
    it restores the law's first moment about ``mean`` (yulesimon(1.5): the omitted power-law tail, 4e-10
    of the mass, held 7e-4 of the mean; K(-0.3) was 2e-3 off).  Beyond the cut the tilted law has decayed
    (``lattice_range``), so the atom changes K(lambda) by less than that tail's tilted mass."""
    edge = float(x[-1] if side > 0 else x[0])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mass = float(dist.sf(edge) if side > 0 else dist.cdf(edge - 1.0))
    if not mass > 0.0:
        return x, logw
    terms = (x - mean) * np.exp(logw)
    missed = -math.fsum(terms)  # first moment about the mean beyond the cut
    noise = 1e-13 * math.fsum(np.abs(terms))  # scipy's pmf to ~1e-15 relative, summed
    # yulesimon(3): 7e-19 of the mass, but 2e-12 of the mean, beyond the cut; geom(1e-4): e^-210 of the
    # mass, and its first moment below the rounding of the sum (an atom at missed/mass flew off to 1e200)
    where = mean + missed / mass if missed > noise else edge + side
    where = max(where, edge + 1.0) if side > 0 else min(where, edge - 1.0)
    return np.append(x, where), np.append(logw, math.log(mass))


def law_nodes(dist, mean: float, var: float, lam_range: tuple[float, float] = (0.0, 0.0),
              split_at_mean: bool = False) -> Nodes:
    """Weighted nodes of ``dist``; ``lam_range`` sizes the lattice of a discrete law with infinite
    support, ``split_at_mean`` adds a panel boundary at the mean of a continuous law."""
    lower, upper = (float(v) for v in dist.support())
    scale = length_scale(dist, var)
    if is_discrete(dist):
        if hasattr(dist.dist, "xk"):  # rv_discrete(values=...): the atoms themselves (plus loc)
            x = atoms(dist)[0]
        else:
            lo, cut_lo = (lattice_range(dist, mean, scale, -1, lam_range[0]) if np.isinf(lower)
                          else (lower, False))
            hi, cut_hi = (lattice_range(dist, mean, scale, +1, lam_range[1]) if np.isinf(upper)
                          else (upper, False))
            if hi - lo + 1 > MAX_LATTICE:
                raise ValueError(f"the support of dist has {hi - lo + 1:.4g} points, more than "
                                 f"{MAX_LATTICE}; use a closed form or a smaller law")
            x = np.arange(lo, hi + 1.0)
            logw = -neg_log_density(dist, x)
            if cut_lo and cut_hi:
                raise ValueError("dist has slowly decaying (power-law) tails on both sides; the mass "
                                 f"beyond {MAX_LATTICE // 2 - 1} lattice points cannot be split between them")
            if not (cut_lo or cut_hi):
                return finalise(x, logw, "discrete law", whole=np.isfinite([lower, upper]).all())
            edge = hi if cut_hi else lo
            x, logw = tail_atom(dist, mean, x, logw, +1 if cut_hi else -1)
            nodes = finalise(x, logw, "discrete law")
            mass = float(np.exp(logw[-1])) if x.size > hi - lo + 1 else 0.0
            return nodes._replace(cut=(edge - nodes.mean, mass))
        return finalise(x, -neg_log_density(dist, x), "discrete law")

    cuts = set(breakpoints(dist, lower, upper))
    # a finite end far from the mean (foldnorm(100), chi(1e5), rice(1000)): the peak, and the tilted
    # law on the way to that end, fall between the nodes of one panel (those laws lost up to all of
    # their mass, or K(-185) of rice(1000) was 0.5 too large): panels of 32 sd from the mean to the end
    for end in (lower, upper):
        reach = abs(end - mean)
        if np.isfinite(end) and reach > 8.0 * scale:
            if reach > 32.0 * MAX_PANELS * scale:
                raise ValueError(f"dist has an end of its support {reach / scale:.4g} standard deviations "
                                 f"from its mean, beyond {32 * MAX_PANELS}: quadrature cannot follow the law "
                                 "tilted towards that end; pass a normal approximation or shift/rescale")
            steps = np.arange(1.0, math.ceil(reach / (32.0 * scale)))
            cuts.update([mean, *(mean + math.copysign(32.0 * scale, end - mean) * steps)])
    if split_at_mean and lower < mean < upper:
        cuts.add(mean)
    cuts = {c for c in cuts if lower < c < upper}
    points = [lower, *sorted(cuts), upper]
    xs, logws = [], []
    for lo, hi in zip(points[:-1], points[1:]):
        x, logjac = panel(lo, hi, mean, scale, ends=(lo == lower, hi == upper))
        xs.append(x)
        logws.append(logjac - neg_log_density(dist, x))
    try:
        x, logw = end_atoms(dist, lower, upper, np.concatenate(xs), np.concatenate(logws))
    except ValueError:
        sub = _sine_nodes(dist)
        if sub is None:
            raise
        x, logw = sub
    return finalise(x, logw, "continuous law")


def _sine_nodes(dist) -> tuple[np.ndarray, np.ndarray] | None:
    """Nodes of a beta-type law (beta, arcsine, rdist) singular at both ends, by x = lo + w sin^2(theta):
    the density 2 sin^(2a-1) cos^(2b-1) / B(a, b) in theta is read from theta itself, never from an x
    rounded to an end (arcsine(loc=3) and rdist(1.6) missed 1e-5 and 1e-8 of the mass at both ends
    and were refused); None for other laws, or a, b < 0.05 (mass beyond theta = 1e-300)."""
    shapes, loc, scale = dist.dist._parse_args(*dist.args, **dist.kwds)
    shapes = [float(np.asarray(v)) for v in shapes]
    loc, scale = float(np.asarray(loc)), float(np.asarray(scale))
    name = dist.dist.name
    if name == "beta":
        (a, b), lo, width = shapes, loc, scale
    elif name == "arcsine":
        a, b, lo, width = 0.5, 0.5, loc, scale
    elif name == "rdist":
        a, b, lo, width = 0.5 * shapes[0], 0.5 * shapes[0], loc - scale, 2.0 * scale
    else:
        return None
    if min(a, b) < 0.05:
        return None
    half_pi = 0.5 * math.pi
    t = np.arange(-math.asinh(350.0 / half_pi), math.asinh(350.0 / half_pi) + H_BOUNDED / 2, H_BOUNDED)
    u = half_pi * np.sinh(t)
    near = half_pi * special.expit(-2.0 * np.abs(u))  # theta's distance to its nearer end, 0 or pi/2
    sin_t = np.where(t < 0, np.sin(near), np.cos(near))
    cos_t = np.where(t < 0, np.cos(near), np.sin(near))
    x = np.where(t < 0, lo + width * sin_t**2, (lo + width) - width * cos_t**2)
    with np.errstate(divide="ignore"):
        logw = (math.log(2.0) - special.betaln(a, b) + (2.0 * a - 1.0) * np.log(sin_t)
                + (2.0 * b - 1.0) * np.log(cos_t) + math.log(H_BOUNDED) + math.log(half_pi / 2.0)
                + math.log(half_pi) + np.log(np.cosh(t)) - 2.0 * log_cosh(u))
    return x, logw


def end_atoms(dist, lower: float, upper: float, x: np.ndarray, logw: np.ndarray):
    """Put the mass the nodes miss within float64 rounding of a finite end (a density singular there,
    e.g. beta(5, 0.1)) on that end; a ValueError if both ends miss more than 1e-9 (the share of each
    is then not known well enough)."""
    live = np.isfinite(logw) & np.isfinite(x)
    if not live.any():
        return x, logw
    missing = -math.expm1(float(special.logsumexp(logw[live])))
    if not missing > 1e-13:
        return x, logw
    xl, wl = x[live], np.exp(logw[live])
    near = [_end_mass(dist.cdf, xl, wl, +1) if np.isfinite(lower) else 0.0,
            _end_mass(dist.sf, xl, wl, -1) if np.isfinite(upper) else 0.0]
    total = sum(near)
    if not 0.5 * missing <= total <= 2.0 * missing:  # not (only) mass at the ends: finalise raises
        return x, logw
    if min(near) > 1e-9:
        raise ValueError(f"dist has a density singular at both ends of its support, with masses "
                         f"{near[0]:.3g} and {near[1]:.3g} closer to them than float64 quadrature nodes "
                         "reach; its moments cannot be computed to 1e-9 (beta(a, b) with a, b < 0.03?): use "
                         "a Bernoulli limit or an rv_discrete approximation")
    with np.errstate(divide="ignore"):
        extra = np.log(missing * np.array(near) / total)
    return np.concatenate([x, [lower, upper]]), np.concatenate([logw, extra])


def _end_mass(cdf, x: np.ndarray, w: np.ndarray, side: int) -> float:
    """Mass beyond the outermost node towards one end (cdf: dist.cdf, side +1; dist.sf, side -1):
    cdf(a) less the node mass beyond a, at the outermost node a where scipy's cdf is positive (it
    underflows near the end for chi(1e-6): P(X < 1e-300) = 0.9993 but cdf(1e-300) = 0)."""
    order = np.argsort(side * x)

    def c(i: int) -> float:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(cdf(x[order[i]]))
    lo, hi = 0, x.size - 1  # bisection for the first node with c > 0 (c is monotone along order)
    if c(lo) > 0 or not c(hi) > 0:
        return max(0.0, c(lo)) if c(lo) > 0 else 0.0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if c(mid) > 0 else (mid, hi)
    mass = c(hi) - float(np.sum(w[order[:hi]]))
    # below 1e-14 the difference is the cdf's rounding (argus(10): 4.5e-17 put on x = 0, which the
    # tilt e^{76} turned into a proxy 40% too large): no atom
    return mass if mass > 1e-14 else 0.0


def breakpoints(dist, lower: float, upper: float) -> list[float]:
    """Interior points where a known family's density has a kink or a singularity."""
    name = dist.dist.name
    try:
        shapes, loc, scale = dist.dist._parse_args(*dist.args, **dist.kwds)
    except Exception:  # pragma: no cover - a user-defined generator with unusual arguments
        return []
    shapes = [float(np.asarray(v)) for v in shapes]
    loc, scale = float(np.asarray(loc)), float(np.asarray(scale))
    if name == "triang":
        pts = [loc + shapes[0] * scale]
    elif name == "trapezoid":
        pts = [loc + shapes[0] * scale, loc + shapes[1] * scale]
    elif name in ("laplace", "laplace_asymmetric", "dweibull", "dgamma", "gennorm", "dpareto_lognorm"):
        pts = [loc]
    elif name == "loglaplace":  # c x^(c-1)/2 below 1, c x^(-c-1)/2 above
        pts = [loc + scale]
    elif name == "crystalball":  # Gaussian above -beta, a power law below (K of (2, 3) lost 4e-9 of the mass)
        pts = [loc - shapes[0] * scale]
    else:
        pts = []
    return sorted(p for p in set(pts) if lower < p < upper)


def panel(lo: float, hi: float, centre: float, scale: float,
          ends: tuple[bool, bool] = (True, True)) -> tuple[np.ndarray, np.ndarray]:
    """Double-exponential nodes and log-weights on one panel [lo, hi] (tanh-sinh, exp-sinh or sinh-sinh);
    ``ends``: whether lo, hi are ends of the support (else interior cuts, where the density is finite)."""
    half_pi = 0.5 * math.pi
    bounded = np.isfinite(lo) and np.isfinite(hi)
    h = H_BOUNDED if bounded else H_UNBOUNDED
    tmax = math.asinh((350.0 if bounded else 600.0) / half_pi)
    t = np.arange(-tmax, tmax + h / 2, h)
    u = half_pi * np.sinh(t)
    log_dt = np.log(np.cosh(t))
    if bounded:
        length = hi - lo
        frac = special.expit(-2.0 * np.abs(u))  # 1 / (1 + e^{2|u|}): distance to the nearer end
        x = np.where(t < 0, lo + length * frac, hi - length * frac)
        logjac = math.log(length / 2.0) + math.log(half_pi) + log_dt - 2.0 * log_cosh(u)
        # near an end x is rounded to that end's float grid: nodes within 1e6 grid steps of it are
        # dropped (end_atoms puts their mass on the end); the rest are moved to the float x (its true
        # fraction, t and Jacobian), so a singular density is weighted where it is read
        dist_end = np.where(t < 0, x - lo, hi - x)
        inside = dist_end > 1e6 * np.where(t < 0, np.spacing(abs(lo)), np.spacing(abs(hi)))
        # at an interior cut (triang's peak at loc + c) nothing is put on an end: keep those nodes
        # (triang(0.157, loc=3) lost 1.7e-9 of its mass there and was refused)
        inside |= np.where(t < 0, not ends[0], not ends[1]) & (dist_end > 0)
        near = (frac < 1e-8) & inside
        if near.any():
            f = dist_end[near] / length
            t_f = np.arcsinh((0.5 * np.log1p(-f) - 0.5 * np.log(f)) / half_pi)
            logjac[near] = (math.log(length / 2.0) + math.log(half_pi) + np.log(np.cosh(t_f))
                            + np.log(4.0 * f) + np.log1p(-f))
    elif np.isinf(lo) and np.isinf(hi):
        with np.errstate(over="ignore"):
            x = centre + scale * np.sinh(u)
        logjac = math.log(scale) + log_cosh(u) + math.log(half_pi) + log_dt
        inside = np.isfinite(x)
    else:
        origin, side = (lo, +1.0) if np.isfinite(lo) else (hi, -1.0)
        with np.errstate(over="ignore"):
            x = origin + side * scale * np.exp(u)
        logjac = math.log(scale) + u + math.log(half_pi) + log_dt
        inside = np.isfinite(x) & (x != origin)
    return x[inside], math.log(h) + logjac[inside]


def orlicz_log_root(logw: np.ndarray, values: np.ndarray, power: float, log_lo: float) -> float | None:
    """Root in log s > log_lo of log E e^{values / s^power} = log 2 (Brent), None if at log_lo already."""
    def excess(log_s: float) -> float:
        return float(special.logsumexp(logw + values * math.exp(-power * log_s))) - LOG2

    if excess(log_lo) <= 0:
        return None
    log_hi = log_lo + 0.5
    while excess(log_hi) > 0:
        log_hi += 0.5
    return optimize.brentq(excess, log_lo, log_hi, xtol=1e-14, rtol=1e-13)


def cgf_nodes(nodes: Nodes, lam: np.ndarray) -> np.ndarray:
    """K(lambda) = log(1 + E[e^{lam Y} - 1 - lam Y]) over the nodes, for a 1-D array ``lam``."""
    out = np.empty(lam.shape, dtype=float)
    step = max(1, CHUNK_ELEMENTS // max(1, nodes.y.size))
    for s in range(0, lam.size, step):
        lc = lam[s : s + step]
        terms = nodes.logw[None, :] + log_phi(lc[:, None] * nodes.y[None, :])
        out[s : s + step] = np.logaddexp(0.0, logsumexp_rows(terms))
    return out


def maximise_side(nodes: Nodes, lam_lo: float, lam_hi: float, side: int) -> tuple[float, float, bool]:
    """max over lam in [lam_lo, lam_hi] (times ``side``) of 2K/lam^2: (value, argmax, at_upper_end)."""
    # a large lattice (betabinom(258085, 1, 1): 15-60 s) gets a coarser grid, at least 32 points;
    # Brent's refinement below still reaches the maximiser to 1e-11 in log lambda
    points = max(32, min(GRID_POINTS, GRID_BUDGET // max(1, nodes.y.size)))
    grid = side * np.geomspace(lam_lo, lam_hi, points)
    prof = 2.0 * cgf_nodes(nodes, grid) / grid**2
    i = int(np.argmax(prof))

    def neg_profile(v: float) -> float:
        lam = side * math.exp(v)
        return -2.0 * float(cgf_nodes(nodes, np.array([lam]))[0]) / lam**2

    lo_i, hi_i = max(i - 1, 0), min(i + 1, grid.size - 1)
    bounds = (math.log(abs(grid[lo_i])), math.log(abs(grid[hi_i])))
    res = optimize.minimize_scalar(neg_profile, bounds=bounds, method="bounded", options={"xatol": 1e-11})
    best_val, best_lam = float(prof[i]), float(grid[i])
    if -res.fun > best_val:
        best_val, best_lam = float(-res.fun), side * math.exp(res.x)
    return best_val, best_lam, i == grid.size - 1
