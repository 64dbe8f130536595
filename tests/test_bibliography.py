"""The bibliography parses, has no duplicate keys, and holds every key the chapters cite.

A malformed entry (a lost closing brace) stops the whole book build in sphinxcontrib-bibtex; this
test finds it in seconds, without building the book.
"""

from __future__ import annotations

import re

import pytest
from pybtex.database import parse_string

from notebook_guard import ROOT

BIB = ROOT / "book" / "references.bib"
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def _keys_declared(text: str) -> list[str]:
    return re.findall(r"^@\w+\{([^,\s]+),", text, flags=re.M)


def _keys_cited() -> set[str]:
    keys = set()
    for path in sorted((ROOT / "book").rglob("*")):
        if path.suffix in {".ipynb", ".md"} and "_build" not in path.parts:
            for group in CITE.findall(path.read_text(encoding="utf-8")):
                keys.update(k.strip() for k in group.split(","))
    return keys


def test_bibliography_parses_and_has_no_duplicate_keys():
    text = BIB.read_text(encoding="utf-8")
    declared = _keys_declared(text)
    assert len(declared) == len(set(declared)), sorted(k for k in declared if declared.count(k) > 1)
    database = parse_string(text, "bibtex")  # raises on a syntax error (e.g. a missing brace)
    assert sorted(database.entries.keys(), key=str.lower) == sorted(declared, key=str.lower)


def test_every_cited_key_is_in_the_bibliography():
    declared = {k.lower() for k in _keys_declared(BIB.read_text(encoding="utf-8"))}
    missing = sorted(k for k in _keys_cited() if k.lower() not in declared)
    assert not missing, f"cited but not in book/references.bib: {missing}"


def test_a_lost_brace_is_caught():
    text = BIB.read_text(encoding="utf-8")
    first_end = text.index("\n}\n")
    broken = text[:first_end] + "\n" + text[first_end + 2:]  # drop the first entry's closing brace
    with pytest.raises(Exception):
        parse_string(broken, "bibtex")
