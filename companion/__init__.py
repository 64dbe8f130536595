"""Companion package of *Outliers and Fading Perturbations in Transformers*.

``import companion as cp`` gives the functions a reader uses most (``cp.optimal_variance_proxy``,
``cp.load``, ``cp.inject``, ...); everything else is reached through the subpackages, which
mirror the book's parts.  Imports run one way, down this table (``tests/test_architecture.py``)::

    foundation      _paths _validation determinism corpus notebook
    theory/         Part I: sub-Gaussian tails, concentration, exceedance counts, normalisation, bootstrap
    stacks/         Part II: residual stacks and the tiny language model
    transformers/   real models: load, hooks, residual stream, readout
    injection/      Part III: directions, the sweep engine, the metric vocabulary, attribution
    outliers/       Part III: channel statistics and regimes, attention logits, massive activations
    applications/   Part III: quantisation, pruning, training controls
    experiments/    config -> run -> Result, cached by config hash
    plots suites __main__   figures two chapters share, experiment suites, the command line

Names are imported on first use: ``import companion`` loads neither NumPy nor torch, so that
:func:`~companion.notebook.setup_notebook` can pin the CPU kernels before they load.  Every chapter starts with it.
"""

import importlib as _importlib
import logging as _logging

from companion import _aliases

# The library logs to the "companion" logger (each module to getLogger(__name__)) and never
# configures logging: this NullHandler keeps its records quiet unless the application (or the
# command line, `python -m companion -v ...`) adds a handler.
_logging.getLogger("companion").addHandler(_logging.NullHandler())

#: The one place the version is written (PEP 440).  pyproject.toml reads it
#: (``[tool.setuptools.dynamic]``), ``python -m companion --version`` prints it, every Result records
#: it (``versions["companion"]``), the book's front page shows it (``{{ version }}``, filled by
#: book/_ext/version_substitution.py) and tests/test_version.py checks that CITATION.cff agrees.
__version__ = "0.2.0.dev0"

#: The curated namespace: name -> module that defines it (imported on first access).
_NAMESPACE = {name: f"companion.{module}" for module, names in {
    "notebook": "setup_notebook",
    "theory.subgaussian": "optimal_variance_proxy log_mgf psi2_norm subgaussian_tail_bound "
                          "bernoulli_optimal_proxy linear_map_proxy monte_carlo_tail",
    "theory.concentration": "bernstein_bound hoeffding_bound gaussian_max_expectation",
    "theory.exceedance": "theorem1_lower_bound theorem2_bounds expected_count_gaussian count_interval "
                         "simulate_counts",
    "theory.normalisation": "layernorm rmsnorm layernorm_jacobian",
    "theory.bootstrap": "bootstrap_interval",
    "stacks.residual": "StackConfig ResidualStack",
    "stacks.tinylm": "TinyLM train_tiny_lm",
    "transformers.models": "load",
    "transformers.stream": "residual_stream inject",
    "transformers.readout": "logits_from_residual next_token_loss",
    "injection.directions": "concept_vectors random_unit_vectors",
    "injection.engine": "sweep_injections track_injection",
    "injection.metrics": "perturbation_metrics next_token_kl",
    "injection.attribution": "attribute_injection",
    "outliers.channel_statistics": "channel_statistics",
    "outliers.regimes": "compare_counts",
    "outliers.attention_logits": "attention_logit_statistics",
    "outliers.massive_activations": "first_token_profile",
    "outliers.outlier_features": "outlier_feature_statistics",
    "applications.quantization": "fake_quantize",
    "applications.model_quantization": "quantized_linears",
    "applications.pruning": "linear_input_statistics",
    "applications.training_controls": "tail_clip_threshold",
    "experiments": "make_config run run_cached load_result",
}.items() for name in names.split()}

__all__ = ["__version__", *_NAMESPACE]

_aliases.install()


def __getattr__(name):
    module = _NAMESPACE.get(name)
    if module is None:
        raise AttributeError(f"module 'companion' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMESPACE))
