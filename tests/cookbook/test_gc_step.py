"""The collector held to the trainer's step (tinker_rl_data.cookbook.gc_step), on
stand-in loop and step functions: the policy while the loop runs, one full
collection per step, the guard, and the collector's state put back after
the loop returns, raises, or restore()."""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import subprocess
import sys
import textwrap
import types
import warnings
import weakref
from typing import Any, Callable

import pytest

from tinker_rl_data.cookbook import gc_step as _gc_step
from tinker_rl_data.cookbook.gc_step import LOOP_FUNCTIONS, STEP_FUNCTIONS, StepCollector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


# CPython 3.12's collections move the immortal objects they meet into the
# frozen generation: how many that is here, with nothing frozen by a program.
gc.unfreeze()
gc.collect()
IMMORTAL_FROZEN = gc.get_freeze_count()


def frozen_by_program() -> int:
    """Objects frozen by gc.freeze(), not by the interpreter (after a
    collection, which puts 3.12's immortal objects in the frozen count)."""
    gc.collect()
    return gc.get_freeze_count() - IMMORTAL_FROZEN


@pytest.fixture(autouse=True)
def collector_state():
    before = (gc.isenabled(), gc.get_threshold(), frozen_by_program(), list(gc.callbacks))
    yield
    after = (gc.isenabled(), gc.get_threshold(), frozen_by_program(), list(gc.callbacks))
    gc.enable()
    gc.unfreeze()
    assert after == before, "the collector's state was not put back"


def fake_train_module(collector: StepCollector, steps: int, fail_at: int | None = None):
    """A module with rl.train's loop and step names, the step recording what
    the collector looked like inside it."""
    seen: list[dict] = []
    module = types.SimpleNamespace()

    async def step(i):
        seen.append({"threshold": gc.get_threshold(), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()})
        seen[-1]["garbage"] = cycle()
        if i == fail_at:
            raise RuntimeError("step failed")
        return i

    async def loop(**kwargs):
        for i in range(steps):
            await module.do_train_step_and_get_sampling_client(i)
            # the cycle made in the step was collected at its end
            seen[-1]["after_step"] = seen[-1]["garbage"]() is None

    for name in LOOP_FUNCTIONS:
        setattr(module, name, loop)
    for name in STEP_FUNCTIONS:
        setattr(module, name, step)
    return module, seen


def held(collector: StepCollector, module: Any) -> Callable[[], None]:
    """``module``'s loop and step functions wrapped by ``collector``, as
    install() wraps the cookbook's; returns what puts them back."""
    originals = dict(vars(module))
    for _, name, make in collector.pieces():
        setattr(module, name, make(originals[name]))

    def undo() -> None:
        vars(module).update(originals)
        collector.restore()

    return undo


def test_pieces_name_every_boundary():
    collector = StepCollector()
    names = {(module, name) for module, name, _ in collector.pieces()}
    assert names == {("tinker_cookbook.rl.train", n) for n in LOOP_FUNCTIONS + STEP_FUNCTIONS}
    with pytest.raises(KeyError):
        collector.make_wrapper("main")


@pytest.mark.parametrize("loop_name", LOOP_FUNCTIONS)
def test_policy_while_the_loop_runs(loop_name):
    collector = StepCollector(young=12_345)
    module, seen = fake_train_module(collector, steps=3)
    gc.set_threshold(700, 10, 10)
    undo = held(collector, module)
    assert getattr(module, loop_name).__wrapped__ is not None
    asyncio.run(getattr(module, loop_name)())
    undo()
    assert len(seen) == 3
    for s in seen:
        assert s["threshold"] == (12_345, _gc_step._NEVER, _gc_step._NEVER)
        assert s["enabled"] and s["frozen"] > IMMORTAL_FROZEN
        assert s["after_step"]
    assert collector.stats.steps == 3 and collector.stats.step_collections == 3
    assert gc.get_threshold() == (700, 10, 10) and frozen_by_program() == 0
    gc.set_threshold(*_default_thresholds)


_default_thresholds = gc.get_threshold()


