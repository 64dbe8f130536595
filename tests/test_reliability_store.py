"""Issue 30, the stored artefacts: a Result store and a TinyLM weight store that cannot be tricked.

Each test names the falsifying input it was written from (the behaviour before the fix in brackets).
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.experiments import store


def _result(name="example", x=None, **scalars):
    return store.Result(name=name, config={}, arrays={"x": np.arange(6.0) if x is None else x},
                        scalars=scalars or {"a": 1.5}, versions={"numpy": np.__version__}, device="cpu",
                        wall_time=0.25, schema="1.1", config_hash="0" * 16)


@pytest.fixture
def saved(tmp_path):
    return store.save_result(_result(), tmp_path)


def _edit_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# ------------------------------------------------------------------ the JSON's own content
@pytest.mark.parametrize("old, new", [('"a": 1.5', '"a": 2.5'),                 # a scalar
                                      ('"device": "cpu"', '"device": "cuda:0"'),
                                      ('"wall_time": 0.25', '"wall_time": 0.5')])
def test_an_edited_scalar_device_or_time_is_detected(saved, old, new):
    """[an edited scalar was returned silently]"""
    _edit_text(saved, old, new)
    with pytest.raises(store.CorruptResultError, match="JSON does not match its SHA-256"):
        store.load_result(saved)


def test_a_json_without_its_own_checksum_loads_with_a_warning(saved):
    meta = json.loads(saved.read_text())
    del meta["json_sha256"]
    saved.write_text(json.dumps(meta))
    with pytest.warns(store.UnverifiedResultWarning, match="_add_checksums"):
        assert store.load_result(saved).scalars == {"a": 1.5}
    assert store._add_checksums(saved) is True
    assert json.loads(saved.read_text())["json_sha256"] == store._json_digest(meta)


@pytest.mark.parametrize("value", ["1" + "0" * 400, "-1e999", "NaN"])
def test_an_out_of_range_number_is_a_damaged_result(saved, value):
    """[wall_time = 10**400 raised TypeError from numpy.isfinite]"""
    _edit_text(saved, '"wall_time": 0.25', f'"wall_time": {value}')
    with pytest.raises(store.CorruptResultError):
        store.load_result(saved)


# ------------------------------------------------------------------ killed and concurrent writers
def _killed_after_the_npz(folder):
    real = os.replace

    def replace_then_die(src, dst):
        real(src, dst)
        if str(dst).endswith(".npz"):
            os._exit(9)  # killed between publishing the .npz and the JSON

    store.os.replace = replace_then_die
    store.save_result(_result(x=np.ones(6)), folder)


def test_a_writer_killed_mid_publication_costs_one_read_and_its_files_are_cleaned(saved, monkeypatch):
    """[every later read retried 50 times on the stale lock; the .json.tmp stayed forever]"""
    proc = multiprocessing.get_context("fork").Process(target=_killed_after_the_npz, args=(saved.parent.parent,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 9
    left = {p.name for p in saved.parent.iterdir()}
    assert saved.with_suffix(".lock").name in left and any(n.endswith(".json.tmp") for n in left)
    calls = {"n": 0}
    real = store._read_pair

    def counting(path):
        calls["n"] += 1
        return real(path)

    monkeypatch.setattr(store, "_read_pair", counting)
    with pytest.raises(store.CorruptResultError):
        store.load_result(saved)  # the new .npz with the old JSON: damaged, read once
    assert calls["n"] == 1
    store.save_result(_result(), saved.parent.parent)  # the next writer cleans up
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name, saved.with_suffix(".npz").name]
    assert store.load_result(saved).scalars == {"a": 1.5}


def test_a_temp_file_of_a_live_writer_is_kept(saved):
    live = saved.parent / f".{saved.stem}.{store._HOST}.{os.getpid()}.{'a' * 32}.npz.tmp"
    live.write_bytes(b"in progress")
    store.save_result(_result(), saved.parent.parent)
    assert live.exists()


def _write_many(folder, seed):
    for k in range(5):
        store.save_result(_result(x=np.full(6, seed * 10.0 + k)), folder)


def test_concurrent_writers_leave_one_complete_pair(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_many, args=(tmp_path, s)) for s in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    path = tmp_path / "example" / ("0" * 16 + ".json")
    x = store.load_result(path).arrays["x"]
    assert np.all(x == x[0])
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.with_suffix(".npz").name]


# ------------------------------------------------------------------ crafted .npz files
def _npz_with_header(shape, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x.npy", "w") as fh:
            np.lib.format.write_array_header_1_0(
                fh, {"descr": "<f8", "fortran_order": False, "shape": shape})
            fh.write(data)
    return buf.getvalue()


def test_a_decompression_bomb_is_refused_before_allocating(saved):
    """[a 1 kB .npz whose header claims 10**7 floats made the reader allocate 80 MB]"""
    blob = _npz_with_header((10 ** 7,), bytes(48))
    saved.with_suffix(".npz").write_bytes(blob)
    tracemalloc.start()
    try:
        with pytest.raises(store.CorruptResultError, match="declares"):
            store.load_result(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak


def test_a_zip_member_larger_than_declared_is_refused(saved):
    zeros = bytes(10 ** 7)  # 10 MB of zeros deflate to about 10 kB
    saved.with_suffix(".npz").write_bytes(_npz_with_header((6,), zeros))
    with pytest.raises(store.CorruptResultError, match="bytes"):
        store.load_result(saved)


# ------------------------------------------------------------------ names and links
@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "", "/abs", "x\\y"])
def test_a_name_that_is_not_a_file_name_is_refused(tmp_path, name):
    """[name='../escape' wrote the pair outside the destination folder]"""
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match="name"):
        store.save_result(_result(name=name), dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_config_hash_with_a_separator_is_refused(tmp_path):
    r = _result()
    r.config_hash = "../../x"
    with pytest.raises(ValueError, match="config_hash"):
        store.save_result(r, tmp_path / "dest")
    assert not (tmp_path / "x.json").exists()


def test_a_dangling_symlink_at_the_lock_is_not_followed(saved, tmp_path):
    """[each save created the symlink's target]"""
    target = tmp_path / "created-by-the-lock"
    lock = saved.with_suffix(".lock")
    lock.symlink_to(target)
    store.save_result(_result(), saved.parent.parent)
    assert not target.exists()
    store.load_result(saved)
    assert not target.exists()


# ------------------------------------------------------------------ the TinyLM weight store
TINY_TRAINED = dict(widths=(8,), depths=(1,), placements=("pre",), n_heads=2, steps=2, batch_size=2,
                    seq_len=16, warmup=1, eval_sequences=2, inject_start=4, inject_stop=8, n_directions=2)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from companion.experiments import framework_trained as xf
    cfg = xf.TrainedWindowsConfig(**TINY_TRAINED)
    path = xf.save_models(xf.train_models(cfg), cfg, tmp_path_factory.mktemp("w") / "m.npz")
    return xf, cfg, path, path.read_bytes(), path.with_suffix(".json").read_bytes()


@pytest.fixture
def fresh_weights(weights):
    xf, cfg, path, npz, sidecar = weights
    path.write_bytes(npz)
    path.with_suffix(".json").write_bytes(sidecar)
    return xf, cfg, path


def _edit_weight(arrays):
    key = sorted(arrays)[0]
    arrays[key] = arrays[key].copy()
    arrays[key].flat[0] = arrays[key].flat[0] + np.float16(1)


def test_an_edited_weight_is_refused(fresh_weights):
    """[a weight edited in the .npz loaded silently]"""
    xf, cfg, path = fresh_weights
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    _edit_weight(arrays)
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    with pytest.raises(ValueError, match="damaged.*retrain"):
        xf.load_models(path, cfg)


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_truncated_weight_file_is_a_clear_error(fresh_weights, cut):
    """[zipfile.BadZipFile: File is not a zip file]"""
    xf, cfg, path = fresh_weights
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * cut)])
    with pytest.raises(ValueError, match="damaged.*retrain"):
        xf.load_models(path, cfg)


