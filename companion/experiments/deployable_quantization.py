"""The ``deployable_quantization`` experiment: deployable schemes and baselines drawn many times.

SmolLM2-135M is calibrated on 8 paragraphs of Acts and evaluated on held-out paragraphs of four other
books of the corpus.  Every scheme is one a deployed integer kernel runs: weights per tensor or per
output channel (static), activations per token (dynamic) or per tensor (static ranges from the
calibration split); SmoothQuant's α is chosen on the calibration split; the rotation baseline
rotates every linear input by a random Hadamard-based orthogonal matrix (the residual basis, with the
RMSNorm gain folded in, and online rotations of the ``o_proj`` and ``down_proj`` inputs); Nagel et
al.'s bias correction comes with per-layer diagnostics and a sequential variant, and their
cross-layer equalisation is applied to ``v_proj → o_proj`` and ``up_proj → down_proj``.  Chance
baselines are drawn many times: random block sets for mixed precision, random pruning seeds.  The
chapter *Applications* renders the Result (its lab notes the full tables).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from companion._paths import package_data
from companion._validation import check_int
from companion.applications import pruning
from companion.applications.model_quantization import (
    LinearQuantization, equalized_linears, quantized_linears, weight_bias_correction)
from companion.applications.quantization import quantize_weight, random_rotation, smoothquant_scales
from companion.experiments import register
from companion.experiments.compression_sweep import SITES, CompressionBench
from companion.transformers import models

__all__ = ["DeployableQuantizationExperiment", "MixedPrecisionBaselinesExperiment", "PruningBaselinesExperiment",
           "QuantizationSensitivityExperiment", "book_paragraphs", "equalization_pairs", "rotation_plan",
           "SCHEMES"]

#: Whole-model schemes in table order; "(reference)" marks the one no deployed kernel runs.
SCHEMES = ("W8 per-channel", "W8 per-tensor", "W4 per-channel", "W4 per-tensor",
           "W4 per-channel, bias corr", "W4 per-channel, bias corr sequential", "W4 per-tensor, CLE",
           "A8 per-tensor static", "A8 per-token", "A4 per-token", "A4 per-token, centred on mean",
           "A4 per-token, rotated", "A4 per-channel dynamic (reference)",
           "W8A8 per-token", "W8A8 per-tensor static", "W8A8 per-tensor static, centred on mean",
           "W8A8 per-tensor static, SQ", "W8A8 per-tensor static, rotated", "W8A8 per-tensor static, CLE",
           "W4A8 per-token", "W4A8 per-token, rotated")


def book_paragraphs(min_chars: int = 40) -> dict[str, list[str]]:
    """The corpus paragraphs of each book (file stem), whitespace-normalised, in file order."""
    env = os.environ.get("COMPANION_DATA")            # the corpus folder, as companion.corpus finds it
    folder = Path(env).expanduser() if env else package_data("corpus")
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise ValueError(f"no .txt files in {folder}; the corpus is listed in companion/data/corpus/SOURCES.md")
    out = {}
    for f in files:
        text = f.read_text(encoding="utf-8").replace("\r\n", "\n")
        paras = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip())
        out[f.stem] = [p for p in paras if len(p) >= min_chars]
    return out


def _blocks(model):
    """The decoder blocks of a Llama-style causal LM (``model.model.layers``)."""
    return model.model.layers


def equalization_pairs(model) -> list[tuple]:
    """The pairs of :func:`~companion.applications.model_quantization.equalized_linears` of a Llama-style
    model: ``v_proj → o_proj`` (with the grouped-query map) and ``up_proj → down_proj`` of every block."""
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    reads_o = np.array([(k // hd) // group * hd + k % hd for k in range(cfg.num_attention_heads * hd)])
    pairs = []
    for blk in _blocks(model):
        pairs.append((blk.self_attn.v_proj, blk.self_attn.o_proj, reads_o))
        pairs.append((blk.mlp.up_proj, blk.mlp.down_proj, None))
    return pairs


def rotation_plan(model, linears, seed: int = 0) -> tuple[dict, dict]:
    """``(smooth, rotate)`` for :func:`~companion.applications.model_quantization.quantized_linears`:
    the rotation baseline of a Llama-style model.

    The inputs of ``q/k/v_proj`` and ``gate/up_proj`` are divided by ``|γ|`` of the RMSNorm before
    them (the gain folded into the weight: what is quantised is the normalised residual, up to signs)
    and rotated by one random orthogonal matrix of the residual width; the inputs of ``o_proj`` and
    ``down_proj`` get their own (online) rotations.  The float model's output is unchanged.
    """
    cfg = model.config
    d_o = linears[next(n for n in linears if n.endswith("o_proj"))].in_features
    rot = {"res": random_rotation(cfg.hidden_size, seed), "o": random_rotation(d_o, seed + 1),
           "down": random_rotation(cfg.intermediate_size, seed + 2)}
    smooth, rotate = {}, {}
    blocks = _blocks(model)
    for n in linears:
        ell, kind = int(n.split(".")[2]), n.split(".")[-1]
        if kind in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            norm = blocks[ell].input_layernorm if kind[0] in "qkv" else blocks[ell].post_attention_layernorm
            # x / |gamma| is the normalised residual up to signs (an orthogonal map), so the
            # quantised input is the normalised residual, rotated
            gamma = np.abs(norm.weight.detach().double().cpu().numpy())
            if (gamma == 0).any():
                raise ValueError(f"block {ell}: a zero RMSNorm gain cannot be folded")
            smooth[n], rotate[n] = gamma, rot["res"]
        else:
            rotate[n] = rot["o" if kind == "o_proj" else "down"]
    return smooth, rotate


def _a_spec(bits, g, static=False, wb=None) -> LinearQuantization:
    """Activations at ``bits`` with granularity ``g`` (static per tensor or dynamic), weights at ``wb``."""
    return LinearQuantization(act_bits=bits, act_granularity=g, static=static, weight_bits=wb)


def _setup(cfg, device):
    """The model, the bench (calibration: Acts; evaluation: the held-out books) and the first arrays
    of a config with the fields ``model, n_calib, eval_books, n_per_book, seq_len, dtype``."""
    check_int(cfg.n_calib, "n_calib", 2)
    check_int(cfg.n_per_book, "n_per_book", 1)
    m = models.load(cfg.model, device=device, dtype=cfg.dtype)
    books = book_paragraphs()
    unknown = sorted(set(cfg.eval_books) - set(books))
    if unknown or "kjv_acts" in cfg.eval_books:
        raise ValueError(f"eval_books must be corpus books other than kjv_acts; got {unknown or 'kjv_acts'}")

    def long(ps, k):
        return [p for p in ps if len(m.tokenizer(p)["input_ids"]) >= cfg.seq_len][:k]

    calib = long(books["kjv_acts"], cfg.n_calib)
    evals = [p for b in cfg.eval_books for p in long(books[b], cfg.n_per_book)]
    bench = CompressionBench(m, calib, evals, cfg.seq_len)
    L, lin = len(m.model.model.layers), bench.linears
    out: dict = {"base_loss": bench.base_loss, "eval_book": [b for b in cfg.eval_books
                                                              for _ in range(cfg.n_per_book)]}
    return m, bench, L, lin, out


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted inputs are seen."""


