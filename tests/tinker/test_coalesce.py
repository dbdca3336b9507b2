"""tinker_rl_data._coalesce: concurrent identical single-sample calls on one
sampling client become one request with num_samples=k. tinker's `sample`
is replaced by a fake with its signature (the transport here): it records
each request and answers with a future the test resolves."""

from __future__ import annotations

import asyncio
import warnings
from concurrent.futures import Future

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
        if self.answer == "at once":
            future.set_result(response(num_samples, offset=100 * len(self.calls)))
        elif isinstance(self.answer, BaseException):
            future.set_exception(self.answer)
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
    assert _coalesce.counts() == {"merged_requests": 1, "merged_calls": 16}
    assert not sample.__tinker_rl_data_pending__


def test_an_error_reaches_every_merged_caller():
    error = RuntimeError("sampler on fire")
    fake = FakeSample(answer=error)
    results = run(group(make_sample(fake), object(), 5))
    assert len(fake.calls) == 1 and fake.calls[0][2] == 5
    assert all(r is error for r in results)


def test_an_error_raised_by_tinkers_sample_reaches_every_caller():
    def raising(*args):
        raise ValueError("bad prompt")

    results = run(group(make_sample(raising), object(), 3))
    assert [type(r) for r in results] == [ValueError] * 3


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
