"""Companion package of *Outliers and Fading Perturbations in Transformers*.

The package is the single source of every number and figure in the book.  Its layers, bottom
first; a module imports only from lower layers (CONTRIBUTING.md, enforced by
``tests/test_architecture.py``)::

    foundation     _paths, _validation, determinism, corpus       (argument checks, data, kernels)
    mathematics    _cgf, tails, concentration, extremes, norms,   (numpy/scipy)
                   resampling
    torch          hooks, stacks, quantization, models, probes,   (building blocks, real models)
                   pruning
    analyses       perturbation, directions, engine,              (metrics, injection engine,
                   channel_regimes, attention_logits,              the chapters' analyses)
                   massive_activations, outlier_features,
                   training_controls, attribution
    experiments    config -> run -> Result, cached by config hash
    reader-facing  notebook (setup_notebook), plots (figures), suites, python -m companion

Every chapter starts with :func:`setup_notebook`.
"""

import logging as _logging

from companion.notebook import setup_notebook

# The library logs to the "companion" logger (each module to getLogger(__name__)) and never
# configures logging: this NullHandler keeps its records quiet unless the application (or the
# command line, `python -m companion -v ...`) adds a handler.
_logging.getLogger("companion").addHandler(_logging.NullHandler())

__all__ = ["setup_notebook", "__version__"]

#: The one place the version is written (PEP 440).  pyproject.toml reads it
#: (``[tool.setuptools.dynamic]``), ``python -m companion --version`` prints it, every Result records
#: it (``versions["companion"]``), the book's front page shows it (``{{ version }}``, filled by
#: book/_ext/version_substitution.py) and tests/test_version.py checks that CITATION.cff agrees.
__version__ = "0.2.0.dev0"
