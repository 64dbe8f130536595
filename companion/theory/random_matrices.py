"""Random weight matrices and bilinear forms: the bounds of the chapter ``random_matrices``.

The operator norm of a matrix with independent centred sub-Gaussian entries through a θ-net and a
union bound (``operator_norm_net_bound``), the sharp Gaussian bound of Gordon and Davidson–Szarek
with Gaussian concentration (``operator_norm_sharp_bound``), the tail of a Gaussian bilinear form
:math:`q^\\top M k` (``bilinear_tail_bound``: Hanson–Wright with explicit constants, or the exact
Chernoff bound) and the depth bound of a Pre-LN MLP stack's backward pass (``backward_growth_bound``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from companion._validation import check_int, check_real, real_array

__all__ = ["operator_norm_net_bound", "operator_norm_sharp_bound", "bilinear_tail_bound",
           "backward_growth_bound"]


def _shape_scale_delta(d_out, d_in, sigma_w, delta):
    return (check_int(d_out, "d_out", minimum=1), check_int(d_in, "d_in", minimum=1),
            check_real(sigma_w, "sigma_w", lo=0.0, lo_open=True),
            check_real(delta, "delta", lo=0.0, lo_open=True, hi=1.0, hi_open=True))


def _net_bound(d_out, d_in, sigma_w, delta, theta):
    log_card = (d_out + d_in) * math.log1p(2.0 / theta)
    return sigma_w / (1.0 - 2.0 * theta) * math.sqrt(2.0 * (log_card + math.log(1.0 / delta)))


def operator_norm_net_bound(d_out, d_in, sigma_w, delta, theta=0.25):
    """A level :math:`b` with :math:`P(\\lVert W\\rVert > b)\\le\\delta`, from θ-nets and a union bound.

    Parameters
    ----------
    d_out, d_in : int
        The shape of :math:`W` (at least 1 each).
    sigma_w : float
        The variance proxy :math:`\\sigma_w^2` of every entry is ``sigma_w**2`` (the standard deviation
        for Gaussian entries); > 0.
    delta : float
        The failure probability, in (0, 1).
    theta : float or None, default 0.25
        The mesh of the nets, in (0, 1/2); ``None`` minimises the bound over θ.

    Returns
    -------
    float
        :math:`b=\\frac{\\sigma_w}{1-2\\theta}\\sqrt{2\\,((d_{out}+d_{in})\\ln(1+2/\\theta)+\\ln(1/\\delta))}`.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or lies outside its range.

    Notes
    -----
    Entries independent, centred and :math:`\\sigma_w^2`-sub-Gaussian. A θ-net of the unit sphere of
    :math:`\\mathbb R^n` has at most :math:`(1+2/\\theta)^n` points, :math:`\\lVert W\\rVert\\le(1-2\\theta)^{-1}
    \\max_{x,y}y^\\top Wx` over the two nets, and each :math:`y^\\top Wx` is :math:`\\sigma_w^2`-sub-Gaussian
    (Vershynin 2018, §4.4). At θ = 1/4 this is :math:`2\\sigma_w\\sqrt{2\\ln 9\\,(d_{out}+d_{in})+2\\ln(1/\\delta)}`.

    Examples
    --------
    >>> round(operator_norm_net_bound(100, 100, 0.1, 0.01), 3)
    5.96
    """
    d_out, d_in, sigma_w, delta = _shape_scale_delta(d_out, d_in, sigma_w, delta)
    if theta is None:
        res = optimize.minimize_scalar(lambda th: _net_bound(d_out, d_in, sigma_w, delta, th),
                                       bounds=(1e-6, 0.5 - 1e-6), method="bounded",
                                       options={"xatol": 1e-10})
        return float(min(res.fun, _net_bound(d_out, d_in, sigma_w, delta, 0.25)))
    theta = check_real(theta, "theta", lo=0.0, lo_open=True, hi=0.5, hi_open=True)
    return _net_bound(d_out, d_in, sigma_w, delta, theta)


def operator_norm_sharp_bound(d_out, d_in, sigma_w, delta):
    """The sharp Gaussian level :math:`\\sigma_w(\\sqrt{d_{out}}+\\sqrt{d_{in}}+\\sqrt{2\\ln(1/\\delta)})`.

    Parameters
    ----------
    d_out, d_in : int
        The shape of :math:`W` (at least 1 each).
    sigma_w : float
        The standard deviation of the i.i.d. :math:`\\mathcal N(0,\\sigma_w^2)` entries; > 0.
    delta : float
        The failure probability, in (0, 1).

    Returns
    -------
    float
        A level exceeded by :math:`\\lVert W\\rVert` with probability at most ``delta``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or lies outside its range.

    Notes
    -----
    Gaussian entries only: :math:`\\mathbb E\\lVert W\\rVert\\le\\sigma_w(\\sqrt{d_{out}}+\\sqrt{d_{in}})`
    (Gordon's inequality; Davidson and Szarek 2001, Theorem II.13), and :math:`\\lVert W\\rVert` is a
    :math:`\\sigma_w`-Lipschitz function of the standard Gaussian entries, so Gaussian concentration adds
    :math:`\\sigma_w\\sqrt{2\\ln(1/\\delta)}`.

    Examples
    --------
    >>> round(operator_norm_sharp_bound(100, 100, 0.1, 0.01), 4)
    2.3035
    """
    d_out, d_in, sigma_w, delta = _shape_scale_delta(d_out, d_in, sigma_w, delta)
    return sigma_w * (math.sqrt(d_out) + math.sqrt(d_in) + math.sqrt(2.0 * math.log(1.0 / delta)))


def _chernoff_tail(t, sv, scale):
    b = scale * sv.max()
    if t == 0.0 or b == 0.0:
        return 1.0
    x2 = (scale * sv) ** 2

    def exponent(lam):  # -lambda t + log E exp(lambda Z), lambda in (0, 1/b)
        return -lam * t - 0.5 * np.sum(np.log1p(-lam * lam * x2))

    res = optimize.minimize_scalar(exponent, bounds=(0.0, (1.0 - 1e-12) / b), method="bounded",
                                   options={"xatol": 1e-12 / b})
    return float(min(1.0, math.exp(min(0.0, res.fun))))


def bilinear_tail_bound(t, singular_values, scale=1.0, method="hanson-wright"):
    """Bound on :math:`P(q^\\top Mk\\ge t)` for independent :math:`q\\sim\\mathcal N(0,\\tau_q^2I)`, :math:`k\\sim\\mathcal N(0,\\tau_k^2I)`.

    Parameters
    ----------
    t : float
        The threshold, >= 0 (the two-sided tail :math:`P(\\lvert q^\\top Mk\\rvert\\ge t)` is twice this).
    singular_values : array_like
        The singular values of :math:`M` (non-negative, at least one).
    scale : float, default 1.0
        :math:`\\tau_q\\tau_k`, the product of the coordinate standard deviations; > 0.
    method : {"hanson-wright", "chernoff"}
        ``"hanson-wright"``: the explicit form
        :math:`\\exp(-\\min(a, b))` with :math:`a=t^2/(4c^2\\lVert M\\rVert_F^2)`,
        :math:`b=t/(2\\sqrt2\\,c\\lVert M\\rVert)` and :math:`c` = ``scale``;
        ``"chernoff"``: the exact Chernoff bound
        :math:`\\inf_\\lambda e^{-\\lambda t}\\prod_i(1-\\lambda^2c^2s_i^2)^{-1/2}` (never larger).

    Returns
    -------
    float
        The bound, in (0, 1].

    Raises
    ------
    TypeError, ValueError
        If ``t`` or ``scale`` is not a finite number in range, a singular value is negative, or
        ``method`` is unknown.

    Notes
    -----
    Given :math:`k`, :math:`q^\\top Mk\\sim\\mathcal N(0,\\tau_q^2\\lVert Mk\\rVert^2)`, so
    :math:`\\mathbb Ee^{\\lambda q^\\top Mk}=\\mathbb Ee^{\\lambda^2\\tau_q^2\\lVert Mk\\rVert^2/2}
    =\\prod_i(1-\\lambda^2c^2s_i^2)^{-1/2}`; with :math:`-\\ln(1-x)\\le 2x` for :math:`x\\le1/2` the
    explicit form follows (Hanson and Wright 1971; Rudelson and Vershynin 2013 for sub-Gaussian vectors).

    Examples
    --------
    >>> round(bilinear_tail_bound(3.0, [1.0]), 4)
    0.3462
    >>> round(bilinear_tail_bound(3.0, [1.0], method="chernoff"), 4)
    0.1482
    """
    t = check_real(t, "t", lo=0.0)
    sv = real_array("singular_values", singular_values).ravel()
    if sv.size == 0:
        raise ValueError("singular_values must hold at least one value")
    if np.any(sv < 0):
        raise ValueError("singular_values must be >= 0 (pass np.linalg.svd(M, compute_uv=False))")
    scale = check_real(scale, "scale", lo=0.0, lo_open=True)
    if method not in ("hanson-wright", "chernoff"):
        raise ValueError(f"method must be 'hanson-wright' or 'chernoff', got {method!r}")
    frob, op = scale * math.sqrt(float(np.sum(sv * sv))), scale * float(sv.max())
    if op == 0.0:
        return 1.0 if t == 0.0 else 0.0
    if method == "chernoff":
        return _chernoff_tail(t, sv, scale)
    return math.exp(-min(t * t / (4.0 * frob * frob), t / (2.0 * math.sqrt(2.0) * op)))


def backward_growth_bound(depth, d, d_ff, gain, token_std, delta):
    """W.h.p. bound on :math:`\\lVert\\nabla_\\ell\\rVert/\\lVert\\nabla_L\\rVert` in a Pre-LN MLP stack under (X).

    Parameters
    ----------
    depth : int
        The number of blocks :math:`L` (>= 1).
    d, d_ff : int
        The stream and hidden widths (>= 1).
    gain : float
        The gain :math:`g` of the output projections; > 0.
    token_std : array_like
        :math:`s(h_\\ell)` for :math:`\\ell=0,\\dots,L-1` (one token's standard deviation at each layer, or
        a lower bound of it over tokens), all > 0.
    delta : float
        The failure probability, in (0, 1), shared by the :math:`2L` weight matrices.

    Returns
    -------
    numpy.ndarray
        Shape ``(depth + 1,)``: entry :math:`\\ell` bounds :math:`\\lVert\\nabla_\\ell\\rVert/\\lVert\\nabla_L\\rVert`
        (entry :math:`L` is 1), simultaneously for all layers, with probability >= 1 - ``delta``.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type, lies outside its range, or ``token_std`` has the wrong length.

    Notes
    -----
    Each block's Jacobian is :math:`I+W^{2\\top}DW^{1\\top}J` with :math:`\\lVert D\\rVert\\le1`,
    :math:`\\lVert J\\rVert=1/s(h_\\ell)`; each weight matrix obeys the sharp bound at level
    :math:`\\delta/(2L)`: :math:`\\lVert W^1\\rVert\\le b`, :math:`\\lVert W^2\\rVert\\le gb`,
    :math:`b=\\sigma(\\sqrt d+\\sqrt{d_{ff}}+\\sqrt{2\\ln(2L/\\delta)})`, :math:`\\sigma^2=2/(d+d_{ff})`.

    Examples
    --------
    >>> backward_growth_bound(2, 64, 64, 1.0, [1.0, 1.0], 0.01).round(2)
    array([47.86,  6.92,  1.  ])
    """
    depth = check_int(depth, "depth", minimum=1)
    d, d_ff = check_int(d, "d", minimum=1), check_int(d_ff, "d_ff", minimum=1)
    gain = check_real(gain, "gain", lo=0.0, lo_open=True)
    s = real_array("token_std", token_std, shape=(depth,))
    if np.any(s <= 0):
        raise ValueError("token_std must be > 0 at every layer (a constant token has no LayerNorm)")
    delta = check_real(delta, "delta", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    b = operator_norm_sharp_bound(d, d_ff, math.sqrt(2.0 / (d + d_ff)), delta / (2 * depth))
    factors = 1.0 + gain * b * b / s
    return np.append(np.cumprod(factors[::-1])[::-1], 1.0)
