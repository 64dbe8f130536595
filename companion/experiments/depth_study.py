"""The depth study: trained Pre-LN, Post-LN and DSLM Post-LN language models from 4 to 64 layers.

Byte-level :class:`~companion.stacks.tinylm.TinyLM` models (same width, data order, optimiser and
schedule) are trained at every depth and placement (``"dslm"``: Post-LN with
:func:`~companion.stacks.residual.dslm_scales`) and measured (:func:`measure_model`): (a) the
injection window -- a target byte's centred unembedding row, injected at the last token with
``alpha`` times the centred spread, must raise that byte's log-probability more than each of
``n_random`` random directions (chance ``1/(n_random + 1)``, checked with held-out directions);
the window is the layers above the 99% binomial quantile of chance; (b) the stream's growth and
the dilution and Post-LN product laws (:mod:`companion.injection.metrics`); (c) per-layer outlier
statistics and Theorem 2's exceedance counts.  Chapter *The depth study*; :data:`GPU_CONFIG` is
the GPU size (``scripts/gpu_depth_study.py``).

The second study (issue 29) makes each member its own experiment, ``depth_member``
(:class:`DepthMember`: placement x depth x seed, float32, a held-out split, tuned learning rates),
so that :func:`run_family` can build the family over several runs, resuming from the cache.  Its
readout (:func:`readout_success`) injects over a span of tokens and reads at later tokens, with
nulls drawn per (prompt, target) pair and an exact rank chance level; the untrained model and the
same-token readout are contrasts; :func:`outlier_metrics` are tracked over training checkpoints.
:data:`GPU_MEMBER` is its GPU size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from companion.theory import exceedance
from companion.injection import metrics as fw
from companion._validation import check_choice, check_int, check_real
from companion.corpus import load_corpus
from companion.experiments import progress_bar, register
from companion.stacks.residual import StackConfig, dslm_scales
from companion.stacks.tinylm import TinyLM, byte_tokenize, train_tiny_lm

__all__ = ["DepthStudy", "GPU_CONFIG", "PLACEMENTS", "member_config", "inject_layers", "train_member",
           "measure_model", "DepthMember", "GPU_MEMBER", "GPU_DEPTHS", "GPU_SEEDS", "FAMILY_DEPTHS",
           "FAMILY_SEEDS", "TRAINED_MARGIN", "trained", "DepthLRSweep", "MEMBER_PLACEMENTS", "MEMBER_LABELS", "member",
           "member_stack_config", "corpus_split", "unigram_heldout", "rank_success", "chance_threshold",
           "detectable_rate", "readout_success", "outlier_metrics", "run_family", "family_root"]

#: Placements a study may contain (see the module docstring).
PLACEMENTS = ("pre", "post", "dslm")
#: Thresholds (in units of the layer's rms) of the Theorem 2 exceedance counts.
COUNT_THRESHOLDS = (4.0, 6.0)
#: ``|mu| / sigma`` above which a channel counts as mean-dominated.
MEAN_DOMINATED = 3.0
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@register("depth_study", schema=1)
@dataclass(frozen=True)
class DepthStudy:
    """Config of the depth study (defaults: the CPU size rendered by the chapter).

    ``d_model``, ``n_heads``, ``steps``, ``batch_size``, ``seq_len``, ``lr`` and ``warmup`` are the
    width and training of every member (:func:`~companion.stacks.tinylm.train_tiny_lm`).

    Raises
    ------
    ValueError
        An unknown placement or dtype, a non-positive count, inconsistent sizes.

    Examples
    --------
    >>> DepthStudy().depths, GPU_CONFIG.d_model
    ((4, 8, 16, 32, 64), 128)
    """

    depths: tuple[int, ...] = (4, 8, 16, 32, 64)
    placements: tuple[str, ...] = ("pre", "post", "dslm")  #: a subset of :data:`PLACEMENTS`
    d_model: int = 32
    n_heads: int = 4
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 64
    lr: float = 1e-3
    warmup: int = 150
    dtype: str = "float64"  #: training and measuring precision, ``"float64"`` or ``"float32"``
    dslm_k: float = 2.0  #: budget of the DSLM scales
    n_prompts: int = 16  #: evaluation prompts (corpus windows; injection at the last token)
    prompt_len: int = 16  #: length of an evaluation prompt
    n_targets: int = 8  #: target tokens
    n_random: int = 16  #: random directions defining chance
    n_heldout: int = 8  #: held-out random directions measuring chance
    scales: tuple[float, ...] = (1.0, 4.0)  #: injected norm in units of the layer's centred spread
    max_inject_layers: int = 8  #: injection grid size (every layer when ``L <= max_inject_layers``)
    n_outlier_prompts: int = 32  #: prompts of the outlier statistics
    n_boot: int = 400  #: bootstrap resamples
    seed: int = 0  #: seed of everything

    def __post_init__(self):
        if not self.depths or not self.placements or not self.scales:
            raise ValueError("DepthStudy.depths, placements and scales must be non-empty")
        for d in self.depths:
            check_int(d, "DepthStudy.depths", minimum=1)
        if len(set(self.depths)) != len(self.depths):
            raise ValueError(f"DepthStudy.depths must be distinct, got {self.depths}")
        for p in self.placements:
            if p not in PLACEMENTS:
                raise ValueError(f"DepthStudy.placements must be among {PLACEMENTS}, got {p!r}")
        if len(set(self.placements)) != len(self.placements):
            raise ValueError(f"DepthStudy.placements must be distinct, got {self.placements}")
        for name in ("d_model", "n_heads", "steps", "batch_size", "seq_len", "n_prompts",
                     "prompt_len", "n_targets", "n_random", "n_heldout", "max_inject_layers",
                     "n_outlier_prompts", "n_boot"):
            check_int(getattr(self, name), f"DepthStudy.{name}", minimum=1)
        check_int(self.warmup, "DepthStudy.warmup", minimum=0)
        check_int(self.seed, "DepthStudy.seed", minimum=0)
        if self.d_model % self.n_heads:
            raise ValueError(f"DepthStudy.n_heads = {self.n_heads} must divide d_model = {self.d_model}")
        if self.d_model < 2:
            raise ValueError("DepthStudy.d_model must be >= 2")
        if self.prompt_len > self.seq_len:
            raise ValueError(f"DepthStudy.prompt_len = {self.prompt_len} exceeds seq_len = {self.seq_len}")
        if self.n_targets > 64:
            raise ValueError(f"DepthStudy.n_targets must be <= 64 (frequent bytes), got {self.n_targets}")
        if not self.lr > 0 or not np.isfinite(self.lr):
            raise ValueError(f"DepthStudy.lr must be positive, got {self.lr}")
        if not 0 < self.dslm_k <= 2 * min(self.depths):
            raise ValueError(f"DepthStudy.dslm_k must lie in (0, 2 * min(depths)], got {self.dslm_k}")
        if any(not s > 0 for s in self.scales):
            raise ValueError(f"DepthStudy.scales must be positive, got {self.scales}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"DepthStudy.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    def compute(self, device, progress: bool = False) -> dict:
        """Train and measure every member; returns the Result's arrays and scalars."""
        return _run_study(self, device, progress)


