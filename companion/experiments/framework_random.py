"""Experiment ``framework_random``: injection windows of random-initialised stacks.

One sweep per placement x block type x gain of a random stack of the maximal depth, read at every
depth ``L`` (its first ``L`` blocks); chapter *The three-effect framework*.  :data:`GPU_RANDOM` is
the GPU size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import check_positive, check_tuple
from companion.injection.engine import sweep_stack_injections
from companion.experiments import progress_bar, register
from companion.injection.metrics import fit_norm_growth, effect_window, predicted_window
from companion.stacks.residual import ResidualStack, StackConfig, sharpen_attention

__all__ = ["BLOCK_TYPES", "WINDOW_KINDS_RANDOM", "RandomWindowsConfig", "GPU_RANDOM", "random_stack",
           "run_random_windows", "predicted_first_fraction"]

#: Block types of the random-stack experiments: ReLU MLP, attention as initialised by the
#: stacks (W_Q = 0: uniform over the causal prefix), and attention whose logits spread by
#: ``sharp_logit_std`` (:func:`companion.stacks.residual.sharpen_attention`): the chaotic case.
BLOCK_TYPES = ("mlp", "attention", "sharp_attention")
#: Output effects of the random-stack windows (see :meth:`companion.injection.engine.SweepResult.effect_at`).
WINDOW_KINDS_RANDOM = ("relative_projection", "relative_size")


@register("framework_random", schema=1)
@dataclass(frozen=True)
class RandomWindowsConfig:
    """Windows of random-initialised stacks across placements, block types, gains and depths.

    Raises
    ------
    TypeError, ValueError
        If a field has the wrong type or value.

    Examples
    --------
    >>> RandomWindowsConfig().depths, GPU_RANDOM.max_depth
    ((4, 8, 16, 32), 128)
    """

    d_model: int = 64  #: width of the swept stack
    max_depth: int = 32  #: depth of the swept stack
    depths: tuple[int, ...] = (4, 8, 16, 32)  #: depths (<= ``max_depth``) at which the window is read
    gains: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)  #: block-output gains (``StackConfig.gain``)
    blocks: tuple[str, ...] = BLOCK_TYPES  #: a subset of :data:`BLOCK_TYPES`
    placements: tuple[str, ...] = ("pre", "post")
    batch: int = 4  #: input: ``batch`` sequences of ``tokens`` i.i.d. ``N(0, I_d)`` vectors
    tokens: int = 16
    scale: float = 0.1  #: injected norm relative to the baseline's RMS stream norm at the injection layer
    threshold: float = 0.5  #: relative window threshold
    sharp_logit_std: float = 16.0  #: logit spread of ``"sharp_attention"`` blocks
    seed: int = 0

    def __post_init__(self):
        for name in ("d_model", "max_depth", "batch", "tokens"):
            check_positive(getattr(self, name), name, integer=True)
        for name in ("scale", "threshold", "sharp_logit_std"):
            check_positive(getattr(self, name), name)
        if self.threshold > 1:
            raise ValueError(f"threshold is relative and must lie in (0, 1], got {self.threshold}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        check_tuple(self.depths, "depths", int, minimum=1)
        if max(self.depths) > self.max_depth:
            raise ValueError(f"depths {self.depths} exceed max_depth = {self.max_depth}")
        check_tuple(self.gains, "gains", float, minimum=1e-12)
        check_tuple(self.blocks, "blocks", str, allowed=BLOCK_TYPES)
        check_tuple(self.placements, "placements", str, allowed=("pre", "post"))

    def compute(self, device, progress: bool = False) -> dict:
        """:func:`run_random_windows` plus the axis labels; ``progress`` shows a bar over the stacks."""
        n = len(self.placements) * len(self.blocks) * len(self.gains)
        bar = progress_bar(n, progress, "random stacks")
        out = run_random_windows(self, device, progress=bar.update if bar else None)
        if bar:
            bar.close()
        out.update(placements=list(self.placements), blocks=list(self.blocks),
                   gains=list(self.gains), depths=list(self.depths))
        return out


def _check_config(config) -> None:
    if not isinstance(config, RandomWindowsConfig):
        raise TypeError(f"config must be a RandomWindowsConfig, got {type(config).__name__}")


def random_stack(placement: str, block: str, gain: float, d_model: int, n_layers: int,
                 seed: int = 0, sharp_logit_std: float = 16.0) -> ResidualStack:
    """A random-initialised stack of one of the :data:`BLOCK_TYPES` (Xavier init, LayerNorm).

    Parameters
    ----------
    placement : {"pre", "post"}
    block : one of :data:`BLOCK_TYPES`
    gain : float
        Block-output gain.
    d_model, n_layers : int
    seed : int, default 0
    sharp_logit_std : float, default 16.0
        Logit spread for ``"sharp_attention"``.

    Returns
    -------
    companion.stacks.residual.ResidualStack
        In ``eval()`` mode.

    Raises
    ------
    ValueError
        If ``block`` is unknown (``StackConfig`` checks the others).

    Examples
    --------
    >>> st = random_stack("post", "sharp_attention", 1.0, d_model=16, n_layers=2)
    >>> st.config.block, st.config.placement
    ('attention', 'post')
    """
    if block not in BLOCK_TYPES:
        raise ValueError(f"block must be one of {BLOCK_TYPES}, got {block!r}")
    kind = "mlp" if block == "mlp" else "attention"
    heads = 4 if d_model % 4 == 0 else 1
    cfg = StackConfig(d_model=d_model, n_layers=n_layers, n_heads=heads, placement=placement,
                      block=kind, gain=float(gain), seed=seed)
    stack = ResidualStack(cfg)
    if block == "sharp_attention":
        sharpen_attention(stack, sharp_logit_std, seed=seed)
    return stack.eval()


def run_random_windows(config: RandomWindowsConfig, device: str | torch.device = "cpu",
                       progress=None) -> dict[str, np.ndarray]:
    """Sweep every random stack of ``config`` and read its windows at every depth.

    Parameters
    ----------
    config : RandomWindowsConfig
    device : str or torch.device, default "cpu"
    progress : callable, optional
        Called after each stack (e.g. a tqdm ``update``).

    Returns
    -------
    dict of str to numpy.ndarray
        For each kind of :data:`WINDOW_KINDS_RANDOM`, ``"effect_<kind>"``
        ``[P, K, G, D, M]`` (NaN for ``l >= L``) and ``"window_<kind>"`` ``[P, K, G, D, 4]``
        (fractions of depth); ``"growth_c"`` and ``"postln_factor"`` ``[P, K, G]`` (the
        baseline's norm growth and geometric-mean skip-path factor).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`RandomWindowsConfig`.

    Examples
    --------
    >>> cfg = RandomWindowsConfig(d_model=16, max_depth=4, depths=(2, 4), gains=(1.0,), blocks=("mlp",),
    ...                           batch=2, tokens=4)
    >>> out = run_random_windows(cfg)
    >>> out["effect_relative_projection"].shape, out["window_relative_size"].shape
    ((2, 1, 1, 2, 4), (2, 1, 1, 2, 4))
    """
    _check_config(config)
    P, K, G, D, M = (len(config.placements), len(config.blocks), len(config.gains),
                     len(config.depths), config.max_depth)
    out = {f"effect_{k}": np.full((P, K, G, D, M), np.nan) for k in WINDOW_KINDS_RANDOM}
    out.update({f"window_{k}": np.full((P, K, G, D, 4), np.nan) for k in WINDOW_KINDS_RANDOM})
    out.update(growth_c=np.full((P, K, G), np.nan), postln_factor=np.full((P, K, G), np.nan))
    g = torch.Generator().manual_seed(config.seed)
    x = torch.randn(config.batch, config.tokens, config.d_model, generator=g).to(device)
    for p, placement in enumerate(config.placements):
        for k, block in enumerate(config.blocks):
            for gi, gain in enumerate(config.gains):
                stack = random_stack(placement, block, gain, config.d_model, M, config.seed,
                                     config.sharp_logit_std).to(device)
                sw = sweep_stack_injections(stack, x, scale=config.scale, seed=config.seed)
                out["growth_c"][p, k, gi] = fit_norm_growth(sw.base_sq_norm)
                ratio = sw.predicted_projection[0, 1:] / sw.predicted_projection[0, :-1]
                out["postln_factor"][p, k, gi] = float(np.exp(np.mean(np.log(ratio))))
                for di, depth in enumerate(config.depths):
                    for kind in WINDOW_KINDS_RANDOM:
                        layers, eff = sw.effect_at(depth, kind)
                        out[f"effect_{kind}"][p, k, gi, di, layers] = eff
                        out[f"window_{kind}"][p, k, gi, di] = effect_window(
                            eff, layers=layers, n_layers=depth, threshold=config.threshold).fractions
                if progress is not None:
                    progress()
    return out


def predicted_first_fraction(arrays: dict, config: RandomWindowsConfig) -> np.ndarray:
    """Lower edge of the predicted window, as a fraction of depth, for every stack and depth.

    Parameters
    ----------
    arrays : dict
        :func:`run_random_windows` output (or ``Result.arrays`` of ``framework_random``).
    config : RandomWindowsConfig
        The config that produced it.

    Returns
    -------
    numpy.ndarray, shape ``[P, K, G, D]``
        ``first / L`` of :func:`~companion.injection.metrics.predicted_window`.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`RandomWindowsConfig`.

    Examples
    --------
    >>> cfg = RandomWindowsConfig(d_model=16, max_depth=4, depths=(2, 4), gains=(1.0,), blocks=("mlp",),
    ...                           batch=2, tokens=4)
    >>> predicted_first_fraction(run_random_windows(cfg), cfg).shape
    (2, 1, 1, 2)
    """
    _check_config(config)
    out = np.empty(arrays["growth_c"].shape + (len(config.depths),))
    for (p, k, g), _ in np.ndenumerate(arrays["growth_c"]):
        for di, depth in enumerate(config.depths):
            if config.placements[p] == "post":
                first, _ = predicted_window("post", depth, factor=arrays["postln_factor"][p, k, g])
            else:
                first, _ = predicted_window("pre", depth, c=arrays["growth_c"][p, k, g])
            out[p, k, g, di] = first / depth
    return out


#: Random stacks at GPU scale: width 512, depths up to 128.
GPU_RANDOM = RandomWindowsConfig(d_model=512, max_depth=128, depths=(8, 16, 32, 64, 128),
                                 batch=8, tokens=64)
