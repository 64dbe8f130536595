#!/usr/bin/env python3
"""Run the depth study at GPU size and write its Result under ``$OUT`` (``make gpu-results``).

Needs only this repository (the corpus is ``companion/data/corpus``, tracked) and PyTorch; no
network, no model packages.  Usage::

    python scripts/gpu_depth_study.py                       # GPU_CONFIG on cuda, into $OUT
    python scripts/gpu_depth_study.py --tiny --device cpu --out /tmp/x   # seconds (the test)
    python scripts/gpu_depth_study.py --set steps=500       # any DepthStudy field
    python scripts/gpu_depth_study.py --family              # the family at GPU size, member by member
    python scripts/gpu_depth_study.py --family --depths 32,64 --seeds 0,1   # part of it (resumable)

``--family`` trains the depth family of the chapter (``ds.run_family``) at ``ds.GPU_MEMBER`` size:
width 128, 4000 steps of 32 x 128 bytes, depths ``ds.GPU_DEPTHS``, seeds ``ds.GPU_SEEDS``, every
placement; each member is its own Result under ``$OUT/depth_study/depth_member/``, and a rerun
skips the members already there.  ``--set`` then changes ``DepthMember`` fields.

Sizing (from the stored CPU-size run, float64, one core of a shared 2-core machine; printed in
the chapter *The depth study*, section 6): training took 46 min of wall time for 372 layers x 300
steps, 25 ms per layer-step of wall time, about 7.5 ms of CPU time (the run had ~30% of a core),
for 3 * 512 * (24 * 32**2 + 2 * 64 * 32) ~ 44 MFLOP per layer-step: ~2-6 GFLOP/s.  GPU_CONFIG
(width 128, 32 x 128 bytes per step, 1000 steps) costs 3 * 4096 * (24 * 128**2 + 2 * 128 * 128)
~ 5.2 GFLOP per layer-step, and the family has 3 * (4 + 8 + 16 + 32 + 64) = 372 layers: 372 *
1000 * 5.2 GFLOP ~ 1.9 PFLOP, i.e. ~3 min at an effective 12 TFLOP/s (float32 without tensor cores on an
H100/H200, 20% of peak for these small matrices).  At this width a step is also bounded below
by kernel launches (~45 launches per sublayer forward and backward, ~8 us each): 372 * 1000 *
2 * 45 * 8 us ~ 4.5 min.  The measurements (forward passes only) add ~1 min: about 8 minutes in
all.  If the first members show a much slower rate, rerun with ``--set steps=500``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, without installing

import numpy as np  # noqa: E402

from companion import experiments as xp  # noqa: E402
from companion.experiments import depth_study as ds  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default: $OUT)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-sized config (tests)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--family", action="store_true", help="the depth family (ds.run_family), GPU size")
    parser.add_argument("--depths", help="family depths, comma-separated (default ds.GPU_DEPTHS)")
    parser.add_argument("--seeds", help="family seeds, comma-separated (default ds.GPU_SEEDS)")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("give --out or set $OUT")
    if (args.depths or args.seeds) and not args.family:
        parser.error("--depths and --seeds belong to --family")
    if args.family:
        return _family(args)
    config = _with_overrides(ds.tiny() if args.tiny else ds.GPU_CONFIG, args.overrides)
    start = time.time()
    result = xp.run(config, device=args.device)
    path = xp.save_result(result, args.out)
    a = result.arrays
    summary = {"path": str(path), "device": result.device, "wall_time": round(time.time() - start, 1),
               "eval_loss": np.round(a["eval_loss"], 3).tolist(),
               "window_first": np.round(a["window"][:, :, 0, 0], 3).tolist(),
               "train_seconds": np.round(a["train_seconds"], 1).tolist()}
    print(json.dumps(summary, indent=1))
    return 0


def _with_overrides(config, overrides):
    """``config`` with the ``KEY=VALUE`` strings of ``--set`` applied (typed by the config's fields)."""
    if not overrides:
        return config
    pairs = dict(item.split("=", 1) for item in overrides)
    current = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return xp.make_config(type(config), {**current, **pairs})


def _ints(text, name):
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"--{name} must be comma-separated integers, got {text!r}") from None
    return values


def _family(args) -> int:
    base = ds.GPU_MEMBER
    depths, seeds = ds.GPU_DEPTHS, ds.GPU_SEEDS
    if args.tiny:   # seconds on a CPU (the test)
        base = dataclasses.replace(base, d_model=8, n_heads=2, steps=6, batch_size=2, seq_len=16, warmup=2,
                                   n_eval=4, n_prompts=4, span=2, n_read=2, context=2, n_targets=2, n_null=3,
                                   n_outlier_prompts=2, n_checkpoints=2)
        depths, seeds = (2,), (0,)
    base = _with_overrides(base, args.overrides)
    depths = _ints(args.depths, "depths") if args.depths else depths
    seeds = _ints(args.seeds, "seeds") if args.seeds else seeds
    start = time.time()
    fam = ds.run_family(ds.MEMBER_PLACEMENTS, depths, seeds, base=base, device=args.device,
                        results_dir=Path(args.out) / "depth_study")
    summary = {"members": len(fam), "wall_time": round(time.time() - start, 1),
               "devices": sorted({r.device for r in fam.values()}),
               "heldout_loss": {f"{p} L={d} seed={s}": round(r.scalars["heldout_loss"], 3)
                                for (p, d, s), r in fam.items()},
               "paths": sorted(str(r.path) for r in fam.values())}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
