"""Interop with the residual-stream tools readers already use (book/running_experiments.ipynb).

The chapter's table maps the probes' indices to module paths and hook names; these tests check
the module side of it with plain torch hooks on tiny random models built from configs (nothing is
downloaded): ``h_l`` is the input of block ``l``, ``h_{l+1}`` its output, and transformers' last
hidden state of a pre-norm model is the final norm of ``h_L``.  ``models.wrap`` is checked on
models the user already holds, including the one inside an nnsight ``LanguageModel`` when nnsight
is installed (the optional extra ``interop``; skipped otherwise).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from companion.transformers import models
from companion.transformers import stream

TEXTS = ["The cat sat on the mat.", "A longer sentence with a few more words in it."]


@pytest.fixture(scope="module")
def tokenizer():
    return copy.deepcopy(models.load("minilm-l6").tokenizer)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=30522, num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64))


def _bert(head: bool = False):
    from transformers import BertConfig, BertForMaskedLM, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64)
    return BertForMaskedLM(cfg) if head else BertModel(cfg)


def _block_io(m, enc):
    """Inputs and outputs of every block, read with plain forward hooks (what nnsight's .input/.output save)."""
    ins, outs, handles = [], [], []
    for block in m.blocks:
        handles.append(block.register_forward_pre_hook(
            lambda mod, args, kwargs: ins.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True))
        handles.append(block.register_forward_hook(
            lambda mod, args, out: outs.append(out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            hidden = m.base(**stream._forward_inputs(m, enc), output_hidden_states=True).hidden_states
    finally:
        for h in handles:
            h.remove()
    return ins, outs, hidden


@pytest.mark.parametrize("build, path", [(_llama, "model.layers"), (_bert, "encoder.layer"),
                                         (lambda: _bert(head=True), "bert.encoder.layer")])
def test_the_table_maps_indices_to_block_inputs_and_outputs(tokenizer, build, path):
    hf = build()
    m = models.wrap(hf, tokenizer)
    assert m.blocks is hf.get_submodule(path)                 # the module paths of the table
    enc = models.tokenize(m, TEXTS)
    hs = stream.residual_stream(m, enc)
    ins, outs, hidden = _block_io(m, enc)
    L = m.n_layers
    for layer in range(L):                                    # h_l = input of block l = resid_pre
        torch.testing.assert_close(hs[layer], ins[layer], rtol=0, atol=0)
        torch.testing.assert_close(hs[layer + 1], outs[layer], rtol=0, atol=0)   # = resid_post
        torch.testing.assert_close(hs[layer], hidden[layer], rtol=0, atol=0)
    if m.placement == "pre":                                  # the final norm sits after h_L
        assert m.final_norm is hf.model.norm
        torch.testing.assert_close(m.final_norm(hs[L]), hidden[L], rtol=0, atol=0)
        assert not torch.allclose(hs[L], hidden[L])
    else:                                                     # post-LN: no final norm, h_L = last hidden
        assert m.final_norm is None
        torch.testing.assert_close(hs[L], hidden[L], rtol=0, atol=0)
        emb = m.base.embeddings(input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"))
        torch.testing.assert_close(hs[0], emb, rtol=0, atol=0)  # h_0 is already LayerNorm-ed


def test_injection_at_h_l_is_added_to_the_input_of_block_l(tokenizer):
    m = models.wrap(_llama(), tokenizer)
    enc = models.tokenize(m, TEXTS)
    v = torch.ones(m.d_model) / m.d_model**0.5
    layer = 2
    injected = stream.inject(m, enc, layer, v, scale=4.0)
    handle = m.blocks[layer].register_forward_pre_hook(lambda mod, args: (args[0] + 4.0 * v, *args[1:]))
    try:
        ins, outs, _ = _block_io(m, enc)
    finally:
        handle.remove()
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(injected[layer + 1][real], outs[layer][real], rtol=1e-5, atol=1e-5)


def test_wrap_of_the_loaded_minilm_is_the_loaded_minilm():
    mini = models.load("minilm-l6")
    again = models.wrap(mini.model, mini.tokenizer, name="mine")
    for field in ("n_layers", "d_model", "placement", "norm", "kind", "device"):
        assert getattr(again, field) == getattr(mini, field)
    assert again.blocks is mini.blocks and again.model is mini.model
    enc = models.tokenize(mini, TEXTS)
    torch.testing.assert_close(stream.residual_stream(again, enc), stream.residual_stream(mini, enc), rtol=0, atol=0)


def test_wrap_needs_a_tokenizer():
    with pytest.raises(TypeError, match="tokenizer"):
        models.wrap(_bert())


def test_wrap_of_an_nnsight_language_model(tokenizer):
    nnsight = pytest.importorskip("nnsight", reason="nnsight is the optional extra 'interop'")
    hf = _llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # nnsight 0.8 deprecates the class name
        lm = nnsight.LanguageModel(hf, tokenizer=tokenizer)
    m = models.wrap(lm)                                       # the model inside, with its tokenizer
    assert m.model is hf and m.tokenizer is tokenizer and m.placement == "pre"
    enc = models.tokenize(m, TEXTS)
    hs = stream.residual_stream(m, enc)
    saved = []
    with lm.trace(dict(enc)):
        for layer in range(m.n_layers):
            saved.append((lm.model.layers[layer].input.save(), lm.model.layers[layer].output.save()))
        final = lm.model.norm.output.save()
    for layer, (inp, out) in enumerate(saved):
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(hs[layer], inp, rtol=0, atol=0)
        torch.testing.assert_close(hs[layer + 1], out, rtol=0, atol=0)
    torch.testing.assert_close(m.final_norm(hs[-1]), final, rtol=0, atol=0)


def test_injection_through_nnsight_equals_probes_inject(tokenizer):
    nnsight = pytest.importorskip("nnsight", reason="nnsight is the optional extra 'interop'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = nnsight.LanguageModel(_llama(), tokenizer=tokenizer)
    m = models.wrap(lm)
    enc = models.tokenize(m, TEXTS)
    v = torch.ones(m.d_model) / m.d_model**0.5
    ref = stream.inject(m, enc, 2, v, scale=4.0)              # adds 4 v to h_2
    with lm.trace(dict(enc)):
        lm.model.layers[2].input = lm.model.layers[2].input + 4.0 * v
        via_input = lm.model.layers[2].output.save()
    with lm.trace(dict(enc)):
        lm.model.layers[1].output[:] += 4.0 * v
        via_output = lm.model.layers[2].output.save()
    real = enc["attention_mask"].bool()                      # nnsight also adds at the pads
    for got in (via_input, via_output):
        torch.testing.assert_close(got[real], ref[3][real], rtol=1e-5, atol=1e-5)
