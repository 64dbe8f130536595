r"""Outliers in real Transformers: regimes, predicted versus observed counts, tails, attention logits.

This module holds the analysis behind the chapter *Outliers in real Transformers*
(``book/outliers_real_models.ipynb``).  The statistics themselves are streamed by
:func:`companion.probes.channel_statistics` (per layer ``l`` and channel ``j``: the mean
:math:`\mu_j`, the variance :math:`\sigma_j^2` and the exceedance counts
:math:`C_j(t) = \#\{i \le N : |h_{ij}| > t\}`); the functions here turn them into the quantities
the outlier note talks about, and measure where real activations leave the note's model
:math:`X_{ij} = \mu_j + Z_{ij}` with sub-Gaussian :math:`Z`.

Conventions
-----------
Arrays of per-channel parameters have the channel axis last, ``mu[..., d]``; a threshold grid
``thresholds[n_t]`` is inserted before it, so per-threshold results have shape
``[..., n_t, d]`` -- the layout of ``ChannelStatistics.counts`` (``[L+1, n_t, d]``).

Public functions
----------------
Regimes and counts
    :data:`REGIMES`, :func:`classify_regime`, :func:`predicted_counts`, :func:`compare_counts`
    (with its result :class:`CountComparison`), :func:`corpus_subset`.
Tails
    :func:`tail_diagnostics`, :func:`gaussian_max_abs_quantile`, :func:`empirical_variance_proxy`,
    :func:`top_activations`.
Attention logits
    :func:`capture_queries_keys` (with :class:`QueryKeyCapture`), :func:`logit_pairs`,
    :func:`dot_product_moments`, :func:`partial_dot_statistics`,
    :func:`attention_logit_statistics`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy import special, stats

from companion import extremes

__all__ = [
    "REGIMES",
    "classify_regime",
    "predicted_counts",
    "CountComparison",
    "compare_counts",
    "corpus_subset",
    "tail_diagnostics",
    "gaussian_max_abs_quantile",
    "empirical_variance_proxy",
    "top_activations",
    "QueryKeyCapture",
    "capture_queries_keys",
    "logit_pairs",
    "dot_product_moments",
    "partial_dot_statistics",
    "attention_logit_statistics",
]

#: Regime codes returned by :func:`classify_regime`, in order 0, 1, 2.
REGIMES = ("centred", "intermediate", "mean-dominated")


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------
def _real_array(name: str, value, min_ndim: int = 0) -> np.ndarray:
    """``value`` as a finite float64 array of at least ``min_ndim`` dimensions."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a number or an array of numbers, got a string")
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} could not be read as a rectangular array ({exc})") from None
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(
            f"{name} must hold real numbers, got dtype {arr.dtype} ({type(value).__name__}); "
            "pass a float array"
        )
    arr = arr.astype(np.float64, copy=False)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name} contains {int(bad.sum())} NaN or infinite value(s) out of {arr.size}; "
            "remove them (a model that produced them has overflowed)"
        )
    return arr


def _thresholds(thresholds) -> np.ndarray:
    t = _real_array("thresholds", thresholds)
    if t.ndim == 0:
        t = t.reshape(1)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"thresholds must be a non-empty 1-D sequence, got shape {t.shape}")
    if (t < 0).any():
        raise ValueError(f"thresholds must be >= 0 (they bound |x|), got min {t.min():.4g}")
    return t


def _mu_sigma(mu, sigma, positive: bool = True) -> tuple[np.ndarray, np.ndarray]:
    m = _real_array("mu", mu, min_ndim=1)
    s = _real_array("sigma", sigma, min_ndim=1)
    if m.shape != s.shape:
        raise ValueError(f"mu and sigma must have the same shape [..., d], got {m.shape} and {s.shape}")
    if positive and (s <= 0).any():
        raise ValueError(
            f"sigma must be > 0 in every channel, got {int((s <= 0).sum())} channel(s) with "
            "sigma <= 0; drop constant channels before comparing counts"
        )
    if not positive and (s < 0).any():
        raise ValueError(f"sigma must be >= 0, got min {s.min():.4g}")
    return m, s


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _nonneg_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _generator(rng) -> np.random.Generator:
    if rng is None:
        return np.random.default_rng(0)
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, Integral) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be None, a non-negative integer seed or a numpy.random.Generator, got {rng!r}"
    )


# --------------------------------------------------------------------------------------------
# regimes and counts
# --------------------------------------------------------------------------------------------
def classify_regime(mu, sigma, thresholds, centred_tol: float = 0.1) -> np.ndarray:
    r"""Regime of every channel at every threshold: centred, intermediate or mean-dominated.

    Parameters
    ----------
    mu, sigma : array_like, shape ``[..., d]``
        Channel means and standard deviations (``sigma >= 0``).
    thresholds : array_like, shape ``[n_t]``
        Thresholds :math:`t \ge 0`.
    centred_tol : float, default 0.1
        A channel counts as centred when :math:`|\mu_j| \le` ``centred_tol`` :math:`\cdot\sigma_j`.

    Returns
    -------
    numpy.ndarray of int8, shape ``[..., n_t, d]``
        Codes into :data:`REGIMES`: 2 if :math:`|\mu_j| > t` (mean-dominated, Theorem 1 applies),
        0 if the channel is centred and :math:`|\mu_j| \le t`, 1 otherwise.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If an input holds NaN/inf, ``sigma < 0``, shapes differ, a threshold is negative or
        ``centred_tol < 0``.

    Notes
    -----
    The note's Theorem 2 separates :math:`|\mu_j| > t` from :math:`\mu_j = 0` exactly.  A measured
    mean is never exactly zero, so the "pure-variance" side is widened to
    :math:`|\mu_j| \le c\,\sigma_j`; every channel in between is *intermediate*, the continuum
    the note leaves out.  The bounds of :func:`predicted_counts` hold in every regime, so the
    choice of ``centred_tol`` only changes how channels are grouped, never a bound.

    Examples
    --------
    >>> classify_regime([0.0, 0.5, 3.0], [1.0, 1.0, 1.0], [2.0]).tolist()
    [[0, 1, 2]]
    """
    m, s = _mu_sigma(mu, sigma, positive=False)
    t = _thresholds(thresholds)
    tol = _nonneg_real("centred_tol", centred_tol)
    a = np.abs(m)[..., None, :]
    tt = t[:, None]
    centred = a <= tol * s[..., None, :]
    out = np.where(a > tt, 2, np.where(centred, 0, 1)).astype(np.int8)
    return out


