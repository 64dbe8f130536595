"""The package as a distribution: honest dependency ranges, data found as package data, and
Results computed by the user kept out of the package.

The wheel itself is built, installed and used from outside the repository in
tests/test_wheel_install.py; the lowest declared versions are tested by ``make test-lowest``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import companion
from companion import _paths
from companion import experiments as xp
from companion.experiments import store
from companion.corpus import _corpus_dir
from companion.experiments import framework_trained as xf
from companion.experiments import injection_window as ei

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
RUNTIME = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def _pins(path: Path) -> dict:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
            pins[canonicalize_name(name)] = version
    return pins


def _lower_bound(req: Requirement) -> str:
    lows = [s.version for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"{req} needs exactly one lower bound (>=)"
    return lows[0]


def test_the_distribution_has_its_own_name_and_metadata():
    project = PYPROJECT["project"]
    assert project["name"] == _paths.DISTRIBUTION != "companion"
    assert project["dynamic"] == ["version"] and "version" not in project
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "companion.__version__"}
    assert project["requires-python"] == ">=3.11"
    assert project["license"] and all((REPO / f).is_file() for f in project["license-files"])
    assert project["description"] and project["classifiers"] and project["readme"] == "README.md"


def test_runtime_dependencies_are_ranges_not_pins():
    for req in RUNTIME:
        assert not any(s.operator in ("==", "===", "~=") for s in req.specifier), (
            f"{req}: the package declares ranges; exact versions belong in constraints.txt")
        _lower_bound(req)
    transformers = next(r for r in RUNTIME if r.name == "transformers")
    assert any(s.operator == "<" for s in transformers.specifier), "a major release breaks APIs"


def test_lowest_constraints_are_the_declared_lower_bounds():
    lowest = {k: Version(v) for k, v in _pins(REPO / "constraints-lowest.txt").items()}
    declared = {canonicalize_name(r.name): Version(_lower_bound(r)) for r in RUNTIME}
    assert lowest == declared


def test_the_book_environment_lies_inside_the_declared_ranges():
    pins = _pins(REPO / "constraints.txt")
    for req in RUNTIME:
        version = pins.get(canonicalize_name(req.name))
        assert version is not None, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} vs {req}"


def test_data_is_package_data_found_with_importlib_resources(monkeypatch):
    package = Path(companion.__file__).parent
    monkeypatch.delenv("COMPANION_DATA", raising=False)
    monkeypatch.delenv("COMPANION_RESULTS", raising=False)
    assert _corpus_dir() == _paths.package_data("corpus") == package / "data" / "corpus"
    assert (_corpus_dir() / "SOURCES.md").is_file() and sorted(_corpus_dir().glob("*.txt"))
    assert xp.stored_root() == package / "data" / "results"
    assert xf._stored_models_path() == package / "data" / "results" / "framework_tiny_lms.npz"
    with pytest.raises(TypeError, match="strings"):
        _paths.package_data("corpus", 3)


def test_results_folders_in_a_clone(monkeypatch):
    monkeypatch.delenv("COMPANION_RESULTS", raising=False)
    assert _paths.source_checkout() == REPO
    assert store._results_root() == REPO / "results"
    assert xp.cache_root() == REPO / "results" / "cache"
    assert store._stored_target() == xp.stored_root()        # GPU runs to commit, from a clone
    assert ei.cli_command(ei.InjectionWindowExperiment()).endswith("--out companion/data/results")


def test_results_folders_of_an_installed_package(monkeypatch, tmp_path):
    """No clone: computed Results go to the user's cache, never into the package's folder."""
    monkeypatch.delenv("COMPANION_RESULTS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(store, "source_checkout", lambda: None)
    cache = tmp_path / ".cache" / "companion" / "results" / "cache"
    assert xp.cache_root() == cache and store._stored_target() == cache
    assert xp.result_path(ei.InjectionWindowExperiment()).parent.parent == cache
    assert xp.stored_root() == Path(companion.__file__).parent / "data" / "results"


def test_companion_results_moves_both_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPANION_RESULTS", str(tmp_path))
    assert xp.stored_root() == tmp_path / "stored" and xp.cache_root() == tmp_path / "cache"
    assert store._stored_target() == tmp_path / "stored"
    assert xf._stored_models_path() == tmp_path / "stored" / "framework_tiny_lms.npz"
    assert ei.gpu_results() == {}


def test_source_checkout_needs_this_distributions_pyproject(monkeypatch, tmp_path):
    fake = tmp_path / "companion" / "_paths.py"
    fake.parent.mkdir()
    monkeypatch.setattr(_paths, "__file__", str(fake))
    assert _paths.source_checkout() is None               # site-packages: no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert _paths.source_checkout() is None
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "{_paths.DISTRIBUTION}"\n')
    assert _paths.source_checkout() == tmp_path
