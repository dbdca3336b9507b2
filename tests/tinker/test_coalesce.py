"""tinker_rl_data.tinker.coalesce: concurrent identical single-sample calls on one
sampling client become one request with num_samples=k. tinker's `sample`
is replaced by a fake with its signature (the transport here): it records
each request and answers with a future the test resolves."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import subprocess
import sys
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from tinker import types
from tinker.lib.backcompat_concurrent_future import _AwaitableFutureCompatWrapper
from tinker.lib.public_interfaces.sampling_client import SamplingClient

from tinker_rl_data.errors import ProbeFailed
from tinker_rl_data.tinker import coalesce as _coalesce
from tinker_rl_data.tinker.coalesce import make_sample, probe_sample


class FakeSample:
    """tinker's `sample`, sending nothing: each call is kept with its future."""

    def __init__(self, answer="at once"):
        self.calls: list[tuple] = []
        self.answer = answer

    def __call__(
        self,
        client,
        prompt,
        num_samples,
        sampling_params,
        include_prompt_logprobs=False,
        topk_prompt_logprobs=0,
        topk_sample_logprobs=0,
        target_prompt_logprobs=None,
        prompt_alt_tokens_k=0,
        prompt_logprobs_last_n=None,
    ):
        future: Future = Future()
        self.calls.append((client, prompt, num_samples, sampling_params, include_prompt_logprobs, future))
        # answer: "at once", "later" (the test resolves it), an exception, or
        # a function of (call number from 1, num_samples) giving one of those.
        answer = self.answer(len(self.calls), num_samples) if callable(self.answer) else self.answer
        if answer == "at once":
            future.set_result(response(num_samples, offset=100 * len(self.calls)))
        elif isinstance(answer, BaseException):
            future.set_exception(answer)
        return _AwaitableFutureCompatWrapper(future)


def response(n, offset=0):
    sequences = [
        types.SampledSequence(
            stop_reason="length", tokens_np=np.array([offset + i], np.int32), logprobs_np=np.array([-0.5], np.float32),
            sequence_id=f"seq-{offset + i}",
        )
        for i in range(n)
    ]
    return types.SampleResponse(sequences=sequences, prompt_cache_hit_tokens=3)


PROMPT = [1, 2, 3]
SUPPORT = Path(__file__).resolve().parents[1] / "support"


def params(**kw):
    return types.SamplingParams(max_tokens=8, stop=["\n"], temperature=1.0, **kw)


def run(coro):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return asyncio.run(coro)


async def group(sample, client, n, prompt=PROMPT, **kw):
    # As tinker-cookbook's group rollout: episodes started together, each
    # awaiting its completer's sample() of the group's shared first prompt.
    async def episode():
        result = await sample(client, prompt=types.ModelInput.from_ints(list(prompt)), num_samples=1,
                              sampling_params=params(**kw))
        return result

    return await asyncio.gather(*(episode() for _ in range(n)), return_exceptions=True)


def test_concurrent_identical_calls_become_one_request():
    fake = FakeSample()
    sample = make_sample(fake)
    _coalesce.reset_counts()
    client = object()
    results = run(group(sample, client, 16))
    assert len(fake.calls) == 1
    (called_client, prompt, num_samples, sp, logprobs, _) = fake.calls[0]
    assert called_client is client and num_samples == 16 and logprobs is False
    assert prompt.to_ints() == PROMPT and sp == params()
    tokens = [r.sequences[0].tokens for r in results]
    assert all(len(r.sequences) == 1 and r.prompt_cache_hit_tokens == 3 for r in results)
    assert sorted(tokens) == [[100 + i] for i in range(16)]  # each caller one distinct sequence
    assert _coalesce.counts() == {"merged_requests": 1, "merged_calls": 16, "split_requests": 0, "split_calls": 0}
    assert not sample.__tinker_rl_data_pending__


def test_a_delivered_callers_future_is_freed_without_the_collector():
    # Each merged caller's future sits in chains of callbacks (asyncio's
    # wrap_future, tinker's wrapper) that hold it back: once answered, the
    # batch and the future let go of them, so a step's thousands of callers
    # are freed as the caller drops them, not by the next full collection.
    fake = FakeSample()
    sample = make_sample(fake)
    client = object()
    refs = []

    async def episode():
        returned = sample(client, prompt=types.ModelInput.from_ints(PROMPT), num_samples=1, sampling_params=params())
        refs.extend([weakref.ref(returned), weakref.ref(returned._future)])
        return (await returned).sequences[0].tokens

    async def main():
        return await asyncio.gather(*(episode() for _ in range(8)))

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        tokens = run(main())
        alive = [r() for r in refs if r() is not None]
    finally:
        if enabled:
            gc.enable()
    assert len(fake.calls) == 1 and sorted(tokens) == [[100 + i] for i in range(8)]
    assert len(refs) == 16 and not alive, [type(a).__name__ for a in alive]