def predicted_counts(mu, sigma, thresholds, n_tokens) -> dict[str, np.ndarray]:
    r"""Expected counts :math:`E[C_j(t)]` predicted from :math:`(\mu_j, \sigma_j)`: exact Gaussian and bounds.

    Parameters
    ----------
    mu, sigma : array_like, shape ``[..., d]``
        Fitted channel means and standard deviations (``sigma > 0``).
    thresholds : array_like, shape ``[n_t]``
        Thresholds :math:`t \ge 0`.
    n_tokens : int
        Number of rows :math:`N` the statistics were computed from.

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[..., n_t, d]``
        ``"gaussian"``: :math:`N\,P(|\mu_j + \sigma_j G| > t)`, :math:`G \sim N(0,1)`;
        ``"lower"``: the one-sided Theorem 1 bound :math:`N(1 - e^{-(|\mu_j|-t)_+^2/(2\sigma_j^2)})`;
        ``"notes_lower"``: the note's :math:`N(1 - 2e^{-(|\mu_j|-t)^2/(2\sigma_j^2)})` where
        :math:`|\mu_j| > t` (NaN elsewhere, possibly negative);
        ``"upper"``: :math:`N\min(1, e^{-(t-|\mu_j|)_+^2/(2\sigma_j^2)} + e^{-(t+|\mu_j|)^2/(2\sigma_j^2)})`.

    Raises
    ------
    TypeError
        If ``n_tokens`` is not an integer or another input is not real-valued.
    ValueError
        If ``n_tokens < 1``, ``sigma <= 0`` somewhere, a threshold is negative, an input is
        not finite or ``mu`` and ``sigma`` differ in shape.

    Notes
    -----
    The bounds are those of :func:`companion.extremes.theorem2_bounds` with the variance proxy
    replaced by the *sample variance* :math:`\sigma_j^2`.  They are theorems only if the noise is
    :math:`\sigma_j^2`-sub-Gaussian, i.e. strictly sub-Gaussian (optimal proxy = variance, as for
    Gaussian noise); for heavier tails the true proxy exceeds :math:`\sigma_j^2` (or does not
    exist) and the upper bound can fail.  Comparing observed counts with them is therefore a
    test of the model :math:`X = \mu + Z` with :math:`Z` no heavier-tailed than a Gaussian.

    Examples
    --------
    >>> p = predicted_counts([[0.0, 3.0]], [[1.0, 1.0]], [1.0], 100)
    >>> [round(float(x), 2) for x in p["gaussian"][0, 0]]
    [31.73, 97.73]
    """
    m, s = _mu_sigma(mu, sigma)
    t = _thresholds(thresholds)
    n = _positive_int("n_tokens", n_tokens)
    mm, ss = m[..., None, :], s[..., None, :]
    tt = t[:, None]
    gauss = np.asarray(extremes.expected_count_gaussian(n, mm, tt, ss), dtype=np.float64)
    b = extremes.theorem2_bounds(n, mm, tt, ss)
    return {
        "gaussian": gauss,
        "lower": np.asarray(b.lower, dtype=np.float64),
        "notes_lower": np.asarray(b.notes_lower, dtype=np.float64),
        "upper": np.asarray(b.upper, dtype=np.float64),
    }


@dataclass(frozen=True)
class CountComparison:
    """Observed against predicted exceedance counts, summed over the channels of each regime.

    Every array has shape ``[..., n_t, 3]`` (the leading axes of ``mu``, e.g. layers; the last
    axis indexes :data:`REGIMES`) unless stated otherwise.

    Attributes
    ----------
    thresholds : numpy.ndarray, shape ``[n_t]``
    n_tokens : int
    n_channels : numpy.ndarray of int
        Channels in each regime.
    observed, gaussian, lower, upper : numpy.ndarray
        Sums over the regime's channels of the observed counts, the exact-Gaussian expectation
        and the Theorem 1 / Theorem 2 bounds of :func:`predicted_counts`.
    lower_violations, upper_violations : numpy.ndarray of int
        Channels whose observed count is significantly (level ``alpha``, binomial test) below
        the lower bound or above the upper bound.
    channel_lower_violation, channel_upper_violation : numpy.ndarray of bool, shape ``[..., d]``
        Per channel: whether it violates the bound at some threshold of the grid.
    alpha : float
    """

    thresholds: np.ndarray
    n_tokens: int
    n_channels: np.ndarray
    observed: np.ndarray
    gaussian: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    lower_violations: np.ndarray
    upper_violations: np.ndarray
    channel_lower_violation: np.ndarray
    channel_upper_violation: np.ndarray
    alpha: float

    def ratio(self, regime: str | None = None) -> np.ndarray:
        """Observed / Gaussian-predicted total, for one regime (name) or all channels (None).

        Parameters
        ----------
        regime : str or None
            One of :data:`REGIMES`, or None for the sum over all regimes.

        Returns
        -------
        numpy.ndarray, shape ``[..., n_t]``
            The ratio; ``inf`` where the prediction is 0 but counts were observed, NaN where both are 0.

        Raises
        ------
        ValueError
            If ``regime`` is not one of :data:`REGIMES` or None.
        """
        if regime is None:
            obs, pred = self.observed.sum(-1), self.gaussian.sum(-1)
        else:
            if regime not in REGIMES:
                raise ValueError(f"unknown regime {regime!r}; choose one of {REGIMES} or None")
            k = REGIMES.index(regime)
            obs, pred = self.observed[..., k], self.gaussian[..., k]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(pred > 0, obs / np.where(pred > 0, pred, 1.0), np.where(obs > 0, np.inf, np.nan))


