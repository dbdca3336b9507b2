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
``cookbook.install``, :func:`stop` clears them, the piece's undo too) as
plain data, and unpickling it needs nothing of this package
(:func:`_reduce_by_source`). In the worker process:

- where the package does not load (a node without the wheel, no native
  core for the platform): the cookbook's own ``_run_rollout_sync``, with
  one warning in that worker at its first rollout; its results tell the
  driver it ran "stock".
- once per process, before its first rollout, the patch layer's install
  with the driver's options and switches as the driver resolved them
  (strict, ``TINKER_RL_DATA_SKIP``, the GC headroom: install()'s
  ``gc_headroom`` winning over any variable; the worker's own values of
  these do not count), and the driver's other ``TINKER_RL_DATA_*``
  variables where the worker has none: the same pieces, each decided by
  its probe on the worker. A worker where some are left out says so with
  one warning (in that worker) and goes on; one whose install raises (a
  bug) warns once and runs the cookbook's functions. With ``strict``, the
  worker's ``InstallError`` is raised by the task, so the driver's run
  stops with it, as a strict install there would. Settings ``None`` (the
  driver uninstalled or is disabled): the worker installs nothing.
- then each feature's ``worker`` hook, for the features whose pieces went
  in there (asked, not skipped, probes passed): the
  :class:`~tinker_rl_data.patch.feature.WorkerPart` it returns wraps each
  rollout and adds to the worker's counters (gc: each group rollout is
  the worker's step, :class:`~tinker_rl_data.cookbook.gc_step.RolloutSteps`;
  coalesce: its counts).
- then the cookbook's own ``_run_rollout_sync``.

What the workers did, the driver sees: a worker's result travels back
wrapped so that unpickling it in the driver hands the cookbook the plain
result and records, per worker (host, pid and a random token: two
containers can share a host name and pid), its install summary (with its
first result) and its counters (rollouts, CPU, peak RSS, and what the
features' worker parts add: GC steps and collections, coalesced sample
calls; with every result, a few dozen bytes, cumulative and since its
previous result). The record is bounded:
totals over every worker (:func:`totals`) and the last :data:`SHOWN`
workers in full (:func:`seen`); :func:`describe` renders both for
``status()``, and each worker's first summary is logged once on the
``tinker_rl_data`` logger: INFO when it installed what the driver did,
WARNING naming what it left out otherwise.

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

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import threading
import time
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import features, switches
from ..errors import InstallError, InstallWarning, NotNeeded, ProbeFailed
from ..patch.feature import Feature, InstallCall, WorkerPart, WorkerStart
from ..patch.piece import Piece

logger = logging.getLogger("tinker_rl_data")

ROLLOUTS_MODULE = "tinker_cookbook.rl.rollouts"
ENTRY_NAME = "_run_rollout_sync"
OWNER = "tinker_rl_data.cookbook"


# --------------------------------------------------------------------------
# The driver's settings


@dataclass(frozen=True)
class Settings:
    """What a worker installs, as the driver resolved it: its options, its
    switches (strict, TINKER_RL_DATA_SKIP, the GC headroom: install()'s
    ``gc_headroom``, else its TINKER_RL_DATA_GC_HEADROOM, "" for the
    default), its other ``TINKER_RL_DATA_*`` variables, and who the driver
    is (host, pid, token). Plain data: it travels as a dict of tuples,
    strings and bools (:func:`_reduce_by_source`)."""

    options: tuple[str, ...]
    strict: bool
    skip: tuple[str, ...] = ()
    gc_headroom: str = ""
    env: tuple[tuple[str, str], ...] = ()
    driver: tuple[str, int, str] = ("", 0, "")
    catalog: str = features.__name__

    def features(self) -> Any:
        """The driver's catalog of features (found by name: a worker
        imports it fresh; this module's package has imported every
        feature's module, registering them there), to install those named
        in ``options``."""
        import importlib

        return importlib.import_module(self.catalog).declared()


_settings: Settings | None = None
_settings_lock = threading.Lock()
# The driver's installed pieces, for the line each worker's first result logs.
_driver_titles: frozenset[str] = frozenset()

# A process's identity: (host, pid) alone can be two containers' processes.
_TOKEN = os.urandom(6).hex()

#: The switches a worker takes from the driver as it resolved them, whatever
#: the worker's own environment holds; its other variables fill in only.
APPLIED = (switches.DISABLE, switches.STRICT, switches.SKIP, switches.GC_HEADROOM)


def _me() -> tuple[str, int, str]:
    return (socket.gethostname(), os.getpid(), _TOKEN)


