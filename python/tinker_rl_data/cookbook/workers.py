"""install() in the cookbook's rollout workers.

When ``rl.train.main(config, rollout_executor=...)`` runs with a process pool
(``spawn`` or ``forkserver``; the cookbook refuses ``fork``) or any
``concurrent.futures.Executor`` over other processes (Ray, a cluster), each
group's rollout runs in a worker through
``tinker_cookbook.rl.rollouts._run_rollout_sync``, which
``do_group_rollout_and_filter_constant_reward`` submits by name. A worker
imports tinker and the cookbook fresh: nothing of the driver's install()
is there.

The piece (:data:`PIECES`, feature ``"workers"``) puts a
:class:`RolloutEntry` at ``rollouts._run_rollout_sync``. In the driver it
is the cookbook's function (a thread pool runs it as it is: the pieces are
in that process already). Pickled, it carries the driver's settings as
they are when the task is sent (:func:`follow` sets them at the end of
``cookbook.install``, :func:`stop` clears them, the piece's undo too), and
in the worker process:

- once per process, before its first rollout, the patch layer's install with the
  driver's options and its strict switch, with the
  driver's ``TINKER_RL_DATA_*`` variables set where the worker has none:
  the same pieces, each decided by its probe on the worker. A worker where
  some are left out says so with one warning (in that worker) and goes on;
  one whose install raises (a bug) warns once and runs the cookbook's
  functions. With ``strict``, the worker's ``InstallError`` is raised by
  the task, so the driver's run stops with it, as a strict install there
  would. Settings ``None`` (the driver uninstalled before the task was
  sent): the worker installs nothing.
- where the gc pieces went in (``"gc"`` asked, not skipped, probes
  passed): a group rollout is the worker's step. A
  :class:`~tinker_rl_data.cookbook.gc_step.StepCollector` with the driver's
  defaults (the same memory guard) settles at the install (one full
  collection, the worker's imports frozen), holds the collector to young
  collections during each rollout, collects fully at its end and puts the
  program's thresholds and callbacks back until the next (the freeze
  stays); the guard's early collection runs on whichever event loop is
  running where it fires (the rollout's own ``asyncio.run`` loop or
  tinker's client thread).
- then the cookbook's own ``_run_rollout_sync``.

What the workers did, the driver sees: a worker's result travels back
wrapped so that unpickling it in the driver hands the cookbook the plain
result and records, per worker (host, pid), its install summary (with its
first result) and its counters (rollouts, GC steps and collections,
coalesced sample calls; with every result, a few dozen bytes).
:func:`seen` returns them, :func:`describe` renders them for ``status()``,
and each worker's first summary is logged once on the ``tinker_rl_data``
logger: INFO when it installed what the driver did, WARNING naming what it
left out otherwise.

The feature's second piece, for the rollouts themselves: before CPython
3.13, ``asyncio.run`` (once per group rollout in a worker) built the
repr of each rollout's result and dropped it (:func:`make_int_to_enum`);
its probe leaves it out, quietly, where the Python at hand does not.

In a worker, the entry piece is installed too (the same features as the
driver) and does nothing there: tasks arrive as what the driver pickled.

Wiring: :data:`PIECES` (feature ``workers``, selected by every
``cookbook.install``) puts :func:`make_entry` at the name; ``cookbook.install``
ends with :func:`follow`, ``cookbook.uninstall`` with :func:`stop` (the
piece's undo does it too); ``status()`` adds :func:`describe`'s lines.

Not handled: a worker installed by one driver settings stays so (an
``uninstall()`` or a new ``install()`` in the driver changes what new
workers do, not what running ones did); ``TINKER_RL_DATA_INT_READ`` is
read when the native core loads, before the driver's value can be set in
a worker that lacks it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InstallError, InstallWarning, NotNeeded, ProbeFailed
from ..patch.piece import Piece

logger = logging.getLogger("tinker_rl_data")

ROLLOUTS_MODULE = "tinker_cookbook.rl.rollouts"
ENTRY_NAME = "_run_rollout_sync"
OWNER = "tinker_rl_data.cookbook"


# --------------------------------------------------------------------------
# The driver's settings


@dataclass(frozen=True)
class Settings:
    """What a worker installs: the driver's options, its strict switch
    (resolved), its ``TINKER_RL_DATA_*`` variables, and who the driver is
    (host, pid)."""

    options: tuple[str, ...]
    strict: bool
    env: tuple[tuple[str, str], ...]
    driver: tuple[str, int]


_settings: Settings | None = None
_settings_lock = threading.Lock()


def _me() -> tuple[str, int]:
    return (socket.gethostname(), os.getpid())


def follow(options: Any, strict: bool | None = None, gc_headroom: float | None = None) -> None:
    """The driver installed ``options``: the workers will install the same
    (``cookbook.install`` calls this last); ``gc_headroom``, install()'s
    option, travels as the worker's ``TINKER_RL_DATA_GC_HEADROOM``."""
    from .. import switches

    global _settings
    variables = {k: v for k, v in os.environ.items() if k.startswith("TINKER_RL_DATA_")}
    if gc_headroom is not None:
        variables["TINKER_RL_DATA_GC_HEADROOM"] = repr(float(gc_headroom))
    env = tuple(sorted(variables.items()))
    with _settings_lock:
        if switches.disabled():
            _settings = None  # install() was a no-op: so are the workers'
            return
        _settings = Settings(
            options=tuple(sorted(set(options))),
            strict=switches.strict(strict),
            env=env,
            driver=_me(),
        )


