"""The setup the real-model experiments share: checked counts, the model, corpus prompts, concept units."""

from __future__ import annotations

import numpy as np

from companion._validation import check_int, check_layer_list


def check_counts(config, minimum: dict) -> None:
    """Check that each field named in ``minimum`` is an integer >= its value there."""
    for key, lo in minimum.items():
        check_int(getattr(config, key), key, lo)


def check_fields(config, minimum: dict, word_concepts: bool = False) -> None:
    """The checks of the injection configs: counts, sentence lengths, known distinct concepts, layers."""
    from companion.injection.directions import CONCEPTS

    check_counts(config, {"min_words": 1, "max_words": 1, "max_length": 1, "max_batch_tokens": 1,
                          **minimum})
    if config.max_words < config.min_words:
        raise ValueError(f"max_words ({config.max_words}) must be >= min_words ({config.min_words})")
    known = sorted(k for k, v in CONCEPTS.items() if v.template is not None or not word_concepts)
    for c in config.concepts:
        if c not in known:
            raise ValueError(f"concepts entries must be {'word concepts ' * word_concepts}among "
                             f"{known}, got {c!r}")
    if len(set(config.concepts)) != len(config.concepts):
        raise ValueError(f"concepts must not repeat entries, got {config.concepts!r}")
    check_layer_list(config.layers)


def load_model(config, device):
    """The model named by ``config.model``, in ``config.dtype``, on ``device``."""
    from companion.transformers import models

    return models.load(config.model, device=device, dtype=config.dtype)


def model_facts(m) -> dict:
    """``m.facts()`` as the injection Results store it (``weights_dtype`` for ``dtype``)."""
    facts = m.facts()
    facts["weights_dtype"] = facts.pop("dtype")
    return facts


def make_corpus_prompts(m, n_prompts, min_words, max_words, max_length):
    """Prompts of the first ``2 * n_prompts`` corpus sentences (even ones injected, odd ones later)."""
    from companion.corpus import corpus_sentences
    from companion.injection.directions import make_prompts

    sentences = corpus_sentences(2 * n_prompts, min_words, max_words)
    return make_prompts(m, sentences[0::2], sentences[1::2], max_length=max_length)


def model_and_prompts(config, device) -> tuple:
    """Validate ``config``, load its model, build its prompts: ``(model, layers, prompts, stream)``."""
    from companion.transformers import stream

    config.validate()
    m = load_model(config, device)
    L = m.n_layers
    layers = list(config.layers) if config.layers else list(range(L + 1))
    if layers[-1] > L:
        raise ValueError(f"layers must lie in [0, {L}] for {m.name}, got {layers[-1]}")
    prompts = make_corpus_prompts(m, config.n_prompts, config.min_words, config.max_words,
                                  config.max_length)
    return m, layers, prompts, stream.residual_stream(m, prompts.encoding)


def concept_units(m, names, max_length) -> tuple:
    """Unit concept vectors ``[L+1, d]`` (a list) and their norms ``[C, L+1]`` for ``names``."""
    from companion.injection import directions as dr

    units, norms = [], np.zeros((len(names), m.n_layers + 1))
    for i, name in enumerate(names):
        c = dr.CONCEPTS[name]
        cv = dr.concept_vectors(m, *c.texts(), pool=c.pool, name=name, max_length=max_length)
        units.append(cv.unit)
        norms[i] = cv.norm
    return units, norms


def bar(items, progress: bool, desc: str, unit: str):
    """``items`` in a tqdm bar if ``progress``."""
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit)
