"""Cyclic garbage as real environments make it (a grader parsing math, a
renderer, a judge's JSON): small parse-tree nodes that point at their
parents, for the trainer runs' environments (:mod:`.cookbook_env`).

A spec is ``KIND:MB``, several joined by ``+`` (``step:0.5+grade:100``;
``+counted`` makes the nodes count themselves: :class:`Counted`, the
trainer tests' measure of the garbage alive at once):

  step:MB   every ``env.step`` builds MB of small cycles, holds them across
            one await (an async judge's call) and drops them when it returns
  grade:MB  each group's rewards are graded in one synchronous stretch
            (``compute_group_rewards``, no await): MB of cycles in gradings
            of :data:`GRADING_BYTES` each, each grading's dropped after it
  start:MB  MB of cycles alive when the training loop starts (made by the
            dataset's builder, before the loop), dropped in the first step
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

KINDS = ("step", "grade", "start")
GRADING_BYTES = 50 * 1024


def _node_bytes() -> int:
    node = {"op": 0, "parent": None, "args": []}
    return sys.getsizeof(node) + sys.getsizeof(node["args"]) + sys.getsizeof([0])


NODE_BYTES = _node_bytes()


class Counted(dict):
    """A node that counts the nodes alive (``alive``), and the most seen at
    the start of a collection (``peak``: :func:`sample_peak` as a gc
    callback). A finalizer per node: for the tests' counts, not the
    bench's timings."""

    __slots__ = ()
    alive = 0
    peak = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Counted.alive += 1

    def __del__(self) -> None:
        Counted.alive -= 1


def sample_peak(phase: str, info: dict) -> None:
    if phase == "start" and Counted.alive > Counted.peak:
        Counted.peak = Counted.alive


def cycles(nbytes: float, node: type = dict) -> dict:
    """About ``nbytes`` of parse-tree nodes, each pointing at its parent
    (every node is in a reference cycle); the root."""
    root = node(op=0, parent=None, args=[])
    stack = [root]
    for i in range(max(1, int(nbytes // NODE_BYTES))):
        parent = stack[i // 3]  # a ternary tree
        child = node(op=i, parent=parent, args=[])
        parent["args"].append(child)
        stack.append(child)
    return root


@dataclass(frozen=True)
class Garbage:
    """MB of cycles per kind (0: none)."""

    step: float = 0.0
    grade: float = 0.0
    start: float = 0.0
    counted: bool = False

    @property
    def node(self) -> type:
        return Counted if self.counted else dict

    @classmethod
    def parse(cls, spec: str) -> Garbage:
        sizes: dict[str, float] = {}
        counted = "counted" in spec.split("+")
        for part in filter(None, spec.split("+")):
            if part == "counted":
                continue
            kind, _, mb = part.partition(":")
            if kind not in KINDS or not mb:
                raise ValueError(f"garbage {part!r}: KIND:MB with KIND one of {', '.join(KINDS)}")
            sizes[kind] = sizes.get(kind, 0.0) + float(mb)
        return cls(**sizes, counted=counted)

    def grade_group(self, samples: int) -> None:
        """A group's grading: in one synchronous stretch, MB of cycles in
        gradings of GRADING_BYTES, each dropped after it."""
        left = self.grade * 2**20
        while left > 0:
            cycles(min(GRADING_BYTES, left), self.node)
            left -= GRADING_BYTES
