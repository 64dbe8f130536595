"""The import contract of ``companion``: layers of folders and allowed imports, read from CONTRIBUTING.md.

CONTRIBUTING.md ("Architecture: layers and the import contract") lists the layers bottom first;
each entry is a folder (``theory``: every module of ``companion/theory/``) or, in the foundation
and reader-facing layers, a module at the top of the package.  A module may import companion
modules of lower layers, of entries listed before its own in its layer, and of its own folder;
the imports inside one folder form no cycle.  Every import of every module is checked (also
imports inside functions), with the ast module: nothing is imported or executed.  Two more rules:
no private name (``_x``) of a module in another folder is imported or used as ``module._x``, and
the foundation and theory layers import torch and transformers at most inside functions.  The
last tests show that each rule catches a violation.
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
    """The layers of the contract block in CONTRIBUTING.md, bottom first (full names of entries)."""
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


def folder(name: str) -> str:
    """The folder (package) a module belongs to: ``companion.theory`` for its modules and its
    ``__init__``; ``companion`` for the modules at the top."""
    if _is_package(name):
        return name
    return name.rsplit(".", 1)[0] if "." in name else name


def _is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split(".")) / "__init__.py").exists()


def entry_of(name: str) -> str:
    """The contract entry of a module: its folder below the top, else the module itself."""
    f = folder(name)
    return f if f != "companion" else name


def position(name: str, layers) -> tuple[int, int] | None:
    """(layer, index in layer) of a module's entry."""
    entry = entry_of(name)
    for i, layer in enumerate(layers):
        if entry in layer:
            return i, layer.index(entry)
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
        same_folder = entry_of(target) == entry_of(module)
        if not same_folder and (module, target) not in EXCEPTIONS:
            other = position(target, layers)
            if other is None:
                out.append(f"{module}:{lineno} imports {target}, which is in no layer")
            elif other >= where:
                out.append(f"{module}:{lineno} imports {target} (layer {other[0]}) from layer {where[0]}: "
                           f"upward or out of order")
        for name in sorted(names):
            if name.startswith("_") and not name.startswith("__") and folder(target) != folder(module):
                out.append(f"{module}:{lineno} imports the private name {target}.{name} of another folder")
    aliases = module_aliases(source)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and folder(aliases[node.value.id]) != folder(module)):
            out.append(f"{module}:{node.lineno} uses the private name {aliases[node.value.id]}.{node.attr} "
                       "of another folder")
    return out


def folder_cycles(files: dict[str, str]) -> list[list[str]]:
    """Cycles of imports between modules of one folder (``files``: module -> source)."""
    graph = {m: set() for m in files}
    for m, src in files.items():
        for _, target, _, _ in imports(src):
            if target in graph and target != m and entry_of(target) == entry_of(m):
                graph[m].add(target)
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


# ---------------------------------------------------------------------------------------------
def test_every_module_is_in_exactly_one_layer_and_every_entry_exists():
    layers = read_layers()
    entries = [e for layer in layers for e in layer]
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    for module in module_files():
        assert position(module, layers) is not None, f"{module} is in no layer of CONTRIBUTING.md"
    for entry in entries:
        assert _is_module(entry), f"CONTRIBUTING.md lists {entry}, which does not exist"


def test_the_top_of_the_package_has_the_books_parts_as_folders():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"theory", "stacks", "transformers", "injection", "outliers", "applications", "experiments"} <= folders


@pytest.mark.parametrize("module", sorted(module_files()))
def test_module_obeys_the_import_contract(module):
    assert violations(module, module_files()[module].read_text(), read_layers()) == []


def test_no_folder_has_an_import_cycle():
    sources = {m: p.read_text() for m, p in module_files().items()}
    assert folder_cycles(sources) == []


def test_package_imports_are_nonempty_so_the_check_is_not_vacuous():
    edges = {(m, t) for m, p in module_files().items()
             for _, t, _, _ in imports(p.read_text()) if t != "<heavy>"}
    assert ("companion.transformers.stream", "companion.transformers.models") in edges
    assert ("companion.theory.concentration", "companion.theory.subgaussian") in edges
    assert ("companion.theory.subgaussian", "companion._validation") in edges
    assert ("companion.injection.engine", "companion.transformers.stream") in edges
    assert len(edges) > 30


# ------------------------------------------------------------------- deliberate violations
@pytest.mark.parametrize("module, source, expected", [
    ("companion.theory.subgaussian", "from companion.stacks import residual\n", "upward"),          # 1 -> 2
    ("companion.theory.subgaussian", "def f():\n    import companion.transformers.stream\n", "upward"),  # lazy, too
    ("companion.stacks.residual", "from companion.transformers.hooks import hooks\n", "out of order"),
    ("companion.injection.engine", "from companion.outliers.regimes import max_abs_z\n", "out of order"),
    ("companion.injection.engine", "from companion.transformers.models import _parse_dtype\n", "private name"),
    ("companion.injection.engine", "from companion.transformers import models\nmodels._LOADED\n", "private name"),
    ("companion.theory.exceedance", "import torch\n", "module level"),
    ("companion.new_module", "import numpy\n", "no layer"),
    ("companion.transformers.stream", "from . import models\n", "relative import"),
])
def test_a_deliberate_violation_is_detected(module, source, expected):
    found = violations(module, source, read_layers())
    assert any(expected in v for v in found), found


def test_a_cycle_inside_a_folder_is_detected():
    sources = {"companion.stacks.residual": "from companion.stacks.tinylm import TinyLM\n",
               "companion.stacks.tinylm": "from companion.stacks.residual import StackConfig\n"}
    assert folder_cycles(sources) == [["companion.stacks.residual", "companion.stacks.tinylm",
                                       "companion.stacks.residual"]]


def test_a_changed_contract_is_enforced_against_the_real_code():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    swapped = text.replace("stacks transformers", "transformers stacks")
    assert swapped != text
    layers = read_layers(swapped)
    found = violations("companion.applications.training_controls",
                       (PACKAGE / "applications" / "training_controls.py").read_text(), layers)
    assert found == []          # applications sit above both
    moved = text.replace("1 theory:        theory", "1 theory:        theory injection").replace(
        "3 analyses:      injection outliers applications", "3 analyses:      outliers applications")
    assert moved != text
    found = violations("companion.injection.engine", (PACKAGE / "injection" / "engine.py").read_text(),
                       read_layers(moved))
    assert any("companion.transformers" in v and "upward" in v for v in found), found


def test_allowed_imports_are_not_flagged():
    layers = read_layers()
    ok = ("from companion._validation import check_int\nfrom companion.theory import _cgf, subgaussian\n"
          "from companion.theory._cgf import log_phi\ndef f():\n    import torch\n")
    assert violations("companion.theory.concentration", ok, layers) == []
