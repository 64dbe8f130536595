"""Experiment ``injection_heldout``: a concept read on words that did not build it, against 99+ nulls.

Each word concept's 12 construction words are split ``n_splits`` times (seeded) into halves A and
B; the concept vector of a split is built from half A against the neutral words
(:func:`companion.injection.directions.concept_vectors`).  The split vectors and ``n_null``
isotropic random unit directions are injected at :math:`\\alpha\\, s_\\ell\\, \\hat v_\\ell`
(:math:`s_\\ell` the centred spread) at every layer of the grid, and the final layer is read
once per run for every word of :data:`HELDOUT_WORDS` ∪ the construction words, so that any word
set (half A, half B, the related words) is read from the same forward passes.

Causal LM: ``logp`` ``[n_dir, n_inj, S, B, n_ids]`` (log-probabilities of the first tokens of all
words at the last token, float32) beside ``base_logp`` ``[B, n_ids]``; encoder: ``dots`` (the
mean-pooled final state dotted with each word's mean-pooled embedding) and ``emb_norm``.  Per run
also ``effect`` (KL at the last token, or 1 - cos of the sentence embedding) and, at layer L,
``rel_inj``, ``rel_last`` (:math:`\\lVert\\delta_L\\rVert/\\lVert h_L\\rVert`) and ``cos_inj``,
``cos_last`` (:math:`\\cos(\\tilde h_L, h_L)`) at the injected tokens (mean) and the last token.
Directions are ordered: ``n_splits`` split vectors per concept (concept-major), then the nulls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from companion.experiments import register
from companion.experiments._common import bar, check_fields, model_and_prompts, model_facts

__all__ = ["InjectionHeldoutExperiment", "CONFIGS", "HELDOUT_WORDS", "word_splits", "word_sets",
           "set_readout", "readout_cube", "heldout_test", "specificity", "final_summary"]

#: Related words never used to build a concept vector (their first tokens differ from every
#: construction word's first token in SmolLM2's tokenizer; checked in the tests).
HELDOUT_WORDS: dict[str, tuple[str, ...]] = {
    "sea": ("sailing", "dolphin", "shark", "island", "shore", "boat", "lighthouse", "pirate",
            "fish", "lobster"),
    "fire": ("burn", "volcano", "lava", "bonfire", "flare", "inferno", "lighter", "hot",
             "match", "chimney"),
    "music": ("band", "orchestra", "jazz", "harp", "flute", "opera", "tune", "lyrics", "chorus",
              "album"),
    "food": ("dinner", "lunch", "breakfast", "meal", "pizza", "egg", "kitchen", "potato", "fruit",
             "sugar"),
}


def word_splits(n_words: int, n_splits: int, seed: int = 0) -> np.ndarray:
    """``n_splits`` random halves: a boolean ``[n_splits, n_words]`` mask of half A (seeded).

    Parameters
    ----------
    n_words : int
        Number of words (>= 2); half A has ``n_words // 2`` of them.
    n_splits : int
        Number of splits (>= 1).
    seed : int, default 0

    Returns
    -------
    numpy.ndarray of bool

    Raises
    ------
    TypeError, ValueError
        Non-integers; ``n_words < 2``, ``n_splits < 1``, ``seed < 0``.

    Examples
    --------
    >>> word_splits(12, 3).sum(1).tolist()
    [6, 6, 6]
    """
    from companion._validation import check_int

    n_words, n_splits = check_int(n_words, "n_words", 2), check_int(n_splits, "n_splits", 1)
    gen = np.random.default_rng(check_int(seed, "seed", 0))
    out = np.zeros((n_splits, n_words), dtype=bool)
    for k in range(n_splits):
        out[k, gen.permutation(n_words)[: n_words // 2]] = True
    return out


@register("injection_heldout", schema=1)
@dataclass(frozen=True)
class InjectionHeldoutExperiment:
    """Split concept vectors and isotropic nulls injected per layer; every word read at the output.

    ``n_prompts``, ``min_words``, ``max_words``, ``max_length`` and ``layers`` are as in
    :class:`~companion.experiments.injection_window.InjectionWindowExperiment`.
    """

    model: str = "smollm2-135m"  #: a name for :func:`companion.transformers.models.load`
    n_prompts: int = 12
    min_words: int = 6
    max_words: int = 9
    max_length: int = 32
    layers: tuple[int, ...] = (0, 5, 10, 15, 20, 25, 29)
    concepts: tuple[str, ...] = ("sea", "fire", "music", "food")
    scales: tuple[float, ...] = (0.125, 0.5)  #: magnitudes :math:`\alpha` (units of :math:`s_\ell`)
    n_splits: int = 6  #: random halves of each concept's words (>= 2)
    n_null: int = 99  #: isotropic random unit directions (>= 19)
    seed: int = 0
    dtype: str = "float32"
    max_batch_tokens: int = 16384

    def validate(self) -> None:
        """Check the fields that do not need the model.

        Raises
        ------
        ValueError
            Counts too small, bad concepts, scales or layers.
        """
        check_fields(self, {"n_prompts": 2, "n_splits": 2, "n_null": 19, "seed": 0},
                     word_concepts=True)
        if not self.concepts or any(c not in HELDOUT_WORDS for c in self.concepts):
            raise ValueError(f"concepts must be among {sorted(HELDOUT_WORDS)}, got {self.concepts}")
        if not self.scales or any(not (math.isfinite(s) and s > 0) for s in self.scales):
            raise ValueError(f"scales must be finite and > 0 (at least one), got {self.scales}")
        if list(self.scales) != sorted(set(self.scales)):
            raise ValueError(f"scales must be strictly increasing, got {self.scales}")

    def compute(self, device, progress):
        """Run the experiment (see the module docstring); returns the Result's arrays and scalars."""
        import torch

        from companion.injection import directions as dr

        m, layers, prompts, base = model_and_prompts(self, device)
        L, d = m.n_layers, m.d_model
        spreads = dr.typical_spreads(base, prompts.injected)
        del base
        causal = m.kind == "causal-lm"
        C = dr.CONCEPTS
        build = {c: list(C[c].positive) for c in self.concepts}
        n_w = len(build[self.concepts[0]])
        splits = word_splits(n_w, self.n_splits, self.seed)
        units = []
        for c in self.concepts:
            words = np.asarray(build[c])
            for k in range(self.n_splits):
                pos = [C[c].template.format(w) for w in words[splits[k]]]
                cv = dr.concept_vectors(m, pos, C[c].texts()[1], pool="last", max_length=self.max_length)
                units.append(cv.unit)
        gen = np.random.default_rng(self.seed + 1)
        rand = dr.random_unit_vectors(d, self.n_null, gen)
        units = np.concatenate([np.stack(units), np.broadcast_to(rand[:, None], (self.n_null, L + 1, d))])

        words = [w for c in self.concepts for w in build[c]] + [w for c in self.concepts for w in HELDOUT_WORDS[c]]
        out: dict = {}
        if causal:
            first = [int(m.tokenizer(" " + w, add_special_tokens=False)["input_ids"][0]) for w in words]
            ids = sorted(set(first))
            out["word_token"] = np.asarray([ids.index(t) for t in first])
            out["token_ids"] = np.asarray(ids)
            feat = _causal_features(m, prompts, torch.as_tensor(ids))
        else:
            wemb = _word_embeddings(m, [C[self.concepts[0]].template.format(w) for w in words],
                                    self.max_length)
            out["word_embedding"] = wemb
            feat = _encoder_features(m, prompts, torch.as_tensor(wemb))
        n_dir, n_inj, S, B = units.shape[0], len(layers), len(self.scales), prompts.batch
        res = {}
        for j in bar(range(n_dir), progress, f"injection_heldout {m.name}", "direction"):
            vecs = torch.from_numpy(spreads[layers][:, None] * units[j][layers])
            from companion.injection.engine import sweep_injections
            sw = sweep_injections(m, prompts.encoding, layers, vecs, scale=list(self.scales),
                                  positions=prompts.injected, measure=feat["measure"],
                                  max_batch_tokens=self.max_batch_tokens)
            got = sw.injected[:, :, L].to(torch.float64).numpy()          # [n_inj, S, B, width]
            for key, sl in feat["slices"].items():
                res.setdefault(key, np.empty((n_dir, n_inj, S, B) + got[..., sl].shape[3:]))[j] = got[..., sl].reshape(
                    (n_inj, S, B) + got[..., sl].shape[3:])
        for key, v in res.items():
            v = v[..., 0] if v.shape[-1] == 1 else v
            out[key] = v.astype(np.float32) if key in ("logp", "dots") else v
        out.update(feat["base"](), layers=np.asarray(layers), typical_spread=spreads,
                   splits=splits, concepts=list(self.concepts), words=words,
                   n_construction=n_w, scales=np.asarray(self.scales), n_prompts=B,
                   effect_name="kl_last" if causal else "embedding_change", **model_facts(m))
        return out