#: Where a result's identity is not a (host, pid, token) triple (a result
#: mangled on its way back): recorded as this one worker, in the totals.
UNKNOWN_WORKER = ("unknown", 0, "")


def _identity(worker: Any) -> tuple[str, int, str]:
    """``worker`` as the record's key (a list after some pickling), or
    :data:`UNKNOWN_WORKER`."""
    try:
        host, pid, token = worker
        if isinstance(host, str) and isinstance(pid, int) and isinstance(token, str):
            return (host, pid, token)
    except (TypeError, ValueError):
        pass
    return UNKNOWN_WORKER


def follow(
    options: Any, strict: bool | None = None, gc_headroom: float | None = None, catalog: str = Settings.catalog
) -> None:
    """The driver installed ``options`` (features of ``catalog``): the
    workers will install the same with the driver's switches
    (``cookbook.install`` calls this last); ``gc_headroom``, install()'s
    option, wins over the variable."""
    from ..patch import transaction as _patch

    global _settings, _driver_titles
    variables = switches.ours()
    headroom = repr(float(gc_headroom)) if gc_headroom is not None else variables.get(switches.GC_HEADROOM, "")
    env = tuple(sorted((k, v) for k, v in variables.items() if k not in APPLIED))
    titles = frozenset(title for title, _ in _patch.status().installed)
    with _settings_lock:
        _driver_titles = titles
        if switches.disabled():
            _settings = None  # install() was a no-op: so are the workers'
            return
        _settings = Settings(
            options=tuple(sorted(set(options))),
            strict=switches.strict(strict),
            skip=tuple(sorted(switches.skipped())),
            gc_headroom=headroom.strip(),
            env=env,
            driver=_me(),
            catalog=catalog,
        )


def stop() -> None:
    """No new worker installs (``cookbook.uninstall``, and the piece's undo)."""
    global _settings, _driver_titles
    with _settings_lock:
        _settings = None
        _driver_titles = frozenset()


def current() -> Settings | None:
    return _settings


# --------------------------------------------------------------------------
# The piece: rollouts._run_rollout_sync


# Unpickling a task must not need this package: a worker without it (a Ray
# node without the wheel, no native core for its platform) would raise
# inside the pool's own worker loop, which breaks the whole pool. So the
# entry, and a result on its way back, reduce to ``eval`` of a short
# expression over plain data: where this module is loaded already it calls
# it; elsewhere it runs a loader (source text, below) that tries to load
# it. Loading them needs only the standard library.

_HERE = "(here := __import__('sys').modules.get('tinker_rl_data.cookbook.workers'))"


def _reduce_by_source(call: str, source: str, **names: Any) -> tuple[Any, tuple[Any, ...]]:
    """A ``__reduce__`` value: unpickled, ``here.<call>`` where this module
    is loaded, else ``source`` run (it sets ``out``), with ``names`` as
    globals. (Compiling the loader costs ~1 ms: once in a worker where the
    package loads, per task in one where it does not.)"""
    return (eval, (f"here.{call} if {_HERE} else exec(source) or out", {"source": source, **names}))


# In the worker: ours if the package loads, else the cookbook's own
# function, wrapped so that the driver hears that this worker ran stock
# (once per process: the state lives on the cookbook's module).
_LOAD_ENTRY = """
try:
    from tinker_rl_data.cookbook.workers import _entry
    out = _entry(settings)
except Exception as exc:
    import os, socket, warnings
    from tinker_cookbook.rl import rollouts
    why, run = f"{type(exc).__name__}: {exc}", rollouts._run_rollout_sync
    stock = vars(rollouts).setdefault("_tinker_rl_data_stock", {"token": os.urandom(6).hex(), "rollouts": 0})

    class Back:
        def __init__(self, *args):
            self.args = args

        def __reduce__(self):
            worker, summary, rollouts, result = self.args
            return (eval, ("exec(source) or out", {"source": receive, "worker": worker, "how": "stock",
                    "summary": summary, "counters": {"rollouts": rollouts}, "delta": {"rollouts": 1}, "result": result}))

    def out(task):
        result = run(task)
        me = (socket.gethostname(), os.getpid(), stock["token"])
        if settings is None or tuple(settings["driver"][:2]) == me[:2]:
            return result
        stock["rollouts"] += 1
        summary = None
        if "why" not in stock:
            stock["why"] = why
            summary = {"options": [], "installed": [], "left": [("tinker_rl_data", why)]}
            try:  # (under -W error a warning raises: the rollout's result still goes back)
                warnings.warn(f"tinker_rl_data: rollout worker {me[1]}: the package does not load here ({why}): "
                              "the cookbook's rollout runs as it is", RuntimeWarning)
            except Exception:
                pass
        return Back(me, summary, stock["rollouts"], result)
"""

