"""The one injection engine for random stacks, trained stacks and real models.

:func:`sweep_injections` adds ``c * v`` to ``h_l`` (the output of block ``l - 1``) at chosen
positions and replays only blocks ``l .. L-1`` from the baseline, through an adapter that
checks the model once.  :func:`sweep_stack_injections` (stacks) and
:func:`track_injection` (real models, per position group) measure every layer and the output
with :mod:`companion.injection.metrics`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from companion.injection import metrics as pt
from companion._validation import check_bool, check_int, check_layer, check_real, is_int, is_real, real_array
from companion.injection.directions import GROUPS, InjectionPrompts, _random_direction, typical_norms
from companion.transformers.models import LoadedModel, check_model
from companion.transformers.stream import ModelAdapter
from companion.stacks.tinylm import StackAdapter

__all__ = [
    "sweep_injections", "SweepResult", "EFFECT_KINDS", "sweep_stack_injections",
    "track_injection"]

#: Output effects a :class:`SweepResult` can hold.  Per token: ``output_change``
#: ``||y_inj - y_base|| / ||y_base||`` and ``output_projection`` ``(y_inj - y_base)·v / ||y_base||``
#: of a stack's final output, ``kl`` (:func:`~companion.injection.metrics.next_token_kl`); per
#: sequence: ``kl_last`` (last token of a causal LM), ``embedding_change`` (mean-pooled encoder state).
EFFECT_KINDS = ("output_change", "output_projection", "kl", "kl_last", "embedding_change")
_PER_SEQUENCE = ("kl_last", "embedding_change")


def _adapt(model, inputs, max_length: int | None = None):
    """The adapter through which the engine runs ``model`` on ``inputs`` (checks the model)."""
    if isinstance(model, LoadedModel):
        return ModelAdapter(model, inputs, max_length)
    return StackAdapter(model, inputs)


def _injection_layers(layers, L: int, model: str, increasing: bool = False) -> tuple:
    """``layers`` (``"all"``, an int or distinct ints in ``[0, L]``) as a tuple."""
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"layers must be a list of integers or 'all', got {layers!r}")
        return tuple(range(L + 1))
    if is_int(layers):
        layers = [layers]
    if isinstance(layers, bytes) or not isinstance(layers, (Sequence, np.ndarray, range)):
        raise TypeError(f"layers must be 'all', an integer or a sequence of integers, got {layers!r}")
    if len(layers) == 0:
        raise ValueError(f"layers is empty; pass a non-empty list of injection layers in [0, {L}] or 'all'")
    out = tuple(check_layer(x, L, model, "every layer") for x in layers)
    if increasing and any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"layers must be strictly increasing, got {list(out)}")
    if len(set(out)) != len(out):
        raise ValueError(f"layers contains repeats: {out}")
    return out


def _unit_directions(directions, d: int, n: int | None = None) -> np.ndarray:
    """``directions`` (``[d]``, or ``[n, d]`` / one ``[d]`` for all) divided by their (non-zero) norms."""
    name = "direction" if n is None else "directions"
    dirs = real_array(name, directions)
    if n is not None and dirs.shape == (d,):
        dirs = np.broadcast_to(dirs, (n, d))
    if dirs.shape != ((d,) if n is None else (n, d)):
        shapes = f"({d},)" + ("" if n is None else f" or ({n}, {d})")
        raise ValueError(f"{name} must have shape {shapes}, got {dirs.shape}")
    unit, zero = pt._unit_vectors(dirs, flat=n is None)
    if np.any(zero):
        raise ValueError(f"{name} must be non-zero: a zero vector has no direction")
    return unit


def _arity(fn) -> int:
    """Number of positional parameters ``fn`` accepts (a large number for ``*args``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@dataclass(frozen=True)
class SweepResult:
    r"""What every injection sweep returns: the streams, or the measurements you asked for.

    Runs are indexed ``[layer]`` for a scalar scale, ``[layer, scale]`` otherwise; a field a
    sweep does not fill is ``None``.  The last five fields are filled for stacks only.
    """

    layers: np.ndarray  #: Injection layers in ``[0, L]``.
    scales: float | np.ndarray  #: The magnitude(s) as given.
    n_layers: int  #: Depth ``L``.
    baseline: torch.Tensor | None = None  #: The run without injection, ``[L+1, batch, tokens, d]``.
    #: ``[runs..., L+1, ...]``: streams, or what ``measure`` returned (:func:`sweep_injections`).
    injected: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None  #: Real tokens, ``[batch, tokens]``.
    injected_mask: torch.Tensor | None = None  #: The positions that received the vector, ``[batch, tokens]``.
    #: :func:`~companion.injection.metrics.perturbation_metrics` per run and layer,
    #: ``[runs..., L+1, batch, tokens]`` or ``[..., batch, len(groups)]``.
    metrics: dict | None = None
    #: Position groups of the metrics' last axis (:data:`~companion.injection.directions.GROUPS`).
    groups: tuple | None = None
    effects: dict | None = None  #: Output effect per run keyed by :data:`EFFECT_KINDS`.
    effect_name: str | None = None  #: The default kind of :meth:`effect`.
    coefficient: np.ndarray | None = None  #: Length of the added vector of each run.
    relative: bool | None = None  #: Whether scales were relative to the stream's size.
    model: str | None = None  #: Name of a real model.
    typical_norm: np.ndarray | None = None  #: Magnitude unit per layer, ``[L+1]`` (:func:`track_injection`).
    base_norm: np.ndarray | None = None  #: ``||h_l||`` per position.
    base_sq_norm: np.ndarray | None = None  #: :math:`\mathbb E\|h_l\|^2` per layer.
    direction: np.ndarray | None = None  #: The unit direction.
    placement: str | None = None  #: ``"pre"`` or ``"post"``.
    #: The skip-path prediction of ``metrics["projection"]``.
    predicted_projection: np.ndarray | None = None

    def mean(self, metric: str, where: str | None = None) -> np.ndarray:
        """A metric averaged over prompts and positions (NaN left out), shape ``[runs..., L+1]``.

        Parameters
        ----------
        metric : str
            A key of ``metrics``.
        where : str, optional
            A position group (default ``"last"``), or for per-token metrics a set of
            :meth:`position_mask` (default ``"all"``).

        Returns
        -------
        numpy.ndarray
            The means.

        Raises
        ------
        ValueError
            For an unknown metric, group or position set.
        """
        if not self.metrics or metric not in self.metrics:
            raise ValueError(f"unknown metric {metric!r}; choose from {sorted(self.metrics or ())}")
        if self.groups is not None:
            where = "last" if where is None else where
            if where not in self.groups:
                raise ValueError(f"unknown group {where!r}; choose from {self.groups}")
            a = self.metrics[metric][..., self.groups.index(where)]
        else:
            a = self.metrics[metric][..., self.position_mask(where or "all")]
            a = a.reshape(*a.shape[:-2], -1)
        return _nanmean(a, np.isfinite(a))

    def effect(self, kind: str | None = None, positions: str = "all") -> np.ndarray:
        """Output effect of each run averaged over prompts (and tokens), shape ``[runs...]``.

        Parameters
        ----------
        kind : str, optional
            One of :data:`EFFECT_KINDS` (default ``effect_name``); ``"output_projection"`` gives
            the absolute mean.
        positions : {"all", "injected", "later"}
            Tokens averaged for per-token kinds (:meth:`position_mask`).

        Returns
        -------
        numpy.ndarray
            The effects.

        Raises
        ------
        ValueError
            For an unknown or unmeasured ``kind`` or ``positions``.
        """
        kind = self.effect_name if kind is None else kind
        if kind is None:
            raise ValueError("this sweep measured no output effect (sweep_injections keeps the streams); "
                             "use sweep_stack_injections or track_injection")
        if kind not in EFFECT_KINDS:
            raise ValueError(f"kind must be one of {EFFECT_KINDS}, got {kind!r}")
        if not self.effects or kind not in self.effects:
            hint = "; kind='kl' needs a language model (TinyLM)" if kind == "kl" else ""
            raise ValueError(f"this sweep did not measure {kind!r} (it has {sorted(self.effects or ())}){hint}")
        values = self.effects[kind]
        if kind in _PER_SEQUENCE:
            return values.mean(-1)
        mean = values[..., self.position_mask(positions)].mean(axis=(-2, -1))
        return np.abs(mean) if kind == "output_projection" else mean

    def position_mask(self, positions: str = "all") -> np.ndarray:
        """Boolean mask over tokens: ``"all"``, ``"injected"`` or ``"later"`` (after the last injected one).

        Parameters
        ----------
        positions : {"all", "injected", "later"}, default "all"

        Returns
        -------
        numpy.ndarray of bool, shape ``[tokens]``
            The mask.

        Raises
        ------
        ValueError
            For another name, differing injected positions, or no token after the injection.
        """
        if positions not in ("all", "injected", "later"):
            raise ValueError(f"positions must be 'all', 'injected' or 'later', got {positions!r}")
        sel = None if self.injected_mask is None else np.asarray(self.injected_mask)
        if sel is None or sel.ndim != 2 or not (sel == sel[:1]).all():
            raise ValueError("position sets need the same injected positions in every sequence")
        sel = sel[0]
        if positions == "all":
            return np.ones_like(sel)
        if positions == "injected":
            return sel.copy()
        mask = np.zeros_like(sel)
        mask[int(np.flatnonzero(sel)[-1]) + 1 :] = True
        if not mask.any():
            raise ValueError("no token lies after the last injected position")
        return mask

    def window(self, threshold: float = 0.5, kind: str | None = None, positions: str = "all",
               relative: bool = True, contiguous: bool = True, scale_index: int = 0) -> pt.Window:
        """:func:`~companion.injection.metrics.effect_window` of :meth:`effect`.

        Parameters
        ----------
        threshold, kind, positions, relative, contiguous : optional
            ``kind`` and ``positions`` as in :meth:`effect`, the others as in
            :func:`~companion.injection.metrics.effect_window`.
        scale_index : int, default 0
            Which magnitude, when the sweep ran several.

        Returns
        -------
        companion.injection.metrics.Window
            The window.

        Raises
        ------
        ValueError
            If ``scale_index`` is out of range, and as :meth:`effect`.
        """
        e = self.effect(kind, positions)
        s = check_int(scale_index, "scale_index", 0)
        if s >= (e.shape[1] if e.ndim == 2 else 1):
            raise ValueError(f"scale_index must be < {e.shape[1] if e.ndim == 2 else 1}, got {s}")
        return pt.effect_window(
            e[:, s] if e.ndim == 2 else e, layers=self.layers.astype(int), n_layers=self.n_layers,
            threshold=threshold, relative=relative, contiguous=contiguous)

    def effect_at(
        self, layer: int, kind: str = "relative_projection", positions: str = "all"
    ) -> tuple[np.ndarray, np.ndarray]:
        r"""Effect read at stream index ``layer`` of the injections made below it (stacks).

        Block ``l`` of a stack depends only on ``(seed, l)``, so reading index ``m`` of a deep
        stack gives the stack of depth ``m``: one sweep serves every depth.

        Parameters
        ----------
        layer : int
            Stream index ``m`` in ``[1, L]``.
        kind : {"relative_projection", "relative_size"}
            :math:`|\operatorname{mean}(p_m/\|h_m\|)|` or :math:`\operatorname{mean}(\|\delta_m\|/\|h_m\|)`.
        positions : {"all", "injected", "later"}
            Tokens averaged (:meth:`effect`).

        Returns
        -------
        (numpy.ndarray of int, numpy.ndarray)
            The injection layers below ``m`` and their effects.

        Raises
        ------
        TypeError, ValueError
            If ``layer`` is not an integer (TypeError), out of range or without an injection below,
            or for an unknown ``kind``/``positions``.
        """
        m = check_int(layer, "layer", 1)
        if m > self.n_layers:
            raise ValueError(f"layer must be in [1, {self.n_layers}], got {m}")
        lay = self.layers
        keep = lay < m
        if not keep.any():
            raise ValueError(f"no injection layer of this sweep lies below layer {m}")
        pos = self.position_mask(positions)
        if kind == "relative_projection":
            vals = self.metrics["projection"][keep, m] / self.base_norm[m]
            return lay[keep], np.abs(vals[:, :, pos].mean(axis=(1, 2)))
        if kind == "relative_size":
            vals = self.metrics["relative_size"][keep, m]
            return lay[keep], vals[:, :, pos].mean(axis=(1, 2))
        raise ValueError(f"kind must be 'relative_projection' or 'relative_size', got {kind!r}")


def sweep_injections(model, inputs, layers, vector, scale=1.0, positions=None, measure: Callable | None = None,
                     max_batch_tokens: int = 16384, max_length: int | None = None) -> SweepResult:
    """Baseline run and one injected run per (layer, scale), sharing all common computation.

    At block ``i`` all runs injected at ``l <= i`` are stacked into one batch: about
    ``L(L+1)/2`` block calls instead of ``L(L+1)``.  Equals
    :func:`companion.transformers.stream.inject` to ``1e-4``, a stack's
    ``forward(inject_layer=...)`` bit for bit.

    Parameters
    ----------
    model : LoadedModel, ResidualStack, TinyLM, ModelAdapter or StackAdapter
        The model (an adapter is used as it is, without a second check).
    inputs : texts, encoding, ``[B, T, d]`` stream or ``[B, T]`` token ids
        As ``model`` takes them; ignored when ``model`` is an adapter.
    layers : sequence of int in ``[0, L]``, or ``"all"``
        Injection layers, without repeats.
    vector : array, shape ``[d]`` or ``[n_layers, d]``
        One vector for every layer, or one per injection layer.
    scale : float or sequence of float
        Magnitude(s) ``c`` of the injected ``c * v``.
    positions : None, sequence of int, or bool array ``[batch, tokens]``
        Positions that receive the vector (:func:`companion.transformers.stream.position_mask`).
    measure : callable, optional
        ``measure(h_injected [K, batch, tokens, d], h_base) -> [K, ...]``, applied at every layer
        (the streams are never all held); with four parameters also ``(layer, conditions)``,
        ``conditions`` ``[K, 2]`` (layer index, scale index).
    max_batch_tokens : int, default 16384
        Most token rows through a block at once (real models).
    max_length : int or None
        Truncation length of a real model's texts.

    Returns
    -------
    SweepResult
        With ``baseline``, ``injected``, ``attention_mask`` and ``injected_mask``.

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type (TypeError); a layer out of range or repeated, a bad or
        overflowing vector, a non-finite scale, empty texts or bad positions.

    Examples
    --------
    >>> sw = sweep_injections(m, texts, "all", v, scale=[2.0, 8.0])   # doctest: +SKIP
    """
    ad = model if isinstance(model, (ModelAdapter, StackAdapter)) else _adapt(model, inputs, max_length)
    L = ad.n_layers
    layers = _injection_layers(layers, L, ad.name)
    scalar = not isinstance(scale, (Sequence, np.ndarray, torch.Tensor))
    scales = (check_real(scale, "scale"),) if scalar else tuple(check_real(s, "every scale") for s in list(scale))
    if len(scales) == 0:
        raise ValueError("scale must be a number or a non-empty list of numbers")
    vec = ad.check_vector(vector, len(layers), scales)
    if vec.ndim == 1:
        vec = vec.expand(len(layers), -1)
    check_int(max_batch_tokens, "max_batch_tokens", 1)
    if measure is not None and not callable(measure):
        raise TypeError("measure must be a callable measure(h_injected, h_base) or None")
    sw = _sweep(ad, layers, vec, scales, ad.position_mask(positions), measure, max_batch_tokens)
    if scalar:
        return replace(sw, injected=sw.injected[:, 0], scales=scales[0])
    return sw


def _sweep(ad, layers: tuple, vec: torch.Tensor, scales: tuple, sel: torch.Tensor, measure,
           max_batch_tokens: int) -> SweepResult:
    """The engine of :func:`sweep_injections` on checked arguments (runs ``[layer, scale]``)."""
    L = ad.n_layers
    base = ad.baseline
    batch, tokens = sel.shape
    selmask = sel.unsqueeze(-1).to(ad.dtype)
    full_args = measure is not None and _arity(measure) >= 4
    # conditions (layer index j, scale index s), ordered by injection layer
    conds = sorted(((j, s) for j in range(len(layers)) for s in range(len(scales))), key=lambda c: layers[c[0]])
    per_batch = 1 if isinstance(ad, StackAdapter) else max(1, int(max_batch_tokens) // (batch * tokens))
    out: torch.Tensor | None = None   # [conditions in (layer, scale) order, L+1, ...], filled in place

    def store(h, i, group):
        """Store ``measure`` (or the streams) of the runs ``group`` ``[K, B, T, d]`` at layer ``i``."""
        nonlocal out
        if full_args:
            h = measure(h, base[i], i, torch.tensor(group, dtype=torch.long).reshape(-1, 2))
        elif measure is not None:
            h = measure(h, base[i])
        if out is None:
            out = h.new_empty((len(conds), L + 1, *h.shape[1:]))
        for k, c in enumerate(group):
            out[c[0] * len(scales) + c[1], i] = h[k]

    with torch.no_grad():
        for start in range(0, len(conds), per_batch):
            chunk = conds[start:start + per_batch]
            active: list[tuple[int, int]] = []
            h = None
            for i in range(L + 1):
                entering = [c for c in chunk if layers[c[0]] == i]
                if entering:
                    new = torch.stack([base[i] + (scales[s] * vec[j]) * selmask for j, s in entering])
                    if not bool(torch.isfinite(new).all()) and bool(torch.isfinite(base[i]).all()):
                        raise ValueError(
                            f"h_{i} + scale·vector overflows {new.dtype} (max {torch.finfo(new.dtype).max:.4g};"
                            f" the stream already holds values up to {float(base[i].abs().max()):.4g}): "
                            f"use smaller scales or a wider dtype")
                    new = new.reshape(len(entering) * batch, tokens, -1)
                    h = new if h is None else torch.cat([h, new])
                    active.extend(entering)
                if active:
                    store(h.reshape(len(active), batch, tokens, -1), i, active)
                waiting = [c for c in chunk if layers[c[0]] > i]
                if waiting:  # runs not injected yet equal the baseline at this layer
                    store(base[i].unsqueeze(0).expand(len(waiting), -1, -1, -1), i, waiting)
                if i < L and active:
                    h = ad.block(i, h, len(active))

    injected = out.reshape(len(layers), len(scales), *out.shape[1:])
    return SweepResult(
        layers=np.asarray(layers), scales=np.asarray(scales), n_layers=L,
        baseline=torch.stack(base), injected=injected, attention_mask=ad.attention_mask,
        injected_mask=sel)


def sweep_stack_injections(model, inputs, layers=None, scale: float = 0.1, relative: bool = True, direction=None,
                           positions=None, seed: int = 0) -> SweepResult:
    r"""Inject :math:`a_\ell v` at every layer of a stack in turn and measure what follows.

    The skip-path prediction: :func:`~companion.injection.metrics.postln_contraction_factors`.

    Parameters
    ----------
    model : companion.stacks.residual.ResidualStack or companion.stacks.tinylm.TinyLM
    inputs : torch.Tensor
        ``[B, T, d]`` stream (ResidualStack) or ``[B, T]`` token ids (TinyLM).
    layers : sequence of int, optional
        Strictly increasing injection layers in ``[0, L]`` (default ``0 .. L-1``).
    scale : float, default 0.1
        :math:`a_\ell` = ``scale`` times the baseline's RMS norm at ``l`` (``relative``), else ``scale``.
    relative : bool, default True
    direction : array_like, shape ``[d]``, optional
        Direction ``v`` (default :func:`~companion.injection.directions.random_direction` with ``seed``).
    positions : int or sequence of int, optional
        Token positions that receive the vector (default all).
    seed : int, default 0
        Seed of the default direction.

    Returns
    -------
    SweepResult
        ``metrics`` ``[K, L+1, B, T]``; ``effects`` ``output_change``, ``output_projection`` (and
        ``kl`` for a TinyLM); ``predicted_projection``, ``base_norm``, ``base_sq_norm``,
        ``direction``, ``placement``, ``coefficient``.

    Raises
    ------
    TypeError, ValueError
        If ``model`` is not a stack or an argument has the wrong type (TypeError); if ``scale <= 0``,
        ``layers`` is bad, ``direction`` is bad or zero, or the vectors overflow.

    Examples
    --------
    >>> from companion.stacks.residual import StackConfig, ResidualStack
    >>> stack = ResidualStack(StackConfig(d_model=16, n_layers=3, n_heads=2, placement="post"))
    >>> sweep_stack_injections(stack, torch.randn(2, 4, 16), scale=1e-4).metrics["projection"].shape
    (3, 4, 2, 4)
    """
    ad = StackAdapter(model, inputs)
    stack, is_lm = ad.stack, ad.lm is not None
    cfg = stack.config
    n_layers, d = cfg.n_layers, cfg.d_model
    scale = check_real(scale, "scale", lo=0.0, lo_open=True)
    relative = check_bool(relative, "relative")
    seed = check_int(seed, "seed", 0)
    lay = np.asarray(_injection_layers(range(n_layers) if layers is None else layers, n_layers,
                                       ad.name, increasing=True))
    v = _unit_directions(_random_direction(d, seed) if direction is None else direction, d)
    v_t = torch.as_tensor(v, dtype=ad.dtype, device=ad.device)
    v_hat = pt._unit_vectors(v)[0]  # as perturbation_metrics normalises a direction

    base = ad.record                                     # the baseline StackOutput
    stream_b = base.stream                               # [L+1, B, T, d]
    mask_np = ad.position_mask(positions)[0].cpu().numpy()  # [T]
    base_sq = stream_b.double().pow(2).sum(-1)           # [L+1, B, T]
    sq = base_sq.mean(dim=(1, 2)).cpu().numpy()          # [L+1]
    base_norm = base_sq.sqrt().cpu().numpy()
    amps = scale * np.sqrt(sq[lay]) if relative else np.full(lay.size, scale)
    top = float(torch.finfo(ad.dtype).max)
    if not np.all(amps * float(v_t.abs().max()) <= top):
        raise ValueError(f"the injected vectors a_l v reach {np.max(amps):.4g} in norm, beyond the range "
                         f"of the stack's dtype {ad.dtype} (max {top:.4g}); use a smaller scale")

    # skip-path factors of the baseline: [L, B, T]
    lam = cfg.residual_scale
    n_sub = base.sublayer_norm_input.shape[1]
    if cfg.placement == "post":
        ln_w = torch.stack([torch.stack([sub.norm.weight for sub in blk.sublayers]) for blk in stack.blocks])
        f = pt.postln_contraction_factors(  # [L, S, B, T]; ln_w is [L, S, d]
            base.sublayer_norm_input, eps=cfg.eps, residual_scale=lam, v=v, norm=cfg.norm,
            ln_weight=ln_w.detach().double().cpu().numpy()[:, :, None, None, :])
        factors = np.prod(f, axis=1)
    else:
        factors = np.full(stream_b.shape[1:3], lam**n_sub)[None].repeat(n_layers, axis=0)

    K = lay.size
    with torch.no_grad():
        final_b = ad.output(stream_b[-1]).double()
        logits_b = ad.logits(stream_b[-1]) if is_lm else None
    final_b_norm = final_b.norm(dim=-1)
    v_t64 = torch.as_tensor(v, dtype=torch.float64, device=ad.device)
    output_change = np.empty((K,) + tuple(stream_b.shape[1:3]))
    output_projection = np.empty_like(output_change)
    kl = np.empty_like(output_change) if is_lm else None

    def measure(h_inj, h_base, layer, conditions):        # h_inj: [1, B, T, d], one run
        m = pt._perturbation_metrics(h_base[None], h_inj, v_hat)
        if layer == n_layers:
            k = int(conditions[0, 0])
            dy = ad.output(h_inj[0]).double() - final_b
            output_change[k] = (dy.norm(dim=-1) / final_b_norm).cpu().numpy()
            output_projection[k] = ((dy @ v_t64) / final_b_norm).cpu().numpy()
            if is_lm:
                kl[k] = pt.next_token_kl(logits_b, ad.logits(h_inj[0]))
        return torch.from_numpy(np.stack([m[name][0] for name in pt.METRIC_NAMES]))[None]

    vectors = torch.stack([float(a) * v_t for a in amps])
    sw = _sweep(ad, tuple(lay.tolist()), vectors, (1.0,), ad.position_mask(positions), measure, 1)
    got = sw.injected[:, 0].numpy()                       # [K, L+1, n_metric, B, T]
    metrics = {name: np.ascontiguousarray(got[:, :, i]) for i, name in enumerate(pt.METRIC_NAMES)}
    predicted = np.stack([pt.predicted_projection(factors, ell, amps[k] * mask_np[None, :])
                          for k, ell in enumerate(lay.tolist())])
    effects = {"output_change": output_change, "output_projection": output_projection}
    if is_lm:
        effects["kl"] = kl
    return SweepResult(
        layers=lay.astype(int), scales=scale, n_layers=n_layers, baseline=sw.baseline,
        attention_mask=sw.attention_mask, injected_mask=sw.injected_mask, metrics=metrics,
        effects=effects, effect_name="output_change",
        coefficient=np.asarray(amps, dtype=np.float64), relative=relative, base_norm=base_norm,
        base_sq_norm=sq, direction=v, placement=cfg.placement, predicted_projection=predicted)


def _prompts_adapter(m, prompts) -> ModelAdapter:
    """The adapter of ``m`` on ``prompts`` (the one check of the model); TypeError for other prompts."""
    if not isinstance(prompts, InjectionPrompts):
        check_model(m)
        raise TypeError("prompts must be InjectionPrompts from companion.injection.directions.make_prompts, "
                        f"got {type(prompts).__name__}")
    return ModelAdapter(m, prompts.encoding)


def _nanmean(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the ``values`` where ``ok`` (NaN where none is)."""
    n = ok.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(ok, values, 0.0).sum(-1) / np.maximum(n, 1), np.nan)


def _group_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` ``[K, B, T]``, ``groups`` ``[G, B, T]`` bool -> NaN-aware means ``[K, B, G]``."""
    return np.moveaxis(_nanmean(values[:, None], groups[None] & np.isfinite(values)[:, None]), 1, 2)


def _check_scales(scales) -> np.ndarray:
    """``scales`` (a number or a non-empty sequence of numbers > 0) as an array."""
    if is_real(scales):
        scales = [scales]
    if isinstance(scales, (str, bytes)) or not isinstance(scales, (Sequence, np.ndarray)):
        raise TypeError("scales must be a number or a sequence of numbers")
    out = [check_real(s, "every scale", lo=0.0, lo_open=True) for s in scales]
    if not out:
        raise ValueError("scales is empty; pass at least one magnitude")
    return np.asarray(out)


def track_injection(m, prompts: InjectionPrompts, layers, directions, scales, relative: bool = True,
                    norms=None, max_batch_tokens: int = 16384, centre=None) -> SweepResult:
    r"""Inject ``c * v_hat`` into a real model at each layer and magnitude; measure every layer and the output.

    One :func:`sweep_injections` whose ``measure`` keeps only the group means and the output
    row: memory O(runs x (layers + d) x batch).  Chapter :doc:`/book/injection_real_models`.

    Parameters
    ----------
    m : LoadedModel
    prompts : InjectionPrompts
        From :func:`companion.injection.directions.make_prompts` for ``m``.
    layers : sequence of int
        Strictly increasing injection layers in ``[0, L]``.
    directions : array_like, shape ``[d]`` or ``[n_inj, d]``
        One direction for all layers or one per layer (normalised here).
    scales : float or sequence of float
        Magnitudes > 0: :math:`\alpha` with ``c = alpha * norms[l]`` (``relative``), else ``c``.
    relative : bool, default True
    norms : array_like, shape ``[L+1]``, optional
        Magnitude unit per layer (default: :func:`~companion.injection.directions.typical_norms`).
    max_batch_tokens : int, default 16384
        As in :func:`sweep_injections`.
    centre : array_like, shape ``[L+1, d]``, optional
        Also measure the ``*_centred`` metrics on :math:`h - \mu_\ell`.

    Returns
    -------
    SweepResult
        ``metrics`` ``[n_inj, n_scales, L+1, batch, 3]`` (groups
        :data:`~companion.injection.directions.GROUPS`), ``effects`` ``kl_last`` (causal LM) or
        ``embedding_change`` (encoder) ``[n_inj, n_scales, batch]``, ``coefficient``, ``typical_norm``.

    Raises
    ------
    TypeError, ValueError
        For wrong argument types (TypeError); bad layers, directions, scales, ``norms`` or ``centre``,
        or overflowing vectors.

    Examples
    --------
    >>> tr = track_injection(m, p, [0, 3, 6], random_unit_vectors(m.d_model)[0], [0.5, 2.0])  # doctest: +SKIP
    >>> tr.mean("relative_size", "last").shape                                                # doctest: +SKIP
    (3, 2, 31)
    """
    ad = _prompts_adapter(m, prompts)
    relative = check_bool(relative, "relative")
    L, d = m.n_layers, m.d_model
    lay = list(_injection_layers(layers, L, m.name, increasing=True))
    unit = _unit_directions(directions, d, len(lay))
    sc = _check_scales(scales)
    if norms is None:
        norms = typical_norms(torch.stack(ad.baseline), prompts.injected)
    norms = real_array("norms", norms)
    if norms.shape != (L + 1,) or np.any(norms <= 0):
        raise ValueError(f"norms must be {L + 1} positive numbers (one per layer), got shape {norms.shape}")
    if centre is not None:
        centre = real_array("centre", centre)
        if centre.shape != (L + 1, d):
            raise ValueError(f"centre must have shape [L+1, d] = {(L + 1, d)}, got {centre.shape}")
    factor = norms[lay] if relative else np.ones(len(lay))
    coefficient = factor[:, None] * sc[None, :]

    groups = prompts.groups.numpy()
    mask = prompts.encoding["attention_mask"].to("cpu", torch.float64)
    last = prompts.last
    causal = m.kind == "causal-lm"
    centred = () if centre is None else ("relative_size", "cos_inj_base", "norm_ratio")
    names = pt.METRIC_NAMES + tuple(k + "_centred" for k in centred)
    B = prompts.batch
    n_inj, n_sc = len(lay), len(sc)
    rows = torch.zeros(n_inj, n_sc, B, d, dtype=torch.float64)  # output rows at layer L

    v_hat = pt._unit_vectors(unit)[0]  # as perturbation_metrics normalises a direction

    def measure(h_inj, h_base, layer, conditions):
        # conditions[k] = (index into lay, index into sc) of run k, measured along its direction
        hi = h_inj.detach().to("cpu", torch.float64)
        hi64 = hi.numpy()[None]  # one "layer" axis of K runs for perturbation_metrics
        hb64 = np.broadcast_to(h_base.detach().to("cpu", torch.float64).numpy(), hi64.shape[1:])[None]
        cond = conditions.cpu()
        v = v_hat[cond[:, 0].numpy()][:, None, None, :]  # [K, 1, 1, d]
        met = pt._perturbation_metrics(hb64, hi64, v)
        if centre is not None:  # the same runs measured on h - mu_l
            cen = pt._perturbation_metrics(hb64, hi64, v, centre[layer][None])
            met.update({k + "_centred": cen[k] for k in centred})
        if layer == L:
            row = hi[:, last] if causal else (hi * mask[None, :, :, None]).sum(2) / mask.sum(1)[None, :, None]
            rows[cond[:, 0], cond[:, 1]] = row  # [K, B, d]: last token (causal) or mean-pooled state
        return torch.from_numpy(np.stack([_group_means(met[name][0], groups)
                                          for name in names], -1))  # [K, B, 3, n_metric]

    vecs = ad.check_vector(torch.from_numpy(factor[:, None] * unit), len(lay), tuple(sc))
    max_batch_tokens = check_int(max_batch_tokens, "max_batch_tokens", 1)
    sw = _sweep(ad, tuple(lay), vecs, tuple(float(x) for x in sc), ad.position_mask(prompts.injected),
                measure, max_batch_tokens)
    grouped = sw.injected.to(torch.float64).numpy()  # [n_inj, n_sc, L+1, B, 3, n_metric]
    hb = sw.baseline[L].detach().to("cpu", torch.float64)
    base_row = hb[last] if causal else (hb * mask[..., None]).sum(1) / mask.sum(1)[:, None]
    metrics = {name: np.ascontiguousarray(grouped[..., i]) for i, name in enumerate(names)}
    if causal:
        lb = ad.logits(base_row.to(torch.float32))
        effect = np.empty((n_inj, n_sc, B))
        for j in range(n_inj):
            li = ad.logits(rows[j].to(torch.float32))  # [n_sc, B, vocab]
            effect[j] = pt._next_token_kl(lb.expand_as(li).detach().cpu().double(), li.detach().cpu().double())
        name = "kl_last"
    else:
        effect = pt._embedding_change(base_row.expand_as(rows).numpy(), rows.numpy())
        name = "embedding_change"
    return SweepResult(
        layers=np.asarray(lay), scales=sc, n_layers=L, baseline=sw.baseline,
        attention_mask=sw.attention_mask, injected_mask=sw.injected_mask, metrics=metrics,
        groups=GROUPS, effects={name: effect}, effect_name=name, coefficient=coefficient,
        relative=relative, model=m.name, typical_norm=norms)
