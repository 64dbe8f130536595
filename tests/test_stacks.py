"""Tests of companion.stacks.residual: configuration, shapes, determinism, the update rules against a
hand-written reference, injection, the tiny language model, the measurements, and every error."""

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
import torch

from companion.stacks.residual import (
    ResidualStack, StackConfig, dslm_scales, forward_sq_norms, last_layer_grad_norms,
)
from companion.stacks.tinylm import TinyLM, byte_tokenize, train_tiny_lm, unigram_loss

SMALL = dict(d_model=16, n_layers=3, n_heads=2)


def _x(B=2, T=5, d=16, seed=0):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- config
def test_config_json_round_trip():
    cfg = StackConfig(d_model=32, n_layers=5, placement="post", norm="rmsnorm", vocab_size=256,
                      residual_scale=0.9, branch_scale=0.3)
    text = json.dumps(asdict(cfg))
    assert StackConfig.from_dict(json.loads(text)) == cfg
    assert cfg.ff_width == 128 and StackConfig(d_ff=10).ff_width == 10
    assert StackConfig(block="both").sublayers == ("attention", "mlp")


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(d_model=0), ValueError, "d_model"),
        (dict(d_model=16.0), TypeError, "d_model"),
        (dict(n_layers=0), ValueError, "n_layers"),
        (dict(n_heads=3), ValueError, "divide"),
        (dict(d_ff=0), ValueError, "d_ff"),
        (dict(placement="middle"), ValueError, "placement"),
        (dict(norm="batchnorm"), ValueError, "norm"),
        (dict(block="conv"), ValueError, "block"),
        (dict(init="kaiming"), ValueError, "init"),
        (dict(gain=0.0), ValueError, "gain"),
        (dict(gain=float("nan")), TypeError, "gain"),
        (dict(residual_scale="1"), TypeError, "residual_scale"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(vocab_size=1), ValueError, "vocab_size"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(final_norm=1), TypeError, "final_norm"),
        (dict(max_len=0), ValueError, "max_len"),
    ],
)
def test_config_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        StackConfig(**kwargs)


def test_from_dict_unknown_key():
    with pytest.raises(ValueError, match="unknown"):
        StackConfig.from_dict({"width": 3})


def test_dslm_scales():
    for n in (1, 8, 192):
        lam, beta = dslm_scales(n)
        assert lam**2 + beta**2 == pytest.approx(1.0, abs=1e-12)
        assert beta**2 == pytest.approx(1.0 / n)
    lam, beta = dslm_scales(10, k=0.5)
    assert beta**2 == pytest.approx(0.025)
    with pytest.raises(ValueError, match="n_layers"):
        dslm_scales(0)
    with pytest.raises(TypeError, match="n_layers"):
        dslm_scales(2.5)
    with pytest.raises(ValueError, match="k must"):
        dslm_scales(4, k=9.0)
    with pytest.raises(ValueError, match="k must"):
        dslm_scales(4, k=0.0)
    with pytest.raises(TypeError, match="k must"):
        dslm_scales(4, k="2")


# ----------------------------------------------------------------------------- shapes, determinism
@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("block, S", [("mlp", 1), ("attention", 1), ("both", 2)])
def test_shapes(placement, norm, block, S):
    cfg = StackConfig(**SMALL, placement=placement, norm=norm, block=block)
    out = ResidualStack(cfg)(_x())
    assert out.stream.shape == (4, 2, 5, 16)
    assert out.pre_norm.shape == out.branch.shape == (3, 2, 5, 16)
    assert out.final.shape == (2, 5, 16)
    assert out.sublayer_norm_input.shape == out.sublayer_branch.shape == (3, S, 2, 5, 16)
    torch.testing.assert_close(out.pre_norm, out.sublayer_norm_input[:, -1])
    torch.testing.assert_close(out.branch, out.sublayer_branch.sum(1))


def test_determinism_and_independence_from_global_rng():
    cfg = StackConfig(**SMALL)
    torch.manual_seed(123)
    a = ResidualStack(cfg)(_x())
    torch.manual_seed(456)
    b = ResidualStack(cfg)(_x())
    assert torch.equal(a.stream, b.stream) and torch.equal(a.final, b.final)
    c = ResidualStack(StackConfig(**{**SMALL, "seed": 1}))(_x())
    assert not torch.allclose(a.stream[1:], c.stream[1:])


