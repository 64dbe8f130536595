"""Experiments: a frozen config dataclass -> ``run(config, device)`` -> a :class:`Result`, cached.

One code path serves every size: a chapter runs a small config on a CPU, the CLI
(``python -m companion run NAME --set key=value``) runs a large one on a GPU, and both produce
the same kind of :class:`Result` -- arrays, the config, package versions, the device and the
wall time -- saved as ``<results>/<experiment>/<config hash>.json`` + ``.npz``.
:func:`run_cached` returns a stored Result only if its config hash and schema match; otherwise
it recomputes (and says so), never silently reusing a stale file.

Where Results live
------------------
``results/stored/``
    Committed Results (the GPU runs the chapters read).  Searched first.
``results/cache/``
    Everything computed locally (git-ignored).  New Results go here by default.
Set ``$COMPANION_RESULTS`` to use another root folder.

Adding an experiment
--------------------
Drop a module into ``companion/experiments/`` (it is discovered automatically with
:mod:`pkgutil`) that defines a frozen dataclass decorated with :func:`register`::

    from dataclasses import dataclass
    from companion.experiments import register

    @register("my_experiment", schema=1)
    @dataclass(frozen=True)
    class MyExperiment:
        \"\"\"One line saying what it measures.\"\"\"
        model: str = "smollm2-135m"
        n_texts: int = 32
        thresholds: tuple[float, ...] = (1.0, 5.0)

        def compute(self, device, progress):
            # ... load, measure ...
            return {"counts": counts_array, "n_tokens": 1234}

* Fields must be JSON-serialisable: ``int``, ``float``, ``str``, ``bool`` or tuples of them
  (tuples, not lists: the dataclass is frozen and hashable).  Every field needs a default, so
  that ``MyExperiment()`` is the small CPU configuration used by the chapter.
* ``compute(device, progress)`` returns a dict: numpy arrays (or torch tensors) go into
  ``Result.arrays``, numbers/strings/lists into ``Result.scalars``.  ``device`` is a
  ``torch.device``; ``progress`` says whether to show a tqdm bar.
* Bump ``schema`` whenever ``compute`` changes what it returns or how: stored Results with
  another schema are then recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pkgutil
import platform
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FRAMEWORK_SCHEMA",
    "Result",
    "register",
    "experiment_names",
    "get_experiment",
    "make_config",
    "config_hash",
    "run",
    "run_cached",
    "save_result",
    "load_result",
    "result_path",
    "results_root",
    "StaleResultWarning",
]

#: Version of the on-disk Result format (part of every Result's schema string).
FRAMEWORK_SCHEMA = 1

_REGISTRY: dict[str, type] = {}
_DISCOVERED = False


class StaleResultWarning(UserWarning):
    """A stored Result did not match its config hash or schema and was recomputed."""


# --------------------------------------------------------------------------- registry
def register(name: str, schema: int = 1):
    """Class decorator: register a frozen config dataclass as the experiment ``name``.

    Parameters
    ----------
    name : str
        Identifier used by the CLI and in Result paths (letters, digits, ``_`` and ``-``).
    schema : int, default 1
        Version of what ``compute`` returns; bump it when that changes.

    Returns
    -------
    callable
        The decorator; it returns the class unchanged, with ``experiment_name`` and
        ``schema`` class attributes set.

    Raises
    ------
    TypeError
        If the class is not a frozen dataclass with a ``compute`` method, a field has no default,
        or a field's type is not JSON-serialisable.
    ValueError
        If ``name`` is malformed or already registered to another class.

    Examples
    --------
    >>> @register("doc_example", schema=1)
    ... @dataclass(frozen=True)
    ... class DocExample:
    ...     n: int = 3
    ...     def compute(self, device, progress):
    ...         return {"squares": np.arange(self.n) ** 2}
    >>> run(DocExample(n=4)).arrays["squares"].tolist()
    [0, 1, 4, 9]
    """
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"experiment name must be letters, digits, '_' or '-', got {name!r}")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ValueError(f"schema must be a positive integer, got {schema!r}")

    def decorate(cls):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"@register expects a dataclass, got {cls!r}")
        if not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__} must be declared with @dataclass(frozen=True)")
        if not callable(getattr(cls, "compute", None)):
            raise TypeError(f"{cls.__name__} needs a method compute(self, device, progress) -> dict")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name} needs a default (the default config is the small one)")
            _field_kind(hints[f.name], f"{cls.__name__}.{f.name}")
        other = _REGISTRY.get(name)
        if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"experiment {name!r} is already registered by {other.__module__}.{other.__qualname__}")
        cls.experiment_name = name
        cls.schema = schema
        _REGISTRY[name] = cls
        return cls

    return decorate


def _discover() -> None:
    """Import every module of this package once, so that their @register calls run."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            try:
                importlib.import_module(f"{__name__}.{info.name}")
            except Exception as exc:  # noqa: BLE001 - one broken module must not hide the others
                warnings.warn(f"experiments module {info.name!r} could not be imported ({type(exc).__name__}: "
                              f"{exc}); its experiments are unavailable", RuntimeWarning, stacklevel=2)


