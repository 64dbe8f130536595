"""The figures of companion.plots (block partfigs), on stored Results or small arrays."""

import dataclasses

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from companion import experiments as xp  # noqa: E402
from companion import plots  # noqa: E402
from companion.experiments import depth_study as ds  # noqa: E402


@pytest.fixture(scope="module")
def depth():
    return xp.load_result(xp.result_path(ds.DepthStudy(), xp.stored_root()))


@pytest.mark.parametrize("draw, n_axes, ylabel", [
    (plots.depth_success_rates, 3, "success rate (alpha = 1)"),
    (plots.depth_window_edges, 2, "first layer of the window / L"),
    (plots.depth_law_projections, 3, "|projection| on injected direction")])
def test_depth_figures(depth, draw, n_axes, ylabel):
    fig, axes = draw(depth)
    assert len(axes) == n_axes and all(ax.lines for ax in axes)
    assert axes[0].get_ylabel() == ylabel and "torch" in fig._suptitle.get_text()
    plt.close(fig)
    with pytest.raises(TypeError, match="depth_study"):
        draw(dataclasses.replace(depth, name="massive_ablation"))
    with pytest.raises(ValueError, match="lacks"):
        draw(dataclasses.replace(depth, arrays={}))


def test_depth_scale_is_checked(depth):
    fig, _ = plots.depth_window_edges(depth, scale=4.0)
    assert "alpha = 4" in fig._suptitle.get_text()
    plt.close(fig)
    with pytest.raises(ValueError, match="scales"):
        plots.depth_success_rates(depth, scale=2.0)
    with pytest.raises(TypeError, match="scale"):
        plots.depth_success_rates(depth, scale="1")
