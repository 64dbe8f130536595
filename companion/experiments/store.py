"""The Result store: a Result is a JSON file and an ``.npz`` file, checksummed and written atomically.

Chapters read :func:`stored_root` (package data, searched first); local runs go to :func:`cache_root`.
The JSON holds the SHA-256 of the ``.npz``, of each array and of its own content, which
:func:`load_result` checks (:class:`CorruptResultError` otherwise), with every array's size and shape
checked before it is decompressed.  :func:`save_result` publishes both files (``.npz`` first) under a
per-Result lock, so concurrent writers leave the last complete pair; readers take no lock and re-read
a pair replaced meanwhile.  What the store guarantees: CONTRIBUTING.md, *Reliability*.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import math
import os
import re
import socket
import tempfile
import time
import threading
import uuid
import warnings
import zipfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from companion._paths import package_data, source_checkout
from companion.experiments.registry import _schema, config_hash, get_experiment, make_config

try:  # POSIX advisory locks; elsewhere only threads of one process are serialised
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["Result", "StaleResultWarning", "CorruptResultWarning", "UnverifiedResultWarning",
           "CorruptResultError", "cache_root",
           "stored_root", "stored_results", "result_path", "check_writable", "save_result", "load_result"]

#: Fields every Result JSON holds, with their JSON types; then the optional ones with their defaults.
_META_TYPES: dict[str, tuple] = {
    "name": (str,), "config": (dict,), "scalars": (dict,), "versions": (dict,), "device": (str,),
    "wall_time": (int, float), "schema": (str,), "config_hash": (str,),
    "created": (str,), "arrays": (dict,), "npz_sha256": (str,), "json_sha256": (str,),
}
_OPTIONAL = {"created": "", "arrays": {}, "npz_sha256": "", "json_sha256": ""}
#: What a Result's name and config hash may be: one file name, no separators, no ``..``.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
#: Temporary files of a writer on another machine (its process cannot be checked) older than this are removed.
_STALE_TEMP_S = 24 * 3600
#: How often :func:`load_result` re-reads a pair that writers keep replacing during the read.
_READ_ATTEMPTS = 50
_THREAD_LOCK = threading.Lock()  # serialises writers only where fcntl is missing
# numpy parses an .npy header with ast.literal_eval, which CPython 3.11 (3.11.7 in CI included) cannot
# always run in two threads at once ("SystemError: AST constructor recursion depth mismatch", cf.
# gh-106905): headers are parsed one thread at a time; the data are read outside the lock
_HEADER_LOCK = threading.Lock()


class StaleResultWarning(UserWarning):
    """A stored Result did not match its config hash or schema and was recomputed."""


class CorruptResultWarning(StaleResultWarning):
    """A stored Result's files were damaged (unreadable, truncated, edited) and it was recomputed."""


class UnverifiedResultWarning(UserWarning):
    """A Result JSON written before the JSON checksum existed was read: its own content is not verified."""


