"""Experiment ``framework_trained``: injection windows of small trained language models.

Byte-level TinyLMs of several widths and depths are trained (:func:`train_models`) and swept
(:func:`sweep_trained`), trained and at initialisation (chapter *The three-effect framework*).
:data:`GPU_TRAINED` is the GPU size.  The chapter loads the stored CPU-sized weights (:func:`load_models`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from companion._validation import check_positive, check_tuple
from companion.corpus import load_corpus
from companion.injection.engine import sweep_stack_injections
from companion.experiments import progress_bar, register, stored_root
from companion.experiments.store import (CorruptResultError, _publish, _read_checked, _read_retrying,
                                         _stored_target)
from companion.injection.metrics import effect_window
from companion.stacks.residual import StackConfig
from companion.stacks.tinylm import TinyLM, byte_tokenize, train_tiny_lm

__all__ = ["WINDOW_KINDS_TRAINED", "TrainedWindowsConfig", "GPU_TRAINED", "tiny_lm_config", "train_models",
           "sweep_trained", "save_models", "load_models", "TRAINING_FIELDS"]

#: Output effects of the trained-stack windows.
WINDOW_KINDS_TRAINED = ("kl_later", "kl_injected", "relative_projection")
_EFFECTS = {"kl_later": ("kl", "later"), "kl_injected": ("kl", "injected"),
            "relative_projection": ("output_projection", "injected")}  # (metric, positions) of each kind

#: Fields of :class:`TrainedWindowsConfig` that determine the trained weights (the others: the sweep).
TRAINING_FIELDS = ("widths", "depths", "placements", "n_heads", "steps", "batch_size", "seq_len",
                   "lr", "warmup", "seed")


def _training_hash(config: "TrainedWindowsConfig") -> str:
    """SHA-256 (16 hex digits) of the :data:`TRAINING_FIELDS` of ``config``.

    >>> h, cfg = _training_hash(TrainedWindowsConfig()), TrainedWindowsConfig
    >>> h == _training_hash(cfg(scale=1.0)), h == _training_hash(cfg(steps=9))
    (True, False)
    """
    payload = json.dumps({k: getattr(config, k) for k in TRAINING_FIELDS}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@register("framework_trained", schema=1)
@dataclass(frozen=True)
class TrainedWindowsConfig:
    """Small language models (:class:`~companion.stacks.tinylm.TinyLM`) trained, then swept.

    Training fields (:func:`~companion.stacks.tinylm.train_tiny_lm`) are :data:`TRAINING_FIELDS`;
    only they determine the weights.

    Raises
    ------
    TypeError, ValueError
        If a field has the wrong type or value.

    Examples
    --------
    >>> cfg = TrainedWindowsConfig()
    >>> cfg.depths, cfg.inject_start, cfg.inject_stop, GPU_TRAINED.widths
    ((2, 4, 8), 16, 32, (128, 256, 512))
    """

    widths: tuple[int, ...] = (32,)  #: ``d_model`` of the models
    depths: tuple[int, ...] = (2, 4, 8)  #: numbers of layers of the models
    placements: tuple[str, ...] = ("pre", "post")
    n_heads: int = 4
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 150
    eval_sequences: int = 8  #: evaluation windows of ``seq_len`` bytes, evenly spaced through the corpus
    inject_start: int = 16  #: first injected token
    inject_stop: int = 32  #: end of the injected span; tokens after it are the "later" positions
    scale: float = 0.5  #: injected norm relative to the RMS stream norm at the injection layer
    n_directions: int = 4  #: random directions (seeds ``seed ..``) whose effects are averaged
    threshold: float = 0.5  #: relative window threshold
    seed: int = 0

    def __post_init__(self):
        for name in ("n_heads", "steps", "batch_size", "seq_len", "eval_sequences", "inject_stop",
                     "n_directions"):
            check_positive(getattr(self, name), name, integer=True)
        for name in ("lr", "scale", "threshold"):
            check_positive(getattr(self, name), name)
        if self.threshold > 1:
            raise ValueError(f"threshold is relative and must lie in (0, 1], got {self.threshold}")
        for name in ("warmup", "inject_start", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if not self.inject_start < self.inject_stop < self.seq_len:
            raise ValueError(f"need inject_start < inject_stop < seq_len (later tokens must exist), got "
                             f"{self.inject_start}, {self.inject_stop}, {self.seq_len}")
        check_tuple(self.widths, "widths", int, minimum=1)
        for w in self.widths:
            if w % self.n_heads:
                raise ValueError(f"n_heads = {self.n_heads} must divide every width, got {w}")
        check_tuple(self.depths, "depths", int, minimum=1)
        check_tuple(self.placements, "placements", str, allowed=("pre", "post"))

    def compute(self, device, progress: bool = False) -> dict:
        """Sweep the models trained and at initialisation (``"init_*"``), with ``train_loss``."""
        bar = progress_bar(len(_model_keys(self)), progress, "training")
        models = train_models(self, device, bar.update if bar else None)
        if bar:
            bar.close()
        out = sweep_trained(models, self, device)
        shape = (len(self.placements), len(self.widths), len(self.depths), self.steps)
        out["train_loss"] = np.full(shape, np.nan)
        for key, (_, loss) in models.items():
            out["train_loss"][_index(self, key)] = loss
        init = {k: TinyLM(tiny_lm_config(self, *k)).eval() for k in models}
        out.update({f"init_{k}": v for k, v in sweep_trained(init, self, device).items()})
        out.update(placements=list(self.placements), widths=list(self.widths),
                   depths=list(self.depths), training_hash=_training_hash(self))
        return out


def tiny_lm_config(config: TrainedWindowsConfig, placement: str, width: int, depth: int) -> StackConfig:
    """The :class:`~companion.stacks.residual.StackConfig` of one model of ``config``.

    Parameters
    ----------
    config : TrainedWindowsConfig
    placement : {"pre", "post"}
    width, depth : int

    Returns
    -------
    companion.stacks.residual.StackConfig
        Attention and MLP in every block, byte vocabulary.

    Examples
    --------
    >>> c = tiny_lm_config(TrainedWindowsConfig(), "post", 32, 4)
    >>> c.n_layers, c.block, c.vocab_size, c.placement
    (4, 'both', 256, 'post')
    """
    return StackConfig(d_model=width, n_layers=depth, n_heads=config.n_heads, placement=placement,
                       block="both", vocab_size=256, max_len=config.seq_len, seed=config.seed)


def _model_keys(config: TrainedWindowsConfig) -> list[tuple[str, int, int]]:
    return [(p, w, d) for p in config.placements for w in config.widths for d in config.depths]


def _index(config: TrainedWindowsConfig, key) -> tuple[int, int, int]:
    """Position of the model ``(placement, width, depth)`` on the config's axes."""
    placement, width, depth = key
    return config.placements.index(placement), config.widths.index(width), config.depths.index(depth)


