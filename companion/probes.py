"""Read and perturb the residual stream of a real Transformer with forward hooks.

Everything here runs the model's own modules (:class:`companion.models.LoadedModel`) and reads
their raw outputs: no weight folding, no re-centring, no re-implementation of a block.

Indexing of the residual stream
-------------------------------
A model with ``L`` blocks has ``L + 1`` residual-stream states ``h_0 .. h_L``:

* ``h_0`` is the input of block 0: the embedding output (token + position embeddings for
  GPT-2; token embeddings for Llama/SmolLM2, whose positions enter through rotary embeddings;
  for BERT/MiniLM the *LayerNorm-ed* sum of word, position and token-type embeddings).
* ``h_l`` for ``1 ≤ l ≤ L`` is the output of block ``l − 1``.

For ``l < L`` this is exactly ``output_hidden_states[l]`` of transformers.  At ``l = L`` the
two conventions differ for **pre-norm** models (SmolLM2, GPT-2, Pythia, Llama): transformers
reports the last hidden state *after* the final norm (``model.norm`` / ``ln_f``), while the
probes return the raw output of the last block, ``h_L``, so that every index is a point of the
same un-normalised residual stream; ``FinalNorm(h_L)`` is transformers' value, and
:func:`companion.models.logits_from_residual` turns ``h_L`` into next-token logits.  For
**post-norm** models (BERT, MiniLM) every block ends with a LayerNorm, there is no final norm,
and all ``L + 1`` indices equal transformers' hidden states (each already normalised).

Functions
---------
residual_stream
    ``[L+1, batch, tokens, d]`` for a batch of texts (one forward pass).
inject
    The residual stream of the run in which ``scale · vector`` is added to ``h_layer``.
ModelAdapter
    The model as the injection engine sees it (:mod:`companion.engine`: sweeps over many
    layers and scales that never recompute the blocks before an injection layer).
channel_statistics
    Per layer and channel: mean, variance, min, max, max |x| and exceedance counts
    ``C_j(t) = #{tokens: |h_j| > t}``, streamed over a corpus with an exact merge.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import torch

from companion._validation import (
    check_int, check_layer, check_real, check_texts, check_thresholds, check_vector,
)
from companion.hooks import hooks
from companion.models import LoadedModel, check_model, encode, logits_from_residual

__all__ = [
    "residual_stream",
    "inject",
    "ModelAdapter",
    "channel_statistics",
    "ChannelStatistics",
    "position_mask",
]


# --------------------------------------------------------------------------- inputs


def _forward_inputs(m: LoadedModel, enc: dict) -> dict:
    params = _forward_parameters(type(m.base))
    kwargs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if "token_type_ids" in enc and "token_type_ids" in params:
        kwargs["token_type_ids"] = enc["token_type_ids"]
    if "use_cache" in params:
        kwargs["use_cache"] = False  # replayed blocks must not append to a key/value cache
    return kwargs


_PARAMS_CACHE: dict[type, frozenset] = {}


def _forward_parameters(cls) -> frozenset:
    if cls not in _PARAMS_CACHE:
        _PARAMS_CACHE[cls] = frozenset(inspect.signature(cls.forward).parameters)
    return _PARAMS_CACHE[cls]


def position_mask(attention_mask: torch.Tensor, positions=None) -> torch.Tensor:
    """Boolean ``[batch, tokens]`` mask of the token positions to inject at.

    Parameters
    ----------
    attention_mask : torch.Tensor, shape ``[batch, tokens]``
        1 for real tokens, 0 for pads (pads at the end of each row).
    positions : None, sequence of int, or boolean array ``[batch, tokens]``
        ``None``: every real token.  Integers ``i ≥ 0`` select the ``i``-th token of every text;
        ``-k`` the ``k``-th token from the end of each text's *real* tokens (``-1`` = last).
        A boolean array is used as it is (restricted to real tokens).

    Returns
    -------
    torch.Tensor of bool, shape ``[batch, tokens]``

    Raises
    ------
    TypeError
        If ``positions`` has the wrong type.
    ValueError
        If a position lies outside a text, the mask has the wrong shape, or it selects nothing.

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
            raise ValueError(f"a boolean positions mask must have shape {tuple(real.shape)}, got {tuple(pos.shape)}")
        sel = pos & real
    else:
        if isinstance(positions, Integral) and not isinstance(positions, bool):
            positions = [positions]
        if isinstance(positions, (np.ndarray, torch.Tensor)):
            positions = positions.tolist()
        if not isinstance(positions, Sequence) or isinstance(positions, str):
            raise TypeError("positions must be None, a list of token indices, or a boolean [batch, tokens] mask")
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
                raise ValueError(
                    f"position {p} lies outside text {row}, which has {int(lengths[row])} tokens; "
                    "use positions valid for every text (negative indices count from each text's end)"
                )
            sel[torch.arange(len(idx), device=real.device), idx] = True
    if not sel.any():
        raise ValueError("positions select no real token")
    return sel


