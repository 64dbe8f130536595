"""The Result store and the converted-model cache survive faults (issue 11, point 7).

Every fault either recomputes with a warning (:class:`~companion.experiments.CorruptResultWarning`
for damaged Results, :class:`~companion.transformers.sources.CorruptCacheWarning` for a damaged converted model)
or fails before any work with a message that says what to do.  Faults covered: truncated, empty,
missing or foreign ``.npz``; a JSON that is malformed or parses to null, a number, a string or a
list; wrong-typed fields; edited array values, shapes and dtypes (caught by the checksums); pairs
written concurrently by several processes and threads; a damaged converted-model cache; an
unwritable ``--out`` folder.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from companion import experiments as ex
from companion.experiments import store
from companion.__main__ import main
from companion.transformers import sources

REPO = Path(__file__).resolve().parents[1]
CALLS = {"n": 0}


@ex.register("test_store_faults", schema=1)
@dataclass(frozen=True)
class Sample:
    """A tiny seeded experiment for the fault tests."""

    n: int = 6
    seed: int = 0

    def compute(self, device, progress):
        CALLS["n"] += 1
        rng = np.random.default_rng([self.seed, self.n])
        x = rng.standard_normal(self.n)
        return {"x": x, "k": np.arange(self.n, dtype=np.int32), "total": float(x.sum())}


@pytest.fixture
def stored(tmp_path):
    """A valid Result of ``Sample()`` saved under ``tmp_path``; returns its JSON path."""
    CALLS["n"] = 0
    result = ex.run_cached(Sample(), device="cpu", results_dir=tmp_path)
    assert CALLS["n"] == 1
    return result.path


def _rewrite_json(path: Path, sign: bool = False, **changes) -> None:
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        node = meta
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_bytes(store._signed(meta) if sign else json.dumps(meta).encode())


def _replace_arrays(path: Path, edit) -> None:
    """Rewrite the .npz with ``edit(arrays)`` (a valid archive with other content)."""
    npz = path.with_suffix(".npz")
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    edit(arrays)
    with open(npz, "wb") as fh:  # a file object: numpy does not append another .npz
        np.savez_compressed(fh, **arrays)


def _foreign_npz(path: Path) -> None:
    """Put the .npz of another config's Result (same array names, other values) in place."""
    calls = CALLS["n"]
    other = ex.save_result(ex.run(Sample(seed=1), device="cpu"), path.parent.parent / "other")
    CALLS["n"] = calls  # not a computation of the config under test
    path.with_suffix(".npz").write_bytes(other.with_suffix(".npz").read_bytes())


def _edit_value(a):
    a["x"] = a["x"].copy()
    a["x"][2] = np.nextafter(a["x"][2], np.inf)  # one ulp


