"""CPU kernel sets: make printed numbers independent of the reader's instruction set.

torch, MKL, oneDNN and NumPy choose vectorised code from the CPU, so AVX-512 and AVX2 machines round
differently in the last bits, and long training runs or fake quantisation carry that into printed digits.
The book pins **AVX2** (every x86-64 CPU since about 2015) by the variables of :data:`KERNEL_SETS`, which
each library reads once, at import: :func:`pin_cpu_kernels` runs first thing in
:func:`~companion.notebook.setup_notebook`, never overwrites a variable already set, and pins nothing
on CPUs without AVX2 or not x86-64.  ``make test-portable`` forces the other sets.
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` are deliberately left alone.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from importlib import metadata

from companion._aliases import renamed_getattr as _renamed_getattr

__all__ = ["KERNEL_SETS", "PINNED_KERNEL_SET", "kernel_environment", "pin_cpu_kernels", "check_kernels"]
__getattr__ = _renamed_getattr(__name__)  # release 0.1 names made private (companion._aliases)

#: The kernel set every stored output of the book was produced with.
PINNED_KERNEL_SET = "avx2"

# NumPy >= 2.3 dispatch targets above AVX2 (``numpy._core._multiarray_umath.__cpu_dispatch__``).
_NUMPY_AVX512_TARGETS = "X86_V4 AVX512_ICL AVX512_SPR"
_NUMPY_ALL_TARGETS = "X86_V3 " + _NUMPY_AVX512_TARGETS

#: Environment of each kernel set that ``make test-portable`` can force.  ``default`` is the
#: portable scalar/SSE code path; ``avx512`` lets every library use AVX-512 where the CPU has it.
KERNEL_SETS: dict[str, dict[str, str]] = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "NPY_DISABLE_CPU_FEATURES": _NUMPY_ALL_TARGETS},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "NPY_DISABLE_CPU_FEATURES": _NUMPY_AVX512_TARGETS},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "ALL",
               "NPY_DISABLE_CPU_FEATURES": ""},
}


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo``; None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), None)
    except OSError:
        return None


def _cpu_has_avx2() -> bool:
    """True on x86-64 Linux whose ``/proc/cpuinfo`` lists ``avx2`` and ``fma`` (else nothing is pinned)."""
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        return False
    flags = _cpu_flags()
    return flags is not None and {"avx2", "fma"} <= flags


def _numpy_supports_targets() -> bool:
    """NumPy >= 2.3 names its x86 dispatch targets X86_V3/X86_V4 (read without importing it)."""
    try:
        major, minor = (int(p) for p in metadata.version("numpy").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (2, 3)


def kernel_environment(kernel_set: str = PINNED_KERNEL_SET) -> dict[str, str]:
    """The environment variables of a kernel set, restricted to what this machine supports.

    Parameters
    ----------
    kernel_set : {"default", "avx2", "avx512"}

    Returns
    -------
    dict of str to str
        Variable name to value; without ``NPY_DISABLE_CPU_FEATURES`` for NumPy < 2.3 (which fails
        on the unknown names).

    Raises
    ------
    ValueError
        If ``kernel_set`` is not one of :data:`KERNEL_SETS`.
    """
    if kernel_set not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set {kernel_set!r}; choose one of {sorted(KERNEL_SETS)}")
    env = dict(KERNEL_SETS[kernel_set])
    if not _numpy_supports_targets():
        env.pop("NPY_DISABLE_CPU_FEATURES")
    return env


def pin_cpu_kernels(environ=None) -> dict[str, str]:
    """Pin the AVX2 kernel set for torch, MKL, oneDNN and NumPy; run it before they are imported.

    Parameters
    ----------
    environ : mapping, optional
        The environment to modify; ``os.environ`` by default.

    Returns
    -------
    dict of str to str
        The variables this call set (one already set is kept; empty if nothing was pinned).
    """
    env = os.environ if environ is None else environ
    if not _cpu_has_avx2():
        return {}
    set_now = {}
    for key, value in kernel_environment(PINNED_KERNEL_SET).items():
        if key not in env:
            env[key] = value
            set_now[key] = value
    return set_now


def _kernel_report() -> dict[str, str]:
    """The kernels in use: torch's capability, NumPy's enabled targets, the variables as set."""
    torch = sys.modules.get("torch")
    np_core = sys.modules.get("numpy._core._multiarray_umath")
    out = {"torch": torch.backends.cpu.get_cpu_capability() if torch is not None else "not imported",
           "numpy": "not imported"}
    if np_core is not None:
        feats = np_core.__cpu_features__
        out["numpy"] = " ".join(t for t in np_core.__cpu_dispatch__ if feats.get(t)) or "baseline"
    return {**out, **{key: os.environ.get(key, "") for key in KERNEL_SETS[PINNED_KERNEL_SET]}}


def check_kernels() -> bool:
    """Warn if torch or NumPy runs other kernels than the environment asks for (imported too early).

    Returns
    -------
    bool
        True if every imported library uses the kernel set named in the environment.

    Warns
    -----
    RuntimeWarning
        For each library imported too early, with what to do about it.
    """
    problems = []
    torch = sys.modules.get("torch")
    wanted = os.environ.get("ATEN_CPU_CAPABILITY")
    if torch is not None and wanted is not None:
        actual = torch.backends.cpu.get_cpu_capability()
        # torch < 2.7 reports its scalar path as "NO AVX", later versions as "DEFAULT".
        if actual.lower().replace("no avx", "default") != wanted.lower():
            problems.append(f"torch runs {actual} kernels, not ATEN_CPU_CAPABILITY={wanted}")
    np_core = sys.modules.get("numpy._core._multiarray_umath")
    disabled = os.environ.get("NPY_DISABLE_CPU_FEATURES", "").split()
    if np_core is not None:
        still_on = [t for t in disabled if np_core.__cpu_features__.get(t)]
        if still_on:
            problems.append(f"NumPy dispatches to {' '.join(still_on)}, which "
                            "NPY_DISABLE_CPU_FEATURES disables")
    if not problems:
        return True
    warnings.warn(
        "; ".join(problems) + ": the library was imported before companion.setup_notebook(), "
        "so printed digits may differ from the book's stored outputs. Restart the kernel and run "
        "`import companion; companion.setup_notebook()` before importing torch or NumPy, or start "
        "Python with the variables of companion.determinism.kernel_environment() set.",
        RuntimeWarning, stacklevel=3)
    return False


def _available_kernel_sets() -> list[str]:
    """The kernel sets this CPU can run, lowest first: ``default`` always, ``avx2``, ``avx512``."""
    out = ["default"]
    if _cpu_has_avx2():
        out.append("avx2")
        flags = _cpu_flags() or set()
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            out.append("avx512")
    return out


def _main(argv: list[str]) -> int:
    """``python -m companion.determinism available | env SET | run SET -- COMMAND`` (SET forced)."""
    if argv == ["available"]:
        print(" ".join(_available_kernel_sets()))
        return 0
    if (len(argv) >= 4 and argv[0] == "run" and argv[2] == "--") or (len(argv) == 2 and argv[0] == "env"):
        try:
            env = kernel_environment(argv[1])
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        if argv[0] == "run":
            os.execvpe(argv[3], argv[3:], {**os.environ, **env})
        print(" ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in env.items()))
        return 0
    print("usage: python -m companion.determinism available | env SET | run SET -- COMMAND...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