#: The GPU size (``scripts/gpu_depth_study.py``, which explains the sizing; ``make gpu-results``).
GPU_CONFIG = DepthStudy(d_model=128, steps=1000, batch_size=32, seq_len=128, warmup=300,
                        dtype="float32", n_prompts=32, n_outlier_prompts=64)


# ------------------------------------------------------------------------------ members
def member_config(config: DepthStudy, placement: str, depth: int) -> StackConfig:
    """The :class:`~companion.stacks.residual.StackConfig` of one member.

    Parameters
    ----------
    config : DepthStudy
    placement : {"pre", "post", "dslm"}
    depth : int

    Returns
    -------
    companion.stacks.residual.StackConfig

    Examples
    --------
    >>> c = member_config(DepthStudy(), "dslm", 8)
    >>> c.placement, c.n_layers, round(c.residual_scale ** 2 + c.branch_scale ** 2, 12)
    ('post', 8, 1.0)
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    lam, beta = dslm_scales(depth, config.dslm_k) if placement == "dslm" else (1.0, 1.0)
    return StackConfig(d_model=config.d_model, n_layers=depth, n_heads=config.n_heads,
                       placement="pre" if placement == "pre" else "post", block="both",
                       residual_scale=lam, branch_scale=beta, vocab_size=256,
                       max_len=config.seq_len, seed=config.seed)


def train_member(config: DepthStudy, placement: str, depth: int, device="cpu"):
    """Train one member on the committed corpus.

    Parameters
    ----------
    config, placement, depth
        As in :func:`member_config`.
    device : str or torch.device

    Returns
    -------
    tuple
        ``(TinyLM in eval mode on the CPU, losses)``.
    """
    model, losses = train_tiny_lm(member_config(config, placement, depth), load_corpus(),
                                  steps=config.steps, batch_size=config.batch_size,
                                  seq_len=config.seq_len, lr=config.lr, seed=config.seed,
                                  device=str(device), warmup=config.warmup,
                                  dtype=_DTYPES[config.dtype])
    return model.eval(), losses


def inject_layers(depth: int, max_layers: int) -> np.ndarray:
    """Injection grid: every stream index ``0..L`` or ``max_layers + 1`` evenly spaced ones.

    Parameters
    ----------
    depth, max_layers : int

    Returns
    -------
    numpy.ndarray of int

    Examples
    --------
    >>> inject_layers(4, 8).tolist(), inject_layers(64, 8)[:4].tolist()
    ([0, 1, 2, 3, 4], [0, 8, 16, 24])
    """
    if depth <= max_layers:
        return np.arange(depth + 1)
    return np.unique(np.round(np.linspace(0, depth, max_layers + 1)).astype(np.int64))


def _target_tokens(n: int) -> np.ndarray:
    """The ``n`` most frequent byte values of the corpus that are letters (ties by value)."""
    ids = byte_tokenize(load_corpus()).numpy()
    counts = np.bincount(ids, minlength=256)
    letters = np.array([b for b in range(256) if chr(b).isascii() and chr(b).isalpha()])
    order = letters[np.lexsort((letters, -counts[letters]))]
    return order[:n]


def _evaluation_prompts(n: int, length: int, offset: float = 0.5) -> torch.Tensor:
    """``[n, length]`` byte windows evenly spaced through the corpus (shifted by ``offset``)."""
    ids = byte_tokenize(load_corpus())
    span = ids.numel() - length - 1
    starts = ((np.arange(n) + offset) * span / n).astype(np.int64)
    return torch.stack([ids[s:s + length] for s in starts])


def _directions(config: DepthStudy, model: TinyLM, targets: np.ndarray) -> np.ndarray:
    """Unit rows, all orthogonal to 1: target unembeddings, then random, then held-out random."""
    W = model.unembed.weight.detach().double().cpu().numpy()           # [V, d]
    rows = W[targets] - W.mean(axis=0)
    rng = np.random.default_rng([config.seed, 7])
    rand = rng.standard_normal((config.n_random + config.n_heldout, config.d_model))
    dirs = np.concatenate([rows, rand])
    dirs = dirs - dirs.mean(axis=1, keepdims=True)
    return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)


def _chance_threshold(n_pairs: int, n_random: int, q: float = 0.99) -> float:
    """Success rate above which a layer is in the window: the ``q`` binomial quantile of chance."""
    p = 1.0 / (n_random + 1)
    return float(stats.binom.ppf(q, n_pairs, p) / n_pairs)


def _window_from_success(rate: np.ndarray, layers: np.ndarray, depth: int, threshold: float) -> np.ndarray:
    """``[first, last, centre, coverage]`` (fractions of depth) of the layers with ``rate > threshold``."""
    inside = np.asarray(rate) > threshold
    if not inside.any():
        return np.array([np.nan, np.nan, np.nan, 0.0])
    frac = np.asarray(layers, dtype=float)[inside] / depth
    return np.array([frac.min(), frac.max(), frac.mean(), inside.mean()])


def _boot_rates(success: np.ndarray, n_boot: int, seed) -> np.ndarray:
    """Success rates ``[n_boot, G]`` of ``success`` ``[G, K, P]`` resampled over targets and prompts."""
    rng = np.random.default_rng(seed)
    _, K, P = success.shape
    s = success.astype(float)
    return np.stack([s[:, rng.integers(0, K, K)][:, :, rng.integers(0, P, P)].mean(axis=(1, 2))
                     for _ in range(n_boot)])


# ------------------------------------------------------------------------------ measurements
@torch.no_grad()
def _last_logprobs(model, ids, **inject):
    """Log-probabilities at the last position (float64) and the model's stream output."""
    logits, out = model(ids, **inject)
    return torch.log_softmax(logits[:, -1].double(), dim=-1), out


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean next-byte cross-entropy of ``logits`` on ``ids``."""
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, 256).double(), ids[:, 1:].reshape(-1)))


def _stream_growth_laws(model, config, ids, dirs_random, spread, l0, device):
    """Measured |projection| on v at every layer after injecting at l0, and both laws' predictions."""
    L = model.config.n_layers
    P, T = ids.shape
    R = dirs_random.shape[0]
    dtype = next(model.parameters()).dtype
    _, base = model(ids)
    vec = torch.as_tensor(np.repeat(dirs_random, P, axis=0) * spread[l0], dtype=dtype, device=device)
    _, inj = model(ids.repeat(R, 1), inject_layer=l0, inject_vector=vec, inject_positions=[T - 1])
    delta = (inj.stream[:, :, -1] - base.stream[:, :, -1].repeat(1, R, 1)).double().cpu().numpy()
    vv = np.repeat(dirs_random, P, axis=0)                                  # [R*P, d]
    proj = np.abs(np.einsum("lbd,bd->lb", delta, vv)).mean(axis=1)           # [L+1]
    h = base.stream[:, :, -1].double().cpu().numpy()                        # [L+1, P, d]
    norm = np.sqrt((h ** 2).sum(-1).mean(-1))                               # [L+1]
    sq = (base.stream.double() ** 2).sum(-1).mean(dim=(1, 2)).cpu().numpy()  # [L+1]
    c = fw.fit_norm_growth(sq)
    layers = np.arange(l0, L + 1)
    pred_pre = np.full(L + 1, np.nan)
    pred_pre[l0:] = proj[l0] / norm[l0] * fw.dilution_factor(max(c, 0.0), l0, layers) * norm[l0:]
    # Post-LN product rule over every sublayer norm, with the learned gains, per direction
    u = base.sublayer_norm_input[:, :, :, -1].double().cpu().numpy()        # [L, S, P, d]
    lam = model.config.residual_scale
    eps = model.config.eps
    pred_post = np.full(L + 1, np.nan)
    if model.config.placement == "post":
        S = u.shape[1]
        gains = np.stack([[sub.norm.weight.detach().double().cpu().numpy()
                           for sub in blk.sublayers] for blk in model.stack.blocks])  # [L, S, d]
        preds = []
        for v in dirs_random:
            f = fw.postln_contraction_factors(u.reshape(L * S, P, -1), eps=eps, residual_scale=lam,
                                              ln_weight=gains.reshape(L * S, 1, -1), v=v)
            f = f.reshape(L, S, P).prod(axis=1)                             # [L, P]
            preds.append(fw.predicted_projection(f, l0, 1.0))               # [L+1, P]
        pred_post = proj[l0] * np.mean(preds, axis=(0, 2))
        pred_post[:l0] = np.nan
    return dict(sq_norm=sq, growth_c=c, proj=proj, norm_last=norm, pred_dilution=pred_pre,
                pred_product=pred_post)


