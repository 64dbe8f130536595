"""Fake quantisation of activations and weights: per-tensor, per-channel and per-token scales,
dynamic or static (calibrated) ranges, symmetric or asymmetric (zero-point) grids, centring and
mixed precision for outlier channels, weight quantisation per output row, SmoothQuant's migration
(:func:`smoothquant_scales`), Nagel et al.'s bias correction (:func:`weight_bias_correction`,
:func:`activation_bias_correction`), and context managers that apply them to the linear layers
of a real model (:func:`quantize_linear_inputs`, :func:`quantized_linears`).

Everything here is *fake* quantisation (quantise, then dequantise, in floating point): it reproduces
the numerical error of an integer kernel exactly, which is all that the error analysis needs.

Convention: the channel axis is the **last** axis of an activation tensor ``x`` of shape
``(..., d)``; every other axis indexes tokens.

Notes
-----
A symmetric ``b``-bit quantiser with step (scale) ``Δ`` maps ``x`` to
``Q(x) = Δ · clamp(round(x / Δ), -q, q)`` with ``q = 2**(b-1) - 1`` (127 for int8, 7 for int4).
The scale is set from the range, ``Δ = max|x| / q``, over the group that shares it (the whole
tensor, one channel, or one token), so nothing is clipped and ``|x - Q(x)| ≤ Δ/2`` for every
element.  Bias correction quantises ``x - μ`` instead of ``x`` and adds ``μ`` back; in front of a
linear layer ``y = W x + b`` the added ``μ`` folds exactly into the bias, ``b' = b + W μ``
(:func:`fold_center_into_bias`, cf. Nagel et al. 2019, data-free quantisation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import (
    check_choice, check_indices, check_int, check_linears, check_real, float_tensor, real_array,
)
from companion.hooks import hooks

__all__ = [
    "GRANULARITIES",
    "qmax",
    "quantization_scale",
    "fake_quantize",
    "max_rounding_error",
    "channel_mse",
    "fold_center_into_bias",
    "quantize_linear_inputs",
    "dynamic_range",
    "quantize_with_range",
    "quantize_weight",
    "smoothquant_scales",
    "LinearQuantization",
    "quantized_linears",
    "weight_bias_correction",
    "activation_bias_correction",
    "mean_quantization_error",
]

#: The groups that can share one scale: the whole tensor, one channel (last axis), one token (row).
GRANULARITIES = ("tensor", "channel", "token")


# --------------------------------------------------------------------------- argument checks
def _channel_vector(v, d: int, like: torch.Tensor, name: str) -> torch.Tensor:
    t, _ = float_tensor(v, name)
    if t.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},) (one value per channel), got {tuple(t.shape)}")
    out = t.to(device=like.device, dtype=like.dtype)
    _check_cast(out, t, name)
    return out


def _check_cast(cast: torch.Tensor, original: torch.Tensor, name: str) -> None:
    """ValueError if finite values became infinite in the cast to ``cast.dtype``."""
    if not bool(torch.isfinite(cast).all()):
        big = float(original.detach().abs().max())
        raise ValueError(
            f"{name} has values up to {big:.4g}, beyond the range of {cast.dtype} "
            f"(max {torch.finfo(cast.dtype).max:.4g}); they become inf after the cast"
        )


#: Half-precision dtypes: their quantiser runs in float32 and the result is rounded once.
_HALF = (torch.float16, torch.bfloat16)
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def _keep_mask(keep_channels, d: int, device) -> torch.Tensor | None:
    if keep_channels is None:
        return None
    mask = torch.zeros(d, dtype=torch.bool, device=device)
    mask[torch.as_tensor(check_indices(keep_channels, d, "keep_channels"), device=device)] = True
    return mask


def _scale_of(y: torch.Tensor, q: int, granularity: str, mask: torch.Tensor | None) -> torch.Tensor:
    """``max|y| / q`` per group (kept channels excluded), 1 where that is 0; inputs validated."""
    a = y.abs()
    if mask is not None:
        a = a.masked_fill(mask, 0.0)
    if granularity == "tensor":
        m = a.amax()
    elif granularity == "channel":
        m = a.reshape(-1, y.shape[-1]).amax(dim=0)
    else:
        m = a.amax(dim=-1, keepdim=True)
    scale = m / q
    return torch.where(scale > 0, scale, torch.ones_like(scale))  # range 0 (or subnormal): any scale is exact


def _centred(t: torch.Tensor, c: torch.Tensor | None):
    """``(x - c, c, dtype)`` in the dtype the quantiser works in: float32 for half-precision
    inputs, else the input's, widened (float32 -> float64) where ``x - c`` overflows it."""
    work = _WIDER[t.dtype] if t.dtype in _HALF else t.dtype
    while True:
        tw = t.to(work)
        cw = None if c is None else c.to(work)
        y = tw if cw is None else tw - cw
        if cw is None or bool(torch.isfinite(y).all()):
            return y, cw, work
        if work not in _WIDER:
            raise ValueError(
                f"x - center overflows {work} (|x - center| exceeds {torch.finfo(work).max:.4g}); "
                f"rescale x and center"
            )
        work = _WIDER[work]


