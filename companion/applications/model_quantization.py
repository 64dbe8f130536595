"""Fake quantisation of a model's linear layers while it runs, and Nagel et al.'s bias corrections.

The quantisers are :mod:`companion.applications.quantization`.  Derivations: the chapter
:doc:`/book/applications`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import (
    check_choice, check_int, check_linears, float_tensor, real_array)
from companion.applications.pruning import _check_names, _run_batches
from companion.applications.quantization import (
    GRANULARITIES, _channel_vector, _check_cast, _fake_quantize, _keep_mask, _per_group, _quantize_range,
    _range_tensor, qmax, quantize_weight)
from companion.transformers.hooks import hooks

__all__ = ["quantize_linear_inputs", "LinearQuantization", "quantized_linears", "weight_bias_correction",
           "activation_bias_correction", "mean_quantization_error", "equalization_scales",
           "equalized_linears"]


@contextlib.contextmanager
def quantize_linear_inputs(
    model: torch.nn.Module,
    bits: int,
    granularity: str = "tensor",
    *,
    modules: Mapping[str, torch.nn.Module] | None = None,
    centers: Mapping[str, torch.Tensor] | None = None,
    keep_channels: Mapping[str, object] | None = None,
) -> Iterator[dict[str, torch.utils.hooks.RemovableHandle]]:
    """Context manager: fake-quantise the input of every chosen ``nn.Linear`` on its batch's range (dynamic).

    Parameters
    ----------
    model : torch.nn.Module
        The model; its linear layers are hooked if ``modules`` is None.
    bits, granularity
        As in :func:`~companion.applications.quantization.fake_quantize`.
    modules : mapping name -> nn.Linear, optional
        The layers to hook (default: every ``nn.Linear`` except one named ``lm_head``).
    centers : mapping name -> tensor of shape (in,), optional
        The ``center`` of each layer (usually the calibration means); others are not centred.
    keep_channels : mapping name -> sequence of int, optional
        Mixed precision per layer: channels kept in floating point.

    Yields
    ------
    dict
        The hook handles by layer name (removed on exit, also on error).

    Raises
    ------
    TypeError, ValueError
        For a bad argument, a mapping naming a layer not hooked, or a center beyond the dtype.

    Examples
    --------
    >>> lin = torch.nn.Linear(3, 2)
    >>> with quantize_linear_inputs(lin, 8, modules={"lin": lin}):
    ...     y = lin(torch.randn(4, 3))  # y = lin(fake_quantize(x, 8))
    """
    q = qmax(bits)
    check_choice(granularity, "granularity", GRANULARITIES)
    if modules is None and isinstance(model, torch.nn.Module):
        modules = {n: m for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n.split(".")[-1] != "lm_head"}
        if not modules:
            raise ValueError("no linear layers to hook; pass modules={name: nn.Linear}")
    modules = check_linears(modules, model)
    centers, keep_channels = dict(centers or {}), dict(keep_channels or {})
    _check_names(centers, modules, "centers", "that are not hooked")
    _check_names(keep_channels, modules, "keep_channels", "that are not hooked")
    prepared_c = {name: _channel_vector(c, modules[name].in_features, modules[name].weight,
                                        f"centers[{name!r}]") for name, c in centers.items()}
    prepared_k = {name: _keep_mask(k, modules[name].in_features, modules[name].weight.device)
                  for name, k in keep_channels.items()}

    def make_hook(name):
        c, k = prepared_c.get(name), prepared_k.get(name)

        def hook(_module, args):
            x, _ = float_tensor(args[0], f"the input of {name!r}")
            cx = None
            if c is not None:
                cx = c.to(x.dtype)
                _check_cast(cx, c, f"centers[{name!r}] (cast to the input's dtype)")
            return (_fake_quantize(x, q, granularity, cx, k),) + tuple(args[1:])
        return hook

    with hooks(pre=[(mod, make_hook(name)) for name, mod in modules.items()]) as handles:
        yield dict(zip(modules, handles))


@dataclass(frozen=True)
class LinearQuantization:
    """How the linear layers are fake-quantised by :func:`quantized_linears`.

    Raises
    ------
    TypeError, ValueError
        For a bad bit width or granularity, or ``static`` with per-token ranges.

    Examples
    --------
    >>> LinearQuantization(act_bits=8, static=True).describe()
    'A8 per-tensor static symmetric'
    """

    act_bits: int | None = 8  #: bit width of the inputs (``None``: inputs stay in floating point)
    #: which entries share a range: ``"tensor"``, ``"token"`` or ``"channel"`` (batch's range unless static)
    act_granularity: str = "tensor"
    act_symmetric: bool = True  #: symmetric grid, or asymmetric with a zero-point
    static: bool = False  #: use the calibrated ranges of :func:`quantized_linears`, clipping beyond them
    weight_bits: int | None = None  #: bit width of the weights, one range per output row (``None``: float)
    weight_symmetric: bool = True  #: symmetric or asymmetric weight grid
    weight_granularity: str = "channel"  #: one weight range per output row (``"channel"``) or ``"tensor"``

    def __post_init__(self):
        if self.act_bits is not None:
            check_int(self.act_bits, "act_bits", 2, 16)
        if self.weight_bits is not None:
            check_int(self.weight_bits, "weight_bits", 2, 16)
        check_choice(self.act_granularity, "granularity", GRANULARITIES)
        check_choice(self.weight_granularity, "weight_granularity", ("channel", "tensor"))
        for f in ("act_symmetric", "static", "weight_symmetric"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f} must be True or False")
        if self.static and self.act_granularity == "token":
            raise ValueError("static ranges are per tensor or per channel; per-token ranges are dynamic")

    def describe(self) -> str:
        """Short name, e.g. ``'W4 per-channel | A8 per-token dynamic asymmetric'`` or ``'float'``."""
        parts = []
        if self.weight_bits is not None:
            parts.append(f"W{self.weight_bits} per-{self.weight_granularity}"
                         f"{'' if self.weight_symmetric else ' asymmetric'}")
        if self.act_bits is not None:
            parts.append(f"A{self.act_bits} per-{self.act_granularity} "
                         f"{'static' if self.static else 'dynamic'} "
                         f"{'symmetric' if self.act_symmetric else 'asymmetric'}")
        return " | ".join(parts) if parts else "float"


def _act_quantizer(spec: LinearQuantization, rng, center=None):
    """The input quantiser of ``spec``, on the static range ``rng`` or the batch's range, around ``center``."""
    def quantize(x):
        y = x if center is None else x - center.to(x.dtype)
        if spec.static:
            lo, hi = rng[0].to(x.dtype), rng[1].to(x.dtype)
        else:
            g = spec.act_granularity
            lo, hi = _per_group(y, g, torch.amin), _per_group(y, g, torch.amax)
        out = _quantize_range(y, spec.act_bits, lo, hi, spec.act_symmetric)
        return out if center is None else out + center.to(x.dtype)
    return quantize


