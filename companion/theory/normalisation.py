"""LayerNorm and RMSNorm as plain functions, with their analytic Jacobians.

The functions here are the mathematical objects of the chapter *LayerNorm geometry*:

* :func:`layernorm` and :func:`rmsnorm` normalise the last axis of an array (NumPy, float64);
* :func:`layernorm_jacobian` and :func:`rmsnorm_jacobian` return the exact ``d x d`` Jacobian
  of the normalisation at a 1-D input, without affine parameters or with a gain ``gamma``;
* :func:`gain_jacobian_norm_bounds` brackets the spectral norm of that Jacobian with a gain,
  ``gamma_(m+1) / s <= ||J|| <= max|gamma| / s``, for one input or a batch of rows;
* :func:`autograd_jacobian` computes the same matrices (for one vector or a batch) by
  differentiating PyTorch's own ``torch.nn.functional.layer_norm`` / ``rms_norm``, an
  independent implementation used to check the formulas.

Conventions follow PyTorch: the variance is the population variance (divide by ``d``) and
``eps`` is added to it inside the square root.
"""

from __future__ import annotations


import numpy as np

from companion._validation import check_real, real_array

__all__ = [
    "layernorm",
    "rmsnorm",
    "layernorm_jacobian",
    "rmsnorm_jacobian",
    "gain_jacobian_norm_bounds",
    "autograd_jacobian",
]


# --------------------------------------------------------------------------- validation
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
    return None if param is None else real_array(name, param, shape=(d,))


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
    eps = check_real(eps, "eps", lo=0.0)
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
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x)
    gamma = _check_affine(gamma, x.shape[-1], "gamma")
    _, s = _centred_scale(x, eps, centre=False)
    out = x / s
    return out * gamma if gamma is not None else out


