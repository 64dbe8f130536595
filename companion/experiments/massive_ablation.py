"""The ``massive_ablation`` experiment: Sun et al.'s zero-versus-mean ablation of a massive activation.

Reads one channel at the first token at every layer
(:func:`~companion.outliers.massive_activations.first_token_profile`), then runs the model
untouched, with :math:`h_\\ell[0, j] = 0`, and with it set to its mean over calibration sentences
(:func:`~companion.outliers.massive_activations.ablate_activation`): per-prompt loss and
attention on the first token.
"""

from __future__ import annotations

from dataclasses import dataclass

from companion.experiments import check_result, register
from companion.experiments._common import check_counts, load_model

__all__ = ["MassiveAblationExperiment", "profile_of", "runs_of"]

ARMS = ("none", "zero", "mean")
#: The arrays that the accessors read from a Result.
_ARRAYS = ("first_values", "median_abs", *(f"{k}_{arm}" for arm in ARMS for k in ("loss", "sink")))


@register("massive_ablation", schema=1)
@dataclass(frozen=True)
class MassiveAblationExperiment:
    """Zero versus mean ablation of one massive activation: loss and attention sinks per prompt.

    Result arrays: ``first_values`` ``[L+1, n_texts]``, ``median_abs``, ``calibration_values``,
    ``loss_<arm>`` ``[n_texts]`` and ``sink_<arm>`` ``[n_texts, L]`` per arm.
    """

    model: str = "smollm2-135m"  #: a causal model for :func:`companion.transformers.models.load`
    channel: int = 507  #: the massive channel (507 in SmolLM2-135M)
    layer: int = 12  #: residual-stream layer :math:`h_\ell` edited (the output of block :math:`\ell - 1`)
    n_texts: int = 256  #: evaluation sentences
    n_calibration: int = 256  #: the following calibration sentences (the "mean" arm's value)
    min_words: int = 8
    max_words: int = 40
    max_length: int = 64
    batch_size: int = 16
    dtype: str = "float32"

    def compute(self, device, progress):
        """Run the three arms; returns the Result's arrays and scalars."""
        from companion.corpus import corpus_sentences
        from companion.outliers import massive_activations as ma

        check_counts(self, {"n_texts": 2, "n_calibration": 1})
        m = load_model(self, device)
        texts = corpus_sentences(self.n_texts + self.n_calibration, min_words=self.min_words,
                                 max_words=self.max_words)
        evaluation, calibration = texts[:self.n_texts], texts[self.n_texts:]
        prof = ma.first_token_profile(m, evaluation, self.channel, max_length=self.max_length)
        cal = ma.first_token_profile(m, calibration, self.channel, max_length=self.max_length)
        mean_value = float(cal.values[self.layer].mean())
        out = {"first_values": prof.values, "median_abs": prof.median_abs,
               "calibration_values": cal.values[self.layer]}
        arms = {"none": (None, None), "zero": (self.layer, 0.0), "mean": (self.layer, mean_value)}
        for arm, (layer, value) in arms.items():
            run = ma.ablate_activation(m, evaluation, layer, self.channel, value,
                                       batch_size=self.batch_size, max_length=self.max_length)
            out[f"loss_{arm}"], out[f"sink_{arm}"] = run.loss, run.sink
        emerged = prof.emergence_layer()
        return {**out, "mean_value": mean_value,
                "emergence_layer": -1 if emerged is None else emerged, **m.facts()}


def profile_of(result):
    """The :class:`~companion.outliers.massive_activations.FirstTokenProfile` stored in a Result.

    Parameters
    ----------
    result : Result

    Returns
    -------
    companion.outliers.massive_activations.FirstTokenProfile

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a missing array.
    """
    from companion.outliers.massive_activations import FirstTokenProfile

    r = check_result(result, "massive_ablation", _ARRAYS)
    return FirstTokenProfile(values=r.arrays["first_values"], median_abs=r.arrays["median_abs"],
                             channel=int(r.config["channel"]))


def runs_of(result) -> dict:
    """The three runs of a Result.

    Parameters
    ----------
    result : Result

    Returns
    -------
    dict
        ``{"none", "zero", "mean"} -> AblationRun``.

    Raises
    ------
    TypeError, ValueError
        As :func:`profile_of`.
    """
    from companion.outliers.massive_activations import AblationRun

    r = check_result(result, "massive_ablation", _ARRAYS)
    layer, channel = int(r.config["layer"]), int(r.config["channel"])
    values = {"none": None, "zero": 0.0, "mean": float(r.scalars["mean_value"])}
    return {arm: AblationRun(loss=r.arrays[f"loss_{arm}"], sink=r.arrays[f"sink_{arm}"],
                             layer=None if arm == "none" else layer, channel=channel, position=0,
                             value=values[arm])
            for arm in ARMS}
