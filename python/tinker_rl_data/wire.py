"""tinker's ``forward_backward`` request bytes, made by the Rust core.

tinker 0.38 sends a ``ForwardBackwardRequest`` as protobuf: in
``AsyncTrainingResource.forward_backward`` it builds the message with
``tinker.proto.request_conv.forward_backward_request_to_proto``, sets
``forward_only`` and calls ``SerializeToString()``. That walk over every
token costs more than making the Datums. Here::

    from tinker_rl_data.wire import encode_forward_backward
    body = encode_forward_backward(request, forward_only=False)

gives the same message's bytes (``SerializeToString(deterministic=True)``:
map entries sorted by key), and :func:`install` makes tinker send them.

Token lists of exact ints and numpy data are read by the core; any chunk,
tensor or provenance span it does not take as it is (another dtype, numpy
scalars in a list, a chunk type tinker refuses) is encoded by tinker's own
code, so its bytes and its exceptions are tinker's. An exception is raised
with the same class and where it happened in front of its message
(``datum 3, model_input chunk 1: Unsupported model input chunk type: ...``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from . import _core
from ._patch import VERIFIED_VERSIONS

__all__ = ["VERIFIED_TINKER_VERSIONS", "encode_forward_backward", "install", "installed", "uninstall"]

#: The tinker versions whose encoder the tests compare this one with.
VERIFIED_TINKER_VERSIONS = VERIFIED_VERSIONS["tinker"]


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


def install(force: bool = False, *, strict: bool | None = None) -> Any:
    """Make tinker send ``forward_backward`` request bytes made by
    :func:`encode_forward_backward`, where its probe finds them equal to
    tinker's own on this machine (``tinker_rl_data._patch``: the policy,
    warnings and ``strict``). Returns the install report; calling it again
    is harmless; :func:`uninstall` undoes it. ``force`` is accepted for
    older callers and has no effect: no version is refused any more."""
    from . import _patch

    del force
    return _patch.install({"wire"}, owner="tinker_rl_data", strict=strict)


def uninstall() -> None:
    """Put back everything tinker_rl_data installed (this encoder, and the
    cookbook's pieces if :func:`tinker_rl_data.cookbook.install` put them
    in). Harmless when nothing is installed."""
    from . import _patch

    _patch.uninstall()


def installed() -> bool:
    """Whether the request encoder is installed."""
    from . import _patch

    return _patch.installed("wire")
