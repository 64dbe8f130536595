"""Fake quantisation applied to the linear layers of a real model, and the corrections around it.

:func:`quantize_linear_inputs` and :func:`quantized_linears` are context managers that quantise the
inputs (and, with :class:`LinearQuantization`, the weights) of chosen ``nn.Linear`` modules while a
model runs; :func:`weight_bias_correction` and :func:`activation_bias_correction` are Nagel et al.'s
bias corrections; :func:`mean_quantization_error` measures the mean output error they target.  The
quantisers themselves are :mod:`companion.applications.quantization`.
Derivations: the chapter :doc:`/book/applications`.

An argument of the wrong type raises ``TypeError`` naming it; the Raises sections list the other errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import (
    check_choice, check_int, check_linears, float_tensor, real_array,
)
from companion.applications.quantization import (
    GRANULARITIES, _channel_vector, _check_cast, _fake_quantize, _keep_mask, _quantize_range, _range_tensor,
    qmax, quantize_weight,
)
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
    """Context manager: fake-quantise the input of every chosen ``nn.Linear`` during forward passes.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose linear layers are hooked (used to find them if ``modules`` is None).
    bits : int
        Bit width for every hooked input.
    granularity : {"tensor", "channel", "token"}
        Scale sharing, applied to each input tensor of shape (batch, seq, d) separately (dynamic quantisation: the range is that of the current
        batch).
    modules : mapping name -> nn.Linear, optional
        The layers to hook.  Default: every ``nn.Linear`` of ``model`` except one named ``lm_head``.
    centers : mapping name -> tensor of shape (in,), optional
        Bias correction per layer (usually the calibration channel means); layers not in the mapping are quantised without centring.
    keep_channels : mapping name -> sequence of int, optional
        Mixed precision per layer: channels kept in floating point.

    Yields
    ------
    dict
        The hook handles by layer name (removed on exit, also on error).

    Raises
    ------
    ValueError
        For bad ``bits``/``granularity``, or ``centers``/``keep_channels`` naming layers that are not hooked or having the wrong length, or a center
        beyond the range of the layer's dtype (during the forward pass: of the input's dtype).

    Examples
    --------
    >>> from companion.applications.quantization import fake_quantize
    >>> lin = torch.nn.Linear(3, 2)
    >>> x = torch.tensor([[0.1, -2.0, 0.7]])
    >>> with quantize_linear_inputs(lin, 2, modules={"lin": lin}):
    ...     y = lin(x)
    >>> torch.allclose(y, lin(fake_quantize(x, 2)))
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_int(bits, "bits", 2, 16)
    check_choice(granularity, "granularity", GRANULARITIES)
    if modules is None:
        modules = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.split(".")[-1] != "lm_head"}
    if not modules:
        raise ValueError("no linear layers to hook; pass modules={name: nn.Linear}")
    for name, mod in modules.items():
        if not isinstance(mod, torch.nn.Linear):
            raise TypeError(f"module {name!r} is a {type(mod).__name__}, not torch.nn.Linear")
    centers = dict(centers or {})
    keep_channels = dict(keep_channels or {})
    for label, mapping in (("centers", centers), ("keep_channels", keep_channels)):
        unknown = sorted(set(mapping) - set(modules))
        if unknown:
            raise ValueError(f"{label} names layers that are not hooked: {unknown[:3]}")
    prepared_c: dict[str, torch.Tensor] = {}
    prepared_k: dict[str, torch.Tensor] = {}
    for name, mod in modules.items():
        w = mod.weight
        if name in centers:
            prepared_c[name] = _channel_vector(centers[name], mod.in_features, w, f"centers[{name!r}]")
        if name in keep_channels:
            mask = _keep_mask(keep_channels[name], mod.in_features, w.device)
            prepared_k[name] = mask
    q = qmax(bits)

    def make_hook(name):
        c, k = prepared_c.get(name), prepared_k.get(name)

        def hook(_module, args):
            x, _ = float_tensor(args[0], f"the input of {name!r}")
            cx = None
            if c is not None:
                cx = c.to(x.dtype)
                _check_cast(cx, c, f"centers[{name!r}] (cast to the input's dtype)")
            xq = _fake_quantize(x, q, granularity, cx, k)
            return (xq,) + tuple(args[1:])

        return hook

    with hooks(pre=[(mod, make_hook(name)) for name, mod in modules.items()]) as handles:
        yield dict(zip(modules, handles))


