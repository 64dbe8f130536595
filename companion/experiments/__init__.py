"""Experiments: a frozen config dataclass -> ``run(config, device)`` -> a :class:`Result`, cached.

One code path serves every size: a chapter runs a small config on a CPU, the CLI
(``python -m companion run NAME --set key=value``) runs a large one on a GPU, and both produce
the same kind of :class:`Result` -- arrays, the config, package versions, the device and the
wall time -- saved as ``<results>/<experiment>/<config hash>.json`` + ``.npz``.
:func:`run_cached` returns a stored Result only if its config hash and schema match; otherwise
it recomputes (and says so), never silently reusing a stale file.

Where Results live
------------------
:func:`stored_root`: ``companion/data/results/``
    Stored Results that chapters read (committed GPU runs, trained weights), installed with the
    package as package data and found with :mod:`importlib.resources`.  Searched first.
:func:`cache_root`: ``results/cache/`` (in a clone) or ``~/.cache/companion/results/cache/``
    Everything computed locally (git-ignored).  New Results go here by default; never into
    site-packages.
Set ``$COMPANION_RESULTS`` to use another root folder: ``$COMPANION_RESULTS/stored`` and
``$COMPANION_RESULTS/cache`` then replace both.

Integrity
---------
The JSON names the SHA-256 of the bytes of its ``.npz`` (``npz_sha256``) and, per array, a
SHA-256 of its dtype, shape and values (``arrays.<key>.sha256``); :func:`load_result` checks
both, and the declared shape and dtype, and raises :class:`CorruptResultError` for a truncated,
empty, edited or mismatched file, or for a JSON that is not a Result.  :func:`run_cached` turns
that into a recompute with a :class:`CorruptResultWarning`; ``python -m companion show`` into an
error message.  A JSON without checksums (written before they existed) is still read, with the
shape and dtype checks only; :func:`add_checksums` adds them without touching the arrays.
:func:`save_result` writes both files under unique temporary names in the target folder and
publishes them (``.npz`` first, JSON last) under a per-Result lock file (``<hash>.lock``, removed
when done), so that concurrent writers of one config, processes or threads, leave the complete
pair of the last of them.  Readers create no lock: a pair replaced while it was being read
fails its checksum, and :func:`load_result` waits for the writer and reads it again.

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

import contextlib
import dataclasses
import hashlib
import importlib
import io
import json
import logging
import os
import pkgutil
import platform
import tempfile
import threading
import time
import types
import typing
import uuid
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from companion._paths import package_data, source_checkout

try:  # POSIX advisory locks; elsewhere only threads of one process are serialised
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = [
    "FRAMEWORK_SCHEMA",
    "Result",
    "check_result",
    "register",
    "experiment_names",
    "get_experiment",
    "make_config",
    "config_hash",
    "run",
    "progress_bar",
    "run_cached",
    "save_result",
    "load_result",
    "result_path",
    "results_root",
    "stored_root",
    "stored_results",
    "stored_target",
    "cache_root",
    "add_checksums",
    "check_writable",
    "stale_reason",
    "StaleResultWarning",
    "CorruptResultWarning",
    "CorruptResultError",
]

logger = logging.getLogger(__name__)

#: Version of the on-disk Result format (part of every Result's schema string).
FRAMEWORK_SCHEMA = 1

_REGISTRY: dict[str, type] = {}
_DISCOVERED = False


class StaleResultWarning(UserWarning):
    """A stored Result did not match its config hash or schema and was recomputed."""


class CorruptResultWarning(StaleResultWarning):
    """A stored Result's files were damaged (unreadable, truncated, edited) and it was recomputed.

    A subclass of :class:`StaleResultWarning`, so that a filter on that also covers this.
    """


class CorruptResultError(ValueError):
    """The files at a Result path do not form a valid Result (see :func:`load_result`).

    A subclass of ``ValueError``; the message names the file, what is wrong with it, and what
    to do (delete both files, or recompute with ``force=True`` / ``--force``).

    Attributes
    ----------
    path : pathlib.Path
        The Result's JSON file.
    reason : str
        What is wrong, e.g. ``"its JSON holds a list, not a Result object"``.
    """

    def __init__(self, path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(
            f"cannot use the Result at {self.path}: {reason}; delete {self.path.name} and "
            f"{self.path.with_suffix('.npz').name} in {self.path.parent}, or recompute it "
            "(run_cached(..., force=True), or --force on the command line)"
        )

    def __reduce__(self):  # picklable across processes, like other exceptions
        return (type(self), (self.path, self.reason))


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


def check_result(result, experiment: str, arrays=(), scalars=()) -> Result:
    """``result`` if it is a :class:`Result` of ``experiment`` that holds the named arrays and
    scalars; TypeError for anything else, ValueError (saying what to do) if one is missing."""
    if not isinstance(result, Result) or result.name != experiment:
        raise TypeError(f"result must be a Result of the {experiment} experiment, got "
                        f"{getattr(result, 'name', type(result).__name__)!r}")
    missing = [k for k in arrays if k not in result.arrays]
    missing += [k for k in scalars if k not in result.scalars]
    if missing:
        raise ValueError(f"the Result lacks {missing}; recompute it with the current code")
    return result


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
    logger.info("computing %s %s on %s", cls.experiment_name, config_hash(config), dev)
    t0 = time.perf_counter()
    outputs = config.compute(dev, bool(progress))
    wall = time.perf_counter() - t0
    logger.info("computed %s %s in %.1f s", cls.experiment_name, config_hash(config), wall)
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


def progress_bar(total: int, progress: bool, desc: str):
    """The tqdm bar of a ``compute`` (``total`` steps, label ``desc``), or ``None`` without
    ``progress``; callers update it with ``bar.update()`` when there is one."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def results_root() -> Path:
    """Root folder of the Results computed here (its ``cache/`` subfolder is :func:`cache_root`).

    Returns
    -------
    pathlib.Path
        ``$COMPANION_RESULTS`` if set; else ``<repository>/results`` when the package runs from a
        clone; else ``~/.cache/companion/results`` (an installed package never writes into
        site-packages).  The stored Results are not below it unless ``$COMPANION_RESULTS`` is
        set: use :func:`stored_root`.
    """
    env = os.environ.get("COMPANION_RESULTS")
    if env:
        return Path(env).expanduser()
    repo = source_checkout()
    if repo is not None:
        return repo / "results"
    return Path.home() / ".cache" / "companion" / "results"


