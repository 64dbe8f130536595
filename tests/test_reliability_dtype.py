"""Reliability at the dtype's range (issue 30): quantisers, injection sums, resources, the CLI's door."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.applications.quantization import quantize_weight, quantize_with_range

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_range_spanning_the_dtype_is_finite(dtype, symmetric):
    m = torch.finfo(dtype).max
    x = torch.tensor([-m, 0.0, m], dtype=dtype)
    for out in (quantize_with_range(x, 8, -m, m, symmetric=symmetric),
                quantize_weight(x[None], 8, symmetric=symmetric)[0]):
        assert bool(torch.isfinite(out).all()), out  # old: -inf (float16) or NaN (wider ranges)
        assert out[1] == 0 and out[0] < 0 < out[2]


@pytest.mark.parametrize("symmetric", [True, False])
def test_zero_range_clips_to_zero(symmetric):
    out = quantize_with_range(np.array([5.0, -3.0]), 8, 0.0, 0.0, symmetric=symmetric)
    assert out.tolist() == [0.0, 0.0]  # old: [5, -3] (symmetric) or [5, 0]


def test_range_beyond_the_work_dtype_is_refused():
    with pytest.raises(ValueError, match="beyond the range"):
        quantize_with_range(np.array([5.0], dtype=np.float32), 8, 1e39, 1e39)  # old: [nan]


@settings(max_examples=60)
@given(dtype=st.sampled_from(DTYPES), symmetric=st.booleans(), bits=st.integers(2, 16),
       fl=st.floats(0.0, 1.0), fh=st.floats(0.0, 1.0), u=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
       scale=st.sampled_from([1e-30, 1.0, 1e3, 0.5, 0.999, 1.0 + 1e-9]))
def test_quantize_with_range_is_finite_and_within_a_step(dtype, symmetric, bits, fl, fh, u, scale):
    """Any range inside the dtype: finite output within one grid step of the clipped input (float64)."""
    fmax = torch.finfo(dtype).max
    mag = min(scale, 1.0) * fmax if scale <= 1.0 else fmax
    lo, hi = -fl * mag, fh * mag
    x = torch.tensor([lo + (hi - lo) * v if np.isfinite(hi - lo) else lo * (1 - v) + hi * v for v in u],
                     dtype=torch.float64).to(dtype)
    lo_t, hi_t = (float(torch.tensor(v, dtype=torch.float64).to(dtype)) for v in (lo, hi))
    out = quantize_with_range(x, bits, lo_t, hi_t, symmetric=symmetric)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    ref = x.double().clamp(lo_t, hi_t)
    if symmetric:
        step = max(abs(lo_t), abs(hi_t)) / (2 ** (bits - 1) - 1)
    else:
        step = (max(hi_t, 0.0) / (2 ** bits - 1) - min(lo_t, 0.0) / (2 ** bits - 1))
    tol = 1.01 * step + 2 * float(ref.abs().max()) * torch.finfo(dtype).eps + torch.finfo(dtype).tiny
    assert float((out.double() - ref).abs().max()) <= tol


# --------------------------------------------------------------------------------------------
# injection: the SUM stream + vector in the model's dtype (SmolLM2 holds ~2e4 in one channel)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_half():
    from companion.transformers import models
    return models.load("smollm2-135m", device="cpu", dtype=torch.float16)


@pytest.mark.slow
def test_inject_refuses_a_sum_that_overflows_float16(smollm2_half):
    from companion.injection.engine import sweep_injections
    from companion.transformers import stream
    m = smollm2_half
    h = stream.residual_stream(m, ["The cat sat."])
    layer = int(torch.argmax(h.float().abs().amax(dim=(1, 2, 3))))
    big = float(h[layer].float().abs().max())
    assert big > 1e4
    c = int(h[layer].float().abs().amax(dim=(0, 1)).argmax())
    v = torch.zeros(m.d_model)
    v[c] = float(torch.sign(h[layer][..., c].float().flatten()[h[layer][..., c].float().abs().flatten().argmax()]))
    scale = 65504.0 - big / 2  # the vector alone passes the cast check; the sum does not
    with pytest.raises(ValueError, match="overflows torch.float16"):
        stream.inject(m, ["The cat sat."], layer, v, scale=scale)  # old: non-finite values, no error
    with pytest.raises(ValueError, match="overflows torch.float16"):
        sweep_injections(m, ["The cat sat."], [layer], v, scale=scale)


# --------------------------------------------------------------------------------------------
# resources: memory estimated from the config before allocating; integers at the public door
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(d_model=2 ** 40, n_heads=1), dict(d_model=2 ** 70, n_heads=1),
                                dict(vocab_size=2 ** 63), dict(d_ff=2 ** 45)])
def test_a_config_beyond_the_machine_is_refused_before_allocating(kw):
    from companion.stacks.residual import ResidualStack, StackConfig
    from companion.stacks.tinylm import TinyLM
    cfg = StackConfig(**{"vocab_size": 256, **kw})
    for build in (ResidualStack, TinyLM):  # old: RuntimeError from the allocator or a C++ overflow
        with pytest.raises(ValueError, match=r"needs about .* GB .* more than this machine"):
            build(cfg)


def test_small_configs_still_build():
    from companion.stacks.residual import StackConfig
    from companion.stacks.tinylm import TinyLM
    assert TinyLM(StackConfig(d_model=16, n_layers=2, n_heads=2, vocab_size=256)).config.d_model == 16


def _stored_channel_statistics(monkeypatch, tmp_path):
    """A config of channel_statistics with a (fake, cheap) stored Result under ``tmp_path``."""
    from companion import experiments as ex
    cls = ex.get_experiment("channel_statistics")
    monkeypatch.setattr(cls, "compute", lambda self, device, progress: {"counts": np.zeros(2)})
    cfg = ex.make_config(cls, n_texts=4)
    ex.run_cached(cfg, device="cpu", results_dir=tmp_path)
    return ex, cfg


def test_an_unavailable_device_is_refused_before_a_cached_result(monkeypatch, tmp_path, capsys):
    from companion.__main__ import main
    ex, cfg = _stored_channel_statistics(monkeypatch, tmp_path)
    assert ex.run_cached(cfg, device="cpu", results_dir=tmp_path).path.exists()
    for dev in ("cuda:99", "tpu"):
        with pytest.raises(ValueError, match="device"):  # old: the cached Result, no error
            ex.run_cached(cfg, device=dev, results_dir=tmp_path)
        argv = ["run", "channel_statistics", "--set", "n_texts=4", "--device", dev, "--out", str(tmp_path)]
        assert main(argv) == 2 and "device" in capsys.readouterr().err


@pytest.mark.parametrize("value", [2 ** 63, -2 ** 63 - 1, 10 ** 30])
def test_integers_beyond_64_bits_are_refused_at_the_door(monkeypatch, tmp_path, capsys, value):
    from companion.__main__ import main
    ex, cfg = _stored_channel_statistics(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match="64 bits"):
        ex.make_config("channel_statistics", n_texts=str(value))
    big = dataclasses.replace(cfg, n_texts=value)
    for call in (ex.run, ex.run_cached, ex.config_hash):
        with pytest.raises(ValueError, match="64 bits"):
            call(big)
    assert main(["run", "channel_statistics", "--set", f"n_texts={value}", "--out", str(tmp_path)]) == 2
    assert "64 bits" in capsys.readouterr().err


@settings(max_examples=60)
@given(dtype=st.sampled_from(DTYPES), granularity=st.sampled_from(["tensor", "channel", "token"]),
       bits=st.integers(2, 16), u=st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4),
       top=st.sampled_from([1.0, 0.999, 0.5, 1e-3]))
def test_fake_quantize_is_finite_and_within_half_a_step(dtype, granularity, bits, u, top):
    """Symmetric dynamic quantiser on data up to the dtype's maximum: finite, within Δ/2 (float64)."""
    from companion.applications.quantization import _scale_of, fake_quantize, qmax
    fmax = torch.finfo(dtype).max
    x = (torch.tensor(u, dtype=torch.float64).reshape(2, 2) * fmax * top).to(dtype)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    out = fake_quantize(x, bits, granularity)  # old: inf for float32/float64 data at ±max
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    half = torch.broadcast_to(_scale_of(x.double(), qmax(bits), granularity, None) / 2, x.shape)
    assert bool(((out.double() - x.double()).abs() <= 1.01 * half + torch.finfo(dtype).eps * x.double().abs()).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", ["tensor", "channel", "token"])
def test_fake_quantize_at_the_dtype_maximum_is_finite(dtype, granularity):
    from companion.applications.quantization import fake_quantize
    m = torch.finfo(dtype).max
    out = fake_quantize(torch.tensor([[-m, 0.0, m, 1.0]], dtype=dtype), 8, granularity)
    assert bool(torch.isfinite(out).all()) and out[0, 2] == m  # old: ±inf for float32 and float64


def test_stack_injection_refuses_a_sum_that_overflows_float16():
    from companion.stacks.residual import ResidualStack, StackConfig
    stack = ResidualStack(StackConfig(d_model=8, n_layers=2, n_heads=2)).half()
    x = torch.zeros(1, 3, 8, dtype=torch.float16)
    x[..., 0] = 6e4  # a massive activation
    v = torch.zeros(8, dtype=torch.float16)
    v[0] = 1e4       # passes the cast check alone
    for layer in (0, 2):
        with pytest.raises(ValueError, match="overflows torch.float16"):  # old: inf in the stream
            stack(x, inject_layer=layer, inject_vector=v)


@pytest.mark.parametrize("kw, match", [(dict(seq_len=2 ** 40), "needs about"), (dict(seed=2 ** 64), "<="),
                                       (dict(n_sequences=2 ** 63), "<="), (dict(chunk=2 ** 70), "<=")])
def test_stack_runs_refuse_oversized_integers_before_torch(kw, match):
    from companion.stacks.residual import StackConfig, forward_sq_norms, last_layer_grad_norms
    cfg = StackConfig(d_model=8, n_layers=1, n_heads=2, d_ff=8, block="mlp")
    with pytest.raises(ValueError, match=match):  # old: C++ allocator/overflow messages (RuntimeError)
        forward_sq_norms(cfg, **kw)
    if "chunk" not in kw:
        with pytest.raises(ValueError, match=match):
            last_layer_grad_norms(cfg, **kw)
