"""What a real model computes from its residual stream: logits (logit lens), loss, embeddings."""

from __future__ import annotations

import numpy as np
import torch

from companion._validation import check_int, check_texts
from companion.transformers.models import LoadedModel, _tokenize, check_model

__all__ = ["logits_from_residual", "next_token_loss", "sentence_embedding"]


def _check_causal(m) -> None:
    """TypeError unless a LoadedModel, ValueError unless it has a next-token head."""
    check_model(m)
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder without a next-token head; "
                         "use a causal LM such as smollm2-135m")


def _batches(m: LoadedModel, texts, batch_size, max_length):
    """Check ``texts`` and ``batch_size``; yield the encodings of the batches."""
    batch_size = check_int(batch_size, "batch_size", 1)
    texts = check_texts(texts, single=True)
    for start in range(0, len(texts), batch_size):
        yield _tokenize(m, texts[start:start + batch_size], max_length)


def logits_from_residual(m: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    """Next-token logits from residual-stream vectors: the final norm, then the unembedding.

    On an earlier layer this is the "logit lens" of :cite:t:`nostalgebraist2020logitlens`.

    Parameters
    ----------
    m : LoadedModel
        A causal language model (``m.kind == "causal-lm"``).
    h : torch.Tensor, shape ``[..., d_model]``
        Raw residual stream after the last block, e.g. ``residual_stream(m, texts)[-1]``.

    Returns
    -------
    torch.Tensor, shape ``[..., vocab]``
        ``W_U · FinalNorm(h)``; equals ``model(...).logits`` for the same run.

    Raises
    ------
    TypeError, ValueError
        If ``h`` is not a tensor, the model has no next-token head, or ``h`` does not end with ``d_model``.
    """
    _check_causal(m)
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor, got {type(h).__name__}")
    if h.shape[-1] != m.d_model:
        raise ValueError(f"h must end with the model width {m.d_model}, got shape {tuple(h.shape)}")
    return _logits(m, h)


def _logits(m: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    """:func:`logits_from_residual` of a checked causal LM and tensor."""
    with torch.no_grad():
        h = h.to(device=m.device, dtype=m.dtype)
        if m.final_norm is not None:
            h = m.final_norm(h)
        logits = m.model.get_output_embeddings()(h)
        cap = getattr(m.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits


def next_token_loss(m: LoadedModel, texts, batch_size: int = 8, max_length: int | None = None,
                    per_text: bool = False):
    """Mean next-token cross-entropy (nats per predicted token) of a causal LM on texts.

    Parameters
    ----------
    m : LoadedModel
        A causal language model, with its current weights.
    texts, max_length
        As :func:`~companion.transformers.models.tokenize`.
    batch_size : int, default 8
    per_text : bool, default False
        Return one mean per text instead of the mean over all predicted tokens.

    Returns
    -------
    float or numpy.ndarray
        ``-(1/N) Σ log p(x_{t+1} | x_{≤t})`` over real next tokens (``exp``: the perplexity).

    Raises
    ------
    ValueError
        For an encoder model, empty texts or a text of a single token.
    """
    _check_causal(m)
    total, count, per = 0.0, 0, []
    with torch.no_grad():
        for enc in _batches(m, texts, batch_size, max_length):
            mask = enc["attention_mask"]
            if (mask.sum(dim=1) < 2).any():
                raise ValueError("every text needs at least two tokens to predict a next token")
            out = m.model(input_ids=enc["input_ids"], attention_mask=mask, use_cache=False)
            logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
            nll = -logp.gather(-1, enc["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
            valid = mask[:, 1:].bool()
            nll = torch.where(valid, nll, torch.zeros_like(nll))
            total += float(nll.sum())
            count += int(valid.sum())
            per.extend((nll.sum(1) / valid.sum(1)).cpu().tolist())
    return np.asarray(per) if per_text else total / count


def sentence_embedding(m: LoadedModel, texts, batch_size: int = 32,
                       max_length: int | None = None) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2.

    Parameters
    ----------
    m, texts, batch_size, max_length
        As :func:`~companion.transformers.readout.next_token_loss` (any model; ``batch_size`` 32).

    Returns
    -------
    torch.Tensor, shape ``[n_texts, d_model]``
        ``u / ‖u‖``, ``u`` the mean last hidden state over real tokens :cite:`reimers2019sbert`.

    Raises
    ------
    ValueError
        Empty texts or bad ``batch_size``.
    """
    check_model(m)
    out = []
    with torch.no_grad():
        for enc in _batches(m, texts, batch_size, max_length):
            hidden = m.base(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                            use_cache=False).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
    return torch.cat(out)