def cache_root() -> Path:
    """Folder of the Results computed locally, where new Results go by default.

    Returns
    -------
    pathlib.Path
        ``<results root>/cache`` (:func:`results_root`): ``results/cache`` in a clone (ignored
        by git), ``~/.cache/companion/results/cache`` for an installed package, or
        ``$COMPANION_RESULTS/cache``.
    """
    return results_root() / "cache"


def stored_root() -> Path:
    """Folder of the stored Results that chapters read; :func:`run_cached` looks here first.

    Returns
    -------
    pathlib.Path
        ``$COMPANION_RESULTS/stored`` if ``$COMPANION_RESULTS`` is set, else the package data
        folder ``companion/data/results`` (installed with the package; in a clone, the folder
        to which GPU runs are written with ``--out companion/data/results`` and committed).
    """
    if os.environ.get("COMPANION_RESULTS"):
        return results_root() / "stored"
    return package_data("results")


def stored_target() -> Path:
    """Where helpers that produce Results to keep write by default.

    :func:`stored_root` when it is meant to be written (a clone, or ``$COMPANION_RESULTS``),
    else :func:`cache_root`: an installed package never writes into site-packages.
    """
    if os.environ.get("COMPANION_RESULTS") or source_checkout() is not None:
        return stored_root()
    return cache_root()