def _fake_quantize(t: torch.Tensor, q: int, granularity: str, c: torch.Tensor | None,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """The quantiser of :func:`fake_quantize` on validated arguments (the hooks' fast path).

    Half-precision inputs are quantised in float32 and rounded once to their dtype (in float16
    ``round(y/Δ)·Δ`` rounds twice and misses the bound Δ/2, and a grid point within Δ/2 above
    65504 became inf).  If ``x - c`` overflows the dtype, the quantiser runs in the next wider
    one (float32 -> float64); float64 has none and raises.
    """
    y, cw, work = _centred(t, c)
    scale = _scale_of(y, q, granularity, mask)
    out = y.div(scale).round_().clamp_(-q, q).mul_(scale)
    if cw is not None:
        out = out.add_(cw)
    if work != t.dtype:  # a grid point within Δ/2 beyond the dtype's range is its largest value
        fmax = torch.finfo(t.dtype).max
        out = out.clamp_(-fmax, fmax).to(t.dtype)
    if mask is not None:
        out = torch.where(mask, t, out)
    return out.to(t.dtype)


# --------------------------------------------------------------------------- core functions
def qmax(bits: int) -> int:
    """Largest integer level of a symmetric signed ``bits``-bit quantiser, ``2**(bits-1) - 1``.

    Parameters
    ----------
    bits : int
        Bit width, 2 ≤ bits ≤ 16.

    Returns
    -------
    int
        127 for 8 bits, 7 for 4 bits.

    Raises
    ------
    TypeError
        If ``bits`` is not an integer.
    ValueError
        If ``bits`` is outside [2, 16].

    Notes
    -----
    The symmetric ("restricted range") grid is ``{-q, …, q}``; the level ``-2**(bits-1)`` of two's
    complement is left unused so that the grid is symmetric about 0.

    Examples
    --------
    >>> qmax(8), qmax(4)
    (127, 7)
    """
    return 2 ** (check_int(bits, "bits", 2, 16) - 1) - 1


def quantization_scale(x, bits: int, granularity: str = "tensor", *, keep_channels=None):
    """Step ``Δ = max|x| / q`` of a symmetric quantiser for each group that shares a scale.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape (..., d)
        Activations; the last axis indexes channels.
    bits : int
        Bit width (``q = 2**(bits-1) - 1``).
    granularity : {"tensor", "channel", "token"}
        ``"tensor"``: one scale; ``"channel"``: one per channel (max over all other axes);
        ``"token"``: one per row (max over the channel axis).
    keep_channels : sequence of int, optional
        Channels excluded from the range (they are kept in floating point by
        :func:`fake_quantize`).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Shape ``()`` for ``"tensor"``, ``(d,)`` for ``"channel"``, ``x.shape[:-1] + (1,)`` for
        ``"token"``; same type as ``x``.  Groups whose range is 0 get scale 1 (every value is 0
        there, so any positive scale reproduces it exactly); so do groups whose ``max|x|/q``
        underflows to 0 (subnormal ranges), which are then rounded to 0.

    Raises
    ------
    TypeError
        If ``x`` is not a floating tensor/array, ``bits`` is not an integer or ``granularity`` not
        a string.
    ValueError
        If ``x`` is empty, 0-dimensional or not finite; ``bits`` is outside [2, 16];
        ``granularity`` is unknown; ``keep_channels`` is out of range or repeated.

    Notes
    -----
    Setting ``Δ`` from the maximum means no value is clipped, so the rounding error obeys
    ``|x - Q(x)| ≤ Δ/2`` (see :func:`max_rounding_error`).

    Examples
    --------
    >>> x = np.array([[1.0, -4.0], [0.5, 2.0]])
    >>> float(quantization_scale(x, 8, "tensor")) * 127
    4.0
    >>> (quantization_scale(x, 8, "channel") * 127).round(6).tolist()
    [1.0, 4.0]
    """
    t, was_numpy = float_tensor(x)
    q = qmax(bits)
    check_choice(granularity, "granularity", GRANULARITIES)
    mask = _keep_mask(keep_channels, t.shape[-1], t.device)
    y, _, _ = _centred(t, None)
    scale = _scale_of(y, q, granularity, mask).to(t.dtype)  # float32 for half inputs, rounded
    return scale.numpy() if was_numpy else scale


def fake_quantize(x, bits: int, granularity: str = "tensor", *, center=None, keep_channels=None):
    """Quantise then dequantise ``x`` with a symmetric ``bits``-bit grid.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape (..., d)
        Activations; the last axis indexes channels.
    bits : int
        Bit width, 2 ≤ bits ≤ 16 (8 = int8, 4 = int4).
    granularity : {"tensor", "channel", "token"}
        Which elements share a scale (see :func:`quantization_scale`).
    center : array_like of shape (d,), optional
        Bias correction: quantise ``x - center`` and add ``center`` back.  With ``center = μ``
        (the channel means) the quantiser sees only the fluctuation of each channel.
    keep_channels : sequence of int, optional
        Mixed precision: these channels are passed through unchanged (floating point) and are
        excluded from the range that sets the scale.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Same shape, dtype and type as ``x``.

    Raises
    ------
    TypeError
        For a non-floating ``x``, a non-integer ``bits`` or a non-string ``granularity``.
    ValueError
        For an empty, 0-dimensional or non-finite ``x``; ``bits`` outside [2, 16]; an unknown
        ``granularity``; a ``center`` of the wrong shape, not finite or beyond the range of
        ``x.dtype`` (e.g. 1e5 for float16); bad ``keep_channels``; ``x - center`` beyond the
        float64 range.

    Notes
    -----
    ``Q(x) = c + Δ · clamp(round((x - c)/Δ), -q, q)`` with ``q = 2**(bits-1) - 1`` and
    ``Δ = max|x - c| / q`` over the group (kept channels excluded).  Since the range sets ``Δ``,
    nothing is clipped and ``|x - Q(x)| ≤ Δ/2``; if the rounding error is close to uniform on
    ``[-Δ/2, Δ/2]`` (many levels per channel) its mean square is ``Δ²/12``.  ``round`` is
    round-half-to-even.  References: Dettmers et al. (2022) for mixed precision of outlier
    channels, Nagel et al. (2019) for bias correction.

    Floating point: float16 and bfloat16 inputs are quantised in float32 and the result is rounded
    once to the input dtype, so ``|x - Q(x)| ≤ Δ/2`` plus half a unit in the last place of ``Q(x)``
    (computing ``round(y/Δ)·Δ`` in float16 rounds twice and can miss the bound by a whole step;
    the grid point next to 65504 overflowed to inf).  A grid point beyond the dtype's largest value
    is stored as that value.  Where ``x - c`` overflows the dtype, the quantiser runs in the next
    wider one (float32 -> float64).

    Examples
    --------
    >>> x = np.array([[0.0, 1.0, -0.6], [2.54, 0.01, 0.2]])
    >>> fake_quantize(x, 8, "tensor").round(4).tolist()
    [[0.0, 1.0, -0.6], [2.54, 0.0, 0.2]]
    >>> fake_quantize(x, 2, "tensor", keep_channels=[0]).tolist()
    [[0.0, 1.0, -1.0], [2.54, 0.0, 0.0]]
    """
    t, was_numpy = float_tensor(x)
    q = qmax(bits)
    check_choice(granularity, "granularity", GRANULARITIES)
    d = t.shape[-1]
    c = None if center is None else _channel_vector(center, d, t, "center")
    mask = _keep_mask(keep_channels, d, t.device)
    out = _fake_quantize(t, q, granularity, c, mask)
    return out.numpy() if was_numpy else out


def max_rounding_error(x, bits: int, granularity: str = "tensor", *, center=None, keep_channels=None):
    """Worst-case absolute error ``Δ/2`` of :func:`fake_quantize`, broadcast to the shape of ``x``.

    Parameters
    ----------
    x, bits, granularity, center, keep_channels
        As in :func:`fake_quantize`.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        ``Δ/2`` for every element (0 for kept channels), same shape and type as ``x``; for
        float16/bfloat16 ``Δ`` is computed in float32 (see :func:`fake_quantize`) and rounded.

    Raises
    ------
    TypeError, ValueError
        As in :func:`fake_quantize`.

    Notes
    -----
    With ``Δ = max|x - c|/q`` over a group, every value lies in ``[-qΔ, qΔ]`` after centring, so
    ``round`` never needs the clamp and the error of one element is at most half a step.

    Examples
    --------
    >>> x = np.array([[1.0, -4.0], [0.5, 2.0]])
    >>> bool((np.abs(fake_quantize(x, 4) - x) <= max_rounding_error(x, 4)).all())
    True
    """
    t, was_numpy = float_tensor(x)
    check_choice(granularity, "granularity", GRANULARITIES)
    d = t.shape[-1]
    c = None if center is None else _channel_vector(center, d, t, "center")
    mask = _keep_mask(keep_channels, d, t.device)
    y, _, _ = _centred(t, c)
    half = torch.broadcast_to(_scale_of(y, qmax(bits), granularity, mask) / 2, t.shape).to(t.dtype)
    if mask is not None:
        half = torch.where(mask, torch.zeros_like(half), half)
    return half.numpy() if was_numpy else half


def channel_mse(x, x_hat):
    """Mean squared difference per channel, averaged over every axis but the last.

    Parameters
    ----------
    x, x_hat : torch.Tensor or numpy.ndarray, shape (..., d)
        Reference and approximation (e.g. activations and their fake-quantised version).

    Returns
    -------
    torch.Tensor or numpy.ndarray, shape (d,)
        ``mean_i (x_ij - x̂_ij)²`` for each channel ``j``; type of ``x``.

    Raises
    ------
    TypeError
        If either argument is not a floating tensor/array.
    ValueError
        If the shapes differ, a tensor is empty, 0-dimensional or not finite, or a mean square
        exceeds the range of ``x.dtype`` (e.g. above 65504 for float16: pass ``x.float()``).

    Notes
    -----
    Computed in float64 for accuracy, returned in the dtype of ``x``.

    Examples
    --------
    >>> channel_mse(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.5], [2.0, 4.5]])).tolist()
    [0.5, 0.25]
    """
    a, was_numpy = float_tensor(x, "x")
    b, _ = float_tensor(x_hat, "x_hat")
    if a.shape != b.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    diff = (a.double() - b.to(a.device).double()).reshape(-1, a.shape[-1])
    mse = diff.pow(2).mean(dim=0)
    out = mse.to(a.dtype)
    _check_cast(out, mse, "the mean squared difference")
    return out.numpy() if was_numpy else out


def fold_center_into_bias(weight, bias, center):
    """Bias of a linear layer that absorbs a centre added back to its input: ``b + W c``.

    Parameters
    ----------
    weight : torch.Tensor, shape (out, in)
        Weight of ``y = W x + b`` (PyTorch's ``nn.Linear`` layout).
    bias : torch.Tensor of shape (out,) or None
        Existing bias (``None`` means zero).
    center : torch.Tensor or numpy.ndarray, shape (in,)
        The centre ``c`` subtracted before quantisation.

    Returns
    -------
    torch.Tensor, shape (out,)
        ``b + W c``.  Then ``W (Q(x - c) + c) + b = W Q(x - c) + (b + W c)``: bias correction costs
        nothing at inference time.

    Raises
    ------
    TypeError
        If ``weight`` is not a floating torch tensor.
    ValueError
        If ``weight`` is not 2-D, ``bias``/``center`` has the wrong shape, is not finite or
        exceeds the range of ``weight.dtype``, or ``b + W c`` overflows that dtype.

    Notes
    -----
    Linear algebra only; the identity is exact up to floating-point rounding.

    Examples
    --------
    >>> W = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    >>> fold_center_into_bias(W, None, torch.tensor([1.0, 1.0])).tolist()
    [3.0, -1.0]
    """
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError("weight must be a floating torch.Tensor of shape (out, in)")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {tuple(weight.shape)}")
    c = _channel_vector(center, weight.shape[1], weight, "center")
    out = weight @ c
    if bias is not None:
        b = _channel_vector(bias, weight.shape[0], weight, "bias")
        out = out + b
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            f"b + W c overflows {weight.dtype} (max {torch.finfo(weight.dtype).max:.4g}); the "
            f"folded bias cannot be stored in the layer's dtype: fold in a wider one "
            f"(weight.double()) or use a smaller center"
        )
    return out


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
        Scale sharing, applied to each input tensor of shape (batch, seq, d) separately
        (dynamic quantisation: the range is that of the current batch).
    modules : mapping name -> nn.Linear, optional
        The layers to hook.  Default: every ``nn.Linear`` of ``model`` except one named
        ``lm_head``.
    centers : mapping name -> tensor of shape (in,), optional
        Bias correction per layer (usually the calibration channel means); layers not in the
        mapping are quantised without centring.
    keep_channels : mapping name -> sequence of int, optional
        Mixed precision per layer: channels kept in floating point.

    Yields
    ------
    dict
        The hook handles by layer name (removed on exit, also on error).

    Raises
    ------
    TypeError
        If ``model`` is not a module or a chosen module is not ``nn.Linear``.
    ValueError
        For bad ``bits``/``granularity``, or ``centers``/``keep_channels`` naming layers that are
        not hooked or having the wrong length, or a center beyond the range of the layer's dtype
        (during the forward pass: of the input's dtype).

    Notes
    -----
    Implemented with ``register_forward_pre_hook``, so the weights are untouched and the hooks
    leave no trace after the ``with`` block.  Dynamic ranges and float weights only; static
    ranges, zero-points, weight quantisation, SmoothQuant and bias correction are applied by
    :func:`quantized_linears`.

    Examples
    --------
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


# =========================================================================== deployable schemes
# Static (calibrated) ranges, asymmetric zero-points, weight quantisation, SmoothQuant's
# migration and Nagel et al.'s bias correction, applied to the linear layers of a model.

def _range_tensor(v, like: torch.Tensor, name: str) -> torch.Tensor:
    t = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v, dtype=np.float64))
    if not t.is_floating_point():
        t = t.double()
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return t.to(device=like.device, dtype=like.dtype)


