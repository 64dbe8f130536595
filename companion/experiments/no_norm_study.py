"""Tails of the residual stream with depth in byte-level TinyLMs without normalisation, Pre-LN and Post-LN.

One TinyLM per *variant* of :data:`VARIANTS` (no norm, Pre-LN, Post-LN) and *seed* is trained with
:func:`~companion.stacks.tinylm.train_tiny_lm`; the seed fixes the initialisation and the order of the
training windows, shared by the three variants.  Every model, and each seed's initialisation, is then
measured on held-out paragraphs ("texts"): per text, layer and site (the stream ``h_l`` and the input of
block ``l``'s attention branch), the tail statistics of :func:`tail_statistics`.  Chapter *Training
controls* (section "Without normalisation") renders the stored Result with a bootstrap over texts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from companion._validation import check_int, check_real
from companion.applications.training_controls import tiny_lm_loss
from companion.corpus import load_corpus
from companion.experiments import progress_bar, register
from companion.stacks.residual import StackConfig
from companion.stacks.tinylm import TinyLM, byte_tokenize, train_tiny_lm

__all__ = ["VARIANTS", "STATISTICS", "NoNormStudy", "held_out_texts", "member_config", "tail_statistics",
           "tiny"]

#: The variants: ``(placement, norm)`` of :class:`~companion.stacks.residual.StackConfig`.
VARIANTS = {"none": ("pre", "none"), "pre": ("pre", "layernorm"), "post": ("post", "layernorm")}
#: The per-text statistics of :func:`tail_statistics`, in the order of its last axis.
STATISTICS = ("rms", "kurtosis", "peak", "top_median", "frac6")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def tail_statistics(x, multiple: float = 6.0) -> np.ndarray:
    r"""Tail statistics of the entries of each row of ``x``.

    For a row of entries :math:`x_1, \dots, x_n` with :math:`r = (\frac1n\sum x_i^2)^{1/2}`: ``rms``
    :math:`r`; ``kurtosis`` the excess kurtosis about the row mean :math:`m_4/m_2^2 - 3`; ``peak``
    :math:`\max|x_i|/r`; ``top_median`` :math:`\max|x_i|/\operatorname{median}|x_i|`; ``frac6`` the
    fraction of entries with :math:`|x_i| \ge` ``multiple`` :math:`\cdot r`.

    Parameters
    ----------
    x : array_like or torch.Tensor, shape ``[..., n]``
        Finite values; ``n >= 2`` and no row constant.
    multiple : float, default 6.0
        Threshold of ``frac6`` in units of the row's rms (LLM.int8()'s magnitude 6, scaled).

    Returns
    -------
    numpy.ndarray, shape ``[..., 5]``
        The statistics of :data:`STATISTICS`, in that order.

    Raises
    ------
    TypeError, ValueError
        A non-real input, fewer than 2 entries per row, a NaN or inf, a row with zero variance or a
        median magnitude of 0, or ``multiple <= 0``.

    Examples
    --------
    >>> s = tail_statistics([1.0, -1.0, 1.0, -1.0])
    >>> s.round(3).tolist()                 # rms, kurtosis, peak, top/median, fraction >= 6 rms
    [1.0, -2.0, 1.0, 1.0, 0.0]
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    if isinstance(x, (bool, str, bytes)) or x is None:
        raise TypeError(f"x must be an array of real numbers, got {type(x).__name__}")
    a = np.asarray(x)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"x must be an array of real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if a.ndim == 0 or a.shape[-1] < 2:
        raise ValueError(f"x needs at least 2 entries along its last axis, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("x contains NaN or infinite values")
    multiple = check_real(multiple, "multiple", lo=0.0, lo_open=True)
    c = a - a.mean(axis=-1, keepdims=True)
    m2 = (c ** 2).mean(axis=-1)
    mag = np.abs(a)
    med = np.median(mag, axis=-1)
    if (m2 <= 0).any() or (med <= 0).any():
        raise ValueError("every row of x needs a positive variance and a positive median magnitude")
    rms = np.sqrt((a ** 2).mean(axis=-1))
    top = mag.max(axis=-1)
    kurt = (c ** 4).mean(axis=-1) / m2 ** 2 - 3.0
    frac = (mag >= multiple * rms[..., None]).mean(axis=-1)
    return np.stack([rms, kurt, top / rms, top / med, frac], axis=-1)


@register("no_norm_study", schema=1)
@dataclass(frozen=True)
class NoNormStudy:
    """Config of the study (defaults: the CPU size rendered by the chapter).

    Raises
    ------
    TypeError, ValueError
        Unknown or repeated variants, fewer than 2 distinct seeds, bad sizes, rate, scale or dtype.

    Examples
    --------
    >>> NoNormStudy().variants, NoNormStudy().branch_scale
    (('none', 'pre', 'post'), 0.25)
    """

    variants: tuple[str, ...] = tuple(VARIANTS)  #: keys of :data:`VARIANTS`
    seeds: tuple[int, ...] = (0, 1, 2)
    d_model: int = 64
    n_layers: int = 8
    n_heads: int = 4
    #: ``beta`` of every residual add, for all variants: ``1/sqrt(2 n_layers)`` (16 adds) by default
    branch_scale: float = 0.25
    steps: int = 500
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 3e-3  #: peak rate of AdamW (weight decay 0.01, clipping at 1; ``train_tiny_lm``)
    warmup: int = 50
    dtype: str = "float64"
    held_out: int = 20  #: the last ``len(paragraphs) // held_out`` paragraphs are held out
    text_bytes: int = 128  #: bytes per text (its first ones), in windows of ``seq_len``
    max_texts: int = 64  #: at most this many held-out paragraphs of ``text_bytes`` bytes or more

    def __post_init__(self):
        if not self.variants:
            raise ValueError("NoNormStudy.variants must be non-empty")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"NoNormStudy.variants must be among {tuple(VARIANTS)}, got {v!r}")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"NoNormStudy.variants must be distinct, got {self.variants}")
        for s in self.seeds:
            check_int(s, "NoNormStudy.seeds", minimum=0)
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"NoNormStudy.seeds must be at least 2 distinct seeds, got {self.seeds}")
        for name in ("d_model", "n_layers", "n_heads", "steps", "batch_size", "seq_len", "text_bytes"):
            check_int(getattr(self, name), f"NoNormStudy.{name}", minimum=1)
        check_int(self.max_texts, "NoNormStudy.max_texts", minimum=2)
        check_int(self.warmup, "NoNormStudy.warmup", minimum=0)
        check_int(self.held_out, "NoNormStudy.held_out", minimum=2)
        if self.d_model % self.n_heads:
            raise ValueError(f"NoNormStudy.n_heads = {self.n_heads} must divide d_model = {self.d_model}")
        if self.text_bytes % self.seq_len:
            raise ValueError(f"NoNormStudy.text_bytes = {self.text_bytes} must be a multiple of "
                             f"seq_len = {self.seq_len}")
        check_real(self.lr, "NoNormStudy.lr", lo=0.0, lo_open=True)
        check_real(self.branch_scale, "NoNormStudy.branch_scale", lo=0.0, lo_open=True)
        if self.dtype not in _DTYPES:
            raise ValueError(f"NoNormStudy.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    def compute(self, device, progress: bool = False) -> dict:
        """Train and measure every (variant, seed) pair; the arrays of the Result."""
        return _run_study(self, progress)


def member_config(config: NoNormStudy, variant: str, seed: int) -> StackConfig:
    """The :class:`StackConfig` of one run (``variant`` a key of :data:`VARIANTS`)."""
    if not isinstance(config, NoNormStudy):
        raise TypeError(f"config must be a NoNormStudy, got {type(config).__name__}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    placement, norm = VARIANTS[variant]
    return StackConfig(d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
                       vocab_size=256, max_len=config.seq_len, placement=placement, norm=norm,
                       branch_scale=config.branch_scale, seed=check_int(seed, "seed", minimum=0))


def held_out_texts(config: NoNormStudy) -> tuple[list[str], torch.Tensor]:
    """Training paragraphs and the held-out texts as ids ``[n_texts, text_bytes]`` (first bytes of each)."""
    if not isinstance(config, NoNormStudy):
        raise TypeError(f"config must be a NoNormStudy, got {type(config).__name__}")
    paragraphs = load_corpus()
    k = len(paragraphs) // config.held_out
    texts = [p for p in paragraphs[-k:] if len(p.encode("utf-8")) >= config.text_bytes][:config.max_texts]
    if len(texts) < 2:
        raise ValueError(f"fewer than 2 held-out paragraphs have {config.text_bytes} bytes")
    ids = torch.stack([byte_tokenize(t)[:config.text_bytes] for t in texts])
    return paragraphs[:-k], ids


def _measure(model: TinyLM, ids: torch.Tensor, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-text statistics of the stream ``[L+1, n, 5]`` and of the attention-branch inputs ``[L, n, 5]``."""
    n, nb = ids.shape[0], ids.shape[1] // seq_len
    windows = ids.reshape(n * nb, seq_len)
    inputs = {}
    handles = [b.sublayers[0].f.register_forward_pre_hook(
        lambda _m, args, layer=layer: inputs.__setitem__(layer, args[0].detach()))
        for layer, b in enumerate(model.stack.blocks)]
    try:
        with torch.no_grad():
            _, out = model(windows.to(next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    d = out.stream.shape[-1]
    stream = out.stream.reshape(out.stream.shape[0], n, nb * seq_len * d)
    branch_in = torch.stack([inputs[layer] for layer in range(len(inputs))]).reshape(len(inputs), n, -1)
    return tail_statistics(stream), tail_statistics(branch_in)


def _run_study(config: NoNormStudy, progress: bool = False) -> dict:
    """Train and measure every (variant, seed); return the arrays of the Result."""
    if not isinstance(config, NoNormStudy):
        raise TypeError(f"config must be a NoNormStudy, got {type(config).__name__}")
    dtype = _DTYPES[config.dtype]
    train_text, texts = held_out_texts(config)
    eval_ids = texts.reshape(-1)
    V, S = len(config.variants), len(config.seeds)
    shape = (V, S)
    out = {k: [] for k in ("stream", "block_input", "init_stream", "init_block_input", "train_loss",
                           "eval_loss", "init_eval_loss", "cpu_seconds", "wall_seconds")}
    bar = progress_bar(V * S, progress, "no-norm study")
    for variant in config.variants:
        for seed in config.seeds:
            cfg = member_config(config, variant, seed)
            init = TinyLM(cfg).to(dtype).eval()
            st0, bi0 = _measure(init, texts, config.seq_len)
            c0, w0 = time.process_time(), time.perf_counter()
            model, losses = train_tiny_lm(cfg, train_text, steps=config.steps, batch_size=config.batch_size,
                                          seq_len=config.seq_len, lr=config.lr, seed=seed,
                                          warmup=config.warmup, dtype=dtype)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            st, bi = _measure(model, texts, config.seq_len)
            for key, value in (("stream", st), ("block_input", bi), ("init_stream", st0),
                               ("init_block_input", bi0), ("train_loss", losses),
                               ("eval_loss", tiny_lm_loss(model, eval_ids, config.seq_len)),
                               ("init_eval_loss", tiny_lm_loss(init, eval_ids, config.seq_len)),
                               ("cpu_seconds", cpu), ("wall_seconds", wall)):
                out[key].append(value)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(*shape, *np.shape(v[0])) for k, v in out.items()}
    arrays.update(variants=list(config.variants), seeds=list(config.seeds), statistics=list(STATISTICS),
                  n_texts=int(texts.shape[0]), entries_per_text=int(config.text_bytes * config.d_model),
                  train_tokens=config.steps * config.batch_size * config.seq_len,
                  branch_scale_rule=f"1/sqrt(2L) = {1 / math.sqrt(2 * config.n_layers):.4f}")
    return arrays


def tiny(**overrides) -> NoNormStudy:
    """A seconds-sized config for tests (width 8, two blocks, two seeds).

    Parameters
    ----------
    **overrides
        Fields to change.

    Returns
    -------
    NoNormStudy
    """
    base = NoNormStudy(seeds=(0, 1), d_model=8, n_layers=2, n_heads=2, steps=4, batch_size=2, seq_len=16,
                       warmup=1, text_bytes=32, max_texts=4)
    return replace(base, **overrides)
