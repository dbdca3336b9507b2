"""Wrapping the core's flat rows into real ``tinker.Datum`` objects.

tinker's public constructors cost about 9 us per Datum plus 20-30 ns per
token of pydantic validation, more than the whole numeric work. The rows
are already validated, so where this tinker's classes have the layout this
module knows, it fills the same instance fields the constructors would
(``model_construct`` style) and checks, once at import, that the result is
field for field what the public constructors give. Anywhere that check
fails it uses the public constructors.
"""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Iterator, Sequence

import numpy as np
from tinker import Datum, ModelInput, TensorData
from tinker.types import EncodedTextChunk

logger = logging.getLogger("tinker_rl_data")

_new = object.__new__
_set = object.__setattr__


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


def _public_datum(tokens: list[int], target: np.ndarray, logprobs: np.ndarray, advantages: np.ndarray) -> Datum:
    return Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(target),
            "logprobs": TensorData.from_numpy(logprobs),
            "advantages": TensorData.from_numpy(advantages),
        },
    )


def _tensor(dtype: str, array: np.ndarray) -> TensorData:
    td = _new(TensorData)
    _set(
        td,
        "__dict__",
        {
            "dtype": dtype,
            "shape": [len(array)],
            "sparse_crow_indices": None,
            "sparse_col_indices": None,
            "_numpy": array,
        },
    )
    return td


def _direct_datum(tokens: list[int], target: np.ndarray, logprobs: np.ndarray, advantages: np.ndarray) -> Datum:
    chunk = _new(EncodedTextChunk)
    _set(chunk, "__dict__", {"tokens": tokens, "type": "encoded_text"})
    _set(chunk, "__pydantic_fields_set__", {"tokens"})
    _set(chunk, "__pydantic_extra__", None)
    _set(chunk, "__pydantic_private__", None)
    model_input = _new(ModelInput)
    _set(model_input, "__dict__", {"chunks": [chunk]})
    _set(model_input, "__pydantic_fields_set__", {"chunks"})
    _set(model_input, "__pydantic_extra__", None)
    _set(model_input, "__pydantic_private__", None)
    datum = _new(Datum)
    _set(
        datum,
        "__dict__",
        {
            "model_input": model_input,
            "loss_fn_inputs": {
                "target_tokens": _tensor("int64", target),
                "logprobs": _tensor("float32", logprobs),
                "advantages": _tensor("float32", advantages),
            },
            "model_input_spans": None,
            "loss_fn_input_spans": None,
        },
    )
    return datum


_PYDANTIC_STATE = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def same_datum(a: Datum, b: Datum) -> bool:
    """Field by field, down to pydantic's bookkeeping and numpy dtypes."""
    if type(a) is not type(b) or set(vars(a)) != set(vars(b)):
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


def _same_model(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    for slot in _PYDANTIC_STATE:
        x, y = getattr(a, slot, None), getattr(b, slot, None)
        if slot == "__dict__":
            if list(x) != list(y):
                return False
            for key in x:
                if isinstance(x[key], list) and x[key] and hasattr(x[key][0], "__pydantic_fields_set__"):
                    if len(x[key]) != len(y[key]) or not all(map(_same_model, x[key], y[key])):
                        return False
                elif type(x[key]) is not type(y[key]) or x[key] != y[key]:
                    return False
                elif isinstance(x[key], list) and [type(v) for v in x[key]] != [type(v) for v in y[key]]:
                    return False
        elif x != y:
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


def _direct_path_works() -> bool:
    """Whether this tinker's classes take the direct path: the layout it
    fills, and one Datum made both ways, field for field."""
    try:
        if not (is_dataclass(Datum) and is_dataclass(TensorData)):
            return False
        if [f.name for f in fields(Datum)] != ["model_input", "loss_fn_inputs", "model_input_spans", "loss_fn_input_spans"]:
            return False
        if [f.name for f in fields(TensorData)] != ["dtype", "shape", "sparse_crow_indices", "sparse_col_indices", "_numpy"]:
            return False
        if set(ModelInput.model_fields) != {"chunks"} or set(EncodedTextChunk.model_fields) != {"tokens", "type"}:
            return False
        args = (
            [7, 8, 9],
            np.array([8, 9, 10], dtype=np.int64),
            np.array([0.0, -0.5, -0.25], dtype=np.float32),
            np.array([0.0, 0.5, 0.5], dtype=np.float32),
        )
        return same_datum(_direct_datum(*args), _public_datum(*args))
    except Exception:  # any surprise in tinker's internals: use its constructors
        return False


DIRECT_PATH = _direct_path_works()
_make_datum = _direct_datum if DIRECT_PATH else _public_datum


def wrap_rows(
    model_inputs: Sequence[list[int]],
    targets: np.ndarray,
    logprobs: np.ndarray,
    advantages: np.ndarray,
    row_offsets: np.ndarray,
) -> list[Datum]:
    """One Datum per row; its tensors are views of the flat arrays."""
    bounds = row_offsets.tolist()
    make = _make_datum
    return [
        make(tokens, targets[a:b], logprobs[a:b], advantages[a:b])
        for tokens, a, b in zip(model_inputs, bounds, bounds[1:])
    ]


__all__ = ["DIRECT_PATH", "gc_paused", "same_datum", "wrap_rows"]
