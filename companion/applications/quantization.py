"""Fake quantisers: grids, scales, calibrated ranges, centring, mixed precision, SmoothQuant.

*Fake* quantisation (quantise, then dequantise, in floating point) reproduces the error of an
integer kernel exactly.  The channel axis is the **last** axis of ``x``; every other axis indexes
tokens.  A symmetric ``b``-bit quantiser maps ``x`` to ``Δ · clamp(round(x / Δ), -q, q)`` with
``q = 2**(b-1) - 1`` and ``Δ = max|x| / q`` over the group that shares the scale (the tensor, a
channel or a token).  Applying them to a model's linear layers:
:mod:`companion.applications.model_quantization`.  Derivations: the chapter :doc:`/book/applications`.
"""

from __future__ import annotations

import numpy as np
import torch

from companion._validation import (
    check_choice, check_indices, check_int, check_real, float_tensor, real_array)

__all__ = ["GRANULARITIES", "qmax", "quantization_scale", "fake_quantize", "channel_mse",
           "fold_center_into_bias", "quantize_with_range", "quantize_weight", "smoothquant_scales",
           "hadamard_matrix", "random_rotation"]

#: The groups that can share one scale: the whole tensor, one channel (last axis), one token (row).
GRANULARITIES = ("tensor", "channel", "token")

#: The wider dtype a quantiser falls back to; half precision always works in float32.
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision dtypes, ``dtype`` otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _channel_vector(v, d: int, like: torch.Tensor, name: str) -> torch.Tensor:
    """``v`` checked to shape ``(d,)`` and cast to the device and dtype of ``like``."""
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
            f"(max {torch.finfo(cast.dtype).max:.4g}); they become inf after the cast")


