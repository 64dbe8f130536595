r"""Experiment ``injection_report``: does an instruct model *report* an injected concept?

The behavioural protocol of Hahami et al. (arXiv:2512.12411) on a chat model, scored by the
next-token log-probabilities of the answer options (no free generation).  Three tasks:

* **localisation** -- ``k`` numbered sentences, the vector added over the tokens of one of them;
  "which sentence felt different?"; answer ``"1".."k"``; chance exactly ``1/k`` (each sentence set
  is shown once with every target, so a model that ignores the injection is right once in ``k``);
* **strength** -- two sentences, both injected, one at :math:`\alpha` and one at
  ``strength_ratio`` times :math:`\alpha`; "in which was it stronger?"; chance exactly ``1/2``
  (each pair is shown in both orders);
* **detection** -- one sentence injected; "do you detect an injected thought?" (Yes/No) beside a
  control question whose true answer is No, asked of the same injected stream: the shift of
  :math:`P(\text{Yes})` on the control question measures a "yes" bias.

Magnitudes are :math:`\alpha\, s_\ell` (``unit="spread"``; :math:`s_\ell` the centred spread,
:func:`companion.injection.directions.typical_spreads`) or raw coefficients of the unit vector
(``unit="raw"``, as in Hahami et al.).  Localisation and detection run through
:func:`companion.injection.engine.sweep_injections` (replay from the injected layer); strength,
which adds two magnitudes at once, through :func:`companion.transformers.stream.forward_states`.
Directions: the concept vectors of :data:`companion.injection.directions.CONCEPTS` and random unit
vectors of the same magnitude.  Result arrays (group ``G`` in ``concept``, ``random``):
``G_loc`` ``[n_dir, n_lay, S, n_loc, k]``, ``G_str`` ``[n_dir, n_lay, S, n_str, 2]``,
``G_det`` ``[n_dir, n_lay, S, n_det, 2, 2]`` (question detect/control, option Yes/No), all
log-probabilities; ``base_loc``, ``base_str``, ``base_det`` without injection; ``loc_target``,
``str_target``.  :func:`task_table` reads them with hierarchical intervals, exact binomial
p-values and Holm's correction over layers; :func:`min_detectable` is the design's power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from companion._validation import check_int, check_real, real_array
from companion.experiments import register
from companion.experiments._common import concept_units, load_model, model_facts

__all__ = ["InjectionReportExperiment", "CONFIGS", "GPU_CONFIG", "SENTENCES", "run_protocol",
           "accuracy_trials", "hierarchical_interval", "binomial_tail", "holm", "min_detectable",
           "task_table", "yes_probability", "raw_to_alpha"]

#: Short neutral sentences (written for this experiment), the trials' material.
SENTENCES = (
    "The bus left the station at noon.", "She folded the letter twice.",
    "A dog slept under the bench.", "The lamp on the desk was old.",
    "He painted the fence green.", "The train was ten minutes late.",
    "They counted the boxes again.", "A key hung beside the door.",
    "The clock in the hall had stopped.", "We walked to the end of the road.",
    "The printer ran out of paper.", "A bird landed on the roof.",
    "The chair by the window creaked.", "He wrote the date on the form.",
    "The shop closed early on Monday.", "Two cups stood on the shelf.",
    "The meeting moved to a larger room.", "She locked the car and left.",
    "The stairs led to a narrow hall.", "A map was pinned to the wall.",
)

_LOC = ("Here are {k} sentences.\n{lines}\nWhile you read them, one sentence may have felt different "
        "to you. Which one? Answer with its number only.")
_STR = ("Here are two sentences.\n{lines}\nA thought was injected into both of them. In which sentence "
        "was it stronger? Answer with its number only.")
_DET = "Read this sentence: {s}\nDo you detect an injected thought? Answer Yes or No."
_CTL = "Read this sentence: {s}\nIs this sentence written in French? Answer Yes or No."


@register("injection_report", schema=1)
@dataclass(frozen=True)
class InjectionReportExperiment:
    """The three report tasks, per injection layer and magnitude (see the module docstring)."""

    model: str = "smollm2-135m"  #: a chat model for :func:`companion.transformers.models.load`
    layers: tuple[int, ...] = tuple(range(30))  #: injection layers (``h_l``); SmolLM2: every one
    scales: tuple[float, ...] = (1.0, 4.0)  #: magnitudes, increasing
    unit: str = "spread"  #: ``"spread"`` (:math:`\alpha s_\ell`) or ``"raw"`` (coefficients)
    concepts: tuple[str, ...] = ("sea", "fire", "music", "food")
    n_random: int = 2  #: random unit directions
    k: int = 4  #: sentences per localisation trial
    n_loc_sets: int = 2  #: localisation sentence sets (trials: ``k`` per set)
    n_str_pairs: int = 2  #: strength pairs (trials: 2 per pair)
    strength_ratio: float = 0.25  #: the weaker injection's magnitude over the stronger's
    n_det: int = 2  #: detection sentences (each asked the detection and the control question)
    #: the system turn (a short one keeps the CPU run small; ``""``: the template's default)
    system: str = "You are a helpful assistant."
    seed: int = 0
    dtype: str = "float32"
    max_batch_tokens: int = 16384

    def validate(self) -> None:
        """Check the fields that do not need the model.

        Raises
        ------
        ValueError
            Bad counts, scales, unit, ratio, layers or concepts.
        """
        from companion.injection.directions import CONCEPTS

        for name, low in (("n_random", 1), ("k", 2), ("n_loc_sets", 1), ("n_str_pairs", 1),
                          ("n_det", 1), ("max_batch_tokens", 1)):
            check_int(getattr(self, name), name, low)
        if self.k > 10:
            raise ValueError(f"k must be at most 10 (answers '1'..'10'), got {self.k}")
        if self.k > len(SENTENCES) or 2 * self.n_str_pairs > len(SENTENCES) or self.n_det > len(SENTENCES):
            raise ValueError(f"at most {len(SENTENCES)} sentences are available")
        if self.unit not in ("spread", "raw"):
            raise ValueError(f"unit must be 'spread' or 'raw', got {self.unit!r}")
        if not self.scales or any(not (math.isfinite(s) and s > 0) for s in self.scales):
            raise ValueError(f"scales must be finite and > 0, got {self.scales}")
        if list(self.scales) != sorted(set(self.scales)):
            raise ValueError(f"scales must be strictly increasing, got {self.scales}")
        if not (0 < self.strength_ratio < 1):
            raise ValueError(f"strength_ratio must lie in (0, 1), got {self.strength_ratio}")
        if not self.layers or list(self.layers) != sorted(set(self.layers)) or self.layers[0] < 0:
            raise ValueError(f"layers must be non-empty, non-negative and increasing, got {self.layers}")
        bad = [c for c in self.concepts if c not in CONCEPTS]
        if not self.concepts or bad:
            raise ValueError(f"concepts must name concepts of CONCEPTS, got {self.concepts}")

    def compute(self, device, progress):
        """Load the model and run :func:`run_protocol`."""
        self.validate()
        return run_protocol(load_model(self, device), self)


#: The stored CPU run (SmolLM2-135M-Instruct) is the default config.
CONFIGS: dict[str, InjectionReportExperiment] = {"smollm2-135m": InjectionReportExperiment()}

#: Llama-3.1-8B-Instruct as Hahami et al. ran it: 10-way localisation, raw coefficients, the
#: output of decoder layer 2 (``h_3`` here) and its neighbours.  Never run in CI (``--device cuda``);
#: :func:`raw_to_alpha` converts its coefficients to :math:`\alpha` once ``typical_spread`` is read.
GPU_CONFIG = InjectionReportExperiment(
    model="meta-llama/Llama-3.1-8B-Instruct", system="", layers=(1, 2, 3, 4, 6, 9, 12, 16, 20, 24, 28),
    scales=(2.0, 5.0, 8.0), unit="raw", k=10, n_loc_sets=10, n_str_pairs=10, n_det=10, n_random=4,
    dtype="bfloat16", max_batch_tokens=8192)


# ------------------------------------------------------------------------------ the measurement
def _chat(tok, body: str, system: str = "") -> str:
    """``body`` as the user's turn of ``tok``'s chat template (after ``system``), ready for the answer."""
    if getattr(tok, "chat_template", None) is None:
        raise ValueError("the model's tokenizer has no chat template; the protocol needs a chat model")
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": body}]
    return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def _spans_mask(m, texts, spans, enc) -> np.ndarray:
    """Boolean ``[batch, tokens]``: the tokens overlapping the character span of each row."""
    tok = m.tokenizer
    ids = enc["input_ids"].cpu().numpy()
    out = np.zeros(ids.shape, dtype=bool)
    for r, (text, (a, b)) in enumerate(zip(texts, spans)):
        e = tok(text, return_offsets_mapping=True, truncation=True, max_length=ids.shape[1])
        n = len(e["input_ids"])
        if list(e["input_ids"]) != ids[r, :n].tolist():
            raise RuntimeError("the tokenizer's offsets do not match the encoding")
        for t, (s, f) in enumerate(e["offset_mapping"]):
            if f > s and s < b and f > a:
                out[r, t] = True
        if not out[r].any():
            raise ValueError(f"row {r}: the injected sentence produced no token")
    return out


def _numbered(sentences) -> str:
    return "\n".join(f"{i + 1}. {s}" for i, s in enumerate(sentences))


def _trials(m, cfg) -> dict:
    """The texts, injection spans, targets and answer ids of every trial (deterministic)."""
    gen = np.random.default_rng(cfg.seed)
    tok = m.tokenizer
    texts, spans, rows = [], [], {}
    loc_target = []
    for _ in range(cfg.n_loc_sets):
        sents = [SENTENCES[i] for i in gen.choice(len(SENTENCES), cfg.k, replace=False)]
        text = _chat(tok, _LOC.format(k=cfg.k, lines=_numbered(sents)), cfg.system)
        for j in range(cfg.k):
            a = text.index(f"{j + 1}. {sents[j]}") + len(f"{j + 1}. ")
            texts.append(text)
            spans.append([(a, a + len(sents[j]))])
            loc_target.append(j)
    rows["loc"] = (0, len(texts))
    str_rows, str_target = [], []
    for p in range(cfg.n_str_pairs):
        pair = [SENTENCES[i] for i in gen.choice(len(SENTENCES), 2, replace=False)]
        text = _chat(tok, _STR.format(lines=_numbered(pair)), cfg.system)
        sp = []
        for j in range(2):
            a = text.index(f"{j + 1}. {pair[j]}") + len(f"{j + 1}. ")
            sp.append((a, a + len(pair[j])))
        for strong in range(2):  # sentence ``strong`` gets the larger magnitude
            str_rows.append((text, sp[strong], sp[1 - strong]))
            str_target.append(strong)
    det_start = len(texts)
    for i in gen.choice(len(SENTENCES), cfg.n_det, replace=False):
        s = SENTENCES[i]
        for template in (_DET, _CTL):
            text = _chat(tok, template.format(s=s), cfg.system)
            a = text.index(s)
            texts.append(text)
            spans.append([(a, a + len(s))])
    rows["det"] = (det_start, len(texts))
    digits = [str(j + 1) for j in range(cfg.k)]
    answer = [tok.encode(x, add_special_tokens=False)[0] for x in (*digits, "Yes", "No")]
    if len(set(answer)) != len(answer):
        raise ValueError("the answer options do not start with distinct tokens")
    return {"texts": texts, "spans": [s[0] for s in spans], "rows": rows, "str_rows": str_rows,
            "loc_target": np.asarray(loc_target), "str_target": np.asarray(str_target),
            "answer_ids": answer}


def run_protocol(m, cfg) -> dict:
    """Run the three tasks of ``cfg`` on the loaded chat model ``m`` (CPU or GPU; same path).

    Parameters
    ----------
    m : LoadedModel
        A causal LM whose tokenizer has a chat template and offsets (a fast tokenizer).
    cfg : InjectionReportExperiment

    Returns
    -------
    dict
        The Result's arrays and scalars (see the module docstring).

    Raises
    ------
    TypeError, ValueError
        A model that is not a causal chat LM; a config that does not fit the model.
    """
    import torch

    from companion.injection import directions as dr
    from companion.injection.engine import sweep_injections
    from companion.transformers import models
    from companion.transformers.readout import logits_from_residual
    from companion.transformers.stream import forward_states

    models.check_model(m)
    if not isinstance(cfg, InjectionReportExperiment):
        raise TypeError(f"cfg must be an InjectionReportExperiment, got {type(cfg).__name__}")
    cfg.validate()
    if m.kind != "causal-lm":
        raise ValueError(f"{m.name} is not a causal LM; the report protocol reads next-token answers")
    L, d = m.n_layers, m.d_model
    layers = [int(x) for x in cfg.layers]
    if layers[-1] > L:
        raise ValueError(f"layers must lie in [0, {L}] for {m.name}, got {layers[-1]}")
    tr = _trials(m, cfg)
    answer = torch.as_tensor(tr["answer_ids"], device=m.device)
    enc = models.encode(m, tr["texts"])
    inj = _spans_mask(m, tr["texts"], tr["spans"], enc)
    last = enc["attention_mask"].sum(1) - 1
    rows_idx = torch.arange(len(tr["texts"]), device=m.device)

    def answers(h_last):                                      # [n, d] -> [n, k + 2] float64
        z = logits_from_residual(m, h_last.to(torch.float32)).double()
        return torch.log_softmax(z, -1)[:, answer].cpu()

    state: dict = {}
    n_rows, width = len(tr["texts"]), len(tr["answer_ids"])

    def measure(h_inj, h_base, layer, conditions):
        K = h_inj.shape[0]
        if layer != L:
            return torch.zeros(K, n_rows, width, dtype=torch.float64)
        if "base" not in state:
            state["base"] = answers(h_base[rows_idx, last])
        return torch.stack([answers(h_inj[k][rows_idx, last]) for k in range(K)])

    # the magnitude unit: s_l measured on the trials' injected tokens, or raw coefficients
    base = forward_states(m, enc)
    spreads = dr.typical_spreads(torch.stack(base), torch.as_tensor(inj, device=m.device))
    unit = spreads if cfg.unit == "spread" else np.ones(L + 1)
    c_units, concept_norm = concept_units(m, cfg.concepts, None)
    rand = dr.random_unit_vectors(d, cfg.n_random, np.random.default_rng(cfg.seed + 1))
    groups = {"concept": np.stack(c_units)[:, layers],
              "random": np.broadcast_to(rand[:, None, :], (cfg.n_random, len(layers), d))}

    # strength: both sentences of a pair injected at once (two magnitudes), full forward per run
    senc = models.encode(m, [t for t, _, _ in tr["str_rows"]])
    hi = _spans_mask(m, [t for t, _, _ in tr["str_rows"]], [s for _, s, _ in tr["str_rows"]], senc)
    lo = _spans_mask(m, [t for t, _, _ in tr["str_rows"]], [s for _, _, s in tr["str_rows"]], senc)
    weight = torch.as_tensor(hi + cfg.strength_ratio * lo, dtype=m.dtype, device=m.device)[..., None]
    slast = senc["attention_mask"].sum(1) - 1
    srows = torch.arange(slast.shape[0], device=m.device)

    S, k = len(cfg.scales), cfg.k
    lo_r, hi_r = tr["rows"]["loc"]
    d0, d1 = tr["rows"]["det"]
    out: dict = {}
    for g, dirs in groups.items():
        loc, det, stre = [], [], []
        for v in dirs:                                            # v: [n_lay, d] unit rows
            vec = torch.as_tensor(unit[layers][:, None] * v, dtype=m.dtype, device=m.device)
            sw = sweep_injections(m, enc, layers, vec, scale=list(cfg.scales), positions=torch.as_tensor(inj),
                                  measure=measure, max_batch_tokens=cfg.max_batch_tokens)
            got = sw.injected[:, :, L].to(torch.float64).numpy()   # [n_lay, S, rows, k+2]
            loc.append(got[:, :, lo_r:hi_r, :k])
            det.append(got[:, :, d0:d1, k:].reshape(len(layers), S, cfg.n_det, 2, 2))
            st = np.empty((len(layers), S, slast.shape[0], 2))
            for j, ell in enumerate(layers):
                for s, a in enumerate(cfg.scales):
                    delta = float(a) * vec[j] * weight
                    hs = forward_states(m, senc, add=(ell, delta))
                    st[j, s] = answers(hs[L][srows, slast])[:, :2].numpy()
            stre.append(st)
        out[f"{g}_loc"], out[f"{g}_det"], out[f"{g}_str"] = np.stack(loc), np.stack(det), np.stack(stre)
    b = state["base"].numpy()
    hb = forward_states(m, senc)[L]
    out.update(
        base_loc=b[lo_r:hi_r, :k], base_det=b[d0:d1, k:].reshape(cfg.n_det, 2, 2),
        base_str=answers(hb[srows, slast])[:, :2].numpy(),
        loc_target=tr["loc_target"], str_target=tr["str_target"], layers=np.asarray(layers),
        scales=np.asarray(cfg.scales, dtype=np.float64), typical_spread=spreads,
        concept_norm=concept_norm, concepts=list(cfg.concepts), unit=cfg.unit,
        n_tokens=int(enc["attention_mask"].sum()), **model_facts(m))
    return out


# ------------------------------------------------------------------------------ statistics
def accuracy_trials(logp, target) -> np.ndarray:
    """Whether the most probable option is the target: ``logp[..., n, options]`` -> ``[..., n]`` bool.

    Parameters
    ----------
    logp : array_like, shape ``[..., n, n_options]``
        Log-probabilities (or any scores) of the answer options per trial.
    target : array_like of int, shape ``[n]``
        The correct option of each trial.

    Returns
    -------
    numpy.ndarray of bool

    Raises
    ------
    ValueError
        Shapes that do not match, or targets outside the options.

    Examples
    --------
    >>> accuracy_trials([[0.0, -1.0], [-2.0, -0.5]], [0, 0]).tolist()
    [True, False]
    """
    x = real_array("logp", logp, min_ndim=2)
    t = np.asarray(target)
    if t.ndim != 1 or t.shape[0] != x.shape[-2]:
        raise ValueError(f"target must have shape ({x.shape[-2]},), got {t.shape}")
    if not np.issubdtype(t.dtype, np.integer) or t.min() < 0 or t.max() >= x.shape[-1]:
        raise ValueError(f"target must hold integers in [0, {x.shape[-1] - 1}]")
    return np.argmax(x, axis=-1) == t


def yes_probability(logp) -> np.ndarray:
    r""":math:`P(\text{Yes}) / (P(\text{Yes}) + P(\text{No}))` from ``[..., 2]`` log-probabilities (Yes, No).

    Examples
    --------
    >>> float(yes_probability([0.0, 0.0]))
    0.5
    """
    x = real_array("logp", logp)
    if x.shape[-1:] != (2,):
        raise ValueError(f"logp must end in an axis of 2 (Yes, No), got shape {x.shape}")
    return 1.0 / (1.0 + np.exp(x[..., 1] - x[..., 0]))


def hierarchical_interval(correct, level: float = 0.95, n_boot: int = 2000, seed: int = 0):
    """Mean of ``correct[direction, trial]`` with a bootstrap resampling directions and trials.

    Directions and trials are crossed (every direction sees the same trials), so each resample
    draws directions and trials independently, with replacement, and averages the sub-table.

    Parameters
    ----------
    correct : array_like, shape ``[n_dir, n_trials]``
        Per-trial scores (0/1 for accuracies), ``n_dir >= 1``, ``n_trials >= 2``.
    level : float in (0, 1)
    n_boot : int >= 10
    seed : int

    Returns
    -------
    tuple of float
        ``(mean, lo, hi)``.

    Raises
    ------
    TypeError, ValueError
        A bad shape, level or count.

    Examples
    --------
    >>> m, lo, hi = hierarchical_interval(np.ones((3, 4)))
    >>> (m, lo, hi)
    (1.0, 1.0, 1.0)
    """
    x = real_array("correct", correct)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError(f"correct must be [n_dir >= 1, n_trials >= 2], got shape {x.shape}")
    check_real(level, "level")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    check_int(n_boot, "n_boot", 10)
    gen = np.random.default_rng(seed)
    nd, nt = x.shape
    di = gen.integers(0, nd, size=(n_boot, nd))
    ti = gen.integers(0, nt, size=(n_boot, nt))
    # mean of x[di][:, ti] = (counts_d^T x counts_t) / (nd nt), without building the sub-tables
    cd = np.stack([np.bincount(r, minlength=nd) for r in di])   # [n_boot, nd]
    ct = np.stack([np.bincount(r, minlength=nt) for r in ti])   # [n_boot, nt]
    boots = np.einsum("bi,ij,bj->b", cd, x, ct) / (nd * nt)
    q = (1 - level) / 2
    return float(x.mean()), float(np.quantile(boots, q)), float(np.quantile(boots, 1 - q))


def binomial_tail(successes, n: int, p: float) -> np.ndarray:
    r"""Exact one-sided p-value :math:`P(X \ge x)`, :math:`X \sim \mathrm{Bin}(n, p)`.

    Examples
    --------
    >>> float(binomial_tail(2, 2, 0.5))
    0.25
    """
    from scipy.stats import binom

    check_int(n, "n", 1)
    check_real(p, "p")
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    x = np.asarray(successes)
    if not np.issubdtype(x.dtype, np.integer) or np.any((x < 0) | (x > n)):
        raise ValueError(f"successes must be integers in [0, {n}]")
    return binom.sf(x - 1, n, p)


def holm(pvalues, alpha: float = 0.05) -> np.ndarray:
    """Holm's step-down rejections: family-wise error at most ``alpha`` under any dependence.

    Sort the ``m`` p-values; reject the ``i``-th smallest while ``p_(i) <= alpha / (m - i + 1)``,
    stopping at the first that fails.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03], 0.05).tolist()
    [True, False, False]
    """
    p = real_array("pvalues", pvalues)
    if p.ndim != 1 or p.size == 0 or np.any((p < 0) | (p > 1)):
        raise ValueError("pvalues must be a non-empty 1-D array of numbers in [0, 1]")
    check_real(alpha, "alpha")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    order = np.argsort(p, kind="stable")
    m = p.size
    ok = p[order] <= alpha / (m - np.arange(m))
    n_reject = m if ok.all() else int(np.argmin(ok))
    out = np.zeros(m, dtype=bool)
    out[order[:n_reject]] = True
    return out


def min_detectable(n: int, chance: float, alpha: float = 0.05, n_tests: int = 1,
                   power: float = 0.8) -> float:
    r"""Smallest true accuracy that the design rejects chance at with probability ``power``.

    The test rejects at layer :math:`\ell` when the successes reach the smallest :math:`c` with
    :math:`P(\mathrm{Bin}(n, \text{chance}) \ge c) \le \alpha / \text{n\_tests}` (Holm's first,
    strictest step); the answer is the smallest :math:`p` with
    :math:`P(\mathrm{Bin}(n, p) \ge c) \ge \text{power}` (bisection; increasing in :math:`p`).

    Examples
    --------
    >>> round(min_detectable(100, 0.5), 2)
    0.63
    """
    from scipy.stats import binom

    check_int(n, "n", 1)
    check_int(n_tests, "n_tests", 1)
    for name, v in (("chance", chance), ("alpha", alpha), ("power", power)):
        check_real(v, name)
        if not 0 < v < 1:
            raise ValueError(f"{name} must lie in (0, 1), got {v}")
    counts = np.arange(n + 2)
    ok = binom.sf(counts - 1, n, chance) <= alpha / n_tests
    if not ok[:n + 1].any():
        return float("nan")                                  # no count can reach the level
    c = int(counts[np.argmax(ok)])
    lo, hi = chance, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binom.sf(c - 1, n, mid) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def raw_to_alpha(coefficient: float, spread: float) -> float:
    r"""A raw coefficient :math:`c` (Hahami et al.: :math:`c\,\hat v`) in the book's units, :math:`c / s_\ell`.

    Examples
    --------
    >>> raw_to_alpha(5.0, 2.5)
    2.0
    """
    check_real(coefficient, "coefficient")
    check_real(spread, "spread")
    if spread <= 0:
        raise ValueError(f"spread must be > 0, got {spread}")
    return float(coefficient) / float(spread)


def _task_trials(arrays, task: str, group: str):
    """``(correct [n_dir, n_lay, S, n], chance)`` of a task, or detection yes-probabilities."""
    if group not in ("concept", "random"):
        raise ValueError(f"group must be 'concept' or 'random', got {group!r}")
    if task == "localisation":
        x = arrays[f"{group}_loc"]
        return accuracy_trials(x, arrays["loc_target"]), 1.0 / x.shape[-1]
    if task == "strength":
        return accuracy_trials(arrays[f"{group}_str"], arrays["str_target"]), 0.5
    raise ValueError(f"task must be 'localisation' or 'strength', got {task!r}")


def task_table(result, task: str, group: str = "concept", alpha: float = 0.05, level: float = 0.95,
               n_boot: int = 2000, seed: int = 0):
    """Accuracy per (layer, magnitude) with intervals, exact p-values and Holm over layers.

    Holm runs over the layers at each magnitude (the family of a "works at layer l" claim);
    the p-value is the exact binomial tail of the pooled successes (directions x trials) at the
    exact chance level.

    Returns
    -------
    dict of str to numpy.ndarray
        Columns ``layer``, ``alpha``, ``accuracy``, ``lo``, ``hi``, ``chance``, ``n``, ``p``,
        ``holm`` (bool: rejected at family-wise level ``alpha``), one row per (magnitude, layer).
    """
    arrays = result.arrays if hasattr(result, "arrays") else result
    correct, chance = _task_trials(arrays, task, group)
    layers, scales = arrays["layers"], arrays["scales"]
    rows = []
    for s, a in enumerate(scales):
        ps = []
        for j, ell in enumerate(layers):
            c = correct[:, j, s].astype(float)
            mean, lo, hi = hierarchical_interval(c, level, n_boot, seed)
            n = c.size
            p = float(binomial_tail(int(round(c.sum())), n, chance))
            ps.append(p)
            rows.append(dict(layer=int(ell), alpha=float(a), accuracy=mean, lo=lo, hi=hi,
                             chance=chance, n=n, p=p))
        rej = holm(ps, alpha)
        for j in range(len(layers)):
            rows[-len(layers) + j]["holm"] = bool(rej[j])
    return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}
