"""The cyclic garbage collector held to the trainer's step.

A trainer step allocates hundreds of thousands of short-lived objects (each
sample request's coroutines, futures, frames, option objects) on top of a
few hundred thousand long-lived ones (torch, tinker, the cookbook). CPython
runs a full collection whenever the long-lived generation grows by a
quarter, and each one scans every tracked object: several per step, most of
the step's GC time. Here, while tinker-cookbook's training loop runs:

- once, when the loop starts (after the setup), one full collection, then
  ``gc.freeze()`` so the setup's objects are never scanned again (skipped if
  the program froze objects itself: :func:`program_froze`);
- inside a step, no collection of the older generations: young collections
  only (each scans the objects allocated since the last one); objects that
  survive one are not scanned again until the step ends;
- at the end of each step, one full collection;
- a guard for memory, relative to the process: when RSS passes the
  step's *limit*, one full collection runs early, on the training loop's
  event loop (a collection cannot start from inside another, where the
  guard looks; RSS is read at most every 50 ms, at young collections,
  from ``/proc/self/statm``: a forked child reads its own; a read that
  fails ends the RSS bound for that loop, quietly; without /proc, on
  macOS and Windows, there is no RSS bound).
  The limit is the RSS after this collector's last full collection plus a
  *headroom*: ``headroom`` times the RSS when the step started (0.15 by
  default), at least ``min_headroom`` bytes (32 MiB: a small process is
  not collected over noise). Memory a collection frees stays resident
  (CPython and malloc keep it for reuse), so after an early collection the
  next limit is that RSS plus the same headroom, not a fraction of it,
  until the step has grown by four headrooms; past that, plus a quarter of
  the step's growth so far (CPython's own rule for its full collections:
  when the long-lived objects grew by a quarter). Each early collection
  scans what the step keeps alive, so a fixed allowance would make a step
  that keeps G bytes pay for G / headroom collections of a growing heap
  (quadratic in the batch); with the quarter, their total work is at most
  about five times the step's final heap (linear). A step's cyclic
  garbage thus takes about ``headroom`` of the process's memory beyond
  what it took before (a quarter of a very large step's growth), whatever
  the process's size (a fixed number of bytes is both too much for a small
  client and too little to matter for a large one). Set it by
  ``StepCollector(headroom=...)``, for install()'s collector by
  :func:`configure`, or by the environment
  variable ``TINKER_RL_DATA_GC_HEADROOM`` (``0.1`` or ``10%``; ``off``:
  no RSS bound), read when a loop starts if no headroom was given. RSS
  alone cannot bound a step's cyclic garbage: what a collection frees
  stays resident and is reused unseen, so from step to step the garbage
  would take all the room the last step's left plus the headroom (RSS
  climbs to the live heap plus a whole step's garbage: 1.27x stock's peak
  on many_short, CPython 3.12). So the guard also collects when the
  objects that survived young collections since the last full one number
  as many as the process held when the step started (frozen and old
  objects, ``survivors_fraction`` 1.0 of them; at least 250,000, at most
  ``max_tracked``, 4 M; after an early collection, at least a quarter of
  the objects the step kept; an early collection by this bound that finds
  them live, freeing under a quarter, doubles it for the loop's later
  steps until it is twice what it found, up to 16 times; any early
  collection that frees half or more puts it back: a
  step's work in flight is not scanned again and again), and, if
  set, when RSS has grown by ``max_rss_growth`` bytes (an absolute cap,
  none by default);
- if a step function the loop calls is not this collector's (a user's
  wrapper sits there, which install() keeps, so that piece is left out),
  the loop's wrapper puts the step's end around it while the loop runs
  (the user's function is what runs, and is the name's value again when
  the loop ends; a step end nested in another is one): the policy is the
  same whichever of the step pieces went in, so long as the loop's did.
  Without the loop's piece the collector stays as the program left it;
- when the loop returns or raises, and on :meth:`StepCollector.restore`,
  the collector's state (enabled, thresholds, frozen objects, callbacks) is
  put back; a loop start that raises (the headroom's warning under
  ``-W error``, an interrupt in the first collection) leaves it as it was,
  the collector not active.

Steps with no training loop around them (a rollout worker's group
rollouts, :mod:`.workers`): :meth:`StepCollector.settle` once (the full
collection and the freeze), then :meth:`StepCollector.step_held` and
:meth:`StepCollector.step_released` around each step: the same policy
inside it, one full collection at its end, and between steps the
program's thresholds, enabled flag and callbacks (its other code is
collected as without this module); only the freeze stays. The feature's
``worker`` hook (:func:`worker_started`) does this in a worker where the
gc pieces went in, with a new collector of the defaults (the driver's
headroom: the worker takes its switches), and its guard's early
collection runs on whichever event loop is running where it fires (the
rollout's own ``asyncio.run`` loop or tinker's client thread).

Nothing here changes what the trainer computes, only when the collector
runs. The step boundary is the function each of ``rl.train``'s loops calls
once per step (sync and async: ``do_train_step_and_get_sampling_client``;
streaming minibatches, in both: ``do_train_step_streaming_and_get_sampling_client``);
the loop is one of ``do_sync_training``, ``do_async_training``,
``do_sync_training_with_stream_minibatch``, which ``rl.train.main`` looks up
by name when it runs. :meth:`StepCollector.pieces` lists them with the
wrapper factory for each; :data:`PIECES` (feature ``gc``) installs
:data:`COLLECTOR`'s wrappers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import inspect
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import switches
from ..patch.feature import Feature, Option, WorkerPart, WorkerStart
from ..patch.piece import Piece, ProbeFailed

TRAIN_MODULE = "tinker_cookbook.rl.train"
LOOP_FUNCTIONS = ("do_sync_training", "do_async_training", "do_sync_training_with_stream_minibatch")
STEP_FUNCTIONS = ("do_train_step_and_get_sampling_client", "do_train_step_streaming_and_get_sampling_client")

# A threshold no count reaches: generation 1 and 2 never collect on their own.
_NEVER = 2**30
# How often (seconds) a young collection reads RSS for the guard.
_RSS_CHECK_INTERVAL = 0.05
# CPython 3.12's collections move the immortal objects they meet into the
# frozen generation (375 of them in 3.12.1, made at startup; 3.11 and 3.13
# leave them), so there a freeze count up to this many is the interpreter's
# own. A program's gc.freeze() freezes every tracked object, far more.
_INTERPRETER_FROZEN = 4096 if sys.version_info[:2] == (3, 12) else 0

#: The environment variable for the guard's headroom (a fraction of RSS;
#: ``off`` for none), read when a loop starts if no headroom was given.
HEADROOM_ENV = switches.GC_HEADROOM
DEFAULT_HEADROOM = 0.15
DEFAULT_MIN_HEADROOM = 32 * 2**20
# After an early collection, the allowance is also at least this fraction of
# the step's growth so far (RSS, and objects kept for max_tracked): the early
# collections' work stays linear in the step's size (CPython's own full
# collections wait for 25% growth).
GROWTH_FRACTION = 0.25
# The step's survivors of young collections after which the guard collects
# early: this fraction of the objects the process held when the step
# started (frozen and old), at least MIN_SURVIVORS_BOUND. RSS cannot see
# the memory a collection frees (it stays resident and is reused), so a
# bound by RSS alone lets a step's cyclic garbage take all the room the
# last step's garbage left, plus the headroom: the count bounds it.
DEFAULT_SURVIVORS_FRACTION = 1.0
MIN_SURVIVORS_BOUND = 250_000
# An early collection the survivors' bound started that freed under a
# quarter of them (GROWTH_FRACTION) found the step's work in flight, not
# garbage: the bound doubles for the loop's later steps until it is twice
# what that collection found (up to this many times the fraction); an early
# collection (by this bound or RSS) that freed at least half of them puts it
# back at once.
# (Coalesced many_short: every step's early collection freed 0 of ~550,000
# survivors, ~650 ms a step.)
MAX_SURVIVORS_SCALE = 16
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


def program_froze() -> bool:
    """Whether the program froze objects itself (gc.freeze())."""
    return gc.get_freeze_count() > _INTERPRETER_FROZEN


class _StatmReader:
    """This process's resident set size in bytes, from /proc/self/statm.
    The descriptor is per process: a forked child's copy reads its parent
    (``/proc/self`` is resolved at open) and fails once the parent exits,
    so a child opens its own (a pid check: ~1 us; opening the file per
    read costs ~40 us more). The inherited one is left open there: its
    number may be another file's by then. (No lock: a fork would copy a
    held one; two threads opening at once leave one descriptor unused.)"""

    def __init__(self) -> None:
        self._pid = 0
        self._fd = -1

    def __call__(self) -> int:
        if self._pid != os.getpid():
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            self._pid = os.getpid()
        return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM = _StatmReader()


def _rss_reader() -> Callable[[], int] | None:
    """The reader of this process's RSS in bytes (None without /proc:
    macOS, Windows)."""
    try:
        _STATM()
    except (OSError, ValueError, IndexError):
        return None
    return _STATM


@dataclass
class StepStats:
    steps: int = 0
    young_collections: int = 0  # automatic, inside steps
    guard_collections: int = 0  # early full collections
    live_collections: int = 0  # early ones (by the survivors' bound) that found them live: the bound doubled
    tracked_checks: int = 0  # exact counts of the objects older than young
    step_collections: int = 0  # the one at each step's end
    froze: int = 0  # objects frozen when the loop started
    step_ends_added: int = 0  # step functions the loop wrapper put the step's end around
    peak_limit: int = 0  # the guard's highest RSS limit (bytes)
    rss_failures: int = 0  # loops whose RSS bound ended as a read of RSS failed


class StepCollector:
    """Holds the collector to the trainer's step while a training loop runs.

    ``young``: net new tracked objects between young collections inside a
    step (None: the threshold in effect when the loop starts, 700 by
    default; young collections free the short-lived cycles early and cost
    little, measured larger values were slower). ``headroom``: the guard
    collects early when RSS passes the RSS after the last full collection
    by this fraction of the RSS at the step's start (default: from
    :data:`HEADROOM_ENV`, else 0.15; None: no relative bound), at least
    ``min_headroom`` bytes, and at least a quarter of the step's growth so
    far (:data:`GROWTH_FRACTION`). ``max_rss_growth``: an absolute cap on that
    growth in bytes (None: none). ``survivors_fraction`` (None: none) of
    the objects held at the step's start (frozen and old; at least
    :data:`MIN_SURVIVORS_BOUND`), at most ``max_tracked`` (None: no cap):
    objects surviving young collections since the last full one after
    which the guard collects; after an early collection at least a quarter
    of the objects the step has kept so far; doubled for later steps by an
    early collection that finds them live (:data:`MAX_SURVIVORS_SCALE`).
    ``freeze``: freeze the setup's
    objects when the loop starts.
    """

    def __init__(
        self,
        young: int | None = None,
        headroom: float | None = _FROM_ENV,
        min_headroom: int = DEFAULT_MIN_HEADROOM,
        max_rss_growth: int | None = None,
        max_tracked: int | None = 4_000_000,
        freeze: bool = True,
        survivors_fraction: float | None = DEFAULT_SURVIVORS_FRACTION,
    ) -> None:
        self.stats = StepStats()
        self._lock = threading.RLock()
        self._depth = 0
        self._saved: tuple[bool, tuple[int, ...]] | None = None
        self._froze = False
        self._settled = False  # the first collection (and freeze) done: steps held without a loop
        self._passive = False
        self._own_collect = False
        self._guard_armed = False
        self._rss: Callable[[], int] | None = None
        self._rss_limit: int | None = None
        self._rss_step = 0
        self._last_check = 0.0
        self._next_tracked_check = 0
        self._kept = 0  # tracked objects the step's early collections left alive
        self._held = 0  # tracked objects (frozen and old) when the step started
        self._survivors_scale = 1  # the survivors' bound's multiple, learned from early collections
        self._by_survivors = False  # the armed early collection is the survivors' bound's
        self._loop: asyncio.AbstractEventLoop | None = None
        self._configure(young, headroom, min_headroom, max_rss_growth, max_tracked, freeze, survivors_fraction)
        _collectors.add(self)

    def _configure(
        self,
        young: int | None,
        headroom: float | None,
        min_headroom: int,
        max_rss_growth: int | None,
        max_tracked: int | None,
        freeze: bool,
        survivors_fraction: float | None = None,
    ) -> None:
        if young is not None and young < 1:
            raise ValueError(f"young must be at least 1, got {young}")
        if headroom is not _FROM_ENV and headroom is not None and not headroom >= 0:
            raise ValueError(f"headroom must be a fraction >= 0, got {headroom}")
        if min_headroom < 0:
            raise ValueError(f"min_headroom must be >= 0, got {min_headroom}")
        if survivors_fraction is not None and not survivors_fraction > 0:
            raise ValueError(f"survivors_fraction must be > 0, got {survivors_fraction}")
        self.young_setting = young
        self.young = young or 1
        self.headroom_setting = headroom
        self.headroom: float | None = None if headroom is _FROM_ENV else headroom
        self.min_headroom = min_headroom
        self.max_rss_growth = max_rss_growth
        self.max_tracked = max_tracked
        self.freeze = freeze
        self.survivors_fraction = survivors_fraction

    # -- the loop and its steps ------------------------------------------------

    def loop_started(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: where the guard's early collections run (none without).
        One full collection, the freeze, then the policy; if any of it
        raises, the collector is as the program had it (and not active)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                return
            self._survivors_scale = 1  # learned anew by each loop
            self._hold(loop, settle=True)

    def loop_ended(self) -> None:
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._put_back()

    def step_ended(self) -> None:
        with self._lock:
            if self._depth == 0 or self._passive:
                return
            self.stats.steps += 1
            self._collect()
            self.stats.step_collections += 1
            self._step_started(new_step=True)

    def settle(self) -> None:
        """Ahead of steps held without a loop (a rollout worker's setup):
        what a loop's start does first, once (a full collection, then the
        freeze); nothing if the program turned the collector off."""
        with self._lock:
            if self._depth or self._settled or not gc.isenabled() or gc.get_threshold()[0] == 0:
                return
            try:
                self._settle()
            except BaseException:
                self._put_back()
                raise

    def step_held(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """A step with no training loop around it (a rollout worker's group
        rollout) starts: the policy holds until :meth:`step_released`. The
        first does what a loop's start does (a full collection, the
        freeze); later ones collect nothing (the last step's end did), and
        the freeze stays between steps (:meth:`restore` ends it). Inside a
        running loop, one more level of it."""
        with self._lock:
            if self._depth:
                self._depth += 1
                return
            self._hold(loop, settle=not self._settled)

    def step_released(self) -> None:
        """The step :meth:`step_held` started ends: one full collection,
        then the program's thresholds, enabled flag and callbacks back (its
        own collections run between steps), the freeze kept."""
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth:
                return
            try:
                if not self._passive:
                    self.stats.steps += 1
                    self._collect()
                    self.stats.step_collections += 1
            finally:
                self._put_back(unfreeze=False)

    def restore(self) -> None:
        """Put the collector's state back now, even inside a running loop
        (whose later steps then leave the collector alone), and end a
        freeze kept between held steps."""
        with self._lock:
            self._depth = 0
            self._put_back()
            self._settled = False

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
            self.loop_started(asyncio.get_running_loop())
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
        if not self.active or self._passive:
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

    def _hold(self, loop: asyncio.AbstractEventLoop | None, settle: bool) -> None:
        """From inactive: the policy from here (``settle``: after one full
        collection and the freeze). Active only once all of it is in place;
        on an exception, what it changed is put back."""
        if not gc.isenabled() or gc.get_threshold()[0] == 0:
            # The program turned the collector off: leave it so.
            self._passive = True
            self._depth = 1
            return
        headroom = headroom_from_env() if self.headroom_setting is _FROM_ENV else self.headroom
        froze, settled = self._froze, self._settled
        try:
            self.headroom = headroom
            self._loop = loop
            wants_rss = self.headroom is not None or self.max_rss_growth is not None
            self._rss = _rss_reader() if wants_rss and self._rss is None else self._rss
            self._saved = (gc.isenabled(), gc.get_threshold())
            self.young = self.young_setting or max(1, gc.get_threshold()[0])
            if settle:
                self._settle()
            gc.callbacks.append(self._on_collection)
            self._step_started(new_step=True)
            gc.enable()
        except BaseException:
            self._put_back(unfreeze=not froze)
            self._settled = settled
            raise
        self._depth = 1

    def _settle(self) -> None:
        self._collect()
        if self.freeze and not program_froze():
            gc.freeze()
            self._froze = True
            self.stats.froze = gc.get_freeze_count()
        self._settled = True

    def _collect(self) -> int:
        self._own_collect = True
        try:
            return gc.collect()
        finally:
            self._own_collect = False

    def _step_started(self, new_step: bool) -> None:
        """After each of this collector's full collections: the young
        threshold and the guard's bounds from here."""
        self._guard_armed = False
        gc.set_threshold(self.young, _NEVER, _NEVER)
        if new_step:
            self._kept = 0
            if self.survivors_fraction is not None:
                self._held = gc.get_freeze_count() + len(gc.get_objects(generation=2))
        self._next_tracked_check = self._survivors_bound() if self._counts_survivors() else 0
        rss = self._read_rss()
        if rss is None:
            self._rss_limit = None
        else:
            if new_step or not self._rss_step:
                self._rss_step = rss
            headroom = self._rss_headroom(grown=rss - self._rss_step)
            self._rss_limit = None if headroom is None else rss + headroom
            self.stats.peak_limit = max(self.stats.peak_limit, self._rss_limit or 0)
            self._last_check = time.monotonic()

    def _rss_headroom(self, grown: int) -> int | None:
        """Bytes of RSS growth past the last full collection the guard
        allows (None: no RSS bound); ``grown``: the step's growth so far."""
        allowed = []
        if self.headroom is not None:
            relative = max(int(self.headroom * self._rss_step), self.min_headroom)
            allowed.append(max(relative, int(GROWTH_FRACTION * grown)))
        if self.max_rss_growth is not None:
            allowed.append(self.max_rss_growth)
        return min(allowed) if allowed else None

    def _counts_survivors(self) -> bool:
        return self.max_tracked is not None or self.survivors_fraction is not None

    def _survivors_bound(self) -> int:
        """Survivors of young collections past the last collection the
        guard allows: ``survivors_fraction`` of the objects held at the
        step's start (at least MIN_SURVIVORS_BOUND), at most
        ``max_tracked``, and at least a quarter of what the step kept
        through its early collections."""
        bound = self.max_tracked if self.max_tracked is not None else _NEVER
        if self.survivors_fraction is not None:
            bound = min(bound, self._relative_bound() * self._survivors_scale)
        return max(bound, int(GROWTH_FRACTION * self._kept))

    def _read_rss(self) -> int | None:
        """RSS in bytes (None: no reader). A read that fails (OSError) ends
        the RSS bound for this loop, quietly (counted in the stats): it
        runs in the user's loop and inside collections."""
        if self._rss is None:
            return None
        try:
            return self._rss()
        except (OSError, ValueError, IndexError):
            self._rss = None
            self._rss_limit = None
            self.stats.rss_failures += 1
            return None

    def _put_back(self, unfreeze: bool = True) -> None:
        while self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        if self._saved is not None:
            enabled, thresholds = self._saved
            gc.set_threshold(*thresholds)
            (gc.enable if enabled else gc.disable)()
            self._saved = None
        if self._froze and unfreeze:
            gc.unfreeze()
            self._froze = False
        self._guard_armed = False
        self._passive = False
        self._loop = None
        self._rss_step = 0
        self._rss_limit = None

    def _guard_collect(self) -> None:
        with self._lock:
            if self._depth == 0 or self._passive or not self._guard_armed:
                return
            # What this collection leaves alive of the step's survivors
            # (counted only for the max_tracked bound: a list of them).
            survivors = _survivors() if self._counts_survivors() else 0
            freed = self._collect()
            self._kept += max(0, survivors - freed)
            self.stats.guard_collections += 1
            if self.survivors_fraction is not None:  # (the scale is the relative bound's)
                self._learn(survivors, freed, by_survivors=self._by_survivors)
            self._step_started(new_step=False)

    def _relative_bound(self) -> int:
        return max(int((self.survivors_fraction or 0) * self._held), MIN_SURVIVORS_BOUND)

    def _learn(self, survivors: int, freed: int, by_survivors: bool) -> None:
        """The survivors' bound for the loop's later steps, from what an
        early collection found (see MAX_SURVIVORS_SCALE): raised only by
        its own collections, lowered by any that finds garbage."""
        if by_survivors and freed < GROWTH_FRACTION * survivors:
            relative = self._relative_bound()
            # Doubled until twice what it found live (a step's in-flight work
            # varies from step to step), at most MAX_SURVIVORS_SCALE times.
            while self._survivors_scale < MAX_SURVIVORS_SCALE and relative * self._survivors_scale < 2 * survivors:
                self._survivors_scale *= 2
            self.stats.live_collections += 1
        elif 2 * freed >= survivors:
            self._survivors_scale = 1

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside a collection (any thread, GIL held), where no other
        # can start: the guard's collection is handed to the event loop.
        if phase != "stop" or self._own_collect or self._depth == 0 or self._guard_armed:
            return
        self.stats.young_collections += 1
        loop = self._loop  # read once: another thread's step end may clear it
        if self._over_bound() and loop is not None:
            self._guard_armed = True
            try:
                loop.call_soon_threadsafe(self._guard_collect)
            except RuntimeError:  # the loop is closed
                self._guard_armed = False

    def _over_bound(self) -> bool:
        if self._counts_survivors():
            # Each young collection this step promoted at most `young`
            # objects: count them exactly only when that bound could be past.
            if gc.get_count()[1] * self.young >= self._next_tracked_check:
                self.stats.tracked_checks += 1
                survivors, bound = _survivors(), self._survivors_bound()
                if survivors >= bound:
                    self._by_survivors = True
                    return True
                self._next_tracked_check = gc.get_count()[1] * self.young + max(bound - survivors, 4 * self.young)
        self._by_survivors = False
        if self._rss is None or self._rss_limit is None:
            return False
        now = time.monotonic()
        if now - self._last_check < _RSS_CHECK_INTERVAL:
            return False
        self._last_check = now
        rss = self._read_rss()
        return rss is not None and self._rss_limit is not None and rss > self._rss_limit