def experiment_names() -> list[str]:
    """Sorted names of all registered experiments (modules are discovered on first call).

    Examples
    --------
    >>> "channel_statistics" in experiment_names()
    True
    """
    _discover()
    return sorted(_REGISTRY)


def get_experiment(name: str) -> type:
    """The config class registered as ``name``.

    Raises
    ------
    ValueError
        If no experiment has that name (the message lists the known ones).
    """
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


# --------------------------------------------------------------------------- configs
_SCALARS = (int, float, str, bool)


def _field_kind(tp, where: str):
    """Return (kind, element type) for a field annotation; raise TypeError if unsupported."""
    origin = typing.get_origin(tp)
    if tp in _SCALARS:
        return ("scalar", tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            kind, elem = _field_kind(args[0], where)
            return ("optional-" + kind, elem)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis and args[0] in _SCALARS:
            return ("tuple", args[0])
    raise TypeError(
        f"{where}: type {tp!r} is not JSON-serialisable; use int, float, str, bool, "
        "tuple[T, ...] of those, or Optional of them"
    )


def _coerce(value: Any, tp, where: str) -> Any:
    """Convert ``value`` (a Python object or a CLI string) to the field type ``tp``."""
    kind, elem = _field_kind(tp, where)
    if kind.startswith("optional-"):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        kind = kind[len("optional-"):]
    if kind == "tuple":
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = json.loads(text)
            else:
                value = [v for v in (p.strip() for p in text.strip("()").split(",")) if v]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(_coerce_scalar(v, elem, where) for v in value)
    return _coerce_scalar(value, elem, where)


def _coerce_scalar(value: Any, tp: type, where: str):
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{where} must be true or false, got {value!r}")
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a {tp.__name__}, got {value!r}")
    try:
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            out = int(value) if not isinstance(value, str) else int(value.strip())
        else:
            out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a {tp.__name__}, got {value!r}") from None
    if tp is float and not np.isfinite(out):
        raise ValueError(f"{where} must be finite, got {value!r}")
    return out


def make_config(name_or_cls, overrides: dict | None = None, **kwargs):
    """Build an experiment config from defaults plus overrides, typed by the dataclass fields.

    Parameters
    ----------
    name_or_cls : str or type
        A registered experiment name or its config class.
    overrides : dict, optional
        Field values; strings (e.g. from ``--set n_texts=256``) are converted to the field's
        type (``"1,5,20"`` or ``"[1, 5, 20]"`` for a tuple field).
    **kwargs
        More overrides.

    Returns
    -------
    The frozen config instance.

    Raises
    ------
    ValueError
        For an unknown experiment or field name, or a value that does not convert.

    Examples
    --------
    >>> make_config("channel_statistics", {"n_texts": "8"}).n_texts
    8
    """
    cls = get_experiment(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    if not getattr(cls, "experiment_name", None):
        raise ValueError(f"{cls!r} is not a registered experiment config")
    values = {**(overrides or {}), **kwargs}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{cls.experiment_name} has no option {', '.join(unknown)}; options: {', '.join(sorted(names))}")
    typed = {k: _coerce(v, hints[k], f"{cls.experiment_name}.{k}") for k, v in values.items()}
    return cls(**typed)


def _config_dict(config) -> dict:
    if not dataclasses.is_dataclass(config) or not getattr(type(config), "experiment_name", None):
        raise TypeError(f"expected a registered experiment config, got {type(config).__name__}")
    return {f.name: (list(v) if isinstance(v := getattr(config, f.name), tuple) else v)
            for f in dataclasses.fields(config)}


def config_hash(config) -> str:
    """16-hex-digit SHA-256 of the experiment name and the canonical JSON of the config.

    Raises
    ------
    TypeError
        If ``config`` is not a registered experiment config.

    Examples
    --------
    >>> config_hash(make_config("channel_statistics")) == config_hash(make_config("channel_statistics"))
    True
    """
    values = _config_dict(config)
    payload = {"experiment": type(config).experiment_name, "config": values}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _schema(cls) -> str:
    return f"{FRAMEWORK_SCHEMA}.{cls.schema}"


# --------------------------------------------------------------------------- results
@dataclass
class Result:
    """What an experiment run produced, with everything needed to trust and reproduce it.

    Attributes
    ----------
    name : str
        Experiment name.
    config : dict
        The config as plain JSON values.
    arrays : dict of str -> numpy.ndarray
    scalars : dict
        Numbers, strings and lists (JSON).
    versions : dict
        python, torch, transformers, numpy, companion (and the platform).
    device : str
        E.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``.
    wall_time : float
        Seconds spent in ``compute``.
    schema : str
        ``"<framework schema>.<experiment schema>"``.
    config_hash : str
    created : str
        UTC timestamp (ISO 8601).
    """

    name: str
    config: dict
    arrays: dict
    scalars: dict
    versions: dict
    device: str
    wall_time: float
    schema: str
    config_hash: str
    created: str = ""
    path: Path | None = field(default=None, compare=False, repr=False)

    def config_object(self):
        """The frozen config instance this Result was computed from."""
        return make_config(self.name, self.config)


def _versions() -> dict:
    import companion

    out = {"python": platform.python_version(), "numpy": np.__version__,
           "companion": getattr(companion, "__version__", "unknown"), "platform": platform.platform()}
    for mod in ("torch", "transformers"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except ImportError:
            out[mod] = None
    return out


def _device_string(device) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if dev.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})"
    return str(dev)


def _split_outputs(outputs: dict, name: str) -> tuple[dict, dict]:
    if not isinstance(outputs, dict):
        raise TypeError(f"{name}.compute must return a dict of arrays and scalars, got {type(outputs).__name__}")
    arrays, scalars = {}, {}
    for key, value in outputs.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{name}.compute returned the key {key!r}; keys must be identifiers")
        if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise TypeError(f"{name}.{key}: object arrays cannot be stored")
            arrays[key] = value
        elif isinstance(value, (np.integer, np.floating, np.bool_)):
            scalars[key] = value.item()
        else:
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name}.{key} is neither an array nor a JSON value: {exc}") from None
            scalars[key] = value
    return arrays, scalars


