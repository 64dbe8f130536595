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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from companion.theory import exceedance
from companion.injection import metrics as fw
from companion._validation import check_int
from companion.corpus import load_corpus
from companion.experiments import progress_bar, register
from companion.stacks.residual import StackConfig, dslm_scales
from companion.stacks.tinylm import TinyLM, byte_tokenize, train_tiny_lm

__all__ = ["DepthStudy", "GPU_CONFIG", "PLACEMENTS", "member_config", "inject_layers", "train_member",
           "measure_model"]

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