def _outliers(out_stream: torch.Tensor) -> dict:
    """Per-layer outlier statistics of a stream ``[L+1, B, T, d]``."""
    x = out_stream.double().cpu().numpy()
    Lp1, B, T, d = x.shape
    x = x.reshape(Lp1, B * T, d)
    rms = np.sqrt((x ** 2).mean(axis=(1, 2)))                               # [L+1]
    mu = x.mean(axis=1)                                                     # [L+1, d]
    sd = x.std(axis=1)
    maxabs = np.abs(x).max(axis=1) / rms[:, None]                            # [L+1, d]
    ratio = np.abs(mu) / np.maximum(sd, 1e-300)
    N = B * T
    observed = np.empty((Lp1, len(COUNT_THRESHOLDS)))
    expected = np.empty_like(observed)
    for i, k in enumerate(COUNT_THRESHOLDS):
        t = k * rms[:, None]
        observed[:, i] = (np.abs(x) > t[:, None, :]).sum(axis=(1, 2))
        expected[:, i] = np.sum(exceedance.expected_count_gaussian(N, mu, t, np.maximum(sd, 1e-300)), axis=1)
    return dict(max_over_rms=maxabs, mean_over_sd=ratio, n_mean_dominated=(ratio > MEAN_DOMINATED).sum(1),
                count_observed=observed, count_expected=expected, rms=rms)


def measure_model(model: TinyLM, config: DepthStudy, device="cpu") -> dict:
    """All measurements (a), (b), (c) of one model; see the module docstring.

    Parameters
    ----------
    model : TinyLM
    config : DepthStudy
    device : str or torch.device

    Returns
    -------
    dict
        ``layers`` [G] injection grid; ``spread`` [L+1]; ``success`` bool [S, G, K, P];
        ``null_success`` bool [S, G, H, K, P] (held-out random directions scored as targets);
        ``dlogp_target`` [S, G, K, P]; ``top1`` bool [S, G, K, P] (target becomes the argmax);
        the stream-growth dict of ``_stream_growth_laws`` and the outlier dict of ``_outliers``;
        ``eval_loss``.
    """
    model = model.to(device).eval()
    dtype = next(model.parameters()).dtype
    L = model.config.n_layers
    K, R = config.n_targets, config.n_random
    targets = _target_tokens(K)
    ids = _evaluation_prompts(config.n_prompts, config.prompt_len).to(device)
    P, T = ids.shape
    dirs = _directions(config, model, targets)                              # [K+R+H, d]
    N = dirs.shape[0]
    with torch.no_grad():
        base_lp, base = _last_logprobs(model, ids)
        h = base.stream.double()
        centred = h - h.mean(dim=(1, 2), keepdim=True)
        spread = centred.pow(2).sum(-1).mean(dim=(1, 2)).sqrt().cpu().numpy()  # [L+1]
        layers = inject_layers(L, config.max_inject_layers)
        G, S = len(layers), len(config.scales)
        dlogp = np.empty((S, G, N, K, P))
        top1 = np.empty((S, G, K, P), dtype=bool)
        ids_rep = ids.repeat(N, 1)
        tgt = torch.as_tensor(targets, device=device)
        base_t = base_lp[:, tgt].T.cpu().numpy()                            # [K, P]
        for si, alpha in enumerate(config.scales):
            for gi, layer in enumerate(layers):
                vec = torch.as_tensor(np.repeat(dirs, P, axis=0) * alpha * spread[layer],
                                      dtype=dtype, device=device)
                lp, _ = _last_logprobs(model, ids_rep, inject_layer=int(layer), inject_vector=vec,
                                       inject_positions=[T - 1])
                lp = lp.view(N, P, -1)
                dlogp[si, gi] = lp[:, :, tgt].permute(0, 2, 1).cpu().numpy() - base_t[None]
                top1[si, gi] = (lp[:K].argmax(-1).cpu().numpy() == targets[:, None])
        target_d = dlogp[:, :, np.arange(K), np.arange(K)]                  # [S, G, K, P]
        null = dlogp[:, :, K:K + R]                                         # [S, G, R, K, P]
        success = target_d > null.max(axis=2)
        held = dlogp[:, :, K + R:]                                          # [S, G, H, K, P]
        null_success = held > null.max(axis=2)[:, :, None]
        l0 = L // 4
        growth = _stream_growth_laws(model, config, ids, dirs[K:K + R], spread, l0, device)
        out_ids = _evaluation_prompts(config.n_outlier_prompts, config.seq_len, offset=0.25).to(device)
        logits, o = model(out_ids)
        eval_loss = _loss(logits, out_ids)
        outl = _outliers(o.stream)
    model.cpu()
    return dict(layers=layers, spread=spread, success=success, null_success=null_success,
                dlogp_target=target_d, top1=top1, growth=growth, outliers=outl, l0=l0,
                eval_loss=eval_loss, targets=targets)


