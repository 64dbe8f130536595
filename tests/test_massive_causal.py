"""Tests of the causal map of the massive activations (issue 27): ``edited_run``, ``token_map``, the
``massive_causal`` experiment and its W8A8 context, each against a direct computation on tiny random
models, and every bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from test_channel_regimes import TEXTS, _tiny, tokenizer  # noqa: F401 (the fixture)

from companion import experiments as xp
from companion.applications.quantization import quantize_weight
from companion.experiments import massive_causal as mc
from companion.outliers import massive_activations as ma
from companion.transformers import stream
from companion.transformers.readout import logits_from_residual, next_token_loss, sentence_embedding


@pytest.fixture(scope="module")
def llama(tokenizer):  # noqa: F811
    return _tiny("llama", tokenizer)


@pytest.fixture(scope="module")
def bert(tokenizer):  # noqa: F811
    return _tiny("bert", tokenizer)


def test_untouched_run_matches_the_package_readouts(llama, bert):
    run = ma.edited_run(llama, TEXTS, trace_channel=5, batch_size=2)
    np.testing.assert_allclose(run.loss, next_token_loss(llama, TEXTS, per_text=True), rtol=1e-5)
    h = stream.residual_stream(llama, TEXTS)
    np.testing.assert_allclose(run.trace, h[1:, :, 0, 5].double().numpy(), rtol=1e-5, atol=1e-6)
    enc = ma.edited_run(bert, TEXTS, batch_size=2)
    assert enc.loss is None
    np.testing.assert_allclose(enc.embedding, sentence_embedding(bert, TEXTS).numpy(), atol=1e-5)


def test_first_token_edit_agrees_with_ablate_activation(llama):
    run = ma.edited_run(llama, TEXTS[:2], [ma.StreamEdit("residual", 1, 3, "first", 7.5)], trace_channel=3)
    old = ma.ablate_activation(llama, TEXTS[:2], 1, 3, 7.5)
    np.testing.assert_allclose(run.loss, old.loss, rtol=1e-5)
    np.testing.assert_allclose(run.trace[0], 7.5)


def test_token_edit_at_the_last_layer_matches_an_edited_stream(llama):
    ids = llama.tokenizer("the", add_special_tokens=False)["input_ids"]
    run = ma.edited_run(llama, TEXTS[:2], [ma.StreamEdit("residual", 2, 4, tuple(ids), -3.0)])
    enc = llama.tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    h = stream.residual_stream(llama, TEXTS[:2])[-1].clone()
    sel = torch.isin(enc["input_ids"], torch.tensor(ids)) & enc["attention_mask"].bool()
    assert sel.any()
    h[..., 4] = torch.where(sel, torch.full_like(h[..., 4], -3.0), h[..., 4])
    logp = torch.log_softmax(logits_from_residual(llama, h)[:, :-1].double(), -1)
    nll = -logp.gather(-1, enc["input_ids"][:, 1:, None])[..., 0]
    valid = enc["attention_mask"][:, 1:].bool()
    want = ((nll * valid).sum(1) / valid.sum(1)).numpy()
    np.testing.assert_allclose(run.loss, want, rtol=1e-5)


@pytest.mark.parametrize("part, module", [("attention", "self_attn"), ("mlp", "mlp")])
def test_sublayer_write_edit_removes_that_write(llama, part, module):
    """The sum after the edited sublayer (the MLP's norm input, or h_2) loses exactly its write."""
    block = llama.blocks[1]
    writes, sums = [], []
    mod = dict(block.named_modules())[module]
    w_handle = mod.register_forward_hook(lambda _m, _a, out: writes.append(
        (out[0] if isinstance(out, tuple) else out)[:, 0, 2].detach().double().clone()))
    s_handle = block.post_attention_layernorm.register_forward_pre_hook(
        lambda _m, args: sums.append(args[0][:, 0, 2].detach().double().clone()))
    try:
        base = ma.edited_run(llama, TEXTS[:2], trace_channel=2)
        run = ma.edited_run(llama, TEXTS[:2], [ma.StreamEdit(part, 1, 2, "all", 0.0)], trace_channel=2)
    finally:
        w_handle.remove()
        s_handle.remove()
    if part == "attention":    # the residual sum the MLP reads: h_1 + attention write
        np.testing.assert_allclose(sums[1].numpy(), (sums[0] - writes[0]).numpy(), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(run.trace[1], base.trace[1] - writes[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.trace[0], base.trace[0])


def test_token_map_matches_the_stream_and_the_value_projection(llama):
    tm = ma.token_map(llama, TEXTS, channel=6, batch_size=2, max_length=32)
    h = stream.residual_stream(llama, TEXTS, max_length=32).double()
    enc = llama.tokenizer(TEXTS, padding=True, return_tensors="pt")
    T = enc["input_ids"].shape[1]
    assert tm.value.shape == (2, 3, 32) and (tm.mask[:, :T] == enc["attention_mask"].bool().numpy()).all()
    real = enc["attention_mask"].bool().numpy()
    np.testing.assert_allclose(tm.value[:, :, :T][:, real], h[1:, ..., 6].numpy()[:, real], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(tm.top_abs[:, :, :T][:, real], h[1:].abs().amax(-1).numpy()[:, real],
                               rtol=1e-5)
    for l, block in enumerate(llama.blocks):   # value vectors from the block's input h_l
        with torch.no_grad():
            v = block.self_attn.v_proj(block.input_layernorm(h[l].float()))
        np.testing.assert_allclose(tm.value_norm[l, :, :T][real], v.double().norm(dim=-1).numpy()[real],
                                   rtol=1e-4)
    real = enc["attention_mask"].bool()
    np.testing.assert_allclose(tm.median_abs, [np.median(h[l][real].abs().numpy()) for l in range(1, 3)],
                               rtol=1e-5)


def test_w8a8_context_keeps_the_first_token_in_float():
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 5, 4)
    x[:, 0] *= 50.0
    w8 = quantize_weight(lin.weight.detach(), 8)
    with torch.no_grad():
        with mc._w8a8({"l": lin}, {"l": (-3.0, 3.0)}, first_float=True):
            kept = lin(x)
        with mc._w8a8({"l": lin}, {"l": (-3.0, 3.0)}, first_float=False):
            quant = lin(x)
        exact = x @ w8.T + lin.bias
    torch.testing.assert_close(kept[:, 0], exact[:, 0])          # float input, W8 weights
    torch.testing.assert_close(kept[:, 1:], quant[:, 1:])
    assert (quant[:, 0] - exact[:, 0]).abs().max() > 1.0          # clipped at the static range


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_experiment_at_a_tiny_size(kind, llama, bert, monkeypatch):
    m = llama if kind == "llama" else bert
    monkeypatch.setattr(mc, "load_model", lambda config, device: m)
    cfg = mc.MassiveCausalExperiment(model="tiny", channel=5, first_layer=1,
                                     words=("the",) if kind == "llama" else (),
                                     word_layers=(1, 2) if kind == "llama" else (),
                                     write_block=1 if kind == "llama" else -1, n_texts=4,
                                     n_calibration=3, n_random=3, random_texts=2, threshold=2.5,
                                     max_length=32, batch_size=2)
    out = cfg.compute("cpu", False)
    arms = out["arms"].split(",")
    want = ["none", "first_zero", "first_mean"]
    want += ["word_zero", "first_word_zero", "attn_write_zero", "mlp_write_zero"] * (kind == "llama")
    assert arms[:len(want)] == want and {"w8a8", "w8a8_first_float"} <= set(arms)
    texts = mc._evaluation_texts(7, cfg.min_words, cfg.max_words)
    if kind == "llama":
        np.testing.assert_allclose(out["score_none"],
                                   next_token_loss(m, texts[:4], max_length=32, per_text=True), rtol=1e-5)
    else:
        np.testing.assert_allclose(out["score_none"], 0.0, atol=1e-6)
    np.testing.assert_allclose(out["trace_first_mean"][0], out["calibration_first"].mean(), rtol=1e-6)
    np.testing.assert_allclose(out["trace_first_zero"][0], 0.0)
    assert out["random_score"].shape == (3, 2) and out["random_channels"].shape[0] == 3
    assert not set(out["random_channels"].ravel()) & set(out["features"].tolist())
    r = xp.Result(name="massive_causal", config=dataclasses.asdict(cfg),
                  arrays={k: np.asarray(v) for k, v in out.items() if not isinstance(v, (str, int, float))},
                  scalars={"arms": out["arms"]}, versions={}, device="cpu", wall_time=1.0, schema="1.1",
                  config_hash="0" * 16)
    assert list(mc.scores_of(r)) == arms


@pytest.mark.parametrize(
    "edit, exc, match",
    [
        (ma.StreamEdit("stream", 1, 0), ValueError, "site"),
        (ma.StreamEdit("residual", 0, 0), ValueError, ">= 1"),
        (ma.StreamEdit("residual", 3, 0), ValueError, "outside"),
        (ma.StreamEdit("mlp", 2, 0), ValueError, "outside"),
        (ma.StreamEdit("residual", 1, 48), ValueError, "outside"),
        (ma.StreamEdit("residual", 1, 0, "last"), ValueError, "positions"),
        (ma.StreamEdit("residual", 1, 0, ()), TypeError, "positions"),
        (ma.StreamEdit("residual", 1, 0, "first", float("nan")), ValueError, "finite"),
        ("first", TypeError, "StreamEdit"),
    ],
)
def test_edited_run_rejects_bad_edits(llama, edit, exc, match):
    with pytest.raises(exc, match=match):
        ma.edited_run(llama, TEXTS[:1], [edit])


def test_bad_inputs_of_the_map_and_the_experiment(llama, monkeypatch):
    with pytest.raises(ValueError, match="outside"):
        ma.token_map(llama, TEXTS, 48)
    with pytest.raises(ValueError, match="non-empty"):
        ma.edited_run(llama, [], ())
    with pytest.raises(ValueError, match=">= 1"):
        ma.edited_run(llama, TEXTS, (), batch_size=0)
    monkeypatch.setattr(mc, "load_model", lambda config, device: llama)
    with pytest.raises(ValueError, match="random_texts"):
        mc.MassiveCausalExperiment(n_texts=4, random_texts=8).compute("cpu", False)
    with pytest.raises(ValueError, match="single tokens"):
        mc.MassiveCausalExperiment(n_texts=2, n_calibration=2, random_texts=2, words=("the earth",),
                                   channel=0, first_layer=1, word_layers=(1,), write_block=-1,
                                   max_length=16).compute("cpu", False)
    r = xp.Result(name="massive_ablation", config={}, arrays={}, scalars={}, versions={}, device="cpu",
                  wall_time=1.0, schema="1.1", config_hash="0" * 16)
    with pytest.raises(TypeError, match="massive_causal"):
        mc.scores_of(r)
    with pytest.raises(ValueError):
        mc.scores_of(dataclasses.replace(r, name="massive_causal"))


@pytest.mark.parametrize("name", sorted(mc.CPU_CONFIGS))
def test_stored_massive_causal_results_are_current_and_consistent(name):
    cfg = mc.CPU_CONFIGS[name]
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), (f"missing {path}; create it with python -m companion run massive_causal "
                           "(the config of CPU_CONFIGS) --out companion/data/results")
    r = xp.load_result(path)
    assert xp.stale_reason(r, cfg) is None
    scores, L = mc.scores_of(r), r.scalars["n_layers"]
    assert {"none", "first_zero", "first_mean", "w8a8", "w8a8_first_float"} <= set(scores)
    for arm, s in scores.items():
        assert s.shape == (cfg.n_texts,) and np.isfinite(s).all()
        assert r.arrays[f"trace_{arm}"].shape == (L, cfg.n_texts)
    # the edits act where they should: before the edited layer every arm reads the same stream
    k = cfg.first_layer - 1
    np.testing.assert_allclose(r.arrays["trace_first_zero"][k], 0.0)
    np.testing.assert_allclose(r.arrays["trace_first_zero"][:k], r.arrays["trace_none"][:k], rtol=1e-5)
    np.testing.assert_allclose(r.arrays["trace_first_mean"][k], r.arrays["calibration_first"].mean(),
                               rtol=1e-6)
    # the untouched run's trace is the token map's first position
    np.testing.assert_allclose(r.arrays["trace_none"], r.arrays["map_value"][:, :, 0], rtol=1e-4, atol=1e-3)
    assert r.arrays["random_score"].shape == (cfg.n_random, cfg.random_texts)
    assert not set(r.arrays["random_channels"].ravel()) & set(r.arrays["features"].tolist())
