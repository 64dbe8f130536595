"""Experiment ``injection_success``: does an injected concept reach the output, above chance?

Default config: SmolLM2-135M; :data:`CONFIGS` adds MiniLM-L6.  Four direction groups (concept
vectors, random unit vectors, ``split`` nulls from random halves of a concept's word pool,
``subspace`` nulls in the top principal subspace) are injected at every layer with
:math:`\\alpha\\, s_\\ell\\, \\hat v_\\ell` (:func:`readout_sweep`; :math:`s_\\ell` the centred
spread), measuring the output *effect* (next-token KL at the last token, or :math:`1-\\cos` of an
encoder's sentence embedding) and each concept's *readout* (the change of
:math:`\\log P(\\text{concept})` at the last and the later tokens, or of the cosine to the
concept's mean embedding).  Result arrays (group ``G``): ``<G>_effect`` ``[n_dir, n_inj, S, B]``,
``<G>_readout`` ``[n_dir, n_inj, S, C, P, B]``, ``<G>_token_sd``, ``<G>_scales``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from companion._validation import as_float64, check_int, check_real, real_array
from companion.experiments import check_result, register
from companion.experiments._common import bar, check_fields, concept_units, model_and_prompts, model_facts
from companion.experiments.injection_window import scale_index

__all__ = ["InjectionSuccessExperiment", "CONFIGS", "GROUPS", "NULL_GROUPS", "concept_targets",
           "readout_sweep", "success_test", "SuccessWindow", "success_table", "success_window",
           "effect_curve", "regimes", "REGIME_THRESHOLDS"]

#: The direction groups of a Result, in order.
GROUPS = ("concept", "random", "split", "subspace")
#: The groups that serve as nulls for the concept vectors.
NULL_GROUPS = ("random", "split", "subspace")
#: Thresholds on :math:`r = E(\alpha_{i+1})/E(\alpha_i)` for a magnitude step of 4 (the
#: quadratic law predicts 16): ``linear`` if ``r >= 10`` (local exponent >= 1.66),
#: ``saturated`` if ``r < 6`` (exponent < 1.29), ``transition`` in between.
REGIME_THRESHOLDS = (6.0, 10.0)


@register("injection_success", schema=1)
@dataclass(frozen=True)
class InjectionSuccessExperiment:
    """Concept, random and null directions injected per layer: output readout of each concept.

    ``n_prompts``, ``min_words``, ``max_words``, ``max_length`` and ``layers`` are as in
    :class:`~companion.experiments.injection_window.InjectionWindowExperiment`.
    """

    model: str = "smollm2-135m"  #: a name for :func:`companion.transformers.models.load`
    n_prompts: int = 32
    min_words: int = 6
    max_words: int = 11
    max_length: int = 64
    layers: tuple[int, ...] = (0, 1, 2, 3, 5, 8, 11, 14, 17, 20, 23, 26, 29, 30)
    #: word concepts of :data:`companion.injection.directions.CONCEPTS` (at least one)
    concepts: tuple[str, ...] = ("sea", "fire", "music", "food")
    #: increasing magnitudes :math:`\alpha` (units of :math:`s_\ell`) of the concept and random groups
    scales: tuple[float, ...] = (0.125, 0.5, 2.0)
    null_scale: float = 0.5  #: magnitude of the split and subspace nulls; one of ``scales``
    n_random: int = 16  #: random directions (>= 2)
    n_split: int = 8  #: split nulls (may be 0)
    n_subspace: int = 8  #: subspace nulls (may be 0)
    subspace_k: int = 16  #: dimension of the principal subspace of the subspace nulls
    seed: int = 0  #: seed of every random choice (directions, splits)
    dtype: str = "float32"
    max_batch_tokens: int = 16384  #: memory bound of :func:`companion.injection.engine.sweep_injections`

    def validate(self) -> None:
        """Check the fields that do not need the model.

        Raises
        ------
        ValueError
            A count too small (a bootstrap and a null need two prompts and two random
            directions), bad concepts, scales, ``null_scale`` or layers.
        """
        check_fields(self, {"subspace_k": 1, "n_prompts": 2, "n_random": 2, "n_split": 0,
                            "n_subspace": 0}, word_concepts=True)
        if not self.concepts:
            raise ValueError("concepts must name at least one word concept")
        if not self.scales or any(not (math.isfinite(s) and s > 0) for s in self.scales):
            raise ValueError(f"scales must be finite and > 0 (at least one), got {self.scales}")
        if list(self.scales) != sorted(set(self.scales)):
            raise ValueError(f"scales must be strictly increasing, got {self.scales}")
        if self.null_scale not in self.scales:
            raise ValueError(f"null_scale must be one of scales {self.scales}, got {self.null_scale}")

    def compute(self, device, progress):
        """Run the experiment (see the module docstring); returns the Result's arrays and scalars."""
        from companion.injection import directions as dr

        m, layers, prompts, base = model_and_prompts(self, device)
        L, d = m.n_layers, m.d_model
        norms = dr.typical_norms(base, prompts.injected)
        spreads = dr.typical_spreads(base, prompts.injected)
        mu = dr.stream_means(base, prompts.injected)
        sel = base.detach().to("cpu").double().numpy()[:, prompts.injected.numpy()]  # [L+1, N, d]
        gen = np.random.default_rng(self.seed)

        c_units, concept_norm = concept_units(m, self.concepts, self.max_length)
        units = {"concept": np.stack(c_units)}  # [n_dir, L+1, d]
        rand = dr.random_unit_vectors(d, self.n_random, gen)
        units["random"] = np.broadcast_to(rand[:, None, :], (self.n_random, L + 1, d))
        split_pool = np.arange(self.n_split) % len(self.concepts)
        if self.n_split:
            nulls = np.empty((self.n_split, L + 1, d))
            for i, name in enumerate(self.concepts):
                js = np.nonzero(split_pool == i)[0]
                if js.size:
                    v = dr.split_null_vectors(m, name, int(js.size), gen,
                                              max_length=self.max_length)
                    nulls[js] = np.moveaxis(v, 1, 0)
            units["split"] = nulls
        if self.n_subspace:
            v = dr.subspace_random_vectors(base, prompts.injected, self.subspace_k,
                                           self.n_subspace, gen)
            units["subspace"] = np.moveaxis(v, 1, 0)
        del base

        targets = concept_targets(m, self.concepts, self.max_length)
        out: dict = {}
        group_names = [g for g in GROUPS if g in units]
        scales = {g: list(self.scales) if g in ("concept", "random") else [self.null_scale]
                  for g in group_names}
        effect_name = readout_positions = None
        items = bar([(g, j) for g in group_names for j in range(units[g].shape[0])], progress,
                     f"injection_success {m.name}", "direction")
        effects = {g: [] for g in group_names}
        readouts = {g: [] for g in group_names}
        for g, j in items:
            res = readout_sweep(m, prompts, layers, units[g][j][layers], scales[g], spreads,
                                targets, max_batch_tokens=self.max_batch_tokens)
            effects[g].append(res["effect"])
            readouts[g].append(res["readout"])
            effect_name, readout_positions = res["effect_name"], res["readout_positions"]
        for g in group_names:
            out[f"{g}_effect"] = np.stack(effects[g])
            out[f"{g}_readout"] = np.stack(readouts[g]).astype(np.float64)
            proj = np.einsum("lnd,jld->jln", sel, units[g])  # token states along each direction
            out[f"{g}_token_sd"] = proj.std(axis=-1)
            out[f"{g}_scales"] = np.asarray(scales[g], dtype=np.float64)
        out.update(
            layers=np.asarray(layers), typical_norm=norms, typical_spread=spreads, stream_mean=mu,
            concept_norm=concept_norm, split_pool=split_pool,
            groups=group_names, concepts=list(self.concepts), effect_name=effect_name,
            readout_positions=list(readout_positions), n_prompts=prompts.batch, **model_facts(m))
        return out


