"""The outlier note's training controls (§6), made testable on a byte-level TinyLM.

Weights use the ``nn.Linear`` layout ``(out, in)``; the note's *column* ``j`` (the weights feeding
output ``j``) is row ``j`` here.  Derivations: the chapter :doc:`/book/training_controls`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from companion._validation import check_int, check_real, real_array, real_vector
from companion.applications.quantization import _check_weight
from companion.stacks.residual import StackConfig
from companion.stacks.tinylm import TinyLM

__all__ = ["tail_clip_threshold", "TailClipper", "column_means", "mean_frobenius_penalty",
           "regularised_weights", "TrainingControls", "ControlledRun", "train_with_controls", "tiny_lm_loss",
           "StreamDrift", "stream_drift", "seed_interval"]


def _check_probability(delta, name: str = "delta") -> float:
    """``delta`` as a float in the open interval (0, 1)."""
    return check_real(delta, name, lo=0.0, lo_open=True, hi=1.0, hi_open=True)


def _check_tinylm(model) -> None:
    """TypeError unless ``model`` is a TinyLM."""
    if not isinstance(model, TinyLM):
        raise TypeError(f"model must be a TinyLM, got {type(model).__name__}")


def _check_ids(ids, name: str, min_len: int) -> torch.Tensor:
    """``ids`` checked to be a 1-D integer tensor of at least ``min_len`` tokens."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer tensor of token ids (e.g. byte_tokenize(text))")
    if ids.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
    if ids.numel() < min_len:
        raise ValueError(f"{name} has {ids.numel()} tokens; need at least {min_len}")
    return ids


def tail_clip_threshold(mean, std, delta: float):
    """Gradient-norm threshold exceeded with probability at most ``delta`` under a sub-Gaussian model.

    Parameters
    ----------
    mean : float or array_like
        Mean ``m`` of the gradient norm.
    std : float or array_like, ≥ 0
        Its sub-Gaussian parameter ``s`` (estimated by the standard deviation).
    delta : float in (0, 1)
        Target probability of clipping.

    Returns
    -------
    float or numpy.ndarray
        ``τ = m + s · sqrt(2 ln(1/δ))``.

    Raises
    ------
    ValueError
        If ``std`` < 0, ``delta`` ∉ (0, 1), a value is NaN/inf, or ``τ`` exceeds the float64 range.

    Examples
    --------
    >>> round(tail_clip_threshold(1.0, 0.5, 0.01), 4)
    2.5174
    """
    d = _check_probability(delta)
    m, s = real_array("mean", mean), real_array("std", std)
    if (s < 0).any():
        raise ValueError(f"std must be >= 0, got {s.min()}")
    return _tail_clip_threshold(m, s, d)


def _tail_clip_threshold(m: np.ndarray, s: np.ndarray, d: float):
    """:func:`tail_clip_threshold` on validated float64 arrays and ``d`` in (0, 1)."""
    if d < 1e-300:  # 1/d overflows below 5.6e-309
        log_inv = -math.log(d)
    elif d > 0.99:  # 1/d keeps few digits of 1 - d: ln(1/d) = -log1p(d - 1), d - 1 exact
        log_inv = -math.log1p(d - 1.0)
    else:
        log_inv = math.log(1.0 / d)
    with np.errstate(over="ignore"):
        tau = m + s * math.sqrt(2.0 * log_inv)
    if not np.isfinite(tau).all():
        raise ValueError(
            "the threshold m + s sqrt(2 ln(1/delta)) exceeds the float64 range; rescale the norms")
    return float(tau) if tau.ndim == 0 else tau