# ------------------------------------------------------------------------------ the study
def _run_study(config: DepthStudy, device="cpu", progress: bool = False) -> dict:
    """Train and measure every member: the Result's arrays (NaN beyond a member's depth) and scalars."""
    P, D, M = len(config.placements), len(config.depths), max(config.depths)
    G = max(len(inject_layers(d, config.max_inject_layers)) for d in config.depths)
    S, K, C = len(config.scales), config.n_targets, len(COUNT_THRESHOLDS)
    shapes = [(("eval_loss", "init_eval_loss", "train_seconds", "growth_c", "law_l0"), ()),
              (("train_loss",), (config.steps,)), (("inject_layers",), (G,)),
              (("success_rate", "null_rate", "top1_rate", "dlogp_target", "success_lo", "success_hi"),
               (S, G)),
              (("window", "window_lo", "window_hi"), (S, 4)),
              (("spread", "sq_norm", "proj", "proj_norm", "pred_dilution", "pred_product", "max_over_rms",
                "max_over_rms_median", "max_mean_over_sd", "n_mean_dominated"), (M + 1,)),
              (("count_observed", "count_expected"), (M + 1, C))]
    out = {k: np.full((P, D, *shape), np.nan) for keys, shape in shapes for k in keys}
    threshold = _chance_threshold(K * config.n_prompts, config.n_random)
    bar = progress_bar(P * D, progress, "depth study")
    import time
    for pi, placement in enumerate(config.placements):
        for di, depth in enumerate(config.depths):
            init = TinyLM(member_config(config, placement, depth)).to(_DTYPES[config.dtype])
            ids = _evaluation_prompts(config.n_outlier_prompts, config.seq_len, offset=0.25)
            with torch.no_grad():
                out["init_eval_loss"][pi, di] = _loss(init(ids)[0], ids)
            t0 = time.perf_counter()
            model, losses = train_member(config, placement, depth, device)
            out["train_seconds"][pi, di] = time.perf_counter() - t0
            out["train_loss"][pi, di] = losses
            m = measure_model(model, config, device)
            g = len(m["layers"])
            out["inject_layers"][pi, di, :g] = m["layers"]
            out["eval_loss"][pi, di] = m["eval_loss"]
            for si in range(S):
                succ = m["success"][si]                                     # [G, K, P]
                rate = succ.mean(axis=(1, 2))
                out["success_rate"][pi, di, si, :g] = rate
                out["null_rate"][pi, di, si, :g] = m["null_success"][si].mean(axis=(1, 2, 3))
                out["top1_rate"][pi, di, si, :g] = m["top1"][si].mean(axis=(1, 2))
                out["dlogp_target"][pi, di, si, :g] = m["dlogp_target"][si].mean(axis=(1, 2))
                out["window"][pi, di, si] = _window_from_success(rate, m["layers"], depth, threshold)
                rows = [_window_from_success(r, m["layers"], depth, threshold)
                        for r in _boot_rates(succ, config.n_boot, [config.seed, 11])]
                out["window_lo"][pi, di, si] = np.nanpercentile(rows, 2.5, axis=0)
                out["window_hi"][pi, di, si] = np.nanpercentile(rows, 97.5, axis=0)
                boots = _boot_rates(succ, config.n_boot, [config.seed, 13])
                out["success_lo"][pi, di, si, :g] = np.percentile(boots, 2.5, axis=0)
                out["success_hi"][pi, di, si, :g] = np.percentile(boots, 97.5, axis=0)
            gr, o, n = m["growth"], m["outliers"], depth + 1
            out["growth_c"][pi, di], out["law_l0"][pi, di] = gr["growth_c"], m["l0"]
            out["spread"][pi, di, :n], out["proj_norm"][pi, di, :n] = m["spread"], gr["norm_last"]
            for key in ("sq_norm", "proj", "pred_dilution", "pred_product"):
                out[key][pi, di, :n] = gr[key]
            for key in ("n_mean_dominated", "count_observed", "count_expected"):
                out[key][pi, di, :n] = o[key]
            out["max_over_rms"][pi, di, :n] = o["max_over_rms"].max(axis=1)
            out["max_over_rms_median"][pi, di, :n] = np.median(o["max_over_rms"], axis=1)
            out["max_mean_over_sd"][pi, di, :n] = o["mean_over_sd"].max(axis=1)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    out.update(placements=list(config.placements), depths=list(config.depths),
               chance=1.0 / (config.n_random + 1), window_threshold=threshold,
               count_thresholds=list(COUNT_THRESHOLDS), mean_dominated=MEAN_DOMINATED,
               targets=[chr(int(t)) for t in _target_tokens(K)],
               train_tokens=config.steps * config.batch_size * config.seq_len)
    return out


def tiny(**overrides) -> DepthStudy:
    """A seconds-sized config for tests (depths 2 and 4, width 8).

    Parameters
    ----------
    **overrides
        Fields to change.

    Returns
    -------
    DepthStudy
    """
    base = DepthStudy(depths=(2, 4), d_model=8, n_heads=2, steps=6, batch_size=2, seq_len=16,
                      warmup=2, n_prompts=4, prompt_len=8, n_targets=2, n_random=4, n_heldout=2,
                      scales=(1.0,), max_inject_layers=2, n_outlier_prompts=2, n_boot=20)
    return replace(base, **overrides)


# ================================================================================ per-member study
#: Placements of a :class:`DepthMember`: Pre-LN, Post-LN, and Post-LN with the residual/branch
#: scales of :func:`~companion.stacks.residual.dslm_scales` on the usual Xavier initialisation (the
#: scaling half of Kedia et al. 2024, *not* their initialisation, hence not called "DSLM").
MEMBER_PLACEMENTS = ("pre", "post", "post_scaled")
#: Labels of :data:`MEMBER_PLACEMENTS` for tables and figures.
MEMBER_LABELS = {"pre": "Pre-LN", "post": "Post-LN", "post_scaled": "Post-LN, λ/β-scaled"}
#: Per-placement peak learning rate and warm-up steps chosen by the sweep of the chapter (section
#: "Training that works"); :func:`member` fills them in.
TUNED = {"pre": (3e-3, 60), "post": (1e-3, 100), "post_scaled": (3e-3, 60)}
#: LLM.int8() outlier criterion (Dettmers et al. 2022): ``|x| >= 6`` on the residual stream.
INT8_THRESHOLD = 6.0
READOUTS = ("later", "same")  #: the two readouts of :func:`readout_success` (see there)