#: The runs: SmolLM2-135M (the default config) and MiniLM-L6 (every layer).
CONFIGS: dict[str, InjectionSuccessExperiment] = {
    "smollm2-135m": InjectionSuccessExperiment(),
    "minilm-l6": InjectionSuccessExperiment(model="minilm-l6", layers=()),
}


# ------------------------------------------------------------------------------ the measurement
def concept_targets(m, concepts, max_length: int | None = None) -> dict:
    """What the readout of each concept compares with at the output.

    Parameters
    ----------
    m : LoadedModel
    concepts : sequence of str
        Word concepts of :data:`companion.injection.directions.CONCEPTS`.
    max_length : int or None

    Returns
    -------
    dict
        Causal LM: ``{"kind": "tokens", "ids": [token ids per concept]}``; encoder:
        ``{"kind": "embedding", "centres": [C, d]}`` (mean-pooled final states of the positive texts).

    Raises
    ------
    TypeError, ValueError
        Not a loaded model or a sequence of names; an unknown concept.
    """
    import torch

    from companion.injection import directions as dr
    from companion.transformers import models
    from companion.transformers import stream

    models.check_model(m)
    if isinstance(concepts, str) or not concepts:
        raise TypeError(f"concepts must be a non-empty sequence of names, got {concepts!r}")
    if m.kind == "causal-lm":
        return {"kind": "tokens", "ids": [dr.concept_token_ids(m, c) for c in concepts]}
    centres = []
    for c in concepts:
        if c not in dr.CONCEPTS:
            raise ValueError(f"unknown concept {c!r}; choose from {sorted(dr.CONCEPTS)}")
        texts = dr.CONCEPTS[c].texts()[0]
        enc = models.tokenize(m, texts, max_length)
        h = stream.residual_stream(m, enc)[-1].to("cpu", torch.float64)
        w = enc["attention_mask"].to("cpu", torch.float64)
        e = (h * w[..., None]).sum(1) / w.sum(1)[:, None]
        centres.append(e.mean(0).numpy())
    return {"kind": "embedding", "centres": np.stack(centres)}


