r"""Tails heavier than sub-Gaussian: sub-Weibull norms, maxima, and the Hill estimator.

Theory and proofs: chapter :doc:`/book/heavy_tails` (:math:`\alpha` the Weibull exponent,
:math:`\gamma` the extreme-value index, :math:`k` the number of upper order statistics).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

from companion._validation import check_int, check_real, real_vector

__all__ = ["psi_alpha_norm", "sub_weibull_tail_bound", "sub_weibull_max_quantile", "hill_estimator",
           "hill_interval"]


def psi_alpha_norm(x, alpha) -> float:
    r"""Plug-in Orlicz norm :math:`\inf\{s>0:\frac1n\sum_i e^{(|x_i|/s)^\alpha}\le2\}` of a sample.

    Parameters
    ----------
    x : array_like, shape (n,)
        A finite, non-empty sample.
    alpha : float
        The exponent :math:`\alpha>0` (2: sub-Gaussian, 1: sub-exponential; below 1 a quasi-norm).

    Returns
    -------
    float
        The norm of the sample's empirical law (0 for an all-zero sample).

    Raises
    ------
    TypeError, ValueError
        If ``x`` is not a finite non-empty 1-D array or ``alpha`` is not a finite number > 0.

    Examples
    --------
    >>> round(psi_alpha_norm([1.0, -1.0], 2.0), 6)     # 1 / sqrt(ln 2)
    1.201122
    """
    a = np.abs(real_vector("x", x))
    alpha = check_real(alpha, "alpha", lo=0.0, lo_open=True)
    top = float(a.max())
    if top == 0.0:
        return 0.0
    r = a / top                                      # the root is top * s with s in [lo, hi]
    logn = math.log(r.size)

    def excess(log_s):                               # log mean exp((r/s)^alpha) - ln 2, decreasing
        return float(special.logsumexp((r * math.exp(-log_s)) ** alpha)) - logn - math.log(2.0)

    hi = -math.log(math.log(2.0)) / alpha            # every term <= 2 there
    lo = -math.log(math.log(2.0) + logn) / alpha     # the largest term alone reaches 2 n there
    if excess(hi) >= 0.0:                            # a sample of equal |x_i|: the root is hi
        return top * math.exp(hi)
    return top * math.exp(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-13))


def sub_weibull_tail_bound(t, K, alpha):
    r"""The Weibull tail :math:`P(|X|\ge t)\le2\exp(-(t/K)^\alpha)` when :math:`\|X\|_{\psi_\alpha}\le K`.

    Markov's inequality applied to :math:`e^{(|X|/K)^\alpha}` (chapter :doc:`/book/heavy_tails`,
    :prf:ref:`ht-prop-tail`).

    Parameters
    ----------
    t : float or array_like
        Thresholds :math:`t\ge0`.
    K : float
        Bound on the :math:`\psi_\alpha` norm, > 0.
    alpha : float
        The exponent, > 0.

    Returns
    -------
    float or numpy.ndarray
        The bound, not capped at 1, shape of ``t``.

    Raises
    ------
    TypeError, ValueError
        If ``t`` is not real, negative or NaN, or ``K``/``alpha`` are not positive finite reals.

    Examples
    --------
    >>> round(sub_weibull_tail_bound(4.0, 2.0, 1.0), 6)     # 2 e^{-2}
    0.270671
    """
    K = check_real(K, "K", lo=0.0, lo_open=True)
    alpha = check_real(alpha, "alpha", lo=0.0, lo_open=True)
    if isinstance(t, (str, bytes)):
        raise TypeError("t must be a real number or an array of real numbers, got a string")
    t_arr = np.asarray(t)
    if t_arr.dtype == bool or not np.issubdtype(t_arr.dtype, np.number) or np.iscomplexobj(t_arr):
        raise TypeError(f"t must be a real number or an array of real numbers, got dtype {t_arr.dtype}")
    t_arr = t_arr.astype(np.float64)
    if np.isnan(t_arr).any() or (t_arr < 0).any():
        raise ValueError("t must be >= 0 and not NaN (a threshold on |X|)")
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        # (t/K)^alpha as exp(alpha ln(t/K)): no overflow of t/K raised to a large alpha
        log_ratio = np.log(t_arr / K, where=t_arr > 0, out=np.full(t_arr.shape, -np.inf))
        out = 2.0 * np.exp(-np.exp(alpha * log_ratio))
    return float(out) if out.ndim == 0 else out


def sub_weibull_max_quantile(N, K, alpha, delta):
    r"""A level exceeded by :math:`\max_{i\le N}|X_i|` with probability at most :math:`\delta`.

    For any dependence between :math:`X_1,\dots,X_N` with :math:`\|X_i\|_{\psi_\alpha}\le K`,
    :math:`P(\max_i|X_i|\ge K(\ln(2N/\delta))^{1/\alpha})\le\delta` (union bound; chapter
    :doc:`/book/heavy_tails`).

    Parameters
    ----------
    N : int
        Number of variables, at least 1.
    K : float
        Bound on their :math:`\psi_\alpha` norms, > 0.
    alpha : float
        The exponent, > 0.
    delta : float
        Probability in (0, 1).

    Returns
    -------
    float
        :math:`K(\ln(2N/\delta))^{1/\alpha}`.

    Raises
    ------
    TypeError, ValueError
        If an argument is of the wrong type or out of range.

    Examples
    --------
    >>> round(sub_weibull_max_quantile(1000, 1.0, 1.0, 0.05), 4)   # ln(40000)
    10.5966
    """
    N = check_int(N, "N", minimum=1)
    K = check_real(K, "K", lo=0.0, lo_open=True)
    alpha = check_real(alpha, "alpha", lo=0.0, lo_open=True)
    delta = check_real(delta, "delta", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    return K * math.exp(math.log(math.log(2.0) + math.log(N) - math.log(delta)) / alpha)


def _upper_logs(x, k):
    """Sorted logs of the k + 1 largest values of a positive sample, and the checked k array."""
    v = real_vector("x", x)
    if (v <= 0).any():
        raise ValueError("x must be positive (pass |x| or the upper tail of a sample), got "
                         f"{int((v <= 0).sum())} value(s) <= 0")
    ks = np.atleast_1d(np.asarray(k))
    if ks.dtype.kind not in "iu" or ks.ndim != 1 or ks.size == 0:
        raise TypeError(f"k must be an integer or a 1-D array of integers, got {k!r}")
    if ks.min() < 1 or ks.max() > v.size - 1:
        raise ValueError(f"k must lie in [1, n - 1] = [1, {v.size - 1}], got {ks.min()}..{ks.max()}")
    cut = v.size - int(ks.max()) - 1                  # only the k + 1 largest values are sorted
    top = np.log(np.sort(np.partition(v, cut)[cut:])[::-1])   # log X_(n), log X_(n-1), ...
    return top, ks.astype(np.int64)


def hill_estimator(x, k):
    r"""Hill's estimate :math:`\hat\gamma_k=\frac1k\sum_{i=1}^k\ln X_{(n-i+1)}-\ln X_{(n-k)}`.

    :math:`\hat\gamma_k` estimates the extreme-value index :math:`\gamma=1/a` of a tail
    :math:`P(X>x)=x^{-a}\ell(x)`; for a Gaussian or exponential tail (:math:`\gamma=0`) it drifts
    to 0 as :math:`k/n\to0`.

    Parameters
    ----------
    x : array_like, shape (n,)
        A positive finite sample (e.g. :math:`|x|`), n >= 2.
    k : int or array_like of int
        Number(s) of upper order statistics, each in [1, n - 1].

    Returns
    -------
    float or numpy.ndarray
        :math:`\hat\gamma_k` for each ``k`` (a float for a scalar ``k``).

    Raises
    ------
    TypeError, ValueError
        If ``x`` is not a positive finite 1-D sample or a ``k`` is out of range.

    Examples
    --------
    >>> round(hill_estimator([1.0, 2.0, 4.0, 8.0], 2), 6)        # (ln 8 + ln 4) / 2 - ln 2
    1.039721
    """
    top, ks = _upper_logs(x, k)
    mean_top = np.cumsum(top)[ks - 1] / ks
    out = mean_top - top[ks]
    return float(out[0]) if np.ndim(k) == 0 else out


def hill_interval(x, k, level: float = 0.95):
    r"""Interval for :math:`\gamma` that is exact for a Pareto tail above :math:`X_{(n-k)}`.

    For independent draws with :math:`P(X>x)=(x/x_m)^{-1/\gamma}` beyond the threshold,
    :math:`k\hat\gamma_k/\gamma` has the Gamma(k, 1) law (Rényi's representation; chapter
    :doc:`/book/heavy_tails`), so :math:`[k\hat\gamma_k/g_{1-\epsilon/2},\,k\hat\gamma_k/g_{\epsilon/2}]`
    covers :math:`\gamma` with probability ``level`` = 1 − ε. A tail that is only asymptotically
    Pareto adds a bias the interval does not see; dependent draws make it too short.

    Parameters
    ----------
    x, k
        As in :func:`hill_estimator` (one ``k``).
    level : float, default 0.95
        Coverage in (0, 1).

    Returns
    -------
    tuple of float
        (lower, upper).

    Raises
    ------
    TypeError, ValueError
        As in :func:`hill_estimator`; ``level`` outside (0, 1).

    Examples
    --------
    >>> lo, hi = hill_interval([1.0, 2.0, 4.0, 8.0], 2)
    >>> bool(lo < 1.039721 < hi)
    True
    """
    level = check_real(level, "level", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    k = check_int(k, "k", minimum=1)
    g = k * hill_estimator(x, k)
    tail = (1.0 - level) / 2.0
    return g / stats.gamma.isf(tail, k), g / stats.gamma.ppf(tail, k)