@register("depth_member", schema=1)
@dataclass(frozen=True)
class DepthMember:
    """One member (placement x depth x seed) of the depth study, its own cached Result.

    Training: :func:`~companion.stacks.tinylm.train_tiny_lm` on the first ``1 - heldout_frac`` of
    the corpus documents (weights and data order seeded by ``seed``); held-out loss on the rest.
    Readout (:func:`readout_success`): at every stream index ``0..L`` of the untrained and the
    trained model; outliers (:func:`outlier_metrics`) at ``n_checkpoints + 1`` evenly spaced steps.

    Raises
    ------
    ValueError
        An unknown placement or dtype, a non-positive count, inconsistent sizes.

    Examples
    --------
    >>> m = member("post_scaled", 8, seed=1)
    >>> m.placement, m.depth, m.seed, m.lr, m.dtype
    ('post_scaled', 8, 1, 0.003, 'float32')
    """

    placement: str = "pre"  #: one of :data:`MEMBER_PLACEMENTS`
    depth: int = 4
    seed: int = 0  #: seeds the weights, the data order and the null directions
    d_model: int = 32
    n_heads: int = 4
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 60
    dtype: str = "float32"
    scaled_k: float = 2.0  #: budget of the ``post_scaled`` scales, ``beta^2 = k / (2 L)``
    heldout_frac: float = 0.1  #: trailing fraction of the corpus documents held out
    n_eval: int = 128  #: held-out windows of the held-out loss
    n_prompts: int = 16  #: held-out prompts of the readout
    span: int = 4  #: injected tokens (later readout)
    n_read: int = 4  #: later tokens read (after the span)
    context: int = 8  #: tokens before the span
    n_targets: int = 8  #: target bytes (the most frequent letters)
    n_null: int = 9  #: random null directions per (prompt, target) pair; chance ``1/(n_null + 1)``
    alpha: float = 2.0  #: injected norm in units of the layer's centred spread
    n_outlier_prompts: int = 16
    n_checkpoints: int = 4

    def __post_init__(self):
        check_choice(self.placement, "DepthMember.placement", MEMBER_PLACEMENTS)
        check_choice(self.dtype, "DepthMember.dtype", tuple(_DTYPES))
        for name in ("depth", "d_model", "n_heads", "steps", "batch_size", "seq_len", "n_eval", "n_prompts",
                     "span", "n_read", "context", "n_targets", "n_null", "n_outlier_prompts", "n_checkpoints"):
            check_int(getattr(self, name), f"DepthMember.{name}", minimum=1)
        check_int(self.seed, "DepthMember.seed", minimum=0)
        check_int(self.warmup, "DepthMember.warmup", minimum=0)
        check_real(self.lr, "DepthMember.lr", lo=0.0, lo_open=True)
        check_real(self.alpha, "DepthMember.alpha", lo=0.0, lo_open=True)
        check_real(self.heldout_frac, "DepthMember.heldout_frac", lo=0.0, lo_open=True, hi=0.5)
        check_real(self.scaled_k, "DepthMember.scaled_k", lo=0.0, lo_open=True, hi=2.0 * self.depth)
        if self.d_model % self.n_heads:
            raise ValueError(f"DepthMember.n_heads = {self.n_heads} must divide d_model = {self.d_model}")
        if self.prompt_len > self.seq_len:
            raise ValueError(f"DepthMember: context + span + n_read = {self.prompt_len} exceeds "
                             f"seq_len = {self.seq_len}")
        if self.n_targets > 26:
            raise ValueError(f"DepthMember.n_targets must be <= 26 (letters), got {self.n_targets}")
        if self.n_checkpoints > self.steps:
            raise ValueError(f"DepthMember.n_checkpoints = {self.n_checkpoints} exceeds steps = {self.steps}")

    @property
    def prompt_len(self) -> int:
        """Tokens of a readout prompt: ``context + span + n_read``."""
        return self.context + self.span + self.n_read

    def compute(self, device, progress: bool = False) -> dict:
        """Train and measure this member; returns the Result's arrays and scalars."""
        return _run_member(self, device)


#: The GPU size of a member (:func:`run_family` with ``base=GPU_MEMBER``): width 128, 4000 steps of
#: 32 x 128 bytes, five seeds (``GPU_SEEDS``), depths ``GPU_DEPTHS``.
GPU_MEMBER = DepthMember(d_model=128, steps=4000, batch_size=32, seq_len=128, warmup=400, n_prompts=32,
                         n_outlier_prompts=64, n_checkpoints=8)
GPU_DEPTHS = (4, 8, 16, 32, 64)
GPU_SEEDS = (0, 1, 2, 3, 4)
#: The stored CPU family (``DepthMember()`` size): the depths of each placement and the seeds of
#: every member.  Plain Post-LN stops at 32 layers: there it no longer trains at any learning rate
#: of its sweep (:class:`DepthLRSweep`), so its 64-layer members were not computed.
FAMILY_DEPTHS = {"pre": (4, 8, 16, 32, 64), "post": (4, 8, 16, 32), "post_scaled": (4, 8, 16, 32, 64)}
FAMILY_SEEDS = (0, 1, 2)
#: A (placement, depth) *trained* when every seed's held-out loss is at least this far (nats/byte)
#: below the unigram baseline (:func:`trained`); a collapsed model sits at the baseline.
TRAINED_MARGIN = 0.1


def member(placement: str, depth: int, seed: int = 0, base: DepthMember | None = None,
           tuned: bool = True, **overrides) -> DepthMember:
    """The :class:`DepthMember` ``base`` (default ``DepthMember()``) at ``placement``, ``depth``, ``seed``.

    Parameters
    ----------
    placement : {"pre", "post", "post_scaled"}
    depth, seed : int
    base : DepthMember, optional
    tuned : bool, default True
        Take ``lr`` and ``warmup`` from :data:`TUNED` (the warm-up scaled by ``base.steps / 600``).
    **overrides
        Other fields to change.

    Returns
    -------
    DepthMember
    """
    base = DepthMember() if base is None else base
    if not isinstance(base, DepthMember):
        raise TypeError(f"base must be a DepthMember, got {type(base).__name__}")
    check_choice(placement, "placement", MEMBER_PLACEMENTS)
    fields = dict(placement=placement, depth=depth, seed=seed)
    if tuned:
        lr, warm = TUNED[placement]
        fields.update(lr=lr, warmup=max(1, round(warm * base.steps / 600)))
    return replace(base, **{**fields, **overrides})


def member_stack_config(config: DepthMember) -> StackConfig:
    """The :class:`~companion.stacks.residual.StackConfig` of a :class:`DepthMember`."""
    lam, beta = dslm_scales(config.depth, config.scaled_k) if config.placement == "post_scaled" else (1.0, 1.0)
    return StackConfig(d_model=config.d_model, n_layers=config.depth, n_heads=config.n_heads,
                       placement="pre" if config.placement == "pre" else "post", block="both",
                       residual_scale=lam, branch_scale=beta, vocab_size=256, max_len=config.seq_len,
                       seed=config.seed)


def corpus_split(heldout_frac: float = 0.1) -> tuple[list[str], torch.Tensor]:
    """The training documents and the held-out bytes (the trailing ``heldout_frac`` of the documents).

    Examples
    --------
    >>> train, held = corpus_split(0.1)
    >>> len(train) > 800 and held.numel() > 40000
    True
    """
    check_real(heldout_frac, "heldout_frac", lo=0.0, lo_open=True, hi=0.5)
    docs = load_corpus()
    n = len(docs) - max(1, int(round(heldout_frac * len(docs))))
    return docs[:n], byte_tokenize(docs[n:])


