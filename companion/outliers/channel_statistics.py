"""Per-layer, per-channel moments and exceedance counts of a real residual stream, streamed over a corpus.

Memory ``O(L · d · |t|)``: the measurements Theorem 2 is tested on.  A wrong type raises ``TypeError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import check_bool, check_int, check_texts, check_thresholds
from companion.transformers.models import LoadedModel, check_model, encode
from companion.transformers.stream import forward_states

__all__ = ["ChannelStatistics", "channel_statistics"]


@dataclass(frozen=True)
class ChannelStatistics:
    """Per-layer, per-channel statistics of the residual stream over a corpus."""

    mean: np.ndarray  #: ``[L+1, d]`` float64 channel means
    var: np.ndarray  #: ``[L+1, d]``: population variance ``(1/N) Σ (x − mean)²`` over the ``N`` tokens
    min: np.ndarray  #: ``[L+1, d]`` smallest value
    max: np.ndarray  #: ``[L+1, d]`` largest value
    max_abs: np.ndarray  #: ``[L+1, d]`` largest ``|x|``
    counts: np.ndarray  #: ``[L+1, len(thresholds), d]`` int64: ``C_j(t) = #{tokens : |h_j| > t}`` (strict)
    thresholds: np.ndarray  #: the thresholds ``t``
    n_tokens: int  #: tokens ``N`` that entered (pads and, with ``skip_first``, first tokens excluded)
    n_texts: int  #: number of texts
    skip_first: bool  #: whether the first token of every text was left out
    model: str  #: name of the model
    #: with ``block_statistics=True``: ``[L+1, len(thresholds), d]`` float64, ``S = Σ_b C_b(t)² / n_b`` over
    #: the texts ``b`` (``C_b`` the text's count, ``n_b`` its tokens) — the between-text dispersion that
    #: :func:`companion.theory.exceedance.design_effect` needs; else None
    block_sum_sq: np.ndarray | None = None
    #: with ``block_statistics=True``: ``[n_texts]`` int64 tokens per text that entered (texts left
    #: with none are dropped); else None
    block_sizes: np.ndarray | None = None

    @property
    def std(self) -> np.ndarray:
        """Per-channel standard deviation ``sqrt(var)``."""
        return np.sqrt(self.var)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by name (for storing in a Result)."""
        return {k: getattr(self, k) for k in ("mean", "var", "min", "max", "max_abs", "counts", "thresholds")}


