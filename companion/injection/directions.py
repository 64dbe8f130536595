"""Directions to inject and the prompts to inject them into (chapter :doc:`/book/injection_real_models`).

Protocol: a prompt is ``first + " " + second``; the vector is added to ``h_l`` (stream index
as in :mod:`companion.transformers.stream`) at the tokens of ``first`` (*injected*; without
special tokens and, in a causal LM, without the first token, an attention sink), and the
perturbation is measured at the position groups :data:`GROUPS`: the injected tokens, the
*later* tokens of ``second``, and the *last* token (where a causal LM predicts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import as_generator, check_int, check_texts, is_int, real_array
from companion.transformers.models import check_model
from companion.transformers.stream import forward_states

__all__ = [
    "GROUPS", "ConceptSet", "CONCEPTS", "InjectionPrompts", "make_prompts", "ConceptVectors",
    "concept_vectors", "random_unit_vectors", "random_direction", "typical_norms",
    "typical_spreads", "stream_means", "concept_token_ids", "split_null_vectors",
    "subspace_random_vectors"]

#: Names of the position groups, in the order used along the ``group`` axis of every result.
GROUPS = ("injected", "later", "last")


@dataclass(frozen=True)
class ConceptSet:
    """Two sets of texts whose difference of mean activations defines a concept direction."""

    name: str  #: Label.
    positive: tuple  #: The positive set (words are placed in ``template``; sentences used as they are).
    negative: tuple  #: The negative set, likewise.
    template: str | None = None  #: Format string with one ``{}`` for words, ``None`` for sentences.
    #: ``"last"``: read the last content token (words); ``"mean"``: average the content tokens (sentences).
    pool: str = "mean"

    def texts(self) -> tuple[list[str], list[str]]:
        """The two lists of texts (words inserted into the template).

        Returns
        -------
        (list of str, list of str)
            The positive and the negative texts.
        """
        if self.template is None:
            return list(self.positive), list(self.negative)
        return ([self.template.format(w) for w in self.positive],
                [self.template.format(w) for w in self.negative])


#: The neutral baseline words of every word concept.
_NEUTRAL_WORDS = ("table", "pencil", "idea", "window", "number", "carpet", "ladder", "button",
                  "letter", "garden", "minute", "bottle")


def _word_set(name: str, words: tuple[str, ...]) -> ConceptSet:
    """A word concept: its words against the neutral words, read at the last token of a request."""
    return ConceptSet(name=name, positive=words, negative=_NEUTRAL_WORDS,
                      template="Tell me about the {}", pool="last")


#: The concept sets of the chapter.  ``"sea"`` follows the word protocol of
#: :cite:t:`hahami2025disturbance` (a concept's words against neutral words, read at the last
#: token of a short request), as do ``"fire"``, ``"music"`` and ``"food"``; ``"joy"`` the
#: sentence protocol (mean over the tokens of cheerful minus sorrowful sentences).  The texts
#: were written for this book.
CONCEPTS: dict[str, ConceptSet] = {
    "sea": _word_set("sea", ("ocean", "sea", "waves", "tide", "sailor", "harbour", "ship",
                             "coral", "whale", "beach", "anchor", "seagull")),
    "fire": _word_set("fire", ("fire", "flame", "smoke", "ash", "candle", "spark", "blaze",
                               "heat", "ember", "torch", "furnace", "fireplace")),
    "music": _word_set("music", ("music", "song", "piano", "guitar", "melody", "drum", "violin",
                                 "singer", "rhythm", "concert", "choir", "trumpet")),
    "food": _word_set("food", ("food", "bread", "cheese", "soup", "apple", "rice", "butter",
                               "meat", "cake", "pasta", "salad", "sandwich")),
    "joy": ConceptSet(
        "joy",
        positive=(
            "We laughed all evening and the whole house felt warm and bright.",
            "She opened the letter and cried out with happiness at the good news.",
            "The children danced in the garden, delighted by the first day of summer.",
            "He was so glad to see his old friend that he hugged him at the door.",
            "What a wonderful morning: the sun is shining and everyone is smiling.",
            "They celebrated the wedding with music, feasting and joyful songs.",
            "I feel cheerful and grateful for every kind word you have said to me.",
            "The team won the final and the crowd cheered with pure delight."),
        negative=(
            "We sat in silence all evening and the whole house felt cold and dark.",
            "She opened the letter and wept with grief at the terrible news.",
            "The children stood in the garden, miserable on the last day of summer.",
            "He was so sad to lose his old friend that he could not leave the door.",
            "What a dreadful morning: the rain is falling and everyone is weeping.",
            "They mourned the death with silence, fasting and sorrowful songs.",
            "I feel gloomy and bitter about every cruel word you have said to me.",
            "The team lost the final and the crowd left in deep despair.",
        ),
    ),
}


def _skip_first(m, skip_first) -> bool:
    """``skip_first`` checked; ``None`` means ``True`` for a causal LM."""
    if skip_first is None:
        return m.kind == "causal-lm"
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True, False or None, got {skip_first!r}")
    return skip_first


def _encode(m, texts, max_length, skip_first: bool):
    """Encoding as :func:`~companion.transformers.models.tokenize` makes it, offsets, content mask."""
    max_length = m.max_length if max_length is None else max_length
    if not is_int(max_length) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    tok = m.tokenizer(texts, padding=True, truncation=True, max_length=int(max_length),
                      return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    real = tok["attention_mask"].bool()
    if not real.any(dim=1).all():
        raise ValueError("a text produced no tokens; pass texts with visible characters")
    enc = {k: v.to(m.device) for k, v in tok.items() if k not in ("offset_mapping", "special_tokens_mask")}
    content = real & ~tok["special_tokens_mask"].bool()
    if skip_first:
        content[torch.arange(real.shape[0]), real.int().argmax(dim=1)] = False  # first real token
    return enc, tok["offset_mapping"], content


def _last_index(content: torch.Tensor) -> torch.Tensor:
    """Index of the last ``True`` of each row."""
    idx = torch.arange(content.shape[1]).expand_as(content)
    return torch.where(content, idx, torch.full_like(idx, -1)).max(dim=1).values


@dataclass(frozen=True)
class InjectionPrompts:
    """Tokenised two-segment prompts and the position groups of the injection protocol.

    The three masks are boolean tensors ``[batch, tokens]``.
    """

    texts: tuple  #: ``first[i] + " " + second[i]``.
    #: As :func:`companion.transformers.models.tokenize` returns it (pass it as ``texts``).
    encoding: dict
    injected: torch.Tensor  #: Tokens of ``first``.
    later: torch.Tensor  #: Tokens of ``second``.
    last: torch.Tensor  #: The last content token.

    @property
    def groups(self) -> torch.Tensor:  # numpydoc ignore=RT01
        """``[3, batch, tokens]`` boolean stack in the order of :data:`GROUPS`."""
        return torch.stack([self.injected, self.later, self.last])

    @property
    def batch(self) -> int:  # numpydoc ignore=RT01
        """Number of prompts."""
        return int(self.injected.shape[0])


def make_prompts(m, first, second, skip_first: bool | None = None,
                 max_length: int | None = None) -> InjectionPrompts:
    """Tokenise ``first[i] + " " + second[i]`` and mark the injected and the later positions.

    Parameters
    ----------
    m : LoadedModel
    first, second : sequence of str
        Segments that receive the injection, and the segments that follow them (same length).
    skip_first : bool or None
        Leave the first token out of every group (default: ``True`` for a causal LM).
    max_length : int or None
        Truncation length (default ``m.max_length``).

    Returns
    -------
    InjectionPrompts
        The prompts; a token belongs to ``first`` when its character span starts inside it.

    Raises
    ------
    TypeError, ValueError
        For wrong types (TypeError), empty or unequal lists, or a prompt without injected or later tokens.

    Examples
    --------
    >>> p = make_prompts(m, ["The sea was calm."], ["We went home."])   # doctest: +SKIP
    """
    check_model(m)
    first = check_texts(first, "first")
    second = check_texts(second, "second")
    if len(first) != len(second):
        raise ValueError(f"first and second must have the same length, got {len(first)} and {len(second)}")
    skip_first = _skip_first(m, skip_first)
    texts = [a.strip() + " " + b.strip() for a, b in zip(first, second)]
    enc, offsets, content = _encode(m, texts, max_length, skip_first)
    bound = torch.tensor([len(a.strip()) for a in first]).unsqueeze(1)
    injected = content & (offsets[..., 0] < bound)
    later = content & (offsets[..., 0] >= bound)
    for name, mask in (("injected", injected), ("later", later)):
        empty = ~mask.any(dim=1)
        if empty.any():
            row = int(torch.nonzero(empty)[0, 0])
            raise ValueError(f"prompt {row} has no {name} token after tokenisation/truncation "
                             f"({texts[row]!r}); use longer segments or a larger max_length")
    last = torch.zeros_like(content)
    last[torch.arange(content.shape[0]), _last_index(content)] = True
    return InjectionPrompts(texts=tuple(texts), encoding=enc, injected=injected, later=later, last=last)


@dataclass(frozen=True)
class ConceptVectors:
    """A concept direction read at every layer."""

    name: str  #: Label.
    unit: np.ndarray  #: ``v_l / ||v_l||``, the direction injected at layer ``l``, ``[L+1, d]``.
    norm: np.ndarray  #: ``||v_l||``, ``[L+1]``.
    pool: str  #: The pooling used.


def _pooled(m, texts, pool, skip_first, max_length) -> torch.Tensor:
    """Per-text pooled residual stream ``[L+1, len(texts), d]`` (float64, CPU)."""
    enc, _, content = _encode(m, texts, max_length, skip_first)
    if not content.any(dim=1).all():
        row = int(torch.nonzero(~content.any(dim=1))[0, 0])
        raise ValueError(f"text {texts[row]!r} has no content token; use longer texts")
    h = torch.stack(forward_states(m, enc)).to("cpu", torch.float64)  # [L+1, B, T, d]
    if pool == "last":
        return h[:, torch.arange(h.shape[1]), _last_index(content)]  # [L+1, B, d]
    w = content.to(torch.float64)
    return (h * w[None, :, :, None]).sum(2) / w.sum(1)[None, :, None]


def concept_vectors(m, positive, negative, pool: str = "mean", name: str = "concept",
                    skip_first: bool | None = None, max_length: int | None = None) -> ConceptVectors:
    """Difference of mean activations between two sets of texts, at every layer.

    The construction of :cite:t:`hahami2025disturbance` and :cite:t:`turner2023activation`.

    Parameters
    ----------
    m : LoadedModel
    positive, negative : sequence of str
        The two sets (e.g. ``ConceptSet.texts()``).
    pool : {"mean", "last"}, default "mean"
        Average each text's content tokens, or take its last content token.
    name : str, default "concept"
    skip_first, max_length : optional
        As in :func:`make_prompts`.

    Returns
    -------
    ConceptVectors
        :math:`v_l` = mean over ``positive`` minus mean over ``negative`` of the pooled ``h_l``.

    Raises
    ------
    TypeError, ValueError
        For wrong types; empty sets, an unknown ``pool``, a text without content, equal means at a layer.

    Examples
    --------
    >>> cv = concept_vectors(m, *CONCEPTS["joy"].texts())   # doctest: +SKIP
    """
    check_model(m)
    if pool not in ("mean", "last"):
        raise ValueError(f"pool must be 'mean' or 'last', got {pool!r}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    skip_first = _skip_first(m, skip_first)
    pos = check_texts(positive, "positive")
    neg = check_texts(negative, "negative")
    means = [_pooled(m, texts, pool, skip_first, max_length).mean(1) for texts in (pos, neg)]
    diff = (means[0] - means[1]).numpy()
    norm = np.linalg.norm(diff, axis=-1)
    if np.any(norm == 0):
        raise ValueError(f"the two sets have identical mean activations at layers {np.nonzero(norm == 0)[0].tolist()}")
    return ConceptVectors(name=name, unit=diff / norm[:, None], norm=norm, pool=pool)


def random_unit_vectors(d: int, n: int = 1, rng: np.random.Generator | None = None) -> np.ndarray:
    r"""``n`` directions drawn uniformly from the unit sphere in :math:`\mathbb{R}^d`.

    Parameters
    ----------
    d, n : int
        Dimension and number of vectors (default 1), both >= 1.
    rng : numpy.random.Generator or None
        Randomness (default ``np.random.default_rng(0)``).

    Returns
    -------
    numpy.ndarray, shape ``[n, d]``
        Unit rows (normalised Gaussian vectors).

    Raises
    ------
    TypeError, ValueError
        If ``d``/``n`` are not integers or ``rng`` is not a Generator; if ``d < 1`` or ``n < 1``.

    Examples
    --------
    >>> random_unit_vectors(4, 2).shape
    (2, 4)
    """
    d = check_int(d, "d", 1)
    n = check_int(n, "n", 1)
    if rng is None:
        rng = np.random.default_rng(0)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    g = rng.standard_normal((n, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def random_direction(d: int, seed: int = 0, mean_zero: bool = True) -> np.ndarray:
    r"""A seeded random unit vector in :math:`\mathbb R^d`, by default orthogonal to **1**.

    Parameters
    ----------
    d : int
        Dimension, >= 2.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    mean_zero : bool, default True
        Remove the component along the all-ones vector (LayerNorm's mean removal then ignores it).

    Returns
    -------
    numpy.ndarray, shape ``[d]``
        A unit vector.

    Raises
    ------
    TypeError, ValueError
        If ``d``/``seed`` are not integers or ``mean_zero`` is not a bool; if ``d < 2`` or ``seed < 0``.

    Examples
    --------
    >>> round(float(random_direction(8, seed=1) @ random_direction(8, seed=1)), 12)
    1.0
    """
    d = check_int(d, "d", 2)
    seed = check_int(seed, "seed", 0)
    if not isinstance(mean_zero, bool):
        raise TypeError(f"mean_zero must be a bool, got {type(mean_zero).__name__}")
    return _random_direction(d, seed, mean_zero)


def _random_direction(d: int, seed: int, mean_zero: bool = True) -> np.ndarray:
    """:func:`random_direction` of checked arguments."""
    v = np.random.default_rng(seed).standard_normal(d)
    if mean_zero:
        v -= v.mean()
    return v / np.linalg.norm(v)


def _stream_and_mask(stream, mask) -> tuple[np.ndarray, np.ndarray]:
    """The stream's states at the mask's positions ``[L+1, n_selected, d]`` (float64), and the mask."""
    h = real_array("stream", stream)
    mk = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if mk.dtype != np.bool_:
        raise TypeError(f"mask must be boolean, got dtype {mk.dtype}")
    if h.ndim != 4 or mk.shape != h.shape[1:3]:
        raise ValueError("stream must be [L+1, batch, tokens, d] and mask [batch, tokens]; "
                         f"got {h.shape} and {mk.shape}")
    if not mk.any():
        raise ValueError("mask selects no position")
    return h[:, mk], mk


def typical_norms(stream, mask) -> np.ndarray:
    """Median residual norm per layer over the selected positions, the unit of a relative injection.

    Parameters
    ----------
    stream : torch.Tensor or array_like, shape ``[L+1, batch, tokens, d]``
        A residual stream.
    mask : torch.Tensor or array_like of bool, shape ``[batch, tokens]``
        Positions to include (e.g. ``InjectionPrompts.injected``).

    Returns
    -------
    numpy.ndarray, shape ``[L+1]``
        :math:`n_l`; the median, because a few tokens carry massive activations :cite:p:`sun2024massive`.

    Raises
    ------
    TypeError, ValueError
        For a non-boolean mask or non-real stream (TypeError), shape mismatch, an empty mask, NaN/inf.

    Examples
    --------
    >>> h = np.ones((2, 1, 3, 4)); h[1] *= 2
    >>> typical_norms(h, np.ones((1, 3), bool)).tolist()
    [2.0, 4.0]
    """
    return np.median(np.linalg.norm(_stream_and_mask(stream, mask)[0], axis=-1), axis=1)


def stream_means(stream, mask) -> np.ndarray:
    r"""Mean residual state per layer over the selected positions, :math:`\mu_\ell`.

    Parameters
    ----------
    stream, mask : torch.Tensor or array_like
        As in :func:`typical_norms`.

    Returns
    -------
    numpy.ndarray, shape ``[L+1, d]``
        The centre of :func:`typical_spreads` and of ``track_injection(centre=...)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`typical_norms`.
    """
    return _stream_and_mask(stream, mask)[0].mean(axis=1)


def typical_spreads(stream, mask) -> np.ndarray:
    r"""Centred spread per layer, :math:`s_\ell = \sqrt{\operatorname{mean}_i \|h_\ell[i] - \mu_\ell\|^2}`.

    A magnitude unit that the few mean-dominated channels of a real model do not dominate.

    Parameters
    ----------
    stream, mask : torch.Tensor or array_like
        As in :func:`typical_norms` (the mask selects at least two positions).

    Returns
    -------
    numpy.ndarray, shape ``[L+1]``
        :math:`s_\ell` with :math:`\mu_\ell` = :func:`stream_means`.

    Raises
    ------
    TypeError, ValueError
        As :func:`typical_norms`, and for fewer than two positions or zero spread.

    Examples
    --------
    >>> h = np.zeros((1, 1, 2, 2)); h[0, 0, :, 0] = [1.0, 3.0]
    >>> typical_spreads(h, np.ones((1, 2), bool)).tolist()
    [1.0]
    """
    sel, mk = _stream_and_mask(stream, mask)
    if int(mk.sum()) < 2:
        raise ValueError("mask must select at least two positions to measure a spread")
    centred = sel - sel.mean(axis=1, keepdims=True)
    out = np.sqrt(np.mean(np.sum(centred**2, axis=-1), axis=1))
    if np.any(out == 0):
        raise ValueError(f"the selected states are identical at layers {np.nonzero(out == 0)[0].tolist()}")
    return out


def _word_concept(concept) -> ConceptSet:
    """``concept`` (a name of :data:`CONCEPTS` or a ConceptSet) checked to be a word concept."""
    if isinstance(concept, str):
        if concept not in CONCEPTS:
            raise ValueError(f"unknown concept {concept!r}; choose from {sorted(CONCEPTS)}")
        concept = CONCEPTS[concept]
    if not isinstance(concept, ConceptSet):
        raise TypeError(f"concept must be a name of CONCEPTS or a ConceptSet, got {type(concept).__name__}")
    if concept.template is None:
        raise ValueError(f"concept {concept.name!r} is a sentence concept; this needs a word concept "
                         "(a template with words, e.g. 'sea')")
    return concept


def concept_token_ids(m, concept) -> np.ndarray:
    """Token ids whose next-token probability reads a word concept at the output.

    Parameters
    ----------
    m : LoadedModel
        A causal language model.
    concept : str or ConceptSet
        A word concept (e.g. ``"sea"``).

    Returns
    -------
    numpy.ndarray of int
        The first token of ``" " + word`` for each positive word, deduplicated, in order.

    Raises
    ------
    TypeError, ValueError
        For wrong types (TypeError); an encoder, an unknown concept or a sentence concept.
    """
    check_model(m)
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder without a next-token head: concept token ids are "
                         "read at the output of a causal LM (use smollm2-135m)")
    ids = []
    for w in _word_concept(concept).positive:
        tok = m.tokenizer(" " + w, add_special_tokens=False)["input_ids"]
        if tok and tok[0] not in ids:
            ids.append(int(tok[0]))
    return np.asarray(ids, dtype=np.int64)


def split_null_vectors(m, concept, n: int, rng=None, skip_first: bool | None = None,
                       max_length: int | None = None) -> np.ndarray:
    """Null concept vectors: difference of means between two random halves of one word pool.

    The level a concept vector's readout must beat: the same construction, but no concept.

    Parameters
    ----------
    m : LoadedModel
    concept : str or ConceptSet
        A word concept; its pool is ``positive + negative``.
    n : int
        Number of null vectors, >= 1.
    rng : None, int or numpy.random.Generator
        The random halves (default seed 0).
    skip_first, max_length : optional
        As in :func:`make_prompts`.

    Returns
    -------
    numpy.ndarray, shape ``[L+1, n, d]``
        Unit vectors, read like :func:`concept_vectors`.

    Raises
    ------
    TypeError, ValueError
        For wrong argument types; ``n < 1``, an unknown or sentence concept, or a split with equal means.
    """
    check_model(m)
    c = _word_concept(concept)
    n = check_int(n, "n", 1)
    gen = as_generator(0 if rng is None else rng)
    skip_first = _skip_first(m, skip_first)
    pos, neg = c.texts()
    per_text = _pooled(m, check_texts(pos + neg), c.pool, skip_first, max_length).numpy()  # [L+1, N, d]
    N = per_text.shape[1]
    out = np.empty((per_text.shape[0], n, per_text.shape[2]))
    for j in range(n):
        perm = gen.permutation(N)
        a, b = perm[: N // 2], perm[N // 2 : 2 * (N // 2)]
        diff = per_text[:, a].mean(1) - per_text[:, b].mean(1)
        norm = np.linalg.norm(diff, axis=-1)
        if np.any(norm == 0):
            raise ValueError("a random split has identical means; use a larger pool")
        out[:, j] = diff / norm[:, None]
    return out


def subspace_random_vectors(stream, mask, k: int, n: int, rng=None) -> np.ndarray:
    r"""Random unit directions inside the top-``k`` principal subspace of the centred stream.

    A null that, like a concept vector, lies where real states vary.

    Parameters
    ----------
    stream, mask : torch.Tensor or array_like
        As in :func:`typical_norms`; the mask's positions define the subspace.
    k, n : int
        Subspace dimension, ``1 <= k <= min(d, positions - 1)``; number of vectors, >= 1.
    rng : None, int or numpy.random.Generator
        Default seed 0.

    Returns
    -------
    numpy.ndarray, shape ``[L+1, n, d]``
        :math:`U_k g / \|g\|` per layer, :math:`U_k` the top right singular vectors.

    Raises
    ------
    TypeError, ValueError
        As :func:`typical_norms`; for wrong types of ``k``/``n``/``rng``, ``k`` out of range, ``n < 1``.

    Examples
    --------
    >>> h = np.random.default_rng(0).standard_normal((2, 1, 20, 6))
    >>> subspace_random_vectors(h, np.ones((1, 20), bool), k=2, n=3).shape
    (2, 3, 6)
    """
    sel, mk = _stream_and_mask(stream, mask)
    k = check_int(k, "k", 1)
    n = check_int(n, "n", 1)
    gen = as_generator(0 if rng is None else rng)
    n_pos, d = sel.shape[1], sel.shape[2]
    if k > min(d, n_pos - 1):
        raise ValueError(f"k must be <= min(d, selected positions - 1) = {min(d, n_pos - 1)}, got {k}")
    out = np.empty((sel.shape[0], n, d))
    for layer in range(sel.shape[0]):
        x = sel[layer] - sel[layer].mean(0)
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        g = gen.standard_normal((n, k))
        v = g @ vt[:k]
        out[layer] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out
