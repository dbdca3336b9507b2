"""What the native calls' GC pause (rust/py/gc.rs) buys: the direct call
of ``tinker_rl_data.cookbook.data_processing.assemble_training_data`` on a
batch of 64 groups x 16 trajectories of 2,000 tokens (1,000 observation,
1,000 action), with a large live heap, in the process's own collector
settings. Run it against the wheel as built and against one whose
``GcPaused::new`` does nothing, and compare the medians:

    python bench/gc_pause.py --live 3000000 --repeats 11

Prints one JSON line: the median and quartiles (ms) of the calls (the
first, which warms tinker's classes, left out), the collections by
generation that ran inside the last one, the heap's size.

On this machine (CPython 3.12.1, shared, noisy): with the pause 30-37 ms
at 0, 3 and 5 M live objects; without it 82-104 ms, with 5 young
collections inside a call and the same figure at 0 live objects: the
difference does not come from scanning the heap; with the collector on the
token reads do not share the caller's ints (they do only while no
collection, so no finalizer, can run).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time


def batch(groups: int, per_group: int, tokens: int):
    import tinker
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

    half = tokens // 2
    out = []
    for g in range(groups):
        trajs = []
        for t in range(per_group):
            base = (g * per_group + t) * 7
            ob = tinker.ModelInput.from_ints([(base + k) % 30_000 for k in range(half)])
            ac = TokensWithLogprobs(
                tokens=[(base + 3 * k) % 30_000 for k in range(half)],
                maybe_logprobs=[-0.25] * half,
                sequence_id=f"s{g}.{t}",
            )
            step = Transition(ob=ob, ac=ac, reward=0.0, episode_done=True, metrics={})
            trajs.append(Trajectory(transitions=[step], final_ob=tinker.ModelInput.empty()))
        out.append(TrajectoryGroup(trajectories_G=trajs, final_rewards_G=[1.0] * per_group, metrics_G=[{}] * per_group))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--live", type=int, default=3_000_000, help="live tracked objects kept in the heap")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--per-group", type=int, default=16)
    p.add_argument("--tokens", type=int, default=2_000)
    args = p.parse_args()

    from tinker_rl_data.cookbook.data_processing import assemble_training_data

    groups = batch(args.groups, args.per_group, args.tokens)
    advantages = [[0.5] * args.per_group for _ in groups]
    live = [[i] for i in range(args.live)]  # tracked containers: what a full collection walks
    gc.collect()

    collections = [0, 0, 0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    times = []
    inside = [0, 0, 0]
    for _ in range(args.repeats + 1):
        gc.collect()
        before = list(collections)
        gc.callbacks.append(count)
        start = time.perf_counter()
        datums, _ = assemble_training_data(groups, advantages)
        elapsed = time.perf_counter() - start
        gc.callbacks.remove(count)
        times.append(elapsed * 1e3)
        inside = [a - b for a, b in zip(collections, before)]
        del datums
    times = times[1:]  # the first warms tinker's classes up
    q = statistics.quantiles(times, n=4)
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "live": len(live),
                "objects": len(gc.get_objects()),
                "median_ms": round(statistics.median(times), 1),
                "q1_ms": round(q[0], 1),
                "q3_ms": round(q[2], 1),
                "collections_in_last_call": inside,
            }
        )
    )


if __name__ == "__main__":
    main()