def test_a_merged_request_failing_sends_each_caller_alone():
    # The merged request (call 1) fails; each caller is then sent alone and
    # gets its own call's outcome: calls 3 and 5 fail, the others succeed.
    error, again = RuntimeError("sampler on fire"), RuntimeError("again")
    fake = FakeSample(answer=lambda i, n: error if i == 1 else again if i in (3, 5) else "at once")
    _coalesce.reset_counts()
    results = run(group(make_sample(fake), object(), 5))
    assert [c[2] for c in fake.calls] == [5, 1, 1, 1, 1, 1]
    assert [c[3] for c in fake.calls[1:]] == [params()] * 5 and all(c[4] is False for c in fake.calls)
    outcomes = [r if isinstance(r, BaseException) else r.sequences[0].tokens for r in results]
    assert outcomes == [[200], again, [400], again, [600]]
    assert _coalesce.counts() == {"merged_requests": 1, "merged_calls": 5, "split_requests": 1, "split_calls": 5}


def test_an_error_of_the_request_itself_reaches_each_caller_from_its_own_call():
    errors = []

    def answer(i, n):
        errors.append(RuntimeError(f"call {i}"))
        return errors[-1]

    results = run(group(make_sample(FakeSample(answer=answer)), object(), 3))
    assert results == errors[1:]  # each caller its own call's exception, not the merged one


def test_a_response_without_one_sequence_per_caller_sends_each_alone():
    fake = FakeSample(answer=lambda i, n: "later" if i == 1 else "at once")
    sample = make_sample(fake)

    async def go():
        client = object()
        futures = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(3)]
        await asyncio.sleep(0)
        fake.calls[0][5].set_result(response(2))  # two sequences for three callers
        return [await f for f in futures]

    results = run(go())
    assert [c[2] for c in fake.calls] == [3, 1, 1, 1]
    assert [r.sequences[0].tokens for r in results] == [[200], [300], [400]]


def test_an_error_raised_by_tinkers_sample_sends_each_caller_alone():
    calls = []

    def raising(client, prompt, num_samples, *args):
        calls.append(num_samples)
        if num_samples > 1 or len(calls) == 3:
            raise ValueError(f"bad prompt {len(calls)}")
        return FakeSample()(client, prompt, num_samples, *args)

    results = run(group(make_sample(raising), object(), 3))
    assert calls == [3, 1, 1, 1]
    assert [type(r).__name__ for r in results] == ["SampleResponse", "ValueError", "SampleResponse"]
    assert str(results[1]) == "bad prompt 3"


def test_a_lone_call_gets_tinkers_response_as_it_is():
    fake = FakeSample()
    (result,) = run(group(make_sample(fake), object(), 1))
    assert fake.calls[0][2] == 1
    assert result is fake.calls[0][5].result()


def test_different_prompts_params_and_clients_are_not_merged():
    fake = FakeSample()
    sample = make_sample(fake)
    a, b = object(), object()

    async def go():
        return await asyncio.gather(
            group(sample, a, 2),
            group(sample, a, 2, prompt=[1, 2, 4]),
            group(sample, a, 2, top_k=5),
            group(sample, b, 2),
        )

    results = run(go())
    assert sorted(c[2] for c in fake.calls) == [2, 2, 2, 2]
    assert all(len(r.sequences) == 1 for g in results for r in g)


@pytest.mark.parametrize(
    "kw",
    [
        {"num_samples": 2},
        {"seed": 7},
        {"include_prompt_logprobs": True},
        {"topk_sample_logprobs": 2},
        {"prompt_alt_tokens_k": 1},
    ],
)
def test_other_calls_go_out_as_they_are_at_once(kw):
    fake = FakeSample()
    sample = make_sample(fake)
    seed = kw.pop("seed", None)
    num_samples = kw.pop("num_samples", 1)

    async def go():
        futures = [
            sample(object(), types.ModelInput.from_ints(PROMPT), num_samples, params(seed=seed), **kw) for _ in range(3)
        ]
        assert len(fake.calls) == 3  # sent from within sample(), as tinker's does
        return [await f for f in futures]

    results = run(go())
    assert [c[2] for c in fake.calls] == [num_samples] * 3
    assert [r for r in results] == [c[5].result() for c in fake.calls]


