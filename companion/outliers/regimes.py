r"""Channel regimes of real residual streams: predicted versus observed counts, tails, top activations.

The analysis of the chapter :doc:`/book/outliers_real_models`, applied to the statistics of
:func:`companion.outliers.channel_statistics.channel_statistics` (means :math:`\mu_j`, variances,
counts :math:`C_j(t) = \#\{i : |h_{ij}| > t\}`).  Per-channel arrays have the channel axis last
(``mu[..., d]``); per-threshold results have shape ``[..., n_t, d]``, the layout of
``ChannelStatistics.counts``.  An argument of the wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import special, stats

from companion.theory import exceedance
from companion._validation import (check_int, check_real, check_texts, check_thresholds, integer_counts,
                                  real_array)

__all__ = ["REGIMES", "classify_regime", "predicted_counts", "CountComparison", "compare_counts",
           "BoundTests", "bound_tests",
           "corpus_subset", "coarsen_thresholds", "tail_diagnostics", "gaussian_max_abs_quantile",
           "empirical_variance_proxy", "top_activations", "max_abs_z"]

#: Regime codes returned by :func:`classify_regime`, in order 0, 1, 2.
REGIMES = ("centred", "intermediate", "mean-dominated")


def _numeric_array(x, name: str, what: str) -> np.ndarray:
    """``x`` (array_like or torch tensor) as a numpy array of integers or floats; TypeError otherwise."""
    a = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"{name} must {what}, got dtype {a.dtype}")
    return a


def _mu_sigma(mu, sigma, positive: bool = True) -> tuple[np.ndarray, np.ndarray]:
    m = real_array("mu", mu, min_ndim=1)
    s = real_array("sigma", sigma, min_ndim=1)
    if m.shape != s.shape:
        raise ValueError(f"mu and sigma must have the same shape [..., d], got {m.shape} and {s.shape}")
    if positive and (s <= 0).any():
        raise ValueError(f"sigma must be > 0 in every channel, got {int((s <= 0).sum())} channel(s) with "
                         "sigma <= 0; drop constant channels before comparing counts")
    if not positive and (s < 0).any():
        raise ValueError(f"sigma must be >= 0, got min {s.min():.4g}")
    return m, s


# --- regimes and counts ---
def classify_regime(mu, sigma, thresholds, centred_tol: float = 0.1) -> np.ndarray:
    r"""Regime of every channel at every threshold: centred, intermediate or mean-dominated.

    Parameters
    ----------
    mu, sigma : array_like, shape ``[..., d]``
        Channel means and standard deviations (``sigma >= 0``).
    thresholds : array_like, shape ``[n_t]``, entries ``>= 0``
    centred_tol : float, default 0.1
        A channel counts as centred when :math:`|\mu_j| \le` ``centred_tol`` :math:`\cdot\sigma_j`.

    Returns
    -------
    numpy.ndarray of int8, shape ``[..., n_t, d]``
        Codes into :data:`REGIMES`: 2 if :math:`|\mu_j| > t` (mean-dominated, Theorem 1 applies),
        0 if the channel is centred and :math:`|\mu_j| \le t`, 1 otherwise.

    Raises
    ------
    ValueError
        If an input is not finite, shapes differ, or ``sigma``, a threshold or ``centred_tol`` is negative.

    Examples
    --------
    >>> classify_regime([0.0, 0.5, 3.0], [1.0, 1.0, 1.0], [2.0]).tolist()
    [[0, 1, 2]]
    """
    m, s = _mu_sigma(mu, sigma, positive=False)
    t = check_thresholds(thresholds)
    tol = check_real(centred_tol, "centred_tol", lo=0.0)
    return _classify_regime(m, s, t, tol)


def _classify_regime(m: np.ndarray, s: np.ndarray, t: np.ndarray, tol: float) -> np.ndarray:
    """:func:`classify_regime` on validated arrays."""
    a = np.abs(m)[..., None, :]
    tt = t[:, None]
    centred = a <= tol * s[..., None, :]
    return np.where(a > tt, 2, np.where(centred, 0, 1)).astype(np.int8)


def predicted_counts(mu, sigma, thresholds, n_tokens) -> dict[str, np.ndarray]:
    r"""Expected counts :math:`E[C_j(t)]` predicted from :math:`(\mu_j, \sigma_j)`: exact Gaussian and bounds.

    Parameters
    ----------
    mu, sigma : array_like, shape ``[..., d]``
        Fitted channel means and standard deviations (``sigma > 0``).
    thresholds : array_like, shape ``[n_t]``, entries ``>= 0``
    n_tokens : int
        Number of rows :math:`N` the statistics were computed from.

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[..., n_t, d]``
        ``"gaussian"``: :math:`N\,P(|\mu_j + \sigma_j G| > t)`, :math:`G \sim N(0,1)`; ``"lower"``: the
        one-sided Theorem 1 bound :math:`N(1 - e^{-(|\mu_j|-t)_+^2/(2\sigma_j^2)})`; ``"notes_lower"``: the
        note's :math:`N(1 - 2e^{-(|\mu_j|-t)^2/(2\sigma_j^2)})` where :math:`|\mu_j| > t` (NaN elsewhere,
        possibly negative); ``"upper"``:
        :math:`N\min(1, e^{-(t-|\mu_j|)_+^2/(2\sigma_j^2)} + e^{-(t+|\mu_j|)^2/(2\sigma_j^2)})`.

    Raises
    ------
    ValueError
        If ``n_tokens < 1``, ``sigma <= 0`` somewhere, or as :func:`classify_regime`.

    Examples
    --------
    >>> p = predicted_counts([[0.0, 3.0]], [[1.0, 1.0]], [1.0], 100)
    >>> [round(float(x), 2) for x in p["gaussian"][0, 0]]
    [31.73, 97.73]
    """
    m, s = _mu_sigma(mu, sigma)
    t = check_thresholds(thresholds)
    n = check_int(n_tokens, "n_tokens", 1)
    return _predicted_counts(m, s, t, n)


def _predicted_counts(m: np.ndarray, s: np.ndarray, t: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """:func:`predicted_counts` on validated arrays."""
    mm, ss = m[..., None, :], s[..., None, :]
    tt = t[:, None]
    out = {"gaussian": np.asarray(exceedance.expected_count_gaussian(n, mm, tt, ss), dtype=np.float64)}
    b = exceedance.theorem2_bounds(n, mm, tt, ss)
    return out | {k: np.asarray(getattr(b, k), dtype=np.float64) for k in ("lower", "notes_lower", "upper")}


@dataclass(frozen=True)
class CountComparison:
    """Observed against predicted exceedance counts, summed over the channels of each regime.

    Arrays have shape ``[..., n_t, 3]`` (the leading axes of ``mu``, e.g. layers; the last axis
    indexes :data:`REGIMES`) unless stated otherwise.
    """

    thresholds: np.ndarray  #: the thresholds, ``[n_t]``
    n_tokens: int  #: tokens ``N`` behind the statistics
    n_channels: np.ndarray  #: channels in each regime (int)
    observed: np.ndarray  #: sum over the regime's channels of the observed counts
    gaussian: np.ndarray  #: the same sum of the exact-Gaussian expectations of :func:`predicted_counts`
    lower: np.ndarray  #: the same sum of the Theorem 1 lower bounds
    upper: np.ndarray  #: the same sum of the Theorem 2 upper bounds
    #: channels whose observed count is significantly (binomial test at level ``alpha``) below the lower bound
    lower_violations: np.ndarray
    upper_violations: np.ndarray  #: the same above the upper bound
    channel_lower_violation: np.ndarray  #: ``[..., d]`` bool: below the bound at some threshold of the grid
    channel_upper_violation: np.ndarray  #: ``[..., d]`` bool: above the bound at some threshold of the grid
    alpha: float  #: level of the binomial tests

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


def compare_counts(counts, mu, sigma, thresholds, n_tokens, centred_tol: float = 0.1,
                   alpha: float = 1e-3) -> CountComparison:
    r"""Observed :math:`C_j(t)` against the exact-Gaussian prediction and the Theorem 1/2 bounds.

    Parameters
    ----------
    counts : array_like of int, shape ``[..., n_t, d]``
        Observed exceedance counts (``ChannelStatistics.counts``).
    mu, sigma, thresholds, n_tokens
        As in :func:`predicted_counts`, from the same tokens.
    centred_tol : float, default 0.1
        See :func:`classify_regime`.
    alpha : float, default 1e-3
        Level of the per-channel binomial test that flags a bound violation.

    Returns
    -------
    CountComparison

    Raises
    ------
    ValueError
        If counts are not integers in ``[0, n_tokens]`` of the right shape, ``alpha`` is not in (0, 1), or
        as :func:`predicted_counts`.

    Examples
    --------
    >>> cc = compare_counts([[[400, 990]]], [[0.0, 4.0]], [[1.0, 1.0]], [2.0], 1000)
    >>> cc.observed[0, 0].tolist(), cc.upper_violations[0, 0].tolist()
    ([400.0, 0.0, 990.0], [1, 0, 0])
    """
    c = _numeric_array(counts, "counts", "be an integer array")
    m, s = _mu_sigma(mu, sigma)
    t = check_thresholds(thresholds)
    n = check_int(n_tokens, "n_tokens", 1)
    expected = m.shape[:-1] + (t.size, m.shape[-1])
    if c.shape != expected:
        raise ValueError(f"counts must have shape mu.shape[:-1] + (len(thresholds), d) = {expected}, "
                         f"got {c.shape}")
    if not np.isfinite(c).all() or (c < 0).any() or (c > n).any() or (c != np.round(c)).any():
        raise ValueError(f"counts must be integers in [0, n_tokens={n}]")
    check_real(alpha, "alpha", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    tol = check_real(centred_tol, "centred_tol", lo=0.0)
    c = c.astype(np.float64)
    pred = _predicted_counts(m, s, t, n)
    reg = _classify_regime(m, s, t, tol)
    p_up = np.clip(pred["upper"] / n, 0.0, 1.0)
    p_lo = np.clip(pred["lower"] / n, 0.0, 1.0)
    # P(Bin(N, p_up) >= c) < alpha  /  P(Bin(N, p_lo) <= c) < alpha
    up_bad = (c > pred["upper"]) & (stats.binom.sf(c - 1, n, p_up) < alpha)
    lo_bad = (c < pred["lower"]) & (stats.binom.cdf(c, n, p_lo) < alpha)

    def by_regime(x):
        return np.stack([np.where(reg == k, x, 0).sum(-1) for k in range(len(REGIMES))], axis=-1)

    return CountComparison(
        thresholds=t, n_tokens=n, n_channels=by_regime(np.ones_like(c, dtype=np.int64)),
        observed=by_regime(c), gaussian=by_regime(pred["gaussian"]), lower=by_regime(pred["lower"]),
        upper=by_regime(pred["upper"]), lower_violations=by_regime(lo_bad.astype(np.int64)),
        upper_violations=by_regime(up_bad.astype(np.int64)), channel_lower_violation=lo_bad.any(axis=-2),
        channel_upper_violation=up_bad.any(axis=-2), alpha=float(alpha))


@dataclass(frozen=True)
class BoundTests:
    """Tests of counts against the Theorem 1/2 bounds that respect dependent tokens (:func:`bound_tests`).

    Per-pair arrays have shape ``[..., n_t, d]``; the family of the Holm rule is one ``[n_t, d]`` slice.
    """

    deff: np.ndarray  #: design effect of each count (between-text dispersion), ``>= 1``
    n_eff: np.ndarray  #: effective number of independent tokens ``N / deff``
    p_upper: np.ndarray  #: beta-binomial p-value of the count against the upper bound (1 where not above it)
    p_lower: np.ndarray  #: the same against the lower bound (1 where not below it)
    reject_upper: np.ndarray  #: bool, Holm's rejections at family-wise level ``alpha``
    reject_lower: np.ndarray  #: bool, the same for the lower bound
    alpha: float  #: family-wise error rate per slice

    @property
    def channel_upper(self) -> np.ndarray:
        """``[..., d]`` bool: the channel's count exceeds the upper bound at some threshold (FWER-controlled)."""
        return self.reject_upper.any(axis=-2)

    @property
    def channel_lower(self) -> np.ndarray:
        """``[..., d]`` bool: the channel's count is below the lower bound at some threshold."""
        return self.reject_lower.any(axis=-2)