def readout_sweep(m, prompts, layers, directions, scales, unit, targets,
                  max_batch_tokens: int = 16384) -> dict:
    r"""Inject :math:`\alpha\,u_\ell\,\hat v_\ell` at each layer and magnitude; read the output.

    Parameters
    ----------
    m : LoadedModel
    prompts : companion.injection.directions.InjectionPrompts
    layers : sequence of int
        Injection layers, strictly increasing.
    directions : array_like, shape ``[n_inj, d]``
        One direction per injection layer (normalised here).
    scales : sequence of float
        Magnitudes :math:`\alpha` (> 0).
    unit : array_like, shape ``[L+1]``
        The magnitude unit per layer (e.g. the centred spread :math:`s_\ell`).
    targets : dict
        From :func:`concept_targets` for the same model.
    max_batch_tokens : int, default 16384

    Returns
    -------
    dict
        ``effect`` ``[n_inj, S, B]``, ``readout`` ``[n_inj, S, C, P, B]`` (see the module
        docstring), ``effect_name``, ``readout_positions``.

    Raises
    ------
    TypeError, ValueError
        Wrong types; shapes that do not fit the model, non-positive scales or units, wrong targets.

    Examples
    --------
    >>> r = readout_sweep(m, p, [3], v[None], [0.5], spreads, concept_targets(m, ["sea"]))  # doctest: +SKIP
    >>> r["readout"].shape                                                                # doctest: +SKIP
    (1, 1, 1, 2, 4)
    """
    import torch

    from companion.injection.directions import InjectionPrompts
    from companion.injection.engine import sweep_injections
    from companion.injection.metrics import next_token_kl
    from companion.transformers.models import check_model
    from companion.transformers.readout import logits_from_residual

    check_model(m)
    if not isinstance(prompts, InjectionPrompts):
        raise TypeError(f"prompts must come from make_prompts, got {type(prompts).__name__}")
    L, d = m.n_layers, m.d_model
    lay = [int(x) for x in layers]
    dirs = real_array("directions", directions)
    if dirs.shape != (len(lay), d):
        raise ValueError(f"directions must have shape {(len(lay), d)}, got {dirs.shape}")
    norm = np.linalg.norm(dirs, axis=1, keepdims=True)
    if np.any(norm == 0):
        raise ValueError("directions must be non-zero")
    dirs = dirs / norm
    sc = real_array("scales", scales, min_ndim=1)
    if sc.ndim != 1 or sc.size == 0 or np.any(sc <= 0):
        raise ValueError(f"scales must be a non-empty list of positive numbers, got {scales!r}")
    u = real_array("unit", unit)
    if u.shape != (L + 1,) or np.any(u <= 0):
        raise ValueError(f"unit must be {L + 1} positive numbers, got shape {u.shape}")
    if not isinstance(targets, dict) or "kind" not in targets:
        raise TypeError("targets must come from concept_targets")
    causal = m.kind == "causal-lm"
    if (targets["kind"] == "tokens") != causal:
        raise ValueError(f"targets of kind {targets['kind']!r} do not fit {m.name} ({m.kind})")

    B = prompts.batch
    mask = prompts.encoding["attention_mask"].to("cpu", torch.float64)
    if causal:
        ids = [torch.as_tensor(np.asarray(t), dtype=torch.long) for t in targets["ids"]]
        C, P = len(ids), 2
        later = prompts.later
        rows_b = torch.nonzero(later)[:, 0]                        # prompt of each later row
        count = later.sum(1).to(torch.float64)
        is_last = prompts.last[later]                              # [n_rows] bool

        def logp(h_rows):                                          # [n, d] -> [n, V] float64
            z = logits_from_residual(m, h_rows.to(torch.float32)).double()
            return torch.log_softmax(z, -1)

        def concept_lse(lp):                                       # [n, V] -> [n, C]
            return torch.stack([torch.logsumexp(lp[:, i], -1) for i in ids], -1)
    else:
        centres = torch.as_tensor(np.asarray(targets["centres"]), dtype=torch.float64)
        C, P = centres.shape[0], 1

        def embed(h):                                              # [K, B, T, d] -> [K, B, d]
            h = h.detach().to("cpu", torch.float64)
            return (h * mask[None, :, :, None]).sum(2) / mask.sum(1)[None, :, None]

        def cos_c(e):                                              # [..., d] -> [..., C]
            return torch.nn.functional.cosine_similarity(e[..., None, :], centres, dim=-1)

    width = 1 + C * P
    state: dict = {}

    def measure(h_inj, h_base, layer, conditions):
        K = h_inj.shape[0]
        if layer != L:
            return torch.zeros(K, B, width, dtype=torch.float64)
        if "base" not in state:                                    # the baseline, once
            if causal:
                lp = logp(h_base[later])
                state["base"] = (lp[is_last], concept_lse(lp))
            else:
                e = embed(h_base[None])[0]
                state["base"] = (e, cos_c(e))
        res = torch.empty(K, B, width, dtype=torch.float64)
        for k in range(K):
            if causal:
                lp = logp(h_inj[k][later])
                lp_last_b, lse_b = state["base"]
                res[k, :, 0] = torch.from_numpy(next_token_kl(lp_last_b, lp[is_last]))
                delta = concept_lse(lp) - lse_b                     # [n_rows, C]
                res[k, :, 1:1 + C] = delta[is_last]
                mean_later = torch.zeros(B, C, dtype=torch.float64).index_add_(0, rows_b, delta)
                res[k, :, 1 + C:] = mean_later / count[:, None]
            else:
                e = embed(h_inj[k:k + 1])[0]
                e_b, cos_b = state["base"]
                res[k, :, 0] = 1 - torch.nn.functional.cosine_similarity(e, e_b, dim=-1)
                res[k, :, 1:] = cos_c(e) - cos_b
        return res

    vecs = torch.from_numpy(u[lay][:, None] * dirs)
    sw = sweep_injections(m, prompts.encoding, lay, vecs, scale=list(sc), positions=prompts.injected,
                         measure=measure, max_batch_tokens=max_batch_tokens)
    got = sw.injected[:, :, L].to(torch.float64).numpy()         # [n_inj, S, B, width]
    effect = got[..., 0]
    readout = got[..., 1:].reshape(len(lay), sc.size, B, P, C)     # causal: [last C | later C]
    readout = readout.transpose(0, 1, 4, 3, 2)                     # [n_inj, S, C, P, B]
    return {
        "effect": effect, "readout": readout,
        "effect_name": "kl_last" if causal else "embedding_change",
        "readout_positions": ("last", "later") if causal else ("embedding",)}