#: The runs: SmolLM2-135M (the default config) and MiniLM-L6 (every layer).
CONFIGS: dict[str, InjectionHeldoutExperiment] = {
    "smollm2-135m": InjectionHeldoutExperiment(),
    "minilm-l6": InjectionHeldoutExperiment(model="minilm-l6", layers=()),
}


def _final_geometry(h_inj, h_base, inj, last) -> "torch.Tensor":
    """``[K, B, 4]``: rel and cos at the injected tokens (mean) and at the last token."""
    import torch

    hi, hb = h_inj.to(torch.float64), h_base.to(torch.float64)[None]
    rel = (hi - hb).norm(dim=-1) / hb.norm(dim=-1)                  # [K, B, T]
    cos = torch.nn.functional.cosine_similarity(hi, hb.expand_as(hi), dim=-1)
    w = inj.to(torch.float64)
    mean = lambda x: (x * w).sum(-1) / w.sum(-1)                     # noqa: E731
    lastv = lambda x: (x * last.to(torch.float64)).sum(-1)           # noqa: E731
    return torch.stack([mean(rel), lastv(rel), mean(cos), lastv(cos)], -1)


def _causal_features(m, prompts, ids) -> dict:
    """The measure of a causal LM: KL at the last token, geometry, log-probs of ``ids``."""
    import torch

    from companion.injection.metrics import next_token_kl
    from companion.transformers.readout import logits_from_residual

    L, B, n = m.n_layers, prompts.batch, len(ids)
    last, inj = prompts.last, prompts.injected
    state: dict = {}

    def logp(h):                                                     # [n, d] -> [n, V]
        return torch.log_softmax(logits_from_residual(m, h.to(torch.float32)).double(), -1)

    def measure(h_inj, h_base, layer, conditions):
        K = h_inj.shape[0]
        res = torch.zeros(K, B, 5 + n, dtype=torch.float64)
        if layer != L:
            return res
        if "base" not in state:
            state["base"] = logp(h_base[last])
        for k in range(K):
            lp = logp(h_inj[k][last])
            res[k, :, 0] = torch.from_numpy(next_token_kl(state["base"], lp))
            res[k, :, 5:] = lp[:, ids]
        res[:, :, 1:5] = _final_geometry(h_inj, h_base, inj, last)
        return res

    return {"measure": measure,
            "slices": {"effect": slice(0, 1), "rel_inj": slice(1, 2), "rel_last": slice(2, 3),
                       "cos_inj": slice(3, 4), "cos_last": slice(4, 5), "logp": slice(5, None)},
            "base": lambda: {"base_logp": state["base"][:, ids].numpy()}}