def layernorm_jacobian(x, eps: float = 0.0, gamma=None) -> np.ndarray:
    r"""Exact Jacobian of LayerNorm at a 1-D input, without affine parameters or with a gain.

    Parameters
    ----------
    x : array_like, shape (d,)
        The point at which to differentiate.
    eps : float, default 0.0
        Variance epsilon, as in :func:`layernorm`.
    gamma : array_like of shape (d,), optional
        Gain; the Jacobian is then :math:`\operatorname{diag}(\gamma)\,J` (a bias does not
        change it). ``None`` means no gain.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64
        ``J[i, j] = d LN(x)_i / d x_j``.

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is not 1-D, contains NaN/inf, is constant while ``eps`` = 0, ``eps`` < 0, or
        ``gamma`` does not have shape ``(d,)``.

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
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x, one_d=True)
    d = x.shape[0]
    gamma = _check_affine(gamma, d, "gamma")
    y, s = _centred_scale(x, eps, centre=True)
    s = float(s[0])
    P = np.eye(d) - 1.0 / d
    J = (P - np.outer(y, y) / (d * s * s)) / s
    return J if gamma is None else gamma[:, None] * J


def rmsnorm_jacobian(x, eps: float = 0.0, gamma=None) -> np.ndarray:
    r"""Exact Jacobian of RMSNorm at a 1-D input, without gain or with a gain.

    Parameters
    ----------
    x : array_like, shape (d,)
        The point at which to differentiate.
    eps : float, default 0.0
        Epsilon added to the mean square, as in :func:`rmsnorm`.
    gamma : array_like of shape (d,), optional
        Gain; the Jacobian is then :math:`\operatorname{diag}(\gamma)\,J`. ``None`` means no
        gain.

    Returns
    -------
    numpy.ndarray, shape (d, d), float64

    Raises
    ------
    TypeError
        If ``x`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``x`` is not 1-D, contains NaN/inf, is all zero while ``eps`` = 0, ``eps`` < 0, or
        ``gamma`` does not have shape ``(d,)``.

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
    eps = check_real(eps, "eps", lo=0.0)
    x = _as_float_array(x, one_d=True)
    d = x.shape[0]
    gamma = _check_affine(gamma, d, "gamma")
    _, r = _centred_scale(x, eps, centre=False)
    r = float(r[0])
    J = (np.eye(d) - np.outer(x, x) / (d * r * r)) / r
    return J if gamma is None else gamma[:, None] * J


def gain_jacobian_norm_bounds(x, gamma, kind: str = "rmsnorm",
                              eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    r"""Bounds on the spectral norm of a normalisation's Jacobian with a learned gain.

    Parameters
    ----------
    x : array_like, shape (d,) or (n, d)
        The input (one token) or a batch of inputs, one per row.
    gamma : array_like, shape (d,)
        The gain of the normalisation.
    kind : {"rmsnorm", "layernorm"}
        Which normalisation; a LayerNorm bias does not change the Jacobian.
    eps : float, default 0.0
        Epsilon inside the square root, as in :func:`rmsnorm` / :func:`layernorm`.

    Returns
    -------
    (lower, upper) : tuple of numpy.ndarray
        Arrays of the shape of ``x`` without its last axis (0-d for one input):
        ``lower = g_(m+1) / s`` and ``upper = g_(1) / s``, where ``g_(1) >= g_(2) >= ...`` are
        the sorted ``|gamma_j|``, ``s`` is the normaliser of the row
        (:math:`\sqrt{\|x\|^2/d + \epsilon}` for RMSNorm, :math:`\sqrt{\mathrm{std}(x)^2 + \epsilon}`
        for LayerNorm) and ``m`` = 1 (RMSNorm) or 2 (LayerNorm).

    Raises
    ------
    TypeError
        If ``x`` or ``gamma`` is not numeric or ``eps`` is not a real number.
    ValueError
        If ``kind`` is unknown, ``x`` is not 1-D or 2-D, ``gamma`` does not have shape ``(d,)``,
        ``d <= m``, an input contains NaN/inf, ``eps`` < 0, or a row is degenerate (zero for
        RMSNorm, constant for LayerNorm) while ``eps`` = 0.

    Notes
    -----
    The Jacobian is :math:`J = \Gamma J_0` with :math:`\Gamma = \operatorname{diag}(\gamma)` and
    :math:`J_0` the Jacobian without gain, which is :math:`1/s` times the identity on a subspace
    :math:`U` of codimension :math:`m` (the complement of :math:`x`, or of :math:`\mathbf 1` and
    the centred :math:`x`) and at most :math:`1/s` on its complement. Hence
    :math:`\|J\| \le \|\Gamma\|\,\|J_0\| = g_{(1)}/s`, and, restricting to :math:`U`,
    :math:`\|J\| \ge \|\Gamma P_U\|/s \ge g_{(m+1)}/s` by Cauchy's interlacing theorem
    (:math:`P_U \Gamma^2 P_U` is a compression of :math:`\Gamma^2` to codimension :math:`m`).
    So :math:`\|J\| = \max_j|\gamma_j|/s` up to the gap between the largest gains.

    Examples
    --------
    >>> x, g = np.array([3.0, -1.0, 2.0, 0.5]), np.array([2.0, 1.5, 0.5, 1.0])
    >>> lo, hi = gain_jacobian_norm_bounds(x, g)
    >>> exact = np.linalg.norm(rmsnorm_jacobian(x, gamma=g), 2)
    >>> bool(lo <= exact <= hi)
    True
    """
    if kind not in ("rmsnorm", "layernorm"):
        raise ValueError(f"kind must be 'rmsnorm' or 'layernorm', got {kind!r}")
    eps = check_real(eps, "eps", lo=0.0)
    arr = _as_float_array(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be a 1-D vector or a 2-D batch of rows, got shape {arr.shape}")
    d = arr.shape[-1]
    if gamma is None:
        raise TypeError("gamma must be an array of shape (d,), got None")
    g = np.sort(np.abs(_check_affine(gamma, d, "gamma")))[::-1]
    m = 1 if kind == "rmsnorm" else 2
    if d <= m:
        raise ValueError(f"the feature axis must be longer than {m} for {kind}, got d = {d}")
    _, s = _centred_scale(arr, eps, centre=(kind == "layernorm"))
    s = s[..., 0]
    return g[m] / s, g[0] / s


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
    eps = check_real(eps, "eps", lo=0.0)
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
