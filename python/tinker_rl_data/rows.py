"""Building the output rows for both front doors (the evsys API and
``tinker_rl_data.cookbook``): real ``tinker.Datum`` objects and their
metadata; and tinker's classes, resolved once (:func:`classes`) and bound
into the core from there (every native call reads them from the binding).

tinker's public constructors cost about 9 us per Datum plus 20-30 ns per
token of pydantic validation, more than the whole numeric work. The rows
are already validated, so where this tinker's classes have the layout we
know, the core fills each instance's fields as the constructors would
("direct"). The first time rows are built (or install() reports it),
probe batches of both front doors (turns merged and not, a numpy model
input, image chunks, provenance spans of both arms) are built both ways and
compared field by field; anywhere they differ (another tinker version's
internals), the core calls tinker's public constructors instead, for both
front doors (:func:`direct_construction` says why).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Sequence

from . import _core

__all__ = ["TinkerClasses", "classes", "direct", "direct_construction"]

logger = logging.getLogger("tinker_rl_data")


class _NoSpanClass:
    """Stands for a provenance span class this tinker does not have."""


@dataclass(frozen=True)
class TinkerClasses:
    """tinker's classes the package reads and builds."""

    datum: type
    model_input: type
    text_chunk: type
    tensor_data: type
    #: (PromptProvenanceSpan, SampledProvenanceSpan), where this tinker has them.
    spans: tuple[type, type] | None
    sample_response: type
    sampling_params: type


@functools.cache
def classes() -> TinkerClasses:
    """tinker's classes, imported once and bound into the core (again
    whenever they are resolved again: after ``classes.cache_clear()``, the
    core reads the new ones)."""
    import tinker
    from tinker.types import EncodedTextChunk

    spans = (
        (tinker.PromptProvenanceSpan, tinker.SampledProvenanceSpan)
        if hasattr(tinker, "PromptProvenanceSpan") and hasattr(tinker, "SampledProvenanceSpan")
        else None
    )
    prompt_span, sampled_span = spans or (_NoSpanClass, _NoSpanClass)
    _core.bind_classes(
        datum=tinker.Datum,
        model_input=tinker.ModelInput,
        text_chunk=EncodedTextChunk,
        tensor_data=tinker.TensorData,
        prompt_span=prompt_span,
        sampled_span=sampled_span,
        sample_response=tinker.SampleResponse,
    )
    return TinkerClasses(
        datum=tinker.Datum,
        model_input=tinker.ModelInput,
        text_chunk=EncodedTextChunk,
        tensor_data=tinker.TensorData,
        spans=spans,
        sample_response=tinker.SampleResponse,
        sampling_params=tinker.SamplingParams,
    )


def _evsys(
    groups: Sequence[Any],
    advantages: Any,
    merge_turns: bool,
    vocab_size: int | None,
    numpy_tokens: bool,
    direct: bool,
    metadata_class: type,
) -> _core.BuiltDatums:
    # The pair is made by the core with the GC still paused, so the young
    # collection due for the new objects runs at the caller's next
    # allocation: returned as it is, with no tuple made here.
    return _core.assemble_datums(
        groups,
        advantages,
        metadata_class=metadata_class,
        merge_turns=merge_turns,
        vocab_size=vocab_size,
        numpy_tokens=numpy_tokens,
        direct=direct,
    )


def _cookbook(
    groups: Sequence[Any], advantages: Any, provenance: bool, direct: bool, exact: bool = False
) -> tuple[list[Any], list[Any]]:
    if provenance and classes().spans is None:
        raise RuntimeError("this tinker has no provenance span classes: call with include_provenance=False")
    return _core.assemble_cookbook(groups, advantages, provenance=provenance, direct=direct, exact=exact)


def same_datum(a: Any, b: Any) -> bool:
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
    import numpy as np

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
            if isinstance(u, np.ndarray):
                if not (u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v)):
                    return False
            elif isinstance(u, list):
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


def _same_tensor(a: Any, b: Any) -> bool:
    import numpy as np

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


