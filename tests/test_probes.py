"""companion.transformers.stream against transformers' own outputs and hand-written references (both offline models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.injection import engine
from companion.transformers import models
from companion.transformers import stream
from companion.outliers import channel_statistics as channel_stats

pytestmark = pytest.mark.slow

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "Let there be light: and there was light, and it was good in his sight.",
]


@pytest.fixture(scope="module", params=["smollm2-135m", "minilm-l6"])
def m(request):
    torch.manual_seed(0)
    return models.load(request.param, device="cpu")


@pytest.fixture(scope="module")
def minilm():
    return models.load("minilm-l6", device="cpu")


@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", device="cpu")


def _vector(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(m.d_model, generator=g)
    return v / v.norm()


def _hand_injected(m, enc, layer, delta):
    """Reference: a plain forward hook on the real block, read through output_hidden_states."""
    if layer == 0:
        def hook(module, args, kwargs):
            return (args[0] + delta, *args[1:]), kwargs
        handle = m.blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    else:
        def hook(module, args, output):
            return output + delta if not isinstance(output, tuple) else (output[0] + delta, *output[1:])
        handle = m.blocks[layer - 1].register_forward_hook(hook, prepend=True)  # before transformers' recorder
    try:
        with torch.no_grad():
            out = m.base(**stream._forward_inputs(m, enc), output_hidden_states=True)
    finally:
        handle.remove()
    return out.hidden_states


# --------------------------------------------------------------------------- residual_stream
def test_residual_stream_equals_output_hidden_states(m):
    enc = models.tokenize(m, TEXTS)
    hs = stream.residual_stream(m, enc)
    L = m.n_layers
    assert hs.shape == (L + 1, len(TEXTS), enc["input_ids"].shape[1], m.d_model)
    with torch.no_grad():
        ref = m.base(**stream._forward_inputs(m, enc), output_hidden_states=True).hidden_states
    assert len(ref) == L + 1
    for i in range(L):
        torch.testing.assert_close(hs[i], ref[i], rtol=0, atol=0)
    if m.placement == "pre":
        # transformers' last hidden state is the final norm of the raw last-block output
        assert not torch.allclose(hs[L], ref[L])
        torch.testing.assert_close(m.final_norm(hs[L]), ref[L], rtol=0, atol=0)
    else:
        torch.testing.assert_close(hs[L], ref[L], rtol=0, atol=0)


def test_residual_stream_accepts_texts_and_padding_is_harmless(m):
    full = stream.residual_stream(m, TEXTS)
    mask = models.tokenize(m, TEXTS)["attention_mask"]
    for b, text in enumerate(TEXTS):
        alone = stream.residual_stream(m, [text])[:, 0]
        n = int(mask[b].sum())
        assert alone.shape[1] == n
        torch.testing.assert_close(full[:, b, :n], alone, rtol=1e-4, atol=1e-3)


# --------------------------------------------------------------------------- inject
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_inject_matches_hand_written_hook(m, where):
    L = m.n_layers
    layer = {"first": 0, "middle": L // 2, "last": L}[where]
    enc = models.tokenize(m, TEXTS)
    v = _vector(m)
    scale = 5.0
    got = stream.inject(m, enc, layer, v, scale=scale)
    delta = scale * v * enc["attention_mask"].unsqueeze(-1).float()
    ref = _hand_injected(m, enc, layer, delta)
    base = stream.residual_stream(m, enc)
    for i in range(L):
        torch.testing.assert_close(got[i], ref[i], rtol=0, atol=0)
    last = m.final_norm(got[L]) if m.placement == "pre" else got[L]
    torch.testing.assert_close(last, ref[L], rtol=0, atol=0)
    # before the injection layer nothing changes; at it, exactly scale * v is added
    torch.testing.assert_close(got[:layer], base[:layer], rtol=0, atol=0)
    torch.testing.assert_close(got[layer] - base[layer], delta, rtol=1e-5, atol=1e-4 * float(base[layer].abs().max()))
    if layer < L:
        assert float((got[L] - base[L]).abs().max()) > 0


def test_inject_positions(m):
    enc = models.tokenize(m, TEXTS)
    mask = enc["attention_mask"]
    v = _vector(m, 1)
    layer = 2
    got = stream.inject(m, enc, layer, v, scale=3.0, positions=[-1])
    sel = stream.position_mask(mask, [-1])
    assert sel.sum() == len(TEXTS)
    last = mask.sum(1) - 1
    assert all(bool(sel[b, last[b]]) for b in range(len(TEXTS)))
    ref = _hand_injected(m, enc, layer, 3.0 * v * sel.unsqueeze(-1).float())
    for i in range(m.n_layers):
        torch.testing.assert_close(got[i], ref[i], rtol=0, atol=0)
    # the same through an explicit boolean mask
    again = stream.inject(m, enc, layer, v, scale=3.0, positions=sel.numpy())
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    if m.placement == "pre":  # causal: tokens before the last one are untouched at every layer
        base = stream.residual_stream(m, enc)
        first = int(last.min())
        torch.testing.assert_close(got[:, :, :first], base[:, :, :first], rtol=0, atol=0)


def test_position_mask_rules():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert stream.position_mask(mask).tolist() == mask.bool().tolist()
    assert stream.position_mask(mask, [0, -1]).int().tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    assert stream.position_mask(mask, 1).int().tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]
    with pytest.raises(ValueError, match="outside text 1"):
        stream.position_mask(mask, [3])
    with pytest.raises(ValueError, match="outside"):
        stream.position_mask(mask, [-3])
    with pytest.raises(ValueError, match="empty"):
        stream.position_mask(mask, [])
    with pytest.raises(ValueError, match="shape"):
        stream.position_mask(mask, np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="no real token"):
        stream.position_mask(mask, np.array([[0, 0, 0, 0], [0, 0, 1, 1]], dtype=bool))
    with pytest.raises(TypeError):
        stream.position_mask(mask, "last")
    with pytest.raises(TypeError):
        stream.position_mask(mask, [0.5])


# --------------------------------------------------------------------------- injection_sweep
def test_injection_sweep_equals_individual_injections_minilm(minilm):
    m = minilm
    enc = models.tokenize(m, TEXTS)
    v = _vector(m, 2)
    scales = [0.5, 4.0]
    sw = engine.sweep_injections(m, enc, "all", v, scale=scales, max_batch_tokens=3 * enc["input_ids"].numel())
    L = m.n_layers
    assert sw.injected.shape == (L + 1, 2, L + 1, *enc["input_ids"].shape, m.d_model)
    assert sw.layers.tolist() == list(range(L + 1)) and sw.scales.tolist() == [0.5, 4.0]
    torch.testing.assert_close(sw.baseline, stream.residual_stream(m, enc), rtol=0, atol=0)
    real = enc["attention_mask"].bool()
    for j, layer in enumerate(sw.layers):
        for s, c in enumerate(scales):
            ref = stream.inject(m, enc, layer, v, scale=c)
            torch.testing.assert_close(sw.injected[j, s][:, real], ref[:, real], rtol=1e-4, atol=1e-4)


def test_injection_sweep_equals_individual_injections_smollm2(smol):
    m = smol
    L = m.n_layers
    texts = TEXTS[:2]
    enc = models.tokenize(m, texts)
    layers = [0, 7, L - 1, L]
    g = torch.Generator().manual_seed(3)
    vecs = torch.randn(len(layers), m.d_model, generator=g)
    sw = engine.sweep_injections(m, enc, layers, vecs, scale=2.0, positions=[0, 1])
    assert sw.injected.shape == (len(layers), L + 1, *enc["input_ids"].shape, m.d_model)
    real = enc["attention_mask"].bool()
    for j, layer in enumerate(layers):
        ref = stream.inject(m, enc, layer, vecs[j], scale=2.0, positions=[0, 1])
        scale_ref = ref[:, real].abs().amax(dim=(1, 2), keepdim=True)
        err = (sw.injected[j][:, real] - ref[:, real]).abs() / scale_ref
        assert float(err.max()) < 1e-4


def test_injection_sweep_measure_matches_full_streams(smol):
    m = smol
    enc = models.tokenize(m, TEXTS)
    v = _vector(m, 4)

    def measure(h_inj, h_base):  # distance to the baseline at the last real token of each text
        last = enc["attention_mask"].sum(1) - 1
        idx = torch.arange(h_base.shape[0])
        return (h_inj[:, idx, last] - h_base[idx, last]).norm(dim=-1)

    layers = [1, 3, 5]
    full = engine.sweep_injections(m, enc, layers, v, scale=[1.0, 10.0], max_batch_tokens=1)
    red = engine.sweep_injections(m, enc, layers, v, scale=[1.0, 10.0], measure=measure)
    assert red.injected.shape == (3, 2, m.n_layers + 1, len(TEXTS))
    last = enc["attention_mask"].sum(1) - 1
    idx = torch.arange(len(TEXTS))
    ref = (full.injected[..., idx, last, :] - full.baseline[:, idx, last]).norm(dim=-1)
    torch.testing.assert_close(red.injected, ref, rtol=1e-4, atol=1e-3)
    # before the injection layer the runs coincide
    assert float(red.injected[1, :, :3].abs().max()) == 0.0

    seen = []

    def measure4(h_inj, h_base, layer, conditions):  # projection on v divided by the run's own scale
        seen.append(layer)
        c = torch.tensor([1.0, 10.0])[conditions[:, 1]]
        return ((h_inj - h_base) @ v)[:, :, 0] / c[:, None]

    proj = engine.sweep_injections(m, enc, layers, v, scale=[1.0, 10.0], measure=measure4)
    assert sorted(set(seen)) == list(range(m.n_layers + 1))
    ref = ((full.injected[..., 0, :] - full.baseline[:, :, 0]) @ v) / torch.tensor([1.0, 10.0]).view(1, 2, 1, 1)
    torch.testing.assert_close(proj.injected, ref, rtol=1e-4, atol=1e-3)
    for j, layer in enumerate(layers):  # exactly 1 at the injection layer, 0 before it
        torch.testing.assert_close(proj.injected[j, :, layer], torch.ones(2, len(TEXTS)), rtol=1e-4, atol=1e-4)
        assert float(proj.injected[j, :, :layer].abs().max()) == 0.0  # layers are >= 1 here


# --------------------------------------------------------------------------- channel_statistics
def _direct_statistics(m, texts, thresholds, skip_first):
    enc = models.tokenize(m, texts)
    keep = enc["attention_mask"].bool()
    if skip_first:
        keep[:, 0] = False
    x = stream.residual_stream(m, enc)[:, keep].double()
    t = torch.as_tensor(thresholds, dtype=torch.float64)
    counts = (x.abs().unsqueeze(2) > t.view(1, 1, -1, 1)).sum(1)  # [L+1, n_thr, d]
    return dict(mean=x.mean(1), var=x.var(1, unbiased=False), max_abs=x.abs().amax(1),
                min=x.amin(1), max=x.amax(1), counts=counts, n=int(keep.sum()))


@pytest.mark.parametrize("skip_first", [False, True])
def test_channel_statistics_equals_direct_computation(m, skip_first):
    texts = TEXTS + ["Short one.", "A much longer sentence, which is here to make the padding matter a great deal more."]
    thresholds = [0.0, 0.5, 2.0, 10.0]
    st = channel_stats.channel_statistics(m, texts, thresholds, batch_size=2, skip_first=skip_first)
    ref = _direct_statistics(m, texts, thresholds, skip_first)
    L1, d = m.n_layers + 1, m.d_model
    assert st.mean.shape == (L1, d) and st.counts.shape == (L1, len(thresholds), d)
    assert st.n_tokens == ref["n"] and st.n_texts == len(texts) and st.skip_first is skip_first
    scale = np.maximum(ref["max_abs"].numpy(), 1.0)
    for key in ("mean", "min", "max", "max_abs"):
        np.testing.assert_allclose(st.__getattribute__(key) / scale, ref[key].numpy() / scale, rtol=0, atol=2e-5)
    assert np.all(np.abs(st.var - ref["var"].numpy()) <= 2e-4 * ref["var"].numpy() + 1e-8 * scale**2)
    # counts may differ only where a value sits within float noise of a threshold
    diff = np.abs(st.counts - ref["counts"].numpy())
    assert diff.max() <= 1 and diff.sum() <= 3
    assert (st.counts[:, 0] <= st.n_tokens).all()
    assert np.all(np.diff(st.counts, axis=1) <= 0)  # C_j(t) is non-increasing in t


def test_channel_statistics_batch_size_invariance(minilm):
    a = channel_stats.channel_statistics(minilm, TEXTS * 3, [1.0, 3.0], batch_size=1)
    b = channel_stats.channel_statistics(minilm, TEXTS * 3, [1.0, 3.0], batch_size=16)
    np.testing.assert_allclose(a.mean, b.mean, atol=1e-5)
    np.testing.assert_allclose(a.var, b.var, rtol=1e-4, atol=1e-5)
    assert a.n_tokens == b.n_tokens
    np.testing.assert_allclose(a.std, np.sqrt(b.var), rtol=1e-4, atol=1e-4)
    assert set(a.arrays()) == {"mean", "var", "min", "max", "max_abs", "counts", "thresholds"}


# --------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise(minilm):
    m = minilm
    v = _vector(m)
    L = m.n_layers
    with pytest.raises(ValueError, match=r"layer must be in \[0, 6\]"):
        stream.inject(m, TEXTS, L + 1, v)
    with pytest.raises(ValueError, match="layer must be in"):
        stream.inject(m, TEXTS, -1, v)
    with pytest.raises(TypeError, match="integer"):
        stream.inject(m, TEXTS, 1.5, v)
    with pytest.raises(ValueError, match="shape"):
        stream.inject(m, TEXTS, 1, torch.ones(m.d_model + 1))
    with pytest.raises(ValueError, match="NaN"):
        stream.inject(m, TEXTS, 1, torch.full((m.d_model,), float("nan")))
    with pytest.raises(TypeError, match="vector"):
        stream.inject(m, TEXTS, 1, "v")
    with pytest.raises(TypeError, match="vector"):
        stream.inject(m, TEXTS, 1, torch.ones(m.d_model, dtype=torch.bool))
    # a list of numbers is a vector like any other (as for the stacks)
    torch.testing.assert_close(stream.inject(m, TEXTS[:1], 1, v.tolist()), stream.inject(m, TEXTS[:1], 1, v))
    with pytest.raises(ValueError, match="finite"):
        stream.inject(m, TEXTS, 1, v, scale=float("inf"))
    with pytest.raises(TypeError, match="scale"):
        stream.inject(m, TEXTS, 1, v, scale="big")
    with pytest.raises(ValueError, match="empty"):
        stream.inject(m, [], 1, v)
    with pytest.raises(ValueError, match="empty"):
        stream.residual_stream(m, [])
    with pytest.raises(ValueError, match="empty"):
        stream.residual_stream(m, ["fine", "  "])
    with pytest.raises(TypeError, match="string"):
        stream.residual_stream(m, [3])
    with pytest.raises(TypeError, match="LoadedModel"):
        stream.residual_stream(m.model, TEXTS)
    with pytest.raises(ValueError, match="outside"):
        stream.inject(m, TEXTS, 1, v, positions=[200])
    with pytest.raises(ValueError, match="repeats"):
        engine.sweep_injections(m, TEXTS, [1, 1], v)
    with pytest.raises(ValueError, match="in \\[0, 6\\]"):
        engine.sweep_injections(m, TEXTS, [0, 7], v)
    with pytest.raises(ValueError, match="non-empty"):
        engine.sweep_injections(m, TEXTS, [], v)
    with pytest.raises(ValueError, match="'all'"):
        engine.sweep_injections(m, TEXTS, "every", v)
    with pytest.raises(ValueError, match="shape"):
        engine.sweep_injections(m, TEXTS, [1, 2], torch.ones(3, m.d_model))
    with pytest.raises(ValueError, match="non-empty"):
        engine.sweep_injections(m, TEXTS, [1], v, scale=[])
    with pytest.raises(ValueError, match="finite"):
        engine.sweep_injections(m, TEXTS, [1], v, scale=[1.0, float("nan")])
    with pytest.raises(TypeError, match="callable"):
        engine.sweep_injections(m, TEXTS, [1], v, measure="norm")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        engine.sweep_injections(m, TEXTS, [1], v, max_batch_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        engine.sweep_injections(m, [], [1], v)
    with pytest.raises(ValueError, match=">= 0"):
        channel_stats.channel_statistics(m, TEXTS, [-1.0])
    with pytest.raises(ValueError, match="finite"):
        channel_stats.channel_statistics(m, TEXTS, [float("nan")])
    with pytest.raises(ValueError, match="non-empty"):
        channel_stats.channel_statistics(m, TEXTS, [])
    with pytest.raises(TypeError, match="thresholds"):
        channel_stats.channel_statistics(m, TEXTS, ["a"])
    with pytest.raises(ValueError, match="batch_size"):
        channel_stats.channel_statistics(m, TEXTS, [1.0], batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        channel_stats.channel_statistics(m, TEXTS, [1.0], batch_size=2.0)
    with pytest.raises(ValueError, match="empty"):
        channel_stats.channel_statistics(m, [], [1.0])
    with pytest.raises(ValueError, match="empty"):
        channel_stats.channel_statistics(m, ["ok", ""], [1.0])
    with pytest.raises(TypeError, match="skip_first"):
        channel_stats.channel_statistics(m, TEXTS, [1.0], skip_first="yes")


# --------------------------------------------------------------------------- extreme inputs
def test_channel_statistics_of_a_constant_channel(minilm, monkeypatch):
    """A channel holding one value at every token has that mean and variance 0 exactly.

    Rounded batch means of 0.1 are not 0.1: the Chan merge left a variance near 1e-34 and the
    mean an ulp off, so a "constant" channel got sigma ~ 1e-17 (and passed sigma > 0 checks).
    """
    real_run = channel_stats.forward_states

    def run_with_constant_channel(m, enc, **kw):  # a float64 stream whose channel 0 is 0.1
        return [h.double().index_fill(-1, torch.tensor([0]), 0.1) for h in real_run(m, enc, **kw)]

    monkeypatch.setattr(channel_stats, "forward_states", run_with_constant_channel)
    st = channel_stats.channel_statistics(minilm, TEXTS, [0.05, 1.0], batch_size=1)
    assert np.all(st.mean[:, 0] == 0.1) and np.all(st.var[:, 0] == 0.0)
    assert np.all(st.var[:, 1:] > 0)
    assert np.all((st.min <= st.mean) & (st.mean <= st.max))


def test_vectors_that_overflow_the_model_dtype_are_refused(minilm):
    """Finite in float64, inf after the cast to the model's float32: the stream became NaN."""
    big = np.full(minilm.d_model, 1e39)
    with pytest.raises(ValueError, match="torch.float32"):
        stream.inject(minilm, TEXTS[:1], 1, big)
    with pytest.raises(ValueError, match="torch.float32"):
        engine.sweep_injections(minilm, TEXTS[:1], [1, 2], big)
    v = _vector(minilm)
    with pytest.raises(ValueError, match="torch.float32"):  # scale * vector overflows float32
        stream.inject(minilm, TEXTS[:1], 1, v, scale=1e39)
    with pytest.raises(ValueError, match="torch.float32"):
        engine.sweep_injections(minilm, TEXTS[:1], [1, 2], v, scale=[1.0, 1e39])
