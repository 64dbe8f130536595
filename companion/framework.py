"""The three-effect framework: perturbation metrics, linearised predictions, the window.

This module holds the analysis behind the chapter *The three-effect framework*
(``book/three_effect_framework.ipynb``).  The metrics, predictions and windows are numpy
functions of stream arrays (numpy arrays or torch tensors), so that they apply equally to random
stacks, small trained stacks (:mod:`companion.stacks`) and real models (:mod:`companion.probes`);
:func:`stack_injection_sweep` and :func:`sharpen_attention` run stacks and so use torch (imported
inside those functions: importing this module does not load torch).

Conventions
-----------
A *stream pair* is two arrays ``base`` and ``inj`` of the same shape ``[L+1, ..., d]``:
index ``l`` along the first axis is the residual stream *before* block ``l`` (index 0 is the
input, index ``L`` the output of the last block), the last axis is the model width ``d``, and
the axes in between (batch, tokens, ...) are arbitrary.  ``inj`` is the run in which a vector
was added to the stream at some layer; ``base`` is the run without it.  The difference is
``delta = inj - base``.

Public functions
----------------
perturbation_metrics
    Projection on the injected direction, cos(delta, v), ||delta||, ||delta||/||h_base||,
    cos(h_inj, h_base) and the norm ratio, per layer (the metric definitions shared with the
    real-model injection chapter).
normalisation_scale
    sqrt(Var(x) + eps) along the last axis: the scale that LayerNorm divides by.
postln_contraction_factors, predicted_projection
    The linearised Post-LN prediction: the component of delta along v is multiplied by
    (v'diag(gamma)v)/std(h + F(h)) at every LayerNorm.
fit_norm_growth, dilution_factor
    The Pre-LN dilution law ||h_l||^2 ~ ||h_0||^2 (1 + c l) and the relative-size factor
    sqrt((1 + c l)/(1 + c m)) that follows from it.
injection_window, predicted_window
    The operational "window": the injection layers whose output effect is at least a stated
    fraction of the largest one, with its position as a fraction of depth; and the window
    that the two first-order laws predict for the readable projection.
sharpen_attention
    Re-draw the query and key maps of a random stack's attention so that its logits have a
    chosen spread (large spread: the chaotic regime in which nearby runs separate).
random_direction, stack_injection_sweep
    A seeded random unit direction orthogonal to the all-ones vector, and the injection sweep
    over layers of a :class:`companion.stacks.ResidualStack` or ``TinyLM`` (baseline run
    once, one injected run per layer, every metric above per layer and position, the output
    change, the next-token KL divergence for a language model, and the skip-path prediction
    of the projection).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import as_float64, check_int, check_real

__all__ = [
    "METRIC_NAMES",
    "EFFECT_KINDS",
    "perturbation_metrics",
    "normalisation_scale",
    "postln_contraction_factors",
    "predicted_projection",
    "fit_norm_growth",
    "dilution_factor",
    "Window",
    "injection_window",
    "predicted_window",
    "random_direction",
    "sharpen_attention",
    "InjectionSweep",
    "stack_injection_sweep",
    "unit_vectors",
]

#: Output effects an :class:`InjectionSweep` can report (see :meth:`InjectionSweep.effect`).
EFFECT_KINDS = ("output_change", "output_projection", "kl")

#: Keys of the dictionary returned by :func:`perturbation_metrics`, in a stable order.
METRIC_NAMES = (
    "projection",
    "cos_delta_v",
    "delta_norm",
    "relative_size",
    "cos_inj_base",
    "norm_ratio",
)


# --------------------------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------------------------


def _check_finite(arr: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(
            f"{name} contains {bad} NaN or infinite value(s); check the forward pass that "
            "produced it (overflow in a deep stack?) or remove those entries"
        )


def unit_vectors(v: np.ndarray, flat: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(v / ||v||, ||v|| == 0)`` along the last axis, whatever the magnitude of ``v``.

    Each vector is first divided by a power of two close to its largest entry (exact), so
    ``||v||`` neither underflows (entries near 1e-200: "zero vector") nor overflows (near 1e200:
    a unit vector of zeros); for ordinary vectors the result is the same to the last bit.
    ``flat``: ``v`` is one vector and its norm is ``np.linalg.norm(v)`` (a dot product), else
    ``np.linalg.norm(v, axis=-1)`` (a reduction): the two may differ in the last bit.
    """
    _, e = np.frexp(np.max(np.abs(v), axis=-1, keepdims=True))
    scaled = np.ldexp(v, -e)
    norm = np.linalg.norm(scaled) if flat else np.linalg.norm(scaled, axis=-1, keepdims=True)
    zero = np.asarray(norm == 0).reshape(v.shape[:-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return scaled / norm, zero


#: Magnitudes whose squares are safely inside the normal float64 range.
_SAFE_MIN, _SAFE_MAX = 1e-150, 1e150


# --------------------------------------------------------------------------------------------
# metrics over a stream pair
# --------------------------------------------------------------------------------------------
def perturbation_metrics(base, inj, v) -> dict[str, np.ndarray]:
    r"""Per-layer metrics of the difference between an injected and a baseline run.

    Parameters
    ----------
    base : array_like or torch.Tensor, shape ``[L+1, ..., d]``
        Residual stream of the baseline run at every layer (index 0 = input of block 0).
        Any axes between the first and the last (batch, tokens, ...) are kept in the output.
    inj : array_like or torch.Tensor, same shape as ``base``
        Residual stream of the run with the injection.
    v : array_like or torch.Tensor, shape ``[d]`` or broadcastable to ``base.shape[1:]``
        The injected direction (it need not be normalised; only its direction matters).
        A per-position direction of shape ``[..., d]`` is allowed.

    Returns
    -------
    dict of str to numpy.ndarray
        Each value has shape ``base.shape[:-1]`` (one value per layer and per position) and
        dtype float64.  With :math:`\delta = h_{inj} - h_{base}` and :math:`\hat v = v/\|v\|`:

        ``"projection"``
            :math:`\delta\cdot v/\|v\|`, the signed component of the difference along ``v``.
        ``"cos_delta_v"``
            :math:`\cos(\delta, v)`; NaN where :math:`\delta = 0` (before the injection
            layer the two runs agree and the angle is undefined).
        ``"delta_norm"``
            :math:`\|\delta\|`.
        ``"relative_size"``
            :math:`\|\delta\|/\|h_{base}\|`; NaN where :math:`h_{base} = 0`.
        ``"cos_inj_base"``
            :math:`\cos(h_{inj}, h_{base})`; NaN where either vector is 0.
        ``"norm_ratio"``
            :math:`\|h_{inj}\|/\|h_{base}\|`; NaN where :math:`h_{base} = 0`.

        The keys are listed in :data:`METRIC_NAMES`.

    Raises
    ------
    TypeError
        If an input is not a real-valued array or tensor.
    ValueError
        If ``base`` has fewer than 2 dimensions, ``inj`` has a different shape, ``v`` does not
        broadcast to one stream layer, ``v`` is zero anywhere, or any input holds NaN/inf.

    Notes
    -----
    Each layer is converted to float64 (and moved to the CPU) on its own and the difference
    formed there, so the extra memory is O(size of one layer) whatever the depth, and inputs
    in float16/bfloat16 or on a GPU are accepted as they are.  These are the quantities measured by
    Hahami et al. at the last token of Llama-3.1-8B (cosine to baseline, norm ratio,
    projection) :cite:p:`hahami2025disturbance`, plus the three the three-effect framework
    needs to tell its effects apart: :math:`\cos(\delta, v)` (is the difference still along
    ``v``?), :math:`\|\delta\|` (do the trajectories converge?) and
    :math:`\|\delta\|/\|h_{base}\|` (is the perturbation diluted?).

    Examples
    --------
    >>> import numpy as np
    >>> base = np.zeros((3, 4)); base[:, 0] = 1.0          # L = 2, d = 4, no batch axis
    >>> inj = base.copy(); inj[1:, 1] = [0.5, 0.25]        # injected at layer 1 along e_1
    >>> m = perturbation_metrics(base, inj, np.array([0.0, 2.0, 0.0, 0.0]))
    >>> m["projection"].tolist()
    [0.0, 0.5, 0.25]
    >>> m["relative_size"].tolist()
    [0.0, 0.5, 0.25]
    >>> bool(np.isnan(m["cos_delta_v"][0])), m["cos_delta_v"][1:].tolist()
    (True, [1.0, 1.0])
    """
    for arr, name in ((base, "base"), (inj, "inj")):
        if arr is None:
            raise TypeError(f"{name} must be an array or tensor, got None")
    if not (hasattr(base, "shape") and hasattr(base, "__getitem__")):
        base = as_float64(base, "base")
    if not (hasattr(inj, "shape") and hasattr(inj, "__getitem__")):
        inj = as_float64(inj, "inj")
    shape, ishape = tuple(base.shape), tuple(inj.shape)
    vv = as_float64(v, "v")
    if len(shape) < 2:
        raise ValueError(
            f"base must have shape [L+1, ..., d] (at least 2 dimensions), got shape {shape}"
        )
    if ishape != shape:
        raise ValueError(f"inj has shape {ishape} but base has shape {shape}; they must match")
    if vv.ndim == 0 or vv.shape[-1] != shape[-1]:
        raise ValueError(
            f"v must have last dimension d = {shape[-1]} (the width of the stream), "
            f"got shape {vv.shape}"
        )
    if vv.ndim > len(shape) - 1:
        raise ValueError(
            f"v has {vv.ndim} dimensions but one layer of the stream has {len(shape) - 1}; "
            "v must not add dimensions"
        )
    try:
        np.broadcast_shapes(vv.shape, shape[1:])
    except ValueError:
        raise ValueError(
            f"v of shape {vv.shape} does not broadcast to one layer of the stream, "
            f"shape {shape[1:]}; pass shape [d] or a per-position shape ending in d"
        ) from None
    _check_finite(vv, "v")
    v_hat, zero = unit_vectors(vv)
    if np.any(zero):
        raise ValueError("v must be a non-zero vector (at every position); it gives the direction")

    out = {k: np.empty(shape[:-1], dtype=np.float64) for k in METRIC_NAMES}
    with np.errstate(invalid="ignore", divide="ignore"):
        for layer in range(shape[0]):  # one layer at a time: bounded float64 temporaries
            hb = as_float64(base[layer], "base")
            hi = as_float64(inj[layer], "inj")
            _check_finite(hb, f"base[{layer}]")
            _check_finite(hi, f"inj[{layer}]")
            delta = hi - hb
            proj = np.sum(delta * v_hat, axis=-1)
            dn = np.linalg.norm(delta, axis=-1)
            bn = np.linalg.norm(hb, axis=-1)
            inn = np.linalg.norm(hi, axis=-1)
            out["projection"][layer] = proj
            out["delta_norm"][layer] = dn
            out["cos_delta_v"][layer] = np.where(dn > 0, np.clip(proj / dn, -1.0, 1.0), np.nan)
            out["relative_size"][layer] = np.where(bn > 0, dn / bn, np.nan)
            out["norm_ratio"][layer] = np.where(bn > 0, inn / bn, np.nan)
            denom = bn * inn
            out["cos_inj_base"][layer] = np.where(
                denom > 0, np.clip(np.sum(hb * hi, axis=-1) / denom, -1.0, 1.0), np.nan
            )
    return out


# --------------------------------------------------------------------------------------------
# the Post-LN linearised prediction
# --------------------------------------------------------------------------------------------
def normalisation_scale(x, eps: float = 0.0, norm: str = "layernorm") -> np.ndarray:
    r"""The scale a normalisation divides by: :math:`\sqrt{\operatorname{Var}(x) + \varepsilon}`.

    Parameters
    ----------
    x : array_like or torch.Tensor, shape ``[..., d]``
        LayerNorm inputs; the variance is taken over the last axis (population variance,
        as ``torch.nn.functional.layer_norm``), ``d >= 2``.
    eps : float, default 0.0
        The normalisation's ``eps`` (must be >= 0).
    norm : {"layernorm", "rmsnorm"}, default "layernorm"
        LayerNorm divides by the centred scale, RMSNorm by the root mean square.

    Returns
    -------
    numpy.ndarray, shape ``x.shape[:-1]``
        LayerNorm: :math:`s(x) = \sqrt{\tfrac1d\sum_i (x_i - \bar x)^2 + \varepsilon}`;
        RMSNorm: :math:`s(x) = \sqrt{\tfrac1d\sum_i x_i^2 + \varepsilon}`.

    Raises
    ------
    TypeError
        If ``x`` is not real-valued or ``eps`` is not a real number.
    ValueError
        If ``x`` has no axis of length >= 2, holds NaN/inf, ``eps`` < 0, ``norm`` is
        unknown, or the scale exceeds the float64 range.

    Notes
    -----
    For LayerNorm without affine parameters the Jacobian at ``x`` is
    :math:`J = s^{-1}\,(I - \mathbf 1\mathbf 1^\top/d - \tfrac{\operatorname{Var}(x)}{s^2}\,
    \hat y\hat y^\top)` with :math:`\hat y` the centred input normalised to unit length
    :cite:p:`xiong2020layer`; its norm on the complement of :math:`\mathbf 1` and
    :math:`\hat y` is :math:`1/s`.  Rows whose squares would leave the normal float64 range
    (entries beyond :math:`10^{150}`, or below :math:`10^{-150}` with a negligible ``eps``) are
    divided by a power of two first (exact) and :math:`s` is formed as
    :math:`\operatorname{hypot}(\mathrm{sd}, \sqrt\varepsilon)`.

    Examples
    --------
    >>> float(normalisation_scale([1.0, -1.0, 1.0, -1.0]))
    1.0
    >>> float(normalisation_scale([2.0, 2.0], eps=0.25))
    0.5
    >>> float(normalisation_scale([2.0, 2.0], norm="rmsnorm"))
    2.0
    """
    arr = as_float64(x, "x")
    eps = check_real(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if norm not in ("layernorm", "rmsnorm"):
        raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")
    if arr.ndim == 0 or arr.shape[-1] < 2:
        raise ValueError(
            f"x must have a last axis of length d >= 2 (the features), got shape {arr.shape}"
        )
    _check_finite(arr, "x")
    with np.errstate(over="ignore", under="ignore"):
        if norm == "rmsnorm":
            s = np.sqrt(np.mean(arr**2, axis=-1) + eps)
        else:
            s = np.sqrt(np.var(arr, axis=-1) + eps)
        # rows whose squares leave the normal float64 range (|x| beyond 1e150 or, with eps = 0,
        # below 1e-150): the same scale from the rows divided by a power of two (exact),
        # sqrt(var + eps) = hypot(sd, sqrt(eps))
        big = np.max(np.abs(arr), axis=-1)
        odd = (big > _SAFE_MAX) | ((big < _SAFE_MIN) & (big > 0) & (eps < _SAFE_MIN**2 * 1e6))
        if np.any(odd):
            _, e = np.frexp(big)
            scaled = np.ldexp(arr, -e[..., None])
            second = np.mean(scaled**2, axis=-1) if norm == "rmsnorm" else np.var(scaled, axis=-1)
            s = np.where(odd, np.hypot(np.ldexp(np.sqrt(second), e), np.sqrt(eps)), s)
    if not np.all(np.isfinite(s)):
        raise ValueError("the normalisation scale of x exceeds the float64 range; rescale x")
    return s


def postln_contraction_factors(
    ln_inputs,
    eps: float = 0.0,
    residual_scale: float = 1.0,
    ln_weight=None,
    v=None,
    norm: str = "layernorm",
) -> np.ndarray:
    r"""Per-layer factors by which Post-LN multiplies the component of a perturbation along v.

    Parameters
    ----------
    ln_inputs : array_like or torch.Tensor, shape ``[L, ..., d]``
        For each block ``l`` of a Post-LN stack, the input of its LayerNorm in the *baseline*
        run, :math:`u_l = \lambda h_l + \beta F(h_l)` (``StackOutput.pre_norm``).
    eps : float, default 0.0
        The LayerNorm ``eps``.
    residual_scale : float, default 1.0
        :math:`\lambda`, the weight of the skip path (1 for a plain residual, below 1 for
        DSLM-style scaled residuals).
    ln_weight : array_like, shape ``[d]`` or ``[L, ..., d]`` with ``ln_inputs.ndim`` axes, optional
        The normalisation gains :math:`\gamma_l` (e.g. ``[L, 1, 1, d]`` for one gain per
        layer over ``[L, B, T, d]`` inputs).  ``None`` means :math:`\gamma = \mathbf 1`.
        When given, ``v`` is required.
    v : array_like, shape ``[d]``, optional
        The direction of the perturbation (needed only with ``ln_weight``).
    norm : {"layernorm", "rmsnorm"}, default "layernorm"
        Which normalisation the stack uses (see :func:`normalisation_scale`).

    Returns
    -------
    numpy.ndarray, shape ``ln_inputs.shape[:-1]``
        :math:`f_l = \lambda\,\hat v^\top \operatorname{diag}(\gamma_l)\hat v / s(u_l)`, which
        is :math:`\lambda/s(u_l)` for :math:`\gamma = \mathbf 1`.

    Raises
    ------
    TypeError
        If an array argument is not real-valued or a scalar argument is not a real number.
    ValueError
        If ``ln_inputs`` has fewer than 2 dimensions or holds NaN/inf, ``eps`` < 0,
        ``residual_scale`` <= 0, ``ln_weight`` does not broadcast, ``ln_weight`` is given
        without ``v``, ``v`` is zero or of the wrong width, or ``norm`` is unknown.

    Notes
    -----
    First-order statement (proved in the chapter, proposition ``tef-prop-postln``): if
    :math:`\hat v \perp \mathbf 1`, :math:`\hat v \perp \hat y_l` (the centred LN input) and
    the block Jacobian contributes nothing along :math:`\hat v`, then the projection
    :math:`p_l = \delta_l\cdot\hat v` obeys :math:`p_{l+1} = f_l\,p_l + O(\|\delta_l\|^2)`.
    With a non-constant :math:`\gamma` the factor above additionally assumes that
    :math:`\delta_l` is parallel to :math:`\hat v`.  The LN Jacobian is from
    :cite:t:`xiong2020layer`.

    Examples
    --------
    >>> import numpy as np
    >>> u = np.array([[[2.0, -2.0, 2.0, -2.0]], [[0.5, -0.5, 0.5, -0.5]]])  # L = 2, one token
    >>> postln_contraction_factors(u).ravel().tolist()
    [0.5, 2.0]
    """
    u = as_float64(ln_inputs, "ln_inputs")
    if u.ndim < 2:
        raise ValueError(
            f"ln_inputs must have shape [L, ..., d] (at least 2 dimensions), got {u.shape}"
        )
    lam = check_real(residual_scale, "residual_scale")
    if lam <= 0:
        raise ValueError(f"residual_scale (lambda) must be > 0, got {lam}")
    s = normalisation_scale(u, eps, norm)
    if ln_weight is None:
        return lam / s
    if v is None:
        raise ValueError("ln_weight was given without v; pass the injected direction v as well")
    g = as_float64(ln_weight, "ln_weight")
    vv = as_float64(v, "v")
    d = u.shape[-1]
    if vv.shape != (d,):
        raise ValueError(f"v must have shape ({d},), got {vv.shape}")
    _check_finite(vv, "v")
    _check_finite(g, "ln_weight")
    if g.ndim == 0 or g.shape[-1] != d or g.ndim not in (1, u.ndim):
        raise ValueError(
            f"ln_weight must have shape [d] or as many axes as ln_inputs ({u.ndim}), ending "
            f"in d = {d}, e.g. [L, 1, 1, d]; got {g.shape}"
        )
    try:
        np.broadcast_shapes(g.shape, u.shape)
    except ValueError:
        raise ValueError(
            f"ln_weight of shape {g.shape} does not broadcast to ln_inputs of shape {u.shape}; "
            "give it singleton axes for batch and tokens, e.g. [L, 1, 1, d]"
        ) from None
    v_hat, zero = unit_vectors(vv, flat=True)
    if zero:
        raise ValueError("v must be a non-zero vector")
    gain = np.sum(g * v_hat**2, axis=-1)  # v_hat' diag(gamma) v_hat, shape g.shape[:-1]
    return lam * gain / s


def predicted_projection(factors, inject_layer: int, initial) -> np.ndarray:
    r"""Propagate a projection through per-layer multiplicative factors.

    Parameters
    ----------
    factors : array_like, shape ``[L, ...]``
        :math:`f_l`, the factor applied by block ``l`` (e.g. from
        :func:`postln_contraction_factors`).
    inject_layer : int
        Stream index :math:`\ell` at which the perturbation is added, ``0 <= ell <= L``.
    initial : float or array_like broadcastable to ``factors.shape[1:]``
        The projection :math:`p_\ell` just after the injection (per position if an array;
        0 at positions that were not injected).

    Returns
    -------
    numpy.ndarray, shape ``[L+1, ...]``
        :math:`\hat p_m = 0` for :math:`m < \ell`, :math:`\hat p_\ell = p_\ell` and
        :math:`\hat p_m = p_\ell \prod_{j=\ell}^{m-1} f_j` for :math:`m > \ell`.

    Raises
    ------
    TypeError
        If ``inject_layer`` is not an integer or an array is not real-valued.
    ValueError
        If ``factors`` is empty or holds NaN/inf, ``inject_layer`` is outside ``[0, L]``,
        or ``initial`` does not broadcast to ``factors.shape[1:]``.

    Notes
    -----
    The cumulative product is computed once (``numpy.cumprod``), so the cost is O(L) per
    position.

    Examples
    --------
    >>> predicted_projection([0.5, 0.5, 2.0], inject_layer=1, initial=4.0).tolist()
    [0.0, 4.0, 2.0, 4.0]
    """
    f = as_float64(factors, "factors")
    if f.ndim == 0 or f.shape[0] == 0:
        raise ValueError(f"factors must have shape [L, ...] with L >= 1, got {f.shape}")
    _check_finite(f, "factors")
    n_layers = f.shape[0]
    ell = check_int(inject_layer, "inject_layer", 0)
    if ell > n_layers:
        raise ValueError(f"inject_layer must be in [0, {n_layers}] (L = {n_layers}), got {ell}")
    p0 = as_float64(initial, "initial")
    _check_finite(p0, "initial")
    try:
        p0 = np.broadcast_to(p0, f.shape[1:])
    except ValueError:
        raise ValueError(
            f"initial of shape {np.shape(p0)} does not broadcast to the per-layer shape "
            f"{f.shape[1:]}"
        ) from None
    out = np.zeros((n_layers + 1,) + f.shape[1:], dtype=np.float64)
    out[ell] = p0
    if ell < n_layers:
        out[ell + 1 :] = p0 * np.cumprod(f[ell:], axis=0)
    return out


# --------------------------------------------------------------------------------------------
# the Pre-LN dilution law
# --------------------------------------------------------------------------------------------
def fit_norm_growth(sq_norms) -> float:
    r"""Least-squares slope :math:`c` of :math:`\|h_l\|^2/\|h_0\|^2 \approx 1 + c\,l`.

    Parameters
    ----------
    sq_norms : array_like, shape ``[L+1]``
        Mean squared stream norm :math:`\mathbb E\|h_l\|^2` at every layer, ``L >= 1``,
        with a positive first entry.

    Returns
    -------
    float
        :math:`c = \sum_l l\,(r_l - 1) / \sum_l l^2` with :math:`r_l = \|h_l\|^2/\|h_0\|^2`
        (the line is forced through :math:`r_0 = 1`).

    Raises
    ------
    TypeError
        If ``sq_norms`` is not real-valued.
    ValueError
        If it is not 1-D with at least 2 entries, holds NaN/inf or negative values, or its
        first entry is 0.

    Notes
    -----
    In a Pre-LN stack the input of every block is normalised, so at random initialisation
    each block adds a roughly constant :math:`\beta^2\mathbb E\|F\|^2` to
    :math:`\mathbb E\|h\|^2` and the growth is linear in depth
    :cite:p:`xiong2020layer,kedia2024transformers`.

    Examples
    --------
    >>> fit_norm_growth([4.0, 6.0, 8.0, 10.0])
    0.5
    """
    r = as_float64(sq_norms, "sq_norms")
    if r.ndim != 1 or r.size < 2:
        raise ValueError(f"sq_norms must be 1-D with at least 2 entries, got shape {r.shape}")
    _check_finite(r, "sq_norms")
    if np.any(r < 0):
        raise ValueError("sq_norms must be non-negative (they are squared norms)")
    if r[0] == 0:
        raise ValueError("sq_norms[0] must be > 0: the growth is measured relative to the input")
    layers = np.arange(r.size, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        c = float(np.sum(layers * (r / r[0] - 1.0)) / np.sum(layers**2))
    if not np.isfinite(c):
        raise ValueError(
            f"the growth slope exceeds the float64 range (sq_norms[0] = {r[0]:.4g}, max "
            f"{r.max():.4g}); the ratios ||h_l||^2/||h_0||^2 overflow"
        )
    return c


def dilution_factor(c: float, inject_layer: int, layers) -> np.ndarray:
    r"""Relative-size factor :math:`\sqrt{(1 + c\ell)/(1 + c m)}` of the Pre-LN dilution law.

    Parameters
    ----------
    c : float
        Growth slope from :func:`fit_norm_growth` (``c >= 0``).
    inject_layer : int
        Stream index :math:`\ell >= 0` of the injection.
    layers : int or array_like of int
        Stream indices :math:`m \ge \ell` at which the factor is wanted.

    Returns
    -------
    numpy.ndarray
        :math:`\sqrt{(1 + c\ell)/(1 + cm)}`, the ratio of the perturbation's relative size at
        layer :math:`m` to its relative size at layer :math:`\ell`, assuming that the
        projection is carried unchanged by the skip path and
        :math:`\|h_m\|^2 \propto 1 + cm`.

    Raises
    ------
    TypeError
        If ``c`` is not a real number, ``inject_layer`` is not an integer, or ``layers`` holds
        non-integers.
    ValueError
        If ``c`` < 0 or non-finite, ``inject_layer`` < 0 or any ``m < inject_layer``.

    Examples
    --------
    >>> dilution_factor(1.0, 0, [0, 3]).tolist()
    [1.0, 0.5]
    """
    c = check_real(c, "c")
    if c < 0:
        raise ValueError(f"c must be >= 0 (norms grow in a Pre-LN stack), got {c}")
    ell = check_int(inject_layer, "inject_layer", 0)
    m = np.asarray(layers)
    if not np.issubdtype(m.dtype, np.integer):
        raise TypeError(f"layers must be integers, got dtype {m.dtype}")
    if np.any(m < ell):
        raise ValueError(f"layers must all be >= inject_layer = {ell}, got min {int(m.min())}")
    mf = m.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = (1.0 + c * ell) / (1.0 + c * mf)
    bad = ~np.isfinite(ratio)
    if np.any(bad):  # c * m beyond 1.8e308 made it inf/inf: divide both by c (c > 0) there
        ratio = np.where(bad, (1.0 / c + ell) / (1.0 / c + mf), ratio)
    return np.sqrt(ratio)


# --------------------------------------------------------------------------------------------
# the window
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """The injection window of one stack (see :func:`injection_window`).

    Attributes
    ----------
    layers : numpy.ndarray of int
        Injection layers in the window, ascending.
    best : int
        Injection layer with the largest output effect.
    first, last : int
        Smallest and largest injection layer in the window.
    n_layers : int
        Depth ``L`` of the stack; fractions are ``layer / L``.
    threshold : float
        The threshold used.
    relative : bool
        Whether the threshold was relative to the largest effect.
    """

    layers: np.ndarray
    best: int
    first: int
    last: int
    n_layers: int
    threshold: float
    relative: bool

    @property
    def best_fraction(self) -> float:
        """``best / L``."""
        return self.best / self.n_layers

    @property
    def first_fraction(self) -> float:
        """``first / L``."""
        return self.first / self.n_layers

    @property
    def last_fraction(self) -> float:
        """``last / L``."""
        return self.last / self.n_layers

    @property
    def size_fraction(self) -> float:
        """Number of injection layers in the window divided by ``L``."""
        return len(self.layers) / self.n_layers


def injection_window(
    effect,
    layers=None,
    n_layers: int | None = None,
    threshold: float = 0.5,
    relative: bool = True,
    contiguous: bool = True,
) -> Window:
    r"""The window: injection layers whose output effect reaches a threshold.

    Parameters
    ----------
    effect : array_like, shape ``[K]``
        Output effect :math:`E(\ell)` of an injection at each tested layer (for example the
        relative change of the final output, or a KL divergence); non-negative.
    layers : array_like of int, shape ``[K]``, optional
        The injection layers (stream indices) at which ``effect`` was measured, strictly
        increasing.  Default ``0, 1, ..., K-1``.
    n_layers : int, optional
        Depth ``L`` of the stack (default ``K``).  Fractions of depth are ``layer / L``.
    threshold : float, default 0.5
        :math:`\tau`.  With ``relative=True`` the window is
        :math:`\{\ell : E(\ell) \ge \tau \max_{\ell'} E(\ell')\}`, :math:`0 < \tau \le 1`;
        otherwise :math:`\{\ell : E(\ell) \ge \tau\}`, :math:`\tau > 0`.
    relative : bool, default True
        Whether ``threshold`` is a fraction of the largest effect.
    contiguous : bool, default True
        Keep only the run of consecutive tested layers around the best one (isolated
        excursions above the threshold elsewhere, e.g. noise at the floor, are not part of
        the window).  ``False`` keeps the whole set.

    Returns
    -------
    Window
        The layers in the window, the best layer, the first and last layers, and their
        positions as fractions of depth.  If no layer reaches an absolute threshold the
        window is empty and ``first = last = -1``.

    Raises
    ------
    TypeError
        If ``relative`` or ``contiguous`` is not a bool or ``layers``/``n_layers`` are not
        integers.
    ValueError
        If ``effect`` is not 1-D and non-empty, holds NaN/inf or negative values, ``layers``
        has a different length, is not strictly increasing or exceeds ``n_layers``, or the
        threshold is out of range.

    Notes
    -----
    The notes speak of an "introspection window" at "~6.25% of depth"; neither term is
    defined there (6.25% = 2/32 is the best injection layer of one 32-layer model in
    :cite:t:`hahami2025disturbance`).  This is the operational definition used in the book:
    the set above (by default its run of consecutive layers through the best one) is the
    window; ``best / L``, ``first / L`` and ``last / L`` are its position.  With an absolute
    threshold that the best layer misses, the window is empty.

    Examples
    --------
    >>> w = injection_window([0.2, 1.0, 0.6, 0.1], n_layers=4)
    >>> w.layers.tolist(), w.best, w.last_fraction
    ([1, 2], 1, 0.5)
    >>> injection_window([0.9, 0.1, 0.8, 1.0]).layers.tolist()
    [2, 3]
    >>> injection_window([0.9, 0.1, 0.8, 1.0], contiguous=False).layers.tolist()
    [0, 2, 3]
    """
    e = as_float64(effect, "effect")
    if e.ndim != 1 or e.size == 0:
        raise ValueError(f"effect must be a non-empty 1-D array, got shape {e.shape}")
    _check_finite(e, "effect")
    if np.any(e < 0):
        raise ValueError("effect must be non-negative (it measures a size of change)")
    if not isinstance(relative, bool):
        raise TypeError(f"relative must be a bool, got {type(relative).__name__}")
    if not isinstance(contiguous, bool):
        raise TypeError(f"contiguous must be a bool, got {type(contiguous).__name__}")
    if layers is None:
        lay = np.arange(e.size)
    else:
        lay = np.asarray(layers)
        if not np.issubdtype(lay.dtype, np.integer):
            raise TypeError(f"layers must be integers, got dtype {lay.dtype}")
        if lay.shape != e.shape:
            raise ValueError(f"layers has shape {lay.shape} but effect has shape {e.shape}")
        if np.any(np.diff(lay) <= 0) or lay[0] < 0:
            raise ValueError("layers must be non-negative and strictly increasing")
    depth = e.size if n_layers is None else check_int(n_layers, "n_layers", 1)
    if lay[-1] > depth:
        raise ValueError(f"layers go up to {int(lay[-1])} but n_layers = {depth}")
    tau = check_real(threshold, "threshold")
    if relative and not 0 < tau <= 1:
        raise ValueError(f"a relative threshold must lie in (0, 1], got {tau}")
    if not relative and tau <= 0:
        raise ValueError(f"an absolute threshold must be > 0, got {tau}")
    cut = tau * e.max() if relative else tau
    above = (e >= cut) if (not relative or e.max() > 0) else np.ones(e.shape, dtype=bool)
    i_best = int(np.argmax(e))
    if contiguous:
        keep = np.zeros_like(above)
        if above[i_best]:
            lo = hi = i_best
            while lo > 0 and above[lo - 1]:
                lo -= 1
            while hi < e.size - 1 and above[hi + 1]:
                hi += 1
            keep[lo : hi + 1] = True
        above = keep
    inside = lay[above]
    best = int(lay[i_best])
    first = int(inside[0]) if inside.size else -1
    last = int(inside[-1]) if inside.size else -1
    return Window(
        layers=inside.astype(int), best=best, first=first, last=last, n_layers=depth,
        threshold=tau, relative=relative,
    )


def predicted_window(
    placement: str, n_layers: int, threshold: float = 0.5, factor: float | None = None,
    c: float | None = None,
) -> tuple[int, int]:
    r"""Window of the readable projection predicted by the first-order laws, ``(first, last)``.

    Parameters
    ----------
    placement : {"pre", "post"}
    n_layers : int
        Depth ``L`` (injection layers ``0 .. L-1``).
    threshold : float, default 0.5
        Relative threshold :math:`\tau \in (0, 1]`.
    factor : float, optional
        Post-LN: the (geometric-mean) per-block factor :math:`\bar f \in (0, 1]` of
        :func:`postln_contraction_factors`.  Required for ``"post"``.
    c : float, optional
        Pre-LN: the growth slope of :func:`fit_norm_growth` (``c >= 0``).  Required for
        ``"pre"``.

    Returns
    -------
    (int, int)
        First and last injection layer of the window; the last is always ``L - 1``.

    Raises
    ------
    TypeError
        If an argument has the wrong type.
    ValueError
        If ``placement`` is unknown, the parameter it needs is missing or out of range,
        ``n_layers`` < 1 or ``threshold`` is outside ``(0, 1]``.

    Notes
    -----
    Relative injections (:math:`\|\delta_\ell\| = r\,\|h_\ell\|`) read at the output
    :math:`h_L`.  Post-LN: :math:`E(\ell) = r\prod_{j=\ell}^{L-1} f_j \approx r\bar f^{L-\ell}`
    (:math:`\|h\|` is constant), so :math:`E(\ell)/E(L-1) = \bar f^{L-1-\ell} \ge \tau` for
    the last :math:`\lfloor\ln(1/\tau)/\ln(1/\bar f)\rfloor + 1` layers, a fixed number
    whatever :math:`L`.  Pre-LN: :math:`E(\ell) = r\sqrt{(1+c\ell)/(1+cL)}`, so the window is
    :math:`\ell \ge (\tau^2(1 + c(L-1)) - 1)/c`, whose lower edge tends to
    :math:`\tau^2 L` as :math:`cL\to\infty`.

    Examples
    --------
    >>> predicted_window("post", 32, factor=0.5)       # 0.5^(31 - l) >= 0.5: l >= 30
    (30, 31)
    >>> predicted_window("pre", 32, c=1e6)             # lower edge -> tau^2 L = 8 (7.75 rounded up)
    (8, 31)
    """
    if placement not in ("pre", "post"):
        raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
    L = check_int(n_layers, "n_layers", 1)
    tau = check_real(threshold, "threshold")
    if not 0 < tau <= 1:
        raise ValueError(f"threshold must lie in (0, 1], got {tau}")
    if placement == "post":
        if factor is None:
            raise ValueError("placement='post' needs factor (the mean Post-LN factor f)")
        f = check_real(factor, "factor")
        if not 0 < f <= 1:
            raise ValueError(f"factor must lie in (0, 1] (LayerNorm contracts), got {f}")
        if f == 1:
            return 0, L - 1
        with np.errstate(over="ignore", divide="ignore"):  # 1/tau beyond 1.8e308: ln = inf
            count = np.floor(np.log(1 / tau) / np.log(1 / f) + 1e-12) + 1
        n = L if not count < L else int(count)  # an infinite count (tau -> 0) is every layer
        return L - n, L - 1
    if c is None:
        raise ValueError("placement='pre' needs c (the norm-growth slope)")
    c = check_real(c, "c")
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    if c == 0:
        return 0, L - 1
    with np.errstate(over="ignore"):
        edge = (tau**2 * (1 + c * (L - 1)) - 1) / c - 1e-12
        if not np.isfinite(edge):  # c (L - 1) beyond 1.8e308, or (tau^2 - 1)/c below -1.8e308
            edge = tau**2 * (L - 1) + (tau**2 - 1) / c - 1e-12
    if not edge > 0:  # also -inf: c -> 0, the whole stack is in the window
        return 0, L - 1
    return max(0, int(np.ceil(edge))), L - 1


# --------------------------------------------------------------------------------------------
# injection sweeps on stacks
# --------------------------------------------------------------------------------------------
def random_direction(d: int, seed: int = 0, mean_zero: bool = True) -> np.ndarray:
    r"""A seeded random unit vector in :math:`\mathbb R^d`, by default orthogonal to **1**.

    Parameters
    ----------
    d : int
        Dimension, ``d >= 2``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    mean_zero : bool, default True
        Remove the component along the all-ones vector (so LayerNorm's mean removal does not
        act on it: assumption (i) of the Post-LN proposition).

    Returns
    -------
    numpy.ndarray, shape ``[d]``, unit Euclidean norm.

    Raises
    ------
    TypeError
        If ``d`` or ``seed`` is not an integer, or ``mean_zero`` is not a bool.
    ValueError
        If ``d`` < 2 or ``seed`` < 0.

    Notes
    -----
    A standard Gaussian vector, centred if asked, divided by its norm: uniform on the unit
    sphere (of the mean-zero hyperplane when ``mean_zero``).

    Examples
    --------
    >>> v = random_direction(8, seed=1)
    >>> round(float(v @ v), 12), abs(float(v.sum())) < 1e-12
    (1.0, True)
    """
    d = check_int(d, "d", 2)
    seed = check_int(seed, "seed", 0)
    if not isinstance(mean_zero, bool):
        raise TypeError(f"mean_zero must be a bool, got {type(mean_zero).__name__}")
    v = np.random.default_rng(seed).standard_normal(d)
    if mean_zero:
        v -= v.mean()
    return v / np.linalg.norm(v)


def sharpen_attention(stack, logit_std: float, seed: int = 0):
    r"""Re-draw every attention sublayer's query and key maps so the logits spread by ``logit_std``.

    Parameters
    ----------
    stack : companion.stacks.ResidualStack
        A stack with attention sublayers (``block`` is ``"attention"`` or ``"both"``); it is
        modified in place.
    logit_std : float
        Target standard deviation :math:`\sigma_a > 0` of the attention logits for unit-variance
        inputs.
    seed : int, default 0
        Seed of the new weights.

    Returns
    -------
    companion.stacks.ResidualStack
        The same stack (for chaining).

    Raises
    ------
    TypeError
        If ``stack`` is not a ``ResidualStack`` or ``logit_std``/``seed`` have the wrong type.
    ValueError
        If the stack has no attention sublayer, ``logit_std`` <= 0 or ``seed`` < 0.

    Notes
    -----
    :math:`W_Q` and :math:`W_K` get i.i.d. :math:`N(0, \sigma_a/d)` entries (biases stay 0).
    For an input :math:`x` with :math:`\|x\|^2 = d` every query and key coordinate is then
    :math:`N(0, \sigma_a)`, and a logit :math:`q\cdot k/\sqrt{d_h}` (a sum of :math:`d_h`
    products) has variance :math:`\sigma_a^2`.  The stacks' default (Xiong et al.'s
    :math:`W_Q = 0`) is the other extreme: uniform attention.  Large :math:`\sigma_a` makes
    attention nearly a hard arg-max whose choice a small perturbation can flip.

    Examples
    --------
    >>> import torch
    >>> from companion.stacks import StackConfig, ResidualStack
    >>> st = sharpen_attention(ResidualStack(StackConfig(d_model=16, n_layers=1, n_heads=2)), 4.0)
    >>> attn = st.blocks[0].sublayers[0].f
    >>> bool(attn.w_q.weight.abs().sum() > 0)
    True
    """
    import math

    import torch

    from companion.stacks import ResidualStack

    if not isinstance(stack, ResidualStack):
        raise TypeError(f"stack must be a companion.stacks.ResidualStack, got {type(stack).__name__}")
    sigma = check_real(logit_std, "logit_std")
    if sigma <= 0:
        raise ValueError(f"logit_std must be > 0, got {sigma}")
    seed = check_int(seed, "seed", 0)
    attention = [sub.f for blk in stack.blocks for sub in blk.sublayers if sub.kind == "attention"]
    if not attention:
        raise ValueError(
            f"the stack has no attention sublayer (block = {stack.config.block!r}); "
            "use block='attention' or 'both'"
        )
    d = stack.config.d_model
    g = torch.Generator().manual_seed(seed)
    std = math.sqrt(sigma / d)
    with torch.no_grad():
        for attn in attention:
            for lin in (attn.w_q, attn.w_k):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g, dtype=torch.float64) * std)
                if lin.bias is not None:
                    lin.bias.zero_()
    return stack


@dataclass
class InjectionSweep:
    """Result of :func:`stack_injection_sweep` (all arrays numpy float64 on the CPU).

    Attributes
    ----------
    layers : numpy.ndarray of int, shape ``[K]``
        Injection layers (stream indices).
    n_layers : int
        Depth ``L`` of the stack.
    placement : str
        ``"pre"`` or ``"post"``.
    direction : numpy.ndarray, shape ``[d]``
        The unit direction ``v``.
    amplitude : numpy.ndarray, shape ``[K]``
        :math:`\\|\\delta_\\ell\\|` added at each injected position.
    injected : numpy.ndarray of bool, shape ``[T]``
        Which token positions received the vector.
    metrics : dict of str to numpy.ndarray, each ``[K, L+1, B, T]``
        :func:`perturbation_metrics` of the injected run against the baseline, for each
        injection layer.
    predicted_projection : numpy.ndarray, shape ``[K, L+1, B, T]``
        Skip-path prediction of ``metrics["projection"]``: Post-LN, the product of the
        factors of :func:`postln_contraction_factors` (one per sublayer norm); Pre-LN,
        :math:`\\lambda^{S(m-\\ell)} p_\\ell` (S sublayers per block).  0 at positions that
        were not injected.
    output_change : numpy.ndarray, shape ``[K, B, T]``
        :math:`\\|y_{inj} - y_{base}\\| / \\|y_{base}\\|` for the stack's final output ``y``
        (after the final norm, if any).
    output_projection : numpy.ndarray, shape ``[K, B, T]``
        :math:`(y_{inj} - y_{base})\\cdot\\hat v / \\|y_{base}\\|`: how much of the injected
        direction can still be read at the output, relative to the output's size.
    kl : numpy.ndarray or None, shape ``[K, B, T]``
        For a language model, :math:`\\mathrm{KL}(p_{base}\\,\\|\\,p_{inj})` of the
        next-token distributions (nats); ``None`` for a bare stack.
    base_sq_norm : numpy.ndarray, shape ``[L+1]``
        :math:`\\mathbb E\\|h_l\\|^2` of the baseline over batch and tokens.
    base_norm : numpy.ndarray, shape ``[L+1, B, T]``
        :math:`\\|h_l\\|` of the baseline at every layer and position.
    """

    layers: np.ndarray
    n_layers: int
    placement: str
    direction: np.ndarray
    amplitude: np.ndarray
    injected: np.ndarray
    metrics: dict
    predicted_projection: np.ndarray
    output_change: np.ndarray
    output_projection: np.ndarray
    kl: np.ndarray | None
    base_sq_norm: np.ndarray
    base_norm: np.ndarray

    def effect(self, kind: str = "output_change", positions: str = "all") -> np.ndarray:
        """Output effect per injection layer, averaged over batch and the chosen tokens.

        Parameters
        ----------
        kind : {"output_change", "output_projection", "kl"}
            ``"output_change"``: mean of :attr:`output_change`; ``"output_projection"``:
            absolute value of the mean of :attr:`output_projection` (the part of the injected
            direction readable at the output); ``"kl"``: mean of :attr:`kl`.
        positions : {"all", "injected", "later"}
            Average over every token, over the injected tokens, or over the tokens after the
            last injected one (the protocol of Hahami et al., who read the last token).

        Returns
        -------
        numpy.ndarray, shape ``[K]``

        Raises
        ------
        ValueError
            If ``kind`` or ``positions`` is unknown, ``kind="kl"`` for a bare stack, or no
            token lies after the last injected one.
        """
        if kind not in EFFECT_KINDS:
            raise ValueError(f"kind must be one of {EFFECT_KINDS}, got {kind!r}")
        values = {"output_change": self.output_change, "output_projection": self.output_projection,
                  "kl": self.kl}[kind]
        if values is None:
            raise ValueError("kind='kl' needs a language model (TinyLM); this sweep ran a bare stack")
        mean = values[:, :, self.position_mask(positions)].mean(axis=(1, 2))
        return np.abs(mean) if kind == "output_projection" else mean

    def effect_at(
        self, layer: int, kind: str = "relative_projection", positions: str = "all"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Effect read at stream index ``layer`` of the injections made before it.

        Because block ``l`` of a stack depends only on ``(seed, l)``, the first ``m`` blocks
        of a deep stack *are* the stack of depth ``m``: reading the stream at index ``m``
        gives the output of the depth-``m`` stack, so one sweep serves every depth.

        Parameters
        ----------
        layer : int
            Stream index ``m`` (``1 <= m <= L``) at which to read.
        kind : {"relative_projection", "relative_size"}
            ``"relative_projection"``: :math:`|\\operatorname{mean}(p_m/\\|h_m\\|)|`, the
            part of the injected direction still readable, relative to the stream's size;
            ``"relative_size"``: :math:`\\operatorname{mean}(\\|\\delta_m\\|/\\|h_m\\|)`.
        positions : {"all", "injected", "later"}
            Tokens to average over (see :meth:`effect`).

        Returns
        -------
        (numpy.ndarray of int, numpy.ndarray)
            The injection layers ``l < m`` of this sweep and the effect of each.

        Raises
        ------
        TypeError
            If ``layer`` is not an integer.
        ValueError
            If ``layer`` is out of range, no injection layer lies below it, or ``kind`` or
            ``positions`` is unknown.
        """
        m = check_int(layer, "layer", 1)
        if m > self.n_layers:
            raise ValueError(f"layer must be in [1, {self.n_layers}], got {m}")
        keep = self.layers < m
        if not keep.any():
            raise ValueError(f"no injection layer of this sweep lies below layer {m}")
        pos = self.position_mask(positions)
        if kind == "relative_projection":
            vals = self.metrics["projection"][keep, m] / self.base_norm[m]
            return self.layers[keep], np.abs(vals[:, :, pos].mean(axis=(1, 2)))
        if kind == "relative_size":
            vals = self.metrics["relative_size"][keep, m]
            return self.layers[keep], vals[:, :, pos].mean(axis=(1, 2))
        raise ValueError(f"kind must be 'relative_projection' or 'relative_size', got {kind!r}")

    def position_mask(self, positions: str = "all") -> np.ndarray:
        """Boolean mask over tokens: ``"all"``, ``"injected"`` or ``"later"`` (see :meth:`effect`)."""
        if positions == "all":
            return np.ones_like(self.injected)
        if positions == "injected":
            return self.injected.copy()
        if positions == "later":
            mask = np.zeros_like(self.injected)
            last = int(np.flatnonzero(self.injected)[-1])
            mask[last + 1 :] = True
            if not mask.any():
                raise ValueError("no token lies after the last injected position")
            return mask
        raise ValueError(f"positions must be 'all', 'injected' or 'later', got {positions!r}")

    def window(
        self, threshold: float = 0.5, kind: str = "output_change", positions: str = "all",
        relative: bool = True, contiguous: bool = True,
    ) -> Window:
        """:func:`injection_window` of :meth:`effect` (same parameters)."""
        return injection_window(
            self.effect(kind, positions), layers=self.layers, n_layers=self.n_layers,
            threshold=threshold, relative=relative, contiguous=contiguous,
        )


def stack_injection_sweep(
    model,
    inputs,
    layers=None,
    scale: float = 0.1,
    relative: bool = True,
    direction=None,
    positions=None,
    seed: int = 0,
) -> InjectionSweep:
    r"""Inject :math:`a_\ell v` at every layer of a stack in turn and measure what follows.

    Parameters
    ----------
    model : companion.stacks.ResidualStack or companion.stacks.TinyLM
        The stack (random or trained).  It is run under ``torch.no_grad`` on its own device.
    inputs : torch.Tensor
        ``[B, T, d]`` input stream for a ``ResidualStack``; ``[B, T]`` token ids for a
        ``TinyLM``.
    layers : sequence of int, optional
        Injection layers (stream indices ``0 <= l <= L``), strictly increasing.  Default
        ``0, ..., L-1``.
    scale : float, default 0.1
        With ``relative=True`` the injected norm is
        :math:`a_\ell = \text{scale}\cdot\sqrt{\mathbb E\|h_\ell\|^2}` (the baseline's
        root-mean-square stream norm at that layer, over batch and tokens); otherwise
        :math:`a_\ell = \text{scale}`.
    relative : bool, default True
        See ``scale``.
    direction : array_like, shape ``[d]``, optional
        The direction ``v`` (normalised here).  Default :func:`random_direction` with
        ``seed``.
    positions : int or sequence of int, optional
        Token positions that receive the vector (``None``: all).
    seed : int, default 0
        Seed of the default direction.

    Returns
    -------
    InjectionSweep

    Raises
    ------
    TypeError
        If ``model`` is neither a ``ResidualStack`` nor a ``TinyLM``, ``relative`` is not a
        bool, or ``scale``/``seed`` have the wrong type.
    ValueError
        If ``scale`` <= 0, ``layers`` is empty, not strictly increasing or out of
        ``[0, L]``, ``direction`` has the wrong shape or is zero, or ``inputs``/``positions``
        are rejected by the model's forward pass.

    Notes
    -----
    The baseline runs once; each injection layer costs one forward pass (the stacks do not
    expose a restart at block :math:`\ell`).  The skip-path prediction is the first-order
    statement of the chapter's propositions: Post-LN multiplies the projection by
    :math:`\lambda\,\hat v^\top\operatorname{diag}(\gamma)\hat v/s(u)` at every norm
    (:func:`postln_contraction_factors`), Pre-LN by :math:`\lambda` at every sublayer.  The
    KL divergence is :math:`\sum_x p_{base}(x)\,(\log p_{base}(x) - \log p_{inj}(x))`.

    Examples
    --------
    >>> import torch
    >>> from companion.stacks import StackConfig, ResidualStack
    >>> stack = ResidualStack(StackConfig(d_model=16, n_layers=3, n_heads=2, placement="post"))
    >>> sw = stack_injection_sweep(stack, torch.randn(2, 4, 16), scale=1e-4)
    >>> sw.metrics["projection"].shape, sw.effect("output_change").shape
    ((3, 4, 2, 4), (3,))
    >>> p, q = sw.metrics["projection"][0, 0], sw.predicted_projection[0, 0]  # at injection
    >>> bool(np.allclose(p, q, rtol=1e-3))
    True
    """
    import torch

    from companion.stacks import ResidualStack, TinyLM

    if isinstance(model, TinyLM):
        stack, is_lm = model.stack, True
    elif isinstance(model, ResidualStack):
        stack, is_lm = model, False
    else:
        raise TypeError(
            f"model must be a companion.stacks.ResidualStack or TinyLM, got {type(model).__name__}"
        )
    cfg = stack.config
    n_layers, d = cfg.n_layers, cfg.d_model
    scale = check_real(scale, "scale")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if not isinstance(relative, bool):
        raise TypeError(f"relative must be a bool, got {type(relative).__name__}")
    seed = check_int(seed, "seed", 0)
    lay = np.arange(n_layers) if layers is None else np.asarray(layers)
    if lay.ndim != 1 or lay.size == 0:
        raise ValueError(f"layers must be a non-empty 1-D sequence of integers, got {layers!r}")
    if not np.issubdtype(lay.dtype, np.integer):
        raise TypeError(f"layers must be integers, got dtype {lay.dtype}")
    if lay[0] < 0 or lay[-1] > n_layers or np.any(np.diff(lay) <= 0):
        raise ValueError(
            f"layers must be strictly increasing stream indices in [0, {n_layers}], got {lay.tolist()}"
        )
    v = random_direction(d, seed) if direction is None else as_float64(direction, "direction")
    if v.shape != (d,):
        raise ValueError(f"direction must have shape ({d},), got {v.shape}")
    _check_finite(v, "direction")
    v, zero = unit_vectors(v, flat=True)
    if zero:
        raise ValueError("direction must be a non-zero vector")

    param = next(model.parameters())
    v_t = torch.as_tensor(v, dtype=param.dtype, device=param.device)

    def forward(**kw):
        if is_lm:
            logits, out = model(inputs, **kw)
            return torch.log_softmax(logits.double(), dim=-1), out
        return None, model(inputs, **kw)

    with torch.no_grad():
        logp_base, base = forward()
        stream_b = base.stream
        n_tok = stream_b.shape[2]
        mask = torch.zeros(n_tok, dtype=torch.bool)
        if positions is None:
            mask[:] = True
        else:
            mask[torch.as_tensor(np.atleast_1d(np.asarray(positions)))] = True
        base_sq = stream_b.double().pow(2).sum(-1)  # [L+1, B, T]
        sq = base_sq.mean(dim=(1, 2)).cpu().numpy()  # [L+1]
        base_norm = base_sq.sqrt().cpu().numpy()
        amps = scale * np.sqrt(sq[lay]) if relative else np.full(lay.size, scale)
        top = float(torch.finfo(param.dtype).max)
        if not np.all(amps * float(v_t.abs().max()) <= top):
            raise ValueError(
                f"the injected vectors a_l v reach {np.max(amps):.4g} in norm, beyond the range "
                f"of the stack's dtype {param.dtype} (max {top:.4g}); use a smaller scale"
            )

        # skip-path factors of the baseline: [L, B, T]
        lam = cfg.residual_scale
        n_sub = base.sublayer_norm_input.shape[1]
        if cfg.placement == "post":
            ln_w = torch.stack(
                [torch.stack([sub.norm.weight for sub in blk.sublayers]) for blk in stack.blocks]
            )  # [L, S, d]
            f = postln_contraction_factors(
                base.sublayer_norm_input, eps=cfg.eps, residual_scale=lam,
                ln_weight=ln_w.detach().double().cpu().numpy()[:, :, None, None, :], v=v,
                norm=cfg.norm,
            )  # [L, S, B, T]
            factors = np.prod(f, axis=1)
        else:
            factors = np.full(stream_b.shape[1:3], lam**n_sub)[None].repeat(n_layers, axis=0)
        mask_np = mask.numpy()

        final_b = base.final.double()
        final_b_norm = final_b.norm(dim=-1)
        K = lay.size
        shape = (K,) + tuple(stream_b.shape[:3])
        metrics = {k: np.empty(shape) for k in METRIC_NAMES}
        predicted = np.empty(shape)
        output_change = np.empty((K,) + tuple(stream_b.shape[1:3]))
        output_projection = np.empty_like(output_change)
        v_t64 = torch.as_tensor(v, dtype=torch.float64, device=param.device)
        kl = np.empty_like(output_change) if is_lm else None
        for k, ell in enumerate(lay.tolist()):
            logp_inj, out = forward(
                inject_layer=ell, inject_vector=float(amps[k]) * v_t, inject_positions=positions
            )
            m = perturbation_metrics(stream_b, out.stream, v)
            for name in METRIC_NAMES:
                metrics[name][k] = m[name]
            predicted[k] = predicted_projection(factors, ell, amps[k] * mask_np[None, :])
            dy = out.final.double() - final_b
            output_change[k] = (dy.norm(dim=-1) / final_b_norm).cpu().numpy()
            output_projection[k] = ((dy @ v_t64) / final_b_norm).cpu().numpy()
            if is_lm:
                kl[k] = (logp_base.exp() * (logp_base - logp_inj)).sum(-1).cpu().numpy()
    return InjectionSweep(
        layers=lay.astype(int), n_layers=n_layers, placement=cfg.placement, direction=v,
        amplitude=np.asarray(amps, dtype=np.float64), injected=mask_np, metrics=metrics,
        predicted_projection=predicted, output_change=output_change,
        output_projection=output_projection, kl=kl, base_sq_norm=sq, base_norm=base_norm,
    )
