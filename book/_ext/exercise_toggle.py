"""One toggle per exercise solution in the HTML book: the solution's text and its code together.

A chapter writes an exercise's solution as a collapsed admonition, optionally followed by the code
cell(s) that compute and check the answer, tagged ``hide-cell`` and starting with a
``# Solution to Exercise N`` comment::

    ```{admonition} Solution          <- end of the exercise's markdown cell
    :class: dropdown
    The argument ...
    ```
    # Solution to Exercise 3          <- next cell: code, tagged hide-cell
    ...

Rendered as they stand, a reader has two toggles to open (the admonition, then the code cell's own
"Show code cell content").  This post-transform moves each such code cell, with its outputs, into the
admonition just before it and drops the cell's own hiding, so that one click shows the whole
solution.  A solution cell with no admonition before it gets one of its own, titled "Solution".
"Discussion" dropdowns (open-ended exercises) are treated the same way.

Only the HTML builders are affected.  The PDF (LaTeX) shows every admonition and every cell in full
anyway, and leaving its doctree alone keeps the tables of solution outputs out of LaTeX boxes (where a
``longtable`` cannot break across pages).
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

TITLES = ("Solution", "Discussion")
SOLUTION_COMMENT = re.compile(r"\s*#\s*(Solution|Discussion)\b", re.I)
TAGS = {"hide-cell", "solution"}


def _tags(cell: nodes.Element) -> set[str]:
    return set((cell.get("cell_metadata") or {}).get("tags", []))


def _source(cell: nodes.Element) -> str:
    for child in cell.findall(nodes.literal_block):
        return child.astext()
    return ""


def is_solution_cell(node: nodes.Node) -> bool:
    """A myst-nb code cell holding a solution: tagged hide-cell/solution, "# Solution ..." first."""
    if not isinstance(node, nodes.container) or node.get("nb_element") != "cell_code":
        return False
    if "solution-cell" in node["classes"]:   # already moved into its admonition
        return False
    if "solution" in _tags(node):
        return True
    hidden = "hide-cell" in _tags(node) or node.get("hide_mode") == "all"
    return hidden and bool(SOLUTION_COMMENT.match(_source(node)))


def is_solution_admonition(node: nodes.Node) -> bool:
    """A collapsed admonition titled "Solution ..." or "Discussion ..."."""
    if not isinstance(node, nodes.admonition) or "dropdown" not in node["classes"]:
        return False
    title = node.children[0] if node.children else None
    return isinstance(title, nodes.title) and title.astext().strip().startswith(TITLES)


def _unhide(cell: nodes.container) -> None:
    for key in ("hide_mode", "prompt_show", "prompt_hide"):
        if key in cell.attributes:
            del cell[key]
    cell["classes"] = [c for c in cell["classes"] if c not in ("tag_hide-cell", "tag_solution")]
    cell["classes"].append("solution-cell")


def _new_admonition(cell: nodes.container) -> nodes.admonition:
    match = SOLUTION_COMMENT.match(_source(cell))
    title = match.group(1).capitalize() if match else "Solution"
    adm = nodes.admonition("", classes=[f"admonition-{title.lower()}", "dropdown"])
    adm += nodes.title("", title)
    return adm


def merge_solutions(doctree: nodes.Node) -> int:
    """Move every solution code cell into the solution admonition before it; return how many."""
    moved = 0
    for parent in list(doctree.findall(nodes.Element)):
        children = list(parent.children)
        if not any(is_solution_cell(c) for c in children):
            continue
        target: nodes.admonition | None = None
        kept: list[nodes.Node] = []
        for child in children:
            if is_solution_cell(child):
                if target is None:
                    target = _new_admonition(child)
                    kept.append(target)
                _unhide(child)
                target.append(child)
                moved += 1
                continue
            target = child if is_solution_admonition(child) else None
            kept.append(child)
        parent.children = []
        parent.extend(kept)
    return moved


class MergeSolutionCells(SphinxPostTransform):
    """Run before myst-nb's HideInputCells (priority 199) so that it leaves the cells alone."""

    default_priority = 150
    formats = ("html",)

    def run(self, **kwargs) -> None:
        merge_solutions(self.document)


def setup(app):
    app.add_post_transform(MergeSolutionCells)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
