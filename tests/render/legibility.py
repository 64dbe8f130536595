"""Legibility of figures and tables in the built HTML (part of check_render.py, light and dark).

A figure's text is legible when its rendered height on the page is at least ``MIN_TEXT_PX`` CSS
pixels.  Matplotlib draws text of ``font_pt`` points into a PNG of ``dpi`` dots per inch, so the
text is ``font_pt / 72 * dpi`` pixels tall in the PNG; the browser shows the PNG at
``displayed_width`` CSS pixels for ``natural_width`` PNG pixels, which scales it by
``displayed_width / natural_width``:

    rendered text px = font_pt / 72 * dpi * displayed_width / natural_width.

The dpi is the PNG's own ``pHYs`` chunk (matplotlib writes the savefig dpi there: 200 for the
book's retina figures, 100 for plain ones).  The font size is the smallest one used in the figure
when the PNG says so in a text chunk ``FONT_KEY`` (written at display time by the PNG hook that
``companion.notebook.setup_notebook`` installs); otherwise the book style's smallest size, ``STYLE_MIN_FONT_PT`` (9 pt ticks and
legends; 10 pt text), is assumed, and the report says "assumed".

Tables: a table wider than the text column overflows it (the reader scrolls sideways, or the
right-hand columns are cut), and a row taller than one screen cannot be read at once; both fail.

The browser side (``MEASURE_JS``) only measures sizes; everything else is the pure functions
below, unit-tested without a browser in tests/test_render_checks.py.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

MIN_TEXT_PX = 11.0        # smallest rendered figure text, CSS px
STYLE_MIN_FONT_PT = 9.0   # setup_notebook's style: 10 pt text, 9 pt ticks and legends
SCREEN = (1400, 1000)     # the reader's window, CSS px (width, height)
FONT_KEY = "Companion-Min-Font-Pt"  # PNG text chunk: the smallest font size in the figure, in pt
# (written by setup_notebook's PNG hook, companion.notebook.FIGURE_FONT_KEY; a test checks they agree)

# Called in the chapter's frame once MathJax and the images are done: sizes only.
MEASURE_JS = r"""(function(d, w) {
  const article = d.querySelector('.bd-article') || d.body;
  const cs = w.getComputedStyle(article);
  const box = article.getBoundingClientRect();
  const left = box.left + parseFloat(cs.paddingLeft), right = box.right - parseFloat(cs.paddingRight);
  const text = e => (e.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 50);
  const figures = Array.from(article.querySelectorAll('img')).map(i => ({
    src: i.currentSrc || i.src, displayed_width: i.getBoundingClientRect().width,
    natural_width: i.naturalWidth, natural_height: i.naturalHeight}));
  const tables = Array.from(article.querySelectorAll('table'))
    .filter(t => !t.closest('pre, .highlight, mjx-container')).map(t => {
      const r = t.getBoundingClientRect();
      const rows = Array.from(t.rows).map(x => x.getBoundingClientRect().height);
      const tallest = rows.length ? rows.indexOf(Math.max(...rows)) : -1;
      return {width: Math.max(r.width, t.scrollWidth), left: r.left, column_width: right - left,
              column_left: left, rows: rows.length, max_row_height: tallest < 0 ? 0 : rows[tallest],
              tallest_row: tallest < 0 ? '' : text(t.rows[tallest]), first: text(t.rows[0] || t)};
    });
  return {figures: figures, tables: tables, column_width: right - left,
          page_height: Math.max(d.documentElement.scrollHeight, d.body.scrollHeight)};
})"""


def rendered_text_px(font_pt: float, dpi: float, displayed_width: float, natural_width: float) -> float:
    """Height in CSS px of ``font_pt``-point text drawn at ``dpi`` into a PNG ``natural_width``
    pixels wide that the page shows ``displayed_width`` CSS px wide."""
    if natural_width <= 0 or dpi <= 0 or font_pt <= 0:
        raise ValueError("font size, dpi and natural width must be positive")
    return font_pt / 72.0 * dpi * displayed_width / natural_width


def png_info(data: bytes) -> tuple[float | None, dict[str, str]]:
    """The dpi (from ``pHYs``, pixels per metre; None if absent or not metric) and the text chunks
    (``tEXt``, ``zTXt``, ``iTXt``) of a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    dpi, texts, pos = None, {}, 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"pHYs" and len(body) == 9:
            x, _, unit = struct.unpack(">IIB", body)
            dpi = x * 0.0254 if unit == 1 else None
        elif kind == b"tEXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            texts[k.decode("latin-1")] = v.decode("latin-1")
        elif kind == b"zTXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            texts[k.decode("latin-1")] = zlib.decompress(v[1:]).decode("latin-1")
        elif kind == b"iTXt" and b"\0" in body:
            k, rest = body.split(b"\0", 1)
            compressed, rest = rest[0], rest[2:]
            _lang, _tk, v = rest.split(b"\0", 2)
            texts[k.decode("latin-1")] = (zlib.decompress(v) if compressed else v).decode("utf-8")
        elif kind == b"IEND":
            break
    return dpi, texts


