"""The collector held to the trainer's step (tinker_rl_data.cookbook.gc_step), on
stand-in loop and step functions: the policy while the loop runs, one full
collection per step, the freeze's renewals, the memory bound inside a step
(compared with the program's own collector in the same test), the
program's own collector calls, and the collector's state put back after
the loop returns, raises, or restore(). The trainer's own loop with
environments that make garbage: tests/cookbook/test_trainer_garbage.py."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import json
import subprocess
import sys
import textwrap
import threading
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


# The gc module's functions as CPython has them.
GC_FUNCTIONS = {name: getattr(gc, name) for name in _gc_step.FRONT}


def gc_functions_are_cpython_s() -> bool:
    return all(getattr(gc, name) is function for name, function in GC_FUNCTIONS.items())


@pytest.fixture(autouse=True)
def collector_state():
    before = (gc.isenabled(), gc.get_threshold(), frozen_by_program(), list(gc.callbacks), True)
    yield
    after = (gc.isenabled(), gc.get_threshold(), frozen_by_program(), list(gc.callbacks), gc_functions_are_cpython_s())
    vars(gc).update(GC_FUNCTIONS)
    gc.enable()
    gc.unfreeze()
    assert after == before, "the collector's state was not put back"


def fake_train_module(collector: StepCollector, steps: int, fail_at: int | None = None):
    """A module with rl.train's loop and step names, the step recording what
    the collector looked like inside it."""
    seen: list[dict] = []
    module = types.SimpleNamespace()

    async def step(i):
        seen.append(
            {
                "threshold": gc.get_threshold(),  # as the program sees them
                "in_force": _gc_step.collector_thresholds(),  # as CPython collects by them
                "enabled": gc.isenabled(),
                "frozen": gc.get_freeze_count(),
            }
        )
        seen[-1]["garbage"] = cycle()
        if i == fail_at:
            raise RuntimeError("step failed")
        return i

    async def loop(**kwargs):
        for i in range(kwargs.get("steps", steps)):
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


_default_thresholds = gc.get_threshold()


@pytest.mark.parametrize("loop_name", LOOP_FUNCTIONS)
def test_policy_while_the_loop_runs(loop_name):
    collector = StepCollector(young=12_345)
    module, seen = fake_train_module(collector, steps=5)
    gc.set_threshold(700, 9, 10)
    undo = held(collector, module)
    assert getattr(module, loop_name).__wrapped__ is not None
    asyncio.run(getattr(module, loop_name)())
    undo()
    assert len(seen) == 5
    for i, s in enumerate(seen):
        # the young generations as the program has them (but `young`), the oldest held
        assert s["in_force"] == (12_345, 9, _gc_step._NEVER)
        assert s["threshold"] == (700, 9, 10)  # what the program sees: its own
        # the first step runs unfrozen; the freeze is renewed at steps 1 and 4's ends
        assert s["enabled"] and (s["frozen"] > IMMORTAL_FROZEN) == (i > 0)
        assert s["after_step"]
    assert collector.stats.steps == 5 and collector.stats.step_collections == 5
    assert collector.stats.renewals == 2
    assert gc.get_threshold() == (700, 9, 10) and frozen_by_program() == 0
    gc.set_threshold(*_default_thresholds)


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
        assert [s["in_force"] for s in seen] == [(700, 10, _gc_step._NEVER)] * 2
        assert all(s["after_step"] for s in seen) and collector.stats.steps == 2 and collector.headroom == 0.2
    finally:
        undo()
        _gc_step.configure()
        gc.set_threshold(*_default_thresholds)
    assert not collector.active


@pytest.mark.parametrize("where", ["callbacks", "thresholds"])
def test_a_start_that_raises_anywhere_puts_everything_back(monkeypatch, where):
    # e.g. a KeyboardInterrupt arriving while the policy goes in
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "callbacks":
        monkeypatch.setattr(_gc_step, "headroom_from_env", interrupted)
    else:
        monkeypatch.setattr(StepCollector, "_start_step", interrupted)
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
        assert collector.active and _gc_step.collector_thresholds() == (700, 10, _gc_step._NEVER)
        assert gc.get_threshold() == (700, 10, 10)
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
        seen[-1]["restored"] = (gc.get_threshold(), frozen_by_program())
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
    module, seen = fake_train_module(collector, steps=5)
    undo = held(collector, module)
    asyncio.run(module.do_sync_training())
    undo()
    assert abs(gc.get_freeze_count() - frozen) <= _gc_step._INTERPRETER_FROZEN
    assert collector.stats.froze == 0 and collector.stats.renewals == 0 and not collector.stats.stepped_aside
    assert all(s["after_step"] for s in seen)
    gc.unfreeze()


# -- the program's own calls while the loop runs -----------------------------------


def program_calls_in_step(call: Callable[[], None], at: int = 1, steps: int = 3, **collector_options):
    """A loop of ``steps`` whose step ``at`` makes the program's own call;
    (what each step saw, the collector, the log lines about stepping aside)."""
    collector = StepCollector(**collector_options)
    module, seen = fake_train_module(collector, steps=steps)
    inner = module.do_train_step_and_get_sampling_client

    async def step(i):
        if i == at:
            call()
        return await inner(i)

    module.do_train_step_and_get_sampling_client = step
    undo = held(collector, module)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger(_gc_step.__name__).addHandler(handler)
    try:
        asyncio.run(module.do_sync_training())
    finally:
        logging.getLogger(_gc_step.__name__).removeHandler(handler)
        undo()
    return seen, collector, lines


def test_the_program_s_thresholds_stay_in_force():
    gc.set_threshold(700, 10, 10)
    try:
        seen, collector, lines = program_calls_in_step(lambda: gc.set_threshold(5_000, 20, 30))
        # set in step 1: steps 1 and 2 ran with the program's, to the loop's end and after
        assert [s["in_force"] for s in seen] == [(700, 10, _gc_step._NEVER), (5_000, 20, 30), (5_000, 20, 30)]
        assert [s["threshold"] for s in seen] == [(700, 10, 10), (5_000, 20, 30), (5_000, 20, 30)]
        assert gc.get_threshold() == (5_000, 20, 30)
        assert collector.stats.steps == 1 and "gc.set_threshold()" in collector.stats.stepped_aside
        assert len(lines) == 1 and "steps aside" in lines[0], lines
        assert collector._on_collection not in gc.callbacks and frozen_by_program() == 0
    finally:
        gc.set_threshold(*_default_thresholds)


def test_the_program_s_disable_stays_in_force():
    try:
        seen, collector, lines = program_calls_in_step(gc.disable)
        assert [s["enabled"] for s in seen] == [True, False, False] and not gc.isenabled()
        assert seen[2]["threshold"] == _default_thresholds  # the program's again, from the step's end that saw it
        assert collector.stats.steps == 1 and "gc.disable()" in collector.stats.stepped_aside
        assert len(lines) == 1
    finally:
        gc.enable()


def test_the_program_s_freeze_stays_in_force():
    # step 0 ends with the collector's freeze; the program freezes in step 3:
    # the policy steps aside there, nothing of the program's is unfrozen
    live: list[Any] = []

    def freeze() -> None:
        live.extend([] for _ in range(20_000))  # what the program's freeze takes in
        gc.freeze()

    seen, collector, lines = program_calls_in_step(freeze, at=3, steps=6)
    assert "gc.freeze()" in collector.stats.stepped_aside and len(lines) == 1
    assert collector.stats.steps == 3 and collector.stats.renewals == 1
    # the program's thresholds back from its call on
    assert [s["in_force"] for s in seen[3:]] == [_default_thresholds] * 3
    assert [s["in_force"][2] for s in seen[:3]] == [_gc_step._NEVER] * 3
    assert frozen_by_program() > 0  # still frozen after the loop: the program's
    gc.unfreeze()


def test_the_program_s_collect_collects():
    # A cycle made and dropped in a step, then the program's gc.collect():
    # freed there, as without the collector.
    freed = []

    def collect_now():
        ref = cycle()
        gc.collect()
        freed.append(ref() is None)

    seen, collector, lines = program_calls_in_step(collect_now, at=2)
    assert freed == [True] and collector.stats.program_collections == 1 and lines == []
    assert collector.stats.steps == 3


# -- every call a program can make, against CPython's own collector ---------------


def _save_thresholds(kept: dict) -> None:
    kept["thresholds"] = gc.get_threshold()


# What a program does to the collector, by step: each step 1 call comes after
# the collector's first renewal (its freeze at step 0's end). Every call
# looks its function up in the gc module when made, as a program does.
def _programs() -> dict[str, dict[int, Callable[[], Any]]]:
    kept: dict[str, Any] = {}
    return {
        "set_threshold(N)": {1: lambda: gc.set_threshold(20_000)},
        "set_threshold(N, M)": {1: lambda: gc.set_threshold(20_000, 5)},
        "set_threshold(N, M, K)": {1: lambda: gc.set_threshold(20_000, 5, 7)},
        "set_threshold twice": {1: lambda: gc.set_threshold(900, 3), 2: lambda: gc.set_threshold(1_200)},
        "disable": {1: lambda: gc.disable()},
        "enable": {1: lambda: gc.enable()},
        "disable, enable": {1: lambda: gc.disable(), 2: lambda: gc.enable()},
        "freeze": {1: lambda: gc.freeze()},
        "unfreeze": {1: lambda: gc.unfreeze()},
        "freeze, unfreeze": {1: lambda: gc.freeze(), 2: lambda: gc.unfreeze()},
        "collect": {1: lambda: gc.collect()},
        "thresholds saved, then set back": {1: lambda: _save_thresholds(kept), 2: lambda: gc.set_threshold(*kept["thresholds"])},
    }


PROGRAMS = sorted(_programs())


def run_program(name: str, point: str, collector: StepCollector | None, steps: int = 3):
    """A loop of ``steps`` whose steps make the program's calls ``name`` at
    ``point`` ("start": first thing in the step; "armed": after the step
    allocated until the collector armed a full collection); with
    ``collector`` None, without one (CPython's own collector). What the
    program saw of the collector in each step (its thresholds before and
    after its calls, the enabled flag after), its state after the loop, and
    whether each call was made while a full collection was armed."""
    calls = _programs()[name]
    module, seen = fake_train_module(collector, steps=steps)
    inner = module.do_train_step_and_get_sampling_client
    kept: list[Any] = []
    armed_at_call: list[bool] = []

    async def step(i):
        before = gc.get_threshold()
        if point == "armed" and i in calls and collector is not None and not collector._aside:
            for _ in range(100_000):  # a young collection arms it (headroom 0)
                kept.append([])
                if collector._armed:
                    break
            armed_at_call.append(collector._armed)
        if i in calls:
            calls[i]()
        seen_by_program.append((before, gc.get_threshold(), gc.isenabled()))
        return await inner(i)

    seen_by_program: list[tuple] = []
    module.do_train_step_and_get_sampling_client = step
    undo = held(collector, module) if collector is not None else (lambda: None)
    try:
        asyncio.run(module.do_sync_training())
    finally:
        undo()
    after = (gc.isenabled(), gc.get_threshold(), frozen_by_program() > 0, gc_functions_are_cpython_s())
    return seen_by_program, after, armed_at_call


@pytest.mark.parametrize("point", ["start", "armed"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_call_leaves_the_collector_as_cpython_does(monkeypatch, name, point):
    # What the program sees in the loop and has after it: what the same calls
    # give without the collector. No threshold of ours is ever shown.
    monkeypatch.setattr(_gc_step, "_CHECK_INTERVAL", 0.0)
    monkeypatch.setattr(_gc_step, "_CHECK_SHARE", 1.0)

    def clean() -> None:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*_default_thresholds)

    try:
        stock_seen, stock_after, _ = run_program(name, point, None)
        clean()
        collector = StepCollector(headroom=0.0)
        seen, after, armed = run_program(name, point, collector)
    finally:
        clean()
    # the calls made while a full collection was armed
    assert all(armed) and bool(armed) == (point == "armed"), armed
    assert seen == stock_seen
    assert after == stock_after, (after, stock_after, collector.stats)
    assert collector.stats.steps >= 1  # the policy held before the program's calls


def test_a_one_argument_set_threshold_leaves_no_never_behind():
    # Defect 2: gc.set_threshold(20_000) in a step, the oldest generation
    # then collected as CPython does it: its count, not never.
    try:
        _, stock_after, _ = run_program("set_threshold(N)", "start", None)
        gc.set_threshold(*_default_thresholds)
        collector = StepCollector()
        seen, after, _ = run_program("set_threshold(N)", "start", collector)
        assert after == stock_after and after[1] == (20_000, *_default_thresholds[1:])
        assert "gc.set_threshold()" in collector.stats.stepped_aside and collector.stats.steps == 1
    finally:
        gc.set_threshold(*_default_thresholds)


def test_gc_functions_bound_before_or_kept_after_the_loop_act_as_cpython_s():
    # A program that bound gc.set_threshold before the loop (CPython's: the
    # policy's functions do not see it) sets one threshold in step 1; one
    # that kept gc.set_threshold / get_threshold from inside the loop calls
    # them after it. Both as without the collector.
    def run(collector: StepCollector | None) -> tuple:
        bound_before = gc.set_threshold
        kept: dict[str, Any] = {}

        def in_step(i: int) -> None:
            if i == 0:
                kept["set"], kept["get"] = gc.set_threshold, gc.get_threshold
            if i == 1:
                bound_before(20_000)

        loop_with(collector, 3, in_step)
        after_loop = gc.get_threshold()
        kept["set"](900, 4)
        return after_loop, kept["get"](), gc.get_threshold(), gc_functions_are_cpython_s()

    try:
        stock = run(None)
        gc.set_threshold(*_default_thresholds)
        collector = StepCollector()
        ours = run(collector)
    finally:
        gc.set_threshold(*_default_thresholds)
    assert ours == stock and stock[0] == (20_000, *_default_thresholds[1:]), (ours, stock)
    assert "gc.set_threshold()" in collector.stats.stepped_aside  # seen at step 1's end


def test_a_freeze_after_the_renewal_s_batch_partly_died_stays(monkeypatch):
    # Defect 4: the collector froze a batch at step 0's end; half of it dies
    # in step 1 (the freeze count shrinks), then the program freezes: what
    # it froze stays frozen after the loop, as without the collector.
    def frozen_after(collector: StepCollector | None) -> int:
        batch: dict[str, Any] = {}

        def in_step(i: int) -> None:
            if i == 0:
                batch["objects"] = [[j] for j in range(20_000)]
            if i == 1:
                del batch["objects"][:10_000]
                gc.freeze()

        loop_with(collector, 3, in_step)
        frozen = frozen_by_program()
        gc.unfreeze()
        return frozen

    stock = frozen_after(None)
    collector = StepCollector()
    ours = frozen_after(collector)
    assert collector.stats.renewals == 1 and "gc.freeze()" in collector.stats.stepped_aside
    assert stock > 10_000 and abs(ours - stock) < 0.05 * stock, (ours, stock)


# -- the native calls' own pause, in another thread -------------------------------


class CallInFlight:
    """A native call (tinker_rl_data.assemble_training_data) in another
    thread, held inside it by a property that waits on an Event with the
    GIL released (as I/O or a lock would), until :meth:`end`."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._call, daemon=True)

    def _call(self) -> None:
        from tinker_rl_data import assemble_training_data
        from tinker_rl_data.evsys import Trajectory, TrajectoryGroup

        call = self

        class Waiting:
            completion_tokens, logprobs = [5, 6], [-0.5, -0.5]

            @property
            def prompt_tokens(self):
                call.entered.set()
                call.released.wait(WAIT)
                return [1, 2, 3]

        try:
            assemble_training_data([TrajectoryGroup([Trajectory([Waiting()], 1.0)])], [[0.5]])
        except BaseException as e:
            self.errors.append(e)

    def start(self) -> None:
        self.thread.start()
        assert self.entered.wait(WAIT), "the call never read its turn"

    def end(self) -> None:
        self.released.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive() and not self.errors, self.errors


WAIT = 30.0  # never reached: each wait ends as soon as the other side acts


def loop_with(collector: StepCollector | None, steps: int, in_step: Callable[[int], None]) -> None:
    """A loop of ``steps`` whose step ``i`` first runs ``in_step(i)``, held
    by ``collector`` (None: as without the collector)."""
    module, seen = fake_train_module(collector, steps=steps)
    inner = module.do_train_step_and_get_sampling_client

    async def step(i):
        in_step(i)
        return await inner(i)

    module.do_train_step_and_get_sampling_client = step
    undo = held(collector, module) if collector is not None else (lambda: None)
    try:
        asyncio.run(module.do_sync_training())
    finally:
        undo()


def test_a_native_call_in_flight_at_a_step_s_end_is_not_the_program_s_disable():
    call = CallInFlight()

    def in_step(i: int) -> None:
        if i == 1:
            call.start()  # in flight at step 1's end: the collector is off for it
        if i == 2:
            call.end()

    collector = StepCollector()
    try:
        loop_with(collector, 3, in_step)
    finally:
        call.end()
    assert collector.stats.stepped_aside == "" and collector.stats.step_collections == 3, collector.stats
    assert gc.isenabled()


def test_the_program_s_disable_while_a_native_call_is_in_flight_stays():
    # The call found the collector on; the program turns it off meanwhile
    # (CPython: off from then on): the call's end leaves it off.
    call = CallInFlight()

    def in_step(i: int) -> None:
        if i == 1:
            call.start()
            gc.disable()
        if i == 2:
            call.end()

    collector = StepCollector()
    try:
        loop_with(collector, 3, in_step)
        assert not gc.isenabled() and "gc.disable()" in collector.stats.stepped_aside
    finally:
        call.end()
        gc.enable()


# -- the freeze's renewals ------------------------------------------------------------


def steps_with(collector: StepCollector, steps: int, in_step: Callable[[int], None]) -> list[Any]:
    """A loop of ``steps`` whose step ``i`` first runs ``in_step(i)``; what
    ``in_step(-1)`` returns after each step's end (the step's collection)."""
    module, seen = fake_train_module(collector, steps=steps)
    inner = module.do_train_step_and_get_sampling_client

    async def step(i):
        in_step(i)
        return await inner(i)

    module.do_train_step_and_get_sampling_client = step
    undo = held(collector, module)
    after_ends = []
    original_end = collector.step_ended

    def step_ended() -> None:
        original_end()
        after_ends.append(in_step(-1))

    collector.step_ended = step_ended  # type: ignore[method-assign]
    try:
        asyncio.run(module.do_sync_training())
    finally:
        del collector.step_ended
        undo()
    return after_ends


def ring(n: int = 10) -> list[Node]:
    nodes = [Node() for _ in range(n)]
    for a, b in zip(nodes, nodes[1:] + nodes[:1]):
        a.other = b
    return nodes


def test_garbage_alive_when_the_loop_starts_is_freed_in_the_first_step():
    setup = {"ring": ring()}  # alive when the loop starts
    ref = weakref.ref(setup["ring"][0])

    def in_step(i: int) -> bool | None:
        if i == 0:
            setup.clear()  # dropped in the first step
        return ref() is not None if i == -1 else None

    assert steps_with(StepCollector(), 2, in_step) == [False, False]


def test_an_object_frozen_then_dropped_is_freed_at_the_next_renewal():
    kept: dict[str, Any] = {}
    refs: list[weakref.ref] = []

    def in_step(i: int) -> bool | None:
        if i == 0:
            kept["ring"] = ring()  # alive at step 0's end: frozen there
            refs.append(weakref.ref(kept["ring"][0]))
        if i == 1:
            kept.clear()  # dropped in step 1
        return refs[0]() is not None if i == -1 else None

    collector = StepCollector()
    # frozen garbage from step 1 to step 3's end; freed at step 4's (the 4th) renewal
    assert steps_with(collector, 5, in_step) == [True, True, True, False, False]
    assert collector.stats.renewals == 2


# -- garbage inside a step, against the program's own collector --------------------


def sync_grading(gradings: int = 6_000, nodes: int = 150) -> int:
    """A grader in one synchronous stretch (no await): each grading makes
    ``nodes`` small cycles and drops them. The peak count of such nodes
    alive at once, sampled at every collection."""
    alive = [0]
    peak = [0]

    class GradeNode:
        def __init__(self, parent):
            self.parent = parent
            self.children = []
            alive[0] += 1

        def __del__(self):
            alive[0] -= 1

    def sample(phase, info):
        if phase == "start":
            peak[0] = max(peak[0], alive[0])

    gc.callbacks.append(sample)
    try:
        for _ in range(gradings):
            root = GradeNode(None)
            for _ in range(nodes):
                child = GradeNode(root)
                root.children.append(child)
            del root, child
    finally:
        gc.callbacks.remove(sample)
    gc.collect()
    return peak[0]


def test_a_synchronous_grading_s_garbage_is_bounded_as_without_the_collector():
    gc.set_threshold(700, 10, 10)
    try:
        stock = sync_grading()
        collector = StepCollector()
        collector.loop_started()
        try:
            held_peak = sync_grading()
            stats = dict(vars(collector.stats))
        finally:
            collector.loop_ended()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*_default_thresholds)
    # 900,000 nodes made: with generation 1 held (the previous policy) over
    # a third waited for the step's end (350,000). Here what reaches the
    # oldest generation (one grading's nodes a generation-1 collection, ~35,000
    # at most) waits for the memory bound, a quarter of the long-lived small
    # objects: in a small process (a test's, ~10 MB) that can be all of them,
    # where CPython's count of a quarter of the long-lived objects collects
    # sooner; the floor is that many nodes and the young generations'.
    assert held_peak <= max(1.25 * stock, 50_000), (held_peak, stock, stats)


