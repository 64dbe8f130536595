"""Bootstrap intervals: the one resampling layer behind every interval a chapter prints.

Both functions are deterministic for a given seed (default 0), so a printed interval is reproducible.
"""

from __future__ import annotations

import numpy as np

from companion._validation import as_float64, as_generator, check_int, check_real, real_array

__all__ = ["bootstrap_interval", "bootstrap_ratio"]


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
