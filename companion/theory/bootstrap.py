"""Bootstrap intervals: the one resampling layer behind every interval a chapter prints.

Both functions are deterministic for a given seed (default 0), so a printed interval is reproducible.
"""

from __future__ import annotations

import warnings

import numpy as np

from companion._validation import as_float64, as_generator, check_int, check_real, real_array

__all__ = ["bootstrap_interval", "bootstrap_ratio", "rank_pvalue", "maxstat_pvalues",
           "crossed_bootstrap"]


def bootstrap_interval(x, level: float = 0.95, n_boot: int = 2000, rng=None):
    """Mean over axis 0 with a percentile bootstrap interval (resampling rows, e.g. prompts).

    Parameters
    ----------
    x : array_like, shape ``[n]`` or ``[n, k]``
        One row per prompt (n >= 2); columns are resampled together (paired comparison: pass differences).
    level : float, default 0.95
        Coverage of the interval, in (0, 1).
    n_boot : int, default 2000
        Bootstrap resamples (at least 10).
    rng : None, int or numpy.random.Generator
        Source of randomness; default seed 0 (reproducible intervals).

    Returns
    -------
    tuple of float or numpy.ndarray
        ``(mean, lo, hi)``: the mean over rows and the interval's ends (shape ``[k]`` for 2-D ``x``).

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (``x`` needs 2 finite rows).

    Examples
    --------
    >>> m, lo, hi = bootstrap_interval(np.arange(10.0))
    >>> float(m), bool(lo < 4.5 < hi)
    (4.5, True)
    """
    a = as_float64(x, "x")
    if a.ndim not in (1, 2) or a.shape[0] < 2:
        raise ValueError(f"x must have shape [n] or [n, k] with n >= 2, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("x contains NaN or infinite values")
    level = check_real(level, "level", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    n_boot = check_int(n_boot, "n_boot", 10)
    gen = as_generator(0 if rng is None else rng)
    boots = a[gen.integers(0, a.shape[0], size=(n_boot, a.shape[0]))].mean(axis=1)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=0)
    mean = a.mean(axis=0)
    if a.ndim == 1:
        return float(mean), float(lo), float(hi)
    return mean, lo, hi


def bootstrap_ratio(num, den=None, n_boot: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    r"""Ratio of sums with a two-way bootstrap interval (directions and prompts resampled independently).

    Parameters
    ----------
    num : array_like, shape ``[n_directions, n_prompts]``
    den : array_like of the same shape, optional
        Denominator table; default all ones (the statistic is then the mean of ``num``).
    n_boot, seed : int, default 2000 and 0
        Bootstrap resamples and the seed of the resampling.
    level : float in (0, 1), default 0.95
        Coverage of the interval.

    Returns
    -------
    tuple of float
        ``(estimate, low, high)``: :math:`\sum num/\sum den` and its percentile interval.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range (finite 2-D tables of one shape).

    Examples
    --------
    >>> bootstrap_ratio(np.ones((3, 4)))
    (1.0, 1.0, 1.0)
    """
    a = real_array("num", num, 2)
    b = np.ones_like(a) if den is None else real_array("den", den, 2)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"num and den must be [n_directions, n_prompts] of one shape, got "
                         f"{a.shape} and {b.shape}")
    n_boot = check_int(n_boot, "n_boot", 1)
    seed = check_int(seed, "seed", 0)
    level = check_real(level, "level", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    rng = np.random.default_rng(seed)
    nd, npr = a.shape
    cd = rng.multinomial(nd, np.full(nd, 1 / nd), size=n_boot).astype(float)
    cp = rng.multinomial(npr, np.full(npr, 1 / npr), size=n_boot).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = np.einsum("ki,ib,kb->k", cd, a, cp) / np.einsum("ki,ib,kb->k", cd, b, cp)
    q = (1 - level) / 2
    lo, hi = np.nanquantile(stats, [q, 1 - q])
    return float(a.sum() / b.sum()), float(lo), float(hi)


def rank_pvalue(stat, null):
    r"""Rank p-value of a statistic against null draws: :math:`(1 + \#\{\text{null} \ge T\})/(n+1)`.

    If ``stat`` and the ``n`` null draws are exchangeable, :math:`P(p \le k/(n+1)) = k/(n+1)`
    exactly for ``k = 1..n+1`` (ties only make it smaller): with 99 nulls a test at 0.05 has
    level exactly 0.05.

    Parameters
    ----------
    stat : float or array_like, shape ``[m]``
        The statistic (one per column).
    null : array_like, shape ``[n]`` or ``[n, m]``
        ``n >= 1`` null draws (per column).

    Returns
    -------
    float or numpy.ndarray
        The p-value(s), in ``[1/(n+1), 1]``.

    Raises
    ------
    TypeError, ValueError
        Non-real input; shapes that do not match; NaN.

    Examples
    --------
    >>> rank_pvalue(3.0, [0.0, 1.0, 4.0])
    0.5
    """
    t = as_float64(stat, "stat")
    y = as_float64(null, "null")
    if t.ndim > 1 or y.ndim != t.ndim + 1 or y.shape[0] < 1 or y.shape[1:] != t.shape:
        raise ValueError(f"null must have shape [n >= 1, *{t.shape}], got {y.shape}")
    if not (np.isfinite(t).all() and np.isfinite(y).all()):
        raise ValueError("stat and null must be finite")
    p = (1 + (y >= t).sum(0)) / (y.shape[0] + 1)
    return float(p) if t.ndim == 0 else p


def maxstat_pvalues(stats, index: int = 0):
    r"""Family-wise adjusted p-values over columns by the max-statistic (Westfall-Young style).

    Each column (e.g. a layer) is standardised by its mean and standard deviation over *all*
    rows (the tested row and the nulls, so the procedure treats every row alike); each row's
    maximum over columns forms the null distribution of the maximum; column ``l`` of the tested
    row gets :math:`p_l = (1 + \#\{j \ne i: \max_{l'} z_{jl'} \ge z_{il}\})/n`.  If the
    ``n`` rows are exchangeable, the probability that *any* :math:`p_l \le k/n` is
    at most ``k/n``: the set :math:`\{l: p_l \le 0.05\}` is empty with probability
    at least 0.95 under the null (for ``n = 100`` exactly 0.95 without ties).

    Parameters
    ----------
    stats : array_like, shape ``[n, m]``
        One row per direction (the tested one and ``n - 1 >= 1`` nulls), one column per test.
    index : int, default 0
        The tested row.

    Returns
    -------
    numpy.ndarray, shape ``[m]``

    Raises
    ------
    TypeError, ValueError
        Non-real input, fewer than two rows, NaN, a bad ``index``.

    Examples
    --------
    >>> s = np.array([[5.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.5, 0.2]])
    >>> maxstat_pvalues(s).tolist()
    [0.25, 1.0]
    """
    x = as_float64(stats, "stats")
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"stats must have shape [n >= 2, m >= 1], got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("stats must be finite")
    i = check_int(index, "index", 0)
    if i >= x.shape[0]:
        raise ValueError(f"index must be < {x.shape[0]}, got {i}")
    sd = x.std(0)
    z = (x - x.mean(0)) / np.where(sd > 0, sd, 1.0)
    mx = np.delete(z.max(1), i)
    return (1 + (mx[:, None] >= z[i][None, :]).sum(0)) / x.shape[0]


def crossed_bootstrap(stat_fn, sizes, n_boot: int = 1000, level: float = 0.95, rng=None,
                      return_boots: bool = False):
    """Percentile intervals resampling several crossed factors (e.g. prompts, word splits, nulls).

    Each resample draws, for every factor independently, ``sizes[f]`` indices with replacement
    and evaluates ``stat_fn(*indices)``.

    Parameters
    ----------
    stat_fn : callable
        ``stat_fn(idx_0, idx_1, ...) -> float or array``; called once with the identity indices
        (the estimate) and once per resample.
    sizes : sequence of int
        Number of units of each factor (each >= 1).
    n_boot : int, default 1000
        Resamples (>= 10).
    level : float, default 0.95
    rng : None, int or numpy.random.Generator
        Default seed 0.
    return_boots : bool, default False
        Also return the resampled values ``[n_boot, ...]``.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, numpy.ndarray)
        The estimate, the lower and the upper bound (NaN-aware: resamples giving NaN are
        ignored); the resampled values appended if ``return_boots``.

    Raises
    ------
    TypeError, ValueError
        ``stat_fn`` not callable, bad sizes, ``n_boot < 10``, a level outside (0, 1).

    Examples
    --------
    >>> x = np.arange(10.0)
    >>> est, lo, hi = crossed_bootstrap(lambda i: x[i].mean(), [10])
    >>> float(est), bool(lo < 4.5 < hi)
    (4.5, True)
    """
    if not callable(stat_fn):
        raise TypeError("stat_fn must be callable")
    if isinstance(sizes, (int, np.integer)) or len(sizes) == 0:
        raise TypeError(f"sizes must be a non-empty sequence of integers, got {sizes!r}")
    sizes = [check_int(s, "every size", 1) for s in sizes]
    n_boot = check_int(n_boot, "n_boot", 10)
    level = check_real(level, "level", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    gen = as_generator(0 if rng is None else rng)
    est = np.asarray(stat_fn(*[np.arange(s) for s in sizes]), dtype=np.float64)
    boots = np.stack([np.asarray(stat_fn(*[gen.integers(0, s, s) for s in sizes]), dtype=np.float64)
                      for _ in range(n_boot)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanquantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return (est, lo, hi, boots) if return_boots else (est, lo, hi)
