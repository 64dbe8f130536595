"""Tests of companion.outliers.massive_activations, companion.outliers.outlier_features, the centred attention
logits, the stored-statistics views and the outliers block of companion.plots: each against a
direct computation on tiny random models, and every bad input."""

from __future__ import annotations

import dataclasses

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from test_channel_regimes import TEXTS, _tiny, tokenizer  # noqa: E402,F401 (the fixture)

from companion.outliers import attention_logits as a  # noqa: E402
from companion.outliers import regimes as cr  # noqa: E402
from companion.outliers import massive_activations as ma  # noqa: E402
from companion.outliers import outlier_features as of  # noqa: E402
from companion import plots
from companion.transformers import stream  # noqa: E402
from companion import experiments as xp  # noqa: E402
from companion.experiments import massive_ablation  # noqa: E402
from companion.experiments.channel_statistics import statistics_of  # noqa: E402
from companion.outliers import channel_statistics as channel_stats


@pytest.fixture(scope="module")
def llama(tokenizer):  # noqa: F811
    return _tiny("llama", tokenizer)


@pytest.fixture(scope="module")
def bert(tokenizer):  # noqa: F811
    return _tiny("bert", tokenizer)


# --------------------------------------------------------------------------- massive activations
def test_first_token_profile_matches_the_residual_stream(llama):
    prof = ma.first_token_profile(llama, TEXTS, channel=5)
    h = stream.residual_stream(llama, TEXTS)
    np.testing.assert_allclose(prof.values, h[:, :, 0, 5].double().numpy(), rtol=1e-5, atol=1e-6)
    real = llama.tokenizer(TEXTS, padding=True, return_tensors="pt")["attention_mask"].bool()
    med = [float(h[l][real].abs().double().median()) for l in range(h.shape[0])]
    np.testing.assert_allclose(prof.median_abs, med, rtol=1e-6)
    np.testing.assert_allclose(prof.ratio, np.abs(prof.values.mean(1)) / prof.median_abs)


def test_emergence_layer_applies_both_criteria():
    prof = ma.FirstTokenProfile(values=np.array([[1.0], [150.0], [2000.0], [2000.0]]),
                                median_abs=np.array([1.0, 1.0, 1.0, 10.0]), channel=0)
    assert prof.emergence_layer() == 2            # layer 1: > 100 but only 150 x the median
    assert prof.emergence_layer(min_ratio=100) == 1
    assert prof.emergence_layer(min_abs=1e4) is None
    with pytest.raises(ValueError):
        prof.emergence_layer(min_abs=-1)
    with pytest.raises(TypeError):
        prof.emergence_layer(min_ratio="big")


def test_baseline_ablation_reproduces_loss_and_attention(llama):
    from companion.transformers.readout import next_token_loss

    run = ma.ablate_activation(llama, TEXTS[:2], None, 3, None, batch_size=1)
    np.testing.assert_allclose(run.loss, next_token_loss(llama, TEXTS[:2], per_text=True), rtol=1e-5)
    enc = llama.tokenizer(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        att = llama.model(**enc, output_attentions=True).attentions
    want = [float(x[0, :, 1:, 0].mean()) for x in att]
    np.testing.assert_allclose(run.sink[0], want, rtol=1e-5)
    assert llama.model.config._attn_implementation == "eager"   # restored


def test_ablation_edits_one_entry_and_changes_what_follows(llama):
    base = ma.ablate_activation(llama, TEXTS[:2], None, 3, None)
    prof = ma.first_token_profile(llama, TEXTS[:2], 3)
    same = ma.ablate_activation(llama, TEXTS[:2], 1, 3, float(prof.values[1, 0]))
    np.testing.assert_allclose(same.loss[0], base.loss[0], rtol=1e-5)     # the value it had
    big = ma.ablate_activation(llama, TEXTS[:2], 1, 3, 500.0)
    assert not np.allclose(big.loss, base.loss)
    np.testing.assert_allclose(big.sink[:, 0], base.sink[:, 0], rtol=1e-5)  # block 0 reads h_0
    assert big.layer == 1 and big.value == 500.0 and big.channel == 3


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(layer=0, value=0.0), ValueError, ">= 1"),
        (dict(layer=3, value=0.0), ValueError, "outside"),
        (dict(layer=1, value=None), ValueError, "together"),
        (dict(layer=None, value=1.0), ValueError, "together"),
        (dict(layer=1.5, value=0.0), TypeError, "integer"),
        (dict(layer=1, value="zero"), TypeError, "real number"),
        (dict(layer=1, value=float("nan")), ValueError, "finite"),
        (dict(layer=1, value=0.0, channel=48), ValueError, "outside"),
        (dict(layer=1, value=0.0, batch_size=0), ValueError, ">= 1"),
    ],
)
def test_ablation_rejects_bad_input(llama, kwargs, exc, match):
    args = {"channel": 0, **kwargs}
    with pytest.raises(exc, match=match):
        ma.ablate_activation(llama, TEXTS[:1], **args)


