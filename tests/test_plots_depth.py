"""The depth_study figures of companion.plots (block cleanup) on a small synthetic Result."""

import dataclasses

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import experiments as xp  # noqa: E402
from companion import plots  # noqa: E402


def _result():
    PL, depths, steps = ["pre", "post"], [2, 4], 30
    rng = np.random.default_rng(0)
    P, D, Lmax = len(PL), len(depths), max(depths)
    arrays = {
        "train_loss": rng.uniform(1, 3, (P, D, steps)),
        "sq_norm": rng.uniform(1, 5, (P, D, Lmax + 1)),
        "max_over_rms": rng.uniform(2, 6, (P, D, Lmax + 1)),
        "n_mean_dominated": rng.integers(0, 4, (P, D, Lmax + 1)).astype(float),
        "count_observed": rng.uniform(1, 9, (P, D, Lmax + 1, 2)),
        "count_expected": rng.uniform(1, 9, (P, D, Lmax + 1, 2)),
    }
    return xp.Result(name="depth_study", config={"d_model": 8}, arrays=arrays,
                     scalars={"placements": PL, "depths": depths}, versions={"torch": "x"},
                     device="cpu", wall_time=1.0, schema="1.1", config_hash="0" * 16)


@pytest.mark.parametrize("draw, n_axes", [(lambda r: plots.depth_training_curves(r, 2.0), 2),
                                          (plots.depth_stream_growth, 2),
                                          (plots.depth_outlier_statistics, 3)])
def test_depth_figures(draw, n_axes):
    r = _result()
    fig, axes = draw(r)
    assert len(axes) == n_axes and all(ax.lines for ax in axes)
    assert "cpu, torch x" in fig._suptitle.get_text()
    plt.close(fig)
    with pytest.raises(TypeError, match="depth_study"):
        draw(dataclasses.replace(r, name="massive_ablation"))
    with pytest.raises(ValueError, match="lacks"):
        draw(dataclasses.replace(r, arrays={}))


def test_depth_training_curves_checks_its_arguments():
    with pytest.raises(TypeError, match="unigram"):
        plots.depth_training_curves(_result(), "2.0")
    with pytest.raises(ValueError, match="window"):
        plots.depth_training_curves(_result(), 2.0, window=0)
