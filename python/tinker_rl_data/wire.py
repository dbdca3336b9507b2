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

import asyncio
import functools
from types import SimpleNamespace
from typing import Any

from . import _core

__all__ = ["VERIFIED_TINKER_VERSIONS", "encode_forward_backward", "install", "installed", "uninstall"]

#: The tinker versions whose encoder the tests compare this one with, and
#: whose ``forward_backward`` :func:`install` reproduces.
VERIFIED_TINKER_VERSIONS = ("0.38.0",)


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
# Sending them: tinker's AsyncTrainingResource.forward_backward


async def _forward_backward(self: Any, *, request: Any, forward_only: bool = False) -> Any:
    # tinker 0.38's method, with this module's encoder in place of
    # `forward_backward_request_to_proto(request)` + `SerializeToString()`.
    from tinker.resources import training

    body = encode_forward_backward(request, forward_only=forward_only)
    headers: dict[str, str] = {"Content-Type": training._PROTO_CONTENT_TYPE}
    if self._client._client_config.proto_compress_fwdbwd:
        body = await asyncio.to_thread(training.zstd.ZstdCompressor().compress, body)
        headers["Content-Encoding"] = "zstd"

    return await self._post(
        "/api/v1/forward_backward",
        body=body,
        options=training.make_request_options(extra_headers=headers),
        cast_to=training.UntypedAPIFuture,
    )


_original: Any = None


def install(force: bool = False) -> None:
    """Make tinker send request bytes made by :func:`encode_forward_backward`.

    Replaces ``tinker.resources.training.AsyncTrainingResource.forward_backward``
    (where every ``TrainingClient.forward_backward`` / ``forward`` call encodes
    its requests) by tinker's own method with this encoder in it: headers,
    zstd compression when the server asks for it, and the post stay tinker's.
    Calling it again is harmless; :func:`uninstall` puts tinker's method back.

    Raises RuntimeError for a tinker version not in ``VERIFIED_TINKER_VERSIONS``
    (whose request may differ), unless ``force=True``.
    """
    global _original
    import tinker
    from tinker.resources.training import AsyncTrainingResource

    version = getattr(tinker, "__version__", None)
    if version not in VERIFIED_TINKER_VERSIONS and not force:
        raise RuntimeError(
            f"tinker_rl_data.install() reproduces the forward_backward request of tinker "
            f"{', '.join(VERIFIED_TINKER_VERSIONS)}, but tinker {version} is installed: its request "
            "may differ. Call install(force=True) to use it anyway."
        )
    if _original is None:
        _original = AsyncTrainingResource.forward_backward
        AsyncTrainingResource.forward_backward = _forward_backward  # type: ignore[method-assign]


def uninstall() -> None:
    """Put tinker's own ``forward_backward`` back. Harmless when not installed."""
    global _original
    if _original is None:
        return
    from tinker.resources.training import AsyncTrainingResource

    if AsyncTrainingResource.forward_backward is _forward_backward:  # not replaced since by someone else
        AsyncTrainingResource.forward_backward = _original  # type: ignore[method-assign]
    _original = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _original is not None