def _quantize_range(y: torch.Tensor, bits: int, lo: torch.Tensor, hi: torch.Tensor,
                    symmetric: bool) -> torch.Tensor:
    """Fake-quantise ``y`` on the grid fixed by the range ``[lo, hi]`` (validated, broadcast)."""
    if symmetric:
        q = 2 ** (bits - 1) - 1
        step = torch.maximum(lo.abs(), hi.abs()) / q
        step = torch.where(step > 0, step, torch.ones_like(step))
        return y.div(step).round().clamp(-q, q).mul(step)
    levels = 2 ** bits - 1
    lo0, hi0 = torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi))
    step = (hi0 - lo0) / levels           # the grid contains 0 exactly (zero-point z)
    step = torch.where(step > 0, step, torch.ones_like(step))
    z = (-lo0 / step).round().clamp(0, levels)
    return (y.div(step).round() + z).clamp(0, levels).sub(z).mul(step)


def dynamic_range(x, granularity: str = "tensor"):
    """Smallest and largest value of each group that shares a quantiser range.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape (..., d)
    granularity : {"tensor", "channel", "token"}

    Returns
    -------
    (lo, hi) : pair of torch.Tensor or numpy.ndarray
        Shapes ``()``, ``(d,)`` or ``x.shape[:-1] + (1,)``; type of ``x``.

    Raises
    ------
    TypeError, ValueError
        As :func:`fake_quantize`.

    Examples
    --------
    >>> lo, hi = dynamic_range(np.array([[1.0, -4.0], [0.5, 2.0]]), "token")
    >>> lo.ravel().tolist(), hi.ravel().tolist()
    ([-4.0, 0.5], [1.0, 2.0])
    """
    t, was_numpy = float_tensor(x)
    check_choice(granularity, "granularity", GRANULARITIES)
    if granularity == "tensor":
        lo, hi = t.amin(), t.amax()
    elif granularity == "channel":
        flat = t.reshape(-1, t.shape[-1])
        lo, hi = flat.amin(dim=0), flat.amax(dim=0)
    else:
        lo, hi = t.amin(dim=-1, keepdim=True), t.amax(dim=-1, keepdim=True)
    return (lo.numpy(), hi.numpy()) if was_numpy else (lo, hi)