def test_state_put_back_after_an_exception():
    collector = StepCollector()
    module, seen = fake_train_module(collector, steps=3, fail_at=1)
    undo = held(collector, module)
    with pytest.raises(RuntimeError, match="step failed"):
        asyncio.run(module.do_sync_training())
    assert not collector.active
    assert gc.get_threshold() == _default_thresholds and gc.isenabled() and frozen_by_program() == 0
    undo()


def test_a_loop_whose_start_raises_leaves_the_collector_as_it_was(monkeypatch):
    # pytest's filterwarnings=error (or -W error) with a malformed variable:
    # the headroom's warning raises inside the loop's start.
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "lots")
    collector = _gc_step.COLLECTOR
    module, seen = fake_train_module(collector, steps=2)
    undo = held(collector, module)
    gc.set_threshold(700, 10, 10)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UserWarning, match=_gc_step.HEADROOM_ENV):
                asyncio.run(module.do_sync_training())
        assert seen == [] and not collector.active
        assert gc.get_threshold() == (700, 10, 10) and gc.isenabled() and frozen_by_program() == 0
        assert collector._on_collection not in gc.callbacks
        # what install(gc_headroom=0.2) calls; then a loop runs with the policy
        _gc_step.configure(headroom=0.2)
        asyncio.run(module.do_sync_training())
        assert [s["threshold"] for s in seen] == [(700, _gc_step._NEVER, _gc_step._NEVER)] * 2
        assert all(s["after_step"] for s in seen) and collector.stats.steps == 2 and collector.headroom == 0.2
    finally:
        undo()
        _gc_step.configure()
        gc.set_threshold(*_default_thresholds)
    assert not collector.active


@pytest.mark.parametrize("where", ["collect", "freeze", "step_started"])
def test_a_start_that_raises_anywhere_puts_everything_back(monkeypatch, where):
    # e.g. a KeyboardInterrupt in a finalizer the first collection runs
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "collect":
        monkeypatch.setattr(StepCollector, "_collect", interrupted)
    elif where == "freeze":
        monkeypatch.setattr(_gc_step, "program_froze", interrupted)
    else:
        monkeypatch.setattr(StepCollector, "_step_started", interrupted)
    gc.set_threshold(700, 10, 10)
    collector = StepCollector()
    try:
        with pytest.raises(KeyboardInterrupt):
            collector.loop_started()
        assert not collector.active
        assert gc.get_threshold() == (700, 10, 10) and gc.isenabled() and frozen_by_program() == 0
        assert collector._on_collection not in gc.callbacks
        monkeypatch.undo()
        collector.loop_started()
        assert collector.active and gc.get_threshold()[1:] == (_gc_step._NEVER, _gc_step._NEVER)
        collector.loop_ended()
    finally:
        gc.set_threshold(*_default_thresholds)


def test_restore_inside_the_loop_and_uninstall():
    collector = StepCollector()
    module, seen = fake_train_module(collector, steps=2)
    undo = held(collector, module)
    wrapped_step = module.do_train_step_and_get_sampling_client

    async def restoring_step(i):
        r = await wrapped_step(i)
        collector.restore()  # as uninstall() would, mid-run
        seen[-1]["restored"] = (gc.get_threshold(), gc.get_freeze_count())
        return r

    module.do_train_step_and_get_sampling_client = restoring_step
    asyncio.run(module.do_sync_training())
    assert seen[0]["restored"] == (_default_thresholds, 0)
    # later steps ran with the collector left alone
    assert seen[1]["threshold"] == _default_thresholds
    undo()
    assert module.do_sync_training.__name__ == "loop" and not hasattr(module.do_sync_training, "__wrapped__")


def test_a_disabled_collector_is_left_alone():
    collector = StepCollector()
    module, seen = fake_train_module(collector, steps=2)
    undo = held(collector, module)
    gc.disable()
    try:
        asyncio.run(module.do_sync_training())
    finally:
        gc.enable()
    assert [s["enabled"] for s in seen] == [False, False] and collector.stats.step_collections == 0
    assert all(s["frozen"] <= IMMORTAL_FROZEN for s in seen)
    undo()


