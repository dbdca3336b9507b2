"""tinker_rl_data.tinker.sample: the `sample` request body against tinker's own,
`json.dumps(model_dump(request, exclude_unset=False, exclude_none=True,
mode="json"), ensure_ascii=False, separators=(",", ":"), allow_nan=False)`,
and posted through tinker's real client (a local transport)."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import warnings

import httpx
import pytest
import tinker._compat
import tinker.resources.sampling
from hypothesis import given
from hypothesis import strategies as st
from tinker import types
from tinker.types._pydantic_types.tensor_data import TensorData

from tinker_rl_data.errors import ProbeFailed
from tinker_rl_data import _core
from tinker_rl_data.tinker import sample as sampling
from tinker_rl_data.tinker.sample import encode_sample_request, make_model_dump, probe_sample_body

ARGS = {"exclude_unset": False, "exclude_none": True, "mode": "json"}


def tinkers_body(request) -> bytes:
    # As httpx writes `json=` bodies (httpx._content.encode_json).
    data = tinker._compat.model_dump(request, **ARGS)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def taken_by_core(request) -> bool:
    return _core.encode_sample_request(request, sampling._parts()) is not None


# --------------------------------------------------------------------------
# Random requests, built through tinker's own constructors

ints = st.one_of(st.integers(-5, 2**31), st.integers(-(2**63), 2**63 - 1))
huge_ints = st.one_of(ints, st.integers(-(2**70), 2**70))
finite = st.floats(allow_nan=False, allow_infinity=False)
texts = st.text(max_size=12)  # any code point but lone surrogates


@st.composite
def token_lists(draw):
    tokens = draw(st.lists(st.one_of(st.integers(0, 200_000), huge_ints), max_size=40))
    return tuple(tokens) if draw(st.booleans()) else tokens


@st.composite
def chunks(draw):
    kind = draw(st.sampled_from(["text", "text", "image", "pointer", "dmel"]))
    expected = draw(st.none() | ints)
    fmt = draw(st.sampled_from(["png", "jpeg"]))
    if kind == "text":
        return types.EncodedTextChunk(tokens=draw(token_lists()))
    if kind == "image":
        return types.ImageChunk(data=draw(st.binary(max_size=10)), format=fmt, expected_tokens=expected)
    if kind == "pointer":
        return types.ImageAssetPointerChunk(format=fmt, location=draw(texts), expected_tokens=expected)
    return types.DmelChunk(dmel=draw(st.binary(max_size=10)))


real = st.one_of(finite, st.integers(-(2**53), 2**53), st.sampled_from([0, 1, 1.0, 0.7, 1e-5, 1e16, -0.0, True]))


@st.composite
def sampling_params(draw, seed=st.none() | ints):
    stop = draw(
        st.none()
        | texts
        | st.lists(texts, max_size=3)
        | st.lists(ints, max_size=3)
        | st.tuples(texts, texts)
    )
    return types.SamplingParams(
        max_tokens=draw(st.none() | ints),
        seed=draw(seed),
        stop=stop,
        temperature=draw(real),
        top_k=draw(ints),
        top_p=draw(real),
    )


@st.composite
def tensors(draw):
    n = draw(st.integers(0, 6))
    if draw(st.booleans()):
        data = draw(st.lists(ints, min_size=n, max_size=n))
        dtype = draw(st.sampled_from(["int64", "float32"]))
    else:
        data = draw(st.lists(finite, min_size=n, max_size=n))
        dtype = "float32"
    sparse = draw(st.booleans())
    return TensorData(
        data=data,
        dtype=dtype,
        shape=draw(st.none() | st.lists(ints, max_size=3)),
        sparse_crow_indices=draw(st.lists(ints, max_size=3)) if sparse else None,
        sparse_col_indices=draw(st.none() | st.lists(ints, max_size=3)) if sparse else None,
    )


@st.composite
def requests(draw):
    optional = {
        "base_model": st.none() | texts,
        "model_path": st.none() | texts,
        "sampling_session_id": st.none() | texts,
        "seq_id": st.none() | huge_ints,
        "prompt_logprobs": st.none() | st.booleans(),
        "topk_prompt_logprobs": ints,
        "topk_sample_logprobs": ints,
        "target_prompt_logprobs": st.none() | tensors(),
        "prompt_alt_tokens_k": ints,
        "prompt_logprobs_last_n": st.none() | ints,
        "record_stability_info": st.none() | st.booleans(),
        "num_samples": huge_ints,
    }
    fields = {name: draw(value) for name, value in optional.items() if draw(st.booleans())}
    return types.SampleRequest(
        prompt=types.ModelInput(chunks=draw(st.lists(chunks(), max_size=4))),
        sampling_params=draw(sampling_params()),
        **fields,
    )


def fits_the_core(request) -> bool:
    """What the core writes itself: ints within int64 (and finite floats)."""
    return all(-(2**63) <= v < 2**63 for v in _all_ints(json.loads(tinkers_body(request))))


def _all_ints(value):
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _all_ints(v)
    elif isinstance(value, list):
        for v in value:
            yield from _all_ints(v)


@given(requests())
def test_bodies_equal_tinkers(request):
    before = copy.deepcopy(request)
    assert encode_sample_request(request) == tinkers_body(request)
    assert request == before
    # Everything tinker's validation makes is the core's to write, except
    # ints past int64 (then tinker writes the whole body).
    assert taken_by_core(request) == fits_the_core(request)


@given(finite)
def test_floats_as_python_repr_writes_them(v):
    request = types.SampleRequest(
        prompt=types.ModelInput.empty(),
        sampling_params=types.SamplingParams(temperature=v),
        target_prompt_logprobs=TensorData(data=[v], dtype="float32"),
    )
    assert taken_by_core(request)
    assert encode_sample_request(request) == tinkers_body(request)
    assert repr(v).encode() in encode_sample_request(request)


def test_the_floats_of_every_layout():
    values = [0.0, -0.0, 1e-4, 1e-5, 1e15, 1e16, 123.456, 5e-324, 1.7976931348623157e308, 2.0**53 + 1, 0.1 + 0.2]
    values += [math.ldexp(1.0, e) for e in range(-1074, 1024, 7)]
    request = types.SampleRequest(
        prompt=types.ModelInput.empty(),
        sampling_params=types.SamplingParams(),
        target_prompt_logprobs=TensorData(data=values, dtype="float32"),
    )
    assert taken_by_core(request)
    assert encode_sample_request(request) == tinkers_body(request)


def test_a_long_scoring_prompt():
    tokens = list(range(0, 150_000, 97)) * 3
    request = types.SampleRequest(
        prompt=types.ModelInput.from_ints(tokens),
        sampling_params=types.SamplingParams(max_tokens=1),
        prompt_logprobs=True,
        sampling_session_id="s",
        seq_id=3,
    )
    assert taken_by_core(request)
    assert encode_sample_request(request) == tinkers_body(request)


# --------------------------------------------------------------------------
# What the core leaves to tinker: tinker's bytes, or tinker's exception


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_float_json_refuses_is_refused_like_tinker(bad):
    request = types.SampleRequest(prompt=types.ModelInput.empty(), sampling_params=types.SamplingParams(top_p=bad))
    with pytest.raises(ValueError) as theirs:
        tinkers_body(request)
    with pytest.raises(ValueError) as ours:
        encode_sample_request(request)
    assert str(ours.value) == str(theirs.value)


def test_a_str_without_utf8_is_refused_like_tinker():
    request = types.SampleRequest(
        prompt=types.ModelInput.empty(), sampling_params=types.SamplingParams(), base_model="a\ud800"
    )
    with pytest.raises(UnicodeEncodeError):
        tinkers_body(request)
    with pytest.raises(UnicodeEncodeError):
        encode_sample_request(request)


class MyChunk(types.EncodedTextChunk):
    pass


class MyParams(types.SamplingParams):
    pass


def odd_requests():
    prompt = types.ModelInput.from_ints([1, 2])
    params = types.SamplingParams()
    construct = types.SampleRequest.model_construct
    yield "a chunk subclass", types.SampleRequest(
        prompt=types.ModelInput(chunks=[MyChunk(tokens=[1])]), sampling_params=params
    )
    yield "a params subclass", types.SampleRequest(prompt=prompt, sampling_params=MyParams(top_k=3))
    yield "a str num_samples", construct(prompt=prompt, sampling_params=params, num_samples="3")
    yield "a bool num_samples", construct(prompt=prompt, sampling_params=params, num_samples=True)
    yield "another type", construct(prompt=prompt, sampling_params=params, type="other")
    yield "a float seq_id", construct(prompt=prompt, sampling_params=params, seq_id=1.5)
    yield "tokens in a range", construct(
        prompt=types.ModelInput.model_construct(chunks=[types.EncodedTextChunk.model_construct(tokens=range(3))]),
        sampling_params=params,
    )
    yield "a bool token", construct(
        prompt=types.ModelInput.model_construct(chunks=[types.EncodedTextChunk.model_construct(tokens=[1, True])]),
        sampling_params=params,
    )
    yield "a float temperature str", construct(
        prompt=prompt, sampling_params=types.SamplingParams.model_construct(temperature="1")
    )
    yield "chunks as a tuple", construct(
        prompt=types.ModelInput.model_construct(chunks=(types.EncodedTextChunk(tokens=[1]),)), sampling_params=params
    )
    yield "mixed tensor data", construct(
        prompt=prompt,
        sampling_params=params,
        target_prompt_logprobs=TensorData.model_construct(data=[1, 2.5], dtype="float32"),
    )
    yield "mixed stop", construct(prompt=prompt, sampling_params=types.SamplingParams.model_construct(stop=["a", 1]))
    yield "a bytearray image", construct(
        prompt=types.ModelInput.model_construct(
            chunks=[types.ImageChunk.model_construct(data=bytearray(b"ab"), format="png")]
        ),
        sampling_params=params,
    )


@pytest.mark.parametrize("name, request_", list(odd_requests()), ids=[n for n, _ in odd_requests()])
def test_what_the_core_does_not_take_is_tinkers_to_write(name, request_):
    assert not taken_by_core(request_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic's serializer warnings, for both
        try:
            want = tinkers_body(request_)
        except Exception as e:  # noqa: BLE001 - whatever tinker raises, we raise
            with pytest.raises(type(e)):
                encode_sample_request(request_)
        else:
            assert encode_sample_request(request_) == want


# --------------------------------------------------------------------------
# The replacement for tinker.resources.sampling.model_dump, and its probe


def test_the_site_is_what_asample_calls():
    (piece,) = sampling.PIECES
    module, name = piece.module, piece.name
    assert module == "tinker.resources.sampling"
    assert getattr(tinker.resources.sampling, name) is tinker._compat.model_dump
    assert name in tinker.resources.sampling.AsyncSamplingResource.asample.__code__.co_names


def test_the_probe_passes_on_the_installed_tinker():
    original = tinker._compat.model_dump
    probe_sample_body(original, make_model_dump(original))


def test_the_probe_fails_with_a_reason():
    original = tinker._compat.model_dump
    ours = make_model_dump(original)

    def off_by_one(model, *args, **kwargs):
        body = ours(model, *args, **kwargs)
        return body.replace(b'"top_k":-1', b'"top_k":-2') if isinstance(body, bytes) else body

    with pytest.raises(ProbeFailed, match="differs from tinker's at byte"):
        probe_sample_body(original, off_by_one)
    with pytest.raises(ProbeFailed, match="left the probe request"):
        probe_sample_body(original, original)

    def changes_other_calls(model, *args, **kwargs):
        return ours(model, *args, **kwargs) if kwargs == ARGS else {}

    with pytest.raises(ProbeFailed, match="other than asample's"):
        probe_sample_body(original, changes_other_calls)


def test_the_probe_fails_when_tinkers_fields_change(monkeypatch):
    sampling.schema_mismatch.cache_clear()
    fields = dict(types.SamplingParams.model_fields)
    monkeypatch.setitem(types.SamplingParams.model_fields, "min_p", fields["top_p"])
    try:
        with pytest.raises(ProbeFailed, match="SamplingParams fields"):
            probe_sample_body(tinker._compat.model_dump, make_model_dump(tinker._compat.model_dump))
    finally:
        monkeypatch.undo()
        sampling.schema_mismatch.cache_clear()
    assert sampling.schema_mismatch() is None


def test_other_model_dump_calls_go_to_the_original():
    calls = []

    def original(model, *args, **kwargs):
        calls.append((model, args, kwargs))
        return {"dumped": True}

    ours = make_model_dump(original)
    request = types.SampleRequest(prompt=types.ModelInput.empty(), sampling_params=types.SamplingParams())
    assert isinstance(ours(request, **ARGS), bytes) and not calls
    assert ours(request, mode="json") == {"dumped": True}
    assert ours(request.sampling_params, **ARGS) == {"dumped": True}
    assert ours(request, exclude={"type"}, **ARGS) == {"dumped": True}
    assert len(calls) == 3


# --------------------------------------------------------------------------
# Posted through tinker's real client: stock, then with the replacement


@pytest.fixture
def sampling_client():
    """An AsyncTinker client whose HTTP goes to a local transport that keeps
    each request."""
    from tinker._client import AsyncTinker

    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        request.read()
        sent.append(request)
        return httpx.Response(200, json={"request_id": f"r{len(sent)}", "sample_sequence_ids": ["a"]})

    def post(request):
        async def go():
            client = AsyncTinker(
                api_key="tml-test",
                base_url="http://127.0.0.1:9",
                http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
                _client_config=types.ClientConfigResponse(),
            )
            async with client:
                return await client.sampling.asample(
                    request=request, max_retries=0, extra_headers={"X-Tinker-Sampling-Backpressure": "1"}
                )

        return asyncio.run(go())

    return post, sent


HEADERS_THAT_VARY = {"x-idempotency-key"}


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")
def test_tinkers_client_posts_our_bytes(sampling_client, monkeypatch):
    post, sent = sampling_client
    requests_ = [r for _, r in sampling._probe_requests()]
    for request in requests_:
        post(request)
    original = tinker.resources.sampling.model_dump
    monkeypatch.setattr(tinker.resources.sampling, "model_dump", make_model_dump(original))
    for request in requests_:
        future = post(request)
        assert future.request_id == f"r{len(sent)}"
    stock, ours = sent[: len(requests_)], sent[len(requests_) :]
    for before, after, request in zip(stock, ours, requests_):
        assert before.url == after.url and before.method == after.method == "POST"
        assert {k: v for k, v in before.headers.items() if k not in HEADERS_THAT_VARY} == {
            k: v for k, v in after.headers.items() if k not in HEADERS_THAT_VARY
        }
        assert after.content == before.content == tinkers_body(request)


# A user's program against the local fake service (tests/support/fake_tinker.py),
# in a process of its own: groups of identical single-sample calls made together
# (as the cookbook's group rollouts make them), then what status() says and how
# many asample requests the service received.
GROUPS_SCRIPT = r"""
import asyncio, json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from fake_tinker import FakeTinker, read_capture
import tinker_rl_data
from tinker_rl_data import cookbook
cookbook.install(gc=False, coalesce=sys.argv[2] == "coalesce")
import tinker
from tinker import types

