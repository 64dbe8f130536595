"""Figure helpers that two chapters share, or that a reader calls on their own Results.

Each helper draws on a matplotlib ``Axes`` (or makes a figure) and returns matplotlib objects; none
calls ``plt.show()``.  The style is set by :func:`~companion.notebook.setup_notebook`, and matplotlib
is imported inside the functions, so importing the package never loads it.  The ``depth_*`` helpers
draw a stored ``depth_study`` Result (chapter :doc:`/book/depth_study`).
"""

from __future__ import annotations

import re

import numpy as np

from companion._validation import as_float64, check_bool, check_int, check_real

__all__ = [
    "COLOURS", "band", "counts", "depth_axis", "depth_colours", "depth_law_projections",
    "depth_outlier_statistics", "depth_stream_growth", "depth_success_rates",
    "depth_training_curves", "depth_window_edges", "finish", "interval_errorbars",
    "layer_profiles", "Table", "table", "tail_curves"]


# One colour for one thing in every chapter: the three placements (SmolLM2 is a Pre-LN model and
# MiniLM a Post-LN one, so each model shares its placement's colour), a concept direction and its
# random baseline.
COLOURS = {"Pre-LN": "C0", "Post-LN": "C1", "DSLM": "C2", "SmolLM2": "C0", "MiniLM": "C1",
           "concept": "C3", "random": "0.45"}


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
    exact : dict, optional
        ``label -> values`` or ``label -> (values, fmt)`` (a matplotlib format such as ``"ko"``;
        default: the next colour, solid): exact or simulated tails, zeros masked (log scale).
    bounds : dict, optional
        The same for bounds, drawn as ``min(1, value)``; default format: the next colour, dashed.
    lw_bound, ms : float
        Line width of the bounds; marker size, for formats with markers.

    Returns
    -------
    list of matplotlib.lines.Line2D
        The lines drawn, exact curves first, in the order given.
    """
    _check_axes(ax)
    t = _vector(t, "t")
    lines = []
    for kind, curves in (("exact", exact), ("bounds", bounds)):
        if curves is None:
            continue
        if not isinstance(curves, dict):
            raise TypeError(f"{kind} must be a dict label -> values, got {type(curves).__name__}")
        for label, entry in curves.items():
            values, fmt = entry if isinstance(entry, tuple) else (entry, None)
            if fmt is not None and not isinstance(fmt, str):
                raise TypeError(f"the format of {kind}[{label!r}] must be a string, got {type(fmt).__name__}")
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


def band(ax, x, y, lo, hi, *, color=None, label=None, fmt: str = "o-", ms: float = 3, alpha: float = 0.15):
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


def interval_errorbars(ax, x, y, lo, hi, *, label=None, fmt: str = "o-", capsize: float = 3, **kwargs):
    """Estimates ``y`` at ``x`` with asymmetric intervals ``[lo, hi]`` (``lo <= y <= hi``).

    Returns the ``ErrorbarContainer``; extra keyword arguments go to ``Axes.errorbar``.
    """
    _check_axes(ax)
    x = _vector(x, "x")
    y, lo, hi = (_vector(v, n, x.size) for v, n in ((y, "y"), (lo, "lo"), (hi, "hi")))
    with np.errstate(invalid="ignore"):
        if np.any(lo > y) or np.any(hi < y):
            raise ValueError("the intervals must contain the estimates (lo <= y <= hi)")
    return ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt=fmt, capsize=capsize, label=label, **kwargs)


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


class Table(str):
    """The aligned text of :func:`table` (print it), shown in a chapter as a rendered table.

    Jupyter displays it through ``_repr_markdown_``: a Markdown table that the book renders as an
    HTML table and a LaTeX (long)table, so that no wide text wraps at the column.
    """

    def __new__(cls, text: str, columns, cells, right):
        self = super().__new__(cls, text)
        self._md = (columns, cells, right)
        return self

    def __repr__(self):
        return str(self)

    def _repr_markdown_(self):
        columns, cells, right = self._md
        cell = lambda v: str(v).strip().replace("|", r"\|") or " "
        lines = ["| " + " | ".join(cell(c) for c in columns) + " |",
                 "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in cells]
        return "\n".join(lines)


def table(columns, rows, fmts, *, sep: str = " ") -> Table:
    """An aligned table: a header line, then one line per row; returns a :class:`Table` (a string).

    Each column is formatted with its format spec (``format(value, spec)``, e.g. ``"8.4g"``);
    its header is right-aligned to the spec's width (or written as is if the spec has none).
    Columns are joined by ``sep``.  ``rows`` is any iterable of sequences, e.g. ``zip(x, y)``.
    Printed, it is aligned text; as a cell's last expression, a rendered table (numbers
    right-aligned, columns whose spec says ``<`` left-aligned).

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
    cells = []
    for k, row in enumerate(rows):
        row = tuple(row)
        if len(row) != len(fmts):
            raise ValueError(f"row {k} has {len(row)} entries, expected {len(fmts)}")
        cells.append([format(v, f) for v, f in zip(row, fmts)])
    text = "\n".join([sep.join(f"{c:>{w}}" for c, w in zip(columns, widths))] + [sep.join(r) for r in cells])
    return Table(text, list(columns), cells, ["<" not in f[:2] for f in fmts])