def quantize_with_range(x, bits: int, lo, hi, *, symmetric: bool = True):
    """Fake-quantise ``x`` on a grid fixed in advance by the range ``[lo, hi]`` (static scales).

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape (..., d)
    bits : int
        Bit width, 2 ≤ bits ≤ 16.
    lo, hi : float or array_like broadcastable to ``x``
        The calibrated range: a number (per tensor), shape ``(d,)`` (per channel) or
        ``x.shape[:-1] + (1,)`` (per token).  ``lo ≤ hi`` is required.
    symmetric : bool, default True
        ``True``: step ``Δ = max(|lo|, |hi|)/q`` on ``{-q, …, q}``, ``q = 2**(bits-1) − 1``.
        ``False``: asymmetric (affine) grid of ``2**bits`` levels, ``Δ = (hi − lo)/(2**bits − 1)``
        with the integer zero-point ``z = round(−lo/Δ)`` (the range is first widened to contain 0,
        so that 0 is represented exactly).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Same shape, dtype and type as ``x``.  Values outside the range are clipped to its end
        points (static scales clip; dynamic ones never do).

    Raises
    ------
    TypeError
        For a non-floating ``x``, a non-integer ``bits`` or a non-bool ``symmetric``.
    ValueError
        For an empty or non-finite ``x``, ``bits`` out of range, a non-finite range, a range
        that does not broadcast to ``x``, or ``lo > hi``.

    Notes
    -----
    Asymmetric: ``Q(x) = Δ (clamp(round(x/Δ) + z, 0, 2^b − 1) − z)`` (Jacob et al. 2018's
    affine scheme).  Inside the range the error is at most ``Δ/2``; a one-signed group (the
    SiLU-gated MLP state is mostly ≥ −0.28) uses almost all ``2^b`` levels instead of half.

    Examples
    --------
    >>> x = np.array([[0.0, 1.0, 3.0]])
    >>> quantize_with_range(x, 2, 0.0, 3.0, symmetric=False).tolist()
    [[0.0, 1.0, 3.0]]
    >>> quantize_with_range(x, 2, -1.0, 1.0).tolist()   # static range: 3.0 is clipped to 1.0
    [[0.0, 1.0, 1.0]]
    """
    t, was_numpy = float_tensor(x)
    b = check_int(bits, "bits", 2, 16)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False, got {type(symmetric).__name__}")
    work = _WIDER[t.dtype] if t.dtype in _HALF else t.dtype
    tw = t.to(work)
    lo_t, hi_t = _range_tensor(lo, tw, "lo"), _range_tensor(hi, tw, "hi")
    try:
        torch.broadcast_shapes(lo_t.shape, hi_t.shape, tw.shape)
    except RuntimeError as exc:
        raise ValueError(f"lo {tuple(lo_t.shape)} and hi {tuple(hi_t.shape)} do not broadcast to x "
                         f"{tuple(tw.shape)}") from exc
    if bool((lo_t > hi_t).any()):
        raise ValueError("lo must not exceed hi")
    out = _quantize_range(tw, b, lo_t, hi_t, symmetric).to(t.dtype)
    return out.numpy() if was_numpy else out


