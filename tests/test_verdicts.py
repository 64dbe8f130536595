"""One source for every verdict: ``companion/data/verdicts.csv``.

The file parses, its IDs are the errata's rows (A1-A42, B1-B29) and unique, every verdict is on the
calibrated scale; the errata chapter renders every row from it (its stored tables say what the file
says) and the record page (``errata_lab_notes``) states the same verdict, scope and evidence scale.
A verdict changed in the file alone, or a page that contradicts it, is detected.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import pytest

from companion import verdicts

ROOT = Path(__file__).resolve().parents[1]
ERRATA = ROOT / "book" / "errata.ipynb"
RECORD = ROOT / "book" / "errata_lab_notes.ipynb"
IDS = [f"A{k}" for k in range(1, 43)] + [f"B{k}" for k in range(1, 30)]
RECORD_FIELDS = {"Verdict": "verdict", "Scope": "scope", "Evidence scale": "evidence_scale",
                 "Decided in": "decided_in"}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def rendered_rows(path: Path = ERRATA) -> dict[str, list[list[str]]]:
    """The rows of the verdict tables stored in a chapter's outputs: ``{id: [cells, ...]}``."""
    rows: dict[str, list[list[str]]] = {}
    for cell in _cells(path):
        if cell["cell_type"] != "code" or "verdict_table(" not in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            text = "".join(out.get("data", {}).get("text/markdown", ""))
            for line in text.splitlines()[2:]:
                cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
                match = re.match(r"(?:\{ref\}`)?([AB]\d+)\b", cells[0])
                assert match, f"a verdict table row without a row ID: {line[:80]}"
                rows.setdefault(match.group(1), []).append(cells)
    return rows


def record_fields(path: Path = RECORD) -> dict[str, dict[str, str]]:
    """What the record page states for each row: ``{id: {field: text}}`` (fields of the file)."""
    text = "\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")
    stated = {}
    for block in re.split(r"^\(err-row-", text, flags=re.M)[1:]:
        rid = re.search(r"^\*\*([AB]\d+)\*\*", block, re.M).group(1)
        assert rid not in stated, f"{rid} has two records"
        stated[rid] = {RECORD_FIELDS[m.group(1)]: m.group(2).strip()
                       for m in re.finditer(r"^\* \*\*([^:*]+):\*\* (.*)$", block, re.M)
                       if m.group(1) in RECORD_FIELDS}
    return stated


def contradictions(records, rendered, stated) -> list[str]:
    """Every place where a page says something other than the file (empty list: none)."""
    problems = []
    for rec in records:
        rid = rec["id"]
        shown = rendered.get(rid, [])
        if len(shown) != 1:
            problems.append(f"{rid}: rendered {len(shown)} times in the errata tables")
        for cells in shown:
            expected = [rec["claim"], rec["verdict"],
                        f"{rec['scope']} · {rec['evidence_scale']} · {rec['decided_in']}"]
            if cells[1:] != expected:
                problems.append(f"{rid}: the errata table shows {cells[1:]}, the file says {expected}")
        said = stated.get(rid)
        if said is None:
            problems.append(f"{rid}: no record on the lab-notes page")
            continue
        for field in RECORD_FIELDS.values():
            if said.get(field) != rec[field]:
                problems.append(f"{rid}: the record states {field} {said.get(field)!r}, "
                                f"the file says {rec[field]!r}")
    extra = (set(rendered) | set(stated)) - {r["id"] for r in records}
    if extra:
        problems.append(f"rows shown but not in the file: {sorted(extra)}")
    return problems


def test_the_file_parses_with_the_errata_ids():
    records = verdicts.load_verdicts()
    assert [r["id"] for r in records] == IDS
    assert all(tuple(r) == verdicts.FIELDS for r in records)


def test_ids_are_unique_and_verdicts_on_the_scale():
    records = verdicts.load_verdicts()
    assert len({r["id"] for r in records}) == len(records)
    assert verdicts.verdict_problems(records) == []
    for rec in records:
        for part in rec["verdict"].split("; "):
            assert any(part == v or part.startswith((v + " for ", v + " (")) for v in verdicts.SCALE), part