def _check_config(config) -> None:
    if not isinstance(config, TrainedWindowsConfig):
        raise TypeError(f"config must be a TrainedWindowsConfig, got {type(config).__name__}")


def train_models(config: TrainedWindowsConfig, device: str | torch.device = "cpu", progress=None,
                 only=None) -> dict:
    """Train every model of ``config`` on the committed corpus.

    Parameters
    ----------
    config : TrainedWindowsConfig
    device : str or torch.device, default "cpu"
    progress : callable, optional
        Called after each model.
    only : iterable of (placement, width, depth), optional
        Train only these models.

    Returns
    -------
    dict
        ``(placement, width, depth) -> (TinyLM, losses)``; models in ``eval()`` mode on the CPU.

    Raises
    ------
    TypeError, ValueError
        Not a :class:`TrainedWindowsConfig`; ``only`` names a model not in ``config``.

    Examples
    --------
    >>> cfg = TrainedWindowsConfig(widths=(8,), depths=(1,), placements=("pre",), n_heads=2, steps=2,
    ...                            batch_size=2, seq_len=16, warmup=1, inject_start=4, inject_stop=8)
    >>> models = train_models(cfg)
    >>> list(models), len(models["pre", 8, 1][1])
    ([('pre', 8, 1)], 2)
    """
    _check_config(config)
    keys = _model_keys(config)
    if only is not None:
        only = [tuple(k) for k in only]
        unknown = [k for k in only if k not in keys]
        if unknown:
            raise ValueError(f"models {unknown} are not in the config (placements x widths x depths)")
        keys = [k for k in keys if k in only]
    text = load_corpus()
    models = {}
    for key in keys:
        model, losses = train_tiny_lm(tiny_lm_config(config, *key), text, steps=config.steps,
                                      batch_size=config.batch_size, seq_len=config.seq_len, lr=config.lr,
                                      seed=config.seed, device=str(device), warmup=config.warmup)
        models[key] = (model.cpu().eval(), losses)
        if progress is not None:
            progress()
    return models


