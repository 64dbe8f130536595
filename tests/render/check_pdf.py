"""Check the PDF of the book the way a reader would look at it (run by `make pdf` after the build).

The PDF is read back with poppler's tools, not from the LaTeX source:

* ``pdftohtml -xml`` gives every line of text with its font, so prose (and maths) can be told apart
  from code (monospaced fonts, where ``$`` and backslashes are legitimate).  Prose must hold no raw
  TeX (``$``, ``\\frac``, ``\\mathbb``, ...), no MyST role left unparsed (``{cite:p}``), no "??"
  (unresolved reference) and no citation key printed instead of its author-year label.
* The maths must be typeset: a maths font is embedded and the text holds mathematical italic
  letters.
* ``pdffonts``: every font is embedded and a CJK font is among them; every Chinese character of
  ``book/glossary.md`` is in the extracted text, and the LaTeX log reports no missing glyph (XeTeX
  drops a glyph its font lacks, which a reader sees as a gap or a tofu box).
* ``pdfimages -list``: at least as many images as the stored chapters have PNG outputs.
* The bibliography lists at least as many entries as the sources cite distinct keys.
* ``pdftoppm``: every page is turned into an image and no ink may touch the paper's left or right
  edge (a table or formula running off the page); a few pages are kept as PNG for a human look.
* Ink outside the page's frame: the LaTeX log holds the page geometry (``CHECKPDF`` lines written by
  the preamble in ``_config.yml``); on every page no ink may lie in the margins left or right of the
  text block, between the text block and the footer, or below the footer (a table that does not break
  runs through the footer and off the page).
* Labelled items, HTML against PDF: every labelled item of the HTML build (``_build/html``; without
  one, of the sources it renders: markdown cells, stored ``text/markdown`` outputs, ``.md`` pages)
  must be in the PDF's text (``pdftotext -raw``): every errata row ID (A1, B16, ...) and every verdict
  ID ((O3), (M), C6, ...) with the start of its row's text, every theorem, definition, lemma, ... by
  its numbered heading ("Theorem 34", as the HTML numbers it) and its title, and every figure (image
  count).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from PIL import Image

TOOLS = ("pdfinfo", "pdftotext", "pdffonts", "pdfimages", "pdftoppm", "pdftohtml")
MONO = re.compile(r"mono|courier|typewriter", re.I)
CJK_FONT = re.compile(r"cjk|sourcehan|source\s*han|wenquanyi|arphic|fandol|ukai|uming", re.I)
MATH_FONT = re.compile(r"math", re.I)
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
MATH_ITALIC = re.compile(r"[\U0001D400-\U0001D7FF]")
# Raw TeX a reader must never see in prose: a dollar sign, a control word, or \{ \} \_ \^.
RAW_TEX = re.compile(r"\$|\\[A-Za-z]{2,}|\\[{}_^]")
MYST_ROLE = re.compile(r"\{(?:cite(?::[a-z]+)?|prf:ref|ref|numref|eq|doc|term|math)\}")
CITE_ROLE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
REF_ROLE = re.compile(r"\{(?:ref|numref|eq|prf:ref)\}`(?:[^`<]*<)?([^`>]+)>?`")
# A label distinctive enough that, printed in the text, it can only be an unresolved reference.
DISTINCT_LABEL = re.compile(r"^(?=.{6,})[\w.]+[-_][\w.-]+$")
BIB_KEY = re.compile(r"^@\w+\s*\{\s*([^,\s]+)\s*,", re.M)
EDGE_MM = 3.0       # ink closer than this to the left or right edge of the paper fails
SCAN_DPI = 40
FRAME_TOL_PT = 6.0  # ink may overhang the text block by this much (italic overhang, antialiasing)
FOOT_TEXT_PT = 16.0  # the footer: its rule and one line of text above its baseline, in points
GEOMETRY = re.compile(r"^CHECKPDF (\w+)=(-?[\d.]+)(pt)?\s*$", re.M)
# A claim ID fills a table row's first cell (A1, B16 in the errata, C6 in a chapter's verdicts) or
# opens it ("(O3) ...", "(M) ...", "P1: ..."). In the errata it is an errata row, elsewhere a verdict.
ROW_ID = re.compile(r"^([A-Z]\d{1,2})$")
OPENING_ID = re.compile(r"^(?:\(([A-Z]{1,2}\d{0,2}[a-z]?)\)|([A-Z]{1,2}\d{0,2}[a-z]?):)(?=\s|$)")
PRF_DIRECTIVE = re.compile(r"^[`:]{3,}\{prf:(theorem|definition|lemma|proposition|corollary|remark|"
                           r"example|conjecture|axiom|criterion|property|observation|algorithm)\}"
                           r"[ \t]*(.*)$", re.M)
SNIPPET_CHARS = (12, 40)   # a row is looked for by the first 12 to 40 letters of its plain text


def run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def page_lines(pdf: Path) -> list[tuple[int, str, str]]:
    """(page, font family, text) for every text line, from ``pdftohtml -xml``."""
    xml = run("pdftohtml", "-xml", "-i", "-stdout", "-q", "-enc", "UTF-8", str(pdf))
    fonts = dict(re.findall(r'<fontspec id="(\d+)"[^>]*family="([^"]*)"', xml))
    lines, page = [], 0
    for m in re.finditer(r'<page number="(\d+)"|<text [^>]*font="(\d+)"[^>]*>(.*?)</text>', xml):
        if m.group(1):
            page = int(m.group(1))
            continue
        text = html.unescape(re.sub(r"<[^>]+>", "", m.group(3)))
        lines.append((page, fonts.get(m.group(2), "?"), text))
    return lines


def markdown_sources(book: Path) -> list[str]:
    """Markdown text of the book's sources: .md files and the markdown cells of the notebooks."""
    texts = [p.read_text(encoding="utf-8") for p in sorted(book.glob("*.md"))]
    for nb in sorted(book.glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        texts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    return texts


def png_outputs(book: Path) -> int:
    """Number of PNG outputs the stored chapters show (cells tagged to hide output excluded)."""
    count = 0
    for nb in sorted(book.glob("*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            tags = set(cell.get("metadata", {}).get("tags", []))
            if cell["cell_type"] != "code" or tags & {"remove-output", "remove-cell"}:
                continue
            count += sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
    return count


def normalise(text: str) -> str:
    """Letters and digits only, lower case: "testa-\\nble" and "testable" compare equal."""
    # NFKC: the PDF's mathematical italic letters (U+1D44E ...) compare equal to plain ones.
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


def _plain_start(cell: str) -> str:
    """The normalised plain text a table cell starts with (before any maths, role or link)."""
    cell = re.sub(r"\*\*|__|(?<!\w)[*_]|[*_](?!\w)", "", cell)
    return normalise(re.split(r"[$`{\\\[<]", cell, maxsplit=1)[0])


def _title_text(title: str) -> str:
    """What a theorem's title is looked for by: its text up to the first formula if that is long
    enough, else its longest stretch outside formulas ("$m$-dependence": "dependence"), else the
    letters and digits of its formula ("$\\cosh x\\le e^{x^2/2}$": "xex22")."""
    plain = _plain_start(title)
    if len(plain) >= 8:
        return plain
    words = max((normalise(w) for w in re.split(r"\$[^$]*\$", title)), key=len)
    return words if len(words) >= 6 else normalise(re.sub(r"\\[A-Za-z]+", "", title))


def _table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")) or re.match(r"^\|[\s:|-]+\|$", line):
            continue
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])])
    return rows


