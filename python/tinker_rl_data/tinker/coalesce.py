"""Coalesced sampling: concurrent ``SamplingClient.sample`` calls that would
send the same request with ``num_samples=1`` go out as one request with
``num_samples=k``, its sequences handed back one per caller.

A call is merged when, on one client and from one event loop, it asks for
one sample with no seed and nothing else (no prompt logprobs, top-k, target
logprobs, alternative tokens): calls whose prompt and sampling parameters
would be sent as the same JSON (the core's reader of :mod:`.sample`) and
that arrive before the loop's next turn share one request. That is how
tinker-cookbook's group rollouts call it: ``asyncio.gather`` starts a
group's episodes together and each one's ``TinkerTokenCompleter`` calls
``sample(prompt, num_samples=1, ...)`` with the group's shared first prompt.
Anything else goes to tinker's ``sample`` as it is, at once.

What it changes: the samples come from the same distribution, not the same
draws; the shared prompt is billed (and its prefix cache counted) once per
merged request; tinker's own retries (HTTP retries, resubmissions) run once,
for the merged request; each caller's response holds its own sequence, the
response's other fields (``prompt_cache_hit_tokens``) as the merged
request's.

Failures are no wider than unmerged calls': when a merged request fails for
good (tinker raised, after its own retries, or the response does not hold
one sequence per caller), each caller still waiting is sent again alone,
with tinker's ``sample`` as it would have called it, and gets that call's
own result or exception. So an error that belongs to the request (a prompt
the service rejects) reaches each caller as the same exception class an
unmerged call gets, from its own request, and an error of the merged
request alone (a transient failure that tinker does not retry, a
``num_samples`` the service refuses) costs each caller one more request,
not its sample: a ``rollout_error_tolerance`` strategy sees each
trajectory's failure apart, never k at once. ``counts()`` says how often
(``split_requests``, ``split_calls``). The resends go out from the thread
that saw the failure (tinker's ``sample`` may be called from any thread).

A caller that blocks instead of awaiting (``result()``, ``exception()``,
``done()``, or ``concurrent.futures.wait`` / ``as_completed`` on the
returned future or its ``future()``: a sync env step inside a coroutine
blocks the loop's thread, whose next turn then never comes) sends its
batch at once, with the calls joined so far; later calls start another.
Awaiting (``await``, ``result_async()``, ``asyncio.wrap_future``) waits
for the turn, so the cookbook's ``asyncio.gather`` still merges a group. A
loop closed before its turn drops it; that sends the batch too (its
callers get tinker's answer, as from tinker's ``sample``, which sends at
once), and no batch of that loop is left for a later loop to join.

Cancelling one caller's future (a per-rollout timeout) leaves the others
and the merged request running, and a caller already sent alone cancels
its own request; cancelling every caller of a merged request cancels it.
A slow merged request is slow for all its callers: a timeout that fires on
one fires on the others (same deadline, same request), as when k unmerged
requests were equally slow.

Installed (:data:`PIECES`, feature ``coalesce``, opt-in) at ``SamplingClient.sample``
of ``tinker.lib.public_interfaces.sampling_client`` (the class
``tinker.SamplingClient`` is), as ``make_sample(original)``; ``sample_async``
calls ``self.sample`` and so goes through it too. :func:`probe_sample`
checks the installed tinker still has what the wrapper relies on.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import os
import threading
from concurrent.futures import CancelledError, Future, InvalidStateError, as_completed, wait
from typing import Any, Callable

from .. import _core, features
from ..patch.feature import Feature, WorkerPart, WorkerStart
from ..patch.piece import Piece, ProbeFailed
from . import futures, sample_path
from . import sample as sampling

__all__ = ["MAX_MERGE", "PIECES", "counts", "make_sample", "probe_sample", "reset_counts"]

#: The most calls one request serves (then the next call starts another):
#: a tinker-cookbook group is 4-64 trajectories.
MAX_MERGE = 64

# tinker's `sample` parameters after `sampling_params`, with the defaults a
# mergeable call leaves them at.
_OPTIONS = (
    ("include_prompt_logprobs", False),
    ("topk_prompt_logprobs", 0),
    ("topk_sample_logprobs", 0),
    ("target_prompt_logprobs", None),
    ("prompt_alt_tokens_k", 0),
    ("prompt_logprobs_last_n", None),
)

_counts_lock = threading.Lock()
# Guards every `pending` dict's read-join-insert (the loop's thread) against
# a batch leaving it from the thread a blocked caller started.
_pending_lock = threading.Lock()
_counts = {"merged_requests": 0, "merged_calls": 0, "split_requests": 0, "split_calls": 0}


def counts() -> dict[str, int]:
    """Requests sent for more than one call (``merged_requests``) and the
    calls they served (``merged_calls``); ``merged_calls - merged_requests``
    requests were saved. Merged requests that failed for good
    (``split_requests``) and the calls then sent again alone
    (``split_calls``)."""
    with _counts_lock:
        return dict(_counts)


def reset_counts() -> None:
    with _counts_lock:
        for k in _counts:
            _counts[k] = 0


def _forget_counts() -> None:
    """In a forked child (a rollout worker of a fork-started pool): the
    parent's merges are not the child's to report (its results would carry
    them back to the parent again), and the lock may have been held at the
    fork."""
    global _counts_lock
    _counts_lock = threading.Lock()
    for k in _counts:
        _counts[k] = 0


os.register_at_fork(after_in_child=_forget_counts)


def make_sample(original: Callable[..., Any], max_merge: int = MAX_MERGE) -> Callable[..., Any]:
    """``SamplingClient.sample`` with concurrent identical single-sample calls
    merged (see the module's docstring); ``original`` is tinker's."""
    from tinker.lib.backcompat_concurrent_future import _AwaitableFutureCompatWrapper

    if max_merge < 1:
        raise ValueError(f"max_merge must be 1 or more, got {max_merge}")
    parts = sampling._parts()
    key_of = _core.sample_prompt_key
    below = sample_path.beneath(original)  # the sample path a call or a merged request takes
    # Open batches by (client, loop, prompt and params JSON); a batch leaves
    # when it is sent, so an id is not reused while its entry lives.
    pending: dict[tuple[int, int, bytes], _Batch] = {}

    @functools.wraps(original)
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
        key, loop = None, None
        if (
            parts is not None
            and type(num_samples) is int
            and num_samples == 1
            and include_prompt_logprobs is False
            and type(topk_prompt_logprobs) is int
            and topk_prompt_logprobs == 0
            and type(topk_sample_logprobs) is int
            and topk_sample_logprobs == 0
            and target_prompt_logprobs is None
            and type(prompt_alt_tokens_k) is int
            and prompt_alt_tokens_k == 0
            and prompt_logprobs_last_n is None
            and getattr(sampling_params, "seed", 0) is None
        ):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass  # no loop to wait a turn on: nothing to merge with
            if loop is not None:
                key = key_of(prompt, sampling_params, parts)
        if key is None or loop is None:
            return below(
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
        slot = (id(self), id(loop), key)
        with _pending_lock:  # (a batch may be sent, and leave, from another thread)
            batch = pending.get(slot)
            caller = batch.join(max_merge) if batch is not None else None
            if caller is None:
                batch = _Batch(below, pending, slot, self, prompt, sampling_params)
                caller = batch.join(max_merge)
                assert caller is not None  # a new batch takes one caller at least
                pending[slot] = batch
                loop.call_soon(_Turn(batch))
        returned = _AwaitableFutureCompatWrapper(caller)
        # Still a concurrent Future (tinker's back-compat), so it can be waited on too.
        returned._waiters = _Waiters(caller._batch)  # type: ignore[attr-defined]
        return returned

    sample.__tinker_rl_data_pending__ = pending  # type: ignore[attr-defined]  # for tests
    return sample


class _Caller(Future):
    """One merged caller's future. Waiting on it blocking before its batch
    is sent (``result()``, ``exception()``, ``done()``, or
    ``concurrent.futures.wait`` / ``as_completed``, which add a waiter)
    sends the batch then, so that a caller blocking the loop's thread does
    not wait for a turn of that loop. Once sent alone (its merged request
    failed), ``alone`` is that request's future."""

    def __init__(self, batch: _Batch):
        super().__init__()
        # Its callbacks' closures hold it (asyncio's wrap_future, tinker's
        # wrapper): dropped once run, the caller is freed without a collection.
        self.add_done_callback(futures.let_go)
        self._batch = batch
        self._waiters = _Waiters(batch)  # type: ignore[attr-defined]
        self.alone: Future | None = None

    def result(self, timeout: float | None = None) -> Any:
        self._batch.send()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._batch.send()
        return super().exception(timeout)

    def done(self) -> bool:
        self._batch.send()  # a caller polling it would wait for the loop's turn forever
        return super().done()

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            self._batch.caller_cancelled(self)
        return cancelled


class _Waiters(list):
    """A future's waiters, where ``concurrent.futures.wait`` and
    ``as_completed`` add theirs before they block: adding one sends the
    batch, from a thread of its own, since the waiting thread holds the
    futures' locks until every waiter is added (sent inline, a caller
    finished before its waiter is added would never wake the wait)."""

    __slots__ = ("batch",)

    def __init__(self, batch: _Batch):
        super().__init__()
        self.batch = batch

    def append(self, waiter: Any) -> None:
        super().append(waiter)
        self.batch.send_from_thread()


class _Turn:
    """The loop's turn for a batch: sends it when the loop runs it, or when
    the loop drops it unrun (closed first), so that no caller waits on a
    dead loop and no batch of a freed loop stays in ``pending`` for a new
    loop at its address to join."""

    __slots__ = ("batch",)

    def __init__(self, batch: _Batch):
        self.batch = batch

    def __call__(self) -> None:
        self.batch.send()

    def __del__(self) -> None:
        self.batch.send()  # nothing to do once sent


class _Batch:
    def __init__(
        self,
        original: Callable[..., Any],
        pending: dict[tuple[int, int, bytes], _Batch],
        slot: tuple[int, int, bytes],
        client: Any,
        prompt: Any,
        sampling_params: Any,
    ) -> None:
        self.original = original
        self.pending = pending
        self.slot = slot
        self.client = client
        self.prompt = prompt
        self.sampling_params = sampling_params
        self.callers: list[_Caller] = []
        self.sent = False
        self.sending = False  # a thread was started to send it
        # Guards `sent`, `sending`, `callers`, `request` and each caller's
        # `alone` (callers are cancelled from any thread; requests finish on
        # tinker's loop thread). Nothing is locked while it is held: a
        # blocking wait holds its futures' locks when it sends the batch.
        self.lock = threading.Lock()
        self.request: Future | None = None
        self.delivering: list[_Caller] = []  # the callers the sent request answers
        self.context = contextvars.copy_context()

    def join(self, max_merge: int) -> _Caller | None:
        """A new caller of this batch; None once it is sent or full."""
        with self.lock:
            if self.sent or len(self.callers) >= max_merge:
                return None
            caller = _Caller(self)
            self.callers.append(caller)
            return caller

    def send_from_thread(self) -> None:
        with self.lock:
            if self.sent or self.sending:
                return
            self.sending = True
        # In the first caller's context, as the loop's turn would send it
        # (tinker reads its sdk-method header from a context variable).
        threading.Thread(
            target=self.context.run, args=(self.send,), name="tinker_rl_data coalesce send", daemon=True
        ).start()

    def send(self) -> None:
        with self.lock:
            if self.sent:
                return
            self.sent = True
            joined = list(self.callers)
        callers = [c for c in joined if not c.cancelled()]
        with _pending_lock:
            if self.pending.get(self.slot) is self:
                del self.pending[self.slot]
        if not callers:
            return
        try:
            api_future = self.original(self.client, self.prompt, len(callers), self.sampling_params)
            request = api_future.future()
        except Exception as e:  # what tinker's `sample` raises
            if len(callers) > 1:
                self.split(callers)  # each caller gets what its own call raises
            else:
                _set(callers[0], exception=e)
            return
        except BaseException as e:
            for c in callers:
                _set(c, exception=e)
            raise
        if len(callers) > 1:
            with _counts_lock:
                _counts["merged_requests"] += 1
                _counts["merged_calls"] += len(callers)
        with self.lock:
            self.request = request
            self.delivering = callers
        request.add_done_callback(self.deliver)
        if all(c.cancelled() for c in callers):
            request.cancel()

    def caller_cancelled(self, caller: _Caller) -> None:
        with self.lock:
            alone = caller.alone
            request = self.request
            callers = list(self.callers)
        if alone is not None:
            alone.cancel()
        elif request is not None and all(c.cancelled() for c in callers):
            request.cancel()

    def deliver(self, done: Future) -> None:
        """The merged request's outcome to its callers (on the thread that
        finished it). Then the batch lets go of them: tinker's future keeps
        this callback, in a cycle of its own, and through it each caller's
        whole chain would wait for the collector."""
        with self.lock:
            callers, self.delivering = self.delivering, []
        try:
            self._deliver(done, callers)
        finally:
            with self.lock:
                self.callers = []
                self.request = None

    def _deliver(self, done: Future, callers: list[_Caller]) -> None:
        if done.cancelled():
            for c in callers:
                c.cancel()
            return
        error = done.exception()
        if len(callers) == 1:
            if error is not None:
                _set(callers[0], exception=error)
            else:
                _set(callers[0], result=done.result())
            return
        if error is not None:
            if isinstance(error, Exception):
                self.split(callers)
            else:  # not a request's failure (KeyboardInterrupt, SystemExit)
                for c in callers:
                    _set(c, exception=error)
            return
        response = done.result()
        sequences = list(response.sequences)
        if len(sequences) != len(callers):
            self.split(callers)  # not one sequence per caller: ask each alone
            return
        for c, sequence in zip(callers, sequences):
            _set(c, result=dataclasses.replace(response, sequences=[sequence]))

    def split(self, callers: list[_Caller]) -> None:
        """Sends each caller still waiting alone, with tinker's `sample` as
        the caller called it: its result or exception is the caller's."""
        waiting = [c for c in callers if not c.done()]
        if waiting:
            with _counts_lock:
                _counts["split_requests"] += 1
                _counts["split_calls"] += len(waiting)
        for c in waiting:
            if c.done():  # cancelled meanwhile
                continue
            try:
                alone = self.original(self.client, self.prompt, 1, self.sampling_params).future()
            except BaseException as e:
                _set(c, exception=e)
                if not isinstance(e, Exception):
                    raise
                continue
            with self.lock:
                c.alone = alone
            alone.add_done_callback(functools.partial(_copy, caller=c))
            if c.cancelled():  # cancelled before `alone` was set: cancel it here
                alone.cancel()


def _copy(done: Future, caller: _Caller) -> None:
    if done.cancelled():
        caller.cancel()
    elif (error := done.exception()) is not None:
        _set(caller, exception=error)
    else:
        _set(caller, result=done.result())


def _set(caller: _Caller, *, result: Any = None, exception: BaseException | None = None) -> None:
    # A caller cancelled meanwhile (from any thread) keeps its cancellation.
    try:
        if exception is not None:
            caller.set_exception(exception)
        else:
            caller.set_result(result)
    except (InvalidStateError, CancelledError):
        pass


def probe_sample(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed, saying why, unless tinker's ``sample`` is still
    what ``ours`` (``make_sample(original)``) relies on: its parameters and
    their defaults, an ``APIFuture`` with ``future()`` as its result, a
    dataclass response with ``sequences``, prompts and parameters the core
    reads, and ``concurrent.futures`` waits a caller can be seen in."""
    from tinker import types
    from tinker.lib.backcompat_concurrent_future import _AwaitableFutureCompatWrapper
    from tinker.lib.public_interfaces.api_future import APIFuture

    if getattr(ours, "__wrapped__", None) is not original:
        raise ProbeFailed("the replacement does not wrap this sample")
    params = list(inspect.signature(original).parameters.values())
    want = ["self", "prompt", "num_samples", "sampling_params", *(name for name, _ in _OPTIONS)]
    if [p.name for p in params] != want:
        raise ProbeFailed(f"tinker's sample takes {[p.name for p in params]}, not {want}")
    defaults = {p.name: p.default for p in params[4:]}
    if defaults != dict(_OPTIONS) or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        raise ProbeFailed(f"tinker's sample options are {defaults}, not {dict(_OPTIONS)}")
    if not (issubclass(_AwaitableFutureCompatWrapper, APIFuture) and issubclass(_AwaitableFutureCompatWrapper, Future)):
        raise ProbeFailed("tinker's sample future is no longer a concurrent Future and an APIFuture")
    fields = {f.name for f in dataclasses.fields(types.SampleResponse)} if dataclasses.is_dataclass(types.SampleResponse) else set()
    if "sequences" not in fields:
        raise ProbeFailed("tinker's SampleResponse is no longer a dataclass with sequences")
    if "seed" not in types.SamplingParams.model_fields:
        raise ProbeFailed("tinker's SamplingParams has no seed")
    if not _waits_are_seen():
        raise ProbeFailed("concurrent.futures.wait no longer adds its waiter to a future's _waiters")
    parts = sampling._parts()
    prompt = types.ModelInput.from_ints([1, 2, 3])
    if parts is None or _core.sample_prompt_key(prompt, types.SamplingParams(max_tokens=4), parts) is None:
        raise ProbeFailed(f"the core does not read tinker's prompts: {sampling.schema_mismatch()}")


def _waits_are_seen() -> bool:
    """Whether ``concurrent.futures.wait`` and ``as_completed`` still add
    their waiter to a future's ``_waiters`` (what sends a batch that a
    caller waits on that way)."""
    seen: list[Any] = []

    class Seen(list):
        def append(self, waiter: Any) -> None:
            seen.append(waiter)
            super().append(waiter)

    future: Future = Future()
    future._waiters = Seen()  # type: ignore[attr-defined]
    wait([future], timeout=0)
    try:
        next(as_completed([future], timeout=0))
    except TimeoutError:
        pass
    return len(seen) == 2 and not future._waiters  # type: ignore[attr-defined]


PIECES = (
    Piece(
        "tinker.lib.public_interfaces.sampling_client",
        "SamplingClient.sample",
        "coalesce",
        make_sample,
        probe_sample,
        spread=False,
        label="coalesced sampling",
    ),
)


def status() -> list[str]:
    """The feature's report line while installed."""
    merged, workers = counts(), features.worker_counters()  # this process's calls and its rollout workers'
    calls = merged.get("merged_calls", 0) + workers.get("merged_calls", 0)
    requests = merged.get("merged_requests", 0) + workers.get("merged_requests", 0)
    return [f"coalesced sampling: {calls} calls sent as {requests} requests"]


class _WorkerCounts(WorkerPart):
    """In a rollout worker: :func:`counts`, carried back with each result."""

    def counters(self) -> dict[str, int]:
        return counts()


def worker_started(start: WorkerStart) -> WorkerPart:
    """The feature's ``worker`` hook (where its pieces went in: a worker
    without them reports no sample calls)."""
    return _WorkerCounts()


FEATURE = features.register(__name__, Feature("coalesce", "coalesced sampling", PIECES, default=False, status=status, worker=worker_started))
