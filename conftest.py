"""Loaded by pytest before any test module, plugin import of numpy or nbval kernel start.

Pins the CPU kernel set (AVX2 for torch, MKL, oneDNN and NumPy) in this process's environment,
which the nbval kernels inherit, so that the tests and the chapters compute the same digits on
AVX2 and AVX-512 machines.  A kernel set forced from outside (``make test-portable``) is kept.
See :mod:`companion.determinism`.
"""

import sys

from companion.determinism import pin_cpu_kernels

_set_now = pin_cpu_kernels()
if _set_now and "numpy" in sys.modules:  # pragma: no cover - a plugin imported numpy first
    raise RuntimeError(
        "numpy or torch was imported before the root conftest.py could pin the CPU kernel set; "
        "run the tests through `make test`, which exports the variables, or remove the plugin "
        "that imports them"
    )