def _word_embeddings(m, texts, max_length) -> np.ndarray:
    """Mean-pooled final states of ``texts`` (an encoder's sentence embeddings), ``[n, d]``."""
    import torch

    from companion.transformers import models, stream

    enc = models.tokenize(m, texts, max_length)
    h = stream.residual_stream(m, enc)[-1].to("cpu", torch.float64)
    w = enc["attention_mask"].to("cpu", torch.float64)
    return ((h * w[..., None]).sum(1) / w.sum(1)[:, None]).numpy()


def _encoder_features(m, prompts, wemb) -> dict:
    """The measure of an encoder: 1 - cos of the embedding, geometry, dots with ``wemb``."""
    import torch

    L, B, n = m.n_layers, prompts.batch, wemb.shape[0]
    last, inj = prompts.last, prompts.injected
    mask = prompts.encoding["attention_mask"].to("cpu", torch.float64)
    state: dict = {}

    def embed(h):                                                    # [K, B, T, d] -> [K, B, d]
        h = h.detach().to("cpu", torch.float64)
        return (h * mask[None, :, :, None]).sum(2) / mask.sum(1)[None, :, None]

    def measure(h_inj, h_base, layer, conditions):
        K = h_inj.shape[0]
        res = torch.zeros(K, B, 6 + n, dtype=torch.float64)
        if layer != L:
            return res
        if "base" not in state:
            state["base"] = embed(h_base[None])[0]
        e = embed(h_inj)
        res[:, :, 0] = 1 - torch.nn.functional.cosine_similarity(e, state["base"][None], dim=-1)
        res[:, :, 1:5] = _final_geometry(h_inj.to("cpu"), h_base.to("cpu"), inj, last)
        res[:, :, 5] = e.norm(dim=-1)
        res[:, :, 6:] = e @ wemb.T
        return res

    return {"measure": measure,
            "slices": {"effect": slice(0, 1), "rel_inj": slice(1, 2), "rel_last": slice(2, 3),
                       "cos_inj": slice(3, 4), "cos_last": slice(4, 5), "emb_norm": slice(5, 6),
                       "dots": slice(6, None)},
            "base": lambda: {"base_emb_norm": state["base"].norm(dim=-1).numpy(),
                             "base_dots": (state["base"] @ wemb.T).numpy()}}


