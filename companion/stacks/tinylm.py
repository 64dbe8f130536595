"""The tiny language model: a residual stack between a byte embedding and an unembedding.

It trains on the committed corpus in well under a minute on a CPU; :class:`StackAdapter` shows a
stack or a TinyLM to the injection engine.  An argument of the wrong type raises ``TypeError``
naming it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from companion._validation import check_vector, is_int, is_real
from companion.stacks.residual import (_NORMAL_STD, ResidualStack, StackConfig, StackOutput, _check_counts,
                                       _check_memory, _init_linear, _layer_generator, _token_mask)

__all__ = ["TinyLM", "StackAdapter", "byte_tokenize", "unigram_loss", "train_tiny_lm"]


class TinyLM(nn.Module):
    """Token embedding + learned positions + :class:`~companion.stacks.residual.ResidualStack` + unembedding.

    ``x_0 = E[ids] + P[positions]``; with ``init="xavier"`` both tables are ``N(0, 1/2)`` so
    ``E||x_0||^2 = d``.  The unembedding is untied and bias-free.

    Parameters
    ----------
    config : StackConfig
        ``config.vocab_size`` must be set.

    Raises
    ------
    ValueError
        If ``config.vocab_size`` is None, or its parameters would exceed this machine's memory.

    Examples
    --------
    >>> lm = TinyLM(StackConfig(d_model=16, n_layers=2, n_heads=2, vocab_size=256))
    >>> logits, out = lm(torch.zeros(1, 4, dtype=torch.long))
    >>> tuple(logits.shape), tuple(out.stream.shape)
    ((1, 4, 256), (3, 1, 4, 16))
    """

    def __init__(self, config: StackConfig):
        super().__init__()
        if not isinstance(config, StackConfig):
            raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
        if config.vocab_size is None:
            raise ValueError("TinyLM needs config.vocab_size (e.g. 256 for byte_tokenize)")
        _check_memory(config)
        self.config = config
        d, V = config.d_model, config.vocab_size
        self.tok_emb = nn.Embedding(V, d)
        self.pos_emb = nn.Embedding(config.max_len, d)
        self.stack = ResidualStack(config)
        self.unembed = nn.Linear(d, V, bias=False)
        g = _layer_generator(config.seed, 1, 0)
        std = math.sqrt(0.5) if config.init == "xavier" else _NORMAL_STD
        with torch.no_grad():
            self.tok_emb.weight.normal_(0.0, std, generator=g)
            self.pos_emb.weight.normal_(0.0, std, generator=g)
        _init_linear(self.unembed, config, g)

    def forward(self, ids, **inject_kwargs):
        """Logits and the stack's record for a batch of token ids.

        Parameters
        ----------
        ids : LongTensor [batch, tokens]
            Token ids in ``[0, vocab_size)``; ``tokens <= max_len``.
        **inject_kwargs
            ``inject_layer``, ``inject_vector``, ``inject_positions`` of
            :meth:`~companion.stacks.residual.ResidualStack.forward`.

        Returns
        -------
        (Tensor [batch, tokens, vocab_size], StackOutput)

        Raises
        ------
        ValueError
            If ``ids`` is not 2-D, too long, or out of the vocabulary, or an injection argument is invalid.
        """
        out = self.stack(self.embed(ids), **inject_kwargs)
        return self.unembed(out.final), out

    def embed(self, ids) -> torch.Tensor:
        """The input stream ``x_0 = E[ids] + P[positions]``, ``[batch, tokens, d_model]`` (checks ``ids``)."""
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer torch.Tensor [batch, tokens], got {type(ids).__name__}"
                            + (f" of dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else ""))
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"ids must have shape [batch, tokens], got {tuple(ids.shape)}")
        T = ids.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"sequence length {T} exceeds config.max_len = {self.config.max_len}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.config.vocab_size - 1}]")
        return self.tok_emb(ids) + self.pos_emb(torch.arange(T, device=ids.device))  # [B, T, d]


class StackAdapter:
    """A ResidualStack or TinyLM seen the way the injection engine sees a model.

    The engine (:mod:`companion.injection.engine`) needs from a model only the attributes
    ``n_layers``, ``d_model``, ``dtype``, ``device``, ``name`` and the members below, as
    :class:`companion.transformers.stream.ModelAdapter` gives them for real Transformers.

    Parameters
    ----------
    model : ResidualStack or TinyLM
    inputs : torch.Tensor
        ``[B, T, d]`` input stream for a ``ResidualStack``; ``[B, T]`` token ids for a ``TinyLM``.
    """

    def __init__(self, model, inputs):
        if isinstance(model, TinyLM):
            self.stack, self.lm = model.stack, model
        elif isinstance(model, ResidualStack):
            self.stack, self.lm = model, None
        else:
            raise TypeError(f"model must be a companion.stacks.residual.ResidualStack or TinyLM, "
                            f"got {type(model).__name__}")
        self.inputs = inputs
        cfg = self.stack.config
        p = next(model.parameters())
        self.n_layers, self.d_model, self.dtype, self.device = cfg.n_layers, cfg.d_model, p.dtype, p.device
        self.name = type(model).__name__
        self._record = None

    @property
    def record(self) -> StackOutput:
        """The :class:`~companion.stacks.residual.StackOutput` of the baseline run (computed once)."""
        if self._record is None:
            with torch.no_grad():
                x = self.inputs if self.lm is None else self.lm.embed(self.inputs)
                self._record = self.stack(x)
        return self._record

    @property
    def baseline(self) -> list[torch.Tensor]:
        """``[h_0, ..., h_L]`` of the run without injection."""
        return list(self.record.stream)

    @property
    def attention_mask(self) -> torch.Tensor:
        """``[B, T]`` ones (stacks have no padding)."""
        B, T = self.record.stream.shape[1:3]
        return torch.ones(B, T, dtype=torch.long, device=self.device)

    def position_mask(self, positions) -> torch.Tensor:
        """``[B, T]`` bool: ``None`` = every token; integers = these tokens of every sequence."""
        B, T = self.record.stream.shape[1:3]
        return _token_mask(positions, T, "positions", self.device).expand(B, T)

    def check_vector(self, vector, rows: int | None = None, scales=()) -> torch.Tensor:
        """``vector`` (``[d]`` or ``[rows, d]``) as a tensor of the stack's dtype; ValueError if
        it is not finite there, or some ``scale * vector`` overflows."""
        return check_vector(vector, self.d_model, rows, dtype=self.dtype, device=self.device,
                            scales=scales, where="the stack")

    def block(self, i: int, h: torch.Tensor, k: int) -> torch.Tensor:
        """Block ``i`` applied to ``h`` (``k`` runs stacked along the batch axis)."""
        return self.stack.apply_block(i, h)

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm of ``h_L``."""
        return self.stack.final_norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor | None:
        """Next-token logits of a TinyLM; ``None`` for a bare stack."""
        return None if self.lm is None else self.lm.unembed(self.output(h))


