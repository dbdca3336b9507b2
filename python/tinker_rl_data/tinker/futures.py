"""tinker's request futures, freed when their callers drop them.

Every call tinker runs on its client thread (``sample``, ``compute_logprobs``,
``forward_backward``, their polls) goes through
``InternalClientHolder.run_coroutine_threadsafe``: a ``concurrent.futures``
future that its own wrapper mirrors (``_AwaitableFutureCompatWrapper`` adds a
done callback holding the wrapper) and that a caller's ``await`` chains to
its loop (``asyncio.wrap_future`` adds a callback whose closure holds the
future). A concurrent future keeps its callbacks after running them, so each
call leaves a cycle of about 50 objects (two futures, their conditions and
locks, the closures) that only a full collection frees: 400,000 objects a
many_short step, 600-800 ms of its step-end collection.

Ours returns tinker's future as it is, with one callback added first: when
the future is done, it drops the future's list of callbacks. A
``concurrent.futures.Future`` runs each callback once, those added before it
finished from that list (the loop already holds it: the rest still run) and
those added after at once, so nothing sees the list again; the cycle is
gone and the call's objects are freed as its caller drops them.

A call made on tinker's own loop (``_APIFuture`` starts its polling loop so,
once per request) skips the hops: the coroutine becomes a task at once
rather than through ``call_soon_threadsafe`` and a wake of the loop it is
already on, and a caller awaiting it there gets the future's outcome from
the task's done callback rather than through ``call_soon_threadsafe``
(what ``asyncio.wrap_future`` would do): the same outcome, the same
cancellation both ways. The concurrent future is chained from the task as
tinker's is, for ``result()``, ``future()`` and callers on other loops.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Future
from typing import Any, Callable

from ..patch.piece import check


def let_go(future: Future) -> None:
    """A done callback, added first: drops the future's list of callbacks."""
    future._done_callbacks = []  # type: ignore[attr-defined]  # each ran, or runs, from the list it had


def make_run_coroutine_threadsafe(original: Callable[..., Any]) -> Callable[..., Any]:
    from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

    class OnItsLoop(AwaitableConcurrentFuture):  # type: ignore[misc, valid-type]
        """tinker's future of a call made on tinker's own loop: awaited
        there, through :func:`_waiter` (no wake)."""

        def __init__(self, future: Future, task: asyncio.Task) -> None:
            super().__init__(future)
            self._task = task

        def __await__(self) -> Any:
            loop = self._task.get_loop()
            if asyncio._get_running_loop() is loop:
                return (yield from _waiter(loop, self._future, self._task))
            return (yield from super().__await__())

    @functools.wraps(original)
    def run_coroutine_threadsafe(self: Any, coro: Any) -> Any:
        running = asyncio._get_running_loop()
        if running is not None and running is self.get_loop() and asyncio.iscoroutine(coro):
            # What asyncio.run_coroutine_threadsafe does, without the hop.
            chained: Future = Future()
            chained.add_done_callback(let_go)
            task = running.create_task(coro)
            asyncio.futures._chain_future(task, chained)  # type: ignore[attr-defined]
            return OnItsLoop(chained, task)
        awaitable = original(self, coro)
        future = getattr(awaitable, "_future", None)
        if type(future) is Future:  # (tinker's own: anything else is left as it is)
            future.add_done_callback(let_go)
        return awaitable

    return run_coroutine_threadsafe


def _waiter(loop: asyncio.AbstractEventLoop, future: Future, task: asyncio.Task) -> asyncio.Future:
    """What ``asyncio.wrap_future(future)`` gives a caller on ``loop`` (the
    task's), without its wake when the task ends: ``future``'s outcome, set
    from the task's done callback (its chain to ``future`` runs first:
    added first), and from another thread only when ``future`` is cancelled
    there; cancelled, it cancels ``future`` (and so the task), as
    ``wrap_future``'s does."""
    waiter = loop.create_future()

    def task_done(_: asyncio.Task) -> None:
        if future.done() and not waiter.done():
            asyncio.futures._copy_future_state(future, waiter)  # type: ignore[attr-defined]

    def future_done(_: Future) -> None:
        if future.cancelled() and not loop.is_closed():
            loop.call_soon_threadsafe(waiter.cancel)  # (a no-op once it is done)

    def waiter_done(_: asyncio.Future) -> None:
        if waiter.cancelled():
            future.cancel()

    task.add_done_callback(task_done)
    future.add_done_callback(future_done)
    waiter.add_done_callback(waiter_done)
    return waiter


