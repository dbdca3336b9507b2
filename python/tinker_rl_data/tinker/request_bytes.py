"""The feature ``wire``: tinker's request bytes made by the Rust core, the
``forward_backward`` body (:mod:`.forward_backward`) and the ``sample`` body
(:mod:`.sample`), each module declaring its piece. Its status line says,
for a run that sent requests of one sample with the same prompt together
(a group's first turn) without coalesced sampling, what that would save."""

from __future__ import annotations

from .. import features
from ..patch.feature import Feature
from . import forward_backward, sample

__all__ = ["FEATURE"]

FEATURE = features.register(
    __name__,
    Feature(
        "wire",
        "tinker's request bytes",
        (*forward_backward.PIECES, *sample.PIECES),
        status=sample.coalescing_hint,  # the sample bodies it makes say what coalescing would save
        worker=sample.worker_started,  # and a rollout worker's bodies too
    ),
)