def _survivors() -> int:
    """Objects that survived young collections since the last full one
    (the older generations are collected only in full: thresholds never)."""
    return len(gc.get_objects(generation=1))


# Every collector, for the fork hook below.
_collectors: weakref.WeakSet[StepCollector] = weakref.WeakSet()


def _forked_child() -> None:
    """A process forked inside a step (a pool made in a rollout, a grader's
    worker) is not in that step: none of its ends or guard's collections
    (on the parent's event loop) come there. Its collector is the
    program's again (thresholds, enabled, callbacks); the setup's freeze
    stays (those objects were live, and a frozen heap is what a fork
    wants)."""
    for collector in list(_collectors):
        collector._lock = threading.RLock()  # a thread of the parent may have held it
        if collector._depth:
            collector._depth = 0
            collector._put_back(unfreeze=False)


os.register_at_fork(after_in_child=_forked_child)

#: The collector ``cookbook.install()`` (``gc=True``, the default) holds to the step.
COLLECTOR = StepCollector()


def configure(
    headroom: float | None = _FROM_ENV,
    min_headroom: int = DEFAULT_MIN_HEADROOM,
    young: int | None = None,
    max_rss_growth: int | None = None,
    max_tracked: int | None = 4_000_000,
    freeze: bool = True,
    survivors_fraction: float | None = DEFAULT_SURVIVORS_FRACTION,
) -> StepCollector:
    """Set :data:`COLLECTOR`'s options (those of :class:`StepCollector`;
    unnamed ones to their defaults) and zero its stats; what
    ``cookbook.install(gc=..., gc_headroom=...)`` passes on. Takes effect
    when the next training loop starts."""
    with COLLECTOR._lock:
        if COLLECTOR.active:
            raise RuntimeError("the collector is held to a running training loop: configure it before")
        COLLECTOR._configure(young, headroom, min_headroom, max_rss_growth, max_tracked, freeze, survivors_fraction)
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
    import inspect

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


