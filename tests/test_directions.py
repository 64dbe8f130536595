"""Tests for companion.injection.directions, the engine's track_injection, and the experiment
companion.experiments.injection_window.

Pure functions are checked against closed forms and hand-written references; the sweep is
checked against a forward hook written here from scratch (not the probes' hooks) on both
offline models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.injection import directions as dr
from companion.injection import engine
from companion.injection import metrics as pt


# --------------------------------------------------------------------------------------------
# random_unit_vectors, typical_norms
# --------------------------------------------------------------------------------------------
def test_random_unit_vectors_norms_and_reproducibility():
    v = dr.random_unit_vectors(300, 50, np.random.default_rng(3))
    assert v.shape == (50, 300)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(v, dr.random_unit_vectors(300, 50, np.random.default_rng(3)))
    np.testing.assert_array_equal(dr.random_unit_vectors(5), dr.random_unit_vectors(5))
    # nearly orthogonal to a fixed direction: E cos^2 = 1/d exactly for the uniform law
    cos2 = dr.random_unit_vectors(300, 4000, np.random.default_rng(4))[:, 0] ** 2
    assert abs(cos2.mean() * 300 - 1.0) < 0.1


def test_random_unit_vectors_errors():
    with pytest.raises(ValueError, match="d must be >= 1"):
        dr.random_unit_vectors(0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        dr.random_unit_vectors(3, 0)
    with pytest.raises(TypeError, match="integer"):
        dr.random_unit_vectors(3.5)
    with pytest.raises(TypeError, match="Generator"):
        dr.random_unit_vectors(3, 1, rng=np.random.RandomState(0))


def test_typical_norms_median_over_mask():
    h = np.zeros((2, 2, 3, 4))
    h[0, :, :, 0] = [[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]]
    h[1, :, :, 1] = [[-6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
    mask = np.array([[True, True, False], [True, False, True]])
    np.testing.assert_allclose(dr.typical_norms(h, mask), [np.median([1, 2, 3, 5]), np.median([6, 7, 9, 11])])
    np.testing.assert_allclose(dr.typical_norms(torch.tensor(h), torch.tensor(mask)), [2.5, 8.0])


def test_typical_norms_errors():
    h = np.ones((2, 1, 3, 4))
    with pytest.raises(TypeError, match="boolean"):
        dr.typical_norms(h, np.ones((1, 3)))
    with pytest.raises(ValueError, match="mask"):
        dr.typical_norms(h, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="selects no"):
        dr.typical_norms(h, np.zeros((1, 3), bool))
    with pytest.raises(ValueError, match="NaN"):
        dr.typical_norms(np.full((2, 1, 3, 4), np.nan), np.ones((1, 3), bool))


def test_group_means_nan_aware():
    values = np.array([[[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]]])  # K=1, B=2, T=3
    groups = np.array([[[True, True, False], [False, True, True]],
                       [[False, True, False], [True, False, False]]])  # G=2
    got = engine._group_means(values, groups)
    assert got.shape == (1, 2, 2)
    np.testing.assert_allclose(got[0], [[1.0, np.nan], [5.5, 4.0]])


def _toy_track(effect):
    """A track_injection SweepResult with hand-set arrays (no model)."""
    effect = np.asarray(effect, dtype=float)  # [n_inj, n_scales, B]
    n_inj, n_sc, B = effect.shape
    L = 4
    met = {k: np.zeros((n_inj, n_sc, L + 1, B, 3)) for k in pt.METRIC_NAMES}
    met["cos_delta_v"][:] = np.nan
    met["cos_delta_v"][0, 0, 2, :, 0] = [0.5, 0.7, np.nan][:B]
    return engine.SweepResult(layers=np.arange(n_inj), scales=np.ones(n_sc), n_layers=L, metrics=met,
                              groups=dr.GROUPS, effects={"kl_last": effect}, effect_name="kl_last",
                              coefficient=np.ones((n_inj, n_sc)), relative=True, model="toy",
                              typical_norm=np.ones(L + 1))


def test_injection_track_summaries():
    tr = _toy_track([[[2.0, 4.0]], [[4.0, 6.0]], [[0.5, 0.5]], [[3.0, 3.0]], [[0.0, 0.2]]])
    np.testing.assert_allclose(tr.effect()[:, 0], [3.0, 5.0, 0.5, 3.0, 0.1])
    w = tr.window()  # tau = 1/2 of the maximum 5: layers 0, 1 (contiguous around the best) and 3
    assert (w.best, w.first, w.last) == (1, 0, 1)
    assert w.last_fraction == 0.25
    assert tr.window(contiguous=False).layers.tolist() == [0, 1, 3]
    assert tr.window(threshold=3.5, relative=False).layers.tolist() == [1]
    assert tr.window(threshold=0.4, relative=False, contiguous=False).layers.tolist() == [0, 1, 2, 3]
    m = tr.mean("cos_delta_v", "injected")
    assert m[0, 0, 2] == pytest.approx(0.6)
    assert np.isnan(m[0, 0, 1]) and np.isnan(tr.mean("cos_delta_v", "last")[0, 0, 2])
    with pytest.raises(ValueError, match="unknown metric"):
        tr.mean("angle")
    with pytest.raises(ValueError, match="unknown group"):
        tr.mean("projection", "first")
    with pytest.raises(ValueError, match="scale_index"):
        tr.window(scale_index=1)
    with pytest.raises(TypeError, match="integer"):
        tr.window(scale_index=0.5)


def test_concept_sets_are_well_formed():
    for name, c in dr.CONCEPTS.items():
        assert c.name == name
        pos, neg = c.texts()
        assert len(pos) == len(neg) >= 8
        assert len(set(pos) | set(neg)) == len(pos) + len(neg)
        assert c.pool in ("mean", "last")


# ============================================================================================
# with the real models (slow: they load the offline weights)
# ============================================================================================
FIRST = ["In the beginning God created the heaven and the earth.",
         "And Jonah was in the belly of the fish three days."]
SECOND = ["And the earth was without form, and void; and darkness was upon the deep.",
          "Then Jonah prayed unto the Lord his God out of the fish's belly."]


@pytest.fixture(scope="module")
def minilm():
    from companion.transformers import models
    return models.load("minilm-l6", device="cpu")


@pytest.fixture(scope="module")
def smol():
    from companion.transformers import models
    return models.load("smollm2-135m", device="cpu")


def _hooked_stream(m, enc, layer, delta):
    """Reference: the residual stream with ``delta`` added to h_layer, by hooks written here."""
    states = [None] * (m.n_layers + 1)
    handles = []

    def pre0(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        if layer == 0:
            h = h + delta
        states[0] = h
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    def post(i):
        def hook(module, args, out):
            h = out[0] if isinstance(out, tuple) else out
            if layer == i + 1:
                h = h + delta
            states[i + 1] = h
            return (h, *out[1:]) if isinstance(out, tuple) else h
        return hook

    handles.append(m.blocks[0].register_forward_pre_hook(pre0, with_kwargs=True))
    for i, b in enumerate(m.blocks):
        handles.append(b.register_forward_hook(post(i)))
    try:
        with torch.no_grad():
            kwargs = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            if m.kind == "causal-lm":
                out = m.model(**kwargs, use_cache=False)
                extra = out.logits
            else:
                extra = m.base(**kwargs).last_hidden_state
    finally:
        for h in handles:
            h.remove()
    return torch.stack(states), extra


def _reference_group_means(metric, groups):
    """[L+1, B, T] metric, [3, B, T] groups -> [L+1, B, 3] plain loops with nanmean."""
    out = np.full(metric.shape[:2] + (3,), np.nan)
    for l in range(metric.shape[0]):
        for b in range(metric.shape[1]):
            for g in range(3):
                vals = metric[l, b][groups[g, b]]
                vals = vals[np.isfinite(vals)]
                if vals.size:
                    out[l, b, g] = vals.mean()
    return out


@pytest.mark.slow
def test_make_prompts_groups_follow_the_text(minilm, smol):
    for m in (minilm, smol):
        p = dr.make_prompts(m, FIRST, SECOND, max_length=64)
        ids = p.encoding["input_ids"]
        for b in range(2):
            first_ids = ids[b][p.injected[b]].tolist()
            later_ids = ids[b][p.later[b]].tolist()
            text_first = m.tokenizer.decode(first_ids).lower()
            text_later = m.tokenizer.decode(later_ids).lower()
            assert text_later.strip().startswith(SECOND[b].split()[0].lower())
            assert "fish" in text_later or "earth" in text_later
            assert not (p.injected[b] & p.later[b]).any()
            assert int(p.last[b].sum()) == 1
            last_idx = int(p.last[b].nonzero()[0, 0])
            assert p.later[b, last_idx]
            # every content token lies in exactly one of the two segments
            if m.kind == "causal-lm":
                assert not p.injected[b, 0]  # the attention-sink token is left out
                assert text_first.strip().split()[0] == FIRST[b].lower().split()[1]
                assert last_idx == int(p.encoding["attention_mask"][b].sum()) - 1
            else:
                assert ids[b, last_idx + 1] == m.tokenizer.sep_token_id
                assert text_first.split()[0] == FIRST[b].lower().split()[0]
        assert p.groups.shape == (3,) + tuple(ids.shape)
        assert p.batch == 2


@pytest.mark.slow
def test_make_prompts_errors(minilm):
    with pytest.raises(ValueError, match="same length"):
        dr.make_prompts(minilm, FIRST, SECOND[:1])
    with pytest.raises(ValueError, match="empty"):
        dr.make_prompts(minilm, [], [])
    with pytest.raises(ValueError, match="empty"):
        dr.make_prompts(minilm, ["  "], ["x y"])
    with pytest.raises(TypeError, match="list of strings"):
        dr.make_prompts(minilm, "one text", "another")
    with pytest.raises(TypeError, match="skip_first"):
        dr.make_prompts(minilm, FIRST, SECOND, skip_first="yes")
    with pytest.raises(ValueError, match="no later token"):
        dr.make_prompts(minilm, FIRST, SECOND, max_length=8)
    with pytest.raises(TypeError, match="LoadedModel"):
        dr.make_prompts("minilm-l6", FIRST, SECOND)


@pytest.mark.slow
def test_concept_vectors_match_a_direct_mean(minilm, smol):
    from companion.transformers import stream
    pos = ["Tell me about the ocean", "Tell me about the whale"]
    neg = ["Tell me about the table", "Tell me about the pencil"]
    for m in (minilm, smol):
        for pool in ("last", "mean"):
            cv = dr.concept_vectors(m, pos, neg, pool=pool, name="t")
            assert cv.unit.shape == (m.n_layers + 1, m.d_model)
            np.testing.assert_allclose(np.linalg.norm(cv.unit, axis=1), 1.0, rtol=1e-12)
            # reference: one text at a time, no padding involved
            means = []
            for texts in (pos, neg):
                acc = []
                for t in texts:
                    h = stream.residual_stream(m, [t]).double()[:, 0]  # [L+1, T, d]
                    lo = 1 if m.kind == "causal-lm" else 1  # first token / [CLS]
                    hi = h.shape[1] if m.kind == "causal-lm" else h.shape[1] - 1  # drop [SEP]
                    acc.append(h[:, hi - 1] if pool == "last" else h[:, lo:hi].mean(1))
                means.append(torch.stack(acc).mean(0))
            ref = (means[0] - means[1]).numpy()
            np.testing.assert_allclose(cv.norm, np.linalg.norm(ref, axis=1), rtol=2e-3)
            cos = np.sum(cv.unit * ref, axis=1) / np.linalg.norm(ref, axis=1)
            assert np.all(cos > 0.9999)


@pytest.mark.slow
def test_concept_vectors_errors(minilm):
    with pytest.raises(ValueError, match="pool"):
        dr.concept_vectors(minilm, ["a b"], ["c d"], pool="max")
    with pytest.raises(ValueError, match="identical"):
        dr.concept_vectors(minilm, ["the same words"], ["the same words"])
    with pytest.raises(ValueError, match="empty"):
        dr.concept_vectors(minilm, [], ["c d"])
    with pytest.raises(TypeError, match="name"):
        dr.concept_vectors(minilm, ["a b"], ["c d"], name=3)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["minilm", "smol"])
def test_track_injection_matches_hand_written_hooks(which, request):
    from companion.transformers import stream
    m = request.getfixturevalue(which)
    p = dr.make_prompts(m, FIRST, SECOND, max_length=64)
    layers = [0, 2, m.n_layers - 1]
    scales = [0.5, 2.0]
    rng = np.random.default_rng(7)
    dirs = dr.random_unit_vectors(m.d_model, len(layers), rng) * np.array([[1.0], [3.0], [0.5]])
    tr = engine.track_injection(m, p, layers, dirs, scales)
    base, base_out = _hooked_stream(m, p.encoding, 0, torch.zeros(()))
    norms = dr.typical_norms(base, p.injected)
    np.testing.assert_allclose(tr.typical_norm, norms, rtol=1e-5)
    groups = p.groups.numpy()
    mask = p.encoding["attention_mask"].double()
    for j, layer in enumerate(layers):
        v_hat = dirs[j] / np.linalg.norm(dirs[j])
        for s, alpha in enumerate(scales):
            c = alpha * norms[layer]
            assert tr.coefficient[j, s] == pytest.approx(c)
            delta = torch.tensor(c * v_hat, dtype=torch.float32) * p.injected.unsqueeze(-1)
            h, out = _hooked_stream(m, p.encoding, layer, delta)
            met = pt.perturbation_metrics(base, h, v_hat)
            for name in pt.METRIC_NAMES:
                ref = _reference_group_means(met[name], groups)
                np.testing.assert_allclose(tr.metrics[name][j, s], ref, rtol=2e-3, atol=2e-3 * (
                    1 + np.nanmax(np.abs(ref))), equal_nan=True, err_msg=f"{name} at layer {layer}")
            if m.kind == "causal-lm":
                idx = p.last.int().argmax(1)
                lb = base_out[torch.arange(2), idx].double().numpy()
                li = out[torch.arange(2), idx].double().numpy()
                pb = np.exp(lb - lb.max(-1, keepdims=True)); pb /= pb.sum(-1, keepdims=True)
                pi = np.exp(li - li.max(-1, keepdims=True)); pi /= pi.sum(-1, keepdims=True)
                ref_effect = np.sum(pb * (np.log(pb) - np.log(pi)), -1)
            else:
                eb = (base_out * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                ei = (out * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                ref_effect = 1 - torch.nn.functional.cosine_similarity(eb, ei, dim=-1).numpy()
            np.testing.assert_allclose(tr.effects["kl_last" if m.kind == "causal-lm" else "embedding_change"][j, s], ref_effect, rtol=0.02, atol=1e-4)
    # before the injection layer nothing changes; at a causal model's last layer the last token
    # cannot see an injection at earlier positions (no attention is left)
    assert np.all(tr.metrics["delta_norm"][1, :, :2] == 0)
    if m.kind == "causal-lm":
        tr_end = engine.track_injection(m, p, [m.n_layers], dirs[0], [1.0], norms=norms)
        assert np.all(tr_end.effects[tr_end.effect_name] == 0)
        assert np.all(tr_end.metrics["delta_norm"][0, 0, -1, :, 1:] == 0)
    # argument errors
    with pytest.raises(TypeError, match="make_prompts"):
        engine.track_injection(m, p.encoding, layers, dirs, scales)
    with pytest.raises(ValueError, match="strictly increasing"):
        engine.track_injection(m, p, [2, 1], dirs[0], [1.0], norms=norms)
    with pytest.raises(ValueError, match=rf"in \[0, {m.n_layers}\]"):
        engine.track_injection(m, p, [m.n_layers + 1], dirs[0], [1.0], norms=norms)
    with pytest.raises(TypeError, match="integer"):
        engine.track_injection(m, p, [1.5], dirs[0], [1.0], norms=norms)
    with pytest.raises(ValueError, match="empty"):
        engine.track_injection(m, p, [], dirs[0], [1.0], norms=norms)
    with pytest.raises(ValueError, match="shape"):
        engine.track_injection(m, p, [1, 2], dirs, [1.0], norms=norms)
    with pytest.raises(ValueError, match="zero vector"):
        engine.track_injection(m, p, [1], np.zeros(m.d_model), [1.0], norms=norms)
    with pytest.raises(ValueError, match="> 0"):
        engine.track_injection(m, p, [1], dirs[0], [0.0], norms=norms)
    with pytest.raises(ValueError, match="empty"):
        engine.track_injection(m, p, [1], dirs[0], [], norms=norms)
    with pytest.raises(TypeError, match="real number"):
        engine.track_injection(m, p, [1], dirs[0], ["1"], norms=norms)
    with pytest.raises(ValueError, match="positive"):
        engine.track_injection(m, p, [1], dirs[0], [1.0], norms=np.zeros(m.n_layers + 1))
    with pytest.raises(TypeError, match="relative"):
        engine.track_injection(m, p, [1], dirs[0], [1.0], relative="yes", norms=norms)
    with pytest.raises(ValueError, match="'all'"):
        engine.track_injection(m, p, "every", dirs[0], [1.0], norms=norms)
    with pytest.raises(TypeError, match="sequence"):
        engine.track_injection(m, p, {1, 2}, dirs[0], [1.0], norms=norms)
    # absolute magnitudes: the coefficient is the scale itself
    tr_abs = engine.track_injection(m, p, [1], dirs[0], [3.0], relative=False, norms=norms)
    assert tr_abs.coefficient.tolist() == [[3.0]]
    rel = tr_abs.mean("relative_size", "injected")[0, 0, 1]
    inv = 3.0 / np.linalg.norm(base[1].double().numpy(), axis=-1)  # [B, T]
    want = np.mean([inv[b][p.injected[b].numpy()].mean() for b in range(p.batch)])
    assert rel == pytest.approx(want, rel=1e-4)


# ============================================================================================
# the experiment companion.experiments.injection_window
# ============================================================================================
def test_experiment_is_registered_and_validates():
    from companion import experiments
    from companion.experiments import injection_window as ei

    assert "injection_window" in experiments.experiment_names()
    cls = experiments.get_experiment("injection_window")
    assert cls is ei.InjectionWindowExperiment
    cls().validate()
    for cfg in list(ei.CPU_CONFIGS.values()) + list(ei.GPU_CONFIGS.values()):
        cfg.validate()
    bad = [
        (dict(n_prompts=0), "n_prompts"), (dict(max_words=3, min_words=5), "max_words"),
        (dict(n_random=-1), "n_random"), (dict(rel_scales=()), "rel_scales"),
        (dict(rel_scales=(0.0,)), "rel_scales"), (dict(abs_scales=(-1.0,)), "abs_scales"),
        (dict(abs_reference_fraction=1.5), "abs_reference_fraction"), (dict(concepts=("nope",)), "concepts"),
        (dict(concepts=("sea", "sea")), "repeat"), (dict(concepts=(), n_random=0), "no direction"),
        (dict(layers=(3, 1)), "increasing"), (dict(layers=(1, 1)), "distinct"), (dict(layers=(-1, 2)), "distinct"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            cls(**kwargs).validate()


def test_gpu_configs_cover_several_depths_and_families():
    from companion.experiments import injection_window as ei

    names = set(ei.GPU_CONFIGS)
    assert {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"} <= names
    assert {"EleutherAI/pythia-70m", "EleutherAI/pythia-1.4b"} <= names
    assert any("Llama" in n or "SmolLM2" in n for n in names)
    for cfg in ei.GPU_CONFIGS.values():
        assert cfg.layers == () and cfg.n_prompts >= 32 and cfg.n_random >= 2


def test_cli_command_rebuilds_the_same_config():
    import shlex

    from companion import experiments
    from companion.__main__ import _parse_overrides, _build_parser
    from companion.experiments import injection_window as ei

    for cfg in list(ei.GPU_CONFIGS.values())[:3] + list(ei.CPU_CONFIGS.values()):
        line = ei.cli_command(cfg)
        args = _build_parser().parse_args(shlex.split(line)[3:])
        rebuilt = experiments.make_config(args.name, _parse_overrides(args.overrides, args.model))
        assert rebuilt == cfg
        assert experiments.config_hash(rebuilt) == experiments.config_hash(cfg)
        assert args.device == "cuda" and args.out == "companion/data/results"
    with pytest.raises(TypeError, match="InjectionWindowExperiment"):
        ei.cli_command({"model": "gpt2"})


def test_result_readers_reject_other_results():
    from companion.experiments import Result
    from companion.experiments import injection_window as ei

    other = Result(name="channel_statistics", config={}, arrays={}, scalars={}, versions={}, device="cpu",
                   wall_time=0.0, schema="1.1", config_hash="0")
    with pytest.raises(TypeError, match="injection_window"):
        ei.tracks(other)
    with pytest.raises(TypeError, match="Result"):
        ei.tracks({"arrays": {}})
    with pytest.raises(TypeError, match="dict"):
        ei.gpu_results(configs=[ei.InjectionWindowExperiment()])


TINY = dict(model="minilm-l6", n_prompts=2, min_words=6, max_words=12, layers=(0, 3, 6),
            rel_scales=(0.25, 1.0), abs_scales=(0.5,), concepts=("joy",), n_random=1)


@pytest.mark.slow
def test_experiment_run_store_and_read_back(tmp_path):
    from companion import experiments
    from companion.experiments import injection_window as ei

    cfg = ei.InjectionWindowExperiment(**TINY)
    res = experiments.run(cfg, device="cpu")
    a, s = res.arrays, res.scalars
    assert s["directions"] == ["joy", "random0"] and s["modes"] == ["rel", "abs"]
    assert s["effect_name"] == "embedding_change" and s["n_layers"] == 6 and s["placement"] == "post"
    assert a["joy_rel_metrics"].shape == (3, 2, 7, 2, 3, 6)
    assert a["joy_abs_effect"].shape == (3, 1, 2)
    ref = a["typical_norm"][s["abs_reference_layer"]]
    assert s["abs_reference_layer"] == 1
    np.testing.assert_allclose(a["random0_abs_coefficient"], 0.5 * ref)
    np.testing.assert_allclose(a["joy_rel_coefficient"], a["typical_norm"][[0, 3, 6], None] * [[0.25, 1.0]])
    # the stored arrays are those of track_injection on the same prompts and direction
    from companion.transformers import models
    from companion.corpus import corpus_sentences

    m = models.load("minilm-l6", device="cpu")
    sent = corpus_sentences(4, 6, 12)
    p = dr.make_prompts(m, sent[0::2], sent[1::2], max_length=cfg.max_length)
    rv = dr.random_unit_vectors(m.d_model, 1, np.random.default_rng(0))[0]
    tr = engine.track_injection(m, p, [0, 3, 6], rv, [0.25, 1.0])
    got = ei.tracks(res)[("random0", "rel")]
    np.testing.assert_allclose(got.effects[got.effect_name], tr.effects[tr.effect_name], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got.mean("relative_size", "later"), tr.mean("relative_size", "later"), rtol=1e-5)
    # windows: one row per direction, fractions of depth consistent with the layers
    rows = ei.window_summary(res, scale=1.0)
    assert [r["direction"] for r in rows] == ["joy", "random0"]
    for r in rows:
        assert r["best"] in (0, 3, 6) and r["best_fraction"] == r["best"] / 6
        assert r["device"].startswith("cpu") and "torch" in r["versions"]
        w = pt.effect_window(ei.tracks(res)[(r["direction"], "rel")].effect()[:, 1],
                                       layers=[0, 3, 6], n_layers=6)
        assert (w.first, w.last) == (r["first"], r["last"])
    assert len(ei.window_summary(res, scale=0.5, mode="abs")) == 2
    for r_set in ei.window_summary(res, scale=1.0, contiguous=False):
        e = ei.tracks(res)[(r_set["direction"], "rel")].effect()[:, 1]
        assert r_set["layers"] == [l for l, x in zip((0, 3, 6), e) if x >= 0.5 * e.max()]
    with pytest.raises(ValueError, match="not run"):
        ei.window_summary(res, scale=0.3)
    with pytest.raises(ValueError, match="mode"):
        ei.window_summary(res, mode="log")
    with pytest.raises(TypeError, match="contiguous"):
        ei.window_summary(res, scale=1.0, contiguous="yes")
    # the direction-averaged window
    mean = np.mean([t.effect()[:, 1] for (d, mo), t in ei.tracks(res).items() if mo == "rel"], axis=0)
    wm = ei.mean_window(res, scale=1.0)
    ref = pt.effect_window(mean, layers=[0, 3, 6], n_layers=6)
    assert (wm.best, wm.first, wm.last) == (ref.best, ref.first, ref.last)
    assert ei.mean_window(res, scale=0.5, mode="abs").n_layers == 6
    with pytest.raises(ValueError, match="not run"):
        ei.mean_window(res, scale=0.3)
    with pytest.raises(ValueError, match="mode"):
        ei.mean_window(res, mode="lin")
    # stored Results are found only when hash and schema match
    experiments.save_result(res, tmp_path)
    found = ei.gpu_results({"tiny": cfg}, folder=tmp_path)
    assert list(found) == ["tiny"] and found["tiny"].device == res.device
    assert ei.gpu_results({"other": ei.InjectionWindowExperiment(**{**TINY, "n_prompts": 3})},
                             folder=tmp_path) == {}
    path = experiments.result_path(cfg, tmp_path)
    text = path.read_text().replace(res.schema, "1.999")
    path.write_text(text)
    assert ei.gpu_results({"tiny": cfg}, folder=tmp_path) == {}


# --------------------------------------------------------------------------- extreme inputs
@pytest.mark.slow
@pytest.mark.parametrize("size", [1e-200, 1e200])
def test_track_injection_directions_of_any_size(minilm, size):
    """||v|| underflowed ("zero vector") or overflowed (v / inf = 0, a zero injection)."""
    p = dr.make_prompts(minilm, FIRST, SECOND, max_length=32)
    d = dr.random_unit_vectors(minilm.d_model, 1, np.random.default_rng(3))[0]
    ref = engine.track_injection(minilm, p, [1], d, [1.0])
    got = engine.track_injection(minilm, p, [1], d * size, [1.0], norms=ref.typical_norm)
    for name in pt.METRIC_NAMES:
        np.testing.assert_allclose(got.metrics[name], ref.metrics[name], rtol=1e-6, equal_nan=True)


@pytest.mark.slow
def test_track_injection_scales_beyond_the_model_dtype(minilm):
    """alpha * n_l * v beyond float32 became inf in the model and NaN in every metric."""
    p = dr.make_prompts(minilm, FIRST, SECOND, max_length=32)
    d = dr.random_unit_vectors(minilm.d_model, 1, np.random.default_rng(3))[0]
    with pytest.raises(ValueError, match="torch.float32"):
        engine.track_injection(minilm, p, [1], d, [1e39], relative=False)


# ============================================================================================
# centred spreads, readout tokens and null directions (issue 14)
# ============================================================================================
def test_typical_spreads_and_means_closed_form():
    h = np.zeros((2, 1, 3, 2))
    h[0, 0, :, 0] = [1.0, 2.0, 3.0]
    h[0, 0, :, 1] = 50.0                     # a shared offset: no spread
    h[1, 0, :, :] = [[1.0, 0.0], [-1.0, 0.0], [7.0, 7.0]]
    mask = np.array([[True, True, False]])
    np.testing.assert_allclose(dr.stream_means(h, mask), [[1.5, 50.0], [0.0, 0.0]])
    np.testing.assert_allclose(dr.typical_spreads(h, mask), [0.5, 1.0])
    np.testing.assert_allclose(dr.typical_spreads(torch.tensor(h), torch.tensor(mask)), [0.5, 1.0])
    # a random stream: s^2 = mean squared norm - squared norm of the mean
    g = np.random.default_rng(0).standard_normal((3, 2, 5, 4)) + 3.0
    full = np.ones((2, 5), bool)
    sel = g.reshape(3, 10, 4)
    want = np.mean(np.sum(sel**2, -1), 1) - np.sum(sel.mean(1) ** 2, -1)
    np.testing.assert_allclose(dr.typical_spreads(g, full) ** 2, want, rtol=1e-12)
    assert np.all(dr.typical_spreads(g, full) < dr.typical_norms(g, full))


def test_typical_spreads_errors():
    h = np.ones((2, 1, 3, 4))
    with pytest.raises(TypeError, match="boolean"):
        dr.typical_spreads(h, np.ones((1, 3)))
    with pytest.raises(ValueError, match="mask"):
        dr.typical_spreads(h, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="no position"):
        dr.stream_means(h, np.zeros((1, 3), bool))
    with pytest.raises(ValueError, match="two positions"):
        dr.typical_spreads(h, np.array([[True, False, False]]))
    with pytest.raises(ValueError, match="identical"):
        dr.typical_spreads(h, np.ones((1, 3), bool))
    with pytest.raises(ValueError, match="NaN"):
        dr.stream_means(np.full((2, 1, 3, 4), np.nan), np.ones((1, 3), bool))


def test_subspace_random_vectors_lie_in_the_principal_subspace():
    g = np.random.default_rng(1)
    # states = mean + 3 strong directions + weak noise
    basis = np.linalg.qr(g.standard_normal((12, 3)))[0].T          # [3, 12]
    coef = g.standard_normal((2, 1, 40, 3)) * [10.0, 8.0, 6.0]
    h = coef @ basis + 0.01 * g.standard_normal((2, 1, 40, 12)) + 5.0
    mask = np.ones((1, 40), bool)
    v = dr.subspace_random_vectors(h, mask, k=3, n=50, rng=np.random.default_rng(2))
    assert v.shape == (2, 50, 12)
    np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=1e-12)
    outside = v - (v @ basis.T) @ basis                              # residual off the span
    assert np.abs(outside).max() < 1e-2
    np.testing.assert_array_equal(v, dr.subspace_random_vectors(h, mask, 3, 50, 2))
    with pytest.raises(ValueError, match="k must be"):
        dr.subspace_random_vectors(h, mask, k=40, n=1)
    with pytest.raises(ValueError, match="n must be >= 1"):
        dr.subspace_random_vectors(h, mask, k=2, n=0)
    with pytest.raises(TypeError, match="integer"):
        dr.subspace_random_vectors(h, mask, k=2.5, n=1)
    with pytest.raises(TypeError, match="rng"):
        dr.subspace_random_vectors(h, mask, k=2, n=1, rng="seed")


def test_new_word_concepts_share_the_sea_protocol():
    sea = dr.CONCEPTS["sea"]
    for name in ("fire", "music", "food"):
        c = dr.CONCEPTS[name]
        assert c.template == sea.template and c.negative == sea.negative and c.pool == "last"
        assert len(c.positive) == 12 and all(w.isalpha() for w in c.positive)


@pytest.mark.slow
def test_concept_token_ids(smol, minilm):
    ids = dr.concept_token_ids(smol, "music")
    assert len(ids) == len(set(ids.tolist())) <= 12
    assert smol.tokenizer.decode([int(ids[0])]) == " music"
    np.testing.assert_array_equal(ids, dr.concept_token_ids(smol, dr.CONCEPTS["music"]))
    with pytest.raises(ValueError, match="encoder"):
        dr.concept_token_ids(minilm, "sea")
    with pytest.raises(ValueError, match="sentence concept"):
        dr.concept_token_ids(smol, "joy")
    with pytest.raises(ValueError, match="unknown concept"):
        dr.concept_token_ids(smol, "sky")
    with pytest.raises(TypeError, match="ConceptSet"):
        dr.concept_token_ids(smol, 3)


@pytest.mark.slow
def test_split_null_vectors_are_differences_of_random_halves(minilm):
    from companion.transformers import stream

    null = dr.split_null_vectors(minilm, "sea", 3, np.random.default_rng(4))
    L, d = minilm.n_layers, minilm.d_model
    assert null.shape == (L + 1, 3, d)
    np.testing.assert_allclose(np.linalg.norm(null, axis=-1), 1.0, rtol=1e-12)
    # reference: the same permutations, the last content token of each text read directly
    pos, neg = dr.CONCEPTS["sea"].texts()
    texts = pos + neg
    h = stream.residual_stream(minilm, texts).double().numpy()         # [L+1, 24, T, d]
    from companion.transformers import models
    mask = models.tokenize(minilm, texts)["attention_mask"].numpy()
    last = mask.sum(1) - 2                                              # before [SEP]
    per_text = h[:, np.arange(24), last]                                 # [L+1, 24, d]
    g = np.random.default_rng(4)
    for j in range(3):
        perm = g.permutation(24)
        diff = per_text[:, perm[:12]].mean(1) - per_text[:, perm[12:]].mean(1)
        want = diff / np.linalg.norm(diff, axis=-1, keepdims=True)
        np.testing.assert_allclose(null[:, j], want, atol=1e-5)
    with pytest.raises(ValueError, match="n must be >= 1"):
        dr.split_null_vectors(minilm, "sea", 0)
    with pytest.raises(ValueError, match="sentence concept"):
        dr.split_null_vectors(minilm, "joy", 2)
    with pytest.raises(TypeError, match="skip_first"):
        dr.split_null_vectors(minilm, "sea", 2, skip_first="no")


@pytest.mark.slow
def test_track_injection_centred_metrics(smol):
    p = dr.make_prompts(smol, FIRST, SECOND, max_length=64)
    from companion.transformers import stream

    base = stream.residual_stream(smol, p.encoding)
    mu = dr.stream_means(base, p.injected)
    spreads = dr.typical_spreads(base, p.injected)
    v = dr.random_unit_vectors(smol.d_model, 1, np.random.default_rng(0))[0]
    raw = engine.track_injection(smol, p, [3], v, [0.5], norms=spreads)
    cen = engine.track_injection(smol, p, [3], v, [0.5], norms=spreads, centre=mu)
    assert raw.coefficient[0, 0] == pytest.approx(0.5 * spreads[3])
    # one pass: the six raw metrics unchanged, plus the three centred ones
    for name in pt.METRIC_NAMES:
        np.testing.assert_array_equal(raw.metrics[name], cen.metrics[name])
    assert sorted(set(cen.metrics) - set(raw.metrics)) == [
        "cos_inj_base_centred", "norm_ratio_centred", "relative_size_centred"]
    # the centred relative size: ||delta|| / ||h - mu|| at the injected positions, injection layer
    hb = base[3].double().numpy() - mu[3]
    want = np.mean([(raw.coefficient[0, 0] / np.linalg.norm(hb[b][p.injected[b].numpy()],
                                                            axis=-1)).mean() for b in range(2)])
    got = cen.mean("relative_size_centred", "injected")[0, 0, 3]
    assert got == pytest.approx(want, rel=1e-4)
    assert got > raw.mean("relative_size", "injected")[0, 0, 3]
    with pytest.raises(ValueError, match="centre must have shape"):
        engine.track_injection(smol, p, [3], v, [0.5], centre=mu[0])


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_model_entry_points_check_the_model_once(kind, check_model_calls):
    """Validate once: make_prompts, concept_vectors, split_null_vectors and concept_token_ids
    check their model exactly once per call (internal tokenisation and forwards do not)."""
    from tiny_transformers import minilm_tokenizer, tiny_transformer

    m = tiny_transformer(kind, minilm_tokenizer(), 3)
    calls = check_model_calls
    runs = [lambda: dr.make_prompts(m, ["The cat sat on the mat"], ["and then slept"]),
            lambda: dr.concept_vectors(m, *dr.CONCEPTS["joy"].texts()),
            lambda: dr.split_null_vectors(m, "sea", 2)]
    if m.kind == "causal-lm":
        runs.append(lambda: dr.concept_token_ids(m, "sea"))
    for run in runs:
        calls.clear()
        run()
        assert len(calls) == 1
