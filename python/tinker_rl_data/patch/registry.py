"""Every replacement the package makes, collected from the feature modules
that declare them (each module's ``PIECES``), in the order install() makes
them. Nothing is declared here: a new piece is added in its feature's
module alone."""

from __future__ import annotations

import functools

from .piece import Piece

__all__ = ["pieces"]


@functools.cache
def pieces() -> tuple[Piece, ...]:
    """All pieces (importing the feature modules: no tinker-cookbook import,
    no probe, nothing built)."""
    from ..cookbook import data_processing, gc_step, kl, step, workers
    from ..tinker import coalesce, forward_backward, sample, transport

    return (
        *forward_backward.PIECES,
        *sample.PIECES,
        *transport.PIECES,
        *coalesce.PIECES,
        *data_processing.PIECES,
        *step.PIECES,
        *kl.PIECES,
        *workers.PIECES,
        *gc_step.PIECES,
    )