class _RunningLoop:
    """Where a worker's guard collection runs: the event loop running in
    the thread where the guard fires (a rollout's ``asyncio.run`` loop, or
    tinker's client thread). RuntimeError when there is none: the collector
    then tries again at a later young collection."""

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Any:
        return asyncio.get_running_loop().call_soon_threadsafe(callback, *args)


class RolloutSteps(WorkerPart):
    """In a rollout worker: each group rollout is a step of ``collector``
    (held before it, released after it, raised or not), the releases'
    full collections timed (``gc_step_ms``)."""

    def __init__(self, collector: StepCollector) -> None:
        self.collector = collector
        self.step_ms = 0.0

    @contextlib.contextmanager
    def rollout(self) -> Iterator[None]:
        self.collector.step_held(_RunningLoop())  # type: ignore[arg-type]  # a loop in call_soon_threadsafe only
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
    """The feature's ``worker`` hook: a new collector, settled (one full
    collection, the worker's imports frozen), held to each rollout; None
    in the driver's own process while its loop holds :data:`COLLECTOR`."""
    if COLLECTOR.active and start.inherited and not start.driver:
        COLLECTOR.restore()  # a copy of the driver's loop state
    if COLLECTOR.active:
        return None
    # No survivors' bound relative to the process here: it counts the old
    # generation at each step's start, and a worker's step is one group
    # rollout (measured: many_short in a spawn pool of 2, 18.4 s a step with
    # it, 6.8-7.2 s without, stock 15.1 s); the absolute bound and the RSS
    # guard stay.
    collector = StepCollector(survivors_fraction=None)
    collector.settle()
    return RolloutSteps(collector)


FEATURE = Feature(
    "gc",
    "GC held to the trainer's step",
    PIECES,
    options=(
        Option(
            "gc_headroom",
            None,
            "the collector's memory guard, as a fraction of RSS",
            variable=switches.GC_HEADROOM,
            example="0.1",
        ),
    ),
    configure=configured,
    worker=worker_started,
)
