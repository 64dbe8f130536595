"""The ``injection_sweep`` experiment: inject ``c v`` at every layer of a real model.

Runs :func:`~companion.injection.engine.sweep_injections` on corpus sentences for any model
:func:`~companion.transformers.models.load` knows, measuring every layer with the metrics of
:mod:`companion.injection.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import check_choice, check_layer
from companion.experiments import register
from companion.experiments._common import bar, check_counts, load_model

__all__ = ["InjectionSweepExperiment", "TOKEN_GROUPS"]

#: Token groups of :class:`InjectionSweepExperiment`: the injected tokens (mean), the last token.
TOKEN_GROUPS = ("injected", "last")


def _median_norms(m, texts, batch_size, max_length) -> torch.Tensor:
    """Median over tokens (first token of each text excluded) of ``‖h_l‖``, per layer ``l``."""
    from companion.transformers import models
    from companion.transformers import stream

    norms = []
    for start in range(0, len(texts), batch_size):
        enc = models.encode(m, texts[start:start + batch_size], max_length)
        keep = enc["attention_mask"].bool().clone()
        keep[:, 0] = False
        norms.append(stream.residual_stream(m, enc)[:, keep].float().norm(dim=-1).cpu())
    return torch.cat(norms, dim=1).median(dim=1).values


def _injection_mask(mask: torch.Tensor, where: str) -> torch.Tensor:
    real = mask.bool()
    last = real.sum(1) - 1
    rows = torch.arange(real.shape[0], device=real.device)
    sel = real.clone()
    if where == "last":
        sel[:] = False
        sel[rows, last] = True
    elif where == "prefix":
        sel[rows, last] = False
    return sel


@register("injection_sweep", schema=2)
@dataclass(frozen=True)
class InjectionSweepExperiment:
    """Inject c·v into the residual stream at every layer and follow it to the output.

    Corpus sentences and batching as in
    :class:`~companion.experiments.channel_statistics.ChannelStatisticsExperiment`.  Result arrays:
    one per name of :data:`~companion.injection.metrics.METRIC_NAMES`, each
    ``[n_layers, n_scales, L+1, 2, n_texts]`` float32 (groups :data:`TOKEN_GROUPS`; NaN-aware
    mean over the injected tokens); ``magnitude`` ``[n_layers, n_scales]``, ``median_norm``,
    ``layers``, ``scales``; causal LMs: ``kl_last`` and ``top1_changed``
    ``[n_layers, n_scales, n_texts]``.
    """

    model: str = "smollm2-135m"
    n_texts: int = 8
    min_words: int = 10
    max_words: int = 24
    max_length: int = 48
    batch_size: int = 8
    layers: tuple[int, ...] = ()  #: injection layers (``h_layer``, 0 = embeddings); empty = all ``0 .. L``
    #: norm ``scale × median ‖h_l‖`` (first tokens excluded) if ``relative``, else ``scale``
    scales: tuple[float, ...] = (0.25, 1.0)
    relative: bool = True
    #: ``"prefix"``: every real token but the last (a downstream reader, as in
    #: :cite:t:`hahami2025disturbance`); ``"all"``: every real token; ``"last"``: the last only
    positions: str = "prefix"
    seed: int = 0  #: seed of the random unit direction ``v``
    dtype: str = "float32"

    def compute(self, device, progress):
        """Run the sweep; returns the Result's arrays and scalars."""
        from companion.corpus import corpus_sentences
        from companion.transformers import models, readout
        from companion.injection.engine import sweep_injections
        from companion.injection.metrics import METRIC_NAMES, next_token_kl, perturbation_metrics

        check_counts(self, {"n_texts": 1, "batch_size": 1})
        check_choice(self.positions, "positions", ("prefix", "all", "last"))
        if not self.scales:
            raise ValueError("scales must hold at least one magnitude")
        m = load_model(self, device)
        L = m.n_layers
        layers = tuple(check_layer(x, L, m.name, "layers") for x in self.layers or range(L + 1))
        texts = corpus_sentences(self.n_texts, min_words=self.min_words, max_words=self.max_words)
        g = torch.Generator().manual_seed(self.seed)
        v = torch.randn(m.d_model, generator=g, dtype=torch.float64)
        v = (v / v.norm()).to(device=m.device, dtype=torch.float32)
        v_np = v.double().cpu().numpy()
        med = _median_norms(m, texts, self.batch_size, self.max_length)
        base_norm = torch.tensor([float(med[layer]) if self.relative else 1.0 for layer in layers])
        magnitude = base_norm[:, None] * torch.tensor(self.scales, dtype=torch.float32)[None, :]
        vectors = base_norm[:, None].to(m.device) * v[None, :]  # the scales multiply these

        n_l, n_s, G = len(layers), len(self.scales), len(TOKEN_GROUPS)
        out = {k: np.zeros((n_l, n_s, L + 1, G, len(texts)), dtype=np.float32) for k in METRIC_NAMES}
        kl = np.zeros((n_l, n_s, len(texts)), dtype=np.float32)
        changed = np.zeros((n_l, n_s, len(texts)), dtype=np.int8)

        batches = bar(range(0, len(texts), self.batch_size), progress, f"injection sweep {m.name}", "batch")
        for start in batches:
            enc = models.encode(m, texts[start:start + self.batch_size], self.max_length)
            sel = _injection_mask(enc["attention_mask"], self.positions)
            if (sel.sum(1) == 0).any():
                raise ValueError("a text has no token to inject at (one-token text with positions='prefix')")
            rows = torch.arange(sel.shape[0], device=sel.device)
            last = enc["attention_mask"].sum(1) - 1
            injected = sel.cpu().numpy()
            finals = {"h": [], "ids": []}  # last-token states at layer L, one entry per chunk of runs

            def measure(h_inj, h_base, layer, conditions):
                hi = h_inj.detach().to("cpu", torch.float64).numpy()            # [K, B, T, d]
                hb = np.broadcast_to(h_base.detach().to("cpu", torch.float64).numpy(), hi.shape)
                met = perturbation_metrics(hb, hi, v_np)                       # name -> [K, B, T]
                per_token = np.stack([met[k] for k in METRIC_NAMES], axis=1)   # [K, metrics, B, T]
                ok = injected & np.isfinite(per_token)
                mean_inj = np.where(ok, per_token, 0.0).sum(-1) / np.maximum(ok.sum(-1), 1)
                mean_inj = np.where(ok.sum(-1) > 0, mean_inj, np.nan)
                at_last = per_token[:, :, rows.cpu().numpy(), last.cpu().numpy()]
                if layer == L and m.kind == "causal-lm":
                    finals["h"].append(h_inj[:, rows, last].clone())
                    finals["ids"].append(conditions.clone())
                return torch.from_numpy(np.stack([mean_inj, at_last], axis=2))  # [K, metrics, G, B]

            sw = sweep_injections(m, enc, layers, vectors, scale=list(self.scales), positions=sel,
                                 measure=measure)
            got = sw.injected.cpu().numpy()  # [n_l, n_s, L+1, metrics, G, B]
            batch_slice = slice(start, start + sel.shape[0])
            for k, name in enumerate(METRIC_NAMES):
                out[name][..., batch_slice] = got[:, :, :, k]
            if m.kind == "causal-lm":
                logits_base = readout.logits_from_residual(m, sw.baseline[L][rows, last])   # [B, V]
                logits_inj = readout.logits_from_residual(m, torch.cat(finals["h"]))        # [K, B, V]
                div = next_token_kl(logits_base.expand_as(logits_inj), logits_inj)         # [K, B]
                flip = (logits_base.argmax(-1) != logits_inj.argmax(-1)).cpu().numpy()
                for k, (j, s) in enumerate(torch.cat(finals["ids"]).tolist()):
                    kl[j, s, batch_slice] = div[k]
                    changed[j, s, batch_slice] = flip[k]

        result = {**out, "magnitude": magnitude.numpy(), "median_norm": med.numpy(),
                  "layers": np.asarray(layers), "scales": np.asarray(self.scales, dtype=np.float64),
                  "n_texts": len(texts), "metrics": list(METRIC_NAMES), "groups": list(TOKEN_GROUPS),
                  **m.facts()}
        if m.kind == "causal-lm":
            result.update(kl_last=kl, top1_changed=changed)
        return result
