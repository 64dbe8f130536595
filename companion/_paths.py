"""Where the package finds its own data, and whether it runs from a source checkout (private).

The corpus and the stored Results are package data under ``companion/data/``, found with
:mod:`importlib.resources` in a clone, an editable install or a wheel.  A clone
(:func:`source_checkout`) keeps local Results in ``results/cache/``; an installed package uses a
user cache folder.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["DISTRIBUTION", "package_data", "source_checkout"]

#: The name of the distribution on PyPI (the import name is ``companion``).
DISTRIBUTION = "fading-outliers-companion"


def package_data(*parts: str) -> Path:
    """Path of a file or folder under ``companion/data/``, found with :mod:`importlib.resources`.

    Parameters
    ----------
    *parts : str
        Path components below ``companion/data`` (e.g. ``"corpus"``).

    Returns
    -------
    pathlib.Path
        The path on the file system (it may not exist; callers check).

    Raises
    ------
    TypeError
        If a part is not a string.
    ValueError
        If the package is not installed as files on disk (e.g. imported from a zip archive).
    """
    if not all(isinstance(p, str) for p in parts):
        raise TypeError(f"path parts must be strings, got {parts!r}")
    resource = importlib.resources.files("companion").joinpath("data", *parts)
    if not isinstance(resource, Path):
        raise ValueError(
            f"companion's data ({resource}) is not on the file system; install the package "
            f"with pip (pip install {DISTRIBUTION}) rather than importing it from an archive"
        )
    return resource


def source_checkout() -> Path | None:
    """The root of the repository if the package runs from a clone of it, else ``None``.

    Returns
    -------
    pathlib.Path or None
        The folder whose ``pyproject.toml`` names this distribution, beside ``companion/``.
    """
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DISTRIBUTION}"' in text else None
