"""Residual stacks in plain PyTorch: Pre-LN / Post-LN and scaled residuals.

:class:`StackConfig` describes a stack; :class:`ResidualStack` is ``L`` blocks acting on the residual
stream ``h`` (``[batch, tokens, d_model]``), each sublayer (attention, MLP) being one residual add

.. code-block:: text

    Pre-LN :  h <- lam * h + beta * F(Norm(h))
    Post-LN:  h <- Norm(lam * h + beta * F(h))
    no norm:  h <- lam * h + beta * F(h)          (norm="none": every Norm, the final one too, is the identity)

with ``lam = residual_scale`` and ``beta = branch_scale`` (Xiong et al. 2020; Kedia et al. 2024);
the measurements of the chapter *Signal propagation* follow.  Weights of block ``l`` depend only on
``(config.seed, l)``, so a depth-``L`` stack is the first ``L`` blocks of any deeper one.  An
argument of the wrong type raises ``TypeError`` naming it.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from companion._validation import check_int, check_real, check_vector, is_int, is_real

__all__ = ["StackConfig", "StackOutput", "ResidualStack", "sharpen_attention", "dslm_scales",
           "forward_sq_norms", "last_layer_grad_norms"]

_CHOICES = {"placement": ("pre", "post"), "norm": ("layernorm", "rmsnorm", "none"),
            "block": ("mlp", "attention", "both"), "init": ("xavier", "normal")}
_NORMAL_STD = 0.02


@dataclass(frozen=True)
class StackConfig:
    """Description of a residual stack (and, with ``vocab_size``, of a TinyLM), field by field below.

    Raises
    ------
    TypeError, ValueError
        If a field has the wrong type (NaN or inf for a float), is out of range or names an unknown choice.

    Examples
    --------
    >>> cfg = StackConfig(d_model=32, n_layers=2, placement="post")
    >>> StackConfig.from_dict(cfg.to_dict()) == cfg
    True
    """

    d_model: int = 64  #: width of the residual stream
    n_layers: int = 8  #: number of blocks ``L``
    n_heads: int = 4  #: attention heads; must divide ``d_model``
    d_ff: int | None = None  #: hidden width of the MLP; ``None`` means ``4 * d_model``
    placement: str = "pre"  #: ``"pre"`` or ``"post"``: where the norm sits (see the module docstring)
    #: ``"layernorm"`` or ``"rmsnorm"`` (the torch norm of that name, with ``eps``); ``"none"``: no
    #: normalisation anywhere (every norm is the identity, so ``placement`` makes no difference)
    norm: str = "layernorm"
    #: ``"mlp"``, ``"attention"`` or ``"both"`` (attention then MLP, each its own residual add)
    block: str = "both"
    residual_scale: float = 1.0  #: ``lam`` in ``h <- lam h + beta F(h)``
    branch_scale: float = 1.0  #: ``beta`` in ``h <- lam h + beta F(h)``
    gain: float = 1.0  #: multiplies the initial std of each output projection (``w_o``, ``w_out``)
    #: ``"xavier"``: ``N(0, 2/(fan_in + fan_out))`` weights, zero biases and a zero query map (uniform
    #: attention, Xiong et al.); ``"normal"``: ``N(0, 0.02^2)`` (GPT-2)
    init: str = "xavier"
    final_norm: bool = True  #: apply a norm after the last block
    eps: float = 1e-5  #: epsilon of every norm
    vocab_size: int | None = None  #: vocabulary of a TinyLM; ``None`` for a bare stack
    max_len: int = 256  #: longest sequence a TinyLM accepts
    seed: int = 0  #: seed of the initialisation

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "max_len", "seed"):
            check_int(getattr(self, name), f"StackConfig.{name}", 0 if name == "seed" else 1)
        if self.d_model % self.n_heads:
            raise ValueError(f"StackConfig.n_heads={self.n_heads} must divide d_model={self.d_model}; "
                             "choose a divisor of the width")
        for name, low in (("d_ff", 1), ("vocab_size", 2)):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), f"StackConfig.{name}", low)
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"StackConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("residual_scale", "branch_scale", "gain", "eps"):
            value = getattr(self, name)
            if not (is_real(value) and math.isfinite(value)):
                raise TypeError(f"StackConfig.{name} must be a finite real number, got {value!r}")
        if self.gain <= 0:
            raise ValueError(f"StackConfig.gain must be > 0, got {self.gain}")
        if self.eps < 0:
            raise ValueError(f"StackConfig.eps must be >= 0, got {self.eps}")
        if not isinstance(self.final_norm, bool):
            raise TypeError(f"StackConfig.final_norm must be a bool, got {self.final_norm!r}")

    @property
    def ff_width(self) -> int:
        """Hidden width of the MLP (``d_ff`` or ``4 * d_model``)."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def sublayers(self) -> tuple[str, ...]:
        """Kinds of the sublayers of one block, in order."""
        return {"mlp": ("mlp",), "attention": ("attention",), "both": ("attention", "mlp")}[self.block]

    def to_dict(self) -> dict:
        """``dataclasses.asdict(self)`` (plain JSON types)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StackConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown StackConfig fields {sorted(unknown)}")
        return cls(**d)


def dslm_scales(n_layers: int, k: float = 2.0) -> tuple[float, float]:
    r"""Residual and branch scales ``(lam, beta)`` of a DSLM-style stack of ``n_layers`` blocks.

    Kedia et al. (2024): :math:`\lambda^2 + \beta^2 = 1` keeps unit second moment at every add;
    ``k = 2`` gives their :math:`\beta^2 \approx 0.005` at 192 layers (our reading, not a quote).

    Parameters
    ----------
    n_layers : int
        Number of blocks ``N``.
    k : float, default 2.0
        Total branch "budget": :math:`\beta^2 = k / (2N)`.

    Returns
    -------
    (float, float)
        :math:`\lambda = \sqrt{1 - \beta^2}` and :math:`\beta`.

    Raises
    ------
    ValueError
        If ``n_layers`` < 1 or not ``0 < k <= 2 N``.

    Examples
    --------
    >>> lam, beta = dslm_scales(192)
    >>> round(beta ** 2, 4), round(lam ** 2 + beta ** 2, 12)
    (0.0052, 1.0)
    """
    n_layers = check_int(n_layers, "n_layers", 1)
    beta2 = check_real(k, "k", lo=0, lo_open=True, hi=2 * n_layers) / (2 * n_layers)
    return math.sqrt(1.0 - beta2), math.sqrt(beta2)


def _machine_bytes() -> int:
    """Physical memory of this machine in bytes (psutil if installed, else ``os.sysconf``; 0 if unknown)."""
    try:
        import psutil
        return int(psutil.virtual_memory().total)
    except ImportError:
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 0


def _check_memory(config: StackConfig, tokens: int = 0) -> None:
    """ValueError before allocating if the float32 parameters of ``config`` (and the float64 activations
    of one forward pass over ``tokens`` tokens) exceed the machine's memory."""
    d, ff, L = config.d_model, config.ff_width, config.n_layers
    n = L * (4 * d * d + 2 * d * ff + ff + 10 * d) + 2 * d
    if config.vocab_size is not None:
        n += 2 * config.vocab_size * d + config.max_len * d
    need, have = 4 * n + 8 * tokens * (d * (3 * L + 3) + ff), _machine_bytes()
    if have and need > have:
        raise ValueError(f"this run needs about {need / 1e9:.3g} GB (parameters and one pass's activations), "
                         f"more than this machine's {have / 1e9:.3g} GB of memory; use a smaller d_model, "
                         f"d_ff, n_layers, vocab_size, max_len, or fewer or shorter sequences")


