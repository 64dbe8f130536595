r"""Where an injected direction goes: its projection split over the sublayers of every block.

The sublayers are the *stages* (:data:`STAGES`), the projection is read per position group, and
a post-norm block's LayerNorms also get two predictions (:func:`layernorm_response`).  The identity
:math:`p_{m+1} - p_m = \sum_s w_{m,s}` is checked on every run.  Chapter :doc:`/book/injection_real_models`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import check_int, check_layer, check_real, real_array
from companion.injection.directions import GROUPS, InjectionPrompts, typical_norms
from companion.injection.engine import _prompts_adapter
from companion.transformers.hooks import hooks

__all__ = ["STAGES", "Attribution", "attribute_injection", "layernorm_response"]

#: Stage names per placement, in the order they act inside a block.
STAGES = {"pre": ("attn", "mlp"), "post": ("attn", "ln1", "mlp", "ln2")}


def layernorm_response(x, delta, v, weight=None, eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    r"""First-order response of a LayerNorm, read along :math:`\hat v`.

    The LayerNorm Jacobian: chapter :doc:`/book/layernorm_geometry`.

    Parameters
    ----------
    x, delta : array_like or torch.Tensor, shape ``[..., d]``
        Baseline LayerNorm inputs (``d >= 2``) and their changes (broadcast with ``x``).
    v : array_like, shape ``[d]``
        The direction (normalised here).
    weight : array_like, shape ``[d]``, optional
        The gain :math:`\gamma` (default ones).
    eps : float, default 0.0

    Returns
    -------
    factor : numpy.ndarray, shape ``x.shape[:-1]``
        Product-rule factor :math:`\hat v^\top\operatorname{diag}(\gamma)P\hat v/\sigma`.
    response : numpy.ndarray
        :math:`\hat v^\top J\delta`, the first-order output change along :math:`\hat v`.

    Raises
    ------
    TypeError, ValueError
        For non-real inputs; mismatched shapes, ``d < 2``, NaN/inf, ``eps < 0`` or a zero ``v``.

    Examples
    --------
    >>> f, r = layernorm_response([1.0, -1.0, 1.0, -1.0], [0.1, -0.1, -0.1, 0.1], [1.0, -1.0, -1.0, 1.0])
    >>> round(float(f), 6), round(float(r), 6)
    (1.0, 0.2)
    """
    x = real_array("x", x, 1)
    dl = real_array("delta", delta, 1)
    vv = real_array("v", v, 1)
    eps = check_real(eps, "eps", lo=0.0)
    d = x.shape[-1]
    if d < 2:
        raise ValueError(f"x must have a last axis of length d >= 2, got shape {x.shape}")
    if dl.shape[-1] != d or vv.shape != (d,):
        raise ValueError(f"delta must end in d = {d} and v have shape ({d},); got {dl.shape}, {vv.shape}")
    try:
        np.broadcast_shapes(x.shape, dl.shape)
    except ValueError:
        raise ValueError(f"delta of shape {dl.shape} does not broadcast to x of shape {x.shape}") from None
    nv = np.linalg.norm(vv)
    if nv == 0:
        raise ValueError("v must be a non-zero vector")
    vv = vv / nv
    g = np.ones(d) if weight is None else real_array("weight", weight, 1)
    if g.shape != (d,):
        raise ValueError(f"weight must have shape ({d},), got {g.shape}")
    sigma = np.sqrt(np.var(x, axis=-1) + eps)
    if np.any(sigma == 0):
        raise ValueError("a row of x is constant and eps = 0: LayerNorm is not differentiable there")
    z = (x - x.mean(-1, keepdims=True)) / sigma[..., None]
    gv = g * vv
    factor = (gv @ vv - gv.sum() * vv.sum() / d) / sigma
    p_delta = dl - dl.mean(-1, keepdims=True)
    response = (p_delta @ gv - (z @ gv) * np.sum(z * dl, axis=-1) / d) / sigma
    return factor, response


@dataclass(frozen=True)
class Attribution:
    """The projection of an injected direction, stage by stage, per direction, prompt and group.

    The ``ln_*`` fields (post-norm only, else ``None``) have shape ``[n, batch, 3, L - ell, 2]``:
    one entry per LayerNorm of a block.
    """

    model: str  #: Model name.
    placement: str  #: Norm placement, ``"pre"`` or ``"post"``.
    layer: int  #: Injection layer :math:`\ell` (blocks :math:`\ell .. L-1` are attributed).
    n_layers: int  #: Depth ``L``.
    stages: tuple  #: :data:`STAGES` of the placement.
    scale: float  #: Size :math:`c` of the injected vector.
    alpha: float | None  #: :math:`c / n_\ell` (``None`` for an absolute magnitude).
    typical_norm: float  #: :math:`n_\ell`.
    directions: np.ndarray  #: The unit directions injected, ``[n, d]``.
    #: :math:`p_m`, group mean of :math:`\hat v\cdot\delta_m`, ``[n, batch, 3, L - ell + 1]``.
    stream: np.ndarray
    #: The change of the projection made by each stage, ``[n, batch, 3, L - ell, n_stages]``.
    writes: np.ndarray
    ln_input: np.ndarray | None  #: The projection at the LayerNorm's input.
    ln_rule: np.ndarray | None  #: The product-rule prediction of its output projection.
    ln_jacobian: np.ndarray | None  #: The first-order (Jacobian) prediction.
    identity_error: float  #: :math:`\max|p_{m+1} - p_m - \sum_s w_{m,s}|/c` (rounding only).

    @property
    def blocks(self) -> np.ndarray:  # numpydoc ignore=RT01
        """The attributed blocks :math:`m = \\ell, \\dots, L-1`."""
        return np.arange(self.layer, self.n_layers)

    def _g(self, group) -> int:
        """Index of a position group."""
        if group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
        return GROUPS.index(group)

    def _dirs(self, directions) -> np.ndarray:
        """Direction indices checked (default all)."""
        n = self.directions.shape[0]
        if directions is None:
            return np.arange(n)
        idx = np.atleast_1d(np.asarray(directions))
        if idx.dtype.kind not in "iu" or idx.size == 0 or idx.min() < -n or idx.max() >= n:
            raise ValueError(f"directions must be indices in [0, {n}), got {directions!r}")
        return idx

    def totals(self, group: str = "injected") -> dict:
        """Sum over blocks of each stage's write divided by :math:`c` (negative values erase the direction).

        Parameters
        ----------
        group : {"injected", "later", "last"}, default "injected"

        Returns
        -------
        dict of str to numpy.ndarray
            ``stage -> [n, batch]``; with the start they telescope to the end projection.

        Raises
        ------
        ValueError
            For an unknown group.
        """
        g = self._g(group)
        w = self.writes[:, :, g].sum(axis=2) / self.scale
        return {s: w[..., k] for k, s in enumerate(self.stages)}

    def block_ratios(self, group: str = "injected", directions=None) -> np.ndarray:
        """Measured :math:`p_{m+1}/p_m` per block, ratio of means over directions and prompts.

        Parameters
        ----------
        group : {"injected", "later", "last"}, default "injected"
        directions : int or sequence of int, optional
            Direction indices (default all).

        Returns
        -------
        numpy.ndarray, shape ``[L - ell]``
            The ratios.

        Raises
        ------
        ValueError
            For an unknown group or bad indices.
        """
        g, idx = self._g(group), self._dirs(directions)
        p = self.stream[idx, :, g].sum(axis=(0, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            return p[1:] / p[:-1]

    def ln_ratios(self, group: str = "injected", directions=None) -> dict:
        """Post-norm: per LayerNorm, ``"measured"``, ``"rule"`` and ``"jacobian"`` ratios ``[L - ell, 2]``.

        Output over input projection, ratio of means over the chosen directions and all prompts.

        Parameters
        ----------
        group, directions : optional
            As in :meth:`block_ratios`.

        Returns
        -------
        dict of str to numpy.ndarray
            The three ratios (NaN/inf where the input projection is 0).

        Raises
        ------
        ValueError
            For a pre-norm result, an unknown group or bad indices.
        """
        if self.placement != "post":
            raise ValueError("ln_ratios exist for post-norm models only")
        g, idx = self._g(group), self._dirs(directions)
        k1, k2 = self.stages.index("ln1"), self.stages.index("ln2")
        den = self.ln_input[idx, :, g].sum(axis=(0, 1))
        out = den + self.writes[idx, :, g][..., [k1, k2]].sum(axis=(0, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            return {"measured": out / den,
                    "rule": self.ln_rule[idx, :, g].sum(axis=(0, 1)) / den,
                    "jacobian": self.ln_jacobian[idx, :, g].sum(axis=(0, 1)) / den}


def _sublayers(m):
    """Per block, the modules to hook: pre -> (attn, mlp); post -> (LN1, LN2)."""
    out = []
    for i, b in enumerate(m.blocks):
        if m.placement == "pre":
            attn = next((getattr(b, n) for n in ("self_attn", "attn", "attention") if hasattr(b, n)), None)
            mlp = getattr(b, "mlp", None)
        else:
            self_out = getattr(getattr(b, "attention", None), "output", None)
            attn = getattr(self_out, "LayerNorm", None)
            mlp = getattr(getattr(b, "output", None), "LayerNorm", None)
        if not isinstance(attn, torch.nn.Module) or not isinstance(mlp, torch.nn.Module):
            kind = "self_attn/attn and mlp" if m.placement == "pre" else \
                "attention.output.LayerNorm and output.LayerNorm"
            raise ValueError(f"{m.name}: block {i} ({type(b).__name__}) has no {kind}; "
                             "attribute_injection supports Llama/GPT-2-like and BERT-like blocks")
        out.append((attn, mlp))
    return out


def _check_directions(directions, d: int, n_layers: int, layer: int) -> np.ndarray:
    """``directions`` ``[n, d]`` or ``[n, L+1, d]`` (row ``layer`` taken) as unit rows ``[n, d]``."""
    arr = real_array("directions", directions, 1)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim == 3:
        if arr.shape[1] != n_layers + 1:
            raise ValueError(f"per-layer directions must have shape [n, {n_layers + 1}, {d}], "
                             f"got {arr.shape}")
        arr = arr[:, layer]
    if arr.ndim != 2 or arr.shape[1] != d or arr.shape[0] == 0:
        raise ValueError(f"directions must have shape [n, {d}] or [n, {n_layers + 1}, {d}], "
                         f"got {np.shape(directions)}")
    norms = np.linalg.norm(arr, axis=1)
    if np.any(norms == 0):
        raise ValueError(f"directions {np.nonzero(norms == 0)[0].tolist()} are zero vectors")
    return arr / norms[:, None]


def attribute_injection(m, prompts: InjectionPrompts, layer: int, directions, scale=None,
                        alpha=None, batch_rows: int = 256) -> Attribution:
    r"""Inject each direction at layer :math:`\ell` and split its projection over the sublayers.

    Parameters
    ----------
    m : LoadedModel
        A pre-norm model (``self_attn``/``attn``/``attention`` and ``mlp``) or a BERT-like post-norm model.
    prompts : InjectionPrompts
        From :func:`companion.injection.directions.make_prompts` for ``m``.
    layer : int
        :math:`\ell \in [0, L-1]`; :math:`c\hat v` is added at ``prompts.injected``.
    directions : array_like, shape ``[n, d]`` or ``[n, L+1, d]``
        Directions (normalised here; per-layer ones give row :math:`\ell`).
    scale, alpha : float
        Exactly one: :math:`c`, or :math:`\alpha` with :math:`c = \alpha n_\ell` (typical norm).
    batch_rows : int, default 256
        Most sequences per forward (the baseline and ``batch_rows // batch - 1`` directions).

    Returns
    -------
    Attribution
        Projections in float64; baseline and injected runs share each forward.

    Raises
    ------
    TypeError, ValueError
        For wrong types; a layer outside [0, L-1], bad or zero directions, not exactly one of ``scale``/
        ``alpha``, prompts of another model, ``batch_rows < 2 * batch``, or an unsupported block.

    Examples
    --------
    >>> a = attribute_injection(m, p, 3, random_unit_vectors(m.d_model, 4), alpha=0.1)  # doctest: +SKIP
    """
    ad = _prompts_adapter(m, prompts)
    L = m.n_layers
    layer = check_layer(layer, L, m.name)
    if layer == L:
        raise ValueError(f"layer must be in [0, {L - 1}]: an injection at l = L = {L} passes no block")
    V = _check_directions(directions, m.d_model, L, layer)
    if (scale is None) == (alpha is None):
        raise ValueError("give exactly one of scale (absolute c) and alpha (c = alpha * n_l)")
    batch_rows = check_int(batch_rows, "batch_rows", 1)
    B = prompts.batch
    if batch_rows < 2 * B:
        raise ValueError(f"batch_rows must be >= 2 * batch = {2 * B} (baseline + one direction)")
    if tuple(ad.attention_mask.shape) != tuple(prompts.injected.shape):
        raise ValueError("prompts do not match the model's encoding; build them with make_prompts(m, ...)")
    base = ad.baseline
    n_ell = float(typical_norms(torch.stack(base).to("cpu", torch.float64), prompts.injected.cpu())[layer])
    alpha = None if alpha is None else check_real(alpha, "alpha")
    c = check_real(scale, "scale") if alpha is None else alpha * n_ell
    if c == 0 or not np.isfinite(c):
        raise ValueError(f"the injected size c must be finite and non-zero, got {c}")
    subs = _sublayers(m)
    stages = STAGES[m.placement]
    n, nb, ns = V.shape[0], L - layer, len(stages)
    dev = m.device
    G = prompts.groups.to(dev, torch.float64)  # [3, B, T]
    counts = G.sum(-1).T[None]  # [1, B, 3]

    def group_mean(x):
        """``x`` [k, B, T] -> [k, B, 3] means over each group's tokens."""
        return torch.einsum("kbt,gbt->kbg", x, G) / counts

    inj = prompts.injected.to(dev, m.dtype)[..., None]  # [B, T, 1]
    stream = np.zeros((n, B, 3, nb + 1))
    writes = np.zeros((n, B, 3, nb, ns))
    post = m.placement == "post"
    ln_in, ln_rule, ln_jac = (np.zeros((n, B, 3, nb, 2)) for _ in range(3)) if post else (None,) * 3
    per = max(1, batch_rows // B - 1)
    for start in range(0, n, per):
        j = slice(start, min(n, start + per))
        Vc = torch.as_tensor(V[j], device=dev, dtype=torch.float64)  # [k, d]
        k = Vc.shape[0]

        def proj(x, Vc=Vc, k=k):
            """[(k+1)B, T, d] -> (projection of the change, change, baseline)."""
            x = x.to(torch.float64).reshape(k + 1, B, *x.shape[1:])
            dx = x[1:] - x[0]
            return torch.einsum("kbtd,kd->kbt", dx, Vc), dx, x[0]

        captured: dict = {}

        def out_hook(i, s):
            def hook(module, args, output):
                y = output[0] if isinstance(output, tuple) else output
                captured[(i, s)] = group_mean(proj(y)[0])
            return hook

        def ln_pre(i, s):
            def hook(module, args):
                pr, dx, x0 = proj(args[0])
                captured[(i, s, "in")] = group_mean(pr)
                gamma = module.weight.detach().to(torch.float64) if module.weight is not None \
                    else torch.ones(m.d_model, dtype=torch.float64, device=dev)
                sigma = torch.sqrt(x0.var(-1, unbiased=False) + module.eps)  # [B, T]
                z = (x0 - x0.mean(-1, keepdim=True)) / sigma[..., None]
                gv = gamma * Vc  # [k, d]
                f = (torch.einsum("kd,kd->k", gv, Vc)
                     - gv.sum(-1) * Vc.sum(-1) / m.d_model)[:, None, None] / sigma  # [k, B, T]
                jac = (torch.einsum("kbtd,kd->kbt", dx - dx.mean(-1, keepdim=True), gv)
                       - torch.einsum("btd,kd->kbt", z, gv) * torch.einsum("btd,kbtd->kbt", z, dx)
                       / m.d_model) / sigma
                captured[(i, s, "rule")] = group_mean(f * pr)
                captured[(i, s, "jac")] = group_mean(jac)
            return hook

        fwd, pre = {}, {}
        for i in range(layer, L):
            a, b = subs[i]
            fwd[a], fwd[b] = out_hook(i, "a"), out_hook(i, "b")
            if post:
                pre[a], pre[b] = ln_pre(i, "a"), ln_pre(i, "b")
        h = base[layer].repeat(k + 1, 1, 1)
        delta = (c * Vc.to(m.dtype))[:, None, None, :] * inj[None]  # [k, B, T, d]
        h = h + torch.cat([torch.zeros_like(delta[:1]), delta]).reshape(h.shape)
        ps = [group_mean(proj(h)[0])]
        with hooks(forward=fwd, pre=pre), torch.no_grad():
            for i in range(layer, L):
                h = ad.block(i, h, k + 1)
                ps.append(group_mean(proj(h)[0]))
        stream[j] = torch.stack(ps, -1).cpu().numpy()
        for bi, i in enumerate(range(layer, L)):
            if post:
                # points: p_m, u1 (LN1 in), x1 (LN1 out), u2 (LN2 in), h_{m+1} (LN2 out)
                pts = [ps[bi], captured[(i, "a", "in")], captured[(i, "a")],
                       captured[(i, "b", "in")], captured[(i, "b")]]
                w = torch.stack([pts[s + 1] - pts[s] for s in range(4)], -1)
                for q, s in enumerate(("a", "b")):
                    for arr, key in ((ln_in, "in"), (ln_rule, "rule"), (ln_jac, "jac")):
                        arr[j, :, :, bi, q] = captured[(i, s, key)].cpu().numpy()
            else:
                w = torch.stack([captured[(i, "a")], captured[(i, "b")]], -1)
            writes[j, :, :, bi] = w.cpu().numpy()
    err = np.abs(np.diff(stream, axis=-1) - writes.sum(-1)).max() / abs(c)
    return Attribution(model=m.name, placement=m.placement, layer=layer, n_layers=L,
                       stages=stages, scale=float(c), alpha=None if alpha is None else float(alpha),
                       typical_norm=n_ell, directions=V, stream=stream, writes=writes,
                       ln_input=ln_in, ln_rule=ln_rule, ln_jacobian=ln_jac,
                       identity_error=float(err))