def run(config, device=None, progress: bool = False) -> Result:
    """Run an experiment now (no cache) and return its :class:`Result`.

    Parameters
    ----------
    config : a registered experiment config instance
    device : str, torch.device or None
        ``None`` picks CUDA, then MPS, then CPU.
    progress : bool, default False
        Passed to ``compute`` (tqdm bars; ``TQDM_DISABLE=1`` silences them anyway).

    Returns
    -------
    Result

    Raises
    ------
    TypeError
        If ``config`` is not a registered config, or ``compute`` returns something unstorable.
    ValueError
        If the device is not available.
    """
    from companion.models import select_device

    cls = type(config)
    _config_dict(config)  # type check
    dev = select_device(device)
    t0 = time.perf_counter()
    outputs = config.compute(dev, bool(progress))
    wall = time.perf_counter() - t0
    arrays, scalars = _split_outputs(outputs, cls.experiment_name)
    return Result(
        name=cls.experiment_name,
        config=_config_dict(config),
        arrays=arrays,
        scalars=scalars,
        versions=_versions(),
        device=_device_string(dev),
        wall_time=wall,
        schema=_schema(cls),
        config_hash=config_hash(config),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def results_root() -> Path:
    """``$COMPANION_RESULTS`` or ``<repository>/results`` (``~/.cache/companion/results`` if absent)."""
    env = os.environ.get("COMPANION_RESULTS")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / "results"
    return Path.home() / ".cache" / "companion" / "results"


def result_path(config, results_dir: str | Path | None = None) -> Path:
    """Path of the JSON file of ``config``'s Result (``<dir>/<name>/<hash>.json``); default dir ``results/cache``."""
    base = Path(results_dir) if results_dir is not None else results_root() / "cache"
    return base / type(config).experiment_name / f"{config_hash(config)}.json"


def save_result(result: Result, results_dir: str | Path | None = None) -> Path:
    """Write ``result`` as JSON (metadata, config, scalars) + ``.npz`` (arrays); return the JSON path.

    Raises
    ------
    TypeError
        If ``result`` is not a Result.
    """
    if not isinstance(result, Result):
        raise TypeError(f"expected a Result, got {type(result).__name__}")
    base = Path(results_dir) if results_dir is not None else results_root() / "cache"
    path = base / result.name / f"{result.config_hash}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(result, k) for k in ("name", "config", "scalars", "versions", "device", "wall_time",
                                            "schema", "config_hash", "created")}
    meta["arrays"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in result.arrays.items()}
    tmp_json = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp_npz = path.with_suffix(f".tmp{os.getpid()}.npz")
    np.savez_compressed(tmp_npz, **result.arrays)
    tmp_json.write_text(json.dumps(meta, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp_npz, path.with_suffix(".npz"))
    os.replace(tmp_json, path)
    result.path = path
    return path


def load_result(path: str | Path) -> Result:
    """Read a Result written by :func:`save_result` (no pickles are loaded).

    Raises
    ------
    ValueError
        If the JSON or the ``.npz`` file is missing or malformed.
    """
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the Result at {path}: {exc}") from exc
    missing = {"name", "config", "scalars", "versions", "device", "wall_time", "schema", "config_hash"} - set(meta)
    if missing:
        raise ValueError(f"{path} is not a Result file (missing {sorted(missing)})")
    declared = set(meta.get("arrays", {}))
    if declared != set(arrays):
        raise ValueError(f"{path}: the .npz holds {sorted(arrays)} but the JSON declares {sorted(declared)}")
    return Result(name=meta["name"], config=meta["config"], arrays=arrays, scalars=meta["scalars"],
                  versions=meta["versions"], device=meta["device"], wall_time=meta["wall_time"],
                  schema=meta["schema"], config_hash=meta["config_hash"], created=meta.get("created", ""),
                  path=path)


def _stale_reason(result: Result, config) -> str | None:
    cls = type(config)
    if result.name != cls.experiment_name:
        return f"it belongs to experiment {result.name!r}"
    if result.schema != _schema(cls):
        return f"its schema is {result.schema}, the code's is {_schema(cls)}"
    want = config_hash(config)
    if result.config_hash != want:
        return f"its config hash is {result.config_hash}, expected {want}"
    try:
        stored = config_hash(make_config(cls, result.config))
    except (TypeError, ValueError) as exc:
        return f"its config no longer matches the dataclass ({exc})"
    if stored != want:
        return f"its stored config hashes to {stored}, not {want}"
    return None


def run_cached(config, device=None, results_dir: str | Path | None = None, force: bool = False,
               progress: bool = False) -> Result:
    """Return the stored Result of ``config`` if it is valid, else run and store it.

    Parameters
    ----------
    config : a registered experiment config instance
    device : str, torch.device or None
        Used only when the experiment has to run.
    results_dir : path or None
        Look only here and save here.  ``None``: look in ``results/stored`` then
        ``results/cache``; save into ``results/cache``.
    force : bool, default False
        Recompute even if a valid Result exists.
    progress : bool, default False

    Returns
    -------
    Result
        ``result.path`` says where it is stored.

    Raises
    ------
    TypeError
        If ``config`` is not a registered experiment config.

    Warns
    -----
    StaleResultWarning
        When a stored Result exists but its hash or schema does not match; it is recomputed
        and overwritten (in the folder it is saved to).

    Notes
    -----
    The key is the config hash (:func:`config_hash`); the device is not part of it, so a
    Result computed on a GPU is used by a chapter running on a CPU.  Its ``device`` field
    says where it was computed.

    Examples
    --------
    >>> r = run_cached(make_config("channel_statistics", n_texts=8))   # doctest: +SKIP
    """
    _config_dict(config)
    if results_dir is not None:
        candidates = [Path(results_dir)]
    else:
        candidates = [results_root() / "stored", results_root() / "cache"]
    if not force:
        for base in candidates:
            path = result_path(config, base)
            if not path.exists():
                continue
            try:
                stored = load_result(path)
            except ValueError as exc:
                warnings.warn(f"recomputing {type(config).experiment_name}: {exc}", StaleResultWarning, stacklevel=2)
                continue
            reason = _stale_reason(stored, config)
            if reason is None:
                return stored
            warnings.warn(f"recomputing {type(config).experiment_name}: the Result at {path} is stale ({reason})",
                          StaleResultWarning, stacklevel=2)
    result = run(config, device=device, progress=progress)
    save_result(result, candidates[-1] if results_dir is None else results_dir)
    return result
