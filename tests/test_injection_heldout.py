"""Tests for the held-out readout (companion.experiments.injection_heldout) and the exact-level
tools of companion.theory.bootstrap (rank p-values, max-statistic, crossed bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion import experiments
from companion.experiments import Result
from companion.experiments import injection_heldout as eh
from companion.theory.bootstrap import crossed_bootstrap, maxstat_pvalues, rank_pvalue


# --------------------------------------------------------------------------------------------
# the statistics: exact level and family-wise error by simulation, brute force on small cases
# --------------------------------------------------------------------------------------------
def test_rank_pvalue_exact_level_by_simulation():
    g = np.random.default_rng(1)
    x = g.standard_normal((20000, 100))                    # row: tested value + 99 nulls
    p = np.array([rank_pvalue(r[0], r[1:]) for r in x[:, :, None]])[:, 0]
    # P(p <= 0.05) = 5/100 exactly; binomial sd at 20000 draws is 0.0015
    assert abs((p <= 0.05).mean() - 0.05) < 0.005
    # discrete uniform on {1/100, ..., 1}
    assert set(np.round(p * 100).astype(int)) <= set(range(1, 101))


def test_rank_pvalue_brute_force_and_ties():
    assert rank_pvalue(2.0, [1.0, 2.0, 3.0]) == 3 / 4     # ties count against the statistic
    assert rank_pvalue(9.0, [1.0, 2.0, 3.0]) == 1 / 4
    np.testing.assert_allclose(rank_pvalue([0.0, 5.0], [[1.0, 1.0], [-1.0, 6.0]]), [2 / 3, 2 / 3])


def test_maxstat_fwer_by_simulation_with_correlated_layers():
    g = np.random.default_rng(2)
    n_rep, n, m = 4000, 100, 11
    hits = 0
    for _ in range(n_rep):
        common = g.standard_normal((n, 1))
        x = 0.7 * common + g.standard_normal((n, m)) * np.linspace(0.5, 3.0, m)  # scales differ
        hits += (maxstat_pvalues(x) <= 0.05).any()
    # FWER = 5/100 exactly under exchangeable rows; sd at 4000 reps is 0.0034
    assert abs(hits / n_rep - 0.05) < 0.012


def test_maxstat_brute_force_small_case():
    x = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0], [2.0, 3.0, 3.0]])
    z = (x - x.mean(0)) / x.std(0)
    mx = z.max(1)
    want = [(1 + sum(mx[j] >= z[0, l] for j in (1, 2, 3))) / 4 for l in range(3)]
    np.testing.assert_allclose(maxstat_pvalues(x), want)
    np.testing.assert_allclose(maxstat_pvalues(x, index=3)[2], (1 + sum(mx[j] >= z[3, 2] for j in (0, 1, 2))) / 4)


def test_maxstat_detects_a_shifted_layer_and_is_never_below_per_layer_rank():
    g = np.random.default_rng(3)
    x = g.standard_normal((100, 8))
    x[0, 5] += 6.0
    p_adj = maxstat_pvalues(x)
    assert p_adj[5] <= 0.05 and (p_adj[np.arange(8) != 5] > 0.05).all()
    sd = x.std(0)
    z = (x - x.mean(0)) / sd
    assert (p_adj >= rank_pvalue(z[0], z[1:]) - 1e-12).all()


def test_crossed_bootstrap_matches_the_exact_variance_of_an_additive_table():
    g = np.random.default_rng(4)
    a, b = g.standard_normal(30), 2.0 * g.standard_normal(6)
    x = a[:, None] + b[None, :]
    est, lo, hi, boots = crossed_bootstrap(lambda i, j: x[i][:, j].mean(), [30, 6], n_boot=4000,
                                           rng=0, return_boots=True)
    assert est == pytest.approx(x.mean())
    # mean of a resampled table = mean(a[i*]) + mean(b[j*]), independent draws: exact variance
    assert boots.var() == pytest.approx(a.var() / 30 + b.var() / 6, rel=0.1)
    assert lo < est < hi


def test_stat_errors():
    with pytest.raises(ValueError, match="shape"):
        rank_pvalue(1.0, [[1.0]])
    with pytest.raises(ValueError, match="finite"):
        rank_pvalue(np.nan, [1.0])
    with pytest.raises(TypeError):
        rank_pvalue("a", [1.0])
    with pytest.raises(ValueError, match="shape"):
        maxstat_pvalues(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="index"):
        maxstat_pvalues(np.zeros((3, 3)), index=3)
    with pytest.raises(ValueError, match="finite"):
        maxstat_pvalues(np.array([[np.nan], [1.0]]))
    with pytest.raises(TypeError, match="callable"):
        crossed_bootstrap(3, [2])
    with pytest.raises(TypeError, match="sizes"):
        crossed_bootstrap(lambda i: 0.0, 3)
    with pytest.raises(ValueError):
        crossed_bootstrap(lambda i: 0.0, [0])
    with pytest.raises(ValueError):
        crossed_bootstrap(lambda i: 0.0, [3], n_boot=5)


# --------------------------------------------------------------------------------------------
# the experiment's pure functions
# --------------------------------------------------------------------------------------------
def test_registered_and_validates():
    assert experiments.get_experiment("injection_heldout") is eh.InjectionHeldoutExperiment
    for cfg in eh.CONFIGS.values():
        cfg.validate()
    cfg = eh.InjectionHeldoutExperiment()
    assert cfg.n_null >= 99 and 0 in cfg.layers and 29 in cfg.layers and cfg.n_splits >= 6
    for kwargs, msg in [(dict(n_null=10), "n_null"), (dict(n_splits=1), "n_splits"),
                        (dict(concepts=("joy",)), "concepts"), (dict(scales=(0.5, 0.1)), "increasing"),
                        (dict(scales=(0.0,)), "> 0"), (dict(layers=(3, 1)), "increasing")]:
        with pytest.raises(ValueError, match=msg):
            eh.InjectionHeldoutExperiment(**kwargs).validate()


def test_word_splits():
    s = eh.word_splits(12, 8, seed=0)
    assert s.shape == (8, 12) and (s.sum(1) == 6).all()
    np.testing.assert_array_equal(s, eh.word_splits(12, 8, seed=0))
    assert len({tuple(r) for r in s}) > 1
    with pytest.raises(ValueError):
        eh.word_splits(1, 2)
    with pytest.raises(TypeError):
        eh.word_splits(12.0, 2)


def test_heldout_words_never_share_a_first_token_with_a_construction_word():
    from companion.injection.directions import CONCEPTS
    from companion.transformers import models

    m = models.load("smollm2-135m", device="cpu")
    first = lambda w: m.tokenizer(" " + w, add_special_tokens=False)["input_ids"][0]  # noqa: E731
    built = {first(w) for c in eh.HELDOUT_WORDS for w in CONCEPTS[c].positive}
    related = [first(w) for ws in eh.HELDOUT_WORDS.values() for w in ws]
    assert not built & set(related) and len(set(related)) == len(related)
    assert all(len(ws) >= 10 for ws in eh.HELDOUT_WORDS.values())


def _synthetic(shift=(0.0, 2.0, 2.0, 0.0), K=4, B=12, n_null=99, seed=0):
    """A causal-LM Result: one token per word, a concept vector that raises its own words."""
    g = np.random.default_rng(seed)
    concepts, n_w, n_rel = ["sea", "fire"], 4, 2
    words = [f"w{i}" for i in range(len(concepts) * (n_w + n_rel))]
    n_dir, n_inj = len(concepts) * K + n_null, len(shift)
    logp = g.normal(-8.0, 0.1, (n_dir, n_inj, 1, B, len(words)))
    for c in range(len(concepts)):
        own = list(range(c * n_w, (c + 1) * n_w)) + [len(concepts) * n_w + c * n_rel + r for r in range(n_rel)]
        for k in range(K):
            logp[c * K + k][..., own] += np.asarray(shift)[:, None, None, None]
    arrays = dict(logp=logp, base_logp=np.full((B, len(words)), -8.0),
                  word_token=np.arange(len(words)), token_ids=np.arange(len(words)),
                  splits=eh.word_splits(n_w, K), scales=np.array([0.5]), layers=np.arange(n_inj))
    for key in ("effect", "rel_inj", "rel_last", "cos_inj", "cos_last"):
        arrays[key] = g.uniform(0.0, 1.0, (n_dir, n_inj, 1, B))
    scalars = dict(concepts=concepts, words=words, n_construction=n_w, n_layers=n_inj + 1)
    return Result(name="injection_heldout", config={}, arrays=arrays, scalars=scalars,
                  versions={}, device="cpu", wall_time=0.0, schema="1.1", config_hash="0")


def test_set_readout_is_the_log_sum_exp_change():
    r = _synthetic()
    got = eh.set_readout(r, [0, 1], 0.5)
    lp = r.arrays["logp"][:, :, 0][..., [0, 1]]
    want = np.log(np.exp(lp).sum(-1)) - np.log(2 * np.exp(-8.0))
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_word_sets_exclude_construction_tokens():
    r = _synthetic()
    for k, (a, b) in enumerate(zip(eh.word_sets(r, "fire", "construction"), eh.word_sets(r, "fire"))):
        assert not set(a) & set(b) and set(a) | set(b) == set(range(4, 8))
    r.arrays["word_token"][5] = r.arrays["word_token"][4]          # two words share a token
    for a, b in zip(eh.word_sets(r, "fire", "construction"), eh.word_sets(r, "fire")):
        tok = r.arrays["word_token"]
        assert not set(tok[a]) & set(tok[b])
    assert [s.tolist() for s in eh.word_sets(r, "fire", "related")][0] == [10, 11]
    with pytest.raises(ValueError, match="which"):
        eh.word_sets(r, "fire", "all")
    with pytest.raises(ValueError, match="unknown concept"):
        eh.word_sets(r, "food")


def test_heldout_test_finds_the_shifted_layers_only():
    r = _synthetic()
    own, null = eh.readout_cube(r, "sea")
    t = eh.heldout_test(own, null, n_boot=200)
    np.testing.assert_array_equal(t["window"], [False, True, True, False])
    assert t["first"] == 1 and t["last"] == 2 and t["p_empty"] == 0.0
    assert (t["effect_lo"][1:3] > 1.0).all() and t["effect_lo"][0] < 0 < t["effect_hi"][0]
    assert t["p"].min() == pytest.approx(0.01)
    # fire's vector does not raise sea's words: the off-diagonal entry of the specificity matrix
    own, null = eh.readout_cube(r, "sea", direction_concept="fire")
    assert not eh.heldout_test(own, null, n_boot=50)["window"].any()
    with pytest.raises(ValueError, match="do not fit"):
        eh.heldout_test(own[:, :2], null, n_boot=50)


def test_specificity_matrix_is_diagonal_where_vectors_raise_their_own_words():
    r = _synthetic(shift=(2.0, 2.0, 0.0, 0.0))
    sp = eh.specificity(r, n_boot=100, layers=[0, 1])
    np.testing.assert_allclose(np.diag(sp["effect"]), [2.0, 2.0], atol=0.05)
    assert abs(sp["effect"][0, 1]) < 0.05 and abs(sp["effect"][1, 0]) < 0.05
    assert (sp["lo"] <= sp["effect"] + 1e-12).all() and (sp["effect"] <= sp["hi"] + 1e-12).all()
    assert eh.specificity(r, n_boot=10)["layers"] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="layers"):
        eh.specificity(r, layers=[7])


def test_final_summary_is_the_mean_over_directions_and_prompts():
    r = _synthetic()
    f = eh.final_summary(r, "rel_inj", group="concept", n_boot=50)
    np.testing.assert_allclose(f["mean"], r.arrays["rel_inj"][:8, :, 0].mean((0, 2)))
    f = eh.final_summary(r, "effect", n_boot=50)
    np.testing.assert_allclose(f["mean"], r.arrays["effect"][8:, :, 0].mean((0, 2)))
    for kw, msg in [(dict(key="kl"), "key"), (dict(key="effect", group="all"), "group"),
                    (dict(key="effect", scale=2.0), "scale")]:
        with pytest.raises(ValueError, match=msg):
            eh.final_summary(r, **kw)


@pytest.mark.slow
def test_tiny_run_on_smollm2_matches_direct_injection():
    from companion.corpus import corpus_sentences
    from companion.injection import directions as dr
    from companion.transformers import models, readout, stream

    cfg = eh.InjectionHeldoutExperiment(n_prompts=2, layers=(3, 30), n_splits=2, n_null=19,
                                        concepts=("sea", "food"), scales=(0.5,))
    res = experiments.run(cfg, device="cpu")
    a = res.arrays
    assert a["logp"].shape == (4 + 19, 2, 1, 2, a["token_ids"].size)
    assert np.all(a["effect"][:, 1] == 0)                  # l = L cannot reach the last token
    m = models.load("smollm2-135m", device="cpu")
    sent = corpus_sentences(4, cfg.min_words, cfg.max_words)
    p = dr.make_prompts(m, sent[0::2], sent[1::2], max_length=cfg.max_length)
    base = stream.residual_stream(m, p.encoding)
    spreads = dr.typical_spreads(base, p.injected)
    half = a["splits"][1]
    pos = [dr.CONCEPTS["food"].template.format(w) for w in np.asarray(dr.CONCEPTS["food"].positive)[half]]
    v = dr.concept_vectors(m, pos, dr.CONCEPTS["food"].texts()[1], pool="last",
                           max_length=cfg.max_length).unit[3]
    h = stream.inject(m, p.encoding, 3, v, scale=0.5 * spreads[3], positions=p.injected)
    lb = torch.log_softmax(readout.logits_from_residual(m, base[-1]).double(), -1)
    li = torch.log_softmax(readout.logits_from_residual(m, h[-1]).double(), -1)
    last = p.last.numpy()
    ids = torch.as_tensor(a["token_ids"])
    np.testing.assert_allclose(a["logp"][3, 0, 0], li.numpy()[last][:, ids], atol=2e-3)
    kl = (lb.exp() * (lb - li)).sum(-1).numpy()[last]
    np.testing.assert_allclose(a["effect"][3, 0, 0], kl, rtol=2e-3, atol=1e-5)
    d = (h[-1] - base[-1]).double()
    rel = (d.norm(dim=-1) / base[-1].double().norm(dim=-1)).numpy()[last]
    np.testing.assert_allclose(a["rel_last"][3, 0, 0], rel, rtol=2e-3, atol=1e-6)