def _evaluation_ids(config: TrainedWindowsConfig) -> torch.Tensor:
    """``[eval_sequences, seq_len]`` byte ids: windows evenly spaced through the corpus."""
    ids = byte_tokenize(load_corpus())
    n, T = config.eval_sequences, config.seq_len
    starts = np.linspace(0, ids.numel() - T - 1, n).astype(np.int64)
    return torch.stack([ids[s:s + T] for s in starts])


def sweep_trained(models: dict, config: TrainedWindowsConfig, device: str | torch.device = "cpu") -> dict:
    """Injection sweeps of language models: effects per injection layer and windows.

    Parameters
    ----------
    models : dict
        ``(placement, width, depth) -> (TinyLM, losses)`` (from :func:`train_models` or
        :func:`load_models`) or ``-> TinyLM``; every key must belong to ``config``.
    config : TrainedWindowsConfig
    device : str or torch.device, default "cpu"

    Returns
    -------
    dict of str to numpy.ndarray
        For each kind of :data:`WINDOW_KINDS_TRAINED`, ``"effect_<kind>"`` ``[P, W, D, M]``
        and ``"window_<kind>"`` ``[P, W, D, 4]`` (fractions of depth), averaged over the
        directions; ``"eval_loss"`` ``[P, W, D]`` (nats).  NaN where a model is absent.

    Raises
    ------
    TypeError, ValueError
        Not a :class:`TrainedWindowsConfig`; a model key not in ``config``.

    Examples
    --------
    >>> out = sweep_trained(load_models(), TrainedWindowsConfig())   # doctest: +SKIP
    """
    _check_config(config)
    P, W, D = len(config.placements), len(config.widths), len(config.depths)
    M = max(config.depths)
    out = {f"effect_{k}": np.full((P, W, D, M), np.nan) for k in WINDOW_KINDS_TRAINED}
    out.update({f"window_{k}": np.full((P, W, D, 4), np.nan) for k in WINDOW_KINDS_TRAINED})
    out["eval_loss"] = np.full((P, W, D), np.nan)
    ids = _evaluation_ids(config).to(device)
    span = list(range(config.inject_start, config.inject_stop))
    for key, value in models.items():
        if tuple(key) not in _model_keys(config):
            raise ValueError(f"model {key} is not part of the config (placements x widths x depths)")
        idx, depth = _index(config, key), key[2]
        model = (value[0] if isinstance(value, tuple) else value).to(device).eval()
        effects = {k: np.zeros(depth) for k in WINDOW_KINDS_TRAINED}
        for j in range(config.n_directions):
            sw = sweep_stack_injections(model, ids, scale=config.scale, positions=span, seed=config.seed + j)
            for kind, (metric, where) in _EFFECTS.items():
                effects[kind] += sw.effect(metric, where) / config.n_directions
        for kind, eff in effects.items():
            out[f"effect_{kind}"][idx][:depth] = eff
            out[f"window_{kind}"][idx] = effect_window(
                eff, n_layers=depth, threshold=config.threshold).fractions
        with torch.no_grad():
            logits, _ = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1))
        out["eval_loss"][idx] = float(loss)
        model.cpu()
    return out


def _stored_models_path() -> Path:
    """Path of the committed CPU-trained weights (``framework_tiny_lms.npz`` in ``stored_root()``)."""
    return stored_root() / "framework_tiny_lms.npz"


#: The fields of the weights' JSON sidecar, with their JSON types (all required: checksums included).
_SIDECAR_TYPES = {"training": (dict,), "training_hash": (str,), "models": (list,), "train_loss": (dict,),
                  "dtype": (str,), "threads": (int,), "versions": (dict,),
                  "arrays": (dict,), "npz_sha256": (str,), "json_sha256": (str,)}


