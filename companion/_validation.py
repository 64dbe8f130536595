"""Argument checks of the public functions (package-internal): one wording of each error.

``TypeError`` for a wrong kind of argument, ``ValueError`` for a wrong value; torch is imported lazily.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

INT64_MAX = int(np.iinfo(np.int64).max)


def is_int(v) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A real number (Python or numpy, integers included), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _real_dtype(dtype) -> bool:
    """An integer or floating numpy dtype (not bool, not object)."""
    return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)


def check_int(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``; TypeError unless an integer, ValueError outside [minimum, maximum]."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_real(value, name: str, *, lo: float | None = None, lo_open: bool = False,
               hi: float | None = None, hi_open: bool = False) -> float:
    """``value`` as a finite ``float`` in [lo, hi] (open ends with ``lo_open``/``hi_open``)."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {hi}, got {v}")
    return v


def as_float64(x, name: str) -> np.ndarray:
    """Convert a numpy array, torch tensor or nested sequence to a float64 numpy array."""
    if x is None:
        raise TypeError(f"{name} must be an array or tensor, got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if getattr(x, "is_complex", lambda: False)():
            raise TypeError(f"{name} must be real-valued, got a complex tensor")
        x = x.double().numpy()
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype == object or not (_real_dtype(arr.dtype) or arr.dtype == np.bool_):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def check_finite(arr, name: str) -> None:
    """ValueError if the array or torch tensor ``arr`` holds a NaN or an infinity (says how many)."""
    ok = arr.isfinite() if hasattr(arr, "isfinite") else np.isfinite(arr)  # tensor: any dtype/device
    if not bool(ok.all()):
        size = int(np.prod(ok.shape))
        raise ValueError(f"{name} contains {size - int(ok.sum())} NaN or infinite value(s) out of {size}; "
                         "remove them, or check the run that produced them (an overflow in a deep stack "
                         "or a model?)")


def real_array(name: str, value, min_ndim: int = 0, shape: tuple | None = None) -> np.ndarray:
    """``value`` as a finite float64 array of ``>= min_ndim`` axes (of ``shape``; None matches any length)."""
    what = f"{name} must be a real number or an array of real numbers"
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what}, got a string")
    if hasattr(value, "detach"):  # torch tensor (converted by as_float64, bfloat16 included)
        if str(value.dtype) == "torch.bool":
            raise TypeError(f"{what}, got dtype bool; pass a float array")
        arr = as_float64(value, name)
    else:
        try:
            raw = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} could not be read as an array ({exc}); pass a number or a "
                             "rectangular array of numbers") from None
        if raw.dtype == bool or not _real_dtype(raw.dtype):
            raise TypeError(f"{what}, got {type(value).__name__} (dtype {raw.dtype})")
        arr = raw.astype(np.float64, copy=False)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    if shape is not None and (arr.ndim != len(shape) or any(
            s is not None and s != n for s, n in zip(shape, arr.shape))):
        dims = ", ".join("n" if s is None else str(s) for s in shape)
        want = f"({dims},)" if len(shape) == 1 else f"({dims})"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    check_finite(arr, name)
    return arr


def real_vector(name: str, value, size: int | None = None) -> np.ndarray:
    """``value`` as a non-empty 1-D finite float64 array (of length ``size`` when given)."""
    v = real_array(name, value, shape=(size,))
    if v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {v.shape}")
    return v


def float_tensor(x, name: str = "x"):
    """``x`` (floating array or tensor, >= 1 axis, finite) as a tensor, and whether it was numpy."""
    import torch
    was_numpy = isinstance(x, np.ndarray)
    if not (was_numpy or isinstance(x, torch.Tensor)):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if not (np.issubdtype(x.dtype, np.floating) if was_numpy else x.is_floating_point()):
        raise TypeError(f"{name} must hold floating-point values, got dtype {x.dtype}")
    t = torch.from_numpy(x if x.flags.c_contiguous else np.ascontiguousarray(x)) if was_numpy else x
    if t.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the channel axis is the last one)")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty; pass a tensor with at least one element")
    check_finite(t, name)
    return t, was_numpy


