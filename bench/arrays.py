"""Rollouts as arrays (issue 20): the same batch given as lists of Python
ints and floats, and as int32 / float32 numpy arrays (what tinker's sampler
returns as ``SampledSequence.tokens_np`` / ``logprobs_np``), through the
same call, against the floor of touching that input once
(``np.concatenate`` of the input arrays).

    python bench/arrays.py [--repeats N] [--workload NAME ...] [--list-model-input]

Per workload, interleaved in one process (GC enabled), median of --repeats:
``assemble_training_data(..., model_input_tokens="numpy")`` on lists, the
same on arrays, the arrays turned into lists first (what reading
``SampledSequence.tokens`` / ``.logprobs`` does) and then the call on
lists, and the floor; then the ratios the issue sets targets for.
``--list-model-input`` adds the default list model input on each input.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import numpy as np  # noqa: E402

import tinker_rl_data as trd  # noqa: E402
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def as_arrays(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The batch with every token and logprob sequence an int32 / float32 array."""
    return [
        TrajectoryGroup(
            [
                Trajectory(
                    [
                        Turn(
                            np.array(u.prompt_tokens, dtype=np.int32),
                            np.array(u.completion_tokens, dtype=np.int32),
                            np.array(u.logprobs, dtype=np.float32),
                        )
                        for u in t.turns
                    ],
                    t.reward,
                )
                for t in g.trajectories
            ],
            g.tags,
        )
        for g in groups
    ]


def to_lists(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """What reading ``SampledSequence.tokens`` / ``.logprobs`` does: every
    array turned into a list (``.tolist()``)."""
    return [
        TrajectoryGroup(
            [
                Trajectory(
                    [Turn(u.prompt_tokens.tolist(), u.completion_tokens.tolist(), u.logprobs.tolist()) for u in t.turns],
                    t.reward,
                )
                for t in g.trajectories
            ],
            g.tags,
        )
        for g in groups
    ]


def floor(groups: list[TrajectoryGroup]) -> int:
    """Touches every input array once."""
    tokens = [a for g in groups for t in g.trajectories for u in t.turns for a in (u.prompt_tokens, u.completion_tokens)]
    logprobs = [u.logprobs for g in groups for t in g.trajectories for u in t.turns]
    return len(np.concatenate(tokens)) + len(np.concatenate(logprobs))


def interleaved(calls: dict[str, object], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for name, call in calls.items():  # warm-up
        call()  # type: ignore[operator]
    for _ in range(repeats):
        for name, call in calls.items():
            gc.collect()
            start = time.perf_counter()
            result = call()  # type: ignore[operator]
            times[name].append(time.perf_counter() - start)
            del result
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--list-model-input", action="store_true")
    args = parser.parse_args()
    print(f"tinker_rl_data {trd.__version__}; median of {args.repeats}, interleaved, GC enabled\n")
    header = (
        "| workload | lists, numpy model input | arrays, same call | arrays via .tolist(), then lists "
        "| floor: np.concatenate | arrays / floor | arrays / lists | arrays / via .tolist() |"
    )
    print(header)
    print("| --- " * 8 + "|")
    extra = []
    for name in args.workload or list(WORKLOADS):
        lists = WORKLOADS[name].build()
        arrays = as_arrays(lists)
        advantages = trd.compute_advantages(lists)
        calls = {
            "lists": lambda: trd.assemble_training_data(lists, advantages, model_input_tokens="numpy"),
            "arrays": lambda: trd.assemble_training_data(arrays, advantages, model_input_tokens="numpy"),
            "via tolist": lambda: trd.assemble_training_data(to_lists(arrays), advantages, model_input_tokens="numpy"),
            "floor": lambda: floor(arrays),
        }
        if args.list_model_input:
            calls["lists, list model input"] = lambda: trd.assemble_training_data(lists, advantages)
            calls["arrays, list model input"] = lambda: trd.assemble_training_data(arrays, advantages)
            calls["via tolist, list model input"] = lambda: trd.assemble_training_data(to_lists(arrays), advantages)
        t = interleaved(calls, args.repeats)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(
            f"| {name} | {ms['lists']:.1f} ms | {ms['arrays']:.1f} ms | {ms['via tolist']:.1f} ms | {ms['floor']:.1f} ms "
            f"| {t['arrays'] / t['floor']:.2f}x | {t['arrays'] / t['lists']:.2f}x | {t['arrays'] / t['via tolist']:.2f}x |"
        )
        if args.list_model_input:
            extra.append(
                f"| {name} | {ms['lists, list model input']:.1f} ms | {ms['arrays, list model input']:.1f} ms "
                f"| {ms['via tolist, list model input']:.1f} ms "
                f"| {t['arrays, list model input'] / t['lists, list model input']:.2f}x "
                f"| {t['arrays, list model input'] / t['via tolist, list model input']:.2f}x |"
            )
    if extra:
        print("\nList model input (the default):\n")
        print(
            "| workload | lists | arrays | arrays via .tolist(), then lists | arrays / lists | arrays / via .tolist() |\n"
            + "| --- " * 6
            + "|"
        )
        print("\n".join(extra))


if __name__ == "__main__":
    main()