def compare_counts(
    counts, mu, sigma, thresholds, n_tokens, centred_tol: float = 0.1, alpha: float = 1e-3
) -> CountComparison:
    r"""Observed :math:`C_j(t)` against the exact-Gaussian prediction and the Theorem 1/2 bounds.

    Parameters
    ----------
    counts : array_like of int, shape ``[..., n_t, d]``
        Observed exceedance counts (``ChannelStatistics.counts``).
    mu, sigma : array_like, shape ``[..., d]``
        Channel means and standard deviations from the same tokens (``sigma > 0``).
    thresholds : array_like, shape ``[n_t]``
    n_tokens : int
        Number of tokens :math:`N` behind the statistics.
    centred_tol : float, default 0.1
        See :func:`classify_regime`.
    alpha : float, default 1e-3
        Level of the per-channel binomial test that flags a bound violation.

    Returns
    -------
    CountComparison

    Raises
    ------
    TypeError
        If an input has the wrong type.
    ValueError
        If shapes disagree, counts are negative, non-integer or exceed ``n_tokens``, or
        ``alpha`` is not in (0, 1); see also :func:`predicted_counts`.

    Notes
    -----
    A bound on :math:`E[C_j(t)]` says nothing about one sample unless the rows are independent;
    if they were, :math:`C_j(t) \sim \mathrm{Bin}(N, p_j)` and an observed count :math:`c` above
    the upper bound :math:`N\bar p` is significant when
    :math:`P(\mathrm{Bin}(N, \bar p) \ge c) < \alpha` (and symmetrically below the lower bound).
    Tokens of one text are dependent, so the test flags only gross violations; that is its
    purpose here.

    Examples
    --------
    >>> cc = compare_counts([[[400, 990]]], [[0.0, 4.0]], [[1.0, 1.0]], [2.0], 1000)
    >>> cc.observed[0, 0].tolist(), cc.upper_violations[0, 0].tolist()
    ([400.0, 0.0, 990.0], [1, 0, 0])
    """
    c = np.asarray(counts)
    if hasattr(counts, "detach"):
        c = counts.detach().cpu().numpy()
    if c.dtype == bool or not (np.issubdtype(c.dtype, np.integer) or np.issubdtype(c.dtype, np.floating)):
        raise TypeError(f"counts must be an integer array, got dtype {c.dtype}")
    m, s = _mu_sigma(mu, sigma)
    t = _thresholds(thresholds)
    n = _positive_int("n_tokens", n_tokens)
    expected = m.shape[:-1] + (t.size, m.shape[-1])
    if c.shape != expected:
        raise ValueError(
            f"counts must have shape mu.shape[:-1] + (len(thresholds), d) = {expected}, got {c.shape}"
        )
    if not np.isfinite(c).all() or (c < 0).any() or (c > n).any() or (c != np.round(c)).any():
        raise ValueError(f"counts must be integers in [0, n_tokens={n}]")
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}")
    c = c.astype(np.float64)
    pred = predicted_counts(m, s, t, n)
    reg = classify_regime(m, s, t, centred_tol)
    p_up = np.clip(pred["upper"] / n, 0.0, 1.0)
    p_lo = np.clip(pred["lower"] / n, 0.0, 1.0)
    # P(Bin(N, p_up) >= c) < alpha  /  P(Bin(N, p_lo) <= c) < alpha
    up_bad = (c > pred["upper"]) & (stats.binom.sf(c - 1, n, p_up) < alpha)
    lo_bad = (c < pred["lower"]) & (stats.binom.cdf(c, n, p_lo) < alpha)

    def by_regime(x):
        return np.stack([np.where(reg == k, x, 0).sum(-1) for k in range(len(REGIMES))], axis=-1)

    return CountComparison(
        thresholds=t,
        n_tokens=n,
        n_channels=by_regime(np.ones_like(c, dtype=np.int64)),
        observed=by_regime(c),
        gaussian=by_regime(pred["gaussian"]),
        lower=by_regime(pred["lower"]),
        upper=by_regime(pred["upper"]),
        lower_violations=by_regime(lo_bad.astype(np.int64)),
        upper_violations=by_regime(up_bad.astype(np.int64)),
        channel_lower_violation=lo_bad.any(axis=-2),
        channel_upper_violation=up_bad.any(axis=-2),
        alpha=float(alpha),
    )


def corpus_subset(m, texts, max_tokens: int, max_length: int | None = None) -> list[str]:
    r"""The longest prefix of ``texts`` whose token count (after truncation) stays within a budget.

    Parameters
    ----------
    m : companion.models.LoadedModel
        Supplies the tokenizer and the default truncation length.
    texts : sequence of str
        Candidate texts in a fixed order (e.g. :func:`companion.corpus.load_corpus`).
    max_tokens : int
        Token budget :math:`\ge 1`; the prefix always keeps at least the first text.
    max_length : int or None
        Truncation length used when counting (default ``m.max_length``), the same the probes use.

    Returns
    -------
    list of str
        ``texts[:k]`` for the largest ``k`` with at most ``max_tokens`` tokens in total (or 1).

    Raises
    ------
    TypeError
        If ``texts`` is not a sequence of strings or ``max_tokens`` is not an integer.
    ValueError
        If ``texts`` is empty or ``max_tokens < 1``.

    Notes
    -----
    Deterministic: the subset depends only on the order of ``texts`` and on the tokenizer, so a
    chapter and a command-line run over the same budget see the same tokens.

    Examples
    --------
    >>> sub = corpus_subset(load("minilm-l6"), load_corpus(), 2000)   # doctest: +SKIP
    """
    budget = _positive_int("max_tokens", max_tokens)
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError("texts is empty; pass at least one string")
    for i, s in enumerate(texts):
        if not isinstance(s, str):
            raise TypeError(f"texts[{i}] must be a string, got {type(s).__name__}")
    limit = m.max_length if max_length is None else _positive_int("max_length", max_length, 2)
    out: list[str] = []
    total = 0
    for s in texts:
        k = min(len(m.tokenizer(s)["input_ids"]), limit)
        if out and total + k > budget:
            break
        out.append(s)
        total += k
    return out


# --------------------------------------------------------------------------------------------
# tails
# --------------------------------------------------------------------------------------------
def _sample_matrix(x) -> np.ndarray:
    a = _real_array("x", x, min_ndim=1)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"x must have shape [n] or [n, d] (samples along axis 0), got {a.shape}")
    if a.shape[0] < 4:
        raise ValueError(f"x needs at least 4 samples along axis 0, got {a.shape[0]}")
    return a


def tail_diagnostics(x) -> dict[str, np.ndarray]:
    r"""Heavy-tail diagnostics per channel: excess kurtosis and the largest standardised deviation.

    Parameters
    ----------
    x : array_like, shape ``[n]`` or ``[n, d]``
        Samples along axis 0 (at least 4), channels along axis 1.

    Returns
    -------
    dict
        ``"mean"``, ``"std"`` (population, ``ddof=0``), ``"excess_kurtosis"``
        :math:`m_4/m_2^2 - 3`, ``"max_abs_z"`` :math:`\max_i |x_i - \bar x|/s`, each of shape
        ``[d]``, and ``"n"`` (int).  Constant channels get NaN kurtosis and ``max_abs_z`` 0.

    Raises
    ------
    TypeError
        If ``x`` is not real-valued.
    ValueError
        If ``x`` has fewer than 4 samples, more than 2 dimensions, or NaN/inf values.

    Notes
    -----
    For Gaussian data the excess kurtosis is 0 (standard error :math:`\approx\sqrt{24/n}`) and
    the maximum of :math:`n` standardised absolute deviations concentrates near
    :math:`\sqrt{2\ln n}` (exact quantiles: :func:`gaussian_max_abs_quantile`).  A strictly
    sub-Gaussian law has excess kurtosis :math:`\le 0` (expand both sides of
    :math:`E e^{\lambda Z} \le e^{\lambda^2\sigma^2/2}` to fourth order with
    :math:`\sigma^2 = \mathrm{Var}\,Z`, for symmetric :math:`Z`), so a large positive kurtosis
    means the variance is not a valid proxy.

    Numerically, the deviations of each channel are divided by a power of two (exact) before the
    fourth powers are taken, so channels of any scale in the float64 range (1e-300 or 1e300)
    give the same kurtosis and ``max_abs_z``; a channel whose values are all equal is constant
    (its mean is that value) even when the rounded mean of its copies is not.

    Examples
    --------
    >>> d = tail_diagnostics(np.random.default_rng(0).standard_normal((100_000, 2)))
    >>> bool(np.all(np.abs(d["excess_kurtosis"]) < 0.1))
    True
    """
    a = _sample_matrix(x)
    mean, c, e_c, constant = _centred_scaled(a)
    m2 = np.mean(c * c, axis=0)
    m4 = np.mean(c**4, axis=0)
    std = np.ldexp(np.sqrt(m2), e_c)
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = np.where(m2 > 0, m4 / np.where(m2 > 0, m2, 1.0) ** 2 - 3.0, np.nan)
        maxz = np.where(m2 > 0, np.abs(c).max(axis=0) / np.where(m2 > 0, np.sqrt(m2), 1.0), 0.0)
    kurt[constant], maxz[constant] = np.nan, 0.0
    return {"mean": mean, "std": std, "excess_kurtosis": kurt, "max_abs_z": maxz, "n": int(a.shape[0])}