class _Probe:
    """An object of the probe batches, read by attribute as the core reads
    the evsys API's and the cookbook's (neither is imported here)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


@dataclass
class _ProbeMetadata:
    """The evsys probe's metadata: a dataclass of the fields the core fills
    in the evsys API's ``DatumMetadata`` (by position, or directly by name)."""

    group_idx: int
    traj_idx: int
    turn_idx: int
    tags: list[str]
    n_turns: int


def _probe_batch() -> list[Any]:
    """An evsys-shaped batch: two turns, a fitted one, numpy columns."""
    import numpy as np

    def turn(prompt: Any, completion: Any, logprobs: Any) -> _Probe:
        return _Probe(prompt_tokens=prompt, completion_tokens=completion, logprobs=logprobs)

    first = _Probe(turns=[turn([7, 8], [9, 10], [-0.5, -0.25]), turn([], [1, True, 3], [-1.0, -2.0, -3.0])], reward=1.0)
    second = _Probe(turns=[turn((2**31 - 1, 5), np.array([6, 7]), np.array([-0.125, -0.5]))], reward=0.0)
    return [_Probe(trajectories=[first, second], tags=["probe"])]


def _cookbook_probe_batch() -> list[Any]:
    """Two transitions merged into one row, an image chunk, both span arms."""
    from tinker.types import ImageChunk

    c = classes()
    ModelInput, EncodedTextChunk = c.model_input, c.text_chunk
    image = ImageChunk(data=b"probe", format="png", expected_tokens=2)
    first = _Probe(
        ob=ModelInput(chunks=[EncodedTextChunk(tokens=[1, 2]), image, EncodedTextChunk(tokens=[3])]),
        ac=_Probe(tokens=[4, 5], maybe_logprobs=[-0.5, -0.25], logprobs=[-0.5, -0.25], sequence_id="s0"),
        reward=0.0,
        metrics={},
    )
    second = _Probe(
        ob=ModelInput(chunks=[EncodedTextChunk(tokens=[1, 2]), image, EncodedTextChunk(tokens=[3, 4, 5, 6])]),
        ac=_Probe(tokens=[7], maybe_logprobs=[-1.0], logprobs=[-1.0], sequence_id="s1"),
        reward=1.0,
        metrics={},
    )
    return [_Probe(trajectories_G=[_Probe(transitions=[first, second])])]


def _all_frozen(c: TinkerClasses) -> bool:
    """Whether every class the core fills (and may untrack) is frozen."""
    frozen_dataclasses = all(
        is_dataclass(k) and getattr(k, "__dataclass_params__").frozen for k in [c.datum, c.tensor_data, *(c.spans or ())]
    )
    return frozen_dataclasses and all(getattr(m, "model_config", {}).get("frozen") is True for m in (c.model_input, c.text_chunk))


def _direct_path_check() -> str | None:
    """Why this tinker cannot take the direct path, or None if it can: its
    classes have the fields the core fills, and probe batches of both front
    doors built both ways are the same, field by field."""
    c = classes()
    if not (is_dataclass(c.datum) and is_dataclass(c.tensor_data)):
        return "tinker.Datum or tinker.TensorData is not a dataclass"
    if [f.name for f in fields(c.datum)] != ["model_input", "loss_fn_inputs", "model_input_spans", "loss_fn_input_spans"]:
        return "tinker.Datum's fields differ from tinker 0.38's"
    if [f.name for f in fields(c.tensor_data)] != ["dtype", "shape", "sparse_crow_indices", "sparse_col_indices", "_numpy"]:
        return "tinker.TensorData's fields differ from tinker 0.38's"
    if list(c.model_input.model_fields) != ["chunks"] or list(c.text_chunk.model_fields) != ["tokens", "type"]:  # type: ignore[attr-defined]
        return "tinker.ModelInput's or EncodedTextChunk's fields differ from tinker 0.38's"
    if c.spans is None:
        return "this tinker has no provenance span classes"
    if any([f.name for f in fields(k)] != ["sequence_id", "offset", "length"] for k in c.spans):
        return "tinker's provenance span classes' fields differ from tinker 0.38's"
    if not _all_frozen(c):
        return "tinker's Datum classes are not all frozen (the core takes frozen ones holding only atoms off the GC)"
    batch, advantages = _probe_batch(), [[0.5, -0.5]]
    for merge_turns in (False, True):
        for numpy_tokens in (False, True):
            ours, our_meta = _evsys(batch, advantages, merge_turns, None, numpy_tokens, True, _ProbeMetadata).result
            theirs, their_meta = _evsys(batch, advantages, merge_turns, None, numpy_tokens, False, _ProbeMetadata).result
            if not (len(ours) == len(theirs) > 0 and all(map(same_datum, ours, theirs)) and our_meta == their_meta):
                return (
                    f"an evsys probe batch (merge_turns={merge_turns}, numpy_tokens={numpy_tokens}) built directly"
                    " differs from tinker's constructors"
                )
    cookbook_batch = _cookbook_probe_batch()
    ours, our_meta = _cookbook(cookbook_batch, [[0.5]], True, True)
    theirs, their_meta = _cookbook(cookbook_batch, [[0.5]], True, False)
    spans = all(d.model_input_spans is not None for d in ours)
    if not (spans and len(ours) == len(theirs) > 0 and all(map(same_datum, ours, theirs)) and our_meta == their_meta):
        return "a cookbook probe batch (image chunks, provenance spans) built directly differs from tinker's constructors"
    return None


