r"""Norms of random vectors and maxima of correlated Gaussian coordinates.

Theory, notation and proofs: chapter :doc:`/book/norms_and_maxima` (:math:`d` coordinates of a
vector, :math:`N` coordinates of a maximum, :math:`n` signs of a Rademacher sum).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import special

from companion.theory import _cgf
from companion._validation import (
    as_real_array, check_choice, check_int, check_real, check_sigma2, check_t, real_array)

__all__ = ["subgaussian_norm_bound", "norm_square_bound", "khintchine_constants", "rademacher_moment",
           "correlated_max_factors", "equicorrelated_max_expectation"]

_C4 = 32.0 * math.sqrt(2.0)     # E X^4 <= 32 sqrt(2) sigma^4 for a sigma^2-sub-Gaussian X


def norm_square_bound(s, d, sigma2=1.0, tail: str = "upper", m4=None):
    r"""Tail bounds for :math:`\|X\|^2-d`, :math:`X` with independent centred
    :math:`\sigma^2`-sub-Gaussian coordinates of second moment 1.

    ``"upper"``: :math:`P(\|X\|^2-d\ge s)\le\exp\bigl(-\frac{s^2}{2(32\sqrt2\,d\sigma^4+4\sigma^2s)}\bigr)`;
    ``"lower"``: :math:`P(d-\|X\|^2\ge s)\le\exp\bigl(-\frac{s^2}{2dm_4}\bigr)`, with :math:`m_4\ge
    \max_i\mathbb EX_i^4` (default :math:`32\sqrt2\sigma^4`).

    Parameters
    ----------
    s : float or array_like
        Deviations :math:`s\ge0`.
    d : int
        Dimension, :math:`d\ge1`.
    sigma2 : float, default 1
        Sub-Gaussian variance proxy of each coordinate (at least its variance, 1).
    tail : {"upper", "lower"}, default "upper"
    m4 : float, optional
        A bound on the fourth moments (lower tail only), at least 1.

    Returns
    -------
    float or numpy.ndarray

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range.

    Examples
    --------
    >>> round(norm_square_bound(0.0, 10), 6)
    1.0
    """
    s_arr = check_t(s)
    dd = check_int(d, "d", 1)
    sig2 = check_real(sigma2, "sigma2", lo=1.0)
    if check_choice(tail, "tail", ("upper", "lower")) == "lower":
        q4 = _C4 * sig2 ** 2 if m4 is None else check_real(m4, "m4", lo=1.0)
        out = np.exp(-s_arr ** 2 / (2.0 * dd * q4))
    else:
        out = np.exp(-s_arr ** 2 / (2.0 * (_C4 * dd * sig2 ** 2 + 4.0 * sig2 * s_arr)))
    return _cgf.scalar_or_array(out)


def subgaussian_norm_bound(t, sigma2=1.0):
    r"""Dimension-free bound :math:`P(|\,\|X\|-\sqrt d\,|\ge t)\le2\exp\bigl(-\frac{t^2}{2\sigma^2
    (4+32\sqrt2\,\sigma^2)}\bigr)`.

    For :math:`X\in\mathbb R^d` with independent centred :math:`\sigma^2`-sub-Gaussian coordinates of
    second moment 1, every :math:`d` (Vershynin, *High-Dimensional Probability*, Thm. 3.1.1, with the
    explicit constant proved in chapter :doc:`/book/norms_and_maxima`).

    Parameters
    ----------
    t : float or array_like
        Deviations :math:`t\ge0`.
    sigma2 : float or array_like, default 1
        The coordinates' variance proxy, at least 1; broadcast with ``t``.

    Returns
    -------
    float or numpy.ndarray
        The bound, not capped at 1.

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range.

    Examples
    --------
    >>> round(subgaussian_norm_bound(10.0), 4)     # 2 exp(-100 / (2 (4 + 45.25)))
    0.7247
    """
    t_b, s_b = _cgf.broadcast(t=check_t(t), sigma2=check_sigma2(sigma2))
    if (s_b < 1.0).any():
        raise ValueError("sigma2 must be >= 1 (the proxy is at least the variance, 1)")
    return _cgf.scalar_or_array(2.0 * np.exp(-t_b ** 2 / (2.0 * s_b * (4.0 + _C4 * s_b))))


def khintchine_constants(p, kind: str = "subgaussian"):
    r"""Constants :math:`A_p\le\bigl(\mathbb E|\sum_ia_i\varepsilon_i|^p\bigr)^{1/p}\le B_p` for
    :math:`\sum_ia_i^2=1` and independent Rademacher signs :math:`\varepsilon_i`.

    ``"subgaussian"`` (proved in the chapter): :math:`B_p=(p\,2^{p/2}\Gamma(p/2))^{1/p}` for every
    :math:`p>0`, :math:`A_p=3^{-(2-p)/(2p)}` for :math:`p<2` and :math:`A_p=1` for :math:`p\ge2`.
    ``"haagerup"`` (optimal, Haagerup, *Studia Math.* 70 (1981), cited): :math:`B_p=1` for
    :math:`p\le2`, :math:`B_p=\sqrt2\,(\Gamma(\frac{p+1}2)/\sqrt\pi)^{1/p}` for :math:`p\ge2`;
    :math:`A_p=1` for :math:`p\ge2`, :math:`A_p=2^{1/2-1/p}` for :math:`0<p\le p_0\approx1.847`, and the
    Gaussian value :math:`\sqrt2(\Gamma(\frac{p+1}2)/\sqrt\pi)^{1/p}` for :math:`p_0\le p<2`.

    Parameters
    ----------
    p : float
        The moment, :math:`p>0`.
    kind : {"subgaussian", "haagerup"}

    Returns
    -------
    tuple of float
        :math:`(A_p, B_p)`.

    Raises
    ------
    TypeError, ValueError
        If ``p`` is not a positive real or ``kind`` is unknown.

    Examples
    --------
    >>> [round(c, 6) for c in khintchine_constants(1.0, "haagerup")]   # Szarek: 1/sqrt 2
    [0.707107, 1.0]
    """
    pp = check_real(p, "p", lo=0.0, lo_open=True)
    gauss = math.sqrt(2.0) * (special.gamma((pp + 1) / 2) / math.sqrt(math.pi)) ** (1 / pp)
    if check_choice(kind, "kind", ("subgaussian", "haagerup")) == "subgaussian":
        upper = math.exp((math.log(pp) + 0.5 * pp * math.log(2.0) + special.gammaln(pp / 2)) / pp)
        lower = 1.0 if pp >= 2 else 3.0 ** (-(2 - pp) / (2 * pp))
        return lower, upper
    if pp >= 2:
        return 1.0, gauss
    return min(2.0 ** (0.5 - 1 / pp), gauss), 1.0


def rademacher_moment(a, p):
    r""":math:`\mathbb E|\sum_ia_i\varepsilon_i|^p`, exactly, by enumerating all :math:`2^n` sign patterns.

    Parameters
    ----------
    a : array_like
        Coefficients, a real vector of length :math:`1\le n\le20`.
    p : float
        The moment, :math:`p>0`.

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        If ``a`` is not a finite real vector of length 1 to 20, or ``p`` is not positive.

    Examples
    --------
    >>> rademacher_moment([1.0, 1.0], 2.0)      # (4 + 0 + 0 + 4) / 4
    2.0
    """
    av = real_array("a", a, min_ndim=1)
    if av.ndim != 1 or not 1 <= av.size <= 20:
        raise ValueError("a must be a vector of 1 to 20 coefficients")
    pp = check_real(p, "p", lo=0.0, lo_open=True)
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=av.size)))
    return float(np.mean(np.abs(signs @ av) ** pp))


def correlated_max_factors(corr):
    r"""Sudakov–Fernique factors for a centred Gaussian vector with correlation matrix ``corr``.

    With :math:`\rho_+=\max_{i\ne j}R_{ij}` and :math:`\rho_-=\max(0,-\min_{i\ne j}R_{ij})`,
    :math:`\sqrt{1-\rho_+}\,\mathbb E\max_iG_i\le\mathbb E\max_iX_i\le\sqrt{1+\rho_-}\,\mathbb E\max_iG_i`,
    :math:`G` i.i.d. standard (chapter :doc:`/book/norms_and_maxima`).

    Parameters
    ----------
    corr : array_like
        A symmetric :math:`N\times N` matrix with unit diagonal, :math:`N\ge2`.

    Returns
    -------
    tuple of float
        :math:`(\sqrt{1-\rho_+}, \sqrt{1+\rho_-})`.

    Raises
    ------
    TypeError, ValueError
        If ``corr`` is not square, symmetric, with unit diagonal and entries in [-1, 1].

    Examples
    --------
    >>> [round(f, 6) for f in correlated_max_factors([[1.0, 0.5], [0.5, 1.0]])]
    [0.707107, 1.0]
    """
    r = real_array("corr", corr, min_ndim=2)
    if r.ndim != 2 or r.shape[0] != r.shape[1] or r.shape[0] < 2:
        raise ValueError("corr must be a square matrix of size at least 2")
    if not (np.allclose(r, r.T) and np.allclose(np.diag(r), 1.0) and np.abs(r).max() <= 1 + 1e-12):
        raise ValueError("corr must be symmetric with unit diagonal and entries in [-1, 1]")
    off = r[~np.eye(r.shape[0], dtype=bool)]
    return math.sqrt(max(0.0, 1.0 - off.max())), math.sqrt(1.0 + max(0.0, -off.min()))


def equicorrelated_max_expectation(N, rho):
    r""":math:`\mathbb E\max_{i\le N}X_i` for standard Gaussians with common correlation
    :math:`\rho\in[0,1]`: :math:`\sqrt{1-\rho}\,\mathbb E\max_{i\le N}G_i` (quadrature).

    Parameters
    ----------
    N : int
        Number of coordinates, :math:`N\ge1`.
    rho : float
        Common correlation, :math:`0\le\rho\le1`.

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        If an argument has the wrong type or is out of range.

    Examples
    --------
    >>> round(equicorrelated_max_expectation(2, 0.0), 6)    # 1 / sqrt(pi)
    0.56419
    """
    from companion.theory import concentration

    nn = check_int(N, "N", 1)
    rr = check_real(rho, "rho", lo=0.0, hi=1.0)
    return math.sqrt(1.0 - rr) * float(concentration.gaussian_max_expectation(nn, absolute=False))