def test_the_user_s_frozen_objects_stay_frozen():
    gc.freeze()
    frozen = gc.get_freeze_count()
    collector = StepCollector()
    module, seen = fake_train_module(collector, steps=1)
    undo = held(collector, module)
    asyncio.run(module.do_sync_training())
    undo()
    assert gc.get_freeze_count() == frozen and collector.stats.froze == 0
    gc.unfreeze()


def garbage_left(collector: StepCollector) -> int:
    """Inside a running loop, make cycles (each holding a buffer) that live
    through a few young collections and then die: only a collection of the
    older generations frees them. How many are still there at the end."""

    async def step() -> int:
        collector.loop_started(asyncio.get_running_loop())
        try:
            refs, window = [], []
            for i in range(20_000):
                a, b = Node(), Node()
                a.other, b.other = b, a
                a.payload = bytearray(256)  # type: ignore[attr-defined]
                refs.append(weakref.ref(a))
                window.append(a)
                if len(window) > 3_000:
                    del window[:1_000]
                del a, b
                if i % 500 == 0:
                    await asyncio.sleep(0)  # where the guard's collection runs
            assert collector.stats.young_collections > 0
            return sum(r() is not None for r in refs) - len(window)
        finally:
            collector.loop_ended()

    return asyncio.run(step())


def test_guard_collects_early_when_rss_grows(monkeypatch):
    monkeypatch.setattr(_gc_step, "_RSS_CHECK_INTERVAL", 0.0)
    guarded = StepCollector(young=1_000, headroom=None, max_rss_growth=0, max_tracked=None)
    # An RSS that grows at every reading: the process's real one need not
    # while the cycles' memory comes from what earlier tests freed.
    guarded._rss = itertools.count(0, 4096).__next__
    left_guarded = garbage_left(guarded)
    assert guarded.stats.guard_collections > 0
    unguarded = StepCollector(young=1_000, headroom=None, max_rss_growth=None, max_tracked=None)
    left_unguarded = garbage_left(unguarded)
    assert unguarded.stats.guard_collections == 0
    # The guard frees most of what waits for the older generations (the
    # counts move with each CPython's young-generation schedule: 3.13 leaves
    # about 6,000 guarded where 3.11 leaves under 5,000).
    assert left_unguarded > 10_000 and left_guarded < left_unguarded / 2, (left_guarded, left_unguarded)


def test_guard_collects_early_when_survivors_pass_the_bound():
    guarded = StepCollector(young=1_000, headroom=None, max_tracked=5_000)
    assert garbage_left(guarded) < 8_000
    assert guarded.stats.guard_collections > 0 and guarded.stats.tracked_checks > 0


def test_a_step_that_keeps_its_objects_is_not_collected_over_and_over():
    # A step that keeps every object it makes (400,000), with the survivors'
    # bound at 10,000 and no RSS bound. With a fixed bound the guard would
    # collect ~40 times, each over all the step has kept so far (quadratic in
    # the step); past four bounds the next is a quarter of what the step kept:
    # about 4 + log(400/40)/log(1.25) ~ 14 collections.
    collector = StepCollector(young=1_000, headroom=None, max_tracked=10_000)

    async def step() -> list[Node]:
        collector.loop_started(asyncio.get_running_loop())
        try:
            keep = []
            for i in range(400_000):
                keep.append(Node())
                if i % 500 == 0:
                    await asyncio.sleep(0)  # where the guard's collection runs
            return keep
        finally:
            collector.loop_ended()

    kept = asyncio.run(step())
    assert len(kept) == 400_000
    assert 5 <= collector.stats.guard_collections <= 16, collector.stats


def test_a_step_s_survivors_are_bounded_relative_to_the_process():
    # Cycles that outlive a few young collections and then die, far more
    # of them than the objects the process holds: RSS cannot see that
    # their room is reused, their count can.
    collector = StepCollector(headroom=None)

    async def step() -> int:
        collector.loop_started(asyncio.get_running_loop())
        try:
            window: list[Node] = []
            for i in range(1_000_000):
                a, b = Node(), Node()
                a.other, b.other = b, a
                window.append(a)
                if len(window) > 30_000:
                    del window[:10_000]
                if i % 1_000 == 0:
                    await asyncio.sleep(0)  # where the guard's collection runs
            return len(gc.get_objects(generation=1))
        finally:
            collector.loop_ended()

    survivors = asyncio.run(step())
    assert collector.stats.guard_collections >= 2, collector.stats
    held = collector._held
    assert survivors <= max(held, _gc_step.MIN_SURVIVORS_BOUND) + 10_000, (survivors, held)