def test_garbage_reaching_the_old_generation_is_collected_inside_the_step(monkeypatch):
    # Cycles that live through a generation-1 collection, then die: only a
    # full collection frees them. With the headroom, armed by memory, in the
    # synchronous stretch itself; with `off`, none until the step's end.
    monkeypatch.setattr(_gc_step, "_CHECK_INTERVAL", 0.0)
    monkeypatch.setattr(_gc_step, "_CHECK_SHARE", 1.0)

    def churn(collector: StepCollector) -> tuple[int, int]:
        collector.loop_started()
        try:
            peak, window = 0, []
            for i in range(400_000):
                a, b = Node(), Node()
                a.other, b.other = b, a
                a.payload = bytearray(64)  # type: ignore[attr-defined]
                window.append(a)
                if len(window) > 20_000:
                    del window[:10_000]
                del a, b
                if i % 10_000 == 0:
                    peak = max(peak, len(gc.get_objects(generation=2)))
            return peak, collector.stats.guard_collections
        finally:
            collector.loop_ended()

    bounded, armed = churn(StepCollector(headroom=0.25))
    unbounded, never = churn(StepCollector(headroom=None))
    assert armed > 0 and never == 0
    assert unbounded > 300_000 and bounded < unbounded / 2, (bounded, unbounded)