@dataclass(frozen=True)
class LinearQuantization:
    """How the linear layers are fake-quantised by :func:`quantized_linears`.

    Parameters
    ----------
    act_bits : int or None
        Bit width of the inputs (``None``: inputs stay in floating point).
    act_granularity : {"tensor", "token", "channel"}
        Which entries share a range (the range is the current batch's unless ``static``).
    act_symmetric : bool
        Symmetric grid or asymmetric with a zero-point.
    static : bool
        Use the calibrated ranges passed to :func:`quantized_linears` (per tensor or per channel), fixed in advance; values beyond them are clipped.
    weight_bits : int or None
        Bit width of the weights, per output row (``None``: float weights).
    weight_symmetric : bool

    Raises
    ------
    TypeError, ValueError
        For bit widths or granularities that :func:`~companion.applications.quantization.fake_quantize` rejects, or ``static`` with per-token ranges (a token's range is not known in
        advance).

    Examples
    --------
    >>> LinearQuantization(act_bits=8, static=True).describe()
    'A8 per-tensor static symmetric'
    """

    act_bits: int | None = 8
    act_granularity: str = "tensor"
    act_symmetric: bool = True
    static: bool = False
    weight_bits: int | None = None
    weight_symmetric: bool = True

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
        """Short name, e.g. ``'W4 per-channel | A8 per-token dynamic asymmetric'``."""
        parts = []
        if self.weight_bits is not None:
            parts.append(f"W{self.weight_bits} per-channel{'' if self.weight_symmetric else ' asymmetric'}")
        if self.act_bits is not None:
            parts.append(f"A{self.act_bits} per-{self.act_granularity} "
                         f"{'static' if self.static else 'dynamic'} "
                         f"{'symmetric' if self.act_symmetric else 'asymmetric'}")
        return " | ".join(parts) if parts else "float"


