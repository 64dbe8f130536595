"""The chapters' exercises: numbered 1..n, each with one difficulty mark (★, ★★ or ★★★).

Part I chapters have at least two ★★ (or harder) proofs; every chapter with exercises has at
least one ★★★ open-ended exercise. The legend is in the preface ("Do the exercises").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from notebook_guard import ROOT, resolve

HEADING = re.compile(r"\*\*Exercise (\d+)\*\* \(([^)]*)\)")
MARK = re.compile(r"(?<!★)(★{1,3})(?!★)")
EXERCISES = re.compile(r"^## Exercises\s*$", re.M)


def _chapters_by_part(toc_path: Path = ROOT / "_toc.yml") -> dict[str, list[Path]]:
    """Chapter notebooks of every part of the table of contents, by the part's caption."""
    toc = yaml.safe_load(toc_path.read_text())
    parts = {}
    for part in toc["parts"]:
        paths = [resolve(c["file"]) for c in part["chapters"]]
        parts[part["caption"]] = [p for p in paths if p is not None and p.suffix == ".ipynb"]
    return parts


def _markdown(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def exercise_headings(path: Path) -> list[tuple[int, str]]:
    """``(number, parenthesis)`` of every exercise heading of a chapter, in order."""
    return [(int(m.group(1)), m.group(2)) for text in _markdown(path) for m in HEADING.finditer(text)]


def exercise_problems(headings: list[tuple[int, str]], part_one: bool) -> list[str]:
    """Everything wrong with one chapter's exercise headings (empty list: all is well)."""
    problems = []
    numbers = [n for n, _ in headings]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"exercise numbers {numbers} do not run 1..n")
    levels = []
    for n, paren in headings:
        marks = MARK.findall(paren)
        if len(marks) != 1 or paren.count("★") != len(marks[0]):
            problems.append(f"Exercise {n} ({paren}) needs exactly one of ★, ★★, ★★★")
            levels.append(0)
        else:
            levels.append(len(marks[0]))
    proofs = sum(1 for (_, paren), lev in zip(headings, levels) if "proof" in paren and lev >= 2)
    if part_one and proofs < 2:
        problems.append(f"a Part I chapter needs two ★★ proof exercises, found {proofs}")
    if 3 not in levels:
        problems.append("no ★★★ open-ended exercise")
    return problems


def _chapters_with_exercises() -> list[tuple[Path, bool]]:
    out = []
    for caption, paths in _chapters_by_part().items():
        for path in paths:
            if any(EXERCISES.search(text) for text in _markdown(path)):
                out.append((path, caption.startswith("Part I ")))
    return out


CHAPTERS = _chapters_with_exercises()


def test_part_one_is_found():
    assert sum(part_one for _, part_one in CHAPTERS) == 8
    assert len(CHAPTERS) >= 16


@pytest.mark.parametrize("path, part_one", CHAPTERS, ids=[p.stem for p, _ in CHAPTERS])
def test_exercises_are_marked(path, part_one):
    headings = exercise_headings(path)
    assert headings, f"{path.name} has an Exercises section but no **Exercise N** heading"
    assert exercise_problems(headings, part_one) == []


@pytest.mark.parametrize(
    "headings, part_one, expected",
    [
        ([(1, "proof, ★★"), (2, "proof, ★★"), (3, "open-ended, ★★★")], True, None),
        ([(1, "proof, ★★"), (3, "proof, ★★"), (4, "open-ended, ★★★")], True, "run 1..n"),
        ([(1, "proof"), (2, "proof, ★★"), (3, "open-ended, ★★★")], False, "exactly one"),
        ([(1, "proof, ★, ★★"), (2, "open-ended, ★★★")], False, "exactly one"),
        ([(1, "proof, ★★★★"), (2, "open-ended, ★★★")], False, "exactly one"),
        ([(1, "proof, ★"), (2, "proof, ★★"), (3, "open-ended, ★★★")], True, "two ★★ proof"),
        ([(1, "computation, ★★"), (2, "proof, ★★"), (3, "open-ended, ★★★")], True, "two ★★ proof"),
        ([(1, "proof, ★★"), (2, "proof, ★★")], False, "no ★★★"),
    ],
)
def test_violations_are_caught(headings, part_one, expected):
    problems = exercise_problems(headings, part_one)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems
