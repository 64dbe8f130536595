"""The one alias table: the flat module paths of release 0.1 keep working for one release.

``companion.tails``, ``companion.probes``, ... were moved into the subpackages that mirror the
book's parts.  Importing an old path gives a small forwarding module that warns
(``DeprecationWarning``) with the new path and hands each name on; nothing is copied.  Old
``companion.stacks.<name>`` is served by the ``companion.stacks`` package the same way.  Remove
this file, and its two callers (``companion/__init__.py``, ``companion/stacks/__init__.py``), in
release 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: old module -> its new modules, searched in order for each name.
MOVED = {
    "companion.tails": ("companion.theory.subgaussian",),
    "companion.concentration": ("companion.theory.concentration",),
    "companion.extremes": ("companion.theory.exceedance",),
    "companion.norms": ("companion.theory.normalisation",),
    "companion.resampling": ("companion.theory.bootstrap",),
    "companion.stacks": ("companion.stacks.residual", "companion.stacks.tinylm"),
    "companion.hooks": ("companion.transformers.hooks",),
    "companion.models": ("companion.transformers.models", "companion.transformers.readout",
                         "companion.transformers.sources"),
    "companion.probes": ("companion.transformers.stream", "companion.outliers.channel_statistics"),
    "companion.perturbation": ("companion.injection.metrics",),
    "companion.directions": ("companion.injection.directions",),
    "companion.engine": ("companion.injection.engine",),
    "companion.attribution": ("companion.injection.attribution",),
    "companion.channel_regimes": ("companion.outliers.regimes",),
    "companion.attention_logits": ("companion.outliers.attention_logits",),
    "companion.massive_activations": ("companion.outliers.massive_activations",),
    "companion.outlier_features": ("companion.outliers.outlier_features",),
    "companion.quantization": ("companion.applications.quantization", "companion.applications.model_quantization"),
    "companion.pruning": ("companion.applications.pruning",),
    "companion.training_controls": ("companion.applications.training_controls",),
}

#: old qualified name -> new qualified name, for the names that changed (renamed, or made private
#: because only the package uses them: then the new name is the old one with a leading underscore).
RENAMED = {
    "companion.engine.injection_sweep": "companion.injection.engine.sweep_injections",
    "companion.engine.stack_injection_sweep": "companion.injection.engine.sweep_stack_injections",
    "companion.perturbation.injection_window": "companion.injection.metrics.effect_window",
    **{f"{old}.{name}": f"{new}._{name}" for old, new, names in (
        ("companion.engine", "companion.injection.engine", "adapt"),
        ("companion.tails", "companion.theory.empirical", "empirical_tail"),
        ("companion.stacks", "companion.stacks.residual",
         "last_layer_grad_norm CausalSelfAttention MLP Sublayer Block"),
        ("companion.quantization", "companion.applications.quantization", "max_rounding_error"),
        ("companion.determinism", "companion.determinism", "cpu_has_avx2 kernel_report available_kernel_sets"),
        ("companion.__main__", "companion.__main__", "build_parser"),
        ("companion.models", "companion.transformers.sources", "cache_dir"),
        ("companion.corpus", "companion.corpus", "corpus_dir corpus_files"),
        ("companion.experiments", "companion.experiments.store", "results_root add_checksums"),
    ) for name in names.split()},
}


def resolve(old_module: str, name: str):
    """``(new qualified name, object)`` of ``old_module.name``; AttributeError if it never existed."""
    renamed = RENAMED.get(f"{old_module}.{name}")
    if renamed is not None:
        module, _, new_name = renamed.rpartition(".")
        return renamed, getattr(importlib.import_module(module), new_name)
    for module in MOVED[old_module]:
        mod = importlib.import_module(module)
        if hasattr(mod, name):
            return f"{module}.{name}", getattr(mod, name)
    raise AttributeError(f"module {old_module!r} has no attribute {name!r} (it moved to "
                         f"{' / '.join(MOVED[old_module])})")


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and will be removed in companion 0.3; use {new}",
                  DeprecationWarning, stacklevel=3)


class _MovedModule(types.ModuleType):
    """What ``import companion.<old>`` returns: forwards every name to its new module."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        new, value = resolve(self.__name__, name)
        _warn(f"{self.__name__}.{name}", new)
        return value

    def __dir__(self):
        names = set()
        for module in MOVED[self.__name__]:
            names.update(getattr(importlib.import_module(module), "__all__", ()))
        return sorted(names)


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        _warn(spec.name, " / ".join(MOVED[spec.name]))
        return _MovedModule(spec.name)

    def exec_module(self, module):
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED and fullname != "companion.stacks":  # that one is a real package now
            return importlib.machinery.ModuleSpec(fullname, _Loader())
        return None


def install() -> None:
    """Put the finder of the old paths on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def renamed_getattr(module: str):
    """A module ``__getattr__`` serving the names :data:`RENAMED` took out of ``module`` itself."""

    def __getattr__(name):
        new = RENAMED.get(f"{module}.{name}")
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(f"{module}.{name}", new)
        new_module, _, new_name = new.rpartition(".")
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__


def package_getattr(package: str):
    """A module ``__getattr__`` for a package that replaced an old module of the same name."""

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            new, value = resolve(package, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        _warn(f"{package}.{name}", new)
        return value

    return __getattr__