def check_thresholds(thresholds, name: str = "thresholds") -> np.ndarray:
    """A number or sequence of thresholds on ``|x|`` as a non-empty 1-D float64 array, all ``>= 0``."""
    t = real_array(name, thresholds)
    if t.ndim == 0:
        t = t.reshape(1)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {t.shape}")
    if (t < 0).any():
        raise ValueError(f"{name} must be >= 0 (they bound |x|), got min {t.min():.4g}")
    return t


def check_texts(texts, name: str = "texts", single: bool = False) -> list[str]:
    """A non-empty list of non-blank strings (with ``single``, one string becomes a list of one)."""
    if single and isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of strings{' or a string' if single else ''}, "
                        f"got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{name} is empty; pass at least one non-empty string")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{name}[{i}] is empty; every text must contain visible characters")
    return texts


def check_choice(value, name: str, choices) -> str:
    """``value`` if it is one of the strings ``choices``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, one of {tuple(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_indices(indices, n: int, name: str = "channels") -> np.ndarray:
    """Distinct integer indices in ``[0, n)`` (sequence, array or tensor) as a 1-D int64 array."""
    a = np.asarray(indices.detach().cpu() if hasattr(indices, "detach") else indices)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of indices, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must hold integers (indices), got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= n):
        raise ValueError(f"{name} must be distinct indices that lie in [0, {n - 1}], got values in "
                         f"[{a.min()}, {a.max()}]")
    if len(np.unique(a)) != a.size:
        raise ValueError(f"{name} must be distinct indices; it contains repeated indices")
    return a.astype(np.int64)


def check_linears(modules, model=...) -> dict:
    """A non-empty mapping name -> ``torch.nn.Linear`` as a dict (and ``model``, if given, a Module)."""
    import torch
    if model is not ... and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(modules, Mapping):
        raise TypeError(f"modules must be a mapping name -> torch.nn.Linear, got {type(modules).__name__}")
    if not modules:
        raise ValueError("modules is empty; pass at least one {name: nn.Linear}")
    for name, mod in modules.items():
        if not isinstance(mod, torch.nn.Linear):
            raise TypeError(f"modules[{name!r}] is a {type(mod).__name__}, not torch.nn.Linear")
    return dict(modules)


def check_layer(layer, n_layers: int, model: str = "the model", name: str = "layer") -> int:
    """A residual-stream index in ``[0, n_layers]`` as an ``int``."""
    if not is_int(layer):
        raise TypeError(f"{name} must be an integer in [0, {n_layers}], got {type(layer).__name__}")
    if not 0 <= int(layer) <= n_layers:
        raise ValueError(f"{name} must be in [0, {n_layers}] for {model} (h_0 = embeddings, h_l = output of "
                         f"block l-1), got {layer}")
    return int(layer)


def check_layer_list(layers, name: str = "layers") -> tuple[int, ...]:
    """Distinct, non-negative, increasing integer layer indices (the model's depth is checked later)."""
    out = tuple(layers)
    if any(not is_int(x) or x < 0 for x in out) or len(set(out)) != len(out):
        raise ValueError(f"{name} must be distinct non-negative integers, got {layers}")
    if list(out) != sorted(out):
        raise ValueError(f"{name} must be increasing, got {layers}")
    return out


def check_vector(vector, d: int, rows: int | None = None, *, dtype, device=None, scales=(),
                 name: str = "vector", where: str = "the model"):
    """``vector`` ``[d]`` (or ``[rows, d]``) as a ``dtype`` tensor on ``device``, finite times each scale."""
    import torch
    if not isinstance(vector, torch.Tensor):
        if isinstance(vector, (str, bytes)):
            raise TypeError(f"{name} must be a tensor or array of {d} real numbers, got a string")
        try:
            vector = torch.as_tensor(np.ascontiguousarray(vector))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} must be a tensor or array of {d} real numbers ({exc})") from None
    integer = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    if not (vector.is_floating_point() or vector.dtype in integer):  # bool and complex fail too
        raise TypeError(f"{name} must hold real numbers (floating point or integer), "
                        f"got dtype {vector.dtype}")
    shapes = [(d,)] if rows is None else [(d,), (rows, d)]
    if tuple(vector.shape) not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(f"{name} must have shape {want} for {where}, got {tuple(vector.shape)}")
    if not bool(torch.isfinite(vector).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    out = vector.to(device=device, dtype=dtype)
    for s in (1.0, *scales):
        if not bool(torch.isfinite(s * out).all()):
            peak, hi = float(vector.abs().max()) * abs(s), torch.finfo(dtype).max
            raise ValueError(f"{'scale * ' if s != 1.0 else ''}{name} reaches {peak:.4g}, beyond the range "
                             f"of the dtype {dtype} of {where} (max {hi:.4g}); use a smaller scale or vector")
    return out


def freeze(dist, name: str = "dist"):
    """``dist()`` for an unfrozen scipy.stats law without shapes, TypeError for one with; else ``dist``."""
    if isinstance(dist, (stats.rv_continuous, stats.rv_discrete)):
        if dist.numargs:
            public = getattr(stats, str(dist.name), None) is dist
            label = f"scipy.stats.{dist.name}" if public else "this distribution"
            example = ", ".join(f"{s.strip()}=..." for s in (dist.shapes or "").split(","))
            raise TypeError(f"{name} must be a frozen scipy.stats distribution: {label} is unfrozen and "
                            f"needs its shape parameter(s) {dist.shapes}; freeze it with its parameters, "
                            f"e.g. {label}({example})")
        return dist()
    return dist


def check_dist(dist, name: str = "dist"):
    """``dist`` as a frozen scipy.stats distribution with scalar, valid parameters (see :func:`freeze`)."""
    dist = freeze(dist, name)
    frozen = isinstance(getattr(dist, "dist", None), (stats.rv_continuous, stats.rv_discrete))
    if not frozen or not callable(getattr(dist, "support", None)):
        raise TypeError(f"{name} must be a frozen scipy.stats distribution, e.g. scipy.stats.norm(0, 1), "
                        f"scipy.stats.bernoulli(0.1) or scipy.stats.rv_discrete(values=(xk, pk))(); "
                        f"got {type(dist).__name__}")
    with np.errstate(all="ignore"):
        lower, upper = dist.support()
    if np.ndim(lower) != 0 or np.ndim(upper) != 0:
        raise ValueError(f"{name} has array-valued parameters; freeze one distribution at a time "
                         f"(e.g. scipy.stats.norm(0, 1), not scipy.stats.norm([0, 1]))")
    if np.isnan(lower) or np.isnan(upper):
        raise ValueError(f"{name} has invalid parameters (scipy reports a NaN support); check its shape, loc "
                         f"and scale arguments")
    return dist


def as_real_array(x, name: str) -> np.ndarray:
    if isinstance(x, (str, bytes)) or (np.ndim(x) == 0 and isinstance(x, (bool, np.bool_))):
        raise TypeError(f"{name} must be a real number or an array of real numbers; got {x!r}")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be array-like of real numbers ({exc})") from None
    if arr.dtype == bool or not _real_dtype(arr.dtype):
        raise TypeError(f"{name} must be a real number or an array of real numbers; got dtype {arr.dtype}")
    return arr.astype(float)


def check_t(t) -> np.ndarray:
    arr = as_real_array(t, "t")
    if np.isnan(arr).any():
        raise ValueError("t contains NaN; pass thresholds t >= 0")
    if (arr < 0).any():
        raise ValueError(f"t must be >= 0 (a distance from the mean); got min(t) = {arr.min():.4g}")
    return arr


def check_sigma2(sigma2, name: str = "sigma2") -> np.ndarray:
    arr = as_real_array(sigma2, name)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; pass a variance proxy > 0")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; an infinite proxy gives no bound")
    if (arr <= 0).any():
        raise ValueError(f"{name} must be > 0 (a variance proxy); got min({name}) = {arr.min():.4g}")
    return arr


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def is_discrete(dist) -> bool:
    return isinstance(dist.dist, stats.rv_discrete)