def test_calls_outside_an_event_loop_go_out_as_they_are():
    fake = FakeSample()
    sample = make_sample(fake)
    client = object()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        results = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()).result() for _ in range(2)]
    assert [c[2] for c in fake.calls] == [1, 1] and len(results) == 2


def test_a_caller_blocking_the_loop_sends_its_batch_first():
    fake = FakeSample()
    sample = make_sample(fake)

    async def go():
        future = sample(object(), types.ModelInput.from_ints(PROMPT), 1, params())
        assert not fake.calls
        return future.result(timeout=5)  # blocks the loop: must not wait for its turn

    assert run(go()).sequences[0].tokens == [100]


# Every way tinker documents to block on what `sample()` returns (its
# `APIFuture`, `.future()`, and the returned future itself, still a
# concurrent Future for old callers), each given two coalesced calls.
LONG = 60  # seconds: only a bound for a test that would otherwise hang


def wait_all(futures):
    done, _ = concurrent.futures.wait([f.future() for f in futures], timeout=LONG)
    return len(done)


def wait_all_returned(futures):
    done, _ = concurrent.futures.wait(futures, timeout=LONG)
    return len(done)


def as_completed(futures):
    return len(list(concurrent.futures.as_completed([f.future() for f in futures], timeout=LONG)))


def as_completed_returned(futures):
    return len(list(concurrent.futures.as_completed(futures, timeout=LONG)))


def result(futures):
    return len([f.result(timeout=LONG) for f in futures])


def future_result(futures):
    return len([f.future().result(timeout=LONG) for f in futures])


def exception(futures):
    return len([f for f in futures if f.exception(timeout=LONG) is None])


def done_polled(futures):
    deadline = time.monotonic() + LONG
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.001)
    return sum(f.done() for f in futures)


BLOCKING = [
    wait_all, wait_all_returned, as_completed, as_completed_returned, result, future_result,
    exception, done_polled,
]


@pytest.mark.parametrize("block", BLOCKING, ids=lambda f: f.__name__)
@pytest.mark.parametrize("answer", ["at once", "from another thread"])
def test_a_blocking_wait_on_the_loops_thread_sends_the_merged_request(block, answer):
    # A sync env step inside a coroutine: the loop's thread blocks on its
    # samples, so the loop's next turn (when a batch goes out) never comes.
    fake = FakeSample(answer="later" if answer == "from another thread" else "at once")
    sample = make_sample(fake)

    def answer_when_sent():
        deadline = time.monotonic() + LONG
        while not fake.calls and time.monotonic() < deadline:
            time.sleep(0.001)
        fake.calls[0][5].set_result(response(2, offset=100))

    async def go():
        client = object()
        futures = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(2)]
        if answer == "from another thread":
            threading.Thread(target=answer_when_sent, daemon=True).start()
        return block(futures), futures

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the returned future's Future methods
        unblocked, futures = run(go())
    assert unblocked == 2
    assert [c[2] for c in fake.calls] == [2]  # still merged
    assert [f.result(0).sequences[0].tokens for f in futures] == [[100], [101]]


