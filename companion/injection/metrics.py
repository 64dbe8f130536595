"""The one metric vocabulary of every injection.

Perturbation metrics, output effects, the linearised Post-LN and Pre-LN laws, and the injection
window.  A *stream pair* is ``base`` and ``inj`` of one shape ``[L+1, ..., d]`` (index ``l`` = the stream
before block ``l``), ``delta = inj - base``.  Derivations: chapter :doc:`/book/three_effect_framework`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import as_float64, check_finite, check_int, check_real, real_array

__all__ = [
    "METRIC_NAMES", "perturbation_metrics", "next_token_kl", "embedding_change",
    "normalisation_scale", "postln_contraction_factors", "predicted_projection", "fit_norm_growth",
    "dilution_factor", "Window", "effect_window", "predicted_window"]

#: Keys of the dictionary returned by :func:`perturbation_metrics`, in a stable order: the
#: metric vocabulary of every injection measurement (stacks, real models, experiments).
METRIC_NAMES = ("projection", "cos_delta_v", "delta_norm", "relative_size", "cos_inj_base", "norm_ratio")


def _unit_vectors(v: np.ndarray, flat: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(v / ||v||, ||v|| == 0)`` along the last axis for any magnitude (``flat``: ``v`` is one vector)."""
    _, e = np.frexp(np.max(np.abs(v), axis=-1, keepdims=True))
    scaled = np.ldexp(v, -e)
    norm = np.linalg.norm(scaled) if flat else np.linalg.norm(scaled, axis=-1, keepdims=True)
    zero = np.asarray(norm == 0).reshape(v.shape[:-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return scaled / norm, zero


#: Magnitudes whose squares are safely inside the normal float64 range.
_SAFE_MIN, _SAFE_MAX = 1e-150, 1e150


def perturbation_metrics(base, inj, v, centre=None) -> dict[str, np.ndarray]:
    r"""Per-layer metrics of the difference between an injected and a baseline run.

    The first three are the measures of :cite:t:`hahami2025disturbance`; computed one layer at a
    time in float64.

    Parameters
    ----------
    base, inj : array_like or torch.Tensor, shape ``[L+1, ..., d]``
        Baseline and injected streams; the middle axes (batch, tokens, ...) are kept.
    v : array_like or torch.Tensor, shape ``[d]`` or broadcastable to ``base.shape[1:]``
        Injected direction (normalised here; may be per position).
    centre : array_like, shape ``[L+1, d]``, optional
        :math:`\mu_\ell` (:func:`companion.injection.directions.stream_means`): the size and
        angle metrics are then computed on :math:`h - \mu_\ell`.

    Returns
    -------
    dict of str to numpy.ndarray
        Keyed by :data:`METRIC_NAMES`, each float64 of shape ``base.shape[:-1]``; with
        :math:`\delta = h_{inj} - h_{base}`: ``projection`` :math:`\delta\cdot\hat v`,
        ``cos_delta_v`` :math:`\cos(\delta, v)`, ``delta_norm`` :math:`\|\delta\|`,
        ``relative_size`` :math:`\|\delta\|/\|h_{base}\|`, ``cos_inj_base``
        :math:`\cos(h_{inj}, h_{base})`, ``norm_ratio`` :math:`\|h_{inj}\|/\|h_{base}\|`;
        NaN where undefined (a zero vector).

    Raises
    ------
    TypeError, ValueError
        For a non-real input (TypeError), mismatched shapes, a zero or non-broadcasting ``v``, NaN/inf.

    Examples
    --------
    >>> base = np.zeros((3, 4)); base[:, 0] = 1.0
    >>> inj = base.copy(); inj[1:, 1] = [0.5, 0.25]
    >>> perturbation_metrics(base, inj, np.array([0.0, 2.0, 0.0, 0.0]))["projection"].tolist()
    [0.0, 0.5, 0.25]
    """
    base, inj = (x if hasattr(x, "shape") and hasattr(x, "__getitem__") else as_float64(x, name)
                 for x, name in ((base, "base"), (inj, "inj")))  # tensors stay: converted per layer
    shape, ishape = tuple(base.shape), tuple(inj.shape)
    vv = as_float64(v, "v")
    if len(shape) < 2:
        raise ValueError(f"base must have shape [L+1, ..., d] (at least 2 dimensions), got shape {shape}")
    if ishape != shape:
        raise ValueError(f"inj has shape {ishape} but base has shape {shape}; they must match")
    if vv.ndim == 0 or vv.shape[-1] != shape[-1]:
        raise ValueError(f"v must have last dimension d = {shape[-1]} (the width of the stream), "
                         f"got shape {vv.shape}")
    if vv.ndim > len(shape) - 1:
        raise ValueError(f"v has {vv.ndim} dimensions but one layer of the stream has {len(shape) - 1}; "
                         "v must not add dimensions")
    try:
        np.broadcast_shapes(vv.shape, shape[1:])
    except ValueError:
        raise ValueError(f"v of shape {vv.shape} does not broadcast to one layer of the stream, "
                         f"shape {shape[1:]}; pass shape [d] or a per-position shape ending in d") from None
    check_finite(vv, "v")
    v_hat, zero = _unit_vectors(vv)
    if np.any(zero):
        raise ValueError("v must be a non-zero vector (at every position); it gives the direction")
    mu = None if centre is None else real_array("centre", centre)
    if mu is not None and mu.shape != (shape[0], shape[-1]):
        raise ValueError(f"centre must have shape [L+1, d] = {(shape[0], shape[-1])}, got {mu.shape}")
    return _perturbation_metrics(base, inj, v_hat, mu)


def _perturbation_metrics(base, inj, v_hat: np.ndarray, mu: np.ndarray | None = None) -> dict:
    """:func:`perturbation_metrics` of checked ``v_hat`` (unit) and ``mu`` (float64 or None)."""
    shape = tuple(base.shape)
    out = {k: np.empty(shape[:-1], dtype=np.float64) for k in METRIC_NAMES}
    with np.errstate(invalid="ignore", divide="ignore"):
        for layer in range(shape[0]):
            hb = as_float64(base[layer], "base")
            hi = as_float64(inj[layer], "inj")
            check_finite(hb, f"base[{layer}]")
            check_finite(hi, f"inj[{layer}]")
            delta = hi - hb
            if mu is not None:
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
                denom > 0, np.clip(np.sum(hb * hi, axis=-1) / denom, -1.0, 1.0), np.nan)
    return out


def normalisation_scale(x, eps: float = 0.0, norm: str = "layernorm") -> np.ndarray:
    r"""The scale a normalisation divides by: :math:`\sqrt{\operatorname{Var}(x) + \varepsilon}`.

    Parameters
    ----------
    x : array_like or torch.Tensor, shape ``[..., d]``
        Normalisation inputs over the last axis, ``d >= 2``.
    eps : float, default 0.0
        The normalisation's ``eps`` (>= 0).
    norm : {"layernorm", "rmsnorm"}, default "layernorm"
        Centred scale (LayerNorm) or root mean square (RMSNorm).

    Returns
    -------
    numpy.ndarray, shape ``x.shape[:-1]``
        :math:`s(x)`; rows outside the normal float64 range are rescaled exactly first.

    Raises
    ------
    TypeError, ValueError
        For a non-real or non-finite input, ``d < 2``, ``eps < 0``, an unknown ``norm``, an overflow.

    Examples
    --------
    >>> float(normalisation_scale([2.0, 2.0], eps=0.25))
    0.5
    """
    arr = as_float64(x, "x")
    eps = check_real(eps, "eps", lo=0.0)
    if norm not in ("layernorm", "rmsnorm"):
        raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")
    if arr.ndim == 0 or arr.shape[-1] < 2:
        raise ValueError(f"x must have a last axis of length d >= 2 (the features), got shape {arr.shape}")
    check_finite(arr, "x")
    with np.errstate(over="ignore", under="ignore"):
        if norm == "rmsnorm":
            s = np.sqrt(np.mean(arr**2, axis=-1) + eps)
        else:
            s = np.sqrt(np.var(arr, axis=-1) + eps)
        # rows whose squares leave the normal range: rescale by a power of two (exact),
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


def postln_contraction_factors(ln_inputs, eps: float = 0.0, residual_scale: float = 1.0, ln_weight=None, v=None,
                               norm: str = "layernorm") -> np.ndarray:
    r"""Per-layer factors by which Post-LN multiplies the component of a perturbation along ``v``.

    Proof: :prf:ref:`tef-prop-postln` of the chapter :doc:`/book/three_effect_framework`.

    Parameters
    ----------
    ln_inputs : array_like or torch.Tensor, shape ``[L, ..., d]``
        Baseline input :math:`u_l` of each block's norm (``StackOutput.pre_norm``).
    eps : float, default 0.0
    residual_scale : float, default 1.0
        Skip-path weight :math:`\lambda > 0`.
    ln_weight : array_like, shape ``[d]`` or ``[L, ..., d]``, optional
        Norm gains :math:`\gamma_l` (default ones); needs ``v``.
    v : array_like, shape ``[d]``, optional
        Perturbation direction (only with ``ln_weight``).
    norm : {"layernorm", "rmsnorm"}, default "layernorm"

    Returns
    -------
    numpy.ndarray, shape ``ln_inputs.shape[:-1]``
        :math:`f_l = \lambda\,\hat v^\top\operatorname{diag}(\gamma_l)\hat v / s(u_l)`.

    Raises
    ------
    TypeError, ValueError
        As :func:`normalisation_scale`; for ``residual_scale <= 0``, or a missing or zero ``v``.

    Examples
    --------
    >>> u = np.array([[[2.0, -2.0, 2.0, -2.0]], [[0.5, -0.5, 0.5, -0.5]]])
    >>> postln_contraction_factors(u).ravel().tolist()
    [0.5, 2.0]
    """
    u = as_float64(ln_inputs, "ln_inputs")
    if u.ndim < 2:
        raise ValueError(f"ln_inputs must have shape [L, ..., d] (at least 2 dimensions), got {u.shape}")
    lam = check_real(residual_scale, "residual_scale")
    if lam <= 0:
        raise ValueError(f"residual_scale (lambda) must be > 0, got {lam}")
    s = normalisation_scale(u, eps, norm)
    if ln_weight is None:
        return lam / s
    if v is None:
        raise ValueError("ln_weight was given without v; pass the injected direction v as well")
    g = real_array("ln_weight", ln_weight)
    d = u.shape[-1]
    vv = real_array("v", v, shape=(d,))
    if g.ndim == 0 or g.shape[-1] != d or g.ndim not in (1, u.ndim):
        raise ValueError(f"ln_weight must have shape [d] or as many axes as ln_inputs ({u.ndim}), ending "
                         f"in d = {d}, e.g. [L, 1, 1, d]; got {g.shape}")
    try:
        np.broadcast_shapes(g.shape, u.shape)
    except ValueError:
        raise ValueError(f"ln_weight of shape {g.shape} does not broadcast to ln_inputs of shape {u.shape}; "
                         "give it singleton axes for batch and tokens, e.g. [L, 1, 1, d]") from None
    v_hat, zero = _unit_vectors(vv, flat=True)
    if zero:
        raise ValueError("v must be a non-zero vector")
    gain = np.sum(g * v_hat**2, axis=-1)  # v_hat' diag(gamma) v_hat, shape g.shape[:-1]
    return lam * gain / s


def predicted_projection(factors, inject_layer: int, initial) -> np.ndarray:
    r"""Propagate a projection through per-layer multiplicative factors.

    Parameters
    ----------
    factors : array_like, shape ``[L, ...]``
        Factor :math:`f_l` of block ``l`` (e.g. :func:`postln_contraction_factors`).
    inject_layer : int
        Stream index :math:`\ell \in [0, L]` of the injection.
    initial : float or array_like broadcastable to ``factors.shape[1:]``
        Projection :math:`p_\ell` just after the injection (0 where nothing was injected).

    Returns
    -------
    numpy.ndarray, shape ``[L+1, ...]``
        0 below :math:`\ell`, then :math:`p_\ell \prod_{j=\ell}^{m-1} f_j`.

    Raises
    ------
    TypeError, ValueError
        For wrong types; empty or non-finite ``factors``, ``inject_layer`` outside [0, L], bad ``initial``.

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
    p0 = real_array("initial", initial)
    try:
        p0 = np.broadcast_to(p0, f.shape[1:])
    except ValueError:
        raise ValueError(f"initial of shape {np.shape(p0)} does not broadcast to the per-layer shape "
                         f"{f.shape[1:]}") from None
    out = np.zeros((n_layers + 1,) + f.shape[1:], dtype=np.float64)
    out[ell] = p0
    if ell < n_layers:
        out[ell + 1 :] = p0 * np.cumprod(f[ell:], axis=0)
    return out


def fit_norm_growth(sq_norms) -> float:
    r"""Fit the slope :math:`c` of :math:`\|h_l\|^2/\|h_0\|^2 \approx 1 + c\,l` by least squares (through 1 at 0).

    Parameters
    ----------
    sq_norms : array_like, shape ``[L+1]``
        :math:`\mathbb E\|h_l\|^2` per layer, first entry > 0.

    Returns
    -------
    float
        :math:`c = \sum_l l\,(r_l - 1) / \sum_l l^2`.

    Raises
    ------
    TypeError, ValueError
        If ``sq_norms`` is not real, 1-D, >= 2 long, finite, >= 0 and ``[0] > 0``, or the slope overflows.

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
        raise ValueError(f"the growth slope exceeds the float64 range (sq_norms[0] = {r[0]:.4g}, max "
                         f"{r.max():.4g}); the ratios ||h_l||^2/||h_0||^2 overflow")
    return c


def dilution_factor(c: float, inject_layer: int, layers) -> np.ndarray:
    r"""Relative-size factor :math:`\sqrt{(1 + c\ell)/(1 + c m)}` of the Pre-LN dilution law.

    Parameters
    ----------
    c : float
        Growth slope (:func:`fit_norm_growth`), >= 0.
    inject_layer : int
        Stream index :math:`\ell \ge 0` of the injection.
    layers : int or array_like of int
        Stream indices :math:`m \ge \ell`.

    Returns
    -------
    numpy.ndarray
        Relative size at ``m`` over relative size at :math:`\ell`.

    Raises
    ------
    TypeError, ValueError
        For wrong types (TypeError), ``c < 0``, ``inject_layer < 0`` or some ``m < inject_layer``.

    Examples
    --------
    >>> dilution_factor(1.0, 0, [0, 3]).tolist()
    [1.0, 0.5]
    """
    c = check_real(c, "c", lo=0.0)
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


@dataclass(frozen=True)
class Window:
    """The injection window of one stack (see :func:`effect_window`)."""

    layers: np.ndarray  #: Injection layers in the window, ascending.
    best: int  #: Layer of the largest effect.
    first: int  #: Smallest layer in the window (-1 if empty).
    last: int  #: Largest layer in the window (-1 if empty).
    n_layers: int  #: Depth ``L``; fractions are ``layer / L``.
    threshold: float  #: The threshold used.
    relative: bool  #: Whether it was relative to the largest effect.

    @property
    def best_fraction(self) -> float:  # numpydoc ignore=RT01
        """``best / L``."""
        return self.best / self.n_layers

    @property
    def first_fraction(self) -> float:  # numpydoc ignore=RT01
        """``first / L``."""
        return self.first / self.n_layers

    @property
    def last_fraction(self) -> float:  # numpydoc ignore=RT01
        """``last / L``."""
        return self.last / self.n_layers

    @property
    def size_fraction(self) -> float:  # numpydoc ignore=RT01
        """Number of injection layers in the window divided by ``L``."""
        return len(self.layers) / self.n_layers

    @property
    def fractions(self) -> list[float]:  # numpydoc ignore=RT01
        """``[best, first, last, size]`` as fractions of depth (a row of a stored window array)."""
        return [self.best_fraction, self.first_fraction, self.last_fraction, self.size_fraction]


def effect_window(effect, layers=None, n_layers: int | None = None, threshold: float = 0.5, relative: bool = True,
                  contiguous: bool = True) -> Window:
    r"""The window: injection layers whose output effect reaches a threshold.

    The book's definition of the "introspection window" of :cite:t:`hahami2025disturbance`.

    Parameters
    ----------
    effect : array_like, shape ``[K]``
        Non-negative output effect :math:`E(\ell)` of each tested injection layer.
    layers : array_like of int, shape ``[K]``, optional
        The tested layers, strictly increasing (default ``0 .. K-1``).
    n_layers : int, optional
        Depth ``L`` (default ``K``).
    threshold : float, default 0.5
        :math:`\tau`: :math:`E(\ell) \ge \tau \max E` (``relative``, :math:`0 < \tau \le 1`) or
        :math:`E(\ell) \ge \tau` (:math:`\tau > 0`).
    relative : bool, default True
        Whether ``threshold`` is a fraction of the largest effect.
    contiguous : bool, default True
        Keep only the run of consecutive layers through the best one.

    Returns
    -------
    Window
        Empty (``first = last = -1``) if no layer reaches an absolute threshold.

    Raises
    ------
    TypeError, ValueError
        For wrong types (TypeError); a bad ``effect`` or ``layers``, or a threshold out of range.

    Examples
    --------
    >>> effect_window([0.9, 0.1, 0.8, 1.0]).layers.tolist()
    [2, 3]
    """
    e = as_float64(effect, "effect")
    if e.ndim != 1 or e.size == 0:
        raise ValueError(f"effect must be a non-empty 1-D array, got shape {e.shape}")
    check_finite(e, "effect")
    if np.any(e < 0):
        raise ValueError("effect must be non-negative (it measures a size of change)")
    for flag, name in ((relative, "relative"), (contiguous, "contiguous")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
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
    if contiguous:  # the run of layers through the best one: a run has one value of cumsum(~above)
        run = np.cumsum(~above)
        above = above & (run == run[i_best]) & above[i_best]
    inside = lay[above]
    best = int(lay[i_best])
    first = int(inside[0]) if inside.size else -1
    last = int(inside[-1]) if inside.size else -1
    return Window(
        layers=inside.astype(int), best=best, first=first, last=last, n_layers=depth,
        threshold=tau, relative=relative)


def predicted_window(placement: str, n_layers: int, threshold: float = 0.5, factor: float | None = None,
                     c: float | None = None) -> tuple[int, int]:
    r"""Window of the readable projection predicted by the first-order laws, ``(first, last)``.

    Post-LN: a fixed number of last layers; Pre-LN: lower edge :math:`\to \tau^2 L`.

    Parameters
    ----------
    placement : {"pre", "post"}
    n_layers : int
        Depth ``L`` (injection layers ``0 .. L-1``).
    threshold : float, default 0.5
        Relative threshold :math:`\tau \in (0, 1]`.
    factor : float, optional
        Post-LN (required): mean per-block factor :math:`\bar f \in (0, 1]`.
    c : float, optional
        Pre-LN (required): growth slope of :func:`fit_norm_growth`, >= 0.

    Returns
    -------
    (int, int)
        First and last injection layer; the last is ``L - 1``.

    Raises
    ------
    TypeError, ValueError
        For wrong types; an unknown ``placement``, or a missing or out-of-range parameter.

    Examples
    --------
    >>> predicted_window("post", 32, factor=0.5)
    (30, 31)
    """
    if placement not in ("pre", "post"):
        raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
    L = check_int(n_layers, "n_layers", 1)
    tau = check_real(threshold, "threshold", lo=0.0, lo_open=True, hi=1.0)
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
    c = check_real(c, "c", lo=0.0)
    if c == 0:
        return 0, L - 1
    with np.errstate(over="ignore"):
        edge = (tau**2 * (1 + c * (L - 1)) - 1) / c - 1e-12
        if not np.isfinite(edge):  # c (L - 1) beyond 1.8e308, or (tau^2 - 1)/c below -1.8e308
            edge = tau**2 * (L - 1) + (tau**2 - 1) / c - 1e-12
    if not edge > 0:  # also -inf: c -> 0, the whole stack is in the window
        return 0, L - 1
    return max(0, int(np.ceil(edge))), L - 1


def next_token_kl(logits_base, logits_inj) -> np.ndarray:
    r""":math:`\mathrm{KL}(p_{base}\,\|\,p_{inj})` of next-token distributions, in nats.

    Parameters
    ----------
    logits_base, logits_inj : torch.Tensor or array_like, shape ``[..., vocab]``
        Logits of the baseline and the injected run (same shape).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        Non-negative; from ``log_softmax`` in float64.

    Raises
    ------
    TypeError, ValueError
        If an input is not real; for different shapes, an empty vocabulary axis, or NaN/inf.

    Examples
    --------
    >>> round(float(next_token_kl([0.0, 0.0], [np.log(3.0), 0.0])), 4)
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
    # a token with p_base = 0 (logits 1e308 apart) contributes 0, not 0 * inf
    terms = torch.where(torch.isneginf(la), torch.zeros_like(terms), terms)
    kl = terms.sum(-1)
    return kl.clamp_min(0.0).numpy()


def embedding_change(e_base, e_inj) -> np.ndarray:
    r"""Change of a sentence embedding, :math:`1 - \cos(e_{base}, e_{inj})` :cite:p:`reimers2019sbert`.

    Parameters
    ----------
    e_base, e_inj : torch.Tensor or array_like, shape ``[..., d]``
        Embeddings of the baseline and the injected run (need not be normalised).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        In ``[0, 2]``, for embeddings of any magnitude in the float64 range.

    Raises
    ------
    TypeError, ValueError
        If an input is not real; for different shapes, a zero vector, or NaN/inf.

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
    # divide each vector by a power of two near its largest entry (exact): no over/underflow
    a, b = (np.ldexp(x, -np.frexp(np.max(np.abs(x), axis=-1, keepdims=True))[1]) for x in (a, b))
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    if np.any(na == 0) or np.any(nb == 0):
        raise ValueError("an embedding is the zero vector; its direction is undefined")
    cos = np.clip(np.sum(a * b, axis=-1) / (na * nb), -1.0, 1.0)
    return 1.0 - cos
