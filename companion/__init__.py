"""Companion package of *Outliers and Fading Perturbations in Transformers*.

The package is the single source of every number and figure in the book.  Its layers, bottom
first; a module imports only from lower layers (CONTRIBUTING.md, enforced by
``tests/test_architecture.py``)::

    foundation     _paths, _validation, determinism, corpus       (argument checks, data, kernels)
    mathematics    _cgf, tails, concentration, extremes, norms    (numpy/scipy)
    torch          hooks, stacks, quantization, models, probes    (building blocks, real models)
    analyses       framework, injection, outliers, applications   (the chapters' analyses)
    experiments    config -> run -> Result, cached by config hash
    reader-facing  notebook (setup_notebook), python -m companion (CLI)

Every chapter starts with :func:`setup_notebook`.
"""

from companion.notebook import setup_notebook

__all__ = ["setup_notebook", "__version__"]
__version__ = "0.1.0"