def early_collections_per_step(collector: StepCollector, kinds: list[str]) -> list[int]:
    """One loop of steps, each of one kind, sized by the collector's own
    survivors' bound (a full suite's process holds more objects than a
    lone test's): "in flight" holds 1.5 bounds of objects to the step's end
    (a batch of rollouts), "cycles" makes 3 bounds of cycles that each live
    through a few young collections and die in the step. The early
    collections each step had."""

    async def steps() -> list[int]:
        collector.loop_started(asyncio.get_running_loop())
        early = []
        try:
            n = int(1.5 * collector._survivors_bound())
            for kind in kinds:
                before = collector.stats.guard_collections
                kept: list[Node] = []
                for i in range(2 * n if kind == "cycles" else n):
                    a = Node()
                    if kind == "cycles":
                        a.other = b = Node()
                        b.other = a
                        if len(kept) > 30_000:
                            del kept[:10_000]
                    kept.append(a)
                    if i % 1_000 == 0:
                        await asyncio.sleep(0)  # where the guard's collection runs
                early.append(collector.stats.guard_collections - before)
                del kept
                collector.step_ended()
            return early
        finally:
            collector.loop_ended()

    return asyncio.run(steps())


def test_a_step_s_work_in_flight_is_not_collected_again_in_later_steps():
    # The first step's early collection finds its objects all live; the
    # later steps' bound is raised past them and they run without one.
    collector = StepCollector(headroom=None, max_tracked=None)
    early = early_collections_per_step(collector, ["in flight"] * 3)
    assert early == [1, 0, 0], (early, collector.stats)
    assert collector.stats.live_collections == 1
    # Cycles that die mid-step: each early collection frees most of its survivors.
    cycles = StepCollector(headroom=None, max_tracked=None)
    early = early_collections_per_step(cycles, ["cycles"] * 2)
    assert min(early) >= 1 and cycles.stats.live_collections == 0, (early, cycles.stats)


def test_a_step_with_garbage_brings_the_raised_bound_back():
    # In flight (the bound raised), then a step of cycles (an early
    # collection frees most: the bound back), then in flight again:
    # collected early once more.
    collector = StepCollector(headroom=None, max_tracked=None)
    early = early_collections_per_step(collector, ["in flight", "cycles", "in flight"])
    assert early[0] == 1 and early[1] >= 1 and early[2] == 1, (early, collector.stats)
    assert collector.stats.live_collections == 2


def test_no_full_collection_inside_a_step():
    collector = StepCollector(young=1_000, headroom=None, max_tracked=None)
    full = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    collector.loop_started()
    gc.callbacks.append(count)
    try:
        keep = []
        for _ in range(50_000):
            keep.append(Node())  # survivors: each young collection promotes them
        assert collector.stats.young_collections > 10
        assert not full
        collector.step_ended()
        assert len(full) == 1
    finally:
        gc.callbacks.remove(count)
        collector.loop_ended()


def test_the_rss_reader_reads_this_process():
    import resource

    read = _gc_step._rss_reader()
    assert read is not None
    before = read()
    block = bytearray(64 * 2**20)  # touched: resident
    grown = read() - before
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 0 < read() <= peak * 1.01
    assert grown >= 32 * 2**20, grown
    del block


