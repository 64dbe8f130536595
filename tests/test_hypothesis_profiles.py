"""The Hypothesis profiles of tests/conftest.py: "ci" (default) is derandomised and keeps no
example database; tests that set their own @settings inherit that and keep their counts."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import test_tails

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")


@settings(max_examples=7)
@given(st.integers())
def _decorated(x):
    pass


def test_loaded_profile_is_the_one_asked_for():
    assert settings.default.deadline is None and settings.default.database is None
    assert settings.default.print_blob is True
    assert settings.default.derandomize is (PROFILE == "ci")
    if PROFILE == "explore":
        assert settings.default.max_examples >= 1000


@pytest.mark.parametrize(
    "own, count",
    [(_decorated._hypothesis_internal_use_settings, 7), (test_tails.SETTINGS, 40)],
    ids=["decorator", "module-level settings object"],
)
def test_own_settings_inherit_derandomize_and_keep_their_counts(own, count):
    assert own.derandomize is settings.default.derandomize
    assert own.database is None and own.deadline is None
    assert own.max_examples == count
