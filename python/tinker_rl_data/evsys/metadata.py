"""Where each training row came from."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DatumMetadata"]


@dataclass
class DatumMetadata:
    """Where a Datum came from: its group, trajectory and (first) turn, the
    group's tags, and how many turns it covers (more than 1 only for merged
    rows, ``merge_turns=True``)."""

    group_idx: int
    traj_idx: int = 0
    turn_idx: int = 0
    tags: list[str] = field(default_factory=list)
    n_turns: int = 1
