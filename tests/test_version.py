"""The version is written once (companion.__version__) and shown everywhere from there.

pyproject.toml reads it (``[tool.setuptools.dynamic]``), the installed metadata carries it, the
command line prints it, every Result records it, CITATION.cff states it and the book's pages get it
as the MyST substitution ``{{ version }}`` (book/_ext/version_substitution.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

import companion
from companion import experiments as xp
from companion._paths import DISTRIBUTION
from companion.__main__ import main

REPO = Path(__file__).resolve().parents[1]


def test_the_version_is_a_pep440_version_written_once():
    Version(companion.__version__)  # raises if malformed
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "companion.__version__"}
    written = [p for p in (REPO / "companion").rglob("*.py")
               if re.search(r"^__version__\s*=", p.read_text(), re.M)]
    assert written == [REPO / "companion" / "__init__.py"]


def test_the_installed_metadata_agrees():
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{DISTRIBUTION} is not installed (only imported from the source tree)")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url and url != REPO.as_uri():
        pytest.skip(f"the installed {DISTRIBUTION} is another checkout ({url}); its metadata says "
                    f"{dist.version}; reinstall (make env) to compare")
    assert dist.version == companion.__version__


def test_the_command_line_prints_it(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.split() == ["companion", companion.__version__]
    out = subprocess.run([sys.executable, "-m", "companion", "--version"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["companion", companion.__version__]


@xp.register("version_probe", schema=1)
@dataclass(frozen=True)
class VersionProbe:
    """A one-number experiment for this test."""
    n: int = 2

    def compute(self, device, progress):
        return {"x": np.arange(self.n)}


def test_every_result_records_it(tmp_path):
    result = xp.run_cached(VersionProbe(), device="cpu", results_dir=tmp_path)
    assert result.versions["companion"] == companion.__version__
    assert xp.load_result(result.path).versions["companion"] == companion.__version__


def test_stored_results_record_the_version_they_were_computed_with():
    # <experiment>/<hash>.json are Results; framework_tiny_lms.json (trained weights) is not one
    paths = sorted(xp.stored_root().glob("*/*.json"))
    assert paths
    for path in paths:
        Version(json.loads(path.read_text())["versions"]["companion"])


def test_citation_cff_states_it():
    text = (REPO / "CITATION.cff").read_text()
    assert re.search(r"^version:\s*(\S+)\s*$", text, re.M).group(1) == companion.__version__


def test_the_book_gets_it_as_a_substitution(tmp_path):
    pytest.importorskip("myst_nb")
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'version_substitution']\n"
        "myst_enable_extensions = ['substitution']\n"
        "myst_substitutions = {'version': 'stale', 'other': 'kept'}\n")
    (src / "index.md").write_text("# Front\n\nVersion {{ version }}, {{ other }}.\n")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "out" / "index.html").read_text()
    assert f"Version {companion.__version__}, kept." in html
    config = (REPO / "_config.yml").read_text()
    assert "version_substitution: book/_ext" in config