def _layer_generator(seed: int, *key: int) -> torch.Generator:
    """A torch generator whose stream depends only on (seed, key)."""
    state = np.random.SeedSequence(entropy=seed, spawn_key=key).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _init_linear(lin: nn.Linear, config: StackConfig, g: torch.Generator, *, out_proj: bool = False,
                 zero: bool = False) -> None:
    """Initialise one linear map per ``config.init`` (see :class:`~companion.stacks.residual.StackConfig`)."""
    with torch.no_grad():
        if lin.bias is not None:
            lin.bias.zero_()
        if zero:
            lin.weight.zero_()
            return
        fan_out, fan_in = lin.weight.shape
        std = math.sqrt(2.0 / (fan_in + fan_out)) if config.init == "xavier" else _NORMAL_STD
        lin.weight.normal_(0.0, std * (config.gain if out_proj else 1.0), generator=g)


def _make_norm(config: StackConfig) -> nn.Module:
    """The norm named by ``config.norm`` (``"none"``: the identity, without parameters)."""
    if config.norm == "none":
        return nn.Identity()
    if config.norm == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.eps)
    return nn.RMSNorm(config.d_model, eps=config.eps)


class _CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``softmax(QK^T / sqrt(d_head) + causal mask) V W_o``."""

    def __init__(self, config: StackConfig, g: torch.Generator):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d, d) for _ in range(4))
        _init_linear(self.w_q, config, g, zero=(config.init == "xavier"))
        _init_linear(self.w_k, config, g)
        _init_linear(self.w_v, config, g)
        _init_linear(self.w_o, config, g, out_proj=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        H = self.n_heads

        def heads(t):  # [B, T, d] -> [B, H, T, d/H]
            return t.view(B, T, H, d // H).transpose(1, 2)

        q, k, v = heads(self.w_q(x)), heads(self.w_k(x)), heads(self.w_v(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d/H]
        return self.w_o(y.transpose(1, 2).reshape(B, T, d))


class _MLP(nn.Module):
    """``ReLU(x W_in + b_in) W_out + b_out`` (Xiong et al.'s feed-forward block)."""

    def __init__(self, config: StackConfig, g: torch.Generator):
        super().__init__()
        self.w_in = nn.Linear(config.d_model, config.ff_width)
        self.w_out = nn.Linear(config.ff_width, config.d_model)
        _init_linear(self.w_in, config, g)
        _init_linear(self.w_out, config, g, out_proj=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(torch.relu(self.w_in(x)))


class _Sublayer(nn.Module):
    """One residual branch: its norm and its function ``F`` (attention or MLP)."""

    def __init__(self, config: StackConfig, kind: str, g: torch.Generator):
        super().__init__()
        self.kind = kind
        self.norm = _make_norm(config)
        self.f = _CausalSelfAttention(config, g) if kind == "attention" else _MLP(config, g)


class _Block(nn.Module):
    """The sublayers of one layer (attention then MLP for ``block="both"``)."""

    def __init__(self, config: StackConfig, layer: int):
        super().__init__()
        g = _layer_generator(config.seed, 0, layer)
        self.sublayers = nn.ModuleList(_Sublayer(config, kind, g) for kind in config.sublayers)


@dataclass
class StackOutput:
    """Everything a forward pass of :class:`~companion.stacks.residual.ResidualStack` records."""

    stream: torch.Tensor  #: ``[L+1, B, T, d]``: the stream before each block ``l`` (after an injection)
    #: ``[L, B, T, d]``: input of block ``l``'s last norm (Post-LN: ``lam h + beta F(h)``; Pre-LN: the stream)
    pre_norm: torch.Tensor
    branch: torch.Tensor  #: ``[L, B, T, d]``: ``beta * F(.)`` added by block ``l``, summed over its sublayers
    final: torch.Tensor  #: ``[B, T, d]``: ``stream[L]`` after the final norm
    sublayer_norm_input: torch.Tensor  #: ``[L, S, B, T, d]``: ``pre_norm`` per sublayer (``S`` = 1 or 2)
    sublayer_branch: torch.Tensor  #: ``[L, S, B, T, d]``: ``branch`` per sublayer


def _added(h: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    """``h + addend``; ValueError if the sum overflows the stream's dtype where ``h`` was finite."""
    out = h + addend
    if not bool(torch.isfinite(out).all()) and bool(torch.isfinite(h).all()):
        raise ValueError(f"the stream + inject_vector overflows {h.dtype} (max {torch.finfo(h.dtype).max:.4g}); "
                         f"use a smaller inject_vector or a wider dtype")
    return out


def _token_mask(positions, T: int, name: str, device) -> torch.Tensor:
    """``[T]`` bool mask of ``positions`` (None, an int, or a 1-D list/tensor in ``[0, T)``)."""
    if positions is None:
        return torch.ones(T, dtype=torch.bool, device=device)
    if is_int(positions):
        positions = [int(positions)]
    pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(np.asarray(positions))
    if pos.ndim != 1 or pos.numel() == 0 or pos.is_floating_point() or pos.dtype == torch.bool:
        raise ValueError(f"{name} must be None or a non-empty 1-D list/tensor of integer token positions, "
                         f"got {positions!r}")
    if int(pos.min()) < 0 or int(pos.max()) >= T:
        raise ValueError(f"{name} must lie in [0, {T - 1}] (tokens), got {pos.tolist()}")
    mask = torch.zeros(T, dtype=torch.bool, device=device)
    mask[pos.to(device)] = True
    return mask


class ResidualStack(nn.Module):
    """``L`` residual blocks with Pre-LN or Post-LN placement and scaled residuals.

    Parameters
    ----------
    config : StackConfig
        The stack (update rule in the module docstring).

    Raises
    ------
    TypeError, ValueError
        If ``config`` is not a StackConfig, or its parameters would exceed this machine's memory
        (checked before anything is allocated; the message gives the estimate).

    Examples
    --------
    >>> stack = ResidualStack(StackConfig(d_model=16, n_layers=3, n_heads=2))
    >>> out = stack(torch.randn(2, 5, 16))
    >>> tuple(out.stream.shape), tuple(out.pre_norm.shape), tuple(out.final.shape)
    ((4, 2, 5, 16), (3, 2, 5, 16), (2, 5, 16))
    """

    def __init__(self, config: StackConfig):
        super().__init__()
        if not isinstance(config, StackConfig):
            raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
        _check_memory(config)
        self.config = config
        self.blocks = nn.ModuleList(_Block(config, layer) for layer in range(config.n_layers))
        self.final_norm = _make_norm(config) if config.final_norm else nn.Identity()

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor [batch, tokens, d_model], got {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != self.config.d_model:
            raise ValueError(f"x must have shape [batch, tokens, {self.config.d_model}], "
                             f"got {tuple(x.shape)}")
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"x must have at least one sequence and one token, got {tuple(x.shape)}")
        p = next(self.parameters())
        if x.dtype != p.dtype:
            raise ValueError(f"x has dtype {x.dtype} but the stack's parameters are {p.dtype}; "
                             f"convert with x.to({p.dtype}) or the model with .to({x.dtype})")

    def _injection(self, x, layer, vector, positions):
        """Validate the injection arguments; return (layer, [B, T, d] addend) or (None, None)."""
        if layer is None:
            if vector is not None or positions is not None:
                raise ValueError("inject_vector / inject_positions were given without inject_layer")
            return None, None
        L = self.config.n_layers
        B, T, d = x.shape
        if not is_int(layer) or not 0 <= layer <= L:
            raise ValueError(f"inject_layer must be an integer in [0, {L}] (n_layers), got {layer!r}")
        if vector is None:
            raise ValueError("inject_layer was given without inject_vector")
        vector = check_vector(vector, d, B, dtype=x.dtype, device=x.device, name="inject_vector",
                              where="the stack").expand(B, d)
        mask = _token_mask(positions, T, "inject_positions", x.device).to(x.dtype)
        return layer, mask[None, :, None] * vector[:, None, :]

    def forward(self, x, *, inject_layer=None, inject_vector=None, inject_positions=None,
                blocks=None) -> StackOutput:
        """Run the stack, recording the residual stream before every block.

        Parameters
        ----------
        x : Tensor [batch, tokens, d_model]
            Input stream (same dtype as the parameters).
        inject_layer : int, optional
            Add ``inject_vector`` before block ``inject_layer`` (``L``: before the final norm).
        inject_vector : Tensor [d_model] or [batch, d_model], optional
        inject_positions : int, list of int or 1-D integer tensor, optional
            Token positions that receive it (``None``: all).
        blocks : range, optional
            Run only these consecutive blocks, ``x`` entering the first.

        Returns
        -------
        StackOutput

        Raises
        ------
        ValueError
            If ``x`` has the wrong shape or dtype, or the injection arguments are inconsistent,
            out of range or not finite in the stack's dtype.
        """
        self._check_input(x)
        layer_inj, addend = self._injection(x, inject_layer, inject_vector, inject_positions)
        cfg = self.config
        lam, beta, pre = cfg.residual_scale, cfg.branch_scale, cfg.placement == "pre"
        streams, norm_ins, branches = [], [], []          # L+1, L x S, L x S tensors [B, T, d]
        h = x
        for layer in range(cfg.n_layers) if blocks is None else blocks:
            if layer == layer_inj:
                h = _added(h, addend)                                # injection site h_l
            streams.append(h)
            norm_ins.append([])
            branches.append([])
            for sub in self.blocks[layer].sublayers:
                if pre:   # Pre-LN: the norm sits on the branch; the stream is never normalised
                    norm_in = h
                    branch = beta * sub.f(sub.norm(h))
                    h = lam * h + branch
                else:     # Post-LN: the norm sits on the stream, after the residual add
                    branch = beta * sub.f(h)
                    norm_in = lam * h + branch
                    h = sub.norm(norm_in)
                norm_ins[-1].append(norm_in)
                branches[-1].append(branch)
        if layer_inj == cfg.n_layers:
            h = _added(h, addend)                                    # injection site h_L
        streams.append(h)
        norm_in = torch.stack([torch.stack(b) for b in norm_ins])    # [L, S, B, T, d]
        branch = torch.stack([torch.stack(b) for b in branches])      # [L, S, B, T, d]
        return StackOutput(stream=torch.stack(streams), pre_norm=norm_in[:, -1],
                           branch=branch.sum(dim=1) if branch.shape[1] > 1 else branch[:, 0],
                           final=self.final_norm(h), sublayer_norm_input=norm_in, sublayer_branch=branch)

    def apply_block(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Block ``layer`` applied to a stream ``h`` of shape ``[batch, tokens, d_model]``.

        The same code as :meth:`forward` between ``stream[layer]`` and ``stream[layer + 1]``;
        the injection engine replays blocks through it.
        """
        return self.forward(h, blocks=range(layer, layer + 1)).stream[-1]


def sharpen_attention(stack, logit_std: float, seed: int = 0):
    r"""Re-draw every attention sublayer's query and key maps so the logits spread by ``logit_std``.

    :math:`W_Q, W_K` get i.i.d. :math:`N(0, \sigma_a/d)` entries, so a logit has variance
    :math:`\sigma_a^2` for inputs with :math:`\|x\|^2 = d`.

    Parameters
    ----------
    stack : ResidualStack
        A stack with attention sublayers, modified in place.
    logit_std : float
        Target std :math:`\sigma_a > 0` of the logits for unit-variance inputs.
    seed : int, default 0
        Seed of the new weights.

    Returns
    -------
    companion.stacks.residual.ResidualStack
        The same stack (for chaining).

    Raises
    ------
    ValueError
        If the stack has no attention sublayer, ``logit_std`` <= 0 or ``seed`` < 0.

    Examples
    --------
    >>> st = sharpen_attention(ResidualStack(StackConfig(d_model=16, n_layers=1, n_heads=2)), 4.0)
    >>> bool(st.blocks[0].sublayers[0].f.w_q.weight.abs().sum() > 0)
    True
    """
    if not isinstance(stack, ResidualStack):
        raise TypeError(f"stack must be a ResidualStack, got {type(stack).__name__}")
    sigma = check_real(logit_std, "logit_std", lo=0.0, lo_open=True)
    seed = check_int(seed, "seed", 0)
    attention = [sub.f for blk in stack.blocks for sub in blk.sublayers if sub.kind == "attention"]
    if not attention:
        raise ValueError(f"the stack has no attention sublayer (block = {stack.config.block!r}); "
                         "use block='attention' or 'both'")
    d = stack.config.d_model
    g = torch.Generator().manual_seed(seed)
    std = math.sqrt(sigma / d)
    with torch.no_grad():
        for attn in attention:
            for lin in (attn.w_q, attn.w_k):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g, dtype=torch.float64) * std)
                if lin.bias is not None:
                    lin.bias.zero_()
    return stack


def _check_counts(**kw) -> None:
    """Each count an integer in [1, 2**63) (``seed`` in [0, 2**64), the range of a torch generator)."""
    for name, v in kw.items():
        check_int(v, name, 0 if name == "seed" else 1, 2 ** 64 - 1 if name == "seed" else 2 ** 63 - 1)


def forward_sq_norms(config: StackConfig, n_sequences: int = 16, seq_len: int = 32, chunk: int = 16,
                     seed: int = 0, stack: ResidualStack | None = None,
                     device: str = "cpu") -> dict[str, np.ndarray]:
    r"""Mean squared norms of the residual stream at every layer, for Gaussian input tokens.

    Xiong et al.'s Lemma 2 bounds them (chapter *Signal propagation*).  Runs under ``torch.no_grad``.

    Parameters
    ----------
    config : StackConfig
        The stack to build (unless ``stack`` is given).
    n_sequences, seq_len : int
        Input: ``n_sequences`` sequences of ``seq_len`` i.i.d. ``N(0, I_d)`` tokens.
    chunk : int, default 16
        Sequences per forward pass (bounds memory).
    seed : int, default 0
        Seed of the input tokens (drawn on the CPU).
    stack : ResidualStack, optional
        Use this (e.g. trained) stack instead.
    device : str, default "cpu"

    Returns
    -------
    dict of float64 arrays
        :math:`\mathbb E\|\cdot\|^2/d` per layer and token: ``"stream"`` [L+1, T],
        ``"pre_norm"`` [L, T], ``"final"`` [T].

    Raises
    ------
    ValueError
        If a count is < 1 or >= 2**63 (``seed`` < 0 or >= 2**64), or the run would exceed the machine's
        memory (estimated from the config before allocating).

    Examples
    --------
    >>> cfg = StackConfig(d_model=32, n_layers=4, d_ff=32, block="mlp")
    >>> forward_sq_norms(cfg, n_sequences=4, seq_len=8)["stream"].shape
    (5, 8)
    """
    if not isinstance(config, StackConfig):
        raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
    _check_counts(n_sequences=n_sequences, seq_len=seq_len, chunk=chunk, seed=seed)
    _check_memory(config if stack is None else getattr(stack, "config", config), min(chunk, n_sequences) * seq_len)
    if stack is None:
        stack = ResidualStack(config)
    elif not isinstance(stack, ResidualStack):
        raise TypeError(f"stack must be a ResidualStack, got {type(stack).__name__}")
    stack = stack.to(device)
    cfg = stack.config
    d = cfg.d_model
    dtype = next(stack.parameters()).dtype
    g = torch.Generator().manual_seed(int(seed))
    sums = {"stream": torch.zeros(cfg.n_layers + 1, seq_len, dtype=torch.float64),
            "pre_norm": torch.zeros(cfg.n_layers, seq_len, dtype=torch.float64),
            "final": torch.zeros(seq_len, dtype=torch.float64)}
    with torch.no_grad():
        for start in range(0, n_sequences, chunk):
            b = min(chunk, n_sequences - start)
            x = torch.randn(b, seq_len, d, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
            out = stack(x)
            sums["stream"] += out.stream.double().pow(2).sum(-1).sum(1).cpu()
            sums["pre_norm"] += out.pre_norm.double().pow(2).sum(-1).sum(1).cpu()
            sums["final"] += out.final.double().pow(2).sum(-1).sum(0).cpu()
    return {k: (v / (n_sequences * d)).numpy() for k, v in sums.items()}


def _readout_problem(config, n_sequences: int, seq_len: int, n_classes: int, seed: int, device):
    """Check the shared arguments; draw Gaussian inputs, a Xavier readout and random labels."""
    if not isinstance(config, StackConfig):
        raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
    _check_counts(n_sequences=n_sequences, seq_len=seq_len, n_classes=n_classes, seed=seed)
    check_int(n_classes, "n_classes", 2)
    _check_memory(config, n_sequences * seq_len)
    if "mlp" not in config.sublayers:
        raise ValueError(f"config.block = {config.block!r} has no MLP; use 'mlp' or 'both'")
    d = config.d_model
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(n_sequences, seq_len, d, generator=g).to(device)
    readout = (torch.randn(d, n_classes, generator=g) * math.sqrt(2.0 / (d + n_classes))).to(device)
    labels = torch.randint(0, n_classes, (n_sequences * seq_len,), generator=g).to(device)
    return x, readout, labels


def _last_layer_grad_norm(config, n_sequences=8, seq_len=32, n_classes=16, seed=0, device="cpu"):
    """Release 0.1's ``last_layer_grad_norm`` (deprecated path): the last of :func:`last_layer_grad_norms`."""
    return float(last_layer_grad_norms(config, n_sequences, seq_len, n_classes, seed, device)[-1])


def last_layer_grad_norms(config: StackConfig, n_sequences: int = 8, seq_len: int = 32, n_classes: int = 16,
                          seed: int = 0, device: str = "cpu", per_token: bool = False) -> np.ndarray:
    r"""Gradient norm of the last MLP output weight, for the stacks of every depth ``1..L`` at once.

    Loss: mean cross-entropy of a fixed random Xavier readout of ``final`` with random labels (Xiong
    et al.'s setting; their Theorem 1 in the chapter *Signal propagation*).  Per-layer seeding makes the
    depth-``l`` stack the first ``l`` blocks of the deep one, so one forward pass suffices: each
    depth's last add is replayed from the recorded input and differentiated.

    Parameters
    ----------
    config : StackConfig
        The deepest stack; must contain an MLP (``block`` is ``"mlp"`` or ``"both"``).
    n_sequences, seq_len : int
        Gaussian input tokens, as in :func:`~companion.stacks.residual.forward_sq_norms`.
    n_classes : int, default 16
        Classes of the readout.
    seed : int, default 0
        Seed of the inputs, labels and readout.
    device : str, default "cpu"
    per_token : bool, default False
        ``True``: mean over tokens of each token's gradient norm (the per-sample quantity Xiong
        et al. bound) instead of the gradient of the mean loss.

    Returns
    -------
    numpy.ndarray, shape (L,)
        Entry ``l - 1``: :math:`\|\partial \tilde{\mathcal L} / \partial W^{2,l}\|_F`, first ``l`` blocks.

    Raises
    ------
    ValueError
        If the stack has no MLP, a count is < 1 (``n_classes`` < 2) or out of range, or the run would
        exceed the machine's memory (as :func:`forward_sq_norms`).

    Examples
    --------
    >>> cfg = StackConfig(d_model=16, n_layers=3, n_heads=2, d_ff=16)
    >>> last_layer_grad_norms(cfg, n_sequences=2, seq_len=4).shape
    (3,)
    """
    x, readout, labels = _readout_problem(config, n_sequences, seq_len, n_classes, seed, device)
    if not isinstance(per_token, bool):
        raise TypeError(f"per_token must be a bool, got {per_token!r}")
    stack = ResidualStack(config).to(device)
    lam, beta = config.residual_scale, config.branch_scale
    with torch.no_grad():
        out = stack(x)
    norms = np.empty(config.n_layers)
    for layer in range(config.n_layers):
        block = stack.blocks[layer]
        mlp = block.sublayers[-1]
        with torch.no_grad():
            if config.placement == "pre":
                h_in = out.sublayer_norm_input[layer, -1]            # stream entering the MLP sublayer
                hidden = torch.relu(mlp.f.w_in(mlp.norm(h_in)))
            else:
                h_in = (out.stream[layer] if len(block.sublayers) == 1
                        else block.sublayers[0].norm(out.sublayer_norm_input[layer, 0]))
                hidden = torch.relu(mlp.f.w_in(h_in))
        # the MLP's output before the residual add, as a leaf: d(loss)/dW2 = sum_t g_t^T hidden_t
        z = mlp.f.w_out(hidden).detach().requires_grad_(True)
        total = lam * h_in + beta * z
        h_out = total if config.placement == "pre" else mlp.norm(total)
        logits = (stack.final_norm(h_out) @ readout).reshape(-1, readout.shape[1])
        token_losses = F.cross_entropy(logits, labels, reduction="none")      # [B*T]
        (g,) = torch.autograd.grad(token_losses.sum(), z)                      # g_t = d loss_t / d z_t
        g, hid = g.reshape(-1, g.shape[-1]), hidden.reshape(-1, hidden.shape[-1])
        if per_token:   # mean over tokens of ||d loss_t / d W2||_F = ||g_t|| ||hidden_t|| (rank one)
            norms[layer] = float((g.norm(dim=1) * hid.norm(dim=1)).mean())
        else:           # gradient of the mean loss: || (1/n) sum_t g_t^T hidden_t ||_F
            norms[layer] = float((g.T @ hid).norm() / g.shape[0])
    return norms