def _rotation(r, d: int, like: torch.Tensor, name: str) -> torch.Tensor:
    """``r`` checked to be an orthogonal ``(d, d)`` matrix, on the device and dtype of ``like``."""
    t, _ = float_tensor(r, name)
    if t.shape != (d, d):
        raise ValueError(f"{name} must have shape ({d}, {d}), got {tuple(t.shape)}")
    t64 = t.detach().to(torch.float64)
    gap = (t64 @ t64.T - torch.eye(d, dtype=torch.float64)).abs().max()
    if not bool(torch.isfinite(t64).all()) or float(gap) > 1e-6:
        raise ValueError(f"{name} must be orthogonal (R R^T = I within 1e-6)")
    return t.to(device=like.device, dtype=like.dtype)


def _prepared(modules, spec, ranges, smooth, rotate=None, center=None):
    """Per layer, the validated SmoothQuant scales, rotation and input quantiser (None where unused)."""
    ranges, smooth = dict(ranges or {}), dict(smooth or {})
    rotate, center = dict(rotate or {}), dict(center or {})
    _check_names(ranges, modules, "ranges")
    _check_names(smooth, modules, "smooth")
    _check_names(rotate, modules, "rotate")
    _check_names(center, modules, "center")
    static = spec.static and spec.act_bits is not None
    missing = sorted(set(modules) - set(ranges)) if static else []
    if missing:
        raise ValueError(f"a static spec needs calibrated ranges for every module; missing {missing[:3]}")
    out = {}
    for name, mod in modules.items():
        w, s, rng = mod.weight, None, None
        if name in smooth:
            s = _channel_vector(smooth[name], mod.in_features, w, f"smooth[{name!r}]")
            if not bool((s > 0).all()):
                raise ValueError(f"smooth[{name!r}] must be positive")
        r = _rotation(rotate[name], mod.in_features, w, f"rotate[{name!r}]") if name in rotate else None
        c = _channel_vector(center[name], mod.in_features, w, f"center[{name!r}]") if name in center else None
        if static:
            lo, hi = ranges[name]
            rng = (_range_tensor(lo, w, f"ranges[{name!r}]"), _range_tensor(hi, w, f"ranges[{name!r}]"))
        out[name] = (s, r, None if spec.act_bits is None else _act_quantizer(spec, rng, c))
    return out