def stored_results(name: str, root: str | Path | None = None) -> list[Result]:
    """Every valid stored Result of experiment ``name`` (any config), newest first.

    Parameters
    ----------
    name : str
        A registered experiment name (:func:`experiment_names`).
    root : path, optional
        Folder holding ``<name>/<hash>.json`` files (default :func:`stored_root`,
        ``companion/data/results``).

    Returns
    -------
    list of Result
        Results of ``name`` whose schema matches the current code; others are skipped (they
        would be recomputed by :func:`run_cached`, never shown).

    Raises
    ------
    ValueError
        If ``name`` is not registered.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     stored_results("channel_statistics", root=tmp)
    []
    """
    cls = get_experiment(name)
    base = Path(root) if root is not None else stored_root()
    found = []
    for path in sorted((base / name).glob("*.json")):
        try:
            result = load_result(path)
        except ValueError:
            continue
        if result.name == name and result.schema == _schema(cls):
            found.append(result)
    return sorted(found, key=lambda r: r.created, reverse=True)


def result_path(config, results_dir: str | Path | None = None) -> Path:
    """Path of the JSON file of ``config``'s Result: ``<dir>/<name>/<hash>.json``.

    ``results_dir`` defaults to :func:`cache_root`.
    """
    base = Path(results_dir) if results_dir is not None else cache_root()
    return base / type(config).experiment_name / f"{config_hash(config)}.json"


# --------------------------------------------------------------------------- storage
#: Fields every Result JSON holds, with their JSON types.
_META_TYPES: dict[str, tuple] = {
    "name": (str,), "config": (dict,), "scalars": (dict,), "versions": (dict,), "device": (str,),
    "wall_time": (int, float), "schema": (str,), "config_hash": (str,),
}
_THREAD_LOCK = threading.Lock()  # serialises writers only where fcntl is missing


