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
_NAMESPACE = {
    "setup_notebook": "companion.notebook",
    # theory
    "optimal_variance_proxy": "companion.theory.subgaussian",
    "log_mgf": "companion.theory.subgaussian",
    "psi2_norm": "companion.theory.subgaussian",
    "subgaussian_tail_bound": "companion.theory.subgaussian",
    "bernoulli_optimal_proxy": "companion.theory.subgaussian",
    "linear_map_proxy": "companion.theory.subgaussian",
    "monte_carlo_tail": "companion.theory.subgaussian",
    "bernstein_bound": "companion.theory.concentration",
    "hoeffding_bound": "companion.theory.concentration",
    "gaussian_max_expectation": "companion.theory.concentration",
    "theorem1_lower_bound": "companion.theory.exceedance",
    "theorem2_bounds": "companion.theory.exceedance",
    "expected_count_gaussian": "companion.theory.exceedance",
    "count_interval": "companion.theory.exceedance",
    "simulate_counts": "companion.theory.exceedance",
    "layernorm": "companion.theory.normalisation",
    "rmsnorm": "companion.theory.normalisation",
    "layernorm_jacobian": "companion.theory.normalisation",
    "bootstrap_interval": "companion.theory.bootstrap",
    # stacks
    "StackConfig": "companion.stacks.residual",
    "ResidualStack": "companion.stacks.residual",
    "TinyLM": "companion.stacks.tinylm",
    "train_tiny_lm": "companion.stacks.tinylm",
    # transformers
    "load": "companion.transformers.models",
    "residual_stream": "companion.transformers.stream",
    "inject": "companion.transformers.stream",
    "logits_from_residual": "companion.transformers.readout",
    "next_token_loss": "companion.transformers.readout",
    # injection
    "concept_vectors": "companion.injection.directions",
    "random_unit_vectors": "companion.injection.directions",
    "sweep_injections": "companion.injection.engine",
    "track_injection": "companion.injection.engine",
    "perturbation_metrics": "companion.injection.metrics",
    "next_token_kl": "companion.injection.metrics",
    "attribute_injection": "companion.injection.attribution",
    # outliers
    "channel_statistics": "companion.outliers.channel_statistics",
    "compare_counts": "companion.outliers.regimes",
    "attention_logit_statistics": "companion.outliers.attention_logits",
    "first_token_profile": "companion.outliers.massive_activations",
    "outlier_feature_statistics": "companion.outliers.outlier_features",
    # applications
    "fake_quantize": "companion.applications.quantization",
    "quantized_linears": "companion.applications.model_quantization",
    "linear_input_statistics": "companion.applications.pruning",
    "tail_clip_threshold": "companion.applications.training_controls",
    # experiments
    "make_config": "companion.experiments",
    "run": "companion.experiments",
    "run_cached": "companion.experiments",
    "load_result": "companion.experiments",
}

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