@contextlib.contextmanager
def quantized_linears(
    modules: Mapping[str, torch.nn.Linear],
    spec: LinearQuantization,
    *,
    ranges: Mapping[str, tuple] | None = None,
    smooth: Mapping[str, object] | None = None,
    output_shift: Mapping[str, object] | None = None,
    rotate: Mapping[str, object] | None = None,
    center: Mapping[str, object] | None = None,
) -> Iterator[None]:
    """Context manager: fake-quantise inputs and/or weights of linear layers, as deployed.

    Parameters
    ----------
    modules : mapping name -> nn.Linear
    spec : LinearQuantization
    ranges : mapping name -> (lo, hi), optional
        Calibrated input ranges (in the smoothed coordinates); required when ``spec.static``.
    smooth : mapping name -> array of shape (in,), optional
        SmoothQuant scales ``s`` (:func:`~companion.applications.quantization.smoothquant_scales`):
        the input is divided by ``s`` and the weight's columns multiplied by it before quantisation.
    output_shift : mapping name -> array of shape (out,), optional
        Subtracted from the output (bias correction: :func:`activation_bias_correction`, ...).
    rotate : mapping name -> orthogonal matrix of shape (in, in), optional
        Rotation ``R`` after smoothing: the input becomes ``x R`` and the weight ``W R`` before
        quantisation (``(xR)(WR)^T = xW^T``; e.g. :func:`~companion.applications.quantization.random_rotation`).
    center : mapping name -> array of shape (in,), optional
        Centre ``c`` of the input quantiser (in the smoothed, rotated coordinates): ``Q(y - c) + c``,
        which folds into the bias; static ``ranges`` are then those of ``y - c``.

    Yields
    ------
    None
        The weights are restored and the hooks removed on exit.

    Raises
    ------
    ValueError
        If a mapping names an unknown layer, has the wrong shape or is not finite, or lacks a range.

    Examples
    --------
    >>> lin = torch.nn.Linear(4, 2)
    >>> with quantized_linears({"lin": lin}, LinearQuantization(act_bits=8, weight_bits=4)):
    ...     y = lin(torch.randn(3, 4))  # W4 per-channel, A8 per-tensor dynamic
    """
    modules = check_linears(modules)
    if not isinstance(spec, LinearQuantization):
        raise TypeError(f"spec must be a LinearQuantization, got {type(spec).__name__}")
    prepared = _prepared(modules, spec, ranges, smooth, rotate, center)
    output_shift = dict(output_shift or {})
    _check_names(output_shift, modules, "output_shift")
    shifts = {name: _channel_vector(v, modules[name].out_features, modules[name].weight,
                                    f"output_shift[{name!r}]") for name, v in output_shift.items()}
    saved, pre, post = {}, [], []
    try:
        for name, mod in modules.items():
            s, r, quant = prepared[name]
            if s is not None or r is not None or spec.weight_bits is not None:  # replaced, restored on exit
                saved[name] = mod.weight.detach().clone()
                new = saved[name] * s if s is not None else saved[name]
                if r is not None:
                    new = new @ r
                if spec.weight_bits is not None:
                    new = quantize_weight(new, spec.weight_bits, granularity=spec.weight_granularity,
                                          symmetric=spec.weight_symmetric)
                with torch.no_grad():
                    mod.weight.copy_(new)
            if s is not None or r is not None or quant is not None:
                def pre_hook(_m, args, s=s, r=r, quant=quant):
                    x = args[0]
                    if s is not None:
                        x = x / s.to(x.dtype)
                    if r is not None:
                        x = x @ r.to(x.dtype)
                    if quant is not None:
                        x = quant(x)
                    return (x,) + tuple(args[1:])
                pre.append((mod, pre_hook))
            if name in shifts:
                post.append((mod, lambda _m, _a, out, shift=shifts[name]: out - shift.to(out.dtype)))
        with hooks(forward=post, pre=pre):
            yield None
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                modules[name].weight.copy_(w)


