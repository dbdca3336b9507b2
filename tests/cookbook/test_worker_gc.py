"""The collector in a rollout worker (tinker_rl_data.cookbook.workers with
the gc pieces): each group rollout is a step, held to the policy while it
runs and released after it, so the worker's other code between rollouts
(sync code, another task a reused Ray worker runs) has the program's own
collector; with the gc pieces skipped (TINKER_RL_DATA_SKIP=gc), no
collector at all. The worker's code path (`run_rollout` with the driver's
settings, as a spawned worker runs it) in a fresh interpreter, with a
stand-in rollout (~10 s each: the interpreter imports tinker and the
cookbook)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook.rl.rollouts  # noqa: F401
except ImportError as exc:
    cookbook_unavailable(exc)

from tinker_rl_data.cookbook import gc_step as _gc_step

WORKER = textwrap.dedent(
    """
    import asyncio, collections, gc, json, os, sys
    import tinker_cookbook.rl.rollouts as rollouts
    from tinker_rl_data.cookbook import gc_step as _gc_step, workers as _workers

    class Node:
        pass

    def churn(n):
        # short-lived cycles that outlive a few young collections: only a
        # collection of the older generations frees them
        window = collections.deque(maxlen=5_000)
        for _ in range(n):
            a, b = Node(), Node()
            a.other, b.other = b, a
            window.append(a)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    inside = []

    def rollout(task):  # stands for the cookbook's _run_rollout_sync
        async def group():
            # what the program sees, and what CPython collects by
            inside.append([gc.get_threshold(), _gc_step.collector_thresholds()])
            churn(20_000)
            return task
        return asyncio.run(group())

    rollouts._run_rollout_sync = rollout
    # the driver's switches as it resolved them (they win over the worker's own)
    skip = tuple(name for name in sys.argv[2].split(",") if name)
    settings = _workers.Settings(("gc",), False, skip=skip, driver=("another-host", 1, "x"))
    gc.set_threshold(700, 10, 10)
    between = []
    for task in range(3):
        _workers.run_rollout(settings, task)
        before, rss_before = [g["collections"] for g in gc.get_stats()], rss()
        churn(int(sys.argv[1]))
        after = [g["collections"] for g in gc.get_stats()]
        between.append({
            "threshold": gc.get_threshold(),
            "ours": [cb for cb in gc.callbacks if "tinker_rl_data" in getattr(cb, "__module__", "")
                     or "StepCollector" in repr(cb)] != [],
            "collections": [b - a for a, b in zip(before, after)],
            "rss_growth": rss() - rss_before,
            "frozen": gc.get_freeze_count(),
        })
    state = _workers._worker
    collector = state.parts["gc"].collector if "gc" in state.parts else None
    print(json.dumps({
        "inside": inside, "between": between, "collector": collector is not None,
        "steps": collector.stats.steps if collector else 0,
        "step_collections": collector.stats.step_collections if collector else 0,
        "froze": collector.stats.froze if collector else 0,
        "installed": state.installed,
    }))
    """
)

CYCLES = 600_000
MiB = 2**20


def run_worker(skip: str = "") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(CYCLES), skip], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_worker_s_collector_is_held_to_each_rollout_only():
    out = run_worker()
    held = [700, 10, _gc_step._NEVER]  # the young generations as the program's, the oldest held
    # the program sees its own thresholds, never the policy's
    assert out["collector"] and out["inside"] == [[[700, 10, 10], held]] * 3
    assert out["steps"] == out["step_collections"] == 3  # one full collection per rollout
    for between in out["between"]:
        # the program's collector between rollouts: its own older collections run
        assert between["threshold"] == [700, 10, 10] and not between["ours"], between
        assert between["collections"][1] > 0 and between["collections"][2] > 0, between
        assert between["rss_growth"] < 64 * MiB, between
        # the first rollout's freeze (at its end) of the worker's imports stays
        assert between["frozen"] > out["froze"] * 0.9 > 0


def test_skip_gc_leaves_the_worker_s_collector_alone():
    out = run_worker(skip="gc")  # the driver had TINKER_RL_DATA_SKIP=gc
    assert not out["collector"] and out["installed"] == []
    assert out["inside"] == [[[700, 10, 10]] * 2] * 3
    for between in out["between"]:
        assert between["threshold"] == [700, 10, 10] and between["frozen"] < 4096
