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
           "activation_bias_correction", "mean_quantization_error"]


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

    def __post_init__(self):
        if self.act_bits is not None:
            check_int(self.act_bits, "act_bits", 2, 16)
        if self.weight_bits is not None:
            check_int(self.weight_bits, "weight_bits", 2, 16)
        check_choice(self.act_granularity, "granularity", GRANULARITIES)
        for f in ("act_symmetric", "static", "weight_symmetric"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f} must be True or False")
        if self.static and self.act_granularity == "token":
            raise ValueError("static ranges are per tensor or per channel; per-token ranges are dynamic")

    def describe(self) -> str:
        """Short name, e.g. ``'W4 per-channel | A8 per-token dynamic asymmetric'`` or ``'float'``."""
        parts = []
        if self.weight_bits is not None:
            parts.append(f"W{self.weight_bits} per-channel{'' if self.weight_symmetric else ' asymmetric'}")
        if self.act_bits is not None:
            parts.append(f"A{self.act_bits} per-{self.act_granularity} "
                         f"{'static' if self.static else 'dynamic'} "
                         f"{'symmetric' if self.act_symmetric else 'asymmetric'}")
        return " | ".join(parts) if parts else "float"


def _act_quantizer(spec: LinearQuantization, rng):
    """The input quantiser of ``spec``, on the static range ``rng`` or the batch's range."""
    def quantize(x):
        if spec.static:
            lo, hi = rng[0].to(x.dtype), rng[1].to(x.dtype)
        else:
            g = spec.act_granularity
            lo, hi = _per_group(x, g, torch.amin), _per_group(x, g, torch.amax)
        return _quantize_range(x, spec.act_bits, lo, hi, spec.act_symmetric)
    return quantize


def _prepared(modules, spec, ranges, smooth):
    """Per layer, the validated SmoothQuant scales and input quantiser (None where unused)."""
    ranges, smooth = dict(ranges or {}), dict(smooth or {})
    _check_names(ranges, modules, "ranges")
    _check_names(smooth, modules, "smooth")
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
        if static:
            lo, hi = ranges[name]
            rng = (_range_tensor(lo, w, f"ranges[{name!r}]"), _range_tensor(hi, w, f"ranges[{name!r}]"))
        out[name] = (s, None if spec.act_bits is None else _act_quantizer(spec, rng))
    return out


@contextlib.contextmanager
def quantized_linears(
    modules: Mapping[str, torch.nn.Linear],
    spec: LinearQuantization,
    *,
    ranges: Mapping[str, tuple] | None = None,
    smooth: Mapping[str, object] | None = None,
    output_shift: Mapping[str, object] | None = None,
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
    prepared = _prepared(modules, spec, ranges, smooth)
    output_shift = dict(output_shift or {})
    _check_names(output_shift, modules, "output_shift")
    shifts = {name: _channel_vector(v, modules[name].out_features, modules[name].weight,
                                    f"output_shift[{name!r}]") for name, v in output_shift.items()}
    saved, pre, post = {}, [], []
    try:
        for name, mod in modules.items():
            s, quant = prepared[name]
            if s is not None or spec.weight_bits is not None:  # the weight is replaced, restored on exit
                saved[name] = mod.weight.detach().clone()
                new = saved[name] * s if s is not None else saved[name]
                if spec.weight_bits is not None:
                    new = quantize_weight(new, spec.weight_bits, symmetric=spec.weight_symmetric)
                with torch.no_grad():
                    mod.weight.copy_(new)
            if s is not None or quant is not None:
                def pre_hook(_m, args, s=s, quant=quant):
                    x = args[0]
                    if s is not None:
                        x = x / s.to(x.dtype)
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
                            spec: LinearQuantization, *, ranges=None, smooth=None) -> dict[str, np.ndarray]:
    """``E[Q(x) − x]`` per input channel of each chosen layer, on calibration batches.

    Parameters
    ----------
    model, batches
        As in :func:`~companion.applications.pruning.linear_input_statistics`.
    modules, ranges, smooth
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
    prepared = _prepared(modules, spec, ranges, smooth)
    acc = {name: [0, None] for name in modules}

    def observe(name, x, _mask):
        s, quant = prepared[name]
        if s is not None:
            x = x / s.to(x.dtype)
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
