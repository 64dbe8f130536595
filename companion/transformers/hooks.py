"""The one way the package hooks a model: PyTorch hooks for a ``with`` block, always removed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch

__all__ = ["hooks"]

HookSpec = Mapping[torch.nn.Module, Callable] | Iterable[tuple[torch.nn.Module, Callable]]


def _pairs(spec, label: str) -> list[tuple[torch.nn.Module, Callable]]:
    """The ``(module, fn)`` pairs of a hook spec; TypeError on a bad entry."""
    items = [] if spec is None else list(spec.items() if isinstance(spec, Mapping) else spec)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"{label} must be a mapping module -> hook or pairs (module, hook), got {item!r}")
        module, fn = item
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{label}: hooks attach to torch.nn.Module objects, got {type(module).__name__}")
        if not callable(fn):
            raise TypeError(f"{label}: the hook for {type(module).__name__} is not callable")
    return items


@contextmanager
def hooks(forward: HookSpec | None = None, pre: HookSpec | None = None, *,
          forward_with_kwargs: bool = False, pre_with_kwargs: bool = False) -> Iterator[list]:
    """Attach forward and forward-pre hooks for the duration of a ``with`` block.

    Parameters
    ----------
    forward, pre : mapping ``{module: fn}`` or iterable of ``(module, fn)``, optional
        Forward hooks ``fn(module, args, output)`` and forward-pre hooks ``fn(module, args)``; a
        non-``None`` return value replaces the output (the inputs).  With ``*_with_kwargs``,
        ``kwargs`` follows ``args`` (``with_kwargs`` of ``register_forward_hook`` and its pre twin).
    forward_with_kwargs, pre_with_kwargs : bool

    Yields
    ------
    list of torch.utils.hooks.RemovableHandle
        The handles, pre hooks first; all removed when the block ends, also on an exception or when
        attaching a later hook fails.

    Raises
    ------
    TypeError
        If an entry is not a ``(torch.nn.Module, callable)`` pair.
    """
    pre_pairs, fwd_pairs = _pairs(pre, "pre"), _pairs(forward, "forward")
    handles: list = []
    try:
        for module, fn in pre_pairs:
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=pre_with_kwargs))
        for module, fn in fwd_pairs:
            handles.append(module.register_forward_hook(fn, with_kwargs=forward_with_kwargs))
        yield handles
    finally:
        for h in handles:
            h.remove()
