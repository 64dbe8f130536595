"""Statistics of linear layers' inputs, and pruning input neurons with or without mean compensation.

Weights use the ``nn.Linear`` layout ``(out, in)``, ``y = W x + b``; column ``w_j = W[:, j]`` reads
input neuron ``j``.  Derivations: the chapter :doc:`/book/applications`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from companion._validation import (
    check_choice, check_finite, check_indices, check_int, check_linears, check_real, real_vector)
from companion.transformers.hooks import hooks

__all__ = ["LinearInputStatistics", "linear_input_statistics", "capture_linear_inputs",
           "linear_input_medians", "top_channels", "PRUNING_SCORES", "neuron_scores", "lowest_fraction",
           "zero_linear_inputs", "compensated_bias", "removal_error"]


def _split_inputs(inputs):
    """A forward call's positional/keyword arguments and the token mask (or None)."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}, None
    if isinstance(inputs, Mapping):
        kwargs = dict(inputs)
        return (), kwargs, kwargs.get("attention_mask")
    raise TypeError("each batch must be a tensor of input ids or a mapping of model arguments (e.g. the "
                    f"output of companion.transformers.models.tokenize), got {type(inputs).__name__}")


def _run_batches(model, batches, modules, observe) -> None:
    """Run ``model`` on every batch, calling ``observe(name, input, mask)`` before each layer."""
    mask = [None]

    def make_hook(name):
        def hook(_module, args):
            observe(name, args[0].detach(), mask[0])
        return hook

    seen = 0
    with hooks(pre=[(mod, make_hook(name)) for name, mod in modules.items()]), torch.no_grad():
        for batch in batches:
            args, kwargs, mask[0] = _split_inputs(batch)
            model(*args, **kwargs)
            seen += 1
    if seen == 0:
        raise ValueError("batches is empty; pass at least one batch")


def _tokens(x: torch.Tensor, mask) -> torch.Tensor:
    """A layer input as ``[tokens, features]``, pad tokens (mask 0) removed."""
    if mask is not None and x.ndim == 3 and tuple(mask.shape) == tuple(x.shape[:2]):
        x = x[mask.bool()]
    return x.reshape(-1, x.shape[-1])


@dataclass(frozen=True)
class LinearInputStatistics:
    """Per-channel statistics of the input of one linear layer over a corpus (float64 arrays)."""

    mean: np.ndarray  #: channel mean ``μ_j``, shape (in_features,)
    var: np.ndarray  #: population variance ``σ_j²`` over the tokens
    max_abs: np.ndarray  #: ``max |x_j|`` over the tokens
    n_tokens: int  #: number of tokens that entered (pads excluded)
    min: np.ndarray | None = None  #: smallest value of each channel (``None`` if built by hand)
    max: np.ndarray | None = None  #: largest value of each channel (``None`` if built by hand)

    @property
    def std(self) -> np.ndarray:
        """``σ_j = sqrt(var_j)``."""
        return np.sqrt(self.var)

    @property
    def second_moment(self) -> np.ndarray:
        """``E[x_j²] = μ_j² + σ_j²``."""
        return self.var + self.mean**2


