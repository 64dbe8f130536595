"""Directions to inject and the prompts to inject them into.

What an injection experiment adds to the residual stream, and where: the concept sets and the
concept vectors read from a real model (difference of mean activations), seeded random
directions (the control), the two-segment prompts with their position groups, and the typical
residual norms that scale a relative injection.  The injection itself and its measurement are
:mod:`companion.injection.engine`; the metrics are :mod:`companion.injection.metrics`.

Indexing
--------
As in :mod:`companion.transformers.stream`: ``h_0`` is the input of block 0, ``h_l`` (``1 <= l <= L``) the
output of block ``l - 1``.  *Injecting at layer* ``l`` adds ``c * v`` to ``h_l`` at the selected
token positions, so every later block sees it.  :cite:t:`hahami2025disturbance` add the vector
to the output of decoder layer ``L_H`` -- stream index ``L_H + 1`` here.

Protocol
--------
A prompt is two segments of text, ``first + " " + second``.  The vector is added at the tokens
of ``first`` (the *injected* positions; the first token of a causal model, which acts as an
attention sink with a residual norm far above the others' -- over a hundred times in the middle
layers of SmolLM2 -- and the special tokens of an encoder are left out), and the perturbation is
measured at three groups of positions: the injected ones, the *later* ones (tokens of
``second``, never injected), and the *last* token (the position at which a causal model
predicts the next token; the literature measures there).

Public functions
----------------
CONCEPTS, ConceptSet
    The word and sentence sets from which concept vectors are read.
make_prompts, InjectionPrompts, GROUPS
    Tokenised two-segment prompts with their position groups.
concept_vectors, ConceptVectors
    Difference of mean activations between two sets of texts, at every layer.
random_unit_vectors, random_direction
    Random directions (the control): uniform on the sphere, or one seeded unit vector
    orthogonal to the all-ones vector (for the stacks' LayerNorm analysis).
typical_norms
    Median residual norm per layer over chosen positions (to scale injections relatively).
typical_spreads, stream_means
    The centred spread sqrt(mean ||h_l - mu_l||^2) and the mean mu_l of the stream per layer
    (a magnitude unit and a centre that the few mean-dominated channels do not dominate).
concept_token_ids
    The first token of each positive word of a word concept (its output readout).
split_null_vectors, subspace_random_vectors
    Null directions for concept vectors: differences of means between random halves of one
    word pool; random directions inside the top principal subspace of the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from companion.transformers import models
from companion.transformers import stream as probes
from companion._validation import as_generator, check_int, check_texts

__all__ = [
    "GROUPS",
    "ConceptSet",
    "CONCEPTS",
    "InjectionPrompts",
    "make_prompts",
    "ConceptVectors",
    "concept_vectors",
    "random_unit_vectors",
    "random_direction",
    "typical_norms",
    "typical_spreads",
    "stream_means",
    "concept_token_ids",
    "split_null_vectors",
    "subspace_random_vectors",
]

#: Names of the position groups, in the order used along the ``group`` axis of every result.
GROUPS = ("injected", "later", "last")


# --- concept sets
@dataclass(frozen=True)
class ConceptSet:
    """Two sets of texts whose difference of mean activations defines a concept direction.

    Attributes
    ----------
    name : str
    positive, negative : tuple of str
        The two sets.  Words are placed in ``template``; sentences are used as they are.
    template : str or None
        A format string with one ``{}`` for words (``None`` for sentences).
    pool : {"last", "mean"}
        Read the activation at the last content token of each text (words in a template) or
        average it over the content tokens (sentences).
    """

    name: str
    positive: tuple
    negative: tuple
    template: str | None = None
    pool: str = "mean"

    def texts(self) -> tuple[list[str], list[str]]:
        """The two lists of texts (words inserted into the template)."""
        if self.template is None:
            return list(self.positive), list(self.negative)
        return ([self.template.format(w) for w in self.positive],
                [self.template.format(w) for w in self.negative])


#: The neutral baseline words of every word concept.
_NEUTRAL_WORDS = ("table", "pencil", "idea", "window", "number", "carpet", "ladder", "button",
                  "letter", "garden", "minute", "bottle")

def _word_set(name: str, words: tuple[str, ...]) -> ConceptSet:
    # a word concept: its words against the neutral words, read at the last token of one request
    return ConceptSet(name=name, positive=words, negative=_NEUTRAL_WORDS,
                      template="Tell me about the {}", pool="last")


#: The concept sets used by the chapter.  ``"sea"`` follows the word protocol of
#: :cite:t:`hahami2025disturbance` (a concept's words against neutral baseline words, read at
#: the last token of a short request), and ``"fire"``, ``"music"`` and ``"food"`` follow it with
#: the same template and neutral words; ``"joy"`` the sentence protocol (mean over the tokens of
#: cheerful minus sorrowful sentences).  The texts were written for this book.
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
        name="joy",
        positive=(
            "We laughed all evening and the whole house felt warm and bright.",
            "She opened the letter and cried out with happiness at the good news.",
            "The children danced in the garden, delighted by the first day of summer.",
            "He was so glad to see his old friend that he hugged him at the door.",
            "What a wonderful morning: the sun is shining and everyone is smiling.",
            "They celebrated the wedding with music, feasting and joyful songs.",
            "I feel cheerful and grateful for every kind word you have said to me.",
            "The team won the final and the crowd cheered with pure delight.",
        ),
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
        template=None,
        pool="mean",
    ),
}


# --- argument checks


def _to_numpy(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values; check the run that produced it")
    return arr


def _encode_with_offsets(m, texts, max_length):
    """Encoding of ``texts`` exactly as the probes tokenise them, plus offsets and special-token mask."""
    enc = models.tokenize(m, texts, max_length)
    extra = m.tokenizer(
        texts, padding=True, truncation=True,
        max_length=int(m.max_length if max_length is None else max_length),
        return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt",
    )
    if not torch.equal(extra["input_ids"].to(enc["input_ids"].device), enc["input_ids"]):
        raise RuntimeError("the tokenizer's offsets do not match companion.transformers.models.tokenize; report this")
    real = enc["attention_mask"].bool().cpu()
    special = extra["special_tokens_mask"].bool() & real
    return enc, extra["offset_mapping"], real, special


def _content_mask(m, real: torch.Tensor, special: torch.Tensor, skip_first: bool) -> torch.Tensor:
    content = real & ~special
    if skip_first:
        first = real.int().argmax(dim=1)  # index of the first real token (0 with right padding)
        content[torch.arange(real.shape[0]), first] = False
    return content


def _default_skip_first(m) -> bool:
    return m.kind == "causal-lm"


# --- prompts
@dataclass(frozen=True)
class InjectionPrompts:
    """Tokenised two-segment prompts and the position groups of the injection protocol.

    Attributes
    ----------
    texts : tuple of str
        ``first[i] + " " + second[i]``.
    encoding : dict of str to torch.Tensor
        ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for BERT), as
        :func:`companion.transformers.models.tokenize` returns them; pass it to the probes as ``texts``.
    injected, later, last : torch.Tensor of bool, shape ``[batch, tokens]``
        The injected positions (tokens of ``first``), the later non-injected positions (tokens
        of ``second``) and the last content token of each prompt.
    """

    texts: tuple
    encoding: dict
    injected: torch.Tensor
    later: torch.Tensor
    last: torch.Tensor

    @property
    def groups(self) -> torch.Tensor:
        """``[3, batch, tokens]`` boolean stack in the order of :data:`GROUPS`."""
        return torch.stack([self.injected, self.later, self.last])

    @property
    def batch(self) -> int:
        """Number of prompts."""
        return int(self.injected.shape[0])


def make_prompts(m, first, second, skip_first: bool | None = None,
                 max_length: int | None = None) -> InjectionPrompts:
    """Tokenise ``first[i] + " " + second[i]`` and mark the injected and the later positions.

    Parameters
    ----------
    m : LoadedModel
        From :func:`companion.transformers.models.load`.
    first : sequence of str
        The segments that receive the injection.
    second : sequence of str, same length
        The segments that follow them (never injected).
    skip_first : bool or None
        Leave the first token out of every group.  Default: ``True`` for a causal LM (its first
        token is an attention sink whose residual norm is far above every other token's) and
        ``False`` for an encoder (whose first token, ``[CLS]``, is special and left out anyway).
    max_length : int or None
        Truncation length (default ``m.max_length``).

    Returns
    -------
    InjectionPrompts

    Raises
    ------
    TypeError
        If ``m`` is not a LoadedModel, the segments are not lists of strings, or
        ``skip_first`` is not a bool.
    ValueError
        If the lists are empty or of different lengths, a segment is empty, or truncation
        leaves a prompt without an injected or a later token (raise ``max_length``).

    Notes
    -----
    A token belongs to ``first`` when its character span starts inside ``first`` (tokenizer
    offsets), so a word-piece split across the boundary cannot occur: the boundary is a space.
    Special tokens (``[CLS]``, ``[SEP]``) belong to no group.  The *last* group is the last
    content token: for a causal LM the position whose next-token distribution is the model's
    output, as in the last-token measurements of :cite:t:`hahami2025disturbance`.

    Examples
    --------
    >>> p = make_prompts(m, ["The sea was calm."], ["We went home."])   # doctest: +SKIP
    >>> p.injected.sum().item(), p.later.sum().item()                   # doctest: +SKIP
    (4, 4)
    """
    models.check_model(m)
    first = check_texts(first, "first")
    second = check_texts(second, "second")
    if len(first) != len(second):
        raise ValueError(f"first and second must have the same length, got {len(first)} and {len(second)}")
    if skip_first is None:
        skip_first = _default_skip_first(m)
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True, False or None, got {skip_first!r}")
    texts = [a.strip() + " " + b.strip() for a, b in zip(first, second)]
    enc, offsets, real, special = _encode_with_offsets(m, texts, max_length)
    content = _content_mask(m, real, special, skip_first)
    bound = torch.tensor([len(a.strip()) for a in first]).unsqueeze(1)
    starts = offsets[..., 0]
    injected = content & (starts < bound)
    later = content & (starts >= bound)
    idx = torch.arange(content.shape[1]).expand_as(content)
    last_idx = torch.where(content, idx, torch.full_like(idx, -1)).max(dim=1).values
    for name, mask in (("injected", injected), ("later", later)):
        empty = ~mask.any(dim=1)
        if empty.any():
            row = int(torch.nonzero(empty)[0, 0])
            raise ValueError(
                f"prompt {row} has no {name} token after tokenisation/truncation "
                f"({texts[row]!r}); use longer segments or a larger max_length"
            )
    last = torch.zeros_like(content)
    last[torch.arange(content.shape[0]), last_idx] = True
    return InjectionPrompts(texts=tuple(texts), encoding=dict(enc), injected=injected,
                            later=later, last=last)


# --- directions
@dataclass(frozen=True)
class ConceptVectors:
    """A concept direction read at every layer.

    Attributes
    ----------
    name : str
    unit : numpy.ndarray, shape ``[L+1, d]``
        ``v_l / ||v_l||``: the direction injected at layer ``l``.
    norm : numpy.ndarray, shape ``[L+1]``
        ``||v_l||``, the length of the raw difference of means.
    pool : str
    """

    name: str
    unit: np.ndarray
    norm: np.ndarray
    pool: str


def _pooled(m, texts, pool, skip_first, max_length) -> torch.Tensor:
    """Per-text pooled residual stream ``[L+1, len(texts), d]`` (float64, CPU)."""
    enc, _, real, special = _encode_with_offsets(m, texts, max_length)
    content = _content_mask(m, real, special, skip_first)
    if not content.any(dim=1).all():
        row = int(torch.nonzero(~content.any(dim=1))[0, 0])
        raise ValueError(f"text {texts[row]!r} has no content token; use longer texts")
    h = probes.residual_stream(m, dict(enc)).to("cpu", torch.float64)  # [L+1, B, T, d]
    if pool == "last":
        idx = torch.arange(content.shape[1]).expand_as(content)
        last = torch.where(content, idx, torch.full_like(idx, -1)).max(dim=1).values
        return h[:, torch.arange(h.shape[1]), last]  # [L+1, B, d]
    w = content.to(torch.float64)
    return (h * w[None, :, :, None]).sum(2) / w.sum(1)[None, :, None]


def concept_vectors(m, positive, negative, pool: str = "mean", name: str = "concept",
                    skip_first: bool | None = None, max_length: int | None = None) -> ConceptVectors:
    r"""Difference of mean activations between two sets of texts, at every layer.

    Parameters
    ----------
    m : LoadedModel
    positive, negative : sequence of str
        The two sets (e.g. ``ConceptSet.texts()``).
    pool : {"mean", "last"}, default "mean"
        Per text, average the residual stream over its content tokens or take its last content
        token (content = real, non-special tokens, without the first token if ``skip_first``).
    name : str
        Label stored with the result.
    skip_first : bool or None
        As in :func:`make_prompts` (default: ``True`` for a causal LM).
    max_length : int or None

    Returns
    -------
    ConceptVectors
        ``unit[l] = v_l/||v_l||`` and ``norm[l] = ||v_l||`` with
        :math:`v_l = \frac{1}{|P|}\sum_{x\in P} \bar h_l(x) - \frac{1}{|N|}\sum_{x\in N} \bar h_l(x)`.

    Raises
    ------
    TypeError
        Wrong argument types.
    ValueError
        Empty sets, an unknown ``pool``, a text without content tokens, or a layer at which the
        two means coincide (the direction is undefined).

    Notes
    -----
    This is the construction of :cite:t:`hahami2025disturbance` (mean of positive minus mean
    of negative sentences; a concept word against baseline words) and of activation addition
    :cite:p:`turner2023activation`.  Reading :math:`v_l` at the layer where it is injected
    avoids the off-by-one of reading ``hidden_states[l]`` but injecting after block ``l``.

    Examples
    --------
    >>> pos, neg = CONCEPTS["joy"].texts()                         # doctest: +SKIP
    >>> cv = concept_vectors(m, pos, neg, pool="mean")             # doctest: +SKIP
    >>> cv.unit.shape                                              # doctest: +SKIP
    (31, 576)
    """
    models.check_model(m)
    if pool not in ("mean", "last"):
        raise ValueError(f"pool must be 'mean' or 'last', got {pool!r}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if skip_first is None:
        skip_first = _default_skip_first(m)
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True, False or None, got {skip_first!r}")
    pos = check_texts(positive, "positive")
    neg = check_texts(negative, "negative")
    means = [_pooled(m, texts, pool, skip_first, max_length).mean(1) for texts in (pos, neg)]
    diff = (means[0] - means[1]).numpy()
    norm = np.linalg.norm(diff, axis=-1)
    if np.any(norm == 0):
        raise ValueError(f"the two sets have identical mean activations at layers {np.nonzero(norm == 0)[0].tolist()}")
    return ConceptVectors(name=name, unit=diff / norm[:, None], norm=norm, pool=pool)


def random_unit_vectors(d: int, n: int = 1, rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` independent directions drawn uniformly from the unit sphere in :math:`\\mathbb{R}^d`.

    Parameters
    ----------
    d : int
        Dimension (>= 1).
    n : int, default 1
        Number of vectors (>= 1).
    rng : numpy.random.Generator or None
        Source of randomness (default ``np.random.default_rng(0)``, so the call is reproducible).

    Returns
    -------
    numpy.ndarray, shape ``[n, d]``
        Rows of unit Euclidean norm.

    Raises
    ------
    TypeError
        If ``d`` or ``n`` is not an integer or ``rng`` is not a Generator.
    ValueError
        If ``d < 1`` or ``n < 1``.

    Notes
    -----
    A standard Gaussian vector divided by its norm is uniform on the sphere (rotation
    invariance of the Gaussian); in high dimension such a vector is nearly orthogonal to any
    fixed direction, :math:`|\\cos| \\approx 1/\\sqrt d` :cite:p:`vershynin2018hdp`.

    Examples
    --------
    >>> v = random_unit_vectors(4, 2, np.random.default_rng(0))
    >>> np.round(np.linalg.norm(v, axis=1), 12).tolist()
    [1.0, 1.0]
    """
    d = check_int(d, "d", 1)
    n = check_int(n, "n", 1)
    if rng is None:
        rng = np.random.default_rng(0)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    g = rng.standard_normal((n, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def typical_norms(stream, mask) -> np.ndarray:
    """Median residual norm per layer over the selected token positions.

    Parameters
    ----------
    stream : torch.Tensor or array_like, shape ``[L+1, batch, tokens, d]``
        A residual stream (:func:`companion.transformers.stream.residual_stream`).
    mask : torch.Tensor or array_like of bool, shape ``[batch, tokens]``
        Positions to include (e.g. ``InjectionPrompts.injected``).

    Returns
    -------
    numpy.ndarray, shape ``[L+1]``
        :math:`n_l = \\operatorname{median}_{(b,t)\\in\\text{mask}} \\|h_l[b,t]\\|`.

    Raises
    ------
    TypeError
        If ``mask`` is not boolean.
    ValueError
        If the shapes do not match, the mask selects nothing, or the stream is not finite.

    Notes
    -----
    Injections are scaled by :math:`n_l` so that a *relative* magnitude
    :math:`\\alpha = c/n_l` means the same at every depth.  The median, not the mean, because a
    few tokens (the first token of a causal LM, delimiters) carry massive activations
    :cite:p:`sun2024massive` that would dominate a mean.

    Examples
    --------
    >>> h = np.ones((2, 1, 3, 4)); h[1] *= 2
    >>> typical_norms(h, np.ones((1, 3), bool)).tolist()
    [2.0, 4.0]
    """
    return np.median(np.linalg.norm(_stream_and_mask(stream, mask)[0], axis=-1), axis=1)


def random_direction(d: int, seed: int = 0, mean_zero: bool = True) -> np.ndarray:
    r"""A seeded random unit vector in :math:`\mathbb R^d`, by default orthogonal to **1**.

    Parameters
    ----------
    d : int
        Dimension, ``d >= 2``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    mean_zero : bool, default True
        Remove the component along the all-ones vector (so LayerNorm's mean removal does not
        act on it: assumption (i) of the Post-LN proposition).

    Returns
    -------
    numpy.ndarray, shape ``[d]``, unit Euclidean norm.

    Raises
    ------
    TypeError
        If ``d`` or ``seed`` is not an integer, or ``mean_zero`` is not a bool.
    ValueError
        If ``d`` < 2 or ``seed`` < 0.

    Notes
    -----
    A standard Gaussian vector, centred if asked, divided by its norm: uniform on the unit
    sphere (of the mean-zero hyperplane when ``mean_zero``).

    Examples
    --------
    >>> v = random_direction(8, seed=1)
    >>> round(float(v @ v), 12), abs(float(v.sum())) < 1e-12
    (1.0, True)
    """
    d = check_int(d, "d", 2)
    seed = check_int(seed, "seed", 0)
    if not isinstance(mean_zero, bool):
        raise TypeError(f"mean_zero must be a bool, got {type(mean_zero).__name__}")
    v = np.random.default_rng(seed).standard_normal(d)
    if mean_zero:
        v -= v.mean()
    return v / np.linalg.norm(v)


# --- centred magnitudes, output readouts and null directions (the injection_success experiment)
def _stream_and_mask(stream, mask) -> tuple[np.ndarray, np.ndarray]:
    h = _to_numpy(stream, "stream")
    mk = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if mk.dtype != np.bool_:
        raise TypeError(f"mask must be boolean, got dtype {mk.dtype}")
    if h.ndim != 4 or mk.shape != h.shape[1:3]:
        raise ValueError("stream must be [L+1, batch, tokens, d] and mask [batch, tokens]; "
                         f"got {h.shape} and {mk.shape}")
    if not mk.any():
        raise ValueError("mask selects no position")
    return h[:, mk], mk  # [L+1, n_selected, d]


def stream_means(stream, mask) -> np.ndarray:
    r"""Mean residual state per layer over the selected positions, :math:`\mu_\ell`.

    Parameters
    ----------
    stream : torch.Tensor or array_like, shape ``[L+1, batch, tokens, d]``
    mask : torch.Tensor or array_like of bool, shape ``[batch, tokens]``

    Returns
    -------
    numpy.ndarray, shape ``[L+1, d]``
        The centre of :func:`typical_spreads` and of the centred metrics of
        :func:`companion.injection.engine.track_injection` (``centre=``).

    Raises
    ------
    TypeError, ValueError
        As :func:`typical_norms`.

    Examples
    --------
    >>> h = np.zeros((1, 1, 2, 2)); h[0, 0, :, 0] = [1.0, 3.0]
    >>> stream_means(h, np.ones((1, 2), bool)).tolist()
    [[2.0, 0.0]]
    """
    sel, _ = _stream_and_mask(stream, mask)
    return sel.mean(axis=1)


def typical_spreads(stream, mask) -> np.ndarray:
    r"""Centred spread of the stream per layer: :math:`s_\ell = \sqrt{\operatorname{mean}_i
    \|h_\ell[i] - \mu_\ell\|^2}` over the selected positions.

    Parameters
    ----------
    stream : torch.Tensor or array_like, shape ``[L+1, batch, tokens, d]``
    mask : torch.Tensor or array_like of bool, shape ``[batch, tokens]``
        Positions to include (e.g. ``InjectionPrompts.injected``); at least two.

    Returns
    -------
    numpy.ndarray, shape ``[L+1]``
        :math:`s_\ell`, with :math:`\mu_\ell` the mean over the same positions
        (:func:`stream_means`).

    Raises
    ------
    TypeError
        If ``mask`` is not boolean or the stream is not real.
    ValueError
        If the shapes do not match, the mask selects fewer than two positions, the stream is
        not finite, or a layer has zero spread (all selected states equal).

    Notes
    -----
    In SmolLM2 the typical norm :math:`n_\ell` of :func:`typical_norms` is dominated by a few
    channels whose value is nearly the same at every token (their mean is large, their spread
    small), so :math:`\alpha n_\ell` says little about how far an injection moves a token
    compared with how far tokens differ from one another.  :math:`s_\ell` removes the shared
    mean: it is the root-mean-square distance of a token's state from the average state, the
    unit in which ``c = alpha * s_l`` compares an injection with the natural variation of the
    stream.

    Examples
    --------
    >>> h = np.zeros((1, 1, 2, 2)); h[0, 0, :, 0] = [1.0, 3.0]; h[0, 0, :, 1] = 100.0
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
        The first token id of ``" " + word`` for each positive word, deduplicated, in the
        order of the words.

    Raises
    ------
    TypeError
        If ``m`` is not a LoadedModel or ``concept`` not a name or ConceptSet.
    ValueError
        If ``m`` is an encoder without a next-token head, the concept is unknown or a
        sentence concept.

    Notes
    -----
    ``log P(concept) = logsumexp_w log p(w)`` over these ids is the readout of the
    injection_success experiment.  A word split into several tokens contributes its first
    token (e.g. a prefix shared with other words), which is the token whose probability the
    model must raise to start the word.

    Examples
    --------
    >>> ids = concept_token_ids(models.load("smollm2-135m"), "sea")   # doctest: +SKIP
    """
    models.check_model(m)
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is an encoder without a next-token head: concept token ids are "
                         "read at the output of a causal LM (use smollm2-135m)")
    c = _word_concept(concept)
    ids = []
    for w in c.positive:
        tok = m.tokenizer(" " + w, add_special_tokens=False)["input_ids"]
        if tok and tok[0] not in ids:
            ids.append(int(tok[0]))
    return np.asarray(ids, dtype=np.int64)


def split_null_vectors(m, concept, n: int, rng=None, skip_first: bool | None = None,
                       max_length: int | None = None) -> np.ndarray:
    r"""Null concept vectors: difference of means between two random halves of one word pool.

    Parameters
    ----------
    m : LoadedModel
    concept : str or ConceptSet
        A word concept; its pool is ``positive + negative`` (24 words for ``"sea"``).
    n : int
        Number of null vectors (>= 1).
    rng : None, int or numpy.random.Generator
        The random halves (default seed 0).
    skip_first, max_length
        As in :func:`concept_vectors`.

    Returns
    -------
    numpy.ndarray, shape ``[L+1, n, d]``
        Unit vectors: null ``j`` at layer ``l`` is
        :math:`(ar h_\ell(A_j) - ar h_\ell(B_j))/\|\cdot\|` for a random split
        :math:`A_j \cup B_j` of the pool into halves, read like :func:`concept_vectors`.

    Raises
    ------
    TypeError
        Wrong argument types.
    ValueError
        ``n < 1``, an unknown or sentence concept, or a split with equal means.

    Notes
    -----
    A concept vector is a difference of two means of 12 words each; part of it is sampling
    noise of that construction (which words were chosen), and part of it the direction along
    which "a specific noun follows 'Tell me about the'" differs from average.  A split of the
    same pool into random halves has the same construction and the same token statistics but
    no concept: its readout is the level a concept vector must beat.

    Examples
    --------
    >>> null = split_null_vectors(m, "sea", 8, np.random.default_rng(1))   # doctest: +SKIP
    >>> null.shape                                                        # doctest: +SKIP
    (31, 8, 576)
    """
    models.check_model(m)
    c = _word_concept(concept)
    n = check_int(n, "n", 1)
    gen = as_generator(0 if rng is None else rng)
    if skip_first is None:
        skip_first = _default_skip_first(m)
    if not isinstance(skip_first, bool):
        raise TypeError(f"skip_first must be True, False or None, got {skip_first!r}")
    pos, neg = c.texts()
    per_text = _pooled(m, pos + neg, c.pool, skip_first, max_length).numpy()  # [L+1, N, d]
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

    Parameters
    ----------
    stream : torch.Tensor or array_like, shape ``[L+1, batch, tokens, d]``
    mask : torch.Tensor or array_like of bool, shape ``[batch, tokens]``
        The positions whose states define the subspace (e.g. the injected ones).
    k : int
        Dimension of the subspace, ``1 <= k <= min(d, number of selected positions - 1)``.
    n : int
        Number of vectors (>= 1).
    rng : None, int or numpy.random.Generator
        Default seed 0.

    Returns
    -------
    numpy.ndarray, shape ``[L+1, n, d]``
        At each layer, ``n`` unit vectors :math:`U_k g / \|g\|` with :math:`U_k` the top-``k``
        right singular vectors of the centred states :math:`h_\ell[i] - \mu_\ell` and ``g``
        standard Gaussian in :math:`\mathbb R^k` (uniform on the unit sphere of the subspace).

    Raises
    ------
    TypeError
        If ``mask`` is not boolean, ``k``/``n`` are not integers or ``rng`` is invalid.
    ValueError
        Shapes that do not match, ``k`` out of range, ``n < 1``, a stream that is not finite.

    Notes
    -----
    A direction uniform on the sphere of :math:`\mathbb R^d` is almost orthogonal to the few
    directions along which real states vary, so the model may simply ignore it; a concept
    vector lies partly in that subspace.  Random directions inside the top principal subspace
    are the null that shares this property without carrying a concept.

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
