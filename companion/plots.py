"""Figure helpers that the chapters call (reader-facing).

Each function draws on a matplotlib ``Axes`` (or makes a figure) and returns matplotlib
objects; none calls ``plt.show()``.  The figure style is set once by
:func:`companion.setup_notebook`; the helpers only remove what the chapters repeated:

* :func:`tail_curves` -- tail probabilities on a log scale: exact curves with zeros masked,
  bounds clipped at 1 (a probability);
* :func:`counts` -- simulated counts (zeros masked) beside their expectation and bounds, on
  log axes;
* :func:`band` -- a profile with its interval as a shaded band (non-finite abscissae dropped);
* :func:`interval_errorbars` -- estimates with asymmetric intervals ``[lo, hi]``;
* :func:`depth_axis` -- a depth axis on a base-2 log scale with a tick at every depth;
* :func:`depth_colours` -- one viridis colour per depth, shallow to deep;
* :func:`finish` -- the figure's title and a tight layout;
* :func:`table` -- an aligned text table (header right-aligned over formatted columns);
* :func:`seed_points` -- one column per arm: every seed's value and the mean with its interval;
* :func:`seed_bands` -- per arm, a curve's mean over seeds with its interval as a band.

Matplotlib is imported inside the functions, so importing the package never loads it.
"""

from __future__ import annotations

import re

import numpy as np

from companion._validation import as_float64, check_bool, check_int, check_real

__all__ = ["band", "counts", "depth_axis", "depth_colours", "finish", "interval_errorbars", "table",
           "tail_curves"]
__all__ += ["seed_points"]
__all__ += ["seed_bands"]


def _check_axes(ax):
    from matplotlib.axes import Axes

    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    return ax


def _vector(x, name: str, size: int | None = None) -> np.ndarray:
    arr = as_float64(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if size is not None and arr.size != size:
        raise ValueError(f"{name} must have {size} entries (as x), got {arr.size}")
    return arr


def tail_curves(ax, t, exact=None, bounds=None, *, lw_bound: float = 0.9, ms: float = 3):
    """Tail probabilities against ``t`` on a logarithmic y-axis.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    t : array_like, 1-D
        The abscissa.
    exact : dict, optional
        ``label -> values`` or ``label -> (values, fmt)``: exact or simulated tails; zeros are
        masked (not drawn), as a log scale cannot show them.  ``fmt`` is a matplotlib format
        string such as ``"C0"`` or ``"ko"``; default: the next colour, solid.
    bounds : dict, optional
        The same for bounds, drawn as ``min(1, value)`` with lines of width ``lw_bound``;
        default format: the next colour, dashed.
    ms : float
        Marker size, for formats with markers.

    Returns
    -------
    list of matplotlib.lines.Line2D
        The lines drawn, exact curves first, in the order given.
    """
    _check_axes(ax)
    t = _vector(t, "t")
    lw_bound = check_real(lw_bound, "lw_bound", lo=0.0, lo_open=True)
    ms = check_real(ms, "ms", lo=0.0)
    lines = []
    for kind, curves in (("exact", exact), ("bounds", bounds)):
        if curves is None:
            continue
        if not isinstance(curves, dict):
            raise TypeError(f"{kind} must be a dict label -> values, got {type(curves).__name__}")
        for label, entry in curves.items():
            values, fmt = entry if isinstance(entry, tuple) else (entry, None)
            if fmt is not None and not isinstance(fmt, str):
                raise TypeError(f"the format of {kind}[{label!r}] must be a string, got "
                                f"{type(fmt).__name__}")
            y = _vector(values, f"{kind}[{label!r}]", t.size)
            if kind == "exact":
                y = np.where(y > 0, y, np.nan)
                fmt, kw = fmt or "-", {}
            else:
                y = np.minimum(1.0, y)
                fmt, kw = fmt or "--", {"lw": lw_bound}
            lines.extend(ax.semilogy(t, y, fmt, label=label, ms=ms, **kw))
    if not lines:
        raise ValueError("tail_curves needs at least one curve in exact or bounds")
    return lines


def counts(ax, x, simulated=None, expected=None, *, upper=None, lower=None, color=None,
           label=None, fmt: str = "o", ms: float = 3, loglog: bool = False):
    """Counts against ``x`` on a log y-axis (log-log if ``loglog``), in one colour.

    ``simulated`` is drawn with ``fmt`` (zeros masked: a log axis cannot show them),
    ``expected`` as a solid line, ``upper`` dashed and ``lower`` dotted where it is positive.
    ``label`` goes to the first curve drawn; ``color`` defaults to the next colour of the cycle.
    Returns the list of ``Line2D`` drawn, in the order simulated, expected, upper, lower.
    """
    _check_axes(ax)
    x = _vector(x, "x")
    loglog = check_bool(loglog, "loglog")
    draw = ax.loglog if loglog else ax.semilogy
    lines = []
    for name, values, style, kw in (("simulated", simulated, fmt, {"ms": ms}),
                                    ("expected", expected, "-", {"lw": 1}),
                                    ("upper", upper, "--", {"lw": 1}),
                                    ("lower", lower, ":", {"lw": 1.5})):
        if values is None:
            continue
        y = _vector(values, name, x.size)
        keep = y > 0 if name in ("simulated", "lower") else np.ones(x.size, bool)
        xs, ys = (x, np.where(keep, y, np.nan)) if name == "simulated" else (x[keep], y[keep])
        colour = color if color is not None or not lines else lines[0].get_color()
        line, = draw(xs, ys, style, color=colour, label=None if lines else label, **kw)
        lines.append(line)
    if not lines:
        raise ValueError("counts needs at least one of simulated, expected, upper, lower")
    return lines


def band(ax, x, y, lo, hi, *, color=None, label=None, fmt: str = "o-", ms: float = 3,
         alpha: float = 0.15):
    """A profile ``y`` against ``x`` with the interval ``[lo, hi]`` as a shaded band.

    Points whose ``x`` is not finite (e.g. layers a shallower member does not have) are dropped.
    Returns ``(line, collection)``: the profile's ``Line2D`` and the band's ``PolyCollection``.
    """
    _check_axes(ax)
    x = _vector(x, "x")
    y, lo, hi = (_vector(v, n, x.size) for v, n in ((y, "y"), (lo, "lo"), (hi, "hi")))
    alpha = check_real(alpha, "alpha", lo=0.0, hi=1.0)
    ok = np.isfinite(x)
    line, = ax.plot(x[ok], y[ok], fmt, ms=ms, color=color, label=label)
    fill = ax.fill_between(x[ok], lo[ok], hi[ok], color=line.get_color(), alpha=alpha)
    return line, fill


def interval_errorbars(ax, x, y, lo, hi, *, label=None, fmt: str = "o-", capsize: float = 3,
                       **kwargs):
    """Estimates ``y`` at ``x`` with asymmetric intervals ``[lo, hi]`` (``lo <= y <= hi``).

    Returns the ``ErrorbarContainer``; extra keyword arguments go to ``Axes.errorbar``.
    """
    _check_axes(ax)
    x = _vector(x, "x")
    y, lo, hi = (_vector(v, n, x.size) for v, n in ((y, "y"), (lo, "lo"), (hi, "hi")))
    with np.errstate(invalid="ignore"):
        if np.any(lo > y) or np.any(hi < y):
            raise ValueError("the intervals must contain the estimates (lo <= y <= hi)")
    return ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt=fmt, capsize=capsize, label=label,
                       **kwargs)


