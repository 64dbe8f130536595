"""LayerNorm and RMSNorm as plain functions (NumPy, float64), with their exact Jacobians.

The objects of the chapter :doc:`/book/layernorm_geometry`, which derives the Jacobians, their spectra and
the gain bounds; conventions follow PyTorch (population variance, ``eps`` inside the square root), and
:func:`autograd_jacobian` checks the formulas against it.
"""

from __future__ import annotations

import numpy as np

from companion._validation import check_real, real_array

__all__ = [
    "layernorm", "rmsnorm", "layernorm_jacobian", "rmsnorm_jacobian", "gain_jacobian_norm_bounds",
    "autograd_jacobian"]


def _as_float_array(x, name: str = "x", *, one_d: bool = False) -> np.ndarray:
    """``x`` as a finite float64 array with a non-empty feature axis (1-D if ``one_d``)."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}") from exc
    if one_d and arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D vector (one token's features), got shape {arr.shape}; "
                         "pass a single row, e.g. x[i]")
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the feature axis), got a scalar")
    if arr.shape[-1] < 1:
        raise ValueError(f"{name} has an empty feature axis (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values; clean the input first")
    return arr


def _check_affine(param, d: int, name: str) -> np.ndarray | None:
    """``None`` or the real array of shape (d,)."""
    return None if param is None else real_array(name, param, shape=(d,))


def _batch(x, kind: str, kinds: tuple[str, str], eps) -> tuple[np.ndarray, float]:
    """Check ``kind`` (one of ``kinds``), ``eps`` and a 1-D/2-D ``x``; return (x, eps)."""
    if kind not in kinds:
        raise ValueError(f"kind must be {kinds[0]!r} or {kinds[1]!r}, got {kind!r}")
    eps = check_real(eps, "eps", lo=0.0)
    arr = _as_float_array(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be a 1-D vector or a 2-D batch of rows, got shape {arr.shape}")
    return arr, eps


def _centred_scale(x: np.ndarray, eps: float, centre: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (y, s, m): y = (x - mean)/m (or x/m), s = sqrt(mean(y**2) + eps/m**2), over the last axis.

    ``m`` is 1, or a row's scale max(max|x|, sqrt(eps)) if beyond 1e+-150 (where y * y under/overflows).
    """
    m = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), np.sqrt(eps))
    m = np.where((m == 0) | ((m >= 1e-150) & (m <= 1e150)), 1.0, m)
    x = x / m
    y = x - x.mean(axis=-1, keepdims=True) if centre else x
    s2 = np.mean(y * y, axis=-1, keepdims=True) + eps / m / m
    if np.any(s2 <= 0):
        what = "constant (zero variance)" if centre else "all zero"
        raise ValueError(f"input is {what} along the feature axis and eps = 0, so the normalisation "
                         "divides by zero; use eps > 0 or a non-degenerate input")
    return y, np.sqrt(s2), m


def layernorm(x, eps: float = 1e-5, gamma=None, beta=None) -> np.ndarray:
    r"""LayerNorm over the last axis: :math:`\gamma\odot(x-\bar x)/\sqrt{\mathrm{var}(x)+\epsilon}+\beta`.

    Parameters
    ----------
    x : array_like, shape (..., d)
        Input; every row (last axis) is normalised separately.
    eps : float, default 1e-5
        Added to the population variance inside the square root.
    gamma, beta : array_like of shape (d,), optional
        Gain and bias; ``None`` means 1 and 0.

    Returns
    -------
    numpy.ndarray, shape (..., d), float64
        The normalised rows (mean 0, norm :math:`\sqrt d` without affine parameters and ``eps`` = 0).

    Raises
    ------
    TypeError, ValueError
        If an argument is not real (TypeError) or is out of range, or a row is constant with ``eps = 0``.

    Examples
    --------
    >>> round(float(np.linalg.norm(layernorm([1.0, 2.0, 3.0, 6.0], eps=0.0)) ** 2), 6)   # d = 4
    4.0
    """
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x)
    d = x.shape[-1]
    gamma, beta = _check_affine(gamma, d, "gamma"), _check_affine(beta, d, "beta")
    y, s, _ = _centred_scale(x, eps, centre=True)
    out = y / s if gamma is None else y / s * gamma
    return out if beta is None else out + beta


