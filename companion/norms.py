"""LayerNorm and RMSNorm as plain functions, with their analytic Jacobians.

The functions here are the mathematical objects of the chapter *LayerNorm geometry*:

* :func:`layernorm` and :func:`rmsnorm` normalise the last axis of an array (NumPy, float64);
* :func:`layernorm_jacobian` and :func:`rmsnorm_jacobian` return the exact ``d x d`` Jacobian
  of the normalisation without affine parameters at a 1-D input;
* :func:`autograd_jacobian` computes the same matrices (for one vector or a batch) by
  differentiating PyTorch's own ``torch.nn.functional.layer_norm`` / ``rms_norm``, an
  independent implementation used to check the formulas.

Conventions follow PyTorch: the variance is the population variance (divide by ``d``) and
``eps`` is added to it inside the square root.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "layernorm",
    "rmsnorm",
    "layernorm_jacobian",
    "rmsnorm_jacobian",
    "autograd_jacobian",
]


# --------------------------------------------------------------------------- validation
def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def _as_float_array(x, name: str = "x", *, one_d: bool = False) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}") from exc
    if one_d and arr.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D vector (one token's features), got shape {arr.shape}; "
            "pass a single row, e.g. x[i]"
        )
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the feature axis), got a scalar")
    if arr.shape[-1] < 1:
        raise ValueError(f"{name} has an empty feature axis (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values; clean the input first")
    return arr


def _check_affine(param, d: int, name: str) -> np.ndarray | None:
    if param is None:
        return None
    arr = _as_float_array(param, name)
    if arr.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},) to match the feature axis, got {arr.shape}")
    return arr


def _centred_scale(x: np.ndarray, eps: float, centre: bool) -> tuple[np.ndarray, np.ndarray]:
    """Return (y, s): y = x - mean (or x), s = sqrt(mean(y**2) + eps), over the last axis."""
    y = x - x.mean(axis=-1, keepdims=True) if centre else x
    s2 = np.mean(y * y, axis=-1, keepdims=True) + eps
    if np.any(s2 <= 0):
        what = "constant (zero variance)" if centre else "all zero"
        raise ValueError(
            f"input is {what} along the feature axis and eps = 0, so the normalisation divides "
            "by zero; use eps > 0 or a non-degenerate input"
        )
    return y, np.sqrt(s2)


# --------------------------------------------------------------------------- functions
def layernorm(x, eps: float = 1e-5, gamma=None, beta=None) -> np.ndarray:
    r"""Layer normalisation over the last axis.

    Parameters
    ----------
    x : array_like, shape (..., d)
        Input; every row (last axis) is normalised separately.
    eps : float, default 1e-5
        Added to the population variance inside the square root (PyTorch's convention).
    gamma : array_like of shape (d,), optional
        Gain (elementwise scale); ``None`` means 1.
    beta : array_like of shape (d,), optional
        Bias; ``None`` means 0.

    Returns
    -------
    numpy.ndarray, shape (..., d), float64

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is a scalar or contains NaN/inf, ``eps`` < 0, ``gamma``/``beta`` do not have
        shape ``(d,)``, or a row is constant while ``eps`` = 0.

    Notes
    -----
    .. math:: \mathrm{LN}(x) = \gamma \odot \frac{x - \bar x \mathbf 1}{\sqrt{\tfrac1d\|x - \bar x\mathbf 1\|^2 + \epsilon}} + \beta,

    as in :cite:t:`ba2016layernorm` and ``torch.nn.functional.layer_norm``.  Without affine
    parameters and with ``eps`` = 0 every output row has mean 0 and Euclidean norm
    :math:`\sqrt d`.

    Examples
    --------
    >>> y = layernorm([1.0, 2.0, 3.0, 6.0], eps=0.0)
    >>> [round(float(v), 4) for v in y]
    [-1.069, -0.5345, 0.0, 1.6036]
    >>> round(float(np.linalg.norm(y) ** 2), 6)
    4.0
    """
    eps = _check_eps(eps)
    x = _as_float_array(x)
    d = x.shape[-1]
    gamma = _check_affine(gamma, d, "gamma")
    beta = _check_affine(beta, d, "beta")
    y, s = _centred_scale(x, eps, centre=True)
    out = y / s
    if gamma is not None:
        out = out * gamma
    if beta is not None:
        out = out + beta
    return out


def rmsnorm(x, eps: float = 1e-5, gamma=None) -> np.ndarray:
    r"""Root-mean-square normalisation over the last axis.

    Parameters
    ----------
    x : array_like, shape (..., d)
        Input; every row (last axis) is normalised separately.
    eps : float, default 1e-5
        Added to the mean square inside the square root (``torch.nn.functional.rms_norm``).
    gamma : array_like of shape (d,), optional
        Gain (elementwise scale); ``None`` means 1.

    Returns
    -------
    numpy.ndarray, shape (..., d), float64

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is a scalar or contains NaN/inf, ``eps`` < 0, ``gamma`` does not have shape
        ``(d,)``, or a row is all zero while ``eps`` = 0.

    Notes
    -----
    .. math:: \mathrm{RMS}(x) = \gamma \odot \frac{x}{\sqrt{\tfrac1d\|x\|^2 + \epsilon}}
       \qquad\text{(no centring, no bias; } :cite:t:`zhang2019rmsnorm` \text{).}

    With ``eps`` = 0 every output row has norm :math:`\sqrt d`, but its mean is not zero.

    Examples
    --------
    >>> y = rmsnorm([3.0, 4.0], eps=0.0)
    >>> [round(float(v), 4) for v in y]
    [0.8485, 1.1314]
    """
    eps = _check_eps(eps)
    x = _as_float_array(x)
    gamma = _check_affine(gamma, x.shape[-1], "gamma")
    _, s = _centred_scale(x, eps, centre=False)
    out = x / s
    return out * gamma if gamma is not None else out


def layernorm_jacobian(x, eps: float = 0.0) -> np.ndarray:
    r"""Exact Jacobian of LayerNorm (no affine parameters) at a 1-D input.

    Parameters
    ----------
    x : array_like, shape (d,)
        The point at which to differentiate.
    eps : float, default 0.0
        Variance epsilon, as in :func:`layernorm`.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64
        ``J[i, j] = d LN(x)_i / d x_j``.

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is not 1-D, contains NaN/inf, is constant while ``eps`` = 0, or ``eps`` < 0.

    Notes
    -----
    With :math:`P = I - \tfrac1d \mathbf 1\mathbf 1^\top`, :math:`y = Px`,
    :math:`s = \sqrt{\|y\|^2/d + \epsilon}`:

    .. math:: J = \frac1s\Big(P - \frac{y y^\top}{d\, s^2}\Big).

    It is symmetric; :math:`J\mathbf 1 = 0`; on the remaining :math:`d-2` directions
    orthogonal to :math:`\mathbf 1` and :math:`y` it multiplies by :math:`1/s`; along
    :math:`y` it multiplies by :math:`\epsilon / s^3` (0 when :math:`\epsilon = 0`).  Hence
    :math:`\|J\|_2 = 1/s = \sqrt d/\|y\|` for :math:`\epsilon = 0` (Xiong et al. 2020,
    supplement to Lemma 3).

    Examples
    --------
    >>> J = layernorm_jacobian([1.0, 2.0, 3.0, 6.0])
    >>> np.allclose(J.sum(axis=1), 0.0)
    True
    >>> round(float(np.linalg.norm(J, 2)), 4)   # 1 / std(x) = 1 / 1.8708
    0.5345
    """
    eps = _check_eps(eps)
    x = _as_float_array(x, one_d=True)
    d = x.shape[0]
    y, s = _centred_scale(x, eps, centre=True)
    s = float(s[0])
    P = np.eye(d) - 1.0 / d
    return (P - np.outer(y, y) / (d * s * s)) / s


def rmsnorm_jacobian(x, eps: float = 0.0) -> np.ndarray:
    r"""Exact Jacobian of RMSNorm (no gain) at a 1-D input.

    Parameters
    ----------
    x : array_like, shape (d,)
        The point at which to differentiate.
    eps : float, default 0.0
        Epsilon added to the mean square, as in :func:`rmsnorm`.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is not 1-D, contains NaN/inf, is all zero while ``eps`` = 0, or ``eps`` < 0.

    Notes
    -----
    With :math:`r = \sqrt{\|x\|^2/d + \epsilon}`:

    .. math:: J = \frac1r\Big(I - \frac{x x^\top}{d\, r^2}\Big).

    Eigenvalue :math:`1/r` on the :math:`d-1` directions orthogonal to :math:`x`, and
    :math:`\epsilon/r^3` along :math:`x`.  There is no centring, so :math:`J\mathbf 1 \neq 0`
    in general.

    Examples
    --------
    >>> J = rmsnorm_jacobian([3.0, 4.0])
    >>> np.allclose(J @ np.array([3.0, 4.0]), 0.0)
    True
    """
    eps = _check_eps(eps)
    x = _as_float_array(x, one_d=True)
    d = x.shape[0]
    _, r = _centred_scale(x, eps, centre=False)
    r = float(r[0])
    return (np.eye(d) - np.outer(x, x) / (d * r * r)) / r


def autograd_jacobian(x, kind: str = "layernorm", eps: float = 0.0) -> np.ndarray:
    """Jacobian of PyTorch's own normalisation at ``x``, by automatic differentiation.

    Parameters
    ----------
    x : array_like, shape (d,) or (n, d)
        The point (or ``n`` points, one per row) at which to differentiate; float64.
    kind : {"layernorm", "rmsnorm"}
        ``torch.nn.functional.layer_norm`` or ``torch.nn.functional.rms_norm``, no affine.
    eps : float, default 0.0

    Returns
    -------
    numpy.ndarray, shape (d, d) or (n, d, d), float64
        ``J[..., i, j] = d f(x)_i / d x_j``.

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``kind`` is unknown, ``x`` is not 1-D or 2-D, contains NaN/inf, ``eps`` < 0, or a
        row is degenerate (constant for LayerNorm, zero for RMSNorm) while ``eps`` = 0.

    Notes
    -----
    Reverse-mode autograd through PyTorch's kernels: the input is copied ``d`` times and one
    backward pass with the identity as output gradient returns all rows of the Jacobian at
    once.  This is an implementation independent of the closed forms in
    :func:`layernorm_jacobian` and :func:`rmsnorm_jacobian`, which the tests compare.

    Examples
    --------
    >>> x = [1.0, 2.0, 3.0, 6.0]
    >>> np.allclose(autograd_jacobian(x), layernorm_jacobian(x))
    True
    >>> autograd_jacobian(np.random.default_rng(0).normal(size=(5, 4)), "rmsnorm").shape
    (5, 4, 4)
    """
    import torch

    if kind not in ("layernorm", "rmsnorm"):
        raise ValueError(f"kind must be 'layernorm' or 'rmsnorm', got {kind!r}")
    eps = _check_eps(eps)
    arr = _as_float_array(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be a 1-D vector or a 2-D batch of rows, got shape {arr.shape}")
    _centred_scale(arr, eps, centre=(kind == "layernorm"))  # raises on a degenerate row
    batch = arr.reshape(-1, arr.shape[-1])
    n, d = batch.shape
    norm = torch.nn.functional.layer_norm if kind == "layernorm" else torch.nn.functional.rms_norm
    copies = torch.from_numpy(batch)[:, None, :].expand(n, d, d).clone().requires_grad_(True)
    out = norm(copies, (d,), eps=eps)                                  # out[k, i] = f(x_k)
    eye = torch.eye(d, dtype=torch.float64).expand(n, d, d)
    (jac,) = torch.autograd.grad(out, copies, grad_outputs=eye)       # jac[k, i, :] = grad of f(x_k)_i
    jac = jac.numpy()
    return jac[0] if arr.ndim == 1 else jac
