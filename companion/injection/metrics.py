"""Perturbation metrics, output effects, linearised predictions and the injection window.

The one metric vocabulary of the package: every injection -- into a random stack, a trained
:class:`~companion.stacks.tinylm.TinyLM` or a real model (:mod:`companion.injection.engine`) -- is measured with
the functions here, so a metric name means the same thing in every chapter and every Result.
The functions are numpy functions of stream arrays (numpy arrays or torch tensors);
:func:`next_token_kl` imports torch inside the function, so importing this module does not load
torch.

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
perturbation_metrics, METRIC_NAMES
    Projection on the injected direction, cos(delta, v), ||delta||, ||delta||/||h_base||,
    cos(h_inj, h_base) and the norm ratio, per layer: the metric vocabulary.
next_token_kl, embedding_change
    The output effects: KL divergence of next-token distributions (the one KL of the package),
    1 - cos of sentence embeddings.
normalisation_scale
    sqrt(Var(x) + eps) along the last axis: the scale that LayerNorm divides by.
postln_contraction_factors, predicted_projection
    The linearised Post-LN prediction: the component of delta along v is multiplied by
    (v'diag(gamma)v)/std(h + F(h)) at every LayerNorm.
fit_norm_growth, dilution_factor
    The Pre-LN dilution law ||h_l||^2 ~ ||h_0||^2 (1 + c l) and the relative-size factor
    sqrt((1 + c l)/(1 + c m)) that follows from it.
effect_window, predicted_window
    The operational "window": the injection layers whose output effect is at least a stated
    fraction of the largest one, with its position as a fraction of depth; and the window
    that the two first-order laws predict for the readable projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import as_float64, check_finite, check_int, check_real, real_array

__all__ = [
    "METRIC_NAMES",
    "perturbation_metrics",
    "next_token_kl",
    "embedding_change",
    "normalisation_scale",
    "postln_contraction_factors",
    "predicted_projection",
    "fit_norm_growth",
    "dilution_factor",
    "Window",
    "effect_window",
    "predicted_window",
    "unit_vectors",
]

#: Keys of the dictionary returned by :func:`perturbation_metrics`, in a stable order: the
#: metric vocabulary of every injection measurement (stacks, real models, experiments).
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
def perturbation_metrics(base, inj, v, centre=None) -> dict[str, np.ndarray]:
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

    centre : array_like, shape ``[L+1, d]``, optional
        A centre :math:`\mu_\ell` per layer (e.g. :func:`companion.injection.directions.stream_means`).
        When given, ``relative_size``, ``cos_inj_base`` and ``norm_ratio`` are computed on the
        centred states :math:`h - \mu_\ell` (:math:`\|\delta\|/\|h_{base} - \mu\|`,
        :math:`\cos(h_{inj} - \mu, h_{base} - \mu)`, :math:`\|h_{inj} - \mu\|/\|h_{base} - \mu\|`);
        ``projection``, ``cos_delta_v`` and ``delta_norm`` do not depend on a centre.  Default
        ``None``: uncentred, as before.

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
    check_finite(vv, "v")
    v_hat, zero = unit_vectors(vv)
    if np.any(zero):
        raise ValueError("v must be a non-zero vector (at every position); it gives the direction")
    mu = None
    if centre is not None:
        mu = as_float64(centre, "centre")
        if mu.shape != (shape[0], shape[-1]):
            raise ValueError(f"centre must have shape [L+1, d] = {(shape[0], shape[-1])}, got {mu.shape}")
        check_finite(mu, "centre")
    return _perturbation_metrics(base, inj, v_hat, mu)


def _perturbation_metrics(base, inj, v_hat: np.ndarray, mu: np.ndarray | None = None) -> dict:
    """:func:`perturbation_metrics` of checked inputs (``v_hat`` unit, ``mu`` float64 or None)."""
    shape = tuple(base.shape)
    out = {k: np.empty(shape[:-1], dtype=np.float64) for k in METRIC_NAMES}
    with np.errstate(invalid="ignore", divide="ignore"):
        for layer in range(shape[0]):  # one layer at a time: bounded float64 temporaries
            hb = as_float64(base[layer], "base")
            hi = as_float64(inj[layer], "inj")
            check_finite(hb, f"base[{layer}]")
            check_finite(hi, f"inj[{layer}]")
            delta = hi - hb
            if mu is not None:  # centred states for the size and angle to the baseline
                hb = hb - mu[layer]
                hi = hi - mu[layer]
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
    check_finite(arr, "x")
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
    check_finite(vv, "v")
    check_finite(g, "ln_weight")
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
    check_finite(f, "factors")
    n_layers = f.shape[0]
    ell = check_int(inject_layer, "inject_layer", 0)
    if ell > n_layers:
        raise ValueError(f"inject_layer must be in [0, {n_layers}] (L = {n_layers}), got {ell}")
    p0 = as_float64(initial, "initial")
    check_finite(p0, "initial")
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
    check_finite(r, "sq_norms")
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
    """The injection window of one stack (see :func:`effect_window`).

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

    @property
    def fractions(self) -> list[float]:
        """``[best, first, last, size]`` as fractions of depth (a row of a stored window array)."""
        return [self.best_fraction, self.first_fraction, self.last_fraction, self.size_fraction]


