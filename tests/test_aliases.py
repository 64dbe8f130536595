"""The old flat module paths (release 0.1) warn and work; the curated namespace resolves lazily."""

import importlib
import subprocess
import sys
import warnings

import pytest

import companion
from companion import _aliases


def _fresh(name):
    """Import ``name`` again, as a reader's first import would (the alias modules are cached)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(set(_aliases.MOVED) - {"companion.stacks"}))
def test_every_old_module_imports_with_a_deprecation_warning_naming_the_new_path(old):
    with pytest.warns(DeprecationWarning, match=_aliases.MOVED[old][0].replace(".", r"\.")):
        _fresh(old)


@pytest.mark.parametrize("old, name, new", [
    ("companion.tails", "optimal_variance_proxy", "companion.theory.subgaussian"),
    ("companion.extremes", "theorem1_lower_bound", "companion.theory.exceedance"),
    ("companion.models", "logits_from_residual", "companion.transformers.readout"),
    ("companion.probes", "inject", "companion.transformers.stream"),
    ("companion.probes", "channel_statistics", "companion.outliers.channel_statistics"),
    ("companion.quantization", "quantized_linears", "companion.applications.model_quantization"),
])
def test_an_old_name_is_the_very_object_at_its_new_path(old, name, new):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = _fresh(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} is deprecated .* use {new}\.{name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old, new", sorted(_aliases.RENAMED.items()))
def test_renamed_functions_forward_to_their_new_names(old, new):
    module_name, _, name = old.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # an old flat module is re-imported; a module that only made a name private is used as is
        fresh = module_name in _aliases.MOVED and module_name != "companion.stacks"  # a real package now
        module = _fresh(module_name) if fresh else importlib.import_module(module_name)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        value = getattr(module, name)
    new_module, _, new_name = new.rpartition(".")
    assert value is getattr(importlib.import_module(new_module), new_name)


def test_a_module_without_a_renamed_name_raises_a_plain_attribute_error():
    import companion.determinism as determinism

    with pytest.raises(AttributeError, match=r"'companion\.determinism' has no attribute 'no_such_name'"):
        determinism.no_such_name


def test_the_stacks_package_still_serves_the_names_of_the_old_stacks_module():
    import companion.stacks as stacks
    from companion.stacks.residual import StackConfig
    from companion.stacks.tinylm import byte_tokenize

    with pytest.warns(DeprecationWarning, match=r"companion\.stacks\.residual\.StackConfig"):
        assert stacks.StackConfig is StackConfig
    with pytest.warns(DeprecationWarning, match=r"companion\.stacks\.tinylm\.byte_tokenize"):
        assert stacks.byte_tokenize is byte_tokenize


def test_a_name_that_never_existed_is_an_attribute_error_that_says_where_things_went():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = _fresh("companion.engine")
    with pytest.raises(AttributeError, match=r"no attribute 'no_such_function'.*companion\.injection\.engine"):
        module.no_such_function  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_function'"):
        companion.no_such_function  # noqa: B018


def test_every_name_of_the_curated_namespace_resolves_to_its_defining_module():
    for name, module in companion._NAMESPACE.items():
        value = getattr(companion, name)
        assert value is getattr(importlib.import_module(module), name), name
    assert set(companion._NAMESPACE) <= set(dir(companion))
    assert set(companion.__all__) == {"__version__", *companion._NAMESPACE}


def test_the_alias_table_points_only_at_modules_that_exist():
    for new_modules in _aliases.MOVED.values():
        for module in new_modules:
            importlib.import_module(module)


def test_importing_companion_loads_neither_numpy_nor_torch_nor_an_old_path():
    code = ("import sys, warnings; warnings.simplefilter('error'); import companion; "
            "assert not {'numpy', 'torch'} & set(sys.modules), sorted(sys.modules); "
            "assert 'companion.tails' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