@pytest.mark.parametrize("change, fragment", [
    ({"verdict": "probably holds"}, "not on the scale"),
    ({"verdict": "holds; mostly"}, "not on the scale"),
    ({"verdict": "fails partly"}, "not on the scale"),
    ({"id": "A2"}, "appears twice"),
    ({"id": "C1"}, "not of the form"),
    ({"scope": ""}, "is empty"),
    ({"claim": "$\\|x\\|$ is small"}, "contains '|'"),
])
def test_bad_records_are_caught(change, fragment):
    records = copy.deepcopy(verdicts.load_verdicts()[:3])
    records[2].update(change)
    assert any(fragment in p for p in verdicts.verdict_problems(records)), verdicts.verdict_problems(records)


def test_bad_files_are_refused(tmp_path):
    path = tmp_path / "v.csv"
    path.write_text("id,claim,verdict\nA1,x,holds\n", encoding="utf-8")
    with pytest.raises(ValueError, match="header"):
        verdicts.load_verdicts(path)
    path.write_text(",".join(verdicts.FIELDS) + "\nA1,x,maybe,general,proof,here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not on the scale"):
        verdicts.load_verdicts(path)
    path.write_text(",".join(verdicts.FIELDS) + "\nA1,x,holds\n", encoding="utf-8")
    with pytest.raises(ValueError, match="fields"):
        verdicts.load_verdicts(path)
    with pytest.raises(ValueError, match="cannot read"):
        verdicts.load_verdicts(tmp_path / "missing.csv")


def test_verdict_table_checks_its_arguments():
    table = verdicts.verdict_table(["B13", "A1"], link="err-row-{}")
    lines = table._repr_markdown_().splitlines()
    assert len(lines) == 4 and lines[2].startswith("| {ref}`B13 <err-row-b13>` |")
    assert len(lines[0].split(" | ")) == 4                                  # four columns
    with pytest.raises(TypeError):
        verdicts.verdict_table("A1")
    with pytest.raises(ValueError, match="no verdict"):
        verdicts.verdict_table(["A99"])
    with pytest.raises(ValueError, match="twice"):
        verdicts.verdict_table(["A1", "A1"])
    with pytest.raises(TypeError, match="label pattern"):
        verdicts.verdict_table(["A1"], link="err-row")


def test_every_row_of_the_file_is_rendered_in_the_errata():
    rendered = rendered_rows()
    assert sorted(rendered, key=IDS.index) == IDS
    assert all(len(v) == 1 for v in rendered.values())


def test_the_errata_writes_no_verdict_table_by_hand():
    """A row typed into a Markdown cell could drift from the file: the chapter renders them all."""
    for cell in _cells(ERRATA):
        if cell["cell_type"] == "markdown":
            assert not re.search(r"^\|\s*[AB]\d+\b", "".join(cell["source"]), re.M)


def test_the_pages_state_what_the_file_says():
    assert contradictions(verdicts.load_verdicts(), rendered_rows(), record_fields()) == []


@pytest.mark.parametrize("rid, verdict", [("B27", "holds"), ("A20", "fails"), ("B13", "holds with a correction")])
def test_a_contradictory_verdict_is_detected(monkeypatch, rid, verdict):
    """Change one verdict in the file alone: both the chapter's table and the record now disagree."""
    changed = copy.deepcopy(verdicts.load_verdicts())
    next(r for r in changed if r["id"] == rid)["verdict"] = verdict
    monkeypatch.setattr(verdicts, "load_verdicts", lambda path=None: changed)
    problems = contradictions(verdicts.load_verdicts(), rendered_rows(), record_fields())
    assert any(p.startswith(f"{rid}: the errata table shows") for p in problems), problems
    assert any(p.startswith(f"{rid}: the record states verdict") for p in problems), problems


def test_a_page_that_drops_or_adds_a_row_is_detected():
    records = verdicts.load_verdicts()
    rendered, stated = rendered_rows(), record_fields()
    del rendered["A5"], stated["B2"]
    stated["B30"] = {}
    problems = contradictions(records, rendered, stated)
    assert any(p.startswith("A5: rendered 0 times") for p in problems)
    assert any(p.startswith("B2: no record") for p in problems)
    assert any("B30" in p for p in problems)