def stop() -> None:
    """No new worker installs (``cookbook.uninstall``, and the piece's undo)."""
    global _settings
    with _settings_lock:
        _settings = None


def current() -> Settings | None:
    return _settings


# --------------------------------------------------------------------------
# The piece: rollouts._run_rollout_sync


class RolloutEntry:
    """What ``rollouts._run_rollout_sync`` holds while installed. Called in
    the driver's process (a thread pool): the cookbook's function. Pickled
    (a process pool, Ray): a :class:`_WorkerEntry` with the driver's
    settings of that moment."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        self.__wrapped__ = original
        self.__name__ = getattr(original, "__name__", ENTRY_NAME)
        self.__qualname__ = getattr(original, "__qualname__", ENTRY_NAME)
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, task: Any) -> Any:
        return self.original(task)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_WorkerEntry, (_settings,))

    def __repr__(self) -> str:
        return f"<tinker_rl_data worker entry for {ROLLOUTS_MODULE}.{ENTRY_NAME}>"


class _WorkerEntry:
    """The entry as unpickled where the rollout runs."""

    def __init__(self, settings: Settings | None) -> None:
        self.settings = settings

    def __call__(self, task: Any) -> Any:
        return run_rollout(self.settings, task)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_WorkerEntry, (self.settings,))


def make_entry(original: Callable[..., Any]) -> RolloutEntry:
    """The patch layer's ``make``."""
    return RolloutEntry(original)


def probe_entry(original: Callable[..., Any], ours: Any) -> None:
    """The entry runs the cookbook's function; what it relies on is that
    the cookbook still submits one module-level function taking the task."""
    import inspect
    import pickle

    if inspect.iscoroutinefunction(original) or list(inspect.signature(original).parameters) != ["task"]:
        raise ProbeFailed(f"{ENTRY_NAME} is no longer a function of the task")
    if ours.original is not original:
        raise ProbeFailed("the entry does not call the cookbook's function")
    if type(pickle.loads(pickle.dumps(ours))) is not _WorkerEntry:
        raise ProbeFailed("the entry does not pickle")


def uninstalled() -> None:
    """The patch layer's ``undo``."""
    stop()


# --------------------------------------------------------------------------
# In the worker


class _RunningLoop:
    """Where the worker's guard collection runs: the event loop running in
    the thread where the guard fires (a rollout's ``asyncio.run`` loop, or
    tinker's client thread). RuntimeError when there is none: the collector
    then tries again at a later young collection."""

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Any:
        return asyncio.get_running_loop().call_soon_threadsafe(callback, *args)


@dataclass
class _Worker:
    settings: Settings | None = None
    how: str = ""  # installed, inherited, failed, disabled
    installed: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    probe_ms: float = 0.0
    setup_ms: float = 0.0
    collector: Any = None
    rollouts: int = 0
    step_gc_ms: float = 0.0
    summary_sent: bool = False


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _original() -> Callable[..., Any]:
    import importlib

    function = getattr(importlib.import_module(ROLLOUTS_MODULE), ENTRY_NAME)
    while isinstance(function, RolloutEntry):  # a process that holds ours (forked, or the driver's)
        function = function.original
    return function  # type: ignore[no-any-return]


