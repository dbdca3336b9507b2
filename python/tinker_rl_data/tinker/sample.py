"""tinker's ``sample`` request body, made by the Rust core.

tinker 0.38 posts a ``SampleRequest`` as JSON: ``AsyncSamplingResource.asample``
calls ``model_dump(request, exclude_unset=False, exclude_none=True,
mode="json")`` (the name ``model_dump`` of ``tinker.resources.sampling``) and
httpx writes the dict with ``json.dumps(ensure_ascii=False, separators=(",",
":"), allow_nan=False)``. Here::

    from tinker_rl_data import encode_sample_request
    body = encode_sample_request(request)

gives those bytes. The core takes requests made of exactly tinker's classes
and plain values (what tinker's own validation leaves); for anything else
(a subclass, a NaN, a ``model_construct``-ed odd value) the whole body is
made by tinker's code, so its bytes and its exceptions are tinker's.

:func:`make_model_dump` makes the replacement for that module-level
``model_dump`` (the piece in :data:`PIECES`, feature ``wire``): for exactly ``asample``'s call it returns the
body as ``bytes``, which tinker's ``_build_request`` posts as the content as
it is (``Content-Type`` stays tinker's default ``application/json``);
every other call goes to the original. :func:`probe_sample_body` checks it
against the installed tinker before it is used.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, List, Optional, Sequence, Union

from .. import _core, features
from ..patch.feature import WorkerPart, WorkerStart
from ..patch.piece import Piece, ProbeFailed, check, outcome, same_outcome

__all__ = ["PIECES", "encode_sample_request", "make_model_dump", "probe_sample_body"]

#: ``asample``'s arguments to ``model_dump``, after the request.
ASAMPLE_ARGS: dict[str, Any] = {"exclude_unset": False, "exclude_none": True, "mode": "json"}


def encode_sample_request(request: Any) -> bytes:
    """The body tinker posts for ``request`` (a ``tinker.types.SampleRequest``).
    Raises what tinker raises for a request it cannot write (a NaN
    temperature: ``ValueError``). The request is not modified."""
    parts = _parts()
    if parts is not None:
        body = _core.encode_sample_request(request, parts)
        if body is not None:
            return body
    from tinker._compat import model_dump

    return httpx_json(model_dump(request, **ASAMPLE_ARGS))


def httpx_json(data: Any) -> bytes:
    """What httpx posts for ``json=data`` (``httpx._content.encode_json``)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def make_model_dump(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement for ``tinker.resources.sampling.model_dump``: the body
    as ``bytes`` for ``asample``'s call on a request the core takes, else
    ``original``'s result."""
    parts = _parts()
    request_class = parts.sample_request if parts is not None else None
    encode = _core.encode_sample_request
    note = MERGEABLE.note

    @functools.wraps(original)
    def model_dump(model: Any, *args: Any, **kwargs: Any) -> Any:
        if parts is not None and type(model) is request_class and not args and kwargs == ASAMPLE_ARGS:
            note(model, parts)
            body = encode(model, parts)
            if body is not None:
                return body
        return original(model, *args, **kwargs)

    return model_dump


class Mergeable:
    """What coalesced sampling would have saved, from the first
    :data:`OBSERVED` ``asample`` requests of one sample each (no seed, no
    prompt logprobs, top-k, target logprobs or alternative tokens: what it
    merges) this process sends: of those, the ones made within
    :data:`TOGETHER` seconds of the first of a run of requests with the same
    sampling session, prompt and sampling parameters (the core's key, as
    coalescing's), up to 64 to a run: a group's first turn, whose calls
    coalescing would have sent as one. Only the first requests are read, so
    the count costs nothing once a run is under way, and only a hash of each
    key is kept (a prompt's images are not)."""

    OBSERVED = 4096
    TOGETHER = 0.5  # seconds: a service answers a sample later than that

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0  # requests of one sample, observed
        self.joined = 0  # of those, the ones coalescing would have joined to another
        self.runs: dict[int, tuple[float, int]] = {}  # key's hash -> (first request's time, requests)

    def note(self, request: Any, parts: SimpleNamespace) -> None:
        if (
            self.requests >= self.OBSERVED
            or getattr(_probing, "on", False)  # the probe's own requests
            or request.num_samples != 1
            or request.prompt_logprobs
            or request.topk_prompt_logprobs
            or request.topk_sample_logprobs
            or request.target_prompt_logprobs is not None
            or request.prompt_alt_tokens_k
            or request.prompt_logprobs_last_n is not None
            or getattr(request.sampling_params, "seed", None) is not None
        ):
            return
        prompt_key = _core.sample_prompt_key(request.prompt, request.sampling_params, parts)
        if prompt_key is None:
            return
        key = hash((request.sampling_session_id, prompt_key))
        now = time.monotonic()
        with self.lock:
            if self.requests >= self.OBSERVED:
                return
            self.requests += 1
            first, count = self.runs.get(key, (0.0, 0))
            if count and count < 64 and now - first <= self.TOGETHER:
                self.joined += 1
                self.runs[key] = (first, count + 1)
            else:
                self.runs[key] = (now, 1)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {
                "single_sample_requests": self.requests,
                "coalescing_would_send": self.requests - self.joined,
                "sample_requests_capped": int(self.requests >= self.OBSERVED),  # it read no more
            }

    def forget(self) -> None:
        """In a forked child (a rollout worker of a fork-started pool): the
        parent's requests are not the child's to report (its results would
        carry them back to the parent again), and the lock may have been
        held at the fork."""
        self.lock = threading.Lock()
        self.requests = self.joined = 0
        self.runs = {}


#: What this process's ``asample`` bodies say coalescing would save.
MERGEABLE = Mergeable()
os.register_at_fork(after_in_child=MERGEABLE.forget)


class _WorkerCounts(WorkerPart):
    """In a rollout worker: :data:`MERGEABLE`'s counts, carried back with
    each result (the driver's status line adds them to its own)."""

    def counters(self) -> dict[str, int]:
        return MERGEABLE.counts()


def worker_started(start: WorkerStart) -> WorkerPart:
    """The wire feature's ``worker`` hook."""
    return _WorkerCounts()


_probing = threading.local()


def coalescing_hint() -> list[str]:
    """The wire feature's report line: where requests of one sample with
    the same prompt and parameters went out together (a group's first turn)
    and coalesced sampling would have sent fewer, how many (this process's
    requests and its rollout workers')."""
    counts, workers = MERGEABLE.counts(), features.worker_counters()
    sent = counts["single_sample_requests"] + workers.get("single_sample_requests", 0)
    would = counts["coalescing_would_send"] + workers.get("coalescing_would_send", 0)
    if would >= sent:
        return []
    capped = counts["sample_requests_capped"] + workers.get("sample_requests_capped", 0)
    first = "the first " if capped else ""
    return [
        f"sampling: of {first}{sent} requests of one sample, {sent - would} went out with the prompt and "
        f"parameters of another: coalesced sampling would have sent about {would} of them "
        "(install(coalesce=True), or the launcher's --coalesce)"
    ]


def probe_sample_body(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed, saying why, unless ``ours`` gives the bytes
    tinker posts with ``original`` for each of a small set of requests (every
    field, chunk type and value kind the core writes), leaves other calls to
    ``original``, and tinker's client posts a bytes body as it is."""
    mismatch = schema_mismatch()
    if mismatch is not None:
        raise ProbeFailed(mismatch)
    _probing.on = True
    try:
        _probe_bodies(original, ours)
    finally:
        _probing.on = False


def _probe_bodies(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    import httpx._content

    for name, request in _probe_requests():
        data = original(request, **ASAMPLE_ARGS)
        want = httpx_json(data)
        if b"".join(httpx._content.encode_json(data)[1]) != want:
            raise ProbeFailed("httpx no longer writes JSON bodies as json.dumps(ensure_ascii=False, ...)")
        got = ours(request, **ASAMPLE_ARGS)
        if not isinstance(got, bytes):
            raise ProbeFailed(f"the core left the probe request {name!r} to tinker")
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise ProbeFailed(
                f"probe request {name!r}: our body differs from tinker's at byte {at}: "
                f"{got[max(0, at - 30):at + 30]!r} vs {want[max(0, at - 30):at + 30]!r}"
            )
    params = _probe_requests()[0][1].sampling_params
    theirs, mine = outcome(original, params, mode="json"), outcome(ours, params, mode="json")
    if same_outcome(theirs, mine, "a model_dump call other than asample's"):
        check(mine[1] == theirs[1], "a model_dump call other than asample's was changed")
    _check_bytes_body_posted_as_is()


def _check_bytes_body_posted_as_is() -> None:
    """tinker's client posts a bytes body as the content, with its default
    ``Content-Type: application/json`` (read from its code: building a real
    client's first request costs more than this probe may; the tests post
    through one)."""
    from tinker._base_client import BaseClient

    build = BaseClient._build_request.__code__
    headers = BaseClient.default_headers.fget.__code__  # type: ignore[attr-defined]
    if not ({"isinstance", "bytes"} <= set(build.co_names) and "content" in build.co_consts):
        raise ProbeFailed("tinker's _build_request no longer posts a bytes body as the content")
    consts = {c for const in headers.co_consts for c in (const if isinstance(const, tuple) else (const,))}
    if not {"Content-Type", "application/json"} <= consts:
        raise ProbeFailed("tinker's default headers no longer say Content-Type: application/json")


# --------------------------------------------------------------------------
# What the core takes from tinker


@functools.cache
def _parts() -> SimpleNamespace | None:
    """tinker's classes, for the core; None when they are not the ones it
    writes (then tinker makes every body)."""
    if schema_mismatch() is not None:
        return None
    from tinker import types
    from tinker.types._pydantic_types.tensor_data import TensorData

    return SimpleNamespace(
        sample_request=types.SampleRequest,
        model_input=types.ModelInput,
        encoded_text_chunk=types.EncodedTextChunk,
        image_chunk=types.ImageChunk,
        image_asset_pointer_chunk=types.ImageAssetPointerChunk,
        dmel_chunk=types.DmelChunk,
        sampling_params=types.SamplingParams,
        tensor_data=TensorData,
    )


@functools.cache
def schema_mismatch() -> str | None:
    """Why tinker's request classes are not the ones the core writes (their
    fields, in order, with these types: rust/py/sample.rs writes them
    in this order), or None."""
    try:
        from typing_extensions import Literal

        from tinker import types
        from tinker.types._pydantic_types.tensor_data import TensorData
        from tinker.types.model_input_chunk import ModelInputChunk
    except ImportError as e:
        return f"tinker's request classes are not where they were: {e}"
    expected: dict[Any, list[tuple[str, Any]]] = {
        types.SampleRequest: [
            ("num_samples", int),
            ("prompt", types.ModelInput),
            ("sampling_params", types.SamplingParams),
            ("base_model", Optional[str]),
            ("model_path", Optional[str]),
            ("sampling_session_id", Optional[str]),
            ("seq_id", Optional[int]),
            ("prompt_logprobs", Optional[bool]),
            ("topk_prompt_logprobs", int),
            ("topk_sample_logprobs", int),
            ("target_prompt_logprobs", Optional[TensorData]),
            ("prompt_alt_tokens_k", int),
            ("prompt_logprobs_last_n", Optional[int]),
            ("record_stability_info", Optional[bool]),
            ("type", Literal["sample"]),
        ],
        types.ModelInput: [("chunks", List[ModelInputChunk])],
        types.EncodedTextChunk: [("tokens", Sequence[int]), ("type", Literal["encoded_text"])],
        types.ImageChunk: [
            ("data", bytes),
            ("format", Literal["png", "jpeg"]),
            ("expected_tokens", Optional[int]),
            ("type", Literal["image"]),
        ],
        types.ImageAssetPointerChunk: [
            ("format", Literal["png", "jpeg"]),
            ("location", str),
            ("expected_tokens", Optional[int]),
            ("type", Literal["image_asset_pointer"]),
        ],
        types.DmelChunk: [("dmel", bytes), ("type", Literal["dmel"])],
        types.SamplingParams: [
            ("max_tokens", Optional[int]),
            ("seed", Optional[int]),
            ("stop", Union[str, Sequence[str], Sequence[int], None]),
            ("temperature", float),
            ("top_k", int),
            ("top_p", float),
        ],
        TensorData: [
            ("data", Union[List[int], List[float]]),
            ("dtype", Literal["int64", "float32"]),
            ("shape", Optional[List[int]]),
            ("sparse_crow_indices", Optional[List[int]]),
            ("sparse_col_indices", Optional[List[int]]),
        ],
    }
    for cls, fields in expected.items():
        have = [(name, field.annotation) for name, field in cls.model_fields.items()]
        if have != fields:
            return f"tinker's {cls.__name__} fields are {have}, not the {fields} the core writes"
        for name, field in cls.model_fields.items():
            if field.alias or field.serialization_alias or field.exclude:
                return f"tinker's {cls.__name__}.{name} is renamed or left out when serialized"
    return None


@functools.cache
def _probe_requests() -> list[tuple[str, Any]]:
    """Requests with every field, chunk type and value kind the core writes."""
    from tinker import types
    from tinker.types._pydantic_types.tensor_data import TensorData

    prompt = types.ModelInput.from_ints(list(range(0, 6000, 7)) + [2**31 - 1])
    return [
        (
            "rollout",  # as SamplingClient._send_asample_request makes it
            types.SampleRequest(
                sampling_session_id="session-é",
                seq_id=1_000_000_007,
                num_samples=1,
                prompt=prompt,
                sampling_params=types.SamplingParams(stop=["<|im_end|>", "\n\n"], max_tokens=512, temperature=1.0),
                prompt_logprobs=False,
                record_stability_info=False,
            ),
        ),
        (
            "defaults",
            types.SampleRequest(prompt=types.ModelInput.empty(), sampling_params=types.SamplingParams()),
        ),
        (
            "every field",
            types.SampleRequest(
                num_samples=16,
                prompt=types.ModelInput(
                    chunks=[
                        types.EncodedTextChunk(tokens=(1, 2**40, -3)),
                        types.ImageChunk(data=b"\x00\xff\xfe\x01", format="png", expected_tokens=4),
                        types.ImageChunk(data=b"ab", format="jpeg"),
                        types.ImageAssetPointerChunk(
                            format="jpeg", location='s3://b/"q"\\\n\t\x01\x7f\u2028é', expected_tokens=2
                        ),
                        types.DmelChunk(dmel=b"\x01\x02\x03"),
                        types.EncodedTextChunk(tokens=[]),
                    ]
                ),
                sampling_params=types.SamplingParams(
                    max_tokens=1, seed=-5, stop=[2, 3], temperature=0.1 + 0.2, top_k=40, top_p=1e-05
                ),
                base_model="Qwen/Qwen3-8B",
                model_path="tinker://run/weights",
                prompt_logprobs=True,
                topk_prompt_logprobs=5,
                topk_sample_logprobs=3,
                target_prompt_logprobs=TensorData(
                    data=[5, -1, 7], dtype="int64", shape=[2, 2], sparse_crow_indices=[0, 2, 3], sparse_col_indices=[0, 1, 1]
                ),
                prompt_alt_tokens_k=2,
                prompt_logprobs_last_n=3,
                record_stability_info=True,
            ),
        ),
        (
            "floats",
            types.SampleRequest(
                prompt=types.ModelInput.from_ints([1]),
                sampling_params=types.SamplingParams(stop="x", temperature=1e16, top_p=True),
                target_prompt_logprobs=TensorData(data=[0.5, -1e-7, 3.0], dtype="float32", shape=[3]),
            ),
        ),
    ]


PIECES = (
    Piece(
        "tinker.resources.sampling",
        "model_dump",
        "wire",
        make_model_dump,
        probe_sample_body,
        defined_in="tinker._compat",
        spread=False,
        label="sample request bytes",
    ),
)