def _centred_scaled(a: np.ndarray):
    """Channel means and the deviations ``a - mean`` divided by a power of two per channel.

    Returns ``(mean, c, e, constant)`` with ``a - mean = c * 2**e`` and ``max|c|`` in [1/2, 1)
    (``c = 0`` for a constant channel, whose mean is its value).  Powers of two scale exactly,
    so ratios of moments of ``c`` are those of ``a - mean`` to the last bit; but ``c**4`` neither
    overflows (data near 1e80) nor underflows (near 1e-80, or tiny deviations around a large
    mean) as the unscaled deviations do.
    """
    _, e_a = np.frexp(np.abs(a).max(axis=0))
    a_s = np.ldexp(a, -e_a)
    mean = np.ldexp(a_s.mean(axis=0), e_a)
    c = a_s - a_s.mean(axis=0)
    constant = (a == a[0]).all(axis=0)
    mean[constant] = a[0, constant]
    c[:, constant] = 0.0
    _, e_c = np.frexp(np.abs(c).max(axis=0))
    return mean, np.ldexp(c, -e_c), e_a + e_c, constant


def gaussian_max_abs_quantile(n, q: float = 0.5):
    r"""Quantile of :math:`\max_{i \le n} |G_i|` for i.i.d. standard Gaussians (exact).

    Parameters
    ----------
    n : int or array_like of int
        Sample size(s) :math:`n \ge 1` (also beyond the int64 range).
    q : float, default 0.5
        Probability level in (0, 1).

    Returns
    -------
    float or numpy.ndarray
        :math:`m` with :math:`P(\max_i |G_i| \le m) = q`.

    Raises
    ------
    TypeError
        If ``n`` is not an integer (array) or ``q`` not a real number.
    ValueError
        If ``n < 1`` or ``q`` is not in (0, 1).

    Notes
    -----
    :math:`P(\max_i|G_i| \le m) = (1 - 2\Phi(-m))^n = q` gives
    :math:`m = -\Phi^{-1}\bigl((1 - q^{1/n})/2\bigr)`, computed with ``expm1`` so that it stays
    accurate for large :math:`n`; when :math:`r = q^{1/n} < 10^{-3}` (tiny ``q``), as
    :math:`m = \sqrt2\,\mathrm{erf}^{-1}(r)`, which keeps the digits that :math:`1 - r` loses.
    It grows like :math:`\sqrt{2\ln(2n)}` to first order.

    Examples
    --------
    >>> round(gaussian_max_abs_quantile(1), 4)        # median of |G|
    0.6745
    >>> round(gaussian_max_abs_quantile(10**6), 3)
    4.963
    """
    arr = np.asarray(n)
    if arr.dtype == object and arr.size and all(  # Python ints beyond the 64-bit range
        isinstance(v, Integral) and not isinstance(v, bool) for v in arr.ravel().tolist()
    ):
        arr = np.asarray([float(v) for v in arr.ravel().tolist()]).reshape(arr.shape)
    elif arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"n must be a positive integer or an array of them, got {type(n).__name__}")
    if (arr < 1).any():
        raise ValueError(f"n must be >= 1, got min {int(arr.min())}")
    if isinstance(q, bool) or not isinstance(q, Real):
        raise TypeError(f"q must be a real number in (0, 1), got {type(q).__name__}")
    if not (0.0 < q < 1.0):
        raise ValueError(f"q must lie strictly between 0 and 1, got {q!r}")
    log_r = math.log(q) / arr.astype(np.float64)  # r = q**(1/n) = P(|G| <= m)
    tail = -np.expm1(log_r)  # 1 - r
    out = -special.ndtri(tail / 2.0)
    # r < 1e-3: 1 - r keeps too few digits of r (m = 0.0 for q = 1e-300, n = 10); there
    # P(|G| <= m) = erf(m / sqrt 2) = r inverts with full precision
    small = log_r < math.log(1e-3)
    if np.any(small):
        out = np.where(small, math.sqrt(2.0) * special.erfinv(np.exp(np.minimum(log_r, 0.0))), out)
    return float(out) if out.ndim == 0 else out


def empirical_variance_proxy(x, s_grid=None) -> dict[str, np.ndarray]:
    r"""Plug-in estimate of the optimal variance proxy, :math:`\sup_\lambda 2\log\hat E e^{\lambda(X-\bar X)}/\lambda^2`.

    Parameters
    ----------
    x : array_like, shape ``[n]`` or ``[n, d]``
        Samples along axis 0 (at least 4), channels along axis 1; no constant channel.
    s_grid : array_like or None
        Values of :math:`s = \lambda\hat\sigma_j` (the grid is standardised per channel), all
        non-zero.  Default: 80 points, :math:`\pm` a geometric grid from 0.05 to 8.

    Returns
    -------
    dict
        ``"ratio"``: the estimate divided by the sample variance (1 for a Gaussian in the limit),
        ``"proxy"``: the estimate :math:`\hat\sigma^2_{\rm opt}`, ``"s_star"``: the maximising
        :math:`s`, each of shape ``[d]``; ``"s_grid"``.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If ``x`` has fewer than 4 samples, NaN/inf values or a constant channel, its variance
        exceeds the float64 range, or ``s_grid`` is empty, not 1-D or contains 0 or non-finite
        values.

    Notes
    -----
    With :math:`z_i = (x_i - \bar x)/\hat\sigma` and the empirical cumulant
    :math:`\hat K(s) = \log\frac1n\sum_i e^{s z_i}` (log-sum-exp), the estimate is
    :math:`\hat\sigma^2 \max_{s} 2\hat K(s)/s^2`.  It is biased: for :math:`|s|` large,
    :math:`\hat K(s) \approx s\,\max_i z_i - \ln n`, so :math:`2\hat K/s^2 \to 0` and the supremum
    is decided by the few largest samples.  For a law that is not sub-Gaussian the true proxy is
    infinite while every estimate is finite; the estimate then grows with :math:`n` and with the
    grid range instead of converging.  Use it next to :func:`tail_diagnostics`, never alone.

    Examples
    --------
    >>> z = np.random.default_rng(0).standard_normal(200_000)
    >>> 0.95 < float(empirical_variance_proxy(z)["ratio"][0]) < 1.1
    True
    """
    a = _sample_matrix(x)
    if s_grid is None:
        pos = np.geomspace(0.05, 8.0, 40)
        s = np.concatenate([-pos[::-1], pos])
    else:
        s = _real_array("s_grid", s_grid)
        if s.ndim != 1 or s.size == 0:
            raise ValueError(f"s_grid must be a non-empty 1-D array, got shape {s.shape}")
        if (s == 0).any():
            raise ValueError("s_grid must not contain 0 (the ratio 2K(s)/s^2 is defined as a limit there)")
    n = a.shape[0]
    _, c, e_c, constant = _centred_scaled(a)
    if constant.any():
        raise ValueError(f"x has {int(constant.sum())} constant channel(s); drop them first")
    std_c = np.sqrt(np.mean(c * c, axis=0))
    z = c / std_c  # (a - mean) / std, scaled by the same power of two in every channel
    with np.errstate(over="ignore"):
        std = np.ldexp(std_c, e_c)
        overflow = not np.isfinite(std * std).all()
    if overflow:
        raise ValueError(
            f"the variance of x exceeds the float64 range (standard deviation up to "
            f"{np.max(std):.4g}); rescale x (the ratio does not depend on the unit)"
        )
    best = np.full(a.shape[1], -np.inf)
    arg = np.zeros(a.shape[1])
    log_n = math.log(n)
    for sv in s:
        k = special.logsumexp(sv * z, axis=0) - log_n
        r = 2.0 * k / (sv * sv)
        better = r > best
        best = np.where(better, r, best)
        arg = np.where(better, sv, arg)
    return {"ratio": best, "proxy": best * std**2, "s_star": arg, "s_grid": s}


