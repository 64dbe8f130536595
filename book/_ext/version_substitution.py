"""The package's version on the book's pages, read from ``companion.__version__`` at build time.

The version is written in one place, ``companion/__init__.py``.  This extension makes it the MyST
substitution ``{{ version }}`` (used on the front page, book/preface.md) and Sphinx's ``version``
and ``release`` (the LaTeX title page of ``make pdf``), so that no page repeats the number by hand.
A ``version`` already given under ``parse: myst_substitutions`` in ``_config.yml`` is overwritten:
the package is the only source.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def package_version() -> str:
    """``companion.__version__`` of the checkout being built (the repository root is imported first)."""
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("companion").__version__


def _set_version(app, config) -> None:
    version = package_version()
    config.myst_substitutions = {**(config.myst_substitutions or {}), "version": version}
    config.version = config.release = version


def setup(app):
    app.connect("config-inited", _set_version)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
