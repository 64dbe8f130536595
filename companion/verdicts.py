"""The verdict on every claim of the two notes, from one data file (``companion/data/verdicts.csv``).

Each record is one row of the errata: ``id`` (``A1``... for note 000, ``B1``... for note 002),
``claim`` (the claim in a few words), ``verdict`` (on the book's calibrated scale, one part per
claim of a row, parts separated by ``"; "``), ``scope`` (the systems the verdict speaks for),
``evidence_scale`` (what the evidence is, in short) and ``decided_in`` (a MyST reference to the
section or result that decides it).  The errata chapter renders its tables from this file with
:func:`verdict_table`, and the full record of each row (the correct statement and the
measurements) is on the errata's lab-notes page; ``tests/test_verdicts.py`` checks that every page
states the verdict of the file.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from companion import _paths
from companion import plots

__all__ = ["FIELDS", "SCALE", "load_verdicts", "verdict_problems", "verdict_table"]

#: The columns of ``verdicts.csv``, in order.
FIELDS = ("id", "claim", "verdict", "scope", "evidence_scale", "decided_in")

#: The calibrated verdict scale (the errata's "The verdict scale"); longest first, for matching.
SCALE = ("holds with a correction", "holds", "fails", "not supported here", "not testable here")

_ID = re.compile(r"^[AB][1-9][0-9]*$")
_PART = re.compile(r"^(?:%s)(?:$| for | \()" % "|".join(re.escape(v) for v in SCALE))


def _path() -> Path:
    return _paths.package_data("verdicts.csv")


def verdict_problems(records) -> list[str]:
    """Everything wrong with a list of verdict records (an empty list: all is well).

    Checks: each record has exactly the fields :data:`FIELDS`, all non-empty strings without a
    ``|`` (it would split a Markdown table cell); IDs of the form ``A<n>``/``B<n>`` and unique;
    every ``"; "``-separated part of a verdict begins with a term of :data:`SCALE`, followed by
    nothing, by ``" for "`` (its scope) or by ``" ("`` (the part of the claim it judges).

    Examples
    --------
    >>> verdict_problems([dict(id="A1", claim="c", verdict="probably", scope="s",
    ...                        evidence_scale="proof", decided_in="x")])
    ["A1: verdict part 'probably' is not on the scale (holds with a correction, holds, ...)"]
    """
    problems, seen = [], set()
    for k, rec in enumerate(records):
        if not isinstance(rec, dict) or tuple(rec) != FIELDS:
            problems.append(f"record {k}: fields must be {FIELDS}, got "
                            f"{tuple(rec) if isinstance(rec, dict) else type(rec).__name__}")
            continue
        rid = rec["id"]
        for field, value in rec.items():
            if not isinstance(value, str) or not value.strip():
                problems.append(f"{rid or k}: field {field!r} is empty")
            elif "|" in value:
                problems.append(f"{rid}: field {field!r} contains '|' (write \\lvert, \\rVert)")
        if not isinstance(rid, str) or not _ID.match(rid):
            problems.append(f"record {k}: id {rid!r} is not of the form A<n> or B<n>")
        elif rid in seen:
            problems.append(f"{rid}: id appears twice")
        seen.add(rid)
        if isinstance(rec["verdict"], str):
            for part in rec["verdict"].split("; "):
                if not _PART.match(part):
                    problems.append(f"{rid}: verdict part {part!r} is not on the scale "
                                    f"({', '.join(SCALE[:2])}, ...)")
    return problems


def load_verdicts(path=None) -> list[dict[str, str]]:
    """The verdict records of ``verdicts.csv`` (or of ``path``), in the file's order, checked.

    Parameters
    ----------
    path : str or Path, optional
        A CSV file with the columns :data:`FIELDS`; the package's ``data/verdicts.csv`` by default.

    Returns
    -------
    list of dict
        One ``{field: text}`` per row.

    Raises
    ------
    ValueError
        If the file is missing or its header differs from :data:`FIELDS`, or if
        :func:`verdict_problems` finds anything wrong (all problems are listed).

    Examples
    --------
    >>> records = load_verdicts()
    >>> records[0]["id"], records[0]["verdict"]
    ('A1', 'holds with a correction')
    """
    path = _path() if path is None else Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = tuple(next(reader, ()))
            rows = [row for row in reader if row]
    except OSError as exc:
        raise ValueError(f"cannot read the verdict file {path}: {exc}") from exc
    if header != FIELDS:
        raise ValueError(f"{path}: header must be {','.join(FIELDS)}, got {','.join(header)}")
    bad = [k for k, row in enumerate(rows, start=2) if len(row) != len(FIELDS)]
    if bad:
        raise ValueError(f"{path}: lines {bad} do not have {len(FIELDS)} fields")
    records = [dict(zip(FIELDS, row)) for row in rows]
    problems = verdict_problems(records)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return records


def verdict_table(ids=None, *, records=None, link: str | None = None) -> plots.Table:
    """The verdicts of some rows as a table of four short columns (a :class:`~companion.plots.Table`).

    Columns: the row's ID, the claim in a few words, the verdict, and its scope, evidence scale
    and the reference that decides it.  As a cell's last expression it renders as a Markdown
    table (HTML and LaTeX), its references resolved.

    Parameters
    ----------
    ids : sequence of str, optional
        Row IDs in the order to show; every row of the file by default.
    records : list of dict, optional
        Verdict records (as :func:`load_verdicts` returns them); read from the file by default.
    link : str, optional
        A label pattern such as ``"err-row-{}"``: each ID becomes a reference to the label made
        from its lower-case ID (the errata link every row to its full record this way).

    Raises
    ------
    TypeError
        If ``ids`` is not a sequence of strings.
    ValueError
        If an ID is not in the records or is asked for twice.

    Examples
    --------
    >>> print(verdict_table(["B13"]).splitlines()[1])  # doctest: +ELLIPSIS
    B13 · $J_{LN}$ has zero row sums · holds · LayerNorm (not RMSNorm) · proof · {ref}`...`
    """
    records = load_verdicts() if records is None else records
    by_id = {r["id"]: r for r in records}
    if ids is None:
        ids = [r["id"] for r in records]
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise TypeError("ids must be a sequence of row IDs (strings), e.g. ['A1', 'A2']")
    ids = list(ids)
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"no verdict for rows {unknown}; the file has {len(by_id)} rows "
                         f"({', '.join(list(by_id)[:3])}, ...)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"a row is asked for twice: {ids}")
    if link is not None and (not isinstance(link, str) or "{}" not in link):
        raise TypeError(f"link must be a label pattern with '{{}}' (e.g. 'err-row-{{}}'), got {link!r}")
    name = (lambda i: i) if link is None else (lambda i: f"{{ref}}`{i} <{link.format(i.lower())}>`")
    rows = [(name(r["id"]), r["claim"], r["verdict"],
             f"{r['scope']} · {r['evidence_scale']} · {r['decided_in']}") for r in (by_id[i] for i in ids)]
    return plots.table(["Row", "Claim", "Verdict", "Scope · evidence · decided in"], rows,
                       ["<", "<", "<", "<"], sep=" · ")
