r"""Outlier features of LLM.int8() :cite:`dettmers2022llmint8`, measured per layer.

A feature is an outlier when its magnitude reaches 6.0 in the normalised inputs of the linear layers
(read with pre-hooks) in at least 25% of the layers and 6% of the positions.  An argument of the
wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import check_bool, check_int, check_real, check_texts

__all__ = ["OutlierFeatureStatistics", "outlier_feature_statistics"]

#: Names of the first FFN linear layer (the expansion) in the supported architectures.
_FFN_NAMES = ("mlp.gate_proj", "mlp.up_proj", "intermediate.dense", "mlp.fc1", "fc1")
_QUERY_NAMES = ("self_attn.q_proj", "attention.self.query", "attn.q_proj")


@dataclass(frozen=True)
class OutlierFeatureStatistics:
    """Share of positions with :math:`|x| \\ge` threshold, per linear-input site and feature."""

    share: np.ndarray  #: ``[2L, d]``: row ``2l``: the attention input of block ``l``; ``2l+1``: its FFN input
    max_abs: np.ndarray  #: ``[2L, d]``: largest ``|x|`` at each site
    n_positions: int  #: real positions (pads excluded) behind every share
    threshold: float  #: the magnitude criterion
    n_layers: int  #: number of blocks ``L``
    model: str  #: name of the model

    def affected_layers(self, position_share: float = 0.06) -> np.ndarray:
        """Bool ``[L, d]``: feature ``j`` reaches the threshold on at least ``position_share`` of
        the positions at either linear input of block ``l``."""
        hit = self.share >= check_real(position_share, "position_share", lo=0.0, hi=1.0)
        return hit[0::2] | hit[1::2]

    def systematic(self, layer_share: float = 0.25, position_share: float = 0.06) -> np.ndarray:
        """Indices of the features that meet the criterion: affected (see
        :meth:`affected_layers`) in at least ``layer_share`` of the blocks.

        Raises
        ------
        ValueError
            If a share is not in [0, 1].
        """
        lay = check_real(layer_share, "layer_share", lo=0.0, hi=1.0)
        frac = self.affected_layers(position_share).mean(axis=0)
        return np.flatnonzero((frac >= lay) & (frac > 0))

    def per_layer(self, position_share: float = 0.06) -> np.ndarray:
        """Number of affected features per block, ``[L]``."""
        return self.affected_layers(position_share).sum(axis=1)


def _find(block, names):
    import torch

    for name, mod in block.named_modules():
        if isinstance(mod, torch.nn.Linear) and any(name == n or name.endswith("." + n) for n in names):
            return mod
    return None


def _linear_input_sites(m) -> list:
    """(query projection, first FFN linear) of every block; their inputs are LLM.int8()'s hidden states."""
    from companion.transformers.models import check_model

    check_model(m)
    out = []
    for l, block in enumerate(m.blocks):
        q, f = _find(block, _QUERY_NAMES), _find(block, _FFN_NAMES)
        if q is None or f is None:
            raise ValueError(f"block {l} of {m.name} has no query projection ({_QUERY_NAMES}) or FFN "
                             f"expansion ({_FFN_NAMES}); this architecture is not supported")
        out.append((q, f))
    return out


def outlier_feature_statistics(m, texts, threshold: float = 6.0, batch_size: int = 8,
                               max_length: int | None = None,
                               skip_first: bool = False) -> OutlierFeatureStatistics:
    r"""Per block and feature, the share of positions where a normalised linear input reaches ``threshold``.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
    texts : sequence of str
    threshold : float, default 6.0
        LLM.int8()'s magnitude criterion.
    batch_size : int, default 8
    max_length : int or None
    skip_first : bool, default False
        Leave out the first position of every text (where massive activations sit).

    Returns
    -------
    OutlierFeatureStatistics

    Raises
    ------
    ValueError
        If ``texts`` is empty, ``threshold < 0``, no position is left, or a block's linears are unknown.
    """
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import tokenize

    sites = _linear_input_sites(m)
    texts = check_texts(texts, single=True)
    t = check_real(threshold, "threshold", lo=0.0)
    bs = check_int(batch_size, "batch_size", 1)
    skip_first = check_bool(skip_first, "skip_first")
    L, d = m.n_layers, m.d_model
    counts = np.zeros((2 * L, d), dtype=np.int64)
    max_abs = np.zeros((2 * L, d))
    n_pos = 0
    keep = None

    def reader(s):
        def hook(module, args):
            x = args[0].detach()[keep].abs().double()            # [positions, d]
            counts[s] += (x >= t).sum(0).cpu().numpy()
            if x.shape[0]:
                max_abs[s] = np.maximum(max_abs[s], x.max(0).values.cpu().numpy())
        return hook

    pre = [(mod, reader(2 * l + k)) for l, pair in enumerate(sites) for k, mod in enumerate(pair)]
    with hooks(pre=pre), torch.no_grad():
        for start in range(0, len(texts), bs):
            enc = tokenize(m, list(texts[start:start + bs]), max_length)
            keep = enc["attention_mask"].bool().clone()
            if skip_first:
                keep[:, 0] = False
            n_pos += int(keep.sum())
            kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
            if m.kind == "causal-lm":
                kwargs["use_cache"] = False
            m.base(**kwargs)
    if n_pos == 0:
        raise ValueError("no position is left; pass longer texts or skip_first=False")
    return OutlierFeatureStatistics(share=counts / n_pos, max_abs=max_abs, n_positions=n_pos,
                                    threshold=t, n_layers=L, model=m.name)