# ------------------------------------------------------------------------------ reading Results
def _boot_args(level, n_boot, seed) -> tuple:
    """``level``, ``n_boot``, ``seed`` checked as the bootstrap readers need them."""
    return (check_real(level, "level", lo=0.0, lo_open=True, hi=1.0, hi_open=True),
            check_int(n_boot, "n_boot", 10), check_int(seed, "seed", 0))


def _group(result, group: str, null: bool = False) -> None:
    """Check that ``result`` is an ``injection_success`` Result with the group (a null group if ``null``)."""
    check_result(result, "injection_success")
    if null and group not in NULL_GROUPS:
        raise ValueError(f"null must be one of {NULL_GROUPS}, got {group!r}")
    if group not in result.scalars["groups"]:
        raise ValueError(f"unknown group {group!r}; this Result has {result.scalars['groups']}")


def _readout(result, group: str, concept: str, position: str, scale) -> np.ndarray:
    """Readout of ``concept`` under every direction of ``group``: ``[n_dir, n_inj, B]``."""
    _group(result, group)
    sc = result.scalars
    if concept not in sc["concepts"]:
        raise ValueError(f"unknown concept {concept!r}; this Result has {sc['concepts']}")
    positions = sc["readout_positions"]
    position = positions[0] if position is None else position
    if position not in positions:
        raise ValueError(f"position must be one of {positions}, got {position!r}")
    s = scale_index(result, group, scale)
    r = result.arrays[f"{group}_readout"]
    return r[:, :, s, sc["concepts"].index(concept), positions.index(position)]


