"""companion.plots: each helper draws what it says, returns matplotlib objects, checks inputs."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from companion import plots  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_tail_curves_masks_zeros_and_clips_bounds(ax):
    t = np.linspace(0, 5, 11)
    exact = np.exp(-t)
    exact[-2:] = 0.0
    lines = plots.tail_curves(ax, t, {"exact": exact}, {"bound": (3 * np.exp(-t / 2), "k:")})
    assert len(lines) == 2 and all(isinstance(line, Line2D) for line in lines)
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "log"
    y_exact, y_bound = (line.get_ydata() for line in lines)
    assert np.isnan(y_exact[-2:]).all() and np.isfinite(y_exact[:-2]).all()
    assert y_bound.max() == 1.0 and len(y_bound) == t.size
    assert lines[1].get_linestyle() == ":"
    assert [line.get_label() for line in lines] == ["exact", "bound"]


def test_tail_curves_rejects_bad_input(ax):
    t = np.linspace(0, 1, 5)
    with pytest.raises(ValueError, match="at least one"):
        plots.tail_curves(ax, t)
    with pytest.raises(ValueError, match="5 entries"):
        plots.tail_curves(ax, t, {"a": np.ones(4)})
    with pytest.raises(TypeError, match="dict"):
        plots.tail_curves(ax, t, [np.ones(5)])
    with pytest.raises(TypeError, match="Axes"):
        plots.tail_curves(None, t, {"a": np.ones(5)})
    with pytest.raises(TypeError, match="format"):
        plots.tail_curves(ax, t, {"a": (np.ones(5), 3)})
    with pytest.raises(ValueError, match="one-dimensional"):
        plots.tail_curves(ax, np.ones((2, 2)), {"a": np.ones(4)})


def test_band_drops_non_finite_x(ax):
    x = np.array([0.0, 0.25, 0.5, np.nan])
    line, fill = plots.band(ax, x, [0.1, 0.2, 0.3, 0.4], [0, 0.1, 0.2, 0.3], [0.2, 0.3, 0.4, 0.5],
                            label="L = 4")
    assert isinstance(line, Line2D) and isinstance(fill, PolyCollection)
    assert len(line.get_xdata()) == 3 and len(ax.get_lines()) == 1
    assert line.get_label() == "L = 4"
    with pytest.raises(ValueError, match="4 entries"):
        plots.band(ax, x, [0.1, 0.2, 0.3], [0, 0, 0, 0], [1, 1, 1, 1])
    with pytest.raises(ValueError, match="alpha"):
        plots.band(ax, x, x, x, x, alpha=2.0)


def test_interval_errorbars(ax):
    x, y = np.array([4, 8, 16]), np.array([0.2, 0.3, 0.4])
    cont = plots.interval_errorbars(ax, x, y, y - 0.1, y + 0.05, label="Pre-LN")
    assert isinstance(cont, ErrorbarContainer)
    data_line = cont.lines[0]
    assert len(data_line.get_xdata()) == 3 and cont.get_label() == "Pre-LN"
    with pytest.raises(ValueError, match="contain"):
        plots.interval_errorbars(ax, x, y, y + 0.1, y + 0.2)
    with pytest.raises(TypeError, match="real numbers"):
        plots.interval_errorbars(ax, x, ["a", "b", "c"], y, y)


def test_depth_axis(ax):
    assert plots.depth_axis(ax, [4, 8, 16, 32, 64]) is ax
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "depth L"
    assert list(ax.get_xticks()) == [4, 8, 16, 32, 64]
    for bad in ([0, 4], [4.5], []):
        with pytest.raises(ValueError, match="positive integers"):
            plots.depth_axis(ax, bad)


def test_depth_colours():
    cols = plots.depth_colours(5)
    assert len(cols) == 5 and all(len(c) == 4 for c in cols) and cols[0] != cols[-1]
    assert len(plots.depth_colours(1)) == 1
    with pytest.raises(ValueError):
        plots.depth_colours(0)
    with pytest.raises(TypeError):
        plots.depth_colours(2.0)


def test_finish():
    fig, _ = plt.subplots(1, 2)
    try:
        assert plots.finish(fig, "title") is fig
        assert isinstance(fig, Figure) and fig._suptitle.get_text() == "title"
        assert fig._suptitle.get_fontsize() == 9
        with pytest.raises(TypeError, match="Figure"):
            plots.finish(None)
        with pytest.raises(TypeError, match="title"):
            plots.finish(fig, 3)
    finally:
        plt.close(fig)


def test_importing_plots_does_not_load_matplotlib_pyplot():
    import subprocess
    import sys

    code = "import sys, companion.plots; print('matplotlib.pyplot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_counts_draws_each_curve_in_one_colour(ax):
    n = np.array([10.0, 100.0, 1000.0, 10000.0])
    sim = np.array([0.0, 3.0, 40.0, 390.0])
    lines = plots.counts(ax, n, sim, 0.04 * n, upper=0.05 * n, lower=0.03 * n - 1,
                         label="mu = 2", loglog=True)
    assert len(lines) == 4 and len(ax.get_lines()) == 4
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert np.isnan(lines[0].get_ydata()[0]) and len(lines[0].get_ydata()) == 4
    assert len(lines[3].get_xdata()) == 3          # the lower bound only where positive
    assert len({line.get_color() for line in lines}) == 1
    assert [line.get_label() for line in lines][0] == "mu = 2"
    assert [line.get_linestyle() for line in lines[1:]] == ["-", "--", ":"]


def test_counts_rejects_bad_input(ax):
    n = np.arange(1.0, 4.0)
    with pytest.raises(ValueError, match="at least one"):
        plots.counts(ax, n)
    with pytest.raises(ValueError, match="3 entries"):
        plots.counts(ax, n, np.ones(2))
    with pytest.raises(TypeError, match="loglog"):
        plots.counts(ax, n, np.ones(3), loglog="yes")


def test_table_aligns_header_and_rows():
    text = plots.table(["u/sigma", "bound"], zip([0.5, 1.0], [0.8825, 0.6065]), ["8.3g", "14.4g"])
    assert text.splitlines() == [" u/sigma          bound",
                                 "     0.5         0.8825",
                                 "       1         0.6065"]
    assert plots.table(["a"], [], ["d"]) == "a"
    assert plots.table(["name", "v"], [("x", 1)], ["<6", ">3"], sep="|") == "  name|  v\nx     |  1"


def test_table_renders_as_a_markdown_table():
    t = plots.table(["$x$", "name"], [(2.5, "a|b"), (10, "c")], ["6.3g", "<5"])
    assert isinstance(t, plots.Table) and repr(t) == str(t) == "   $x$  name\n   2.5 a|b  \n    10 c    "
    assert t._repr_markdown_().splitlines() == [
        "| $x$ | name |", "|---:|:---|", r"| 2.5 | a\|b |", "| 10 | c |"]
    assert plots.table(["a"], [], ["d"])._repr_markdown_() == "| a |\n|---:|"


def test_table_rejects_bad_input():
    with pytest.raises(ValueError, match="2 columns but 1"):
        plots.table(["a", "b"], [], ["8g"])
    with pytest.raises(ValueError, match="row 0 has 1 entries"):
        plots.table(["a", "b"], [(1,)], ["8g", "8g"])
    with pytest.raises(TypeError, match="columns"):
        plots.table("ab", [], ["8g", "8g"])
    with pytest.raises(TypeError, match="fmts"):
        plots.table(["a"], [], [8])


# --- engine ---