def test_shallow_stack_is_prefix_of_deep_stack():
    deep = ResidualStack(StackConfig(d_model=16, n_layers=6, n_heads=2))
    shallow = ResidualStack(StackConfig(d_model=16, n_layers=2, n_heads=2))
    x = _x()
    torch.testing.assert_close(deep(x).stream[:3], shallow(x).stream, rtol=0, atol=0)


def test_xavier_init_statistics():
    d = 128
    cfg = StackConfig(d_model=d, n_layers=1, n_heads=4, d_ff=256, gain=3.0, block="both")
    sub_att, sub_mlp = ResidualStack(cfg).blocks[0].sublayers
    att, mlp = sub_att.f, sub_mlp.f
    assert torch.count_nonzero(att.w_q.weight) == 0                 # uniform attention at init
    assert att.w_k.weight.std().item() == pytest.approx(math.sqrt(1 / d), rel=0.05)
    assert att.w_o.weight.std().item() == pytest.approx(3.0 * math.sqrt(1 / d), rel=0.05)
    assert mlp.w_in.weight.std().item() == pytest.approx(math.sqrt(2 / (d + 256)), rel=0.05)
    assert mlp.w_out.weight.std().item() == pytest.approx(3.0 * math.sqrt(2 / (d + 256)), rel=0.05)
    assert all(torch.count_nonzero(m.bias) == 0 for m in (att.w_o, mlp.w_in, mlp.w_out))


def test_normal_init_statistics():
    cfg = StackConfig(d_model=128, n_layers=1, n_heads=4, init="normal", gain=0.5, block="both")
    att, mlp = (s.f for s in ResidualStack(cfg).blocks[0].sublayers)
    assert att.w_q.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert mlp.w_out.weight.std().item() == pytest.approx(0.01, rel=0.05)


def test_uniform_attention_at_xavier_init():
    """With W_q = 0 every query attends uniformly to its causal prefix."""
    cfg = StackConfig(d_model=16, n_layers=1, n_heads=2, block="attention", final_norm=False)
    stack = ResidualStack(cfg)
    x = _x(B=1, T=4)
    sub = stack.blocks[0].sublayers[0]
    v = sub.f.w_v(sub.norm(x))                                      # [1, T, d]
    prefix_mean = torch.cumsum(v, dim=1) / torch.arange(1, 5)[None, :, None]
    torch.testing.assert_close(stack(x).branch[0], sub.f.w_o(prefix_mean))


# ----------------------------------------------------------------------------- update rules
def _reference(stack, x):
    """Hand-written forward pass, sublayer by sublayer, for comparison."""
    cfg = stack.config
    lam, beta = cfg.residual_scale, cfg.branch_scale
    h, streams = x, [x]
    for block in stack.blocks:
        for sub in block.sublayers:
            if cfg.placement == "pre":
                h = lam * h + beta * sub.f(sub.norm(h))
            else:
                h = sub.norm(lam * h + beta * sub.f(h))
        streams.append(h)
    return torch.stack(streams)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("block", ["mlp", "attention", "both"])
def test_forward_matches_reference(placement, block):
    lam, beta = dslm_scales(3)
    cfg = StackConfig(**SMALL, placement=placement, block=block, residual_scale=lam, branch_scale=beta)
    stack = ResidualStack(cfg)
    x = _x()
    out = stack(x)
    ref = _reference(stack, x)
    torch.testing.assert_close(out.stream, ref)
    torch.testing.assert_close(out.final, stack.final_norm(ref[-1]))


def test_pre_ln_stream_increments_are_branches():
    stack = ResidualStack(StackConfig(**SMALL, block="both"))
    out = stack(_x())
    torch.testing.assert_close(out.stream[1:] - out.stream[:-1], out.branch, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.sublayer_norm_input[:, 0], out.stream[:-1])


def test_post_ln_stream_is_normalised_pre_norm():
    cfg = StackConfig(**SMALL, placement="post", eps=0.0)
    stack = ResidualStack(cfg)
    out = stack(_x())
    norms2 = out.stream[1:].pow(2).sum(-1)
    torch.testing.assert_close(norms2, torch.full_like(norms2, 16.0), rtol=1e-5, atol=1e-4)
    ln = torch.nn.functional.layer_norm(out.pre_norm, (16,), eps=0.0)
    torch.testing.assert_close(out.stream[1:], ln, rtol=1e-5, atol=1e-5)