def success_test(concept_values, null_values, level: float = 0.95, quantile: float = 0.95,
                 n_boot: int = 1000, seed: int = 0) -> dict:
    r"""Does a readout under the concept vector beat the same readout under null directions?

    Parameters
    ----------
    concept_values : array_like, shape ``[B]``
        The concept's readout per prompt under its own concept vector.
    null_values : array_like, shape ``[n_null, B]``
        The same readout under each of ``n_null >= 2`` null directions of the same magnitude.
    level : float, default 0.95
        Level of the bootstrap interval.
    quantile : float, default 0.95
        The null's quantile the concept must exceed.
    n_boot, seed : int, default 1000, 0

    Returns
    -------
    dict
        ``concept_mean``, ``null_mean``, ``null_q`` (the null means' ``quantile``), ``diff`` (the
        paired mean difference), ``diff_lo``, ``diff_hi`` (its bootstrap interval) and ``success``:
        ``concept_mean > null_q`` and ``diff_lo > 0``.

    Raises
    ------
    TypeError, ValueError
        Non-real inputs; bad shapes (fewer than 2 prompts or nulls), NaN, a level outside (0, 1).

    Examples
    --------
    >>> nulls = np.random.default_rng(0).normal(0, 1, (16, 32))
    >>> success_test(nulls[0] + 2.0, nulls[1:])["success"], success_test(nulls[0], nulls[1:])["success"]
    (True, False)
    """
    from companion.theory.bootstrap import bootstrap_interval

    x = as_float64(concept_values, "concept_values")
    y = as_float64(null_values, "null_values")
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"concept_values must have shape [B] with B >= 2, got {x.shape}")
    if y.ndim != 2 or y.shape[1] != x.size or y.shape[0] < 2:
        raise ValueError(f"null_values must have shape [n_null >= 2, {x.size}], got {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("the readouts contain NaN or infinite values")
    check_real(quantile, "quantile", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    level, n_boot, seed = _boot_args(level, n_boot, seed)
    q = float(np.quantile(y.mean(1), quantile))
    diff, lo, hi = bootstrap_interval(x - y.mean(0), level=level, n_boot=n_boot,
                                      rng=np.random.default_rng(seed))
    xc = float(x.mean())
    return dict(concept_mean=xc, null_mean=float(y.mean()), null_q=q, diff=float(diff),
                diff_lo=float(lo), diff_hi=float(hi), success=bool(xc > q and lo > 0))


def success_table(result, null: str = "random", position: str | None = None,
                  level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """The success test of every concept at every injection layer and magnitude of a null group.

    Parameters
    ----------
    result : Result
        Of the ``injection_success`` experiment (so for every reader below).
    null : {"random", "split", "subspace"}, default "random"
        The null group; the magnitudes tested are those it ran.
    position : str, optional
        A readout position of the Result (``"last"``, ``"later"`` or ``"embedding"``); default the first.
    level, n_boot, seed
        As in :func:`success_test`.

    Returns
    -------
    list of dict
        One row per (concept, layer, scale): ``concept``, ``layer``, ``fraction`` (layer / L),
        ``scale``, ``null``, ``position`` and the keys of :func:`success_test`.

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; an unknown null group or position.

    Examples
    --------
    >>> rows = success_table(stored[0])                    # doctest: +SKIP
    >>> sum(r["success"] for r in rows)                   # doctest: +SKIP
    """
    _group(result, null, null=True)
    sc, a = result.scalars, result.arrays
    L = int(sc["n_layers"])
    rows = []
    for ci, concept in enumerate(sc["concepts"]):
        for scale in np.asarray(a[f"{null}_scales"]).tolist():
            own = _readout(result, "concept", concept, position, scale)[ci]   # [n_inj, B]
            nul = _readout(result, null, concept, position, scale)           # [n, n_inj, B]
            for j, layer in enumerate(np.asarray(a["layers"]).tolist()):
                t = success_test(own[j], nul[:, j], level=level, n_boot=n_boot, seed=seed)
                rows.append(dict(concept=concept, layer=int(layer), fraction=layer / L,
                                 scale=float(scale), null=null,
                                 position=position or sc["readout_positions"][0], **t))
    return rows


@dataclass(frozen=True)
class SuccessWindow:
    """The injection layers where a concept's readout succeeds, with bootstrap edges."""

    concept: str
    null: str
    position: str
    scale: float
    n_layers: int
    layers: np.ndarray  #: injection layers where :func:`success_test` succeeds (possibly empty)
    first: int | None  #: smallest of ``layers`` (``None`` if empty)
    last: int | None  #: largest of ``layers`` (``None`` if empty)
    first_ci: tuple  #: bootstrap interval of ``first`` over prompt resamples (NaN if none succeeds)
    last_ci: tuple  #: bootstrap interval of ``last``
    p_empty: float  #: fraction of resamples in which no layer succeeds
    n_boot: int


def success_window(result, concept: str, scale: float = 0.5, null: str = "random",
                   position: str | None = None, level: float = 0.95, n_boot: int = 1000,
                   seed: int = 0) -> SuccessWindow:
    """The success window of one concept: where its readout beats the null, with edge intervals.

    The window (not necessarily contiguous) is the layers that pass :func:`success_test`; the edge
    intervals resample prompts (paired) and use only its ``concept_mean > null_q`` criterion.

    Parameters
    ----------
    result : Result
    concept : str
    scale : float, default 0.5
        A magnitude run by both the concept and the ``null`` group.
    null, position, level, n_boot, seed
        As in :func:`success_table`.

    Returns
    -------
    SuccessWindow

    Raises
    ------
    TypeError, ValueError
        As :func:`success_table`; an unknown concept or a scale not run.

    Examples
    --------
    >>> w = success_window(stored[0], "sea")              # doctest: +SKIP
    >>> w.first, w.last, w.last_ci                        # doctest: +SKIP
    """
    _group(result, null, null=True)
    level, n_boot, seed = _boot_args(level, n_boot, seed)
    sc, a = result.scalars, result.arrays
    ci = sc["concepts"].index(concept) if concept in sc["concepts"] else None
    own = _readout(result, "concept", concept, position, scale)[ci]          # [n_inj, B]
    nul = _readout(result, null, concept, position, scale)                  # [n, n_inj, B]
    if nul.shape[0] < 2:
        raise ValueError(f"the {null} group has {nul.shape[0]} direction(s); a null needs two")
    lay = np.asarray(a["layers"]).astype(int)
    ok = np.array([success_test(own[j], nul[:, j], level=level, n_boot=n_boot,
                                seed=seed)["success"] for j in range(lay.size)])
    gen = np.random.default_rng(seed)
    B = own.shape[-1]
    idx = gen.integers(0, B, size=(n_boot, B))
    xc = own[:, idx].mean(-1)                                                # [n_inj, n_boot]
    xn = nul[:, :, idx].mean(-1)                                             # [n, n_inj, n_boot]
    succ = xc > np.quantile(xn, 0.95, axis=0)                                # [n_inj, n_boot]
    any_ = succ.any(0)
    qs = [(1 - level) / 2, (1 + level) / 2]
    if any_.any():
        firsts = lay[np.argmax(succ[:, any_], axis=0)]
        lasts = lay[lay.size - 1 - np.argmax(succ[::-1, any_], axis=0)]
        first_ci = tuple(float(x) for x in np.quantile(firsts, qs))
        last_ci = tuple(float(x) for x in np.quantile(lasts, qs))
    else:
        first_ci = last_ci = (float("nan"), float("nan"))
    win = lay[ok]
    return SuccessWindow(
        concept=concept, null=null, position=position or sc["readout_positions"][0],
        scale=float(scale), n_layers=int(sc["n_layers"]), layers=win,
        first=int(win[0]) if win.size else None, last=int(win[-1]) if win.size else None,
        first_ci=first_ci, last_ci=last_ci, p_empty=float(1 - any_.mean()), n_boot=n_boot)


def effect_curve(result, group: str = "random", scale: float = 0.5, direction: int | None = None,
                 level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> dict:
    """The output effect (disruption) per injection layer, with a bootstrap band.

    Parameters
    ----------
    result : Result
    group : str, default "random"
        A direction group of the Result.
    scale : float, default 0.5
        A magnitude the group ran.
    direction : int or None
        One direction of the group (a band over prompts), or ``None``: the mean over its
        directions (a band over prompts and directions, resampled independently).
    level, n_boot, seed
        As in :func:`success_test`.

    Returns
    -------
    dict
        ``layers``, ``fraction`` (layer / L), ``mean``, ``lo``, ``hi`` (each ``[n_inj]``),
        ``effect_name``.

    Raises
    ------
    TypeError, ValueError
        Wrong types or another experiment's Result; an unknown group, scale or direction.

    Examples
    --------
    >>> c = effect_curve(stored[0], "random", 0.5)        # doctest: +SKIP
    """
    _group(result, group)
    level, n_boot, seed = _boot_args(level, n_boot, seed)
    s = scale_index(result, group, scale)
    e = result.arrays[f"{group}_effect"][:, :, s]                           # [n_dir, n_inj, B]
    if direction is not None:
        direction = check_int(direction, "direction", 0)
        if direction >= e.shape[0]:
            raise ValueError(f"direction must be < {e.shape[0]}, got {direction}")
        e = e[direction:direction + 1]
    gen = np.random.default_rng(seed)
    n_dir, _, B = e.shape
    pi = gen.integers(0, B, size=(n_boot, B))
    di = gen.integers(0, n_dir, size=(n_boot, n_dir)) if n_dir > 1 else np.zeros((n_boot, 1), int)
    per_dir = e[:, :, pi].mean(-1)                                          # [n_dir, n_inj, n_boot]
    boots = np.take_along_axis(per_dir, di.T[:, None, :], axis=0).mean(0)   # [n_inj, n_boot]
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=1)
    lay = np.asarray(result.arrays["layers"]).astype(int)
    return dict(layers=lay, fraction=lay / int(result.scalars["n_layers"]), mean=e.mean(axis=(0, 2)),
                lo=lo, hi=hi, effect_name=result.scalars["effect_name"])


def regimes(result, group: str = "random", thresholds=REGIME_THRESHOLDS) -> dict:
    r"""Linear or saturated: the quadratic law checked per injection layer and magnitude.

    Parameters
    ----------
    result : Result
    group : str, default "random"
        A group that ran several magnitudes (``concept`` or ``random``).
    thresholds : (float, float), default :data:`REGIME_THRESHOLDS`
        ``(low, high)`` on the ratio of consecutive effects, for a magnitude step ``k`` the
        quadratic law predicts ``k**2``; the thresholds are stated for ``k = 4`` and scaled
        as ``k**2 / 16`` for another step.

    Returns
    -------
    dict
        ``layers``, ``scales``, ``ratio`` ``[n_inj, S - 1]`` (consecutive mean effects),
        ``expected`` (the quadratic law's ratios) and ``regime`` ``[n_inj, S]``: ``"linear"``
        (ratio >= high), ``"saturated"`` (< low), ``"transition"``, ``"undetermined"`` (first
        magnitude, not linear) or ``"no effect"`` (effect 0).

    Raises
    ------
    TypeError, ValueError
        Another experiment's Result; an unknown group, one magnitude, not ``0 < low <= high``.

    Examples
    --------
    >>> regimes(stored[0])["regime"][3]                   # doctest: +SKIP
    """
    _group(result, group)
    try:
        low, high = (float(t) for t in thresholds)
    except (TypeError, ValueError):
        raise TypeError(f"thresholds must be two numbers, got {thresholds!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"thresholds must satisfy 0 < low <= high, got {thresholds!r}")
    scales = np.asarray(result.arrays[f"{group}_scales"], dtype=np.float64)
    if scales.size < 2:
        raise ValueError(f"the {group} group ran one magnitude; the regime needs two or more")
    e = result.arrays[f"{group}_effect"].mean(axis=(0, 3))                  # [n_inj, S]
    expected = (scales[1:] / scales[:-1]) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = e[:, 1:] / e[:, :-1]
    lo_t, hi_t = low * expected / 16, high * expected / 16
    reg = np.empty(e.shape, dtype=object)
    for j in range(e.shape[0]):
        for i in range(scales.size):
            if e[j, i] == 0:
                reg[j, i] = "no effect"
            elif i == 0:
                reg[j, i] = "linear" if ratio[j, 0] >= hi_t[0] else "undetermined"
            else:
                r = ratio[j, i - 1]
                reg[j, i] = "linear" if r >= hi_t[i - 1] else "saturated" if r < lo_t[i - 1] else "transition"
    return dict(layers=np.asarray(result.arrays["layers"]).astype(int), scales=scales,
                ratio=ratio, expected=expected, regime=reg.astype(str))