def _curve_items(curves, name: str):
    if not isinstance(curves, dict) or not curves:
        raise TypeError(f"{name} must be a non-empty dict label -> values or label -> (values, fmt)")
    for label, spec in curves.items():
        if not isinstance(label, str):
            raise TypeError(f"{name}: labels must be strings, got {label!r}")
        values, fmt, kw = (spec + ({},))[:3] if isinstance(spec, tuple) else (spec, None, {})
        if fmt is not None and not isinstance(fmt, str):
            raise TypeError(f"{name}[{label!r}]: the format must be a string, got {fmt!r}")
        if not isinstance(kw, dict):
            raise TypeError(f"{name}[{label!r}]: the keywords must be a dict, got {kw!r}")
        yield label, values, fmt, kw


def layer_profiles(ax, curves, x=None, *, xlabel: str = "layer l", ylabel: str | None = None,
                   title: str | None = None, logy: bool = False, ms: float = 3,
                   legend_fontsize: float | None = 8, logx: bool = False, legend_loc=None):
    """Per-layer profiles, one line per entry of ``curves``.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    curves : dict
        ``label -> values`` or ``label -> (values, fmt)`` (a matplotlib format such as
        ``"C0o-"`` or ``"C0:"``; default: the next colour, ``"o-"``) or
        ``label -> (values, fmt, keywords)`` (Line2D keywords such as ``{"lw": 1}``); every
        ``values`` has the length of ``x``.  A label starting with ``_`` stays out of the legend.
    x : array_like, optional
        Abscissa (default ``0, 1, ...``).
    xlabel, ylabel, title : str
    logy : bool
        Logarithmic y-axis (``logx``: x-axis).
    ms : float
    legend_fontsize : float or None
        None: no legend.
    logx : bool
    legend_loc : str or int
        The legend's location (``Axes.legend``'s ``loc``; default: the rc setting).

    Returns
    -------
    list of matplotlib.lines.Line2D
    """
    _check_axes(ax)
    items = list(_curve_items(curves, "curves"))
    if x is None:
        x = np.arange(as_float64(items[0][1], "values").size)
    x = _vector(x, "x")
    logy, logx = check_bool(logy, "logy"), check_bool(logx, "logx")
    lines = []
    for label, values, fmt, kw in items:
        y = _vector(values, f"curves[{label!r}]", x.size)
        line, = ax.plot(x, y, fmt or "o-", label=label, **{"ms": ms, **kw})
        lines.append(line)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if legend_fontsize is not None:
        ax.legend(fontsize=legend_fontsize, loc=legend_loc)
    return lines


# --- depth study: one panel per placement or statistic, the members coloured by depth ---
# "dslm" is the key of the stored Result; the book names it for what it is (Kedia et al.'s residual
# scaling on Xavier initialisation, not their whole recipe).
_PLACEMENT_NAMES = {"pre": "Pre-LN", "post": "Post-LN", "dslm": "λ/β-scaled Post-LN"}


def _depth_result(result, arrays):
    """The arrays, placements, depths and ``"device, torch version"`` of a depth_study Result."""
    from companion.experiments import check_result

    r = check_result(result, "depth_study", arrays, ("placements", "depths"))
    hw = f"{r.device}, torch {r.versions.get('torch', '?')}"
    return r.arrays, list(r.scalars["placements"]), np.array(r.scalars["depths"]), hw



def _legend_below(fig, ax, title: str | None = None, *, ncol: int = 4):
    """Move the legend of ``ax`` below the panels of ``fig`` (9 pt, so it covers no data),
    give ``fig`` its suptitle and a tight layout that leaves room for the legend."""
    handles, labels = ax.get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="lower center", ncol=min(ncol, len(labels)),
                        fontsize=9, frameon=False)
    finish(fig, title)
    fig.canvas.draw()
    height = legend.get_window_extent().height / fig.bbox.height
    fig.tight_layout(rect=(0, height + 0.01, 1, 1))
    return fig