def channel_statistics(m: LoadedModel, texts, thresholds, batch_size: int = 16, max_length: int | None = None,
                       skip_first: bool = False, progress: bool = False,
                       block_statistics: bool = False) -> ChannelStatistics:
    """Stream per-channel statistics of every residual-stream layer over a corpus.

    Parameters
    ----------
    m : LoadedModel
    texts : sequence of str
        The corpus (e.g. :func:`companion.corpus.corpus_sentences`); any length.
    thresholds : sequence of float ≥ 0
        The ``t`` of the exceedance counts ``C_j(t)``.
    batch_size : int, default 16
        Texts per forward pass (memory ``O(L · batch · tokens · d)``).
    max_length : int or None
        Truncation length (default ``m.max_length``).
    skip_first : bool, default False
        Exclude the first token of every text (the massive activations of :cite:t:`sun2024massive`).
    progress : bool, default False
        Show a tqdm progress bar over batches.
    block_statistics : bool, default False
        Also keep, per text, the sufficient statistics of the between-text dispersion of the counts
        (``block_sum_sq``, ``block_sizes``): memory ``O(L · d · |t|)`` more, time about twice the counting.

    Returns
    -------
    ChannelStatistics

    Raises
    ------
    ValueError
        If a text is empty, thresholds are negative/NaN/empty, ``batch_size < 1``, or no token is left.
    """
    check_model(m)
    t = check_thresholds(thresholds)
    batch_size = check_int(batch_size, "batch_size", 1)
    skip_first = check_bool(skip_first, "skip_first")
    block_statistics = check_bool(block_statistics, "block_statistics")
    texts = check_texts(texts, single=True)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    L1, d, nt = m.n_layers + 1, m.d_model, len(t)
    dev = m.device
    acc_dtype = torch.float64 if dev.type != "mps" else torch.float32
    n = 0
    mean = torch.zeros(L1, d, dtype=acc_dtype, device=dev)
    m2 = torch.zeros(L1, d, dtype=acc_dtype, device=dev)
    mn = torch.full((L1, d), math.inf, dtype=acc_dtype, device=dev)
    mx = torch.full((L1, d), -math.inf, dtype=acc_dtype, device=dev)
    counts = torch.zeros(L1, d, nt, dtype=torch.int64, device=dev)
    tt = torch.as_tensor(t, dtype=acc_dtype, device=dev)
    sum_sq = torch.zeros(L1, d, nt, dtype=torch.float64, device=dev) if block_statistics else None
    sizes: list[int] = []

    batches = range(0, len(texts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc=f"statistics {m.name}", unit="batch")
    with torch.no_grad():
        for start in batches:
            enc = encode(m, [texts[i] for i in order[start:start + batch_size]], max_length)
            keep = enc["attention_mask"].bool().clone()
            if skip_first:
                keep[:, 0] = False
            nb = int(keep.sum())
            if nb == 0:
                continue
            full = torch.stack(forward_states(m, enc))  # [L+1, batch, tokens, d]
            if block_statistics:
                per_text = keep.sum(dim=1)
                # |h| of the dropped positions set to -1: never above a threshold t >= 0
                a = torch.where(keep[None, :, :, None], full.to(acc_dtype).abs(), -1.0)
                a = a.permute(0, 1, 3, 2).contiguous().sort(dim=-1).values  # [L+1, batch, d, tokens]
                below_b = torch.searchsorted(a, tt.expand(*a.shape[:3], nt).contiguous(), right=True)
                c_b = (a.shape[-1] - below_b).to(torch.float64)  # [L+1, batch, d, nt]
                used = per_text > 0
                w = 1.0 / per_text[used].to(torch.float64)
                sum_sq += (c_b[:, used] ** 2 * w[None, :, None, None]).sum(dim=1)
                sizes += per_text[used].tolist()
                del a, below_b, c_b
            x = full[:, keep].to(acc_dtype)  # [L+1, nb, d]
            del full
            mb = x.mean(dim=1)
            m2b = ((x - mb.unsqueeze(1)) ** 2).sum(dim=1)
            delta = mb - mean
            tot = n + nb
            mean = mean + delta * (nb / tot)
            m2 = m2 + m2b + delta**2 * (n * nb / tot)
            n = tot
            mn = torch.minimum(mn, x.amin(dim=1))
            mx = torch.maximum(mx, x.amax(dim=1))
            xs = x.abs().transpose(1, 2).contiguous().sort(dim=-1).values  # [L+1, d, nb]
            below = torch.searchsorted(xs, tt.expand(L1, d, nt).contiguous(), right=True)
            counts += nb - below
            del x, xs
    if n == 0:
        raise ValueError("no token left to measure (texts of one token with skip_first=True?)")
    # rounding leaves a constant channel M ~ 1e-34 and a mean an ulp off, or any mean an ulp outside
    # [min, max]: state them exactly
    constant = mn == mx
    mean = torch.where(constant, mn, torch.minimum(torch.maximum(mean, mn), mx))
    m2 = torch.where(constant, torch.zeros_like(m2), m2)
    max_abs = torch.maximum(mx.abs(), mn.abs())
    to_np = lambda a: a.to(torch.float64).cpu().numpy()  # noqa: E731
    return ChannelStatistics(
        mean=to_np(mean), var=to_np(m2 / n), min=to_np(mn), max=to_np(mx), max_abs=to_np(max_abs),
        counts=counts.permute(0, 2, 1).cpu().numpy(), thresholds=t, n_tokens=n, n_texts=len(texts),
        skip_first=skip_first, model=m.name,
        block_sum_sq=None if sum_sq is None else sum_sq.permute(0, 2, 1).cpu().numpy(),
        block_sizes=None if sum_sq is None else np.asarray(sizes, dtype=np.int64))