def _set_up(settings: Settings) -> _Worker:
    """Install in this process, once."""
    from ..patch import transaction as _patch

    state = _Worker(settings=settings)
    if _patch.installed():
        # This process has the pieces already (the driver's own process, or
        # a copy of it): nothing to decide again.
        state.how = "inherited"
        state.installed = [title for title, _ in _patch.status().installed]
    else:
        for key, value in settings.env:
            os.environ.setdefault(key, value)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                report = _patch.install(settings.options, owner=OWNER, strict=settings.strict)
            except InstallError:
                raise  # strict: the task fails, as the driver's install would
            except Exception as exc:  # a bug: the cookbook's functions run
                state.how = "failed"
                state.left = [("install", f"{type(exc).__name__}: {exc}")]
                report = None
        if report is not None:
            state.how = "disabled" if report.disabled else "installed"
            state.installed = [title for title, _ in report.installed]
            state.left = list(report.left)
            state.probe_ms = report.probe_ms
        others = [w for w in caught if not issubclass(w.category, InstallWarning)]
        for w in others:  # not ours: as they were
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        ours = [str(w.message) for w in caught if issubclass(w.category, InstallWarning)]
        if state.how == "failed" or ours:
            warnings.warn(
                f"tinker_rl_data: rollout worker {_me()[1]}: "
                + ("install failed, the cookbook's functions run: " + state.left[0][1] if state.how == "failed" else "")
                + "; ".join(ours),
                InstallWarning,
                stacklevel=2,
            )
    if _patch.installed("gc"):
        # The gc pieces went in here (not skipped, probes passed): each
        # rollout is a step (run_rollout holds the collector to it).
        from . import gc_step as _gc_step

        if _gc_step.COLLECTOR.active and state.how == "inherited" and settings.driver != _me():
            _gc_step.COLLECTOR.restore()  # a copy of the driver's loop state
        if not _gc_step.COLLECTOR.active:
            state.collector = _gc_step.StepCollector()
            state.collector.settle()
    return state


def run_rollout(settings: Settings | None, task: Any) -> Any:
    """The worker's ``_run_rollout_sync``: install once, the rollout as the
    step, the cookbook's function, the result with what this worker did."""
    global _worker
    original = _original()
    if settings is None:
        return original(task)
    if _worker is None:
        with _worker_lock:
            if _worker is None:
                start = time.perf_counter()
                _worker = _set_up(settings)
                _worker.setup_ms = (time.perf_counter() - start) * 1e3
    state = _worker
    if state.collector is not None:
        state.collector.step_held(_RunningLoop())
    try:
        result = original(task)
    finally:
        state.rollouts += 1
        if state.collector is not None:
            start = time.perf_counter()
            state.collector.step_released()
            state.step_gc_ms += (time.perf_counter() - start) * 1e3
    if settings.driver == _me():
        return result  # not pickled back: the cookbook's result as it is
    summary = None
    if not state.summary_sent:
        state.summary_sent = True
        summary = {
            "how": state.how,
            "options": list(settings.options),
            "installed": state.installed,
            "left": state.left,
            "probe_ms": round(state.probe_ms, 1),
            "setup_ms": round(state.setup_ms, 1),
        }
    return _Delivery(_me(), summary, _counters(state), result)


def _counters(state: _Worker) -> dict[str, Any]:
    import sys

    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "rollouts": state.rollouts,
        "cpu_ms": round((usage.ru_utime + usage.ru_stime) * 1e3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
    }
    if state.collector is not None:
        out["gc_step_ms"] = round(state.step_gc_ms, 1)
        stats = state.collector.stats
        out["gc_steps"] = stats.steps
        out["gc_guard_collections"] = stats.guard_collections
        out["gc_young_collections"] = stats.young_collections
        out["gc_froze"] = stats.froze
    coalesce = sys.modules.get("tinker_rl_data.tinker.coalesce")
    if coalesce is not None:
        out.update(coalesce.counts())
    return out


class _Delivery:
    """A worker's result on its way back: unpickled (in the driver) it is
    the result itself, and what the worker reported is recorded."""

    __slots__ = ("worker", "summary", "counters", "result")

    def __init__(self, worker: tuple[str, int], summary: dict[str, Any] | None, counters: dict[str, Any], result: Any):
        self.worker, self.summary, self.counters, self.result = worker, summary, counters, result

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_received, (self.worker, self.summary, self.counters, self.result))


# --------------------------------------------------------------------------
# In the driver: what the workers reported

_seen: dict[tuple[str, int], dict[str, Any]] = {}
_seen_lock = threading.Lock()


def _received(worker: tuple[str, int], summary: dict[str, Any] | None, counters: dict[str, Any], result: Any) -> Any:
    try:
        with _seen_lock:
            entry = _seen.setdefault(tuple(worker), {"host": worker[0], "pid": worker[1]})  # type: ignore[arg-type]
            first = summary is not None and "how" not in entry
            if summary is not None:
                entry.update(summary)
            entry["counters"] = dict(counters)
        if first:
            _log_worker(entry)
    except Exception:  # never fail the result's delivery
        pass
    return result


def _log_worker(entry: dict[str, Any]) -> None:
    from ..patch import transaction as _patch

    driver = {title for title, _ in _patch.status().installed}
    missing = sorted(driver - set(entry.get("installed", ())))
    line = (
        f"tinker_rl_data: rollout worker {entry['host']}:{entry['pid']}: {entry.get('how')}, "
        f"{len(entry.get('installed', ()))} piece(s), probes {entry.get('probe_ms', 0):.0f} ms"
    )
    if missing or entry.get("how") not in ("installed", "inherited"):
        logger.warning("%s; not in this worker: %s", line, ", ".join(missing) or "all")
    else:
        logger.info(line)


