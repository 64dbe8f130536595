"""plots.window_effects (block injection) on small synthetic injection_window Results."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from companion import experiments as xp  # noqa: E402
from companion import plots  # noqa: E402


def _result(name: str, L: int, peak: int):
    layers = np.arange(0, L + 1, 2)
    rng = np.random.default_rng(L)
    effect = np.exp(-0.5 * ((layers - peak) / 2.0) ** 2)[:, None, None] * [1.0, 4.0]  # [n, S]
    arrays = {"layers": layers, "rel_scales": np.array([0.125, 0.5]), "abs_scales": np.array([]),
              "typical_norm": np.ones(L + 1)}
    for d in ("sea", "random0"):
        arrays[f"{d}_rel_effect"] = np.moveaxis(effect, 1, 2) * rng.uniform(0.9, 1.1, (1, 1, 3))
        arrays[f"{d}_rel_metrics"] = np.zeros((layers.size, 2, L + 1, 3, 3, 6), np.float32)
        arrays[f"{d}_rel_coefficient"] = np.ones((layers.size, 2))
    scalars = {"directions": ["sea", "random0"], "modes": ["rel"], "abs_reference_layer": 1,
               "n_layers": L, "effect_name": "kl_last", "model_name": name}
    return xp.Result(name="injection_window", config={}, arrays=arrays, scalars=scalars,
                     versions={}, device="cuda:0 (test)", wall_time=0.0, schema="1.1",
                     config_hash=name)


def test_window_effects_one_normalised_curve_per_result():
    results = {"a": _result("model-a", 12, 4), "b": _result("model-b", 24, 16)}
    fig, ax = plt.subplots()
    assert plots.window_effects(ax, results, scale=0.5) is ax
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("model")]
    assert [ln.get_label() for ln in lines] == ["model-a (L = 12)", "model-b (L = 24)"]
    for ln, r in zip(lines, results.values()):
        x, y = ln.get_data()
        np.testing.assert_allclose(x, r.arrays["layers"] / r.scalars["n_layers"])
        assert np.max(y) == pytest.approx(1.0)
        want = np.mean([r.arrays[f"{d}_rel_effect"][:, 1].mean(-1) for d in ("sea", "random0")], 0)
        np.testing.assert_allclose(y, want / want.max())
    assert ax.get_ylabel() == "effect / maximum (alpha = 0.5)"
    plt.close(fig)


def test_window_effects_errors():
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match="Axes"):
        plots.window_effects("ax", {})
    with pytest.raises(TypeError, match="injection_window"):
        plots.window_effects(ax, {"x": "not a Result"})
    with pytest.raises(ValueError, match="was not run"):
        plots.window_effects(ax, {"a": _result("m", 12, 4)}, scale=2.0)
    plt.close(fig)


def _success_result():
    g = np.random.default_rng(0)
    layers, scales, B = np.array([0, 2, 4, 6, 8]), np.array([0.125, 0.5, 2.0]), 8
    base = (scales[None, None, :, None] ** 2) * (1 + layers[None, :, None, None])
    arrays = dict(layers=layers, random_scales=scales, concept_scales=scales,
                  random_effect=base * g.uniform(0.9, 1.1, (3, layers.size, 3, B)),
                  concept_effect=base * g.uniform(0.9, 1.1, (2, layers.size, 3, B)))
    arrays["random_effect"][:, 0] = 0.0                       # a layer without effect: left out
    scalars = dict(groups=["concept", "random"], concepts=["sea", "fire"], n_layers=8,
                   effect_name="kl_last")
    return xp.Result(name="injection_success", config={}, arrays=arrays, scalars=scalars,
                     versions={}, device="cpu", wall_time=0.0, schema="1.1", config_hash="0")


def test_effect_bands_random_band_and_concept_mean_per_magnitude():
    r = _success_result()
    fig, ax = plt.subplots()
    assert plots.effect_bands(ax, r) is ax
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert [ln.get_label() for ln in dotted] == [
        fr"2 concepts (mean), $\alpha$ = {a:g}" for a in (0.125, 0.5, 2)]
    for ln, s in zip(dotted, range(3)):
        x, y = ln.get_data()
        np.testing.assert_allclose(x, [0.25, 0.5, 0.75, 1.0])         # layer 0 dropped
        np.testing.assert_allclose(y, r.arrays["concept_effect"][:, 1:, s].mean(axis=(0, 2)))
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "kl_last"
    assert any(t.get_label() == r"3 random, $\alpha$ = 0.5" for t in ax.get_children())
    with pytest.raises(TypeError, match="injection_success"):
        plots.effect_bands(ax, _result("m", 12, 4))
    plt.close(fig)