def quantize_weight(weight, bits: int, *, granularity: str = "channel", symmetric: bool = True):
    """Fake-quantised copy of a weight matrix ``(out, in)``.

    Parameters
    ----------
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
    bits : int
    granularity : {"channel", "tensor"}
        ``"channel"``: one range per output row (per-output-channel, the usual weight scheme);
        ``"tensor"``: one range for the matrix.
    symmetric : bool, default True

    Returns
    -------
    torch.Tensor or numpy.ndarray, shape (out, in)

    Raises
    ------
    TypeError, ValueError
        As :func:`quantize_with_range`; also for a matrix that is not 2-D or a granularity other
        than ``"channel"``/``"tensor"``.

    Notes
    -----
    The range of each group is its own min and max (nothing is clipped).

    Examples
    --------
    >>> quantize_weight(np.array([[1.0, -0.5], [0.2, 0.1]]), 2).tolist()
    [[1.0, -0.0], [0.2, 0.0]]
    """
    t, was_numpy = float_tensor(weight, "weight")
    if t.ndim != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {tuple(t.shape)}")
    if granularity not in ("channel", "tensor"):
        raise ValueError(f"weight granularity must be 'channel' (per output row) or 'tensor', got {granularity!r}")
    if granularity == "channel":
        lo, hi = t.amin(dim=1, keepdim=True), t.amax(dim=1, keepdim=True)
    else:
        lo, hi = t.amin(), t.amax()
    out = quantize_with_range(t, bits, lo, hi, symmetric=symmetric)
    return out.numpy() if was_numpy else out


