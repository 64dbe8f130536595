"""book/_ext/exercise_toggle.py: one toggle per exercise solution (its text and its code together).

Checked twice: on a small hand-made doctree (the transform itself), and by building a tiny book of
one notebook with Sphinx + myst-nb (HTML: the solution's code sits inside the solution's dropdown and
has no toggle of its own; LaTeX: the solution's text and code are both written out in full).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
exercise_toggle = pytest.importorskip("exercise_toggle")


def _admonition(title: str = "Solution", text: str = "The argument.") -> nodes.admonition:
    adm = nodes.admonition("", classes=["admonition-solution", "dropdown"])
    adm += nodes.title("", title)
    adm += nodes.paragraph("", text)
    return adm


def _cell(source: str, tags=("hide-cell",)) -> nodes.container:
    cell = nodes.container(nb_element="cell_code", cell_metadata={"tags": list(tags)},
                           classes=["cell"] + [f"tag_{t}" for t in tags])
    if "hide-cell" in tags:
        cell["hide_mode"] = "all"
        cell["prompt_show"], cell["prompt_hide"] = "Show code cell {type}", "Hide code cell {type}"
    src = nodes.container(nb_element="cell_code_source", classes=["cell_input"])
    src += nodes.literal_block(source, source)
    cell += src
    out = nodes.container(nb_element="cell_code_output", classes=["cell_output"])
    out += nodes.literal_block("42", "42")
    cell += out
    return cell


def _document() -> nodes.document:
    doc = new_document("<test>", get_default_settings(Parser))
    section = nodes.section()
    doc += section
    section += nodes.title("", "Exercises")
    section += nodes.paragraph("", "Exercise 1 (★).")
    section += _admonition()
    section += _cell("# Solution to Exercise 1\nx = 1")
    section += _cell("# Solution to Exercise 1, continued\nprint(x)")
    section += nodes.paragraph("", "Exercise 2 (★★).")
    section += _admonition(text="A proof, no code.")
    section += nodes.paragraph("", "Exercise 3 (★).")
    section += _cell("# Solution to Exercise 3\ny = 2")          # no admonition before it
    section += _cell("z = 3  # an ordinary hidden cell", tags=("hide-cell",))
    section += _cell("w = 4", tags=())
    section += nodes.paragraph("", "Exercise 4 (★★★).")
    section += _admonition(title="Discussion")
    section += _cell("# Discussion of Exercise 4\nprint(4)")
    return doc


def test_solution_cells_move_into_their_admonition():
    doc = _document()
    assert exercise_toggle.merge_solutions(doc) == 4
    section = doc[0]
    adms = [c for c in section.children if isinstance(c, nodes.admonition)]
    assert [a[0].astext() for a in adms] == ["Solution", "Solution", "Solution", "Discussion"]
    inside = [[c for c in a.children if isinstance(c, nodes.container)] for a in adms]
    assert [len(cells) for cells in inside] == [2, 0, 1, 1]
    assert inside[0][0].astext().startswith("# Solution to Exercise 1\nx = 1")
    assert "print(x)" in inside[0][1].astext()
    assert inside[2][0].astext().startswith("# Solution to Exercise 3")
    # The moved cells lose their own toggle (one click opens text and code).
    for cells in inside:
        for cell in cells:
            assert "hide_mode" not in cell.attributes
            assert "tag_hide-cell" not in cell["classes"]
            assert "solution-cell" in cell["classes"]
    # The order of the section is kept, and cells that are not solutions stay where they were.
    kinds = [type(c).__name__ for c in section.children]
    assert kinds == ["title", "paragraph", "admonition", "paragraph", "admonition", "paragraph",
                     "admonition", "container", "container", "paragraph", "admonition"]
    plain = [c for c in section.children if isinstance(c, nodes.container)]
    assert plain[0].get("hide_mode") == "all" and "z = 3" in plain[0].astext()
    assert "w = 4" in plain[1].astext()
    # Idempotent: nothing left to move.
    assert exercise_toggle.merge_solutions(doc) == 0


def test_admonition_must_be_a_solution_dropdown():
    note = nodes.admonition("", classes=["dropdown"])
    note += nodes.title("", "Remark")
    assert not exercise_toggle.is_solution_admonition(note)
    open_solution = nodes.admonition("", classes=["admonition-solution"])
    open_solution += nodes.title("", "Solution")
    assert not exercise_toggle.is_solution_admonition(open_solution)
    assert exercise_toggle.is_solution_admonition(_admonition())
    assert exercise_toggle.is_solution_cell(_cell("print(1)", tags=("solution",)))
    assert not exercise_toggle.is_solution_cell(_cell("# Solution to Exercise 1", tags=()))


NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"},
                 "language_info": {"name": "python"}},
    "cells": [
        {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": [
            "# Tiny\n", "\n", "## Exercises\n", "\n",
            "**Exercise 1** (★). Compute one plus one.\n", "\n",
            "```{admonition} Solution\n", ":class: dropdown\n", "\n",
            "It is TWO-IN-TEXT.\n", "```\n"]},
        {"cell_type": "code", "id": "c1", "execution_count": 1,
         "metadata": {"tags": ["hide-cell"]},
         "source": ["# Solution to Exercise 1\n", "print('TWO-IN-CODE', 1 + 1)"],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": ["TWO-IN-CODE 2\n"]}]},
        {"cell_type": "code", "id": "c2", "execution_count": 2,
         "metadata": {"tags": ["hide-cell"]}, "source": ["OTHER_HIDDEN = 3"], "outputs": []},
    ],
}

CONF = f"""
import sys
sys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})
extensions = ["myst_nb", "exercise_toggle"]
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence"]
master_doc = "tiny"
latex_documents = [("tiny", "tiny.tex", "Tiny", "A", "manual")]
"""


@pytest.fixture(scope="module")
def tiny_book(tmp_path_factory) -> Path:
    pytest.importorskip("myst_nb")
    import json

    src = tmp_path_factory.mktemp("tiny")
    (src / "conf.py").write_text(CONF, encoding="utf-8")
    (src / "tiny.ipynb").write_text(json.dumps(NOTEBOOK), encoding="utf-8")
    for builder in ("html", "latex"):
        proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", builder, str(src),
                               str(src / "_build" / builder)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return src / "_build"


def test_tiny_book_html_has_one_toggle_per_solution(tiny_book):
    html = (tiny_book / "html" / "tiny.html").read_text(encoding="utf-8")
    title = html.index('<p class="admonition-title">Solution</p>')
    start = html.rindex("<div", 0, title)
    assert "dropdown" in html[start:title]
    text, code = html.index("TWO-IN-TEXT", start), html.index("TWO", html.index("Solution to Ex"))
    # The code cell comes after the solution's text, before the admonition's div is closed.
    depth, pos = 0, start
    for m in re.finditer(r"<div\b|</div>", html[pos:]):
        depth += 1 if m.group(0) == "<div" else -1
        if depth == 0:
            end = pos + m.end()
            break
    assert start < text < code < end
    assert "TWO-IN-CODE 2" in html[start:end]
    # No toggle of its own for the solution cell; the ordinary hidden cell keeps its toggle.
    assert html[start:end].count("<details") == 0
    assert html.count("<details") == 1 and "OTHER_HIDDEN" in html[html.index("<details"):]


def test_tiny_book_latex_shows_solution_in_full(tiny_book):
    tex = (tiny_book / "latex" / "tiny.tex").read_text(encoding="utf-8")
    # The admonition, its text, then the cell's source and output: nothing collapsed in the PDF.
    adm = tex.index("\\begin{sphinxadmonition}{note}{Solution}")
    text = tex.index("It is TWO\\sphinxhyphen{}IN\\sphinxhyphen{}TEXT.")
    code = tex.index("Solution to Exercise 1")
    output = tex.index("TWO\\PYGZhy{}IN\\PYGZhy{}CODE 2")
    assert adm < text < code < output
    assert "OTHER\\PYGZus{}HIDDEN" in tex