# In the driver: the result, and what the worker did recorded (the result
# alone in a process without the package).
_RECEIVE = """
try:
    from tinker_rl_data.cookbook.workers import _received
except Exception:
    def _received(worker, how, summary, counters, delta, result):
        return result
out = _received(worker, how, summary, counters, delta, result)
"""


_ENTRY_CALL = "_entry(settings)"
_RECEIVE_CALL = "_received(worker, how, summary, counters, delta, result)"


_unreadable_warned = False


def _entry(settings: dict[str, Any] | None) -> _WorkerEntry:
    """What a task's entry unpickles to where this module loads; never
    raises (it runs inside the pool's own worker loop). A driver of another
    version may send fields this one lacks (dropped) or lack some this one
    needs: then the cookbook's rollout runs as it is, with one warning."""
    global _unreadable_warned
    if settings is None:
        return _WorkerEntry(None)
    try:
        known = {f.name for f in dataclasses.fields(Settings)}
        return _WorkerEntry(Settings(**{k: v for k, v in settings.items() if k in known}))
    except Exception as exc:
        if not _unreadable_warned:
            _unreadable_warned = True
            try:  # (under -W error a warning raises)
                warnings.warn(
                    f"tinker_rl_data: rollout worker {os.getpid()}: the driver's settings are not readable here "
                    f"({type(exc).__name__}: {exc}): the cookbook's rollout runs as it is",
                    InstallWarning,
                    stacklevel=2,
                )
            except Exception:
                pass
        return _WorkerEntry(None)


def _plain(settings: Settings | None) -> dict[str, Any] | None:
    return None if settings is None else dataclasses.asdict(settings)


class RolloutEntry:
    """What ``rollouts._run_rollout_sync`` holds while installed. Called in
    the driver's process (a thread pool): the cookbook's function. Pickled
    (a process pool, Ray): a :class:`_WorkerEntry` with the driver's
    settings of that moment where the package loads, the cookbook's own
    function (saying so) where it does not."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        self.__wrapped__ = original
        self.__name__ = getattr(original, "__name__", ENTRY_NAME)
        self.__qualname__ = getattr(original, "__qualname__", ENTRY_NAME)
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, task: Any) -> Any:
        return self.original(task)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce_by_source(_ENTRY_CALL, _LOAD_ENTRY, settings=_plain(_settings), receive=_RECEIVE)

    def __repr__(self) -> str:
        return f"<tinker_rl_data worker entry for {ROLLOUTS_MODULE}.{ENTRY_NAME}>"


class _WorkerEntry:
    """The entry as unpickled where the rollout runs."""

    def __init__(self, settings: Settings | None) -> None:
        self.settings = settings

    def __call__(self, task: Any) -> Any:
        return run_rollout(self.settings, task)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce_by_source(_ENTRY_CALL, _LOAD_ENTRY, settings=_plain(self.settings), receive=_RECEIVE)


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


@dataclass
class _Worker:
    settings: Settings | None = None
    how: str = ""  # installed, inherited, failed, disabled (a worker without the package: "stock")
    installed: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    probe_ms: float = 0.0
    setup_ms: float = 0.0
    parts: dict[str, WorkerPart] = field(default_factory=dict)  # feature -> what its worker hook returned
    rollouts: int = 0
    summary_sent: bool = False
    # What the last result carried (its deltas are since then); a Ray actor
    # may run rollouts in several threads.
    sent: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _original() -> Callable[..., Any]:
    import importlib

    function = getattr(importlib.import_module(ROLLOUTS_MODULE), ENTRY_NAME)
    while isinstance(function, RolloutEntry):  # a process that holds ours (forked, or the driver's)
        function = function.original
    return function  # type: ignore[no-any-return]


def _apply(settings: Settings) -> None:
    """The driver's switches as it resolved them replace this process's own
    (an inherited or a node's variable does not win: install()'s arguments
    mean the same here); its other variables fill in where this one has none."""
    driver = {
        switches.SKIP: ",".join(settings.skip),
        switches.STRICT: "1" if settings.strict else "",
        switches.GC_HEADROOM: settings.gc_headroom,
    }
    for key in APPLIED:
        if driver.get(key):
            os.environ[key] = driver[key]
        else:
            os.environ.pop(key, None)  # DISABLE too: a disabled driver sends no settings
    for key, value in settings.env:
        os.environ.setdefault(key, value)


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
        _apply(settings)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                report = _patch.install(settings.features(), settings.options, owner=OWNER, strict=settings.strict)
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
    start = WorkerStart(inherited=state.how == "inherited", driver=settings.driver == _me())
    for feature in settings.features():
        if feature.worker is not None and _patch.installed(feature.name):
            part = feature.worker(start)
            if part is not None:
                state.parts[feature.name] = part
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
    with contextlib.ExitStack() as parts:
        for part in state.parts.values():
            parts.enter_context(part.rollout())
        try:
            result = original(task)
        finally:
            state.rollouts += 1
    if settings.driver == _me():
        return result  # not pickled back: the cookbook's result as it is
    return _delivery(state, result)


#: Counters a worker's results carry that add up over workers (each result
#: carries them since the worker's previous one too).
ADDITIVE = (
    "rollouts",
    "cpu_ms",
    "gc_steps",
    "gc_step_ms",
    "gc_guard_collections",
    "gc_young_collections",
    "merged_calls",
    "merged_requests",
    "single_sample_requests",
    "coalescing_would_send",
    "sample_requests_capped",
)


def _delivery(state: _Worker, result: Any) -> _Delivery:
    with state.lock:  # one snapshot per result, in order: the deltas add up to the last one
        counters = _counters(state)
        delta = {key: counters[key] - state.sent.get(key, 0) for key in ADDITIVE if key in counters}
        state.sent = counters
        summary = None
        if not state.summary_sent:
            state.summary_sent = True
            summary = {
                "options": list(state.settings.options) if state.settings else [],
                "installed": state.installed,
                "left": state.left,
                "probe_ms": round(state.probe_ms, 1),
                "setup_ms": round(state.setup_ms, 1),
            }
    return _Delivery(_me(), state.how, summary, counters, delta, result)


def _peak_rss_mb() -> float | None:
    """The process's peak RSS in MiB, where the platform says (``resource``:
    KiB on Linux, bytes on macOS); None on Windows, which has no
    ``resource`` (its peak working set would need the Win32 API)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10))