def depth_axis(ax, depths, *, label: str = "depth L"):
    """Make the x-axis a depth axis: base-2 log scale, a tick labelled at every depth."""
    _check_axes(ax)
    depths = _vector(depths, "depths")
    if depths.size == 0 or np.any(depths <= 0) or np.any(depths != np.round(depths)):
        raise ValueError("depths must be positive integers")
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(int(L)) for L in depths])
    ax.set_xlabel(label)
    return ax


def depth_colours(n: int, cmap: str = "viridis") -> list:
    """``n`` colours from ``cmap``, shallow (first) to deep (last); one colour if ``n == 1``."""
    import matplotlib

    n = check_int(n, "n", minimum=1)
    cm = matplotlib.colormaps[cmap]
    return [cm(i / max(n - 1, 1)) for i in range(n)]


def finish(fig, title: str | None = None, *, fontsize: float = 9):
    """Give ``fig`` a small suptitle (if ``title``) and a tight layout; returns ``fig``."""
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    if title is not None:
        if not isinstance(title, str):
            raise TypeError(f"title must be a string, got {type(title).__name__}")
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    return fig


_WIDTH = re.compile(r"^(?:.?[<>=^])?[+\- ]?z?#?0?(\d+)")


def table(columns, rows, fmts, *, sep: str = " ") -> str:
    """An aligned text table: a header line, then one line per row; returns the text.

    Each column is formatted with its format spec (``format(value, spec)``, e.g. ``"8.4g"``);
    its header is right-aligned to the spec's width (or written as is if the spec has none).
    Columns are joined by ``sep``.  ``rows`` is any iterable of sequences, e.g. ``zip(x, y)``.

    >>> print(table(["x", "x^2"], [(1, 1), (2.5, 6.25)], ["4g", "6.3g"]))
       x    x^2
       1      1
     2.5   6.25
    """
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError("columns must be a sequence of strings")
    if isinstance(fmts, str) or not all(isinstance(f, str) for f in fmts):
        raise TypeError("fmts must be a sequence of format specs (strings)")
    if len(columns) != len(fmts):
        raise ValueError(f"{len(columns)} columns but {len(fmts)} format specs")
    if not isinstance(sep, str):
        raise TypeError(f"sep must be a string, got {type(sep).__name__}")
    widths = [int(m.group(1)) if (m := _WIDTH.match(f)) else 0 for f in fmts]
    lines = [sep.join(f"{c:>{w}}" for c, w in zip(columns, widths))]
    for k, row in enumerate(rows):
        row = tuple(row)
        if len(row) != len(fmts):
            raise ValueError(f"row {k} has {len(row)} entries, expected {len(fmts)}")
        lines.append(sep.join(format(v, f) for v, f in zip(row, fmts)))
    return "\n".join(lines)


