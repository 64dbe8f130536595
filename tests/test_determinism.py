"""CPU kernel pinning (companion.determinism): what is set, what is kept, what is reported."""

import os
import subprocess
import sys

import pytest
import torch

from companion import determinism as det


def test_kernel_environment_of_each_set():
    for name in det.KERNEL_SETS:
        env = det.kernel_environment(name)
        assert env["ATEN_CPU_CAPABILITY"] == name
        assert set(env) <= set(det.KERNEL_SETS[name])
    assert "X86_V4" in det.kernel_environment("avx2").get("NPY_DISABLE_CPU_FEATURES", "X86_V4")
    with pytest.raises(ValueError, match="unknown kernel set 'avx1024'"):
        det.kernel_environment("avx1024")


def test_pin_sets_missing_variables_and_keeps_forced_ones():
    env = {"ATEN_CPU_CAPABILITY": "default"}
    set_now = det.pin_cpu_kernels(env)
    if not det._cpu_has_avx2():
        assert set_now == {} and env == {"ATEN_CPU_CAPABILITY": "default"}
        return
    assert env["ATEN_CPU_CAPABILITY"] == "default"            # a forced kernel set wins
    assert "ATEN_CPU_CAPABILITY" not in set_now
    assert env["MKL_CBWR"] == "AVX2" and set_now["MKL_CBWR"] == "AVX2"
    assert det.pin_cpu_kernels(env) == {}                      # idempotent


def test_test_process_runs_the_kernels_its_environment_names():
    """The top-level conftest.py pinned the kernel set before torch was imported."""
    wanted = os.environ.get("ATEN_CPU_CAPABILITY")
    if wanted is None:
        pytest.skip("no kernel set pinned on this CPU")
    assert torch.backends.cpu.get_cpu_capability().lower() == wanted.lower()
    assert det.check_kernels()
    report = det._kernel_report()
    assert report["torch"].lower() == wanted.lower()


def test_check_kernels_warns_when_torch_runs_other_kernels(monkeypatch):
    actual = torch.backends.cpu.get_cpu_capability()
    other = "default" if actual != "DEFAULT" else "avx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", other)
    with pytest.warns(RuntimeWarning, match="setup_notebook"):
        assert det.check_kernels() is False


def test_available_kernel_sets_start_with_default():
    sets = det._available_kernel_sets()
    assert sets[0] == "default" and set(sets) <= set(det.KERNEL_SETS)


@pytest.mark.skipif(not det._cpu_has_avx2(), reason="kernel sets are pinned only on AVX2 CPUs")
def test_cli_runs_a_command_under_a_forced_kernel_set():
    code = ("import torch, numpy; from companion.determinism import _kernel_report as r; "
            "print(r()['torch'], r()['numpy'], sep='|')")
    out = subprocess.run([sys.executable, "-m", "companion.determinism", "run", "default", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, check=True)
    torch_caps, numpy_targets = out.stdout.strip().split("|")
    assert torch_caps in {"DEFAULT", "NO AVX"}      # torch < 2.7 calls the scalar path "NO AVX"
    if det._numpy_supports_targets():   # NumPy < 2.3 cannot switch its AVX2/AVX-512 targets off
        assert numpy_targets == "baseline"
    bad = subprocess.run([sys.executable, "-m", "companion.determinism", "run", "avx9", "--", "true"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown kernel set" in bad.stderr
    usage = subprocess.run([sys.executable, "-m", "companion.determinism"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_setup_notebook_pins_before_numpy_in_a_fresh_process():
    code = ("import sys, companion; assert 'numpy' not in sys.modules; "
            "companion.setup_notebook(); import torch, os; "
            "print(os.environ.get('ATEN_CPU_CAPABILITY'), torch.backends.cpu.get_cpu_capability())")
    env = {k: v for k, v in os.environ.items() if k not in det.KERNEL_SETS["avx2"]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    if det._cpu_has_avx2():
        assert out.stdout.split() == ["avx2", "AVX2"]


def test_setup_notebook_warns_if_numpy_came_first():
    # Only the kernel warning is turned into an error: older matplotlib/pyparsing pairs emit
    # unrelated DeprecationWarnings on import.
    code = ("import numpy, warnings, companion; "
            "warnings.filterwarnings('error', category=RuntimeWarning); "
            "companion.setup_notebook()")
    env = {k: v for k, v in os.environ.items() if k not in det.KERNEL_SETS["avx2"]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    flags = det._cpu_flags() or set()
    # NumPy < 2.3 is not pinned (it has no names for its AVX-512 targets), so nothing to warn about.
    if det._cpu_has_avx2() and "avx512f" in flags and det._numpy_supports_targets():
        assert out.returncode != 0 and "imported before companion.setup_notebook()" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