# ------------------------------------------------------------------------------ reading Results
def word_sets(result, concept: str, which: str = "heldout") -> list:
    """The word indices read for ``concept`` in each split: ``n_splits`` integer arrays.

    Parameters
    ----------
    result : Result
        Of ``injection_heldout``.
    concept : str
        One of the Result's concepts.
    which : {"heldout", "related", "construction"}, default "heldout"
        Half B of each split (without words whose first token is a half-A word's: the readout
        must not see a construction token), the related words of :data:`HELDOUT_WORDS`, or
        half A (the circular control).

    Returns
    -------
    list of numpy.ndarray
        Indices into ``result.scalars["words"]``.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; an unknown concept or ``which``.
    """
    from companion.experiments import check_result

    check_result(result, "injection_heldout")
    sc, a = result.scalars, result.arrays
    if concept not in sc["concepts"]:
        raise ValueError(f"unknown concept {concept!r}; this Result has {sc['concepts']}")
    if which not in ("heldout", "related", "construction"):
        raise ValueError(f"which must be 'heldout', 'related' or 'construction', got {which!r}")
    ci, n_w = sc["concepts"].index(concept), int(sc["n_construction"])
    own = ci * n_w + np.arange(n_w)
    n_c = len(sc["concepts"])
    n_rel = (len(sc["words"]) - n_c * n_w) // n_c
    tok = np.asarray(a["word_token"]) if "word_token" in a else np.arange(len(sc["words"]))
    sets = []
    for k, half in enumerate(np.asarray(a["splits"], dtype=bool)):
        if which == "construction":
            sets.append(own[half])
        elif which == "related":
            sets.append(n_c * n_w + ci * n_rel + np.arange(n_rel))
        else:
            b = own[~half]
            sets.append(b[~np.isin(tok[b], tok[own[half]])])
    return sets


