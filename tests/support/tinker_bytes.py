"""Datums as tinker's own encoder puts them on the wire: the oracle the
tests compare rows with (independent of the package's encoder)."""

from __future__ import annotations

from typing import Any


def wire_bytes(datums: Any) -> bytes:
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    request = ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(data=list(datums), loss_fn="importance_sampling"),
        model_id="model",
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString(deterministic=True)