def _check_weight(w, name: str) -> None:
    """TypeError/ValueError unless ``w`` is a 2-D floating tensor."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"{name} must be a floating torch.Tensor of shape (out, in), got {type(w).__name__}")
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D (out, in), got shape {tuple(w.shape)}")


def _keep_mask(keep_channels, d: int, device) -> torch.Tensor | None:
    """Boolean mask of the channels kept in floating point, or None."""
    if keep_channels is None:
        return None
    mask = torch.zeros(d, dtype=torch.bool, device=device)
    mask[torch.as_tensor(check_indices(keep_channels, d, "keep_channels"), device=device)] = True
    return mask


def _per_group(t: torch.Tensor, granularity: str, reduce) -> torch.Tensor:
    """``reduce`` (``torch.amax`` or ``torch.amin``) over each group that shares a scale."""
    if granularity == "tensor":
        return reduce(t)
    if granularity == "channel":
        return reduce(t.reshape(-1, t.shape[-1]), dim=0)
    return reduce(t, dim=-1, keepdim=True)


def _scale_of(y: torch.Tensor, q: int, granularity: str, mask: torch.Tensor | None) -> torch.Tensor:
    """``max|y| / q`` per group (kept channels excluded), 1 where that is 0; inputs validated."""
    a = y.abs()
    if mask is not None:
        a = a.masked_fill(mask, 0.0)
    scale = _per_group(a, granularity, torch.amax) / q
    return torch.where(scale > 0, scale, torch.ones_like(scale))  # range 0 (or subnormal): any scale is exact


def _centred(t: torch.Tensor, c: torch.Tensor | None):
    """``(x - c, c, dtype)`` in the dtype the quantiser works in, widened if ``x - c`` overflows."""
    work = _work_dtype(t.dtype)
    while True:
        tw = t.to(work)
        cw = None if c is None else c.to(work)
        y = tw if cw is None else tw - cw
        if cw is None or bool(torch.isfinite(y).all()):
            return y, cw, work
        if work not in _WIDER:
            raise ValueError(
                f"x - center overflows {work} (|x - center| exceeds {torch.finfo(work).max:.4g}); "
                f"rescale x and center")
        work = _WIDER[work]


def _fake_quantize(t: torch.Tensor, q: int, granularity: str, c: torch.Tensor | None,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """The quantiser of :func:`fake_quantize` on validated arguments (the hooks' fast path)."""
    y, cw, work = _centred(t, c)
    scale = _scale_of(y, q, granularity, mask)
    out = y.div(scale).round_().clamp_(-q, q).mul_(scale)
    if cw is not None:
        out = out.add_(cw)
    fmax = torch.finfo(t.dtype).max  # a grid point within Δ/2 beyond the dtype's range is its largest value
    out = out.clamp_(-fmax, fmax).to(t.dtype)
    if mask is not None:
        out = torch.where(mask, t, out)
    return out.to(t.dtype)


def _quantizer_args(x, bits, granularity, center, keep_channels):
    """Validated ``(tensor, was_numpy, q, centre, mask)`` of the :func:`fake_quantize` family."""
    t, was_numpy = float_tensor(x)
    q = qmax(bits)
    check_choice(granularity, "granularity", GRANULARITIES)
    d = t.shape[-1]
    c = None if center is None else _channel_vector(center, d, t, "center")
    return t, was_numpy, q, c, _keep_mask(keep_channels, d, t.device)


def qmax(bits: int) -> int:
    """Largest integer level of a symmetric signed ``bits``-bit quantiser, ``2**(bits-1) - 1``.

    Parameters
    ----------
    bits : int, 2 ≤ bits ≤ 16

    Returns
    -------
    int
        127 for 8 bits, 7 for 4 bits.

    Raises
    ------
    ValueError
        If ``bits`` is outside [2, 16].
    """
    return 2 ** (check_int(bits, "bits", 2, 16) - 1) - 1


def quantization_scale(x, bits: int, granularity: str = "tensor", *, keep_channels=None):
    """Step ``Δ = max|x| / q`` of a symmetric quantiser for each group that shares a scale.

    Parameters
    ----------
    x, bits, granularity, keep_channels
        As in :func:`fake_quantize` (kept channels are left out of the range).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Shape ``()``, ``(d,)`` or ``x.shape[:-1] + (1,)``; type of ``x``.  A group whose
        ``max|x| / q`` is 0 (or underflows) gets scale 1.

    Raises
    ------
    TypeError, ValueError
        As in :func:`fake_quantize`.

    Examples
    --------
    >>> float(quantization_scale(np.array([[1.0, -4.0], [0.5, 2.0]]), 8)) * 127
    4.0
    """
    t, was_numpy, q, _, mask = _quantizer_args(x, bits, granularity, None, keep_channels)
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
        Which elements share a scale: all; each channel (last axis); each token (row).
    center : array_like of shape (d,), optional
        Quantise ``x - center`` and add ``center`` back (``center = μ``: bias correction).
    keep_channels : sequence of int, optional
        Mixed precision: channels passed through unchanged and left out of the range.

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Same shape, dtype and type as ``x``.

    Raises
    ------
    ValueError
        For an empty, 0-dimensional or non-finite ``x``, an argument out of range, a ``center``
        of the wrong shape or beyond the range of ``x.dtype``, or ``x - center`` beyond float64.

    Examples
    --------
    >>> fake_quantize(np.array([[0.0, 1.0, -0.6], [2.54, 0.01, 0.2]]), 8).round(4).tolist()
    [[0.0, 1.0, -0.6], [2.54, 0.0, 0.2]]
    """
    t, was_numpy, q, c, mask = _quantizer_args(x, bits, granularity, center, keep_channels)
    out = _fake_quantize(t, q, granularity, c, mask)
    return out.numpy() if was_numpy else out


def _max_rounding_error(x, bits: int, granularity: str = "tensor", *, center=None, keep_channels=None):
    """Worst-case error ``Δ/2`` of :func:`fake_quantize` (0 on kept channels), shape and type of ``x``."""
    t, was_numpy, q, c, mask = _quantizer_args(x, bits, granularity, center, keep_channels)
    y, _, _ = _centred(t, c)
    half = torch.broadcast_to(_scale_of(y, q, granularity, mask) / 2, t.shape).to(t.dtype)
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
    ValueError
        If the shapes differ, a tensor is empty or not finite, or a result overflows ``x.dtype``.

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
    """Bias ``b + W c`` of a linear layer whose centred input is quantised.

    ``W (Q(x - c) + c) + b = W Q(x - c) + (b + W c)``: centring costs nothing at inference.

    Parameters
    ----------
    weight : torch.Tensor, shape (out, in)
        Weight of ``y = W x + b`` (``nn.Linear`` layout).
    bias : torch.Tensor of shape (out,) or None
        Existing bias (``None`` means zero).
    center : torch.Tensor or numpy.ndarray, shape (in,)
        The centre ``c`` subtracted before quantisation.

    Returns
    -------
    torch.Tensor, shape (out,)
        ``b + W c``.

    Raises
    ------
    ValueError
        For a weight that is not 2-D, a wrong shape, or values (or ``b + W c``) beyond ``weight.dtype``.

    Examples
    --------
    >>> fold_center_into_bias(torch.tensor([[1.0, 2.0], [0.0, -1.0]]), None, torch.ones(2)).tolist()
    [3.0, -1.0]
    """
    _check_weight(weight, "weight")
    out = weight @ _channel_vector(center, weight.shape[1], weight, "center")
    if bias is not None:
        out = out + _channel_vector(bias, weight.shape[0], weight, "bias")
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            f"b + W c overflows {weight.dtype} (max {torch.finfo(weight.dtype).max:.4g}); the "
            f"folded bias cannot be stored in the layer's dtype: fold in a wider one "
            f"(weight.double()) or use a smaller center")
    return out


# --------------------------------------------------------------------------- deployable schemes
def _range_tensor(v, like: torch.Tensor, name: str) -> torch.Tensor:
    """A finite range end point as a tensor on the device and dtype of ``like``."""
    t = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v, dtype=np.float64))
    if not t.is_floating_point():
        t = t.double()
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    out = t.to(device=like.device, dtype=like.dtype)
    _check_cast(out, t, name)
    return out


def _quantize_range(y: torch.Tensor, bits: int, lo: torch.Tensor, hi: torch.Tensor,
                    symmetric: bool) -> torch.Tensor:
    """Fake-quantise ``y`` on the grid fixed by the range ``[lo, hi]`` (validated, broadcast)."""
    fmax = torch.finfo(y.dtype).max       # a grid point within a step beyond the range is its largest value
    if symmetric:
        q = 2 ** (bits - 1) - 1
        m = torch.maximum(lo.abs(), hi.abs())
        step = m / q
        out = y.div(torch.where(step > 0, step, torch.ones_like(step))).round().clamp(-q, q).mul(step)
        return torch.where(step > 0, out, y.clamp(-m, m)).clamp(-fmax, fmax)  # step 0: range (almost) 0
    levels = 2 ** bits - 1
    lo0, hi0 = torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi))
    step = (hi0 - lo0) / levels           # the grid contains 0 exactly (zero-point z)
    step = torch.where(torch.isfinite(step), step, hi0 / levels - lo0 / levels)  # hi - lo beyond fmax
    pos = torch.where(step > 0, step, torch.ones_like(step))
    z = (-lo0 / pos).round().clamp(0, levels)
    out = (y.div(pos).round() + z).clamp(0, levels).sub(z).mul(step)
    return torch.where(step > 0, out, y.clamp(lo0, hi0)).clamp(-fmax, fmax)


def _dynamic_range(x, granularity: str = "tensor"):
    """``(lo, hi)``: smallest and largest value of each group that shares a range; type of ``x``."""
    t, was_numpy = float_tensor(x)
    check_choice(granularity, "granularity", GRANULARITIES)
    lo, hi = _per_group(t, granularity, torch.amin), _per_group(t, granularity, torch.amax)
    return (lo.numpy(), hi.numpy()) if was_numpy else (lo, hi)


def quantize_with_range(x, bits: int, lo, hi, *, symmetric: bool = True):
    """Fake-quantise ``x`` on a grid fixed in advance by the range ``[lo, hi]`` (static scales).

    Parameters
    ----------
    x, bits
        As in :func:`fake_quantize`.
    lo, hi : float or array_like broadcastable to ``x``
        The calibrated range, ``lo ≤ hi``: a number, shape ``(d,)`` or ``x.shape[:-1] + (1,)``.
    symmetric : bool, default True
        ``True``: step ``max(|lo|, |hi|)/q`` on ``{-q, …, q}``.  ``False``: affine grid of
        ``2**bits`` levels with an integer zero-point (the range is widened to contain 0).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        Same shape, dtype and type as ``x``; values outside the range are clipped to it.

    Raises
    ------
    ValueError
        For a bad ``x`` or ``bits``, or a range that is not finite, does not broadcast, or has ``lo > hi``.

    Examples
    --------
    >>> quantize_with_range(np.array([[0.0, 1.0, 3.0]]), 2, 0.0, 3.0, symmetric=False).tolist()
    [[0.0, 1.0, 3.0]]
    """
    t, was_numpy = float_tensor(x)
    b = check_int(bits, "bits", 2, 16)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False, got {type(symmetric).__name__}")
    tw = t.to(_work_dtype(t.dtype))
    lo_t, hi_t = _range_tensor(lo, tw, "lo"), _range_tensor(hi, tw, "hi")
    try:
        torch.broadcast_shapes(lo_t.shape, hi_t.shape, tw.shape)
    except RuntimeError as exc:
        raise ValueError(f"lo {tuple(lo_t.shape)} and hi {tuple(hi_t.shape)} do not broadcast to x "
                         f"{tuple(tw.shape)}") from exc
    if bool((lo_t > hi_t).any()):
        raise ValueError("lo must not exceed hi")
    fmax = torch.finfo(t.dtype).max
    out = _quantize_range(tw, b, lo_t, hi_t, symmetric).clamp(-fmax, fmax).to(t.dtype)
    return out.numpy() if was_numpy else out


def quantize_weight(weight, bits: int, *, granularity: str = "channel", symmetric: bool = True):
    """Fake-quantised copy of a weight matrix ``(out, in)``.

    Parameters
    ----------
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
    bits, symmetric
        As in :func:`quantize_with_range`.
    granularity : {"channel", "tensor"}
        One range per output row (the usual weight scheme) or one for the matrix.

    Returns
    -------
    torch.Tensor or numpy.ndarray, shape (out, in)

    Raises
    ------
    TypeError, ValueError
        As :func:`quantize_with_range`; also for a matrix that is not 2-D or another granularity.

    Examples
    --------
    >>> quantize_weight(np.array([[1.0, -0.5], [0.2, 0.1]]), 2).tolist()
    [[1.0, -0.0], [0.2, 0.0]]
    """
    t, was_numpy = float_tensor(weight, "weight")
    if t.ndim != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {tuple(t.shape)}")
    if granularity not in ("channel", "tensor"):
        raise ValueError(
            f"weight granularity must be 'channel' (per output row) or 'tensor', got {granularity!r}")
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
        The layer's weight; ``max|W_j|`` is taken over column ``j``.
    alpha : float in [0, 1]
        Migration strength: 0 equalises only the weights, 1 moves all the activation range into them.

    Returns
    -------
    numpy.ndarray, shape (in,), float64
        Positive scales; 1 where ``max|X_j|`` or ``max|W_j|`` is 0.

    Raises
    ------
    TypeError, ValueError
        For arrays of the wrong shape, negative or non-finite ranges, or ``alpha`` outside [0, 1].

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


def hadamard_matrix(n: int) -> np.ndarray:
    """Sylvester's normalised Hadamard matrix of order ``n`` (a power of two): entries ``±1/sqrt(n)``.

    Parameters
    ----------
    n : int
        The order, a power of two (>= 1).

    Returns
    -------
    numpy.ndarray, shape (n, n), float64
        An orthogonal, symmetric matrix.

    Raises
    ------
    TypeError, ValueError
        If ``n`` is not a positive integer power of two.

    Examples
    --------
    >>> (hadamard_matrix(2) * np.sqrt(2)).tolist()
    [[1.0, 1.0], [1.0, -1.0]]
    """
    n = check_int(n, "n", 1)
    if n & (n - 1):
        raise ValueError(f"n must be a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def random_rotation(d: int, seed: int = 0) -> np.ndarray:
    """A random orthogonal matrix built on a Hadamard matrix: ``diag(±1) · (H_{2^k} ⊗ O_m)``.

    ``d = 2^k m`` with ``m`` odd; ``H`` is :func:`hadamard_matrix`, ``O_m`` a Haar-random orthogonal
    ``m × m`` matrix and the signs are random (the randomised Hadamard rotation of QuaRot-style
    quantisation, extended to dimensions that are not powers of two).  Multiplying the input of a
    linear layer by it and the weight by the same matrix, ``(xR)(WR)^T = x W^T``, leaves the layer's
    output unchanged while spreading a large channel over many.

    Parameters
    ----------
    d : int
        Dimension (>= 1).
    seed : int, default 0

    Returns
    -------
    numpy.ndarray, shape (d, d), float64
        An orthogonal matrix.

    Raises
    ------
    TypeError, ValueError
        If ``d`` or ``seed`` is not a valid integer.

    Examples
    --------
    >>> r = random_rotation(12, seed=1)
    >>> bool(np.allclose(r @ r.T, np.eye(12)))
    True
    """
    d = check_int(d, "d", 1)
    gen = np.random.default_rng(check_int(seed, "seed", 0))
    k = (d & -d)                                           # the largest power of two dividing d
    m = d // k
    q, r = np.linalg.qr(gen.standard_normal((m, m)))
    q = q * np.sign(np.where(np.diag(r) == 0, 1.0, np.diag(r)))   # Haar measure
    signs = gen.choice([-1.0, 1.0], size=d)
    return signs[:, None] * np.kron(hadamard_matrix(k), q)
