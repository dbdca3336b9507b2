"""``SamplingClient.sample``: tinker's sample path, run lean.

tinker 0.38's ``sample()`` wraps one request in layers, each per call: the
method's context manager for its ``x-sdk-method`` header, two closures made
and decorated by ``capture_exceptions`` (whose telemetry provider it finds
with ``inspect.getclosurevars``), the retry handler's ``execute`` with a
task of its own watching for progress, ``_sample_async_impl`` with the
dispatch limits, and an ``_APIFuture`` that starts a second task to poll
the result and is awaited through ``asyncio.wait_for``. At a many-short
workload's pace those layers cost more client CPU than the two requests
they send.

Ours runs the same steps with fewer objects, on tinker's loop as tinker
does, calling tinker's own functions for each step that decides anything:
the retry loop (``RetryHandler._execute_with_retry``: its retries, delays,
logs and telemetry), ``InternalClientHolder.execute_with_retries`` around
``SamplingClient._send_asample_request`` (the request, 429 and billing
pauses), the dispatch limits (``sample_dispatch_rate_limit``), the join of
a cloned sampler, the result's polling loop (``_APIFuture._result_async``,
awaited in the sample's own task: the same polls, outcomes and
cancellation), the response checks and ``_attach_sequence_ids``. What
differs is only how the layers hold together:

- the ``x-sdk-method`` context variable is set directly, as tinker's
  ``_entered`` sets it (the outermost public call's name);
- the telemetry of a failed call is tinker's ``acapture_exceptions``
  (``log_fatal_exception`` with ``ERROR``), written as a ``try``;
- the retry handler's semaphore, counters, progress logs and stuck
  detection as its ``execute``, the detection by a timer at the handler's
  deadline rather than a task per call (the same cancel and the same
  ``APIConnectionError`` when no call made progress for
  ``progress_timeout``);
- the result polled in the sample's task rather than a second one;
- a call its caller awaits at once (``await client.sample(...)``, as the
  cookbook's completers do) crosses to tinker's loop and back without
  ``run_coroutine_threadsafe``'s concurrent future, tinker's wrapper of it
  and ``asyncio.wrap_future``'s chain: a ticket put in a batch that wakes
  tinker's loop once for all the calls put before it runs, a task there in
  the caller's context, the outcome put in a batch back to a future of the
  caller's loop (its cancel cancels the task). A call whose future the
  caller keeps gets tinker's future, as stock's: blocking on its
  ``result()`` inside a running loop works as it does with tinker's.

Every limit is tinker's own object: the handler's semaphore
(``sample_max_concurrent_requests``), the dispatch count and bytes
semaphores, the in-flight response bytes. Flags the service sends are read
per call as tinker reads them (``sample_no_retries``,
``sample_use_retrieve_futures``: the session poller is tinker's).

A client ours does not reproduce runs tinker's ``sample``: a subclass, an
instance attribute replacing a step ours calls or skips, a retry handler or
holder of another class, and (checked per call, by identity) a function
ours stands in for replaced on tinker's class or module since install().
The probe checks that the tinker installed is one whose steps ours
reproduces: the source of each function ours stands in for, compared with
tinker 0.38.0's, and no wrapper around one but tinker's own decorators (an
older tinker is left as it is; a newer one whose functions changed, or a
wrapped one, warns and keeps tinker's).
"""

from __future__ import annotations

import asyncio
import contextvars
import dis
import functools
import hashlib
import inspect
import os
import sys
import threading
import time
from typing import Any, Callable

from ..patch.piece import Piece, ProbeFailed

__all__ = ["PIECES", "beneath", "make_sample", "probe_sample"]

