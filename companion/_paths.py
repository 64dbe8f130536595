"""Where the package finds its own data, and whether it runs from a source checkout (private).

The corpus and the stored Results travel inside the package, under ``companion/data/`` (package
data of the wheel); :func:`package_data` finds them with :mod:`importlib.resources`, so they are
found the same way in a clone, an editable install and a wheel installed into site-packages.
:func:`source_checkout` tells a clone of the repository (where locally computed Results go to
``results/cache/``) from an installed package (where they go to a user cache folder).
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
        If the package is not installed as files on disk (e.g. imported from a zip archive),
        where its data cannot be read as ordinary files.
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

    A clone is recognised by the ``pyproject.toml`` beside the ``companion`` folder that names
    this distribution; an installed package (site-packages) has none.

    Returns
    -------
    pathlib.Path or None
    """
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DISTRIBUTION}"' in text else None