def test_an_edited_loss_in_the_sidecar_is_refused(fresh_weights):
    xf, cfg, path = fresh_weights
    meta = json.loads(path.with_suffix(".json").read_text())
    key = meta["models"][0]
    meta["train_loss"][key][0] += 1.0
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="damaged.*retrain"):
        xf.load_models(path, cfg)


def test_weights_are_written_atomically(fresh_weights, monkeypatch):
    """[np.savez_compressed wrote in place: a failed write left a half file and the old sidecar]"""
    xf, cfg, path = fresh_weights
    before = (path.read_bytes(), path.with_suffix(".json").read_bytes())
    models = xf.load_models(path, cfg)

    def full_disk(file, *args, **kwargs):  # half a file written, then the disk is full
        with open(file, "wb") if isinstance(file, (str, Path)) else contextlib.nullcontext(file) as fh:
            fh.write(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write_npz", full_disk)
    monkeypatch.setattr(np, "savez_compressed", full_disk)
    with pytest.raises(OSError, match="No space"):
        xf.save_models(models, cfg, path)
    assert (path.read_bytes(), path.with_suffix(".json").read_bytes()) == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.json", "m.npz"]


# ------------------------------------------------------------------ property: no edit goes unnoticed
@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from([".json", ".npz"]), where=st.floats(0, 1, exclude_max=True),
       byte=st.integers(0, 255))
def test_any_one_byte_edit_is_detected_or_changes_nothing(which, where, byte):
    """Either the edited pair raises CorruptResultError or it loads as exactly the original Result."""
    import tempfile

    original = _result(x=np.linspace(0.0, 1.0, 7), a=1.5, b=[1, 2])
    with tempfile.TemporaryDirectory() as tmp:
        path = store.save_result(original, tmp)
        target = path.with_suffix(which)
        data = bytearray(target.read_bytes())
        data[int(where * len(data))] = byte
        target.write_bytes(bytes(data))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", store.UnverifiedResultWarning)  # never demoted to unverified
                got = store.load_result(path)
        except store.CorruptResultError:
            return
    for key in ("name", "config", "scalars", "versions", "device", "wall_time", "schema", "config_hash"):
        assert getattr(got, key) == getattr(original, key), key
    np.testing.assert_array_equal(got.arrays["x"], original.arrays["x"])
    assert got.arrays["x"].dtype == original.arrays["x"].dtype


def test_a_renamed_checksum_field_is_damage_not_an_old_file(saved):
    """[renaming json_sha256 made the file look like an old one: it loaded with only a warning]"""
    _edit_text(saved, '"json_sha256"', '"json_sha25X"')
    with pytest.raises(store.CorruptResultError, match="fields no writer"):
        store.load_result(saved)


def test_a_crafted_pair_declaring_a_huge_array_is_refused_before_allocating(saved):
    """A JSON re-signed to declare 10**8 floats, with a zip entry that holds 48 bytes: refused unread."""
    saved.with_suffix(".npz").write_bytes(_npz_with_header((10 ** 8,), bytes(48)))
    meta = json.loads(saved.read_text())
    meta["arrays"]["x"]["shape"] = [10 ** 8]
    meta["npz_sha256"] = store._file_digest(saved.with_suffix(".npz"))
    saved.write_bytes(store._signed(meta))
    tracemalloc.start()
    try:
        with pytest.raises(store.CorruptResultError, match="inflates to"):
            store.load_result(saved)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak
