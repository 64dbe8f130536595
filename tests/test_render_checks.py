"""The legibility computation of `make check-render` (tests/render/legibility.py), without a browser.

The browser only measures sizes (an image's displayed and natural width, a table's width and its
rows' heights, the page height); these tests feed such measurements to the pure functions and check
what they pass and fail, including deliberate defects: a figure shrunk to 50 %, a table wider than
the text column, a row taller than one screen.
"""

import base64
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "render"))
import legibility as L  # noqa: E402

COLUMN = 772.0  # the text column at 1400x1000 in the book's theme (measured)


def retina(displayed: float, natural: float = 1278.0, font_pt=None) -> L.Figure:
    """A retina figure (PNG at 200 dpi) shown ``displayed`` CSS px wide."""
    return L.Figure("_images/fig.png", displayed, natural, 200.0, font_pt)


def test_rendered_text_px_formula():
    # 9 pt at 200 dpi is 25 PNG pixels; shown at half the PNG's width, 12.5 CSS px
    assert L.rendered_text_px(9, 200, 639, 1278) == pytest.approx(12.5)
    assert L.rendered_text_px(9, 100, 1090, 1090) == pytest.approx(12.5)
    assert L.rendered_text_px(10, 100, 545, 1090) == pytest.approx(10 / 72 * 100 / 2)
    with pytest.raises(ValueError):
        L.rendered_text_px(9, 200, 639, 0)


def test_a_retina_figure_at_its_size_passes():
    page = L.Legibility([retina(639)], [], 5000)
    assert page.problems() == []
    assert page.smallest_text_px == pytest.approx(12.5)


def test_deliberate_defect_a_figure_shrunk_to_half_fails():
    page = L.Legibility([retina(639), retina(639 / 2)], [], 5000)
    problems = page.problems()
    assert len(problems) == 1 and "6.2 px < 11 px" in problems[0] and "50% of its size" in problems[0]
    assert page.smallest_text_px == pytest.approx(6.25)


def test_the_injection_figure_of_the_issue_fails():
    # a 100-dpi PNG 1390 px wide squeezed into the 772 px column: 9 pt renders 6.9 px tall
    fig = L.Figure("_images/inj.png", COLUMN, 1390, 100.0)
    (problem,) = L.Legibility([fig]).problems()
    assert "6.9 px" in problem and "(assumed)" in problem and "56% of its size" in problem


def test_threshold_is_eleven_px():
    # 9 pt at 200 dpi is 25 PNG px: the smallest passing display is 11/25 of the natural width
    natural = 1000.0
    assert L.Legibility([retina(natural * 11 / 25 + 0.01, natural)]).problems() == []
    assert L.Legibility([retina(natural * 11 / 25 - 1, natural)]).problems() != []


def test_a_small_legend_recorded_in_the_png_fails_where_the_style_would_pass():
    # at its 1x size a 9 pt retina figure passes (12.5 px); a 7 pt legend is 9.7 px
    assert L.Legibility([retina(639)]).problems() == []
    (problem,) = L.Legibility([retina(639, font_pt=7.0)]).problems()
    assert "9.7 px" in problem and "7 pt at 200 dpi" in problem


def test_a_figure_without_dpi_cannot_be_measured():
    (problem,) = L.Legibility([L.Figure("x.svg", 500, 1000, None)]).problems()
    assert "cannot measure" in problem


def test_tables_overflow_and_tall_rows():
    fits = L.Table(width=COLUMN, column_width=COLUMN, max_row_height=400, first="| a | b |")
    wide = L.Table(width=1020, column_width=COLUMN, max_row_height=120, first="# Claim")
    tall = L.Table(width=700, column_width=COLUMN, max_row_height=1100, first="# Claim",
                   tallest_row="B26 Post-LN")
    assert L.Legibility([], [fits]).problems() == []
    (p,) = L.Legibility([], [wide]).problems()
    assert "1020 px wide > text column 772 px" in p
    (p,) = L.Legibility([], [tall]).problems()
    assert "1100 px tall > one screen" in p and "B26" in p


def test_summary_counts_figures_tables_and_screens():
    page = L.Legibility([retina(639), retina(500)], [L.Table(700, COLUMN, 50)], 40_300)
    assert page.screens == pytest.approx(40.3)
    s = page.summary()
    assert s.startswith("2 figures, smallest text 9.8 px (9 pt assumed), 1 tables, 40.3 screens")
    assert L.Legibility([], [], 3000).summary() == "0 figures, smallest text -, 0 tables, 3.0 screens"


def _png(fig, **kw) -> bytes:
    from io import BytesIO

    buf = BytesIO()
    fig.savefig(buf, format="png", **kw)
    return buf.getvalue()


def test_png_info_reads_matplotlibs_dpi_and_text_chunks():
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1])
    dpi, texts = L.png_info(_png(fig, dpi=200, metadata={L.FONT_KEY: "7"}))
    plt.close(fig)
    assert dpi == pytest.approx(200, abs=0.01)
    assert texts[L.FONT_KEY] == "7" and texts["Software"].startswith("Matplotlib")
    with pytest.raises(ValueError):
        L.png_info(b"GIF89a")


def test_setup_notebook_records_the_smallest_font_in_each_png():
    """The chapters' PNG hook writes the figure's smallest font size where the check reads it."""
    from IPython.core.interactiveshell import InteractiveShell

    from companion import notebook

    assert notebook.FIGURE_FONT_KEY == L.FONT_KEY
    from IPython.core.pylabtools import select_figure_formats

    shell = InteractiveShell.instance()
    try:
        select_figure_formats(shell, "retina")  # what setup_notebook's set_matplotlib_formats does
        notebook._record_font_size(shell)
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], label="a")
        ax.set_xlabel("x", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.legend(fontsize=6)
        data = shell.display_formatter.format(fig)[0]["image/png"]
        plt.close(fig)
    finally:
        InteractiveShell.clear_instance()
    png = base64.b64decode(data)
    dpi, texts = L.png_info(png)
    assert texts[L.FONT_KEY] == "6"
    assert dpi == pytest.approx(200, abs=0.01)  # retina: twice the style's 100 dpi


def test_from_probe_reads_the_png_under_the_html_root(tmp_path):
    fig, ax = plt.subplots(figsize=(6.39, 3.5))
    ax.plot([0, 1])
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "a.png").write_bytes(_png(fig, dpi=200))
    (tmp_path / "_images" / "b.png").write_bytes(_png(fig, dpi=200, metadata={L.FONT_KEY: "6"}))
    plt.close(fig)
    measured = {
        "figures": [
            {"src": "http://127.0.0.1:8000/_images/a.png", "displayed_width": 639, "natural_width": 1278},
            {"src": "http://127.0.0.1:8000/_images/b.png", "displayed_width": 639, "natural_width": 1278},
        ],
        "tables": [{"width": 900, "column_width": COLUMN, "max_row_height": 30, "first": "x"}],
        "page_height": 12_000,
    }
    page = L.from_probe(measured, tmp_path)
    assert [f.font_pt for f in page.figures] == [None, 6.0]
    assert page.figures[0].text_px() == pytest.approx(12.5, abs=0.01)
    problems = page.problems()
    assert len(problems) == 2 and "8.3 px" in problems[0] and "900 px wide" in problems[1]
    assert page.summary().endswith("1 tables, 12.0 screens")
