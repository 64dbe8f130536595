r"""Massive activations :cite:`sun2024massive`: first-token profiles and the zero/mean ablation.

The ablation watches the loss and the attention paid to the first token (the sink of
:cite:t:`xiao2024attentionsinks`).  An argument of the wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import check_int, check_real, check_texts

__all__ = ["FirstTokenProfile", "first_token_profile", "AblationRun", "ablate_activation"]


def _model_texts_channel(m, texts, channel, causal: bool) -> tuple[list[str], int]:
    """Check the model (a causal LM when ``causal``), then the texts and the channel index."""
    from companion.transformers.models import check_model

    check_model(m)
    if causal and m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder; the ablation measures next-token loss and needs a "
                         "causal language model such as smollm2-135m")
    texts = check_texts(texts, single=True)
    channel = check_int(channel, "channel", 0)
    if channel >= m.d_model:
        raise ValueError(f"channel {channel} is outside [0, {m.d_model - 1}] (width of {m.name})")
    return texts, channel


@dataclass(frozen=True)
class FirstTokenProfile:
    """One channel of the residual stream at the first position, for every layer and text."""

    values: np.ndarray  #: ``[L+1, n_texts]``: :math:`h_\ell[0, j]` (layer 0 = embeddings)
    median_abs: np.ndarray  #: ``[L+1]``: median :math:`|h_\ell|` over the texts' real tokens and channels
    channel: int  #: the channel ``j``

    @property
    def mean(self) -> np.ndarray:
        """Mean over texts of the first-token value, per layer ``[L+1]``."""
        return self.values.mean(axis=1)

    @property
    def ratio(self) -> np.ndarray:
        """``|mean| / median_abs`` per layer: Sun et al.'s size relative to the median."""
        return np.abs(self.mean) / self.median_abs

    def emergence_layer(self, min_abs: float = 100.0, min_ratio: float = 1000.0) -> int | None:
        """First layer whose mean first-token value exceeds ``min_abs`` and ``min_ratio`` times
        the median (Sun et al.: about 100 and about 1000); None if no layer does.

        Raises
        ------
        TypeError, ValueError
            If a bound is not a number >= 0.
        """
        a = check_real(min_abs, "min_abs", lo=0.0)
        r = check_real(min_ratio, "min_ratio", lo=0.0)
        hit = np.flatnonzero((np.abs(self.mean) > a) & (self.ratio > r))
        return int(hit[0]) if hit.size else None


def first_token_profile(m, texts, channel: int, max_length: int | None = None,
                        median_texts: int = 16) -> FirstTokenProfile:
    r"""The value of one channel at the first token of every text, at every layer.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
    texts : sequence of str
    channel : int
        Channel index in ``[0, d)``.
    max_length : int or None
        Truncation for the median (default ``m.max_length``).
    median_texts : int, default 16
        The layers' median :math:`|h|` (a scale) is over the real tokens of the first ``median_texts`` texts.

    Returns
    -------
    FirstTokenProfile

    Raises
    ------
    ValueError
        If ``channel`` is outside the width or ``texts`` is empty.
    """
    from companion.transformers import stream
    from companion.transformers.models import tokenize

    texts, channel = _model_texts_channel(m, texts, channel, causal=False)
    n_med = check_int(median_texts, "median_texts", 1)
    first_len = 2 if m.kind == "causal-lm" else max_length
    values = []
    for start in range(0, len(texts), 32):
        h = stream.residual_stream(m, texts[start:start + 32], max_length=first_len)
        values.append(h[:, :, 0, channel].double().cpu().numpy())
    h = stream.residual_stream(m, texts[:n_med], max_length=max_length)
    real = tokenize(m, texts[:n_med], max_length)["attention_mask"].bool()
    med = np.array([float(h[l][real].abs().double().median()) for l in range(h.shape[0])])
    return FirstTokenProfile(values=np.concatenate(values, axis=1), median_abs=med, channel=channel)