# --- train ---
def seed_points(ax, values, labels, *, level: float = 0.95, reference: float | None = None,
                colors=None, jitter: float = 0.12):
    """One column per arm: every seed's value as a dot, the mean with its t-interval as a bar.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    values : array_like, shape (arms, seeds)
        E.g. the held-out loss of each seed, or paired differences to a reference arm.
    labels : sequence of str, one per arm
        Tick labels.
    level : float in (0, 1), default 0.95
        Level of the Student-t interval over seeds
        (:func:`companion.training_controls.seed_interval`).
    reference : float, optional
        A horizontal dotted line (e.g. 0 for differences).
    colors : sequence of colours, optional
        One per arm; default ``C0, C1, ...``.
    jitter : float ≥ 0
        Horizontal spread of the seed dots.

    Returns
    -------
    list of matplotlib.container.ErrorbarContainer
        One per arm, in order.
    """
    from companion.training_controls import seed_interval

    _check_axes(ax)
    v = as_float64(values, "values")
    if v.ndim != 2 or v.shape[1] < 2:
        raise ValueError(f"values must have shape (arms, seeds) with at least 2 seeds, got {v.shape}")
    if isinstance(labels, str) or len(labels) != v.shape[0] or not all(isinstance(s, str) for s in labels):
        raise ValueError(f"labels must be {v.shape[0]} strings, one per arm")
    jitter = check_real(jitter, "jitter", lo=0.0)
    colors = [f"C{k}" for k in range(v.shape[0])] if colors is None else list(colors)
    if len(colors) != v.shape[0]:
        raise ValueError(f"colors must have {v.shape[0]} entries, got {len(colors)}")
    mean, lo, hi = seed_interval(v, level=level, axis=1)
    offsets = np.linspace(-jitter, jitter, v.shape[1])
    out = []
    for k in range(v.shape[0]):
        ax.plot(k + offsets, v[k], "o", color=colors[k], ms=3, alpha=0.5)
        out.append(ax.errorbar([k], [mean[k]], yerr=[[mean[k] - lo[k]], [hi[k] - mean[k]]], fmt="s",
                               color=colors[k], ms=6, capsize=4, lw=1.5))
    if reference is not None:
        ax.axhline(check_real(reference, "reference"), color="k", ls=":", lw=0.8)
    ax.set_xticks(np.arange(v.shape[0]), list(labels))
    return out


def seed_bands(ax, x, values, labels, *, level: float = 0.95, colors=None):
    """Per arm, the mean over seeds of a curve with its t-interval as a shaded band.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x : array_like, shape (K,)
    values : array_like, shape (arms, seeds, K)
    labels : sequence of str, one per arm
    level : float in (0, 1), default 0.95
    colors : sequence of colours, optional

    Returns
    -------
    list of matplotlib.lines.Line2D
        The mean curves, one per arm.
    """
    from companion.training_controls import seed_interval

    _check_axes(ax)
    v = as_float64(values, "values")
    if v.ndim != 3 or v.shape[1] < 2:
        raise ValueError(f"values must have shape (arms, seeds, K) with at least 2 seeds, got {v.shape}")
    xs = _vector(x, "x", v.shape[2])
    if isinstance(labels, str) or len(labels) != v.shape[0] or not all(isinstance(s, str) for s in labels):
        raise ValueError(f"labels must be {v.shape[0]} strings, one per arm")
    colors = [f"C{k}" for k in range(v.shape[0])] if colors is None else list(colors)
    if len(colors) != v.shape[0]:
        raise ValueError(f"colors must have {v.shape[0]} entries, got {len(colors)}")
    mean, lo, hi = seed_interval(v, level=level, axis=1)
    lines = []
    for k in range(v.shape[0]):
        (line,) = ax.plot(xs, mean[k], "-", color=colors[k], label=labels[k])
        ax.fill_between(xs, lo[k], hi[k], color=colors[k], alpha=0.2, lw=0)
        lines.append(line)
    return lines