def test_rmsnorm_stack_uses_rmsnorm():
    stack = ResidualStack(StackConfig(**SMALL, norm="rmsnorm"))
    assert isinstance(stack.blocks[0].sublayers[0].norm, torch.nn.RMSNorm)


def test_stack_without_normalisation_is_the_plain_residual_update():
    # norm="none": h <- lam h + beta F(h) with F applied to the raw stream, no final norm, no norm parameters
    lam, beta = 0.9, 0.25
    stacks = {p: ResidualStack(StackConfig(**SMALL, norm="none", placement=p, residual_scale=lam,
                                           branch_scale=beta)) for p in ("pre", "post")}
    x = _x()
    out = stacks["pre"](x)
    h, ref = x, [x]
    for block in stacks["pre"].blocks:                       # written out without the stack's code path
        for sub in block.sublayers:
            h = lam * h + beta * sub.f(h)
        ref.append(h)
    torch.testing.assert_close(out.stream, torch.stack(ref))
    torch.testing.assert_close(out.final, out.stream[-1])   # the final "norm" is the identity
    torch.testing.assert_close(stacks["post"](x).stream, out.stream)   # placement makes no difference
    assert not any("norm" in name for name, _ in stacks["pre"].named_parameters())
    lm = TinyLM(StackConfig(**SMALL, norm="none", vocab_size=256))
    logits, rec = lm(torch.zeros(1, 4, dtype=torch.long))
    torch.testing.assert_close(logits, lm.unembed(rec.stream[-1]))
    with pytest.raises(ValueError, match="norm must be one of"):
        StackConfig(norm="None")


def test_causality():
    stack = ResidualStack(StackConfig(**SMALL, block="both"))
    x = _x(B=1, T=6)
    y = x.clone()
    y[:, 4] += 1.0
    a, b = stack(x), stack(y)
    torch.testing.assert_close(a.stream[:, :, :4], b.stream[:, :, :4], rtol=0, atol=0)
    assert not torch.allclose(a.stream[-1, :, 4:], b.stream[-1, :, 4:])


# ----------------------------------------------------------------------------- injection
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_injection_adds_vector_before_block(placement):
    stack = ResidualStack(StackConfig(**SMALL, placement=placement))
    x = _x(B=2, T=5)
    v = torch.randn(16)
    base = stack(x)
    inj = stack(x, inject_layer=1, inject_vector=v, inject_positions=[1, 3])
    torch.testing.assert_close(inj.stream[:1], base.stream[:1], rtol=0, atol=0)
    diff = inj.stream[1] - base.stream[1]
    mask = torch.tensor([0.0, 1, 0, 1, 0])
    torch.testing.assert_close(diff, mask[None, :, None] * v.expand(2, 5, 16), rtol=0, atol=1e-6)
    assert not torch.allclose(inj.stream[2], base.stream[2])
    # tokens before the first injected one never see the perturbation (causal attention)
    torch.testing.assert_close(inj.stream[:, :, 0], base.stream[:, :, 0], rtol=0, atol=0)


