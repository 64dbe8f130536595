"""Rotations, cross-layer equalisation, centred/rotated deployable quantisers and the experiment's helpers.

Every check compares with an independent computation: orthogonality and Sylvester's recursion, the
float model's own output (rotation and equalisation must leave it unchanged), a hand-written
quantise-then-multiply, the per-token step bound, and the corpus loader.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.applications.model_quantization import (
    LinearQuantization, equalization_scales, equalized_linears, quantized_linears)
from companion.applications.quantization import (
    fake_quantize, hadamard_matrix, qmax, quantize_weight, random_rotation)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_hadamard_is_orthogonal_with_equal_entries(n):
    h = hadamard_matrix(n)
    np.testing.assert_allclose(h @ h.T, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(np.abs(h), 1 / np.sqrt(n))
    if n >= 2:                      # Sylvester's recursion, written out: H_2n = [[H, H], [H, -H]] / sqrt 2
        half = hadamard_matrix(n // 2)
        np.testing.assert_allclose(h, np.block([[half, half], [half, -half]]) / np.sqrt(2))


@pytest.mark.parametrize("d", [1, 6, 12, 576, 1536])
def test_random_rotation_is_orthogonal_and_seeded(d):
    r = random_rotation(d, seed=4)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-10)
    np.testing.assert_array_equal(r, random_rotation(d, seed=4))
    if d > 1:
        assert not np.allclose(r, random_rotation(d, seed=5))


def test_random_rotation_of_a_power_of_two_is_a_signed_hadamard():
    r = random_rotation(16, seed=2)
    np.testing.assert_allclose(np.abs(r), 0.25)      # every entry ±1/sqrt(16): a Hadamard matrix up to signs


def test_rotation_spreads_a_massive_channel():
    x = torch.zeros(4, 64, dtype=torch.float64)
    x[:, 3] = 100.0
    y = x @ torch.as_tensor(random_rotation(64, seed=0))
    # the norm of each row is kept and spread evenly: every entry has |y| = 100/8
    np.testing.assert_allclose(y.abs().numpy(), 12.5, rtol=1e-12)


@pytest.mark.parametrize("bad, exc", [(3, ValueError), (0, ValueError), (2.0, TypeError), ("4", TypeError)])
def test_hadamard_rejects_bad_orders(bad, exc):
    with pytest.raises(exc):
        hadamard_matrix(bad)


@pytest.mark.parametrize("d, seed, exc", [(0, 0, ValueError), (3.5, 0, TypeError), (4, -1, ValueError)])
def test_random_rotation_rejects_bad_arguments(d, seed, exc):
    with pytest.raises(exc):
        random_rotation(d, seed)


def _lin(d_in, d_out, seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(d_in, d_out, bias=False).double()


def test_rotation_and_smoothing_leave_the_float_layer_unchanged():
    lin, x = _lin(12, 5, 0), torch.randn(7, 12, dtype=torch.float64)
    y0 = lin(x).detach()
    w0 = lin.weight.detach().clone()
    kw = {"rotate": {"l": random_rotation(12, 1)}, "smooth": {"l": np.linspace(0.5, 2.0, 12)}}
    with quantized_linears({"l": lin}, LinearQuantization(act_bits=None), **kw):
        torch.testing.assert_close(lin(x).detach(), y0, rtol=0, atol=1e-12)
    torch.testing.assert_close(lin.weight.detach(), w0, rtol=0, atol=0)        # restored exactly


@pytest.mark.parametrize("bits, granularity", [(8, "token"), (4, "token"), (8, "tensor")])
def test_rotated_centred_quantiser_equals_a_hand_computation(bits, granularity):
    lin, x = _lin(16, 3, 1), torch.randn(9, 16, dtype=torch.float64) * 3 + 1
    r, c = torch.as_tensor(random_rotation(16, 3)), torch.linspace(-1, 1, 16, dtype=torch.float64)
    spec = LinearQuantization(act_bits=bits, act_granularity=granularity, weight_bits=4,
                              weight_granularity="tensor")
    with quantized_linears({"l": lin}, spec, rotate={"l": r}, center={"l": c}):
        got = lin(x).detach()
    y = x @ r                                             # by hand: rotate, centre, quantise, shift back
    yq = fake_quantize(y - c, bits, granularity) + c
    wq = quantize_weight(lin.weight.detach() @ r, 4, granularity="tensor")
    torch.testing.assert_close(got, yq @ wq.T, rtol=0, atol=1e-12)


def test_per_token_quantiser_meets_its_step_bound():
    eye = torch.nn.Linear(20, 20, bias=False).double()
    with torch.no_grad():
        eye.weight.copy_(torch.eye(20, dtype=torch.float64))
    x = torch.randn(50, 20, dtype=torch.float64) * torch.logspace(-2, 2, 50, dtype=torch.float64)[:, None]
    for bits in (8, 4, 3):
        with quantized_linears({"e": eye}, LinearQuantization(act_bits=bits, act_granularity="token")):
            err = (eye(x) - x).abs().detach()
        step = x.abs().amax(1, keepdim=True) / qmax(bits)          # Δ of each token's own range
        assert bool((err <= step / 2 * (1 + 1e-12)).all())
        assert float((err / step).max()) > 0.3                      # and the bound is not vacuous


def test_weight_granularity_tensor_uses_one_range():
    lin, x = _lin(6, 4, 2), torch.randn(3, 6, dtype=torch.float64)
    with quantized_linears({"l": lin}, LinearQuantization(act_bits=None, weight_bits=3, weight_granularity="tensor")):
        w = lin.weight.detach().clone()
    levels = np.unique(np.round(np.abs(w.numpy()) / (np.abs(lin.weight.detach().numpy()).max() / 3), 9))
    assert set(levels) <= {0.0, 1.0, 2.0, 3.0}                     # one step for the whole matrix
    assert LinearQuantization(weight_bits=4, act_bits=None, weight_granularity="tensor").describe() == "W4 per-tensor"


def test_bad_rotation_center_and_granularity():
    lin = _lin(4, 2, 0)
    spec = LinearQuantization(act_bits=8)
    with pytest.raises(ValueError, match="orthogonal"):
        with quantized_linears({"l": lin}, spec, rotate={"l": np.ones((4, 4))}):
            pass
    with pytest.raises(ValueError, match="shape"):
        with quantized_linears({"l": lin}, spec, rotate={"l": np.eye(3)}):
            pass
    with pytest.raises(ValueError, match="shape"):
        with quantized_linears({"l": lin}, spec, center={"l": np.zeros(3)}):
            pass
    with pytest.raises(ValueError, match="not in modules"):
        with quantized_linears({"l": lin}, spec, rotate={"m": np.eye(4)}):
            pass
    with pytest.raises(ValueError):
        LinearQuantization(weight_bits=4, weight_granularity="token")


def _gated_mlp(seed, d=6, h=10):
    g, u, dn = _lin(d, h, seed), _lin(d, h, seed + 1), _lin(h, d, seed + 2)
    with torch.no_grad():                                   # very unequal channel ranges
        u.weight.mul_(torch.logspace(-1.5, 1.5, h, dtype=torch.float64)[:, None])
    return g, u, dn, (lambda x: dn(torch.nn.functional.silu(g(x)) * u(x)))


def test_cle_leaves_the_float_function_unchanged_and_equalises_ranges():
    g, u, dn, f = _gated_mlp(0)
    x = torch.randn(8, 6, dtype=torch.float64)
    y0 = f(x).detach()
    w_u, w_d = u.weight.detach().clone(), dn.weight.detach().clone()
    with equalized_linears([(u, dn, None)]) as (s,):
        torch.testing.assert_close(f(x).detach(), y0, rtol=0, atol=1e-12)
        r1, r2 = u.weight.abs().amax(1).detach(), dn.weight.abs().amax(0).detach()
        torch.testing.assert_close(r1, r2, rtol=1e-12, atol=0)                       # equal ranges
        torch.testing.assert_close(r1, (w_u.abs().amax(1) * w_d.abs().amax(0)).sqrt(), rtol=1e-12, atol=0)
        assert s.shape == (10,) and (s > 0).all()
    torch.testing.assert_close(u.weight.detach(), w_u, rtol=0, atol=0)
    torch.testing.assert_close(dn.weight.detach(), w_d, rtol=0, atol=0)


def test_cle_with_a_grouped_query_map():
    """Values of 2 kv heads read by 4 query heads: o_proj column k reads value channel reads[k]."""
    hd, n_kv, n_q = 3, 2, 4
    v, o = _lin(5, n_kv * hd, 3), _lin(n_q * hd, 5, 4)
    reads = np.array([(k // hd) // (n_q // n_kv) * hd + k % hd for k in range(n_q * hd)])
    x, attn = torch.randn(6, 5, dtype=torch.float64), torch.softmax(torch.randn(n_q, 6, 6), -1).double()

    def f():
        val = v(x)[:, reads].reshape(6, n_q, hd).transpose(0, 1)     # [head, token, hd]
        return o((attn @ val).transpose(0, 1).reshape(6, n_q * hd)).detach()
    y0 = f()
    with equalized_linears([(v, o, reads)]):
        torch.testing.assert_close(f(), y0, rtol=0, atol=1e-12)


def test_equalization_scales_by_hand_and_bad_input():
    s = equalization_scales(np.array([[4.0, 1.0], [0.5, 0.0]]), np.array([[1.0, 2.0], [-1.0, 0.5]]))
    np.testing.assert_allclose(s, [np.sqrt(4.0 / 1.0), np.sqrt(0.5 / 2.0)])
    with pytest.raises(ValueError, match="reads"):
        equalization_scales(np.ones((2, 2)), np.ones((2, 3)), reads=[0, 0, 0])   # row 1 never read
    with pytest.raises(ValueError, match="reads"):
        equalization_scales(np.ones((2, 2)), np.ones((2, 2)), reads=[0, 2])
    with pytest.raises(ValueError):
        equalization_scales(np.ones(3), np.ones((2, 3)))
    lin_b = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match="bias"):
        with equalized_linears([(lin_b, _lin(3, 2, 0), None)]):
            pass
    with pytest.raises(TypeError):
        with equalized_linears([(np.ones((2, 2)), _lin(2, 2, 0), None)]):
            pass


def test_book_paragraphs_partition_the_corpus():
    from companion.corpus import load_corpus
    from companion.experiments.deployable_quantization import SCHEMES, book_paragraphs
    books = book_paragraphs()
    assert {"kjv_acts", "kjv_genesis", "kjv_mark", "kjv_esther", "kjv_ruth"} <= set(books)
    assert [p for ps in books.values() for p in ps] == load_corpus()        # the same paragraphs, in order
    assert sum("reference" in s for s in SCHEMES) == 1                      # one labelled non-deployable row


def test_experiment_refuses_acts_as_held_out_text():
    from companion.experiments import make_config
    cfg = make_config("deployable_quantization", eval_books=("kjv_acts", "kjv_mark"))
    with pytest.raises(ValueError, match="kjv_acts"):
        cfg.compute("cpu", None)


@pytest.fixture(scope="module")
def tiny_llama():
    from tests.tiny_transformers import minilm_tokenizer, tiny_transformer
    return tiny_transformer("llama", minilm_tokenizer(), n_layers=2, dtype=torch.float64)


def _logits(m, ids):
    with torch.no_grad():
        return m.model(input_ids=ids).logits


def test_the_rotation_plan_and_cle_leave_the_float_model_unchanged(tiny_llama):
    from companion.experiments.deployable_quantization import equalization_pairs, rotation_plan
    m = tiny_llama
    lin = {n: mod for n, mod in m.model.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in n}
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    y0 = _logits(m, ids)
    smooth, rotate = rotation_plan(m.model, lin, seed=3)
    assert len(rotate) == len(lin) and len(smooth) == 5 * 2          # q, k, v, gate, up of 2 blocks
    with quantized_linears(lin, LinearQuantization(act_bits=None), smooth=smooth, rotate=rotate):
        torch.testing.assert_close(_logits(m, ids), y0, rtol=0, atol=1e-10)
    with equalized_linears(equalization_pairs(m.model)):                    # grouped-query attention here
        torch.testing.assert_close(_logits(m, ids), y0, rtol=0, atol=1e-10)
    torch.testing.assert_close(_logits(m, ids), y0, rtol=0, atol=0)        # everything restored
    # and the rotation changes what an int4 per-tensor quantiser does (it is not a no-op)
    spec = LinearQuantization(act_bits=4)
    with quantized_linears(lin, spec):
        plain = _logits(m, ids)
    with quantized_linears(lin, spec, smooth=smooth, rotate=rotate):
        rotated = _logits(m, ids)
    assert float((plain - rotated).abs().max()) > 1e-6


STORED = ("deployable_quantization", "mixed_precision_baselines", "pruning_baselines", "quantization_sensitivity")


@pytest.mark.parametrize("name", STORED)
def test_the_stored_results_are_current_and_sane(name):
    """The chapter renders these Results: they must be stored (not recomputed), current and consistent."""
    from companion import experiments as xp
    cfg = xp.make_config(name)
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), f"missing {path}; python -m companion run {name} --out companion/data/results"
    r = xp.load_result(path)
    assert xp.stale_reason(r, cfg) is None
    books = list(r.scalars["eval_book"])
    assert len(books) == 16 and len(set(books)) == 4 and "kjv_acts" not in books      # held-out books
    assert np.isfinite(r.arrays["base_loss"]).all()
    if name == "deployable_quantization":
        assert r.arrays["loss"].shape == (len(r.scalars["schemes"]), 16)
        assert r.scalars["alpha_chosen"] == cfg.alphas[int(np.argmin(r.arrays["alpha_calib_kl"]))]
        bc = r.arrays["bc_local"]
        assert bc.shape == (210, 4) and (bc[:, :2] >= 0).all()
        # the MSE change, computed as |c|^2 - 2 c.m (m: mean error before, c: the correction), equals
        # the difference of the two squared mean errors |m - c|^2 - |m|^2, computed separately
        np.testing.assert_allclose(bc[:, 2], bc[:, 1] - bc[:, 0], rtol=1e-6, atol=1e-9 * bc[:, 0].max())
    elif name == "mixed_precision_baselines":
        sets = r.arrays["mixed_sets"]
        assert len(sets) - len(r.scalars["mixed_rules"]) >= 50                          # many random sets
        assert all(len(set(s)) == cfg.keep_layers for s in sets)
    elif name == "pruning_baselines":
        assert r.arrays["prune_random_loss"].shape[0] >= 10                                # many seeds
    else:
        n_sites, n_blocks = len(r.scalars["sites"]), len(r.arrays["layer_mean_share"])
        assert r.arrays["site_loss"].shape == r.arrays["site_high_loss"].shape == (n_sites, 16)
        assert r.arrays["layer_loss"].shape == (n_blocks, 16) and n_blocks == 30
        assert ((0 < r.arrays["layer_mean_share"]) & (r.arrays["layer_mean_share"] < 1)).all()
        # int4 per token on every linear input is also a row of the deployable_quantization Result,
        # computed there in another run: the two measurements must agree text by text
        from companion.experiments.deployable_quantization import SCHEMES
        dq = xp.load_result(xp.result_path(xp.make_config("deployable_quantization"), xp.stored_root()))
        np.testing.assert_allclose(r.arrays["all_low_loss"], dq.arrays["loss"][SCHEMES.index("A4 per-token")],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r.arrays["base_loss"], dq.arrays["base_loss"], rtol=1e-6)


def test_sensitivity_refuses_low_bits_above_high_bits():
    from companion.experiments import make_config
    with pytest.raises(ValueError, match="high_bits"):
        make_config("quantization_sensitivity", low_bits=8, high_bits=4).compute("cpu", None)
    with pytest.raises(ValueError, match="low_bits must be a int"):        # refused at the door
        make_config("quantization_sensitivity", low_bits=4.5)


def test_block_input_statistics_by_hand():
    """Mean share and range per block, from the calibration statistics of the block's linear inputs
    (the one helper that compression_sweep, mixed_precision_baselines and quantization_sensitivity use)."""
    from types import SimpleNamespace

    from companion.experiments.compression_sweep import CompressionBench

    def st(mean, second, max_abs):
        return SimpleNamespace(mean=np.array(mean), second_moment=np.array(second), max_abs=np.array(max_abs))

    bench = object.__new__(CompressionBench)
    names = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.up_proj"]
    bench.linears = {n: None for n in names}
    bench.stats = {names[0]: st([1.0, 0.0], [2.0, 2.0], [3.0, 0.5]),
                   names[1]: st([2.0], [8.0], [7.0]),
                   names[2]: st([0.0, 3.0], [1.0, 9.0], [1.0, 4.0])}
    share, range_ = bench.block_input_statistics(2)
    np.testing.assert_allclose(share, [(1 + 4) / (2 + 2 + 8), 9 / 10])
    np.testing.assert_array_equal(range_, [7.0, 4.0])