@functools.cache
def direct_construction() -> str | None:
    """None where Datums are built directly, else why tinker's public
    constructors are used. Checked once, when first needed."""
    try:
        reason = _direct_path_check()
    except Exception as e:  # any surprise in tinker's internals: use its constructors
        reason = f"the probe raised {type(e).__name__}: {e}"
    if reason is None:
        logger.debug("building Datums directly: tinker's classes have the known layout")
    else:
        logger.info("building Datums through tinker's public constructors: %s", reason)
    return reason


def direct() -> bool:
    """Whether Datums are built directly (:func:`direct_construction`)."""
    return direct_construction() is None


@functools.cache
def _numpy_tokens_check() -> str | None:
    """Why int32-array model inputs cannot be sent by this tinker, or None:
    its wire encoder must give the same bytes as for a list of ints."""
    import numpy as np

    try:
        from tinker import types
        from tinker.proto.request_conv import forward_backward_request_to_proto
    except ImportError as e:
        return f"this tinker has no wire encoder to check against ({e})"

    c = classes()

    def encoded(tokens: Any) -> bytes:
        chunk = c.text_chunk.model_construct(tokens=tokens)  # type: ignore[attr-defined]
        datum = c.datum(model_input=c.model_input(chunks=[chunk]), loss_fn_inputs={})
        request = types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="importance_sampling"),
            model_id="probe",
            seq_id=0,
        )
        return bytes(forward_backward_request_to_proto(request).SerializeToString(deterministic=True))

    try:
        values = [0, 1, 2**31 - 1, 7]
        if encoded(np.array(values, dtype=np.int32)) != encoded(values):
            return "this tinker encodes an int32 array differently from a list of ints"
    except Exception as e:
        return f"this tinker's encoder does not take an int32 array ({type(e).__name__}: {e})"
    return None



def build_datums(
    groups: Sequence[Any],
    advantages: Any,
    merge_turns: bool,
    vocab_size: int | None,
    numpy_tokens: bool,
    metadata_class: type,
) -> _core.BuiltDatums:
    """The evsys API's Datums, their metadata (``metadata_class``'s, the
    evsys API's ``DatumMetadata``), and how the logprobs of turns were
    fitted."""
    unsupported = _numpy_tokens_check() if numpy_tokens else None
    if unsupported:
        raise RuntimeError(f"model_input_tokens='numpy' is not available: {unsupported}")
    return _evsys(groups, advantages, merge_turns, vocab_size, numpy_tokens, direct(), metadata_class)


def cookbook_datums(
    groups: Sequence[Any], advantages: Any, provenance: bool, exact: bool = False
) -> tuple[list[Any], list[Any]]:
    """tinker-cookbook's Datums and their metadata dicts; ``exact``: raise
    :class:`~tinker_rl_data.errors.Unsupported` for an input the cookbook
    reads otherwise than the core would accept it (a token that is no
    ``int``, logprobs that are no list, an action without ``sequence_id``)."""
    return _cookbook(groups, advantages, provenance, direct(), exact)