def weight_bias_correction(weight, weight_q, input_mean):
    """Nagel et al.'s bias correction for weight quantisation, ``(W̃ − W) E[x]``.

    Parameters
    ----------
    weight, weight_q : torch.Tensor or numpy.ndarray, shape (out, in)
        The float and the quantised weight.
    input_mean : array_like, shape (in,)
        ``E[x]`` of the layer's input (calibration data).

    Returns
    -------
    numpy.ndarray, shape (out,), float64
        The expected output shift, to be subtracted from the bias.

    Raises
    ------
    TypeError, ValueError
        On shape mismatch or non-finite values.

    Examples
    --------
    >>> weight_bias_correction(np.eye(2), np.array([[1.0, 0.1], [0.0, 1.0]]), [0.0, 10.0]).tolist()
    [1.0, 0.0]
    """
    w = real_array("weight", weight, shape=(None, None))
    wq = real_array("weight_q", weight_q, shape=w.shape)
    return (wq - w) @ real_array("input_mean", input_mean, shape=(w.shape[1],))


def activation_bias_correction(weight, mean_error):
    """The activation analogue of bias correction: the expected output shift ``W E[Q(x) − x]``.

    Parameters
    ----------
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
        The weight that reads the quantised input (the smoothed one if smoothing is used).
    mean_error : array_like, shape (in,)
        ``E[Q(x) − x]`` per input channel (:func:`mean_quantization_error`).

    Returns
    -------
    numpy.ndarray, shape (out,), float64
        The expected output shift.

    Raises
    ------
    TypeError, ValueError
        On shape mismatch or non-finite values.

    Examples
    --------
    >>> activation_bias_correction(np.array([[1.0, 2.0]]), [0.5, -0.25]).tolist()
    [0.0]
    """
    w = real_array("weight", weight, shape=(None, None))
    return w @ real_array("mean_error", mean_error, shape=(w.shape[1],))


def mean_quantization_error(model: torch.nn.Module, batches, modules: Mapping[str, torch.nn.Linear],
                            spec: LinearQuantization, *, ranges=None, smooth=None, rotate=None,
                            center=None) -> dict[str, np.ndarray]:
    """``E[Q(x) − x]`` per input channel of each chosen layer, on calibration batches.

    Parameters
    ----------
    model, batches
        As in :func:`~companion.applications.pruning.linear_input_statistics`.
    modules, ranges, smooth, rotate, center
        As in :func:`quantized_linears`.
    spec : LinearQuantization
        Only the activation part is used (``act_bits`` must be set).

    Returns
    -------
    dict name -> numpy.ndarray of shape (in,), float64
        The mean of ``Q(x/s) − x/s`` over all tokens (pads included: pass unpadded batches).

    Raises
    ------
    TypeError, ValueError
        As :func:`quantized_linears`; also if ``spec.act_bits`` is None or ``batches`` is empty.
    """
    modules = check_linears(modules, model)
    if not isinstance(spec, LinearQuantization) or spec.act_bits is None:
        raise ValueError("spec must be a LinearQuantization with act_bits set")
    prepared = _prepared(modules, spec, ranges, smooth, rotate, center)
    acc = {name: [0, None] for name in modules}

    def observe(name, x, _mask):
        s, r, quant = prepared[name]
        if s is not None:
            x = x / s.to(x.dtype)
        if r is not None:
            x = x @ r.to(x.dtype)
        e = (quant(x) - x).reshape(-1, x.shape[-1]).double()
        a = acc[name]
        a[1] = e.sum(0) if a[1] is None else a[1] + e.sum(0)
        a[0] += e.shape[0]

    _run_batches(model, batches, modules, observe)
    out = {}
    for name, (n, total) in acc.items():
        if n == 0:
            raise ValueError(f"layer {name!r} never ran")
        out[name] = (total / n).cpu().numpy()
    return out


