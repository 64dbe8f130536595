"""Experiments: a frozen config dataclass -> ``run(config, device)`` -> a :class:`Result`, cached.

A chapter runs a config's defaults (the CPU size), the CLI (``python -m companion run NAME --device
cuda --set key=value``) an experiment's ``GPU_*`` config; both give a :class:`Result` saved under its
config hash (:mod:`companion.experiments.store`).  :func:`run_cached` reuses a stored Result only if
its config hash and schema match.  GPU Results are copied into ``companion/data/results/NAME/``.
To add an experiment, put a module with a config decorated by :func:`register` in this folder.
"""

from __future__ import annotations

import importlib
import json
import logging
import platform
import time
import warnings
from pathlib import Path

import numpy as np

from companion._aliases import renamed_getattr as _renamed_getattr
from companion.experiments.registry import (
    FRAMEWORK_SCHEMA, _config_dict, _schema, config_hash, experiment_names, get_experiment, make_config,
    register)
from companion.experiments.store import (
    CorruptResultError, CorruptResultWarning, Result, StaleResultWarning, cache_root, check_writable,
    load_result, result_path, save_result, stored_results, stored_root)

__all__ = [
    "FRAMEWORK_SCHEMA", "Result", "check_result", "register", "experiment_names", "get_experiment",
    "make_config", "config_hash", "run", "progress_bar", "run_cached", "save_result", "load_result",
    "result_path", "stored_root", "stored_results", "cache_root", "check_writable", "stale_reason",
    "StaleResultWarning", "CorruptResultWarning", "CorruptResultError"]
__getattr__ = _renamed_getattr(__name__)  # 0.1 names made private (companion._aliases)

logger = logging.getLogger(__name__)


def check_result(result, experiment: str, arrays=(), scalars=()) -> Result:
    """``result``, checked to be a :class:`Result` of ``experiment`` holding the named arrays and scalars.

    Parameters
    ----------
    result : object
    experiment : str
    arrays, scalars : sequence of str
        Keys ``result.arrays`` and ``result.scalars`` must hold.

    Returns
    -------
    Result
        ``result`` itself.

    Raises
    ------
    TypeError, ValueError
        Not a Result of ``experiment`` (TypeError); a key missing (ValueError, saying what to do).
    """
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
        raise TypeError(f"{name}.compute must return a dict of arrays and scalars, "
                        f"got {type(outputs).__name__}")
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
    TypeError, ValueError
        Not a registered config, or ``compute`` returns something unstorable; an unavailable device.
    """
    from companion.transformers.models import select_device

    cls = type(config)
    values = _config_dict(config)  # also the type check
    name, key = cls.experiment_name, config_hash(config)
    dev = select_device(device)
    logger.info("computing %s %s on %s", name, key, dev)
    t0 = time.perf_counter()
    outputs = config.compute(dev, bool(progress))
    wall = time.perf_counter() - t0
    logger.info("computed %s %s in %.1f s", name, key, wall)
    arrays, scalars = _split_outputs(outputs, name)
    return Result(name=name, config=values, arrays=arrays, scalars=scalars, versions=_versions(),
                  device=_device_string(dev), wall_time=wall, schema=_schema(cls), config_hash=key,
                  created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def progress_bar(total: int, progress: bool, desc: str):
    """The tqdm bar of a ``compute`` (``total`` steps, label ``desc``), or ``None`` without ``progress``.

    Parameters
    ----------
    total : int
    progress : bool
    desc : str

    Returns
    -------
    tqdm.tqdm or None
    """
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def stale_reason(result: Result, config) -> str | None:
    """Why a stored ``result`` cannot stand for ``config`` (None if it can).

    Parameters
    ----------
    result : Result
    config : a registered experiment config instance

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
        Used only when the experiment has to run; checked (available here) in any case.
    results_dir : path or None
        Look and save only here; ``None``: look in :func:`stored_root` then :func:`cache_root`,
        save into :func:`cache_root`.
    force : bool, default False
        Recompute even if a valid Result exists.
    progress : bool, default False
        As :func:`run`.

    Returns
    -------
    Result
        ``result.path`` says where it is stored.  The key is the config hash, not the device: a
        GPU Result serves a CPU chapter.

    Raises
    ------
    TypeError, ValueError
        Not a registered config; an unavailable ``device``; a save folder that cannot be written
        (both checked before computing or reading).

    Warns
    -----
    StaleResultWarning
        A stored Result whose hash or schema does not match, or (:class:`CorruptResultWarning`)
        whose files are damaged, is recomputed and overwritten.

    Examples
    --------
    >>> r = run_cached(make_config("channel_statistics", n_texts=8))   # doctest: +SKIP
    """
    _config_dict(config)
    if device is not None:  # an unavailable device is refused even when a stored Result would serve
        from companion.transformers.models import select_device
        select_device(device)
    name = type(config).experiment_name
    candidates = [Path(results_dir)] if results_dir is not None else [stored_root(), cache_root()]
    for base in ([] if force else candidates):
        path = result_path(config, base)
        if not path.exists():
            continue
        try:
            stored = load_result(path)
        except CorruptResultError as exc:
            warnings.warn(f"recomputing {name}: the Result at {path} is damaged ({exc.reason})",
                          CorruptResultWarning, stacklevel=2)
            continue
        except ValueError as exc:
            warnings.warn(f"recomputing {name}: {exc}", StaleResultWarning, stacklevel=2)
            continue
        reason = stale_reason(stored, config)
        if reason is None:
            logger.info("using the stored Result %s", path)
            return stored
        warnings.warn(f"recomputing {name}: the Result at {path} is stale ({reason})", StaleResultWarning,
                      stacklevel=2)
    target = candidates[-1]
    check_writable(target / name)  # fail now, not after the computation
    result = run(config, device=device, progress=progress)
    save_result(result, target)
    logger.info("saved %s", result.path)
    return result
