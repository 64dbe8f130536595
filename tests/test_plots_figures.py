"""The concentration and three-effect figures of companion.plots (block figures), on small arrays."""

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
