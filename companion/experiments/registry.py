"""The experiment registry: named, frozen config dataclasses and the hash that keys their Results.

:func:`register` makes a frozen dataclass with a ``compute(device, progress)`` method an experiment;
:func:`make_config` builds a config from JSON-like overrides (the CLI's ``--set``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import pkgutil
import types
import typing
import warnings
from typing import Any

import numpy as np

__all__ = ["FRAMEWORK_SCHEMA", "register", "experiment_names", "get_experiment", "make_config", "config_hash"]

#: Modules of companion/experiments/ that hold no experiment (not imported by discovery).
INFRASTRUCTURE = ("registry", "store")
#: Version of the on-disk Result format (part of every Result's schema string).
FRAMEWORK_SCHEMA = 1
_REGISTRY: dict[str, type] = {}
_DISCOVERED = False
_SCALARS = (int, float, str, bool)


def register(name: str, schema: int = 1):
    """Class decorator: register a frozen config dataclass as the experiment ``name``.

    Its fields are ``int``, ``float``, ``str``, ``bool`` or tuples of them, each with a default (the
    CPU size; seeds are fields, so a config determines its Result); ``compute(device, progress)``
    returns a dict whose arrays (numpy or torch) go into ``Result.arrays``, JSON values into
    ``Result.scalars``.  Modules of ``companion/experiments/`` are discovered with :mod:`pkgutil`.

    Parameters
    ----------
    name : str
        Identifier used by the CLI and in Result paths (letters, digits, ``_`` and ``-``).
    schema : int, default 1
        Version of what ``compute`` returns; bump it when that changes.

    Returns
    -------
    callable
        The decorator; it sets the class attributes ``experiment_name`` and ``schema``.

    Raises
    ------
    TypeError, ValueError
        Not a frozen dataclass with ``compute`` and typed, defaulted fields; a malformed or taken name.

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
                raise TypeError(f"{cls.__name__}.{f.name} needs a default "
                                "(the default config is the small one)")
            _field_kind(hints[f.name], f"{cls.__name__}.{f.name}")
        other = _REGISTRY.get(name)
        where = (cls.__module__, cls.__qualname__)
        if other is not None and (other.__module__, other.__qualname__) != where:
            raise ValueError(f"experiment {name!r} is already registered by "
                             f"{other.__module__}.{other.__qualname__}")
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
    package = importlib.import_module("companion.experiments")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_") and info.name not in INFRASTRUCTURE:
            try:
                importlib.import_module(f"{package.__name__}.{info.name}")
            except Exception as exc:  # noqa: BLE001 - one broken module must not hide the others
                warnings.warn(f"experiments module {info.name!r} could not be imported "
                              f"({type(exc).__name__}: {exc}); its experiments are unavailable",
                              RuntimeWarning, stacklevel=2)


def experiment_names() -> list[str]:
    """Sorted names of all registered experiments (modules are discovered on first call).

    Returns
    -------
    list of str

    Examples
    --------
    >>> "channel_statistics" in experiment_names()
    True
    """
    _discover()
    return sorted(_REGISTRY)


def get_experiment(name: str) -> type:
    """The config class registered as ``name`` (one of :func:`experiment_names`).

    Parameters
    ----------
    name : str

    Returns
    -------
    type

    Raises
    ------
    ValueError
        If no experiment has that name (the message lists the known ones).
    """
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


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
        "tuple[T, ...] of those, or Optional of them")


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
    if tp is int and not -2 ** 63 <= out < 2 ** 63:
        raise ValueError(f"{where} must fit in 64 bits (|value| < 2**63), got {value!r}")
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
    object
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
        raise ValueError(f"{cls.experiment_name} has no option {', '.join(unknown)}; "
                         f"options: {', '.join(sorted(names))}")
    typed = {k: _coerce(v, hints[k], f"{cls.experiment_name}.{k}") for k, v in values.items()}
    return cls(**typed)


def _config_dict(config) -> dict:
    if not dataclasses.is_dataclass(config) or not getattr(type(config), "experiment_name", None):
        raise TypeError(f"expected a registered experiment config, got {type(config).__name__}")
    out = {f.name: (list(v) if isinstance(v := getattr(config, f.name), tuple) else v)
           for f in dataclasses.fields(config)}
    for k, v in out.items():  # integers beyond 64 bits would reach torch/numpy as C++ overflow errors
        if any(isinstance(x, int) and not -2 ** 63 <= x < 2 ** 63 for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{type(config).experiment_name}.{k} must fit in 64 bits (|value| < 2**63), got {v!r}")
    return out


def config_hash(config) -> str:
    """16-hex-digit SHA-256 of the experiment name and the canonical JSON of ``config``.

    Parameters
    ----------
    config : a registered experiment config instance

    Returns
    -------
    str

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
