"""Counts of dependent tokens: design effect, beta-binomial p-values, Holm's rule, block statistics.

Each function is checked against an independent computation: a one-way ANOVA on the explicit 0/1
indicators, simulations of dependent Bernoulli blocks with a known design effect, the beta-binomial
pmf summed from its closed form, and Holm's adjusted p-values.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from companion.theory import exceedance as ex


def _blocks(rng, sizes, p, rho, reps):
    """``reps`` corpora of dependent Bernoulli blocks: block b has its own rate p_b ~ Beta (corr. rho)."""
    theta = 1.0 / rho - 1.0
    rates = rng.beta(p * theta, (1 - p) * theta, size=(reps, len(sizes)))
    return rng.binomial(np.asarray(sizes)[None, :], rates)            # [reps, k] block counts


def _stats(block_counts, sizes):
    sizes = np.asarray(sizes, dtype=np.float64)
    return block_counts.sum(-1), (block_counts ** 2 / sizes).sum(-1)


def test_design_effect_equals_anova_on_the_indicators():
    rng = np.random.default_rng(0)
    sizes = [5, 9, 14, 3, 20, 11]
    ind = [rng.random(n) < rng.uniform(0.05, 0.6) for n in sizes]
    cb = np.array([x.sum() for x in ind])
    c, s = _stats(cb, sizes)
    # one-way ANOVA computed from the indicators themselves
    allx = np.concatenate(ind).astype(float)
    grand, k, n = allx.mean(), len(sizes), allx.size
    ssb = sum(len(x) * (x.mean() - grand) ** 2 for x in ind)
    ssw = sum(((x - x.mean()) ** 2).sum() for x in ind)
    msb, msw = ssb / (k - 1), ssw / (n - k)
    n0 = (n - sum(m * m for m in sizes) / n) / (k - 1)
    rho = max(0.0, (msb - msw) / (msb + (n0 - 1) * msw))
    de = ex.design_effect(c, s, sizes)
    assert de.rho == pytest.approx(rho, rel=1e-12, abs=1e-12)
    n_w = sum(m * m for m in sizes) / n
    assert de.deff == pytest.approx(1 + (n_w - 1) * rho) and de.n_eff == pytest.approx(n / de.deff)


def test_design_effect_recovers_a_known_dependence_by_simulation():
    rng = np.random.default_rng(1)
    sizes = rng.integers(40, 160, size=60)
    p, rho = 0.1, 0.05
    cb = _blocks(rng, sizes, p, rho, reps=400)
    c, s = _stats(cb, sizes)
    de = ex.design_effect(c, s, sizes)
    n, n_w = sizes.sum(), (sizes ** 2).sum() / sizes.sum()
    true_deff = 1 + (n_w - 1) * rho
    # the estimate is unbiased to a few per cent, and the variance of C over the replicates is D times
    # the binomial one
    assert np.mean(de.rho) == pytest.approx(rho, rel=0.1)
    assert np.median(de.deff) == pytest.approx(true_deff, rel=0.15)
    assert c.var() / (n * p * (1 - p)) == pytest.approx(true_deff, rel=0.2)
    # independent tokens: design effect near 1
    ind = rng.binomial(sizes[None, :], p, size=(400, sizes.size))
    assert np.median(ex.design_effect(*_stats(ind, sizes), sizes).deff) < 1.2


def test_design_effect_edge_cases_and_errors():
    de = ex.design_effect([0, 40], [0.0, 40.0], [10, 10, 10, 10])       # none / every token
    assert de.rho.tolist() == [0.0, 0.0] and de.deff.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="at least 2"):
        ex.design_effect([1], [1.0], [5])
    with pytest.raises(ValueError, match=">= 1"):
        ex.design_effect([1], [1.0], [5, 0])
    with pytest.raises(ValueError, match="same shape"):
        ex.design_effect([1, 2], [1.0], [5, 5])
    with pytest.raises(ValueError, match="integer counts"):
        ex.design_effect([11], [11.0], [5, 5])
    with pytest.raises(ValueError, match="C\\^2 / N, C"):
        ex.design_effect([4], [5.0], [5, 5])
    with pytest.raises(TypeError):
        ex.design_effect(["a"], [1.0], [5, 5])


def test_pvalue_is_binomial_without_dependence_and_the_betabinomial_pmf_otherwise():
    n, p = 60, 0.15
    c = np.arange(n + 1)
    np.testing.assert_allclose(ex.dependent_count_pvalue(c, n, p), stats.binom.sf(c - 1, n, p), rtol=1e-12)
    # beta-binomial pmf from its closed form, summed by hand
    deff = 3.0
    theta = (n - 1) / (deff - 1) - 1
    a, b = p * theta, (1 - p) * theta
    logpmf = (special.gammaln(n + 1) - special.gammaln(c + 1) - special.gammaln(n - c + 1)
              + special.betaln(c + a, n - c + b) - special.betaln(a, b))
    pmf = np.exp(logpmf)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    mean = (c * pmf).sum()
    var = ((c - mean) ** 2 * pmf).sum()
    assert mean == pytest.approx(n * p) and var == pytest.approx(n * p * (1 - p) * deff)
    upper = pmf[::-1].cumsum()[::-1]
    lower = pmf.cumsum()
    np.testing.assert_allclose(ex.dependent_count_pvalue(c, n, p, deff), upper, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(ex.dependent_count_pvalue(c, n, p, deff, tail="lower"), lower, rtol=1e-9,
                               atol=1e-13)


def test_binomial_is_anti_conservative_and_the_fitted_law_is_not():
    rng = np.random.default_rng(2)
    sizes = np.full(40, 100)
    p, rho = 0.05, 0.03
    cb = _blocks(rng, sizes, p, rho, reps=4000)
    c, s = _stats(cb, sizes)
    n = int(sizes.sum())
    de = ex.design_effect(c, s, sizes)
    level = 0.01
    binom_rate = np.mean(ex.dependent_count_pvalue(c, n, p) < level)
    fitted_rate = np.mean(ex.dependent_count_pvalue(c, n, p, np.minimum(de.deff, n - 1)) < level)
    assert binom_rate > 5 * level          # the binomial law rejects a true null far too often
    assert fitted_rate <= 2 * level        # the fitted beta-binomial keeps roughly its level


def test_pvalue_errors():
    with pytest.raises(ValueError, match="integers in"):
        ex.dependent_count_pvalue(11, 10, 0.5)
    with pytest.raises(ValueError, match="p must"):
        ex.dependent_count_pvalue(1, 10, 1.5)
    with pytest.raises(ValueError, match="deff"):
        ex.dependent_count_pvalue(1, 10, 0.5, deff=0.5)
    with pytest.raises(ValueError, match="deff"):
        ex.dependent_count_pvalue(1, 10, 0.5, deff=10.0)
    with pytest.raises(ValueError, match="tail"):
        ex.dependent_count_pvalue(1, 10, 0.5, tail="both")


def _holm_adjusted(p):
    """Holm's adjusted p-values: max over j <= i of min(1, (m - j + 1) p_(j))."""
    order = np.argsort(p, kind="stable")
    m = p.size
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def test_holm_agrees_with_adjusted_pvalues_and_controls_fwer():
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.uniform(0, 0.05, size=rng.integers(1, 30)) ** rng.uniform(0.5, 2)
        np.testing.assert_array_equal(ex.holm_reject(p, 0.05), _holm_adjusted(p) <= 0.05)
    # global null with strongly dependent tests: the family-wise error stays below alpha
    z = rng.standard_normal((4000, 1)) * 0.9 + rng.standard_normal((4000, 50)) * np.sqrt(1 - 0.81)
    pv = stats.norm.sf(z)
    fwer = np.mean([ex.holm_reject(row, 0.1).any() for row in pv])
    assert fwer <= 0.1
    assert ex.holm_reject(np.array([[0.001, 0.5], [0.2, 0.004]]), 0.05).tolist() == [[True, False],
                                                                                      [False, True]]