def set_readout(result, words, scale: float = 0.5) -> np.ndarray:
    """The readout of one word set under every direction, layer and prompt: ``[n_dir, n_inj, B]``.

    Causal LM: the change of :math:`\\log P(\\text{set})` (log-sum-exp over the distinct first
    tokens) at the last token; encoder: the change of the cosine between the sentence embedding
    and the set's mean word embedding.

    Parameters
    ----------
    result : Result
    words : sequence of int
        Indices into ``result.scalars["words"]`` (non-empty).
    scale : float, default 0.5
        A magnitude of the Result.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; an empty set or a scale not run.
    """
    from companion.experiments import check_result

    check_result(result, "injection_heldout")
    a = result.arrays
    w = np.asarray(words, dtype=np.int64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError("words must be a non-empty list of word indices")
    scales = np.asarray(a["scales"]).tolist()
    if scale not in scales:
        raise ValueError(f"scale must be one of {scales}, got {scale}")
    s = scales.index(scale)
    if "logp" in a:
        cols = np.unique(np.asarray(a["word_token"])[w])
        lse = lambda x: np.logaddexp.reduce(np.asarray(x, np.float64)[..., cols], axis=-1)  # noqa: E731
        return lse(a["logp"][:, :, s]) - lse(a["base_logp"])[None, None]
    e = np.asarray(a["word_embedding"])
    centre = e[w].mean(0)
    dot = np.asarray(a["dots"][:, :, s], np.float64)[..., w].mean(-1)                 # e . centre
    cn = np.linalg.norm(centre)
    base = np.asarray(a["base_dots"], np.float64)[:, w].mean(-1) / (a["base_emb_norm"] * cn)
    return dot / (np.asarray(a["emb_norm"][:, :, s]) * cn) - base[None, None]


def readout_cube(result, concept: str, which: str = "heldout", scale: float = 0.5,
                 direction_concept: str | None = None) -> tuple:
    """Readouts of ``concept``'s word sets: the concept's split vectors and the nulls.

    Parameters
    ----------
    result : Result
    concept : str
        The concept read.
    which : str, default "heldout"
        As in :func:`word_sets`.
    scale : float, default 0.5
    direction_concept : str, optional
        The concept injected (default ``concept``: the diagonal of the specificity matrix).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``own`` ``[K, n_inj, B]`` (split ``k``'s vector, read on split ``k``'s set) and ``null``
        ``[n_null, K, n_inj, B]`` (each null read on the same sets).

    Raises
    ------
    TypeError, ValueError
        As :func:`word_sets` and :func:`set_readout`.
    """
    sc = result.scalars
    inj = concept if direction_concept is None else direction_concept
    if inj not in sc["concepts"]:
        raise ValueError(f"unknown concept {inj!r}; this Result has {sc['concepts']}")
    K = np.asarray(result.arrays["splits"]).shape[0]
    n_c = len(sc["concepts"])
    row0 = sc["concepts"].index(inj) * K
    own, null = [], []
    for k, w in enumerate(word_sets(result, concept, which)):
        r = set_readout(result, w, scale)
        own.append(r[row0 + k])
        null.append(r[n_c * K:])
    return np.stack(own), np.stack(null, axis=1)


def heldout_test(own, null, n_boot: int = 1000, level: float = 0.95, alpha: float = 0.05,
                 seed: int = 0) -> dict:
    """Per-layer rank p-values, the max-statistic window and crossed-bootstrap intervals.

    The statistic of a direction at a layer is its readout averaged over splits and prompts.

    Parameters
    ----------
    own : array_like, shape ``[K, n_inj, B]``
    null : array_like, shape ``[n_null, K, n_inj, B]``
        From :func:`readout_cube`.
    n_boot, level : int, float
        Resamples and level of the intervals (prompts x splits x nulls resampled).
    alpha : float, default 0.05
        The family-wise level of the window.
    seed : int, default 0

    Returns
    -------
    dict
        ``effect`` ``[n_inj]`` (concept minus null mean) with ``effect_lo``, ``effect_hi``;
        ``p`` (rank, per layer), ``p_fwer`` (max-statistic), ``window`` (bool ``[n_inj]``,
        ``p_fwer <= alpha``), ``first``, ``last`` (grid indices, -1 if empty) with bootstrap
        intervals ``first_ci``, ``last_ci`` (NaN where empty), ``p_empty``, and ``mde80``
        ``[n_inj]``: the smallest effect detected per layer with probability about 0.8 (the
        null's 95% quantile above its mean plus 0.84 bootstrap sd of the concept statistic).

    Raises
    ------
    TypeError, ValueError
        Non-real input or shapes that do not match.
    """
    from companion._validation import as_float64, check_real
    from companion.theory.bootstrap import crossed_bootstrap, maxstat_pvalues, rank_pvalue

    x, y = as_float64(own, "own"), as_float64(null, "null")
    if x.ndim != 3 or y.ndim != 4 or y.shape[1:] != x.shape or y.shape[0] < 19:
        raise ValueError(f"own [K, n_inj, B] and null [n_null >= 19, K, n_inj, B] do not fit: "
                         f"{x.shape}, {y.shape}")
    alpha = check_real(alpha, "alpha", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    K, n_inj, B = x.shape
    n_null = y.shape[0]

    def stats(b, k, j):
        return np.concatenate([x[k][:, :, b].mean((0, 2))[None], y[j][:, k][:, :, :, b].mean((1, 3))])

    T = stats(np.arange(B), np.arange(K), np.arange(n_null))                  # [1 + n_null, n_inj]
    p = rank_pvalue(T[0], T[1:])
    p_fwer = maxstat_pvalues(T)
    win = p_fwer <= alpha
    lay = np.arange(n_inj)

    def boot(b, k, j):
        t = stats(b, k, j)
        w = maxstat_pvalues(t) <= alpha
        first = lay[w][0] if w.any() else np.nan
        last = lay[w][-1] if w.any() else np.nan
        return np.concatenate([t[0] - t[1:].mean(0), [first, last, float(w.any())], t[0]])

    est, lo, hi, boots = crossed_bootstrap(boot, [B, K, n_null], n_boot=n_boot, level=level,
                                           rng=seed, return_boots=True)
    gen = np.random.default_rng(seed)
    sd_T = np.stack([x[gen.integers(0, K, K)][:, :, gen.integers(0, B, B)].mean((0, 2))
                     for _ in range(n_boot)]).std(0)
    mde = np.quantile(T[1:], 0.95, axis=0) - T[1:].mean(0) + 0.8416 * sd_T
    any_ = float(boots[:, n_inj + 2].mean())
    return dict(effect=est[:n_inj], effect_lo=lo[:n_inj], effect_hi=hi[:n_inj], p=p, p_fwer=p_fwer,
                window=win, first=int(lay[win][0]) if win.any() else -1,
                last=int(lay[win][-1]) if win.any() else -1,
                first_ci=(lo[n_inj], hi[n_inj]), last_ci=(lo[n_inj + 1], hi[n_inj + 1]),
                p_empty=1 - any_, mde80=mde, stat=T[0], null_mean=T[1:].mean(0))



def specificity(result, scale: float = 0.5, which: str = "heldout", layers=None,
                n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """The cross-concept matrix: concept ``i``'s split vectors read on concept ``j``'s words.

    Entry ``[i, j]`` is the readout of ``j``'s word sets under ``i``'s split vectors minus the
    null mean, averaged over splits, prompts and the chosen layers; intervals resample prompts,
    splits (each re-estimates the vector) and null directions.

    Parameters
    ----------
    result : Result
    scale : float, default 0.5
    which : str, default "heldout"
        As in :func:`word_sets`.
    layers : sequence of int, optional
        Injection layers averaged over (default: every tested layer below L).
    n_boot, level, seed
        Of the crossed bootstrap.

    Returns
    -------
    dict
        ``concepts``, ``layers``, ``effect``, ``lo``, ``hi`` (each ``[C, C]``).

    Raises
    ------
    TypeError, ValueError
        As :func:`readout_cube`; a layer not tested.
    """
    from companion.theory.bootstrap import crossed_bootstrap

    sc = result.scalars
    lay = np.asarray(result.arrays["layers"]).astype(int).tolist()
    L = int(sc["n_layers"])
    pick = [x for x in lay if x < L] if layers is None else [int(x) for x in layers]
    if not pick or any(x not in lay for x in pick):
        raise ValueError(f"layers must be tested layers among {lay}, got {layers!r}")
    j_l = [lay.index(x) for x in pick]
    names = sc["concepts"]
    cubes = [[readout_cube(result, r, which, scale, direction_concept=i) for r in names] for i in names]
    own = np.stack([[c[0][:, j_l] for c in row] for row in cubes])          # [C, C, K, n, B]
    null = np.stack([[c[1][:, :, j_l] for c in row] for row in cubes])      # [C, C, N, K, n, B]

    def stat(b, k, j):
        o = own[:, :, k][..., b].mean((2, 3, 4))
        return o - null[:, :, j][:, :, :, k][..., b].mean((2, 3, 4, 5))

    B, K, N = own.shape[-1], own.shape[2], null.shape[2]
    est, lo, hi = crossed_bootstrap(stat, [B, K, N], n_boot=n_boot, level=level, rng=seed)
    return dict(concepts=list(names), layers=pick, effect=est, lo=lo, hi=hi)


def final_summary(result, key: str, scale: float = 0.5, group: str = "null",
                  n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """A per-run quantity (disruption, or final-layer geometry) per layer, with crossed intervals.

    Parameters
    ----------
    result : Result
    key : {"effect", "rel_inj", "rel_last", "cos_inj", "cos_last"}
    scale : float, default 0.5
    group : {"null", "concept"}, default "null"
        The isotropic nulls or every concept's split vectors.
    n_boot, level, seed
        Of the bootstrap over prompts and directions.

    Returns
    -------
    dict
        ``layers``, ``mean``, ``lo``, ``hi`` (each ``[n_inj]``).

    Raises
    ------
    TypeError, ValueError
        An unknown key, group or scale.
    """
    from companion.experiments import check_result
    from companion.theory.bootstrap import crossed_bootstrap

    check_result(result, "injection_heldout")
    if key not in ("effect", "rel_inj", "rel_last", "cos_inj", "cos_last"):
        raise ValueError(f"unknown key {key!r}")
    if group not in ("null", "concept"):
        raise ValueError(f"group must be 'null' or 'concept', got {group!r}")
    a, sc = result.arrays, result.scalars
    scales = np.asarray(a["scales"]).tolist()
    if scale not in scales:
        raise ValueError(f"scale must be one of {scales}, got {scale}")
    n_c = len(sc["concepts"]) * np.asarray(a["splits"]).shape[0]
    x = np.asarray(a[key][:, :, scales.index(scale)], np.float64)         # [n_dir, n_inj, B]
    x = x[n_c:] if group == "null" else x[:n_c]
    est, lo, hi = crossed_bootstrap(lambda d, b: x[d][:, :, b].mean((0, 2)), [x.shape[0], x.shape[2]],
                                    n_boot=n_boot, level=level, rng=seed)
    return dict(layers=np.asarray(a["layers"]).astype(int), mean=est, lo=lo, hi=hi)
