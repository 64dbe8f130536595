"""companion.experiments: registry, typed configs, Result cache round trip and stale detection."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from companion import experiments as ex
from companion.transformers import models
from companion.transformers import stream
from companion.outliers import channel_statistics as channel_stats

CALLS = {"n": 0}


@ex.register("test_tiny", schema=1)
@dataclass(frozen=True)
class Tiny:
    """A tiny experiment for the tests: powers of a seeded normal sample."""

    n: int = 5
    power: float = 2.0
    tags: tuple[str, ...] = ("a", "b")
    flag: bool = False
    note: str | None = None

    def compute(self, device, progress):
        CALLS["n"] += 1
        x = np.random.default_rng(self.n).standard_normal(self.n)
        return {"x": x, "xp": np.abs(x) ** self.power, "total": float(np.sum(x)), "device_type": device.type,
                "count": np.int64(self.n)}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPANION_RESULTS", str(tmp_path))
    return tmp_path


# --------------------------------------------------------------------------- registry and configs
def test_registry_discovers_the_real_model_experiments():
    names = ex.experiment_names()
    assert {"channel_statistics", "injection_sweep", "test_tiny"} <= set(names)
    assert ex.get_experiment("test_tiny") is Tiny and Tiny.experiment_name == "test_tiny"
    with pytest.raises(ValueError, match="unknown experiment 'nope'.*channel_statistics"):
        ex.get_experiment("nope")


def test_make_config_types_overrides_by_field():
    c = ex.make_config("test_tiny", {"n": "7", "power": "0.5", "tags": "x,y,z", "flag": "true", "note": "hi"})
    assert c == Tiny(n=7, power=0.5, tags=("x", "y", "z"), flag=True, note="hi")
    assert ex.make_config(Tiny, tags="[\"p\"]", note="none") == Tiny(tags=("p",), note=None)
    assert ex.make_config(Tiny, n=3.0).n == 3
    assert ex.make_config("channel_statistics", {"thresholds": "1,5"}).thresholds == (1.0, 5.0)
    with pytest.raises(ValueError, match="no option size"):
        ex.make_config("test_tiny", {"size": "3"})
    with pytest.raises(ValueError, match="test_tiny.n must be a int"):
        ex.make_config("test_tiny", {"n": "three"})
    with pytest.raises(ValueError, match="must be a int"):
        ex.make_config("test_tiny", {"n": 2.5})
    with pytest.raises(ValueError, match="true or false"):
        ex.make_config("test_tiny", {"flag": "maybe"})
    with pytest.raises(ValueError, match="finite"):
        ex.make_config("test_tiny", {"power": "nan"})
    with pytest.raises(ValueError, match="must be a float"):
        ex.make_config("test_tiny", {"power": True})


def test_config_hash_is_stable_and_sensitive():
    a, b = Tiny(), Tiny()
    assert ex.config_hash(a) == ex.config_hash(b) and len(ex.config_hash(a)) == 16
    assert ex.config_hash(Tiny(n=6)) != ex.config_hash(a)
    assert ex.config_hash(Tiny(tags=("b", "a"))) != ex.config_hash(a)
    with pytest.raises(TypeError, match="registered experiment config"):
        ex.config_hash({"n": 5})


def test_register_rejects_bad_experiments():
    with pytest.raises(TypeError, match="frozen"):
        @ex.register("bad_mutable")
        @dataclass
        class Mutable:
            n: int = 1

            def compute(self, device, progress):
                return {}
    with pytest.raises(TypeError, match="default"):
        @ex.register("bad_nodefault")
        @dataclass(frozen=True)
        class NoDefault:
            n: int

            def compute(self, device, progress):
                return {}
    with pytest.raises(TypeError, match="JSON-serialisable"):
        @ex.register("bad_list")
        @dataclass(frozen=True)
        class WithList:
            n: list = None

            def compute(self, device, progress):
                return {}
    with pytest.raises(TypeError, match="compute"):
        @ex.register("bad_nocompute")
        @dataclass(frozen=True)
        class NoCompute:
            n: int = 1
    with pytest.raises(TypeError, match="dataclass"):
        ex.register("bad_class")(int)
    with pytest.raises(ValueError, match="letters"):
        ex.register("bad name")
    with pytest.raises(ValueError, match="schema"):
        ex.register("bad_schema", schema=0)
    with pytest.raises(ValueError, match="already registered"):
        @ex.register("test_tiny")
        @dataclass(frozen=True)
        class Impostor:
            n: int = 1

            def compute(self, device, progress):
                return {}


def test_run_fills_the_result():
    r = ex.run(Tiny(n=4), device="cpu")
    assert r.name == "test_tiny" and r.config == {"n": 4, "power": 2.0, "tags": ["a", "b"], "flag": False, "note": None}
    np.testing.assert_allclose(r.arrays["xp"], np.abs(r.arrays["x"]) ** 2)
    assert r.scalars["count"] == 4 and r.scalars["device_type"] == "cpu"
    assert set(r.versions) >= {"python", "torch", "transformers", "numpy", "companion"}
    assert r.device.startswith("cpu") and r.wall_time >= 0 and r.schema == f"{ex.FRAMEWORK_SCHEMA}.1"
    assert r.config_hash == ex.config_hash(Tiny(n=4)) and r.config_object() == Tiny(n=4)


def test_run_rejects_unstorable_outputs():
    @ex.register("test_unstorable")
    @dataclass(frozen=True)
    class Unstorable:
        kind: str = "object"

        def compute(self, device, progress):
            if self.kind == "object":
                return {"a": np.array([{}], dtype=object)}
            if self.kind == "key":
                return {"not an identifier": 1}
            if self.kind == "list":
                return [1, 2]
            return {"s": {1, 2}}

    with pytest.raises(TypeError, match="object arrays"):
        ex.run(Unstorable())
    with pytest.raises(ValueError, match="identifiers"):
        ex.run(Unstorable(kind="key"))
    with pytest.raises(TypeError, match="dict"):
        ex.run(Unstorable(kind="list"))
    with pytest.raises(TypeError, match="JSON"):
        ex.run(Unstorable(kind="set"))
    with pytest.raises(TypeError, match="registered"):
        ex.run(object())


# --------------------------------------------------------------------------- the cache
def test_cache_round_trip(results):
    CALLS["n"] = 0
    cfg = Tiny(n=6)
    first = ex.run_cached(cfg)
    assert CALLS["n"] == 1 and first.path == results / "cache" / "test_tiny" / f"{ex.config_hash(cfg)}.json"
    assert first.path.exists() and first.path.with_suffix(".npz").exists()
    again = ex.run_cached(cfg)
    assert CALLS["n"] == 1  # read, not recomputed
    for k in first.arrays:
        np.testing.assert_array_equal(again.arrays[k], first.arrays[k])
    for k in ("name", "config", "scalars", "versions", "device", "wall_time", "schema", "config_hash", "created"):
        assert getattr(again, k) == getattr(first, k)
    ex.run_cached(Tiny(n=7))
    assert CALLS["n"] == 2  # another config, another file
    ex.run_cached(cfg, force=True)
    assert CALLS["n"] == 3
    loaded = ex.load_result(first.path)
    assert loaded.config_hash == first.config_hash and json.loads(first.path.read_text())["arrays"]["x"]["shape"] == [6]


def test_stored_results_are_found_first(results):
    CALLS["n"] = 0
    cfg = Tiny(n=3)
    stored = ex.run(cfg)
    ex.save_result(stored, results / "stored")
    got = ex.run_cached(cfg)
    assert CALLS["n"] == 1 and got.path.parent.parent.name == "stored"
    explicit = ex.run_cached(cfg, results_dir=results / "elsewhere")
    assert CALLS["n"] == 2 and explicit.path.parent.parent.name == "elsewhere"


def _tamper(path, **changes):
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("what", ["schema", "hash", "config", "npz", "json", "arrays"])
def test_stale_results_are_recomputed_with_a_warning(results, what, monkeypatch):
    CALLS["n"] = 0
    cfg = Tiny(n=8)
    r = ex.run_cached(cfg)
    path = r.path
    if what == "schema":
        monkeypatch.setattr(Tiny, "schema", 2)  # the code moved on
    elif what == "hash":
        _tamper(path, config_hash="0" * 16)
    elif what == "config":
        _tamper(path, config={**r.config, "n": 9})
    elif what == "npz":
        path.with_suffix(".npz").unlink()
    elif what == "json":
        path.write_text("{not json")
    else:
        meta = json.loads(path.read_text())
        meta["arrays"]["extra"] = {"shape": [1], "dtype": "float64"}
        path.write_text(json.dumps(meta))
    with pytest.warns(ex.StaleResultWarning):
        fresh = ex.run_cached(cfg)
    assert CALLS["n"] == 2
    assert ex.load_result(path).schema == fresh.schema == ex._schema(Tiny)
    assert ex.run_cached(cfg).config_hash == ex.config_hash(cfg) and CALLS["n"] == 2  # repaired


def test_load_and_save_errors(results):
    with pytest.raises(ValueError, match="cannot read"):
        ex.load_result(results / "missing.json")
    (results / "x.json").write_text(json.dumps({"name": "test_tiny"}))
    np.savez(results / "x.npz")
    with pytest.raises(ValueError, match="not a Result"):
        ex.load_result(results / "x.json")
    with pytest.raises(TypeError, match="Result"):
        ex.save_result({"name": "x"})


# --------------------------------------------------------------------------- the real-model experiments
@pytest.mark.slow
def test_channel_statistics_experiment_matches_the_probe(results):
    cfg = ex.make_config("channel_statistics", model="minilm-l6", n_texts=6, batch_size=4, thresholds=(1.0, 3.0))
    r = ex.run_cached(cfg, device="cpu")
    m = models.load("minilm-l6", device="cpu")
    from companion.corpus import corpus_sentences

    texts = corpus_sentences(6, min_words=cfg.min_words, max_words=cfg.max_words)
    st = channel_stats.channel_statistics(m, texts, [1.0, 3.0], batch_size=4, max_length=cfg.max_length)
    np.testing.assert_allclose(r.arrays["mean"], st.mean, atol=1e-6)
    np.testing.assert_array_equal(r.arrays["counts"], st.counts)
    assert r.scalars["n_tokens"] == st.n_tokens and r.scalars["placement"] == "post"
    assert r.arrays["counts"].shape == (7, 2, 384)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm-l6", "smollm2-135m"])
def test_injection_sweep_experiment_invariants(results, name):
    m = models.load(name, device="cpu")
    L = m.n_layers
    layers = (0, L // 2, L)
    cfg = ex.make_config("injection_sweep", model=name, n_texts=3, batch_size=2, layers=layers, scales=(0.5, 2.0))
    r = ex.run(cfg, device="cpu")
    a = r.arrays
    assert a["projection"].shape == (3, 2, L + 1, 2, 3) and a["magnitude"].shape == (3, 2)
    np.testing.assert_allclose(a["magnitude"][:, 1] / a["magnitude"][:, 0], 4.0, rtol=1e-6)
    np.testing.assert_allclose(a["magnitude"][:, 0], 0.5 * a["median_norm"][list(layers)], rtol=1e-5)
    for j, layer in enumerate(layers):
        # at the injection layer the injected tokens moved by exactly c along v; the last token did not move
        np.testing.assert_allclose(a["projection"][j, :, layer, 0], a["magnitude"][j][:, None] * np.ones(3), rtol=2e-3)
        np.testing.assert_allclose(a["delta_norm"][j, :, layer, 1], 0.0, atol=1e-6)
        # before it, the runs coincide
        assert np.all(a["delta_norm"][j, :, :layer] == 0) and np.allclose(a["cos_inj_base"][j, :, :layer], 1.0, atol=1e-6)
    assert np.all(a["cos_inj_base"] <= 1 + 1e-5) and np.all(a["relative_size"] >= 0)
    if m.kind == "causal-lm":
        assert a["kl_last"].shape == (3, 2, 3) and np.all(a["kl_last"] >= 0)
        # injected at L, the last (not injected) token's prediction is untouched; earlier injections reach it
        assert np.all(a["kl_last"][2] < 1e-6) and np.all(a["kl_last"][0] > 1e-4)
    else:
        assert "kl_last" not in a
    with pytest.raises(ValueError, match="positions"):
        ex.run(ex.make_config("injection_sweep", model=name, positions="middle"), device="cpu")
    with pytest.raises(ValueError, match="layers must be in"):
        ex.run(ex.make_config("injection_sweep", model=name, layers=(L + 1,)), device="cpu")
