"""The ``injection_attribution`` experiment: an injected projection, sublayer by sublayer.

Runs :func:`~companion.injection.attribution.attribute_injection` for concept and seeded random
directions on corpus prompts at every layer of ``layers`` at relative size ``alpha`` (and, with
``half_check``, at ``alpha / 2``: the linearity check).  :data:`CONFIGS` holds the chapter's two
configurations; :func:`attributions_of` and :func:`half_streams_of` read a Result back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion._validation import check_real
from companion.experiments import check_result, register
from companion.experiments._common import check_counts, concept_units, load_model, make_corpus_prompts

__all__ = ["InjectionAttributionExperiment", "CONFIGS", "attributions_of", "half_streams_of"]

_KEYS = ("stream", "writes", "ln_input", "ln_rule", "ln_jacobian")


@register("injection_attribution", schema=1)
@dataclass(frozen=True)
class InjectionAttributionExperiment:
    """Per-stage projections of injected concept and random directions.

    ``n_prompts``, ``min_words``, ``max_words`` and ``max_length`` select corpus prompts as in
    ``injection_window``.  Result arrays per injection layer ``l``: ``l{l}_stream``, ``l{l}_writes``
    (post-norm models also ``l{l}_ln_input``, ``l{l}_ln_rule``, ``l{l}_ln_jacobian``),
    ``half_l{l}_stream``; and ``scale``, ``typical_norm``, ``directions``.
    """

    model: str = "minilm-l6"
    layers: tuple[int, ...] = ()  #: injection layers (each in ``[0, L - 1]``); empty = every one
    concepts: tuple[str, ...] = ("sea", "joy")  #: keys of :data:`companion.injection.directions.CONCEPTS`
    n_random: int = 16  #: random directions (seeded with ``seed``), after the concepts
    n_prompts: int = 32
    min_words: int = 6
    max_words: int = 11
    max_length: int = 64
    alpha: float = 0.05  #: relative size :math:`c = \alpha n_\ell`
    half_check: bool = True  #: also run at ``alpha / 2`` (arrays ``half_l{l}_stream``, projections only)
    seed: int = 0
    batch_rows: int = 320
    dtype: str = "float32"

    def compute(self, device, progress):
        """Run the attributions; returns the Result's arrays and scalars."""
        from companion.injection import attribution as at
        from companion.injection import directions as dr

        check_counts(self, {"n_prompts": 1, "n_random": 0})
        alpha = check_real(self.alpha, "alpha")
        unknown = [c for c in self.concepts if c not in dr.CONCEPTS]
        if unknown:
            raise ValueError(f"unknown concepts {unknown}; choose from {sorted(dr.CONCEPTS)}")
        m = load_model(self, device)
        L = m.n_layers
        layers = list(self.layers) if self.layers else list(range(L))
        prompts = make_corpus_prompts(m, self.n_prompts, self.min_words, self.max_words, self.max_length)
        units = concept_units(m, self.concepts, self.max_length)[0]
        rand = dr.random_unit_vectors(m.d_model, max(self.n_random, 1), np.random.default_rng(self.seed))
        rand = np.repeat(rand[:self.n_random, None], L + 1, axis=1)
        dirs = np.concatenate([np.stack(units), rand]) if units else rand
        names = list(self.concepts) + [f"random{k}" for k in range(self.n_random)]
        out: dict = {}
        scales, norms, used, err = [], [], [], 0.0
        for ell in layers:
            runs = {"": alpha, "half_": alpha / 2} if self.half_check else {"": alpha}
            for prefix, a in runs.items():
                r = at.attribute_injection(m, prompts, ell, dirs, alpha=a,
                                           batch_rows=self.batch_rows)
                err = max(err, r.identity_error)
                for key in _KEYS if prefix == "" else ("stream",):
                    val = getattr(r, key)
                    if val is not None:
                        out[f"{prefix}l{ell}_{key}"] = val.astype(np.float32)
                if prefix == "":
                    scales.append(r.scale)
                    norms.append(r.typical_norm)
                    used.append(r.directions)
        out.update(scale=np.array(scales), typical_norm=np.array(norms),
                   directions=np.stack(used).astype(np.float32), layers=np.array(layers))
        return {**out, "direction_names": names, "identity_error": err,
                "n_prompts_used": prompts.batch, **m.facts()}


#: The chapter's two configurations (CPU, stored under ``companion/data/results``).
CONFIGS = {
    "minilm-l6": InjectionAttributionExperiment(),
    "smollm2-135m": InjectionAttributionExperiment(
        model="smollm2-135m", layers=(3, 15), concepts=("sea", "fire", "music", "food")),
}


def attributions_of(result) -> dict:
    """``{layer: Attribution}`` rebuilt from a Result of ``injection_attribution``.

    Parameters
    ----------
    result : Result

    Returns
    -------
    dict of int to companion.injection.attribution.Attribution

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a missing array.
    """
    from companion.injection.attribution import STAGES, Attribution

    a, s = check_result(result, "injection_attribution").arrays, result.scalars
    out = {}
    for i, ell in enumerate(a["layers"].tolist()):
        key = f"l{ell}_"
        if key + "stream" not in a:
            raise ValueError(f"the Result has no {key}stream; recompute it with the current code")
        get = lambda k: a[key + k].astype(np.float64) if key + k in a else None  # noqa: E731
        out[ell] = Attribution(
            model=s["model_name"], placement=s["placement"], layer=ell, n_layers=s["n_layers"],
            stages=STAGES[s["placement"]], scale=float(a["scale"][i]),
            alpha=float(result.config["alpha"]), typical_norm=float(a["typical_norm"][i]),
            directions=a["directions"][i].astype(np.float64), stream=get("stream"),
            writes=get("writes"), ln_input=get("ln_input"), ln_rule=get("ln_rule"),
            ln_jacobian=get("ln_jacobian"), identity_error=float(s["identity_error"]))
    return out


def half_streams_of(result) -> dict:
    """``{layer: (c / 2, stream)}`` of the run at ``alpha / 2`` (the linearity check).

    Parameters
    ----------
    result : Result

    Returns
    -------
    dict
        ``stream`` is ``[n, batch, 3, L - l + 1]`` as in ``Attribution.stream``.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a Result run without ``half_check``.
    """
    a = check_result(result, "injection_attribution").arrays
    out = {}
    for i, ell in enumerate(a["layers"].tolist()):
        key = f"half_l{ell}_stream"
        if key not in a:
            raise ValueError("the Result has no half_* arrays; it was run with half_check=False")
        out[ell] = (float(a["scale"][i]) / 2, a[key].astype(np.float64))
    return out
