"""The native compute_trajectory_metrics alone, for instruction counts:
one bench/step.py-style batch (two metrics per transition, the workload's
tags), the call made --calls times.

    valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect='*py_trajectory_metrics*' \
        python bench/callgrind_metrics.py --workload single_turn_long --calls 5

Instructions per call: the total over the toggled function / --calls.
Without valgrind it prints the median wall time per call instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from step import cookbook_batch  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="single_turn_long")
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()

    from tinker_rl_data import _core
    from tinker_rl_data.cookbook import step as _step

    _, cb, taglist = cookbook_batch(args.workload)
    call_args = (cb, taglist, _step._own_total_rewards())
    times = []
    for _ in range(args.calls):
        t = time.perf_counter()
        _core.trajectory_metrics(*call_args)
        times.append(time.perf_counter() - t)
    print(f"{args.workload}: {args.calls} calls, median {statistics.median(times) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