def rmsnorm(x, eps: float = 1e-5, gamma=None) -> np.ndarray:
    r"""Root-mean-square normalisation over the last axis: :math:`\gamma\odot x/\sqrt{\|x\|^2/d+\epsilon}`.

    Parameters
    ----------
    x, eps, gamma : array_like, float, array_like or None
        As in :func:`layernorm` (``eps`` is added to the mean square).

    Returns
    -------
    numpy.ndarray, shape (..., d), float64
        The normalised rows (norm :math:`\sqrt d` with ``eps`` = 0; no centring).

    Raises
    ------
    TypeError, ValueError
        As :func:`layernorm` (a degenerate row is all zero).

    Examples
    --------
    >>> [round(float(v), 4) for v in rmsnorm([3.0, 4.0], eps=0.0)]
    [0.8485, 1.1314]
    """
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x)
    gamma = _check_affine(gamma, x.shape[-1], "gamma")
    y, s, _ = _centred_scale(x, eps, centre=False)
    return y / s if gamma is None else y / s * gamma


def _jacobian(x, eps, gamma, centre: bool) -> np.ndarray:
    """Check a 1-D point, ``eps`` and gain; the Jacobian of LayerNorm (``centre``) or RMSNorm there."""
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x, one_d=True)
    gamma = _check_affine(gamma, x.shape[0], "gamma")
    d = x.shape[0]
    y, s, m = _centred_scale(x, eps, centre=centre)
    s, m = float(s[0]), float(m[0])
    J = ((np.eye(d) - 1.0 / d if centre else np.eye(d)) - np.outer(y, y) / (d * s * s)) / (m * s)
    return J if gamma is None else gamma[:, None] * J


def layernorm_jacobian(x, eps: float = 0.0, gamma=None) -> np.ndarray:
    r"""Exact Jacobian of LayerNorm at a 1-D input, without affine parameters or with a gain.

    Parameters
    ----------
    x : array_like, shape (d,)
    eps, gamma : float (default 0.0), array_like or None
        As in :func:`layernorm`; a gain makes the Jacobian :math:`\operatorname{diag}(\gamma)J`.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64
        ``J[i, j] = d LN(x)_i / d x_j`` :math:`=\frac1s(P-\frac{yy^\top}{ds^2})`, :math:`y=Px`.

    Raises
    ------
    TypeError, ValueError
        As :func:`layernorm`, or if ``x`` is not 1-D.

    Examples
    --------
    >>> round(float(np.linalg.norm(layernorm_jacobian([1.0, 2.0, 3.0, 6.0]), 2)), 4)   # 1 / std(x)
    0.5345
    """
    return _jacobian(x, eps, gamma, centre=True)


def rmsnorm_jacobian(x, eps: float = 0.0, gamma=None) -> np.ndarray:
    r"""Exact Jacobian of RMSNorm at a 1-D input, without gain or with a gain.

    Parameters
    ----------
    x, eps, gamma : array_like, float, array_like or None
        As in :func:`layernorm_jacobian`.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64
        :math:`J=\frac1r(I-\frac{xx^\top}{dr^2})`, :math:`r=\sqrt{\|x\|^2/d+\epsilon}`.

    Raises
    ------
    TypeError, ValueError
        As :func:`rmsnorm`, or if ``x`` is not 1-D.

    Examples
    --------
    >>> np.allclose(rmsnorm_jacobian([3.0, 4.0]) @ np.array([3.0, 4.0]), 0.0)
    True
    """
    return _jacobian(x, eps, gamma, centre=False)


