"""tinker's ``forward_backward`` request bytes, made by the Rust core.

tinker 0.38 sends a ``ForwardBackwardRequest`` as protobuf: in
``AsyncTrainingResource.forward_backward`` it builds the message with
``tinker.proto.request_conv.forward_backward_request_to_proto``, sets
``forward_only`` and calls ``SerializeToString()``. That walk over every
token costs more than making the Datums. Here::

    from tinker_rl_data import encode_forward_backward
    body = encode_forward_backward(request, forward_only=False)

gives the same message's bytes (``SerializeToString(deterministic=True)``:
map entries sorted by key), and the piece declared here (:data:`PIECES`,
feature ``wire``) makes tinker send them: tinker's message builder
``forward_backward_request_to_proto``, as ``tinker.resources.training``
holds it, becomes :func:`make_request_builder` of it.

Token lists of exact ints and numpy data are read by the core; any chunk,
tensor or provenance span it does not take as it is (another dtype, numpy
scalars in a list, a chunk type tinker refuses) is encoded by tinker's own
code, so its bytes and its exceptions are tinker's. An exception is raised
with the same class and where it happened in front of its message
(``datum 3, model_input chunk 1: Unsupported model input chunk type: ...``).
"""

from __future__ import annotations

import functools
import inspect
import types as pytypes
from types import SimpleNamespace
from typing import Any, Callable

from .. import _core
from ..patch.piece import Piece, ProbeFailed, check

__all__ = ["PIECES", "encode_forward_backward", "make_request_builder"]


def encode_forward_backward(request: Any, *, forward_only: bool = False) -> bytes:
    """The bytes tinker sends for ``request`` (a ``tinker.types.ForwardBackwardRequest``):
    ``forward_backward_request_to_proto(request)`` with ``forward_only`` set,
    serialized deterministically. Raises what tinker raises, before any bytes
    are made, with where in front of the message. Neither the request nor its
    Datums are modified."""
    return _core.encode_forward_backward(request, forward_only, _tinker_parts())


@functools.cache
def _tinker_parts() -> SimpleNamespace:
    """What the core takes from tinker: the chunk and span classes, and
    tinker's own encoding of one chunk, tensor or span for what the core
    leaves to it."""
    from tinker.proto import request_conv
    from tinker.proto import tinker_public_pb2 as public_pb
    from tinker.types import DmelChunk, EncodedTextChunk, ImageChunk, SampledProvenanceSpan

    def serialized(message: Any) -> bytes:
        return message.SerializeToString(deterministic=True)

    def chunk_bytes(chunk: Any) -> bytes:
        message = public_pb.Chunk()
        request_conv._write_chunk(message, chunk)
        return serialized(message)

    def tensor_bytes(tensor: Any) -> bytes:
        return serialized(request_conv._tensor_data_to_proto(tensor))

    def span_bytes(span: Any) -> bytes:
        message = public_pb.ProvenanceSpan()
        request_conv._write_provenance_span(message, span)
        return serialized(message)

    def stored(message_name: str, field: str, value: Any) -> Any:
        message = getattr(public_pb, message_name)()
        setattr(message, field, value)
        return getattr(message, field)

    def map_key(key: Any) -> str:
        inputs = public_pb.Datum().loss_fn_inputs
        inputs[key]  # as `datum_msg.loss_fn_inputs[name]` takes it
        return next(iter(inputs))

    # Map keys are ordered by their bytes; of a key and its prefix, upb puts
    # the longer first, protobuf's other backends the shorter.
    probe = public_pb.ForwardBackwardRequest()
    probe.loss_fn_config["a"] = probe.loss_fn_config["ab"] = 0.0
    probe_bytes = serialized(probe)
    key_a, key_ab = b"\x0a\x01a", b"\x0a\x02ab"  # the entries' key fields
    return SimpleNamespace(
        encoded_text_chunk=EncodedTextChunk,
        image_chunk=ImageChunk,
        dmel_chunk=DmelChunk,
        sampled_span=SampledProvenanceSpan,
        chunk_bytes=chunk_bytes,
        tensor_bytes=tensor_bytes,
        span_bytes=span_bytes,
        stored=stored,
        map_key=map_key,
        longer_key_first=probe_bytes.index(key_ab) < probe_bytes.index(key_a),
    )


# --------------------------------------------------------------------------
# Sending them: the message builder tinker's forward_backward calls


