"""The whole pipeline on a synthetic rollout batch: advantages, Datums,
metrics, timed against the plain-Python reference of SPEC.md.

    python bench/demo.py [workload]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

import reference  # noqa: E402
import tinker_rl_data as trd  # noqa: E402
from workloads import WORKLOADS, positions  # noqa: E402


def pipeline(module, groups):
    advantages = module.compute_advantages(groups)
    datums, metadata = module.assemble_training_data(groups, advantages)
    return datums, metadata, module.compute_trajectory_metrics(groups)


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "single_turn_long"
    groups = WORKLOADS[name].build()
    n_pos, n_datums = positions(groups)
    pipeline(trd, groups)  # warm-up
    t0 = time.perf_counter()
    datums, metadata, metrics = pipeline(trd, groups)
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipeline(reference, groups)
    theirs = time.perf_counter() - t0
    print(f"workload {name}: {len(datums)} datums ({n_datums} expected), {n_pos:,} positions")
    for key, value in metrics.items():
        print(f"  {key} = {value:g}")
    print(f"tinker_rl_data {ours * 1e3:8.1f} ms  ({ours / n_pos * 1e9:.1f} ns/position)")
    print(f"reference      {theirs * 1e3:8.1f} ms  ({theirs / n_pos * 1e9:.1f} ns/position)")
    print(f"speed-up       {theirs / ours:8.1f}x")


if __name__ == "__main__":
    main()