class TailClipper:
    """Dynamic clipping threshold from the last ``window`` gradient norms.

    Parameters
    ----------
    delta : float in (0, 1), default 0.01
        Target clipping probability of :func:`tail_clip_threshold`.
    window : int, default 50
        Number of most recent (unclipped) gradient norms used for the mean and std.
    min_history : int, default 20
        Below this many observations the threshold is ``inf`` (no clipping yet).

    Raises
    ------
    TypeError, ValueError
        For non-integer or too small sizes, ``min_history > window``, or a bad ``delta``.

    Examples
    --------
    >>> TailClipper(delta=0.01, window=3, min_history=2).threshold
    inf
    """

    def __init__(self, delta: float = 0.01, window: int = 50, min_history: int = 20):
        self.delta = _check_probability(delta)
        self.window = check_int(window, "window", 2)
        self.min_history = check_int(min_history, "min_history", 2)
        if self.min_history > self.window:
            raise ValueError(f"min_history ({min_history}) must not exceed window ({window})")
        self._norms: deque[float] = deque(maxlen=self.window)

    def update(self, grad_norm: float) -> None:
        """Record one (unclipped) gradient norm; ValueError if it is negative or not finite."""
        self._norms.append(check_real(grad_norm, "grad_norm", lo=0.0))

    @property
    def threshold(self) -> float:
        """Current ``τ`` (``inf`` while fewer than ``min_history`` norms are recorded)."""
        if len(self._norms) < self.min_history:
            return math.inf
        a = np.fromiter(self._norms, dtype=np.float64)
        return _tail_clip_threshold(np.asarray(a.mean()), np.asarray(a.std()), self.delta)


def column_means(weight: torch.Tensor) -> torch.Tensor:
    """The note's column means: for each output ``j``, the mean of the weights feeding it.

    Parameters
    ----------
    weight : torch.Tensor, shape (out, in)

    Returns
    -------
    torch.Tensor, shape (out,)
        ``c_j = (1/in) Σ_i W[j, i]`` (differentiable).

    Raises
    ------
    TypeError, ValueError
        If ``weight`` is not a 2-D floating tensor.

    Examples
    --------
    >>> column_means(torch.tensor([[1.0, 3.0], [2.0, -2.0]])).tolist()
    [2.0, 0.0]
    """
    _check_weight(weight, "weight")
    return weight.mean(dim=1)


def mean_frobenius_penalty(weights: Sequence[torch.Tensor], lam_frobenius: float,
                           lam_colmean: float) -> torch.Tensor:
    """The note's regulariser ``Σ_W λ_F ‖W‖_F² + λ_μ ‖colmean(W)‖²``.

    Parameters
    ----------
    weights : sequence of torch.Tensor, each (out, in)
        The regularised matrices (:func:`regularised_weights`).
    lam_frobenius : float ≥ 0
        ``λ_F``, on the scale of the weights ("the variance").
    lam_colmean : float ≥ 0
        ``λ_μ``, on the column means ("the systematic bias").

    Returns
    -------
    torch.Tensor
        A differentiable scalar.

    Raises
    ------
    TypeError, ValueError
        If ``weights`` is empty or not a list of 2-D floating tensors, or a λ is negative or not finite.

    Examples
    --------
    >>> round(float(mean_frobenius_penalty([torch.tensor([[1.0, 3.0], [2.0, -2.0]])], 0.1, 1.0)), 4)
    5.8
    """
    lf = check_real(lam_frobenius, "lam_frobenius", lo=0.0)
    lm = check_real(lam_colmean, "lam_colmean", lo=0.0)
    if isinstance(weights, torch.Tensor) or not isinstance(weights, Sequence):
        raise TypeError("weights must be a list of weight tensors")
    if len(weights) == 0:
        raise ValueError("weights is empty; pass at least one matrix")
    for k, w in enumerate(weights):
        _check_weight(w, f"weights[{k}]")
    return _mean_frobenius_penalty(weights, lf, lm)


def _mean_frobenius_penalty(weights, lf: float, lm: float) -> torch.Tensor:
    """:func:`mean_frobenius_penalty` on validated 2-D weights and float weights ``lf``, ``lm``."""
    return sum(lf * w.pow(2).sum() + lm * w.mean(dim=1).pow(2).sum() for w in weights)