class _Holder:
    """What ``run_coroutine_threadsafe`` reads of tinker's holder: its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop


def probe_run_coroutine_threadsafe(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed unless ours returns what tinker's does (a future of
    the coroutine's result or exception, of the same type, its ``future()``
    a ``concurrent.futures.Future``), also for a call made on the holder's
    loop, and this Python's futures run every callback added before they
    finish, and those added later at once, with the list dropped by the
    first."""
    check(_callbacks_run_once(), "concurrent.futures.Future no longer runs its callbacks from the list it had")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tinker_rl_data probe loop", daemon=True)
    thread.start()
    try:
        holder = _Holder(loop)
        for result in ("ok", ValueError("probe")):

            async def call(result: Any = result) -> Any:
                if isinstance(result, Exception):
                    raise result
                return result

            theirs, mine = original(holder, call()), ours(holder, call())
            check(type(mine) is type(theirs), f"ours returned {type(mine).__name__}, tinker's {type(theirs).__name__}")
            inner = mine.future()
            check(type(inner) is Future, f"tinker's future() is a {type(inner).__name__}")
            seen: list[Any] = []
            ran = threading.Event()

            def added(future: Future) -> None:
                seen.append("added")
                ran.set()

            inner.add_done_callback(added)
            for future in (theirs.future(), inner):
                error = future.exception(timeout=10)
                got = future.result() if error is None else error
                check(got is result, f"the future's outcome is {got!r}, not {result!r}")
            check(ran.wait(10) and seen == ["added"], "a callback added to tinker's future did not run once")
            check(not inner._done_callbacks, "tinker's future kept its callbacks")  # type: ignore[attr-defined]
            on_its_loop = asyncio.run_coroutine_threadsafe(_on_its_loop(original, ours, holder, call), loop)
            try:
                on_its_loop.result(_PROBE_WAIT)
            except TimeoutError:
                on_its_loop.cancel()
                check(False, f"a call awaited on tinker's loop did not finish in {_PROBE_WAIT} s")
    finally:
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(_PROBE_WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_PROBE_WAIT)
        loop.close()


_PROBE_WAIT = 10  # seconds: the probe's calls answer at once


async def _cancel_the_rest() -> None:
    """Cancels what a refused function left running on the probe's loop
    (so closing the loop destroys no pending task)."""
    rest = asyncio.all_tasks() - {asyncio.current_task()}
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=_PROBE_WAIT)


async def _on_its_loop(original: Callable[..., Any], ours: Callable[..., Any], holder: _Holder, call: Any) -> None:
    """A call made on the holder's loop (as ``_APIFuture`` makes its own):
    ours is one of tinker's futures, awaited there as tinker's (also
    through ``asyncio.wait_for``, as ``_APIFuture.result_async`` awaits), and
    its ``future()`` holds the same outcome, its callbacks dropped."""
    theirs, mine = original(holder, call()), ours(holder, call())
    check(isinstance(mine, type(theirs)), f"ours returned {type(mine).__name__}, tinker's {type(theirs).__name__}")
    outcomes = []
    for future in (theirs, mine, ours(holder, call())):
        try:
            outcomes.append(await asyncio.wait_for(future, None) if future is not mine else await future)
        except Exception as exc:
            outcomes.append(exc)
    check(len({id(o) for o in outcomes}) == 1, f"awaited on tinker's loop, the outcomes are {outcomes!r}")
    inner = mine.future()
    check(inner.done() and not inner._done_callbacks, "the future's callbacks were kept")  # type: ignore[attr-defined]
    error = inner.exception()
    check((inner.result() if error is None else error) is outcomes[0], "the future's outcome differs")
    timed_out = [await _timed_out(made, holder) for made in (original, ours)]
    check(timed_out[1] == timed_out[0], f"timed out on tinker's loop: {timed_out[1]} from ours, {timed_out[0]} from tinker's")


async def _timed_out(made: Callable[..., Any], holder: _Holder) -> tuple[Any, bool]:
    """What a caller on the holder's loop gets when its wait times out and
    the call swallows the cancel, and whether ``future()`` is cancelled."""

    async def swallows() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    future = made(holder, swallows())
    try:
        got: Any = await asyncio.wait_for(future, 0.01)
    except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
        got = type(exc)
    await asyncio.sleep(0)  # the cancel reaches the task
    return got, future.future().cancelled()


def _callbacks_run_once() -> bool:
    future: Future = Future()
    ran: list[str] = []
    future.add_done_callback(let_go)
    future.add_done_callback(lambda f: ran.append("before"))
    future.set_result(None)
    future.add_done_callback(lambda f: ran.append("after"))
    return ran == ["before", "after"] and future._done_callbacks == []  # type: ignore[attr-defined]