def _block_input_means(m, batch, mods, block) -> dict[str, np.ndarray]:
    """Mean input of each layer in ``mods`` (all in one block) over the batch's tokens; stops after it."""
    sums = {}

    def make(name):
        def hook(_m, args):
            x = args[0].detach().double()
            sums[name] = x.reshape(-1, x.shape[-1]).mean(0).cpu().numpy()
        return hook

    def stop(*_a):
        raise _Stop

    handles = [mod.register_forward_pre_hook(make(n)) for n, mod in mods.items()]
    handles.append(block.register_forward_hook(stop))
    try:
        with torch.no_grad():
            m.model(**batch, use_cache=False)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return sums


@register("deployable_quantization", schema=1)
@dataclass(frozen=True)
class DeployableQuantizationExperiment:
    """Deployable quantisation, bias correction, equalisation and rotation on held-out books.

    Per-text arrays (``[scheme, eval text]``): ``loss``, ``kl`` of ``schemes``.  Per block: ``mean_err``
    (squared norm of the mean
    error of the block's output over the squared norm of the float output, averaged over tokens),
    ``rel_mse``.  Diagnostics: ``alpha_calib_kl``, ``bc_local`` (per layer output-mean error on the
    evaluation split before / after correction, and the change of the output MSE).
    """

    model: str = "smollm2-135m"  #: a causal LM for :func:`~companion.transformers.models.load`
    n_calib: int = 8  #: calibration texts: the first paragraphs of Acts with >= ``seq_len`` tokens
    eval_books: tuple[str, ...] = ("kjv_genesis", "kjv_mark", "kjv_esther", "kjv_ruth")
    n_per_book: int = 4  #: evaluation texts per book (its first paragraphs with >= ``seq_len`` tokens)
    seq_len: int = 64
    dtype: str = "float32"  #: compute type
    alphas: tuple[float, ...] = (0.25, 0.5, 0.65, 0.8, 0.9)  #: SmoothQuant α tried on the calibration split
    rotation_seed: int = 0

    def compute(self, device, progress):
        """Run the experiment; returns the Result's arrays and scalars."""
        m, bench, L, lin, out = _setup(self, device)
        results = {}
        a_spec = _a_spec

        def record(name, ctx):
            results[name] = bench.measure(ctx)

        w_spec = {(b, g): LinearQuantization(act_bits=None, weight_bits=b, weight_granularity=g)
                  for b in (8, 4) for g in ("channel", "tensor")}
        # ---- weights only
        for b in (8, 4):
            for g in ("channel", "tensor"):
                record(f"W{b} per-{g}", quantized_linears(lin, w_spec[b, g]))
        mu_cal = {n: bench.stats[n].mean for n in lin}
        wq = {n: quantize_weight(mod.weight.detach(), 4).double().cpu().numpy() for n, mod in lin.items()}
        shift = {n: weight_bias_correction(mod.weight, wq[n], mu_cal[n]) for n, mod in lin.items()}
        record("W4 per-channel, bias corr", quantized_linears(lin, w_spec[4, "channel"], output_shift=shift))
        # sequential: block by block, E[x] from the model whose earlier blocks are quantised and corrected
        seq_shift: dict = {}
        blocks = _blocks(m.model)
        for ell in range(L):
            mods = bench.modules(layers=[ell])
            with quantized_linears(lin, w_spec[4, "channel"], output_shift=seq_shift):
                means = _block_input_means(m, bench.calib, mods, blocks[ell])
            seq_shift.update({n: weight_bias_correction(lin[n].weight, wq[n], means[n]) for n in mods})
        record("W4 per-channel, bias corr sequential",
               quantized_linears(lin, w_spec[4, "channel"], output_shift=seq_shift))
        # local diagnostics on the evaluation split (float inputs): output-mean error and MSE change
        eval_stats = pruning.linear_input_statistics(m.model, [bench.eval], lin)
        bc_local = []
        for n in lin:
            dw = wq[n] - lin[n].weight.detach().double().cpu().numpy()
            before = dw @ eval_stats[n].mean
            corr = shift[n]
            after = before - corr
            bc_local.append([float(before @ before), float(after @ after),
                             float(corr @ corr - 2 * corr @ before),          # exact change of E|e - corr|^2
                             float(((dw ** 2) @ eval_stats[n].second_moment).sum())])  # diagonal E|e|^2
        out["bc_local"] = np.array(bc_local)        # [layer, (|mean err|^2 before, after, dMSE, diag MSE)]
        out["bc_layers"] = list(lin)
        # cross-layer equalisation: v -> o (grouped-query map), up -> down
        pairs = equalization_pairs(m.model)
        with equalized_linears(pairs):
            record("W4 per-tensor, CLE", quantized_linears(lin, w_spec[4, "tensor"]))
            cle_stats = pruning.linear_input_statistics(m.model, [bench.calib], lin)
        # ---- activations
        ranges = bench.static_ranges(lin)
        record("A8 per-tensor static", quantized_linears(lin, a_spec(8, "tensor", True), ranges=ranges))
        record("A8 per-token", quantized_linears(lin, a_spec(8, "token")))
        record("A4 per-token", quantized_linears(lin, a_spec(4, "token")))
        record("A4 per-token, centred on mean", quantized_linears(lin, a_spec(4, "token"), center=mu_cal))
        # rotation: residual readers share one rotation (RMSNorm gain folded in), o and down online
        smooth_rot, rotate = rotation_plan(m.model, lin, self.rotation_seed)
        with quantized_linears(lin, LinearQuantization(act_bits=None), smooth=smooth_rot, rotate=rotate):
            rot_stats = pruning.linear_input_statistics(m.model, [bench.calib], lin)
        rot_ranges = {n: (-max(abs(s.min.min()), s.max.max()), max(abs(s.min.min()), s.max.max()))
                      for n, s in rot_stats.items()}
        rot_kw = {"smooth": smooth_rot, "rotate": rotate}
        record("A4 per-token, rotated", quantized_linears(lin, a_spec(4, "token"), **rot_kw))
        record("A4 per-channel dynamic (reference)", quantized_linears(lin, a_spec(4, "channel")))
        record("W8A8 per-token", quantized_linears(lin, a_spec(8, "token", wb=8)))
        record("W8A8 per-tensor static", quantized_linears(lin, a_spec(8, "tensor", True, 8), ranges=ranges))
        c_ranges = {}
        for n, s in bench.stats.items():
            r = float(max(np.abs(s.min - s.mean).max(), np.abs(s.max - s.mean).max()))
            c_ranges[n] = (-r, r)
        record("W8A8 per-tensor static, centred on mean",
               quantized_linears(lin, a_spec(8, "tensor", True, 8), ranges=c_ranges, center=mu_cal))
        # SmoothQuant: alpha chosen on the calibration split (mean KL), then evaluated once
        calib_kl = []
        for a in self.alphas:
            sm = {n: smoothquant_scales(bench.stats[n].max_abs, mod.weight, a) for n, mod in lin.items()}
            ctx = quantized_linears(lin, a_spec(8, "tensor", True, 8), ranges=bench.static_ranges(lin, smooth=sm),
                                    smooth=sm)
            calib_kl.append(float(bench.measure(ctx, split="calib")["kl"].mean()))
        best = self.alphas[int(np.argmin(calib_kl))]
        sm = {n: smoothquant_scales(bench.stats[n].max_abs, mod.weight, best) for n, mod in lin.items()}
        record("W8A8 per-tensor static, SQ", quantized_linears(
            lin, a_spec(8, "tensor", True, 8), ranges=bench.static_ranges(lin, smooth=sm), smooth=sm))
        out["alpha_calib_kl"], out["alpha_chosen"] = np.array(calib_kl), float(best)
        record("W8A8 per-tensor static, rotated",
               quantized_linears(lin, a_spec(8, "tensor", True, 8), ranges=rot_ranges, **rot_kw))
        cle_ranges = {}
        for n, s in cle_stats.items():
            r = float(s.max_abs.max())
            cle_ranges[n] = (-r, r)
        with equalized_linears(pairs):
            record("W8A8 per-tensor static, CLE",
                   quantized_linears(lin, a_spec(8, "tensor", True, 8), ranges=cle_ranges))
        record("W4A8 per-token", quantized_linears(lin, a_spec(8, "token", wb=4)))
        record("W4A8 per-token, rotated", quantized_linears(lin, a_spec(8, "token", wb=4), **rot_kw))
        assert tuple(results) == tuple(sorted(results, key=SCHEMES.index))
        out["schemes"] = list(SCHEMES)
        for key in ("loss", "kl", "rel_mse", "mean_err"):
            out[key] = np.array([results[n][key] for n in SCHEMES])
        out.update(**m.facts())
        return out