def integer_counts(name: str, N) -> np.ndarray:
    """``N`` as an integer array, all >= 1 (object dtype for Python ints beyond 64 bits)."""
    arr = np.asarray(N)
    if arr.dtype == object:  # Python ints beyond the 64-bit range
        flat = arr.ravel().tolist()
        if flat and all(is_int(v) for v in flat):
            if min(flat) < 1:
                raise ValueError(f"{name} must be >= 1, got min({name}) = {min(flat)}")
            return arr
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be a positive integer (number of rows) or an array of them, got "
                        f"{type(N).__name__} (dtype {arr.dtype}); write e.g. 10**6 rather than 1e6")
    if arr.size and (arr < 1).any():
        raise ValueError(f"{name} must be >= 1, got min({name}) = {int(arr.min())}")
    return arr


def row_counts(name: str, N) -> np.ndarray:
    """``N`` as a positive int64 array (a scalar or array of integers) for the simulation."""
    arr = integer_counts(name, N)
    if arr.dtype == object or (arr.dtype == np.uint64 and arr.size and int(arr.max()) > INT64_MAX):
        raise ValueError(f"{name} = {int(np.max(arr))} exceeds the int64 range ({INT64_MAX:.3g}); a "
                         "simulation cannot draw that many rows (use the exact functions, which "
                         "accept any N)")
    return arr.astype(np.int64)