@dataclass(frozen=True)
class AblationRun:
    """Per-text loss and first-token attention of one (possibly ablated) run."""

    loss: np.ndarray  #: ``[n_texts]``: mean next-token cross-entropy (nats) of each text
    #: ``[n_texts, L]``: attention weight on the first token, averaged over the heads and the query
    #: positions ``1 .. n-1`` of each text, per block
    sink: np.ndarray
    layer: int | None  #: the residual-stream layer :math:`h_\ell` that was edited (None: no edit)
    channel: int  #: the channel edited
    position: int  #: the position edited
    value: float | None  #: the value written (None: no edit)


def ablate_activation(m, texts, layer: int | None, channel: int, value: float | None,
                      position: int = 0, batch_size: int = 16,
                      max_length: int | None = None) -> AblationRun:
    r"""Set :math:`h_\ell[\mathrm{position}, \mathrm{channel}]` to ``value`` and measure loss and sinks.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
        A causal language model.
    texts : sequence of str
        Every text needs at least two tokens.
    layer : int or None
        Residual-stream layer :math:`\ell \in [1, L]` (output of block :math:`\ell-1`); None: baseline run.
    channel : int
    value : float or None
        The value written (Sun et al.: 0 or the mean over inputs); None with ``layer=None``.
    position, batch_size, max_length
        Position edited (default 0), texts per batch (16), truncation (None: ``m.max_length``).

    Returns
    -------
    AblationRun

    Raises
    ------
    ValueError
        For an encoder, a layer or channel out of range, one of ``layer``/``value`` None, a one-token text.
    """
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import tokenize

    texts, channel = _model_texts_channel(m, texts, channel, causal=True)
    position = check_int(position, "position", 0)
    bs = check_int(batch_size, "batch_size", 1)
    if (layer is None) != (value is None):
        raise ValueError("layer and value go together: both None (baseline) or both set")
    if layer is not None:
        layer = check_int(layer, "layer", 1)
        if layer > m.n_layers:
            raise ValueError(f"layer {layer} is outside [1, {m.n_layers}] (h_l = output of block l-1)")
        value = check_real(value, "value")

    def edit(module, args, output):
        hs = (output[0] if isinstance(output, tuple) else output).clone()
        if hs.shape[1] > position:
            hs[:, position, channel] = value
        return (hs,) + tuple(output[1:]) if isinstance(output, tuple) else hs

    forward = [] if layer is None else [(m.blocks[layer - 1], edit)]
    previous = m.model.config._attn_implementation
    losses, sinks = [], []
    try:
        m.model.set_attn_implementation("eager")
        with hooks(forward=forward), torch.no_grad():
            for start in range(0, len(texts), bs):
                enc = tokenize(m, texts[start:start + bs], max_length)
                mask = enc["attention_mask"]
                if (mask.sum(dim=1) < 2).any():
                    raise ValueError("every text needs at least two tokens to predict a next token")
                out = m.model(input_ids=enc["input_ids"], attention_mask=mask, use_cache=False,
                              output_attentions=True)
                logp = torch.log_softmax(out.logits[:, :-1].double(), dim=-1)
                nll = -logp.gather(-1, enc["input_ids"][:, 1:, None])[..., 0]
                valid = mask[:, 1:].bool()
                losses.append(((nll * valid).sum(1) / valid.sum(1)).cpu().numpy())
                # attention on key 0 from the real queries 1..n-1, averaged over heads: [B, L]
                per_layer = [a[:, :, 1:, 0].double().mean(1) for a in out.attentions]
                w = torch.stack(per_layer, dim=-1)                    # [B, T-1, L]
                sinks.append(((w * valid[..., None]).sum(1) / valid.sum(1)[:, None]).cpu().numpy())
    finally:
        m.model.set_attn_implementation(previous)
    return AblationRun(loss=np.concatenate(losses), sink=np.concatenate(sinks), layer=layer,
                       channel=channel, position=position, value=value)