def test_the_verdict_file_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "data/verdicts.csv" in config["tool"]["setuptools"]["package-data"]["companion"]
    assert (ROOT / "companion" / "data" / "verdicts.csv").exists()


QUOTE = re.compile(r"\brows? ([AB]\d+)[,:;]? \(?\*{1,2}(%s)\b" % "|".join(re.escape(v) for v in verdicts.SCALE))


def quoted_verdicts(text: str) -> list[tuple[str, str]]:
    """``(row, verdict)`` for every place a page quotes an errata row with its verdict in italics or
    bold, e.g. "errata row A21, *not testable here*"."""
    return [(m.group(1), m.group(2)) for m in QUOTE.finditer(text)]


def quote_problems(records, pages) -> list[str]:
    parts = {r["id"]: [p for p in r["verdict"].split("; ")] for r in records}
    problems = []
    for name, text in pages.items():
        for rid, said in quoted_verdicts(text):
            if not any(p == said or p.startswith((said + " for ", said + " (")) for p in parts.get(rid, [])):
                problems.append(f"{name}: row {rid} quoted as *{said}*, the file says {parts.get(rid)}")
    return problems


def _pages() -> dict[str, str]:
    pages = {}
    for path in sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md")):
        if path.suffix == ".md":
            pages[path.name] = path.read_text(encoding="utf-8")
        else:
            pages[path.name] = "\n".join("".join(c["source"]) for c in _cells(path)
                                         if c["cell_type"] == "markdown")
    return pages


def test_other_pages_quote_the_verdict_of_the_file():
    assert quote_problems(verdicts.load_verdicts(), _pages()) == []


def test_a_wrong_quotation_is_detected():
    records = verdicts.load_verdicts()
    assert quoted_verdicts("see errata row A21, *not testable here*; and rows B13 (**holds**)") == [
        ("A21", "not testable here"), ("B13", "holds")]
    assert quote_problems(records, {"p": "row A21, *not testable here*"}) == []
    assert quote_problems(records, {"p": "row A20, *holds*"}) != []
    assert quote_problems(records, {"p": "row B27, *holds with a correction*"}) != []


def chapter_table_problems(records, pages: dict[str, dict[str, list[list[str]]]]) -> list[str]:
    """Rows of the chapters' own verdict tables (stored outputs) that differ from the file."""
    by_id = {r["id"]: r for r in records}
    problems = []
    for name, rendered in pages.items():
        for rid, shown in rendered.items():
            rec = by_id.get(rid)
            if rec is None:
                problems.append(f"{name}: row {rid} is not in the file")
                continue
            expected = [rec["claim"], rec["verdict"],
                        f"{rec['scope']} · {rec['evidence_scale']} · {rec['decided_in']}"]
            problems += [f"{name}: {rid} shows {cells[1:]}, the file says {expected}"
                         for cells in shown if cells[1:] != expected]
    return problems


def _chapter_tables() -> dict[str, dict[str, list[list[str]]]]:
    return {path.name: rendered_rows(path) for path in sorted((ROOT / "book").glob("*.ipynb"))
            if path != ERRATA and rendered_rows(path)}


def test_the_chapters_verdict_tables_show_the_file():
    """A chapter's stored verdict table goes stale when the file changes and the chapter is not
    re-executed; nbval would see it only when it runs, this test sees it at once."""
    tables = _chapter_tables()
    assert {"injection_real_models.ipynb", "three_effect_framework.ipynb"} <= set(tables)
    assert chapter_table_problems(verdicts.load_verdicts(), tables) == []


def test_a_stale_chapter_table_is_detected():
    records = verdicts.load_verdicts()
    tables = _chapter_tables()
    name = next(iter(tables))
    rid = next(iter(tables[name]))
    stale = {name: {rid: [[c if k != 2 else c + " (old)" for k, c in enumerate(row)]
                          for row in tables[name][rid]]}}
    assert chapter_table_problems(records, stale) != []