# --------------------------------------------------------------------------- one hooked forward
def _hidden_of(args, kwargs):
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RuntimeError("could not find the hidden states among a block's arguments")


def _run(m: LoadedModel, enc: dict, add: tuple[int, torch.Tensor] | None = None, record_calls: bool = False):
    """One forward pass of ``m.base`` with hooks on every block.

    Returns the list ``[h_0, ..., h_L]`` and, with ``record_calls``, the exact
    ``(args_without_hidden, kwargs, hidden_as_kwarg)`` each block was called with.
    ``add = (layer, delta)`` adds ``delta`` (``[batch, tokens, d]``) to ``h_layer``.
    """
    L = m.n_layers
    states: list[torch.Tensor | None] = [None] * (L + 1)
    calls: list = [None] * L

    def pre_hook(i):
        def hook(module, args, kwargs):
            if record_calls:
                as_kw = not args
                rest = args[1:] if args else ()
                kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                calls[i] = (rest, kw, as_kw)
            if i != 0:
                return None
            h = _hidden_of(args, kwargs)
            if add is not None and add[0] == 0:
                h = h + add[1]
                states[0] = h
                if args:
                    return (h, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": h}
            states[0] = h
            return None

        return hook

    def post_hook(i):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            if add is not None and add[0] == i + 1:
                h = h + add[1]
                output = (h, *output[1:]) if isinstance(output, tuple) else h
                states[i + 1] = h
                return output
            states[i + 1] = h
            return None

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
        From :func:`companion.models.load`.
    texts : str, sequence of str, or the output of :func:`companion.models.tokenize`
    max_length : int or None
        Truncation length (default ``m.max_length``).

    Returns
    -------
    torch.Tensor, shape ``[L+1, batch, tokens, d]``, on ``m.device``
        Index ``l`` is ``h_l`` (see the module docstring): ``h_0`` the embedding output, ``h_l``
        the output of block ``l-1``.  Rows of pad tokens (``tokenize(m, texts)["attention_mask"]
        == 0``) hold values that nothing else depends on; ignore them.

    Raises
    ------
    TypeError
        If ``m`` is not a LoadedModel or ``texts`` is not text.
    ValueError
        If ``texts`` is empty or contains an empty string.

    Notes
    -----
    For ``l < L``, ``h_l`` equals transformers' ``output_hidden_states[l]``.  For a pre-norm
    model, index ``L`` is the raw output of the last block; transformers' last hidden state is
    ``FinalNorm(h_L)`` (``m.final_norm``).  For a post-norm model index ``L`` equals it.

    Examples
    --------
    >>> m = companion.models.load("minilm-l6")                    # doctest: +SKIP
    >>> residual_stream(m, ["One sentence.", "Two."]).shape      # doctest: +SKIP
    torch.Size([7, 2, 5, 384])
    """
    check_model(m)
    enc = encode(m, texts, max_length)
    return torch.stack(_run(m, enc))


def inject(m: LoadedModel, texts, layer: int, vector, scale: float = 1.0, positions=None,
           max_length: int | None = None) -> torch.Tensor:
    """Residual stream of the run in which ``scale · vector`` is added to ``h_layer``.

    Parameters
    ----------
    m : LoadedModel
    texts : str, sequence of str, or an encoding from :func:`companion.models.tokenize`
    layer : int in ``[0, L]``
        Where to add: ``0`` adds to the embedding output (the input of block 0), ``l ≥ 1`` to
        the output of block ``l − 1`` -- the same indexing as :func:`residual_stream`.
        ``layer = L`` perturbs only the final state.
    vector : torch.Tensor or numpy.ndarray, shape ``[d]``
    scale : float, default 1.0
    positions : None, sequence of int, or boolean ``[batch, tokens]``
        Token positions that receive the vector (:func:`position_mask`); ``None`` = every real
        token.
    max_length : int or None

    Returns
    -------
    torch.Tensor, shape ``[L+1, batch, tokens, d]``
        ``h'_0 .. h'_L`` of the injected run; ``h'_l = h_l`` for ``l < layer`` and
        ``h'_layer = h_layer + scale · vector`` at the selected positions.

    Raises
    ------
    TypeError
        For arguments of the wrong type.
    ValueError
        If ``layer`` is outside ``[0, L]``, ``vector`` does not have ``d`` entries or is not
        finite, ``scale`` is not finite, ``vector`` or ``scale · vector`` overflows the model's
        dtype (e.g. 1e5 in float16), ``texts`` is empty, or ``positions`` is invalid.

    Notes
    -----
    Implemented as one forward pass with a hook on block ``layer - 1`` (a pre-hook on block 0
    for ``layer = 0``) that replaces its output by output + ``scale · vector ⊗ mask``; all
    later blocks see the perturbed stream, exactly as in the injection experiments of
    :cite:t:`hahami2025disturbance` (who add to the output of decoder layer ``layer - 1``
    in this indexing).

    Examples
    --------
    >>> v = torch.randn(m.d_model); v /= v.norm()                      # doctest: +SKIP
    >>> h = inject(m, ["The cat sat."], layer=3, vector=v, scale=8.0)  # doctest: +SKIP
    """
    check_model(m)
    layer = check_layer(layer, m.n_layers, m.name)
    scale = check_real(scale, "scale")
    vec = check_vector(vector, m.d_model, dtype=m.dtype, device=m.device, scales=(scale,), where=m.name)
    enc = encode(m, texts, max_length)
    sel = position_mask(enc["attention_mask"], positions)
    delta = (scale * vec) * sel.unsqueeze(-1).to(vec.dtype)
    return torch.stack(_run(m, enc, add=(layer, delta)))


# --------------------------------------------------------------------------- the engine's adapter
def _expand(value, k: int, batch: int):
    """Repeat a captured block argument across ``k`` stacked conditions (condition-major)."""
    if k == 1:
        return value
    if isinstance(value, torch.Tensor):
        # per-sequence tensors (masks [B, 1, T, T], position ids [B, T], rotary tables [B, T, h])
        # have a leading batch axis and at least two axes; 1-D tensors (cache positions) are shared
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
    rest, kwargs, as_kw = call
    rest = _expand(rest, k, batch)
    kwargs = _expand(kwargs, k, batch)
    out = block(*rest, hidden_states=h, **kwargs) if as_kw else block(h, *rest, **kwargs)
    return out[0] if isinstance(out, tuple) else out


class ModelAdapter:
    """A real Transformer seen the way the injection engine (:mod:`companion.engine`) sees a model.

    The counterpart of :class:`companion.stacks.StackAdapter`, with the same attributes and
    methods: ``n_layers``, ``d_model``, ``dtype``, ``device``, ``name``; ``baseline`` (the raw
    residual stream ``[h_0, ..., h_L]`` of one hooked forward, computed on first use);
    ``attention_mask``; ``position_mask(positions)`` (:func:`position_mask`);
    ``check_vector(vector, rows, scales)``; ``block(i, h, k)``: block ``i`` of the real model
    called on ``h`` with the exact arguments transformers passed to it in the baseline run
    (attention masks, rotary ``position_embeddings`` ...; recorded with forward pre-hooks with
    ``with_kwargs=True``), repeated for ``k`` runs stacked along the batch axis; ``output(h)``
    (the final norm, identity for a post-norm model) and ``logits(h)``
    (:func:`companion.models.logits_from_residual` for a causal LM, ``None`` for an encoder).

    Parameters
    ----------
    m : LoadedModel
    texts : str, sequence of str, or an encoding from :func:`companion.models.tokenize`
    max_length : int or None

    Raises
    ------
    TypeError, ValueError
        As :func:`companion.models.encode` (wrong model type, empty texts).
    """

    def __init__(self, m: LoadedModel, texts, max_length: int | None = None):
        check_model(m)
        self.model = m
        self.encoding = encode(m, texts, max_length)
        self.n_layers, self.d_model, self.dtype, self.device = m.n_layers, m.d_model, m.dtype, m.device
        self.name = m.name
        self._run = None

    @property
    def baseline(self) -> list[torch.Tensor]:
        if self._run is None:
            self._run = _run(self.model, self.encoding, record_calls=True)
        return self._run[0]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.encoding["attention_mask"]

    def position_mask(self, positions) -> torch.Tensor:
        return position_mask(self.attention_mask, positions)

    def check_vector(self, vector, rows: int | None = None, scales=()) -> torch.Tensor:
        m = self.model
        return check_vector(vector, m.d_model, rows, dtype=m.dtype, device=m.device, scales=scales,
                            where=m.name)

    def block(self, i: int, h: torch.Tensor, k: int) -> torch.Tensor:
        self.baseline  # noqa: B018 - records the block calls
        return _call_block(self.model.blocks[i], h, self._run[1][i], k, self.attention_mask.shape[0])

    def output(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.model.final_norm is None else self.model.final_norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor | None:
        return logits_from_residual(self.model, h) if self.model.kind == "causal-lm" else None


# --------------------------------------------------------------------------- channel statistics
@dataclass(frozen=True)
class ChannelStatistics:
    """Per-layer, per-channel statistics of the residual stream over a corpus.

    Attributes
    ----------
    mean, var, min, max, max_abs : numpy.ndarray, shape ``[L+1, d]``, float64
        ``var`` is the population variance ``(1/N) Σ (x − mean)²`` over the ``N`` tokens.
    counts : numpy.ndarray, shape ``[L+1, len(thresholds), d]``, int64
        ``C_j(t) = #{tokens : |h_j| > t}`` (strict inequality).
    thresholds : numpy.ndarray, shape ``[len(thresholds)]``
    n_tokens : int
        Number of tokens ``N`` that entered (pads and, with ``skip_first``, first tokens excluded).
    n_texts : int
    skip_first : bool
    model : str
    """

    mean: np.ndarray
    var: np.ndarray
    min: np.ndarray
    max: np.ndarray
    max_abs: np.ndarray
    counts: np.ndarray
    thresholds: np.ndarray
    n_tokens: int
    n_texts: int
    skip_first: bool
    model: str

    @property
    def std(self) -> np.ndarray:
        """Per-channel standard deviation ``sqrt(var)``."""
        return np.sqrt(self.var)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by name (for storing in a Result)."""
        return {k: getattr(self, k) for k in ("mean", "var", "min", "max", "max_abs", "counts", "thresholds")}


def channel_statistics(
    m: LoadedModel,
    texts,
    thresholds,
    batch_size: int = 16,
    max_length: int | None = None,
    skip_first: bool = False,
    progress: bool = False,
) -> ChannelStatistics:
    """Stream per-channel statistics of every residual-stream layer over a corpus.

    Parameters
    ----------
    m : LoadedModel
    texts : sequence of str
        The corpus (e.g. :func:`companion.corpus.corpus_sentences`); any length.
    thresholds : sequence of float ≥ 0
        The ``t`` of the exceedance counts ``C_j(t)``.
    batch_size : int, default 16
        Texts per forward pass (memory is ``O(L · batch · tokens · d)`` for one batch).
    max_length : int or None
        Truncation length (default ``m.max_length``).
    skip_first : bool, default False
        Exclude the first token of every text.  The first token carries the "massive
        activations" of :cite:t:`sun2024massive` (attention sinks); excluding it separates the
        typical tokens from that one position.
    progress : bool, default False
        Show a tqdm progress bar over batches (``TQDM_DISABLE=1`` turns it off).

    Returns
    -------
    ChannelStatistics

    Raises
    ------
    TypeError
        For arguments of the wrong type.
    ValueError
        If ``texts`` is empty or contains an empty string, thresholds are negative/NaN/empty,
        ``batch_size`` < 1, or no token is left (e.g. one-token texts with ``skip_first``).

    Notes
    -----
    Each batch contributes its count ``n_b``, mean ``m_b`` and sum of squared deviations
    ``M_b``; they are merged into the running ``(n, m, M)`` by the exact pairwise update of
    :cite:t:`chan1982updating` (the batch form of :cite:t:`welford1962`):
    ``δ = m_b − m``, ``m ← m + δ n_b/(n+n_b)``, ``M ← M + M_b + δ² n n_b/(n+n_b)``, in float64.
    A channel whose every token holds one value gets exactly that mean and variance 0 (the
    rounded batch means alone would leave a variance near 1e-34).
    The counts come from sorting ``|x|`` per channel and a binary search for each threshold.
    Memory is ``O(L · d · |thresholds|)`` for the accumulators whatever the corpus size.  Texts
    are processed in order of length to reduce padding (the result does not depend on order).

    Examples
    --------
    >>> st = channel_statistics(m, corpus_sentences(64), thresholds=[1, 5, 20])   # doctest: +SKIP
    >>> st.counts.shape                                                           # doctest: +SKIP
    (31, 3, 576)
    """
    check_model(m)
    t = check_thresholds(thresholds)
    batch_size = check_int(batch_size, "batch_size", 1)
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True or False, got {skip_first!r}")
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
            x = torch.stack(_run(m, enc))[:, keep].to(acc_dtype)  # [L+1, nb, d]
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
    # A channel whose tokens all hold one value has variance 0 and that value as its mean, but the
    # rounded batch means leave M > 0 (~1e-34) and a mean off by an ulp: state it exactly.  Any
    # mean lies in [min, max]; rounding can push it out by an ulp.
    constant = mn == mx
    mean = torch.where(constant, mn, torch.minimum(torch.maximum(mean, mn), mx))
    m2 = torch.where(constant, torch.zeros_like(m2), m2)
    max_abs = torch.maximum(mx.abs(), mn.abs())
    to_np = lambda a: a.to(torch.float64).cpu().numpy()  # noqa: E731
    return ChannelStatistics(
        mean=to_np(mean), var=to_np(m2 / n), min=to_np(mn), max=to_np(mx), max_abs=to_np(max_abs),
        counts=counts.permute(0, 2, 1).cpu().numpy(), thresholds=t, n_tokens=n, n_texts=len(texts),
        skip_first=skip_first, model=m.name,
    )
