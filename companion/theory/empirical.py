r"""Empirical and Monte Carlo tails, the measured side of every tail bound.

Chapter :doc:`/book/subgaussian_tails` compares them with the bounds; :mod:`companion.theory.subgaussian`
re-exports both.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from companion.theory import _cgf
from companion._validation import as_real_array, check_bool, check_dist, check_int, check_t, freeze

__all__ = ["monte_carlo_tail"]


def _is_law(x) -> bool:
    """Whether ``x`` is a frozen scipy.stats distribution."""
    return isinstance(getattr(x, "dist", None), (stats.rv_continuous, stats.rv_discrete))


def _check_sample(x, name: str) -> np.ndarray:
    """``x`` as a non-empty, finite 1-D float array."""
    arr = as_real_array(x, name)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values; remove them first")
    return arr


def _count_at_least(values_sorted: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Number of sorted values >= each t."""
    return values_sorted.size - np.searchsorted(values_sorted, t, side="left")


def _empirical_tail(samples, t, *, two_sided: bool = True):
    """Empirical tail ``#{i: |x_i| >= t} / n`` (or ``x_i >= t``) of a 1-D sample, vectorised in ``t``."""
    x = _check_sample(samples, "samples")
    t_arr = check_t(t)
    two = check_bool(two_sided, "two_sided")
    return _cgf.scalar_or_array(_count_at_least(np.sort(np.abs(x) if two else x), t_arr) / x.size)


def monte_carlo_tail(sampler, t, n_samples: int, rng: np.random.Generator, *, two_sided: bool = True,
                     chunk_size: int = 1 << 18):
    r"""Streamed Monte Carlo estimate of :math:`P(|X-\mathbb EX|\ge t)` with bounded memory.

    Parameters
    ----------
    sampler : frozen scipy.stats distribution or callable
        A law (its samples are centred at its mean) or ``sampler(rng, size)`` returning centred samples.
    t : float or array_like
        Thresholds :math:`t\ge0`.
    n_samples : int
        Total number of samples (> 0).
    rng : numpy.random.Generator
    two_sided : bool, default True
        Two-sided (:math:`|X|\ge t`) or upper (:math:`X\ge t`) tail.
    chunk_size : int, default 262144
        Samples drawn and counted at a time (memory bound).

    Returns
    -------
    float or numpy.ndarray
        Estimated tail probabilities, shape of ``t``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or range, the law has no finite mean, or the draws are bad.

    Examples
    --------
    >>> p = monte_carlo_tail(stats.norm(), [1.0], 100_000, np.random.default_rng(0))
    >>> bool(abs(p[0] - 0.3173) < 0.005)
    True
    """
    sampler = freeze(sampler, "sampler")
    is_dist = _is_law(sampler)
    if not is_dist and not callable(sampler):
        raise TypeError("sampler must be a frozen scipy.stats distribution or a callable (rng, size) -> "
                        f"array; got {type(sampler).__name__}")
    if is_dist:
        sampler = check_dist(sampler, "sampler")
    n_samples = check_int(n_samples, "n_samples", 1)
    chunk_size = check_int(chunk_size, "chunk_size", 1)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (np.random.default_rng(seed)); "
                        f"got {type(rng).__name__}")
    t_arr = check_t(t)
    two = check_bool(two_sided, "two_sided")
    shift = 0.0
    if is_dist:
        shift, _ = _cgf.moments(sampler)
        if not np.isfinite(shift):
            raise ValueError("sampler has no finite mean; its centred tail is undefined")
    flat_t = t_arr.ravel()
    counts = np.zeros(flat_t.shape, dtype=np.int64)
    done = 0
    while done < n_samples:
        m = min(chunk_size, n_samples - done)
        if is_dist:
            x = np.asarray(sampler.rvs(size=m, random_state=rng), dtype=float) - shift
        else:
            x = np.asarray(sampler(rng, m), dtype=float)
            if x.shape != (m,):
                raise ValueError(f"sampler(rng, {m}) returned shape {x.shape}, expected ({m},)")
        if not np.isfinite(x).all():
            raise ValueError("the sampler returned NaN or infinite values")
        counts += _count_at_least(np.sort(np.abs(x) if two else x), flat_t)
        done += m
    return _cgf.scalar_or_array((counts / n_samples).reshape(t_arr.shape))