FORKED = textwrap.dedent(
    """
    import json, os, sys, time
    from tinker_rl_data.cookbook import gc_step

    def own_rss():
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    collector = gc_step.StepCollector()
    collector.loop_started()  # the RSS reader is in use before the fork
    grown, done = os.pipe(), os.pipe()
    parent = os.getpid()
    if os.fork():
        block = bytearray(256 * 2**20)  # the parent grows by 256 MiB (touched)
        os.write(grown[1], b"x")
        os.read(done[0], 1)
        os._exit(0)  # the child goes on without its parent
    os.read(grown[0], 1)
    out = {"read": collector._rss(), "own": own_rss()}
    os.write(done[1], b"x")
    while os.getppid() == parent:
        time.sleep(0.01)
    try:
        collector.step_ended()  # reads RSS: the parent is gone
        collector.loop_ended()
        collector.loop_started()
        collector.step_ended()
        out["after_exit"] = collector._rss()
        collector.loop_ended()
    except BaseException as exc:
        out["raised"] = repr(exc)
    print(json.dumps(out), flush=True)
    """
)


def test_a_forked_child_reads_its_own_rss():
    proc = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "raised" not in out, out
    # the parent grew by 256 MiB after the fork; the child did not
    assert abs(out["read"] - out["own"]) < 32 * 2**20, out
    assert out["after_exit"] > 0


FORKED_IN_A_STEP = textwrap.dedent(
    """
    import gc, json, os
    from tinker_rl_data.cookbook import gc_step

    gc.set_threshold(1500, 7, 3)
    before = [gc.isenabled(), list(gc.get_threshold()), len(gc.callbacks)]
    collector = gc_step.StepCollector(young=100)
    for hold in ("loop", "held step"):
        collector.loop_started() if hold == "loop" else collector.step_held()
        inside = list(gc.get_threshold())
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a pool's worker, forked inside the step
            state = [gc.isenabled(), list(gc.get_threshold()), len(gc.callbacks), collector.active]
            os.write(write, json.dumps(state).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(read, 4096))
        still = [list(gc.get_threshold()), collector.active]  # the parent's step goes on
        collector.loop_ended() if hold == "loop" else collector.step_released()
        print(json.dumps({"hold": hold, "before": before, "inside": inside, "child": child, "parent": still}))
    """
)