@register("mixed_precision_baselines", schema=1)
@dataclass(frozen=True)
class MixedPrecisionBaselinesExperiment:
    """Mixed precision on the held-out books: blocks kept at ``high_bits`` chosen by each rule, against
    ``n_random_sets`` random block sets (chance, drawn many times).

    Arrays: ``mixed_loss [rule or random set, text]`` (``mixed_rules`` first, then the random sets of
    ``mixed_sets``); per block ``layer_kl`` (calibration split; reused from the stored
    ``compression_sweep`` Result), ``layer_mean_share``, ``layer_range``.
    """

    model: str = "smollm2-135m"  #: a causal LM for :func:`~companion.transformers.models.load`
    n_calib: int = 8  #: calibration texts: the first paragraphs of Acts with >= ``seq_len`` tokens
    eval_books: tuple[str, ...] = ("kjv_genesis", "kjv_mark", "kjv_esther", "kjv_ruth")
    n_per_book: int = 4  #: evaluation texts per book (its first paragraphs with >= ``seq_len`` tokens)
    seq_len: int = 64
    dtype: str = "float32"  #: compute type
    low_bits: int = 4  #: per-token dynamic activations at ``low_bits``...
    high_bits: int = 8  #: ... and the chosen blocks at ``high_bits``
    keep_layers: int = 6
    n_random_sets: int = 50  #: random block sets

    def compute(self, device, progress):
        """Run the experiment; returns the Result's arrays and scalars."""
        check_int(self.n_random_sets, "n_random_sets", 2)
        m, bench, L, lin, out = _setup(self, device)
        a_spec = _a_spec
        # ---- mixed precision: rules and random block sets.  The per-layer sensitivity (KL on the
        # calibration split with only block l at int4 per token) is reused from the stored
        # compression_sweep Result, which measured it on the same calibration texts
        from companion import experiments as xp

        lo, hi = self.low_bits, self.high_bits
        sweep = xp.run_cached(xp.make_config("compression_sweep"))
        if (sweep.config["model"], sweep.config["n_calib"], sweep.config["seq_len"], sweep.config["low_bits"]) != (
                self.model, self.n_calib, self.seq_len, lo):
            raise ValueError("the stored compression_sweep sensitivities were measured on another set-up")
        layer_kl = np.asarray(sweep.arrays["layer_kl"], dtype=float)
        share, rng_ = bench.block_input_statistics(L)
        k = check_int(self.keep_layers, "keep_layers", 1, L - 1)
        rules = {"sensitivity (calibration KL)": np.argsort(-layer_kl, kind="stable")[:k],
                 "largest mean share (the note)": np.argsort(-share, kind="stable")[:k],
                 "largest range": np.argsort(-rng_, kind="stable")[:k]}
        gen = np.random.default_rng(0)
        sets = [sorted(int(c) for c in chosen) for chosen in rules.values()]
        sets += [sorted(int(c) for c in gen.choice(L, k, replace=False)) for _ in range(self.n_random_sets)]
        mixed = []
        for chosen in sets:
            high = bench.modules(layers=set(chosen))
            low = {n: mod for n, mod in lin.items() if n not in high}
            with quantized_linears(high, a_spec(hi, "token")):
                mixed.append(bench.measure(quantized_linears(low, a_spec(lo, "token")))["loss"])
        out.update(layer_kl=layer_kl, layer_mean_share=share, layer_range=rng_,
                   mixed_rules=list(rules), mixed_sets=np.array(sets), mixed_loss=np.array(mixed))
        out.update(**m.facts())
        return out