def _array_digest(array: np.ndarray) -> str:
    """SHA-256 (hex) of an array's dtype (with byte order), shape and values in C order."""
    h = hashlib.sha256(f"{array.dtype.str}|{list(array.shape)}|".encode())
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _write_npz(fh, arrays: dict) -> None:
    """Write ``arrays`` to ``fh`` as an ``.npz`` (deflated ``.npy`` members, no pickles).

    Unlike :func:`numpy.savez_compressed` the bytes depend only on the arrays (fixed member
    timestamps), and any identifier is a valid key (``file`` included).
    """
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def _temp_write(folder: Path, stem: str, suffix: str, write) -> Path:
    """Write a new file with a unique name in ``folder`` via ``write(fh)``, flushed to disk.

    The name is unique across processes and threads (a UUID); the permissions follow the umask
    like any new file (``tempfile.mkstemp`` would make them private).
    """
    tmp = folder / f".{stem}.{uuid.uuid4().hex}{suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _json_bytes(meta: dict) -> bytes:
    return (json.dumps(meta, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def _acquire(lock: Path) -> int | None:
    """File descriptor holding an exclusive flock on ``lock`` (created), or None without flock."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: go on unlocked
            os.close(fd)
            lock.unlink(missing_ok=True)
            return None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the writer that held it deleted it meanwhile: lock the current file


@contextlib.contextmanager
def _pair_lock(json_path: Path):
    """Hold the write lock of one Result (``<hash>.lock`` beside it) while its pair is published.

    Writers create the lock file, publish, and delete it before unlocking, so that none is left
    behind; whoever locks a file checks that it is still the one at the path (a deleted lock is
    never trusted).  Readers take no lock: when a read fails its checks, :func:`load_result`
    waits for a writer that holds the lock, or sees that the files changed, and reads again.
    """
    if fcntl is None:  # pragma: no cover - Windows
        with _THREAD_LOCK:
            yield
        return
    lock = json_path.with_suffix(".lock")
    fd = _acquire(lock)
    try:
        yield
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)
            os.close(fd)


def check_writable(folder: Path) -> None:
    """Raise ValueError (before any work is done) if Results cannot be written into ``folder``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(
            f"cannot write Results into {folder} ({exc}); choose a writable folder: --out DIR "
            "on the command line, results_dir= in Python, or $COMPANION_RESULTS for the default "
            "folders"
        ) from None


def save_result(result: Result, results_dir: str | Path | None = None) -> Path:
    """Write ``result`` as JSON (metadata, config, scalars, checksums) + ``.npz`` (arrays).

    Both files are written under unique temporary names in the target folder, then published
    with :func:`os.replace`, the ``.npz`` first and the JSON last (which names the SHA-256 of its
    ``.npz``), while holding the Result's lock (``fcntl.flock``; where that is missing, only
    threads of one process are serialised).  Of concurrent writers of one config (processes or
    threads) the last leaves a complete pair; a reader that meets a half-published pair sees a
    checksum mismatch and :func:`load_result` reads again.

    Parameters
    ----------
    result : Result
    results_dir : path or None
        Root folder; the files go to ``<results_dir>/<name>/<config hash>.json`` and ``.npz``.
        ``None``: :func:`cache_root` (``results/cache`` in a clone).

    Returns
    -------
    pathlib.Path
        The JSON path (also set as ``result.path``).

    Raises
    ------
    TypeError
        If ``result`` is not a Result, or an array is not storable (object dtype).
    ValueError
        If an array name is not an identifier.
    OSError
        If the folder cannot be written (:func:`run_cached` checks this before computing).
    """
    if not isinstance(result, Result):
        raise TypeError(f"expected a Result, got {type(result).__name__}")
    arrays = {}
    for key, value in result.arrays.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"array names must be identifiers, got {key!r}")
        arrays[key] = np.asarray(value)
        if arrays[key].dtype.hasobject:
            raise TypeError(f"array {key!r} has dtype object, which cannot be stored without "
                            "pickles")
    base = Path(results_dir) if results_dir is not None else cache_root()
    path = base / result.name / f"{result.config_hash}.json"
    npz_path = path.with_suffix(".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(result, k) for k in ("name", "config", "scalars", "versions", "device", "wall_time",
                                            "schema", "config_hash", "created")}
    meta["arrays"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "sha256": _array_digest(v)}
                      for k, v in arrays.items()}
    temps = []
    try:
        temps.append(_temp_write(path.parent, path.stem, ".npz.tmp",
                                 lambda fh: _write_npz(fh, arrays)))
        meta["npz_sha256"] = _file_digest(temps[0])
        text = _json_bytes(meta)
        temps.append(_temp_write(path.parent, path.stem, ".json.tmp", lambda fh: fh.write(text)))
        with _pair_lock(path):
            os.replace(temps[0], npz_path)
            os.replace(temps[1], path)
        temps = []
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    result.path = path
    return path


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _read_pair(path: Path) -> tuple[Result, dict]:
    """Read and verify one Result pair (no lock); return it and its JSON metadata."""
    npz_path = path.with_suffix(".npz")
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the Result at {path}: {exc}") from exc

    def corrupt(reason: str) -> CorruptResultError:
        return CorruptResultError(path, reason)

    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise corrupt(f"its JSON is malformed ({exc})") from None
    if not isinstance(meta, dict):
        raise corrupt(f"its JSON holds a {_kind(meta)}, not a Result object")
    missing = sorted(set(_META_TYPES) - set(meta))
    if missing:
        raise corrupt(f"it is not a Result file (missing {missing})")
    optional = {"created": "", "arrays": {}, "npz_sha256": ""}  # absent: fine; present: typed
    for key, types_ in {**_META_TYPES, "created": (str,), "arrays": (dict,),
                        "npz_sha256": (str,)}.items():
        value = meta.get(key, optional.get(key))
        if isinstance(value, bool) or not isinstance(value, types_):
            want = " or ".join(t.__name__ for t in types_)
            raise corrupt(f"its field {key!r} is a {_kind(value)}, not a {want}")
    if not np.isfinite(meta["wall_time"]):
        raise corrupt(f"its wall_time is {meta['wall_time']!r}")
    declared = meta.get("arrays", {})
    for key, spec in declared.items():
        ok = (isinstance(spec, dict) and isinstance(spec.get("dtype"), str)
              and isinstance(spec.get("shape"), list)
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                      for n in spec["shape"])
              and isinstance(spec.get("sha256", ""), str))
        if not ok:
            raise corrupt(f"its description of array {key!r} is malformed ({spec!r:.80})")

    try:
        blob = npz_path.read_bytes()
    except OSError as exc:
        raise corrupt(f"its arrays file {npz_path.name} cannot be read "
                      f"({exc.strerror or exc})") from None
    want_sha = meta.get("npz_sha256")
    sha_ok = want_sha is None or hashlib.sha256(blob).hexdigest() == want_sha
    try:
        data = np.load(io.BytesIO(blob), allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not an .npz archive")
        with data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # noqa: BLE001 - zipfile, zlib, EOFError, ValueError: all "damaged"
        note = "" if sha_ok else "; it does not match the SHA-256 in the JSON"
        raise corrupt(f"{npz_path.name} ({len(blob)} bytes) is not a readable .npz "
                      f"({type(exc).__name__}: {exc}){note}") from None
    if set(declared) != set(arrays):
        raise corrupt(f"the .npz holds {sorted(arrays)} but the JSON declares {sorted(declared)}")
    for key, spec in declared.items():
        a = arrays[key]
        if list(a.shape) != spec["shape"] or str(a.dtype) != spec["dtype"]:
            raise corrupt(f"array {key!r} is {a.dtype} {list(a.shape)} but the JSON declares "
                          f"{spec['dtype']} {spec['shape']}")
        if "sha256" in spec and _array_digest(a) != spec["sha256"]:
            raise corrupt(f"the values of array {key!r} do not match their SHA-256 in the JSON")
    if not sha_ok:
        raise corrupt(f"{npz_path.name} does not match the SHA-256 in the JSON (another run's "
                      "file, or edited)")
    result = Result(name=meta["name"], config=meta["config"], arrays=arrays,
                    scalars=meta["scalars"], versions=meta["versions"], device=meta["device"],
                    wall_time=meta["wall_time"], schema=meta["schema"],
                    config_hash=meta["config_hash"], created=meta.get("created", ""), path=path)
    return result, meta


def load_result(path: str | Path) -> Result:
    """Read and verify a Result written by :func:`save_result` (no pickles are loaded).

    Checks that the JSON is a Result (fields present, with their types), that the ``.npz``
    holds exactly the declared arrays with the declared shapes and dtypes, and -- when the JSON
    records them (every Result saved since they were introduced) -- the SHA-256 of the ``.npz``
    bytes and of each array.  A JSON without checksums is read with the other checks only
    (see :func:`add_checksums`).  If a check fails while a writer is replacing the pair (its
    lock file exists, or the files changed during the read), the pair is read again; readers
    never create files, so read-only folders work.

    Parameters
    ----------
    path : str or Path
        The Result's ``.json`` file; the ``.npz`` is beside it.

    Returns
    -------
    Result

    Raises
    ------
    CorruptResultError
        (a ``ValueError``) If the files exist but do not form a valid Result: malformed or
        non-object JSON, a missing or wrong-typed field, a missing, empty, truncated or edited
        ``.npz``, or arrays that differ from their description or checksum.
    ValueError
        If the JSON file cannot be read at all (missing, a folder).

    Examples
    --------
    >>> import tempfile
    >>> r = Result(name="example", config={}, arrays={"x": np.arange(3)}, scalars={}, versions={},
    ...            device="cpu", wall_time=0.0, schema="1.1", config_hash="0" * 16)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     load_result(save_result(r, tmp)).arrays["x"].tolist()
    [0, 1, 2]
    """
    path = Path(path)
    for attempt in range(_READ_ATTEMPTS):
        before = _pair_signature(path)
        try:
            return _read_pair(path)[0]
        except CorruptResultError:
            # a writer publishing the pair while it was read is a race, not damage: read again
            raced = _wait_for_writer(path) or _pair_signature(path) != before
            if not raced or attempt == _READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


#: How often :func:`load_result` re-reads a pair that writers keep replacing during the read.
_READ_ATTEMPTS = 50


def _wait_for_writer(path: Path) -> bool:
    """Wait until no writer holds the Result's lock; return whether one was there.

    Only opens an existing lock file (read-only) and never creates one.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # blocks while a writer publishes
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


def _pair_signature(path: Path) -> tuple:
    """Identity of both files (inode, size, mtime): any writer's os.replace changes it."""
    out = []
    for item in (path, path.with_suffix(".npz")):
        try:
            st = os.stat(item)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def add_checksums(path: str | Path) -> bool:
    """One-off migration: record the checksums in a Result JSON written before they existed.

    Adds ``npz_sha256`` and the per-array ``sha256`` to the JSON (rewritten atomically, in the
    format of :func:`save_result`); the ``.npz``, the config, its hash and every other field are
    unchanged.  The arrays are first checked against the declared names, shapes and dtypes.

    Parameters
    ----------
    path : str or Path
        The Result's ``.json`` file.

    Returns
    -------
    bool
        True if the JSON was changed, False if it already held (valid) checksums.

    Raises
    ------
    CorruptResultError, ValueError
        As :func:`load_result`: a damaged Result is not blessed with checksums.

    Examples
    --------
    Run once over the committed Results::

        for p in sorted(stored_root().glob("*/*.json")):
            add_checksums(p)
    """
    path = Path(path)
    with _pair_lock(path):
        result, meta = _read_pair(path)
        if "npz_sha256" in meta and all("sha256" in spec for spec in meta["arrays"].values()):
            return False
        meta["npz_sha256"] = _file_digest(path.with_suffix(".npz"))
        for key, spec in meta["arrays"].items():
            spec["sha256"] = _array_digest(result.arrays[key])
        text = _json_bytes(meta)
        tmp = _temp_write(path.parent, path.stem, ".json.tmp", lambda fh: fh.write(text))
        try:
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return True


def stale_reason(result: Result, config) -> str | None:
    """Why a stored ``result`` cannot stand for ``config`` (None if it can).

    Parameters
    ----------
    result : Result
        A loaded Result.
    config
        A registered experiment config.

    Returns
    -------
    str or None
        A short reason (another experiment, another schema, another config hash), or None.
    """
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
        Look only here and save here.  ``None``: look in :func:`stored_root` then
        :func:`cache_root`; save into :func:`cache_root`.
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
    ValueError
        If the Result has to be computed but the folder it would be saved to cannot be written
        (checked before computing).

    Warns
    -----
    StaleResultWarning
        When a stored Result exists but its hash or schema does not match; it is recomputed
        and overwritten (in the folder it is saved to).
    CorruptResultWarning
        (a StaleResultWarning) When a stored Result's files are damaged
        (:class:`CorruptResultError`); it is recomputed likewise.

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
        candidates = [stored_root(), cache_root()]
    if not force:
        for base in candidates:
            path = result_path(config, base)
            if not path.exists():
                continue
            try:
                stored = load_result(path)
            except CorruptResultError as exc:
                name = type(config).experiment_name
                warnings.warn(f"recomputing {name}: the Result at {path} is damaged ({exc.reason})",
                              CorruptResultWarning, stacklevel=2)
                continue
            except ValueError as exc:
                warnings.warn(f"recomputing {type(config).experiment_name}: {exc}", StaleResultWarning, stacklevel=2)
                continue
            reason = stale_reason(stored, config)
            if reason is None:
                logger.info("using the stored Result %s", path)
                return stored
            warnings.warn(f"recomputing {type(config).experiment_name}: the Result at {path} is stale ({reason})",
                          StaleResultWarning, stacklevel=2)
    target = candidates[-1]
    check_writable(target / type(config).experiment_name)  # fail now, not after the computation
    result = run(config, device=device, progress=progress)
    save_result(result, target)
    logger.info("saved %s", result.path)
    return result