class CorruptResultError(ValueError):
    """The files at a Result path do not form a valid Result (see :func:`load_result`).

    Parameters
    ----------
    path : pathlib.Path
        The Result's JSON file (attribute ``path``).
    reason : str
        What is wrong (attribute ``reason``).
    """

    def __init__(self, path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(
            f"cannot use the Result at {self.path}: {reason}; delete {self.path.name} and "
            f"{self.path.with_suffix('.npz').name} in {self.path.parent}, or recompute it "
            "(run_cached(..., force=True), or --force on the command line)")

    def __reduce__(self):  # picklable across processes, like other exceptions
        return (type(self), (self.path, self.reason))


@dataclass
class Result:
    """What an experiment run produced, with everything needed to trust and reproduce it."""

    name: str  #: experiment name
    config: dict  #: the config, as JSON values
    arrays: dict  #: name -> numpy.ndarray
    scalars: dict  #: the scalar outputs, as JSON values
    versions: dict  #: python, torch, transformers, numpy, companion and the platform
    device: str  #: e.g. ``"cuda:0 (NVIDIA H100 80GB HBM3)"``
    wall_time: float  #: seconds spent in ``compute``
    schema: str  #: ``"<framework schema>.<experiment schema>"``
    config_hash: str  #: the key of :func:`result_path`
    created: str = ""  #: UTC time (ISO 8601)
    path: Path | None = field(default=None, compare=False, repr=False)  #: where it is stored

    def config_object(self):
        """The frozen config instance this Result was computed from."""
        return make_config(self.name, self.config)


def _results_root() -> Path:
    """``$COMPANION_RESULTS``, else ``<repository>/results``, else ``~/.cache/companion/results``."""
    env = os.environ.get("COMPANION_RESULTS")
    if env:
        return Path(env).expanduser()
    repo = source_checkout()
    return repo / "results" if repo is not None else Path.home() / ".cache" / "companion" / "results"


def cache_root() -> Path:
    """Folder of the Results computed locally, where new Results go by default.

    Returns
    -------
    pathlib.Path
        ``$COMPANION_RESULTS/cache``, else ``<repository>/results/cache`` in a clone, else
        ``~/.cache/companion/results/cache``.
    """
    return _results_root() / "cache"


def stored_root() -> Path:
    """Folder of the stored Results that chapters read (searched first by ``run_cached``).

    Returns
    -------
    pathlib.Path
        ``$COMPANION_RESULTS/stored`` if set, else the package data ``companion/data/results``.
    """
    return _results_root() / "stored" if os.environ.get("COMPANION_RESULTS") else package_data("results")


def _stored_target() -> Path:
    """:func:`stored_root` in a clone or under ``$COMPANION_RESULTS`` (Results to keep), else the cache."""
    writable = os.environ.get("COMPANION_RESULTS") or source_checkout() is not None
    return stored_root() if writable else cache_root()


def stored_results(name: str, root: str | Path | None = None) -> list[Result]:
    """Every valid stored Result of experiment ``name`` (any config), newest first.

    Parameters
    ----------
    name : str
        A registered experiment name.
    root : path, optional
        Folder holding ``<name>/<hash>.json`` files (default :func:`stored_root`).

    Returns
    -------
    list of Result
        Those whose schema matches the current code (others would be recomputed, never shown).

    Raises
    ------
    ValueError
        If ``name`` is not registered.

    Examples
    --------
    >>> newest = stored_results("framework_random")[0]  # doctest: +SKIP
    """
    cls = get_experiment(name)
    base = Path(root) if root is not None else stored_root()
    found = []
    for path in sorted((base / name).glob("*.json")):
        try:
            result = load_result(path)
        except ValueError:
            continue
        if result.name == name and result.schema == _schema(cls):
            found.append(result)
    return sorted(found, key=lambda r: r.created, reverse=True)


def result_path(config, results_dir: str | Path | None = None) -> Path:
    """Path of the JSON file of ``config``'s Result: ``<results_dir>/<name>/<hash>.json``.

    Parameters
    ----------
    config : a registered experiment config instance
    results_dir : path or None
        Default :func:`cache_root`.

    Returns
    -------
    pathlib.Path
    """
    base = Path(results_dir) if results_dir is not None else cache_root()
    return base / type(config).experiment_name / f"{config_hash(config)}.json"


def _array_digest(array: np.ndarray) -> str:
    """SHA-256 (hex) of an array's dtype (with byte order), shape and values in C order."""
    h = hashlib.sha256(f"{array.dtype.str}|{list(array.shape)}|".encode())
    h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _write_npz(fh, arrays: dict) -> None:
    """Write ``arrays`` to ``fh`` as an ``.npz`` whose bytes depend only on the arrays (no pickles)."""
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def _temp_write(folder: Path, stem: str, suffix: str, write) -> Path:
    """Write a new file with a unique (UUID) name in ``folder`` via ``write(fh)``, flushed to disk."""
    tmp = folder / f".{stem}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex}{suffix}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _json_bytes(meta: dict) -> bytes:
    return (json.dumps(meta, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def _json_digest(meta: dict) -> str:
    """SHA-256 of the JSON's canonical text without its own ``json_sha256`` (ValueError for NaN/inf)."""
    return hashlib.sha256(_json_bytes({k: v for k, v in meta.items() if k != "json_sha256"})).hexdigest()


def _signed(meta: dict) -> bytes:
    """The JSON text of ``meta`` with its own checksum."""
    return _json_bytes({**meta, "json_sha256": _json_digest(meta)})


def _check_file_name(what: str, value) -> None:
    if not isinstance(value, str) or not _FILE_NAME.match(value) or ".." in value:
        raise ValueError(f"the Result's {what} {value!r} cannot name a file in the store: use letters, "
                         "digits, '_', '-' and '.' (no path separator, no '..')")


def _clean_temps(folder: Path, stem: str) -> None:
    """Remove temporary files of ``stem`` left by killed writers (dead process here, or a day old)."""
    for tmp in folder.glob(f".{glob.escape(stem)}.*.tmp"):
        parts = tmp.name.split(".")
        try:
            if len(parts) >= 6 and parts[2] == _HOST and parts[3].isdigit():
                try:
                    os.kill(int(parts[3]), 0)
                    continue  # its writer is alive
                except ProcessLookupError:
                    pass
                except (PermissionError, OverflowError):  # another user's live process
                    continue
            elif time.time() - tmp.lstat().st_mtime < _STALE_TEMP_S:
                continue
            tmp.unlink()
        except OSError:
            pass


def _acquire(lock: Path) -> int | None:
    """File descriptor holding an exclusive flock on ``lock`` (created), or None without flock."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError:
            if not lock.is_symlink():
                raise
            lock.unlink()  # never create or lock a link's target
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: go on unlocked
            os.close(fd)
            lock.unlink(missing_ok=True)
            return None
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(lock)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the writer that held it deleted it meanwhile: lock the current file


@contextlib.contextmanager
def _pair_lock(json_path: Path):
    """Hold the write lock of one Result (``<hash>.lock``, deleted before unlocking) while publishing."""
    if fcntl is None:  # pragma: no cover - Windows
        with _THREAD_LOCK:
            yield
        return
    lock = json_path.with_suffix(".lock")
    fd = _acquire(lock)
    try:
        yield
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)
            os.close(fd)


def check_writable(folder: Path) -> None:
    """Raise ValueError (before any work is done) if Results cannot be written into ``folder`` (a Path)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"cannot write Results into {folder} ({exc}); choose a writable folder: --out DIR "
                         "on the command line, results_dir= in Python, or $COMPANION_RESULTS for the "
                         "default folders") from None


def save_result(result: Result, results_dir: str | Path | None = None) -> Path:
    """Write ``result`` as JSON (metadata, config, scalars, checksums) + ``.npz`` (arrays), atomically.

    Parameters
    ----------
    result : Result
        The Result to store.
    results_dir : path or None
        Root folder of ``<name>/<config hash>.json`` and ``.npz``; default :func:`cache_root`.

    Returns
    -------
    pathlib.Path
        The JSON path (also set as ``result.path``).

    Raises
    ------
    TypeError, ValueError, OSError
        Not a Result or an object array (TypeError); an array name that is not an identifier, or a
        name or config hash that is not a file name (ValueError); a folder that cannot be written.
    """
    if not isinstance(result, Result):
        raise TypeError(f"expected a Result, got {type(result).__name__}")
    arrays = {}
    for key, value in result.arrays.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"array names must be identifiers, got {key!r}")
        arrays[key] = np.asarray(value)
        if arrays[key].dtype.hasobject:
            raise TypeError(f"array {key!r} has dtype object, which cannot be stored without pickles")
    _check_file_name("name", result.name)
    _check_file_name("config_hash", result.config_hash)
    base = Path(results_dir) if results_dir is not None else cache_root()
    path = base / result.name / f"{result.config_hash}.json"
    meta = {k: getattr(result, k) for k in ("name", "config", "scalars", "versions", "device", "wall_time",
                                            "schema", "config_hash", "created")}
    _publish(path, meta, arrays)
    result.path = path
    return path


def _publish(path: Path, meta: dict, arrays: dict) -> None:
    """Write ``arrays`` beside the JSON ``path`` and ``meta`` with every checksum, atomically, as a pair."""
    npz_path = path.with_suffix(".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta["arrays"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "sha256": _array_digest(v)}
                      for k, v in arrays.items()}
    temps = []
    try:
        temps.append(_temp_write(path.parent, path.stem, ".npz.tmp", lambda fh: _write_npz(fh, arrays)))
        meta["npz_sha256"] = _file_digest(temps[0])
        text = _signed(meta)
        temps.append(_temp_write(path.parent, path.stem, ".json.tmp", lambda fh: fh.write(text)))
        with _pair_lock(path):
            _clean_temps(path.parent, path.stem)
            os.replace(temps[0], npz_path)
            os.replace(temps[1], path)
        temps = []
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _read_pair(path: Path, legacy: bool = False) -> tuple[Result, dict]:
    """Read and verify one Result pair (no lock); return it and its JSON metadata."""
    meta, arrays = _read_checked(path, _META_TYPES, _OPTIONAL, legacy)
    try:
        finite = math.isfinite(meta["wall_time"])
    except OverflowError:  # an integer beyond float range
        finite = False
    if not finite:
        raise CorruptResultError(path, f"its wall_time is {meta['wall_time']!r:.40}")
    required = {k: meta[k] for k in _META_TYPES if k not in _OPTIONAL}
    return Result(**required, arrays=arrays, created=meta.get("created", ""), path=path), meta


def _read_checked(path: Path, types: dict, optional: dict, legacy: bool = False) -> tuple[dict, dict]:
    """Read and verify a JSON + ``.npz`` pair and its checksums; warns if unchecksummed unless ``legacy``."""
    npz_path = path.with_suffix(".npz")
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the Result at {path}: {exc}") from exc
    corrupt = partial(CorruptResultError, path)
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise corrupt(f"its JSON is malformed ({exc})") from None
    if not isinstance(meta, dict):
        raise corrupt(f"its JSON holds a {_kind(meta)}, not a Result object")
    missing = sorted(set(types) - set(optional) - set(meta))
    if missing:
        raise corrupt(f"it is not a Result file (missing {missing})")
    unknown = sorted(set(meta) - set(types))
    if unknown:  # e.g. a renamed json_sha256: never written by this store
        raise corrupt(f"its JSON has fields no writer of this store writes ({unknown!r:.80})")
    for key, types_ in types.items():  # an optional field may be absent, not mistyped
        value = meta.get(key, optional.get(key))
        if isinstance(value, bool) or not isinstance(value, types_):
            want = " or ".join(t.__name__ for t in types_)
            raise corrupt(f"its field {key!r} is a {_kind(value)}, not a {want}")
    declared = meta.get("arrays", {})
    for key, spec in declared.items():
        ok = (isinstance(spec, dict) and isinstance(spec.get("dtype"), str)
              and isinstance(spec.get("sha256", ""), str) and isinstance(spec.get("shape"), list)
              and all(type(n) is int and n >= 0 for n in spec["shape"]))
        if not ok:
            raise corrupt(f"its description of array {key!r} is malformed ({spec!r:.80})")
    if "json_sha256" in meta:
        try:
            json_ok = _json_digest(meta) == meta["json_sha256"]
        except ValueError:  # NaN or infinity: never written by save_result
            json_ok = False
        if not json_ok:
            raise corrupt("its JSON does not match its SHA-256 (edited, or damaged)")
    try:
        blob = npz_path.read_bytes()
    except OSError as exc:
        raise corrupt(f"its arrays file {npz_path.name} cannot be read ({exc.strerror or exc})") from None
    want_sha = meta.get("npz_sha256")
    sha_ok = want_sha is None or hashlib.sha256(blob).hexdigest() == want_sha
    try:
        arrays = _read_npz(blob, declared, corrupt)
    except CorruptResultError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile, zlib, EOFError, ValueError: all "damaged"
        note = "" if sha_ok else "; it does not match the SHA-256 in the JSON"
        raise corrupt(f"{npz_path.name} ({len(blob)} bytes) is not a readable .npz "
                      f"({type(exc).__name__}: {exc}){note}") from None
    for key, spec in declared.items():
        if "sha256" in spec and _array_digest(arrays[key]) != spec["sha256"]:
            raise corrupt(f"the values of array {key!r} do not match their SHA-256 in the JSON")
    if not sha_ok:
        raise corrupt(f"{npz_path.name} does not match the SHA-256 in the JSON "
                      "(another run's file, or edited)")
    if "json_sha256" not in meta and not legacy:
        warnings.warn(f"the JSON of {path} has no checksum of its own content (written before the store "
                      "checked it): its scalars are not verified; add it with "
                      "companion.experiments.store._add_checksums(path), or recompute",
                      UnverifiedResultWarning, stacklevel=4)
    return meta, arrays


#: An array inflating to more than this many bytes must not compress more than :data:`_MAX_RATIO` times.
_BOMB_BYTES, _MAX_RATIO = 64 << 20, 200


def _read_npz(blob: bytes, declared: dict, corrupt) -> dict:
    """The arrays of an ``.npz``, each checked against ``declared`` (size, shape, dtype) before it is read."""
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        members = {info.filename: info for info in zf.infolist()}
        held = sorted(name.removesuffix(".npy") for name in members)
        if held != sorted(declared) or len(members) != len(zf.namelist()):
            raise corrupt(f"the .npz holds {held} but the JSON declares {sorted(declared)}")
        arrays = {}
        for info in zf.infolist():  # in the archive's order, which the next save keeps
            key = info.filename.removesuffix(".npy")
            spec = declared[key]
            nbytes = math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize
            with zf.open(info) as fh:  # the header first: shape and dtype before any allocation
                version = np.lib.format.read_magic(fh)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                with _HEADER_LOCK:
                    shape, fortran_order, dtype = read_header(fh)
                inflated = fh.tell() + nbytes
                if list(shape) != spec["shape"] or str(dtype) != spec["dtype"]:
                    raise corrupt(f"array {key!r} is {dtype} {list(shape)} but the JSON declares "
                                  f"{spec['dtype']} {spec['shape']}")
                if info.file_size != inflated or (  # a zip entry's sizes are claims: checked, then bounded
                        inflated > _BOMB_BYTES and inflated > _MAX_RATIO * min(info.compress_size, len(blob))):
                    raise corrupt(f"array {key!r} inflates to {info.file_size} bytes from "
                                  f"{info.compress_size}, but the JSON declares {spec['dtype']} "
                                  f"{spec['shape']} ({inflated} bytes)")
                if dtype.hasobject:
                    raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
                data = bytearray(fh.read(nbytes))  # writable, as np.load's arrays are
                if len(data) != nbytes:
                    raise EOFError(f"array {key!r} holds {len(data)} of its {nbytes} bytes")
                flat = (np.frombuffer(data, dtype=dtype, count=math.prod(shape)) if nbytes
                        else np.empty(math.prod(shape), dtype=dtype))
                arrays[key] = (flat.reshape(shape[::-1]).transpose() if fortran_order
                               else flat.reshape(shape))
    return arrays


def load_result(path: str | Path) -> Result:
    """Read and verify a Result written by :func:`save_result` (types, shapes, checksums; no pickles).

    Parameters
    ----------
    path : str or Path
        The Result's ``.json`` file; the ``.npz`` is beside it.

    Returns
    -------
    Result
        With ``path`` set.

    Raises
    ------
    CorruptResultError, ValueError
        The files do not form a valid Result (CorruptResultError, a ValueError); the JSON cannot be read.

    Examples
    --------
    >>> import tempfile
    >>> r = Result(name="example", config={}, arrays={"x": np.arange(3)}, scalars={}, versions={},
    ...            device="cpu", wall_time=0.0, schema="1.1", config_hash="0" * 16)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     load_result(save_result(r, tmp)).arrays["x"].tolist()
    [0, 1, 2]
    """
    return _read_retrying(lambda p: _read_pair(p)[0], Path(path))


def _read_retrying(read, path: Path):
    """``read(path)``, read again while a live writer replaces the pair meanwhile."""
    for _ in range(_READ_ATTEMPTS - 1):
        before = _pair_signature(path)
        try:
            return read(path)
        except CorruptResultError:
            # a writer publishing the pair while it was read is a race, not damage: read again
            if not (_wait_for_writer(path) or _pair_signature(path) != before):
                raise
    return read(path)


def _wait_for_writer(path: Path) -> bool:
    """Wait until no writer holds the Result's lock (never created here); return whether one held it."""
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False  # free at once: no live writer
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_SH)  # blocks while a writer publishes
        return True
    except OSError:  # a file system without flock
        return False
    finally:
        os.close(fd)


def _pair_signature(path: Path) -> tuple:
    """Identity of both files (inode, size, mtime): any writer's os.replace changes it."""
    out = []
    for item in (path, path.with_suffix(".npz")):
        try:
            st = os.stat(item)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _add_checksums(path: str | Path) -> bool:
    """Record the checksums in a (verified) Result JSON written before they existed; True if changed."""
    path = Path(path)
    with _pair_lock(path):
        result, meta = _read_pair(path, legacy=True)
        if "json_sha256" in meta and "npz_sha256" in meta and all(
                "sha256" in spec for spec in meta["arrays"].values()):
            return False
        meta["npz_sha256"] = _file_digest(path.with_suffix(".npz"))
        for key, spec in meta["arrays"].items():
            spec["sha256"] = _array_digest(result.arrays[key])
        text = _signed(meta)
        tmp = _temp_write(path.parent, path.stem, ".json.tmp", lambda fh: fh.write(text))
        try:
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return True