# tinker's own client against the local fake service (tests/support/fake_tinker.py),
# in a process of its own (as a user's script: tinker's client threads and
# connections end with it), blocking on two coalesced calls each way.
BLOCKED_SCRIPT = r"""
import asyncio, concurrent.futures, json, sys
sys.path.insert(0, sys.argv[1])
from fake_tinker import FakeTinker
import tinker
from tinker import types
from tinker.lib.public_interfaces.sampling_client import SamplingClient
from tinker_rl_data.tinker import coalesce

SamplingClient.sample = coalesce.make_sample(SamplingClient.sample)
LONG = 30  # only a bound: without it the unfixed waits never return
WAYS = {
    "wait": lambda fs: len(concurrent.futures.wait([f.future() for f in fs], timeout=LONG).done),
    "as_completed": lambda fs: len(list(concurrent.futures.as_completed([f.future() for f in fs], timeout=LONG))),
    "result": lambda fs: len([f.result(timeout=LONG) for f in fs]),
}

async def blocked(client, way, prompt):
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    futures = [client.sample(prompt, 1, params) for _ in range(2)]
    try:
        unblocked = WAYS[way](futures)
    except TimeoutError:
        unblocked = "timed out"
    return unblocked, [[list(s.tokens) for s in f.result(LONG).sequences] for f in futures]

out = {}
with FakeTinker() as service:
    with tinker.ServiceClient(base_url=service.base_url, api_key="tml-fake-key") as service_client:
        client = service_client.create_sampling_client(base_model="fake/model-8b").result()
        for i, way in enumerate(WAYS):
            coalesce.reset_counts()
            unblocked, samples = asyncio.run(blocked(client, way, types.ModelInput.from_ints([7, 8, i])))
            out[way] = {"unblocked": unblocked, "samples": samples, "counts": coalesce.counts()}
    service.proc.stdout.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def blocked_on_tinkers_client():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_SCRIPT, str(SUPPORT)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("way", ["wait", "as_completed", "result"])
def test_a_blocking_wait_gets_tinkers_samples_merged(blocked_on_tinkers_client, way):
    outcome = blocked_on_tinkers_client[way]
    assert outcome["unblocked"] == 2
    assert outcome["counts"]["merged_requests"] == 1 and outcome["counts"]["merged_calls"] == 2
    samples = outcome["samples"]
    assert [len(s) for s in samples] == [1, 1] and samples[0] != samples[1]  # one draw each


def test_the_probe_fails_when_a_blocking_wait_is_not_seen(monkeypatch):
    # What sends a batch under `concurrent.futures.wait`: the waiter it adds.
    from concurrent.futures import _base

    def install_unseen(fs, return_when):
        waiter = _base._AllCompletedWaiter(len(fs), stop_on_exception=False)
        for f in fs:
            list.append(f._waiters, waiter)
        return waiter

    monkeypatch.setattr(_base, "_create_and_install_waiters", install_unseen)
    original = SamplingClient.sample
    with pytest.raises(ProbeFailed, match="concurrent.futures.wait"):
        probe_sample(original, make_sample(original))


def test_a_batch_whose_loop_closes_before_its_turn_is_sent_and_left():
    fake = FakeSample()
    sample = make_sample(fake)
    pending = sample.__tinker_rl_data_pending__
    client = object()
    futures = []

    def calls():
        futures.extend(sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(2))

    loop = asyncio.new_event_loop()
    loop.call_soon(calls)
    loop.call_soon(loop.stop)  # stopped in the turn of the calls: their batch's turn never comes
    loop.run_forever()
    assert len(futures) == 2 and not fake.calls and len(pending) == 1
    loop.close()
    # Its callers get what tinker's sample, called at once, would have given them.
    assert [c[2] for c in fake.calls] == [2]
    assert [f.future().result(0).sequences[0].tokens for f in futures] == [[100], [101]]
    # No batch of the closed loop is left for a new loop (maybe at its address) to join.
    assert not pending
    results = run(group(sample, client, 2))
    assert [c[2] for c in fake.calls] == [2, 2]
    assert [r.sequences[0].tokens for r in results] == [[200], [201]]


def test_merges_at_most_max_merge_calls_per_request():
    fake = FakeSample()
    results = run(group(make_sample(fake, max_merge=4), object(), 10))
    assert [c[2] for c in fake.calls] == [4, 4, 2]
    assert len({r.sequences[0].tokens[0] for r in results}) == 10
    with pytest.raises(ValueError):
        make_sample(fake, max_merge=0)


def test_cancelling_one_caller_leaves_the_others_and_all_cancels_the_request():
    fake = FakeSample(answer="later")
    sample = make_sample(fake)

    async def go():
        client = object()
        futures = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(3)]
        await asyncio.sleep(0)
        (*_, request) = fake.calls[0]
        assert futures[0].future().cancel()
        assert not request.cancelled()
        request.set_result(response(3))
        rest = [await f for f in futures[1:]]
        others = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(2)]
        await asyncio.sleep(0)
        for f in others:
            f.future().cancel()
        return rest, fake.calls[1][5]

    rest, second = run(go())
    assert [r.sequences[0].tokens for r in rest] == [[1], [2]]
    assert second.cancelled()


def test_a_caller_timed_out_leaves_the_others_samples():
    # As RetryOnFailure(per_rollout_timeout=...): one episode's wait_for
    # cancels its caller; the merged request goes on for the others.
    fake = FakeSample(answer="later")
    sample = make_sample(fake)

    async def go():
        client = object()

        async def episode(timeout):
            f = sample(client, types.ModelInput.from_ints(PROMPT), 1, params())
            return await asyncio.wait_for(f.result_async(), timeout)

        tasks = [asyncio.ensure_future(episode(t)) for t in (0.01, 5, 5)]
        await asyncio.sleep(0.05)
        assert tasks[0].done() and isinstance(tasks[0].exception(), asyncio.TimeoutError)
        assert len(fake.calls) == 1 and not fake.calls[0][5].cancelled()
        fake.calls[0][5].set_result(response(3))
        return [await t for t in tasks[1:]]

    assert [r.sequences[0].tokens for r in run(go())] == [[1], [2]]


def test_a_cancelled_caller_is_not_sent_again_and_the_others_are():
    fake = FakeSample(answer=lambda i, n: "later" if i == 1 else "at once")
    sample = make_sample(fake)

    async def go():
        client = object()
        futures = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(3)]
        await asyncio.sleep(0)
        assert futures[1].future().cancel()
        fake.calls[0][5].set_exception(RuntimeError("merged request failed"))
        return futures[1].future(), [await f for f in (futures[0], futures[2])]

    cancelled, rest = run(go())
    assert [c[2] for c in fake.calls] == [3, 1, 1]  # the cancelled caller is not resent
    assert cancelled.cancelled() and [r.sequences[0].tokens for r in rest] == [[200], [300]]


def test_cancelling_a_caller_sent_alone_cancels_its_request_only():
    fake = FakeSample(answer=lambda i, n: RuntimeError("merged request failed") if i == 1 else "later")
    sample = make_sample(fake)

    async def go():
        client = object()
        futures = [sample(client, types.ModelInput.from_ints(PROMPT), 1, params()) for _ in range(3)]
        await asyncio.sleep(0)
        assert [c[2] for c in fake.calls] == [3, 1, 1, 1]
        alone = [c[5] for c in fake.calls[1:]]
        assert futures[0].future().cancel()
        assert alone[0].cancelled() and not alone[1].cancelled() and not alone[2].cancelled()
        alone[1].set_result(response(1, offset=7))
        alone[2].set_exception(KeyError("its own"))
        return await futures[1], await asyncio.gather(futures[2], return_exceptions=True)

    first, (second,) = run(go())
    assert first.sequences[0].tokens == [7] and isinstance(second, KeyError)


def test_failures_and_cancellations_from_other_threads():
    # tinker finishes its futures on its own loop's thread; a caller can be
    # cancelled from any thread. Many groups, each merged request failing
    # on a worker thread, one caller per group cancelled from another one.
    fake = FakeSample(answer=lambda i, n: "later")
    sample = make_sample(fake)
    groups, size = 40, 4

    async def go():
        client = object()
        futures = []
        for g in range(groups):
            futures.append([sample(client, types.ModelInput.from_ints([g, 1]), 1, params()) for _ in range(size)])
        await asyncio.sleep(0)
        merged = [c[5] for c in fake.calls]
        assert len(merged) == groups

        def fail():
            for m in merged:
                m.set_exception(RuntimeError("merged"))

        def cancel():
            for fs in futures:
                fs[0].future().cancel()

        threads = [threading.Thread(target=fail), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in fake.calls[groups:]:
            if not c[5].done():
                c[5].set_result(response(1, offset=5))
        return futures

    futures = run(go())
    for fs in futures:
        assert fs[0].future().cancelled()
        assert all(f.future().result(timeout=1).sequences[0].tokens == [5] for f in fs[1:])
    assert len(fake.calls) - groups <= groups * size


def test_the_probe_passes_on_tinkers_sample_and_fails_with_a_reason():
    original = SamplingClient.sample
    probe_sample(original, make_sample(original))
    with pytest.raises(ProbeFailed, match="does not wrap"):
        probe_sample(original, make_sample(FakeSample()))

    def other(self, prompt, num_samples, sampling_params, include_prompt_logprobs=False):
        pass

    with pytest.raises(ProbeFailed, match="tinker's sample takes"):
        probe_sample(other, make_sample(other))


def test_the_site_is_tinkers_sample():
    import importlib

    (piece,) = _coalesce.PIECES
    module, name = piece.module, piece.name
    cls_name, attr = name.split(".")
    cls = getattr(importlib.import_module(module), cls_name)
    import tinker

    assert cls is tinker.SamplingClient and callable(getattr(cls, attr))