def unigram_heldout(heldout_frac: float = 0.1) -> float:
    """Held-out cross-entropy (nats/byte) of the training bytes' unigram frequencies (add-1/2).

    The baseline every member must beat.
    """
    train, held = corpus_split(heldout_frac)
    counts = np.bincount(byte_tokenize(train).numpy(), minlength=256) + 0.5
    return float(-np.log(counts / counts.sum())[held.numpy()].mean())


def _windows(ids: torch.Tensor, n: int, length: int, offset: float = 0.0) -> torch.Tensor:
    """``[n, length]`` windows of ``ids`` evenly spaced (shifted by ``offset`` of a step)."""
    span = ids.numel() - length
    if span < n:
        raise ValueError(f"{ids.numel()} bytes cannot hold {n} windows of {length}")
    starts = ((np.arange(n) + offset) * span / n).astype(np.int64)
    return torch.stack([ids[s:s + length] for s in starts])


def rank_success(target: np.ndarray, nulls: np.ndarray) -> np.ndarray:
    """Rank test: the target's score is strictly above every null's (ties fail).

    If the target and its ``k`` nulls are exchangeable, this holds with probability exactly
    ``1/(k+1)`` when scores are continuous, and at most that with ties.

    Parameters
    ----------
    target : array [...]
    nulls : array [k, ...]

    Returns
    -------
    numpy.ndarray of bool [...]

    Examples
    --------
    >>> rank_success(np.array([2.0, 0.0]), np.array([[1.0, 0.0], [0.5, -1.0]])).tolist()
    [True, False]
    """
    target, nulls = np.asarray(target, dtype=float), np.asarray(nulls, dtype=float)
    if nulls.ndim < 1 or nulls.shape[1:] != target.shape or nulls.shape[0] < 1:
        raise ValueError(f"nulls must have shape [k, *target.shape] with k >= 1, got {nulls.shape} "
                         f"for target {target.shape}")
    return target > nulls.max(axis=0)