def labelled_items(book: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Labelled items the HTML pages show: kind -> [(page, label, normalised text to find)].

    Read from what the HTML build renders: the ``.md`` pages, the notebooks' markdown cells and
    their stored ``text/markdown`` outputs (results tables).
    """
    pages: list[tuple[str, str]] = [(p.stem, p.read_text(encoding="utf-8"))
                                    for p in sorted(book.glob("*.md"))]
    for nb in sorted(book.glob("*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                pages.append((nb.stem, "".join(cell["source"])))
            tags = set(cell.get("metadata", {}).get("tags", []))
            if cell["cell_type"] == "code" and not tags & {"remove-output", "remove-cell"}:
                for out in cell.get("outputs", []):
                    md = out.get("data", {}).get("text/markdown")
                    if md:
                        pages.append((nb.stem, "".join(md)))
    items: dict[str, list[tuple[str, str, str]]] = {"errata row": [], "verdict": [],
                                                      "theorem-like (titled)": []}
    for page, text in pages:
        for row in _table_rows(text):
            first = row[0]
            match = ROW_ID.match(first) or OPENING_ID.match(first)
            if not match:
                continue
            kind = "errata row" if page == "errata" else "verdict"
            cells = [first[match.end():]] + row[1:]
            snippet = next((p for p in map(_plain_start, cells) if len(p) >= SNIPPET_CHARS[0]), "")
            label = next(g for g in match.groups() if g)
            items[kind].append((page, label, snippet[:SNIPPET_CHARS[1]]))
        for m in PRF_DIRECTIVE.finditer(text):
            kind, title = m.group(1), m.group(2).strip()
            items.setdefault(f"{kind} (numbered)", []).append((page, kind, ""))
            if title:
                text_of_title = _title_text(title)
                items["theorem-like (titled)"].append((page, f"{kind}: {title}",
                                                       text_of_title[:SNIPPET_CHARS[1]]))
    return items


HTML_TITLE = re.compile(r'<p class="admonition-title"><span class="caption-number">([A-Z][a-z]+) '
                        r'(\d+(?:\.\d+)*) </span>(.*?)</p>', re.S)


def _html_text(fragment: str) -> str:
    """Text of an HTML fragment; inline maths \\(...\\) back to $...$ as in the sources."""
    text = html.unescape(re.sub(r"<[^>]+>", "", fragment))
    return re.sub(r"\\\((.*?)\\\)", lambda m: f"${m.group(1)}$", text, flags=re.S)


def html_labelled_items(html_dir: Path) -> tuple[dict[str, list[tuple[str, str, str]]], int]:
    """Labelled items of the HTML build (``_build/html/book/*.html``) and its number of figures.

    The same kinds as :func:`labelled_items`, read from the rendered pages: table rows by their first
    cell, theorem-like items by their caption ("Theorem 34 (title)"), figures as the images of the
    cells' outputs.
    """
    items: dict[str, list[tuple[str, str, str]]] = {"errata row": [], "verdict": [],
                                                      "theorem-like (titled)": []}
    figures = 0
    for page in sorted((html_dir / "book").glob("*.html")):
        doc = page.read_text(encoding="utf-8")
        main = doc[doc.find('<main'):] if '<main' in doc else doc
        for table in re.findall(r"<table\b.*?</table>", main, re.S):
            for tr in re.findall(r"<tr\b.*?</tr>", table, re.S):
                row = [_html_text(c).strip() for c in re.findall(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", tr,
                                                                 re.S)]
                if not row or "<th" in tr.split("</t", 1)[0]:
                    continue
                first = row[0]
                match = ROW_ID.match(first) or OPENING_ID.match(first)
                if not match:
                    continue
                kind = "errata row" if page.stem == "errata" else "verdict"
                cells = [first[match.end():]] + row[1:]
                snippet = next((p for p in map(_plain_start, cells)
                                if len(p) >= SNIPPET_CHARS[0]), "")
                label = next(g for g in match.groups() if g)
                items[kind].append((page.stem, label, snippet[:SNIPPET_CHARS[1]]))
        for m in HTML_TITLE.finditer(main):
            name, number = m.group(1), m.group(2)
            title = _html_text(m.group(3)).strip()
            title = title[1:-1].strip() if title.startswith("(") and title.endswith(")") else title
            items.setdefault(f"{name.lower()} (numbered)", []).append(
                (page.stem, f"{name} {number}", ""))
            if title:
                items["theorem-like (titled)"].append((page.stem, f"{name} {number}: {title}",
                                                       _title_text(title)[:SNIPPET_CHARS[1]]))
        figures += len(re.findall(r'<img[^>]+src="\.\./_images/', main))
    return items, figures


def compare_labels(items: dict[str, list[tuple[str, str, str]]], pdf_text: str,
                   shown_images: int, expected_images: int) -> tuple[dict[str, tuple[int, int]],
                                                                     list[str]]:
    """Found/total per kind, and one failure line per kind with the items the PDF lacks."""
    flat = normalise(pdf_text)
    counts: dict[str, tuple[int, int]] = {}
    failures: list[str] = []
    for kind, entries in items.items():
        missing = []
        if kind.endswith("(numbered)") and all(" " in label for _, label, _ in entries):
            # From the HTML build: each numbered heading ("Theorem 34") opens a line of the PDF.
            found = 0
            for page, label, _ in entries:
                ok = re.search(rf"(?m)^\s*{re.escape(label)}(?: \(|\s*$)", pdf_text) is not None
                found += ok
                if not ok:
                    missing.append(f"{page}: {label}")
        elif kind.endswith("(numbered)"):
            name = kind.split()[0].capitalize()
            heads = len(re.findall(rf"(?m)^\s*{name} \d+(?:\.\d+)*(?: \(|\s*$)", pdf_text))
            found = min(heads, len(entries))
            if heads < len(entries):
                missing.append(f"{len(entries)} {name} directives, {heads} numbered in the PDF")
        else:
            found = 0
            for page, label, snippet in entries:
                if kind == "theorem-like (titled)":
                    ok = bool(snippet) and snippet in flat
                else:
                    token = re.search(rf"(?<![\w(])\(?{re.escape(label)}\)?(?!\w)", pdf_text)
                    ok = token is not None and (not snippet or snippet in flat)
                found += ok
                if not ok:
                    missing.append(f"{page}: {label}")
        counts[kind] = (found, len(entries))
        if missing:
            failures.append(f"{kind}: {len(missing)} of {len(entries)} missing from the PDF text: "
                            f"{missing[:8]}")
    counts["figure (images)"] = (min(shown_images, expected_images), expected_images)
    if shown_images < expected_images:
        failures.append(f"figures: only {shown_images} images in the PDF for {expected_images} "
                        f"PNG outputs")
    return counts, failures


def read_geometry(log_text: str) -> dict[str, float]:
    """The ``CHECKPDF name=value`` lines of the LaTeX log, lengths in points."""
    return {k: float(v) for k, v, _ in GEOMETRY.findall(log_text)}


def frame(geom: dict[str, float], page: int) -> dict[str, float]:
    """Text block and footer of physical page ``page`` (1-based), in points from the top left."""
    inch = 72.27
    odd = page % 2 == 1 or not geom.get("twoside", 0)
    side = geom["oddsidemargin"] if odd else geom["evensidemargin"]
    left = inch + geom.get("hoffset", 0.0) + side
    top = inch + geom.get("voffset", 0.0) + geom["topmargin"]
    body_top = top + geom["headheight"] + geom["headsep"]
    bottom = body_top + geom["textheight"]
    foot = bottom + geom["footskip"]
    return {"left": left, "right": left + geom["textwidth"], "head_top": top, "bottom": bottom,
            "foot_top": foot - FOOT_TEXT_PT, "foot_bottom": foot + 4.0,
            "width": geom["paperwidth"], "height": geom["paperheight"]}


def ink_outside_frame(png: Path, geom: dict[str, float], page: int) -> list[str]:
    """Where page ``page``'s image has ink outside its frame: margins, footer gap, below footer."""
    img = Image.open(png).convert("L")
    ink = img.point(lambda v: 255 if v < 200 else 0)
    f = frame(geom, page)
    sx, sy = img.width / f["width"], img.height / f["height"]
    tol = FRAME_TOL_PT

    def box(x0: float, y0: float, x1: float, y1: float) -> bool:
        x0, x1 = max(0, int(x0 * sx)), min(img.width, int(round(x1 * sx)))
        y0, y1 = max(0, int(y0 * sy)), min(img.height, int(round(y1 * sy)))
        return x1 > x0 and y1 > y0 and ink.crop((x0, y0, x1, y1)).getbbox() is not None

    zones = {"left margin": (0, 0, f["left"] - tol, f["height"]),
             "right margin": (f["right"] + tol, 0, f["width"], f["height"]),
             "between text and footer": (0, f["bottom"] + tol, f["width"], f["foot_top"]),
             "below the footer": (0, f["foot_bottom"] + tol, f["width"], f["height"])}
    return [name for name, z in zones.items() if box(*z)]


def ink_columns(png: Path) -> tuple[int, int, int] | None:
    """(first, last) column holding ink and the page width in pixels; None for an empty page."""
    img = Image.open(png).convert("L")
    box = img.point(lambda v: 255 if v < 235 else 0).getbbox()
    return None if box is None else (box[0], box[2], img.width)


def check(pdf: Path, log: Path | None, book: Path, out: Path,
          html_dir: Path | None = None) -> list[str]:
    failures: list[str] = []
    pages = int(re.search(r"Pages:\s+(\d+)", run("pdfinfo", str(pdf))).group(1))
    print(f"{pdf}: {pages} pages")

    # Fonts: all embedded, one CJK font, one maths font.
    font_rows = run("pdffonts", str(pdf)).splitlines()[2:]
    names = [row.split()[0] for row in font_rows]
    # The last five columns are emb, sub, uni, object number and generation.
    not_embedded = [row.split()[0] for row in font_rows if row.split()[-5] != "yes"]
    cjk = [n for n in names if CJK_FONT.search(n)]
    maths = [n for n in names if MATH_FONT.search(n)]
    print(f"fonts: {len(names)} ({len(cjk)} CJK, {len(maths)} maths), not embedded: {not_embedded}")
    if not_embedded:
        failures.append(f"fonts not embedded: {not_embedded}")
    if not cjk:
        failures.append("no CJK font embedded: the glossary's Chinese terms cannot be shown")
    if not maths:
        failures.append("no maths font embedded: the mathematics was not typeset")

    # Text, split into prose and code by font.
    lines = page_lines(pdf)
    prose = [(p, t) for p, f, t in lines if not MONO.search(f)]
    full_text = "\n".join(t for _, _, t in lines)
    raw = [(p, t) for p, t in prose if RAW_TEX.search(t) or MYST_ROLE.search(t)]
    # LaTeX prints an undefined reference as "??", sphinxcontrib-bibtex an unknown key as "[]".
    unresolved = [(p, t) for p, t in prose if "??" in t or "[]" in t]
    italic = sum(len(MATH_ITALIC.findall(t)) for _, t in prose)
    print(f"text: {len(lines)} lines ({len(prose)} prose), {italic} mathematical italic letters, "
          f"{len(raw)} prose lines with raw TeX, {len(unresolved)} with '??' or '[]'")
    for label, found in (("raw TeX or MyST syntax in prose", raw),
                         ("unresolved '??' or '[]'", unresolved)):
        for page, text in found[:10]:
            failures.append(f"{label}, page {page}: {text.strip()[:90]!r}")
    if italic == 0:
        failures.append("no mathematical italic letters in the text: maths was not typeset")

    # Citations: every cited key exists and is printed as a label, never as the key itself.
    sources = markdown_sources(book)
    cited = {key.strip() for text in sources for m in CITE_ROLE.finditer(text)
             for key in m.group(1).split(",")}
    bib_keys = set()
    for bib in book.glob("*.bib"):
        bib_keys |= set(BIB_KEY.findall(bib.read_text(encoding="utf-8")))
    missing = sorted(cited - bib_keys)
    printed_keys = sorted(k for k in cited if k in full_text)
    entries = set(re.findall(r"^\[(\d+)\]", "\n".join(t for _, t in prose), re.M))
    print(f"citations: {len(cited)} distinct keys cited, {len(bib_keys)} in the .bib, "
          f"{len(entries)} numbered bibliography entries in the PDF")
    if missing:
        failures.append(f"cited keys missing from the bibliography file: {missing}")
    if printed_keys:
        failures.append(f"citation keys printed instead of labels (unresolved): "
                        f"{printed_keys[:10]}")
    # Sphinx prints a reference it cannot resolve as its bare label: in the text font ({ref}) or as
    # a code literal of its own ({prf:ref}, {eq}); code cells may mention a label inside a comment.
    labels = {m.group(1).strip() for s in sources for m in REF_ROLE.finditer(s)}
    labels = {lab for lab in labels if DISTINCT_LABEL.match(lab)}
    prose_text = "\n".join(t for _, t in prose)
    literals = {t.strip() for _, f, t in lines if MONO.search(f)}
    bare = sorted(lab for lab in labels if lab in prose_text or lab in literals)
    print(f"references: {len(labels)} distinct labels referenced, {len(bare)} printed bare")
    if bare:
        failures.append(f"references printed as bare labels (unresolved): {bare[:10]}")
    if len(entries) < len(cited):
        failures.append(f"bibliography lists {len(entries)} entries for {len(cited)} cited keys")

    # Chinese: every Han character of the glossary is in the text.
    han = set(HAN.findall((book / "glossary.md").read_text(encoding="utf-8")))
    absent = sorted(han - set(full_text))
    print(f"CJK: {len(han)} distinct Chinese characters in the glossary, "
          f"{len(absent)} absent from the PDF")
    if not han:
        failures.append("book/glossary.md holds no Chinese characters: nothing to check")
    if absent:
        failures.append(f"Chinese characters missing from the PDF text: {''.join(absent[:40])}")

    # LaTeX log: glyphs the fonts lack, undefined references and citations.
    geometry: dict[str, float] = {}
    if log is not None and log.exists():
        text = log.read_text(encoding="utf-8", errors="replace")
        geometry = read_geometry(text)
        glyphs = sorted(set(re.findall(r"Missing character: There is no (.) ", text)))
        undefined = re.findall(r"(?:Reference|Citation) `[^']*' on page \d+ undefined", text)
        print(f"LaTeX log: {len(glyphs)} missing glyphs, {len(undefined)} undefined references")
        if glyphs:
            failures.append(f"glyphs missing from the fonts (tofu): {''.join(glyphs[:40])}")
        if undefined or "There were undefined references" in text:
            failures.append(f"LaTeX reports undefined references: {undefined[:5]}")
    else:
        failures.append(f"LaTeX log {log} not found")

    # Figures.
    images = [row.split() for row in run("pdfimages", "-list", str(pdf)).splitlines()[2:]]
    shown = sum(1 for row in images if len(row) > 2 and row[2] == "image")
    expected = png_outputs(book)
    print(f"figures: {shown} images in the PDF, {expected} PNG outputs in the stored chapters")

    # Labelled items of the HTML pages against the PDF's text: from the HTML build when there is
    # one (`make book`), else from the sources it renders.
    raw_text = run("pdftotext", "-raw", "-enc", "UTF-8", str(pdf), "-")
    if html_dir is not None and (html_dir / "book").is_dir():
        items, html_figures = html_labelled_items(html_dir)
        origin = f"HTML build {html_dir}"
        expected = max(expected, html_figures)
    else:
        items, origin = labelled_items(book), f"sources in {book} (no HTML build: run make book)"
    counts, missing_items = compare_labels(items, raw_text, shown, expected)
    print(f"labelled items of the {origin}, found in the PDF/total: "
          + ", ".join(f"{kind} {found}/{total}" for kind, (found, total) in counts.items()))
    failures += missing_items

    # Page images: nothing runs off the paper; keep a few pages for a human look.
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run("pdftoppm", "-r", str(SCAN_DPI), "-gray", "-png", str(pdf), f"{tmp}/p")
        scans = sorted(Path(tmp).glob("p-*.png"))
        edge_px = EDGE_MM / 25.4 * SCAN_DPI
        off = []
        outside: dict[str, list[int]] = {}
        for scan in scans:
            page = int(scan.stem.split("-")[1])
            cols = ink_columns(scan)
            if cols and (cols[0] < edge_px or cols[1] > cols[2] - edge_px):
                off.append(page)
            if geometry:
                for zone in ink_outside_frame(scan, geometry, page):
                    outside.setdefault(zone, []).append(page)
        print(f"page images: {len(scans)} pages at {SCAN_DPI} dpi, {len(off)} with ink at the edge, "
              f"ink outside the frame: "
              + (", ".join(f"{z} on {len(p)} pages" for z, p in outside.items()) or "none"))
        if len(scans) != pages:
            failures.append(f"pdftoppm produced {len(scans)} images for {pages} pages")
        if off:
            failures.append(f"content runs off the paper on pages {off[:20]}")
        if not geometry:
            failures.append("no CHECKPDF page geometry in the LaTeX log: the frame was not checked")
        for zone, zone_pages in outside.items():
            where = f"in the {zone}" if "margin" in zone else zone
            failures.append(f"ink {where} on {len(zone_pages)} pages: {zone_pages[:20]}")
    keep = {1: "title"}
    for page, text in prose:
        if "GLOSSARY" in text and "glossary" not in keep.values():
            keep[page] = "glossary"
        if text.strip() == "BIBLIOGRAPHY" and "bibliography" not in keep.values():
            keep[page] = "bibliography"
    for page, name in sorted(keep.items()):
        run("pdftoppm", "-r", "80", "-png", "-singlefile", "-f", str(page), "-l", str(page),
            str(pdf), str(out / f"page{page:03d}_{name}"))
    print(f"pages kept for a look: {', '.join(str(p) for p in sorted(keep))} in {out}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pdf", type=Path, default=Path("_build/latex/book.pdf"))
    parser.add_argument("--log", type=Path, default=None,
                        help="LaTeX log (default: next to the PDF)")
    parser.add_argument("--book", type=Path, default=Path("book"), help="the book's sources")
    parser.add_argument("--html", type=Path, default=Path("_build/html"),
                        help="the HTML build whose labelled items the PDF must hold (if built)")
    parser.add_argument("--out", type=Path, default=Path("_build/pdf_check"),
                        help="where to keep a few page images")
    args = parser.parse_args(argv)
    missing_tools = [t for t in TOOLS if shutil.which(t) is None]
    if missing_tools:
        print(f"missing {missing_tools}: install Debian's poppler-utils")
        return 2
    if not args.pdf.is_file():
        print(f"no {args.pdf}: run 'make pdf'")
        return 2
    log = args.log or args.pdf.with_suffix(".log")
    failures = check(args.pdf, log, args.book, args.out, args.html)
    print("PDF check:", "FAILED" if failures else "passed")
    for failure in failures:
        print("  -", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