def seen() -> list[dict[str, Any]]:
    """Per worker that sent a result back since the last :func:`reset`:
    host, pid, how (installed, inherited, failed, disabled), options,
    installed (titles), left ((title, why)), probe_ms, setup_ms (the
    worker's install: imports, probes, the collector's first collection
    and freeze), and counters
    (rollouts, cpu_ms and peak_rss_mb of the worker process, gc_steps,
    gc_step_ms (the full collections at the rollouts' ends),
    gc_guard_collections, gc_young_collections, gc_froze, merged_calls,
    merged_requests: as of its latest result)."""
    with _seen_lock:
        return [dict(entry) for entry in _seen.values()]


def reset() -> None:
    with _seen_lock:
        _seen.clear()


def describe(entries: list[dict[str, Any]] | None = None) -> list[str]:
    """Lines for the report: one per worker."""
    entries = seen() if entries is None else entries
    lines = []
    for e in entries:
        c = e.get("counters", {})
        extra = f", {c.get('merged_calls', 0)} sample calls sent as {c.get('merged_requests', 0)}" if "merged_calls" in c else ""
        gc_part = f", GC steps {c['gc_steps']}" if "gc_steps" in c else ""
        left = f", left: {', '.join(t for t, _ in e.get('left', ()))}" if e.get("left") else ""
        lines.append(
            f"{e['host']}:{e['pid']} {e.get('how', '?')}: {len(e.get('installed', ()))} piece(s){left}; "
            f"{c.get('rollouts', 0)} rollout(s){gc_part}{extra}"
        )
    return lines


# --------------------------------------------------------------------------
# The piece: signal._int_to_enum (CPython before 3.13), for asyncio.run


def make_int_to_enum(original: Callable[..., Any]) -> Callable[..., Any]:
    """CPython 3.13's ``signal._int_to_enum``: a handler that is not an int
    is returned as it is, as the older one returns it after failing to
    make it a ``Handlers`` member. The older one's failure builds its
    message from ``repr(handler)``, and ``asyncio.run``, when its coroutine
    has ended, reads and resets the SIGINT handler it set: a
    ``functools.partial`` holding the finished main task, whose repr holds
    the repr of the task's result. In a rollout worker that is each group
    rollout's (the cookbook's ``_run_rollout_sync``), so every rollout
    built the text of its whole ``TrajectoryGroup`` twice, and dropped it
    (84% of a worker's rollout thread on single_turn_long, measured)."""

    def _int_to_enum(value: Any, enum_klass: Any) -> Any:
        if not isinstance(value, int):
            return value
        return original(value, enum_klass)

    _int_to_enum.__doc__ = original.__doc__
    _int_to_enum.__wrapped__ = original  # type: ignore[attr-defined]
    return _int_to_enum


class _ReprCounted:
    """A handler-like callable that counts its reprs."""

    reprs = 0

    def __call__(self, *args: Any) -> None:
        pass

    def __repr__(self) -> str:
        type(self).reprs += 1
        return "<probe handler>"


def probe_int_to_enum(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    import signal

    handler = _ReprCounted()
    _ReprCounted.reprs = 0
    kept = original(handler, signal.Handlers)
    if _ReprCounted.reprs == 0:
        raise NotNeeded("this Python's signal module returns a handler without its repr")
    for value in (handler, signal.SIG_DFL, signal.SIG_IGN, int(signal.SIG_DFL), int(signal.SIG_IGN), 7, None, signal.default_int_handler):
        theirs, mine = original(value, signal.Handlers), ours(value, signal.Handlers)
        if type(theirs) is not type(mine) or theirs != mine:
            raise ProbeFailed(f"_int_to_enum({value!r}): {theirs!r} vs ours {mine!r}")
    if kept is not handler:
        raise ProbeFailed("the original does not return a handler it cannot convert")


#: The pieces' titles in the report.
WORKERS_TITLE = "rollout workers install too"
SIGNAL_TITLE = "asyncio.run, no repr of its result (signal._int_to_enum)"


PIECES = (
    Piece(
        ROLLOUTS_MODULE,
        ENTRY_NAME,
        "workers",
        make_entry,
        probe_entry,
        spread=False,
        label=WORKERS_TITLE,
        undo=uninstalled,
    ),
    Piece(
        "signal",
        "_int_to_enum",
        "workers",
        make_int_to_enum,
        probe_int_to_enum,
        spread=False,
        label=SIGNAL_TITLE,
        needs="tinker_cookbook",
    ),
)