def test_injection_variants():
    stack = ResidualStack(StackConfig(**SMALL))
    x = _x(B=2, T=4)
    base = stack(x)
    vb = torch.randn(2, 16)
    out = stack(x, inject_layer=0, inject_vector=vb)                   # all tokens, per-sequence
    torch.testing.assert_close(out.stream[0], x + vb[:, None, :])
    out = stack(x, inject_layer=3, inject_vector=np.ones(16), inject_positions=torch.tensor([2]))
    torch.testing.assert_close(out.stream[:3], base.stream[:3], rtol=0, atol=0)
    torch.testing.assert_close(out.stream[3] - base.stream[3],
                               torch.zeros(2, 4, 16).index_fill_(1, torch.tensor([2]), 1.0))
    out = stack(x, inject_layer=3, inject_vector=torch.ones(16), inject_positions=2)
    torch.testing.assert_close(out.stream[3, :, 2] - base.stream[3, :, 2], torch.ones(2, 16))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(inject_layer=4, inject_vector=torch.ones(16)), "inject_layer"),
        (dict(inject_layer=-1, inject_vector=torch.ones(16)), "inject_layer"),
        (dict(inject_layer=1.0, inject_vector=torch.ones(16)), "inject_layer"),
        (dict(inject_layer=1), "without inject_vector"),
        (dict(inject_vector=torch.ones(16)), "without inject_layer"),
        (dict(inject_positions=[0]), "without inject_layer"),
        (dict(inject_layer=1, inject_vector=torch.ones(15)), "shape"),
        (dict(inject_layer=1, inject_vector=torch.ones(3, 16)), "shape"),
        (dict(inject_layer=1, inject_vector=torch.full((16,), float("nan"))), "NaN"),
        (dict(inject_layer=1, inject_vector=torch.ones(16), inject_positions=[5]), "inject_positions"),
        (dict(inject_layer=1, inject_vector=torch.ones(16), inject_positions=[-1]), "inject_positions"),
        (dict(inject_layer=1, inject_vector=torch.ones(16), inject_positions=[]), "inject_positions"),
        (dict(inject_layer=1, inject_vector=torch.ones(16), inject_positions=[0.5]), "inject_positions"),
        (dict(inject_layer=1, inject_vector=torch.ones(16), inject_positions=[[0]]), "inject_positions"),
    ],
)
def test_injection_errors(kwargs, match):
    stack = ResidualStack(StackConfig(**SMALL))
    with pytest.raises(ValueError, match=match):
        stack(_x(B=2, T=5), **kwargs)


@pytest.mark.parametrize("vector", ["v", torch.ones(16, dtype=torch.bool), [[1.0], [1.0, 2.0]],
                                    torch.ones(16, dtype=torch.complex64)])
def test_injection_vector_type_errors(vector):
    stack = ResidualStack(StackConfig(**SMALL))
    with pytest.raises(TypeError, match="inject_vector must"):
        stack(_x(B=2, T=5), inject_layer=1, inject_vector=vector)
    # integer vectors are real numbers: cast to the stack's dtype like any other
    out = stack(_x(B=2, T=5), inject_layer=1, inject_vector=torch.ones(16, dtype=torch.long))
    ref = stack(_x(B=2, T=5), inject_layer=1, inject_vector=torch.ones(16))
    assert torch.equal(out.stream, ref.stream)


