"""Benchmark: streamed ``companion.theory.exceedance.simulate_counts`` against a one-shot NumPy count.

Run ``python benchmarks/bench_simulate_counts.py`` (``make benchmarks`` runs it too).  In one run it

1. times both implementations of the same count, :math:`\\#\\{i \\le N : |\\mu + \\sigma G_i| > t\\}`,
   at ``N = 2e7`` (where the one-shot version still fits in memory), interleaving the two
   and keeping the best of several repeats, and prints draws per second and their ratio;
2. measures the peak memory of ``simulate_counts`` at ``N = 2e8`` in a fresh subprocess, with
   ``tracemalloc`` (NumPy reports its buffers to it) and the peak resident set size, and the one-shot
   version's peak at ``2e7`` for comparison (peak RSS is the process's ``VmHWM``);
3. prints draws per second of ``simulate_counts`` for every noise law and for many thresholds.

Options: ``--quick`` (smaller sizes, for a smoke test), ``--repeats R``.
Exit status 1 if the peak memory at ``N = 2e8`` is 800 MB or more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402

from companion.theory.exceedance import simulate_counts  # noqa: E402

MU, T, SIGMA = 0.5, 2.0, 1.0
MEMORY_LIMIT_MB = 800.0


def one_shot_count(N: int, mu: float, t: float, sigma: float, rng: np.random.Generator) -> int:
    """The plain NumPy version: draw all N values at once, form |X|, compare, count."""
    x = mu + sigma * rng.standard_normal(N)
    return int(np.count_nonzero(np.abs(x) > t))


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def speed_comparison(N: int, repeats: int) -> dict:
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(2)
    times = {"simulate_counts": float("inf"), "one_shot": float("inf")}
    counts = {}
    for _ in range(repeats):  # interleave so both see the same machine load
        t0 = time.perf_counter()
        counts["simulate_counts"] = simulate_counts(N, MU, T, SIGMA, rng=rng_a)
        times["simulate_counts"] = min(times["simulate_counts"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        counts["one_shot"] = one_shot_count(N, MU, T, SIGMA, rng_b)
        times["one_shot"] = min(times["one_shot"], time.perf_counter() - t0)
    # both are draws of the same Binomial(N, p): they must agree to a few standard deviations
    from companion.theory.exceedance import exceedance_probability_gaussian

    p = exceedance_probability_gaussian(MU, T, SIGMA)
    sd = (N * p * (1 - p)) ** 0.5
    for name, c in counts.items():
        assert abs(c - N * p) < 6 * sd, (name, c, N * p)
    return {name: N / s for name, s in times.items()}


_CHILD = r"""
import json, resource, sys, time, tracemalloc
import numpy as np
from companion.theory.exceedance import simulate_counts

def peak_rss_mb():
    # VmHWM is this process's own high-water mark; ru_maxrss can inherit the parent's peak at fork
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

N, how = int(sys.argv[1]), sys.argv[2]
base = peak_rss_mb()
tracemalloc.start()
t0 = time.perf_counter()
if how == "stream":
    c = simulate_counts(N, 0.5, 2.0, 1.0, rng=3)
else:
    x = 0.5 + 1.0 * np.random.default_rng(3).standard_normal(N)
    c = int(np.count_nonzero(np.abs(x) > 2.0))
wall = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps({"count": int(c), "tracemalloc_peak_mb": peak / 1e6,
                  "maxrss_mb": peak_rss_mb(), "maxrss_before_mb": base, "wall_s": wall}))
"""


def peak_memory(N: int, how: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(N), how], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def laws_table(N: int, repeats: int) -> list[tuple[str, float]]:
    rows = []
    for noise in ("gaussian", "uniform", "rademacher", "laplace"):
        rng = np.random.default_rng(4)
        s = best_time(lambda: simulate_counts(N, MU, T, SIGMA, noise=noise, rng=rng), repeats)
        rows.append((noise, N / s))
    grid = np.linspace(0.0, 5.0, 64)
    rng = np.random.default_rng(5)
    s = best_time(lambda: simulate_counts(N, MU, grid, SIGMA, rng=rng), repeats)
    rows.append(("gaussian, 64 thresholds", N / s))
    rng = np.random.default_rng(6)
    mus = np.linspace(0.0, 4.0, N // 100)
    s = best_time(lambda: simulate_counts(100, mus, T, SIGMA, rng=rng), repeats)
    rows.append((f"gaussian, {mus.size} channels x 100 rows", N / s))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    n_speed = 2 * 10**6 if args.quick else 2 * 10**7
    n_memory = 2 * 10**7 if args.quick else 2 * 10**8

    stream = peak_memory(n_memory, "stream")  # in fresh subprocesses, before this process grows
    shot = peak_memory(n_speed, "oneshot")
    rates = speed_comparison(n_speed, args.repeats)
    ratio = rates["simulate_counts"] / rates["one_shot"]
    print(f"count of |0.5 + G| > 2 over N = {n_speed:.0e} Gaussian draws (best of {args.repeats})")
    print(f"  simulate_counts (streamed, float32) : {rates['simulate_counts'] / 1e6:8.1f} M draws/s")
    print(f"  one-shot numpy (float64, all at once): {rates['one_shot'] / 1e6:8.1f} M draws/s")
    print(f"  ratio streamed / one-shot            : {ratio:8.2f}x")

    print(f"peak memory, simulate_counts at N = {n_memory:.0e}: tracemalloc {stream['tracemalloc_peak_mb']:.2f} MB, "
          f"process peak RSS {stream['maxrss_mb']:.0f} MB (of which {stream['maxrss_before_mb']:.0f} MB before the call), "
          f"{n_memory / stream['wall_s'] / 1e6:.1f} M draws/s")
    print(f"peak memory, one-shot at N = {n_speed:.0e}: tracemalloc {shot['tracemalloc_peak_mb']:.0f} MB, "
          f"process peak RSS {shot['maxrss_mb']:.0f} MB "
          f"(linear in N: about {shot['tracemalloc_peak_mb'] * n_memory / n_speed / 1e3:.1f} GB at N = {n_memory:.0e})")

    print(f"simulate_counts throughput by case (N = {n_speed:.0e})")
    for name, rate in laws_table(n_speed, args.repeats):
        print(f"  {name:36s}: {rate / 1e6:8.1f} M draws/s")

    ok = stream["maxrss_mb"] < MEMORY_LIMIT_MB
    print(f"memory budget {MEMORY_LIMIT_MB:.0f} MB at N = {n_memory:.0e}: {'met' if ok else 'EXCEEDED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
