"""The cyclic garbage collector held to the trainer's step.

CPython collects its oldest generation when the objects that survived into
it since its last such collection number a quarter of those it kept then,
and each of those collections scans every object the process holds:
torch's, tinker's and the cookbook's hundreds of thousands, and the step's
work in flight. In a many_short step that is most of the client's time.
While tinker-cookbook's training loop runs, this module changes three
things, and only when the collector runs:

- **The long-lived objects are frozen** (``gc.freeze()``) at the end of
  steps 1, 4, 16, 64, ...: later collections do not scan them. Each of
  these renewals first unfreezes and collects everything (~130 ms with
  torch imported: their cost fades as the run goes), so an object alive
  at one renewal that dies later is freed at the next; the first step runs
  with nothing frozen (garbage alive when the loop starts and dropped in
  the first step is freed in that step, as without this module). Not done
  when the program froze objects itself (:func:`program_froze`).
- **Inside a step, the oldest generation waits for memory, not for a
  count.** The young generations are collected as the program has them
  (its first threshold, every tenth a generation-1 collection: short-lived
  cycles die young, as they do without this module). The oldest is
  collected when the memory of Python's small objects
  (``sys.getallocatedblocks()``, frozen ones included, read at a young
  collection at most every 50 ms, or more seldom where a read would take
  more than 1% of the time: it visits the whole heap) has grown by ``headroom`` (0.25, as
  CPython's quarter, but of memory) of the step's long-lived objects (or of
  its work in flight, where that is larger) past what the last full
  collection left, or past the step's base plus the most an armed
  collection in an earlier step of the loop found in flight (a step may
  hold as much again without a scan of it). The collection is armed by
  the thresholds, so it runs in whichever thread allocates next, inside a
  synchronous stretch (a grader that never awaits) too; CPython's own
  check still applies (the objects that reached the oldest generation
  since its last collection are a quarter of those it kept then). The
  counts that make CPython scan the whole heap at every quarter of growth
  are gone, a bound on memory is kept: a step's garbage takes at most
  about ``headroom`` of the memory of the process's long-lived small
  objects (frozen ones included) before it is collected.
- **Each step ends with one full collection**: the step's work in flight,
  dead by then, is freed before the next step starts.

**The program's own calls are kept**, and no threshold of ours is ever
the program's. While the policy holds (a loop running, a worker's held
step), the gc module's ``set_threshold``, ``get_threshold``, ``disable``,
``enable``, ``freeze`` and ``unfreeze`` (:data:`FRONT`) are this module's:
``gc.get_threshold()`` shows the program's thresholds (as CPython would
hold them after the program's own calls), never the policy's; a
``gc.set_threshold()`` (1, 2 or 3 arguments: CPython merges it into the
program's thresholds, put in force first), ``gc.freeze()`` or
``gc.unfreeze()`` makes the policy step aside for the rest of the loop (one
log line) with the program's settings in force, the call made as CPython
makes it (a freeze takes this module's frozen objects in: they are the
program's from then; an unfreeze takes them out). ``gc.disable()`` and
``gc.enable()`` are CPython's: a pause the program ends itself inside a step
(ray's serialization, ``timeit``) leaves the policy as it was; a collector
the program left off at a step's end makes the policy step aside then.
``gc.collect()`` collects as it would (and restarts the count).
When the policy ends (the loop returns or raises, :meth:`StepCollector.restore`,
``uninstall()``, a fork in the child, stepping aside), the gc module's
functions are the very objects it had again; ours, wherever the program
kept them, act as the gc module's from then. Then the program's thresholds, enabled
flag and frozen objects are what its own calls made them: its thresholds,
its callbacks without ours, this module's frozen objects unfrozen unless
the program froze or unfroze.

Why the gc module's functions and not a check of the collector's state at
the step's end: a check after the fact cannot tell the program's calls from
ours (a 1-argument ``gc.set_threshold()`` keeps the policy's other two; the
freeze count shrinks as frozen objects die, whoever froze them), and
``gc.get_threshold()`` inside a step would show the policy's never, which a
program that saves it and sets it back later would keep for ever. What the
functions miss: a function bound before the loop started (``from gc import
set_threshold``) and a C extension's ``PyGC_Disable()``; for those the
step's end still checks: the collector off (not by a native call's pause,
which is not the program's) or thresholds not ours make the policy step
aside, with the program's thresholds where the values are still ours and
its own where it set them; a freeze count grown past this module's.

The native calls' own pause (``rust/py/gc.rs``: the collector off for a
call, counted across threads) is not the program's: a loop's start and a
step's end read the collector's flag as the program has it, and the
program's ``gc.disable()`` or ``gc.enable()`` made through these functions
while such a call is in flight (in another thread) is told to it, so that
the last call in flight leaves the program's flag.

``headroom`` is set by ``install(gc_headroom=...)`` or
``TINKER_RL_DATA_GC_HEADROOM`` (``0.25`` or ``25%``; ``0``: a full
collection as soon as anything grew; ``off``: none inside a step), the
same in the driver and in rollout workers.

Steps with no training loop around them (a rollout worker's group
rollouts, :mod:`.workers`): :meth:`StepCollector.step_held` and
:meth:`StepCollector.step_released` around each step: the same policy
inside it (renewals at a worker's rollouts 1, 4, 16, ...), and between
steps the program's thresholds, enabled flag and callbacks; the freeze
stays. The feature's ``worker`` hook (:func:`worker_started`) does this in
a worker where the gc pieces went in.

The step boundary is the function each of ``rl.train``'s loops calls once
per step (sync and async: ``do_train_step_and_get_sampling_client``;
streaming minibatches, in both: ``do_train_step_streaming_and_get_sampling_client``);
the loop is one of ``do_sync_training``, ``do_async_training``,
``do_sync_training_with_stream_minibatch``, which ``rl.train.main`` looks up
by name when it runs. If a step function the loop calls is not this
collector's (a user's wrapper, which install() keeps), the loop's wrapper
puts the step's end around it while the loop runs. :data:`PIECES` (feature
``gc``) installs :data:`COLLECTOR`'s wrappers.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import inspect
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import _core, features, switches
from ..patch.feature import Feature, Option, WorkerPart, WorkerStart
from ..patch.piece import Piece, ProbeFailed

TRAIN_MODULE = "tinker_cookbook.rl.train"
LOOP_FUNCTIONS = ("do_sync_training", "do_async_training", "do_sync_training_with_stream_minibatch")
STEP_FUNCTIONS = ("do_train_step_and_get_sampling_client", "do_train_step_streaming_and_get_sampling_client")

_log = logging.getLogger(__name__)

# A threshold no count reaches: the oldest generation never collects on its own.
_NEVER = 2**30
# How often (seconds) a young collection reads the small objects' memory, at
# most: sys.getallocatedblocks() visits every pool of the allocator, so a
# read costs in proportion to the heap (~0.1 ms at 1 GB, ~2.5 ms at 4 GB, a
# 16x many_short batch): the next read also waits the last one's CPU time
# (the thread's: a read the scheduler paused is not a costly one) over
# _CHECK_SHARE, so reading takes at most that share of the time.
_CHECK_INTERVAL = 0.05
_CHECK_SHARE = 0.01
_allocated_blocks = sys.getallocatedblocks

# The gc module's functions the program's calls go through while a policy
# holds (see "The program's own calls" above).
FRONT = ("set_threshold", "get_threshold", "disable", "enable", "freeze", "unfreeze")
# CPython's own, for this module's calls (never the program's front).
_real_set_threshold = gc.set_threshold
_real_get_threshold = gc.get_threshold
_real_freeze = gc.freeze
_real_unfreeze = gc.unfreeze
# The collector's flag as the program has it (a native call's pause is not
# the program's), and what tells the native calls in flight the program's
# gc.enable() / gc.disable() (rust/py/gc.rs).
_program_enabled = _core.gc_program_enabled
_tell_native_calls = _core.gc_program_set_enabled
# CPython 3.12's collections move the immortal objects they meet into the
# frozen generation (375 of them in 3.12.1, made at startup; 3.11 and 3.13
# leave them), so there a freeze count up to this many is the interpreter's
# own. A program's gc.freeze() freezes every tracked object, far more.
_INTERPRETER_FROZEN = 4096 if sys.version_info[:2] == (3, 12) else 0

#: The environment variable for the headroom (a fraction; ``off`` for none),
#: read when a loop starts if no headroom was given.
HEADROOM_ENV = switches.GC_HEADROOM
DEFAULT_HEADROOM = 0.25
# A sentinel: the headroom from the environment (else the default).
_FROM_ENV: Any = object()
# Set on this module's step wrappers (and copied by functools.wraps onto a
# user's wrapper around one): the collector whose step end it is.
_STEP_MARK = "_tinker_rl_data_step_of"

# Set while one of this module's step wrappers runs (in that task): a
# wrapper nested in another leaves the step's end to the outer one.
_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("tinker_rl_data_in_step", default=False)


def headroom_from_env(default: float | None = DEFAULT_HEADROOM) -> float | None:
    """:data:`HEADROOM_ENV` as a fraction (:func:`tinker_rl_data.switches.gc_headroom`)."""
    return switches.gc_headroom(default)


def collector_thresholds() -> tuple[int, ...]:
    """The thresholds CPython collects by now. While a policy holds,
    ``gc.get_threshold()`` shows the program's; this, the policy's."""
    return _real_get_threshold()


def program_froze() -> bool:
    """Whether the program froze objects itself (gc.freeze())."""
    return gc.get_freeze_count() > _INTERPRETER_FROZEN


def _is_renewal(step: int) -> bool:
    """Steps 1, 4, 16, 64, ... end with the freeze renewed."""
    return step & (step - 1) == 0 and step.bit_length() % 2 == 1


@dataclass
class StepStats:
    steps: int = 0
    young_collections: int = 0  # automatic ones of the young generations, inside steps
    guard_collections: int = 0  # full collections inside steps, armed by the memory bound
    program_collections: int = 0  # full collections the program ran itself (gc.collect()) inside steps
    step_collections: int = 0  # the one at each step's end
    renewals: int = 0  # step ends that renewed the freeze
    froze: int = 0  # objects frozen by the latest renewal
    step_ends_added: int = 0  # step functions the loop wrapper put the step's end around
    stepped_aside: str = ""  # why the collector stepped aside (the program's own settings)


class StepCollector:
    """Holds the collector to the trainer's step while a training loop runs
    (the module's docstring says how).

    ``young``: the young generation's threshold inside a step (None: the
    program's when the loop starts, 700 by default). ``headroom``: the
    growth of the small objects' memory since the last full collection, as
    a fraction of it, after which a full collection runs inside a step
    (default: from :data:`HEADROOM_ENV`, else 0.25; None: none until the
    step's end). ``freeze``: freeze the long-lived objects at the ends of
    steps 1, 4, 16, .... ``middle``: the generation-1 threshold inside a
    step (None: the program's, 10 by default; the bench's knob).
    """

    def __init__(
        self, young: int | None = None, headroom: float | None = _FROM_ENV, freeze: bool = True, middle: int | None = None
    ) -> None:
        self.stats = StepStats()
        self._lock = threading.RLock()
        self._depth = 0
        self._saved: tuple[int, ...] | None = None  # the program's thresholds (the enabled flag is never ours)
        self._ours: tuple[int, ...] = ()  # the thresholds this collector set last
        self._froze = 0  # the freeze count this collector left (0: none of ours)
        self._aside = False  # the program changed the collector's settings: hands off
        self._armed = False
        self._own_collect = False  # this collector's step-end collection is running
        self._middle = 10  # the program's generation-1 threshold, kept inside steps
        self._limit = 0  # allocated blocks past which a full collection is armed
        self._base = 0  # allocated blocks after the step's first collection (its long-lived objects)
        self._in_flight = 0  # the most blocks above its base an armed collection left in a step (this loop)
        self._next_check = 0.0
        self._renewals = 0  # step ends seen by the freeze's schedule (across a worker's held steps)
        # name: (ours, what the gc module had), while ours are in it
        self._front: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        self._front_live = [False]  # what those functions read: False once they are out
        self._configure(young, headroom, freeze, middle)
        _collectors.add(self)

    def _configure(self, young: int | None, headroom: float | None, freeze: bool, middle: int | None = None) -> None:
        if young is not None and young < 1:
            raise ValueError(f"young must be at least 1, got {young}")
        if headroom is not _FROM_ENV and headroom is not None and not headroom >= 0:
            raise ValueError(f"headroom must be a fraction >= 0, got {headroom}")
        self.young_setting = young
        self.young = young or 700
        self.headroom_setting = headroom
        self.headroom: float | None = None if headroom is _FROM_ENV else headroom
        self.freeze = freeze
        self.middle_setting = middle

    # -- the loop and its steps ------------------------------------------------

    def loop_started(self) -> None:
        """The policy from here, until :meth:`loop_ended`; nothing if the
        program turned the collector off."""
        with self._lock:
            if self._depth:
                self._depth += 1
                return
            self._renewals = 0
            self._in_flight = 0
            self._hold()

    def loop_ended(self) -> None:
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._put_back()

    def step_ended(self) -> None:
        """One full collection (a renewal of the freeze at steps 1, 4, 16,
        ...), then the next step's bound."""
        with self._lock:
            if self._depth == 0 or self._aside or self._program_changed():
                return
            self.stats.steps += 1
            self._end_step()
            if not self._aside:
                self._start_step(new_step=True)

    def step_held(self) -> None:
        """A step with no training loop around it (a rollout worker's group
        rollout) starts: the policy holds until :meth:`step_released`.
        Inside a running loop, one more level of it."""
        with self._lock:
            if self._depth:
                self._depth += 1
                return
            self._hold()

    def step_released(self) -> None:
        """The step :meth:`step_held` started ends: one full collection (a
        renewal at the worker's steps 1, 4, 16, ...), then the program's
        thresholds, enabled flag and callbacks back, the freeze kept."""
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth:
                return
            try:
                if not self._aside and not self._program_changed():
                    self.stats.steps += 1
                    self._end_step()
            finally:
                self._put_back(unfreeze=False)

    def restore(self) -> None:
        """Put the collector's state back now, even inside a running loop
        (whose later steps then leave the collector alone), and end a
        freeze kept between held steps."""
        with self._lock:
            self._depth = 0
            self._put_back()
            self._renewals = 0
            self._in_flight = 0

    @property
    def active(self) -> bool:
        return self._depth > 0

    # -- wrappers ----------------------------------------------------------------

    def wrap_loop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A training loop (async): the policy holds while it runs. A step
        function in the loop's module that is not this collector's (a
        user's wrapper kept by install()) gets the step's end around it
        while the loop runs."""

        @functools.wraps(original)
        async def loop(*args: Any, **kwargs: Any) -> Any:
            self.loop_started()
            added = []
            try:
                added = self._add_step_ends(original)
                return await original(*args, **kwargs)
            finally:
                for namespace, name, theirs, ours in added:
                    if namespace.get(name) is ours:
                        namespace[name] = theirs
                self.loop_ended()

        return loop

    def wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A once-per-step function (async): the step ends when it returns
        (once, if two of these wrappers are nested)."""

        @functools.wraps(original)
        async def step(*args: Any, **kwargs: Any) -> Any:
            if _IN_STEP.get():
                return await original(*args, **kwargs)
            token = _IN_STEP.set(True)
            try:
                result = await original(*args, **kwargs)
            finally:
                _IN_STEP.reset(token)
            self.step_ended()
            return result

        setattr(step, _STEP_MARK, self)
        return step

    def make_wrapper(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The wrapper factory for ``rl.train``'s function ``name``."""
        if name in LOOP_FUNCTIONS:
            return self.wrap_loop
        if name in STEP_FUNCTIONS:
            return self.wrap_step
        raise KeyError(name)

    def pieces(self) -> list[tuple[str, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
        """(module, name, make_wrapper) for every function to wrap."""
        return [(TRAIN_MODULE, name, self.make_wrapper(name)) for name in LOOP_FUNCTIONS + STEP_FUNCTIONS]

    # -- internals -----------------------------------------------------------------

    def _add_step_ends(self, loop_function: Callable[..., Any]) -> list[tuple[dict[str, Any], str, Any, Any]]:
        """Where the loop looks its step functions up (its module's
        globals), wrap each that is not ours; (namespace, name, theirs,
        ours) for each wrapped."""
        if not self.active or self._aside:
            return []
        namespace = getattr(inspect.unwrap(loop_function), "__globals__", None)
        if not isinstance(namespace, dict):
            return []
        added = []
        for name in STEP_FUNCTIONS:
            theirs = namespace.get(name)
            if theirs is None or getattr(theirs, _STEP_MARK, None) is self:
                continue
            if not inspect.iscoroutinefunction(theirs):
                continue
            ours = self.wrap_step(theirs)
            namespace[name] = ours
            added.append((namespace, name, theirs, ours))
            self.stats.step_ends_added += 1
        return added

    def _hold(self) -> None:
        """From inactive: the policy from here. Active only once all of it
        is in place; on an exception, what it changed is put back."""
        self._depth = 1
        if not _program_enabled() or _real_get_threshold()[0] == 0:
            self._aside = True  # the program turned the collector off: leave it so
            return
        if _front_holder() not in (None, self):
            self._aside = True  # another collector's policy holds (one at a time)
            return
        try:
            if self.headroom_setting is _FROM_ENV:
                self.headroom = headroom_from_env()
            self._saved = _real_get_threshold()
            self.young = self.young_setting or self._saved[0]
            self._middle = self.middle_setting or self._saved[1]
            gc.callbacks.append(self._on_collection)
            self._install_front()
            self._start_step(new_step=True)
        except BaseException:
            self._depth = 0
            self._put_back()
            raise

    def _start_step(self, new_step: bool = False) -> None:
        """After a full collection (``new_step``: the step's first): the
        memory bound and the thresholds from here (in this order: a young
        collection may run as soon as they are set). The bound: what is
        held now, or the step's base plus an earlier step's work in flight,
        plus the headroom of the larger of the base and what is in flight
        (so that a step growing far past its base is collected a bounded
        number of times, each scan paid for by as much growth)."""
        if self.headroom is not None:
            now = sys.getallocatedblocks()
            if new_step:
                self._base = now
            held = max(now, self._base + self._in_flight)
            self._limit = int(held + self.headroom * max(self._base, held - self._base))
        self._armed = False
        self._next_check = 0.0
        self._set_thresholds(self.young, self._middle, _NEVER)

    def _set_thresholds(self, *thresholds: int) -> None:
        _real_set_threshold(*thresholds)
        self._ours = _real_get_threshold()

    def _end_step(self) -> None:
        """The step's full collection; at steps 1, 4, 16, ... the freeze
        renewed around it."""
        self._renewals += 1
        renew = self.freeze and _is_renewal(self._renewals)
        if renew and self._froze and _program_froze_over(self._froze):
            self._step_aside("the program froze objects itself (gc.freeze())")
            renew = False
        if renew and self._froze:
            _real_unfreeze()
            self._froze = 0
        self._own_collect = True
        try:
            gc.collect()
            self.stats.step_collections += 1
            if renew and not program_froze():
                _real_freeze()
                # Once more over what is left unfrozen (nearly nothing):
                # CPython then counts the oldest generation's growth from the
                # objects not frozen, so that an armed collection is not
                # refused for the count of those just frozen.
                gc.collect()
                self._froze = gc.get_freeze_count()
                self.stats.froze = self._froze
                self.stats.renewals += 1
        finally:
            self._own_collect = False

    def _program_changed(self) -> bool:
        """Whether the program turned the collector off or set its
        thresholds past the gc module's functions (functions it bound
        before the loop started, a C extension): if so, step aside. A
        native call's pause in flight (another thread) is not the program's."""
        if not _program_enabled():
            self._step_aside("the program turned the collector off (gc.disable())")
        elif _real_get_threshold() != self._ours:
            self._step_aside(f"the program set the thresholds to {self._programs_thresholds()} (gc.set_threshold())")
        return self._aside

    def _programs_thresholds(self) -> tuple[int, ...]:
        """The program's thresholds: those it had, with what it set past
        the gc module's functions over ours (a value still ours is not)."""
        now = _real_get_threshold()
        if self._saved is None or len(self._ours) != len(now):
            return now
        return tuple(mine if value == ours else value for value, ours, mine in zip(now, self._ours, self._saved))

    def _step_aside(self, why: str) -> None:
        """The program's settings stay in force for the rest of the loop:
        the gc module's functions and the program's thresholds back, nothing
        of ours runs again; the freeze is undone at the loop's end only if
        it is still ours alone."""
        if self._aside:
            return
        self._aside = True
        self._remove_callback()
        self._remove_front()
        if self._saved is not None:
            _real_set_threshold(*self._programs_thresholds())
        self._saved = None
        self._armed = False
        self.stats.stepped_aside = why
        _log.warning("tinker_rl_data: the GC policy steps aside for the rest of this training loop: %s", why)

    def _install_front(self) -> None:
        """The program's calls of the gc module's :data:`FRONT` functions
        go through ours from here (see the module's doc)."""
        global _holder
        originals = {name: getattr(gc, name) for name in FRONT}
        live = self._front_live = [True]

        def theirs(name: str, ours: Callable[..., Any]) -> Callable[..., Any]:
            # Once ours are out: what the gc module has then (not ourselves).
            now = getattr(gc, name)
            return originals[name] if now is ours else now

        def get_threshold() -> tuple[int, ...]:
            thresholds = self._saved
            if live[0] and thresholds is not None:
                return thresholds
            return theirs("get_threshold", get_threshold)()  # type: ignore[no-any-return]

        def set_threshold(*args: Any, **kwargs: Any) -> None:
            with self._lock:
                if not live[0]:
                    return theirs("set_threshold", set_threshold)(*args, **kwargs)
                # The program's thresholds in force first: CPython then
                # merges its call (1 or 2 arguments) into them, errors included.
                self._step_aside("the program set its thresholds (gc.set_threshold())")
                return originals["set_threshold"](*args, **kwargs)  # type: ignore[no-any-return]

        def disable() -> None:
            # No stepping aside here: a pause the program ends itself
            # (gc.disable() ... gc.enable() around a stretch, as ray's and
            # timeit's are) leaves the policy as it was; a collector still
            # off at the step's end makes it step aside then.
            if not live[0]:
                return theirs("disable", disable)()  # type: ignore[no-any-return]
            originals["disable"]()
            _tell_native_calls(False)

        def enable() -> None:
            # The program's own pause ends (a native call in flight puts the
            # collector back on at its end).
            if not live[0]:
                return theirs("enable", enable)()  # type: ignore[no-any-return]
            originals["enable"]()
            _tell_native_calls(True)

        def freeze() -> None:
            with self._lock:
                if not live[0]:
                    return theirs("freeze", freeze)()  # type: ignore[no-any-return]
                self._froze = 0  # the program's freeze takes ours in: its own from here
                self._step_aside("the program froze objects itself (gc.freeze())")
                return originals["freeze"]()  # type: ignore[no-any-return]

        def unfreeze() -> None:
            with self._lock:
                if not live[0]:
                    return theirs("unfreeze", unfreeze)()  # type: ignore[no-any-return]
                self._froze = 0  # the program's unfreeze takes ours out too
                self._step_aside("the program unfroze objects (gc.unfreeze())")
                return originals["unfreeze"]()  # type: ignore[no-any-return]

        ours: dict[str, Callable[..., Any]] = {
            "get_threshold": get_threshold,
            "set_threshold": set_threshold,
            "disable": disable,
            "enable": enable,
            "freeze": freeze,
            "unfreeze": unfreeze,
        }
        for name, function in ours.items():
            function.__name__ = name
            function.__doc__ = originals[name].__doc__
            function.__wrapped__ = originals[name]  # type: ignore[attr-defined]
        self._front = {name: (function, originals[name]) for name, function in ours.items()}
        for name, function in ours.items():
            setattr(gc, name, function)
        _holder = weakref.ref(self)

    def _remove_front(self) -> None:
        """The gc module's functions back (the very objects it had), where
        ours are still there; ours, wherever the program keeps them, act
        as the gc module's from here."""
        global _holder
        self._front_live[0] = False
        for name, (function, original) in self._front.items():
            if getattr(gc, name, None) is function:
                setattr(gc, name, original)
        self._front = {}
        if _front_holder() is self:
            _holder = None

    def _remove_callback(self) -> None:
        while self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _put_back(self, unfreeze: bool = True) -> None:
        self._remove_callback()
        self._remove_front()
        if self._saved is not None:
            _real_set_threshold(*self._programs_thresholds())
            self._saved = None
        if unfreeze and self._froze:
            if not _program_froze_over(self._froze):  # still ours alone
                _real_unfreeze()
            self._froze = 0
        self._armed = False
        self._aside = False
        self._ours = ()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside a collection, in whichever thread allocated (GIL held,
        # no other collection can start): no lock, no collection, no log and
        # no change to gc.callbacks (CPython is iterating it) from here. A
        # program's own settings are seen and answered at the step's end.
        if phase != "stop" or self._depth == 0 or self._aside or _real_get_threshold() != self._ours:
            return
        if info["generation"] == 2:
            if self._armed:
                self.stats.guard_collections += 1
                # What it left above the step's base is the step's work in
                # flight: later steps may hold as much again unscanned.
                self._in_flight = max(self._in_flight, sys.getallocatedblocks() - self._base)
            elif not self._own_collect:
                self.stats.program_collections += 1
            self._start_step()
            return
        self.stats.young_collections += 1
        if self._armed or self.headroom is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        cpu = time.thread_time()
        blocks = _allocated_blocks()
        cost = time.thread_time() - cpu
        self._next_check = now + max(_CHECK_INTERVAL, cost / _CHECK_SHARE)
        if blocks > self._limit:
            # The next young collections go on to the oldest generation
            # (CPython's own quarter check still applies).
            self._armed = True
            self._set_thresholds(self.young, 0, 0)


# The collector whose functions are in the gc module (one at a time).
_holder: weakref.ref[StepCollector] | None = None


def _front_holder() -> StepCollector | None:
    return _holder() if _holder is not None else None


def _program_froze_over(count: int) -> bool:
    """Whether the program froze objects over the ``count`` this module
    froze: the count grew (beyond the immortal objects CPython 3.12's
    collections move there). Frozen objects that die leave the count, so it
    only shrinks otherwise."""
    return gc.get_freeze_count() > count + _INTERPRETER_FROZEN


# Every collector, for the fork hook below.
_collectors: weakref.WeakSet[StepCollector] = weakref.WeakSet()


def _forked_child() -> None:
    """A process forked inside a step (a pool made in a rollout, a grader's
    worker) is not in that step: none of its ends come there. Its
    collector is the program's again (thresholds, enabled, callbacks); the
    freeze stays (those objects were live, and a frozen heap is what a
    fork wants)."""
    for collector in list(_collectors):
        collector._lock = threading.RLock()  # a thread of the parent may have held it
        if collector._depth:
            collector._depth = 0
            collector._put_back(unfreeze=False)


os.register_at_fork(after_in_child=_forked_child)

#: The collector ``cookbook.install()`` (``gc=True``, the default) holds to the step.
COLLECTOR = StepCollector()


def configure(
    headroom: float | None = _FROM_ENV, young: int | None = None, freeze: bool = True, middle: int | None = None
) -> StepCollector:
    """Set :data:`COLLECTOR`'s options (those of :class:`StepCollector`;
    unnamed ones to their defaults) and zero its stats; what
    ``cookbook.install(gc=..., gc_headroom=...)`` passes on. Takes effect
    when the next training loop starts."""
    with COLLECTOR._lock:
        if COLLECTOR.active:
            raise RuntimeError("the collector is held to a running training loop: configure it before")
        COLLECTOR._configure(young, headroom, freeze, middle)
        COLLECTOR.stats = StepStats()
    return COLLECTOR


def make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """The patch layer's ``make``: :data:`COLLECTOR`'s wrapper of
    ``rl.train``'s loop or step function ``original``."""
    return COLLECTOR.make_wrapper(original.__name__)(original)


def probe_wrapper(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """The wrappers change when the collector runs, nothing else: what the
    probe checks is that the cookbook's function is still what they wrap
    (a coroutine function, as the loop awaits it)."""
    if not (inspect.iscoroutinefunction(original) and inspect.iscoroutinefunction(ours)):
        raise ProbeFailed(f"{original.__name__} is no longer a coroutine function")
    if ours.__wrapped__ is not original:  # type: ignore[attr-defined]
        raise ProbeFailed("the wrapper does not call the cookbook's function")


def uninstalled() -> None:
    """The patch layer's ``undo``: the collector's state back."""
    COLLECTOR.restore()


PIECES = tuple(
    Piece(
        TRAIN_MODULE,
        name,
        "gc",
        make_wrapper,
        probe_wrapper,
        label=f"GC held to the step: {name}",
        undo=uninstalled,
    )
    for name in (*LOOP_FUNCTIONS, *STEP_FUNCTIONS)
)


def configured(options: Any) -> None:
    """The feature's ``configure``: install()'s ``gc_headroom``, when given,
    for the collector's next loop."""
    if options.get("gc_headroom") is not None and not COLLECTOR.active:
        configure(headroom=options["gc_headroom"])


class RolloutSteps(WorkerPart):
    """In a rollout worker: each group rollout is a step of ``collector``
    (held before it, released after it, raised or not), the releases'
    full collections timed (``gc_step_ms``)."""

    def __init__(self, collector: StepCollector) -> None:
        self.collector = collector
        self.step_ms = 0.0

    @contextlib.contextmanager
    def rollout(self) -> Iterator[None]:
        self.collector.step_held()
        try:
            yield
        finally:
            start = time.perf_counter()
            self.collector.step_released()
            self.step_ms += (time.perf_counter() - start) * 1e3

    def counters(self) -> dict[str, Any]:
        stats = self.collector.stats
        return {
            "gc_step_ms": round(self.step_ms, 1),
            "gc_steps": stats.steps,
            "gc_guard_collections": stats.guard_collections,
            "gc_young_collections": stats.young_collections,
            "gc_froze": stats.froze,
        }


def worker_started(start: WorkerStart) -> RolloutSteps | None:
    """The feature's ``worker`` hook: a new collector (the driver's
    headroom: the worker takes its switches) held to each rollout; None in
    the driver's own process while its loop holds :data:`COLLECTOR`."""
    if COLLECTOR.active and start.inherited and not start.driver:
        COLLECTOR.restore()  # a copy of the driver's loop state
    if COLLECTOR.active:
        return None
    return RolloutSteps(StepCollector())


FEATURE = features.register(
    __name__,
    Feature(
        "gc",
        "GC held to the trainer's step",
        PIECES,
        options=(
            Option(
                "gc_headroom",
                None,
                "how far the small objects' memory grows in a step before a full collection, as a fraction",
                variable=switches.GC_HEADROOM,
                example="0.5",
            ),
        ),
        configure=configured,
        worker=worker_started,
    ),
)