def as_generator(rng) -> np.random.Generator:
    if rng is None or isinstance(rng, np.random.Generator):
        return np.random.default_rng(rng)  # a Generator is returned as it is
    if is_int(rng):
        if rng < 0:
            raise ValueError(f"an integer rng seed must be >= 0, got {rng}")
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be None, a non-negative integer seed or a numpy.random.Generator, got "
                    f"{type(rng).__name__} (for a legacy RandomState use np.random.default_rng(seed))")


def checkpoints(N) -> tuple[np.ndarray, bool]:
    """Sorted sample sizes at which counts are reported, and whether N was a scalar."""
    arr = row_counts("N", N)
    if arr.ndim > 1:
        raise ValueError("N must be an integer or a 1-D increasing sequence of integers, "
                         f"got shape {arr.shape}")
    if arr.ndim == 1:
        if arr.size == 0:
            raise ValueError("N is an empty sequence; pass at least one sample size")
        if (np.diff(arr) <= 0).any():
            raise ValueError(f"the sample sizes in N must be strictly increasing, got {arr.tolist()}")
    return np.atleast_1d(arr), arr.ndim == 0


def check_tuple(value, name: str, kind: type, allowed=None, minimum=None) -> tuple:
    """A non-empty tuple of ``kind`` (int, float or str) without repeats, in ``allowed``, ``>= minimum``."""
    if not isinstance(value, tuple) or not value:
        raise TypeError(f"{name} must be a non-empty tuple, got {value!r}")
    ok, what = {int: (is_int, "integers"), float: (is_real, "numbers"),
                str: (lambda v: isinstance(v, str), "strings")}.get(kind, (lambda v: True, ""))
    for item in value:
        if not ok(item):
            raise TypeError(f"{name} must hold {what}, got {item!r}")
        if allowed is not None and item not in allowed:
            raise ValueError(f"{name} entries must be among {allowed}, got {item!r}")
        if minimum is not None and item < minimum:
            raise ValueError(f"{name} entries must be >= {minimum}, got {item!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} must not repeat entries, got {value!r}")
    return value


def check_positive(value, name: str, integer: bool = False):
    """``value`` > 0: an integer (``integer=True``) or a finite real number (TypeError for NaN/inf)."""
    if integer:
        if not is_int(value):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    elif not is_real(value) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value
