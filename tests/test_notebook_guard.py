"""The notebook guard: every chapter in _toc.yml exists and is stored fully executed."""

import json

import nbformat
import pytest

from notebook_guard import ROOT, notebook_problems, resolve, toc_files, toc_notebooks


@pytest.mark.parametrize("entry", toc_files())
def test_toc_entry_exists(entry):
    assert resolve(entry) is not None, f"_toc.yml names {entry}, but neither .ipynb nor .md exists"


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: p.name)
def test_chapter_is_stored_executed(path):
    assert notebook_problems(path) == []


def test_every_notebook_in_book_is_in_toc():
    listed = {p.resolve() for p in toc_notebooks()}
    on_disk = {p.resolve() for p in (ROOT / "book").glob("*.ipynb")}
    assert on_disk - listed == set(), "a chapter notebook is not listed in _toc.yml"


def _write(tmp_path, cells, kernel="python3"):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": "Python 3", "language": "python"}
    nb.cells = cells
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    return path


def _executed(source, count, outputs=None):
    cell = nbformat.v4.new_code_cell(source)
    cell.execution_count = count
    cell.outputs = outputs if outputs is not None else [
        nbformat.v4.new_output("stream", name="stdout", text="ok\n")
    ]
    return cell


def test_guard_accepts_an_executed_notebook(tmp_path):
    path = _write(tmp_path, [_executed("import companion\ncompanion.setup_notebook()", 1)])
    assert notebook_problems(path) == []


def test_guard_catches_an_unexecuted_notebook(tmp_path):
    cells = [
        _executed("import companion\ncompanion.setup_notebook()", 1),
        nbformat.v4.new_code_cell("print(1)"),  # never run: nbval would skip its comparison
    ]
    problems = notebook_problems(_write(tmp_path, cells))
    assert any("never executed" in p for p in problems)


def test_guard_catches_stored_errors_kernel_and_missing_import(tmp_path):
    err = nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])
    cells = [_executed("import numpy", 1, outputs=[err])]
    problems = notebook_problems(_write(tmp_path, cells, kernel="python"))
    text = "\n".join(problems)
    assert "stores an error" in text
    assert "kernelspec" in text
    assert "never imports companion" in text


def test_guard_catches_out_of_order_execution(tmp_path):
    cells = [
        _executed("import companion\ncompanion.setup_notebook()", 2),
        _executed("print(2)", 1),
    ]
    assert any("out of order" in p for p in notebook_problems(_write(tmp_path, cells)))


def test_guard_reports_unreadable_json(tmp_path):
    path = tmp_path / "broken.ipynb"
    path.write_text("{not json")
    assert "cannot be read" in notebook_problems(path)[0]
    json.loads("{}")  # the guard itself never raises on bad input


@pytest.mark.parametrize("first_cell, fragment", [
    ("import numpy as np\nimport companion\ncompanion.setup_notebook()", "begin with `import companion`"),
    ("import companion\nimport torch\nrng = companion.setup_notebook()", "`import torch` comes before"),
    ("import companion\nx = 1", "must call companion.setup_notebook()"),
])
def test_guard_catches_imports_before_setup_notebook(tmp_path, first_cell, fragment):
    """setup_notebook pins the CPU kernels, which NumPy reads at import: it must come first."""
    problems = notebook_problems(_write(tmp_path, [_executed(first_cell, 1)]))
    assert any(fragment in p for p in problems), problems


def test_guard_accepts_comments_before_setup_notebook(tmp_path):
    cell = "import companion\n# one thread: see the note\nrng = companion.setup_notebook(threads=1)\nimport numpy"
    assert notebook_problems(_write(tmp_path, [_executed(cell, 1)])) == []


def markdown_words(path) -> int:
    """Words in a notebook's Markdown cells (prose, maths and headings; code and outputs excluded)."""
    nb = json.loads(path.read_text())
    return sum(len("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


CHAPTERS = [p for p in toc_notebooks() if not p.stem.endswith("_lab_notes")]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_prose_is_at_most_6000_words(path):
    # The full record of a chapter belongs on its lab-notes page, which this limit does not bind.
    assert markdown_words(path) <= 6000, f"{path.name}: {markdown_words(path)} words of prose"


def test_word_count_counts_markdown_only(tmp_path):
    md = nbformat.v4.new_markdown_cell("one two three\n\nfour $x$")
    path = _write(tmp_path, [md, _executed("a = 1  # five six seven", 1)])
    assert markdown_words(path) == 5


def page_title(path) -> str:
    """The first level-1 heading of a page (``# ...`` in Markdown or a notebook's Markdown cells)."""
    if path.suffix == ".ipynb":
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    return next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "")


@pytest.mark.parametrize("path", [p for p in map(resolve, toc_files()) if p is not None],
                         ids=lambda p: p.name)
def test_page_title_has_no_quote_marks(path):
    # Smart quotes turn ' into a typographic apostrophe in the title but not in the section's
    # name, and sphinx-proof then numbers none of the page's theorems in the PDF (seen once:
    # "Definition (Report tasks)" without its number).
    assert not set(page_title(path)) & set("'\"‘’“”"), f"{path.name}: {page_title(path)!r}"
