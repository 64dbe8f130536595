"""plots.layer_profiles' keywords used by the mathematical chapters (block mathfigs): per-curve
Line2D keywords, ``_`` labels out of the legend, logx and legend_loc."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import plots  # noqa: E402


def test_layer_profiles_keywords_logx_and_legend():
    fig, ax = plt.subplots()
    x = np.array([1.0, 2.0, 4.0, 8.0])
    lines = plots.layer_profiles(ax, {"a": (x ** -0.5, "C3o", {"lw": 1, "ms": 6}),
                                      "_theory": (x ** -0.5, "k--", {"lw": 0.8}),
                                      "b": x, "c": (2 * x, "C0s")},
                                 x, xlabel="depth L", ylabel="norm", title="t", logx=True,
                                 logy=True, legend_fontsize=7, legend_loc="upper left")
    assert len(lines) == 4
    assert (lines[0].get_linewidth(), lines[0].get_markersize()) == (1, 6)
    assert lines[0].get_marker() == "o"
    assert (lines[1].get_linewidth(), lines[1].get_linestyle()) == (0.8, "--")
    assert lines[2].get_markersize() == 3 and lines[3].get_marker() == "s"   # the default ms
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("depth L", "norm", "t")
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    assert legend._loc == 2                                             # "upper left"
    plt.close(fig)


def test_layer_profiles_defaults_unchanged():
    fig, ax = plt.subplots()
    plots.layer_profiles(ax, {"a": [1, 2, 3]})
    assert ax.get_xscale() == ax.get_yscale() == "linear"
    assert ax.get_legend()._loc == 0                                    # "best" (the rc setting)
    plt.close(fig)


def test_layer_profiles_rejects_bad_keywords():
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match="keywords must be a dict"):
        plots.layer_profiles(ax, {"a": ([1, 2, 3], "C0", ["lw", 1])})
    with pytest.raises(TypeError, match="logx"):
        plots.layer_profiles(ax, {"a": [1, 2, 3]}, logx="yes")
    with pytest.raises(ValueError):
        plots.layer_profiles(ax, {"a": ([1, 2, 3], "C0", {"lw": 1})}, x=[0, 1])
    plt.close(fig)
