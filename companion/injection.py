"""Inject a direction into the residual stream of a real Transformer and follow it.

This module holds the analysis behind the chapter *Injection in real Transformers*
(``book/injection_real_models.ipynb``) and the experiment :mod:`companion.experiments.injection`.
It runs the model only through :mod:`companion.probes` (forward hooks on the real modules) and
measures the perturbation only through :func:`companion.framework.perturbation_metrics`, so the
metrics mean the same thing here as on the random stacks of *The three-effect framework*.

Indexing
--------
As in :mod:`companion.probes`: ``h_0`` is the input of block 0, ``h_l`` (``1 <= l <= L``) the
output of block ``l - 1``.  *Injecting at layer* ``l`` adds ``c * v`` to ``h_l`` at the selected
token positions, so every later block sees it.  :cite:t:`hahami2025disturbance` add the vector
to the output of decoder layer ``L_H`` -- stream index ``L_H + 1`` here.

Protocol
--------
A prompt is two segments of text, ``first + " " + second``.  The vector is added at the tokens
of ``first`` (the *injected* positions; the first token of a causal model, which acts as an
attention sink with a residual norm far above the others' -- over a hundred times in the middle
layers of SmolLM2 -- and the special tokens of an encoder are left out), and the perturbation is measured at three groups of
positions: the injected ones, the *later* ones (tokens of ``second``, never injected), and the
*last* token (the position at which a causal model predicts the next token; the literature
measures there).

Public functions
----------------
CONCEPTS, ConceptSet
    The word and sentence sets from which concept vectors are read.
make_prompts, InjectionPrompts
    Tokenised two-segment prompts with their position groups.
concept_vectors, ConceptVectors
    Difference of mean activations between two sets of texts, at every layer.
random_unit_vectors
    Random directions (the control).
typical_norms
    Median residual norm per layer over chosen positions (to scale injections relatively).
next_token_kl, embedding_change
    The output effects: KL divergence of next-token distributions, 1 - cos of sentence
    embeddings.
track_injection, InjectionTrack
    Inject at many layers and magnitudes; per-layer metrics per position group and the output
    effect of every run.  ``InjectionTrack.window`` applies the operational window definition
    of :func:`companion.framework.injection_window` (shared with the random stacks) to the
    output effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch

from companion import framework, models, probes
from companion._validation import check_int

__all__ = [
    "GROUPS",
    "ConceptSet",
    "CONCEPTS",
    "InjectionPrompts",
    "make_prompts",
    "ConceptVectors",
    "concept_vectors",
    "random_unit_vectors",
    "typical_norms",
    "next_token_kl",
    "embedding_change",
    "InjectionTrack",
    "track_injection",
]

#: Names of the position groups, in the order used along the ``group`` axis of every result.
GROUPS = ("injected", "later", "last")


# --------------------------------------------------------------------------------------------
# concept sets
# --------------------------------------------------------------------------------------------
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


#: The concept sets used by the chapter.  ``"sea"`` follows the word protocol of
#: :cite:t:`hahami2025disturbance` (a concept's words against neutral baseline words, read at
#: the last token of a short request); ``"joy"`` the sentence protocol (mean over the tokens of
#: cheerful minus sorrowful sentences).  The texts were written for this book.
CONCEPTS: dict[str, ConceptSet] = {
    "sea": ConceptSet(
        name="sea",
        positive=("ocean", "sea", "waves", "tide", "sailor", "harbour", "ship", "coral",
                  "whale", "beach", "anchor", "seagull"),
        negative=("table", "pencil", "idea", "window", "number", "carpet", "ladder", "button",
                  "letter", "garden", "minute", "bottle"),
        template="Tell me about the {}",
        pool="last",
    ),
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


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------


def _check_texts(texts, name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{name} is empty; pass at least one non-empty string")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{name}[{i}] is empty; every text must contain visible characters")
    return texts


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
        raise RuntimeError("the tokenizer's offsets do not match companion.models.tokenize; report this")
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


# --------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InjectionPrompts:
    """Tokenised two-segment prompts and the position groups of the injection protocol.

    Attributes
    ----------
    texts : tuple of str
        ``first[i] + " " + second[i]``.
    encoding : dict of str to torch.Tensor
        ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for BERT), as
        :func:`companion.models.tokenize` returns them; pass it to the probes as ``texts``.
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
        From :func:`companion.models.load`.
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
    first = _check_texts(first, "first")
    second = _check_texts(second, "second")
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