class _EncodedRequest:
    """What tinker's ``AsyncTrainingResource.forward_backward`` gets from
    ``forward_backward_request_to_proto`` once installed: it sets
    ``forward_only`` and calls ``SerializeToString()``, which gives this
    module's bytes. Any other use (an attribute read or set) builds tinker's
    own message and goes to it, so the object also works as the message."""

    __slots__ = ("_request", "_build", "_message", "forward_only")

    def __init__(self, request: Any, build: Any) -> None:
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "_build", build)
        object.__setattr__(self, "_message", None)
        object.__setattr__(self, "forward_only", False)

    def SerializeToString(self, **kwargs: Any) -> bytes:  # noqa: N802 (protobuf's name)
        if self._message is not None:
            return self._message.SerializeToString(**kwargs)  # type: ignore[no-any-return]
        return encode_forward_backward(self._request, forward_only=bool(self.forward_only))

    def _tinkers(self) -> Any:
        if self._message is None:
            message = self._build(self._request)
            message.forward_only = self.forward_only
            object.__setattr__(self, "_message", message)
        return self._message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tinkers(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "forward_only":
            object.__setattr__(self, name, value)
            if self._message is None:
                return
        setattr(self._tinkers(), name, value)


def make_request_builder(original: Any) -> Any:
    """The replacement of ``tinker.resources.training.forward_backward_request_to_proto``
    (``original``): tinker's method and whatever wraps it run unchanged, and
    the body it serializes is made by the Rust core. What the core needs of
    tinker is resolved here, at install, not at the first request."""
    _tinker_parts()

    def forward_backward_request_to_proto(request: Any) -> Any:
        return _EncodedRequest(request, original)

    forward_backward_request_to_proto.__doc__ = original.__doc__
    return forward_backward_request_to_proto


# --------------------------------------------------------------------------
# The probe: tinker's own forward_backward, posting with its builder and with ours


def _requests() -> list[tuple[Any, bool]]:
    import numpy as np
    from tinker import types

    def text(tokens: Any) -> Any:
        return types.EncodedTextChunk.model_construct(tokens=tokens)

    dense = types.TensorData.from_numpy(np.array([0.5, -1.25, 3.0], dtype=np.float32))
    ints = types.TensorData.from_numpy(np.array([7, 8, 9], dtype=np.int64))
    sparse = types.TensorData(
        data=[2.5, -1.0], dtype="float32", shape=[2, 3], sparse_crow_indices=[0, 1, 2], sparse_col_indices=[2, 0]
    )
    chunks = [
        text([1, 2, 3]),
        text(np.array([4, 5], dtype=np.int32)),
        types.ImageChunk(data=b"\x89PNG probe", format="png", expected_tokens=2),
        types.DmelChunk(dmel=b"\x00\x01\x02"),
    ]
    plain = types.Datum(
        model_input=types.ModelInput(chunks=chunks[:2]),
        loss_fn_inputs={"target_tokens": ints, "weights": dense, "advantages": sparse},
    )
    mixed = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={"target_tokens": ints, "logprobs": dense}
    )
    spans = types.Datum(model_input=types.ModelInput(chunks=[text([1, 2, 3, 4])]), loss_fn_inputs={"x": ints})
    spans = spans.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id="p", offset=1, length=2),
            types.SampledProvenanceSpan(sequence_id="s", offset=0, length=2),
        ],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id="s", length=3)],
    )

    def request(data: list[Any], config: Any, seq_id: Any) -> Any:
        return types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(
                data=data, loss_fn="importance_sampling", loss_fn_config=config
            ),
            model_id="probe-model",
            seq_id=seq_id,
        )

    return [
        (request([plain, mixed, spans], {"clip": 0.2, "mode": "token", "a": 1.0}, 3), False),
        (request([plain], None, None), True),
        (request([], {}, 0), False),
    ]


def _tinker_method_with(builder: Callable[[Any], Any]) -> Callable[..., Any]:
    """tinker's own ``AsyncTrainingResource.forward_backward`` (as defined,
    below any wrapper) reading ``builder`` for ``forward_backward_request_to_proto``:
    a copy of the function with its own globals, so tinker's module is not
    touched while probing."""
    from tinker.resources import training

    method = inspect.unwrap(training.AsyncTrainingResource.forward_backward)
    code = getattr(method, "__code__", None)
    if not isinstance(code, pytypes.CodeType):
        raise ProbeFailed("tinker's AsyncTrainingResource.forward_backward is not a Python function")
    check(
        "forward_backward_request_to_proto" in code.co_names and method.__globals__ is vars(training),
        "tinker's forward_backward no longer builds its message with "
        "tinker.resources.training.forward_backward_request_to_proto",
    )
    namespace = dict(method.__globals__)
    namespace["forward_backward_request_to_proto"] = builder
    return pytypes.FunctionType(code, namespace, method.__name__, method.__defaults__, method.__closure__)


def _posted_body(method: Callable[..., Any], request: Any, forward_only: bool) -> bytes:
    """What ``method`` posts for ``request`` (no compression), its post stubbed."""
    posted: list[bytes] = []

    async def post(path: str, *, body: bytes, **_: Any) -> None:
        check(path == "/api/v1/forward_backward", f"tinker's forward_backward posts to {path!r}")
        posted.append(body)

    resource = pytypes.SimpleNamespace(
        _client=pytypes.SimpleNamespace(_client_config=pytypes.SimpleNamespace(proto_compress_fwdbwd=False)),
        _post=post,
    )
    coroutine = method(resource, request=request, forward_only=forward_only)
    try:
        coroutine.send(None)
    except StopIteration:
        pass
    else:
        coroutine.close()
        raise ProbeFailed("tinker's forward_backward waits on something besides its post")
    check(len(posted) == 1 and isinstance(posted[0], bytes), "tinker's forward_backward did not post one bytes body")
    return posted[0]


def probe_encoder(original: Any, ours: Any) -> None:
    from tinker.proto import tinker_public_pb2 as public_pb

    stock_method, our_method = _tinker_method_with(original), _tinker_method_with(ours)
    for i, (request, forward_only) in enumerate(_requests()):
        expected = original(request)
        expected.forward_only = forward_only
        stock = _posted_body(stock_method, request, forward_only)
        mine = _posted_body(our_method, request, forward_only)
        parse = public_pb.ForwardBackwardRequest.FromString
        check(parse(stock) == expected, f"request {i}: tinker's own body is not its message (probe out of date)")
        check(parse(mine) == expected, f"request {i}: our body parses to another message than tinker's")
        check(
            mine == expected.SerializeToString(deterministic=True),
            f"request {i}: our body is not tinker's message serialized deterministically",
        )


PIECES = (
    Piece(
        "tinker.resources.training",
        "forward_backward_request_to_proto",
        "wire",
        make_request_builder,
        probe_encoder,
        defined_in="tinker.proto.request_conv",
        spread=False,
        label="forward_backward request bytes",
    ),
)