GROUPS, GROUP_SIZE, DISTINCT = 3, 8, int(sys.argv[3])

async def rollouts(client):
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    calls = [client.sample(types.ModelInput.from_ints([5, 6, g]), 1, params) for g in range(GROUPS) for _ in range(GROUP_SIZE)]
    calls += [client.sample(types.ModelInput.from_ints([9, i]), 1, params) for i in range(DISTINCT)]
    await asyncio.gather(*calls)

capture = tempfile.mktemp()
with FakeTinker(capture=capture) as service:
    with tinker.ServiceClient(base_url=service.base_url, api_key="tml-fake-key") as service_client:
        client = service_client.create_sampling_client(base_model="fake/model-8b").result()
        asyncio.run(rollouts(client))
        notes = tinker_rl_data.status().notes
    service.proc.stdout.close()
sent = sum(r["path"] == "/api/v1/asample" for r in read_capture(capture))
print(json.dumps({"sent": sent, "notes": notes}))
"""


def run_groups(mode: str, distinct: int) -> dict:
    import subprocess
    import sys
    from pathlib import Path

    support = Path(__file__).resolve().parents[1] / "support"
    proc = subprocess.run(
        [sys.executable, "-c", GROUPS_SCRIPT, str(support), mode, str(distinct)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_status_says_what_coalescing_would_have_sent_for_groups_of_one_prompt():
    # issue 54, item 5: the estimate is what a coalesced run of the same
    # program sends, counted by the service.
    plain, coalesced = run_groups("plain", 4), run_groups("coalesce", 4)
    assert plain["sent"] == 3 * 8 + 4
    assert coalesced["sent"] < plain["sent"]
    hints = [n for n in plain["notes"] if n.startswith("sampling:")]
    assert hints == [
        f"sampling: of {plain['sent']} requests of one sample, {plain['sent'] - coalesced['sent']} went out with the "
        f"prompt and parameters of another: coalesced sampling would have sent about {coalesced['sent']} of them "
        "(install(coalesce=True), or the launcher's --coalesce)"
    ]


def test_status_says_nothing_of_coalescing_where_no_prompt_repeats():
    from tinker_rl_data.tinker.sample import Mergeable

    # Distinct prompts only: nothing to gain, no line.
    counter = Mergeable()
    parts = sampling._parts()
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    for i in range(5):
        prompt = types.ModelInput.from_ints([9, i])
        counter.note(types.SampleRequest(sampling_session_id="s", seq_id=i, num_samples=1, prompt=prompt, sampling_params=params), parts)
    assert counter.counts() == {"single_sample_requests": 5, "coalescing_would_send": 5, "sample_requests_capped": 0}
    # Requests coalescing leaves alone (a seed, several samples) are not counted.
    prompt = types.ModelInput.from_ints([9, 0])
    for request in (
        types.SampleRequest(sampling_session_id="s", seq_id=9, num_samples=2, prompt=prompt, sampling_params=params),
        types.SampleRequest(sampling_session_id="s", seq_id=9, num_samples=1, prompt=prompt, sampling_params=types.SamplingParams(max_tokens=8, seed=3)),
    ):
        counter.note(request, parts)
    assert counter.counts() == {"single_sample_requests": 5, "coalescing_would_send": 5, "sample_requests_capped": 0}


def test_the_coalescing_estimate_counts_requests_made_together_and_only_the_first():
    import time

    from tinker_rl_data.tinker.sample import Mergeable

    parts = sampling._parts()
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    request = types.SampleRequest(
        sampling_session_id="s", seq_id=0, num_samples=1, prompt=types.ModelInput.from_ints([9, 1]), sampling_params=params
    )
    counter = Mergeable()
    counter.TOGETHER = 0.01
    counter.note(request, parts)
    time.sleep(0.05)  # awaited one after the other: coalescing would not merge them
    counter.note(request, parts)
    assert counter.counts() == {"single_sample_requests": 2, "coalescing_would_send": 2, "sample_requests_capped": 0}
    counter.note(request, parts)  # at once after the last: one request
    assert counter.counts() == {"single_sample_requests": 3, "coalescing_would_send": 2, "sample_requests_capped": 0}
    counter.OBSERVED = 5
    for _ in range(10):
        counter.note(request, parts)
    assert counter.counts()["single_sample_requests"] == 5
    assert counter.counts()["sample_requests_capped"] == 1  # the line then says "the first"
    assert all(type(key) is int for key in counter.runs)  # hashes, not the prompts' bytes


FORK_COUNTS = """
import os, sys, threading
from tinker_rl_data.tinker import coalesce, sample
from tinker_rl_data.tinker.sample import MERGEABLE

MERGEABLE.requests, MERGEABLE.joined, MERGEABLE.runs = 40, 30, {1: (0.0, 40)}
with coalesce._counts_lock:
    coalesce._counts["merged_calls"], coalesce._counts["merged_requests"] = 8, 2
MERGEABLE.lock.acquire()  # held at the fork (by another thread, say)
pid = os.fork()
if pid == 0:  # a rollout worker of a fork-started pool: its counts are its own
    ok = MERGEABLE.counts()["single_sample_requests"] == 0 and coalesce.counts()["merged_calls"] == 0
    os._exit(0 if ok else 3)
MERGEABLE.lock.release()
_, status = os.waitpid(pid, 0)
assert MERGEABLE.counts()["single_sample_requests"] == 40  # the parent's kept
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_reports_none_of_the_parents_sample_requests():
    # A fork-started worker pool's child carries its counts back to the
    # parent with its results: the parent's own must not be among them (and
    # a lock held at the fork must not hang the child). In a fresh
    # single-threaded process (a fork of a process with threads warns).
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FORK_COUNTS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