def _counters(state: _Worker) -> dict[str, Any]:
    out: dict[str, Any] = {"rollouts": state.rollouts, "cpu_ms": round(time.process_time() * 1e3)}
    peak = _peak_rss_mb()
    if peak is not None:
        out["peak_rss_mb"] = peak
    for part in state.parts.values():
        out.update(part.counters())
    return out


class _Delivery:
    """A worker's result on its way back: unpickled (in the driver) it is
    the result itself, and what the worker reported is recorded."""

    __slots__ = ("worker", "how", "summary", "counters", "delta", "result")

    def __init__(
        self,
        worker: tuple[str, int, str],
        how: str,
        summary: dict[str, Any] | None,
        counters: dict[str, Any],
        delta: dict[str, Any],
        result: Any,
    ) -> None:
        self.worker, self.how, self.summary, self.result = worker, how, summary, result
        self.counters, self.delta = counters, delta

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        names = {name: getattr(self, name) for name in self.__slots__}
        return _reduce_by_source(_RECEIVE_CALL, _RECEIVE, **names)


# --------------------------------------------------------------------------
# In the driver: what the workers reported, bounded: totals over every
# worker seen and the last few workers in full (a run that recycles its
# workers sees thousands).

#: Workers kept in full (by their latest result).
SHOWN = 8


@dataclass
class _Totals:
    workers: int = 0  # whose first result came
    how: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)  # piece -> workers that left it out
    counters: dict[str, Any] = field(default_factory=dict)  # ADDITIVE summed, peak_rss_mb the largest


_recent: OrderedDict[tuple[str, int, str], dict[str, Any]] = OrderedDict()
_totals = _Totals()
_seen_lock = threading.Lock()


def _received(
    worker: tuple[str, int, str],
    how: str,
    summary: dict[str, Any] | None,
    counters: dict[str, Any],
    delta: dict[str, Any],
    result: Any,
) -> Any:
    try:
        with _seen_lock:
            key = _identity(worker)
            entry = _recent.pop(key, None) or {"host": key[0], "pid": key[1]}
            _recent[key] = entry
            if len(_recent) > SHOWN:
                _recent.popitem(last=False)
            entry["how"] = how
            # a worker's counters only grow; results from its threads may arrive out of order
            known = entry.get("counters", {})
            entry["counters"] = {name: max(value, known.get(name, value)) for name, value in counters.items()}
            if summary is not None:
                entry.update(summary)
                _totals.workers += 1
                _totals.how[how] += 1
                _totals.left.update(title for title, _ in summary.get("left", ()))
            for name, value in delta.items():
                _totals.counters[name] = _totals.counters.get(name, 0) + value
            if counters.get("peak_rss_mb") is not None:
                _totals.counters["peak_rss_mb"] = max(_totals.counters.get("peak_rss_mb", 0), counters["peak_rss_mb"])
            if summary is not None:
                line, level = _worker_line(entry)
        if summary is not None:
            logger.log(level, line)
    except Exception:  # never fail the result's delivery
        pass
    return result