def test_input_errors():
    stack = ResidualStack(StackConfig(**SMALL))
    with pytest.raises(TypeError, match="torch.Tensor"):
        stack(np.zeros((1, 2, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        stack(torch.zeros(2, 16))
    with pytest.raises(ValueError, match="shape"):
        stack(torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="dtype"):
        stack(torch.zeros(1, 2, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one"):
        stack(torch.zeros(1, 0, 16))
    with pytest.raises(TypeError, match="StackConfig"):
        ResidualStack({"d_model": 16})


def test_float64_stack():
    stack = ResidualStack(StackConfig(**SMALL)).double()
    assert stack(_x().double()).stream.dtype == torch.float64


# ----------------------------------------------------------------------------- language model
def test_tiny_lm_shapes_and_errors():
    cfg = StackConfig(**SMALL, vocab_size=256, max_len=8)
    lm = TinyLM(cfg)
    logits, out = lm(torch.randint(0, 256, (2, 8)), inject_layer=1, inject_vector=torch.ones(16))
    assert logits.shape == (2, 8, 256) and out.stream.shape == (4, 2, 8, 16)
    with pytest.raises(ValueError, match="vocab_size"):
        TinyLM(StackConfig(**SMALL))
    with pytest.raises(TypeError, match="StackConfig"):
        TinyLM(None)
    with pytest.raises(TypeError, match="integer"):
        lm(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="shape"):
        lm(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        lm(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        lm(torch.full((1, 3), 256))


def test_tiny_lm_input_scale():
    lm = TinyLM(StackConfig(d_model=128, n_layers=1, n_heads=4, vocab_size=256))
    _, out = lm(torch.arange(256)[None, :])
    assert out.stream[0].pow(2).sum(-1).mean().item() / 128 == pytest.approx(1.0, rel=0.1)


def test_byte_tokenize_and_unigram_loss():
    assert byte_tokenize(["ab", "c"]).tolist() == [97, 98, 10, 10, 99]
    assert byte_tokenize("x").dtype == torch.long
    with pytest.raises(ValueError, match="empty"):
        byte_tokenize("")
    with pytest.raises(TypeError, match="str"):
        byte_tokenize(b"bytes")
    with pytest.raises(TypeError, match="str"):
        byte_tokenize(["a", 3])
    assert unigram_loss(torch.tensor([3, 3, 3])) == 0.0
    assert unigram_loss(np.arange(4)) == pytest.approx(math.log(4))
    for bad in ([], [[1, 2]], [-1, 2], [0.5]):
        with pytest.raises(ValueError, match="ids"):
            unigram_loss(np.asarray(bad))


def test_train_tiny_lm_is_deterministic():
    cfg = StackConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=256, max_len=16)
    text = "the quick brown fox jumps over the lazy dog. " * 20
    m1, l1 = train_tiny_lm(cfg, text, steps=5, batch_size=2, seq_len=16)
    m2, l2 = train_tiny_lm(cfg, text, steps=5, batch_size=2, seq_len=16)
    np.testing.assert_array_equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert not m1.training


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(config=StackConfig(**SMALL)), ValueError, "vocab_size"),
        (dict(steps=0), ValueError, "steps"),
        (dict(batch_size=1.5), TypeError, "batch_size"),
        (dict(seq_len=64), ValueError, "max_len"),
        (dict(lr=0.0), ValueError, "lr"),
        (dict(warmup=-1), ValueError, "warmup"),
        (dict(text="short"), ValueError, "bytes"),
        (dict(config="cfg"), TypeError, "StackConfig"),
    ],
)
def test_train_tiny_lm_errors(kwargs, exc, match):
    args = dict(config=StackConfig(**SMALL, vocab_size=256, max_len=32), text="abc " * 50,
                steps=1, batch_size=2, seq_len=16)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        train_tiny_lm(**args)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_tiny_lm_learns_below_unigram(placement):
    from companion.corpus import load_corpus

    text = load_corpus()
    cfg = StackConfig(d_model=64, n_layers=2, vocab_size=256, placement=placement)
    _, losses = train_tiny_lm(cfg, text, steps=120, batch_size=16, seq_len=64)
    assert losses[-10:].mean() < unigram_loss(byte_tokenize(text)) - 0.3


# ----------------------------------------------------------------------------- measurements
def test_forward_sq_norms_pre_mlp_matches_lemma():
    """Pre-LN MLP stack, d_ff = d: E||x_l||^2 / d = 1 + l/2 exactly in expectation."""
    cfg = StackConfig(d_model=256, n_layers=6, d_ff=256, block="mlp", final_norm=True)
    r = forward_sq_norms(cfg, n_sequences=8, seq_len=32)
    assert r["stream"].shape == (7, 32) and r["pre_norm"].shape == (6, 32)
    np.testing.assert_allclose(r["stream"].mean(1), 1 + 0.5 * np.arange(7), rtol=0.08)
    np.testing.assert_allclose(r["final"], 1.0, rtol=1e-3)


def test_forward_sq_norms_post_is_flat_and_chunking_is_exact():
    cfg = StackConfig(d_model=32, n_layers=4, n_heads=4, placement="post", final_norm=False)
    a = forward_sq_norms(cfg, n_sequences=6, seq_len=8, chunk=6)
    b = forward_sq_norms(cfg, n_sequences=6, seq_len=8, chunk=4)
    np.testing.assert_allclose(a["stream"][1:], 1.0, rtol=1e-3)
    np.testing.assert_allclose(a["stream"], b["stream"], rtol=1e-6)
    stack = ResidualStack(cfg)
    c = forward_sq_norms(cfg, n_sequences=6, seq_len=8, stack=stack)
    np.testing.assert_allclose(a["pre_norm"], c["pre_norm"], rtol=1e-6)


def test_last_layer_grad_norm_depth_dependence():
    def g(placement, L):
        cfg = StackConfig(d_model=32, n_layers=L, n_heads=4, d_ff=32, placement=placement,
                          final_norm=(placement == "pre"))
        return last_layer_grad_norms(cfg, n_sequences=4, seq_len=16)[-1]

    pre_ratio = g("pre", 24) / g("pre", 2)
    post_ratio = g("post", 24) / g("post", 2)
    assert pre_ratio < 0.6                  # Pre-LN: shrinks like 1/sqrt(L)
    assert 0.5 < post_ratio < 2.0           # Post-LN: no trend with depth


def test_measurement_errors():
    cfg = StackConfig(**SMALL)
    with pytest.raises(TypeError, match="StackConfig"):
        forward_sq_norms("cfg")
    with pytest.raises(ValueError, match="n_sequences"):
        forward_sq_norms(cfg, n_sequences=0)
    with pytest.raises(TypeError, match="chunk"):
        forward_sq_norms(cfg, chunk=2.0)
    with pytest.raises(TypeError, match="ResidualStack"):
        forward_sq_norms(cfg, stack="stack")
    with pytest.raises(ValueError, match="no MLP"):
        last_layer_grad_norms(StackConfig(**SMALL, block="attention"))
    with pytest.raises(ValueError, match="n_classes"):
        last_layer_grad_norms(cfg, n_classes=1)
    with pytest.raises(TypeError, match="StackConfig"):
        last_layer_grad_norms(None)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("block", ["mlp", "both"])
def test_grad_norms_from_one_deep_stack_match_separate_stacks(placement, block):
    from dataclasses import replace

    lam, beta = dslm_scales(5)
    cfg = StackConfig(d_model=16, n_layers=5, n_heads=2, d_ff=24, placement=placement, block=block,
                      residual_scale=lam, branch_scale=beta, final_norm=(placement == "pre"))
    all_depths = last_layer_grad_norms(cfg, n_sequences=2, seq_len=6, seed=3)
    separate = [_direct_grad_norm(replace(cfg, n_layers=l), n_sequences=2, seq_len=6, seed=3)
                for l in range(1, 6)]
    np.testing.assert_allclose(all_depths, separate, rtol=1e-5)


def _direct_grad_norm(cfg, n_sequences, seq_len, seed, n_classes=16):
    """Reference: autograd through the whole stack to the last MLP's output weight (mean loss)."""
    from companion.stacks.residual import _readout_problem

    x, readout, labels = _readout_problem(cfg, n_sequences, seq_len, n_classes, seed, "cpu")
    stack = ResidualStack(cfg)
    loss = torch.nn.functional.cross_entropy((stack(x).final @ readout).reshape(-1, n_classes), labels)
    (grad,) = torch.autograd.grad(loss, stack.blocks[-1].sublayers[-1].f.w_out.weight)
    return float(grad.norm())


def test_grad_norms_errors():
    with pytest.raises(ValueError, match="no MLP"):
        last_layer_grad_norms(StackConfig(**SMALL, block="attention"))
    with pytest.raises(TypeError, match="StackConfig"):
        last_layer_grad_norms({})
    with pytest.raises(ValueError, match="n_classes"):
        last_layer_grad_norms(StackConfig(**SMALL), n_classes=1)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_per_token_grad_norms_match_token_by_token_autograd(placement):
    from companion.stacks.residual import _readout_problem

    cfg = StackConfig(d_model=16, n_layers=3, n_heads=2, d_ff=16, placement=placement,
                      final_norm=(placement == "pre"))
    got = last_layer_grad_norms(cfg, n_sequences=2, seq_len=3, n_classes=5, seed=1, per_token=True)[-1]
    stack = ResidualStack(cfg)
    x, readout, labels = _readout_problem(cfg, 2, 3, 5, 1, "cpu")
    losses = torch.nn.functional.cross_entropy((stack(x).final @ readout).reshape(-1, 5), labels,
                                               reduction="none")
    w = stack.blocks[-1].sublayers[-1].f.w_out.weight
    norms = [torch.autograd.grad(losses[t], w, retain_graph=True)[0].norm().item() for t in range(6)]
    assert got == pytest.approx(np.mean(norms), rel=1e-5)
    with pytest.raises(TypeError, match="per_token"):
        last_layer_grad_norms(cfg, per_token=1)


def test_train_tiny_lm_in_float64_starts_from_the_float32_initialisation():
    cfg = StackConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=256, max_len=32)
    text = "abcabcabc" * 20
    m32, l32 = train_tiny_lm(cfg, text, steps=3, batch_size=2, seq_len=16)
    m64, l64 = train_tiny_lm(cfg, text, steps=3, batch_size=2, seq_len=16, dtype=torch.float64)
    assert next(m64.parameters()).dtype == torch.float64
    np.testing.assert_allclose(l64[0], l32[0], rtol=1e-5)      # same initial network
    with pytest.raises(TypeError, match="floating-point torch.dtype"):
        train_tiny_lm(cfg, text, steps=1, batch_size=2, seq_len=16, dtype=torch.int64)
