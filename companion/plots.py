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
* :func:`table` -- an aligned text table (header right-aligned over formatted columns).

Matplotlib is imported inside the functions, so importing the package never loads it.
"""

from __future__ import annotations

import re

import numpy as np

from companion._validation import as_float64, check_bool, check_int, check_real

__all__ = ["TRACK_PANELS", "attribution_panels", "band",
           "bernoulli_sum_tails", "channel_points", "count_comparison",
           "count_comparison_panels", "counts", "depth_axis", "depth_colours",
           "depth_law_projections", "depth_outlier_statistics", "depth_stream_growth",
           "depth_success_rates", "depth_training_curves", "depth_window_edges",
           "effect_bands", "effect_profiles", "finish", "gaussian_maxima",
           "interval_errorbars", "largest_logits", "layer_profiles", "ln_rule_scatter",
           "massive_activation_sink", "norm_and_logit_tails", "norm_fluctuations",
           "outlier_feature_shares", "partial_dot_curves", "partial_dot_panels",
           "perturbation_tracks",
           "postln_projection", "preln_ratios",
           "random_window_edges", "readout_against_null", "readout_panels",
           "relative_effects", "scale_spread", "subexponential_tails",
           "sublayer_cumulative", "success_window_rows", "table", "tail_curves", "trained_kl_profiles", "window_edges", "window_effects"]


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


# --- injection: windows and effect profiles ---
def window_edges(ax, depths, measured, predicted, labels, predicted_labels=None, *,
                 colours=("C0", "C1", "C3"), note: float | None = 0.0625):
    """Lower edge of the injection window against depth: measured (dots) and predicted (dashes).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    depths : array_like, 1-D
        The depths ``L`` (base-2 log axis, a tick at each).
    measured, predicted : array_like, shape ``[n, len(depths)]``
        ``first / L`` per curve, e.g. ``window_relative_projection[p, k, :, :, 1]`` and
        :func:`companion.experiments.framework_random.predicted_first_fraction` of a
        ``framework_random`` Result.
    labels : sequence of str
        One label per curve (``"measured first/L, <label>"``).
    predicted_labels : sequence of str, optional
        Labels of the predicted curves (``"predicted, <label>"``); default ``labels``.
    colours : sequence of colours
    note : float or None, default 0.0625
        A dotted horizontal reference (the note's 6.25%); ``None`` for none.

    Returns
    -------
    matplotlib.axes.Axes
    """
    _check_axes(ax)
    depths = _vector(depths, "depths")
    meas = as_float64(measured, "measured")
    pred = as_float64(predicted, "predicted")
    if meas.shape != pred.shape or meas.ndim != 2 or meas.shape[1] != depths.size:
        raise ValueError(f"measured and predicted must both have shape [n, {depths.size}], got "
                         f"{meas.shape} and {pred.shape}")
    predicted_labels = labels if predicted_labels is None else predicted_labels
    if len(labels) != meas.shape[0] or len(predicted_labels) != meas.shape[0] or len(colours) < meas.shape[0]:
        raise ValueError(f"need {meas.shape[0]} labels and colours, got {len(labels)}, "
                         f"{len(predicted_labels)} and {len(colours)}")
    for m, q, label, plabel, colour in zip(meas, pred, labels, predicted_labels, colours):
        ax.plot(depths, m, "o-", color=colour, label=f"measured first/L, {label}")
        ax.plot(depths, list(q), "--", color=colour, lw=1, label=f"predicted, {plabel}")
    if note is not None:
        ax.axhline(note, color="k", lw=0.8, ls=":", label="note: 6.25%")
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(int(L)) for L in depths])
    ax.set_xlabel("depth L")
    return ax


def effect_profiles(ax, effects, depths, *, fmt: str = "o-", label: str = "",
                    colours=("C0", "C1", "C3"), ms: float = 4):
    """Output effect against the injection layer's position ``(l + 1/2) / L``, one curve per depth,
    each divided by its maximum.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    effects : array_like, shape ``[len(depths), max(depths)]``
        Effect per injection layer (NaN beyond each depth), e.g.
        ``effect_kl_later[p, 0]`` of a ``framework_trained`` Result.
    depths : sequence of int
    fmt, label, colours, ms
        Line format, a label suffix (``"L=<depth> <label>"``), colours, marker size.

    Returns
    -------
    matplotlib.axes.Axes
    """
    _check_axes(ax)
    eff = as_float64(effects, "effects")
    if eff.ndim != 2 or eff.shape[0] != len(depths):
        raise ValueError(f"effects must have shape [{len(depths)}, max depth], got {eff.shape}")
    for d, (depth, colour) in enumerate(zip(depths, colours)):
        e = eff[d, :depth]
        ax.plot((np.arange(depth) + 0.5) / depth, e / e.max(), fmt, color=colour, ms=ms,
                label=f"L={depth} {label}")
    return ax



#: The four per-layer metrics of :func:`perturbation_tracks`: (metric of
#: :data:`companion.injection.metrics.METRIC_NAMES`, panel title).
TRACK_PANELS = (("projection", r"projection $p_m / c$"), ("cos_delta_v", r"$\cos(\delta_m, v)$"),
                ("relative_size", r"relative size $\|\delta_m\| / \|h_m\|$"),
                ("cos_inj_base", r"$\cos(\tilde h_m, h_m)$"))


def perturbation_tracks(axes, tracks, layer: int, *, name: str = "", scale_index: int = 1,
                        directions=("sea", "random0"), colours=("C0", "C3"), titles: bool = True):
    """One injection layer of ``injection_window`` tracks, followed through the later layers.

    One panel per metric of :data:`TRACK_PANELS` (the projection divided by the injected size
    ``c``); per direction, the injected tokens (solid) and the last token (dashed); on the
    relative-size panel, pure dilution ``c / n_m`` (dotted) for the first direction.

    Parameters
    ----------
    axes : sequence of 4 matplotlib.axes.Axes
    tracks : dict
        :func:`companion.experiments.injection_window.tracks` of one Result (keys
        ``(direction, "rel")``).
    layer : int
        The injection layer (one of the Result's layers).
    name : str
        The model's name, for the x-label.
    scale_index : int, default 1
        Which relative magnitude.
    directions, colours : sequences of equal length
    titles : bool
        Panel titles (for the first row of a grid).

    Returns
    -------
    list of matplotlib.axes.Axes
    """
    axes = [_check_axes(ax) for ax in axes]
    if len(axes) != len(TRACK_PANELS):
        raise ValueError(f"axes must hold {len(TRACK_PANELS)} Axes, got {len(axes)}")
    if len(directions) != len(colours):
        raise ValueError("directions and colours must have the same length")
    for d, colour in zip(directions, colours):
        if (d, "rel") not in tracks:
            raise ValueError(f"no relative track for direction {d!r}; have {sorted(tracks)}")
        tr = tracks[(d, "rel")]
        lay = tr.layers.tolist()
        if layer not in lay:
            raise ValueError(f"layer {layer} was not an injection layer; the layers are {lay}")
        j = lay.index(layer)
        c = tr.coefficient[j, scale_index]
        x = np.arange(layer, tr.n_layers + 1) / tr.n_layers
        for k, (metric, title) in enumerate(TRACK_PANELS):
            ax = axes[k]
            for group, style in (("injected", "-"), ("last", "--")):
                y = tr.mean(metric, group)[j, scale_index, layer:]
                ax.plot(x, y / c if metric == "projection" else y, style, color=colour, lw=1.5,
                        label=f"{d}, {group}" if k == 0 else None)
            if metric == "relative_size" and d == directions[0]:
                ax.plot(x, c / tr.typical_norm[layer:], ":", color="k",
                        label="pure dilution $c/n_m$")
            ax.set_title(title if titles else None, fontsize=9)
            ax.set_xlabel(f"layer / L  ({name}, injected at l = {layer})", fontsize=8)
    axes[0].set_ylabel(name)
    return axes


def relative_effects(ax, tracks, *, scale_indices=(0, 1), directions=("sea", "random0"),
                     colours=("C0", "C3")):
    """Output effect per injection layer, divided by its maximum, for relative and fixed sizes.

    Per direction: the relative magnitudes ``scale_indices`` (dotted, solid) and the fixed
    coefficient (dash-dot), against ``l / L``, with the threshold 1/2 of the window definition.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    tracks : dict
        :func:`companion.experiments.injection_window.tracks` of one Result with both the
        ``"rel"`` and the ``"abs"`` sweep.
    scale_indices : pair of int
    directions, colours : sequences of equal length

    Returns
    -------
    matplotlib.axes.Axes
    """
    _check_axes(ax)
    if len(directions) != len(colours):
        raise ValueError("directions and colours must have the same length")
    for d, colour in zip(directions, colours):
        if (d, "rel") not in tracks or (d, "abs") not in tracks:
            raise ValueError(f"direction {d!r} needs a 'rel' and an 'abs' track; "
                             f"have {sorted(tracks)}")
        rel, fixed = tracks[(d, "rel")], tracks[(d, "abs")]
        x = rel.layers / rel.n_layers
        for s, style in zip(scale_indices, (":", "-")):
            e = rel.effect()[:, s]
            ax.plot(x, e / e.max(), style, color=colour, marker="o", ms=3,
                    label=fr"{d}, $\alpha$ = {rel.scales[s]:g}")
        e = fixed.effect()[:, 0]
        ax.plot(x, e / e.max(), "-.", color=colour, marker="s", ms=3, alpha=0.6,
                label=f"{d}, fixed c = {fixed.scales[0]:.3g}")
    ax.axhline(0.5, color="k", lw=0.6)
    ax.set_xlabel(r"injection layer $\ell / L$")
    ax.set_ylabel(f"{rel.effect_name} / its maximum over layers")
    return ax

# --- channel statistics, counts and attention logits ---
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


def channel_points(ax, st, layers, thresholds=None, *, title: str | None = None,
                   colours=("C0", "C3", "C2", "C1")):
    """Every channel of some layers as a point ``(sigma_j, |mu_j|)`` on log-log axes.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    st : companion.outliers.channel_statistics.ChannelStatistics
    layers : sequence of int
        Layers to draw (at most ``len(colours)``).
    thresholds : sequence of float, optional
        One threshold per layer, drawn as a dashed horizontal line ``|mu| = t`` (channels above
        it are mean-dominated at ``t``).
    title : str, optional
    colours : sequence of matplotlib colours

    Returns
    -------
    list of matplotlib.collections.PathCollection
        One scatter per layer.
    """
    from companion.outliers.channel_statistics import ChannelStatistics

    _check_axes(ax)
    if not isinstance(st, ChannelStatistics):
        raise TypeError(f"st must be a ChannelStatistics, got {type(st).__name__}")
    layers = [check_int(l, "every layer", 0) for l in layers]
    if not layers or len(layers) > len(colours) or max(layers) >= st.mean.shape[0]:
        raise ValueError(f"layers must be 1 to {len(colours)} indices in [0, {st.mean.shape[0] - 1}]")
    if thresholds is not None:
        thresholds = _vector(thresholds, "thresholds", len(layers))
    out = []
    for i, (l, colour) in enumerate(zip(layers, colours)):
        out.append(ax.scatter(st.std[l], np.abs(st.mean[l]) + 1e-4, s=6, color=colour, alpha=0.6,
                              label=f"layer {l}"))
        if thresholds is not None:
            ax.axhline(thresholds[i], color=colour, ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel=r"$\sigma_j$", ylabel=r"$|\mu_j|$", title=title)
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(loc="lower right")
    return out


def count_comparison(ax, predicted, observed, regime, n_tokens, names, *, title: str | None = None,
                     colours=("C2", "C0", "C3")):
    """Observed counts ``C_j(t)`` against their predicted expectation, one colour per regime.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    predicted, observed : array_like, same shape
        Expected and observed counts (e.g. ``[n_t, d]`` of one layer).
    regime : array_like of int, same shape
        Regime codes ``0 .. len(names) - 1`` (:func:`companion.outliers.regimes.classify_regime`).
    n_tokens : int
        ``N``, the upper end of both axes.
    names : sequence of str
        Regime names (:data:`companion.outliers.regimes.REGIMES`).

    Returns
    -------
    list of matplotlib.collections.PathCollection

    Notes
    -----
    Pairs with a prediction below 1e-3 and no observation are not drawn; zero counts are drawn
    at 0.5 (a log axis cannot show 0); the diagonal is "prediction = observation".
    """
    _check_axes(ax)
    pred, obs = as_float64(predicted, "predicted"), as_float64(observed, "observed")
    reg = as_float64(regime, "regime")
    if pred.shape != obs.shape or reg.shape != pred.shape:
        raise ValueError(f"predicted, observed and regime must share one shape, got {pred.shape}, "
                         f"{obs.shape} and {reg.shape}")
    n = check_int(n_tokens, "n_tokens", 1)
    if isinstance(names, str) or len(names) > len(colours):
        raise TypeError(f"names must be a sequence of at most {len(colours)} regime names")
    show = (pred > 1e-3) | (obs > 0)
    out = []
    for r, (name, colour) in enumerate(zip(names, colours)):
        sel = show & (reg == r)
        out.append(ax.scatter(np.maximum(pred[sel], 1e-3), np.maximum(obs[sel], 0.5), s=3, alpha=0.4,
                              color=colour, label=name))
    lim = [1e-3, 2 * n]
    ax.plot(lim, lim, color="k", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=[0.4, 2 * n],
           xlabel="Gaussian-predicted E[C_j(t)]", ylabel="observed C_j(t) (0 drawn at 0.5)",
           title=title)
    ax.legend(loc="lower right", markerscale=3)
    return out


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
    logy, logx : bool
        Logarithmic y-axis, x-axis.
    ms : float
        Marker size.
    legend_fontsize : float or None
        None: no legend.
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
    ms = check_real(ms, "ms", lo=0.0)
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
        ax.legend(fontsize=check_real(legend_fontsize, "legend_fontsize", lo=0.0, lo_open=True),
                  loc=legend_loc)
    return lines


def partial_dot_curves(axes, part, label: str):
    """Variance and signal-to-noise ratio of the partial logit ``z_m`` against ``m``, one head.

    Parameters
    ----------
    axes : pair of matplotlib.axes.Axes
        Left: ``Var(z_m)`` (solid) and ``Var(z_m / sqrt m)`` (dashed); right: the SNR (solid)
        and the ``sqrt m`` law through its last point (dotted).
    part : dict
        The output of :func:`companion.outliers.attention_logits.partial_dot_statistics`.
    label : str

    Returns
    -------
    dict
        ``"slope_var"``, ``"slope_snr"``: least-squares slopes of ``log Var(z_m)`` and
        ``log SNR`` against ``log m``.
    """
    if not isinstance(axes, (list, tuple, np.ndarray)) or len(axes) != 2:
        raise TypeError("axes must be a pair of matplotlib Axes")
    ax_var, ax_snr = (_check_axes(a) for a in axes)
    if not isinstance(part, dict) or not {"sizes", "var", "var_scaled", "snr"} <= set(part):
        raise TypeError("part must be the dict of companion.outliers.attention_logits.partial_dot_statistics")
    if not isinstance(label, str):
        raise TypeError(f"label must be a string, got {type(label).__name__}")
    m_ = _vector(part["sizes"], "part['sizes']")
    var, var_scaled, snr = (_vector(part[k], f"part[{k!r}]", m_.size) for k in ("var", "var_scaled", "snr"))
    line, = ax_var.plot(m_, var, label=f"{label}: Var($z_m$)")
    ax_var.plot(m_, var_scaled, ls="--", color=line.get_color(), label=r"Var($z_m/\sqrt{m}$)")
    ax_snr.plot(m_, snr, color=line.get_color(), label=label)
    ax_snr.plot(m_, snr[-1] * np.sqrt(m_ / m_[-1]), ls=":", color=line.get_color(),
                label=r"$\propto\sqrt{m}$")
    ax_var.set(xscale="log", yscale="log", xlabel="coordinates used m", ylabel="variance")
    ax_snr.set(xscale="log", yscale="log", xlabel="coordinates used m",
               ylabel=r"$|E z_m| / \mathrm{sd}(z_m)$")
    return {"slope_var": float(np.polyfit(np.log(m_), np.log(var), 1)[0]),
            "slope_snr": float(np.polyfit(np.log(m_), np.log(snr), 1)[0])}


# --- injection: sublayer attribution and the LayerNorm rule ---
def _attribution(a, name: str = "attribution"):
    from companion.injection.attribution import Attribution

    if not isinstance(a, Attribution):
        raise TypeError(f"{name} must be a companion.injection.attribution.Attribution, got "
                        f"{type(a).__name__}")
    return a


def _direction_sets(sets, n: int) -> dict:
    if not isinstance(sets, dict) or not sets:
        raise TypeError("directions must be a non-empty dict label -> list of direction indices")
    out = {}
    for label, idx in sets.items():
        arr = np.atleast_1d(np.asarray(idx))
        if not isinstance(label, str) or arr.dtype.kind not in "iu" or arr.size == 0 \
                or arr.min() < 0 or arr.max() >= n:
            raise ValueError(f"directions[{label!r}] must be indices in [0, {n}), got {idx!r}")
        out[label] = arr
    return out


def ln_rule_scatter(ax, attributions, directions: dict, group: str = "injected", colors=None):
    """Measured LayerNorm ratio against the product-rule factor, one point per LN and block.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    attributions : sequence of companion.injection.attribution.Attribution
        Post-norm results (e.g. one per injection layer).
    directions : dict of str to list of int
        Direction sets to pool (e.g. ``{"concepts": [0, 1], "random": [2, ..., 17]}``).
    group : str, default "injected"
    colors : sequence of colours, optional

    Returns
    -------
    list of matplotlib.collections.PathCollection
        One per direction set; LN1 as circles, LN2 as triangles, the diagonal dotted.
    """
    _check_axes(ax)
    atts = [_attribution(a, "attributions[i]") for a in attributions]
    if not atts:
        raise ValueError("attributions is empty")
    sets = _direction_sets(directions, atts[0].directions.shape[0])
    colors = [f"C{k}" for k in range(len(sets))] if colors is None else list(colors)
    out, lo, hi = [], np.inf, -np.inf
    for k, (label, idx) in enumerate(sets.items()):
        for q, marker in ((0, "o"), (1, "^")):
            x = np.concatenate([a.ln_ratios(group, idx)["rule"][:, q] for a in atts])
            y = np.concatenate([a.ln_ratios(group, idx)["measured"][:, q] for a in atts])
            ok = np.isfinite(x) & np.isfinite(y)
            out.append(ax.scatter(x[ok], y[ok], s=14, marker=marker, color=colors[k], alpha=0.8,
                                  label=f"{label}, LN{q + 1}"))
            if ok.any():
                lo, hi = min(lo, x[ok].min(), y[ok].min()), max(hi, x[ok].max(), y[ok].max())
    if np.isfinite(lo):
        ax.plot([lo, hi], [lo, hi], ":", color="k", lw=1)
    ax.set_xlabel("product rule  $\\hat v^\\top\\mathrm{diag}(\\gamma)P\\hat v/\\sigma$")
    ax.set_ylabel("measured  $p_{out}/p_{in}$")
    return out


def sublayer_cumulative(ax, attribution, directions: dict, group: str = "injected", colors=None):
    """Projection :math:`p_m/c` and the running sums of the attention and MLP writes.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    attribution : companion.injection.attribution.Attribution
        A pre-norm result.
    directions : dict of str to list of int
    group : str, default "injected"
    colors : sequence of colours, optional

    Returns
    -------
    list of matplotlib.lines.Line2D
        Per direction set: :math:`p_m/c` (solid), :math:`p_\\ell/c` + running attention sum
        (dashed) and the running MLP sum (dotted), means over the set and the prompts.
    """
    _check_axes(ax)
    a = _attribution(attribution)
    if a.placement != "pre":
        raise ValueError("sublayer_cumulative draws a pre-norm result (stages attn, mlp)")
    sets = _direction_sets(directions, a.directions.shape[0])
    colors = [f"C{k}" for k in range(len(sets))] if colors is None else list(colors)
    from companion.injection.directions import GROUPS

    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    g = GROUPS.index(group)
    m = np.arange(a.layer, a.n_layers + 1)
    lines = []
    for k, (label, idx) in enumerate(sets.items()):
        p = a.stream[idx, :, g].mean(axis=(0, 1)) / a.scale
        w = a.writes[idx, :, g].mean(axis=(0, 1)) / a.scale  # [blocks, 2]
        cum = np.vstack([np.zeros((1, 2)), np.cumsum(w, axis=0)])
        lines += ax.plot(m, p, "-", color=colors[k], lw=1.8, label=f"{label}: $p_m/c$")
        lines += ax.plot(m, p[0] + cum[:, 0], "--", color=colors[k], lw=1,
                         label=f"{label}: $p_\\ell/c$ + attention writes")
        lines += ax.plot(m, cum[:, 1], ":", color=colors[k], lw=1.4,
                         label=f"{label}: MLP writes")
    ax.axhline(0, color="0.6", lw=0.6)
    ax.set_xlabel(f"layer m ({a.model}, injected at l = {a.layer})")
    return lines



# --- depth study ---
# Figures of a stored depth_study Result (book/depth_study.ipynb): one panel per placement or
# per statistic, the members coloured by depth.

_PLACEMENT_NAMES = {"pre": "Pre-LN", "post": "Post-LN", "dslm": "DSLM Post-LN"}


def _depth_result(result, arrays):
    """The arrays, placements, depths and ``"device, torch version"`` of a depth_study Result."""
    from companion.experiments import check_result

    r = check_result(result, "depth_study", arrays, ("placements", "depths"))
    hw = f"{r.device}, torch {r.versions.get('torch', '?')}"
    return r.arrays, list(r.scalars["placements"]), np.array(r.scalars["depths"]), hw


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
    fig, axes = plt.subplots(1, len(PL), figsize=(11, 3.3), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        for d, (L, colour) in enumerate(zip(depths, depth_colours(len(depths)))):
            curve = np.convolve(A["train_loss"][p, d], np.ones(window) / window, mode="valid")
            ax.plot(np.arange(len(curve)) + window, curve, color=colour, label=f"L = {L}")
        ax.axhline(unigram, color="k", ls=":", lw=0.8, label="unigram loss")
        ax.set_title(_PLACEMENT_NAMES.get(placement, placement))
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("training loss (nats/byte)")
    axes[0, 0].legend(fontsize=7)
    finish(fig, f"Training curves ({hw})")
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
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
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
    axes[1].set(yscale="log", ylabel="E||h_L||^2 / d at the last layer")
    depth_axis(axes[1], depths)
    axes[0].legend(fontsize=7)
    finish(fig, f"Growth of the residual stream ({hw})")
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
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
    for p, placement in enumerate(PL):
        name = _PLACEMENT_NAMES.get(placement, placement)
        peak = np.nanmax(A["max_over_rms"][p, :, 1:], axis=1)
        last = A["max_over_rms"][p, range(len(depths)), depths]
        axes[0].plot(depths, peak, "o-", color=f"C{p}", label=f"{name}: max over layers")
        axes[0].plot(depths, last, "s--", color=f"C{p}", ms=3, label="at the last layer")
        axes[1].plot(depths, np.nanmax(A["n_mean_dominated"][p, :, 1:], axis=1), "o-", color=f"C{p}")
        obs = np.nansum(A["count_observed"][p, :, 1:, 0], axis=1)
        exp = np.nansum(A["count_expected"][p, :, 1:, 0], axis=1)
        axes[2].plot(depths, obs / exp, "o-", color=f"C{p}", label=name)
    axes[0].set_ylabel("max |x| / rms")
    axes[1].set_ylabel(f"mean-dominated channels (of {d_model})")
    axes[2].set_ylabel("C(4 rms): observed / Gaussian, all layers")
    axes[2].axhline(1, color="k", ls=":", lw=0.8)
    for ax in axes:
        depth_axis(ax, depths)
    axes[0].legend(fontsize=6)
    axes[2].legend(fontsize=7)
    finish(fig, f"Outlier statistics against depth at width {d_model} ({hw})")
    return fig, axes


# --- injection: concept readouts against nulls ---
def readout_against_null(ax, x, concept, null_mean, null_q, success=None, *, color=None,
                         label=None):
    """A concept's output readout per injection layer against its null level.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x : array_like, shape (K,)
        Injection layers (or layer / L).
    concept : array_like, shape (K,)
        The readout under the concept vector (prompt mean).
    null_mean, null_q : array_like, shape (K,)
        The mean and the 95th percentile of the same readout under the null directions;
        drawn as a dashed line and a shaded band from the null's mean to its percentile.
    success : array_like of bool, shape (K,), optional
        Layers where the success test holds: drawn as filled markers, the others open.
    color, label
        Of the concept's curve.

    Returns
    -------
    matplotlib.lines.Line2D
        The concept's curve.

    Raises
    ------
    TypeError
        If ``ax`` is not an Axes.
    ValueError
        Arrays of different lengths.
    """
    _check_axes(ax)
    xs = _vector(x, "x")
    c, m, q = (_vector(v, n, xs.size) for v, n in ((concept, "concept"), (null_mean, "null_mean"),
                                                   (null_q, "null_q")))
    ok = np.ones(xs.size, bool) if success is None else np.asarray(success, dtype=bool)
    if ok.shape != xs.shape:
        raise ValueError(f"success must have {xs.size} entries, got shape {ok.shape}")
    (line,) = ax.plot(xs, c, "-", color=color, label=label)
    col = line.get_color()
    ax.plot(xs[ok], c[ok], "o", color=col, ms=4)
    ax.plot(xs[~ok], c[~ok], "o", mfc="none", color=col, ms=4)
    ax.plot(xs, m, "--", color=col, lw=0.8)
    ax.fill_between(xs, m, q, color=col, alpha=0.15, lw=0)
    return line


def success_window_rows(ax, labels, layers, windows, first_ci, last_ci, n_layers):
    """One row per case: the injection layers where success holds, and the edges' intervals.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    labels : sequence of str
        One per row (e.g. ``"sea, random null"``).
    layers : array_like of int
        Every tested injection layer (drawn as small grey ticks).
    windows : sequence of array_like of int
        Per row, the layers where the test succeeds (drawn as filled dots).
    first_ci, last_ci : array_like, shape (rows, 2)
        Per row, the bootstrap interval of the first and the last edge (NaN: none).
    n_layers : int
        Depth ``L``; the abscissa is layer / L.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        If ``ax`` is not an Axes or ``n_layers`` not an integer.
    ValueError
        Inputs of inconsistent lengths.
    """
    _check_axes(ax)
    L = check_int(n_layers, "n_layers", 1)
    if isinstance(labels, str) or not all(isinstance(s, str) for s in labels):
        raise ValueError("labels must be a sequence of strings")
    rows = len(labels)
    if len(windows) != rows:
        raise ValueError(f"windows must have {rows} entries, got {len(windows)}")
    fci, lci = as_float64(first_ci, "first_ci"), as_float64(last_ci, "last_ci")
    if fci.shape != (rows, 2) or lci.shape != (rows, 2):
        raise ValueError(f"first_ci and last_ci must have shape ({rows}, 2)")
    lay = _vector(layers, "layers") / L
    for k in range(rows):
        y = rows - 1 - k
        ax.plot(lay, np.full(lay.size, y), "|", color="0.7", ms=6)
        w = np.asarray(windows[k], dtype=float) / L
        ax.plot(w, np.full(w.size, y), "o", color=f"C{k % 10}", ms=5)
        for ci, yy in ((fci[k], y + 0.18), (lci[k], y - 0.18)):
            if np.all(np.isfinite(ci)):
                ax.plot(ci / L, [yy, yy], "-", color=f"C{k % 10}", lw=2.5, alpha=0.6,
                        solid_capstyle="butt")
    ax.set_yticks(np.arange(rows)[::-1], list(labels))
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel(r"injection layer $\ell / L$")
    return ax


# --- block figures ---
# Figures of the concentration and three-effect chapters: the chapter computes every curve, these
# functions only draw them.

def _samples_dict(samples, name: str, rows: int) -> dict:
    if not isinstance(samples, dict) or not samples:
        raise TypeError(f"{name} must be a non-empty dict key -> array")
    out = {k: as_float64(v, f"{name}[{k!r}]") for k, v in samples.items()}
    for k, v in out.items():
        if v.ndim != 2 or v.shape[0] != rows or v.shape[1] < 2:
            raise ValueError(f"{name}[{k!r}] must have shape ({rows}, trials >= 2), got {v.shape}")
    return out


def gaussian_maxima(N, exact, upper, t_N, lower, simulated):
    """Where the largest of ``N`` standard Gaussians lies (two panels).

    Parameters
    ----------
    N : array_like, 1-D
        Grid of ``N`` (integers >= 1).
    exact, upper, t_N, lower : array_like, same length as ``N``
        ``E max|G_i|``; the upper bound ``sqrt(2 ln 2N)``; ``t_N`` with ``E C(t_N) = 1``; the lower
        bound (ii) (non-positive values are not drawn).
    simulated : tuple ``(Ns, samples)``
        Simulated maxima, ``samples[i]`` one per stream at ``Ns[i]``: their mean drawn with
        +- 2 standard errors.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)
        Left: the curves against ``N``; right: their ratio to ``sqrt(2 ln N)`` for ``N > 1``.
    """
    import matplotlib.pyplot as plt

    N = _vector(N, "N")
    if N.size == 0 or np.any(N < 1):
        raise ValueError("N must be a non-empty grid of integers >= 1")
    exact, upper, t_N, lower = (_vector(v, n, N.size) for v, n in (
        (exact, "exact"), (upper, "upper"), (t_N, "t_N"), (lower, "lower")))
    if not isinstance(simulated, tuple) or len(simulated) != 2:
        raise TypeError("simulated must be a tuple (Ns, samples)")
    Ns = _vector(simulated[0], "simulated Ns")
    sim = _samples_dict({"": simulated[1]}, "simulated samples", Ns.size)[""]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    ax.semilogx(N, exact, "k", label=r"exact $\mathbb{E}\max|G_i|$")
    ax.errorbar(Ns, sim.mean(axis=1), yerr=2 * sim.std(axis=1, ddof=1) / np.sqrt(sim.shape[1]),
                fmt="o", ms=3, color="C3", label=f"simulated ({sim.shape[1]} streams)")
    ax.semilogx(N, upper, "C0--", label=r"upper $\sqrt{2\ln 2N}$")
    ax.semilogx(N, t_N, "C2:", label=r"$t_N$: $\mathbb{E}C(t_N)=1$")
    ax.semilogx(N, (1 - np.exp(-1)) * t_N, "C1-.", label=r"lower $(1-e^{-1})t_N$")
    ax.set(xlabel="N", ylabel="largest of N", title="Where is the largest of N Gaussians?")
    ax.legend(fontsize=8)
    ax = axes[1]
    big = N > 1
    root = np.sqrt(2 * np.log(N[big]))
    ax.semilogx(N[big], exact[big] / root, "k", label="exact")
    ax.semilogx(N[big], upper[big] / root, "C0--", label="upper bound")
    ax.semilogx(N[big], np.where(lower[big] > 0, lower[big], np.nan) / root, "C1-.",
                label="lower bound (ii), a = 1")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set(xlabel="N", ylabel=r"ratio to $\sqrt{2\ln N}$", ylim=(0.4, 1.6),
           title=r"Slow convergence to $\sqrt{2\ln N}$")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, axes


def largest_logits(n, samples, n_grid, gaussian):
    """The largest of ``n`` attention logits against the context length ``n``.

    Parameters
    ----------
    n : array_like, 1-D
        Context lengths of the simulation.
    samples : dict
        ``d_k -> array [len(n), trials]``: simulated maxima, drawn as means +- 2 standard errors.
    n_grid : array_like, 1-D
        Grid for the reference curves.
    gaussian : array_like, same length as ``n_grid``
        The expected largest of ``n`` Gaussian logits (drawn dashed); ``ln n`` is drawn dotted.

    Returns
    -------
    (matplotlib.figure.Figure, matplotlib.axes.Axes)
    """
    import matplotlib.pyplot as plt

    n = _vector(n, "n")
    samples = _samples_dict(samples, "samples", n.size)
    if len(samples) > 10:
        raise ValueError("samples can hold at most 10 values of d_k")
    n_grid = _vector(n_grid, "n_grid")
    gaussian = _vector(gaussian, "gaussian", n_grid.size)
    fig, ax = plt.subplots()
    for k, (d_k, m) in enumerate(samples.items()):
        ax.errorbar(n, m.mean(axis=1), yerr=2 * m.std(axis=1, ddof=1) / np.sqrt(m.shape[1]),
                    fmt="o-", color=f"C{k}", ms=3, label=f"$d_k$ = {d_k} (simulated)")
    ax.semilogx(n_grid, gaussian, "k--", lw=0.9,
                label=r"Gaussian logits (exact); $\approx\sqrt{2\ln n}$")
    ax.semilogx(n_grid, np.log(n_grid), "k:", lw=0.9, label=r"$\ln n$")
    ax.set(xscale="log", xlabel="context length n", ylabel="largest logit",
           title=r"Largest of n logits: $\ln n$ for $d_k=1$, $\sqrt{2\ln n}$ for $d_k=64$")
    ax.legend(fontsize=8)
    return fig, ax


def scale_spread(spread):
    """Relative spread of LayerNorm's scale per layer, across sequences and across positions.

    Parameters
    ----------
    spread : dict
        ``d -> (within, between)``: per layer, sd / mean of the scale across sequences and across
        positions; ``1/sqrt(2d)`` (a Gaussian vector's value) is drawn dotted.

    Returns
    -------
    (matplotlib.figure.Figure, matplotlib.axes.Axes)
    """
    import matplotlib.pyplot as plt

    if not isinstance(spread, dict) or not spread or len(spread) > 10:
        raise TypeError("spread must be a dict d -> (within, between) with 1 to 10 entries")
    curves = {}
    for d, pair in spread.items():
        d = check_int(d, "every width d", 1)
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"spread[{d}] must be a pair (within, between)")
        within = _vector(pair[0], f"spread[{d}] within")
        curves[d] = (within, _vector(pair[1], f"spread[{d}] between", within.size))
    fig, ax = plt.subplots()
    for k, (d, (within, between)) in enumerate(curves.items()):
        ax.plot(within, "o-", color=f"C{k}", label=f"across sequences, d = {d}")
        ax.plot(between, "s--", color=f"C{k}", label=f"across positions, d = {d}")
        ax.axhline(1 / np.sqrt(2 * d), color=f"C{k}", lw=0.8, ls=":")
    ax.set(xlabel="layer", ylabel="relative spread of the scale", ylim=(0, 0.12),
           title=r"LayerNorm's scale: $1/\sqrt{2d}$ across sequences (dotted)")
    ax.legend(fontsize=8)
    return fig, ax


def _block_gain_grid(rows, name: str, colours) -> tuple[list, list]:
    """The blocks and gains of a dict ``(block, gain) -> entries``, in insertion order."""
    if not isinstance(rows, dict) or not rows or not all(
            isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], str) for k in rows):
        raise TypeError(f"{name} must be a non-empty dict (block, gain) -> arrays")
    blocks = list(dict.fromkeys(k[0] for k in rows))
    gains = list(dict.fromkeys(k[1] for k in rows))
    if any((b, g) not in rows for b in blocks for g in gains):
        raise ValueError(f"{name} must hold every (block, gain) pair")
    if len(gains) > len(colours):
        raise ValueError(f"{name}: at most {len(colours)} gains (one colour each)")
    return blocks, gains


def postln_projection(rows, ell: int, d: int, *, colours=("C0", "C1", "C3")):
    """Post-LN stacks: the measured projection ``|p_m|`` against the product of ``1/s``, one panel
    per block, one colour per gain, relative to ``p_ell``; dotted: the floor
    ``||delta_m|| / sqrt(d)``.

    Parameters
    ----------
    rows : dict
        ``(block, gain) -> (p, q, dn, ...)``: measured projection, predicted projection and
        ``||delta||``, arrays ``[L + 1, sequences, tokens]`` (extra entries are ignored).
    ell : int
        The injection layer.
    d : int
        The width.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    blocks, gains = _block_gain_grid(rows, "rows", colours)
    ell, d = check_int(ell, "ell", 0), check_int(d, "d", 1)
    arrays = {}
    for key, entry in rows.items():
        if not isinstance(entry, tuple) or len(entry) < 3:
            raise TypeError(f"rows[{key}] must be a tuple (p, q, dn, ...)")
        p, q, dn = (as_float64(v, f"rows[{key}]") for v in entry[:3])
        if p.ndim != 3 or q.shape != p.shape or dn.shape != p.shape or p.shape[0] <= ell:
            raise ValueError(f"rows[{key}]: p, q, dn must share a shape [L + 1 > ell, B, T]")
        arrays[key] = p, q, dn
    fig, axes = plt.subplots(1, len(blocks), figsize=(11, 3.6), sharey=True, squeeze=False)
    for ax, block in zip(axes[0], blocks):
        for gain, colour in zip(gains, colours):
            p, q, dn = arrays[(block, gain)]
            m = np.arange(ell, p.shape[0])
            p0 = q[ell].mean()
            ax.semilogy(m, np.abs(p[ell:].mean(axis=(1, 2))) / p0, "o", color=colour, ms=4,
                        label=f"measured, g={gain}")
            ax.semilogy(m, q[ell:].mean(axis=(1, 2)) / p0, "-", color=colour, lw=1.2,
                        label=f"product of 1/s, g={gain}")
            ax.semilogy(m, (dn[ell:] / np.sqrt(d)).mean(axis=(1, 2)) / p0, ":", color=colour, lw=1)
        ax.set_title(f"Post-LN, {block}")
        ax.set_xlabel("layer m")
        ax.set_ylim(1e-4, 2)
    axes[0, 0].set_ylabel(r"$|p_m| / p_\ell$  (dotted: floor $\|\delta_m\|/\sqrt{d}$)")
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Random Post-LN stacks (d = {d}): projection measured vs the product of 1/s")
    fig.tight_layout()
    return fig, axes[0]


def preln_ratios(rows, ell: int, *, colours=("C0", "C1", "C3")):
    """Pre-LN stacks: the readable projection ``pi_m / pi_ell`` against the dilution law and the
    relative size ``rho_m / rho_ell``, one panel per block, one colour per gain.

    Parameters
    ----------
    rows : dict
        ``(block, gain) -> (pi, law, rho, c)``: three curves over layers ``ell, ell + 1, ...``
        (same length) and the growth slope ``c`` of the law.
    ell : int
        The injection layer (the first abscissa).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    blocks, gains = _block_gain_grid(rows, "rows", colours)
    ell = check_int(ell, "ell", 0)
    curves = {}
    for key, entry in rows.items():
        if not isinstance(entry, tuple) or len(entry) != 4:
            raise TypeError(f"rows[{key}] must be a tuple (pi, law, rho, c)")
        meas = _vector(entry[0], f"rows[{key}] pi")
        law, rho = (_vector(v, f"rows[{key}]", meas.size) for v in entry[1:3])
        curves[key] = meas, law, rho, check_real(entry[3], f"rows[{key}] c")
    fig, axes = plt.subplots(1, len(blocks), figsize=(10, 3.6), sharey=True, squeeze=False)
    for ax, block in zip(axes[0], blocks):
        for gain, colour in zip(gains, colours):
            meas, law, rho, c = curves[(block, gain)]
            m = np.arange(ell, ell + meas.size)
            ax.plot(m, meas, "o", ms=3, color=colour, label=fr"$\pi_m/\pi_\ell$, g={gain}")
            ax.plot(m, law, "-", color=colour, lw=1.2,
                    label=fr"$\sqrt{{(1+c\ell)/(1+cm)}}$, c={c:.2f}")
            ax.plot(m, rho, "--", color=colour, lw=1, label=fr"$\rho_m/\rho_\ell$, g={gain}")
        ax.set_title(f"Pre-LN, {block}")
        ax.set_xlabel("layer m")
        ax.set_ylim(0, 1.6)
    axes[0, 0].set_ylabel("ratio to the injection layer")
    axes[0, 0].legend(fontsize=7, ncol=1, loc="upper right")
    fig.tight_layout()
    return fig, axes[0]


def subexponential_tails(t, exact, bounds, windows):
    """Sub-exponential tails and their parameters (two panels).

    Parameters
    ----------
    t : array_like, 1-D
    exact, bounds : dict
        Tails of the centred variables and their ``psi_1`` bounds, as in :func:`tail_curves`
        (left panel).
    windows : dict
        ``label -> (inv_b, nu2, variance, colour)``: the smallest ``nu^2`` against the window
        ``1/b`` (right panel; infinite values are not drawn), the variance drawn as a dotted line.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)
    """
    import matplotlib.pyplot as plt

    if not isinstance(windows, dict) or not windows:
        raise TypeError("windows must be a non-empty dict label -> (inv_b, nu2, variance, colour)")
    curves = {}
    for label, entry in windows.items():
        if not isinstance(entry, tuple) or len(entry) != 4 or not isinstance(entry[3], str):
            raise TypeError(f"windows[{label!r}] must be a tuple (inv_b, nu2, variance, colour)")
        x = _vector(entry[0], f"windows[{label!r}] inv_b")
        curves[label] = (x, _vector(entry[1], f"windows[{label!r}] nu2", x.size),
                         check_real(entry[2], f"windows[{label!r}] variance"), entry[3])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    tail_curves(ax, t, exact, bounds)
    ax.set(xlabel="t", ylabel=r"$P(|X-\mathbb{E}X|\geq t)$", ylim=(1e-8, 1.5),
           title="Exponential tails and the $\\psi_1$ bound")
    ax.legend(fontsize=8)
    ax = axes[1]
    for label, (x, nu2, _, colour) in curves.items():
        ax.plot(x, nu2, colour, label=label)
    for _, _, variance, colour in curves.values():
        ax.axhline(variance, color=colour, ls=":", lw=0.8)
    ax.set(xlabel="window $1/b$", ylabel=r"smallest $\nu^2$", ylim=(0, 12),
           title=r"$\nu^2(b)$: from the variance (dotted) to $\infty$ at the tail rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, axes


def norm_fluctuations(x, densities, gaussian, simulated, t, exact, bounds):
    """The fluctuation ``||h|| - E||h||`` of a Gaussian vector's norm (two panels).

    Parameters
    ----------
    x : array_like, 1-D
        Abscissa of the densities.
    densities : dict
        ``d -> density of ||h|| - E||h||`` at ``x``.
    gaussian : array_like
        The ``N(0, 1/2)`` density at ``x`` (dashed).
    simulated : tuple ``(d, samples)``
        Simulated fluctuations at width ``d``, drawn as a histogram.
    t, exact, bounds
        The right panel's tails and dimension-free bounds, as in :func:`tail_curves`.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)
    """
    import matplotlib.pyplot as plt

    x = _vector(x, "x")
    if not isinstance(densities, dict) or not densities:
        raise TypeError("densities must be a non-empty dict d -> values")
    dens = {check_int(d, "every width d", 1): _vector(v, f"densities[{d}]", x.size)
            for d, v in densities.items()}
    gaussian = _vector(gaussian, "gaussian", x.size)
    if not isinstance(simulated, tuple) or len(simulated) != 2:
        raise TypeError("simulated must be a tuple (d, samples)")
    d_sim, samples = check_int(simulated[0], "simulated d", 1), _vector(simulated[1], "samples")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for d, y in dens.items():
        ax.plot(x, y, label=f"d = {d}")
    ax.plot(x, gaussian, "k--", lw=0.9, label="N(0, 1/2)")
    ax.hist(samples, bins=60, density=True, color="C2", alpha=0.25, label=f"simulated, d = {d_sim}")
    ax.set(xlabel=r"$\|h\|-\mathbb{E}\|h\|$", ylabel="density",
           title=r"$\|h\|$ fluctuates by O(1) in every dimension")
    ax.legend(fontsize=8)
    ax = axes[1]
    tail_curves(ax, t, exact, bounds)
    ax.set(xlabel="t", ylabel=r"$P(|\,\|h\|-c\,|\geq t)$", ylim=(1e-14, 1.5),
           title="Dimension-free bounds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, axes


def norm_and_logit_tails(r, norm_tails, t, logit_tails, gaussian):
    """Tails of squared norms (left) and of scaled attention logits (right), on log axes.

    Parameters
    ----------
    r : array_like, 1-D
        Relative deviations of ``||h||^2 / d`` from 1.
    norm_tails : dict
        ``d -> (exact, bernstein)`` at ``r``; one colour per ``d`` (at most 10).
    t : array_like, 1-D
    logit_tails : dict
        ``d_k -> exact tail of |q.k| / sqrt(d_k)`` at ``t``.
    gaussian : array_like
        The standard Gaussian's two-sided tail at ``t`` (dashed, black).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)
    """
    import matplotlib.pyplot as plt

    for name, value in (("norm_tails", norm_tails), ("logit_tails", logit_tails)):
        if not isinstance(value, dict) or not 0 < len(value) <= 10:
            raise TypeError(f"{name} must be a dict with 1 to 10 entries")
    if not all(isinstance(v, tuple) and len(v) == 2 for v in norm_tails.values()):
        raise TypeError("norm_tails must map d -> (exact, bernstein)")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for k, (d, (exact, bern)) in enumerate(norm_tails.items()):
        tail_curves(ax, r, {f"exact, d = {d}": (exact, f"C{k}")},
                    {f"Bernstein, d = {d}": (bern, f"C{k}--")})
    ax.set(xlabel=r"$r$", ylabel=r"$P(|\,\|h\|^2/d-1\,|\geq r)$",
           ylim=(1e-12, 1.5), title="Squared norms: exact and Bernstein")
    ax.legend(fontsize=8)
    ax = axes[1]
    tail_curves(ax, t, {f"$d_k$ = {d_k}": (v, f"C{k}") for k, (d_k, v) in enumerate(
        logit_tails.items())}, {"N(0, 1)": (gaussian, "k--")})
    ax.set(xlabel="t", ylabel=r"$P(|q\cdot k|/\sqrt{d_k}\geq t)$", ylim=(1e-12, 1.5),
           title="Scaled logits: heavier than Gaussian, less so as $d_k$ grows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, axes


def bernoulli_sum_tails(t, panels, n: int):
    """Tails of sums of ``n`` Bernoulli variables against their bounds, one panel per ``p``.

    Parameters
    ----------
    t : array_like, 1-D
    panels : dict
        ``p -> (exact, bounds)``: the exact two-sided tail at ``t`` (black dots) and a dict of
        bounds as in :func:`tail_curves` (drawn with width 1.5).
    n : int
        The number of summands (in the titles).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    if not isinstance(panels, dict) or not panels or not all(
            isinstance(v, tuple) and len(v) == 2 for v in panels.values()):
        raise TypeError("panels must be a non-empty dict p -> (exact, bounds)")
    n = check_int(n, "n", 1)
    fig, axes = plt.subplots(1, len(panels), figsize=(10, 4), sharey=True, squeeze=False)
    for ax, (p, (exact, bounds)) in zip(axes[0], panels.items()):
        tail_curves(ax, t, {"exact": (exact, "ko")}, bounds, lw_bound=1.5)
        ax.set(xlabel="t", title=f"sum of {n} Bernoulli({p})", ylim=(1e-30, 2))
    axes[0, 0].set_ylabel(r"$P(|S-np|\geq t)$")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return fig, axes[0]


def _arrays_of(arrays, name: str, keys) -> dict:
    if not isinstance(arrays, dict) or any(k not in arrays for k in keys):
        raise TypeError(f"{name} must be a dict of arrays with {', '.join(keys)}")
    return {k: as_float64(arrays[k], f"{name}[{k!r}]") for k in keys}


def random_window_edges(arrays, predicted, config, block: str = "mlp"):
    """Lower edge of the window of the readable projection in random stacks against depth, one
    panel per placement (:func:`window_edges`, one colour per gain).

    Parameters
    ----------
    arrays : dict
        Of :func:`companion.experiments.framework_random.run_random_windows`.
    predicted : array_like, ``[placement, block, gain, depth]``
        :func:`companion.experiments.framework_random.predicted_first_fraction`.
    config : companion.experiments.framework_random.RandomWindowsConfig
    block : str, default "mlp"
        One of ``config.blocks``.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    from companion.experiments.framework_random import RandomWindowsConfig

    if not isinstance(config, RandomWindowsConfig):
        raise TypeError(f"config must be a RandomWindowsConfig, got {type(config).__name__}")
    if block not in config.blocks:
        raise ValueError(f"block must be one of {config.blocks}, got {block!r}")
    win = _arrays_of(arrays, "arrays", ("window_relative_projection",))
    win = win["window_relative_projection"]
    shape = (len(config.placements), len(config.blocks), len(config.gains), len(config.depths))
    pred = as_float64(predicted, "predicted")
    if win.shape[:4] != shape or pred.shape != shape:
        raise ValueError(f"arrays and predicted must match the config's shape {shape}, got "
                         f"{win.shape[:4]} and {pred.shape}")
    name = {"mlp": "MLP"}.get(block, block)
    fig, axes = plt.subplots(1, len(config.placements), figsize=(10, 3.6), sharey=True,
                             squeeze=False)
    k = config.blocks.index(block)
    for ax, (p, placement) in zip(axes[0], enumerate(config.placements)):
        window_edges(ax, config.depths, win[p, k, :, :, 1], pred[p, k],
                     [f"{name} g={g}" for g in config.gains], [f"g={g}" for g in config.gains])
        ax.set_title(f"{placement}-LN: window = [first, L-1]")
    axes[0, 0].set_ylabel("lower edge of the window / L")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig, axes[0]


def trained_kl_profiles(trained, init, config):
    """KL at later tokens against the injection layer in trained TinyLMs and at initialisation,
    one panel per placement (:func:`effect_profiles`, each curve divided by its maximum).

    Parameters
    ----------
    trained, init : dict
        Of :func:`companion.experiments.framework_trained.sweep_trained` (the first width).
    config : companion.experiments.framework_trained.TrainedWindowsConfig

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    from companion.experiments.framework_trained import TrainedWindowsConfig

    if not isinstance(config, TrainedWindowsConfig):
        raise TypeError(f"config must be a TrainedWindowsConfig, got {type(config).__name__}")
    kl = [_arrays_of(a, n, ("effect_kl_later",))["effect_kl_later"]
          for a, n in ((trained, "trained"), (init, "init"))]
    shape = (len(config.placements), len(config.widths), len(config.depths))
    if any(a.shape[:3] != shape for a in kl):
        raise ValueError(f"effect_kl_later must have the config's shape {shape} + (layer,)")
    fig, axes = plt.subplots(1, len(config.placements), figsize=(10, 3.6), sharey=True,
                             squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(config.placements)):
        effect_profiles(ax, kl[0][p, 0], config.depths, label="trained")
        effect_profiles(ax, kl[1][p, 0], config.depths, fmt="x:", label="at init")
        ax.axhline(0.5, color="k", lw=0.8, ls="--")
        ax.set_title(f"TinyLM, {placement}-LN: KL at later tokens")
        ax.set_xlabel("injection layer (l + 1/2) / L")
    axes[0, 0].set_ylabel("KL / max over layers")
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig, axes[0]


# Figures of the outliers chapter: the package's dataclasses of two real models.

def _named(stats, layers, kind):
    """``stats`` (name -> ``kind``) and ``layers`` (name -> layer(s)) checked for one figure."""
    if not isinstance(layers, dict) or not layers or any(n not in stats for n in layers):
        raise TypeError("layers must be a non-empty dict whose names are keys of stats")
    for name in layers:
        if not isinstance(stats[name], kind):
            raise TypeError(f"stats[{name!r}] must be a {kind.__name__}, got "
                            f"{type(stats[name]).__name__}")


def count_comparison_panels(stats, layers):
    """Observed counts against their Gaussian prediction (:func:`count_comparison`), one panel per
    model at one layer; the regimes are those of
    :func:`companion.outliers.regimes.classify_regime`.

    Parameters
    ----------
    stats : dict
        ``name -> companion.outliers.channel_statistics.ChannelStatistics``.
    layers : dict
        ``name -> layer`` (one panel each, in this order).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)
    """
    import matplotlib.pyplot as plt

    from companion.outliers import regimes
    from companion.outliers.channel_statistics import ChannelStatistics

    _named(stats, layers, ChannelStatistics)
    fig, axes = plt.subplots(1, len(layers), figsize=(10, 4.2), squeeze=False)
    for ax, (name, l) in zip(axes[0], layers.items()):
        st = stats[name]
        l = check_int(l, f"layers[{name!r}]", 0, st.mean.shape[0] - 1)
        pred = regimes.predicted_counts(st.mean[l], st.std[l], st.thresholds, st.n_tokens)
        reg = regimes.classify_regime(st.mean[l], st.std[l], st.thresholds)
        count_comparison(ax, pred["gaussian"], st.counts[l], reg, st.n_tokens, regimes.REGIMES,
                         title=f"{name}, layer {l}")
    fig.tight_layout()
    return fig, axes[0]


def massive_activation_sink(profile, sink, layer: int):
    """A massive activation and the first-token attention sink (two panels).

    Parameters
    ----------
    profile : companion.outliers.massive_activations.FirstTokenProfile
        Left: its ratio to the median ``|h|`` per layer (log scale; dashed: 1000).
    sink : dict
        ``arm -> (mean, lo, hi)``: attention weight on the first token per block with its
        interval (e.g. a bootstrap over prompts); at most 3 arms, drawn black, red, blue.
    layer : int
        The ablated layer (dotted vertical line in both panels).

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes)
    """
    import matplotlib.pyplot as plt

    from companion.outliers.massive_activations import FirstTokenProfile

    if not isinstance(profile, FirstTokenProfile):
        raise TypeError(f"profile must be a FirstTokenProfile, got {type(profile).__name__}")
    n_blocks = profile.values.shape[0] - 1
    layer = check_int(layer, "layer", 0, n_blocks)
    colours = ("k", "C3", "C0")
    if not isinstance(sink, dict) or not 0 < len(sink) <= len(colours) or not all(
            isinstance(v, tuple) and len(v) == 3 for v in sink.values()):
        raise TypeError("sink must be a dict arm -> (mean, lo, hi) with 1 to 3 arms")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    layer_profiles(axes[0], {f"|h[0, {profile.channel}]| / median |h|": profile.ratio},
                   np.arange(n_blocks + 1), ylabel="ratio", logy=True)
    axes[0].axhline(1000, color="k", ls="--", lw=0.8)
    axes[0].axvline(layer, color="grey", ls=":", lw=0.8)
    for (arm, (mean, lo, hi)), colour in zip(sink.items(), colours):
        band(axes[1], np.arange(n_blocks), mean, lo, hi, color=colour, label=arm, ms=2)
    axes[1].axvline(layer, color="grey", ls=":", lw=0.8)
    axes[1].set(xlabel="block", ylabel="attention weight on the first token", ylim=(0, 1))
    axes[1].legend(fontsize=8)
    fig.suptitle(f"SmolLM2: the massive activation (left) and the first-token sink under the "
                 f"ablation at h_{layer} (right; bands: 95% bootstrap over prompts)", fontsize=9)
    fig.tight_layout()
    return fig, axes


def outlier_feature_shares(features, position_share: float = 0.06):
    """Share of positions at the outlier threshold per block, one curve per systematic feature
    (:meth:`companion.outliers.outlier_features.OutlierFeatureStatistics.systematic`) of each model,
    against the relative depth; the larger of a block's two linear inputs.

    Parameters
    ----------
    features : dict
        ``name -> OutlierFeatureStatistics``.
    position_share : float, default 0.06
        The criterion's share (dashed line).

    Returns
    -------
    (matplotlib.figure.Figure, matplotlib.axes.Axes)
    """
    import matplotlib.pyplot as plt

    from companion.outliers.outlier_features import OutlierFeatureStatistics

    if not isinstance(features, dict) or not features or not all(
            isinstance(v, OutlierFeatureStatistics) for v in features.values()):
        raise TypeError("features must be a non-empty dict name -> OutlierFeatureStatistics")
    position_share = check_real(position_share, "position_share", lo=0.0, hi=1.0)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ofs in features.items():
        for j in ofs.systematic(position_share=position_share):
            share = np.maximum(ofs.share[0::2, j], ofs.share[1::2, j])
            layer_profiles(ax, {f"{name}, feature {j}": share},
                           (np.arange(ofs.n_layers) + 0.5) / ofs.n_layers, legend_fontsize=None,
                           xlabel="relative depth (block + 1/2) / L",
                           ylabel=f"share of positions with |x| >= {ofs.threshold:g}")
    ax.axhline(position_share, color="k", ls="--", lw=0.8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, ax


# --- block injection ---
def effect_bands(ax, result, colours=("C0", "C1", "C3")):
    """The disruption curves of an ``injection_success`` Result on a log scale.

    Per magnitude of the random group (one colour each): the random directions' mean effect
    with its 95% bootstrap band (:func:`~companion.experiments.injection_success.effect_curve`)
    and, dotted, the mean over the concept vectors, against :math:`\ell / L`; layers where the
    random mean is 0 are left out (a log scale cannot show them).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    result : Result
        Of ``injection_success``.
    colours : sequence of str
        One per magnitude.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        If ``ax`` is not an Axes or ``result`` not an ``injection_success`` Result.
    """
    from companion.experiments import check_result
    from companion.experiments import injection_success as es

    _check_axes(ax)
    check_result(result, "injection_success")
    n_random, n_concepts = result.arrays["random_effect"].shape[0], len(result.scalars["concepts"])
    for alpha, colour in zip(result.arrays["random_scales"], colours):
        c = es.effect_curve(result, "random", alpha)
        keep = c["mean"] > 0
        band(ax, c["fraction"][keep], c["mean"][keep], c["lo"][keep], c["hi"][keep],
             color=colour, label=fr"{n_random} random, $\alpha$ = {alpha:g}")
        cc = [es.effect_curve(result, "concept", alpha, direction=k) for k in range(n_concepts)]
        ax.plot(c["fraction"][keep], np.mean([x["mean"] for x in cc], 0)[keep], ":",
                color=colour, label=fr"{n_concepts} concepts (mean), $\alpha$ = {alpha:g}")
    ax.set_yscale("log")
    ax.set_xlabel(r"injection layer $\ell / L$")
    ax.set_ylabel(result.scalars["effect_name"])
    return ax


def window_effects(ax, results, scale: float = 0.5):
    """The output effect of ``injection_window`` Results against the injection layer's depth.

    Per Result, the effect of the relative sweep at ``scale`` averaged over its directions
    (the curve :func:`~companion.experiments.injection_window.mean_window` thresholds), divided
    by its maximum, against :math:`\\ell / L`; the window's threshold 1/2 as a line.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    results : dict
        ``key -> Result`` of ``injection_window`` (e.g. from
        :func:`~companion.experiments.injection_window.gpu_results`), one curve each.
    scale : float, default 0.5
        A relative magnitude the Results ran.

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        If ``ax`` is not an Axes or a value of ``results`` not an ``injection_window`` Result.
    ValueError
        A Result that did not run ``scale``.
    """
    from companion.experiments import injection_window as ei

    _check_axes(ax)
    for r in results.values():
        tracks = ei.tracks(r)                       # checks the Result
        k = ei.scale_index(r, "rel", scale)
        effect = np.mean([t.effect()[:, k] for (_, mode), t in tracks.items() if mode == "rel"], 0)
        L = r.scalars["n_layers"]
        ax.plot(r.arrays["layers"] / L, effect / effect.max(), marker="o", ms=2,
                label=f"{r.scalars['model_name']} (L = {L})")
    ax.axhline(0.5, color="k", lw=0.6)
    ax.set_xlabel(r"injection layer $\ell / L$")
    ax.set_ylabel(f"effect / maximum (alpha = {scale:g})")
    ax.legend(fontsize=6, ncol=2)
    return ax


# --- block partfigs ---
def _depth_scale(result, scale) -> int:
    scales = list(result.config["scales"])
    if check_real(scale, "scale") not in scales:
        raise ValueError(f"scale must be one of the Result's scales {scales}, got {scale!r}")
    return scales.index(scale)


def depth_success_rates(result, scale: float = 1.0):
    """Success rate of the target directions against injection layer / L in a depth_study
    Result, one panel per placement: each member with its bootstrap band (darker = deeper),
    the chance level (dotted) and the window threshold (dashed); each title gives the mean rate
    of the held-out random directions.

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
    fig, axes = plt.subplots(1, len(PL), figsize=(11, 3.3), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        for d, (L, colour) in enumerate(zip(depths, depth_colours(len(depths)))):
            rate, lo, hi = (A[k][p, d, s] for k in keys)
            band(ax, A["inject_layers"][p, d] / L, rate, lo, hi, color=colour, label=f"L = {L}")
        ax.axhline(chance, color="k", ls=":", lw=0.8, label=f"chance 1/{round(1 / chance)}")
        ax.axhline(result.scalars["window_threshold"], color="r", ls="--", lw=0.8,
                   label="window threshold")
        ax.set_title(f"{_PLACEMENT_NAMES.get(placement, placement)} (held-out null: "
                     f"{np.nanmean(A['null_rate'][p, :, s]):.3f})", fontsize=9)
        ax.set_xlabel("injection layer / L")
    axes[0, 0].set_ylabel(f"success rate (alpha = {scale:g})")
    axes[0, 0].legend(fontsize=7)
    finish(fig, f"Success of a target's unembedding direction against "
                f"{result.config['n_random']} random ones ({hw})")
    return fig, axes[0]


def depth_window_edges(result, scale: float = 1.0):
    """First layer / L (left) and coverage (right) of the window against depth in a depth_study
    Result, with their bootstrap intervals, one series per placement; the note's 6.25% dotted.

    Parameters and Raises as :func:`depth_success_rates`; returns the figure and its two Axes.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("window", "window_lo", "window_hi"))
    s = _depth_scale(result, scale)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
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
    axes[0].legend(fontsize=7)
    finish(fig, f"Window position and width against depth, alpha = {scale:g} ({hw})")
    return fig, axes


def depth_law_projections(result):
    """Projection on the injected direction from ``l0 = L/4`` to the output against its law
    (Pre-LN: dilution; Post-LN: product rule) in a depth_study Result, one panel per
    placement, for the deepest member and the one four times shallower.

    Returns the figure and its Axes; raises as :func:`companion.experiments.check_result`.
    """
    import matplotlib.pyplot as plt

    A, PL, depths, hw = _depth_result(result, ("proj", "pred_dilution", "pred_product", "law_l0"))
    fig, axes = plt.subplots(1, len(PL), figsize=(11, 3.3), sharey=True, squeeze=False)
    for ax, (p, placement) in zip(axes[0], enumerate(PL)):
        law = "pred_dilution" if placement == "pre" else "pred_product"
        for d in sorted({max(len(depths) - 3, 0), len(depths) - 1}):
            L, l0 = depths[d], int(A["law_l0"][p, d])
            m = np.arange(l0, L + 1)
            ax.plot(m / L, A["proj"][p, d, m], "o", ms=3, color=f"C{d}", label=f"measured, L = {L}")
            ax.plot(m / L, A[law][p, d, m], "-", color=f"C{d}", label="law")
        ax.set(yscale="log", title=_PLACEMENT_NAMES.get(placement, placement), xlabel="layer / L")
    axes[0, 0].set_ylabel("|projection| on the injected direction")
    axes[0, 0].legend(fontsize=7)
    finish(fig, f"Pre-LN dilution law and Post-LN product rule on trained members ({hw})")
    return fig, axes[0]


def readout_panels(results, panels, ylabels, *, scale: float = 0.5, title: str | None = None):
    """:func:`readout_against_null` for every concept (columns) and readout (rows) of
    ``injection_success`` Results, against the random null at one magnitude.

    Parameters
    ----------
    results : dict
        ``key -> Result`` of ``injection_success``.
    panels : sequence of (key, position)
        One row each; a row repeating the previous row's key gets no titles.
    ylabels : dict
        ``position -> y-label``.
    scale : float, default 0.5
        The magnitude, one of the random group's.
    title : str, optional
        The figure's title.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes, shape (rows, concepts))

    Raises
    ------
    TypeError
        A value of ``results`` that is not an ``injection_success`` Result.
    ValueError
        A panel with an unknown key or position (as ``success_table``), a position
        ``ylabels`` lacks, or a ``scale`` the Result did not run.
    """
    import matplotlib.pyplot as plt

    from companion.experiments import check_result
    from companion.experiments import injection_success as es

    if not isinstance(results, dict) or not panels or any(
            k not in results or p not in ylabels for k, p in panels):
        raise ValueError("panels must be (key of results, position of ylabels) pairs")
    ncol = max(len(check_result(r, "injection_success").scalars["concepts"])
               for r in results.values())
    fig, axes = plt.subplots(len(panels), ncol, figsize=(13, 8 / 3 * len(panels)), sharex=True,
                             squeeze=False)
    for row, (name, pos) in enumerate(panels):
        r, table = results[name], es.success_table(results[name], "random", pos)
        for col, concept in enumerate(r.scalars["concepts"]):
            rows = [x for x in table if x["concept"] == concept and x["scale"] == scale]
            if not rows:
                raise ValueError(f"the random group of {name!r} did not run scale {scale!r}")
            layer, *curves = (np.array([x[k] for x in rows]) for k in (
                "layer", "concept_mean", "null_mean", "null_q", "success"))
            ax = axes[row, col]
            readout_against_null(ax, layer / r.scalars["n_layers"], *curves, color=f"C{col}")
            ax.axhline(0, color="k", lw=0.5)
            ax.set_title(f"{concept} ({name})" if row == 0 or panels[row - 1][0] != name
                         else None, fontsize=9)
            if col == 0:
                ax.set_ylabel(ylabels[pos], fontsize=8)
            if row == len(panels) - 1:
                ax.set_xlabel(r"injection layer $\ell / L$")
    finish(fig, title)
    return fig, axes


def attribution_panels(post, pre, post_directions, pre_directions, names, *,
                       colours=("C0", "C3")):
    """Where an injected direction goes: the LayerNorm product rule on post-norm Attributions
    (:func:`ln_rule_scatter`, left), then one :func:`sublayer_cumulative` panel per pre-norm
    Attribution.

    Parameters
    ----------
    post : sequence of companion.injection.attribution.Attribution
        Post-norm results, pooled in the left panel.
    pre : sequence of companion.injection.attribution.Attribution
        Pre-norm results, one panel each (colours ``C0``, ``C3``, ...).
    post_directions, pre_directions : dict of str to list of int
        The direction sets of each.
    names : pair of str
        Short names of the post-norm and the pre-norm model, for the titles.
    colours : sequence of colours
        One per pre-norm direction set.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of Axes)

    Raises
    ------
    TypeError, ValueError
        As :func:`ln_rule_scatter` and :func:`sublayer_cumulative`.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(pre), figsize=(14, 4.2))
    ln_rule_scatter(axes[0], list(post), post_directions)
    axes[0].set_title(f"{names[0]}: each LayerNorm, every (l, m)", fontsize=10)
    axes[0].legend(fontsize=7)
    for ax, a in zip(axes[1:], pre):
        sublayer_cumulative(ax, a, pre_directions, colors=colours)
        ax.set_title(f"{names[1]}, injected at l = {a.layer}: where the projection goes",
                     fontsize=10)
    axes[1].set_ylabel("fraction of c, injected tokens")
    axes[-1].legend(fontsize=7, loc="lower left")
    finish(fig)
    return fig, axes


def partial_dot_panels(parts):
    """:func:`partial_dot_curves` of several heads in one figure (variance left, SNR right).

    Parameters
    ----------
    parts : dict
        ``label -> output of`` :func:`companion.outliers.attention_logits.partial_dot_statistics`.

    Returns
    -------
    (matplotlib.figure.Figure, numpy.ndarray of two Axes, dict)
        The dict maps each label to its slopes (as :func:`partial_dot_curves` returns them).

    Raises
    ------
    TypeError
        If ``parts`` is not a non-empty dict, or as :func:`partial_dot_curves`.
    """
    import matplotlib.pyplot as plt

    if not isinstance(parts, dict) or not parts:
        raise TypeError("parts must be a non-empty dict label -> partial_dot_statistics output")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    slopes = {label: partial_dot_curves(axes, part, label) for label, part in parts.items()}
    for ax in axes:
        ax.legend(fontsize=7)
    finish(fig)
    return fig, axes, slopes
