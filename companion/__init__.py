"""Companion package of *Outliers and Fading Perturbations in Transformers*.

The package is the single source of every number and figure in the book.  Its layers,
in the one direction in which they import each other::

    tails -> extremes                 (pure mathematics, numpy/scipy)
    norms -> stacks                   (torch building blocks)
    models -> probes                  (real pretrained Transformers)
    experiments                       (config -> run -> Result, cached by config hash)
    notebook, plots, CLI              (reader-facing)

Every chapter starts with :func:`setup_notebook`.
"""

from companion.notebook import setup_notebook

__all__ = ["setup_notebook", "__version__"]
__version__ = "0.1.0"