def regularised_weights(model: torch.nn.Module,
                        targets: Sequence[str]) -> list[tuple[str, torch.nn.Parameter]]:
    """The weight matrices of the ``nn.Linear`` modules whose attribute name is in ``targets``.

    Parameters
    ----------
    model : torch.nn.Module
        E.g. a TinyLM (attention ``w_q, w_k, w_v, w_o``; MLP ``w_in, w_out``; ``unembed``).
    targets : sequence of str
        Attribute names, e.g. ``("w_v", "w_o")`` for the note's "value and output matrices".

    Returns
    -------
    list of (str, torch.nn.Parameter)
        Qualified name and weight of each matched layer, in module order.

    Raises
    ------
    ValueError
        If ``targets`` is empty or matches no linear layer.

    Examples
    --------
    >>> lm = TinyLM(StackConfig(d_model=8, n_layers=2, n_heads=2, vocab_size=256, max_len=8))
    >>> [n for n, _ in regularised_weights(lm, ["w_o"])]
    ['stack.blocks.0.sublayers.0.f.w_o', 'stack.blocks.1.sublayers.0.f.w_o']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not all(
            isinstance(t, str) for t in targets):
        raise TypeError("targets must be a list of attribute names such as ['w_v', 'w_o']")
    if not targets:
        raise ValueError("targets is empty; name at least one kind of matrix, e.g. 'w_o'")
    out = [(n, m.weight) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in set(targets)]
    if not out:
        raise ValueError(f"no linear layer of the model is named like {list(targets)}")
    return out


_CLIP_MODES = ("none", "fixed", "tail")


@dataclass(frozen=True)
class TrainingControls:
    """Gradient clipping and the mean-and-Frobenius regulariser of one training run.

    Raises
    ------
    TypeError, ValueError
        For values of the wrong type or out of range.

    Examples
    --------
    >>> TrainingControls(clip="tail", tail_delta=0.05).clip
    'tail'
    """

    #: clip the gradient norm: ``"none"``, ``"fixed"`` (``clip_value``) or ``"tail"`` (:class:`TailClipper`)
    clip: str = "fixed"
    clip_value: float = 1.0  #: the fixed threshold, > 0
    tail_delta: float = 0.01  #: the :class:`TailClipper`'s ``delta``
    tail_window: int = 50  #: the :class:`TailClipper`'s ``window``
    tail_min_history: int = 20  #: the :class:`TailClipper`'s ``min_history``
    lam_frobenius: float = 0.0  #: ``λ_F`` of :func:`mean_frobenius_penalty`, ≥ 0
    lam_colmean: float = 0.0  #: ``λ_μ`` of :func:`mean_frobenius_penalty`, ≥ 0
    reg_targets: tuple[str, ...] = ("w_v", "w_o")  #: matrices regularised (:func:`regularised_weights`)

    def __post_init__(self):
        if not isinstance(self.clip, str) or self.clip not in _CLIP_MODES:
            raise ValueError(f"clip must be one of {_CLIP_MODES}, got {self.clip!r}")
        check_real(self.clip_value, "clip_value", lo=0.0, lo_open=True)
        TailClipper(self.tail_delta, self.tail_window, self.tail_min_history)  # validates
        check_real(self.lam_frobenius, "lam_frobenius", lo=0.0)
        check_real(self.lam_colmean, "lam_colmean", lo=0.0)
        if not isinstance(self.reg_targets, tuple) or not all(isinstance(t, str) for t in self.reg_targets):
            raise TypeError("reg_targets must be a tuple of strings such as ('w_v', 'w_o')")

    @property
    def regularised(self) -> bool:
        """Whether the regulariser is active."""
        return self.lam_frobenius > 0 or self.lam_colmean > 0


@dataclass
class ControlledRun:
    """Record of :func:`train_with_controls`."""

    model: TinyLM  #: the trained model, in ``eval()`` mode
    losses: np.ndarray  #: cross-entropy per step (nats/byte, without the penalty), shape (steps,)
    grad_norms: np.ndarray  #: global gradient norm per step, before clipping
    thresholds: np.ndarray  #: clipping threshold per step (``inf`` = none)
    clipped: np.ndarray  #: whether each step was clipped (bool)
    eval_loss: float  #: held-out cross-entropy (:func:`tiny_lm_loss`)
    controls: TrainingControls  #: the run's controls
    config: StackConfig = field(repr=False)  #: the model's configuration

    @property
    def clip_rate(self) -> float:
        """Fraction of steps at which the gradient was clipped."""
        return float(self.clipped.mean())


def train_with_controls(
    config: StackConfig,
    train_ids: torch.Tensor,
    eval_ids: torch.Tensor,
    controls: TrainingControls = TrainingControls(),
    *,
    steps: int = 200,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 3e-3,
    warmup: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    callback: Callable[[int, TinyLM], None] | None = None,
) -> ControlledRun:
    """Train a TinyLM with a chosen clipping rule and the optional regulariser.

    Parameters
    ----------
    config : StackConfig
        ``vocab_size`` 256 (bytes), ``max_len ≥ seq_len``.
    train_ids, eval_ids : torch.LongTensor, 1-D
        Byte ids (:func:`~companion.stacks.tinylm.byte_tokenize`) of the training and held-out text.
    controls : TrainingControls
    steps, batch_size, seq_len, warmup, seed
        As in :func:`~companion.stacks.tinylm.train_tiny_lm`.
    lr : float > 0
        Peak learning rate of Adam (no weight decay: the only penalty is the regulariser).
    dtype : torch.float32 or torch.float64, default float32
        Precision of training; float64 keeps the trajectory the same under every CPU kernel set.
    callback : callable or None
        Called as ``callback(step, model)`` after every step (from 1); it must not change the model.

    Returns
    -------
    ControlledRun

    Raises
    ------
    TypeError, ValueError
        For a bad argument or text, or a training loss that becomes NaN/inf (the message says when).
    """
    if not isinstance(config, StackConfig):
        raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
    if config.vocab_size != 256:
        raise ValueError(f"config.vocab_size must be 256 (bytes), got {config.vocab_size}")
    if not isinstance(controls, TrainingControls):
        raise TypeError(f"controls must be a TrainingControls, got {type(controls).__name__}")
    steps = check_int(steps, "steps", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    seq_len = check_int(seq_len, "seq_len", 2)
    seed = check_int(seed, "seed", 0)
    lr = check_real(lr, "lr", lo=0.0, lo_open=True)
    warmup = max(1, steps // 10) if warmup is None else check_int(warmup, "warmup", 0)
    if seq_len > config.max_len:
        raise ValueError(f"seq_len = {seq_len} exceeds config.max_len = {config.max_len}")
    train_ids = _check_ids(train_ids, "train_ids", seq_len + 2)
    eval_ids = _check_ids(eval_ids, "eval_ids", seq_len + 1)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable as callback(step, model), got {type(callback).__name__}")

    model = TinyLM(config).to(dtype)
    reg_w = [w for _, w in regularised_weights(model, controls.reg_targets)] if controls.regularised else []
    lam_f, lam_m = float(controls.lam_frobenius), float(controls.lam_colmean)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.95))

    def rate(step):
        if step < warmup:
            return (step + 1) / max(1, warmup)
        frac = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    clipper = TailClipper(controls.tail_delta, controls.tail_window, controls.tail_min_history)
    g = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len + 1)
    losses, norms, taus = np.empty(steps), np.empty(steps), np.empty(steps)
    clipped = np.zeros(steps, dtype=bool)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for step in range(steps):
        starts = torch.randint(0, train_ids.numel() - seq_len - 1, (batch_size,), generator=g)
        window = train_ids[starts[:, None] + offsets]
        logits, _ = model(window[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        loss = (ce + _mean_frobenius_penalty(reg_w, lam_f, lam_m)) if reg_w else ce
        if not torch.isfinite(loss):
            raise ValueError(f"the training loss became {loss.item()} at step {step}; lower lr or clip")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad.detach().norm() for p in params if p.grad is not None]
        gnorm = float(torch.linalg.vector_norm(torch.stack(grads)))
        if controls.clip == "fixed":
            tau = controls.clip_value
        else:
            tau = clipper.threshold if controls.clip == "tail" else math.inf
        if gnorm > tau:
            factor = tau / (gnorm + 1e-12)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(factor)
            clipped[step] = True
        clipper.update(gnorm)
        opt.step()
        sched.step()
        losses[step], norms[step], taus[step] = ce.item(), gnorm, tau
        if callback is not None:
            model.eval()
            callback(step + 1, model)
            model.train()
    model.eval()
    return ControlledRun(model=model, losses=losses, grad_norms=norms, thresholds=taus, clipped=clipped,
                         eval_loss=_tiny_lm_loss(model, eval_ids, seq_len, 64), controls=controls,
                         config=config)


def tiny_lm_loss(model: TinyLM, ids: torch.Tensor, seq_len: int, batch_size: int = 64) -> float:
    """Mean next-token cross-entropy of a TinyLM on non-overlapping windows of ``ids``.

    Parameters
    ----------
    model : TinyLM
    ids : torch.LongTensor, 1-D
    seq_len : int ≥ 1
        Tokens fed per window; each window of ``seq_len + 1`` ids yields ``seq_len`` predictions.
    batch_size : int ≥ 1
        Windows per forward pass.

    Returns
    -------
    float
        Nats per token, over ``⌊(len(ids) − 1)/seq_len⌋`` windows.

    Raises
    ------
    TypeError, ValueError
        If ``model`` is not a TinyLM, ``ids`` is shorter than ``seq_len + 1`` or a size is < 1.
    """
    _check_tinylm(model)
    seq_len = check_int(seq_len, "seq_len", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    ids = _check_ids(ids, "ids", seq_len + 1)
    return _tiny_lm_loss(model, ids, seq_len, batch_size)


def _tiny_lm_loss(model: TinyLM, ids: torch.Tensor, seq_len: int, batch_size: int) -> float:
    """:func:`tiny_lm_loss` on validated arguments."""
    n = (ids.numel() - 1) // seq_len
    starts = torch.arange(n) * seq_len
    offsets = torch.arange(seq_len + 1)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for b in range(0, n, batch_size):
            w = ids[starts[b:b + batch_size, None] + offsets]
            logits, _ = model(w[:, :-1])
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
            total += float(ce)
            count += w[:, 1:].numel()
    model.train(was_training)
    return total / count


@dataclass(frozen=True)
class StreamDrift:
    """Mean drift and outliers of a TinyLM's residual stream at each of its ``L+1`` layers."""

    mean: np.ndarray  #: channel mean ``μ_j`` over the tokens, shape (L+1, d)
    std: np.ndarray  #: channel standard deviation ``σ_j``, shape (L+1, d)
    rms: np.ndarray  #: ``sqrt(mean x²)`` over tokens and channels (the layer's scale), shape (L+1,)
    max_abs: np.ndarray  #: largest ``|x|`` of each layer, shape (L+1,)
    multiples: np.ndarray  #: thresholds ``t = multiple · rms_l``, shape (k,)
    exceed_frac: np.ndarray  #: fraction of entries with ``|x| > t``, shape (L+1, k)
    mean_dominated: np.ndarray  #: channels with ``|μ_j| > t`` (Theorem 2's mean-dominated regime), (L+1, k)
    n_tokens: int  #: number of tokens
    channel_max_abs: np.ndarray  #: largest ``|x_tj|`` of each channel, shape (L+1, d)

    @property
    def channel_peak(self) -> np.ndarray:
        """``max_t |x_tj| / rms_l`` per layer and channel, shape (L+1, d): outliers stand out."""
        return self.channel_max_abs / self.rms[:, None]

    @property
    def channel_rms(self) -> np.ndarray:
        """``sqrt(mean_t x_tj²) / rms_l`` per layer and channel (1 for equal channels)."""
        return np.sqrt(self.mean**2 + self.std**2) / self.rms[:, None]

    @property
    def drift(self) -> np.ndarray:
        """Relative mean drift ``‖μ‖ / (sqrt(d) · rms)`` per layer (0: centred, 1: all mean)."""
        d = self.mean.shape[1]
        return np.linalg.norm(self.mean, axis=1) / (math.sqrt(d) * self.rms)