def test_a_read_of_the_heap_that_costs_more_is_made_more_seldom(monkeypatch):
    # sys.getallocatedblocks() visits every pool: at 4 GB a read costs ~2.5
    # ms of CPU, and reading every 50 ms would cost 5% of the step. Each
    # read waits its own CPU time over _CHECK_SHARE (1%): a read of 10 ms,
    # once a second.
    import time

    reads: list[float] = []

    def slow_read() -> int:
        reads.append(time.monotonic())
        spent = time.thread_time() + 0.01
        while time.thread_time() < spent:  # CPU, as the read's walk is
            pass
        return 0  # never above the limit: nothing is armed

    monkeypatch.setattr(_gc_step, "_allocated_blocks", slow_read)
    collector = StepCollector(headroom=0.25)
    collector.loop_started()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # young collections all along
            cycle: list[Any] = []
            cycle.append(cycle)
            del cycle
    finally:
        collector.loop_ended()
    assert collector.stats.young_collections > 100, collector.stats
    assert 1 <= len(reads) <= 2, reads  # at 50 ms apart: 17 or more


def test_a_later_step_holds_its_work_in_flight_again_unscanned(monkeypatch):
    # Each step keeps a batch of objects to its end (work in flight, far
    # more than the headroom of what the process held): the first step's
    # armed collections find it live; the later steps' bound allows as much
    # again, and they run with no full collection but their end's.
    monkeypatch.setattr(_gc_step, "_CHECK_INTERVAL", 0.0)
    monkeypatch.setattr(_gc_step, "_CHECK_SHARE", 1.0)
    collector = StepCollector(headroom=0.25)
    armed_per_step = []
    collector.loop_started()
    try:
        batch = 2 * len(gc.get_objects())
        for _ in range(3):
            before = collector.stats.guard_collections
            in_flight = [{"i": [i]} for i in range(batch)]
            armed_per_step.append(collector.stats.guard_collections - before)
            del in_flight
            collector.step_ended()
    finally:
        collector.loop_ended()
    assert armed_per_step[0] >= 1 and armed_per_step[1:] == [0, 0], (armed_per_step, collector.stats)