def byte_tokenize(text) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as token ids (vocabulary 256, no tokenizer files).

    Parameters
    ----------
    text : str or sequence of str
        A sequence (e.g. :func:`companion.corpus.load_corpus`) is joined with blank lines.

    Returns
    -------
    torch.LongTensor [n_bytes]

    Raises
    ------
    ValueError
        If the text is empty.

    Examples
    --------
    >>> byte_tokenize("Hé").tolist()
    [72, 195, 169]
    """
    if not isinstance(text, str):
        if isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            text = "\n\n".join(text)
        else:
            raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")
    data = text.encode("utf-8")
    if not data:
        raise ValueError("text is empty; pass some text to tokenise")
    return torch.tensor(np.frombuffer(data, dtype=np.uint8).astype(np.int64))


def unigram_loss(ids) -> float:
    """Cross-entropy (nats/token) of the best context-free predictor: the entropy of the ids.

    Parameters
    ----------
    ids : 1-D integer tensor or array

    Returns
    -------
    float
        :math:`H = -\\sum_v p_v \\ln p_v` over the empirical frequencies.

    Raises
    ------
    ValueError
        If ``ids`` is empty, not 1-D, or has negative entries.

    Examples
    --------
    >>> round(unigram_loss(torch.tensor([0, 1, 0, 1])), 4)   # ln 2
    0.6931
    """
    a = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids)
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer) or a.min() < 0:
        raise ValueError("ids must be a non-empty 1-D array of non-negative integers")
    p = np.bincount(a) / a.size
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def train_tiny_lm(config: StackConfig, text, steps: int = 300, batch_size: int = 16, seq_len: int = 128,
                  lr: float = 3e-3, seed: int = 0, device: str = "cpu", warmup: int | None = None,
                  dtype: torch.dtype | None = None, callback=None):
    """Train a :class:`~companion.stacks.tinylm.TinyLM` on bytes of ``text`` with AdamW; deterministic on CPU.

    Next-byte cross-entropy; gradients clipped to norm 1; AdamW ``betas=(0.9, 0.95)``, weight
    decay 0.01 on matrices.  Post-LN needs ``lr=1e-3`` or a longer warm-up (Xiong et al. 2020).

    Parameters
    ----------
    config : StackConfig
        ``vocab_size`` must be 256 (bytes); ``max_len >= seq_len``.
    text : str or list of str
        Training text, e.g. ``companion.corpus.load_corpus()``.
    steps, batch_size, seq_len : int
        Optimiser steps; random windows per step; tokens per window.
    lr : float, default 3e-3
        Peak learning rate.
    seed : int, default 0
        Seed of the window sampling (the weights are seeded by ``config.seed``).
    device : str, default "cpu"
    warmup : int or None
        Linear warm-up steps (``None``: ``max(1, steps // 10)``), then cosine decay to ``lr / 10``.
    dtype : torch.dtype, optional
        Training dtype; weights are initialised in the default dtype and then cast.
    callback : callable, optional
        ``callback(step, model)`` before the first step (``step = 0``) and after every step
        (``step`` = steps done), e.g. to measure checkpoints; it must leave the weights unchanged.

    Returns
    -------
    (TinyLM, numpy.ndarray)
        The trained model in ``eval()`` mode and the training loss (nats/token) at every step.

    Raises
    ------
    ValueError
        If ``config.vocab_size != 256``, a count is < 1, ``lr`` <= 0, ``seq_len > max_len``,
        or the text is shorter than ``seq_len + 2`` bytes.

    Examples
    --------
    >>> cfg = StackConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=256, max_len=32)
    >>> model, losses = train_tiny_lm(cfg, "abcabcabc" * 20, steps=3, batch_size=2, seq_len=16)
    >>> losses.shape
    (3,)
    """
    if not isinstance(config, StackConfig):
        raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
    if config.vocab_size != 256:
        raise ValueError(f"train_tiny_lm reads bytes: config.vocab_size must be 256, got {config.vocab_size}")
    _check_counts(steps=steps, batch_size=batch_size, seq_len=seq_len, seed=seed)
    if warmup is not None and (not is_int(warmup) or warmup < 0):
        raise ValueError(f"warmup must be a non-negative integer or None, got {warmup!r}")
    if not (is_real(lr) and math.isfinite(lr)) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    if seq_len > config.max_len:
        raise ValueError(f"seq_len = {seq_len} exceeds config.max_len = {config.max_len}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float64, got {dtype!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    ids = byte_tokenize(text)
    if ids.numel() < seq_len + 2:
        raise ValueError(f"text has {ids.numel()} bytes; need at least seq_len + 2 = {seq_len + 2}")

    warmup = max(1, steps // 10) if warmup is None else warmup
    model = TinyLM(config).to(device=device, dtype=dtype)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))

    def rate(step):  # multiplier of lr: linear warm-up, then cosine to 0.1
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    g = torch.Generator().manual_seed(int(seed))
    offsets = torch.arange(seq_len + 1)
    losses = np.empty(steps)
    model.train()
    if callback is not None:
        callback(0, model)
    for step in range(steps):
        starts = torch.randint(0, ids.numel() - seq_len - 1, (batch_size,), generator=g)
        window = ids[starts[:, None] + offsets].to(device)          # [B, T+1]
        logits, _ = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses[step] = loss.item()
        if callback is not None:
            callback(step + 1, model)
    return model.eval(), losses
