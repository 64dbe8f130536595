import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# make tests/notebook_guard.py importable as a plain module
sys.path.insert(0, str(Path(__file__).parent))

# Hypothesis profiles.  This file is imported before any test module, so the module-level
# ``settings(...)`` objects and ``@settings(...)`` decorators of the tests are created after the
# profile is loaded: they inherit every option they do not set themselves (derandomize,
# database, print_blob), and keep their own max_examples.
#   ci       (default) derandomised: the same examples on every machine and every run, no
#            example database (nothing is replayed from, or written to, .hypothesis/).
#   explore  randomised, for hunting new counterexamples with several seeds, e.g.
#            HYPOTHESIS_PROFILE=explore python -m pytest tests -m hypothesis --hypothesis-seed=3
#            (tests/explore_hypothesis.sh loops over seeds).
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True
)
settings.register_profile(
    "explore", derandomize=False, database=None, deadline=None, print_blob=True, max_examples=1000
)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "explore"):
    raise ValueError(f"HYPOTHESIS_PROFILE must be 'ci' or 'explore', got {_PROFILE!r}")
settings.load_profile(_PROFILE)


@pytest.fixture
def check_model_calls(monkeypatch):
    """A list that records every ``check_model`` call made through any companion module
    (the validate-once tests count them)."""
    from companion.transformers import models

    calls, original = [], models.check_model

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("companion") and getattr(mod, "check_model", None) is original:
            monkeypatch.setattr(mod, "check_model", counted)
    return calls