def test_holm_errors():
    with pytest.raises(ValueError, match="pvalues"):
        ex.holm_reject([1.2])
    with pytest.raises(ValueError, match="alpha"):
        ex.holm_reject([0.1], alpha=1.0)


def test_channel_statistics_block_statistics_match_per_text_counts():
    from companion.outliers import channel_statistics as cs
    from companion.outliers import regimes
    from companion.transformers import models, stream
    import torch

    m = models.load("minilm-l6", device="cpu")
    texts = ["The cat sat on the mat.", "A much longer sentence, here to make the padding matter.",
             "Short one.", "Another text about rivers and the sea and boats."]
    t = [0.5, 2.0]
    st = cs.channel_statistics(m, texts, t, batch_size=3, skip_first=True, block_statistics=True)
    plain = cs.channel_statistics(m, texts, t, batch_size=3, skip_first=True)
    np.testing.assert_array_equal(st.counts, plain.counts)
    assert plain.block_sum_sq is None
    sq, sizes = 0.0, []
    for text in texts:                                  # one text at a time, directly
        h = stream.residual_stream(m, [text])[:, 0, 1:].double()       # first token left out
        cb = (h.abs().unsqueeze(1) > torch.tensor(t, dtype=torch.float64).view(1, -1, 1, 1)).sum(2)
        sq = sq + cb.numpy() ** 2 / h.shape[1]
        sizes.append(h.shape[1])
    assert sorted(st.block_sizes.tolist()) == sorted(sizes) and st.block_sizes.sum() == st.n_tokens
    np.testing.assert_allclose(st.block_sum_sq, sq, rtol=1e-9, atol=0.2)
    bt = regimes.bound_tests(st)
    assert bt.deff.shape == st.counts.shape and (bt.deff >= 1).all()
    assert bt.channel_upper.shape == st.mean.shape
    with pytest.raises(ValueError, match="block statistics"):
        regimes.bound_tests(plain)
