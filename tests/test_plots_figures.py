"""The concentration and three-effect figures of companion.plots (block figures)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import plots  # noqa: E402
from companion.outliers import channel_statistics as channel_stats

RNG = np.random.default_rng(0)


def _maxima_args():
    N = np.array([1, 2, 10, 100, 1000])
    exact = np.sqrt(2 * np.log(2 * N)) * 0.9
    return [N, exact, exact * 1.2, exact * 1.1, exact * 0.5,
            (np.array([10, 100]), RNG.normal(2.0, 0.1, (2, 50)))]


def _post_rows(L=5):
    return {(b, g): tuple(RNG.uniform(0.1, 1, (L + 1, 2, 3)) for _ in range(3)) + ("extra",)
            for b in ("mlp", "attention") for g in (0.5, 2.0)}


def _pre_rows(n=4):
    return {(b, g): (RNG.uniform(size=n), RNG.uniform(size=n), RNG.uniform(size=n), 0.3)
            for b in ("mlp", "attention", "both") for g in (0.5, 1.0, 2.0)}


def test_gaussian_maxima():
    fig, axes = plots.gaussian_maxima(*_maxima_args())
    assert isinstance(fig, plt.Figure) and len(axes) == 2
    assert axes[0].get_xlabel() == "N" and "ratio" in axes[1].get_ylabel()
    assert len(axes[1].lines) == 4 and axes[1].lines[0].get_xdata().size == 4  # N = 1 left out
    assert "simulated (50 streams)" in [t.get_text() for t in axes[0].get_legend().get_texts()]
    plt.close(fig)
    args = _maxima_args()
    with pytest.raises(ValueError, match="upper must have 5"):
        plots.gaussian_maxima(args[0], args[1], args[2][:3], *args[3:])
    with pytest.raises(ValueError, match="N must be"):
        plots.gaussian_maxima(np.zeros(5), *args[1:])
    with pytest.raises(TypeError, match="simulated"):
        plots.gaussian_maxima(*args[:5], [1, 2, 3])
    with pytest.raises(ValueError, match=r"shape \(2, trials"):
        plots.gaussian_maxima(*args[:5], (np.array([10, 100]), np.ones((3, 50))))
    with pytest.raises(TypeError, match="real"):
        plots.gaussian_maxima(["a"] * 5, *args[1:])


def test_largest_logits():
    n = np.array([16, 256, 4096])
    samples = {1: RNG.normal(size=(3, 20)), 64: RNG.normal(size=(3, 20))}
    grid = np.geomspace(10, 5000, 9)
    fig, ax = plots.largest_logits(n, samples, grid, np.sqrt(2 * np.log(grid)))
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "context length n"
    assert len(ax.containers) == 2 and len(ax.get_legend().get_texts()) == 4
    plt.close(fig)
    with pytest.raises(ValueError, match=r"shape \(3, trials"):
        plots.largest_logits(n, {1: RNG.normal(size=(2, 20))}, grid, grid)
    with pytest.raises(TypeError, match="non-empty dict"):
        plots.largest_logits(n, [RNG.normal(size=(3, 20))], grid, grid)
    with pytest.raises(ValueError, match="gaussian must have 9"):
        plots.largest_logits(n, samples, grid, grid[:4])


def test_scale_spread():
    spread = {64: (np.full(6, 0.09), np.full(6, 0.1)), 256: (np.full(6, 0.04), np.full(6, 0.1))}
    fig, ax = plots.scale_spread(spread)
    assert len(ax.lines) == 6 and ax.get_ylim() == (0, 0.12)
    assert ax.lines[2].get_ydata()[0] == pytest.approx(1 / np.sqrt(128))
    plt.close(fig)
    with pytest.raises(TypeError, match="pair"):
        plots.scale_spread({64: np.zeros(6)})
    with pytest.raises(ValueError, match="between must have 6"):
        plots.scale_spread({64: (np.zeros(6), np.zeros(5))})
    with pytest.raises(TypeError, match="width d"):
        plots.scale_spread({"64": (np.zeros(6), np.zeros(6))})


def test_postln_projection():
    fig, axes = plots.postln_projection(_post_rows(), 2, 16)
    assert len(axes) == 2 and [ax.get_title() for ax in axes] == ["Post-LN, mlp",
                                                                  "Post-LN, attention"]
    assert len(axes[0].lines) == 6 and axes[0].lines[0].get_xdata().tolist() == [2, 3, 4, 5]
    assert "d = 16" in fig._suptitle.get_text()
    plt.close(fig)
    rows = _post_rows()
    with pytest.raises(ValueError, match="every"):
        plots.postln_projection({k: v for k, v in list(rows.items())[:3]}, 2, 16)
    with pytest.raises(ValueError, match="share a shape"):
        plots.postln_projection(rows, 9, 16)
    with pytest.raises(TypeError, match="dict"):
        plots.postln_projection({"mlp": rows[("mlp", 0.5)]}, 2, 16)
    with pytest.raises(TypeError, match="ell"):
        plots.postln_projection(rows, 2.5, 16)


def test_preln_ratios():
    fig, axes = plots.preln_ratios(_pre_rows(), 3)
    assert len(axes) == 3 and axes[0].get_ylabel() == "ratio to the injection layer"
    assert len(axes[2].lines) == 9 and axes[2].lines[0].get_xdata().tolist() == [3, 4, 5, 6]
    plt.close(fig)
    rows = _pre_rows()
    rows[("mlp", 0.5)] = rows[("mlp", 0.5)][:3]
    with pytest.raises(TypeError, match="pi, law, rho, c"):
        plots.preln_ratios(rows, 3)
    with pytest.raises(ValueError, match="at most 2 gains"):
        plots.preln_ratios(_pre_rows(), 3, colours=("C0", "C1"))


def test_subexponential_tails():
    t = np.linspace(0, 5, 11)
    windows = {"a": (np.linspace(0.1, 0.4, 4), [1.0, 2.0, 3.0, 9.0], 1.0, "C1"),
               "b": (np.linspace(0.1, 0.9, 4), [1.0, 1.5, 2.0, 5.0], 0.5, "C0")}
    fig, axes = plots.subexponential_tails(t, {"exact": np.exp(-t)}, {"bound": 2 * np.exp(-t)},
                                           windows)
    assert len(axes) == 2 and axes[1].get_xlabel() == "window $1/b$"
    assert len(axes[0].lines) == 2 and len(axes[1].lines) == 4
    plt.close(fig)
    with pytest.raises(TypeError, match="colour"):
        plots.subexponential_tails(t, {"e": np.exp(-t)}, None, {"a": windows["a"][:3]})
    with pytest.raises(ValueError, match="nu2 must have 4"):
        plots.subexponential_tails(t, {"e": np.exp(-t)}, None,
                                   {"a": (np.ones(4), np.ones(3), 1.0, "C0")})
    with pytest.raises(ValueError, match="at least one curve"):
        plots.subexponential_tails(t, None, None, windows)


def test_norm_fluctuations():
    x, t = np.linspace(-3, 3, 31), np.linspace(0, 4, 9)
    fig, axes = plots.norm_fluctuations(x, {4: np.exp(-x**2), 64: np.exp(-x**2)}, np.exp(-x**2),
                                        (64, RNG.normal(size=200)), t, {"exact": np.exp(-t)},
                                        {"bound": (2 * np.exp(-t), "k--")})
    assert len(axes[0].lines) == 3 and len(axes[0].patches) == 60
    assert axes[0].get_ylabel() == "density" and len(axes[1].lines) == 2
    plt.close(fig)
    with pytest.raises(TypeError, match="simulated"):
        plots.norm_fluctuations(x, {4: x}, x, RNG.normal(size=20), t, {"e": t}, None)
    with pytest.raises(ValueError, match=r"densities\[4\] must have 31"):
        plots.norm_fluctuations(x, {4: x[:5]}, x, (4, x), t, {"e": t}, None)
    with pytest.raises(TypeError, match="width d"):
        plots.norm_fluctuations(x, {4.5: x}, x, (4, x), t, {"e": t}, None)


def test_norm_and_logit_tails():
    r, t = np.linspace(0.01, 1, 10), np.linspace(0, 6, 13)
    fig, axes = plots.norm_and_logit_tails(r, {64: (np.exp(-r), 2 * np.exp(-r))}, t,
                                           {1: np.exp(-t), 16: np.exp(-t**2)}, np.exp(-t**2 / 2))
    assert len(axes[0].lines) == 2 and len(axes[1].lines) == 3
    assert matplotlib.colors.same_color(axes[1].lines[1].get_color(), "C1")
    assert axes[0].get_yscale() == "log"
    plt.close(fig)
    with pytest.raises(TypeError, match="exact, bernstein"):
        plots.norm_and_logit_tails(r, {64: np.exp(-r)}, t, {1: t}, t)
    with pytest.raises(TypeError, match="logit_tails"):
        plots.norm_and_logit_tails(r, {64: (r, r)}, t, {}, t)


def test_bernoulli_sum_tails():
    t = np.arange(1.0, 11.0)
    bounds = {"Hoeffding": (np.exp(-t / 5), "C0-")}
    fig, axes = plots.bernoulli_sum_tails(t, {0.5: (np.exp(-t), bounds),
                                              0.01: (np.exp(-2 * t), bounds)}, 100)
    assert len(axes) == 2 and axes[1].get_title() == "sum of 100 Bernoulli(0.01)"
    assert axes[0].get_ylabel() == r"$P(|S-np|\geq t)$" and axes[0].lines[1].get_linewidth() == 1.5
    plt.close(fig)
    with pytest.raises(TypeError, match="panels"):
        plots.bernoulli_sum_tails(t, {0.5: np.exp(-t)}, 100)
    with pytest.raises(ValueError, match="n must be"):
        plots.bernoulli_sum_tails(t, {0.5: (np.exp(-t), bounds)}, 0)


def test_random_window_edges():
    from companion.experiments import framework_random as xr

    cfg = xr.RandomWindowsConfig(gains=(0.5, 1.0))
    shape = (len(cfg.placements), len(cfg.blocks), len(cfg.gains), len(cfg.depths))
    arrays = {"window_relative_projection": RNG.uniform(size=shape + (4,))}
    pred = RNG.uniform(size=shape)
    fig, axes = plots.random_window_edges(arrays, pred, cfg)
    assert len(axes) == len(cfg.placements)
    assert axes[0].get_title() == "pre-LN: window = [first, L-1]"
    assert len(axes[0].lines) == 5 and "MLP g=0.5" in axes[0].lines[0].get_label()
    plt.close(fig)
    with pytest.raises(TypeError, match="RandomWindowsConfig"):
        plots.random_window_edges(arrays, pred, {"gains": (0.5,)})
    with pytest.raises(ValueError, match="block must be"):
        plots.random_window_edges(arrays, pred, cfg, block="conv")
    with pytest.raises(ValueError, match="shape"):
        plots.random_window_edges(arrays, pred[:1], cfg)
    with pytest.raises(TypeError, match="window_relative_projection"):
        plots.random_window_edges({}, pred, cfg)


def test_trained_kl_profiles():
    from companion.experiments import framework_trained as xt

    cfg = xt.TrainedWindowsConfig()
    shape = (len(cfg.placements), len(cfg.widths), len(cfg.depths), max(cfg.depths))
    trained = {"effect_kl_later": RNG.uniform(0.1, 1, shape)}
    init = {"effect_kl_later": RNG.uniform(0.1, 1, shape)}
    fig, axes = plots.trained_kl_profiles(trained, init, cfg)
    assert len(axes) == len(cfg.placements) and axes[0].get_ylabel() == "KL / max over layers"
    assert len(axes[1].lines) == 2 * len(cfg.depths) + 1
    plt.close(fig)
    with pytest.raises(TypeError, match="TrainedWindowsConfig"):
        plots.trained_kl_profiles(trained, init, None)
    with pytest.raises(ValueError, match="shape"):
        plots.trained_kl_profiles(trained, {"effect_kl_later": np.ones((1, 1, 1, 2))}, cfg)


def _channel_stats(L=3, d=5, nt=4):
    from companion.transformers import stream

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