def depth_training_curves(result, unigram: float, *, window: int = 20):
    """Training loss of every member of a depth_study Result, one panel per placement.

    Parameters
    ----------
    result : Result
        Of the ``depth_study`` experiment.
    unigram : float
        The unigram loss of the corpus (nats/byte), drawn as a dotted line.
    window : int, default 20
        The curves are running means over ``window`` steps.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.experiments.check_result`; for a non-real ``unigram`` or a
        ``window`` < 1.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("train_loss",))
    unigram = check_real(unigram, "unigram")
    window = check_int(window, "window", minimum=1)
    fig, axes = plt.subplots(1, len(PL), figsize=(7.5, 3.4), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        for d, (L, colour) in enumerate(zip(depths, depth_colours(len(depths)))):
            curve = np.convolve(A["train_loss"][p, d], np.ones(window) / window, mode="valid")
            ax.plot(np.arange(len(curve)) + window, curve, color=colour, label=f"L = {L}")
        ax.axhline(unigram, color="k", ls=":", lw=0.8, label="unigram loss")
        ax.set_title(_PLACEMENT_NAMES.get(placement, placement))
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("training loss (nats/byte)")
    _legend_below(fig, axes[0, 0], f"Training curves ({hw})", ncol=5)
    return fig, axes[0]


def depth_stream_growth(result):
    """Growth of the residual stream in a depth_study Result: ``E||h_l||^2 / d`` against
    ``l / L`` for every member (left, darker = deeper) and at the last layer against depth
    (right).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.experiments.check_result`.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("sq_norm",))
    d_model = int(result.config["d_model"])
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.4))
    for p, placement in enumerate(PL):
        name = _PLACEMENT_NAMES.get(placement, placement)
        for d, L in enumerate(depths):
            axes[0].plot(np.arange(L + 1) / L, A["sq_norm"][p, d, :L + 1] / d_model, color=f"C{p}",
                         alpha=0.3 + 0.7 * d / max(len(depths) - 1, 1),
                         label=name if d == len(depths) - 1 else None)
        axes[1].plot(depths, A["sq_norm"][p, range(len(depths)), depths] / d_model, "o-",
                     color=f"C{p}", label=name)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer / L (darker: deeper)")
    axes[0].set_ylabel("E||h_l||^2 / d")
    axes[1].set(yscale="log", ylabel="E||h_L||^2 / d, last layer")
    depth_axis(axes[1], depths)
    _legend_below(fig, axes[0], f"Growth of the residual stream ({hw})")
    return fig, axes


def depth_outlier_statistics(result):
    """Outlier statistics against depth in a depth_study Result: the peak ``max|x| / rms`` over
    layers and at the last layer, the most mean-dominated channels of a layer, and the
    observed / Gaussian-expected count ``C(4 rms)`` summed over layers.

    Returns the figure and its three Axes; raises as :func:`depth_stream_growth`.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(
        result, ("max_over_rms", "n_mean_dominated", "count_observed", "count_expected"))
    d_model = int(result.config["d_model"])
    fig, axes = plt.subplots(1, 3, figsize=(7.5, 3.6))
    for p, placement in enumerate(PL):
        name = _PLACEMENT_NAMES.get(placement, placement)
        peak = np.nanmax(A["max_over_rms"][p, :, 1:], axis=1)
        last = A["max_over_rms"][p, range(len(depths)), depths]
        axes[0].plot(depths, peak, "o-", color=f"C{p}", label=f"{name}: max over layers")
        axes[0].plot(depths, last, "s--", color=f"C{p}", ms=3, label=f"{name}: last layer")
        axes[1].plot(depths, np.nanmax(A["n_mean_dominated"][p, :, 1:], axis=1), "o-", color=f"C{p}")
        obs = np.nansum(A["count_observed"][p, :, 1:, 0], axis=1)
        exp = np.nansum(A["count_expected"][p, :, 1:, 0], axis=1)
        axes[2].plot(depths, obs / exp, "o-", color=f"C{p}")
    axes[0].set_ylabel("max |x| / rms")
    axes[1].set_ylabel(f"mean-dominated channels (of {d_model})")
    axes[2].set_ylabel("C(4 rms), observed / Gaussian")
    axes[2].axhline(1, color="k", ls=":", lw=0.8)
    for ax in axes:
        depth_axis(ax, depths)
    _legend_below(fig, axes[0], f"Outlier statistics against depth at width {d_model} ({hw})",
                  ncol=2)
    return fig, axes


def _depth_scale(result, scale) -> int:
    scales = list(result.config["scales"])
    if check_real(scale, "scale") not in scales:
        raise ValueError(f"scale must be one of the Result's scales {scales}, got {scale!r}")
    return scales.index(scale)


def depth_success_rates(result, scale: float = 1.0):
    """Success rate of the target directions against injection layer / L, one panel per placement.

    Each member of the depth_study Result with its bootstrap band (darker = deeper), the chance
    level (dotted) and the window threshold (dashed); titles give the held-out random rate.

    Parameters
    ----------
    result : Result
        Of the ``depth_study`` experiment.
    scale : float, default 1.0
        The magnitude alpha, one of the Result's ``scales``.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.experiments.check_result`; for a ``scale`` the Result lacks.
    """
    import matplotlib.pyplot as plt

    keys = ("success_rate", "success_lo", "success_hi")
    A, PL, depths, hw = _depth_result(result, keys + ("inject_layers", "null_rate"))
    s, chance = _depth_scale(result, scale), result.scalars["chance"]
    fig, axes = plt.subplots(1, len(PL), figsize=(7.5, 3.6), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        for d, (L, colour) in enumerate(zip(depths, depth_colours(len(depths)))):
            rate, lo, hi = (A[k][p, d, s] for k in keys)
            band(ax, A["inject_layers"][p, d] / L, rate, lo, hi, color=colour, label=f"L = {L}")
        ax.axhline(chance, color="k", ls=":", lw=0.8, label=f"chance 1/{round(1 / chance)}")
        ax.axhline(result.scalars["window_threshold"], color="r", ls="--", lw=0.8,
                   label="window threshold")
        ax.set_title(f"{_PLACEMENT_NAMES.get(placement, placement)}\n(held-out null: "
                     f"{np.nanmean(A['null_rate'][p, :, s]):.3f})", fontsize=9)
        ax.set_xlabel("injection layer / L")
    axes[0, 0].set_ylabel(f"success rate (alpha = {scale:g})")
    _legend_below(fig, axes[0, 0], f"Success of a target's unembedding direction against "
                                   f"{result.config['n_random']} random ones\n({hw})", ncol=4)
    return fig, axes[0]


def depth_window_edges(result, scale: float = 1.0):
    """First layer / L (left) and coverage (right) of the window against depth in a depth_study
    Result, with their bootstrap intervals, one series per placement; the note's 6.25% dotted.

    Parameters and Raises as :func:`depth_success_rates`; returns the figure and its two Axes.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("window", "window_lo", "window_hi"))
    s = _depth_scale(result, scale)
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.4))
    for p, placement in enumerate(PL):
        for ax, j, label in ((axes[0], 0, "first layer of the window / L"),
                             (axes[1], 3, "coverage")):
            w, lo, hi = (A[k][p, :, s, j] for k in ("window", "window_lo", "window_hi"))
            interval_errorbars(ax, depths * 2 ** ((p - 1) * 0.06), w, lo, hi,
                               label=_PLACEMENT_NAMES.get(placement, placement))
            ax.set_ylabel(label)
    for ax in axes:
        depth_axis(ax, depths)
    axes[0].axhline(0.0625, color="k", ls=":", lw=0.8, label="note 002: 6.25%")
    _legend_below(fig, axes[0], f"Window position and width against depth, alpha = {scale:g} ({hw})")
    return fig, axes