def test_ablation_needs_a_causal_model_and_two_tokens(llama, bert):
    with pytest.raises(ValueError, match="encoder"):
        ma.ablate_activation(bert, TEXTS, None, 0, None)
    with pytest.raises(ValueError, match="non-empty"):
        ma.ablate_activation(llama, [], None, 0, None)
    with pytest.raises(TypeError, match="LoadedModel"):
        ma.ablate_activation("smollm2", TEXTS, None, 0, None)
    with pytest.raises(ValueError, match="outside"):
        ma.first_token_profile(llama, TEXTS, 48)
    with pytest.raises(TypeError):
        ma.first_token_profile(llama, [1, 2], 0)


# --------------------------------------------------------------------------- LLM.int8() features
@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_outlier_feature_shares_match_a_direct_capture(kind, tokenizer):  # noqa: F811
    m = _tiny(kind, tokenizer)
    sites = of._linear_input_sites(m)
    got = {}

    def grab(s):
        def hook(module, args):
            got.setdefault(s, []).append(args[0].detach().clone())
        return hook

    handles = [mod.register_forward_pre_hook(grab(2 * l + k))
               for l, pair in enumerate(sites) for k, mod in enumerate(pair)]
    enc = m.tokenizer(TEXTS, padding=True, return_tensors="pt")
    try:
        with torch.no_grad():
            m.base(**enc)
    finally:
        for h in handles:
            h.remove()
    keep = enc["attention_mask"].bool()
    t = 0.05
    st = of.outlier_feature_statistics(m, TEXTS, threshold=t, batch_size=3)
    assert st.share.shape == (2 * m.n_layers, m.d_model) and st.n_positions == int(keep.sum())
    for s, xs in got.items():
        x = xs[0][keep].abs().double()
        np.testing.assert_allclose(st.share[s], (x >= t).double().mean(0).numpy())
        np.testing.assert_allclose(st.max_abs[s], x.max(0).values.numpy(), rtol=1e-6)
    # the criterion, written out
    aff = (st.share[0::2] >= 0.06) | (st.share[1::2] >= 0.06)
    np.testing.assert_array_equal(st.affected_layers(0.06), aff)
    want = np.flatnonzero((aff.mean(0) >= 0.25) & (aff.mean(0) > 0))
    np.testing.assert_array_equal(st.systematic(0.25, 0.06), want)
    np.testing.assert_array_equal(st.per_layer(0.06), aff.sum(1))
    first = of.outlier_feature_statistics(m, TEXTS, threshold=t, skip_first=True)
    assert first.n_positions == st.n_positions - len(TEXTS)


def test_outlier_features_reject_bad_input(llama):
    with pytest.raises(ValueError, match=">= 0"):
        of.outlier_feature_statistics(llama, TEXTS, threshold=-1.0)
    with pytest.raises(TypeError):
        of.outlier_feature_statistics(llama, TEXTS, skip_first=1)
    with pytest.raises(ValueError, match="non-empty"):
        of.outlier_feature_statistics(llama, [])
    with pytest.raises(TypeError, match="LoadedModel"):
        of.outlier_feature_statistics(torch.nn.Linear(2, 2), TEXTS)
    st = of.outlier_feature_statistics(llama, TEXTS)
    with pytest.raises(ValueError):
        st.systematic(layer_share=1.5)
    with pytest.raises(TypeError):
        st.affected_layers(position_share="6%")