@register("pruning_baselines", schema=1)
@dataclass(frozen=True)
class PruningBaselinesExperiment:
    """Pruning the MLP neurons of every block on the held-out books: scores, with and without mean
    compensation, against ``n_prune_seeds`` random draws (chance, drawn many times).

    Arrays: ``prune_loss [score, (removed, mean comp.), fraction, text]``, ``prune_random_loss
    [seed, fraction, text]``.
    """

    model: str = "smollm2-135m"  #: a causal LM for :func:`~companion.transformers.models.load`
    n_calib: int = 8  #: calibration texts: the first paragraphs of Acts with >= ``seq_len`` tokens
    eval_books: tuple[str, ...] = ("kjv_genesis", "kjv_mark", "kjv_esther", "kjv_ruth")
    n_per_book: int = 4  #: evaluation texts per book (its first paragraphs with >= ``seq_len`` tokens)
    seq_len: int = 64
    dtype: str = "float32"  #: compute type
    prune_fractions: tuple[float, ...] = (0.1, 0.3)
    n_prune_seeds: int = 10  #: random pruning draws

    def compute(self, device, progress):
        """Run the experiment; returns the Result's arrays and scalars."""
        check_int(self.n_prune_seeds, "n_prune_seeds", 2)
        m, bench, L, lin, out = _setup(self, device)
        # ---- pruning the MLP neurons of every block: scores, and random draws
        downs = bench.modules(["down"])
        means = {n: bench.stats[n].mean for n in downs}
        scores = ("activation", "weight", "spread")
        prune = np.zeros((len(scores), 2, len(self.prune_fractions), len(out["base_loss"])))
        for a, method in enumerate(scores):
            neuron = {n: pruning.neuron_scores(method, bench.stats[n], mod.weight) for n, mod in downs.items()}
            for c, f in enumerate(self.prune_fractions):
                chosen = {n: pruning.lowest_fraction(v, f) for n, v in neuron.items()}
                for b, fill in enumerate((None, means)):
                    prune[a, b, c] = bench.measure(pruning.zero_linear_inputs(downs, chosen, fill=fill))["loss"]
        prune_random = np.zeros((self.n_prune_seeds, len(self.prune_fractions), len(out["base_loss"])))
        for seed in range(self.n_prune_seeds):
            neuron = {n: pruning.neuron_scores("random", bench.stats[n], mod.weight, seed=seed + 1000 * j)
                      for j, (n, mod) in enumerate(downs.items())}
            for c, f in enumerate(self.prune_fractions):
                chosen = {n: pruning.lowest_fraction(v, f) for n, v in neuron.items()}
                prune_random[seed, c] = bench.measure(pruning.zero_linear_inputs(downs, chosen))["loss"]
        out.update(prune_scores=list(scores), prune_loss=prune, prune_random_loss=prune_random, **m.facts())
        return out


