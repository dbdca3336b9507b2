"""Building the output rows: real ``tinker.Datum`` objects and their
:class:`DatumMetadata`.

tinker's public constructors cost about 9 us per Datum plus 20-30 ns per
token of pydantic validation, more than the whole numeric work. The rows
are already validated, so where this tinker's classes have the layout we
know, the core fills each instance's fields as the constructors would
(``_core.assemble_datums``). At import, one batch is built both ways and
compared field by field; anywhere they differ (another tinker version's
internals), the public constructors are used.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Iterator, Sequence

import numpy as np
from tinker import Datum, ModelInput, TensorData
from tinker.types import EncodedTextChunk

from . import _core


@dataclass
class DatumMetadata:
    """Where a Datum came from: its group, trajectory and turn, and the
    group's tags."""

    group_idx: int
    traj_idx: int = 0
    turn_idx: int = 0
    tags: list[str] = field(default_factory=list)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Holds off Python's cyclic GC while many acyclic objects are made.

    Every container allocated counts toward a collection; with a large live
    heap, the collections they set off multiplied the cost per Datum by up
    to 5 (SPEC §5). Nothing made here can form a cycle, so nothing is lost.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_CLASSES = (Datum, ModelInput, EncodedTextChunk, TensorData, DatumMetadata)


def _direct(groups: Sequence[Any], advantages: Any) -> tuple[list[Datum], list[DatumMetadata], int]:
    return _core.assemble_datums(groups, advantages, _CLASSES)


def _public(groups: Sequence[Any], advantages: Any) -> tuple[list[Datum], list[DatumMetadata], int]:
    """Through tinker's public constructors, from the core's flat rows."""
    inputs, targets, logprobs, advs, offsets, group_idx, traj_idx, turn_idx, fitted = _core.assemble_arrays(
        groups, advantages
    )
    tags = [list(getattr(g, "tags", None) or ()) for g in groups]
    bounds = offsets.tolist()
    datums = [
        Datum(
            model_input=ModelInput.from_ints(inputs[a:b].tolist()),
            loss_fn_inputs={
                "target_tokens": TensorData.from_numpy(targets[a:b]),
                "logprobs": TensorData.from_numpy(logprobs[a:b]),
                "advantages": TensorData.from_numpy(advs[a:b]),
            },
        )
        for a, b in zip(bounds, bounds[1:])
    ]
    metadata = [
        DatumMetadata(g, t, u, list(tags[g])) for g, t, u in zip(group_idx.tolist(), traj_idx.tolist(), turn_idx.tolist())
    ]
    return datums, metadata, fitted


def same_datum(a: Datum, b: Datum) -> bool:
    """Field by field, down to pydantic's bookkeeping and numpy dtypes."""
    if type(a) is not type(b) or list(vars(a)) != list(vars(b)):
        return False
    for name, value in vars(a).items():
        other = vars(b)[name]
        if name == "model_input":
            if not _same_model(value, other):
                return False
        elif name == "loss_fn_inputs":
            if list(value) != list(other) or not all(_same_tensor(value[k], other[k]) for k in value):
                return False
        elif value != other:
            return False
    return True


_PYDANTIC_STATE = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def _same_model(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for slot in _PYDANTIC_STATE:
        x: Any = getattr(a, slot, None)
        y: Any = getattr(b, slot, None)
        if slot != "__dict__":
            if x != y:
                return False
            continue
        if list(x) != list(y):
            return False
        for key in x:
            u, v = x[key], y[key]
            if type(u) is not type(v):
                return False
            if isinstance(u, list):
                if len(u) != len(v):
                    return False
                if u and hasattr(u[0], "__pydantic_fields_set__"):
                    if not all(map(_same_model, u, v)):
                        return False
                elif u != v or [type(i) for i in u] != [type(i) for i in v]:
                    return False
            elif u != v:
                return False
    return True


def _same_tensor(a: TensorData, b: TensorData) -> bool:
    if type(a) is not type(b) or list(vars(a)) != list(vars(b)):
        return False
    for key, x in vars(a).items():
        y = vars(b)[key]
        if isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _probe_batch() -> list[Any]:
    from .env import Trajectory, TrajectoryGroup, Turn

    return [
        TrajectoryGroup(
            [
                Trajectory([Turn([7, 8], [9, 10], [-0.5, -0.25]), Turn([], [1, True, 3], [-1.0, -2.0, -3.0])], 1.0),
                Trajectory([Turn((2**31 - 1, 5), np.array([6, 7]), np.array([-0.125, -0.5]))], 0.0),
            ],
            tags=["probe"],
        )
    ]


def _direct_path_works() -> bool:
    """Whether this tinker takes the direct path: its classes have the
    fields the core fills, and a probe batch built both ways is the same."""
    try:
        if not (is_dataclass(Datum) and is_dataclass(TensorData)):
            return False
        if [f.name for f in fields(Datum)] != ["model_input", "loss_fn_inputs", "model_input_spans", "loss_fn_input_spans"]:
            return False
        if [f.name for f in fields(TensorData)] != ["dtype", "shape", "sparse_crow_indices", "sparse_col_indices", "_numpy"]:
            return False
        if list(ModelInput.model_fields) != ["chunks"] or list(EncodedTextChunk.model_fields) != ["tokens", "type"]:
            return False
        batch = _probe_batch()
        advantages = [[0.5, -0.5]]
        ours, our_meta, _ = _direct(batch, advantages)
        theirs, their_meta, _ = _public(batch, advantages)
        return len(ours) == len(theirs) == 3 and all(map(same_datum, ours, theirs)) and our_meta == their_meta
    except Exception:  # any surprise in tinker's internals: use its constructors
        return False


DIRECT_PATH = _direct_path_works()


def build_rows(groups: Sequence[Any], advantages: Any) -> tuple[list[Datum], list[DatumMetadata], int]:
    """Datums, their metadata, and how many turns had their logprobs fitted."""
    with gc_paused():
        return _direct(groups, advantages) if DIRECT_PATH else _public(groups, advantages)