@dataclass
class Figure:
    src: str
    displayed_width: float
    natural_width: float
    dpi: float | None
    font_pt: float | None = None  # None: the style's smallest size is assumed

    @property
    def assumed_font(self) -> bool:
        return self.font_pt is None

    def text_px(self) -> float | None:
        if self.dpi is None or self.natural_width <= 0:
            return None
        return rendered_text_px(self.font_pt or STYLE_MIN_FONT_PT, self.dpi, self.displayed_width,
                                self.natural_width)


@dataclass
class Table:
    width: float
    column_width: float
    max_row_height: float
    first: str = ""
    tallest_row: str = ""
    rows: int = 0


@dataclass
class Legibility:
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    page_height: float = 0.0

    @property
    def smallest_text_px(self) -> float | None:
        px = [p for f in self.figures if (p := f.text_px()) is not None]
        return min(px) if px else None

    @property
    def screens(self) -> float:
        return self.page_height / SCREEN[1]

    def problems(self, min_px: float = MIN_TEXT_PX, screen_height: float = SCREEN[1]) -> list[str]:
        """Figures whose text renders below ``min_px``, tables wider than the text column, rows
        taller than one screen."""
        out = []
        for f in self.figures:
            px = f.text_px()
            name = f.src.rsplit("/", 1)[-1][:16]
            if px is None:
                out.append(f"figure {name}: cannot measure (no dpi in the PNG or not loaded)")
            elif px < min_px:
                font = f"{f.font_pt or STYLE_MIN_FONT_PT:g} pt" + (" (assumed)" if f.assumed_font else "")
                # its own size: matplotlib's 100 dpi is one CSS px per pixel (retina: 2 pixels)
                own = f.natural_width * 100 / f.dpi
                out.append(f"figure {name}: text {px:.1f} px < {min_px:g} px ({font} at {f.dpi:.0f} dpi; "
                           f"{f.natural_width:.0f} px PNG shown {f.displayed_width:.0f} px wide, "
                           f"{f.displayed_width / own:.0%} of its size)")
        for t in self.tables:
            if t.width > t.column_width + 1:
                out.append(f"table {t.first[:40]!r}: {t.width:.0f} px wide > text column "
                           f"{t.column_width:.0f} px")
            if t.max_row_height > screen_height:
                out.append(f"table {t.first[:40]!r}: a row is {t.max_row_height:.0f} px tall > one "
                           f"screen ({screen_height:g} px): {t.tallest_row[:40]!r}")
        return out

    def summary(self) -> str:
        px = self.smallest_text_px
        assumed = any(f.assumed_font for f in self.figures)
        return (f"{len(self.figures)} figures, smallest text "
                + ("-" if px is None else f"{px:.1f} px" + (" (9 pt assumed)" if assumed else ""))
                + f", {len(self.tables)} tables, {self.screens:.1f} screens")


def image_path(root: Path, src: str) -> Path:
    """The file under the HTML root that a loaded image's URL (``http://host:port/_images/x.png``)
    names."""
    from urllib.parse import unquote, urlsplit

    return root / unquote(urlsplit(src).path).lstrip("/")


def from_probe(measured: dict, root: Path) -> Legibility:
    """A :class:`Legibility` from ``MEASURE_JS``'s result; each PNG's dpi and font size are read
    from the file under ``root``."""
    figures = []
    for m in measured["figures"]:
        dpi, font = None, None
        path = image_path(root, m["src"])
        if path.suffix.lower() == ".png" and path.is_file():
            dpi, texts = png_info(path.read_bytes())
            font = float(texts[FONT_KEY]) if FONT_KEY in texts else None
        figures.append(Figure(m["src"], m["displayed_width"], m["natural_width"], dpi, font))
    tables = [Table(t["width"], t["column_width"], t["max_row_height"], t.get("first", ""),
                    t.get("tallest_row", ""), t.get("rows", 0)) for t in measured["tables"]]
    return Legibility(figures, tables, measured["page_height"])
