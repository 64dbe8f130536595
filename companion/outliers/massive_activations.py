r"""Massive activations :cite:`sun2024massive`: first-token profiles and the zero/mean ablation.

The ablation watches the loss and the attention paid to the first token (the sink of
:cite:t:`xiao2024attentionsinks`).  An argument of the wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import check_int, check_real, check_texts

__all__ = ["FirstTokenProfile", "first_token_profile", "AblationRun", "ablate_activation", "StreamEdit",
           "EditedRun", "edited_run", "TokenMap", "token_map", "EDIT_SITES"]


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


# ----------------------------------------------------------------------------- causal map (issue 27)
#: Where an :class:`StreamEdit` writes: the residual stream, or the write of a block's sublayer.
EDIT_SITES = ("residual", "attention", "mlp")
_SUBLAYER_NAMES = {"attention": ("self_attn", "attention.output.dense"), "mlp": ("mlp", "output.dense")}
_VALUE_NAMES = ("self_attn.v_proj", "attention.self.value")


@dataclass(frozen=True)
class StreamEdit:
    r"""One intervention: ``channel`` of a site set to ``value`` at the chosen positions.

    ``site="residual"``: :math:`h_\ell` with :math:`\ell` = ``layer`` in ``[1, L]`` (the output of block
    :math:`\ell-1`); ``"attention"``/``"mlp"``: what block ``layer`` (in ``[0, L)``) writes through that
    sublayer (its output before the residual addition).  ``positions``: ``"first"``, ``"all"`` or a
    tuple of token ids (every real position holding one of them).
    """

    site: str
    layer: int
    channel: int
    positions: str | tuple = "first"
    value: float = 0.0


@dataclass(frozen=True)
class EditedRun:
    """Per-text outcome of a run with edits (:func:`edited_run`)."""

    loss: np.ndarray | None  #: ``[n]`` mean next-token cross-entropy (causal LM), else None
    embedding: np.ndarray | None  #: ``[n, d]`` unit sentence embedding (encoder), else None
    trace: np.ndarray  #: ``[L, n]``: :math:`h_\ell[0, c]` for ``trace_channel`` c, ``l = 1..L`` (after edits)


def _module(block, names, what: str):
    for name, mod in block.named_modules():
        if name in names:
            return mod
    raise ValueError(f"no {what} module ({', '.join(names)}) in {type(block).__name__}")


def _check_edit(m, e) -> StreamEdit:
    if not isinstance(e, StreamEdit):
        raise TypeError(f"edits must be StreamEdit objects, got {type(e).__name__}")
    if e.site not in EDIT_SITES:
        raise ValueError(f"site must be one of {EDIT_SITES}, got {e.site!r}")
    lo, hi = (1, m.n_layers) if e.site == "residual" else (0, m.n_layers - 1)
    layer = check_int(e.layer, "layer", lo)
    if layer > hi:
        raise ValueError(f"layer {layer} of a {e.site} edit is outside [{lo}, {hi}]")
    channel = check_int(e.channel, "channel", 0)
    if channel >= m.d_model:
        raise ValueError(f"channel {channel} is outside [0, {m.d_model - 1}] (width of {m.name})")
    pos = e.positions
    if isinstance(pos, str):
        if pos not in ("first", "all"):
            raise ValueError(f"positions must be 'first', 'all' or a tuple of token ids, got {pos!r}")
    elif isinstance(pos, tuple) and pos:
        pos = tuple(check_int(t, "token id", 0) for t in pos)
    else:
        raise TypeError(f"positions must be 'first', 'all' or a non-empty tuple of token ids, got {pos!r}")
    return StreamEdit(e.site, layer, channel, pos, check_real(e.value, "value"))


def _edit_hook(e: StreamEdit, batch: dict):
    """A forward hook writing ``e.value`` into the output (tensor or tuple) of a module."""
    import torch

    def hook(module, args, output):
        hs = (output[0] if isinstance(output, tuple) else output).clone()
        if e.positions == "first":
            hs[:, 0, e.channel] = e.value
        else:
            sel = batch["mask"] if e.positions == "all" else (
                torch.isin(batch["ids"], torch.as_tensor(e.positions)) & batch["mask"])
            hs[..., e.channel] = torch.where(sel, torch.full_like(hs[..., e.channel], e.value),
                                             hs[..., e.channel])
        return (hs,) + tuple(output[1:]) if isinstance(output, tuple) else hs
    return hook


def _output_of(output):
    return output[0] if isinstance(output, tuple) else output


def edited_run(m, texts, edits=(), trace_channel: int = 0, batch_size: int = 16,
               max_length: int | None = None) -> EditedRun:
    r"""Run a model with :class:`StreamEdit` interventions; per-text loss (or embedding) and a trace.

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
        A causal LM (loss) or an encoder (sentence embedding, as
        :func:`~companion.transformers.readout.sentence_embedding`).
    texts : sequence of str
    edits : sequence of StreamEdit
        Applied together in the same forward pass (``()``: the untouched model).
    trace_channel : int, default 0
        The channel whose first-token value is recorded at every layer (after the edits).
    batch_size, max_length
        Texts per batch (16); truncation (None: ``m.max_length``).

    Returns
    -------
    EditedRun

    Raises
    ------
    TypeError, ValueError
        A bad edit (site, layer, channel, positions), an empty text list, a one-token text (causal LM).
    """
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import tokenize

    texts, trace_channel = _model_texts_channel(m, texts, trace_channel, causal=False)
    edits = [_check_edit(m, e) for e in edits]
    bs = check_int(batch_size, "batch_size", 1)
    batch: dict = {}
    forward = []
    for e in edits:
        block = m.blocks[e.layer - 1] if e.site == "residual" else m.blocks[e.layer]
        mod = block if e.site == "residual" else _module(block, _SUBLAYER_NAMES[e.site], e.site)
        forward.append((mod, _edit_hook(e, batch)))
    trace = [[] for _ in range(m.n_layers)]

    def reader(l):
        def hook(module, args, output):
            trace[l].append(_output_of(output)[:, 0, trace_channel].double().cpu().numpy())
        return hook

    forward += [(b, reader(l)) for l, b in enumerate(m.blocks)]
    losses, embs = [], []
    with hooks(forward=forward), torch.no_grad():
        for start in range(0, len(texts), bs):
            enc = tokenize(m, texts[start:start + bs], max_length)
            mask = enc["attention_mask"]
            batch.update(ids=enc["input_ids"], mask=mask.bool())
            if m.kind == "causal-lm":
                if (mask.sum(dim=1) < 2).any():
                    raise ValueError("every text needs at least two tokens to predict a next token")
                out = m.model(input_ids=enc["input_ids"], attention_mask=mask, use_cache=False)
                logp = torch.log_softmax(out.logits[:, :-1].double(), dim=-1)
                nll = -logp.gather(-1, enc["input_ids"][:, 1:, None])[..., 0]
                valid = mask[:, 1:].bool()
                losses.append(((nll * valid).sum(1) / valid.sum(1)).cpu().numpy())
            else:
                kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
                hidden = m.base(**kwargs).last_hidden_state.double()
                w = mask[..., None].to(hidden.dtype)
                pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1)
                embs.append(torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy())
    return EditedRun(loss=np.concatenate(losses) if losses else None,
                     embedding=np.concatenate(embs) if embs else None,
                     trace=np.stack([np.concatenate(t) for t in trace]))


@dataclass(frozen=True)
class TokenMap:
    """Per layer and position of every text: one channel, the largest ``|h|`` and the value-vector norm."""

    ids: np.ndarray  #: ``[n, T]`` token ids (pads: the tokenizer's pad id)
    mask: np.ndarray  #: ``[n, T]`` True on real tokens
    value: np.ndarray  #: ``[L, n, T]``: :math:`h_\ell[t, c]`, ``l = 1..L`` (output of block ``l-1``)
    top_abs: np.ndarray  #: ``[L, n, T]``: :math:`\max_j |h_\ell[t, j]|`
    median_abs: np.ndarray  #: ``[L]``: median :math:`|h_\ell|` over real tokens and channels
    #: ``[L, n, T]``: :math:`\lVert v \rVert` (all heads) of position ``t`` in block ``l``'s attention
    value_norm: np.ndarray
    channel: int


def token_map(m, texts, channel: int, batch_size: int = 16, max_length: int | None = None) -> TokenMap:
    r"""Where the large activations sit: one channel and :math:`\max_j|h|` at every position and layer,
    with the norm of each position's value vector (what an attention sink passes on).

    Parameters
    ----------
    m : companion.transformers.models.LoadedModel
    texts : sequence of str
    channel : int
    batch_size, max_length
        As :func:`edited_run`; the arrays are ``max_length`` (default ``m.max_length``) wide.

    Returns
    -------
    TokenMap

    Raises
    ------
    TypeError, ValueError
        A channel outside the width, empty texts, an architecture without a known value projection.
    """
    import torch

    from companion.transformers.hooks import hooks
    from companion.transformers.models import tokenize

    texts, channel = _model_texts_channel(m, texts, channel, causal=False)
    bs = check_int(batch_size, "batch_size", 1)
    width = m.max_length if max_length is None else check_int(max_length, "max_length", 2)
    n, L = len(texts), m.n_layers
    value, top, vnorm = (np.zeros((L, n, width), np.float32) for _ in range(3))
    ids, mask = np.zeros((n, width), np.int64), np.zeros((n, width), bool)
    rows = slice(0, 0)
    hs_abs = [[] for _ in range(L)]

    def reader(l):
        def hook(module, args, output):
            h = _output_of(output).detach()
            T = h.shape[1]
            value[l, rows, :T] = h[..., channel].float().cpu().numpy()
            top[l, rows, :T] = h.abs().amax(-1).float().cpu().numpy()
            if len(hs_abs[l]) < 4:   # the median scale from the first batches' real tokens
                hs_abs[l].append(h[batch_mask[0]].abs().double().flatten().cpu().numpy())
        return hook

    def v_reader(l):
        def hook(module, args, output):
            v = output.detach()
            vnorm[l, rows, :v.shape[1]] = v.double().norm(dim=-1).float().cpu().numpy()
        return hook

    batch_mask = [None]
    forward = [(b, reader(l)) for l, b in enumerate(m.blocks)]
    forward += [(_module(b, _VALUE_NAMES, "value projection"), v_reader(l))
                for l, b in enumerate(m.blocks)]
    with hooks(forward=forward), torch.no_grad():
        for start in range(0, n, bs):
            enc = tokenize(m, texts[start:start + bs], width)
            rows = slice(start, start + enc["input_ids"].shape[0])
            T = enc["input_ids"].shape[1]
            batch_mask[0] = enc["attention_mask"].bool()
            ids[rows, :T], mask[rows, :T] = enc["input_ids"].cpu().numpy(), batch_mask[0].cpu().numpy()
            kwargs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
            if m.kind == "causal-lm":
                kwargs["use_cache"] = False
            m.base(**kwargs)
    med = np.array([float(np.median(np.concatenate(a))) for a in hs_abs])
    return TokenMap(ids=ids, mask=mask, value=value, top_abs=top, median_abs=med, value_norm=vnorm,
                    channel=channel)
