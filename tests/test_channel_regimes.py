"""Tests of companion.outliers.regimes and companion.outliers.attention_logits: every statistic against a direct computation, and every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from tiny_transformers import minilm_tokenizer, tiny_transformer

from companion.outliers import attention_logits as a
from companion.outliers import regimes as o

RNG = np.random.default_rng(12345)


# --------------------------------------------------------------------------- regimes and counts
def test_classify_regime_matches_a_direct_loop():
    mu = RNG.normal(0, 2, size=(3, 7))
    sigma = RNG.uniform(0.5, 2, size=(3, 7))
    mu[0, 0] = 0.0
    mu[1, 1] = 0.05 * sigma[1, 1]
    t = np.array([0.0, 0.5, 1.0, 3.0])
    reg = o.classify_regime(mu, sigma, t, centred_tol=0.1)
    assert reg.shape == (3, 4, 7) and reg.dtype == np.int8
    for a in range(3):
        for k in range(4):
            for j in range(7):
                m, s, tt = abs(mu[a, j]), sigma[a, j], t[k]
                want = 2 if m > tt else (0 if m <= 0.1 * s else 1)
                assert reg[a, k, j] == want
    assert o.REGIMES[reg[0, 1, 0]] == "centred"


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        (([0.0], [-1.0], [1.0]), {}, ValueError, "sigma must be >= 0"),
        (([0.0], [1.0], [-1.0]), {}, ValueError, "thresholds must be >= 0"),
        (([np.nan], [1.0], [1.0]), {}, ValueError, "NaN or infinite"),
        (([0.0, 1.0], [1.0], [1.0]), {}, ValueError, "same shape"),
        (([0.0], [1.0], [1.0]), {"centred_tol": -0.1}, ValueError, "centred_tol"),
        ((["a"], [1.0], [1.0]), {}, TypeError, "real numbers"),
        (([0.0], [1.0], [[1.0, 2.0]]), {}, ValueError, "1-D"),
        ((0.0, 1.0, [1.0]), {}, ValueError, "at least 1 dimension"),
    ],
)
def test_classify_regime_rejects_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        o.classify_regime(*args, **kwargs)


def test_predicted_counts_against_scipy_and_the_formulas():
    mu = np.array([[0.0, 0.7, -2.5, 4.0]])
    sigma = np.array([[1.0, 0.5, 1.2, 2.0]])
    t = np.array([0.5, 1.0, 3.0])
    N = 1234
    p = o.predicted_counts(mu, sigma, t, N)
    for k, tt in enumerate(t):
        for j in range(4):
            m, s = mu[0, j], sigma[0, j]
            exact = N * (stats.norm.sf(tt, loc=m, scale=s) + stats.norm.cdf(-tt, loc=m, scale=s))
            assert p["gaussian"][0, k, j] == pytest.approx(exact, rel=1e-10)
            u = abs(m) - tt
            low = N * (1 - math.exp(-max(u, 0) ** 2 / (2 * s * s)))
            up = N * min(1.0, math.exp(-max(tt - abs(m), 0) ** 2 / (2 * s * s)) + math.exp(-(tt + abs(m)) ** 2 / (2 * s * s)))
            assert p["lower"][0, k, j] == pytest.approx(low, rel=1e-12, abs=1e-12)
            assert p["upper"][0, k, j] == pytest.approx(up, rel=1e-12)
            if u > 0:
                assert p["notes_lower"][0, k, j] == pytest.approx(N * (1 - 2 * math.exp(-u * u / (2 * s * s))))
            else:
                assert np.isnan(p["notes_lower"][0, k, j])


@settings(max_examples=60, deadline=None)
@given(
    mu=st.floats(-20, 20),
    sigma=st.floats(0.01, 10),
    t=st.floats(0, 30),
)
def test_gaussian_expectation_lies_between_the_bounds(mu, sigma, t):
    # a Gaussian is sigma^2-sub-Gaussian, so the Theorem 1/2 bounds must bracket its exact count
    p = o.predicted_counts([mu], [sigma], [t], 1000)
    g, lo, up = p["gaussian"][0, 0], p["lower"][0, 0], p["upper"][0, 0]
    assert lo <= g * (1 + 1e-9) + 1e-9
    assert g <= up * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize(
    "n_tokens, exc, match",
    [(0, ValueError, "n_tokens must be >= 1"), (1.5, TypeError, "n_tokens must be an integer"), (True, TypeError, "integer")],
)
def test_predicted_counts_rejects_bad_n(n_tokens, exc, match):
    with pytest.raises(exc, match=match):
        o.predicted_counts([0.0], [1.0], [1.0], n_tokens)


def test_predicted_counts_rejects_zero_sigma():
    with pytest.raises(ValueError, match="sigma must be > 0"):
        o.predicted_counts([0.0, 1.0], [1.0, 0.0], [1.0], 10)


def _simulated_statistics(noise, N=20000, d=40, seed=0):
    g = np.random.default_rng(seed)
    mu = np.concatenate([np.zeros(d // 4), g.normal(0, 0.3, d // 4), g.choice([-1, 1], d // 2) * g.uniform(2, 6, d // 2)])
    scale = g.uniform(0.5, 1.5, d)
    if noise == "gaussian":
        z = g.standard_normal((N, d))
    else:  # Student t with 3 degrees of freedom, standardised: heavy tails
        z = g.standard_t(3, size=(N, d)) / math.sqrt(3.0)
    x = mu + scale * z
    t = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    counts = (np.abs(x)[:, None, :] > t[None, :, None]).sum(0)
    return x, t, counts


def test_compare_counts_matches_direct_sums_and_flags_heavy_tails():
    for noise in ("gaussian", "t3"):
        x, t, counts = _simulated_statistics(noise)
        N = x.shape[0]
        m, s = x.mean(0), x.std(0)
        cc = o.compare_counts(counts[None], m[None], s[None], t, N)
        reg = o.classify_regime(m[None], s[None], t)[0]
        pred = o.predicted_counts(m, s, t, N)
        for k in range(t.size):
            for r in range(3):
                sel = reg[k] == r
                assert cc.n_channels[0, k, r] == sel.sum()
                assert cc.observed[0, k, r] == counts[k, sel].sum()
                assert cc.gaussian[0, k, r] == pytest.approx(pred["gaussian"][k, sel].sum())
                assert cc.upper[0, k, r] == pytest.approx(pred["upper"][k, sel].sum())
                assert cc.lower[0, k, r] == pytest.approx(pred["lower"][k, sel].sum())
        assert cc.n_channels.sum(-1).tolist() == [[x.shape[1]] * t.size]
        assert cc.channel_upper_violation.shape == (1, x.shape[1])
        assert (cc.channel_upper_violation.sum() >= cc.upper_violations[0].sum(-1)).all()
        # per-channel flags agree with a direct binomial test
        up = pred["upper"]
        direct = ((counts > up) & (stats.binom.sf(counts - 1, N, np.clip(up / N, 0, 1)) < 1e-3)).any(0)
        assert cc.channel_upper_violation[0].tolist() == direct.tolist()
        if noise == "gaussian":
            # Gaussian data obey both bounds: no significant violation anywhere
            assert cc.upper_violations.sum() == 0 and cc.lower_violations.sum() == 0
            assert np.allclose(cc.ratio()[0], 1.0, rtol=0.1)
        else:
            # t(3) tails exceed the sub-Gaussian bound built from the variance at large t
            assert cc.upper_violations[0, -1].sum() > 0
            assert cc.ratio("centred")[0, 3] > 2.0
    assert cc.ratio("mean-dominated").shape == (1, t.size)
    with pytest.raises(ValueError, match="unknown regime"):
        cc.ratio("heavy")


def test_compare_counts_rejects_bad_input():
    mu, s, t = np.zeros((2, 3)), np.ones((2, 3)), [1.0, 2.0]
    good = np.zeros((2, 2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="counts must have shape"):
        o.compare_counts(np.zeros((2, 3, 2), dtype=int), mu, s, t, 10)
    with pytest.raises(ValueError, match="integers in"):
        o.compare_counts(good - 1, mu, s, t, 10)
    with pytest.raises(ValueError, match="integers in"):
        o.compare_counts(good + 11, mu, s, t, 10)
    with pytest.raises(ValueError, match="integers in"):
        o.compare_counts(good + 0.5, mu, s, t, 10)
    with pytest.raises(TypeError, match="integer array"):
        o.compare_counts(np.full((2, 2, 3), "a"), mu, s, t, 10)
    with pytest.raises(ValueError, match="alpha"):
        o.compare_counts(good, mu, s, t, 10, alpha=1.5)


# --------------------------------------------------------------------------- tails
def test_tail_diagnostics_against_scipy():
    x = np.column_stack([RNG.standard_normal(5000), RNG.standard_t(4, 5000), RNG.uniform(-1, 3, 5000)])
    d = o.tail_diagnostics(x)
    np.testing.assert_allclose(d["excess_kurtosis"], stats.kurtosis(x, axis=0, fisher=True, bias=True), rtol=1e-10)
    np.testing.assert_allclose(d["std"], x.std(0), rtol=1e-12)
    np.testing.assert_allclose(d["max_abs_z"], np.abs(x - x.mean(0)).max(0) / x.std(0), rtol=1e-12)
    assert d["n"] == 5000
    # uniform: excess kurtosis -6/5; t(4): heavy, positive
    assert d["excess_kurtosis"][2] == pytest.approx(-1.2, abs=0.05)
    assert d["excess_kurtosis"][1] > 1.0
    one = o.tail_diagnostics(x[:, 0])
    assert one["excess_kurtosis"].shape == (1,)
    const = o.tail_diagnostics(np.ones((10, 1)))
    assert np.isnan(const["excess_kurtosis"][0]) and const["max_abs_z"][0] == 0


@pytest.mark.parametrize(
    "x, exc, match",
    [
        (np.zeros((3, 2)), ValueError, "at least 4 samples"),
        (np.zeros((5, 2, 2)), ValueError, r"shape \[n\] or \[n, d\]"),
        (np.array([1.0, np.inf, 0, 0, 0]), ValueError, "NaN or infinite"),
        (np.array(["a"] * 5), TypeError, "real numbers"),
    ],
)
def test_tail_diagnostics_rejects_bad_input(x, exc, match):
    with pytest.raises(exc, match=match):
        o.tail_diagnostics(x)


def test_gaussian_max_abs_quantile_is_exact():
    for n in (1, 7, 1000, 10**7):
        for q in (0.1, 0.5, 0.9):
            m = o.gaussian_max_abs_quantile(n, q)
            # P(max |G| <= m) = (1 - 2 Phi(-m))^n
            assert n * math.log1p(-2 * stats.norm.sf(m)) == pytest.approx(math.log(q), rel=1e-8)
    arr = o.gaussian_max_abs_quantile(np.array([10, 100]))
    assert arr.shape == (2,) and arr[1] > arr[0]
    # Monte Carlo median of the max of 200 |G|
    mc = np.median(np.abs(RNG.standard_normal((4000, 200))).max(1))
    assert mc == pytest.approx(o.gaussian_max_abs_quantile(200), rel=0.02)


@pytest.mark.parametrize(
    "n, q, exc, match",
    [(0, 0.5, ValueError, "n must be >= 1"), (2.5, 0.5, TypeError, "n must be a positive integer"),
     (10, 1.0, ValueError, "strictly between"), (10, "a", TypeError, "q must be a real number")],
)
def test_gaussian_max_abs_quantile_rejects_bad_input(n, q, exc, match):
    with pytest.raises(exc, match=match):
        o.gaussian_max_abs_quantile(n, q)


def test_empirical_variance_proxy_matches_direct_formula():
    x = RNG.standard_normal((3000, 3)) * [1.0, 2.0, 0.5] + [0.0, 5.0, -1.0]
    grid = np.array([-2.0, -0.5, 0.3, 1.0, 3.0])
    out = o.empirical_variance_proxy(x, grid)
    for j in range(3):
        z = (x[:, j] - x[:, j].mean()) / x[:, j].std()
        vals = [2 * math.log(np.mean(np.exp(s * z))) / s**2 for s in grid]
        assert out["ratio"][j] == pytest.approx(max(vals), rel=1e-10)
        assert out["s_star"][j] == grid[int(np.argmax(vals))]
        assert out["proxy"][j] == pytest.approx(max(vals) * x[:, j].var(), rel=1e-10)


def test_empirical_variance_proxy_is_consistent_for_bounded_laws_and_not_for_heavy_tails():
    n = 200_000
    gauss = o.empirical_variance_proxy(RNG.standard_normal(n))["ratio"][0]
    assert gauss == pytest.approx(1.0, abs=0.05)
    # Bernoulli(0.1): optimal proxy (1-2p)/(2 ln((1-p)/p)) = 0.1820 against variance 0.09
    p = 0.1
    b = (RNG.random(n) < p).astype(float)
    want = (1 - 2 * p) / (2 * math.log((1 - p) / p)) / (p * (1 - p))
    got = o.empirical_variance_proxy(b, np.linspace(0.1, 8, 200))["ratio"][0]
    assert got == pytest.approx(want, rel=0.03)
    # Student t(3) is not sub-Gaussian: the estimate keeps growing with the sample size
    t3 = RNG.standard_t(3, size=10**6)
    small = np.median([o.empirical_variance_proxy(t3[i * 1000:(i + 1) * 1000])["ratio"][0] for i in range(50)])
    large = o.empirical_variance_proxy(t3)["ratio"][0]
    assert large > 1.5 * small


@pytest.mark.parametrize(
    "x, grid, exc, match",
    [
        (np.ones((10, 1)), None, ValueError, "constant channel"),
        (np.arange(10.0), [0.0, 1.0], ValueError, "must not contain 0"),
        (np.arange(10.0), [[1.0]], ValueError, "1-D"),
        (np.arange(10.0), [np.nan], ValueError, "NaN"),
        (np.arange(3.0), None, ValueError, "at least 4"),
    ],
)
def test_empirical_variance_proxy_rejects_bad_input(x, grid, exc, match):
    with pytest.raises(exc, match=match):
        o.empirical_variance_proxy(x, grid)


def test_top_activations_against_direct_search():
    h = RNG.standard_normal((3, 2, 5, 4))
    h[1, 1, 4, 2] = 100.0  # in a padded position: must be ignored
    h[1, 0, 0, 3] = -40.0
    mask = np.ones((2, 5), dtype=int)
    mask[1, 4] = 0
    r = o.top_activations(torch.tensor(h), mask, k=3)
    for l in range(3):
        a = np.abs(h[l]) * mask[:, :, None] - (1 - mask[:, :, None])
        flat = np.argsort(-a.ravel(), kind="stable")[:3]
        b, p, c = np.unravel_index(flat, a.shape)
        assert r["batch"][l].tolist() == b.tolist()
        assert r["position"][l].tolist() == p.tolist()
        assert r["channel"][l].tolist() == c.tolist()
        np.testing.assert_allclose(r["value"][l], h[l][b, p, c])
        assert r["median_abs"][l] == pytest.approx(np.median(np.abs(h[l][mask.astype(bool)])))
    assert r["value"][1, 0] == -40.0 and r["ratio"][1, 0] == pytest.approx(40.0 / r["median_abs"][1])
    # a boolean mask and a float32 tensor give the same answer
    r32 = o.top_activations(torch.tensor(h, dtype=torch.float32), mask.astype(bool), k=3)
    assert r32["channel"].tolist() == r["channel"].tolist()
    np.testing.assert_allclose(r32["value"], r["value"], rtol=1e-6)


@pytest.mark.parametrize(
    "h, mask, k, exc, match",
    [
        (np.zeros((2, 3, 4)), None, 1, ValueError, "shape"),
        (np.zeros((1, 2, 3, 4)), np.ones((2, 4)), 1, ValueError, "attention_mask must have shape"),
        (np.zeros((1, 2, 3, 4)), np.zeros((2, 3)), 1, ValueError, "masks every position"),
        (np.zeros((1, 2, 3, 4)), None, 25, ValueError, "exceeds"),
        (np.zeros((1, 2, 3, 4)), None, 0, ValueError, "k must be >= 1"),
        (np.zeros((1, 2, 3, 4)), None, 1.0, TypeError, "k must be an integer"),
        (np.full((1, 2, 3, 4), np.nan), None, 1, ValueError, "NaN"),
        (np.zeros((1, 2, 3, 4), dtype=bool), None, 1, TypeError, "real numbers"),
        (np.zeros((1, 2, 3, 4)), np.full((2, 3), "a"), 1, TypeError, "boolean or 0/1"),
    ],
)
def test_top_activations_rejects_bad_input(h, mask, k, exc, match):
    with pytest.raises(exc, match=match):
        o.top_activations(h, mask, k)


# --------------------------------------------------------------------------- dot products
def test_dot_product_moments_against_monte_carlo():
    d = 16
    mq, mk = RNG.normal(0, 1, d), RNG.normal(0, 1, d)
    vq, vk = RNG.uniform(0.2, 2, d), RNG.uniform(0.2, 2, d)
    n = 400_000
    q = mq + np.sqrt(vq) * RNG.standard_normal((n, d))
    k = mk + np.sqrt(vk) * RNG.standard_normal((n, d))
    mean, var = a.dot_product_moments(mq, vq, mk, vk)
    dots = np.einsum("nc,nc->n", q, k)
    assert dots.mean() == pytest.approx(mean, abs=4 * math.sqrt(var / n))
    assert dots.var() == pytest.approx(var, rel=0.02)
    with pytest.raises(ValueError, match="share one shape"):
        a.dot_product_moments(mq, vq, mk[:3], vk)
    with pytest.raises(ValueError, match=">= 0"):
        a.dot_product_moments(mq, -vq, mk, vk)


def test_partial_dot_statistics_against_direct_computation():
    P, d = 5000, 32
    shared = 0.5
    q = shared + RNG.standard_normal((P, d))
    k = shared + RNG.standard_normal((P, d))
    sizes = [1, 2, 8, 32]
    out = a.partial_dot_statistics(q, k, sizes=sizes, n_orders=3, rng=7)
    g = np.random.default_rng(7)
    means, vars_ = np.zeros(4), np.zeros(4)
    for _ in range(3):
        perm = g.permutation(d)
        for i, m in enumerate(sizes):
            ell = (q[:, perm[:m]] * k[:, perm[:m]]).sum(1)
            means[i] += ell.mean() / 3
            vars_[i] += ell.var() / 3
    np.testing.assert_allclose(out["mean"], means, rtol=1e-10)
    np.testing.assert_allclose(out["var"], vars_, rtol=1e-10)
    np.testing.assert_allclose(out["var_scaled"], vars_ / np.array(sizes), rtol=1e-10)
    # full size does not depend on the order and equals the plain logit statistics
    full = np.einsum("pc,pc->p", q, k)
    assert out["var"][-1] == pytest.approx(full.var(), rel=1e-10)
    # independent coordinates: mean = m * shared^2, var = m (1 + 2 shared^2); snr grows like sqrt(m)
    np.testing.assert_allclose(out["var_independent"] / np.array(sizes), 1 + 2 * shared**2, rtol=0.05)
    snr = out["snr"]
    np.testing.assert_allclose(snr / np.sqrt(sizes), shared**2 / math.sqrt(1 + 2 * shared**2), rtol=0.15)
    assert out["sizes"].tolist() == sizes
    default = a.partial_dot_statistics(q[:100], k[:100])
    assert default["sizes"].tolist() == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize(
    "q, k, sizes, n_orders, exc, match",
    [
        (np.zeros((5, 4)), np.zeros((5, 3)), None, 2, ValueError, "matching"),
        (np.zeros((1, 4)), np.zeros((1, 4)), None, 2, ValueError, "P >= 2"),
        (np.zeros((5, 4)), np.zeros((5, 4)), [0], 2, ValueError, r"\[1, d_k=4\]"),
        (np.zeros((5, 4)), np.zeros((5, 4)), [5], 2, ValueError, r"\[1, d_k=4\]"),
        (np.zeros((5, 4)), np.zeros((5, 4)), [1.5], 2, TypeError, "integers"),
        (np.zeros((5, 4)), np.zeros((5, 4)), None, 0, ValueError, "n_orders must be >= 1"),
        (np.zeros((5, 4)), np.zeros((5, 4)), None, 2.0, TypeError, "n_orders must be an integer"),
    ],
)
def test_partial_dot_statistics_rejects_bad_input(q, k, sizes, n_orders, exc, match):
    with pytest.raises(exc, match=match):
        a.partial_dot_statistics(q, k, sizes=sizes, n_orders=n_orders)


def test_partial_dot_statistics_rejects_bad_rng():
    with pytest.raises(TypeError, match="rng must be"):
        a.partial_dot_statistics(np.zeros((5, 4)), np.zeros((5, 4)), rng="seed")


# --------------------------------------------------------------------------- real attention layers (tiny random models)
TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Amen.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def _tiny(kind, tokenizer):
    return tiny_transformer(kind, tokenizer, n_layers=2)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_captured_queries_and_keys_reproduce_the_attention_probabilities(kind, tokenizer):
    m = _tiny(kind, tokenizer)
    caps = a.capture_queries_keys(m, TEXTS, batch_size=2)
    assert [c.layer for c in caps] == [0, 1]
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        att = m.base(**enc, output_attentions=True).attentions
    lengths = enc["attention_mask"].sum(1).tolist()
    for cap in caps:
        assert cap.rotary == (kind == "llama") and cap.causal == (kind == "llama")
        assert cap.scaling == pytest.approx(1 / math.sqrt(8))
        assert cap.q.shape == (sum(lengths), 6, 8)
        assert cap.k.shape == (sum(lengths), 2 if kind == "llama" else 6, 8)
        for b, n in enumerate(lengths):
            sel = cap.text == b
            assert cap.position[sel].tolist() == list(range(n))
            q, k = torch.tensor(cap.q[sel]), torch.tensor(cap.k[sel])
            for h in range(cap.n_heads):
                logits = (q[:, h] @ k[:, cap.kv_head(h)].T) * cap.scaling
                if cap.causal:
                    logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf)
                torch.testing.assert_close(torch.softmax(logits, -1), att[cap.layer][b, h, :n, :n], atol=1e-6, rtol=1e-5)
    if kind == "llama":
        raw = a.capture_queries_keys(m, TEXTS, layers=[1], rotary=False)[0]
        assert not raw.rotary
        # the rotation is orthogonal: same-position logits agree, other pairs do not
        c = caps[1]
        same = np.einsum("nc,nc->n", raw.q[:, 0], raw.k[:, 0])
        np.testing.assert_allclose(same, np.einsum("nc,nc->n", c.q[:, 0], c.k[:, 0]), rtol=1e-4, atol=1e-6)
        assert not np.allclose(raw.q, c.q)


def test_logit_pairs_and_statistics(tokenizer):
    m = _tiny("llama", tokenizer)
    cap = a.capture_queries_keys(m, TEXTS, layers=[0])[0]
    lengths = np.bincount(cap.text)
    q, k = a.logit_pairs(cap, 4)
    assert q.shape == (int((lengths * (lengths + 1) // 2).sum()), 8)
    # row p is a causal pair of one text: rebuild the logits directly
    want = []
    for b in range(len(TEXTS)):
        idx = np.flatnonzero(cap.text == b)
        for i in idx:
            for j in idx:
                if cap.position[j] <= cap.position[i]:
                    want.append(cap.q[i, 4] @ cap.k[j, cap.kv_head(4)])
    np.testing.assert_allclose(np.einsum("pc,pc->p", q, k), np.array(want), rtol=1e-5, atol=1e-6)
    q2, _ = a.logit_pairs(cap, 4, skip_first=True)
    assert q2.shape[0] == int(((lengths - 1) * lengths // 2).sum())
    q3, _ = a.logit_pairs(cap, 4, max_pairs=50, rng=1)
    assert q3.shape == (50, 8)
    stats_ = a.attention_logit_statistics(cap, max_pairs=None)
    for h in (0, 5):
        qh, kh = a.logit_pairs(cap, h)
        ell = np.einsum("pc,pc->p", qh, kh)
        assert stats_["mean"][h] == pytest.approx(ell.mean(), rel=1e-9, abs=1e-12)
        assert stats_["var"][h] == pytest.approx(ell.var(), rel=1e-9)
        assert stats_["var_scaled"][h] == pytest.approx(ell.var() / 8, rel=1e-9)
        assert stats_["shared_mean"][h] == pytest.approx(qh.mean(0) @ kh.mean(0), rel=1e-9, abs=1e-12)
    bert = _tiny("bert", tokenizer)
    capb = a.capture_queries_keys(bert, TEXTS, layers=[0])[0]
    lb = np.bincount(capb.text)
    assert a.logit_pairs(capb, 0)[0].shape[0] == int((lb**2).sum())


def test_attention_helpers_reject_bad_input(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from companion.transformers.models import wrap

    m = _tiny("llama", tokenizer)
    with pytest.raises(TypeError, match="LoadedModel"):
        a.capture_queries_keys(m.model, TEXTS)
    with pytest.raises(ValueError, match="outside"):
        a.capture_queries_keys(m, TEXTS, layers=[2])
    with pytest.raises(ValueError, match="repeats"):
        a.capture_queries_keys(m, TEXTS, layers=[0, 0])
    with pytest.raises(ValueError, match="non-empty"):
        a.capture_queries_keys(m, TEXTS, layers=[])
    with pytest.raises(ValueError, match="texts is empty"):
        a.capture_queries_keys(m, [])
    with pytest.raises(TypeError, match="rotary"):
        a.capture_queries_keys(m, TEXTS, rotary="yes")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        a.capture_queries_keys(m, TEXTS, batch_size=0)
    gpt2 = wrap(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=tokenizer.vocab_size)), tokenizer)
    with pytest.raises(ValueError, match="fused projection"):
        a.capture_queries_keys(gpt2, TEXTS)
    cap = a.capture_queries_keys(m, TEXTS, layers=[0])[0]
    with pytest.raises(ValueError, match="outside"):
        a.logit_pairs(cap, 6)
    with pytest.raises(TypeError, match="head must be an integer"):
        a.logit_pairs(cap, 1.0)
    with pytest.raises(TypeError, match="QueryKeyCapture"):
        a.logit_pairs("cap", 0)
    with pytest.raises(TypeError, match="QueryKeyCapture"):
        a.attention_logit_statistics("cap")
    with pytest.raises(ValueError, match="max_pairs must be >= 1"):
        a.logit_pairs(cap, 0, max_pairs=0)
    one = a.capture_queries_keys(m, ["Amen"], layers=[0])[0]
    if one.q.shape[0] == 1:
        with pytest.raises(ValueError, match="no \\(query, key\\) pair"):
            a.logit_pairs(one, 0, skip_first=True)


def test_corpus_subset_respects_the_budget(tokenizer):
    m = _tiny("bert", tokenizer)
    texts = TEXTS * 5
    n_tok = [len(tokenizer(s)["input_ids"]) for s in texts]
    sub = o.corpus_subset(m, texts, 60)
    assert sub == texts[: len(sub)]
    assert sum(n_tok[: len(sub)]) <= 60 < sum(n_tok[: len(sub) + 1])
    assert o.corpus_subset(m, texts, 1) == texts[:1]
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        o.corpus_subset(m, texts, 0)
    with pytest.raises(TypeError, match="list of strings"):
        o.corpus_subset(m, "text", 10)
    with pytest.raises(ValueError, match="empty"):
        o.corpus_subset(m, [], 10)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string"):
        o.corpus_subset(m, ["a", 3], 10)