def chance_threshold(n_pairs: int, n_null: int, q: float = 0.99) -> float:
    """Smallest success rate that the exact binomial test of chance ``1/(n_null+1)`` rejects at level ``1 - q``.

    Examples
    --------
    >>> round(chance_threshold(128, 9), 4)
    0.1719
    """
    check_int(n_pairs, "n_pairs", minimum=1)
    check_int(n_null, "n_null", minimum=1)
    check_real(q, "q", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    p = 1.0 / (n_null + 1)
    return float((stats.binom.ppf(q, n_pairs, p) + 1) / n_pairs)


def detectable_rate(n_pairs: int, n_null: int, q: float = 0.99, power: float = 0.8) -> float:
    """Smallest true success rate that the test of :func:`chance_threshold` detects with ``power``.

    Examples
    --------
    >>> 0.19 < detectable_rate(128, 9) < 0.3
    True
    """
    check_real(power, "power", lo=0.0, lo_open=True, hi=1.0, hi_open=True)
    k = round(chance_threshold(n_pairs, n_null, q) * n_pairs)            # successes needed
    grid = np.linspace(1.0 / (n_null + 1), 1.0, 2001)
    ok = stats.binom.sf(k - 1, n_pairs, grid) >= power
    return float(grid[ok.argmax()])


def _member_directions(model: TinyLM, targets: np.ndarray, n_pairs_per_target: int, n_null: int,
                       seed) -> np.ndarray:
    """``[K, P, n_null + 2, d]`` unit centred directions: target row, ``n_null`` nulls, one held-out null.

    The nulls are drawn afresh for every (target, prompt) pair.
    """
    W = model.unembed.weight.detach().double().cpu().numpy()
    rows = W[targets] - W.mean(axis=0)                                      # [K, d]
    K, d = rows.shape
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((K, n_pairs_per_target, n_null + 2, d))
    dirs[:, :, 0] = rows[:, None]
    dirs -= dirs.mean(axis=-1, keepdims=True)
    return dirs / np.linalg.norm(dirs, axis=-1, keepdims=True)


@torch.no_grad()
def readout_success(model: TinyLM, ids: torch.Tensor, targets, n_null: int, alpha: float, span: int,
                    n_read: int, readout: str = "later", seed=0, chunk: int = 512) -> dict:
    r"""Injection success at every stream index, read at later tokens or at the injected token.

    For every (target byte ``t``, prompt) pair, the target's centred unembedding row and ``n_null``
    fresh random centred directions (plus one more, held out) are each injected with norm
    ``alpha`` times the layer's centred spread.  ``readout="later"``: injected at the ``span``
    tokens before the last ``n_read`` tokens, scored by the mean change of
    :math:`\log p(t)` at those last ``n_read`` tokens (so the signal must travel by attention; at
    ``\ell = L`` it cannot, and every score is 0).  ``readout="same"``: injected at the last token
    and read there (the logit-lens readout, a contrast that succeeds near the top by construction).
    A pair succeeds if the target direction's score beats every null (:func:`rank_success`).

    Parameters
    ----------
    model : TinyLM
    ids : LongTensor [P, T]
        Prompts; ``T > span + n_read`` for the later readout.
    targets : sequence of int
        Target bytes (``K``).
    n_null : int
    alpha : float
    span, n_read : int
    readout : {"later", "same"}
    seed : int or sequence
        Seed of the null directions.
    chunk : int
        Sequences per forward pass.

    Returns
    -------
    dict
        ``success`` bool [L+1, K, P]; ``null_success`` bool [L+1, K, P] (the held-out null scored as
        a target); ``score`` [L+1, K, P] (the target direction's score); ``spread`` [L+1].
    """
    if not isinstance(model, TinyLM):
        raise TypeError(f"model must be a TinyLM, got {type(model).__name__}")
    check_choice(readout, "readout", READOUTS)
    check_int(n_null, "n_null", minimum=1)
    check_int(span, "span", minimum=1)
    check_int(n_read, "n_read", minimum=1)
    check_real(alpha, "alpha", lo=0.0, lo_open=True)
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
        raise TypeError("ids must be a 2-D integer torch.Tensor [prompts, tokens]")
    P, T = ids.shape
    if readout == "later" and T <= span + n_read:
        raise ValueError(f"prompts of {T} tokens cannot hold a span of {span} and {n_read} later tokens")
    targets = np.asarray(targets, dtype=np.int64)
    K, N = len(targets), n_null + 2
    p = next(model.parameters())
    L = model.config.n_layers
    dirs = _member_directions(model, targets, P, n_null, seed)              # [K, P, N, d]
    if readout == "later":
        inj_pos, read = list(range(T - n_read - span, T - n_read)), slice(T - n_read, T)
    else:
        inj_pos, read = [T - 1], slice(T - 1, T)
    ids = ids.to(p.device)
    logits, base = model(ids)
    h = base.stream.double()
    spread = (h - h.mean(dim=(1, 2), keepdim=True)).pow(2).sum(-1).mean(dim=(1, 2)).sqrt().cpu().numpy()
    base_lp = torch.log_softmax(logits[:, read].double(), -1)               # [P, R, V]
    # rows of the batch: (k, p, n) flattened; prompt index p, target index k
    kk, pp, nn_ = np.meshgrid(np.arange(K), np.arange(P), np.arange(N), indexing="ij")
    kk, pp = kk.ravel(), pp.ravel()
    flat_dirs = dirs.reshape(-1, dirs.shape[-1])
    tgt = torch.as_tensor(targets[kk], device=p.device)
    score = np.empty((L + 1, K * P * N))
    for layer in range(L + 1):
        for s in range(0, len(kk), chunk):
            sl = slice(s, s + chunk)
            vec = torch.as_tensor(flat_dirs[sl] * alpha * spread[layer], dtype=p.dtype, device=p.device)
            lg, _ = model(ids[pp[sl]], inject_layer=layer, inject_vector=vec, inject_positions=inj_pos)
            lp = torch.log_softmax(lg[:, read].double(), -1)                # [b, R, V]
            idx = tgt[sl][:, None, None].expand(-1, lp.shape[1], 1)
            delta = lp.gather(-1, idx)[..., 0] - base_lp[pp[sl]].gather(-1, idx)[..., 0]
            score[layer, sl] = delta.mean(-1).cpu().numpy()
    score = score.reshape(L + 1, K, P, N)
    nulls = np.moveaxis(score[..., 1:N - 1], -1, 0)                          # [n_null, L+1, K, P]
    return dict(success=rank_success(score[..., 0], nulls),
                null_success=rank_success(score[..., N - 1], nulls),
                score=score[..., 0], spread=spread)


def outlier_metrics(stream) -> dict:
    """Standard outlier metrics of every layer of a stream ``[L+1, B, T, d]``.

    Returns
    -------
    dict
        ``frac_int8`` [L+1]: share of entries with ``|x| >= 6`` (LLM.int8()); ``dims_int8`` [L+1]:
        channels where ``|x| >= 6`` on at least 6% of the tokens; ``kurtosis`` [L+1]: the
        (non-excess) kurtosis of each token's ``d`` entries, averaged over tokens (3 for a
        Gaussian); ``top_to_median`` [L+1]: ``max |x|`` over ``median |x|``.

    Examples
    --------
    >>> x = torch.zeros(1, 1, 4, 5); x[0, 0, :, 0] = 8.0; x[0, 0, :, 1:] = 1.0
    >>> m = outlier_metrics(x)
    >>> m["frac_int8"].tolist(), m["dims_int8"].tolist(), m["top_to_median"].tolist()
    ([0.2], [1.0], [8.0])
    """
    x = stream.detach().double().cpu().numpy() if isinstance(stream, torch.Tensor) else np.asarray(stream, float)
    if x.ndim != 4 or x.shape[-1] < 2:
        raise ValueError(f"stream must have shape [L+1, B, T, d] with d >= 2, got {x.shape}")
    x = x.reshape(x.shape[0], -1, x.shape[-1])                               # [L+1, N, d]
    a = np.abs(x)
    big = a >= INT8_THRESHOLD
    c = x - x.mean(-1, keepdims=True)
    m2 = (c ** 2).mean(-1)
    kurt = np.where(m2 > 0, (c ** 4).mean(-1) / np.maximum(m2, 1e-300) ** 2, np.nan).mean(-1)
    med = np.median(a.reshape(a.shape[0], -1), axis=1)
    return dict(frac_int8=big.mean(axis=(1, 2)), dims_int8=(big.mean(axis=1) >= 0.06).sum(-1).astype(float),
                kurtosis=kurt, top_to_median=a.max(axis=(1, 2)) / np.maximum(med, 1e-300))


def _heldout_loss(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return _loss(model(ids)[0], ids)


def _train(config: DepthMember, train_docs, device, callback=None):
    """The trained model of a member and its training losses (:func:`~companion.stacks.tinylm.train_tiny_lm`)."""
    return train_tiny_lm(member_stack_config(config), train_docs, steps=config.steps,
                         batch_size=config.batch_size, seq_len=config.seq_len, lr=config.lr, seed=config.seed,
                         device=str(device), warmup=config.warmup, dtype=_DTYPES[config.dtype],
                         callback=callback)


def _run_member(config: DepthMember, device="cpu") -> dict:
    """Train and measure one member (:class:`DepthMember`)."""
    import time

    cpu0 = time.process_time()
    dtype = _DTYPES[config.dtype]
    train, held = corpus_split(config.heldout_frac)
    eval_ids = _windows(held, config.n_eval, config.seq_len).to(device)
    out_ids = _windows(held, config.n_outlier_prompts, config.seq_len, offset=0.5).to(device)
    prompts = _windows(held, config.n_prompts, config.prompt_len, offset=0.25)
    targets = _target_tokens(config.n_targets)
    cfg = member_stack_config(config)
    ckpts = np.unique(np.round(np.linspace(0, config.steps, config.n_checkpoints + 1)).astype(int))
    track = {k: [] for k in ("frac_int8", "dims_int8", "kurtosis", "top_to_median")}
    heldout_curve = []

    def callback(step, model):
        if step in ckpts:
            model.eval()
            with torch.no_grad():
                _, o = model(out_ids)
                for k, v in outlier_metrics(o.stream).items():
                    track[k].append(v)
                heldout_curve.append(_heldout_loss(model, eval_ids))
            model.train()

    res = {}
    init = TinyLM(cfg).to(device=device, dtype=dtype).eval()
    for name, mode in (("init_later", "later"), ("init_same", "same")):
        res[name] = readout_success(init, prompts, targets, config.n_null, config.alpha, config.span,
                                    config.n_read, mode, seed=[config.seed, 21])
    t0, c0 = time.perf_counter(), time.process_time()
    model, losses = _train(config, train, device, callback)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    for name, mode in (("later", "later"), ("same", "same")):
        res[name] = readout_success(model, prompts, targets, config.n_null, config.alpha, config.span,
                                    config.n_read, mode, seed=[config.seed, 22])
    out = dict(train_loss=losses, checkpoints=ckpts, heldout_curve=np.array(heldout_curve),
               **{f"outlier_{k}": np.array(v) for k, v in track.items()})
    for name, r in res.items():
        out[f"{name}_success"] = r["success"]
        out[f"{name}_null_success"] = r["null_success"]
        out[f"{name}_score"] = r["score"]
        out[f"{name}_spread"] = r["spread"]
    out.update(heldout_loss=heldout_curve[-1], init_heldout_loss=heldout_curve[0],
               unigram_heldout=unigram_heldout(config.heldout_frac), train_seconds=train_wall,
               train_cpu_seconds=train_cpu, cpu_seconds=time.process_time() - cpu0, chance=1.0 / (config.n_null + 1),
               threshold=chance_threshold(config.n_targets * config.n_prompts, config.n_null),
               targets=[chr(int(t)) for t in targets], label=MEMBER_LABELS[config.placement])
    return out


def family_root() -> "Path":
    """Folder of the stored members: ``companion/data/results/depth_study`` (members go in its
    ``depth_member/`` subfolder)."""
    from companion.experiments import stored_root
    return stored_root() / "depth_study"


def _packaged_member(config: DepthMember, roots):
    """The valid, current Result of ``config`` in the first of the read-only ``roots`` holding one, or None."""
    from companion.experiments import load_result, result_path, stale_reason

    for root in roots:
        path = result_path(config, root)
        if path.exists():
            try:
                result = load_result(path)
            except ValueError:
                continue
            if stale_reason(result, config) is None:
                return result
    return None


def trained(results) -> bool:
    """Whether every Result of ``results`` (the seeds of one placement and depth) trained: held-out
    loss at least :data:`TRAINED_MARGIN` below its unigram baseline.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> trained([NS(scalars={"heldout_loss": 2.0, "unigram_heldout": 2.99})])
    True
    >>> trained([NS(scalars={"heldout_loss": 2.98, "unigram_heldout": 2.99})])
    False
    """
    results = list(results)
    if not results:
        raise ValueError("trained() needs at least one Result")
    return all(r.scalars["heldout_loss"] <= r.scalars["unigram_heldout"] - TRAINED_MARGIN for r in results)


def run_family(placements=MEMBER_PLACEMENTS, depths=None, seeds=FAMILY_SEEDS,
               base: DepthMember | None = None, device=None, results_dir=None, compute: bool = True,
               progress: bool = False) -> dict:
    """Every member's Result, each cached on its own (a rerun resumes where one stopped).

    Parameters
    ----------
    placements, depths, seeds : sequences
        Default: every placement at its depths of :data:`FAMILY_DEPTHS`, and :data:`FAMILY_SEEDS`
        (the stored family).
    base : DepthMember, optional
        Sizes shared by every member (default ``DepthMember()``; :data:`GPU_MEMBER` at GPU size).
    device : str, optional
    results_dir : path, optional
        Where members are looked up and saved.  Default: looked up in the packaged members
        (:func:`family_root`), then in the folder where new members go: the same folder in a clone
        of the repository or under ``$COMPANION_RESULTS`` (Results to keep), else the user's cache
        (``depth_study/`` under :func:`~companion.experiments.cache_root`), so that an installed,
        read-only package is never written to.
    compute : bool, default True
        ``False``: only load; a missing member raises ``FileNotFoundError``.
    progress : bool

    Returns
    -------
    dict
        ``{(placement, depth, seed): Result}``.

    Raises
    ------
    ValueError
        No placement, depth or seed; or a member to compute whose folder cannot be written (the
        message says what to pass: ``results_dir=`` or ``$COMPANION_RESULTS``), before it is computed.
    FileNotFoundError
        ``compute=False`` and a member is stored in none of the folders.
    """
    from pathlib import Path

    from companion.experiments import load_result, result_path, run_cached
    from companion.experiments.store import _stored_target

    if results_dir is not None:
        roots = [Path(results_dir)]
    else:  # packaged members first (read only), then where new members go
        roots = list(dict.fromkeys([family_root(), _stored_target() / "depth_study"]))
    for p in placements:
        check_choice(p, "placement", MEMBER_PLACEMENTS)
    keys = [(p, int(d), int(s)) for p in placements for d in (FAMILY_DEPTHS[p] if depths is None else depths)
            for s in seeds]
    if not keys:
        raise ValueError("run_family needs at least one placement, depth and seed")
    configs = {k: member(*k, base=base) for k in keys}
    out = {}
    bar = progress_bar(len(keys), progress, "depth members")
    for k, cfg in configs.items():
        out[k] = _packaged_member(cfg, roots[:-1])
        if out[k] is None and compute:
            out[k] = run_cached(cfg, device=device, results_dir=roots[-1])
        elif out[k] is None:
            path = result_path(cfg, roots[-1])
            if not path.exists():
                raise FileNotFoundError(f"member {k} is not stored at {path}; run run_family(compute=True)")
            out[k] = load_result(path)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return out


@register("depth_lr_sweep", schema=1)
@dataclass(frozen=True)
class DepthLRSweep:
    """Held-out loss of one (placement, depth, seed) over a grid of peak learning rates and warm-ups.

    Every other field is that of :class:`DepthMember` (its default sizes); only the training runs
    (no readout), so a point costs the training time of a member.  The chapter uses it to choose a
    member's ``lr`` and ``warmup`` where :data:`TUNED` does not train it (:data:`TUNED_DEEP`).

    Raises
    ------
    ValueError
        An empty or non-positive grid; anything :class:`DepthMember` refuses.

    Examples
    --------
    >>> DepthLRSweep().lrs, DepthLRSweep().warmups
    ((0.0001, 0.0003, 0.001), (100, 300))
    """

    placement: str = "post"
    depth: int = 32
    seed: int = 0
    lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    warmups: tuple[int, ...] = (100, 300)
    d_model: int = 32
    n_heads: int = 4
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 64
    dtype: str = "float32"
    heldout_frac: float = 0.1
    n_eval: int = 128

    def __post_init__(self):
        if not self.lrs or not self.warmups:
            raise ValueError("DepthLRSweep.lrs and warmups must be non-empty")
        for lr in self.lrs:
            check_real(lr, "DepthLRSweep.lrs", lo=0.0, lo_open=True)
        for w in self.warmups:
            check_int(w, "DepthLRSweep.warmups", minimum=0)
        self.member(self.lrs[0], self.warmups[0])                           # DepthMember's own checks

    def member(self, lr: float, warmup: int) -> DepthMember:
        """The :class:`DepthMember` trained at one grid point."""
        return DepthMember(placement=self.placement, depth=self.depth, seed=self.seed, lr=lr, warmup=warmup,
                           d_model=self.d_model, n_heads=self.n_heads, steps=self.steps,
                           batch_size=self.batch_size, seq_len=self.seq_len, dtype=self.dtype,
                           heldout_frac=self.heldout_frac, n_eval=self.n_eval)

    def compute(self, device, progress: bool = False) -> dict:
        """Train at every grid point; ``heldout_loss`` ``[lrs, warmups]`` (nats/byte)."""
        import time

        cpu0 = time.process_time()
        train, held = corpus_split(self.heldout_frac)
        eval_ids = _windows(held, self.n_eval, self.seq_len).to(device)
        loss = np.full((len(self.lrs), len(self.warmups)), np.nan)
        final_train = np.full_like(loss, np.nan)
        bar = progress_bar(loss.size, progress, "learning-rate sweep")
        for i, lr in enumerate(self.lrs):
            for j, w in enumerate(self.warmups):
                model, losses = _train(self.member(lr, w), train, device)
                model.eval()
                loss[i, j] = _heldout_loss(model, eval_ids)
                final_train[i, j] = float(np.mean(losses[-50:]))
                if bar is not None:
                    bar.update()
        if bar is not None:
            bar.close()
        return dict(heldout_loss=loss, final_train_loss=final_train,
                    unigram_heldout=unigram_heldout(self.heldout_frac),
                    cpu_seconds=time.process_time() - cpu0)
