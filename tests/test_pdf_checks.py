"""The checks of tests/render/check_pdf.py fail on a deliberately broken table (no book build needed).

A tiny LaTeX document (pdflatex, a few seconds) sets a 45-row claim table three ways:

* as a ``longtable`` that breaks across pages: every row is in the PDF's text, no ink leaves the frame;
* as a ``tabular`` (which cannot break): it runs through the footer and off the paper, the rows past the
  page are missing from ``pdftotext``'s text, and there is ink between the text block and the footer and
  below the footer;
* as a ``longtable`` too wide for the text block (a column of fixed width): ink in the right margin.

The labelled items come from a one-page fake book (``errata.md`` with the same table), read by
``labelled_items`` as the real book's pages are.  The tests that typeset are skipped where pdflatex or
poppler is missing (CI has no TeX).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "render"))
check_pdf = pytest.importorskip("check_pdf")

MISSING = [tool for tool in ("pdflatex", "pdftotext", "pdftoppm") if shutil.which(tool) is None]
needs_tex = pytest.mark.skipif(bool(MISSING), reason=f"not installed (TeX Live / poppler-utils): "
                                                     f"{MISSING}")

ROWS = 45
PREAMBLE = r"""
\documentclass[10pt]{article}
\usepackage[a5paper,margin=2cm,footskip=1cm]{geometry}
\usepackage{longtable,array,fancyhdr}
\pagestyle{fancy}\fancyhf{}\fancyfoot[C]{\thepage}\renewcommand{\footrulewidth}{0.4pt}
\makeatletter
\AtBeginDocument{%
  \typeout{CHECKPDF paperwidth=\the\paperwidth}\typeout{CHECKPDF paperheight=\the\paperheight}%
  \typeout{CHECKPDF textwidth=\the\textwidth}\typeout{CHECKPDF textheight=\the\textheight}%
  \typeout{CHECKPDF oddsidemargin=\the\oddsidemargin}%
  \typeout{CHECKPDF evensidemargin=\the\evensidemargin}%
  \typeout{CHECKPDF topmargin=\the\topmargin}\typeout{CHECKPDF headheight=\the\headheight}%
  \typeout{CHECKPDF headsep=\the\headsep}\typeout{CHECKPDF footskip=\the\footskip}%
  \typeout{CHECKPDF hoffset=\the\hoffset}\typeout{CHECKPDF voffset=\the\voffset}%
  \typeout{CHECKPDF twoside=\if@twoside 1\else 0\fi}}
\makeatother
\begin{document}
Errata: the claims and their verdicts.

