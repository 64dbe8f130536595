"""Measure how far the stored TinyLM training runs move between CPU kernel sets.

Retrains the depth-2 models of ``framework_tiny_lms`` (the ones the test suite retrains) under
every kernel set this CPU has, each in its own process, and prints the largest difference of the
training losses and of the float16-rounded weights from the stored ones and between kernel sets.
The tolerances of ``tests/test_experiments_framework.py::test_stored_weights_are_reproduced_by_training``
are derived from these numbers.  Run: ``.venv/bin/python tests/portability/training_spread.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, numpy as np, torch
import companion.experiments.framework_trained as xf
torch.set_num_threads(1); torch.use_deterministic_algorithms(True)
out = {}
cfg = xf.TrainedWindowsConfig(**eval(sys.argv[2]))
for placement in ("pre", "post"):
    key = (placement, 32, 2)
    model, losses = xf.train_models(cfg, only=[key])[key]
    out[placement + "/losses"] = np.asarray(losses)
    for name, t in model.state_dict().items():
        out[placement + "/" + name] = t.half().float().numpy()
out["capability"] = np.array(torch.backends.cpu.get_cpu_capability())
np.savez(sys.argv[1], **out)
"""


def _train(kernel_set: str, path: Path, overrides: str = "{}") -> dict:
    subprocess.run([sys.executable, "-m", "companion.determinism", "run", kernel_set, "--",
                    sys.executable, "-c", CHILD, str(path), overrides], check=True, cwd=ROOT)
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _distances(run: dict, stored: dict) -> tuple[float, float]:
    """Largest |loss difference| and largest relative distance ||w - w_stored|| / ||w_stored||
    of all weights of a model (the vector of every parameter)."""
    dl, dw = 0.0, 0.0
    for placement in ("pre", "post"):
        model, losses = stored[(placement, 32, 2)]
        dl = max(dl, float(np.abs(run[placement + "/losses"] - np.asarray(losses)).max()))
        sd = model.state_dict()
        diff = sum(float(((run[placement + "/" + n] - t.numpy()) ** 2).sum()) for n, t in sd.items())
        norm = sum(float((t.numpy() ** 2).sum()) for t in sd.values())
        dw = max(dw, float(np.sqrt(diff / norm)))
    return dl, dw


def main() -> None:
    from companion.determinism import _available_kernel_sets
    import companion.experiments.framework_trained as xf

    stored = xf.load_models()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {ks: _train(ks, Path(tmp) / f"{ks}.npz") for ks in _available_kernel_sets()}
        other = _train("avx2", Path(tmp) / "seed1.npz", "{'seed': 1}")
        other_lr = _train("avx2", Path(tmp) / "lr.npz", "{'lr': 2.9e-3}")
    print("largest |loss difference| and relative distance of all weights, "
          "from the stored depth-2 models (float16 weights):")
    for ks, run in runs.items():
        dl, dw = _distances(run, stored)
        print(f"  kernel set {ks:>7} ({run['capability']}): loss {dl:.2e}, weights {dw:.2e}")
    for label, run in (("seed 1 instead of 0", other), ("lr 2.9e-3 instead of 3e-3", other_lr)):
        dl, dw = _distances(run, stored)
        print(f"  another configuration ({label}): loss {dl:.2e}, weights {dw:.2e}")


if __name__ == "__main__":
    main()