def save_models(models: dict, config: TrainedWindowsConfig, path: str | Path | None = None) -> Path:
    """Store trained models as float16 weights plus a JSON sidecar (config, hash, losses, versions).

    Written like a Result (:func:`~companion.experiments.store.save_result`): checksummed, atomically.

    Parameters
    ----------
    models : dict
        ``(placement, width, depth) -> (TinyLM, losses)`` from :func:`train_models`.
    config : TrainedWindowsConfig
        The config they were trained with.
    path : str or Path, optional
        ``.npz`` file (JSON sidecar beside it); default: the stored weights' path (cache outside a clone).

    Returns
    -------
    Path
        The ``.npz`` path.

    Raises
    ------
    TypeError, ValueError
        ``config`` is not a :class:`TrainedWindowsConfig` (TypeError); ``path`` does not end in ``.npz``.
    """
    _check_config(config)
    path = Path(path) if path is not None else _stored_target() / _stored_models_path().name
    if path.suffix != ".npz":
        raise ValueError(f"the weights' path must end in .npz, got {path}")
    arrays, losses = {}, {}
    for (placement, width, depth), (model, loss) in models.items():
        key = f"{placement}/w{width}/L{depth}"
        for name, tensor in model.state_dict().items():
            arrays[f"{key}/{name}"] = tensor.detach().cpu().numpy().astype(np.float16)
        losses[key] = [round(float(x), 6) for x in loss]
    sidecar = {"training": {k: getattr(config, k) for k in TRAINING_FIELDS},
               "training_hash": _training_hash(config), "models": sorted(losses), "train_loss": losses,
               "dtype": "float16", "threads": torch.get_num_threads(),
               "versions": {"torch": torch.__version__, "numpy": np.__version__}}
    _publish(path.with_suffix(".json"), sidecar, arrays)
    return path


def load_models(path: str | Path | None = None, config: TrainedWindowsConfig | None = None) -> dict:
    """Load models stored by :func:`save_models`.

    Parameters
    ----------
    path : str or Path, optional
        Default: the committed weights, ``framework_tiny_lms.npz`` in ``stored_root()``.
    config : TrainedWindowsConfig, optional
        Expected config (default ``TrainedWindowsConfig()``); weights trained otherwise are refused.

    Returns
    -------
    dict
        ``(placement, width, depth) -> (TinyLM, losses)``, float32 models in ``eval()`` mode.

    Raises
    ------
    ValueError
        If the file or its sidecar is missing or damaged (any edit, truncation, or a sidecar without
        checksums), or the stored training settings differ.

    Examples
    --------
    >>> models = load_models()                       # the committed CPU-trained TinyLMs
    >>> sorted(models)[0], models[("pre", 32, 8)][0].config.n_layers
    (('post', 32, 2), 8)
    """
    path = Path(path) if path is not None else _stored_models_path()
    config = TrainedWindowsConfig() if config is None else config
    sidecar_path = path.with_suffix(".json")
    if not path.exists() or not sidecar_path.exists():
        raise ValueError(f"no stored models at {path} (+ .json); create them with "
                         "save_models(train_models(TrainedWindowsConfig()), TrainedWindowsConfig())")
    try:
        sidecar, arrays = _read_retrying(lambda p: _read_checked(p, _SIDECAR_TYPES, {}), sidecar_path)
    except CorruptResultError as exc:
        raise ValueError(f"the TinyLM weights at {path} are damaged ({exc.reason}); retrain and save them: "
                         "save_models(train_models(config), config, path)") from None
    if sidecar.get("training_hash") != _training_hash(config):
        wanted = {k: getattr(config, k) for k in TRAINING_FIELDS}
        raise ValueError(f"the models at {path} were trained with {sidecar.get('training')}, not with the "
                         f"requested {wanted}; retrain and save")
    models = {}
    try:
        for key in sidecar["models"]:
            placement, w, L = key.split("/")
            k = (placement, int(w[1:]), int(L[1:]))
            model = TinyLM(tiny_lm_config(config, *k))
            state = {name: torch.from_numpy(arrays[f"{key}/{name}"].astype(np.float32))
                     for name in model.state_dict()}
            model.load_state_dict(state)
            models[k] = (model.eval(), np.asarray(sidecar["train_loss"][key], dtype=float))
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"the TinyLM weights at {path} do not fit the models they name ({exc!r:.200}); "
                         "retrain and save them: save_models(train_models(config), config, path)") from None
    return models


#: Trained stacks at GPU scale: widths 128-512, depths 2-32, 3000 steps of 64 x 256 bytes.
GPU_TRAINED = TrainedWindowsConfig(widths=(128, 256, 512), depths=(2, 4, 8, 16, 32), steps=3000,
                                   batch_size=64, seq_len=256, warmup=600, lr=1e-3, eval_sequences=32,
                                   inject_start=64, inject_stop=128, n_directions=8)