def top_activations(h, attention_mask=None, k: int = 1) -> dict[str, np.ndarray]:
    r"""The ``k`` largest :math:`|h|` entries of each layer, where they sit, and the layer's median :math:`|h|`.

    Parameters
    ----------
    h : array_like or torch.Tensor, shape ``[L+1, batch, tokens, d]``
        A residual stream (:func:`companion.probes.residual_stream`).
    attention_mask : array_like or None, shape ``[batch, tokens]``
        1 for real tokens, 0 for pads (pads are ignored).  None: every position is real.
    k : int, default 1
        Entries reported per layer.

    Returns
    -------
    dict of numpy.ndarray
        ``"value"`` (signed), ``"batch"``, ``"position"``, ``"channel"`` of shape ``[L+1, k]``,
        sorted by decreasing :math:`|h|`; ``"median_abs"`` of shape ``[L+1]``, the median of
        :math:`|h|` over real tokens and channels; ``"ratio"`` = ``|value| / median_abs``.

    Raises
    ------
    TypeError
        If ``h`` is not real-valued or ``k`` not an integer.
    ValueError
        If ``h`` is not 4-D, the mask does not match ``h``'s batch and token axes or masks every
        position, ``k`` is not in ``[1, number of real entries]``, or ``h`` has NaN/inf.

    Notes
    -----
    :cite:t:`sun2024massive` call an activation *massive* when it exceeds 100 in magnitude and
    is about :math:`10^3` times the median magnitude of its layer; ``ratio`` is that second
    criterion.

    Examples
    --------
    >>> h = np.zeros((1, 1, 3, 4)); h[0, 0, 0, 2] = -50.0; h[0, 0, 1:, :] = 0.5
    >>> r = top_activations(h)
    >>> float(r["value"][0, 0]), int(r["position"][0, 0]), int(r["channel"][0, 0])
    (-50.0, 0, 2)
    """
    a = h.detach().cpu().numpy() if hasattr(h, "detach") else np.asarray(h)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"h must hold real numbers, got dtype {a.dtype}")
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.ndim != 4:
        raise ValueError(f"h must have shape [L+1, batch, tokens, d], got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("h contains NaN or infinite values; the model has overflowed")
    k = _positive_int("k", k)
    L1, B, T, d = a.shape
    if attention_mask is None:
        mask = np.ones((B, T), dtype=bool)
    else:
        raw = attention_mask.detach().cpu().numpy() if hasattr(attention_mask, "detach") else np.asarray(attention_mask)
        if not (raw.dtype == bool or np.issubdtype(raw.dtype, np.number)):
            raise TypeError(f"attention_mask must be a boolean or 0/1 array, got dtype {raw.dtype}")
        mask = raw != 0
        if mask.shape != (B, T):
            raise ValueError(f"attention_mask must have shape [batch, tokens] = {(B, T)}, got {mask.shape}")
    n_real = int(mask.sum()) * d
    if n_real == 0:
        raise ValueError("attention_mask masks every position; nothing to measure")
    if k > n_real:
        raise ValueError(f"k = {k} exceeds the {n_real} real entries per layer")
    absv = np.where(mask[None, :, :, None], np.abs(a), a.dtype.type(-1)).reshape(L1, -1)
    idx = np.argpartition(-absv, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(absv, idx, axis=1), axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1)
    b, p, c = np.unravel_index(idx, (B, T, d))
    value = np.take_along_axis(a.reshape(L1, -1), idx, axis=1).astype(np.float64)
    med = np.array([np.median(np.abs(a[l][mask])) for l in range(L1)], dtype=np.float64)
    with np.errstate(divide="ignore"):
        ratio = np.abs(value) / med[:, None]
    return {"value": value, "batch": b, "position": p, "channel": c, "median_abs": med, "ratio": ratio}


# --------------------------------------------------------------------------------------------
# attention logits
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueryKeyCapture:
    """Queries and keys of one attention layer over a batch of texts (real tokens only).

    Attributes
    ----------
    layer : int
        Block index.
    q : numpy.ndarray, shape ``[n_tokens, n_heads, d_k]``, float32
    k : numpy.ndarray, shape ``[n_tokens, n_kv_heads, d_k]``, float32
        For a model with rotary embeddings and ``rotary=True`` these are the rotated vectors, so
        that ``q[i, h] @ k[j, kv_head(h)]`` is exactly the logit before the ``1/sqrt(d_k)`` scale.
    text : numpy.ndarray of int, shape ``[n_tokens]``
        Index of the text each token belongs to.
    position : numpy.ndarray of int, shape ``[n_tokens]``
        Position of the token within its text (0 = first token).
    causal : bool
        Whether the model attends only to earlier positions.
    rotary : bool
        Whether rotary position embeddings were applied.
    scaling : float
        The factor the model multiplies logits by (``1/sqrt(d_k)`` for both offline models).
    """

    layer: int
    q: np.ndarray
    k: np.ndarray
    text: np.ndarray
    position: np.ndarray
    causal: bool
    rotary: bool
    scaling: float

    @property
    def n_heads(self) -> int:
        return self.q.shape[1]

    @property
    def d_k(self) -> int:
        return self.q.shape[2]

    def kv_head(self, head: int) -> int:
        """Key head read by query head ``head`` (grouped-query attention shares key heads)."""
        group = self.q.shape[1] // self.k.shape[1]
        return head // group


def _attention_parts(block):
    """(attention module, query linear, key linear) of one block, or ValueError."""
    import torch

    for mod in block.modules():
        for qn, kn in (("q_proj", "k_proj"), ("query", "key")):
            q, k = getattr(mod, qn, None), getattr(mod, kn, None)
            if isinstance(q, torch.nn.Linear) and isinstance(k, torch.nn.Linear):
                return mod, q, k
    raise ValueError(
        f"could not find separate query/key projections (q_proj/k_proj or query/key) in "
        f"{type(block).__name__}; models with a fused projection (GPT-2's c_attn) are not supported"
    )


def capture_queries_keys(m, texts, layers=None, max_length: int | None = None, rotary: bool = True,
                         batch_size: int = 16) -> list[QueryKeyCapture]:
    r"""Queries and keys of real attention layers, read with forward hooks on the q/k projections.

    Parameters
    ----------
    m : companion.models.LoadedModel
        A model whose blocks have separate query and key projections (Llama/SmolLM2, BERT/MiniLM).
    texts : sequence of str
        The texts (right-padded batches; pads are dropped from the result).
    layers : sequence of int or None
        Block indices in ``[0, L-1]`` (default: every block).
    max_length : int or None
        Truncation length (default ``m.max_length``).
    rotary : bool, default True
        Apply the model's rotary position embedding (if it has one) to the captured vectors, as
        the attention does; ``False`` returns the raw projections.
    batch_size : int, default 16
        Texts per forward pass.

    Returns
    -------
    list of QueryKeyCapture
        One per requested layer, in the order of ``layers``.

    Raises
    ------
    TypeError
        If ``m`` is not a LoadedModel or an argument has the wrong type.
    ValueError
        If a layer is out of range or repeated, ``texts`` is empty, or the model has no separate
        query/key projections.

    Notes
    -----
    Forward hooks on the projection modules read :math:`q = W_Q x + b_Q` and
    :math:`k = W_K x + b_K` exactly as the model computes them (no re-implementation of the
    normalisation before them).  For rotary models (Llama) a forward pre-hook on the attention
    module reads the ``position_embeddings`` ``(cos, sin)`` that the model passes, and the
    model's own ``apply_rotary_pos_emb`` rotates :math:`q, k`; then
    :math:`q_i\cdot k_j` is the logit the softmax sees before the ``scaling`` factor.  Because
    the rotation of position :math:`i` is orthogonal, :math:`q_i\cdot k_i` is the same with or
    without it; only pairs at different positions differ.

    Examples
    --------
    >>> caps = capture_queries_keys(load("minilm-l6"), ["In the beginning."], layers=[0])  # doctest: +SKIP
    >>> caps[0].q.shape                                                                   # doctest: +SKIP
    (6, 12, 32)
    """
    import torch

    from companion.hooks import hooks
    from companion.models import LoadedModel, tokenize

    if not isinstance(m, LoadedModel):
        raise TypeError(f"m must be a LoadedModel from companion.models.load, got {type(m).__name__}")
    if not isinstance(rotary, bool):
        raise TypeError(f"rotary must be True or False, got {rotary!r}")
    bs = _positive_int("batch_size", batch_size)
    L = m.n_layers
    if layers is None:
        layers = list(range(L))
    if isinstance(layers, Integral) and not isinstance(layers, bool):
        layers = [layers]
    if not isinstance(layers, (Sequence, np.ndarray, range)) or len(layers) == 0:
        raise ValueError("layers must be a non-empty list of block indices or None")
    layers = [_positive_int("every layer", l, 0) for l in layers]
    for l in layers:
        if not 0 <= l < L:
            raise ValueError(f"layer {l} is outside [0, {L - 1}] (block indices of {m.name})")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers contains repeats: {layers}")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence) or len(texts) == 0:
        raise ValueError("texts must be a non-empty list of strings")

    cfg = m.model.config
    n_heads = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    d_k = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    causal = m.kind == "causal-lm"

    parts = {l: _attention_parts(m.blocks[l]) for l in layers}
    got: dict = {}

    def out_hook(layer, name):
        def hook(module, args, output):
            got[(layer, name)] = output.detach()
        return hook

    def pre_hook(layer):
        def hook(module, args, kwargs):
            got[(layer, "pe")] = kwargs.get("position_embeddings")
        return hook

    qs = {l: [] for l in layers}
    ks = {l: [] for l in layers}
    text_idx, pos_idx = [], []
    rotated = False
    forward = [(lin, out_hook(l, name)) for l, (_, qlin, klin) in parts.items()
               for lin, name in ((qlin, "q"), (klin, "k"))]
    pre = [(attn, pre_hook(l)) for l, (attn, _, _) in parts.items()]
    with hooks(forward=forward, pre=pre, pre_with_kwargs=True):
        for start in range(0, len(texts), bs):
            chunk = list(texts[start:start + bs])
            enc = tokenize(m, chunk, max_length)
            kwargs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
            if "token_type_ids" in enc:
                kwargs["token_type_ids"] = enc["token_type_ids"]
            if causal:
                kwargs["use_cache"] = False
            got.clear()
            with torch.no_grad():
                m.base(**kwargs)
            keep = enc["attention_mask"].bool()
            B, T = keep.shape
            for l in layers:
                q = got[(l, "q")].reshape(B, T, n_heads, d_k)
                k = got[(l, "k")].reshape(B, T, n_kv, d_k)
                pe = got.get((l, "pe"))
                if rotary and pe is not None:
                    module = sys.modules[type(parts[l][0]).__module__]
                    apply = getattr(module, "apply_rotary_pos_emb", None)
                    if apply is None:
                        raise ValueError(f"{type(parts[l][0]).__name__} uses rotary embeddings but its module "
                                         "has no apply_rotary_pos_emb; pass rotary=False")
                    cos, sin = pe
                    q, _ = apply(q, q, cos, sin, unsqueeze_dim=2)
                    k, _ = apply(k, k, cos, sin, unsqueeze_dim=2)
                    rotated = True
                qs[l].append(q[keep].float().cpu().numpy())
                ks[l].append(k[keep].float().cpu().numpy())
            b_idx, p_idx = torch.nonzero(keep, as_tuple=True)
            text_idx.append((b_idx + start).cpu().numpy())
            pos_idx.append(p_idx.cpu().numpy())
    text_arr = np.concatenate(text_idx)
    pos_arr = np.concatenate(pos_idx)
    scaling = float(getattr(parts[layers[0]][0], "scaling", 1.0 / math.sqrt(d_k)))
    return [
        QueryKeyCapture(layer=l, q=np.concatenate(qs[l]), k=np.concatenate(ks[l]), text=text_arr,
                        position=pos_arr, causal=causal, rotary=rotated, scaling=scaling)
        for l in layers
    ]


def logit_pairs(cap: QueryKeyCapture, head: int, skip_first: bool = False, max_pairs: int | None = None,
                rng=None) -> tuple[np.ndarray, np.ndarray]:
    r"""Matched (query, key) pairs of one head: every pair the attention scores, within each text.

    Parameters
    ----------
    cap : QueryKeyCapture
    head : int
        Query head in ``[0, n_heads)``; its key head is ``cap.kv_head(head)``.
    skip_first : bool, default False
        Drop pairs whose key (or query) is the first token of its text (the attention sink).
    max_pairs : int or None
        Keep a uniform random subset of at most this many pairs.
    rng : None, int or numpy.random.Generator
        Randomness for the subset (default seed 0).

    Returns
    -------
    (q, k) : tuple of numpy.ndarray, each ``[P, d_k]``
        Row ``p`` is one scored pair: ``q[p] @ k[p]`` is a raw logit.  Causal models give the
        pairs with key position ≤ query position; encoders give all pairs.

    Raises
    ------
    TypeError
        If ``cap`` is not a QueryKeyCapture or an argument has the wrong type.
    ValueError
        If ``head`` is out of range, ``max_pairs < 1`` or no pair is left.

    Examples
    --------
    >>> q, k = logit_pairs(cap, head=0, max_pairs=10_000)   # doctest: +SKIP
    """
    if not isinstance(cap, QueryKeyCapture):
        raise TypeError(f"cap must be a QueryKeyCapture, got {type(cap).__name__}")
    if isinstance(head, bool) or not isinstance(head, Integral):
        raise TypeError(f"head must be an integer, got {type(head).__name__}")
    if not 0 <= head < cap.n_heads:
        raise ValueError(f"head {head} is outside [0, {cap.n_heads - 1}]")
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True or False, got {skip_first!r}")
    gen = _generator(rng)
    qi_all, kj_all = [], []
    starts = np.flatnonzero(np.r_[True, cap.text[1:] != cap.text[:-1]])
    ends = np.r_[starts[1:], cap.text.size]
    for s, e in zip(starts, ends):
        idx = np.arange(s, e)
        if skip_first:
            idx = idx[cap.position[idx] != 0]
        if idx.size == 0:
            continue
        ii, jj = np.meshgrid(idx, idx, indexing="ij")
        keep = (cap.position[jj] <= cap.position[ii]) if cap.causal else np.ones_like(ii, dtype=bool)
        qi_all.append(ii[keep])
        kj_all.append(jj[keep])
    if not qi_all:
        raise ValueError("no (query, key) pair is left; pass longer texts or skip_first=False")
    qi, kj = np.concatenate(qi_all), np.concatenate(kj_all)
    if max_pairs is not None:
        mp = _positive_int("max_pairs", max_pairs)
        if qi.size > mp:
            sel = np.sort(gen.choice(qi.size, size=mp, replace=False))
            qi, kj = qi[sel], kj[sel]
    return cap.q[qi, head].astype(np.float64), cap.k[kj, cap.kv_head(head)].astype(np.float64)


def dot_product_moments(mu_q, var_q, mu_k, var_k) -> tuple[np.ndarray, np.ndarray]:
    r"""Mean and variance of :math:`q\cdot k` for independent vectors with independent coordinates.

    Parameters
    ----------
    mu_q, var_q, mu_k, var_k : array_like, shape ``[..., d]``
        Coordinate means and variances (variances ``>= 0``) of :math:`q` and :math:`k`.

    Returns
    -------
    (mean, var) : tuple of numpy.ndarray, shape ``[...]``
        :math:`\sum_c \mu_{q,c}\mu_{k,c}` and
        :math:`\sum_c (\sigma_{q,c}^2\sigma_{k,c}^2 + \sigma_{q,c}^2\mu_{k,c}^2 + \sigma_{k,c}^2\mu_{q,c}^2)`.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If shapes differ, a variance is negative, an input is not finite, or the result exceeds
        the float64 range.

    Notes
    -----
    For independent :math:`a, b`: :math:`\mathrm{Var}(ab) = \sigma_a^2\sigma_b^2 + \sigma_a^2\mu_b^2
    + \sigma_b^2\mu_a^2`; independent coordinates add.  With zero means and unit variances the
    variance is :math:`d_k` -- it *grows* with :math:`d_k` -- and the :math:`1/\sqrt{d_k}` scale of
    :cite:t:`vaswani2017attention` brings it back to 1.  A shared mean with
    :math:`\mu_{q,c}\mu_{k,c} \approx m` in every coordinate makes the mean :math:`\approx m d_k`
    against a standard deviation :math:`\propto\sqrt{d_k}`: the signal-to-noise ratio grows like
    :math:`\sqrt{d_k}`, with or without the scale (a common factor cancels in the ratio).

    Examples
    --------
    >>> [float(v) for v in dot_product_moments(np.zeros(64), np.ones(64), np.zeros(64), np.ones(64))]
    [0.0, 64.0]
    """
    arrs = [_real_array(n, v, min_ndim=1) for n, v in
            (("mu_q", mu_q), ("var_q", var_q), ("mu_k", mu_k), ("var_k", var_k))]
    shape = arrs[0].shape
    if any(a.shape != shape for a in arrs):
        raise ValueError(f"mu_q, var_q, mu_k, var_k must share one shape, got {[a.shape for a in arrs]}")
    mq, vq, mk, vk = arrs
    if (vq < 0).any() or (vk < 0).any():
        raise ValueError("variances must be >= 0")
    with np.errstate(over="ignore", invalid="ignore"):
        mean = (mq * mk).sum(-1)
        var = (vq * vk + vq * mk**2 + vk * mq**2).sum(-1)
    if not (np.isfinite(mean).all() and np.isfinite(var).all()):
        raise ValueError(
            "the mean or variance of q.k exceeds the float64 range; rescale the inputs (the "
            "mean scales like the product of the scales of q and k, the variance like its square)"
        )
    return mean, var


def partial_dot_statistics(q, k, sizes=None, n_orders: int = 8, rng=None) -> dict[str, np.ndarray]:
    r"""How the logit :math:`q\cdot k` restricted to :math:`m` of the :math:`d_k` coordinates grows with :math:`m`.

    Parameters
    ----------
    q, k : array_like, shape ``[P, d_k]``
        Matched pairs (row ``p`` is one scored pair, e.g. from :func:`logit_pairs`), ``P >= 2``.
    sizes : sequence of int or None
        Sub-dimensions :math:`m` in ``[1, d_k]`` (default: ``1, 2, 4, ...`` and ``d_k``).
    n_orders : int, default 8
        Random coordinate orders averaged over (the first :math:`m` coordinates of each order
        form the subset).
    rng : None, int or numpy.random.Generator
        Randomness for the orders (default seed 0).

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[len(sizes)]`` (and ``"sizes"``)
        ``"mean"``, ``"var"``: mean and variance over pairs of
        :math:`\ell_m = \sum_{c \in S_m} q_c k_c`, averaged over orders; ``"var_scaled"``:
        :math:`\mathrm{Var}(\ell_m/\sqrt m)`; ``"snr"``: :math:`|E\ell_m|/\mathrm{sd}(\ell_m)` (per
        order, then averaged); ``"var_independent"``, ``"mean_independent"``: the same moments
        predicted by :func:`dot_product_moments` from each coordinate's mean and variance, i.e.
        if all coordinates and :math:`q, k` were independent.

    Raises
    ------
    TypeError
        If an input is not real-valued or ``n_orders`` is not an integer.
    ValueError
        If ``q`` and ``k`` are not matching 2-D arrays with at least 2 rows, a size is outside
        ``[1, d_k]``, or an input is not finite.

    Notes
    -----
    One pass per order: the per-coordinate products :math:`q_c k_c` are permuted and
    cumulatively summed, which yields :math:`\ell_m` for every :math:`m` at once.  For i.i.d.
    unit-variance coordinates ``var`` is linear in :math:`m` and ``var_scaled`` is flat; a
    shared mean makes ``snr`` grow like :math:`\sqrt m`; correlated coordinates make ``var``
    exceed ``var_independent``.

    Examples
    --------
    >>> g = np.random.default_rng(0)
    >>> out = partial_dot_statistics(g.standard_normal((20000, 64)), g.standard_normal((20000, 64)), sizes=[1, 64])
    >>> [round(float(v) / s) for v, s in zip(out["var"], out["sizes"])]
    [1, 1]
    """
    qa = _real_array("q", q)
    ka = _real_array("k", k)
    if qa.ndim != 2 or qa.shape != ka.shape or qa.shape[0] < 2:
        raise ValueError(f"q and k must be matching [P, d_k] arrays with P >= 2, got {qa.shape} and {ka.shape}")
    P, d = qa.shape
    if sizes is None:
        sz = sorted(set([2**i for i in range(int(math.log2(d)) + 1)] + [d]))
    else:
        sz = list(sizes)
        for s in sz:
            if isinstance(s, bool) or not isinstance(s, Integral):
                raise TypeError(f"sizes must be integers, got {s!r}")
            if not 1 <= s <= d:
                raise ValueError(f"every size must lie in [1, d_k={d}], got {s}")
    sz_arr = np.asarray(sz, dtype=np.int64)
    n_ord = _positive_int("n_orders", n_orders)
    gen = _generator(rng)
    prod = qa * ka
    mq, vq = qa.mean(0), qa.var(0)
    mk, vk = ka.mean(0), ka.var(0)
    ind_mean_c = mq * mk
    ind_var_c = vq * vk + vq * mk**2 + vk * mq**2
    acc = {key: np.zeros(sz_arr.size) for key in ("mean", "var", "var_scaled", "snr", "mean_independent", "var_independent")}
    for _ in range(n_ord):
        perm = gen.permutation(d)
        cum = np.cumsum(prod[:, perm], axis=1)[:, sz_arr - 1]
        mean = cum.mean(0)
        var = cum.var(0)
        acc["mean"] += mean
        acc["var"] += var
        acc["var_scaled"] += var / sz_arr
        with np.errstate(divide="ignore", invalid="ignore"):
            acc["snr"] += np.where(var > 0, np.abs(mean) / np.sqrt(np.where(var > 0, var, 1.0)), np.nan)
        acc["mean_independent"] += np.cumsum(ind_mean_c[perm])[sz_arr - 1]
        acc["var_independent"] += np.cumsum(ind_var_c[perm])[sz_arr - 1]
    out = {key: v / n_ord for key, v in acc.items()}
    out["sizes"] = sz_arr
    return out


def attention_logit_statistics(cap: QueryKeyCapture, skip_first: bool = False, max_pairs: int | None = 200_000,
                               rng=None) -> dict[str, np.ndarray]:
    r"""Per-head statistics of the raw attention logits :math:`q_i\cdot k_j` of one layer.

    Parameters
    ----------
    cap : QueryKeyCapture
    skip_first : bool, default False
        Drop pairs that involve the first token of a text (see :func:`logit_pairs`).
    max_pairs : int or None, default 200000
        Pairs per head (a random subset when there are more).
    rng : None, int or numpy.random.Generator

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[n_heads]``
        ``"mean"``, ``"var"`` of the raw logit; ``"var_scaled"`` of the logit times the model's
        ``scaling`` (:math:`1/\sqrt{d_k}`); ``"snr"`` :math:`|E\ell|/\mathrm{sd}(\ell)`;
        ``"shared_mean"``: :math:`\bar q\cdot\bar k` (the logit of the mean query and mean key);
        ``"var_independent"``: :func:`dot_product_moments` from the coordinates' means and
        variances; ``"q_norm2"``, ``"k_norm2"``: mean squared norms.

    Raises
    ------
    TypeError, ValueError
        As :func:`logit_pairs`.

    Notes
    -----
    Writing :math:`q = \bar q + \tilde q`, :math:`k = \bar k + \tilde k`,
    :math:`q\cdot k = \bar q\cdot\bar k + \bar q\cdot\tilde k + \tilde q\cdot\bar k + \tilde q\cdot\tilde k`;
    ``shared_mean`` is the first term.  The ratio ``var / var_independent`` measures how far the
    coordinates are from independent.

    Examples
    --------
    >>> st = attention_logit_statistics(caps[0])   # doctest: +SKIP
    """
    if not isinstance(cap, QueryKeyCapture):
        raise TypeError(f"cap must be a QueryKeyCapture, got {type(cap).__name__}")
    gen = _generator(rng)
    keys = ("mean", "var", "var_scaled", "snr", "shared_mean", "var_independent", "q_norm2", "k_norm2")
    out = {key: np.zeros(cap.n_heads) for key in keys}
    for h in range(cap.n_heads):
        q, k = logit_pairs(cap, h, skip_first=skip_first, max_pairs=max_pairs, rng=gen)
        logit = np.einsum("pc,pc->p", q, k)
        mean, var = logit.mean(), logit.var()
        out["mean"][h] = mean
        out["var"][h] = var
        out["var_scaled"][h] = var * cap.scaling**2
        out["snr"][h] = abs(mean) / math.sqrt(var) if var > 0 else np.nan
        out["shared_mean"][h] = float(q.mean(0) @ k.mean(0))
        out["var_independent"][h] = float(dot_product_moments(q.mean(0), q.var(0), k.mean(0), k.var(0))[1])
        out["q_norm2"][h] = float(np.mean(np.sum(q * q, axis=1)))
        out["k_norm2"][h] = float(np.mean(np.sum(k * k, axis=1)))
    return out