def smoothquant_scales(act_max, weight, alpha: float):
    """SmoothQuant's per-input-channel migration scales ``s_j = max|X_j|^α / max|W_j|^(1−α)``.

    Parameters
    ----------
    act_max : array_like, shape (in,)
        Calibrated ``max_i |x_ij|`` of each input channel.
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
        The layer's weight; ``max|W_j|`` is taken over column ``j`` (the weights that read input
        ``j``).
    alpha : float in [0, 1]
        Migration strength: 0 leaves the activations' ranges alone (only the weights' are
        equalised), 1 moves all of the activation range into the weights.

    Returns
    -------
    numpy.ndarray, shape (in,), float64
        Positive scales; a channel with ``max|X_j| = 0`` or ``max|W_j| = 0`` gets 1.

    Raises
    ------
    TypeError, ValueError
        For arrays of the wrong shape, negative or non-finite ranges, or ``alpha`` outside [0, 1].

    Notes
    -----
    ``y = W x = (W diag(s)) (diag(s)^{-1} x)`` exactly; after the migration the activation
    channel ``j`` has range ``max|X_j|^{1−α} max|W_j|^{1−α}`` and the weight column
    ``max|X_j|^α max|W_j|^α``: at ``α = 1/2`` both equal ``sqrt(max|X_j| max|W_j|)``.
    Xiao et al. (2023), eq. (4).

    Examples
    --------
    >>> smoothquant_scales([16.0, 1.0], np.array([[1.0, 1.0], [-0.25, 0.5]]), 0.5).tolist()
    [4.0, 1.0]
    """
    w = float_tensor(weight, "weight")[0].detach().double().cpu().numpy()
    if w.ndim != 2:
        raise ValueError(f"weight must have shape (out, in), got {w.shape}")
    a = real_array("act_max", act_max, shape=(w.shape[1],))
    if (a < 0).any():
        raise ValueError(f"act_max must be >= 0 (a maximum of |x|), got min {a.min():.4g}")
    al = check_real(alpha, "alpha", lo=0.0, hi=1.0)
    wmax = np.abs(w).max(axis=0)
    ok = (a > 0) & (wmax > 0)
    s = np.ones_like(a)
    s[ok] = a[ok] ** al / wmax[ok] ** (1.0 - al)
    return s


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
        Use the calibrated ranges passed to :func:`quantized_linears` (per tensor or per
        channel), fixed in advance; values beyond them are clipped.
    weight_bits : int or None
        Bit width of the weights, per output row (``None``: float weights).
    weight_symmetric : bool

    Raises
    ------
    TypeError, ValueError
        For bit widths or granularities that :func:`fake_quantize` rejects, or ``static`` with
        per-token ranges (a token's range is not known in advance).

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
        Calibrated input ranges for ``spec.static`` (numbers for per-tensor, ``(in,)`` arrays for
        per-channel), in the *smoothed* coordinates if ``smooth`` is given.  Required for every
        module when ``spec.static``.
    smooth : mapping name -> array of shape (in,), optional
        SmoothQuant scales ``s`` (:func:`smoothquant_scales`): the input is divided by ``s`` before
        it is quantised and the weight is multiplied by ``s`` (column-wise) before it is quantised.
    output_shift : mapping name -> array of shape (out,), optional
        Bias correction: subtracted from the layer's output (i.e. folded into its bias), e.g.
        :func:`weight_bias_correction` or :func:`activation_bias_correction`.

    Yields
    ------
    None

    Raises
    ------
    TypeError
        For a non-mapping ``modules`` or a non-:class:`LinearQuantization` ``spec``.
    ValueError
        If a mapping names a module that is not in ``modules``, has the wrong shape or is not
        finite, or ``ranges`` is missing a module for a static spec.

    Notes
    -----
    The weights are replaced in place for the duration of the block (``W̃ = Q(W diag(s))``) and
    restored exactly on exit, also after an error; the inputs are changed by forward pre-hooks
    and the shift by forward hooks, through :func:`companion.hooks.hooks`.  The layer then
    computes ``W̃ Q(x/s) + b − shift`` instead of ``W x + b``.

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

    Notes
    -----
    ``E[W̃ x] − E[W x] = (W̃ − W) E[x]``: the weight error ``ε = W̃ − W`` is fixed, so its
    effect on the mean output is linear in the input mean.  A channel with a large mean
    ``μ_j`` turns the rounding error of column ``j`` into a systematic shift ``ε_{:,j} μ_j`` --
    the only place in quantisation where a channel mean enters by itself.
    Nagel et al. (2019), section 4.2.

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
        The weight that reads the quantised input (the smoothed / quantised one if those are
        used).
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
        The mean over all tokens (pads included: pass unpadded batches) of ``Q(x/s) − x/s``,
        in the smoothed coordinates.

    Raises
    ------
    TypeError, ValueError
        As :func:`quantized_linears`; ``ValueError`` if ``spec.act_bits`` is None or ``batches``
        is empty.

    Notes
    -----
    The inputs are those of the float model (the hooks read, they do not change them), as in
    Nagel et al.'s layer-wise correction.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1).double()
    >>> x = torch.tensor([[0.0, 0.3], [1.0, 0.3]], dtype=torch.float64)
    >>> err = mean_quantization_error(lin, [x], {"l": lin}, LinearQuantization(act_bits=2))
    >>> np.round(err["l"], 6).tolist()
    [0.0, -0.3]
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