"""
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def _claim(i: int) -> str:
    return f"claim {WORDS[i % 9]} {WORDS[(i // 9) % 9]} number {i} holds"


def _latex(kind: str) -> str:
    rows = "\n".join(f"A{i} & {_claim(i)} & verdict {i} \\\\ \\hline" for i in range(1, ROWS + 1))
    if kind == "tabular":
        table = f"\\begin{{tabular}}{{|l|p{{5cm}}|l|}}\\hline\n{rows}\n\\end{{tabular}}"
    elif kind == "wide":
        table = f"\\begin{{longtable}}{{|l|p{{11cm}}|l|}}\\hline\n{rows}\n\\end{{longtable}}"
    else:
        table = f"\\begin{{longtable}}{{|l|p{{5cm}}|l|}}\\hline\n{rows}\n\\end{{longtable}}"
    return PREAMBLE + table + "\n\nAfter the table.\n\\end{document}\n"


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for kind in ("longtable", "tabular", "wide"):
        work = tmp_path_factory.mktemp(kind)
        (work / "t.tex").write_text(_latex(kind), encoding="utf-8")
        proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                              cwd=work, capture_output=True, text=True, timeout=120)
        assert (work / "t.pdf").is_file(), proc.stdout[-2000:]
        out[kind] = work / "t.pdf"
    return out


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("book")
    table = ["| ID | claim | verdict |", "|---|---|---|"]
    table += [f"| A{i} | {_claim(i)} | verdict {i} |" for i in range(1, ROWS + 1)]
    (src / "errata.md").write_text("# Errata\n\n" + "\n".join(table) + "\n", encoding="utf-8")
    return src


def _frame_failures(pdf: Path, tmp: Path) -> dict[str, list[int]]:
    geometry = check_pdf.read_geometry(pdf.with_suffix(".log").read_text(errors="replace"))
    assert {"textwidth", "textheight", "footskip", "paperheight"} <= set(geometry)
    subprocess.run(["pdftoppm", "-r", str(check_pdf.SCAN_DPI), "-gray", "-png", str(pdf),
                    str(tmp / "p")], check=True)
    zones: dict[str, list[int]] = {}
    for scan in sorted(tmp.glob("p-*.png")):
        page = int(scan.stem.split("-")[1])
        for zone in check_pdf.ink_outside_frame(scan, geometry, page):
            zones.setdefault(zone, []).append(page)
    return zones


def _labels(pdf: Path, book: Path):
    text = subprocess.run(["pdftotext", "-raw", "-enc", "UTF-8", str(pdf), "-"],
                          capture_output=True, text=True, check=True).stdout
    return check_pdf.compare_labels(check_pdf.labelled_items(book), text, 0, 0)


def test_row_ids_of_the_three_forms_are_read():
    rows = check_pdf._table_rows("| A1 | x |\n|---|---|\n| (O3) early ones | y |\n| P2: window | z |")
    assert [r[0] for r in rows] == ["A1", "(O3) early ones", "P2: window"]
    assert check_pdf.OPENING_ID.match("(M) trajectory").group(1) == "M"
    assert check_pdf.OPENING_ID.match("P2: window").group(2) == "P2"
    assert check_pdf._plain_start("**fails** for $x$") == "failsfor"


@needs_tex
def test_breaking_table_passes(pdfs, book, tmp_path):
    counts, failures = _labels(pdfs["longtable"], book)
    assert counts["errata row"] == (ROWS, ROWS) and not failures
    assert _frame_failures(pdfs["longtable"], tmp_path) == {}


@needs_tex
def test_table_through_the_footer_fails_both_checks(pdfs, book, tmp_path):
    counts, failures = _labels(pdfs["tabular"], book)
    found, total = counts["errata row"]
    assert total == ROWS and found < ROWS            # the rows past the paper are not in the text
    assert failures and failures[0].startswith(f"errata row: {ROWS - found} of {ROWS} missing")
    zones = _frame_failures(pdfs["tabular"], tmp_path)
    assert zones.get("between text and footer") and zones.get("below the footer")
    assert "right margin" not in zones


@needs_tex
def test_table_wider_than_the_text_fails_the_margin_check(pdfs, book, tmp_path):
    counts, failures = _labels(pdfs["wide"], book)
    assert not failures                              # every row is there ...
    zones = _frame_failures(pdfs["wide"], tmp_path)
    assert zones.get("right margin")                 # ... but it runs into the right margin
    assert "between text and footer" not in zones and "below the footer" not in zones


def test_latex_fixes_make_free_tables_long():
    """book/_ext/latex_fixes.py: a table with widths becomes a longtable unless it sits in a box."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import latex_fixes

    def table() -> nodes.table:
        tgroup = nodes.tgroup(cols=2)
        tgroup += [nodes.colspec(colwidth=1), nodes.colspec(colwidth=1)]
        body = nodes.tbody()
        for i in range(3):
            row = nodes.row()
            row += [nodes.entry("", nodes.paragraph("", f"A{i}")),
                    nodes.entry("", nodes.paragraph("", "a claim that needs a paragraph column"))]
            body += row
        tgroup += body
        return nodes.table("", tgroup)

    doc = new_document("<test>", get_default_settings(Parser))
    free, boxed, spanning = table(), table(), table()
    admonition = nodes.admonition("", nodes.title("", "Solution"), boxed)
    doc += [free, admonition]
    latex_fixes._set_table_widths(doc)
    latex_fixes._make_long(doc)
    assert "colwidths-given" in free["classes"] and "longtable" in free["classes"]
    assert "colwidths-given" in boxed["classes"] and "longtable" not in boxed["classes"]
    latex_fixes._make_long(spanning)          # no widths given: its columns would not wrap
    assert "longtable" not in spanning["classes"]


def test_html_items_against_pdf_text(tmp_path):
    """Items read from an HTML page (as `make book` writes it); one of each kind missing fails."""
    page = tmp_path / "book" / "errata.html"
    page.parent.mkdir()
    page.write_text(
        '<main><table class="table"><thead><tr><th class="head"><p>ID</p></th>'
        '<th class="head"><p>claim</p></th></tr></thead><tbody>'
        '<tr><td><p>A1</p></td><td><p>the first claim holds <em>here</em></p></td></tr>'
        '<tr><td><p>A2</p></td><td><p>the second claim is cut off</p></td></tr></tbody></table>'
        '<p class="admonition-title"><span class="caption-number">Theorem 7 </span> '
        '(Chernoff tail bounds)</p>'
        '<p class="admonition-title"><span class="caption-number">Lemma 2 </span> '
        '(<span class="math notranslate nohighlight">\\(\\cosh x\\le e^{x^2/2}\\)</span>)</p>'
        '<img alt="_images/a.png" src="../_images/a.png" /></main>', encoding="utf-8")
    items, figures = check_pdf.html_labelled_items(tmp_path)
    assert [i[1] for i in items["errata row"]] == ["A1", "A2"] and figures == 1
    assert [i[1] for i in items["theorem (numbered)"]] == ["Theorem 7"]
    assert items["theorem-like (titled)"][1][2] == "xex22"
    whole = ("A1 the first claim holds here\nA2 the second claim is cut off\n"
             "Theorem 7 (Chernoff tail bounds)\nLemma 2 (cosh 𝑥 ≤ 𝑒𝑥2\n/2)\n")
    counts, failures = check_pdf.compare_labels(items, whole, 1, figures)
    assert not failures and counts["errata row"] == (2, 2)
    cut = whole.replace("A2 the second claim is cut off\n", "").replace("Theorem 7", "Theorem 8")
    counts, failures = check_pdf.compare_labels(items, cut, 0, figures)
    assert counts["errata row"] == (1, 2) and counts["theorem (numbered)"] == (0, 1)
    assert any("errata: A2" in f for f in failures)
    assert any("only 0 images" in f for f in failures)
