"""Benchmarks of companion.transformers.stream and the injection engine, each ratio measured side by side in one run.

1. Injection sweep over every layer of SmolLM2 (goal: <= 0.33 x the naive loop).
   naive  = for each injection layer, one full model forward (``model(**enc,
            output_hidden_states=True)``, LM head included) with a forward hook on that block
            that adds the vector -- what one writes without the companion package;
   sweep  = ``engine.sweep_injections`` over the same layers (baseline included).
   Also reported: the sweep against a loop of ``stream.inject`` (no LM head, so the gain
   there comes only from the shared prefixes and the batching), and, where nnsight is installed
   (the ``interop`` extra), the same loop written with nnsight: one ``LanguageModel.trace`` per
   injection layer that adds the vector to the block's input or output and saves every block's
   output (skipped, and said so, without nnsight).
2. Capture overhead: ``stream.residual_stream`` against a plain forward of the same base
   model on the same tokens (goal: <= 1.10 x).
3. ``channel_stats.channel_statistics`` throughput (tokens per second) on each offline model.

Timings alternate between the contenders and the minimum over repetitions is kept, which is
robust to other processes sharing the CPU; process CPU time is reported beside the wall time
(on a shared machine, run with ``--threads 1``: CPU time is then unaffected by the other
processes).  Exit status 1 if the sweep goal is missed.

Run: ``.venv/bin/python benchmarks/bench_probes.py [--reps 3] [--texts 4] [--threads 2] [--sections 1,2,3]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

from companion.injection import engine
from companion.transformers import models
from companion.transformers import stream  # noqa: E402
from companion.corpus import corpus_sentences  # noqa: E402
from companion.outliers import channel_statistics as channel_stats

SWEEP_GOAL = 0.33
CAPTURE_GOAL = 1.10


def timed(fn):
    """Wall-clock and process CPU time of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def alternate(contenders: dict, reps: int) -> dict:
    """Run the contenders in turn ``reps`` times; the minimum wall time of each (and ``name_cpu``, CPU time)."""
    best = {k: float("inf") for k in contenders} | {f"{k}_cpu": float("inf") for k in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            wall, cpu = timed(fn)
            best[name] = min(best[name], wall)
            best[f"{name}_cpu"] = min(best[f"{name}_cpu"], cpu)
    return best


def naive_sweep(m, enc, layers, vector, scale):
    """One full forward (LM head included) per injection layer, with a hook on the real block."""
    delta = scale * vector * enc["attention_mask"].unsqueeze(-1).to(vector.dtype)
    outs = []
    for layer in layers:
        if layer == 0:
            def hook(module, args, kwargs):
                return (args[0] + delta, *args[1:]), kwargs
            handle = m.blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
        else:
            def hook(module, args, output):
                return output + delta
            handle = m.blocks[layer - 1].register_forward_hook(hook, prepend=True)
        try:
            with torch.no_grad():
                out = m.model(**enc, output_hidden_states=True, use_cache=False)
        finally:
            handle.remove()
        outs.append(out.hidden_states)
    return outs


def nnsight_sweep(lm, enc, layers, vector, scale, n_layers):
    """The naive loop written with nnsight: one trace per injection layer, every block output saved."""
    delta = scale * vector * enc["attention_mask"].unsqueeze(-1).to(vector.dtype)
    outs = []
    for layer in layers:
        saved = []                                           # filled inside the trace
        with torch.no_grad(), lm.trace(dict(enc)):
            blocks = lm.model.layers
            if layer == 0:
                blocks[0].input = blocks[0].input + delta
            for i in range(n_layers):                        # nnsight: in the order the model runs
                if i == layer - 1:
                    blocks[i].output[:] += delta
                saved.append(blocks[i].output.save())
        outs.append(saved)
    return outs


def nnsight_model(m):
    """``nnsight.LanguageModel`` around the same weights, or None when nnsight is not installed."""
    try:
        import nnsight
    except ImportError:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                     # nnsight 0.8 deprecates the class name
        return nnsight.LanguageModel(m.model, tokenizer=m.tokenizer)


def bench_sweep(m, texts, reps):
    enc = models.tokenize(m, texts)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(m.d_model, generator=g)
    v /= v.norm()
    layers = list(range(m.n_layers + 1))
    scale = 8.0
    # correctness first: the sweep reproduces the naive runs
    sw = engine.sweep_injections(m, enc, layers, v, scale)
    ref = naive_sweep(m, enc, [0, m.n_layers // 2], v, scale)
    real = enc["attention_mask"].bool()
    for k, layer in enumerate([0, m.n_layers // 2]):
        a, b = sw.injected[layer][m.n_layers - 1][real], ref[k][m.n_layers - 1][real]
        assert float((a - b).abs().max() / b.abs().max()) < 1e-4, "the sweep disagrees with the naive loop"
    contenders = {
        "naive": lambda: naive_sweep(m, enc, layers, v, scale),
        "inject": lambda: [stream.inject(m, enc, layer, v, scale) for layer in layers],
        "sweep": lambda: engine.sweep_injections(m, enc, layers, v, scale),
    }
    lm = nnsight_model(m)
    if lm is not None:
        got = nnsight_sweep(lm, enc, [m.n_layers // 2], v, scale, m.n_layers)[0][m.n_layers - 1]
        a = sw.injected[m.n_layers // 2][m.n_layers][real]        # h_L = output of the last block
        assert float((a - got[real]).abs().max() / a.abs().max()) < 1e-4, "nnsight disagrees with the sweep"
        contenders["nnsight"] = lambda: nnsight_sweep(lm, enc, layers, v, scale, m.n_layers)
    return enc, alternate(contenders, reps)


def bench_capture(m, texts, reps):
    enc = models.tokenize(m, texts)
    inputs = stream._forward_inputs(m, enc)

    def plain():
        with torch.no_grad():
            m.base(**inputs)

    return alternate({"plain": plain, "capture": lambda: stream.residual_stream(m, enc)}, reps)


def bench_statistics(m, texts, reps):
    thresholds = [0.5, 1, 2, 5, 10, 20, 50, 100]
    st = channel_stats.channel_statistics(m, texts, thresholds, batch_size=16)
    best = alternate({"stats": lambda: channel_stats.channel_statistics(m, texts, thresholds, batch_size=16)}, reps)
    return st.n_tokens, best["stats"], best["stats_cpu"]


def report_sweep(smol, sweep_texts, reps):
    enc, best = bench_sweep(smol, sweep_texts, reps)
    n_tok = int(enc["attention_mask"].sum())
    ratio = best["sweep"] / best["naive"]
    print(f"\n[1] injection sweep, SmolLM2, layers 0..{smol.n_layers} ({smol.n_layers + 1} runs), "
          f"{len(sweep_texts)} texts, {n_tok} tokens")
    for key, label in (("naive", "naive loop (full forward + hook per layer)"),
                       ("nnsight", "the same loop through nnsight (one trace per layer)"),
                       ("inject", "loop of stream.inject"), ("sweep", "engine.sweep_injections")):
        if key in best:
            print(f"    {label:52s} wall {best[key]:8.3f} s   cpu {best[key + '_cpu']:8.3f} s")
        else:
            print(f"    {label:52s} skipped: nnsight is not installed (pip install '.[interop]')")
    print(f"    ratio sweep / naive  = {ratio:.3f} wall, {best['sweep_cpu'] / best['naive_cpu']:.3f} cpu   "
          f"(goal <= {SWEEP_GOAL})  {'OK' if ratio <= SWEEP_GOAL else 'MISSED'}")
    print(f"    ratio sweep / inject = {best['sweep'] / best['inject']:.3f} wall, "
          f"{best['sweep_cpu'] / best['inject_cpu']:.3f} cpu")
    if "nnsight" in best:
        print(f"    ratio sweep / nnsight = {best['sweep'] / best['nnsight']:.3f} wall, "
              f"{best['sweep_cpu'] / best['nnsight_cpu']:.3f} cpu;  nnsight / naive = "
              f"{best['nnsight'] / best['naive']:.3f} wall")
    return ratio


def report_capture(models_, texts, reps):
    print("\n[2] capture overhead: residual_stream / plain forward of the base model")
    for m in models_:
        b = bench_capture(m, texts, reps)
        r = b["capture"] / b["plain"]
        print(f"    {m.name:13s} plain {b['plain']:.3f} s  capture {b['capture']:.3f} s  ratio {r:.3f} wall, "
              f"{b['capture_cpu'] / b['plain_cpu']:.3f} cpu  (goal <= {CAPTURE_GOAL})  "
              f"{'OK' if r <= CAPTURE_GOAL else 'MISSED'}")


def report_statistics(models_, texts, reps):
    print(f"\n[3] channel_statistics throughput ({len(texts)} texts, 8 thresholds, batch 16)")
    for m in models_:
        n, t, cpu = bench_statistics(m, texts, reps)
        print(f"    {m.name:13s} {n} tokens in {t:.3f} s = {n / t:,.0f} tokens/s  ({n / cpu:,.0f} per CPU-second)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per contender (minimum kept)")
    parser.add_argument("--texts", type=int, default=4, help="texts in the sweep batch")
    parser.add_argument("--stat-texts", type=int, default=64, help="texts for the statistics throughput")
    parser.add_argument("--capture-reps", type=int, default=7, help="repetitions for the (cheap) capture overhead")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--sections", default="1,2,3", help="which benchmarks to run, e.g. 2,3")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    smol = models.load("smollm2-135m", device="cpu")
    mini = models.load("minilm-l6", device="cpu")
    sweep_texts = corpus_sentences(args.texts, min_words=12, max_words=20)
    stat_texts = corpus_sentences(args.stat_texts, min_words=8, max_words=40)
    sections = {int(x) for x in args.sections.split(",")}
    print(f"torch {torch.__version__}, {args.threads} threads, min of {args.reps} alternating repetitions")

    ratio = 0.0
    if 1 in sections:
        ratio = report_sweep(smol, sweep_texts, args.reps)
    if 2 in sections:
        report_capture((smol, mini), stat_texts[:16], args.capture_reps)
    if 3 in sections:
        report_statistics((smol, mini), stat_texts, args.reps)
    return 0 if ratio <= SWEEP_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