def effect_window(
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
    >>> w = effect_window([0.2, 1.0, 0.6, 0.1], n_layers=4)
    >>> w.layers.tolist(), w.best, w.last_fraction
    ([1, 2], 1, 0.5)
    >>> effect_window([0.9, 0.1, 0.8, 1.0]).layers.tolist()
    [2, 3]
    >>> effect_window([0.9, 0.1, 0.8, 1.0], contiguous=False).layers.tolist()
    [0, 2, 3]
    """
    e = as_float64(effect, "effect")
    if e.ndim != 1 or e.size == 0:
        raise ValueError(f"effect must be a non-empty 1-D array, got shape {e.shape}")
    check_finite(e, "effect")
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
# output effects
# --------------------------------------------------------------------------------------------
def next_token_kl(logits_base, logits_inj) -> np.ndarray:
    r"""KL divergence :math:`\mathrm{KL}(p_{base}\,\|\,p_{inj})` of next-token distributions.

    Parameters
    ----------
    logits_base, logits_inj : torch.Tensor or array_like, shape ``[..., vocab]``
        Unnormalised logits of the baseline and the injected run (same shape).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        :math:`\sum_w p_{base}(w)\,(\log p_{base}(w) - \log p_{inj}(w))` in nats, >= 0.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If the shapes differ, the last axis is empty, or a value is NaN/inf.

    Notes
    -----
    Computed from ``log_softmax`` in float64 (stable for any logit scale).  The direction
    :math:`\mathrm{KL}(p_{base}\|p_{inj})` weights the tokens the unperturbed model expects: it
    asks how surprised the original model's predictions would be by the injected ones.

    Examples
    --------
    >>> float(next_token_kl([0.0, 0.0], [0.0, 0.0]))
    0.0
    >>> round(float(next_token_kl([0.0, 0.0], [np.log(3.0), 0.0])), 4)   # KL(1/2,1/2 || 3/4,1/4)
    0.1438
    """
    import torch

    a = torch.as_tensor(real_array("logits_base", logits_base))
    b = torch.as_tensor(real_array("logits_inj", logits_inj))
    if a.shape != b.shape:
        raise ValueError(f"logits_base has shape {tuple(a.shape)} but logits_inj has {tuple(b.shape)}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError("logits must have a non-empty last (vocabulary) axis")
    return _next_token_kl(a, b)


def _next_token_kl(a, b) -> np.ndarray:
    """:func:`next_token_kl` of two float64 CPU tensors of one shape."""
    import torch

    la = torch.log_softmax(a, dim=-1)
    lb = torch.log_softmax(b, dim=-1)
    terms = la.exp() * (la - lb)
    # a token with p_base = 0 (log-probability -inf: logits 1e308 apart) contributes 0, not 0 * inf
    terms = torch.where(torch.isneginf(la), torch.zeros_like(terms), terms)
    kl = terms.sum(-1)
    return kl.clamp_min(0.0).numpy()


def embedding_change(e_base, e_inj) -> np.ndarray:
    r"""Change of a sentence embedding: :math:`1 - \cos(e_{base}, e_{inj})`.

    Parameters
    ----------
    e_base, e_inj : torch.Tensor or array_like, shape ``[..., d]``
        Embeddings of the baseline and the injected run (need not be normalised).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        In ``[0, 2]``; 0 when the two point the same way.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If the shapes differ, a vector is zero, or a value is NaN/inf.

    Notes
    -----
    Sentence-transformers compares embeddings by cosine similarity :cite:p:`reimers2019sbert`,
    so :math:`1 - \cos` is the change a user of the embedding sees.  Each vector is divided by a
    power of two near its largest entry first (exact), so embeddings of any magnitude in the
    float64 range give the same value.

    Examples
    --------
    >>> embedding_change([[1.0, 0.0]], [[0.0, 2.0]]).tolist()
    [1.0]
    """
    a = real_array("e_base", e_base)
    b = real_array("e_inj", e_inj)
    if a.shape != b.shape:
        raise ValueError(f"e_base has shape {a.shape} but e_inj has {b.shape}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError("embeddings must have a non-empty last axis")
    return _embedding_change(a, b)


def _embedding_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`embedding_change` of two float64 arrays of one shape."""
    # divide each vector by a power of two near its largest entry (exact): the norms neither
    # overflow (entries near 1e200 gave cos = 0) nor underflow (near 1e-200: "zero vector")
    a, b = (np.ldexp(x, -np.frexp(np.max(np.abs(x), axis=-1, keepdims=True))[1]) for x in (a, b))
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    if np.any(na == 0) or np.any(nb == 0):
        raise ValueError("an embedding is the zero vector; its direction is undefined")
    cos = np.clip(np.sum(a * b, axis=-1) / (na * nb), -1.0, 1.0)
    return 1.0 - cos
