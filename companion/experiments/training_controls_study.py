"""Clipping and the mean-and-Frobenius regulariser, several seeds per arm, on trained TinyLMs.

A byte-level Pre-LN TinyLM is trained once per *arm* of :data:`ARMS` and *seed* (shared by the arms:
paired differences) and measured on held-out paragraphs, as is each seed's initialisation.  Chapter
*Training controls* renders :data:`SHORT` and :data:`LONG_CLIP` + :data:`LONG_REG` (:func:`merge_arms`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from companion._validation import check_int, check_real
from companion.corpus import load_corpus
from companion.experiments import Result, progress_bar, register
from companion.stacks.residual import StackConfig
from companion.stacks.tinylm import TinyLM, byte_tokenize
from companion.applications.training_controls import (
    TrainingControls, column_means, regularised_weights, stream_drift, tiny_lm_loss, train_with_controls)

__all__ = ["ARMS", "LONG_CLIP", "LONG_REG", "PER_ARM", "SHORT", "TrainingControlsStudy", "arm_controls",
           "corpus_split", "member_config", "merge_arms", "tiny"]

#: The arms a study may contain, with their controls: the reference, clipping at 1, sub-Gaussian tail
#: clipping, the regulariser on the attention value and output matrices, the column-mean penalty on
#: the MLP outputs.
ARMS = {
    "none": TrainingControls(clip="none"),
    "fixed": TrainingControls(clip="fixed", clip_value=1.0),
    "tail": TrainingControls(clip="tail", tail_delta=0.01, tail_window=50, tail_min_history=20),
    "reg_vo": TrainingControls(clip="none", lam_frobenius=1e-3, lam_colmean=10.0,
                               reg_targets=("w_v", "w_o")),
    "colmean_mlp": TrainingControls(clip="none", lam_colmean=10.0, reg_targets=("w_out",)),
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@register("training_controls_study", schema=1)
@dataclass(frozen=True)
class TrainingControlsStudy:
    """Config of the study (defaults: the longer, larger-rate regime rendered by the chapter).

    Raises
    ------
    TypeError, ValueError
        Unknown or repeated arms, fewer than 2 distinct seeds, bad sizes, rate or dtype.

    Examples
    --------
    >>> TrainingControlsStudy().arms[:2], SHORT.steps
    (('none', 'fixed'), 100)
    """

    arms: tuple[str, ...] = tuple(ARMS)  #: keys of :data:`ARMS`
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    d_model: int = 48  #: width of the Pre-LN TinyLM
    n_layers: int = 4
    n_heads: int = 4
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-2  #: peak rate of Adam (no weight decay), warm-up then cosine decay
    warmup: int = 60
    dtype: str = "float32"  #: training precision, ``"float32"`` or ``"float64"``
    held_out: int = 20  #: the last ``len(paragraphs) // held_out`` paragraphs are held out
    eval_windows: int = 64  #: held-out windows for the stream statistics after training
    probe_every: int = 50  #: steps between two probes of the channel peaks during training
    probe_windows: int = 16  #: held-out windows per probe

    def __post_init__(self):
        if not self.arms:
            raise ValueError("TrainingControlsStudy.arms must be non-empty")
        for a in self.arms:
            if a not in ARMS:
                raise ValueError(f"TrainingControlsStudy.arms must be among {tuple(ARMS)}, got {a!r}")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"TrainingControlsStudy.arms must be distinct, got {self.arms}")
        for s in self.seeds:
            check_int(s, "TrainingControlsStudy.seeds", minimum=0)
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"TrainingControlsStudy.seeds must be at least 2 distinct seeds, "
                             f"got {self.seeds}")
        for name in ("d_model", "n_layers", "n_heads", "steps", "batch_size", "seq_len", "eval_windows",
                     "probe_every", "probe_windows"):
            check_int(getattr(self, name), f"TrainingControlsStudy.{name}", minimum=1)
        check_int(self.warmup, "TrainingControlsStudy.warmup", minimum=0)
        check_int(self.held_out, "TrainingControlsStudy.held_out", minimum=2)
        if self.d_model % self.n_heads:
            raise ValueError(f"TrainingControlsStudy.n_heads = {self.n_heads} must divide "
                             f"d_model = {self.d_model}")
        check_real(self.lr, "TrainingControlsStudy.lr", lo=0.0, lo_open=True)
        if self.dtype not in _DTYPES:
            raise ValueError(f"TrainingControlsStudy.dtype must be one of {sorted(_DTYPES)}, "
                             f"got {self.dtype!r}")

    def compute(self, device, progress: bool = False) -> dict:
        """Train and measure every (arm, seed) pair; the arrays of the Result."""
        return _run_study(self, progress)


#: The short regime: the applications chapter's former set-up (100 steps, peak rate 3e-3).
SHORT = TrainingControlsStudy(seeds=tuple(range(8)), steps=100, lr=3e-3, warmup=10, dtype="float64",
                              probe_every=10)
#: The long regime, stored as two Results (run as two processes): the clipping arms with the
#: reference, and the two regulariser arms (same seeds, so :func:`merge_arms` joins them).
LONG_CLIP = TrainingControlsStudy(arms=("none", "fixed", "tail"))
LONG_REG = TrainingControlsStudy(arms=("reg_vo", "colmean_mlp"))

#: Arrays of a Result with one entry per (arm, seed); the others are per seed or per probe.
PER_ARM = ("eval_loss", "train_loss", "grad_norm", "threshold", "clipped", "train_seconds", "drift",
           "rms", "channel_peak", "channel_mean", "channel_std", "exceed6", "colmean_vo",
           "colmean_mlp", "peak_trace")


def merge_arms(*results) -> tuple[list[str], dict]:
    """Join Results of one regime that hold different arms of the same seeds.

    Parameters
    ----------
    *results : companion.experiments.Result
        Results of this experiment whose configs differ only in ``arms`` (disjoint).

    Returns
    -------
    arms : list of str
        The arms, in the order of the Results.
    arrays : dict
        The :data:`PER_ARM` arrays concatenated along the arm axis; the others, checked equal.

    Raises
    ------
    TypeError, ValueError
        Not a Result of this experiment; none given, configs differing beyond ``arms``, a repeated arm.
    """
    if not results:
        raise ValueError("merge_arms needs at least one Result")
    for r in results:
        if not isinstance(r, Result) or r.name != "training_controls_study":
            raise TypeError("merge_arms takes Results of the training_controls_study experiment")
    base = {k: v for k, v in results[0].config.items() if k != "arms"}
    arms: list[str] = []
    for r in results:
        if {k: v for k, v in r.config.items() if k != "arms"} != base:
            raise ValueError("merge_arms: the Results differ in more than their arms")
        arms += list(r.scalars["arms"])
    if len(set(arms)) != len(arms):
        raise ValueError(f"merge_arms: an arm appears twice in {arms}")
    first = results[0].arrays
    arrays = {}
    for key, value in first.items():
        if key in PER_ARM:
            arrays[key] = np.concatenate([r.arrays[key] for r in results], axis=0)
        else:
            for r in results[1:]:
                if not np.array_equal(r.arrays[key], value):
                    raise ValueError(f"merge_arms: the Results disagree on {key!r}")
            arrays[key] = value
    return arms, arrays


def arm_controls(arm: str) -> TrainingControls:
    """The :class:`TrainingControls` of an arm of :data:`ARMS`.

    Examples
    --------
    >>> arm_controls("reg_vo").reg_targets
    ('w_v', 'w_o')
    """
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {tuple(ARMS)}, got {arm!r}")
    return ARMS[arm]


def corpus_split(held_out: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids of the training text and of the held-out text (the last ``1/held_out`` paragraphs)."""
    held_out = check_int(held_out, "held_out", minimum=2)
    paragraphs = load_corpus()
    k = len(paragraphs) // held_out
    return byte_tokenize(paragraphs[:-k]), byte_tokenize(paragraphs[-k:])