# --------------------------------------------------------------------------- centred attention logits
def test_centred_logits_match_a_brute_force_computation(llama):
    cap = a.capture_queries_keys(llama, TEXTS, layers=[1])[0]
    out = a.centred_logit_statistics(cap)
    h = 4
    kv = cap.kv_head(h)
    q_bar = cap.q[:, h].astype(np.float64).mean(0)
    raw, cen, sig, rest = [], [], [], []
    for b in range(len(TEXTS)):
        idx = np.flatnonzero(cap.text == b)
        for i in idx:
            keys = [j for j in idx if cap.position[j] <= cap.position[i]]
            if len(keys) < 2:
                continue
            q = cap.q[i, h].astype(np.float64)
            k = cap.k[keys, kv].astype(np.float64)
            logit = k @ q
            c = logit - logit.mean()
            s = (k - k.mean(0)) @ q_bar
            # softmax ignores the per-query constant
            np.testing.assert_allclose(np.exp(c) / np.exp(c).sum(), np.exp(logit) / np.exp(logit).sum(),
                                       rtol=1e-9)
            raw += list(logit)
            cen += list(c)
            sig += list(s)
            rest += list(c - s)
    raw, cen, sig, rest = map(np.array, (raw, cen, sig, rest))
    assert out["n_pairs"][h] == raw.size
    np.testing.assert_allclose(out["snr_raw"][h], abs(raw.mean()) / raw.std(), rtol=1e-9)
    np.testing.assert_allclose(out["var_centred"][h], np.mean(cen ** 2), rtol=1e-9)
    np.testing.assert_allclose(out["query_constant_share"][h], 1 - np.mean(cen ** 2) / raw.var(), rtol=1e-9)
    np.testing.assert_allclose(out["snr_centred"][h], np.sqrt(np.sum(sig ** 2) / np.sum(rest ** 2)), rtol=1e-9)
    assert np.all((out["query_constant_share"] >= 0) & (out["query_constant_share"] <= 1))


def test_centred_logits_encoder_and_bad_input(bert):
    cap = a.capture_queries_keys(bert, TEXTS, layers=[0])[0]
    out = a.centred_logit_statistics(cap, skip_first=True)
    lengths = np.bincount(cap.text) - 1
    assert out["n_pairs"][0] == int((lengths[lengths >= 2] ** 2).sum())
    with pytest.raises(TypeError, match="QueryKeyCapture"):
        a.centred_logit_statistics("cap")
    with pytest.raises(TypeError):
        a.centred_logit_statistics(cap, skip_first="yes")
    one = dataclasses.replace(cap, text=np.arange(cap.text.size), position=np.zeros(cap.text.size, int))
    with pytest.raises(ValueError, match="two keys"):
        a.centred_logit_statistics(one)


# --------------------------------------------------------------------------- stored statistics views
def _stats(L=2, d=3, nt=4):
    g = np.random.default_rng(0)
    mean, var = g.normal(size=(L, d)), g.uniform(1, 2, size=(L, d))
    return channel_stats.ChannelStatistics(mean=mean, var=var, min=mean - 3, max=mean + 4, max_abs=np.abs(mean) + 4,
                                    counts=g.integers(0, 10, size=(L, nt, d)),
                                    thresholds=np.arange(1.0, nt + 1), n_tokens=10, n_texts=2,
                                    skip_first=True, model="x")


def test_coarsen_thresholds_and_max_abs_z():
    st = _stats()
    c = cr.coarsen_thresholds(st, 2)
    np.testing.assert_array_equal(c.thresholds, [1.0, 3.0])
    np.testing.assert_array_equal(c.counts, st.counts[:, ::2])
    assert c.mean is st.mean and c.n_tokens == 10
    np.testing.assert_array_equal(cr.coarsen_thresholds(st, 1, start=3).thresholds, [4.0])
    np.testing.assert_allclose(cr.max_abs_z(st), 4 / np.sqrt(st.var))
    for bad, exc in (((st, 0), ValueError), ((st, 2.0), TypeError), ((st, 1, 4), ValueError),
                     (("st", 2), TypeError)):
        with pytest.raises(exc):
            cr.coarsen_thresholds(*bad)
    with pytest.raises(TypeError, match="ChannelStatistics"):
        cr.max_abs_z({"mean": 1})