def linear_input_statistics(
    model: torch.nn.Module, batches: Iterable, modules: Mapping[str, torch.nn.Linear]
) -> dict[str, LinearInputStatistics]:
    """Stream mean, variance and ``max|x|`` of every input channel of the chosen linear layers.

    Parameters
    ----------
    model : torch.nn.Module
        Called as ``model(ids)`` for a tensor batch or ``model(**batch)`` for a mapping.
    batches : iterable
        Tensors of input ids or mappings of model arguments
        (:func:`~companion.transformers.models.tokenize`); pads (``attention_mask`` 0) are excluded.
    modules : mapping name -> nn.Linear
        The layers whose inputs are measured.

    Returns
    -------
    dict name -> LinearInputStatistics
        The statistics of each layer's input.

    Raises
    ------
    ValueError
        If ``modules`` or ``batches`` is empty, a layer never ran, or an input is not finite.
    """
    modules = check_linears(modules, model)
    acc = {name: {"n": 0} for name in modules}

    def observe(name, x, mask):
        x = _tokens(x, mask).double()
        check_finite(x, f"the input of {name!r}")
        nb = x.shape[0]
        if nb == 0:
            return
        mb = x.mean(dim=0)
        m2b = ((x - mb) ** 2).sum(dim=0)
        mx = x.abs().amax(dim=0)
        lo, hi = x.amin(dim=0), x.amax(dim=0)
        a = acc[name]
        if a["n"] == 0:
            a.update(n=nb, mean=mb, m2=m2b, max=mx, lo=lo, hi=hi)
        else:  # Chan et al.'s parallel update of the mean and the sum of squares
            n, tot = a["n"], a["n"] + nb
            delta = mb - a["mean"]
            a["mean"] = a["mean"] + delta * (nb / tot)
            a["m2"] = a["m2"] + m2b + delta**2 * (n * nb / tot)
            a["max"] = torch.maximum(a["max"], mx)
            a["lo"], a["hi"] = torch.minimum(a["lo"], lo), torch.maximum(a["hi"], hi)
            a["n"] = tot

    _run_batches(model, batches, modules, observe)
    out = {}
    for name, a in acc.items():
        if a["n"] == 0:
            raise ValueError(f"layer {name!r} never ran (or saw only pad tokens); check the module names")
        # a constant channel: exact mean and variance 0 (rounded batch means leave M ~ 1e-34);
        # any mean lies in [min, max], rounding can push it out by an ulp
        constant = a["lo"] == a["hi"]
        inside = torch.minimum(torch.maximum(a["mean"], a["lo"]), a["hi"])
        mean = torch.where(constant, a["lo"], inside)
        m2 = torch.where(constant, torch.zeros_like(a["m2"]), a["m2"])
        out[name] = LinearInputStatistics(
            mean=mean.cpu().numpy(), var=(m2 / a["n"]).cpu().numpy(),
            max_abs=a["max"].cpu().numpy(), n_tokens=int(a["n"]),
            min=a["lo"].cpu().numpy(), max=a["hi"].cpu().numpy())
    return out


def _map_inputs_once(model, inputs, modules, reduce):
    """``{name: reduce(name, x)}`` for the input ``x`` (``[tokens, in]``, no pads) of each layer."""
    store: dict[str, list] = {name: [] for name in modules}
    _run_batches(model, [inputs], modules,
                 lambda name, x, mask: store[name].append(reduce(name, _tokens(x, mask))))
    for name, xs in store.items():
        if len(xs) != 1:
            raise ValueError(f"layer {name!r} ran {len(xs)} times in one forward pass; expected exactly once")
    return {name: xs[0] for name, xs in store.items()}


def capture_linear_inputs(model: torch.nn.Module, inputs,
                          modules: Mapping[str, torch.nn.Linear]) -> dict[str, torch.Tensor]:
    """Inputs of the chosen linear layers during one forward pass, as ``[tokens, in_features]``.

    Parameters
    ----------
    model, modules
        As in :func:`linear_input_statistics`.
    inputs : torch.Tensor or mapping
        One batch; with an ``attention_mask`` in a mapping, pad tokens are dropped.

    Returns
    -------
    dict name -> torch.Tensor
        Detached copies of shape ``[n_tokens, in_features]``.

    Raises
    ------
    ValueError
        If ``modules`` is empty or a layer did not run exactly once.

    Examples
    --------
    >>> lin, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    >>> torch.equal(capture_linear_inputs(lin, x, {"lin": lin})["lin"], x)
    True
    """
    modules = check_linears(modules, model)
    return _map_inputs_once(model, inputs, modules, lambda name, x: x.clone())


def _column_median(x: torch.Tensor) -> torch.Tensor:
    """``torch.quantile(x, 0.5, dim=0)`` to the last bit, without its full sort."""
    return (torch.median(x, dim=0).values - torch.median(-x, dim=0).values) / 2