def member_config(config: TrainingControlsStudy, seed: int) -> StackConfig:
    """The :class:`StackConfig` of the run with seed ``seed``."""
    return StackConfig(d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
                       vocab_size=256, max_len=config.seq_len, placement="pre", seed=seed)


def _colmean_norm(model: TinyLM, targets) -> float:
    return float(np.sqrt(sum(float(column_means(w.detach().double()).pow(2).sum())
                             for _, w in regularised_weights(model, targets))))


def _centred_rows(model: TinyLM, targets) -> TinyLM:
    clone = TinyLM(model.config).to(next(model.parameters()).dtype)
    clone.load_state_dict(model.state_dict())
    with torch.no_grad():
        for _, w in regularised_weights(clone, targets):
            w.sub_(w.mean(dim=1, keepdim=True))
    return clone.eval()


def _append(rows: dict, **values) -> None:
    for key, value in values.items():
        rows.setdefault(key, []).append(value)


def _run_study(config: TrainingControlsStudy, progress: bool = False) -> dict:
    """Train and measure every (arm, seed); return the arrays of the Result."""
    if not isinstance(config, TrainingControlsStudy):
        raise TypeError(f"config must be a TrainingControlsStudy, got {type(config).__name__}")
    dtype = _DTYPES[config.dtype]
    train_ids, test_ids = corpus_split(config.held_out)
    probe_steps = np.arange(config.probe_every, config.steps + 1, config.probe_every)
    drift = partial(stream_drift, ids=test_ids, seq_len=config.seq_len, max_windows=config.eval_windows)
    rows: dict = {}  # key -> one entry per seed ("init_*") or per (arm, seed)
    for seed in config.seeds:
        init = TinyLM(member_config(config, seed)).to(dtype).eval()
        sd0 = drift(init)
        _append(rows, init_drift=sd0.drift, init_peak=sd0.channel_peak.max(axis=1),
                init_drift_mlp0=drift(_centred_rows(init, ("w_out",))).drift,
                init_drift_vo0=drift(_centred_rows(init, ("w_v", "w_o"))).drift,
                init_eval_loss=tiny_lm_loss(init, test_ids, config.seq_len),
                init_colmean_vo=_colmean_norm(init, ("w_v", "w_o")),
                init_colmean_mlp=_colmean_norm(init, ("w_out",)))
    bar = progress_bar(len(config.arms) * len(config.seeds), progress, "training controls")
    for arm in config.arms:
        for seed in config.seeds:
            trace = np.empty((len(probe_steps), config.n_layers + 1))

            def probe(step, model, trace=trace):
                if step % config.probe_every == 0:
                    peaks = drift(model, max_windows=config.probe_windows).channel_peak
                    trace[step // config.probe_every - 1] = peaks.max(axis=1)

            t0 = time.perf_counter()
            run = train_with_controls(member_config(config, seed), train_ids, test_ids, arm_controls(arm),
                                      steps=config.steps, batch_size=config.batch_size,
                                      seq_len=config.seq_len, lr=config.lr, warmup=config.warmup, seed=seed,
                                      dtype=dtype, callback=probe)
            seconds = time.perf_counter() - t0
            sd = drift(run.model, multiples=(6.0,))
            _append(rows, eval_loss=run.eval_loss, train_loss=run.losses, grad_norm=run.grad_norms,
                    threshold=run.thresholds, clipped=run.clipped, train_seconds=seconds, drift=sd.drift,
                    rms=sd.rms, channel_peak=sd.channel_peak, channel_mean=sd.mean, channel_std=sd.std,
                    exceed6=sd.exceed_frac[:, 0], colmean_vo=_colmean_norm(run.model, ("w_v", "w_o")),
                    colmean_mlp=_colmean_norm(run.model, ("w_out",)), peak_trace=trace)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    out = {}
    for key, values in rows.items():
        array = np.array(values, dtype=bool if key == "clipped" else np.float64)
        per_arm = (len(config.arms), len(config.seeds), *array.shape[1:])
        out[key] = array.reshape(per_arm) if key in PER_ARM else array
    out.update(arms=list(config.arms), seeds=list(config.seeds), probe_steps=probe_steps,
               n_eval_tokens=int(min(config.eval_windows, test_ids.numel() // config.seq_len)
                                 * config.seq_len),
               train_bytes=int(train_ids.numel()), held_out_bytes=int(test_ids.numel()),
               train_tokens=config.steps * config.batch_size * config.seq_len)
    return out


def tiny(**overrides) -> TrainingControlsStudy:
    """A seconds-sized config for tests (two arms, two seeds, width 8).

    Parameters
    ----------
    **overrides
        Fields to change.

    Returns
    -------
    TrainingControlsStudy
    """
    base = TrainingControlsStudy(arms=("none", "colmean_mlp"), seeds=(0, 1), d_model=8, n_layers=2,
                                 n_heads=2, steps=6, batch_size=2, seq_len=16, warmup=2,
                                 eval_windows=4, probe_every=3, probe_windows=2)
    return replace(base, **overrides)