def equalization_scales(w1, w2, reads=None) -> np.ndarray:
    """Nagel et al.'s cross-layer equalisation scales ``s_j = sqrt(r1_j / r2_j)`` for two layers in series.

    Layer 1 writes channel ``j`` with row ``j`` of ``w1`` (range ``r1_j = max|W1[j, :]|``); layer 2
    reads it with the columns ``k`` of ``w2`` with ``reads[k] = j`` (range ``r2_j``, the largest
    ``|W2[:, k]|`` over them).  Dividing row ``j`` of ``W1`` by ``s_j`` and multiplying those columns of
    ``W2`` by ``s_j`` leaves the composition unchanged whenever what lies between the layers is
    linear in each channel (attention's ``A V``; the gate ``SiLU(g) ⊙ u`` of a gated MLP, for ``u``)
    and gives both the same range ``sqrt(r1_j r2_j)``.

    Parameters
    ----------
    w1 : torch.Tensor or numpy.ndarray, shape (n, in1)
    w2 : torch.Tensor or numpy.ndarray, shape (out2, n2)
    reads : array_like of int, shape (n2,), optional
        The row of ``w1`` each column of ``w2`` reads (default: column ``k`` reads row ``k``, ``n2 = n``);
        grouped-query attention repeats a value channel for several heads.

    Returns
    -------
    numpy.ndarray, shape (n,), float64
        Positive scales; 1 where either range is 0.

    Raises
    ------
    TypeError, ValueError
        For non-2-D or non-finite weights, or a ``reads`` that does not index the rows of ``w1``
        (or misses one).

    Examples
    --------
    >>> equalization_scales(np.array([[4.0], [1.0]]), np.array([[1.0, 1.0]])).tolist()
    [2.0, 1.0]
    """
    a = np.abs(real_array("w1", _as_numpy(w1), shape=(None, None)))
    b = np.abs(real_array("w2", _as_numpy(w2), shape=(None, None)))
    n = a.shape[0]
    idx = np.arange(b.shape[1]) if reads is None else np.asarray(reads)
    if idx.shape != (b.shape[1],) or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"reads must be {b.shape[1]} integers (one per column of w2), got shape {idx.shape}")
    if idx.min(initial=0) < 0 or idx.max(initial=0) >= n or len(np.unique(idx)) != n:
        raise ValueError(f"reads must index every row of w1 (0..{n - 1}) and nothing else")
    r1 = a.max(axis=1)
    r2 = np.zeros(n)
    np.maximum.at(r2, idx, b.max(axis=0))
    s = np.ones(n)
    ok = (r1 > 0) & (r2 > 0)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    return s


def _as_numpy(w):
    return w.detach().double().cpu().numpy() if isinstance(w, torch.Tensor) else w


@contextlib.contextmanager
def equalized_linears(pairs) -> Iterator[dict]:
    """Context manager: apply cross-layer equalisation to pairs of linear layers, restored on exit.

    Parameters
    ----------
    pairs : sequence of (nn.Linear, nn.Linear, reads or None)
        Writer, reader and the map of :func:`equalization_scales`; the writer must have no bias
        (a bias would be divided too; Llama-style blocks have none).

    Yields
    ------
    list of numpy.ndarray
        The scales of each pair.

    Raises
    ------
    TypeError, ValueError
        For a pair that is not two ``nn.Linear`` layers, a writer with a bias, or a bad ``reads``.
    """
    pairs = list(pairs)
    for p in pairs:
        if (not isinstance(p, tuple) or len(p) != 3 or not isinstance(p[0], torch.nn.Linear)
                or not isinstance(p[1], torch.nn.Linear)):
            raise TypeError("pairs must be (nn.Linear writer, nn.Linear reader, reads) tuples")
        if p[0].bias is not None:
            raise ValueError("the writer of an equalised pair must have no bias")
    scales = [equalization_scales(w1.weight, w2.weight, reads) for w1, w2, reads in pairs]
    saved = [(w1.weight.detach().clone(), w2.weight.detach().clone()) for w1, w2, _ in pairs]
    try:
        with torch.no_grad():
            for (w1, w2, reads), s in zip(pairs, scales):
                st = torch.as_tensor(s, dtype=w1.weight.dtype, device=w1.weight.device)
                w1.weight.div_(st[:, None])
                w2.weight.mul_(st[torch.as_tensor(np.arange(w2.in_features) if reads is None
                                                  else np.asarray(reads))][None, :])
        yield scales
    finally:
        with torch.no_grad():
            for (w1, w2, _), (a, b) in zip(pairs, saved):
                w1.weight.copy_(a)
                w2.weight.copy_(b)