def depth_law_projections(result):
    """Projection on the injected direction from ``l0 = L/4`` to the output against its law
    (Pre-LN: dilution; Post-LN: product rule) in a depth_study Result, one panel per
    placement, for the deepest member and the one four times shallower.

    Returns the figure and its Axes; raises as :func:`companion.experiments.check_result`.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("proj", "pred_dilution", "pred_product", "law_l0"))
    fig, axes = plt.subplots(1, len(PL), figsize=(7.5, 3.4), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        law = "pred_dilution" if placement == "pre" else "pred_product"
        for d in sorted({max(len(depths) - 3, 0), len(depths) - 1}):
            L, l0 = depths[d], int(A["law_l0"][p, d])
            m = np.arange(l0, L + 1)
            ax.plot(m / L, A["proj"][p, d, m], "o", ms=3, color=f"C{d}", label=f"measured, L = {L}")
            ax.plot(m / L, A[law][p, d, m], "-", color=f"C{d}", label="law")
        ax.set(yscale="log", title=_PLACEMENT_NAMES.get(placement, placement), xlabel="layer / L")
    axes[0, 0].set_ylabel("|projection| on injected direction")
    _legend_below(fig, axes[0, 0], f"Pre-LN dilution law and Post-LN product rule on trained members"
                                   f"\n({hw})")
    return fig, axes[0]
