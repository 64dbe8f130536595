"""Tests for companion.experiments.injection_success: the config checks, a tiny run on both
offline models checked against direct injections (companion.transformers.stream.inject), and the accessors'
statistics on synthetic Results whose answer is known (including a case where success must
fail)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.injection import directions as dr
from companion import experiments
from companion.experiments import Result
from companion.experiments import injection_success as es
from companion.transformers import readout


# --------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------
def test_registered_and_validates():
    assert "injection_success" in experiments.experiment_names()
    assert experiments.get_experiment("injection_success") is es.InjectionSuccessExperiment
    for cfg in es.CONFIGS.values():
        cfg.validate()
    cfg = es.InjectionSuccessExperiment()
    assert cfg.n_random >= 16 and len(cfg.concepts) == 4 and cfg.n_prompts >= 32
    bad = [
        (dict(n_prompts=1), "n_prompts"), (dict(n_random=1), "n_random"),
        (dict(n_split=-1), "n_split"), (dict(subspace_k=0), "subspace_k"),
        (dict(max_words=3, min_words=5), "max_words"), (dict(concepts=()), "at least one"),
        (dict(concepts=("joy",)), "word concepts"), (dict(concepts=("sea", "sea")), "repeat"),
        (dict(scales=(0.5, 0.125)), "increasing"), (dict(scales=(0.0, 1.0)), "> 0"),
        (dict(null_scale=1.0), "null_scale"), (dict(layers=(3, 1)), "increasing"),
        (dict(layers=(1, 1)), "distinct"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            es.InjectionSuccessExperiment(**kwargs).validate()


# --------------------------------------------------------------------------------------------
# accessors on synthetic Results
# --------------------------------------------------------------------------------------------
LAYERS = np.array([0, 2, 4, 6, 8])


def _synthetic(shift_layers=(2, 4), shift=1.0, B=32, n_null=16, seed=0,
               scales=(0.125, 0.5, 2.0), exponent=2.0, zero_layer=None):
    g = np.random.default_rng(seed)
    n_inj, S = LAYERS.size, len(scales)
    own = g.standard_normal((1, n_inj, S, 1, 2, B))
    for j, layer in enumerate(LAYERS):
        if layer in shift_layers:
            own[:, j] += shift
    null = g.standard_normal((n_null, n_inj, S, 1, 2, B))
    sc = np.asarray(scales)
    base = sc[None, None, :, None] ** exponent
    eff_c = base * (1 + 0.01 * g.standard_normal((1, n_inj, S, B)))
    eff_r = base * (1 + 0.01 * g.standard_normal((n_null, n_inj, S, B)))
    if zero_layer is not None:
        eff_c[:, zero_layer] = 0.0
        eff_r[:, zero_layer] = 0.0
    arrays = dict(layers=LAYERS, concept_readout=own, random_readout=null, concept_effect=eff_c,
                  random_effect=eff_r, concept_scales=sc, random_scales=sc)
    scalars = dict(groups=["concept", "random"], concepts=["sea"], n_layers=8,
                   readout_positions=["last", "later"], effect_name="kl_last")
    return Result(name="injection_success", config={}, arrays=arrays, scalars=scalars,
                  versions={}, device="cpu", wall_time=0.0, schema="1.1", config_hash="0")


def test_success_test_rule_both_criteria():
    g = np.random.default_rng(3)
    shared = g.standard_normal(32)
    nulls = shared[None] + 1e-3 * g.standard_normal((16, 32))        # tight null means
    noise = g.standard_normal(32)
    noise -= noise.mean()
    # (i) holds: the concept's mean is 0.05 above every null mean; (ii) fails: the paired
    # difference is 0.05 + noise of sd 1 over 32 prompts, its interval covers 0
    t = es.success_test(shared + 0.05 + noise, nulls)
    assert t["concept_mean"] > t["null_q"] and t["diff_lo"] < 0 < t["diff_hi"]
    assert t["success"] is False
    # a clear shift succeeds; no shift fails
    assert es.success_test(shared + 1.0 + 0.1 * noise, nulls)["success"] is True
    t0 = es.success_test(nulls[0], nulls[1:])
    assert t0["success"] is False
    assert t0["diff"] == pytest.approx(float(np.mean(nulls[0] - nulls[1:].mean(0))))
    # the interval is the paired bootstrap of resampling.bootstrap_interval
    from companion.theory.bootstrap import bootstrap_interval

    x = shared + 0.3 + noise
    _, lo, hi = bootstrap_interval(x - nulls.mean(0), n_boot=1000, rng=np.random.default_rng(0))
    t = es.success_test(x, nulls)
    assert (t["diff_lo"], t["diff_hi"]) == pytest.approx((lo, hi))


def test_success_test_errors():
    x, y = np.zeros(4), np.zeros((3, 4))
    with pytest.raises(ValueError, match="concept_values"):
        es.success_test(np.zeros(1), y[:, :1])
    with pytest.raises(ValueError, match="null_values"):
        es.success_test(x, np.zeros((1, 4)))
    with pytest.raises(ValueError, match="null_values"):
        es.success_test(x, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="NaN"):
        es.success_test(np.full(4, np.nan), y)
    with pytest.raises(ValueError, match="quantile"):
        es.success_test(x, y, quantile=1.0)
    with pytest.raises(TypeError):
        es.success_test("x", y)
    with pytest.raises(ValueError, match="n_boot"):
        es.success_test(x, y, n_boot=1)


def test_success_window_finds_the_shifted_layers_and_fails_without_shift():
    r = _synthetic(shift_layers=(2, 4, 6))
    w = es.success_window(r, "sea", 0.5)
    assert w.layers.tolist() == [2, 4, 6] and (w.first, w.last) == (2, 6)
    assert w.first_ci[0] <= 2 <= w.first_ci[1] and w.last_ci[0] <= 6 <= w.last_ci[1]
    assert w.p_empty == 0.0 and w.n_boot == 1000 and w.position == "last"
    rows = es.success_table(r)
    assert len(rows) == 3 * LAYERS.size
    assert {(x["layer"], x["scale"]) for x in rows if x["success"]} == {
        (layer, s) for layer in (2, 4, 6) for s in (0.125, 0.5, 2.0)}
    # no shift anywhere: success must fail at every layer
    r0 = _synthetic(shift_layers=(), seed=1)
    w0 = es.success_window(r0, "sea", 0.5, position="later")
    assert w0.layers.tolist() == [] and w0.first is None and w0.last is None
    assert not any(x["success"] for x in es.success_table(r0))


def test_accessor_errors():
    r = _synthetic()
    other = Result(name="injection_window", config={}, arrays={}, scalars={}, versions={},
                   device="cpu", wall_time=0.0, schema="1.1", config_hash="0")
    with pytest.raises(TypeError, match="Result"):
        es.success_table({"arrays": {}})
    with pytest.raises(TypeError, match="injection_success"):
        es.success_window(other, "sea")
    with pytest.raises(ValueError, match="null must be"):
        es.success_table(r, null="concept")
    with pytest.raises(ValueError, match="unknown group"):
        es.success_table(r, null="split")
    with pytest.raises(ValueError, match="unknown concept"):
        es.success_window(r, "fire")
    with pytest.raises(ValueError, match="was not run"):
        es.success_window(r, "sea", scale=1.0)
    with pytest.raises(ValueError, match="position"):
        es.success_window(r, "sea", position="embedding")
    with pytest.raises(ValueError, match="unknown group"):
        es.effect_curve(r, group="subspace")
    with pytest.raises(ValueError, match="direction must be"):
        es.effect_curve(r, direction=99)
    with pytest.raises(ValueError, match="thresholds"):
        es.regimes(r, thresholds=(10.0, 6.0))
    with pytest.raises(TypeError, match="thresholds"):
        es.regimes(r, thresholds=3.0)


def test_effect_curve_band():
    r = _synthetic()
    c = es.effect_curve(r, "random", 0.5)
    e = r.arrays["random_effect"][:, :, 1]
    np.testing.assert_allclose(c["mean"], e.mean(axis=(0, 2)))
    assert np.all(c["lo"] <= c["mean"]) and np.all(c["mean"] <= c["hi"])
    np.testing.assert_allclose(c["fraction"], LAYERS / 8)
    one = es.effect_curve(r, "random", 0.5, direction=3)
    np.testing.assert_allclose(one["mean"], e[3].mean(-1))
    # resampling directions as well widens the band (16 directions with 1% noise)
    assert np.all(one["hi"] - one["lo"] > 0)


def test_regimes_from_the_quadratic_law():
    quad = es.regimes(_synthetic(exponent=2.0, zero_layer=4))
    assert quad["expected"].tolist() == [16.0, 16.0]
    assert np.all(quad["regime"][[0, 1, 2, 3]] == "linear")
    assert np.all(quad["regime"][4] == "no effect")
    sat = es.regimes(_synthetic(exponent=0.5))                      # ratio 2 per step
    np.testing.assert_allclose(sat["ratio"], 2.0, rtol=0.05)
    assert np.all(sat["regime"][:, 0] == "undetermined")
    assert np.all(sat["regime"][:, 1:] == "saturated")
    mid = es.regimes(_synthetic(exponent=1.5))                      # ratio 8 per step
    assert np.all(mid["regime"][:, 1:] == "transition")


# --------------------------------------------------------------------------------------------
# tiny runs on the offline models, against direct injections
# --------------------------------------------------------------------------------------------
TINY = dict(n_prompts=2, scales=(0.5, 2.0), null_scale=0.5, n_random=2, n_split=1,
            n_subspace=2, subspace_k=2, concepts=("sea", "food"))


@pytest.mark.slow
def test_tiny_run_on_smollm2_matches_direct_injection():
    from companion.transformers import models
    from companion.transformers import stream
    from companion.corpus import corpus_sentences

    cfg = es.InjectionSuccessExperiment(layers=(3, 30), **TINY)
    res = experiments.run(cfg, device="cpu")
    a, s = res.arrays, res.scalars
    assert s["groups"] == ["concept", "random", "split", "subspace"]
    assert s["readout_positions"] == ["last", "later"] and s["effect_name"] == "kl_last"
    assert a["concept_readout"].shape == (2, 2, 2, 2, 2, 2)
    assert a["split_readout"].shape == (1, 2, 1, 2, 2, 2)
    assert a["subspace_effect"].shape == (2, 2, 1, 2)
    assert a["random_token_sd"].shape == (2, 31)
    # an injection at l = L cannot reach the last token: everything is exactly 0
    for g in s["groups"]:
        assert np.all(a[f"{g}_effect"][:, 1] == 0) and np.all(a[f"{g}_readout"][:, 1] == 0)
    # the concept vector raises its own words' probability
    assert a["concept_readout"][0, 0, :, 0].mean() > 0

    m = models.load("smollm2-135m", device="cpu")
    sent = corpus_sentences(4, cfg.min_words, cfg.max_words)
    p = dr.make_prompts(m, sent[0::2], sent[1::2], max_length=cfg.max_length)
    base = stream.residual_stream(m, p.encoding)
    spreads = dr.typical_spreads(base, p.injected)
    np.testing.assert_allclose(a["typical_spread"], spreads, rtol=1e-6)
    pos, neg = dr.CONCEPTS["food"].texts()
    v = dr.concept_vectors(m, pos, neg, pool="last").unit[3]
    h = stream.inject(m, p.encoding, 3, v, scale=2.0 * spreads[3], positions=p.injected)
    ids = dr.concept_token_ids(m, "food")
    lb = torch.log_softmax(readout.logits_from_residual(m, base[-1]).double(), -1)
    li = torch.log_softmax(readout.logits_from_residual(m, h[-1]).double(), -1)
    lse = lambda lp: torch.logsumexp(lp[..., ids], -1)                # noqa: E731
    delta = (lse(li) - lse(lb)).numpy()                                # [B, T]
    last = p.last.numpy()
    later = p.later.numpy()
    want_last = delta[last]
    want_later = np.array([delta[b][later[b]].mean() for b in range(2)])
    got = a["concept_readout"][1, 0, 1, 1]                              # food, l=3, alpha=2
    np.testing.assert_allclose(got[0], want_last, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(got[1], want_later, atol=2e-3, rtol=2e-3)
    kl = (lb.exp() * (lb - li)).sum(-1).numpy()[last]
    np.testing.assert_allclose(a["concept_effect"][1, 0, 1], kl, rtol=2e-3, atol=1e-5)


@pytest.mark.slow
def test_tiny_run_on_minilm_matches_direct_injection():
    from companion.transformers import models
    from companion.transformers import stream
    from companion.corpus import corpus_sentences

    cfg = es.InjectionSuccessExperiment(model="minilm-l6", layers=(1, 6), **TINY)
    res = experiments.run(cfg, device="cpu")
    a, s = res.arrays, res.scalars
    assert s["readout_positions"] == ["embedding"] and s["effect_name"] == "embedding_change"
    assert a["concept_readout"].shape == (2, 2, 2, 2, 1, 2)
    m = models.load("minilm-l6", device="cpu")
    sent = corpus_sentences(4, cfg.min_words, cfg.max_words)
    p = dr.make_prompts(m, sent[0::2], sent[1::2], max_length=cfg.max_length)
    base = stream.residual_stream(m, p.encoding)
    spreads = dr.typical_spreads(base, p.injected)
    pos, neg = dr.CONCEPTS["sea"].texts()
    v = dr.concept_vectors(m, pos, neg, pool="last").unit[6]
    h = stream.inject(m, p.encoding, 6, v, scale=0.5 * spreads[6], positions=p.injected)
    mask = p.encoding["attention_mask"].double()
    emb = lambda x: (x.double() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # noqa: E731
    centre = es.concept_targets(m, ["sea"], cfg.max_length)["centres"][0]
    cos = lambda e: torch.nn.functional.cosine_similarity(                            # noqa: E731
        e, torch.as_tensor(centre)[None], dim=-1).numpy()
    want = cos(emb(h[-1])) - cos(emb(base[-1]))
    np.testing.assert_allclose(a["concept_readout"][0, 1, 0, 0, 0], want, atol=1e-4)
    change = 1 - torch.nn.functional.cosine_similarity(emb(h[-1]), emb(base[-1]), dim=-1)
    np.testing.assert_allclose(a["concept_effect"][0, 1, 0], change.numpy(), rtol=1e-3, atol=1e-6)


@pytest.mark.slow
def test_readout_sweep_errors():
    from companion.transformers import models

    m = models.load("minilm-l6", device="cpu")
    p = dr.make_prompts(m, ["The sea was calm today."], ["We went home at noon."])
    targets = es.concept_targets(m, ["sea"])
    d, L = m.d_model, m.n_layers
    v = np.ones((1, d))
    u = np.ones(L + 1)
    with pytest.raises(TypeError, match="make_prompts"):
        es.readout_sweep(m, p.encoding, [1], v, [0.5], u, targets)
    with pytest.raises(ValueError, match="directions must have shape"):
        es.readout_sweep(m, p, [1, 2], v, [0.5], u, targets)
    with pytest.raises(ValueError, match="non-zero"):
        es.readout_sweep(m, p, [1], 0 * v, [0.5], u, targets)
    with pytest.raises(ValueError, match="scales"):
        es.readout_sweep(m, p, [1], v, [-0.5], u, targets)
    with pytest.raises(ValueError, match="unit"):
        es.readout_sweep(m, p, [1], v, [0.5], u[:-1], targets)
    with pytest.raises(TypeError, match="concept_targets"):
        es.readout_sweep(m, p, [1], v, [0.5], u, {"ids": []})
    with pytest.raises(ValueError, match="do not fit"):
        es.readout_sweep(m, p, [1], v, [0.5], u, {"kind": "tokens", "ids": [[1]]})
    with pytest.raises(TypeError, match="concepts"):
        es.concept_targets(m, "sea")
