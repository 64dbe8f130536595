"""The stored Results that chapters read (package data, companion/data/results/): present, current, sane.

A chapter that renders a stored Result must not silently recompute it (a whole-corpus pass of
SmolLM2 takes about twenty CPU minutes) nor show one whose config or schema has drifted from the
code.  These tests fail as soon as either happens, and check the stored numbers for internal
consistency (they are data, so they are checked like data).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from companion import experiments as xp
from companion.experiments import store

#: The whole-corpus channel statistics of the outliers chapter (section "The whole corpus").
WHOLE_CORPUS_GRID = tuple(2.0 ** (k / 2) for k in range(-6, 31))
WHOLE_CORPUS = {
    "smollm2-135m": dict(n_layers=30, d_model=576),
    "minilm-l6": dict(n_layers=6, d_model=384),
}


def whole_corpus_config(model: str):
    return xp.make_config("channel_statistics", model=model, n_texts=2838, skip_first=True,
                          max_length=128, batch_size=16, thresholds=WHOLE_CORPUS_GRID)


@pytest.mark.parametrize("model", sorted(WHOLE_CORPUS))
def test_whole_corpus_statistics_are_stored_and_current(model):
    cfg = whole_corpus_config(model)
    path = xp.result_path(cfg, xp.stored_root())
    assert path.exists(), (f"missing {path}; create it with python -m companion run channel_statistics "
                           f"--model {model} ... --out companion/data/results (see the outliers chapter)")
    result = xp.load_result(path)
    assert xp.stale_reason(result, cfg) is None
    # run_cached must return the stored Result (it would otherwise recompute for many minutes)
    def refuse(*args, **kwargs):
        raise AssertionError("run_cached tried to recompute a stored Result")

    mp = pytest.MonkeyPatch()
    mp.setattr(xp, "run", refuse)
    try:
        again = xp.run_cached(cfg)
    finally:
        mp.undo()
    assert again.config_hash == result.config_hash
    assert result.device and result.versions.get("torch") and result.wall_time > 0


@pytest.mark.parametrize("model", sorted(WHOLE_CORPUS))
def test_whole_corpus_statistics_are_consistent(model):
    result = xp.load_result(xp.result_path(whole_corpus_config(model), xp.stored_root()))
    a, s = result.arrays, result.scalars
    L, d = WHOLE_CORPUS[model]["n_layers"], WHOLE_CORPUS[model]["d_model"]
    assert s["n_layers"] == L and s["d_model"] == d and s["n_texts"] == 2838
    n = s["n_tokens"]
    assert n > 50_000                                            # the whole corpus, not a prefix
    for key in ("mean", "var", "min", "max", "max_abs"):
        assert a[key].shape == (L + 1, d) and np.all(np.isfinite(a[key])), key
    np.testing.assert_allclose(a["thresholds"], WHOLE_CORPUS_GRID)
    counts = a["counts"]
    assert counts.shape == (L + 1, len(WHOLE_CORPUS_GRID), d)
    assert counts.min() >= 0 and counts.max() <= n
    assert np.all(np.diff(counts, axis=1) <= 0)                 # C_j(t) does not increase with t
    assert np.all(a["min"] <= a["mean"] + 1e-9) and np.all(a["mean"] <= a["max"] + 1e-9)
    np.testing.assert_allclose(a["max_abs"], np.maximum(np.abs(a["min"]), np.abs(a["max"])))
    assert np.all(a["var"] >= 0)
    # a channel's count at t is positive exactly when its largest |h| exceeds t
    exceeds = a["max_abs"][:, None, :] > a["thresholds"][None, :, None]
    assert np.array_equal(counts > 0, exceeds)


def test_every_stored_result_carries_checksums_that_verify():
    """Each committed pair names the SHA-256 of its .npz and of each array, and they match."""
    paths = sorted(xp.stored_root().glob("*/*.json"))
    assert paths, "no committed Results found"
    for path in paths:
        meta = json.loads(path.read_text())
        npz = path.with_suffix(".npz").read_bytes()
        assert meta.get("npz_sha256") == hashlib.sha256(npz).hexdigest(), (
            f"{path} has no (or a wrong) npz_sha256; add it with experiments.store._add_checksums")
        assert meta.get("json_sha256") == store._json_digest(meta), f"{path}: no (or a wrong) json_sha256"
        result = xp.load_result(path)  # verifies the per-array checksums too
        assert all(len(spec["sha256"]) == 64 for spec in meta["arrays"].values())
        assert result.config_hash == path.stem


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(WHOLE_CORPUS))
def test_whole_corpus_statistics_agree_with_a_fresh_pass_in_what_they_mean(model):
    """Recompute the statistics on the first 48 of the same sentences and check the conclusions the
    chapter draws from the stored Result: which channels carry the large means, and the typical
    per-layer spread.  The tolerances are sampling tolerances (48 sentences against 2838), far wider
    than the spread between CPU kernel sets; a Result of another model or of changed weights fails."""
    cfg = whole_corpus_config(model)
    stored = xp.load_result(xp.result_path(cfg, xp.stored_root())).arrays
    fresh_cfg = xp.make_config("channel_statistics", model=model, n_texts=48, skip_first=True,
                               max_length=128, batch_size=16, thresholds=WHOLE_CORPUS_GRID)
    fresh = xp.run(fresh_cfg, device="cpu").arrays
    L = WHOLE_CORPUS[model]["n_layers"]
    agree = 0
    for layer in range(1, L + 1):
        score_s = np.abs(stored["mean"][layer]) / np.median(np.sqrt(stored["var"][layer]))
        score_f = np.abs(fresh["mean"][layer]) / np.median(np.sqrt(fresh["var"][layer]))
        agree += int(np.argmax(score_f) in np.argsort(score_s)[-3:])
        ratio = np.median(np.sqrt(fresh["var"][layer])) / np.median(np.sqrt(stored["var"][layer]))
        assert 0.7 < ratio < 1.4, (layer, ratio)
    assert agree >= 0.8 * L, f"the largest-mean channel agrees at only {agree} of {L} layers"
