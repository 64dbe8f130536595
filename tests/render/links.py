"""Link texts that collide on one page (part of check_render.py; unit-tested in
tests/test_table_sources.py).

A reader who sees "Theorem 2" twice on one page expects both to lead to the same place.  This
module reads a built HTML page, collects the links of its article (``<article class="bd-article">``;
the sidebars and the previous/next buttons are left out, as are heading permalinks and footnote
back-links; a textual citation's label is the whole citation, "Sun et al. [2024]", not its
linked year) and reports every link text that leads to two or more different targets, and
theorem-like link texts that lost their number ("Theorem" for an unnumbered target).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

UNNUMBERED = {"Theorem", "Proposition", "Lemma", "Corollary", "Definition", "Remark", "Example"}
SKIP_CLASSES = {"headerlink", "fn-backref", "toc-backref"}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0            # >0 inside the article
        self.stack: list[str] = []
        self.open: list[tuple[str, list[str]]] = []   # (href, text parts) of the <a> being read
        self.links: list[tuple[str, str]] = []
        # a textual citation ``Sun et al. [<a>2024</a>]``: (stack depth, text parts, first link index)
        self.cites: list[tuple[int, list[str], int]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "article" and "bd-article" in (a.get("class") or "").split():
            self.depth = 1
            self.stack = ["article"]
            return
        if not self.depth or tag in {"br", "img", "hr", "meta", "input", "link", "wbr", "col", "area"}:
            return
        self.stack.append(tag)
        if tag == "span" and "bibtex-citation" in (a.get("class") or "").split():
            self.cites.append((len(self.stack), [], len(self.links)))
        if tag == "a":
            classes = set((a.get("class") or "").split())
            skip = (not a.get("href") or classes & SKIP_CLASSES or a.get("role") == "doc-backlink")
            self.open.append(("" if skip else a["href"], []))

    def handle_endtag(self, tag):
        if not self.depth or not self.stack:
            return
        # close up to the matching tag (HTML in the wild leaves some tags unclosed)
        if tag not in self.stack:
            return
        while self.stack:
            t = self.stack.pop()
            if t == "a" and self.open:
                href, parts = self.open.pop()
                text = " ".join("".join(parts).split())
                if href and text:
                    self.links.append((text, href))
            if self.cites and self.cites[-1][0] == len(self.stack) + 1:
                _, parts, first = self.cites.pop()
                if len(self.links) == first + 1:  # one link: its label is the whole citation
                    self.links[first] = (" ".join("".join(parts).split()), self.links[first][1])
            if t == tag:
                break
        if not self.stack:
            self.depth = 0

    def handle_data(self, data):
        for _, parts in self.open:
            parts.append(data)
        for _, parts, _ in self.cites:
            parts.append(data)


def article_links(text: str) -> list[tuple[str, str]]:
    """(link text, href) of every link in the page's article, in order."""
    parser = _Links()
    parser.feed(text)
    parser.close()
    return parser.links


def normalise(href: str, page: str) -> str:
    """The target of ``href`` on page ``page`` (a path such as ``book/theorem2.html``), as a
    site path with its fragment: ``#x`` and ``theorem2.html#x`` on that page are the same target."""
    url = urljoin("http://site/" + page, href)
    parts = urlsplit(url)
    if parts.netloc != "site":
        return url
    return parts.path + ("#" + parts.fragment if parts.fragment else "")


def link_collisions(text: str, page: str = "page.html") -> list[str]:
    """Link texts of the page's article that lead to two or more different targets, and
    theorem-like link texts without a number."""
    targets: dict[str, list[str]] = {}
    for label, href in article_links(text):
        t = normalise(href, page)
        if t not in targets.setdefault(label, []):
            targets[label].append(t)
    problems = [f"link text {k!r} leads to {len(v)} targets: {v[:4]}"
                for k, v in targets.items() if len(v) > 1]
    problems += [f"link text {k!r} has no number" for k in targets if k in UNNUMBERED]
    return problems


def site_collisions(root: Path) -> dict[str, list[str]]:
    """:func:`link_collisions` for every chapter page under ``root/book``."""
    out = {}
    for path in sorted((root / "book").glob("*.html")):
        page = path.relative_to(root).as_posix()
        if found := link_collisions(path.read_text(), page):
            out[page] = found
    return out


if __name__ == "__main__":
    import sys

    found = site_collisions(Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html"))
    for page, problems in found.items():
        for p in problems:
            print(f"{page}: {p}")
    print(f"{sum(map(len, found.values()))} link collisions on {len(found)} pages")
    sys.exit(1 if found else 0)
