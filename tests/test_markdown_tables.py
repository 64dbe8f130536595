"""Maths inside Markdown tables: ``\\|`` is read as an escaped cell separator and renders as ``|``.

A norm inside a table row must be written ``\\Vert`` (or ``\\lVert``/``\\rVert``); this test finds
every table row of every chapter and page that still writes ``\\|``.
"""

import json
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"


PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))


def markdown_text(path: Path) -> str:
    """The Markdown of a page: its text, or a notebook's markdown cells joined."""
    if path.suffix == ".md":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def table_rows_with_escaped_bars(text: str) -> list[str]:
    """Table rows (lines starting with ``|``) that contain ``\\|``."""
    return [line for line in text.splitlines() if line.lstrip().startswith("|") and "\\|" in line]


def test_detector_finds_an_escaped_bar():
    assert table_rows_with_escaped_bars("| $\\|x\\|$ | norm |") != []
    assert table_rows_with_escaped_bars("| $\\Vert x\\Vert$ | norm |\n$\\|x\\|$ outside") == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_escaped_bar_in_a_table(path):
    bad = table_rows_with_escaped_bars(markdown_text(path))
    assert not bad, f"{path.name}: write \\Vert instead of \\| inside a Markdown table: {bad[0][:120]}"