def _worker_line(entry: dict[str, Any]) -> tuple[str, int]:
    """The line a worker's first result logs: INFO when it installed what
    the driver did (as of the driver's last install), WARNING otherwise."""
    missing = sorted(_driver_titles - set(entry.get("installed", ())))
    line = (
        f"tinker_rl_data: rollout worker {entry['host']}:{entry['pid']}: {entry.get('how')}, "
        f"{len(entry.get('installed', ()))} piece(s), probes {entry.get('probe_ms', 0):.0f} ms"
    )
    if missing or entry.get("how") not in ("installed", "inherited"):
        return f"{line}; not in this worker: {', '.join(missing) or 'all'}", logging.WARNING
    return line, logging.INFO


def seen() -> list[dict[str, Any]]:
    """The last :data:`SHOWN` workers that sent a result back since the
    last :func:`reset` (oldest first): host, pid, how (installed,
    inherited, failed, disabled; stock: the package does not load there),
    options, installed (titles), left ((title, why)), probe_ms, setup_ms
    (the worker's install: imports, probes, the collector's first
    collection and freeze), and counters (rollouts, cpu_ms and peak_rss_mb
    of the worker process (no peak_rss_mb on Windows), gc_steps, gc_step_ms
    (the full collections at the rollouts' ends), gc_guard_collections,
    gc_young_collections, gc_froze, merged_calls, merged_requests (with
    coalescing): as of its latest result). Every worker's: :func:`totals`."""
    with _seen_lock:
        return [dict(entry) for entry in _recent.values()]


def totals() -> dict[str, Any]:
    """Over every worker seen since the last :func:`reset`: workers (how
    many sent a first result), how (workers per how), left (piece title ->
    workers that left it out), counters (:data:`ADDITIVE` summed,
    peak_rss_mb the largest)."""
    with _seen_lock:
        return {
            "workers": _totals.workers,
            "how": dict(_totals.how),
            "left": dict(_totals.left),
            "counters": dict(_totals.counters),
        }


features.provide_worker_counters(lambda: totals()["counters"])


def reset() -> None:
    global _totals
    with _seen_lock:
        _recent.clear()
        _totals = _Totals()


def _counts_text(c: dict[str, Any]) -> str:
    gc_part = f", GC steps {c['gc_steps']}" if "gc_steps" in c else ""
    merged = f", {c['merged_calls']} sample calls sent as {c.get('merged_requests', 0)}" if "merged_calls" in c else ""
    return f"{c.get('rollouts', 0)} rollout(s){gc_part}{merged}"


def describe() -> list[str]:
    """Lines for the report: the totals over every worker seen, then one
    per worker of the last few (:func:`seen`)."""
    entries, total = seen(), totals()
    if not entries:
        return []
    n = total["workers"]
    shown = f" (last {len(entries)} shown)" if n > len(entries) else ""
    hows = ", ".join(f"{count} {how}" for how, count in sorted(total["how"].items()))
    left = total["left"]
    left_part = f"; left: {', '.join(f'{t} ({k})' for t, k in sorted(left.items()))}" if left else ""
    lines = [f"totals: {n} worker(s){shown}: {hows}; {_counts_text(total['counters'])}{left_part}"]
    for e in entries:
        left_titles = f", left: {', '.join(t for t, _ in e.get('left', ()))}" if e.get("left") else ""
        lines.append(
            f"{e['host']}:{e['pid']} {e.get('how', '?')}: {len(e.get('installed', ()))} piece(s){left_titles}; "
            f"{_counts_text(e.get('counters', {}))}"
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


def followed(call: InstallCall) -> None:
    """The feature's ``installed`` hook: the workers follow the driver's install."""
    follow(call.features, call.strict, call.options.get("gc_headroom"), catalog=call.catalog)


def status() -> list[str]:
    """The feature's report lines: one per worker seen."""
    return [f"worker {line}" for line in describe()]


FEATURE = features.register(
    __name__,
    Feature(
        "workers",
        "the same install in rollout workers",
        PIECES,
        switch=False,
        installed=followed,
        uninstalled=stop,
        status=status,
    ),
)
