"""Tests for companion.injection.engine on stacks (stack_injection_sweep), and the stacks' random
directions and sharpened attention that its experiments use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.injection import engine
from companion.injection import metrics as pt
from companion.injection.directions import random_direction
from companion.stacks.residual import ResidualStack, StackConfig, sharpen_attention
from companion.stacks.tinylm import StackAdapter, TinyLM

# --------------------------------------------------------------------------------------------
# random directions, sharpened attention, injection sweeps on stacks
# --------------------------------------------------------------------------------------------


def test_random_direction():
    v = random_direction(16, seed=3)
    assert v.shape == (16,) and np.isclose(np.linalg.norm(v), 1) and abs(v.sum()) < 1e-12
    np.testing.assert_array_equal(v, random_direction(16, seed=3))
    assert not np.allclose(v, random_direction(16, seed=4))
    w = random_direction(16, seed=3, mean_zero=False)
    assert np.isclose(np.linalg.norm(w), 1) and abs(w.sum()) > 1e-6


@pytest.mark.parametrize(
    "kwargs, err, match",
    [(dict(d=1), ValueError, ">= 2"), (dict(d=4.0), TypeError, "integer"),
     (dict(d=4, seed=-1), ValueError, ">= 0"), (dict(d=4, mean_zero=1), TypeError, "bool")],
)
def test_random_direction_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        random_direction(**kwargs)


def test_sharpen_attention_sets_the_logit_spread():
    d, heads = 64, 4
    stack = ResidualStack(StackConfig(d_model=d, n_layers=1, n_heads=heads, block="attention"))
    sharpen_attention(stack, 8.0, seed=1)
    attn = stack.blocks[0].sublayers[0].f
    x = torch.randn(512, d, generator=torch.Generator().manual_seed(0))
    x = torch.nn.functional.layer_norm(x, (d,))               # unit-variance inputs
    with torch.no_grad():
        q = attn.w_q(x).view(512, heads, d // heads)
        k = attn.w_k(x).view(512, heads, d // heads)
        logits = torch.einsum("ihd,jhd->hij", q, k) / (d // heads) ** 0.5
    assert 6.0 < float(logits.std()) < 10.0
    assert float(stack.blocks[0].sublayers[0].f.w_q.bias.detach().abs().sum()) == 0.0


@pytest.mark.parametrize(
    "stack, std, seed, err, match",
    [
        ("not a stack", 1.0, 0, TypeError, "ResidualStack"),
        (ResidualStack(StackConfig(d_model=8, n_layers=1, n_heads=2, block="mlp")), 1.0, 0, ValueError, "no attention"),
        (ResidualStack(StackConfig(d_model=8, n_layers=1, n_heads=2)), 0.0, 0, ValueError, "> 0"),
        (ResidualStack(StackConfig(d_model=8, n_layers=1, n_heads=2)), 1.0, -2, ValueError, ">= 0"),
    ],
)
def test_sharpen_attention_errors(stack, std, seed, err, match):
    with pytest.raises(err, match=match):
        sharpen_attention(stack, std, seed=seed)


def _x(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_sweep_matches_direct_forward_passes():
    stack = ResidualStack(StackConfig(d_model=16, n_layers=4, n_heads=2, placement="pre"))
    x = _x((2, 5, 16))
    v = random_direction(16, seed=7)
    sw = engine.sweep_stack_injections(stack, x, layers=[1, 3], scale=0.2, direction=v, positions=[2, 4])
    with torch.no_grad():
        base = stack(x)
        rms3 = base.stream[3].pow(2).sum(-1).mean().sqrt()
        inj = stack(x, inject_layer=3, inject_vector=0.2 * rms3 * torch.tensor(v, dtype=torch.float32),
                    inject_positions=[2, 4])
    ref = pt.perturbation_metrics(base.stream, inj.stream, v)
    for k in pt.METRIC_NAMES:
        # the sweep forms the amplitude in float64, the reference in float32; the float32 difference
        # h_inj - h_base moves by up to 5.4e-7 between CPU kernel sets (measured under `default`)
        np.testing.assert_allclose(sw.metrics[k][1], ref[k], rtol=1e-5, atol=2e-6, equal_nan=True)
    dy = (inj.final - base.final).double()
    np.testing.assert_allclose(sw.effects["output_change"][1], (dy.norm(dim=-1) / base.final.double().norm(dim=-1)).numpy(),
                               rtol=1e-5)
    assert sw.coefficient[1] == pytest.approx(0.2 * float(rms3), rel=1e-6)
    assert sw.injected is None and sw.position_mask("injected").tolist() == [False, False, True, False, True]
    # Pre-LN skip-path prediction: the injected amplitude at injected positions, from layer 3 on
    assert np.all(sw.predicted_projection[1, :3] == 0)
    np.testing.assert_allclose(sw.predicted_projection[1, 3:, :, 2], sw.coefficient[1])
    assert np.all(sw.predicted_projection[1, 3:, :, 0] == 0)
    assert "kl" not in sw.effects and sw.base_norm.shape == (5, 2, 5)
    assert sw.layers.tolist() == [1, 3] and sw.scales == 0.2 and sw.placement == "pre"


def test_sweep_absolute_scale_and_effects():
    stack = ResidualStack(StackConfig(d_model=16, n_layers=3, n_heads=2))
    sw = engine.sweep_stack_injections(stack, _x((2, 6, 16)), scale=0.5, relative=False, positions=[1, 2])
    np.testing.assert_allclose(sw.coefficient, 0.5)
    np.testing.assert_allclose(sw.metrics["delta_norm"][np.arange(3), np.arange(3)][:, :, 1], 0.5, rtol=1e-5)
    later = sw.effect("output_change", "later")
    np.testing.assert_allclose(later, sw.effects["output_change"][:, :, 3:].mean(axis=(1, 2)))
    np.testing.assert_array_equal(sw.effect(), sw.effect("output_change"))
    np.testing.assert_allclose(sw.effect("output_projection", "injected"),
                               np.abs(sw.effects["output_projection"][:, :, 1:3].mean(axis=(1, 2))))
    w = sw.window(kind="output_change")
    assert isinstance(w, pt.Window) and w.n_layers == 3
    # per-token metrics averaged over the chosen tokens, NaN left out (cos_delta_v before injection)
    np.testing.assert_allclose(sw.mean("delta_norm", "injected"),
                               sw.metrics["delta_norm"][..., 1:3].mean(axis=(-2, -1)))
    cos = sw.mean("cos_delta_v")
    assert np.isnan(cos[2, 0]) and np.isfinite(cos[0, 0])
    with pytest.raises(ValueError, match="unknown metric"):
        sw.mean("size")
    with pytest.raises(ValueError, match="scale_index"):
        sw.window(scale_index=1)


def test_postln_sweep_prediction_is_first_order_accurate():
    """The proposition's product rule at the first LayerNorm after the injection: the error
    is O(1/sqrt(d)), so at d = 256 it is a few per cent."""
    stack = ResidualStack(StackConfig(d_model=256, n_layers=3, n_heads=4, placement="post", block="mlp"))
    sw = engine.sweep_stack_injections(stack, _x((2, 8, 256)), layers=[1], scale=1e-4)
    p, q = sw.metrics["projection"][0], sw.predicted_projection[0]
    np.testing.assert_allclose(p[1], q[1], rtol=1e-3)
    assert np.median(np.abs(p[2] - q[2]) / np.abs(q[2])) < 0.05
    assert np.all(q[2] < q[1])                                   # LayerNorm factors below 1 here


def test_effect_at_equals_the_shallower_stack():
    """Blocks are seeded per layer, so reading a deep sweep at stream index m is the sweep of
    the depth-m stack read at its output."""
    deep = ResidualStack(StackConfig(d_model=16, n_layers=5, n_heads=2, placement="post"))
    shallow = ResidualStack(StackConfig(d_model=16, n_layers=3, n_heads=2, placement="post"))
    x = _x((2, 4, 16))
    sd = engine.sweep_stack_injections(deep, x, scale=0.1)
    ss = engine.sweep_stack_injections(shallow, x, scale=0.1)
    layers, eff = sd.effect_at(3, "relative_size")
    assert layers.tolist() == [0, 1, 2]
    np.testing.assert_allclose(eff, ss.metrics["relative_size"][:, 3].mean(axis=(1, 2)), rtol=1e-6)
    _, proj = sd.effect_at(3, "relative_projection")
    ref = np.abs((ss.metrics["projection"][:, 3] / ss.base_norm[3]).mean(axis=(1, 2)))
    np.testing.assert_allclose(proj, ref, rtol=1e-6)


def test_sweep_on_tiny_lm_gives_kl():
    lm = TinyLM(StackConfig(d_model=16, n_layers=2, n_heads=2, vocab_size=256, max_len=16))
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    sw = engine.sweep_stack_injections(lm, ids, scale=0.5, positions=[3, 4])
    kl = sw.effects["kl"]
    assert kl.shape == (2, 2, 10) and np.all(kl >= -1e-12)
    np.testing.assert_allclose(kl[:, :, :3], 0, atol=1e-12)     # causal: earlier tokens unchanged
    assert np.all(sw.effect("kl", "injected") > 0)
    tiny = engine.sweep_stack_injections(lm, ids, scale=1e-4, positions=[3, 4])
    assert np.all(tiny.effect("kl", "injected") < 1e-3 * sw.effect("kl", "injected"))


def test_sweep_errors():
    stack = ResidualStack(StackConfig(d_model=8, n_layers=2, n_heads=2))
    x = _x((1, 3, 8))
    cases = [
        (dict(model="stack"), TypeError, "ResidualStack or TinyLM"),
        (dict(scale=0.0), ValueError, "scale must be > 0"),
        (dict(scale="a"), TypeError, "real number"),
        (dict(relative=1), TypeError, "True or False"),
        (dict(layers=[]), ValueError, "non-empty"),
        (dict(layers=[1, 0]), ValueError, "strictly increasing"),
        (dict(layers=[0, 3]), ValueError, r"\[0, 2\]"),
        (dict(layers=[0.5]), TypeError, "integer"),
        (dict(layers=[1, 1]), ValueError, "strictly increasing"),
        (dict(direction=np.ones(3)), ValueError, r"shape \(8,\)"),
        (dict(direction=np.zeros(8)), ValueError, "non-zero"),
        (dict(seed=-1), ValueError, ">= 0"),
    ]
    for kwargs, err, match in cases:
        args = dict(model=stack, inputs=x)
        args.update(kwargs)
        with pytest.raises(err, match=match):
            engine.sweep_stack_injections(**args)
    sw = engine.sweep_stack_injections(stack, x, positions=[2])
    with pytest.raises(ValueError, match="kind must be"):
        sw.effect("cosine")
    with pytest.raises(ValueError, match="needs a language model"):
        sw.effect("kl")
    with pytest.raises(ValueError, match="after the last injected"):
        sw.effect("output_change", "later")
    with pytest.raises(ValueError, match="positions must be"):
        sw.effect("output_change", "some")
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        sw.effect_at(3)
    with pytest.raises(ValueError, match=">= 1"):
        sw.effect_at(0)
    with pytest.raises(ValueError, match="kind must be"):
        sw.effect_at(2, "kl")
    only_late = engine.sweep_stack_injections(stack, x, layers=[2])
    with pytest.raises(ValueError, match="no injection layer"):
        only_late.effect_at(1)


def test_injection_sweep_on_a_stack_is_forward_bit_for_bit():
    """The one engine on a stack: every injected stream equals forward(inject_layer=...)."""
    lm = TinyLM(StackConfig(d_model=16, n_layers=3, n_heads=2, vocab_size=256, placement="post"))
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    v = torch.randn(16, generator=torch.Generator().manual_seed(1))
    sw = engine.sweep_injections(lm, ids, "all", v, scale=[0.5, 2.0], positions=[1, 4])
    assert sw.injected.shape == (4, 2, 4, 2, 6, 16)
    assert sw.injected_mask[:, [1, 4]].all() and sw.injected_mask.sum() == 4
    for layer in range(4):
        for s, c in enumerate((0.5, 2.0)):
            _, out = lm(ids, inject_layer=layer, inject_vector=c * v, inject_positions=[1, 4])
            assert torch.equal(sw.injected[layer, s], out.stream)
    with pytest.raises(ValueError, match="no output effect"):
        sw.effect()
    with pytest.raises(ValueError, match="unknown metric"):
        sw.mean("projection")
    ad = engine._adapt(lm, ids)
    assert isinstance(ad, StackAdapter) and torch.equal(torch.stack(ad.baseline), sw.baseline)
    with pytest.raises(ValueError, match="positions must lie"):
        engine.sweep_injections(lm, ids, [0], v, positions=[6])
    with pytest.raises(TypeError, match="ResidualStack or TinyLM"):
        engine._adapt("a model", ids)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_track_injection_checks_the_model_once(kind, check_model_calls):
    """Validate once: one track_injection call checks its model exactly once."""
    from companion.injection import directions as dr
    from tiny_transformers import minilm_tokenizer, tiny_transformer

    m = tiny_transformer(kind, minilm_tokenizer(), 3)
    p = dr.make_prompts(m, ["The cat sat on the mat", "A dog ran"], ["and then slept", "and barked"])
    calls = check_model_calls
    calls.clear()  # count the sweep's checks only
    engine.track_injection(m, p, [0, 2], random_direction(m.d_model), [0.5, 2.0])
    assert len(calls) == 1
    calls.clear()
    engine.sweep_injections(m, ["The cat sat"], "all", random_direction(m.d_model), scale=[1.0, 2.0])
    assert len(calls) == 1
