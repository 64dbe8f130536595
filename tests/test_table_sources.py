"""Table sources and link texts (issue 25, item 5).

1. ``\\|`` in a Markdown table: the table parser reads it as an escaped cell separator and the
   maths shows ``|``, not ``‖`` (‖X‖_ψ₂ renders as |X|_ψ₂).  Norms in tables are written
   ``\\lVert … \\rVert``.  Every Markdown table of book/*.md and of every notebook (its markdown
   cells, and the Markdown its code cells output, e.g. ``companion.plots.table``) is found, with or
   without leading pipes, outside fenced code; each test names every offending row of its page.
   This test is strict: it fails until every page is clean.
2. Link texts: on one page a link text (``Theorem 2``, ``Sun et al. [2024]``) must lead to one
   target only (tests/render/links.py; `make check-render` runs it over the built HTML).
"""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.md")) + sorted(BOOK.glob("*.ipynb"))

sys.path.insert(0, str(Path(__file__).parent / "render"))
from links import article_links, link_collisions  # noqa: E402

DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def table_rows(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every row of every Markdown (GFM) table in ``text``: the header line
    above a delimiter row (``|---|:--:|``), the delimiter, and the following lines up to a blank
    line or a line without ``|``.  Fenced code (``` or ~~~) is skipped."""
    lines = text.splitlines()
    rows, fence, k = [], None, 0
    while k < len(lines):
        line = lines[k]
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif (fence is None and k + 1 < len(lines) and "|" in line and "|" in lines[k + 1]
              and DELIMITER.match(lines[k + 1])):
            j = k + 2
            while j < len(lines) and lines[j].strip() and "|" in lines[j] and not FENCE.match(lines[j]):
                j += 1
            rows += [(i + 1, lines[i]) for i in range(k, j)]
            k = j
            continue
        k += 1
    return rows


MATHS = re.compile(r"\$[^$]+\$")


def escaped_bars(text: str) -> list[tuple[int, str]]:
    """Table rows with ``\\|`` inside maths (``$…$``); outside maths ``\\|`` is the escape of a literal
    ``|`` in a cell (e.g. ``max \\|z\\|`` in a header that ``plots.table`` writes) and renders as ``|``."""
    return [(n, line) for n, line in table_rows(text)
            if any("\\|" in m.group(0) for m in MATHS.finditer(line))]


def markdown_sources(path: Path) -> list[tuple[str, str]]:
    """(where, Markdown text) of a page: the file, or each markdown cell of a notebook and each
    Markdown output of its code cells."""
    if path.suffix == ".md":
        return [(path.name, path.read_text())]
    out = []
    for k, cell in enumerate(json.loads(path.read_text())["cells"]):
        where = f"{path.name} cell {k} ({cell.get('id', '?')})"
        if cell["cell_type"] == "markdown":
            out.append((where, "".join(cell["source"])))
        for o in cell.get("outputs", []):
            md = o.get("data", {}).get("text/markdown")
            if md is not None:
                out.append((where + " output", "".join(md) if isinstance(md, list) else md))
    return out


# -- the detector ---------------------------------------------------------------------------------

def test_rows_are_found_with_and_without_leading_pipes():
    text = "a | b\n--|--\n$\\|x\\|$ | 1\n\nprose with $\\|x\\|$ | not a table\n"
    assert escaped_bars(text) == [(3, "$\\|x\\|$ | 1")]
    text = "| $\\lVert x\\rVert$ | n |\n|:---|---:|\n| $\\|y\\|$ | 2 |\n| ok | 3 |"
    assert [n for n, _ in escaped_bars(text)] == [3]
    assert len(table_rows(text)) == 4


def test_maths_and_code_outside_tables_are_not_rows():
    text = "$$\\|x\\|_2 \\le 1$$\n\n```python\n| \\| |\n|---|\n| \\| |\n```\n\n| a |\n|---|\n| b |\n"
    assert escaped_bars(text) == []
    assert [n for n, _ in table_rows(text)] == [9, 10, 11]


def test_an_escaped_pipe_in_text_is_allowed():
    text = "| max \\|z\\| | $\\|x\\|$ |\n|---|---|\n| 1 \\| 2 | 3 |\n"
    assert [n for n, _ in escaped_bars(text)] == [1]


def test_a_table_ends_at_a_blank_line():
    text = "| a |\n|---|\n| 1 |\n\n| $\\|x\\|$ | not after a delimiter |\n"
    assert escaped_bars(text) == []


def test_notebook_sources_include_markdown_outputs(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "id": "m1", "source": ["| a |\n", "|---|\n", "| $\\|x\\|$ |"]},
        {"cell_type": "code", "id": "c1", "source": [], "outputs": [
            {"output_type": "execute_result", "data": {"text/markdown": "| n |\n|---|\n| $\\|y\\|$ |"}}]},
    ]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    found = [(w, escaped_bars(t)) for w, t in markdown_sources(path)]
    assert [w for w, bad in found if bad] == ["x.ipynb cell 0 (m1)", "x.ipynb cell 1 (c1) output"]


# -- the book (strict: every page) ----------------------------------------------------------------

@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_escaped_bar_in_a_table_row(path):
    bad = [f"{where} line {n}: {line.strip()[:100]}"
           for where, text in markdown_sources(path) for n, line in escaped_bars(text)]
    assert not bad, (f"{len(bad)} table row(s) write \\| (renders as |); use \\lVert ... \\rVert:\n  "
                     + "\n  ".join(bad))


# -- link texts -----------------------------------------------------------------------------------

PAGE = """<html><body><nav><a href="theorem2.html">Theorem 2</a></nav>
<article class="bd-article"><section><h1>T<a class="headerlink" href="#t">#</a></h1>
<p>By <a class="reference internal" href="#subg-thm-chernoff">Theorem 2</a> and
<a class="reference internal" href="theorem2.html">Theorem 2</a>;
again <a class="reference internal" href="subgaussian_tails.html#subg-thm-chernoff">Theorem 2</a>.</p>
<p><span class="bibtex-citation" id="id1">Sun <em>et al.</em>
[<a href="bibliography.html#id6">2024</a>]</span>,
<span class="bibtex-citation" id="id2">Xiao <em>et al.</em>
[<a href="bibliography.html#id10">2024</a>]</span>,
<span class="bibtex-citation" id="id3">[<a href="bibliography.html#id1">Hoeffding, 1963</a>,
<a href="bibliography.html#id2">Boucheron <em>et al.</em>, 2013</a>]</span>
<a class="reference internal" href="#x">Lemma</a>
<a role="doc-backlink" href="#r1">1</a> <a role="doc-backlink" href="#r2">1</a></p>
</section></article><a class="right-next" href="theorem2.html">Theorem 2</a></body></html>"""


def test_link_texts_leading_to_two_targets_are_found():
    problems = link_collisions(PAGE, "book/subgaussian_tails.html")
    # "#subg-thm-chernoff" and "subgaussian_tails.html#subg-thm-chernoff" are one target on this page
    assert problems[0] == ("link text 'Theorem 2' leads to 2 targets: "
                           "['/book/subgaussian_tails.html#subg-thm-chernoff', '/book/theorem2.html']")
    assert problems[1:] == ["link text 'Lemma' has no number"]


def test_only_the_article_counts_and_citations_are_labelled_whole():
    labels = [t for t, _ in article_links(PAGE)]
    assert labels.count("Theorem 2") == 3                     # not the sidebar, not "next"
    assert "Sun et al. [2024]" in labels and "Xiao et al. [2024]" in labels and "2024" not in labels
    assert "Hoeffding, 1963" in labels and "Boucheron et al., 2013" in labels
    assert "#" not in labels and "1" not in labels            # permalinks and footnote back-links


def test_one_target_per_text_passes():
    ok = PAGE.replace('href="theorem2.html">Theorem 2</a>;',
                      'href="theorem2.html">the Theorem 2 chapter</a>;')
    assert link_collisions(ok.replace(">Lemma<", ">Lemma 3<"), "book/subgaussian_tails.html") == []
