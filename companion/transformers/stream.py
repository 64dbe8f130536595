"""Read and perturb the raw residual stream of a real Transformer with forward hooks.

A model with ``L`` blocks has ``L + 1`` states: ``h_0`` is the input of block 0 (the embedding output;
LayerNorm-ed for BERT/MiniLM) and ``h_l`` the output of block ``l − 1``, transformers'
``output_hidden_states[l]`` for ``l < L``; for pre-norm models ``h_L`` is the last block's raw output
(transformers reports it after the final norm).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from numbers import Integral

import numpy as np
import torch

from companion._validation import check_layer, check_real, check_vector
from companion.transformers.hooks import hooks
from companion.transformers.models import LoadedModel, _encode, check_model
from companion.transformers.readout import _logits

__all__ = ["residual_stream", "inject", "ModelAdapter", "forward_states", "position_mask"]


@functools.cache
def _forward_parameters(cls) -> frozenset:
    return frozenset(inspect.signature(cls.forward).parameters)


def _forward_inputs(m: LoadedModel, enc: dict) -> dict:
    """Keyword arguments of ``m.base`` for an encoding (no key/value cache)."""
    params = _forward_parameters(type(m.base))
    kwargs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if "token_type_ids" in enc and "token_type_ids" in params:
        kwargs["token_type_ids"] = enc["token_type_ids"]
    if "use_cache" in params:
        kwargs["use_cache"] = False  # replayed blocks must not append to a key/value cache
    return kwargs


def position_mask(attention_mask: torch.Tensor, positions=None) -> torch.Tensor:
    """Boolean ``[batch, tokens]`` mask of the token positions to inject at.

    Parameters
    ----------
    attention_mask : torch.Tensor, shape ``[batch, tokens]``
        1 for real tokens, 0 for pads (pads at the end of each row).
    positions : None, sequence of int, or bool array ``[batch, tokens]``
        ``None``: every real token.  ``i ≥ 0``: the ``i``-th token of every text; ``-k``: the
        ``k``-th from the end of each text's real tokens.  A mask is restricted to real tokens.

    Returns
    -------
    torch.Tensor of bool, shape ``[batch, tokens]``
        True at the selected real tokens.

    Raises
    ------
    TypeError, ValueError
        If ``positions`` has the wrong type, a position lies outside a text, or nothing is selected.

    Examples
    --------
    >>> position_mask(torch.tensor([[1, 1, 1], [1, 1, 0]]), [-1]).int()
    tensor([[0, 0, 1],
            [0, 1, 0]], dtype=torch.int32)
    """
    real = attention_mask.bool()
    if positions is None:
        return real.clone()
    if isinstance(positions, (np.ndarray, torch.Tensor)) and positions.dtype in (np.bool_, torch.bool):
        pos = torch.as_tensor(positions, device=real.device)
        if tuple(pos.shape) != tuple(real.shape):
            raise ValueError(f"a boolean positions mask must have shape {tuple(real.shape)}, "
                             f"got {tuple(pos.shape)}")
        sel = pos & real
    else:
        if isinstance(positions, Integral) and not isinstance(positions, bool):
            positions = [positions]
        if isinstance(positions, (np.ndarray, torch.Tensor)):
            positions = positions.tolist()
        if not isinstance(positions, Sequence) or isinstance(positions, str):
            raise TypeError("positions must be None, a list of token indices, "
                            "or a boolean [batch, tokens] mask")
        if len(positions) == 0:
            raise ValueError("positions is empty; pass None to inject at every token")
        lengths = real.sum(dim=1)
        sel = torch.zeros_like(real)
        for p in positions:
            if isinstance(p, bool) or not isinstance(p, Integral):
                raise TypeError(f"positions must be integers, got {p!r}")
            idx = torch.full_like(lengths, int(p)) if p >= 0 else lengths + int(p)
            bad = (idx < 0) | (idx >= lengths)
            if bad.any():
                row = int(torch.nonzero(bad)[0, 0])
                raise ValueError(f"position {p} lies outside text {row}, which has {int(lengths[row])} "
                                 "tokens; use positions valid for every text (negative indices count from "
                                 "each text's end)")
            sel[torch.arange(len(idx), device=real.device), idx] = True
    if not sel.any():
        raise ValueError("positions select no real token")
    return sel


def _added(h: torch.Tensor, delta: torch.Tensor, layer: int) -> torch.Tensor:
    """``h + delta``; ValueError if the sum overflows the stream's dtype where ``h`` was finite."""
    out = h + delta
    if not bool(torch.isfinite(out).all()) and bool(torch.isfinite(h).all()):
        raise ValueError(
            f"h_{layer} + scale·vector overflows {h.dtype} (max {torch.finfo(h.dtype).max:.4g}; the stream "
            f"already holds values up to {float(h.abs().max()):.4g}): use a smaller scale or a wider dtype")
    return out


