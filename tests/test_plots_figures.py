"""The outliers chapter's figures of companion.plots (block figures)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import plots  # noqa: E402
from companion.outliers import channel_statistics as channel_stats

RNG = np.random.default_rng(0)


def _channel_stats(L=3, d=5, nt=4):
    mean, var = RNG.normal(size=(L, d)), RNG.uniform(1, 2, size=(L, d))
    return channel_stats.ChannelStatistics(mean=mean, var=var, min=mean - 3, max=mean + 4,
                                    max_abs=np.abs(mean) + 4,
                                    counts=RNG.integers(0, 10, size=(L, nt, d)),
                                    thresholds=np.arange(1.0, nt + 1), n_tokens=10, n_texts=2,
                                    skip_first=True, model="x")


def test_count_comparison_panels():
    stats = {"a": _channel_stats(), "b": _channel_stats()}
    fig, axes = plots.count_comparison_panels(stats, {"a": 1, "b": 2})
    assert len(axes) == 2 and axes[1].get_title() == "b, layer 2"
    assert axes[0].get_xscale() == "log" and len(axes[0].collections) == 3
    plt.close(fig)
    with pytest.raises(TypeError, match="keys of stats"):
        plots.count_comparison_panels(stats, {"c": 1})
    with pytest.raises(TypeError, match="ChannelStatistics"):
        plots.count_comparison_panels({"a": np.zeros(3)}, {"a": 1})
    with pytest.raises(ValueError, match="layers"):
        plots.count_comparison_panels(stats, {"a": 3})


def test_massive_activation_sink():
    from companion.outliers.massive_activations import FirstTokenProfile

    prof = FirstTokenProfile(values=RNG.uniform(1, 2, (5, 3)), median_abs=np.ones(5), channel=7)
    mean = RNG.uniform(0.2, 0.8, 4)
    sink = {"none": (mean, mean - 0.1, mean + 0.1), "zero": (mean / 2, mean / 3, mean)}
    fig, axes = plots.massive_activation_sink(prof, sink, 2)
    assert len(axes) == 2 and axes[0].get_yscale() == "log"
    assert axes[1].get_ylim() == (0, 1) and "h_2" in fig._suptitle.get_text()
    assert axes[1].lines[0].get_xdata().size == 4
    plt.close(fig)
    with pytest.raises(TypeError, match="FirstTokenProfile"):
        plots.massive_activation_sink(prof.values, sink, 2)
    with pytest.raises(ValueError, match="layer"):
        plots.massive_activation_sink(prof, sink, 5)
    with pytest.raises(TypeError, match="arm"):
        plots.massive_activation_sink(prof, {"none": mean}, 2)


def test_outlier_feature_shares():
    from companion.outliers.outlier_features import OutlierFeatureStatistics

    share = np.zeros((8, 6))
    share[:, 2] = 0.5
    ofs = OutlierFeatureStatistics(share=share, max_abs=share * 20, n_positions=100,
                                   threshold=6.0, n_layers=4, model="m")
    fig, ax = plots.outlier_feature_shares({"m": ofs})
    assert len(ax.lines) == 2 and ax.lines[0].get_label() == "m, feature 2"
    assert ax.get_ylabel() == "share of positions with |x| >= 6"
    plt.close(fig)
    with pytest.raises(TypeError, match="OutlierFeatureStatistics"):
        plots.outlier_feature_shares({"m": share})
    with pytest.raises(ValueError, match="position_share"):
        plots.outlier_feature_shares({"m": ofs}, position_share=2.0)
