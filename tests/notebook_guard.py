"""Checks that make nbval meaningful: nbval only compares outputs that are stored.

``notebook_problems(path)`` lists everything wrong with one chapter notebook;
``toc_notebooks()`` lists the chapters named in ``_toc.yml``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every ``file:`` entry of the table of contents (root included), without suffix."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return files


def resolve(entry: str, root: Path = ROOT) -> Path | None:
    """The file a toc entry points at (``.ipynb`` or ``.md``), or None if neither exists."""
    for suffix in (".ipynb", ".md"):
        path = root / f"{entry}{suffix}"
        if path.exists():
            return path
    return None


def toc_notebooks() -> list[Path]:
    return [p for p in (resolve(e) for e in toc_files()) if p is not None and p.suffix == ".ipynb"]


def setup_order_problems(first_cell: str) -> list[str]:
    """The first code cell must run ``import companion`` and ``companion.setup_notebook(...)``
    before any other import: setup_notebook pins the CPU kernel set, which NumPy reads when it is
    imported (see companion/determinism.py)."""
    statements = [line for line in first_cell.splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    if not statements or statements[0].strip() != "import companion":
        return ["the first code cell must begin with `import companion`"]
    for line in statements[1:]:
        if "setup_notebook(" in line:
            return []
        if line.lstrip().startswith(("import ", "from ")):
            return [f"`{line.strip()}` comes before companion.setup_notebook() in the first code cell"]
    return ["the first code cell must call companion.setup_notebook() right after `import companion`"]


def notebook_problems(path: Path) -> list[str]:
    """Everything that would let nbval pass vacuously or a reader fail, as messages."""
    try:
        nb = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path}: cannot be read as JSON ({exc})"]
    problems = []
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != "python3":
        problems.append(f"{path}: kernelspec name is {kernel!r}, not 'python3'")
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    if not code:
        problems.append(f"{path}: has no code cell")
    source = "\n".join("".join(c.get("source", "")) for c in code)
    if "companion" not in source:
        problems.append(f"{path}: never imports companion")
    if "setup_notebook(" not in source:
        problems.append(f"{path}: never calls companion.setup_notebook()")
    if code:
        problems += [f"{path}: {p}" for p in setup_order_problems("".join(code[0].get("source", "")))]
    for i, cell in enumerate(code):
        if not "".join(cell.get("source", "")).strip():
            continue
        if cell.get("execution_count") is None:
            problems.append(f"{path}: code cell {i} was never executed")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"{path}: code cell {i} stores an error ({out.get('ename')})")
    counts = [c.get("execution_count") for c in code if c.get("execution_count") is not None]
    if counts and counts != sorted(counts):
        problems.append(f"{path}: cells were executed out of order {counts}")
    if not any(c.get("outputs") for c in code):
        problems.append(f"{path}: no code cell has a stored output")
    return problems
