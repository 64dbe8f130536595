"""The concentration and three-effect figures of companion.plots (block figures)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import plots  # noqa: E402

RNG = np.random.default_rng(0)


def _maxima_args():
    N = np.array([1, 2, 10, 100, 1000])
    exact = np.sqrt(2 * np.log(2 * N)) * 0.9
    return [N, exact, exact * 1.2, exact * 1.1, exact * 0.5,
            (np.array([10, 100]), np.array([1.5, 2.3]), np.array([0.01, 0.02]))]


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
    plt.close(fig)
    args = _maxima_args()
    with pytest.raises(ValueError, match="upper must have 5"):
        plots.gaussian_maxima(args[0], args[1], args[2][:3], *args[3:])
    with pytest.raises(ValueError, match="N must be"):
        plots.gaussian_maxima(np.zeros(5), *args[1:])
    with pytest.raises(TypeError, match="simulated"):
        plots.gaussian_maxima(*args[:5], [1, 2, 3])
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