# --------------------------------------------------------------------------------------------
# directions
# --------------------------------------------------------------------------------------------
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
    pos = _check_texts(positive, "positive")
    neg = _check_texts(negative, "negative")
    means = []
    for texts in (pos, neg):
        enc, _, real, special = _encode_with_offsets(m, texts, max_length)
        content = _content_mask(m, real, special, skip_first)
        if not content.any(dim=1).all():
            row = int(torch.nonzero(~content.any(dim=1))[0, 0])
            raise ValueError(f"text {texts[row]!r} has no content token; use longer texts")
        h = probes.residual_stream(m, dict(enc)).to("cpu", torch.float64)  # [L+1, B, T, d]
        if pool == "last":
            idx = torch.arange(content.shape[1]).expand_as(content)
            last = torch.where(content, idx, torch.full_like(idx, -1)).max(dim=1).values
            per_text = h[:, torch.arange(h.shape[1]), last]  # [L+1, B, d]
        else:
            w = content.to(torch.float64)
            per_text = (h * w[None, :, :, None]).sum(2) / w.sum(1)[None, :, None]
        means.append(per_text.mean(1))
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
        A residual stream (:func:`companion.probes.residual_stream`).
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
    h = _to_numpy(stream, "stream")
    mk = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if mk.dtype != np.bool_:
        raise TypeError(f"mask must be boolean, got dtype {mk.dtype}")
    if h.ndim != 4 or mk.shape != h.shape[1:3]:
        raise ValueError(f"stream must be [L+1, batch, tokens, d] and mask [batch, tokens]; got {h.shape} and {mk.shape}")
    if not mk.any():
        raise ValueError("mask selects no position")
    norms = np.linalg.norm(h[:, mk], axis=-1)  # [L+1, n_selected]
    return np.median(norms, axis=1)


