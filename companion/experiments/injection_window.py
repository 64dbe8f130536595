"""Experiment ``injection_window``: concept and random injections into a real model, per layer.

The default config is the CPU-sized SmolLM2-135M run of the chapter *Injection in real
Transformers*; :data:`CPU_CONFIGS` adds MiniLM-L6, :data:`GPU_CONFIGS` holds hub models of several
depths (``python -m companion run-suite injection-gpu``; :func:`gpu_results` reads them back).  One
run measures the typical norm ``n_l`` per layer of ``n_prompts`` two-sentence prompts and runs
:func:`~companion.injection.engine.track_injection` for each concept vector and ``n_random``
random directions at relative magnitudes ``alpha * n_l`` and absolute ones ``beta * n_ref``
(``n_ref``: the typical norm at ``abs_reference_fraction`` of the depth).  Arrays per direction
and mode (``rel``/``abs``): ``<direction>_<mode>_metrics``, ``_effect``, ``_coefficient``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from companion import experiments as xp
from companion._validation import check_bool, check_int, check_real
from companion.experiments import check_result, config_hash, make_config, register
from companion.experiments._common import bar, check_fields, concept_units, make_corpus_prompts
from companion.experiments._common import model_and_prompts, model_facts

__all__ = ["InjectionWindowExperiment", "CPU_CONFIGS", "GPU_CONFIGS", "tracks", "window_summary",
           "mean_window", "gpu_results", "cli_command", "HAHAMI_LAST_TOKEN", "corpus_prompts",
           "scale_index"]


def corpus_prompts(source, n_prompts: int | None = None, *, min_words: int = 6,
                   max_words: int = 11, max_length: int = 64, device="cpu") -> tuple:
    """A model and two-sentence corpus prompts: the setup every injection run starts from.

    Parameters
    ----------
    source : str or config
        A model name for :func:`companion.transformers.models.load`, or an injection config
        whose ``model``, ``n_prompts``, ``min_words``, ``max_words`` and ``max_length`` are used.
    n_prompts : int, optional
        Number of prompts (the config's by default; required with a model name).
    min_words, max_words, max_length : int
        Sentence lengths and token limit when ``source`` is a model name.
    device : str or torch.device, default "cpu"

    Returns
    -------
    (LoadedModel, InjectionPrompts)
        The model and the prompts of the first ``2 * n_prompts`` corpus sentences (even ones
        injected, odd ones later), from :func:`companion.injection.directions.make_prompts`.

    Raises
    ------
    ValueError
        If ``n_prompts`` is missing or below 1.

    Examples
    --------
    >>> m, p = corpus_prompts("minilm-l6", 8)            # doctest: +SKIP
    """
    from companion.transformers import models

    if not isinstance(source, str):
        n_prompts = source.n_prompts if n_prompts is None else n_prompts
        min_words, max_words, max_length = source.min_words, source.max_words, source.max_length
        source = source.model
    if n_prompts is None:
        raise ValueError("n_prompts is required with a model name")
    n = check_int(n_prompts, "n_prompts", 1)
    m = models.load(source, device=device)
    return m, make_corpus_prompts(m, n, min_words, max_words, max_length)


@register("injection_window", schema=1)
@dataclass(frozen=True)
class InjectionWindowExperiment:
    """Concept and random vectors injected at every layer: metrics per layer, output effect, window."""

    model: str = "smollm2-135m"  #: a name for :func:`companion.transformers.models.load` (or a hub id)
    n_prompts: int = 8  #: two-sentence prompts (``2 * n_prompts`` corpus sentences)
    min_words: int = 6  #: fewest words of a sentence
    max_words: int = 11  #: most words of a sentence
    max_length: int = 64  #: token truncation (losing a second segment raises)
    #: injection layers (stream indices); empty = every layer ``0 .. L``
    layers: tuple[int, ...] = (0, 1, 2, 3, 5, 8, 11, 14, 17, 20, 23, 26, 29, 30)
    rel_scales: tuple[float, ...] = (0.125, 0.5, 2.0)  #: relative magnitudes ``alpha`` (``alpha * n_l``)
    abs_scales: tuple[float, ...] = (0.5,)  #: multiples ``beta`` of ``n_ref``; empty = no absolute sweep
    abs_reference_fraction: float = 0.1  #: ``n_ref`` is the typical norm at ``round(fraction * L)``
    concepts: tuple[str, ...] = ("sea",)  #: names in :data:`companion.injection.directions.CONCEPTS`
    n_random: int = 1  #: random unit directions (at least one direction overall)
    seed: int = 0  #: seed of the random directions
    dtype: str = "float32"
    max_batch_tokens: int = 16384  #: memory bound of :func:`companion.injection.engine.sweep_injections`

    def validate(self) -> None:
        """Check the fields that do not need the model.

        Raises
        ------
        ValueError
            Invalid counts, scales, fraction, concepts or layers, or no direction at all.
        """
        check_fields(self, {"n_prompts": 1, "n_random": 0})
        if not self.rel_scales:
            raise ValueError("rel_scales must hold at least one magnitude")
        for key in ("rel_scales", "abs_scales"):
            for s in getattr(self, key):
                if not (math.isfinite(s) and s > 0):
                    raise ValueError(f"{key} entries must be finite and > 0, got {s}")
        if not 0.0 <= self.abs_reference_fraction <= 1.0:
            raise ValueError(f"abs_reference_fraction must lie in [0, 1], got {self.abs_reference_fraction}")
        if not self.concepts and self.n_random == 0:
            raise ValueError("no direction to inject: give concepts or n_random >= 1")

    def compute(self, device, progress):
        """Run the experiment (see the module docstring); returns the Result's arrays and scalars."""
        from companion.injection import directions as dr
        from companion.injection.engine import track_injection
        from companion.injection.metrics import METRIC_NAMES

        m, layers, prompts, base = model_and_prompts(self, device)
        L = m.n_layers
        norms = dr.typical_norms(base, prompts.injected)
        del base
        ref_layer = int(round(self.abs_reference_fraction * L))

        units, concept_norm = concept_units(m, self.concepts, self.max_length)
        directions = {name: u[layers] for name, u in zip(self.concepts, units)}
        rand = dr.random_unit_vectors(m.d_model, max(self.n_random, 1), np.random.default_rng(self.seed))
        for k in range(self.n_random):
            directions[f"random{k}"] = rand[k]
        cos_random = np.stack([u @ rand[0] for u in units]) if units else np.zeros((0, L + 1))
        out: dict = {}
        modes = [("rel", list(self.rel_scales), True)]
        if self.abs_scales:
            modes.append(("abs", [b * float(norms[ref_layer]) for b in self.abs_scales], False))
        items = bar([(d, mode) for d in directions for mode in modes], progress, f"injection {m.name}",
                    "sweep")
        effect_name = ""
        for dname, (mode, scales, relative) in items:
            tr = track_injection(m, prompts, layers, directions[dname], scales, relative=relative,
                                 norms=norms, max_batch_tokens=self.max_batch_tokens)
            stacked = np.stack([tr.metrics[k] for k in METRIC_NAMES], -1)
            out[f"{dname}_{mode}_metrics"] = stacked.astype(np.float32)
            out[f"{dname}_{mode}_effect"] = tr.effects[tr.effect_name]
            out[f"{dname}_{mode}_coefficient"] = tr.coefficient
            effect_name = tr.effect_name
        out.update(
            layers=np.asarray(layers), typical_norm=norms, concept_norm=concept_norm,
            concept_cos_random=cos_random, rel_scales=np.asarray(self.rel_scales, dtype=np.float64),
            abs_scales=np.asarray(self.abs_scales, dtype=np.float64),
            directions=list(directions), modes=[m_[0] for m_ in modes], effect_name=effect_name,
            abs_reference_layer=ref_layer, n_prompts=prompts.batch, **model_facts(m))
        return out


#: Hahami et al.'s released last-token measurement (Llama-3.1-8B-Instruct, concept "Dust",
#: coefficient 6 at decoder layer 2; ``exp4_residual_tracking.pt`` of
#: github.com/elyhahami18/llama-introspection-new): ``layer`` their decoder index ``k`` (stream
#: ``k + 1`` here), ``cos`` at the last token, ``norm_ratio`` and ``projection`` ranges over layers.
HAHAMI_LAST_TOKEN: dict = {
    "model": "Llama-3.1-8B-Instruct", "n_layers": 32, "inject_layer": 2, "coefficient": 6.0,
    "layer": (0, 1, 2, 3, 19, 31), "fraction": tuple((k + 1) / 32 for k in (0, 1, 2, 3, 19, 31)),
    "cos": (1.0, 1.0, 1.0, 0.936, 0.50, 0.917), "norm_ratio": (0.84, 1.02), "projection": (-0.93, 0.60),
}


#: The CPU-sized runs of the chapter (about two minutes together on a 2-core CPU).
CPU_CONFIGS: dict[str, InjectionWindowExperiment] = {
    "smollm2-135m": InjectionWindowExperiment(),
    "minilm-l6": InjectionWindowExperiment(
        model="minilm-l6", n_prompts=8, layers=(), concepts=("sea", "joy"), n_random=2,
    ),
}


#: The GPU-scale runs (every layer, 32 prompts, two concepts, two random directions) of hub
#: models of several depths: ``python -m companion run-suite injection-gpu``.
GPU_CONFIGS: dict[str, InjectionWindowExperiment] = {
    name: InjectionWindowExperiment(
        model=name, n_prompts=32, min_words=6, max_words=16, max_length=96, layers=(),
        rel_scales=(0.125, 0.5, 2.0), abs_scales=(0.5,), concepts=("sea", "joy"), n_random=2,
        max_batch_tokens=32768)
    for name in (
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
        "EleutherAI/pythia-70m", "EleutherAI/pythia-160m", "EleutherAI/pythia-410m",
        "EleutherAI/pythia-1b", "EleutherAI/pythia-1.4b",
        "HuggingFaceTB/SmolLM2-1.7B", "meta-llama/Llama-3.2-1B",
        "bert-base-uncased", "bert-large-uncased",
    )
}


# ------------------------------------------------------------------------------ reading Results
def scale_index(result, key: str, scale) -> int:
    """Index of ``scale`` in the Result's ``<key>_scales`` (a mode or a group).

    Parameters
    ----------
    result : Result
    key : str
        A mode (``"rel"``, ``"abs"``) or a direction group.
    scale : float

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``scale`` was not run.

    Examples
    --------
    >>> k = scale_index(run_cached(CPU_CONFIGS["minilm-l6"]), "rel", 0.5)   # doctest: +SKIP
    """
    scale = check_real(scale, "scale", lo=0.0, lo_open=True)
    given = np.asarray(result.arrays[f"{key}_scales"], dtype=np.float64)
    hit = np.nonzero(np.isclose(given, scale, rtol=1e-12, atol=0.0))[0]
    if hit.size == 0:
        raise ValueError(f"scale {scale} was not run; the {key} scales are {given.tolist()}")
    return int(hit[0])


def _mode_scale_index(result, mode: str, scale) -> int:
    """:func:`scale_index` in the ``rel`` or ``abs`` sweep of an ``injection_window`` Result."""
    check_result(result, "injection_window")
    if mode not in ("rel", "abs"):
        raise ValueError(f"mode must be 'rel' or 'abs', got {mode!r}")
    if mode not in result.scalars["modes"]:
        raise ValueError(f"this Result has no {mode!r} sweep (modes: {result.scalars['modes']})")
    return scale_index(result, mode, scale)


def tracks(result) -> dict:
    """The :func:`~companion.injection.engine.track_injection` results stored in a Result.

    Parameters
    ----------
    result : Result
        Of the ``injection_window`` experiment (so for every reader below).

    Returns
    -------
    dict of (str, str) to companion.injection.engine.SweepResult
        Keyed by ``(direction, mode)``, e.g. ``("sea", "rel")`` or ``("random0", "abs")``.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a missing array.

    Examples
    --------
    >>> tracks(run_cached(CPU_CONFIGS["minilm-l6"]))[("joy", "rel")].window(scale_index=1)  # doctest: +SKIP
    """
    from companion.injection.directions import GROUPS
    from companion.injection.engine import SweepResult
    from companion.injection.metrics import METRIC_NAMES

    check_result(result, "injection_window")
    a, sc = result.arrays, result.scalars
    n_ref = float(a["typical_norm"][sc["abs_reference_layer"]])
    scales = {"rel": np.asarray(a["rel_scales"], dtype=np.float64),
              "abs": np.asarray(a["abs_scales"], dtype=np.float64) * n_ref}
    out = {}
    for dname in sc["directions"]:
        for mode in sc["modes"]:
            key = f"{dname}_{mode}"
            try:
                met = a[f"{key}_metrics"].astype(np.float64)
                effect = a[f"{key}_effect"]
                coef = a[f"{key}_coefficient"]
            except KeyError as exc:
                raise ValueError(f"the Result lacks the array {exc.args[0]!r}; it is not a complete "
                                 "injection_window Result") from None
            out[(dname, mode)] = SweepResult(
                layers=np.asarray(a["layers"]), scales=scales[mode],
                n_layers=int(sc["n_layers"]), metrics={k: met[..., i] for i, k in enumerate(METRIC_NAMES)},
                groups=GROUPS, effects={sc["effect_name"]: effect}, effect_name=sc["effect_name"],
                coefficient=coef, relative=mode == "rel", model=sc["model_name"],
                typical_norm=np.asarray(a["typical_norm"]))
    return out


def window_summary(result, scale: float = 0.5, threshold: float = 0.5, mode: str = "rel",
                   contiguous: bool = True) -> list[dict]:
    """One row per direction: the window of the output effect at one magnitude, with provenance.

    Parameters
    ----------
    result : Result
    scale : float, default 0.5
        A magnitude the config ran (``alpha`` or ``beta``, by ``mode``).
    threshold : float, default 0.5
        Relative threshold of :func:`~companion.injection.metrics.effect_window`.
    mode : {"rel", "abs"}
    contiguous : bool, default True
        As in :func:`~companion.injection.metrics.effect_window`.

    Returns
    -------
    list of dict
        The model's description, ``direction``, the window (``layers``, ``best``, ``first``,
        ``last`` and their fractions, ``size_fraction``), ``max_effect``, ``effect_name``,
        ``device``, ``versions``.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result, a non-bool ``contiguous``; an unknown mode or scale.

    Examples
    --------
    >>> window_summary(run_cached(CPU_CONFIGS["minilm-l6"]))[0]["best_fraction"]   # doctest: +SKIP
    """
    contiguous = check_bool(contiguous, "contiguous")
    k = _mode_scale_index(result, mode, scale)
    rows = []
    sc = result.scalars
    for (dname, m_), tr in tracks(result).items():
        if m_ != mode:
            continue
        w = tr.window(scale_index=k, threshold=threshold, contiguous=contiguous)
        rows.append(dict(
            model=sc["model_name"], placement=sc["placement"], norm=sc["norm"],
            n_layers=int(sc["n_layers"]), direction=dname, layers=w.layers.tolist(), best=w.best,
            first=w.first, last=w.last, best_fraction=w.best_fraction,
            first_fraction=w.first_fraction, last_fraction=w.last_fraction, size_fraction=w.size_fraction,
            max_effect=float(tr.effect()[:, k].max()), effect_name=tr.effect_name,
            device=result.device, versions=dict(result.versions)))
    return rows


def mean_window(result, scale: float = 0.5, threshold: float = 0.5, mode: str = "rel"):
    """The window of the output effect averaged over every direction of a Result.

    Parameters
    ----------
    result, scale, threshold, mode
        As in :func:`window_summary`.

    Returns
    -------
    companion.injection.metrics.Window
        The window of the mean effect over directions (less noise at the edges).

    Raises
    ------
    TypeError, ValueError
        As :func:`window_summary`.

    Examples
    --------
    >>> mean_window(run_cached(CPU_CONFIGS["minilm-l6"])).best_fraction   # doctest: +SKIP
    """
    from companion.injection.metrics import effect_window

    k = _mode_scale_index(result, mode, scale)
    effects = [tr.effect()[:, k] for (d, m_), tr in tracks(result).items() if m_ == mode]
    return effect_window(np.mean(effects, axis=0), layers=np.asarray(result.arrays["layers"]),
                         n_layers=int(result.scalars["n_layers"]), threshold=threshold)


def gpu_results(configs: dict | None = None, folder=None) -> dict:
    """The stored Results of the GPU configs (those that have been run and committed), by name.

    Parameters
    ----------
    configs : dict of str to InjectionWindowExperiment, optional
        Default :data:`GPU_CONFIGS`.
    folder : path, optional
        Default :func:`~companion.experiments.stored_root`.

    Returns
    -------
    dict of str to Result
        Only configs with a stored Result of matching hash and schema.

    Raises
    ------
    TypeError
        If ``configs`` is not a dict of injection_window configs.
    """
    configs = GPU_CONFIGS if configs is None else configs
    if not (isinstance(configs, dict)
            and all(isinstance(c, InjectionWindowExperiment) for c in configs.values())):
        raise TypeError("configs must be a dict of name -> InjectionWindowExperiment")
    by_hash = {r.config_hash: r for r in xp.stored_results("injection_window", folder)
               if r.config_hash == config_hash(make_config(InjectionWindowExperiment, r.config))}
    return {key: by_hash[config_hash(cfg)] for key, cfg in configs.items() if config_hash(cfg) in by_hash}


def cli_command(config, device: str = "cuda", out: str = "companion/data/results") -> str:
    """The ``python -m companion run`` command that computes exactly ``config``.

    Parameters
    ----------
    config : InjectionWindowExperiment
    device : str, default "cuda"
    out : str, default "companion/data/results"
        The stored Results folder of a clone.

    Returns
    -------
    str
        One command line; every non-default field is passed with ``--set`` (same config hash).

    Raises
    ------
    TypeError
        If ``config`` is not an InjectionWindowExperiment.

    Examples
    --------
    >>> cli_command(InjectionWindowExperiment(n_prompts=4), device="cpu")
    'python -m companion run injection_window --model smollm2-135m --set n_prompts=4 --device cpu --out companion/data/results'
    """
    if not isinstance(config, InjectionWindowExperiment):
        raise TypeError(f"config must be an InjectionWindowExperiment, got {type(config).__name__}")
    default = InjectionWindowExperiment()
    parts = ["python -m companion run injection_window", f"--model {config.model}"]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "model" or value == getattr(default, f.name):
            continue
        if isinstance(value, tuple):
            text = "[" + ",".join(f'"{v}"' if isinstance(v, str) else repr(v) for v in value) + "]"
            parts.append(f"--set '{f.name}={text}'")
        else:
            parts.append(f"--set {f.name}={value}")
    parts += [f"--device {device}", f"--out {out}"]
    return " ".join(parts)


