"""The ``channel_statistics`` experiment: residual-stream channel statistics of a real model.

Streams :func:`~companion.outliers.channel_statistics.channel_statistics` over corpus sentences
for any model :func:`~companion.transformers.models.load` knows.
"""

from __future__ import annotations

from dataclasses import dataclass

from companion.experiments import check_result, register
from companion.experiments._common import check_counts, load_model

__all__ = ["ChannelStatisticsExperiment", "statistics_of"]


@register("channel_statistics", schema=1)
@dataclass(frozen=True)
class ChannelStatisticsExperiment:
    """Per-layer, per-channel mean, variance, extremes and counts C_j(t) over corpus sentences.

    The first ``n_texts`` corpus sentences of ``min_words``-``max_words`` words, truncated to
    ``max_length`` tokens, in batches of ``batch_size``.
    """

    model: str = "smollm2-135m"  #: a name for :func:`companion.transformers.models.load`
    n_texts: int = 64
    min_words: int = 8
    max_words: int = 40
    max_length: int = 64
    batch_size: int = 16
    #: the ``t`` of ``C_j(t) = #{tokens: |h_j| > t}``
    thresholds: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    skip_first: bool = False  #: exclude the first token of each text (where massive activations sit)
    dtype: str = "float32"

    def compute(self, device, progress):
        """Stream the statistics; returns the Result's arrays and scalars."""
        from companion.corpus import corpus_sentences
        from companion.outliers.channel_statistics import channel_statistics

        check_counts(self, {"n_texts": 1, "batch_size": 1})
        m = load_model(self, device)
        texts = corpus_sentences(self.n_texts, min_words=self.min_words, max_words=self.max_words)
        st = channel_statistics(m, texts, self.thresholds, batch_size=self.batch_size,
                                max_length=self.max_length, skip_first=self.skip_first, progress=progress)
        return {**st.arrays(), "n_tokens": st.n_tokens, "n_texts": st.n_texts, **m.facts()}


def statistics_of(result):
    """The :class:`~companion.outliers.channel_statistics.ChannelStatistics` stored in a Result.

    Parameters
    ----------
    result : companion.experiments.Result
        A Result of this experiment.

    Returns
    -------
    companion.outliers.channel_statistics.ChannelStatistics
        As computed, so a chapter reads a stored pass as a live one.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; a missing array or scalar.

    Examples
    --------
    >>> st = statistics_of(run_cached(make_config("channel_statistics", n_texts=8)))  # doctest: +SKIP
    """
    from companion.outliers.channel_statistics import ChannelStatistics

    check_result(result, "channel_statistics", ("mean", "var", "min", "max", "max_abs", "counts",
                                                "thresholds"), ("n_tokens", "n_texts"))
    a, s = result.arrays, result.scalars
    return ChannelStatistics(mean=a["mean"], var=a["var"], min=a["min"], max=a["max"],
                             max_abs=a["max_abs"], counts=a["counts"], thresholds=a["thresholds"],
                             n_tokens=int(s["n_tokens"]), n_texts=int(s["n_texts"]),
                             skip_first=bool(result.config.get("skip_first", False)),
                             model=str(result.config.get("model", "")))
