"""Tests of companion.injection.attribution: the exact pre-norm identity, LayerNorm's first-order response
against autograd, agreement with a direct injection, batching, intervals and bad inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tiny_transformers import minilm_tokenizer, tiny_transformer

from companion.injection import attribution as at
from companion.injection import directions as dr
from companion.transformers import stream

FIRST = ["The sea was calm and grey that morning.", "A small dog ran across the road.",
         "We read the letter twice before dinner."]
SECOND = ["Nobody spoke on the boat.", "Its owner shouted after it.", "Then we went to sleep."]


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


def _tiny(kind, tokenizer):
    return tiny_transformer(kind, tokenizer, n_layers=3, dtype=torch.float64)


@pytest.fixture(scope="module")
def llama(tokenizer):
    return _tiny("llama", tokenizer)


@pytest.fixture(scope="module")
def bert(tokenizer):
    return _tiny("bert", tokenizer)


def _dirs(d, n=3, seed=1):
    return dr.random_unit_vectors(d, n, np.random.default_rng(seed))


# --------------------------------------------------------------------------- LayerNorm response
def test_layernorm_response_matches_autograd():
    g = np.random.default_rng(0)
    d = 16
    x, delta = g.normal(size=(5, d)) * 3 + 1, g.normal(size=(5, d))
    v, gamma, beta = g.normal(size=d), g.uniform(0.2, 2.0, d), g.normal(size=d)
    eps = 1e-3
    _, resp = at.layernorm_response(x, delta, v, gamma, eps)

    def ln(t):
        return torch.nn.functional.layer_norm(t, (d,), torch.tensor(gamma), torch.tensor(beta), eps)

    _, jvp = torch.func.jvp(ln, (torch.tensor(x),), (torch.tensor(delta),))
    want = (jvp.numpy() @ (v / np.linalg.norm(v)))
    np.testing.assert_allclose(resp, want, rtol=1e-10, atol=1e-12)


def test_layernorm_factor_is_the_parallel_leading_term():
    g = np.random.default_rng(1)
    d = 32
    x, v, gamma = g.normal(size=(4, d)), g.normal(size=d), g.uniform(0.5, 1.5, d)
    vh = v / np.linalg.norm(v)
    f, resp = at.layernorm_response(x, vh, v, gamma)
    sigma = x.std(-1)
    z = (x - x.mean(-1, keepdims=True)) / sigma[:, None]
    # response to delta = v_hat: the factor minus the std-change term
    np.testing.assert_allclose(resp, f - ((z @ (gamma * vh)) * (z @ vh)) / (d * sigma), rtol=1e-12)
    # with gamma = 1 and v orthogonal to 1 the factor is 1/sigma (postln_contraction_factors)
    w = vh - vh.mean()
    f1, _ = at.layernorm_response(x, w, w)
    np.testing.assert_allclose(f1, 1 / sigma, rtol=1e-12)


def test_layernorm_response_bad_inputs():
    with pytest.raises(ValueError, match="non-zero"):
        at.layernorm_response(np.ones((2, 3)) * [1, 2, 3], np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="broadcast"):
        at.layernorm_response(np.ones((2, 3)), np.ones((3, 3)), np.ones(3))
    with pytest.raises(ValueError, match="d >= 2"):
        at.layernorm_response(np.ones((2, 1)), np.ones(1), np.ones(1))
    with pytest.raises(ValueError, match="eps"):
        at.layernorm_response([1.0, 2.0], [1.0, 0.0], [1.0, 0.0], eps=-1.0)
    with pytest.raises(ValueError, match="constant"):
        at.layernorm_response([1.0, 1.0], [1.0, 0.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="weight"):
        at.layernorm_response([1.0, 2.0], [1.0, 0.0], [1.0, 0.0], weight=[1.0])
    with pytest.raises(TypeError):
        at.layernorm_response("x", [1.0, 0.0], [1.0, 0.0])


# --------------------------------------------------------------------------- the attribution
@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_identity_and_direct_injection(kind, request):
    m = request.getfixturevalue(kind)
    p = dr.make_prompts(m, FIRST, SECOND)
    V = _dirs(m.d_model)
    a = at.attribute_injection(m, p, 1, V, scale=0.3)
    assert a.stages == at.STAGES[m.placement]
    assert a.identity_error < 1e-10
    # the per-block change is the sum of the stage writes, exactly
    np.testing.assert_allclose(np.diff(a.stream, axis=-1), a.writes.sum(-1), atol=1e-12)
    # p_l = c at the injected tokens, 0 elsewhere
    np.testing.assert_allclose(a.stream[:, :, 0, 0], 0.3, rtol=1e-12)
    np.testing.assert_allclose(a.stream[:, :, 1:, 0], 0.0, atol=1e-15)
    # the stream agrees with a direct injection through the full model
    for j in range(len(V)):
        h0 = stream.residual_stream(m, p.encoding)
        h1 = stream.inject(m, p.encoding, 1, V[j], scale=0.3, positions=p.injected)
        pr = ((h1 - h0) @ torch.tensor(V[j])).numpy()  # [L+1, B, T]
        G = p.groups.numpy().astype(float)
        want = np.einsum("lbt,gbt->bgl", pr, G) / G.sum(-1).T[..., None]
        np.testing.assert_allclose(a.stream[j], want[..., 1:], atol=1e-10)
    # telescoping: start + sum of the totals = end
    tot = sum(a.totals("later").values())
    np.testing.assert_allclose(a.stream[:, :, 1, -1] / a.scale, a.stream[:, :, 1, 0] / 0.3 + tot,
                               atol=1e-12)


def test_batching_does_not_change_the_result(bert):
    p = dr.make_prompts(bert, FIRST, SECOND)
    V = _dirs(bert.d_model, 4)
    a = at.attribute_injection(bert, p, 0, V, alpha=0.1, batch_rows=6)
    b = at.attribute_injection(bert, p, 0, V, alpha=0.1)
    for key in ("stream", "writes", "ln_input", "ln_rule", "ln_jacobian"):
        np.testing.assert_allclose(getattr(a, key), getattr(b, key), atol=1e-10)
    assert a.alpha == 0.1 and np.isclose(a.scale, 0.1 * a.typical_norm)


def test_postnorm_first_order_prediction_becomes_exact(bert):
    p = dr.make_prompts(bert, FIRST, SECOND)
    V = _dirs(bert.d_model, 2)
    errs = []
    for c in (1e-2, 1e-3):
        r = at.attribute_injection(bert, p, 1, V, scale=c).ln_ratios("injected")
        errs.append(np.abs(r["jacobian"] - r["measured"]).max())
        assert r["rule"].shape == (bert.n_layers - 1, 2)
    assert errs[1] < errs[0] / 5 and errs[1] < 1e-3  # the error is second order in c


def test_accessors(llama, bert):
    p = dr.make_prompts(llama, FIRST, SECOND)
    a = at.attribute_injection(llama, p, 0, _dirs(llama.d_model, 2), scale=0.5)
    assert set(a.totals()) == {"attn", "mlp"} and a.totals()["mlp"].shape == (2, 3)
    assert a.block_ratios("last", directions=[1]).shape == (llama.n_layers,)
    assert a.blocks.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="post-norm"):
        a.ln_ratios()
    with pytest.raises(ValueError, match="group"):
        a.totals("middle")
    with pytest.raises(ValueError, match="directions"):
        a.block_ratios(directions=[5])


def test_bad_inputs(llama, bert):
    p = dr.make_prompts(llama, FIRST, SECOND)
    V = _dirs(llama.d_model, 2)
    with pytest.raises(TypeError, match="LoadedModel"):
        at.attribute_injection("llama", p, 0, V, scale=1.0)
    with pytest.raises(TypeError, match="InjectionPrompts"):
        at.attribute_injection(llama, FIRST, 0, V, scale=1.0)
    with pytest.raises(ValueError, match="passes no block"):
        at.attribute_injection(llama, p, 3, V, scale=1.0)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        at.attribute_injection(llama, p, 4, V, scale=1.0)
    with pytest.raises(TypeError):
        at.attribute_injection(llama, p, 1.5, V, scale=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        at.attribute_injection(llama, p, 0, V)
    with pytest.raises(ValueError, match="exactly one"):
        at.attribute_injection(llama, p, 0, V, scale=1.0, alpha=0.1)
    with pytest.raises(ValueError, match="non-zero"):
        at.attribute_injection(llama, p, 0, V, scale=0.0)
    with pytest.raises(ValueError, match="zero vectors"):
        at.attribute_injection(llama, p, 0, np.zeros((1, llama.d_model)), scale=1.0)
    with pytest.raises(ValueError, match="shape"):
        at.attribute_injection(llama, p, 0, np.ones((2, 5)), scale=1.0)
    with pytest.raises(ValueError, match="per-layer"):
        at.attribute_injection(llama, p, 0, np.ones((2, 2, llama.d_model)), scale=1.0)
    with pytest.raises(ValueError):
        at.attribute_injection(llama, p, 0, np.full((1, llama.d_model), np.nan), scale=1.0)
    with pytest.raises(ValueError, match="batch_rows"):
        at.attribute_injection(llama, p, 0, V, scale=1.0, batch_rows=3)
    cut = dataclasses.replace(p, injected=p.injected[:, :-1])
    with pytest.raises(ValueError, match="make_prompts"):
        at.attribute_injection(bert, cut, 0, V, scale=1.0)  # prompts of another tokenisation
    # per-layer directions use row l
    per_layer = np.repeat(V[:, None], llama.n_layers + 1, axis=1)
    a = at.attribute_injection(llama, p, 2, per_layer, scale=1.0)
    np.testing.assert_allclose(a.directions, V, atol=1e-15)


# --------------------------------------------------------------------------- intervals


# --------------------------------------------------------------------------- the experiment
@pytest.mark.slow
def test_experiment_round_trip(tmp_path):
    from companion import experiments
    from companion.experiments import injection_attribution as ia

    cfg = ia.InjectionAttributionExperiment(layers=(4,), concepts=("joy",), n_random=1,
                                            n_prompts=2)
    r = experiments.run(cfg, device="cpu")
    full = ia.attributions_of(r)[4]
    c_half, half = ia.half_streams_of(r)[4]
    assert full.stream.shape == half.shape == (2, 2, 3, 3) and np.isclose(c_half, full.scale / 2)
    assert full.ln_rule.shape == (2, 2, 3, 2, 2)
    assert r.scalars["direction_names"] == ["joy", "random0"]
    assert r.scalars["identity_error"] < 1e-5
    # linear regime: halving c halves the projections (to a few per cent)
    np.testing.assert_allclose(half[:, :, 0] / c_half, full.stream[:, :, 0] / full.scale,
                               atol=0.05)
    with pytest.raises(TypeError, match="injection_attribution"):
        ia.attributions_of("result")
    no_half = experiments.run(dataclasses.replace(cfg, half_check=False), device="cpu")
    with pytest.raises(ValueError, match="half_check"):
        ia.half_streams_of(no_half)