def stream_drift(model: TinyLM, ids: torch.Tensor, seq_len: int, multiples=(4.0, 6.0),
                 max_windows: int = 64) -> StreamDrift:
    """Channel means, scales and outlier counts of the residual stream of a TinyLM.

    Parameters
    ----------
    model : TinyLM
    ids : torch.LongTensor, 1-D
        Held-out bytes, cut into non-overlapping windows of ``seq_len`` tokens.
    seq_len : int ≥ 1
    multiples : sequence of float > 0
        Thresholds in units of the layer's rms.
    max_windows : int ≥ 1
        At most this many windows (one forward pass).

    Returns
    -------
    StreamDrift

    Raises
    ------
    TypeError, ValueError
        If ``model`` is not a TinyLM, ``multiples`` is empty or not positive, or ``ids`` is too short.
    """
    _check_tinylm(model)
    seq_len = check_int(seq_len, "seq_len", 1)
    max_windows = check_int(max_windows, "max_windows", 1)
    mult = real_vector("multiples", multiples)
    if (mult <= 0).any():
        raise ValueError("multiples must be > 0")
    ids = _check_ids(ids, "ids", seq_len)
    n = min(max_windows, ids.numel() // seq_len)
    with torch.no_grad():
        _, out = model(ids[: n * seq_len].view(n, seq_len))
    x = out.stream.double().reshape(out.stream.shape[0], -1, out.stream.shape[-1])  # [L+1, N, d]
    mu = x.mean(dim=1)
    rms = x.pow(2).mean(dim=(1, 2)).sqrt()
    t = rms[:, None] * torch.as_tensor(mult, dtype=x.dtype)[None, :]  # [L+1, k]
    chmax = x.abs().amax(dim=1)                                         # [L+1, d]
    return StreamDrift(
        mean=mu.cpu().numpy(), std=x.std(dim=1, unbiased=False).cpu().numpy(), rms=rms.cpu().numpy(),
        max_abs=chmax.amax(dim=1).cpu().numpy(), multiples=mult,
        exceed_frac=(x.abs()[:, :, :, None] > t[:, None, None, :]).double().mean(dim=(1, 2)).cpu().numpy(),
        mean_dominated=(mu.abs()[:, :, None] > t[:, None, :]).sum(dim=1).cpu().numpy().astype(np.int64),
        n_tokens=int(x.shape[1]), channel_max_abs=chmax.cpu().numpy())


def seed_interval(values, level: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds and its Student-t confidence interval.

    Parameters
    ----------
    values : array_like, at least 2 entries along ``axis``
        One value per seed, or per-seed paired differences between two arms that share seeds.
    level : float in (0, 1), default 0.95
    axis : int, default 0
        The seed axis.

    Returns
    -------
    mean, lo, hi : numpy.ndarray
        ``mean ± t_{n-1, (1+level)/2} · s/√n``, ``s`` the sample standard deviation (0-d for 1-D input).

    Raises
    ------
    ValueError
        For fewer than 2 seeds, a NaN/inf value, ``level`` ∉ (0, 1) or ``axis`` out of range.

    Examples
    --------
    >>> [round(float(v), 3) for v in seed_interval([1.0, 2.0, 3.0, 4.0, 5.0])]
    [3.0, 1.037, 4.963]
    """
    lv = _check_probability(level, "level")
    a = real_array("values", values)
    if a.ndim == 0:
        raise ValueError("values must hold one value per seed, got a scalar")
    ax = check_int(axis, "axis")
    if not -a.ndim <= ax < a.ndim:
        raise ValueError(f"axis {ax} is out of range for an array of {a.ndim} dimensions")
    n = a.shape[ax]
    if n < 2:
        raise ValueError(f"need at least 2 seeds for an interval, got {n}")
    mean = a.mean(axis=ax)
    half = stats.t.ppf(0.5 + lv / 2, n - 1) * a.std(axis=ax, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half