def forward_states(m: LoadedModel, enc: dict, add: tuple[int, torch.Tensor] | None = None,
                   record_calls: bool = False):
    """One forward pass of ``m.base`` with hooks on every block, without argument checks.

    Parameters
    ----------
    m, enc
        The model and an encoding from :func:`companion.transformers.models.encode`.
    add : tuple (int, torch.Tensor) or None
        ``(layer, delta)`` adds ``delta`` (``[batch, tokens, d]``) to ``h_layer``.
    record_calls : bool
        Also return ``(args_without_hidden, kwargs, hidden_as_kwarg)`` of each block's call.

    Returns
    -------
    list of torch.Tensor, or (list, list)
        ``[h_0, ..., h_L]`` (and the block calls with ``record_calls``).
    """
    states: list[torch.Tensor | None] = [None] * (m.n_layers + 1)
    calls: list = [None] * m.n_layers

    def pre_hook(i):
        def hook(module, args, kwargs):
            if record_calls:
                calls[i] = (args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"}, not args)
            if i != 0:
                return None
            if not args and "hidden_states" not in kwargs:
                raise RuntimeError("could not find the hidden states among a block's arguments")
            h = args[0] if args else kwargs["hidden_states"]
            if add is None or add[0] != 0:
                states[0] = h
                return None
            states[0] = h = _added(h, add[1], 0)
            return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
        return hook

    def post_hook(i):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            if add is None or add[0] != i + 1:
                states[i + 1] = h
                return None
            states[i + 1] = h = _added(h, add[1], i + 1)
            return (h, *output[1:]) if isinstance(output, tuple) else h
        return hook

    blocks = list(m.blocks)
    with hooks(pre={b: pre_hook(i) for i, b in enumerate(blocks)},
               forward={b: post_hook(i) for i, b in enumerate(blocks)}, pre_with_kwargs=True):
        with torch.no_grad():
            m.base(**_forward_inputs(m, enc))
    if any(s is None for s in states):
        raise RuntimeError(f"{m.name}: not every block ran; the model's forward skipped blocks")
    return (states, calls) if record_calls else states


def residual_stream(m: LoadedModel, texts, max_length: int | None = None) -> torch.Tensor:
    """The raw residual stream at every layer for a batch of texts.

    Parameters
    ----------
    m : LoadedModel
    texts : str, sequence of str, or an encoding from :func:`companion.transformers.models.tokenize`
    max_length : int or None
        Truncation length (default ``m.max_length``).

    Returns
    -------
    torch.Tensor, shape ``[L+1, batch, tokens, d]``, on ``m.device``
        Index ``l`` is ``h_l``; ignore the rows of pad tokens.

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.transformers.models.tokenize`.

    Examples
    --------
    >>> residual_stream(load("minilm-l6"), ["One sentence.", "Two."]).shape      # doctest: +SKIP
    torch.Size([7, 2, 5, 384])
    """
    check_model(m)
    return torch.stack(forward_states(m, _encode(m, texts, max_length)))


def inject(m: LoadedModel, texts, layer: int, vector, scale: float = 1.0, positions=None,
           max_length: int | None = None) -> torch.Tensor:
    """Residual stream of the run in which ``scale · vector`` is added to ``h_layer``.

    One forward pass with a hook on block ``layer - 1``, as in :cite:t:`hahami2025disturbance`.

    Parameters
    ----------
    m, texts, max_length
        As :func:`~companion.transformers.stream.residual_stream`.
    layer : int in ``[0, L]``
        Where to add, indexed as in :func:`~companion.transformers.stream.residual_stream`.
    vector : torch.Tensor or numpy.ndarray, shape ``[d]``
        The direction added, times the finite ``scale``.
    scale : float, default 1.0
    positions : None, sequence of int, or bool ``[batch, tokens]``
        Tokens that receive the vector, as :func:`~companion.transformers.stream.position_mask`.

    Returns
    -------
    torch.Tensor, shape ``[L+1, batch, tokens, d]``
        ``h'_0 .. h'_L`` of the injected run (``h'_l = h_l`` for ``l < layer``).

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type; if ``layer`` is outside ``[0, L]``, ``vector`` has not ``d``
        finite entries, ``scale · vector`` or ``h_layer + scale · vector`` overflows the dtype, or ``texts``/``positions``
        are invalid.

    Examples
    --------
    >>> h = inject(m, ["The cat sat."], layer=3, vector=v, scale=8.0)  # doctest: +SKIP
    """
    check_model(m)
    layer = check_layer(layer, m.n_layers, m.name)
    scale = check_real(scale, "scale")
    vec = check_vector(vector, m.d_model, dtype=m.dtype, device=m.device, scales=(scale,), where=m.name)
    enc = _encode(m, texts, max_length)
    sel = position_mask(enc["attention_mask"], positions)
    delta = (scale * vec) * sel.unsqueeze(-1).to(vec.dtype)
    return torch.stack(forward_states(m, enc, add=(layer, delta)))


def _expand(value, k: int, batch: int):
    """Repeat a captured block argument across ``k`` stacked conditions (condition-major)."""
    if k == 1:
        return value
    if isinstance(value, torch.Tensor):
        # per-sequence tensors (masks, position ids, rotary tables) lead with the batch axis; 1-D are shared
        if value.ndim >= 2 and value.shape[0] == batch:
            return value.repeat(k, *([1] * (value.ndim - 1)))
        return value
    if isinstance(value, tuple):
        return tuple(_expand(v, k, batch) for v in value)
    if isinstance(value, list):
        return [_expand(v, k, batch) for v in value]
    if isinstance(value, dict):
        return {key: _expand(v, k, batch) for key, v in value.items()}
    return value


def _call_block(block, h, call, k, batch):
    """Call ``block`` on ``h`` with its recorded arguments, repeated for ``k`` stacked runs."""
    rest, kwargs, as_kw = _expand(call, k, batch)
    out = block(*rest, hidden_states=h, **kwargs) if as_kw else block(h, *rest, **kwargs)
    return out[0] if isinstance(out, tuple) else out


class ModelAdapter:
    """A real Transformer as the injection engine (:mod:`companion.injection.engine`) sees a model.

    Same interface as :class:`companion.stacks.tinylm.StackAdapter`; ``block(i, h, k)`` calls
    block ``i`` with the exact arguments transformers passed in the baseline run (masks, rotary
    embeddings; recorded by pre-hooks), repeated for ``k`` runs stacked along the batch axis.

    Parameters
    ----------
    m, texts, max_length
        As :func:`~companion.transformers.stream.residual_stream`.

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.transformers.models.encode`.
    """

    def __init__(self, m: LoadedModel, texts, max_length: int | None = None):
        check_model(m)
        self.model = m
        self.encoding = _encode(m, texts, max_length)
        self.n_layers, self.d_model, self.dtype, self.device = m.n_layers, m.d_model, m.dtype, m.device
        self.name = m.name
        self._run = None

    @property
    def baseline(self) -> list[torch.Tensor]:
        if self._run is None:
            self._run = forward_states(self.model, self.encoding, record_calls=True)
        return self._run[0]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.encoding["attention_mask"]

    def position_mask(self, positions) -> torch.Tensor:
        return position_mask(self.attention_mask, positions)

    def check_vector(self, vector, rows: int | None = None, scales=()) -> torch.Tensor:
        return check_vector(vector, self.d_model, rows, dtype=self.dtype, device=self.device, scales=scales,
                            where=self.name)

    def block(self, i: int, h: torch.Tensor, k: int) -> torch.Tensor:
        self.baseline  # noqa: B018 - records the block calls
        return _call_block(self.model.blocks[i], h, self._run[1][i], k, self.attention_mask.shape[0])

    def output(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.model.final_norm is None else self.model.final_norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor | None:
        return _logits(self.model, h) if self.model.kind == "causal-lm" else None