def test_statistics_of_a_result_round_trips():
    st = _stats()
    r = xp.Result(name="channel_statistics", config={"model": "x", "skip_first": True},
                  arrays=st.arrays(), scalars={"n_tokens": 10, "n_texts": 2}, versions={}, device="cpu",
                  wall_time=1.0, schema="1.1", config_hash="0" * 16)
    back = statistics_of(r)
    for f in ("mean", "var", "min", "max", "max_abs", "counts", "thresholds"):
        np.testing.assert_array_equal(getattr(back, f), getattr(st, f))
    assert (back.n_tokens, back.n_texts, back.skip_first, back.model) == (10, 2, True, "x")
    with pytest.raises(TypeError, match="channel_statistics"):
        statistics_of(dataclasses.replace(r, name="massive_ablation"))
    with pytest.raises(TypeError):
        statistics_of(st)
    with pytest.raises(ValueError, match="lacks"):
        statistics_of(dataclasses.replace(r, arrays={"mean": st.mean}))


def test_massive_ablation_accessors():
    L, n = 3, 4
    arrays = {"first_values": np.ones((L + 1, n)), "median_abs": np.ones(L + 1)}
    for arm in massive_ablation.ARMS:
        arrays[f"loss_{arm}"], arrays[f"sink_{arm}"] = np.full(n, 2.0), np.zeros((n, L))
    r = xp.Result(name="massive_ablation", config={"channel": 5, "layer": 2}, arrays=arrays,
                  scalars={"mean_value": 7.0}, versions={}, device="cpu", wall_time=1.0, schema="1.1",
                  config_hash="0" * 16)
    prof = massive_ablation.profile_of(r)
    assert prof.channel == 5 and prof.values.shape == (L + 1, n)
    runs = massive_ablation.runs_of(r)
    assert list(runs) == ["none", "zero", "mean"]
    assert runs["none"].layer is None and runs["mean"].value == 7.0 and runs["zero"].layer == 2
    with pytest.raises(TypeError):
        massive_ablation.runs_of(dataclasses.replace(r, name="channel_statistics"))
    with pytest.raises(ValueError, match="lacks"):
        massive_ablation.profile_of(dataclasses.replace(r, arrays={}))


# --------------------------------------------------------------------------- plots
@pytest.fixture
def ax():
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots()
    yield axis
    plt.close(fig)


def test_layer_profiles_draw_and_reject_bad_input(ax):
    lines = plots.layer_profiles(ax, {"a": [1, 2, 3], "b": ([3, 2, 1], "C1:")}, logy=True)
    assert [ln.get_label() for ln in lines] == ["a", "b"] and ax.get_yscale() == "log"
    with pytest.raises(TypeError):
        plots.layer_profiles(ax, [1, 2, 3])
    with pytest.raises(TypeError):
        plots.layer_profiles(ax, {"a": ([1, 2], 3)})
    with pytest.raises(ValueError):
        plots.layer_profiles(ax, {"a": [1, 2, 3]}, x=[0, 1])


# --------------------------------------------------------------------------- the stored Result
def test_stored_massive_ablation_is_current_and_consistent():
    cfg = xp.make_config("massive_ablation", model="smollm2-135m")
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), (f"missing {path}; create it with python -m companion run massive_ablation "
                           "--model smollm2-135m --out companion/data/results")
    r = xp.load_result(path)
    assert xp.stale_reason(r, cfg) is None
    L, n = r.scalars["n_layers"], cfg.n_texts
    prof, runs = massive_ablation.profile_of(r), massive_ablation.runs_of(r)
    assert prof.values.shape == (L + 1, n) and prof.emergence_layer() == cfg.layer
    assert r.scalars["emergence_layer"] == cfg.layer
    cal = r.arrays["calibration_values"]
    assert cal.shape == (cfg.n_calibration,) and r.scalars["mean_value"] == pytest.approx(cal.mean())
    for run in runs.values():
        assert run.loss.shape == (n,) and run.sink.shape == (n, L)
        assert np.all(run.loss > 0) and np.all((run.sink >= 0) & (run.sink <= 1))
    # blocks before the edited layer read the same stream in every arm
    for arm in ("zero", "mean"):
        np.testing.assert_allclose(runs[arm].sink[:, :cfg.layer], runs["none"].sink[:, :cfg.layer],
                                   atol=1e-6)