#: The functions whose steps ours stands in for, by where they are, and the
#: sha256 of tinker 0.38.0's source of each (``inspect.getsource``).
REPRODUCED = {
    "tinker.lib.public_interfaces.sampling_client:SamplingClient.sample": "02077239375b24f483011c1dc97f45b24043aeff754dd515a80edb2da1bf920b",
    "tinker.lib.public_interfaces.sampling_client:SamplingClient._sample_async_impl": "90f4fd9ca4e1d5badda00031612a0ec68f9971328bded8695a16c31c5a896821",
    "tinker.lib.retry_handler:RetryHandler.execute": "f3964e190ac2f471ba519290d77e110f6107f2be32c210ee18f9eb0bb235a212",
    "tinker.lib.api_future_impl:_APIFuture.__init__": "0fbdedae4fe85ab160962a13d8be03063e7af23ccd64d9d487b8b384f4d253d9",
    "tinker.lib.api_future_impl:_APIFuture.result_async": "2d135e0ef63c9ece9a41bfc88b458f3f0ff3d68dfd60a9d00f3f922898fe5363",
    "tinker.lib.telemetry:capture_exceptions": "4ac78e56a4d353673918e88dd14a1fcb5a347f6531c556b304bb831df5ee8b43",
    "tinker.lib.telemetry:Telemetry.acapture_exceptions": "790d6d95c81272e5339dd3ea57aa76dcd9db6dd68e6f623e67a6c635de3598ee",
    "tinker.lib.sdk_method:_entered": "f0197396da8c5bcfa4271d2ac8a84cfb3cdae651e73331d3cfed1f391a18006c",
    "tinker.lib.internal_client_holder:InternalClientHolder.sample_dispatch_rate_limit": "17c501fbeb3de9b486d8d4f2a29a02b92a6fde24cd7915d8f02e042531da5ffb",
    "tinker.lib.internal_client_holder:InternalClientHolder._sample_dispatch_count_rate_limit": "73cd73ad0dcbeafefa39a109c478833647fddc59238986c9fb07749867add758",
    "tinker.lib.internal_client_holder:InternalClientHolder._sample_dispatch_count_throttled_rate_limit": "65203e546c71a8ddc18cd522e6c301798bf5c5d8194ef79585dd1f8cfd91d84b",
    "tinker.lib.internal_client_holder:InternalClientHolder._sample_dispatch_bytes_rate_limit": "140946518defcadddc42f08327013d0a981913fc891fed7d7c57d984d48496c1",
    "tinker.lib.internal_client_holder:BytesSemaphore.acquire": "fb99e2a481f9085d1f9b55569283a026ae4845b3495481eaf8c16859bd47c0f5",
    "tinker.lib.internal_client_holder:BytesSemaphore._release": "2338fa0d81d836d2fdeb77ab3e2ec9f583dc85ef088757a8db30aca5a88f432d",
    "tinker.lib.sdk_method:_tracked": "6e2134e909cef2286056912a8c319b24053c69ac57f32f08716314adbfe57a38",
}

# What a client's instance must not hold of its own for ours to run (a
# user's function there: tinker's sample runs it).
_STEPS = (
    "_sample_async_impl",
    "_send_asample_request",
    "_join_sampling_session",
    "_get_futures_poller",
    "on_queue_state_change",
    "get_telemetry",
)

# What a client's holder must leave as tinker's (the dispatch limits ours takes).
_HOLDER_STEPS = (
    "sample_dispatch_rate_limit",
    "_sample_dispatch_count_rate_limit",
    "_sample_dispatch_count_throttled_rate_limit",
    "_sample_dispatch_bytes_rate_limit",
    "_sample_backoff_requested_recently",
)
# And what stock's sample calls on it to reach its loop (a user's on the
# instance: tinker's sample runs it; on the class, ours: the futures piece).
_HOLDER_CALLS = ("run_coroutine_threadsafe", "get_loop")
_HOLDER_OWN = _HOLDER_STEPS + _HOLDER_CALLS


