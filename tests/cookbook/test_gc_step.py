"""The collector held to the trainer's step (tinker_rl_data._gc_step), on
stand-in loop and step functions: the policy while the loop runs, one full
collection per step, the guard, and the collector's state put back after
the loop returns, raises, or restore()."""

from __future__ import annotations

import asyncio
import gc
import itertools
import types
import weakref

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
    undo = _gc_step.apply(collector, module)
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
    undo = _gc_step.apply(collector, module)
    with pytest.raises(RuntimeError, match="step failed"):
        asyncio.run(module.do_sync_training())
    assert not collector.active
    assert gc.get_threshold() == _default_thresholds and gc.isenabled() and frozen_by_program() == 0
    undo()


def test_restore_inside_the_loop_and_uninstall():
    collector = StepCollector()
    module, seen = fake_train_module(collector, steps=2)
    undo = _gc_step.apply(collector, module)
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
    undo = _gc_step.apply(collector, module)
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
    undo = _gc_step.apply(collector, module)
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
    guarded = StepCollector(young=1_000, max_rss_growth=0, max_tracked=None)
    # An RSS that grows at every reading: the process's real one need not
    # while the cycles' memory comes from what earlier tests freed.
    guarded._rss = itertools.count(0, 4096).__next__
    left_guarded = garbage_left(guarded)
    assert guarded.stats.guard_collections > 0
    unguarded = StepCollector(young=1_000, max_rss_growth=None, max_tracked=None)
    left_unguarded = garbage_left(unguarded)
    assert unguarded.stats.guard_collections == 0
    # The guard frees most of what waits for the older generations (the
    # counts move with each CPython's young-generation schedule: 3.13 leaves
    # about 6,000 guarded where 3.11 leaves under 5,000).
    assert left_unguarded > 10_000 and left_guarded < left_unguarded / 2, (left_guarded, left_unguarded)


def test_guard_collects_early_when_survivors_pass_the_bound():
    guarded = StepCollector(young=1_000, max_rss_growth=None, max_tracked=5_000)
    assert garbage_left(guarded) < 8_000
    assert guarded.stats.guard_collections > 0 and guarded.stats.tracked_checks > 0


def test_no_full_collection_inside_a_step():
    collector = StepCollector(young=1_000, max_rss_growth=None, max_tracked=None)
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
