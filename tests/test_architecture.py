"""The import contract of ``companion``: layers and allowed imports, read from CONTRIBUTING.md.

CONTRIBUTING.md ("Architecture: layers and the import contract") lists the layers; a module may
import companion modules of lower layers and, in its own layer, only those listed before it.
Every import of every module is checked (also imports inside functions), with the ast module:
nothing is imported or executed.  Two more rules: no private name (``_x``) of another companion
module is imported or used as ``module._x``, and the foundation and mathematics layers import torch
and transformers at most inside functions.  The last tests show that each rule catches a violation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "companion"
NUMPY_ONLY_LAYERS = 2            # layers 0 and 1 do not load torch when imported
HEAVY = {"torch", "transformers"}
#: (importer, imported): the documented exceptions to the layer order.
EXCEPTIONS = {("companion.experiments", "companion")}   # reads companion.__version__


def read_layers(text: str | None = None) -> list[list[str]]:
    """The layers of the contract block in CONTRIBUTING.md, bottom first (full module names)."""
    text = (ROOT / "CONTRIBUTING.md").read_text() if text is None else text
    block = re.search(r"<!-- import-contract -->\s*```text\n(.*?)```", text, re.S)
    assert block, "CONTRIBUTING.md has no import-contract block"
    layers = []
    for k, line in enumerate(block.group(1).strip().splitlines()):
        number, rest = line.split(" ", 1)
        assert int(number) == k, f"layers must be numbered 0, 1, ... in order: {line!r}"
        names = rest.split(":", 1)[1].split()
        layers.append(["companion" if n == "companion" else f"companion.{n}" for n in names])
    return layers


def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def position(name: str, layers) -> tuple[int, int] | None:
    """(layer, index in layer) of a module; ``pkg.*`` entries match every submodule of pkg."""
    for i, layer in enumerate(layers):
        for j, entry in enumerate(layer):
            if entry == name or (entry.endswith(".*") and name.startswith(entry[:-1])):
                return i, j
    return None


def imports(source: str):
    """Yield ``(lineno, target module, imported names, top_level)`` for companion imports,
    ``(lineno, "<heavy>", {root}, top_level)`` for torch/transformers and ``"<relative>"`` for
    relative imports (the package uses absolute ones)."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root in HEAVY:
                    yield node.lineno, "<heavy>", {root}, id(node) in top
                elif root == "companion":
                    yield node.lineno, a.name, set(), id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                yield node.lineno, "<relative>", set(), id(node) in top
                continue
            base = node.module
            root = base.split(".")[0]
            if root in HEAVY:
                yield node.lineno, "<heavy>", {root}, id(node) in top
            elif root == "companion":
                plain = set()
                for a in node.names:
                    if _is_module(f"{base}.{a.name}"):
                        yield node.lineno, f"{base}.{a.name}", set(), id(node) in top
                    else:
                        plain.add(a.name)
                if plain:
                    yield node.lineno, base, plain, id(node) in top


def module_aliases(source: str) -> dict[str, str]:
    """Names bound to companion modules: ``from companion import tails as t`` -> {"t": ...}."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("companion"):
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("companion.") and a.asname:
                    out[a.asname] = a.name
    return out


def violations(module: str, source: str, layers) -> list[str]:
    """Every way ``source`` (the text of ``module``) breaks the contract."""
    where = position(module, layers)
    if where is None:
        return [f"{module} is in no layer of the import contract (CONTRIBUTING.md)"]
    out = []
    for lineno, target, names, top_level in imports(source):
        if target == "<heavy>":
            if where[0] < NUMPY_ONLY_LAYERS and top_level:
                out.append(f"{module}:{lineno} imports {names.pop()} at module level (layer {where[0]} "
                           f"must not load it on import)")
            continue
        if target == "<relative>":
            out.append(f"{module}:{lineno} uses a relative import; write companion.<module>")
            continue
        if target != module and (module, target) not in EXCEPTIONS:
            other = position(target, layers)
            if other is None:
                out.append(f"{module}:{lineno} imports {target}, which is in no layer")
            elif other >= where:
                out.append(f"{module}:{lineno} imports {target} (layer {other[0]}) from layer {where[0]}: "
                           f"upward or out of order")
        for name in sorted(names):
            if name.startswith("_") and not name.startswith("__") and target != module:
                out.append(f"{module}:{lineno} imports the private name {target}.{name}")
    aliases = module_aliases(source)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases[node.value.id] != module):
            out.append(f"{module}:{node.lineno} uses the private name {aliases[node.value.id]}.{node.attr}")
    return out


# ---------------------------------------------------------------------------------------------
def test_every_module_is_in_exactly_one_layer_and_every_entry_exists():
    layers = read_layers()
    entries = [e for layer in layers for e in layer]
    assert len(entries) == len(set(entries)), "a module is listed twice"
    for module in module_files():
        assert position(module, layers) is not None, f"{module} is in no layer of CONTRIBUTING.md"
    for entry in entries:
        assert entry.endswith(".*") or _is_module(entry), f"CONTRIBUTING.md lists {entry}, which does not exist"


@pytest.mark.parametrize("module", sorted(module_files()))
def test_module_obeys_the_import_contract(module):
    assert violations(module, module_files()[module].read_text(), read_layers()) == []


def test_package_imports_are_nonempty_so_the_check_is_not_vacuous():
    edges = {(m, t) for m, p in module_files().items()
             for _, t, _, _ in imports(p.read_text()) if t != "<heavy>"}
    assert ("companion.probes", "companion.models") in edges
    assert ("companion.concentration", "companion.tails") in edges
    assert ("companion.tails", "companion._validation") in edges
    assert len(edges) > 30


# ------------------------------------------------------------------- deliberate violations
@pytest.mark.parametrize("module, source, expected", [
    ("companion.tails", "from companion import stacks\n", "upward"),                      # 1 -> 2
    ("companion.tails", "def f():\n    import companion.probes\n", "upward"),            # lazy, too
    ("companion.tails", "from companion.concentration import psi1_norm\n", "out of order"),
    ("companion.probes", "from companion.models import _check_model\n", "private name"),
    ("companion.concentration", "from companion import tails\ntails._moments(1)\n", "private name"),
    ("companion.extremes", "import torch\n", "module level"),
    ("companion.new_module", "import numpy\n", "no layer"),
    ("companion.probes", "from . import models\n", "relative import"),
])
def test_a_deliberate_violation_is_detected(module, source, expected):
    found = violations(module, source, read_layers())
    assert any(expected in v for v in found), found


def test_a_changed_contract_is_enforced_against_the_real_code():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    swapped = text.replace("hooks stacks quantization models probes", "hooks stacks quantization probes models")
    assert swapped != text
    layers = read_layers(swapped)
    found = violations("companion.probes", (PACKAGE / "probes.py").read_text(), layers)
    assert any("companion.models" in v and "out of order" in v for v in found), found


def test_allowed_imports_are_not_flagged():
    layers = read_layers()
    ok = ("from companion._validation import check_int\nfrom companion import _cgf, tails\n"
          "def f():\n    import torch\n")
    assert violations("companion.concentration", ok, layers) == []