def bound_tests(st, alpha: float = 0.05) -> BoundTests:
    r"""Counts of ``st`` against the Theorem 1/2 bounds, with dependent tokens and multiplicity control.

    For every (layer, threshold, channel), the design effect :math:`D` of the count is estimated from its
    between-text dispersion (:func:`companion.theory.exceedance.design_effect`); the count is compared with
    the bound's per-token probability :math:`p` = bound / :math:`N` under the beta-binomial law of variance
    :math:`Np(1-p)D` (:func:`~companion.theory.exceedance.dependent_count_pvalue`); and within each layer
    Holm's rule over all thresholds and channels keeps the family-wise error at ``alpha``.

    Parameters
    ----------
    st : ChannelStatistics
        From :func:`~companion.outliers.channel_statistics.channel_statistics` with
        ``block_statistics=True`` (at least two texts).
    alpha : float, default 0.05
        Family-wise error rate per layer.

    Returns
    -------
    BoundTests

    Raises
    ------
    ValueError
        If ``st`` carries no block statistics, or ``alpha`` is not in (0, 1).
    """
    _check_statistics(st)
    if getattr(st, "block_sum_sq", None) is None or getattr(st, "block_sizes", None) is None:
        raise ValueError("st carries no block statistics: compute it with channel_statistics(..., "
                         "block_statistics=True)")
    check_real(alpha, "alpha", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    n = int(st.n_tokens)
    c = np.asarray(st.counts, dtype=np.float64)
    de = exceedance.design_effect(c, st.block_sum_sq, st.block_sizes)
    pred = _predicted_counts(np.asarray(st.mean, dtype=np.float64), np.sqrt(st.var), st.thresholds, n)
    p_up = np.clip(pred["upper"] / n, 0.0, 1.0)
    p_lo = np.clip(pred["lower"] / n, 0.0, 1.0)
    deff = np.minimum(de.deff, n - 1.0) if n > 1 else de.deff
    p_upper = np.where(c > pred["upper"], exceedance.dependent_count_pvalue(c, n, p_up, deff, "upper"), 1.0)
    p_lower = np.where(c < pred["lower"], exceedance.dependent_count_pvalue(c, n, p_lo, deff, "lower"), 1.0)
    lead = c.shape[:-2]
    rej_up, rej_lo = np.zeros(c.shape, dtype=bool), np.zeros(c.shape, dtype=bool)
    for idx in np.ndindex(*lead):
        rej_up[idx] = exceedance.holm_reject(p_upper[idx], alpha)
        rej_lo[idx] = exceedance.holm_reject(p_lower[idx], alpha)
    return BoundTests(deff=de.deff, n_eff=de.n_eff, p_upper=p_upper, p_lower=p_lower,
                      reject_upper=rej_up, reject_lower=rej_lo, alpha=float(alpha))


def corpus_subset(m, texts, max_tokens: int, max_length: int | None = None) -> list[str]:
    r"""The longest prefix of ``texts`` whose token count (after truncation) stays within a budget.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
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
    ValueError
        If ``texts`` is empty or ``max_tokens < 1``.
    """
    budget = check_int(max_tokens, "max_tokens", 1)
    texts = check_texts(texts)
    limit = m.max_length if max_length is None else check_int(max_length, "max_length", 2)
    out: list[str] = []
    total = 0
    for s in texts:
        k = min(len(m.tokenizer(s)["input_ids"]), limit)
        if out and total + k > budget:
            break
        out.append(s)
        total += k
    return out


# --- tails ---
def _sample_matrix(x) -> np.ndarray:
    a = real_array("x", x, min_ndim=1)
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
        ``"mean"``, ``"std"`` (population, ``ddof=0``), ``"excess_kurtosis"`` :math:`m_4/m_2^2 - 3`,
        ``"max_abs_z"`` :math:`\max_i |x_i - \bar x|/s`, each of shape ``[d]``, and ``"n"`` (int).
        Constant channels get NaN kurtosis and ``max_abs_z`` 0.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 4 samples, more than 2 dimensions, or NaN/inf values.

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
    """Channel means and the deviations ``a - mean`` divided by a power of two per channel."""
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
    ValueError
        If ``n < 1`` or ``q`` is not in (0, 1).

    Examples
    --------
    >>> round(gaussian_max_abs_quantile(1), 4)        # median of |G|
    0.6745
    """
    arr = integer_counts("n", n).astype(np.float64)  # also Python ints beyond the int64 range
    check_real(q, "q")
    if not (0.0 < q < 1.0):
        raise ValueError(f"q must lie strictly between 0 and 1, got {q!r}")
    log_r = math.log(q) / arr  # r = q**(1/n) = P(|G| <= m)
    tail = -np.expm1(log_r)  # 1 - r
    out = -special.ndtri(tail / 2.0)
    # r < 1e-3: 1 - r keeps too few digits of r (m = 0.0 for q = 1e-300, n = 10); there
    # P(|G| <= m) = erf(m / sqrt 2) = r inverts with full precision
    small = log_r < math.log(1e-3)
    if np.any(small):
        out = np.where(small, math.sqrt(2.0) * special.erfinv(np.exp(np.minimum(log_r, 0.0))), out)
    return float(out) if out.ndim == 0 else out


def empirical_variance_proxy(x, s_grid=None) -> dict[str, np.ndarray]:
    r"""Plug-in optimal variance proxy :math:`\sup_\lambda 2\log\hat E e^{\lambda(X-\bar X)}/\lambda^2`.

    Parameters
    ----------
    x : array_like, shape ``[n]`` or ``[n, d]``
        Samples along axis 0 (at least 4), channels along axis 1; no constant channel.
    s_grid : array_like or None
        Non-zero values of :math:`s = \lambda\hat\sigma_j` (the grid is standardised per channel).
        Default: 80 points, :math:`\pm` a geometric grid from 0.05 to 8.

    Returns
    -------
    dict
        ``"ratio"``: the estimate over the sample variance (1 for a Gaussian in the limit), ``"proxy"``:
        the estimate :math:`\hat\sigma^2_{\rm opt}`, ``"s_star"``: the maximising :math:`s`, each of
        shape ``[d]``; ``"s_grid"``.

    Raises
    ------
    ValueError
        As :func:`tail_diagnostics`; for a constant channel, a variance beyond float64, or a bad ``s_grid``.

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
        s = real_array("s_grid", s_grid)
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
        raise ValueError(f"the variance of x exceeds the float64 range (standard deviation up to "
                         f"{np.max(std):.4g}); rescale x (the ratio does not depend on the unit)")
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
    r"""The ``k`` largest :math:`|h|` of each layer, where they sit, and the layer's median :math:`|h|`.

    Parameters
    ----------
    h : array_like or torch.Tensor, shape ``[L+1, batch, tokens, d]``
        A residual stream (:func:`companion.transformers.stream.residual_stream`).
    attention_mask : array_like or None, shape ``[batch, tokens]``
        1 for real tokens, 0 for pads (pads are ignored).  None: every position is real.
    k : int, default 1
        Entries reported per layer.

    Returns
    -------
    dict of numpy.ndarray
        ``"value"`` (signed), ``"batch"``, ``"position"``, ``"channel"`` of shape ``[L+1, k]``, by
        decreasing :math:`|h|`; ``"median_abs"`` of shape ``[L+1]``, the median of :math:`|h|` over real
        tokens and channels; ``"ratio"`` = ``|value| / median_abs``.

    Raises
    ------
    ValueError
        If ``h`` is not finite 4-D, the mask has the wrong shape or masks everything, or ``k`` is too large.

    Examples
    --------
    >>> h = np.zeros((1, 1, 3, 4)); h[0, 0, 0, 2] = -50.0; h[0, 0, 1:, :] = 0.5
    >>> top_activations(h)["ratio"].tolist()      # -50 against a median |h| of 0.5
    [[100.0]]
    """
    a = _numeric_array(h, "h", "hold real numbers")
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.ndim != 4:
        raise ValueError(f"h must have shape [L+1, batch, tokens, d], got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("h contains NaN or infinite values; the model has overflowed")
    k = check_int(k, "k", 1)
    L1, B, T, d = a.shape
    if attention_mask is None:
        mask = np.ones((B, T), dtype=bool)
    else:
        raw = (attention_mask.detach().cpu().numpy() if hasattr(attention_mask, "detach")
               else np.asarray(attention_mask))
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


# --- views of stored statistics ---
def _check_statistics(st) -> None:
    from companion.outliers.channel_statistics import ChannelStatistics

    if not isinstance(st, ChannelStatistics):
        raise TypeError(f"st must be a companion.outliers.channel_statistics.ChannelStatistics (from "
                        "channel_statistics or experiments.channel_statistics.statistics_of), "
                        f"got {type(st).__name__}")


def coarsen_thresholds(st, step: int = 2, start: int = 0):
    r"""The same statistics on every ``step``-th threshold of the grid (``thresholds[start::step]``).

    Parameters
    ----------
    st : companion.outliers.channel_statistics.ChannelStatistics
    step : int, default 2
        Keep every ``step``-th threshold (``>= 1``).
    start : int, default 0
        Index of the first threshold kept (``0 <= start < len(st.thresholds)``).

    Returns
    -------
    companion.outliers.channel_statistics.ChannelStatistics
        Means, variances and extremes unchanged; ``counts`` and ``thresholds`` subsampled.

    Raises
    ------
    ValueError
        If ``step < 1`` or ``start`` is outside the grid.
    """
    _check_statistics(st)
    step = check_int(step, "step", 1)
    start = check_int(start, "start", 0)
    if start >= st.thresholds.size:
        raise ValueError(f"start = {start} is outside the grid of {st.thresholds.size} thresholds")
    sq = None if st.block_sum_sq is None else st.block_sum_sq[:, start::step]
    return replace(st, counts=st.counts[:, start::step], thresholds=st.thresholds[start::step], block_sum_sq=sq)


def max_abs_z(st) -> np.ndarray:
    r"""Largest standardised deviation of every channel, from the streamed minimum and maximum.

    Parameters
    ----------
    st : companion.outliers.channel_statistics.ChannelStatistics

    Returns
    -------
    numpy.ndarray, shape ``[L+1, d]``
        :math:`\max(\max_i h_{ij} - \mu_j,\ \mu_j - \min_i h_{ij})/\sigma_j` (``inf`` for a constant
        channel with a non-zero deviation, NaN for ``0/0``).
    """
    _check_statistics(st)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(st.max - st.mean, st.mean - st.min) / st.std