#: name -> how to damage the pair at the JSON path.
FAULTS = {
    "npz empty": lambda p: p.with_suffix(".npz").write_bytes(b""),
    "npz truncated to half": lambda p: p.with_suffix(".npz").write_bytes(
        p.with_suffix(".npz").read_bytes()[: p.with_suffix(".npz").stat().st_size // 2]),
    "npz missing its last byte": lambda p: p.with_suffix(".npz").write_bytes(
        p.with_suffix(".npz").read_bytes()[:-1]),
    "npz missing": lambda p: p.with_suffix(".npz").unlink(),
    "npz is a folder": lambda p: (p.with_suffix(".npz").unlink(), p.with_suffix(".npz").mkdir()),
    "npz garbage": lambda p: p.with_suffix(".npz").write_bytes(
        np.random.default_rng(0).bytes(p.with_suffix(".npz").stat().st_size)),
    "npz holds one .npy array": lambda p: np.save(open(p.with_suffix(".npz"), "wb"), np.arange(3)),
    "npz of another config": _foreign_npz,
    "array value edited": lambda p: _replace_arrays(p, _edit_value),
    "array shape edited": lambda p: _replace_arrays(p, lambda a: a.update(x=a["x"].reshape(2, 3))),
    "array dtype edited": lambda p: _replace_arrays(
        p, lambda a: a.update(x=a["x"].astype(np.float32))),
    "array removed": lambda p: _replace_arrays(p, lambda a: a.pop("k")),
    "array added": lambda p: _replace_arrays(p, lambda a: a.update(extra=np.zeros(2))),
    # the JSON's own description edited to agree with the edited npz: only the checksums see it
    "shape edited in both files": lambda p: (
        _replace_arrays(p, lambda a: a.update(x=a["x"].reshape(3, 2))),
        _rewrite_json(p, **{"arrays.x.shape": [3, 2], "npz_sha256": hashlib.sha256(
            p.with_suffix(".npz").read_bytes()).hexdigest()})),
    "dtype edited in both files": lambda p: (
        _replace_arrays(p, lambda a: a.update(x=a["x"].astype(np.float32))),
        _rewrite_json(p, **{"arrays.x.dtype": "float32", "npz_sha256": hashlib.sha256(
            p.with_suffix(".npz").read_bytes()).hexdigest()})),
    "npz checksum edited": lambda p: _rewrite_json(p, npz_sha256="0" * 64),
    "array checksum edited": lambda p: _rewrite_json(p, **{"arrays.k.sha256": "0" * 64}),
    "json empty": lambda p: p.write_text(""),
    "json malformed": lambda p: p.write_text("{not json"),
    "json not utf-8": lambda p: p.write_bytes(b"\xff\xfe{}"),
    "json null": lambda p: p.write_text("null"),
    "json number": lambda p: p.write_text("3.5"),
    "json string": lambda p: p.write_text('"a Result"'),
    "json list": lambda p: p.write_text("[1, 2, 3]"),
    "json empty object": lambda p: p.write_text("{}"),
    "name is a number": lambda p: _rewrite_json(p, name=3),
    "config is a list": lambda p: _rewrite_json(p, config=[6, 0]),
    "scalars is null": lambda p: _rewrite_json(p, scalars=None),
    "versions is a string": lambda p: _rewrite_json(p, versions="2.13"),
    "device is a number": lambda p: _rewrite_json(p, device=0),
    "wall_time is a string": lambda p: _rewrite_json(p, wall_time="fast"),
    "wall_time is a bool": lambda p: _rewrite_json(p, wall_time=True),
    "wall_time is infinite": lambda p: _rewrite_json(p, wall_time=float("inf")),
    "schema is a number": lambda p: _rewrite_json(p, schema=1.1),
    "config_hash is null": lambda p: _rewrite_json(p, config_hash=None),
    "created is a number": lambda p: _rewrite_json(p, created=2026),
    "arrays is a list": lambda p: _rewrite_json(p, arrays=["x", "k"]),
    "array spec is a number": lambda p: _rewrite_json(p, **{"arrays.x": 6}),
    "array shape is a string": lambda p: _rewrite_json(p, **{"arrays.x.shape": "6"}),
    "array shape negative": lambda p: _rewrite_json(p, **{"arrays.x.shape": [-6]}),
    "array dtype is a number": lambda p: _rewrite_json(p, **{"arrays.x.dtype": 8}),
    "npz_sha256 is a number": lambda p: _rewrite_json(p, npz_sha256=5),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_result_raises_a_specific_error(stored, fault):
    FAULTS[fault](stored)
    with pytest.raises(ex.CorruptResultError) as info:
        ex.load_result(stored)
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working
    message = str(info.value)
    assert str(stored) in message and "delete" in message and "force" in message
    assert info.value.path == stored and info.value.reason in message


@pytest.mark.parametrize("fault", sorted(set(FAULTS) - {"npz is a folder"}))  # os.replace cannot
def test_run_cached_recomputes_a_damaged_result_with_a_warning(stored, fault):  # replace a folder
    FAULTS[fault](stored)
    with pytest.warns(ex.CorruptResultWarning, match="damaged"):
        fresh = ex.run_cached(Sample(), device="cpu", results_dir=stored.parent.parent)
    assert CALLS["n"] == 2 and fresh.path == stored
    again = ex.load_result(stored)  # repaired in place
    np.testing.assert_array_equal(again.arrays["x"], fresh.arrays["x"])
    again = ex.run_cached(Sample(), results_dir=stored.parent.parent)
    assert again.config_hash == fresh.config_hash
    assert CALLS["n"] == 2


@pytest.mark.parametrize("fault", ["npz truncated to half", "json list", "wall_time is a string",
                                   "array value edited", "npz missing"])
def test_show_reports_a_damaged_result_without_a_traceback(stored, fault, capsys):
    FAULTS[fault](stored)
    assert main(["show", str(stored)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot use the Result at") and "Traceback" not in err
    assert "delete" in err


def test_show_in_a_subprocess_exits_2_with_one_line(stored):
    FAULTS["npz empty"](stored)
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "companion", "show", str(stored)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "is not a readable .npz" in out.stderr and out.stdout == ""
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1


def test_stale_config_values_of_the_wrong_type_are_recomputed(stored):
    _rewrite_json(stored, sign=True, config={"n": "six", "seed": [0]})  # a valid Result file, a bad config
    assert ex.load_result(stored).config == {"n": "six", "seed": [0]}
    with pytest.warns(ex.StaleResultWarning, match="stale"):
        ex.run_cached(Sample(), results_dir=stored.parent.parent)
    assert CALLS["n"] == 2


# ------------------------------------------------------------------ checksums and migration
def test_saved_json_records_checksums_of_the_npz_and_of_each_array(stored):
    meta = json.loads(stored.read_text())
    assert meta["npz_sha256"] == hashlib.sha256(stored.with_suffix(".npz").read_bytes()).hexdigest()
    result = ex.load_result(stored)
    for key, spec in meta["arrays"].items():
        assert spec["sha256"] == store._array_digest(result.arrays[key]) and len(spec["sha256"]) == 64
    # the array digest covers dtype and shape, not only the bytes
    x = result.arrays["x"]
    assert len({store._array_digest(x), store._array_digest(x.reshape(2, 3)),
                store._array_digest(x.view(np.int64))}) == 3
    # the npz bytes depend only on the arrays: saving the same arrays again gives the same file
    again = ex.save_result(ex.load_result(stored), stored.parent.parent / "again")
    assert again.with_suffix(".npz").read_bytes() == stored.with_suffix(".npz").read_bytes()


def _strip_checksums(path: Path) -> None:
    meta = json.loads(path.read_text())
    del meta["npz_sha256"], meta["json_sha256"]
    for spec in meta["arrays"].values():
        del spec["sha256"]
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def test_json_without_checksums_is_still_read_and_can_be_migrated(stored):
    original = ex.load_result(stored)
    _strip_checksums(stored)
    with pytest.warns(store.UnverifiedResultWarning, match="no checksum of its own content"):
        legacy = ex.load_result(stored)  # backward compatible, said so
    assert legacy.config_hash == original.config_hash
    # without checksums a changed value goes unnoticed; shapes and dtypes are still checked
    _replace_arrays(stored, _edit_value)
    with pytest.warns(store.UnverifiedResultWarning):
        assert ex.load_result(stored).arrays["x"][2] != original.arrays["x"][2]
    _replace_arrays(stored, lambda a: a.update(x=a["x"].astype(np.float32)))
    with pytest.raises(ex.CorruptResultError, match="declares float64"):
        ex.load_result(stored)
    with pytest.raises(ex.CorruptResultError):  # a damaged pair is not blessed with checksums
        store._add_checksums(stored)
    assert "npz_sha256" not in json.loads(stored.read_text())
    # the migration adds the checksums, and nothing else changes
    _replace_arrays(stored, lambda a: a.update(x=original.arrays["x"]))
    before = json.loads(stored.read_text())
    npz_before = stored.with_suffix(".npz").read_bytes()
    assert store._add_checksums(stored) is True
    after = json.loads(stored.read_text())
    assert stored.with_suffix(".npz").read_bytes() == npz_before
    assert ex.load_result(stored).config_hash == original.config_hash
    _strip_checksums(stored)
    assert json.loads(stored.read_text()) == before  # only the checksums were added
    store._add_checksums(stored)
    assert store._add_checksums(stored) is False and json.loads(stored.read_text()) == after
    assert not list(stored.parent.glob(".*"))  # no temporary file left
    _replace_arrays(stored, _edit_value)  # now detected
    with pytest.raises(ex.CorruptResultError, match="values of array 'x'"):
        ex.load_result(stored)


# ------------------------------------------------------------------ a reader racing a writer
def test_a_reader_that_races_a_writer_reads_again(stored, monkeypatch):
    """A pair replaced while it is read fails its checksum; load_result then reads it again."""
    other = ex.run(Sample(seed=1), device="cpu")
    other.config_hash, other.config = ex.config_hash(Sample()), {"n": 6, "seed": 0}
    staged = ex.save_result(other, stored.parent.parent / "staged")
    real = store._read_pair
    calls = {"n": 0}

    def racing(path):
        calls["n"] += 1
        if calls["n"] == 1:  # a writer publishes its npz now, and its JSON just after the read
            os.replace(staged.with_suffix(".npz"), stored.with_suffix(".npz"))
            try:
                return real(path)
            finally:
                os.replace(staged, stored)
        return real(path)

    monkeypatch.setattr(store, "_read_pair", racing)
    got = ex.load_result(stored)
    assert calls["n"] == 2
    np.testing.assert_array_equal(got.arrays["x"], other.arrays["x"])


def test_a_damaged_pair_nobody_writes_is_read_once(stored, monkeypatch):
    real = store._read_pair
    calls = {"n": 0}

    def counting(path):
        calls["n"] += 1
        return real(path)

    monkeypatch.setattr(store, "_read_pair", counting)
    FAULTS["array value edited"](stored)
    with pytest.raises(ex.CorruptResultError):
        ex.load_result(stored)
    assert calls["n"] == 1


# --------------------------------------------------------------------------- concurrent writers
N_WRITES = 8
SHARED = ("shared-a", "shared-b")


def _tagged(key: str, writer: int, i: int) -> ex.Result:
    """A Result of config ``key`` from ``writer``'s ``i``-th write (tagged in both files)."""
    rng = np.random.default_rng([writer, i])
    return ex.Result(name="concurrent", config={"key": key}, arrays={
        "tag": np.array([writer, i]), "x": rng.standard_normal(20_000),
        "y": rng.integers(0, 9, (64, 64))},
        scalars={"writer": writer, "i": i}, versions={}, device="cpu", wall_time=0.0, schema="1.1",
        config_hash=hashlib.sha256(key.encode()).hexdigest()[:16])


def _check_pair(result: ex.Result) -> tuple[int, int]:
    """The (writer, i) of a loaded Result, after checking that its two files belong together."""
    writer, i = result.scalars["writer"], result.scalars["i"]
    assert result.arrays["tag"].tolist() == [writer, i], "JSON and .npz come from different writes"
    expected = _tagged(result.config["key"], writer, i).arrays
    np.testing.assert_array_equal(result.arrays["x"], expected["x"])
    return writer, i


def _pair_path(folder: Path, key: str) -> Path:
    return Path(folder) / "concurrent" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _report(sink, item) -> None:
    """Append to a list (threads) or put on a multiprocessing queue (processes)."""
    if isinstance(sink, list):
        sink.append(item)
    else:
        sink.put(item)


def _write_many(folder, writer: int, errors) -> None:
    try:
        for i in range(N_WRITES):
            for key in (*SHARED, f"own-{writer}"):
                ex.save_result(_tagged(key, writer, i), folder)
            for key in SHARED:  # every pair that exists loads and is complete
                _check_pair(ex.load_result(_pair_path(folder, key)))
    except BaseException:  # noqa: BLE001 - report to the test
        _report(errors, traceback.format_exc())
        raise


def _read_until(folder, stop, errors, counts) -> None:
    loaded = 0
    try:
        while not stop.is_set():
            for key in SHARED:
                path = _pair_path(folder, key)
                if path.exists():
                    _check_pair(ex.load_result(path))
                    loaded += 1
    except BaseException:  # noqa: BLE001
        _report(errors, traceback.format_exc())
        raise
    finally:
        _report(counts, loaded)


def _check_final_state(folder: Path, n_writers: int) -> None:
    for key in SHARED:  # last writer wins, with a complete pair
        writer, i = _check_pair(ex.load_result(_pair_path(folder, key)))
        assert 0 <= writer < n_writers and i == N_WRITES - 1
    for w in range(n_writers):
        assert _check_pair(ex.load_result(_pair_path(folder, f"own-{w}"))) == (w, N_WRITES - 1)
    names = sorted(p.name for p in (folder / "concurrent").iterdir())
    keys = (*SHARED, *(f"own-{w}" for w in range(n_writers)))
    expected = sorted(_pair_path(folder, k).with_suffix(s).name
                      for k in keys for s in (".json", ".npz"))
    assert names == expected, "temporary or lock files were left behind"


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_writers_in_several_processes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    errors, counts, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    n_writers = 4
    writers = [ctx.Process(target=_write_many, args=(tmp_path, w, errors))
               for w in range(n_writers)]
    readers = [ctx.Process(target=_read_until, args=(tmp_path, stop, errors, counts))
               for _ in range(2)]
    for p in readers + writers:
        p.start()
    for p in writers:
        p.join(120)
    stop.set()
    for p in readers:
        p.join(60)
    loaded = sum(counts.get(timeout=10) for _ in readers)
    found = []
    while not errors.empty():
        found.append(errors.get(timeout=5))
    assert not found, "\n".join(found)
    assert [p.exitcode for p in writers + readers] == [0] * (n_writers + 2)
    assert loaded > 0  # the readers did read while the writers wrote
    _check_final_state(tmp_path, n_writers)


def test_concurrent_writers_in_several_threads(tmp_path):
    errors, counts, stop = [], [], threading.Event()
    n_writers = 6
    writers = [threading.Thread(target=_write_many, args=(tmp_path, w, errors))
               for w in range(n_writers)]
    readers = [threading.Thread(target=_read_until, args=(tmp_path, stop, errors, counts))
               for _ in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(120)
    stop.set()
    for t in readers:
        t.join(60)
    assert not errors, "\n".join(errors)
    assert sum(counts) > 0
    _check_final_state(tmp_path, n_writers)


def _in_threads(fn, n: int) -> list[str]:
    """Run ``fn()`` in ``n`` threads at once; the tracebacks of those that raised."""
    errors = []

    def work():
        try:
            fn()
        except BaseException:  # noqa: BLE001
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 120 s"
    return errors


def test_run_cached_from_several_threads_leaves_one_valid_pair(tmp_path):
    errors = _in_threads(lambda: ex.run_cached(Sample(n=5), device="cpu", results_dir=tmp_path, force=True), 6)
    assert not errors, "\n".join(errors)
    path = ex.result_path(Sample(n=5), tmp_path)
    assert ex.load_result(path).arrays["x"].shape == (5,)
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == [path.name, path.with_suffix(".npz").name]  # no temporary or lock file left


# ------------------------------------------------------------------ unwritable output folders
def _unwritable(tmp_path, where):
    if where == "under a file":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        return blocker / "results"
    return Path("/proc") / "companion-results"  # no one may create folders in /proc, not even root


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_run_cached_checks_the_folder_before_computing(tmp_path, where):
    CALLS["n"] = 0
    with pytest.raises(ValueError, match="cannot write Results into .*--out DIR"):
        ex.run_cached(Sample(), device="cpu", results_dir=_unwritable(tmp_path, where))
    assert CALLS["n"] == 0


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_cli_run_fails_before_computing_when_out_is_unwritable(tmp_path, where, capsys):
    CALLS["n"] = 0
    code = main(["run", "test_store_faults", "--device", "cpu", "--quiet", "--out",
                 str(_unwritable(tmp_path, where))])
    assert code == 2 and CALLS["n"] == 0
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write Results into") and "--out" in err


def test_cli_run_to_an_unwritable_out_in_a_subprocess_loads_no_model(tmp_path):
    """The real experiment fails at once (it would load a model and read the corpus first)."""
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    out_dir = str(_unwritable(tmp_path, "under a file"))
    out = subprocess.run([sys.executable, "-m", "companion", "run", "channel_statistics",
                          "--device", "cpu", "--quiet", "--out", out_dir],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot write Results into" in out.stderr and out.stdout == ""


def test_cli_reports_an_os_error_while_saving_without_a_traceback(tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ex, "save_result", full_disk)
    code = main(["run", "test_store_faults", "--device", "cpu", "--quiet", "--out", str(tmp_path)])
    assert code == 1
    assert "No space left on device" in capsys.readouterr().err


def test_a_failed_save_leaves_no_temporary_files(tmp_path, monkeypatch):
    def broken(fh, arrays):
        fh.write(b"PK")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write_npz", broken)
    with pytest.raises(OSError, match="No space"):
        ex.save_result(ex.run(Sample(), device="cpu"), tmp_path)
    assert list((tmp_path / "test_store_faults").iterdir()) == []


# ------------------------------------------------------------------ the converted-model cache
@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """Replace the 40-second GGUF conversion by a tiny Llama; the cache goes to tmp_path/cache."""
    from companion.transformers import models

    spec = sources.OFFLINE_MODELS["smollm2-135m"]
    try:
        sources._package_path(spec)
        tokenizer_dir = sources._package_path(sources.OFFLINE_MODELS["minilm-l6"])
    except ValueError as exc:
        pytest.skip(str(exc))
    transformers = sources._quiet_transformers()
    import torch

    calls = {"n": 0}

    def convert(path):
        calls["n"] += 1
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=2, max_position_embeddings=32)
        model = transformers.LlamaForCausalLM(config).eval()
        return model, transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))

    monkeypatch.setattr(sources, "_load_gguf", convert)
    monkeypatch.setattr(models, "_LOADED", {})  # no real GGUF load of this process is reused
    monkeypatch.setenv("COMPANION_CACHE", str(tmp_path / "cache"))
    return types.SimpleNamespace(load=lambda: sources._load_offline(spec, None, True), calls=calls,
                                 models=models)


def test_a_fresh_conversion_records_sizes_and_checksums(fake_conversion):
    models = fake_conversion.models
    model, tokenizer, source = fake_conversion.load()
    folder = Path(source)
    assert fake_conversion.calls["n"] == 1 and folder.parent == sources._cache_dir()
    marker = json.loads((folder / "companion.json").read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(marker["files"])
    for name, spec in marker["files"].items():
        data = (folder / name).read_bytes()
        assert spec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "mtime_ns": (folder / name).stat().st_mtime_ns}
    again, _, source2 = fake_conversion.load()
    assert fake_conversion.calls["n"] == 1 and source2 == source  # read from the cache
    for key, value in model.state_dict().items():
        assert (again.state_dict()[key] == value).all()


def test_files_are_hashed_again_only_when_their_time_changed(fake_conversion, monkeypatch):
    models = fake_conversion.models
    _, _, source = fake_conversion.load()
    folder = Path(source)
    hashed = []
    real = sources._sha256
    monkeypatch.setattr(sources, "_sha256", lambda path: hashed.append(path.name) or real(path))
    assert sources._cache_problem(folder) is None and hashed == []  # unchanged: stat only
    weights = folder / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, content unchanged
    assert sources._cache_problem(folder) is None and hashed == ["model.safetensors"]
    assert sources._cache_problem(folder) is None and hashed == ["model.safetensors"]  # recorded
    fake_conversion.load()
    assert fake_conversion.calls["n"] == 1  # same content: no new conversion


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 5] ^= 0x01
    path.write_bytes(bytes(data))


CACHE_FAULTS = {
    "weights truncated": lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:100]),
    "weights empty": lambda f: (f / "model.safetensors").write_bytes(b""),
    "one weight bit flipped": lambda f: _flip_a_byte(f / "model.safetensors"),
    "weights missing": lambda f: (f / "model.safetensors").unlink(),
    "tokenizer garbage": lambda f: (f / "tokenizer.json").write_text("{" * 10),
    "marker missing": lambda f: (f / "companion.json").unlink(),
    "marker garbage": lambda f: (f / "companion.json").write_text("not json"),
    "marker a list": lambda f: (f / "companion.json").write_text("[]"),
    "marker of another conversion": lambda f: (f / "companion.json").write_text(
        json.dumps({"conversion_version": 999})),
    "marker files malformed": lambda f: (f / "companion.json").write_text(
        json.dumps({"conversion_version": 1, "files": {"../x": 3}})),
}


@pytest.mark.parametrize("fault", sorted(CACHE_FAULTS))
def test_a_damaged_cache_is_converted_again_with_a_warning(fake_conversion, fault):
    models = fake_conversion.models
    model, _, source = fake_conversion.load()
    # copies: the loaded weights may be memory-mapped from the very file the fault truncates
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    del model
    folder = Path(source)
    CACHE_FAULTS[fault](folder)
    expected = f"(?s){folder.name}.*damaged.*converting the GGUF"
    with pytest.warns(sources.CorruptCacheWarning, match=expected):
        model, _, source2 = fake_conversion.load()
    assert fake_conversion.calls["n"] == 2 and source2 == source
    assert sources._cache_problem(folder) is None
    for key, value in reference.items():
        assert (model.state_dict()[key] == value).all()
    assert sorted(p.name for p in sources._cache_dir().iterdir()) == [folder.name]  # none left aside
    fake_conversion.load()
    assert fake_conversion.calls["n"] == 2  # repaired: read from the cache again


def test_a_cache_written_before_checksums_is_trusted_once_it_loads(fake_conversion):
    models = fake_conversion.models
    _, _, source = fake_conversion.load()
    folder = Path(source)
    marker = folder / "companion.json"
    old_marker = json.dumps({"conversion_version": sources._CONVERSION_VERSION})  # before checksums
    marker.write_text(old_marker)
    fake_conversion.load()
    assert fake_conversion.calls["n"] == 1 and "files" in json.loads(marker.read_text())  # upgraded
    marker.write_text(old_marker)
    (folder / "model.safetensors").write_bytes(b"\0" * 64)  # old marker, damaged weights
    with pytest.warns(sources.CorruptCacheWarning, match="(?s)damaged.*does not load"):
        fake_conversion.load()
    assert fake_conversion.calls["n"] == 2 and sources._cache_problem(folder) is None


def test_a_damaged_cache_that_cannot_be_removed_says_how_to_fix_it(fake_conversion, monkeypatch):
    models = fake_conversion.models
    _, _, source = fake_conversion.load()
    CACHE_FAULTS["weights truncated"](Path(source))
    monkeypatch.setattr(sources, "_discard_folder", lambda folder: False)
    expected = f"(?s)rm -r {re.escape(source)}.*COMPANION_CACHE"
    with pytest.warns(sources.CorruptCacheWarning, match=expected):
        model, _, source2 = fake_conversion.load()
    assert source2.endswith(".gguf") and fake_conversion.calls["n"] == 2  # the de-quantised model
    assert model.config.num_hidden_layers == 1


def test_a_conversion_that_does_not_load_raises_with_the_path(fake_conversion, monkeypatch):
    models = fake_conversion.models

    def broken(folder, kind, dtype):
        raise OSError("safetensors: header too large")

    monkeypatch.setattr(sources, "_load_folder", broken)
    with pytest.raises(ValueError, match=r"written to .*smollm2-135m-.* is damaged .*rm -r"):
        fake_conversion.load()


# ------------------------------------------------------------------ .npy headers and thread safety

def test_npy_headers_are_parsed_one_thread_at_a_time(tmp_path, monkeypatch):
    """numpy parses a header with ast.literal_eval, which CPython 3.11 cannot always run in two threads
    at once (a SystemError in CI, cf. gh-106905); the store parses headers under a lock: no overlap."""
    paths = [ex.save_result(_tagged(f"k{j}", 0, j), tmp_path) for j in range(4)]
    inside, overlaps = [0], []
    real = {v: getattr(np.lib.format, f"read_array_header_{v}") for v in ("1_0", "2_0")}

    def slow(version):
        def parse(fh):
            inside[0] += 1
            overlaps.append(inside[0] > 1)
            threading.Event().wait(0.002)  # long enough for another thread to enter if it could
            try:
                return real[version](fh)
            finally:
                inside[0] -= 1
        return parse

    for version in real:
        monkeypatch.setattr(np.lib.format, f"read_array_header_{version}", slow(version))

    def read():
        for _ in range(5):
            for path in paths:
                ex.load_result(path)

    errors = _in_threads(read, 4)
    assert not errors, "\n".join(errors)
    assert len(overlaps) >= 4 * 5 * 4 and not any(overlaps)


@pytest.mark.parametrize("make", [
    lambda: np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)),
    lambda: np.arange(6, dtype=">i4").reshape(2, 3),
    lambda: np.zeros((0, 5)),
    lambda: np.array(3.5),
    lambda: np.array([True, False]),
    lambda: np.arange(4, dtype=np.complex64),
], ids=["fortran", "big-endian", "empty", "0-d", "bool", "complex"])
def test_arrays_read_back_exactly_as_numpy_reads_them(tmp_path, make):
    array = make()
    r = ex.Result(name="layout", config={}, arrays={"a": array}, scalars={}, versions={},
                  device="cpu", wall_time=0.0, schema="1.1", config_hash="0" * 16)
    path = ex.save_result(r, tmp_path)
    got = ex.load_result(path).arrays["a"]
    with np.load(path.with_suffix(".npz")) as ref:
        want = ref["a"]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.f_contiguous == want.flags.f_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, want)
