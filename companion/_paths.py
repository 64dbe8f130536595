"""Where the package finds its data (``companion/data/``: the corpus, the stored Results), and
whether it runs from a clone of its repository (package-internal)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["DISTRIBUTION", "package_data", "source_checkout"]

#: The name of the distribution on PyPI (the import name is ``companion``).
DISTRIBUTION = "fading-outliers-companion"


def package_data(*parts: str) -> Path:
    """Path (may not exist) of ``companion/data/<parts>``; ValueError if the package is not on disk."""
    if not all(isinstance(p, str) for p in parts):
        raise TypeError(f"path parts must be strings, got {parts!r}")
    resource = importlib.resources.files("companion").joinpath("data", *parts)
    if not isinstance(resource, Path):
        raise ValueError(f"companion's data ({resource}) is not on the file system; install the package "
                         f"with pip (pip install {DISTRIBUTION}) rather than importing it from an archive")
    return resource


def source_checkout() -> Path | None:
    """The root of the repository (whose ``pyproject.toml`` names this distribution) or None."""
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DISTRIBUTION}"' in text else None