def test_headroom_from_the_environment(monkeypatch):
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "0.05")
    collector = StepCollector()
    collector.loop_started()
    try:
        assert collector.headroom == 0.05
    finally:
        collector.loop_ended()
    assert StepCollector(headroom=0.5).headroom == 0.5  # a headroom given is not the variable's
    for raw, value in (("off", None), ("15%", 0.15), ("0", 0.0)):
        monkeypatch.setenv(_gc_step.HEADROOM_ENV, raw)
        assert _gc_step.headroom_from_env() == value
    monkeypatch.setenv(_gc_step.HEADROOM_ENV, "lots")
    with pytest.warns(UserWarning, match="TINKER_RL_DATA_GC_HEADROOM"):
        assert _gc_step.headroom_from_env() == _gc_step.DEFAULT_HEADROOM


def test_configure_sets_install_s_collector():
    try:
        collector = _gc_step.configure(headroom=0.05, young=900)
        assert collector is _gc_step.COLLECTOR and collector.headroom == 0.05 and collector.young == 900
        with pytest.raises(ValueError):
            _gc_step.configure(headroom=-1)
    finally:
        _gc_step.configure()
    assert _gc_step.COLLECTOR.headroom_setting is _gc_step._FROM_ENV


FORKED_IN_A_STEP = textwrap.dedent(
    """
    import gc, json, os
    from tinker_rl_data.cookbook import gc_step

    gc.set_threshold(1500, 7, 3)
    cpython_s = {name: getattr(gc, name) for name in gc_step.FRONT}
    before = [gc.isenabled(), list(gc.get_threshold()), len(gc.callbacks)]
    collector = gc_step.StepCollector(young=100)
    for hold in ("loop", "held step"):
        collector.loop_started() if hold == "loop" else collector.step_held()
        inside = list(gc_step.collector_thresholds())
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a pool's worker, forked inside the step
            state = [gc.isenabled(), list(gc_step.collector_thresholds()), len(gc.callbacks), collector.active]
            state.append([getattr(gc, name) is function for name, function in cpython_s.items()])
            os.write(write, json.dumps(state).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(read, 4096))
        still = [list(gc_step.collector_thresholds()), collector.active]  # the parent's step goes on
        collector.loop_ended() if hold == "loop" else collector.step_released()
        print(json.dumps({"hold": hold, "before": before, "inside": inside, "child": child, "parent": still}))
    """
)