def linear_input_medians(model: torch.nn.Module, inputs,
                         modules: Mapping[str, torch.nn.Linear]) -> dict[str, np.ndarray]:
    """Per-channel median of the input of each chosen linear layer over one batch.

    Parameters
    ----------
    model, inputs, modules
        As in :func:`capture_linear_inputs`.

    Returns
    -------
    dict name -> numpy.ndarray, shape (in_features,), float64
        The medians (the midpoint of the two central values for an even count).

    Raises
    ------
    TypeError, ValueError
        As :func:`capture_linear_inputs`.

    Examples
    --------
    >>> lin, x = torch.nn.Linear(2, 1), torch.tensor([[1.0, 0.0], [2.0, 0.0], [100.0, 1.0], [3.0, 1.0]])
    >>> linear_input_medians(lin, x, {"lin": lin})["lin"].tolist()
    [2.5, 0.5]
    """
    modules = check_linears(modules, model)

    def median(name, x):
        if x.shape[0] == 0:
            raise ValueError(f"the input of {name!r} has no (unpadded) tokens")
        return _column_median(x.double()).cpu().numpy()

    return _map_inputs_once(model, inputs, modules, median)


def top_channels(values, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries (e.g. ``max|x_j|``), largest first, ties by lower index.

    Parameters
    ----------
    values : array_like, shape (d,)
        One score per channel.
    k : int, 0 ≤ k ≤ d

    Returns
    -------
    numpy.ndarray of int64, shape (k,)

    Raises
    ------
    ValueError
        If ``values`` is not a finite 1-D array or ``k`` is out of range.

    Examples
    --------
    >>> top_channels([0.5, 9.0, 3.0, 9.0], 2).tolist()
    [1, 3]
    """
    v = real_vector("values", values)
    k = check_int(k, "k", 0)
    if k > v.size:
        raise ValueError(f"k = {k} exceeds the number of channels {v.size}")
    order = np.lexsort((np.arange(v.size), -v))
    return order[:k].astype(np.int64)


#: Neuron scores understood by :func:`neuron_scores` (low score = pruned first).
PRUNING_SCORES = ("activation", "weight", "contribution", "spread", "random")


def _to_float64(a, name: str) -> np.ndarray:
    """A finite tensor or array as a float64 array."""
    if isinstance(a, torch.Tensor):
        out = a.detach().double().cpu().numpy()
    elif isinstance(a, np.ndarray):
        out = a.astype(np.float64)
    else:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return out


def _matrix(weight) -> np.ndarray:
    """A finite 2-D weight as a float64 array."""
    w = _to_float64(weight, "weight")
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {w.shape}")
    return w


def neuron_scores(method: str, stats: LinearInputStatistics | None = None, weight=None,
                  seed: int = 0) -> np.ndarray:
    """Importance score of every input neuron of a linear layer; the lowest are pruned first.

    Parameters
    ----------
    method : {"activation", "weight", "contribution", "spread", "random"}
        ``|μ_j| + σ_j`` (the note's rule); ``‖W[:, j]‖₂``; ``sqrt(E[a_j²]) ‖W[:, j]‖₂`` (the rms of
        the neuron's contribution); ``σ_j ‖W[:, j]‖₂`` (the same with mean compensation,
        :func:`compensated_bias`); i.i.d. uniform scores (a baseline).
    stats : LinearInputStatistics, optional
        Needed by ``"activation"``, ``"contribution"`` and ``"spread"``.
    weight : torch.Tensor or numpy.ndarray, shape (out, in), optional
        The weight that reads the neurons (e.g. ``down_proj``); needed by the three weighted scores.
    seed : int, default 0
        Seed of ``"random"``.

    Returns
    -------
    numpy.ndarray, shape (in,), float64

    Raises
    ------
    ValueError
        If ``method`` is unknown, a needed argument is missing or invalid, or the shapes disagree.

    Examples
    --------
    >>> st = LinearInputStatistics(np.array([0.0, 1.0]), np.array([1.0, 0.0]), np.array([2.0, 1.0]), 10)
    >>> neuron_scores("contribution", st, np.array([[3.0, 0.0], [4.0, 1.0]])).tolist()
    [5.0, 1.0]
    """
    check_choice(method, "method", PRUNING_SCORES)
    if stats is not None and not isinstance(stats, LinearInputStatistics):
        raise TypeError(f"stats must be a LinearInputStatistics, got {type(stats).__name__}")
    w = None if weight is None else _matrix(weight)
    if method in ("activation", "contribution", "spread") and stats is None:
        raise ValueError(f"method {method!r} needs stats (from linear_input_statistics)")
    if method in ("weight", "contribution", "spread") and w is None:
        raise ValueError(f"method {method!r} needs the weight that reads the neurons")
    if stats is not None and w is not None and stats.mean.shape[0] != w.shape[1]:
        raise ValueError(f"stats has {stats.mean.shape[0]} channels but weight has {w.shape[1]} inputs")
    if method == "activation":
        return np.abs(stats.mean) + stats.std
    if method == "weight":
        return np.linalg.norm(w, axis=0)
    if method == "contribution":
        return np.sqrt(stats.second_moment) * np.linalg.norm(w, axis=0)
    if method == "spread":
        return stats.std * np.linalg.norm(w, axis=0)
    if stats is None and w is None:
        raise ValueError("method 'random' needs stats or weight to know the number of neurons")
    n = stats.mean.shape[0] if stats is not None else w.shape[1]
    return np.random.default_rng(check_int(seed, "seed", 0)).random(n)


def lowest_fraction(scores, fraction: float) -> np.ndarray:
    """Indices of the ``round(fraction · n)`` lowest scores, in increasing index order.

    Parameters
    ----------
    scores : array_like, shape (n,)
        One score per neuron (:func:`neuron_scores`).
    fraction : float in [0, 1]

    Returns
    -------
    numpy.ndarray of int64

    Raises
    ------
    ValueError
        If ``fraction`` is outside [0, 1] or ``scores`` is not a finite 1-D array.

    Examples
    --------
    >>> lowest_fraction([3.0, 1.0, 2.0, 0.5], 0.5).tolist()
    [1, 3]
    """
    s = real_vector("scores", scores)
    f = check_real(fraction, "fraction", lo=0.0, hi=1.0)
    k = int(round(f * s.size))
    return np.sort(np.argsort(s, kind="stable")[:k]).astype(np.int64)


def _check_names(mapping, modules, label: str, where: str = "not in modules") -> None:
    """ValueError if ``mapping`` has keys that are not in ``modules``."""
    unknown = sorted(set(mapping) - set(modules))
    if unknown:
        raise ValueError(f"{label} names layers {where}: {unknown[:3]}")


@contextlib.contextmanager
def zero_linear_inputs(modules: Mapping[str, torch.nn.Linear], channels: Mapping[str, object],
                       fill: Mapping[str, object] | None = None) -> Iterator[None]:
    """Context manager: the chosen input channels of each layer read as 0 (neurons pruned).

    Parameters
    ----------
    modules : mapping name -> nn.Linear
    channels : mapping name -> sequence of int
        Input channels to zero, per layer (every key must be in ``modules``).
    fill : mapping name -> array_like of shape (in,), optional
        Mean compensation: the pruned channels read ``fill[name][j]`` (the calibration means)
        instead of 0, as :func:`compensated_bias` folds them into the bias.

    Yields
    ------
    None
        The hooks are removed on exit.

    Raises
    ------
    ValueError
        If a mapping names an unknown layer, or an index or ``fill`` is invalid.

    Examples
    --------
    >>> lin = torch.nn.Linear(2, 1)
    >>> with zero_linear_inputs({"lin": lin}, {"lin": [1]}):
    ...     y = lin(torch.tensor([[2.0, 3.0]]))  # y = lin(torch.tensor([[2.0, 0.0]]))
    """
    modules = check_linears(modules)
    if not isinstance(channels, Mapping):
        raise TypeError(f"channels must be a mapping name -> channel indices, got {type(channels).__name__}")
    _check_names(channels, modules, "channels")
    masks = {}
    for name, idx in channels.items():
        mod = modules[name]
        a = check_indices(idx, mod.in_features, f"channels[{name!r}]")
        m = torch.ones(mod.in_features, dtype=mod.weight.dtype, device=mod.weight.device)
        m[torch.as_tensor(a, device=m.device)] = 0.0
        masks[name] = m
    fills = {}
    if fill is not None:
        if not isinstance(fill, Mapping):
            raise TypeError(f"fill must be a mapping name -> values per channel, got {type(fill).__name__}")
        _check_names(fill, channels, "fill", "without pruned channels")
        for name, v in fill.items():
            a = real_vector(f"fill[{name!r}]", v, size=modules[name].in_features)
            keep = masks[name]
            fills[name] = (1.0 - keep) * torch.as_tensor(a, dtype=keep.dtype, device=keep.device)

    def make_hook(mask, add):
        def hook(_module, args):
            x = args[0] * mask.to(args[0].dtype)
            if add is not None:
                x = x + add.to(x.dtype)
            return (x,) + tuple(args[1:])
        return hook

    with hooks(pre=[(modules[name], make_hook(mask, fills.get(name))) for name, mask in masks.items()]):
        yield None


def compensated_bias(weight, bias, channels, mean):
    """Bias that absorbs the mean of removed input neurons: ``b + Σ_{j∈S} μ_j W[:, j]``.

    Parameters
    ----------
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
    bias : torch.Tensor, numpy.ndarray of shape (out,), or None
        The layer's bias (``None``: zero).
    channels : sequence of int
        The removed set ``S``.
    mean : array_like, shape (in,)
        The channel means ``μ`` (calibration data).

    Returns
    -------
    numpy.ndarray, shape (out,), float64

    Raises
    ------
    ValueError
        On shape mismatch, non-finite values, or out-of-range/repeated channels.

    Examples
    --------
    >>> compensated_bias(np.array([[1.0, 2.0], [0.0, 3.0]]), None, [1], [5.0, 0.5]).tolist()
    [1.0, 1.5]
    """
    W = _matrix(weight)
    mu = real_vector("mean", mean, size=W.shape[1])
    s = check_indices(channels, W.shape[1])
    b = np.zeros(W.shape[0]) if bias is None else real_vector("bias", bias, size=W.shape[0])
    return b + W[:, s] @ mu[s]


def removal_error(x, weight, channels, center=None) -> dict[str, float]:
    """Exact mean squared output change from removing input neurons, with two bounds.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray, shape (n_tokens, in)
        Captured inputs of the layer (:func:`capture_linear_inputs`).
    weight : torch.Tensor or numpy.ndarray, shape (out, in)
    channels : sequence of int
        The removed set ``S``.
    center : array_like of shape (in,), optional
        Mean compensation: the removed neurons read ``center``, so ``a_j`` becomes ``a_j − c_j``.

    Returns
    -------
    dict
        ``"exact"``: ``mean_i ‖Σ_{j∈S} a_ij W[:, j]‖²``;
        ``"diagonal"``: ``Σ_{j∈S} E[a_j²] ‖W[:, j]‖²`` (exact for uncorrelated contributions);
        ``"minkowski"``: ``(Σ_{j∈S} sqrt(E[a_j²]) ‖W[:, j]‖)²``, an upper bound on ``"exact"``.

    Raises
    ------
    ValueError
        On shape mismatch, non-finite values, or out-of-range/repeated channels.

    Examples
    --------
    >>> removal_error(np.array([[1.0, 1.0], [1.0, -1.0]]), np.eye(2), [0, 1])
    {'exact': 2.0, 'diagonal': 2.0, 'minkowski': 4.0}
    """
    X, W = _to_float64(x, "x"), _to_float64(weight, "weight")
    if center is not None and X.ndim == 2:
        X = X - real_vector("center", center, size=X.shape[1])
    if X.ndim != 2 or W.ndim != 2 or X.shape[1] != W.shape[1] or X.shape[0] == 0:
        raise ValueError(
            f"need x of shape (n_tokens, in) and weight of shape (out, in); got {X.shape} and {W.shape}")
    s = check_indices(channels, W.shape[1])
    Xs, Ws = X[:, s], W[:, s]
    e = Xs @ Ws.T
    ea2 = (Xs**2).mean(axis=0)
    wn = np.linalg.norm(Ws, axis=0)
    return {
        "exact": float((e**2).sum(axis=1).mean()),
        "diagonal": float((ea2 * wn**2).sum()),
        "minkowski": float((np.sqrt(ea2) * wn).sum() ** 2)}