# --------------------------------------------------------------------------------------------
# output effects
# --------------------------------------------------------------------------------------------
def next_token_kl(logits_base, logits_inj) -> np.ndarray:
    r"""KL divergence :math:`\mathrm{KL}(p_{base}\,\|\,p_{inj})` of next-token distributions.

    Parameters
    ----------
    logits_base, logits_inj : torch.Tensor or array_like, shape ``[..., vocab]``
        Unnormalised logits of the baseline and the injected run (same shape).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        :math:`\sum_w p_{base}(w)\,(\log p_{base}(w) - \log p_{inj}(w))` in nats, >= 0.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If the shapes differ, the last axis is empty, or a value is NaN/inf.

    Notes
    -----
    Computed from ``log_softmax`` in float64 (stable for any logit scale).  The direction
    :math:`\mathrm{KL}(p_{base}\|p_{inj})` weights the tokens the unperturbed model expects: it
    asks how surprised the original model's predictions would be by the injected ones.

    Examples
    --------
    >>> float(next_token_kl([0.0, 0.0], [0.0, 0.0]))
    0.0
    >>> round(float(next_token_kl([0.0, 0.0], [np.log(3.0), 0.0])), 4)   # KL(1/2,1/2 || 3/4,1/4)
    0.1438
    """
    a = torch.as_tensor(_to_numpy(logits_base, "logits_base"))
    b = torch.as_tensor(_to_numpy(logits_inj, "logits_inj"))
    if a.shape != b.shape:
        raise ValueError(f"logits_base has shape {tuple(a.shape)} but logits_inj has {tuple(b.shape)}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError("logits must have a non-empty last (vocabulary) axis")
    la = torch.log_softmax(a, dim=-1)
    lb = torch.log_softmax(b, dim=-1)
    terms = la.exp() * (la - lb)
    # a token with p_base = 0 (log-probability -inf: logits 1e308 apart) contributes 0, not 0 * inf
    terms = torch.where(torch.isneginf(la), torch.zeros_like(terms), terms)
    kl = terms.sum(-1)
    return kl.clamp_min(0.0).numpy()


def embedding_change(e_base, e_inj) -> np.ndarray:
    r"""Change of a sentence embedding: :math:`1 - \cos(e_{base}, e_{inj})`.

    Parameters
    ----------
    e_base, e_inj : torch.Tensor or array_like, shape ``[..., d]``
        Embeddings of the baseline and the injected run (need not be normalised).

    Returns
    -------
    numpy.ndarray, shape ``[...]``
        In ``[0, 2]``; 0 when the two point the same way.

    Raises
    ------
    TypeError
        If an input is not real-valued.
    ValueError
        If the shapes differ, a vector is zero, or a value is NaN/inf.

    Notes
    -----
    Sentence-transformers compares embeddings by cosine similarity :cite:p:`reimers2019sbert`,
    so :math:`1 - \cos` is the change a user of the embedding sees.  Each vector is divided by a
    power of two near its largest entry first (exact), so embeddings of any magnitude in the
    float64 range give the same value.

    Examples
    --------
    >>> embedding_change([[1.0, 0.0]], [[0.0, 2.0]]).tolist()
    [1.0]
    """
    a = _to_numpy(e_base, "e_base")
    b = _to_numpy(e_inj, "e_inj")
    if a.shape != b.shape:
        raise ValueError(f"e_base has shape {a.shape} but e_inj has {b.shape}")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError("embeddings must have a non-empty last axis")
    # divide each vector by a power of two near its largest entry (exact): the norms neither
    # overflow (entries near 1e200 gave cos = 0) nor underflow (near 1e-200: "zero vector")
    a, b = (np.ldexp(x, -np.frexp(np.max(np.abs(x), axis=-1, keepdims=True))[1]) for x in (a, b))
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    if np.any(na == 0) or np.any(nb == 0):
        raise ValueError("an embedding is the zero vector; its direction is undefined")
    cos = np.clip(np.sum(a * b, axis=-1) / (na * nb), -1.0, 1.0)
    return 1.0 - cos


# --------------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InjectionTrack:
    """Per-layer metrics and output effects of injections at many layers and magnitudes.

    Attributes
    ----------
    model : str
    n_layers : int
        Depth ``L``.
    layers : numpy.ndarray of int, shape ``[n_inj]``
        Injection layers (stream indices).
    scales : numpy.ndarray, shape ``[n_scales]``
        The magnitudes as given: relative ``alpha`` (``relative=True``) or absolute ``c``.
    relative : bool
    coefficient : numpy.ndarray, shape ``[n_inj, n_scales]``
        The absolute length ``c`` of the added vector ``c * v_hat``.
    typical_norm : numpy.ndarray, shape ``[L+1]``
        Median baseline ``||h_l||`` at the injected positions.
    metrics : dict of str to numpy.ndarray, each ``[n_inj, n_scales, L+1, batch, 3]``
        :func:`companion.framework.perturbation_metrics`, averaged over the positions of each
        group of :data:`GROUPS` in each prompt (NaN where undefined, e.g. ``cos_delta_v``
        before the injection layer).
    output_effect : numpy.ndarray, shape ``[n_inj, n_scales, batch]``
        KL divergence at the last token (causal LM) or ``1 - cos`` of the sentence embedding
        (encoder) between the injected and the baseline run.
    effect_name : str
        ``"kl_last"`` or ``"embedding_change"``.
    """

    model: str
    n_layers: int
    layers: np.ndarray
    scales: np.ndarray
    relative: bool
    coefficient: np.ndarray
    typical_norm: np.ndarray
    metrics: dict
    output_effect: np.ndarray
    effect_name: str

    def mean(self, metric: str, group: str = "last") -> np.ndarray:
        """Prompt-averaged metric, shape ``[n_inj, n_scales, L+1]``.

        Raises
        ------
        ValueError
            For an unknown metric or group name.
        """
        if metric not in self.metrics:
            raise ValueError(f"unknown metric {metric!r}; choose from {sorted(self.metrics)}")
        if group not in GROUPS:
            raise ValueError(f"unknown group {group!r}; choose from {GROUPS}")
        a = self.metrics[metric][..., GROUPS.index(group)]
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(a)
            n = ok.sum(-1)
            s = np.where(ok, a, 0.0).sum(-1)
            return np.where(n > 0, s / np.maximum(n, 1), np.nan)

    def effect(self) -> np.ndarray:
        """Prompt-averaged output effect, shape ``[n_inj, n_scales]``."""
        return self.output_effect.mean(-1)

    def window(self, scale_index: int = 0, threshold: float = 0.5, relative: bool = True,
               contiguous: bool = True):
        """:func:`companion.framework.injection_window` of the prompt-averaged output effect.

        Parameters
        ----------
        scale_index : int
            Which magnitude (index into ``scales``).
        threshold, relative, contiguous
            As in :func:`companion.framework.injection_window`.

        Returns
        -------
        companion.framework.Window

        Raises
        ------
        ValueError
            If ``scale_index`` is out of range (and as ``injection_window`` raises).
        """
        s = check_int(scale_index, "scale_index", 0)
        if s >= len(self.scales):
            raise ValueError(f"scale_index must be < {len(self.scales)}, got {s}")
        return framework.injection_window(self.effect()[:, s], layers=self.layers.astype(int),
                                          n_layers=self.n_layers, threshold=threshold, relative=relative,
                                          contiguous=contiguous)


def _group_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` ``[K, B, T]``, ``groups`` ``[G, B, T]`` bool -> NaN-aware means ``[K, B, G]``."""
    ok = groups[None] & np.isfinite(values)[:, None]  # [K, G, B, T]
    s = np.where(ok, values[:, None], 0.0).sum(-1)
    n = ok.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 0, s / np.maximum(n, 1), np.nan)
    return np.moveaxis(out, 1, 2)


def _check_scales(scales) -> np.ndarray:
    if isinstance(scales, Real) and not isinstance(scales, bool):
        scales = [scales]
    if isinstance(scales, (str, bytes)) or not isinstance(scales, (Sequence, np.ndarray)):
        raise TypeError("scales must be a number or a sequence of numbers")
    out = []
    for s in scales:
        if isinstance(s, bool) or not isinstance(s, Real):
            raise TypeError(f"every scale must be a real number, got {s!r}")
        if not math.isfinite(float(s)) or float(s) <= 0:
            raise ValueError(f"every scale must be finite and > 0, got {s}")
        out.append(float(s))
    if not out:
        raise ValueError("scales is empty; pass at least one magnitude")
    return np.asarray(out)


def track_injection(m, prompts: InjectionPrompts, layers, directions, scales, relative: bool = True,
                    norms=None, max_batch_tokens: int = 16384) -> InjectionTrack:
    r"""Inject ``c * v_hat`` at each layer and magnitude; measure every layer and the output.

    Parameters
    ----------
    m : LoadedModel
    prompts : InjectionPrompts
        From :func:`make_prompts` (for the same model).
    layers : sequence of int
        Injection layers (stream indices in ``[0, L]``), strictly increasing.
    directions : array_like, shape ``[d]`` or ``[n_inj, d]``
        One direction for every layer (e.g. a random unit vector) or one per injection layer
        (e.g. ``ConceptVectors.unit[layers]``).  Normalised here.
    scales : float or sequence of float
        Magnitudes, > 0.  With ``relative=True`` they are :math:`\alpha` and the added vector at
        layer :math:`\ell` is :math:`\alpha\, n_\ell\, \hat v` (:func:`typical_norms`);
        otherwise they are the absolute length :math:`c`.
    relative : bool, default True
    norms : array_like, shape ``[L+1]``, optional
        Typical norms to use; computed from a baseline run of ``prompts`` when omitted.
    max_batch_tokens : int, default 16384
        Passed to :func:`companion.probes.injection_sweep` (memory bound per block call).

    Returns
    -------
    InjectionTrack

    Raises
    ------
    TypeError
        Wrong argument types.
    ValueError
        Layers outside ``[0, L]``, not increasing; a direction of the wrong shape or zero;
        non-positive scales; ``norms`` of the wrong shape or non-positive; injected vectors
        beyond the range of the model's dtype.

    Notes
    -----
    Runs :func:`companion.probes.injection_sweep` once (blocks before an injection layer are
    never recomputed), with a ``measure`` that applies
    :func:`companion.framework.perturbation_metrics` at every layer as the sweep proceeds,
    each run against its own direction, and keeps only the per-group means and the output row
    (the last token's state for a causal LM, the mean-pooled state for an encoder, kept at the
    last layer only), so memory stays O(runs x (layers + d) x batch).  The
    output effect is :func:`next_token_kl` of the logits at the last token
    (:func:`companion.models.logits_from_residual`) for a causal LM, and
    :func:`embedding_change` of the mean-pooled final state for an encoder (the
    all-MiniLM-L6-v2 embedding up to its final normalisation, which :math:`1-\cos` ignores).

    Examples
    --------
    >>> tr = track_injection(m, p, [0, 3, 6], random_unit_vectors(m.d_model)[0], [0.5, 2.0])  # doctest: +SKIP
    >>> tr.mean("relative_size", "last").shape                                                # doctest: +SKIP
    (3, 2, 31)
    """
    models.check_model(m)
    if not isinstance(prompts, InjectionPrompts):
        raise TypeError(f"prompts must come from make_prompts, got {type(prompts).__name__}")
    if not isinstance(relative, bool):
        raise TypeError(f"relative must be True or False, got {relative!r}")
    L, d = m.n_layers, m.d_model
    if isinstance(layers, (str, bytes)) or not isinstance(layers, (Sequence, np.ndarray, range)):
        raise TypeError("layers must be a sequence of integers")
    lay = []
    for x in layers:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (Integral, np.integer)):
            raise TypeError(f"every layer must be an integer, got {x!r}")
        lay.append(int(x))
    if not lay:
        raise ValueError("layers is empty; pass at least one injection layer")
    if any(x < 0 or x > L for x in lay) or any(b <= a for a, b in zip(lay, lay[1:])):
        raise ValueError(f"layers must be strictly increasing integers in [0, {L}], got {lay}")
    dirs = _to_numpy(directions, "directions")
    if dirs.shape == (d,):
        dirs = np.broadcast_to(dirs, (len(lay), d))
    elif dirs.shape != (len(lay), d):
        raise ValueError(f"directions must have shape ({d},) or ({len(lay)}, {d}), got {dirs.shape}")
    unit, zero = framework.unit_vectors(dirs)
    if np.any(zero):
        raise ValueError("a direction is the zero vector; pass non-zero directions")
    sc = _check_scales(scales)
    if norms is None:
        base = probes.residual_stream(m, prompts.encoding)
        norms = typical_norms(base, prompts.injected)
        del base
    norms = _to_numpy(norms, "norms")
    if norms.shape != (L + 1,) or np.any(norms <= 0):
        raise ValueError(f"norms must be {L + 1} positive numbers (one per layer), got shape {norms.shape}")
    factor = norms[lay] if relative else np.ones(len(lay))
    coefficient = factor[:, None] * sc[None, :]

    groups = prompts.groups.numpy()
    mask = prompts.encoding["attention_mask"].to("cpu", torch.float64)
    last = prompts.last
    causal = m.kind == "causal-lm"
    n_metric = len(framework.METRIC_NAMES)
    B = prompts.batch
    n_inj, n_sc = len(lay), len(sc)
    rows = torch.zeros(n_inj, n_sc, B, d, dtype=torch.float64)  # output rows at layer L

    def measure(h_inj, h_base, layer, conditions):
        # conditions[k] = (index into lay, index into sc) of run k: each run is measured
        # against the direction it was injected along
        hi = h_inj.detach().to("cpu", torch.float64)
        hi64 = hi.numpy()[None]  # one "layer" axis of K runs for perturbation_metrics
        hb64 = np.broadcast_to(h_base.detach().to("cpu", torch.float64).numpy(), hi64.shape[1:])[None]
        cond = conditions.cpu()
        v = unit[cond[:, 0].numpy()][:, None, None, :]  # [K, 1, 1, d]
        met = framework.perturbation_metrics(hb64, hi64, v)
        if layer == L:
            row = hi[:, last] if causal else (hi * mask[None, :, :, None]).sum(2) / mask.sum(1)[None, :, None]
            rows[cond[:, 0], cond[:, 1]] = row  # [K, B, d]: last token (causal) or mean-pooled state
        return torch.from_numpy(np.stack([_group_means(met[name][0], groups)
                                          for name in framework.METRIC_NAMES], -1))  # [K, B, 3, n_metric]

    vecs = torch.from_numpy(factor[:, None] * unit)
    sw = probes.injection_sweep(m, prompts.encoding, lay, vecs, scale=list(sc), positions=prompts.injected,
                                measure=measure, max_batch_tokens=max_batch_tokens)
    grouped = sw.injected.to(torch.float64).numpy()  # [n_inj, n_sc, L+1, B, 3, n_metric]
    hb = sw.baseline[L].detach().to("cpu", torch.float64)
    base_row = hb[last] if causal else (hb * mask[..., None]).sum(1) / mask.sum(1)[:, None]
    metrics = {name: np.ascontiguousarray(grouped[..., i]) for i, name in enumerate(framework.METRIC_NAMES)}
    if causal:
        lb = models.logits_from_residual(m, base_row.to(torch.float32))
        effect = np.empty((n_inj, n_sc, B))
        for j in range(n_inj):
            li = models.logits_from_residual(m, rows[j].to(torch.float32))  # [n_sc, B, vocab]
            effect[j] = next_token_kl(lb.expand_as(li), li)
        name = "kl_last"
    else:
        effect = embedding_change(base_row.expand_as(rows), rows)
        name = "embedding_change"
    return InjectionTrack(model=m.name, n_layers=L, layers=np.asarray(lay), scales=sc, relative=relative,
                          coefficient=coefficient, typical_norm=norms, metrics=metrics,
                          output_effect=effect, effect_name=name)