@register("quantization_sensitivity", schema=1)
@dataclass(frozen=True)
class QuantizationSensitivityExperiment:
    """Which layers and which sites are sensitive to low-bit activations, on the held-out books.

    Per-text loss increases (``[.., eval text]``): ``site_loss [site]`` with only that site's inputs at
    ``low_bits`` per token; ``all_low_loss`` with every linear input at ``low_bits``; ``site_high_loss
    [site]`` with that site at ``high_bits`` and the rest at ``low_bits``; ``layer_loss [block]`` with only
    that block at ``low_bits``.  Per block, from the calibration split: ``layer_mean_share``
    (:math:`\\sum\\lVert\\mu\\rVert^2 / \\sum E\\lVert x\\rVert^2` over its linear inputs) and
    ``layer_range`` (largest :math:`|x|`).
    """

    model: str = "smollm2-135m"  #: a causal LM for :func:`~companion.transformers.models.load`
    n_calib: int = 8  #: calibration texts: the first paragraphs of Acts with >= ``seq_len`` tokens
    eval_books: tuple[str, ...] = ("kjv_genesis", "kjv_mark", "kjv_esther", "kjv_ruth")
    n_per_book: int = 4  #: evaluation texts per book (its first paragraphs with >= ``seq_len`` tokens)
    seq_len: int = 64
    dtype: str = "float32"  #: compute type
    low_bits: int = 4  #: per-token dynamic activations at ``low_bits``...
    high_bits: int = 8  #: ... and the site kept at ``high_bits``

    def compute(self, device, progress):
        """Run the experiment; returns the Result's arrays and scalars."""
        lo = check_int(self.low_bits, "low_bits", 2, 16)
        hi = check_int(self.high_bits, "high_bits", lo, 16)
        m, bench, L, lin, out = _setup(self, device)

        def loss(mods, bits=lo):
            return bench.measure(quantized_linears(mods, _a_spec(bits, "token")))["loss"]

        sites = list(SITES)
        site_loss = [loss(bench.modules([s])) for s in sites]
        site_high = []
        for s in sites:
            high = bench.modules([s])
            with quantized_linears(high, _a_spec(hi, "token")):
                site_high.append(loss({n: mod for n, mod in lin.items() if n not in high}))
        layer_loss = [loss(bench.modules(layers=[ell])) for ell in range(L)]
        share, rng_ = bench.block_input_statistics(L)
        out.update(sites=sites, site_loss=np.array(site_loss), all_low_loss=loss(lin),
                   site_high_loss=np.array(site_high), layer_loss=np.array(layer_loss),
                   layer_mean_share=share, layer_range=rng_, **m.facts())
        return out
