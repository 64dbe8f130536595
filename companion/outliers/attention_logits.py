r"""Attention logits of real Transformers: query/key capture, logit pairs and their statistics.

The moments of :math:`q\cdot k` set beside :prf:ref:`olr-thm-dot`; derivations: *Attention logits* in
:doc:`/book/outliers_real_models`.  An argument of the wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from companion._validation import as_generator, check_bool, check_int, check_texts, real_array

__all__ = ["QueryKeyCapture", "capture_queries_keys", "logit_pairs", "dot_product_moments",
           "partial_dot_statistics", "attention_logit_statistics", "centred_logit_statistics"]


@dataclass(frozen=True)
class QueryKeyCapture:
    """Queries and keys of one attention layer over a batch of texts (real tokens only)."""

    layer: int  #: block index
    q: np.ndarray  #: ``[n_tokens, n_heads, d_k]`` float32 queries
    #: ``[n_tokens, n_kv_heads, d_k]`` float32 keys.  With rotary embeddings and ``rotary=True`` both are
    #: rotated, so ``q[i, h] @ k[j, kv_head(h)]`` is exactly the logit before the ``1/sqrt(d_k)`` scale.
    k: np.ndarray
    text: np.ndarray  #: ``[n_tokens]`` int: the text each token belongs to
    position: np.ndarray  #: ``[n_tokens]`` int: the token's position in its text (0 = first token)
    causal: bool  #: whether the model attends only to earlier positions
    rotary: bool  #: whether rotary embeddings were applied
    scaling: float  #: the factor the model multiplies logits by (``1/sqrt(d_k)`` for both offline models)

    @property
    def n_heads(self) -> int:
        """Number of query heads."""
        return self.q.shape[1]

    @property
    def d_k(self) -> int:
        """Dimension of a query or key head."""
        return self.q.shape[2]

    def kv_head(self, head: int) -> int:
        """Key head read by query head ``head`` (grouped-query attention shares key heads)."""
        return head // (self.q.shape[1] // self.k.shape[1])


def _attention_parts(block):
    """(attention module, query linear, key linear) of one block, or ValueError."""
    import torch

    for mod in block.modules():
        for qn, kn in (("q_proj", "k_proj"), ("query", "key")):
            q, k = getattr(mod, qn, None), getattr(mod, kn, None)
            if isinstance(q, torch.nn.Linear) and isinstance(k, torch.nn.Linear):
                return mod, q, k
    raise ValueError(f"could not find separate query/key projections (q_proj/k_proj or query/key) in "
                     f"{type(block).__name__}; models with a fused projection (GPT-2's c_attn) "
                     "are not supported")


def capture_queries_keys(m, texts, layers=None, max_length: int | None = None, rotary: bool = True,
                         batch_size: int = 16) -> list[QueryKeyCapture]:
    r"""Queries and keys of real attention layers, read with forward hooks on the q/k projections.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
        A model whose blocks have separate query and key projections (Llama/SmolLM2, BERT/MiniLM).
    texts : sequence of str
        The texts (right-padded batches; pads are dropped from the result).
    layers : sequence of int or None
        Block indices in ``[0, L-1]`` (default: every block).
    max_length : int or None
        Truncation length (default ``m.max_length``).
    rotary : bool, default True
        Apply the model's rotary embedding (if any), as the attention does; ``False``: the raw projections.
    batch_size : int, default 16

    Returns
    -------
    list of QueryKeyCapture
        One per requested layer, in the order of ``layers``.

    Raises
    ------
    ValueError
        If a layer is out of range or repeated, ``texts`` is empty, or q/k projections are not separate.
    """
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import check_model, tokenize

    check_model(m)
    rotary = check_bool(rotary, "rotary")
    bs = check_int(batch_size, "batch_size", 1)
    L = m.n_layers
    layers = list(range(L)) if layers is None else layers
    if isinstance(layers, Integral) and not isinstance(layers, bool):
        layers = [layers]
    if not isinstance(layers, (Sequence, np.ndarray, range)) or len(layers) == 0:
        raise ValueError("layers must be a non-empty list of block indices or None")
    layers = [check_int(l, "every layer", 0) for l in layers]
    for l in layers:
        if not 0 <= l < L:
            raise ValueError(f"layer {l} is outside [0, {L - 1}] (block indices of {m.name})")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers contains repeats: {layers}")
    texts = check_texts(texts, single=True)

    cfg = m.model.config
    n_heads = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    d_k = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    causal = m.kind == "causal-lm"

    parts = {l: _attention_parts(m.blocks[l]) for l in layers}
    got: dict = {}

    def out_hook(layer, name):
        def hook(module, args, output):
            got[(layer, name)] = output.detach()
        return hook

    def pre_hook(layer):
        def hook(module, args, kwargs):
            got[(layer, "pe")] = kwargs.get("position_embeddings")
        return hook

    qs, ks = {l: [] for l in layers}, {l: [] for l in layers}
    text_idx, pos_idx = [], []
    rotated = False
    forward = [(lin, out_hook(l, name)) for l, (_, qlin, klin) in parts.items()
               for lin, name in ((qlin, "q"), (klin, "k"))]
    pre = [(attn, pre_hook(l)) for l, (attn, _, _) in parts.items()]
    with hooks(forward=forward, pre=pre, pre_with_kwargs=True):
        for start in range(0, len(texts), bs):
            enc = tokenize(m, list(texts[start:start + bs]), max_length)
            kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
            if causal:
                kwargs["use_cache"] = False
            got.clear()
            with torch.no_grad():
                m.base(**kwargs)
            keep = enc["attention_mask"].bool()
            B, T = keep.shape
            for l in layers:
                q = got[(l, "q")].reshape(B, T, n_heads, d_k)
                k = got[(l, "k")].reshape(B, T, n_kv, d_k)
                pe = got.get((l, "pe"))
                if rotary and pe is not None:
                    module = sys.modules[type(parts[l][0]).__module__]
                    apply = getattr(module, "apply_rotary_pos_emb", None)
                    if apply is None:
                        raise ValueError(f"{type(parts[l][0]).__name__} uses rotary embeddings but its "
                                         "module has no apply_rotary_pos_emb; pass rotary=False")
                    cos, sin = pe
                    q, _ = apply(q, q, cos, sin, unsqueeze_dim=2)
                    k, _ = apply(k, k, cos, sin, unsqueeze_dim=2)
                    rotated = True
                qs[l].append(q[keep].float().cpu().numpy())
                ks[l].append(k[keep].float().cpu().numpy())
            b_idx, p_idx = torch.nonzero(keep, as_tuple=True)
            text_idx.append((b_idx + start).cpu().numpy())
            pos_idx.append(p_idx.cpu().numpy())
    text_arr, pos_arr = np.concatenate(text_idx), np.concatenate(pos_idx)
    scaling = float(getattr(parts[layers[0]][0], "scaling", 1.0 / math.sqrt(d_k)))
    return [QueryKeyCapture(layer=l, q=np.concatenate(qs[l]), k=np.concatenate(ks[l]), text=text_arr,
                            position=pos_arr, causal=causal, rotary=rotated, scaling=scaling) for l in layers]


def logit_pairs(cap: QueryKeyCapture, head: int, skip_first: bool = False, max_pairs: int | None = None,
                rng=None) -> tuple[np.ndarray, np.ndarray]:
    r"""Matched (query, key) pairs of one head: every pair the attention scores, within each text.

    Parameters
    ----------
    cap : QueryKeyCapture
    head : int
        Query head in ``[0, n_heads)``; its key head is ``cap.kv_head(head)``.
    skip_first : bool, default False
        Drop pairs whose key (or query) is the first token of its text (the attention sink).
    max_pairs : int or None
        Keep a uniform random subset of at most this many pairs.
    rng : None, int or numpy.random.Generator
        Randomness for the subset (default seed 0).

    Returns
    -------
    (q, k) : tuple of numpy.ndarray, each ``[P, d_k]``
        Row ``p`` is one scored pair: ``q[p] @ k[p]`` is a raw logit.  Causal models give the pairs
        with key position ≤ query position; encoders give all pairs.

    Raises
    ------
    ValueError
        If ``head`` is out of range, ``max_pairs < 1`` or no pair is left.
    """
    skip_first = _check_capture(cap, skip_first)
    check_int(head, "head", None)
    if not 0 <= head < cap.n_heads:
        raise ValueError(f"head {head} is outside [0, {cap.n_heads - 1}]")
    mp = None if max_pairs is None else check_int(max_pairs, "max_pairs", 1)
    return _logit_pairs(cap, head, skip_first, mp, as_generator(0 if rng is None else rng))


def _check_capture(cap, skip_first) -> bool:
    """TypeError unless ``cap`` is a QueryKeyCapture; ``skip_first`` as a bool."""
    if not isinstance(cap, QueryKeyCapture):
        raise TypeError(f"cap must be a QueryKeyCapture, got {type(cap).__name__}")
    return check_bool(skip_first, "skip_first")


def _text_groups(cap: QueryKeyCapture, skip_first: bool, min_size: int) -> list[np.ndarray]:
    """Token indices of each text (without its first token if ``skip_first``), if at least ``min_size``."""
    starts = np.flatnonzero(np.r_[True, cap.text[1:] != cap.text[:-1]])
    groups = [np.arange(s, e) for s, e in zip(starts, np.r_[starts[1:], cap.text.size])]
    if skip_first:
        groups = [idx[cap.position[idx] != 0] for idx in groups]
    return [idx for idx in groups if idx.size >= min_size]


def _logit_pairs(cap: QueryKeyCapture, head: int, skip_first: bool, mp: int | None,
                 gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """:func:`logit_pairs` on validated arguments."""
    qi_all, kj_all = [], []
    for idx in _text_groups(cap, skip_first, 1):
        ii, jj = np.meshgrid(idx, idx, indexing="ij")
        keep = (cap.position[jj] <= cap.position[ii]) if cap.causal else np.ones_like(ii, dtype=bool)
        qi_all.append(ii[keep])
        kj_all.append(jj[keep])
    if not qi_all:
        raise ValueError("no (query, key) pair is left; pass longer texts or skip_first=False")
    qi, kj = np.concatenate(qi_all), np.concatenate(kj_all)
    if mp is not None and qi.size > mp:
        sel = np.sort(gen.choice(qi.size, size=mp, replace=False))
        qi, kj = qi[sel], kj[sel]
    return cap.q[qi, head].astype(np.float64), cap.k[kj, cap.kv_head(head)].astype(np.float64)


def dot_product_moments(mu_q, var_q, mu_k, var_k) -> tuple[np.ndarray, np.ndarray]:
    r"""Mean and variance of :math:`q\cdot k` for independent vectors with independent coordinates.

    Parameters
    ----------
    mu_q, var_q, mu_k, var_k : array_like, shape ``[..., d]``
        Coordinate means and variances (variances ``>= 0``) of :math:`q` and :math:`k`.

    Returns
    -------
    (mean, var) : tuple of numpy.ndarray, shape ``[...]``
        :math:`\sum_c \mu_{q,c}\mu_{k,c}` and
        :math:`\sum_c (\sigma_{q,c}^2\sigma_{k,c}^2 + \sigma_{q,c}^2\mu_{k,c}^2 + \sigma_{k,c}^2\mu_{q,c}^2)`.

    Raises
    ------
    ValueError
        If shapes differ, a variance is negative, an input is not finite, or the result overflows float64.

    Examples
    --------
    >>> [float(v) for v in dot_product_moments(np.zeros(64), np.ones(64), np.zeros(64), np.ones(64))]
    [0.0, 64.0]
    """
    arrs = [real_array(n, v, min_ndim=1) for n, v in
            (("mu_q", mu_q), ("var_q", var_q), ("mu_k", mu_k), ("var_k", var_k))]
    if any(a.shape != arrs[0].shape for a in arrs):
        raise ValueError(f"mu_q, var_q, mu_k, var_k must share one shape, got {[a.shape for a in arrs]}")
    mq, vq, mk, vk = arrs
    if (vq < 0).any() or (vk < 0).any():
        raise ValueError("variances must be >= 0")
    return _dot_product_moments(mq, vq, mk, vk)


def _dot_product_moments(mq, vq, mk, vk) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dot_product_moments` on validated float64 arrays of one shape."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean = (mq * mk).sum(-1)
        var = (vq * vk + vq * mk**2 + vk * mq**2).sum(-1)
    if not (np.isfinite(mean).all() and np.isfinite(var).all()):
        raise ValueError("the mean or variance of q.k exceeds the float64 range; rescale the inputs "
                         "(the mean scales like scale(q) * scale(k), the variance like its square)")
    return mean, var


def partial_dot_statistics(q, k, sizes=None, n_orders: int = 8, rng=None) -> dict[str, np.ndarray]:
    r"""How the logit :math:`q\cdot k` over :math:`m` of the :math:`d_k` coordinates grows with :math:`m`.

    Parameters
    ----------
    q, k : array_like, shape ``[P, d_k]``
        Matched pairs (row ``p`` is one scored pair, e.g. from :func:`logit_pairs`), ``P >= 2``.
    sizes : sequence of int or None
        Sub-dimensions :math:`m` in ``[1, d_k]`` (default: ``1, 2, 4, ...`` and ``d_k``).
    n_orders : int, default 8
        Random coordinate orders averaged over (the subset is the first :math:`m` of each order).
    rng : None, int or numpy.random.Generator
        Randomness for the orders (default seed 0).

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[len(sizes)]`` (and ``"sizes"``)
        ``"mean"``, ``"var"``: mean and variance over pairs of :math:`\ell_m = \sum_{c \in S_m} q_c k_c`,
        averaged over orders; ``"var_scaled"``: :math:`\mathrm{Var}(\ell_m/\sqrt m)`; ``"snr"``:
        :math:`|E\ell_m|/\mathrm{sd}(\ell_m)` (per order, then averaged); ``"var_independent"``,
        ``"mean_independent"``: the moments :func:`dot_product_moments` predicts from each coordinate's
        mean and variance, i.e. if all coordinates and :math:`q, k` were independent.

    Raises
    ------
    ValueError
        If ``q``, ``k`` are not finite matching ``[P >= 2, d_k]`` arrays, or a size is outside ``[1, d_k]``.
    """
    qa, ka = real_array("q", q), real_array("k", k)
    if qa.ndim != 2 or qa.shape != ka.shape or qa.shape[0] < 2:
        raise ValueError(f"q and k must be matching [P, d_k] arrays, P >= 2; got {qa.shape} and {ka.shape}")
    P, d = qa.shape
    if sizes is None:
        sz = sorted(set([2**i for i in range(int(math.log2(d)) + 1)] + [d]))
    else:
        sz = list(sizes)
        for s in sz:
            check_int(s, "sizes (integers)", None)
            if not 1 <= s <= d:
                raise ValueError(f"every size must lie in [1, d_k={d}], got {s}")
    sz_arr = np.asarray(sz, dtype=np.int64)
    n_ord = check_int(n_orders, "n_orders", 1)
    gen = as_generator(0 if rng is None else rng)
    prod = qa * ka
    mq, vq = qa.mean(0), qa.var(0)
    mk, vk = ka.mean(0), ka.var(0)
    ind_mean_c, ind_var_c = mq * mk, vq * vk + vq * mk**2 + vk * mq**2
    keys = ("mean", "var", "var_scaled", "snr", "mean_independent", "var_independent")
    acc = {key: np.zeros(sz_arr.size) for key in keys}
    for _ in range(n_ord):
        perm = gen.permutation(d)
        cum = np.cumsum(prod[:, perm], axis=1)[:, sz_arr - 1]
        mean, var = cum.mean(0), cum.var(0)
        acc["mean"] += mean
        acc["var"] += var
        acc["var_scaled"] += var / sz_arr
        with np.errstate(divide="ignore", invalid="ignore"):
            acc["snr"] += np.where(var > 0, np.abs(mean) / np.sqrt(np.where(var > 0, var, 1.0)), np.nan)
        acc["mean_independent"] += np.cumsum(ind_mean_c[perm])[sz_arr - 1]
        acc["var_independent"] += np.cumsum(ind_var_c[perm])[sz_arr - 1]
    out = {key: v / n_ord for key, v in acc.items()}
    out["sizes"] = sz_arr
    return out


def attention_logit_statistics(cap: QueryKeyCapture, skip_first: bool = False,
                               max_pairs: int | None = 200_000, rng=None) -> dict[str, np.ndarray]:
    r"""Per-head statistics of the raw attention logits :math:`q_i\cdot k_j` of one layer.

    Parameters
    ----------
    cap, skip_first, max_pairs, rng
        As in :func:`logit_pairs`; ``max_pairs`` is per head (default 200000 here).

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[n_heads]``
        ``"mean"``, ``"var"`` of the raw logit; ``"var_scaled"`` of the logit times ``cap.scaling``
        (:math:`1/\sqrt{d_k}`); ``"snr"`` :math:`|E\ell|/\mathrm{sd}(\ell)`; ``"shared_mean"``:
        :math:`\bar q\cdot\bar k` (the logit of the mean query and mean key); ``"var_independent"``:
        :func:`dot_product_moments` from the coordinates' means and variances; ``"q_norm2"``,
        ``"k_norm2"``: mean squared norms.

    Raises
    ------
    TypeError, ValueError
        As :func:`logit_pairs`.
    """
    skip_first = _check_capture(cap, skip_first)
    mp = None if max_pairs is None else check_int(max_pairs, "max_pairs", 1)
    gen = as_generator(0 if rng is None else rng)
    keys = ("mean", "var", "var_scaled", "snr", "shared_mean", "var_independent", "q_norm2", "k_norm2")
    out = {key: np.zeros(cap.n_heads) for key in keys}
    for h in range(cap.n_heads):
        q, k = _logit_pairs(cap, h, skip_first, mp, gen)
        logit = np.einsum("pc,pc->p", q, k)
        mean, var = logit.mean(), logit.var()
        out["mean"][h] = mean
        out["var"][h] = var
        out["var_scaled"][h] = var * cap.scaling**2
        out["snr"][h] = abs(mean) / math.sqrt(var) if var > 0 else np.nan
        out["shared_mean"][h] = float(q.mean(0) @ k.mean(0))
        out["var_independent"][h] = float(_dot_product_moments(q.mean(0), q.var(0), k.mean(0), k.var(0))[1])
        out["q_norm2"][h] = float(np.mean(np.sum(q * q, axis=1)))
        out["k_norm2"][h] = float(np.mean(np.sum(k * k, axis=1)))
    return out


def centred_logit_statistics(cap: QueryKeyCapture, skip_first: bool = False) -> dict[str, np.ndarray]:
    r"""Per-head statistics of the *per-query-centred* logits, the part the softmax responds to.

    Parameters
    ----------
    cap : QueryKeyCapture
    skip_first : bool, default False
        Drop the first token of every text as query and as key (the attention sink).

    Returns
    -------
    dict of numpy.ndarray, each of shape ``[n_heads]``
        ``"snr_raw"``: :math:`|E\ell|/\mathrm{sd}(\ell)` over the same pairs (as in
        :func:`attention_logit_statistics`); ``"query_constant_share"``: the share of
        :math:`\mathrm{Var}(\ell)` constant within each query's row, which the softmax ignores;
        ``"snr_centred"``: :math:`\mathrm{rms}(s)/\mathrm{rms}(r)`, the shared-mean signal that survives
        centring, with :math:`c_{ij} = \ell_{ij} - \overline{\ell_{i\cdot}} = s_{ij} + r_{ij}`,
        :math:`s_{ij} = \bar q\cdot(k_j - \bar k_{(i)})`,
        :math:`r_{ij} = (q_i - \bar q)\cdot(k_j - \bar k_{(i)})`;
        ``"var_centred"``: the mean of :math:`c_{ij}^2`; ``"n_pairs"``.

    Raises
    ------
    ValueError
        If no query has two keys to compare.
    """
    groups = _text_groups(cap, _check_capture(cap, skip_first), 2)
    if not groups:
        raise ValueError("no query has two keys to compare; pass longer texts or skip_first=False")
    keys = ("snr_raw", "query_constant_share", "snr_centred", "var_centred", "n_pairs")
    out = {key: np.zeros(cap.n_heads) for key in keys}
    every = np.concatenate(groups)
    for h in range(cap.n_heads):
        kv = cap.kv_head(h)
        q_bar = cap.q[every, h].astype(np.float64).mean(0)
        acc = np.zeros(6)  # n, sum l, sum l^2, sum c^2, sum s^2, sum r^2
        for idx in groups:
            q = cap.q[idx, h].astype(np.float64)
            k = cap.k[idx, kv].astype(np.float64)
            pos = cap.position[idx]
            mask = (pos[None, :] <= pos[:, None]) if cap.causal else np.ones((idx.size,) * 2, bool)
            mask &= (mask.sum(1) >= 2)[:, None]
            n_i = np.maximum(mask.sum(1), 1)
            logit = q @ k.T
            row_mean = np.where(mask, logit, 0.0).sum(1) / n_i
            c = np.where(mask, logit - row_mean[:, None], 0.0)
            k_bar = (mask.astype(np.float64) @ k) / n_i[:, None]
            s_part = np.where(mask, (k @ q_bar)[None, :] - (k_bar @ q_bar)[:, None], 0.0)
            r_part = c - s_part
            lv = logit[mask]
            acc += (lv.size, lv.sum(), (lv * lv).sum(), (c * c).sum(), (s_part ** 2).sum(),
                    (r_part ** 2).sum())
        n = acc[0]
        mean = acc[1] / n
        var = acc[2] / n - mean ** 2
        out["snr_raw"][h] = abs(mean) / math.sqrt(var) if var > 0 else np.nan
        out["var_centred"][h] = acc[3] / n
        out["query_constant_share"][h] = 1.0 - acc[3] / n / var if var > 0 else np.nan
        out["snr_centred"][h] = math.sqrt(acc[4] / acc[5]) if acc[5] > 0 else np.nan
        out["n_pairs"][h] = n
    return out