def make_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    """``SamplingClient.sample`` run lean (the module's docstring) for a
    client ours reproduces, else ``original``."""
    import tinker
    from tinker.lib import sdk_method
    from tinker.lib.api_future_impl import _UNCOMPUTED, _APIFuture
    from tinker.lib.backcompat_concurrent_future import _AwaitableFutureCompatWrapper
    from tinker.lib.internal_client_holder import BytesSemaphore, InternalClientHolder
    from tinker.lib.public_interfaces import sampling_client as module
    from tinker.lib.retry_handler import RetryHandler
    from tinker.types import SampleResponse

    SamplingClient = module.SamplingClient
    current = sdk_method._current_sdk_method
    method_name = "SamplingClient.sample"
    state = _state
    # The functions ours stands in for, as found now: one replaced on its
    # class later (a user's patch) is run by tinker's sample, not skipped.
    # Classes' and modules' names stock's sample reads when called.
    from tinker.lib.telemetry import Telemetry

    skipped = [
        (where, name, vars(where)[name])
        for where, names in (
            (SamplingClient, ("_sample_async_impl",)),
            (RetryHandler, ("execute",)),
            (_APIFuture, ("__init__", "result_async")),
            (InternalClientHolder, _HOLDER_STEPS),
            (BytesSemaphore, ("acquire",)),
            (Telemetry, ("acapture_exceptions",)),
            (module, ("capture_exceptions", "_APIFuture", "_AwaitableFutureCompatWrapper")),
            (sdk_method, ("_entered",)),
        )
        for name in names
    ]

    def lean(client: Any) -> bool:
        return (
            type(client) is SamplingClient
            and state["active"]
            and all(vars(cls).get(name) is function for cls, name, function in skipped)
            and client.__dict__.keys().isdisjoint(_STEPS)
            and type(client.retry_handler) is RetryHandler
            and type(client.holder) is InternalClientHolder
            and client.holder.__dict__.keys().isdisjoint(_HOLDER_OWN)
            and type(client.holder._sample_dispatch_semaphore) is asyncio.Semaphore
            and type(client.holder._sample_dispatch_throttled_semaphore) is asyncio.Semaphore
            and type(client.holder._sample_dispatch_bytes_semaphore) is BytesSemaphore
        )

    async def one_sample(client: Any, args: tuple[Any, ...]) -> Any:
        """``_sample_async_impl``: the dispatch, then the result polled in
        this task."""
        (prompt, num_samples, sampling_params, prompt_logprobs, topk_prompt, topk_sample, target, alt_k, last_n) = args
        if client._cloned_sampler_id is None:
            await client._join_sampling_session()
        holder = client.holder
        estimated_bytes_count = holder.estimate_bytes_count_in_model_input(prompt)
        request_id = client._request_id_counter
        client._request_id_counter += 1
        async with _dispatch_limit(holder, estimated_bytes_count):
            while True:
                if holder._sample_backoff_until is not None and time.monotonic() < holder._sample_backoff_until:
                    await asyncio.sleep(1)
                    continue
                untyped_future = await holder.execute_with_retries(
                    client._send_asample_request,
                    request_id,
                    num_samples,
                    prompt,
                    sampling_params,
                    prompt_logprobs,
                    topk_prompt,
                    topk_sample,
                    target,
                    alt_k,
                    last_n,
                )
                if untyped_future is not None:
                    break
                backoff_duration = 1 if estimated_bytes_count <= 128 * 1024 else 5
                holder._sample_backoff_until = time.monotonic() + backoff_duration
        response = await _polled(client, untyped_future, time.time())
        module._check_prompt_alt_tokens_returned(response, alt_k)
        module._check_prompt_logprobs_last_n_honored(response, last_n)
        return module._attach_sequence_ids(response, untyped_future.sample_sequence_ids)

    async def _polled(client: Any, untyped_future: Any, request_start_time: float) -> Any:
        """``_APIFuture(...).result_async()`` without its task: the future's
        state as its ``__init__`` makes it, its polling loop awaited here."""
        poller = client._get_futures_poller()
        future = _APIFuture.__new__(_APIFuture)
        future.model_cls = SampleResponse
        future.holder = client.holder
        future.untyped_future = untyped_future
        future.request_type = "Sample"
        future._cached_result = _UNCOMPUTED
        future._futures_poller = poller
        future.request_start_time = request_start_time
        future.request_future_start_time = time.time()
        future.request_queue_roundtrip_time = future.request_future_start_time - request_start_time
        future._queue_state_observer = client
        return await future._result_async()

    async def with_retries(client: Any, attempt: Callable[[], Any]) -> Any:
        """``RetryHandler.execute``, stuck detection by a timer."""
        handler = client.retry_handler
        handler._waiting_at_semaphore_count += 1
        semaphore = handler._semaphore
        if semaphore is not None:
            await semaphore.acquire()
        try:
            handler._waiting_at_semaphore_count -= 1
            if handler._in_retry_loop_count == 0:
                handler._last_global_progress = time.time()
            handler._in_retry_loop_count += 1
            handler._maybe_log_progress()
            task = asyncio.current_task()
            assert task is not None
            task._no_progress_made_marker = False  # type: ignore[attr-defined]
            watch = _Watch(handler, task) if handler.config.enable_stuck_detection else None
            try:
                result = await handler._execute_with_retry(attempt)
                handler._last_global_progress = time.time()
                return result
            except asyncio.CancelledError:
                if task._no_progress_made_marker:  # type: ignore[attr-defined]
                    task.uncancel()
                    import httpx

                    raise tinker.APIConnectionError(
                        request=httpx.Request("GET", "http://localhost"),
                        message=f"No progress made in {handler.config.progress_timeout}s. Requests appear to be stuck.",
                    )  # in the except clause, as the handler's: the CancelledError is its context
                raise
            finally:
                handler._in_retry_loop_count -= 1
                handler._maybe_log_progress()
                if watch is not None:
                    watch.stop()
        finally:
            if semaphore is not None:
                semaphore.release()

    async def run(client: Any, args: tuple[Any, ...], retries: bool) -> Any:
        """The call on tinker's loop: ``capture_exceptions(fatal=True)``
        around the retry handler (or, with ``sample_no_retries``, around one
        attempt)."""
        calls[0] += 1
        telemetry = client.get_telemetry()
        try:
            if not retries:
                return await one_sample(client, args)

            async def _sample_async() -> Any:
                return await one_sample(client, args)

            _sample_async.__qualname__ = "SamplingClient.sample.<locals>._sample_async"  # the handler's logs name it
            return await with_retries(client, _sample_async)
        except Exception as e:
            if telemetry is not None:
                await telemetry.log_fatal_exception(e, "ERROR")
            raise

    def sample(
        self: Any,
        prompt: Any,
        num_samples: int,
        sampling_params: Any,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: Any = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> Any:
        if not lean(self):
            return original(
                self,
                prompt,
                num_samples,
                sampling_params,
                include_prompt_logprobs,
                topk_prompt_logprobs,
                topk_sample_logprobs,
                target_prompt_logprobs,
                prompt_alt_tokens_k,
                prompt_logprobs_last_n,
            )
        token = current.set(method_name) if current.get() is None else None
        try:
            target = None
            if target_prompt_logprobs is not None:
                module._check_target_prompt_logprobs(target_prompt_logprobs)
                target = module._tensor_data_to_model(target_prompt_logprobs)
            module._check_prompt_alt_tokens_k(prompt_alt_tokens_k)
            module._check_prompt_logprobs_last_n(prompt_logprobs_last_n, include_prompt_logprobs)
            args = (
                prompt,
                num_samples,
                sampling_params,
                include_prompt_logprobs,
                topk_prompt_logprobs,
                topk_sample_logprobs,
                target,
                prompt_alt_tokens_k,
                prompt_logprobs_last_n,
            )
            retries = not self.holder._client_config.sample_no_retries
            coro = run(self, args, retries)
            caller = asyncio._get_running_loop()
            if caller is not None and _awaited_at_once(sys._getframe(1)):
                loop = self.holder.get_loop()
                if caller is not loop:
                    return _crossing(loop, caller, coro)
            return _AwaitableFutureCompatWrapper(self.holder.run_coroutine_threadsafe(coro).future())
        finally:
            if token is not None:
                current.reset(token)

    functools.update_wrapper(sample, original)
    # A wrong call's TypeError names tinker's method, as tinker's own would.
    sample.__code__ = sample.__code__.replace(co_qualname="SamplingClient.sample", co_name="sample")
    return sample


def beneath(original: Callable[..., Any]) -> Callable[..., Any]:
    """The sample path under coalesced sampling (its calls of one sample
    that merge with none, and its merged requests): ours while this
    module's piece is installed, else ``original``, tinker's (the
    ``transport`` row not chosen, skipped, refused by its probe, or
    uninstalled)."""
    from ..patch import transaction

    ours = make_sample(original)
    piece = PIECES[0]

    @functools.wraps(original)
    def sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        return (ours if piece in transaction._installed else original)(self, *args, **kwargs)

    return sample


_CALLS = frozenset(dis.opmap[name] for name in ("CALL", "CALL_KW") if name in dis.opmap)
_CACHE = dis.opmap["CACHE"]
_GET_AWAITABLE = dis.opmap["GET_AWAITABLE"]


def _awaited_at_once(frame: Any) -> bool:
    """Whether the caller is at a call whose result it awaits next
    (``await client.sample(...)``, or through ``functools.partial``): then
    the returned object goes to that ``await`` alone, and no one can block
    on its ``result()`` or hand it to another loop. A call by anything
    else (``map``, an unpacked argument list: not a plain call) is not."""
    code = frame.f_code.co_code
    i = frame.f_lasti  # the call, or (3.11, 3.12, calling a Python function) its last cache entry
    while code[i] == _CACHE:
        i -= 2
    if code[i] not in _CALLS:
        return False
    i += 2
    while code[i] == _CACHE:
        i += 2
    return code[i] == _GET_AWAITABLE


class _Batch:
    """Callbacks run on one loop in batches: the first one put wakes the
    loop (``call_soon_threadsafe``), the ones put before it runs join it,
    rather than a handle and a wake of the loop each."""

    __slots__ = ("loop", "run", "lock", "items")

    def __init__(self, loop: asyncio.AbstractEventLoop, run: Callable[[Any], None]) -> None:
        self.loop = loop
        self.run = run
        self.lock = threading.Lock()
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        """Raises RuntimeError when the loop is closed (nothing will run it)."""
        with self.lock:
            self.items.append(item)
            if len(self.items) > 1:
                return  # a drain is on its way
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self.lock:
                self.items.clear()
            raise

    def _drain(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for i, item in enumerate(items):
            try:
                self.run(item)
            except (SystemExit, KeyboardInterrupt):  # as asyncio's handles: raised, the rest still run
                for rest in items[i + 1 :]:
                    self.put(rest)
                raise
            except BaseException as exc:  # one item's failure is not the others'
                self.loop.call_exception_handler({"message": "sample call crossing", "exception": exc})


def _batch(batches: dict[asyncio.AbstractEventLoop, _Batch], loop: asyncio.AbstractEventLoop, run: Callable[[Any], None]) -> _Batch:
    """The loop's batch (one made on first use; a closed loop's dropped)."""
    batch = batches.get(loop)
    if batch is None:
        for old in [old for old in batches if old.is_closed()]:
            batches.pop(old, None)
        batch = batches[loop] = _Batch(loop, run)
    return batch


class _Ticket:
    """One sample call crossing: its coroutine and context until tinker's
    loop starts it, then its task; the future its caller awaits and the
    batch its outcome goes back by."""

    __slots__ = ("loop", "coro", "context", "waiter", "back", "task", "error", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Any, waiter: asyncio.Future, back: _Batch) -> None:
        self.loop = loop
        self.coro = coro
        self.context: contextvars.Context | None = contextvars.copy_context()
        self.waiter = waiter
        self.back = back
        self.task: asyncio.Task | None = None
        self.error: BaseException | None = None  # the task could not be made
        self.cancelled = False


# Per loop: its batch of calls to start (tinker's), of outcomes to deliver (a caller's).
_starts: dict[asyncio.AbstractEventLoop, _Batch] = {}
_deliveries: dict[asyncio.AbstractEventLoop, _Batch] = {}


def _forget_batches() -> None:
    """In a forked child: the parent's loops do not run here, and a batch's
    lock may have been held by one of its threads at the fork."""
    _starts.clear()
    _deliveries.clear()


os.register_at_fork(after_in_child=_forget_batches)


def _crossing(loop: asyncio.AbstractEventLoop, caller: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Future:
    """What ``run_coroutine_threadsafe`` and ``asyncio.wrap_future`` do for
    a call awaited at once on another loop, with a wake of each loop per
    batch of calls rather than two concurrent futures, their locks and a
    wake per call: the coroutine becomes a task on tinker's loop in the
    caller's context; its outcome (result, exception, cancellation) is set
    on a future of the caller's loop; the caller's cancelling that future
    cancels the task (or, not started yet, it never starts)."""
    crossed[0] += 1
    waiter = caller.create_future()
    ticket = _Ticket(loop, coro, waiter, _batch(_deliveries, caller, _deliver))
    waiter.add_done_callback(functools.partial(_on_waiter_done, ticket))
    try:
        _batch(_starts, loop, _start).put(ticket)
    except RuntimeError:  # tinker's loop is closed: as run_coroutine_threadsafe
        coro.close()
        raise
    return waiter


def _start(ticket: _Ticket) -> None:
    """On tinker's loop: the call's task."""
    coro, context, ticket.coro, ticket.context = ticket.coro, ticket.context, None, None
    if ticket.cancelled:
        coro.close()
        return
    try:
        task = ticket.task = ticket.loop.create_task(coro, context=context)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # (a task factory's) the caller gets it, as run_coroutine_threadsafe's
        ticket.error = exc
        coro.close()
        _finished(ticket, None)
        raise
    task.add_done_callback(functools.partial(_finished, ticket))


def _finished(ticket: _Ticket, task: asyncio.Task | None) -> None:
    """On tinker's loop: the outcome goes back to the caller's loop (none
    when it is closed: no one awaits there, as ``wrap_future``'s chain)."""
    try:
        ticket.back.put(ticket)
    except RuntimeError:
        pass


def _deliver(ticket: _Ticket) -> None:
    """On the caller's loop: the task's outcome, set on what it awaits."""
    waiter, task = ticket.waiter, ticket.task
    if waiter.done():
        return
    if task is None:
        if ticket.error is not None:
            waiter.set_exception(ticket.error)
    elif task.cancelled():
        waiter.cancel()
    elif (exc := task.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(task.result())


def _on_waiter_done(ticket: _Ticket, waiter: asyncio.Future) -> None:
    """On the caller's loop: its cancel goes on to tinker's loop."""
    if waiter.cancelled():
        try:
            ticket.loop.call_soon_threadsafe(_cancel, ticket)
        except RuntimeError:  # tinker's loop is closed
            pass


def _cancel(ticket: _Ticket) -> None:
    """On tinker's loop: the task cancelled (or, not started yet, never started)."""
    if ticket.task is not None:
        ticket.task.cancel()
    else:
        ticket.cancelled = True


class _dispatch_limit:
    """``InternalClientHolder.sample_dispatch_rate_limit`` without its exit
    stack and three generator context managers: the dispatch count
    semaphore, the throttled one after a recent backoff, then the bytes
    (20 times the estimate after a recent backoff), each tinker's own
    object, taken and given back in tinker's order. The bytes semaphore's
    release wakes its waiters as tinker's does (a task notifying its
    condition), and only when someone waits: with no waiter, tinker's task
    notifies no one."""

    __slots__ = ("holder", "estimate", "taken", "bytes")

    def __init__(self, holder: Any, estimate: int) -> None:
        self.holder = holder
        self.estimate = estimate
        self.taken: list[Any] = []
        self.bytes = 0

    async def __aenter__(self) -> None:
        holder = self.holder
        taken = self.taken
        try:
            await holder._sample_dispatch_semaphore.acquire()
            taken.append(holder._sample_dispatch_semaphore)
            if holder._sample_backoff_requested_recently():
                await holder._sample_dispatch_throttled_semaphore.acquire()
                taken.append(holder._sample_dispatch_throttled_semaphore)
            count = self.estimate
            if holder._sample_backoff_requested_recently():
                count *= 20
            limit = holder._sample_dispatch_bytes_semaphore
            async with limit._condition:
                while limit._bytes < 0:
                    await limit._condition.wait()
            limit._bytes -= count
            self.bytes = count
            taken.append(limit)
        except BaseException:
            self._release()
            raise

    async def __aexit__(self, *exc_info: Any) -> None:
        self._release()

    def _release(self) -> None:
        for limit in reversed(self.taken):
            if type(limit) is asyncio.Semaphore:
                limit.release()
            else:
                limit._bytes += self.bytes
                if limit._condition._waiters or limit._condition.locked():
                    limit._release_task = asyncio.create_task(limit._release())
        self.taken.clear()


class _Watch:
    """The retry handler's stuck detection for one call: at the handler's
    deadline (its last progress plus ``progress_timeout``, read when the
    timer fires, as its progress task reads it on waking), the call's task
    is marked and cancelled; before it, the timer is set again for the
    deadline then."""

    __slots__ = ("handler", "task", "timer")

    def __init__(self, handler: Any, task: asyncio.Task) -> None:
        self.handler = handler
        self.task = task
        self.timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        deadline = self.handler._last_global_progress + self.handler.config.progress_timeout
        self.timer = self.task.get_loop().call_later(deadline - time.time(), self._fire)

    def _fire(self) -> None:
        deadline = self.handler._last_global_progress + self.handler.config.progress_timeout
        if time.time() > deadline:
            self.task._no_progress_made_marker = True  # type: ignore[attr-defined]
            self.task.cancel()
            self.timer = None
        else:
            self._arm()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


# Whether the piece is in: its probe passed (set then, just before the
# transaction puts it in), not uninstalled since. Ours, wherever a caller
# or coalesced sampling holds it, runs tinker's ``sample`` otherwise.
_state = {"active": False}
# Sample calls run lean in this process, and of those the ones awaited at
# once that crossed in batches (the tests check they were).
calls = [0]
crossed = [0]


def undo() -> None:
    """At uninstall: a ``sample`` kept by a caller runs tinker's again."""
    _state["active"] = False


def source_digest(where: str) -> str | None:
    """sha256 of the source of ``module:Qualified.name``, or None when it
    cannot be read or is wrapped by anything but tinker's own decorators
    (its method-name wrapper, contextlib's context managers): a wrapper
    there (a user's, a tracer's, a mock's) is code ours would skip."""
    import importlib

    module_name, _, qualname = where.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = vars(obj)[part] if isinstance(obj, type) else getattr(obj, part)
        while hasattr(obj, "__wrapped__"):
            if getattr(obj, "__code__", None) not in _own_wrappers():
                return None
            obj = obj.__wrapped__
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except Exception:
        return None


@functools.cache
def _own_wrappers() -> frozenset[Any]:
    """The code of the wrappers tinker's own decorators make around the
    functions ours reproduces."""
    import contextlib

    from tinker.lib import sdk_method

    async def agen() -> Any:
        yield

    def gen() -> Any:
        yield

    return frozenset(
        {
            sdk_method._tracked(lambda: None, "").__code__,
            contextlib.contextmanager(gen).__code__,
            contextlib.asynccontextmanager(agen).__code__,
        }
    )


def probe_sample(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed unless each function whose steps ours stands in
    for is tinker 0.38.0's, by its source."""
    changed = [where for where, digest in REPRODUCED.items() if source_digest(where) != digest]
    _state["active"] = not changed
    if changed:
        raise ProbeFailed(
            "tinker's sample path is not the one ours reproduces (tinker 0.38.0's): "
            + ", ".join(where.partition(":")[2] for where in changed)
            + " changed"
        )


PIECES = (
    Piece(
        "tinker",  # the class coalesced sampling's piece replaces the method of too, named apart
        "SamplingClient.sample",
        "transport",
        make_sample,
        probe_sample,
        defined_in="tinker.lib.public_interfaces.sampling_client",
        spread=False,
        since="0.38.0",
        undo=undo,
        label="sample calls run lean",
    ),
)