def _act_quantizer(spec: LinearQuantization, rng):
    bits, gran, sym = spec.act_bits, spec.act_granularity, spec.act_symmetric

    def quantize(x):
        if spec.static:
            lo, hi = rng
            lo, hi = lo.to(x.dtype), hi.to(x.dtype)
        elif gran == "tensor":
            lo, hi = x.amin(), x.amax()
        elif gran == "channel":
            flat = x.reshape(-1, x.shape[-1])
            lo, hi = flat.amin(dim=0), flat.amax(dim=0)
        else:
            lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
        return _quantize_range(x, bits, lo, hi, sym)

    return quantize


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
        Calibrated input ranges for ``spec.static`` (numbers for per-tensor, ``(in,)`` arrays for per-channel), in the *smoothed* coordinates if
        ``smooth`` is given.  Required for every module when ``spec.static``.
    smooth : mapping name -> array of shape (in,), optional
        SmoothQuant scales ``s`` (:func:`~companion.applications.quantization.smoothquant_scales`): the input is divided by ``s`` before it is quantised and the weight is multiplied by
        ``s`` (column-wise) before it is quantised.
    output_shift : mapping name -> array of shape (out,), optional
        Bias correction: subtracted from the layer's output (i.e. folded into its bias), e.g. :func:`weight_bias_correction` or
        :func:`activation_bias_correction`.

    Yields
    ------
    None

    Raises
    ------
    ValueError
        If a mapping names a module that is not in ``modules``, has the wrong shape or is not finite, or ``ranges`` is missing a module for a static
        spec.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1, bias=False).double()
    >>> with torch.no_grad(): _ = lin.weight.copy_(torch.tensor([[1.0, 0.25]]))
    >>> with quantized_linears({"l": lin}, LinearQuantization(act_bits=None, weight_bits=2)):
    ...     y = lin(torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    >>> y.item(), lin.weight[0, 1].item()   # 0.25 is rounded to 0 inside the block, restored after
    (1.0, 0.25)
    """
    modules = check_linears(modules)
    if not isinstance(spec, LinearQuantization):
        raise TypeError(f"spec must be a LinearQuantization, got {type(spec).__name__}")
    ranges, smooth, output_shift = dict(ranges or {}), dict(smooth or {}), dict(output_shift or {})
    for label, mapping in (("ranges", ranges), ("smooth", smooth), ("output_shift", output_shift)):
        unknown = sorted(set(mapping) - set(modules))
        if unknown:
            raise ValueError(f"{label} names layers that are not in modules: {unknown[:3]}")
    if spec.static and spec.act_bits is not None:
        missing = sorted(set(modules) - set(ranges))
        if missing:
            raise ValueError(f"a static spec needs calibrated ranges for every module; missing {missing[:3]}")
    prepared = {}
    for name, mod in modules.items():
        w = mod.weight
        s = None if name not in smooth else _channel_vector(smooth[name], mod.in_features, w, f"smooth[{name!r}]")
        if s is not None and not bool((s > 0).all()):
            raise ValueError(f"smooth[{name!r}] must be positive")
        shift = None if name not in output_shift else _channel_vector(
            output_shift[name], mod.out_features, w, f"output_shift[{name!r}]")
        rng = None
        if spec.static and spec.act_bits is not None:
            lo, hi = ranges[name]
            rng = (_range_tensor(lo, w, f"ranges[{name!r}]"), _range_tensor(hi, w, f"ranges[{name!r}]"))
        prepared[name] = (s, shift, rng)
    saved = {}
    pre, post = [], []
    try:
        with torch.no_grad():
            for name, mod in modules.items():
                s = prepared[name][0]
                if s is None and spec.weight_bits is None:
                    continue
                saved[name] = mod.weight.detach().clone()
                new = saved[name] * s if s is not None else saved[name]
                if spec.weight_bits is not None:
                    new = quantize_weight(new, spec.weight_bits, symmetric=spec.weight_symmetric)
                mod.weight.copy_(new)
        for name, mod in modules.items():
            s, shift, rng = prepared[name]
            quant = _act_quantizer(spec, rng) if spec.act_bits is not None else None
            if s is not None or quant is not None:
                def pre_hook(_m, args, s=s, quant=quant):
                    x = args[0]
                    if s is not None:
                        x = x / s.to(x.dtype)
                    if quant is not None:
                        x = quant(x)
                    return (x,) + tuple(args[1:])
                pre.append((mod, pre_hook))
            if shift is not None:
                post.append((mod, lambda _m, _a, out, shift=shift: out - shift.to(out.dtype)))
        with hooks(forward=post, pre=pre):
            yield None
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                modules[name].weight.copy_(w)


def weight_bias_correction(weight, weight_q, input_mean):
    """Nagel et al.'s bias correction for weight quantisation: the expected output shift
    ``(W̃ − W) E[x]``, to be subtracted from the bias.

    Parameters
    ----------
    weight, weight_q : torch.Tensor or numpy.ndarray, shape (out, in)
        The float and the quantised weight.
    input_mean : array_like, shape (in,)
        ``E[x]`` of the layer's input (calibration data).

    Returns
    -------
    numpy.ndarray, shape (out,), float64

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
        The weight that reads the quantised input (the smoothed / quantised one if those are used).
    mean_error : array_like, shape (in,)
        ``E[Q(x) − x]`` per input channel on calibration data (:func:`mean_quantization_error`).

    Returns
    -------
    numpy.ndarray, shape (out,), float64

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
    model : torch.nn.Module
        Called as ``model(batch)`` for a tensor or ``model(**batch)`` for a mapping.
    batches : iterable of tensors or mappings
    modules : mapping name -> nn.Linear
    spec : LinearQuantization
        Only the activation part is used (``act_bits`` must be set).
    ranges, smooth : mappings, optional
        As in :func:`quantized_linears`.

    Returns
    -------
    dict name -> numpy.ndarray of shape (in,), float64
        The mean over all tokens (pads included: pass unpadded batches) of ``Q(x/s) − x/s``, in the smoothed coordinates.

    Raises
    ------
    TypeError, ValueError
        As :func:`quantized_linears`; ``ValueError`` if ``spec.act_bits`` is None or ``batches`` is empty.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1).double()
    >>> x = torch.tensor([[0.0, 0.3], [1.0, 0.3]], dtype=torch.float64)
    >>> err = mean_quantization_error(lin, [x], {"l": lin}, LinearQuantization(act_bits=2))
    """
    modules = check_linears(modules, model)
    if not isinstance(spec, LinearQuantization) or spec.act_bits is None:
        raise ValueError("spec must be a LinearQuantization with act_bits set")
    ranges, smooth = dict(ranges or {}), dict(smooth or {})
    acc = {name: [0, None] for name in modules}
    quants, scales = {}, {}
    for name, mod in modules.items():
        rng = None
        if spec.static:
            if name not in ranges:
                raise ValueError(f"a static spec needs ranges for every module; missing {name!r}")
            lo, hi = ranges[name]
            rng = (_range_tensor(lo, mod.weight, "lo"), _range_tensor(hi, mod.weight, "hi"))
        quants[name] = _act_quantizer(spec, rng)
        scales[name] = (None if name not in smooth
                        else _channel_vector(smooth[name], mod.in_features, mod.weight, f"smooth[{name!r}]"))

    def make_hook(name):
        def hook(_m, args):
            x = args[0].detach()
            if scales[name] is not None:
                x = x / scales[name].to(x.dtype)
            e = (quants[name](x) - x).reshape(-1, x.shape[-1]).double()
            a = acc[name]
            a[1] = e.sum(0) if a[1] is None else a[1] + e.sum(0)
            a[0] += e.shape[0]

        return hook

    seen = 0
    with hooks(pre=[(mod, make_hook(name)) for name, mod in modules.items()]), torch.no_grad():
        for batch in batches:
            if isinstance(batch, Mapping):
                model(**batch)
            else:
                model(batch)
            seen += 1
    if seen == 0:
        raise ValueError("batches is empty; pass at least one batch")
    out = {}
    for name, (n, total) in acc.items():
        if n == 0:
            raise ValueError(f"layer {name!r} never ran")
        out[name] = (total / n).cpu().numpy()
    return out