def test_a_process_forked_inside_a_step_has_the_programs_collector():
    proc = subprocess.run([sys.executable, "-c", FORKED_IN_A_STEP], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.strip().splitlines():
        out = json.loads(line)
        assert out["inside"][1:] == [7, 2**30], out  # the step's policy, in the parent
        # not in the step: the program's collector, CPython's gc functions
        assert out["child"] == [*out["before"], False, [True] * len(_gc_step.FRONT)], out
        assert out["parent"] == [out["inside"], True], out



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


def test_a_pause_the_program_ends_inside_a_step_leaves_the_policy_held():
    # gc.disable() ... gc.enable() around a stretch (ray's serialization in
    # the driver, timeit): the policy goes on (the Ray executor's driver held
    # no step before 4b85707); a pause left on at the step's end steps it aside.
    def paused(i: int) -> None:
        gc.disable()
        gc.enable()

    collector = StepCollector()
    loop_with(collector, 3, paused)
    assert (collector.stats.steps, collector.stats.stepped_aside) == (3, "")
    collector = StepCollector()
    try:
        loop_with(collector, 3, lambda i: gc.disable() if i == 1 else None)
        assert collector.stats.steps == 1 and "gc.disable()" in collector.stats.stepped_aside
        assert not gc.isenabled()  # the program's, after the loop
    finally:
        gc.enable()
