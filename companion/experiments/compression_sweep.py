"""The ``compression_sweep`` experiment: quantisation schemes and pruning on a causal LM.

Every scheme is applied to the linear layers of SmolLM2-135M's blocks and measured on held-out text
against the float model (loss increase, next-token KL, relative MSE of the stream per block); the
chapter *Applications* renders the stored Result and re-measures a few schemes with
:class:`CompressionBench`.  The offline weights are a dequantised Q4_1 checkpoint (a 4-bit grid per 32).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import check_int
from companion.applications import pruning
from companion.applications.model_quantization import (
    LinearQuantization, activation_bias_correction, mean_quantization_error, quantize_linear_inputs,
    quantized_linears, weight_bias_correction)
from companion.applications.quantization import quantize_weight, smoothquant_scales
from companion.corpus import load_corpus
from companion.experiments import register
from companion.transformers import models

__all__ = ["CompressionSweepExperiment", "CompressionBench", "SITES"]

#: The four kinds of linear input of a Llama block, by the layer that reads them.
SITES = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


def _quantization_schemes(alphas) -> list[str]:
    """Names of the whole-model schemes (:meth:`CompressionBench.scheme`), in table order."""
    names = ["A8 tensor dynamic", "A8 tensor dynamic, centred on mean", "A8 tensor static",
             "A8 tensor static, act bias corr", "A8 tensor static asym", "A8 token dynamic",
             "A8 token dynamic asym", "A4 token dynamic", "A4 token dynamic, centred on mean",
             "A4 token dynamic, act bias corr", "A4 token dynamic asym", "A8 tensor dynamic, top-4 float",
             "W8", "W4", "W4 asym", "W4, bias corr", "W4 asym, bias corr", "W3", "W3, bias corr"]
    names += [f"W8A8 tensor static, SQ alpha={a:g}" if a is not None else "W8A8 tensor static"
              for a in (None, *alphas)]
    names += ["W8A8 token dynamic", "W8A8 token dynamic, SQ alpha=0.5"]
    return names


class CompressionBench:
    """A float model, a calibration and an evaluation split, and the schemes applied to them.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
        A causal LM (float64 recommended).
    calib_texts, eval_texts : list of str
        Each at least ``seq_len`` tokens long.
    seq_len : int
    stats : dict name -> LinearInputStatistics, optional
        Precomputed calibration statistics (:func:`~companion.applications.pruning.linear_input_statistics`).

    Raises
    ------
    ValueError
        If a text is shorter than ``seq_len`` tokens.
    """

    def __init__(self, m, calib_texts, eval_texts, seq_len: int = 64, stats=None):
        self.m = m
        self.seq_len = check_int(seq_len, "seq_len", 2)
        self.calib = dict(models.tokenize(m, list(calib_texts), self.seq_len))
        self.eval = dict(models.tokenize(m, list(eval_texts), self.seq_len))
        for label, batch in (("calibration", self.calib), ("evaluation", self.eval)):
            if not bool(batch["attention_mask"].all()):
                raise ValueError(f"every {label} text must have at least {self.seq_len} tokens")
        self.linears = {n: mod for n, mod in m.model.named_modules()
                        if isinstance(mod, torch.nn.Linear) and ".layers." in n}
        self.stats = (pruning.linear_input_statistics(m.model, [self.calib], self.linears)
                      if stats is None else dict(stats))
        self._base = {"eval": self._run(self.eval)}

    def _run(self, batch):
        with torch.no_grad():
            out = self.m.model(**batch, use_cache=False, output_hidden_states=True)
        logp = torch.log_softmax(out.logits[:, :-1].double(), dim=-1)
        target = batch["input_ids"][:, 1:]
        loss = -logp.gather(-1, target[..., None])[..., 0].mean(dim=1)
        hidden = torch.stack(out.hidden_states[1:])[:, :, 1:].double()     # [L, batch, tokens-1, d]
        return logp, loss.numpy(), hidden

    def measure(self, ctx=None, split: str = "eval") -> dict:
        """Loss increase and KL per text; relative MSE and squared mean error per block (first token
        excluded), both over the float stream's mean squared norm, under ``ctx``."""
        if split not in self._base:
            self._base[split] = self._run(self.calib)
        logp0, loss0, h0 = self._base[split]
        with ctx if ctx is not None else contextlib.nullcontext():
            logp, loss, h = self._run(self.eval if split == "eval" else self.calib)
        kl = (logp0.exp() * (logp0 - logp)).sum(-1).mean(dim=1)
        num = (h - h0).pow(2).sum(-1).mean(dim=(1, 2))
        den = h0.pow(2).sum(-1).mean(dim=(1, 2))
        mean_err = (h - h0).mean(dim=(1, 2)).pow(2).sum(-1)       # |E[h - h0]|^2 per block
        return {"loss": loss - loss0, "kl": kl.numpy(), "rel_mse": (num / den).numpy(),
                "mean_err": (mean_err / den).numpy()}

    @property
    def base_loss(self) -> np.ndarray:
        """Float model's loss per evaluation text."""
        return self._base["eval"][1]

    def modules(self, sites=None, layers=None) -> dict:
        """The linear layers at the given sites (keys of :data:`SITES`) and block indices."""
        kinds = None if sites is None else {k for s in sites for k in SITES[s]}
        return {n: mod for n, mod in self.linears.items()
                if (kinds is None or n.split(".")[-1] in kinds)
                and (layers is None or int(n.split(".")[2]) in layers)}

    def block_input_statistics(self, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """Per block, from the calibration statistics of its linear layers' inputs: the mean share
        :math:`\\sum\\mu_j^2 / \\sum E[x_j^2]` over all input channels, and the range (largest :math:`|x|`)."""
        share, range_ = [], []
        for ell in range(n_blocks):
            sts = [self.stats[n] for n in self.modules(layers=[ell])]
            share.append(sum(float((s.mean ** 2).sum()) for s in sts) / sum(float(s.second_moment.sum()) for s in sts))
            range_.append(max(float(s.max_abs.max()) for s in sts))
        return np.array(share), np.array(range_)

    def static_ranges(self, modules, symmetric=True, smooth=None):
        """Per-tensor calibrated ranges ``(lo, hi)`` of each input (in smoothed coordinates)."""
        out = {}
        for n in modules:
            st = self.stats[n]
            s = np.ones_like(st.max_abs) if smooth is None else smooth[n]
            lo, hi = float((st.min / s).min()), float((st.max / s).max())
            if symmetric:
                r = max(abs(lo), abs(hi))
                lo, hi = -r, r
            out[n] = (lo, hi)
        return out

    def smooth_scales(self, modules, alpha):
        """SmoothQuant scales from the calibration ranges."""
        return {n: smoothquant_scales(self.stats[n].max_abs, mod.weight, alpha) for n, mod in modules.items()}

    def activation(self, bits, granularity, *, symmetric=True, static=False, modules=None,
                   bias_correction=False, weight_bits=None, alpha=None, center=False, keep=None):
        """A context manager applying one quantisation scheme to ``modules`` (default: all)."""
        mods = self.linears if modules is None else modules
        if center or keep:
            centers = ({n: torch.as_tensor(self.stats[n].mean) for n in mods} if center else None)
            keeps = ({n: pruning.top_channels(self.stats[n].max_abs, keep) for n in mods} if keep else None)
            return quantize_linear_inputs(self.m.model, bits, granularity, modules=mods, centers=centers,
                                          keep_channels=keeps)
        spec = LinearQuantization(act_bits=bits, act_granularity=granularity, act_symmetric=symmetric,
                                  static=static, weight_bits=weight_bits)
        smooth = None if alpha is None else self.smooth_scales(mods, alpha)
        ranges = self.static_ranges(mods, symmetric, smooth) if static else None
        shift = None
        if bias_correction:
            err = mean_quantization_error(self.m.model, [self.calib], mods, spec, ranges=ranges,
                                          smooth=smooth)
            shift = {n: activation_bias_correction(mod.weight, err[n]) for n, mod in mods.items()}
        return quantized_linears(mods, spec, ranges=ranges, smooth=smooth, output_shift=shift)

    def weights(self, bits, *, symmetric=True, bias_correction=False, modules=None):
        """Weight-only quantisation, optionally with Nagel et al.'s bias correction."""
        mods = self.linears if modules is None else modules
        spec = LinearQuantization(act_bits=None, weight_bits=bits, weight_symmetric=symmetric)
        shift = None
        if bias_correction:
            shift = {n: weight_bias_correction(mod.weight, quantize_weight(mod.weight.detach(), bits,
                                                                           symmetric=symmetric),
                                               self.stats[n].mean)
                     for n, mod in mods.items()}
        return quantized_linears(mods, spec, output_shift=shift)

    def scheme(self, name: str):
        """The context manager of a named whole-model scheme (the ``schemes`` of the Result)."""
        base, _, option = name.partition(", ")
        kw = {}
        if option.startswith("SQ alpha="):
            kw["alpha"] = float(option.split("=")[1])
        elif option:
            kw = {"centred on mean": {"center": True}, "act bias corr": {"bias_correction": True},
                  "top-4 float": {"keep": 4}, "bias corr": {"bias_correction": True}}[option]
        words = base.split()
        if words[0].startswith("W") and "A" not in words[0]:
            return self.weights(int(words[0][1:]), symmetric="asym" not in words, **kw)
        wbits = None
        if words[0].startswith("W"):
            wbits, abits = (int(v) for v in words[0][1:].split("A"))
        else:
            abits = int(words[0][1:])
        return self.activation(abits, words[1], symmetric="asym" not in words, static="static" in words,
                               weight_bits=wbits, **kw)


def _summary(r) -> list[float]:
    n = len(r["loss"])
    return [float(r["loss"].mean()), float(r["loss"].std(ddof=1) / np.sqrt(n)), float(r["kl"].mean()),
            float(r["kl"].std(ddof=1) / np.sqrt(n)), float(r["rel_mse"][-1])]


@register("compression_sweep", schema=1)
@dataclass(frozen=True)
class CompressionSweepExperiment:
    """Quantisation schemes, mixed precision and pruning with mean compensation on a causal LM.

    Summary rows hold (loss increase, s.e., KL, s.e., relative MSE after the last block):
    ``schemes_summary``, ``site_summary``, ``mixed_summary``, ``prune_summary [n_scores, 2, n_fractions,
    5]`` (without / with mean compensation); per layer ``layer_kl``, ``layer_mean_share``, ``layer_range``.
    """

    model: str = "smollm2-135m"  #: a causal LM for :func:`~companion.transformers.models.load`
    n_calib: int = 8  #: calibration texts (corpus paragraphs of >= ``seq_len`` tokens)
    n_eval: int = 8  #: evaluation texts, likewise
    seq_len: int = 64
    dtype: str = "float64"  #: compute type (float32 roundings differ between CPU kernels)
    alphas: tuple[float, ...] = (0.25, 0.5, 0.65, 0.8, 0.9)  #: SmoothQuant migration strengths
    low_bits: int = 4  #: mixed precision: per-token dynamic activations at ``low_bits``...
    high_bits: int = 8  #: ... and the chosen layers or sites at ``high_bits``
    keep_layers: int = 6  #: layers kept at ``high_bits`` by each selection rule
    prune_fractions: tuple[float, ...] = (0.1, 0.3)  #: fractions of every block's MLP neurons removed

    def compute(self, device, progress):
        """Run the sweep; returns the Result's arrays and scalars."""
        check_int(self.n_calib, "n_calib", 2)
        check_int(self.n_eval, "n_eval", 2)
        m = models.load(self.model, device=device, dtype=self.dtype)
        paragraphs = load_corpus()
        long_enough = [p for p in paragraphs[:40] if len(m.tokenizer(p)["input_ids"]) >= self.seq_len]
        bench = CompressionBench(m, long_enough[:self.n_calib],
                                 long_enough[self.n_calib:self.n_calib + self.n_eval], self.seq_len)
        out: dict = {"base_loss": bench.base_loss}
        names = _quantization_schemes(self.alphas)
        res = [bench.measure(bench.scheme(n)) for n in names]
        out["schemes"] = names
        out["schemes_summary"] = np.array([_summary(r) for r in res])
        for key in ("loss", "kl", "rel_mse"):
            out[f"schemes_{key}"] = np.array([r[key] for r in res])
        lo, hi = self.low_bits, self.high_bits
        # per site: only that site at low bits
        site_res = [bench.measure(bench.activation(lo, "token", modules=bench.modules([s]))) for s in SITES]
        out["sites"] = list(SITES)
        out["site_summary"] = np.array([_summary(r) for r in site_res])
        # per layer: sensitivity on the calibration split, statistics of the layer's inputs
        L = m.n_layers
        layer_kl = [bench.measure(bench.activation(lo, "token", modules=bench.modules(layers=[ell])),
                                  split="calib")["kl"].mean() for ell in range(L)]
        out["layer_kl"] = np.array(layer_kl)
        share, rng_ = bench.block_input_statistics(L)
        out["layer_mean_share"], out["layer_range"] = share, rng_
        k = self.keep_layers
        rules = {"sensitivity (calibration KL)": np.argsort(-np.array(layer_kl), kind="stable")[:k],
                 "largest mean share (the note)": np.argsort(-np.array(share), kind="stable")[:k],
                 "largest range": np.argsort(-np.array(rng_), kind="stable")[:k],
                 "random (seed 0)": np.random.default_rng(0).choice(L, k, replace=False)}
        mixed = []  # the layers chosen by each rule, then one site, kept at high bits; the rest low
        for high in ([bench.modules(layers=set(int(c) for c in chosen)) for chosen in rules.values()]
                     + [bench.modules([s]) for s in SITES]):
            low = {n: mod for n, mod in bench.linears.items() if n not in high}
            with bench.activation(hi, "token", modules=high):
                mixed.append(bench.measure(bench.activation(lo, "token", modules=low)))
        out["mixed_rules"] = list(rules) + [f"{s} at {hi} bits" for s in SITES]
        out["mixed_layers"] = np.array([sorted(int(c) for c in v) for v in rules.values()])
        out["mixed_summary"] = np.array([_summary(r) for r in mixed])
        # pruning the MLP neurons of every block, with and without mean compensation
        downs = bench.modules(["down"])
        scores = pruning.PRUNING_SCORES
        prune = np.zeros((len(scores), 2, len(self.prune_fractions), 5))
        means = {n: bench.stats[n].mean for n in downs}
        for a, method in enumerate(scores):
            neuron = {n: pruning.neuron_scores(method, bench.stats[n], mod.weight, seed=0)
                      for n, mod in downs.items()}
            for c, f in enumerate(self.prune_fractions):
                chosen = {n: pruning.lowest_fraction(v, f) for n, v in neuron.items()}
                for b, fill in enumerate((None, means)):
                    pruned = pruning.zero_linear_inputs(downs, chosen, fill=fill)
                    prune[a, b, c] = _summary(bench.measure(pruned))
        out.update(prune_scores=list(scores), prune_summary=prune, **m.facts())
        return out