def gain_jacobian_norm_bounds(x, gamma, kind: str = "rmsnorm",
                              eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Bound the spectral norm of a normalisation's Jacobian with a learned gain.

    Parameters
    ----------
    x, gamma : array_like, shape (d,) or (n, d), and shape (d,)
        One input or a batch of rows, and the gain.
    kind : {"rmsnorm", "layernorm"}
        Which normalisation (a LayerNorm bias does not change the Jacobian).
    eps : float, default 0.0
        As in :func:`layernorm`.

    Returns
    -------
    tuple of numpy.ndarray
        ``(g_(m+1) / s, g_(1) / s)`` per row (0-d for one input): ``g_(k)`` are the sorted ``|gamma_j|``,
        ``s`` the row's normaliser, ``m`` = 1 (RMSNorm) or 2 (LayerNorm).

    Raises
    ------
    TypeError, ValueError
        As :func:`layernorm` (``gamma`` None included), or if ``kind`` is unknown or ``d <= m``.

    Examples
    --------
    >>> x, g = np.array([3.0, -1.0, 2.0, 0.5]), np.array([2.0, 1.5, 0.5, 1.0])
    >>> lo, hi = gain_jacobian_norm_bounds(x, g)
    >>> bool(lo <= np.linalg.norm(rmsnorm_jacobian(x, gamma=g), 2) <= hi)
    True
    """
    arr, eps = _batch(x, kind, ("rmsnorm", "layernorm"), eps)
    d = arr.shape[-1]
    if gamma is None:
        raise TypeError("gamma must be an array of shape (d,), got None")
    g = np.sort(np.abs(_check_affine(gamma, d, "gamma")))[::-1]
    m = 1 if kind == "rmsnorm" else 2
    if d <= m:
        raise ValueError(f"the feature axis must be longer than {m} for {kind}, got d = {d}")
    _, s, scale = _centred_scale(arr, eps, centre=(kind == "layernorm"))
    s = (scale * s)[..., 0]
    return g[m] / s, g[0] / s


def autograd_jacobian(x, kind: str = "layernorm", eps: float = 0.0) -> np.ndarray:
    """Jacobian of PyTorch's own normalisation at ``x``, by automatic differentiation.

    Parameters
    ----------
    x : array_like, shape (d,) or (n, d)
        One point or ``n`` points (rows); float64.
    kind : {"layernorm", "rmsnorm"}
        ``torch.nn.functional.layer_norm`` or ``rms_norm``, no affine parameters.
    eps : float, default 0.0
        As in :func:`layernorm`.

    Returns
    -------
    numpy.ndarray, shape (d, d) or (n, d, d), float64
        ``J[..., i, j] = d f(x)_i / d x_j`` (one backward pass per point).

    Raises
    ------
    TypeError, ValueError
        As :func:`layernorm`, if ``kind`` is unknown, ``x`` is not 1-D/2-D, or a row's scale is beyond
        :math:`10^{\pm150}`.

    Examples
    --------
    >>> np.allclose(autograd_jacobian([1.0, 2.0, 6.0]), layernorm_jacobian([1.0, 2.0, 6.0]))
    True
    """
    import torch

    arr, eps = _batch(x, kind, ("layernorm", "rmsnorm"), eps)
    _, _, scale = _centred_scale(arr, eps, centre=(kind == "layernorm"))  # raises on a degenerate row
    if (scale != 1.0).any():  # PyTorch squares x: its Jacobian is silently 0 or NaN there
        raise ValueError("a row's scale max(|x|, sqrt(eps)) is beyond 1e+-150, where PyTorch's normalisation "
                         "overflows or underflows; use layernorm_jacobian / rmsnorm_jacobian (exact there)")
    batch = arr.reshape(-1, arr.shape[-1])
    n, d = batch.shape
    norm = torch.nn.functional.layer_norm if kind == "layernorm" else torch.nn.functional.rms_norm
    copies = torch.from_numpy(batch)[:, None, :].expand(n, d, d).clone().requires_grad_(True)
    out = norm(copies, (d,), eps=eps)                                  # out[k, i] = f(x_k)
    eye = torch.eye(d, dtype=torch.float64).expand(n, d, d)
    (jac,) = torch.autograd.grad(out, copies, grad_outputs=eye)       # jac[k, i, :] = grad of f(x_k)_i
    jac = jac.numpy()
    return jac[0] if arr.ndim == 1 else jac