def test_a_process_forked_inside_a_step_has_the_programs_collector():
    proc = subprocess.run([sys.executable, "-c", FORKED_IN_A_STEP], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.strip().splitlines():
        out = json.loads(line)
        assert out["inside"][1:] == [2**30, 2**30], out  # the step's policy, in the parent
        assert out["child"] == [*out["before"], False], out  # not in the step: the program's collector
        assert out["parent"] == [out["inside"], True], out


def test_a_failed_rss_read_ends_the_bound_quietly():
    def gone() -> int:
        raise ProcessLookupError(3, "No such process")

    collector = StepCollector(young=100)
    collector.loop_started()
    try:
        collector._rss = gone
        collector.step_ended()
        assert collector._rss_limit is None and collector.stats.rss_failures == 1
        assert not collector._over_bound()
        collector.step_ended()
        assert collector.stats.rss_failures == 1 and collector.stats.steps == 2
    finally:
        collector.loop_ended()
    collector.loop_started()  # a new loop reads RSS again
    assert collector._rss is not None and collector._rss_limit is not None
    collector.loop_ended()


# -- the guard relative to the process ------------------------------------------


class FakeRSS:
    """An RSS reader the test sets (bytes)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


MiB = 2**20


def guard_run(collector: StepCollector, rss: FakeRSS, readings: list[int], steps: int = 1) -> list[int]:
    """Inside a running loop, for each step, for each RSS in ``readings``:
    set it, make young collections run (the guard looks there), let the
    loop run the guard's collection; then end the step at the first RSS.
    The guard collections after each reading."""
    collector._rss = rss
    fired = []

    async def run() -> None:
        collector.loop_started(asyncio.get_running_loop())
        try:
            for _ in range(steps):
                start = rss.value
                for value in readings:
                    rss.value = value
                    keep = [[] for _ in range(20 * collector.young)]  # survivors: young collections run
                    del keep
                    await asyncio.sleep(0)
                    fired.append(collector.stats.guard_collections)
                rss.value = start
                collector.step_ended()
        finally:
            collector.loop_ended()

    asyncio.run(run())
    return fired


@pytest.fixture
def no_check_interval(monkeypatch):
    monkeypatch.setattr(_gc_step, "_RSS_CHECK_INTERVAL", 0.0)
    monkeypatch.delenv(_gc_step.HEADROOM_ENV, raising=False)


def test_guard_collects_past_a_fraction_of_the_step_s_rss(no_check_interval):
    # 1 GiB at the step's start, 15% headroom: the limit is 1 GiB + 153.6 MiB
    # (an absolute 512 MiB would let it grow by half).
    collector = StepCollector(young=100, headroom=0.15, max_tracked=None)
    rss = FakeRSS(1024 * MiB)
    fired = guard_run(collector, rss, [1100 * MiB, 1177 * MiB, 1178 * MiB])
    assert fired == [0, 0, 1]
    assert collector.stats.peak_limit >= 1177 * MiB


def test_the_headroom_scales_with_the_process(no_check_interval):
    # 8 GiB: 600 MiB of growth is within 15% (1,228.8 MiB)...
    big = StepCollector(young=100, headroom=0.15, max_tracked=None)
    assert guard_run(big, FakeRSS(8192 * MiB), [8792 * MiB, 9420 * MiB, 9422 * MiB]) == [0, 0, 1]
    # ... and 100 MiB: the floor (32 MiB), not 15 MiB, of growth.
    small = StepCollector(young=100, headroom=0.15, min_headroom=32 * MiB, max_tracked=None)
    assert guard_run(small, FakeRSS(100 * MiB), [120 * MiB, 131 * MiB, 133 * MiB]) == [0, 0, 1]


def test_after_the_guard_the_limit_does_not_compound(no_check_interval):
    # 1000 MiB at the step's start, 10%: past 1100 the guard collects; the
    # memory stays resident (RSS 1101 after it), and the next limit is 1101
    # + 100 (10% of the step's start; the step grew by less than 4 x 100),
    # not 1101 * 1.1 = 1211.1.
    collector = StepCollector(young=100, headroom=0.10, min_headroom=0, max_tracked=None)
    fired = guard_run(collector, FakeRSS(1000 * MiB), [1101 * MiB, 1101 * MiB, 1200 * MiB, 1205 * MiB])
    assert fired == [1, 1, 1, 2]


def test_a_large_step_is_not_collected_over_and_over(no_check_interval):
    # A step that keeps what it allocates: from 1000 MiB to 5000 MiB in
    # 10 MiB readings, 10% headroom (100 MiB). With a fixed allowance the
    # guard would collect ~40 times, each scan bigger than the last
    # (quadratic in the step). Past four headrooms of growth the allowance
    # is a quarter of the growth: at most 4 + log(4000/400)/log(1.25) ~ 14.3.
    start, step, headroom = 1000 * MiB, 10 * MiB, 100 * MiB
    readings = list(range(start + step, 5000 * MiB + 1, step))
    collector = StepCollector(young=100, headroom=0.10, min_headroom=0, max_tracked=None)
    fired = guard_run(collector, FakeRSS(start), readings)
    at = [readings[i] for i in range(len(readings)) if fired[i] > (fired[i - 1] if i else 0)]
    assert 5 <= len(at) <= 15, at
    # ... and never later than the allowance after the previous collection
    # (one reading late at most: the guard looks at young collections).
    previous = start
    for rss in at:
        allowed = max(headroom, (previous - start) // 4)
        assert allowed < rss - previous <= allowed + step, (previous, rss)
        previous = rss


def test_each_step_measures_from_its_own_start(no_check_interval):
    collector = StepCollector(young=100, headroom=0.15, max_tracked=None)
    # Two steps: each grows by 10% of its start, within the bound: no guard.
    fired = guard_run(collector, FakeRSS(1000 * MiB), [1050 * MiB, 1100 * MiB], steps=2)
    assert fired == [0, 0, 0, 0] and collector.stats.step_collections == 2


def test_headroom_from_the_environment(no_check_interval, monkeypatch):
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "0.05")
    collector = StepCollector(young=100, max_tracked=None)  # no headroom given: the variable's
    assert guard_run(collector, FakeRSS(1000 * MiB), [1040 * MiB, 1051 * MiB]) == [0, 1]
    assert collector.headroom == 0.05
    # A headroom given is not the variable's.
    given = StepCollector(young=100, headroom=0.15, max_tracked=None)
    assert guard_run(given, FakeRSS(1000 * MiB), [1051 * MiB, 1140 * MiB]) == [0, 0]
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "off")
    off = StepCollector(young=100, max_tracked=None)
    assert guard_run(off, FakeRSS(1000 * MiB), [4000 * MiB]) == [0] and off.headroom is None
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "15%")
    assert _gc_step.headroom_from_env() == 0.15
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "lots")
    with pytest.warns(UserWarning, match="TINKER_RL_DATA_GC_HEADROOM"):
        assert _gc_step.headroom_from_env() == _gc_step.DEFAULT_HEADROOM


def test_configure_sets_install_s_collector(no_check_interval):
    try:
        collector = _gc_step.configure(headroom=0.05, min_headroom=0)
        assert collector is _gc_step.COLLECTOR and collector.headroom == 0.05 and collector.min_headroom == 0
        with pytest.raises(ValueError):
            _gc_step.configure(headroom=-1)
    finally:
        _gc_step.configure()
    assert _gc_step.COLLECTOR.headroom_setting is _gc_step._FROM_ENV


# -- a user's wrapper on the step function ---------------------------------------

LOOP_SOURCE = """
async def do_sync_training(steps):
    for i in range(steps):
        await do_train_step_and_get_sampling_client(i)
        after_step.append(garbage[-1]() is None)
"""


def module_with_a_user_s_step(user_wraps: bool):
    """A module whose loop looks its step function up in its globals (as
    rl.train's do), a user's hook (with functools.wraps or not) there."""
    module = types.ModuleType("fake_rl_train")
    module.garbage, module.after_step, module.calls = [], [], []
    exec(LOOP_SOURCE, module.__dict__)

    async def cookbook_step(i):
        module.garbage.append(cycle())
        return i

    async def users_hook(i):
        module.calls.append(i)
        return await cookbook_step(i)

    module.do_train_step_and_get_sampling_client = functools.wraps(cookbook_step)(users_hook) if user_wraps else users_hook
    return module


@pytest.mark.parametrize("user_wraps", [True, False])
def test_the_loop_ends_the_step_around_a_user_s_step_function(user_wraps):
    module = module_with_a_user_s_step(user_wraps)
    users = module.do_train_step_and_get_sampling_client
    collector = StepCollector()
    # install() keeps the user's step function: only the loop's piece goes in.
    loop = collector.wrap_loop(module.do_sync_training)
    asyncio.run(loop(3))
    assert module.calls == [0, 1, 2]  # the user's hook ran each step
    assert collector.stats.step_collections == 3 and collector.stats.step_ends_added == 1
    assert module.after_step == [True, True, True]  # each step's cycle collected at its end
    assert module.do_train_step_and_get_sampling_client is users  # put back


def test_one_step_end_when_a_user_s_hook_is_around_ours():
    module = module_with_a_user_s_step(user_wraps=True)
    collector = StepCollector()
    ours = collector.wrap_step(module.do_train_step_and_get_sampling_client)

    async def plain_hook(i):  # no functools.wraps: the loop cannot see ours inside
        return await ours(i)

    module.do_train_step_and_get_sampling_client = plain_hook
    asyncio.run(collector.wrap_loop(module.do_sync_training)(2))
    assert collector.stats.steps == 2 and collector.stats.step_collections == 2
    assert module.do_train_step_and_get_sampling_client is plain_hook
    # With functools.wraps the hook carries ours's mark: nothing added.
    module = module_with_a_user_s_step(user_wraps=True)
    collector2 = StepCollector()
    ours2 = collector2.wrap_step(module.do_train_step_and_get_sampling_client)

    async def hook(i):
        return await ours2(i)

    module.do_train_step_and_get_sampling_client = functools.wraps(ours2)(hook)
    asyncio.run(collector2.wrap_loop(module.do_sync_training)(2))
    assert collector2.stats.step_ends_added == 0 and collector2.stats.step_collections == 2
