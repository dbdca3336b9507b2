"""Token and logprob sequences given as arrays (anything with the buffer
protocol: numpy arrays of every integer and float dtype, strided, either
byte order, unaligned; array.array; memoryview) give the Datums of the
equal lists, on both front doors, and the same located errors."""

from __future__ import annotations

import array
from types import SimpleNamespace as NS

import numpy as np
import pytest
import tinker
from hypothesis import given
from hypothesis import strategies as st
from tinker.types import EncodedTextChunk

import tinker_rl_data as trd
from tinker_rl_data import cookbook
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

INT_DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"]
FLOAT_DTYPES = ["f2", "f4", "f8"]


def limit_of(dtype: str) -> int:
    return min(int(np.iinfo(dtype).max), 2**31 - 1)


@st.composite
def laid_out(draw, values: list, dtype: str):
    """`values` as an array of `dtype` in some memory layout: either byte
    order, strided (also backwards), unaligned, or as array.array /
    memoryview; with the list of what the array holds."""
    order = draw(st.sampled_from(["<", ">"]))
    dt = np.dtype(dtype).newbyteorder(order) if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    layout = draw(st.sampled_from(["plain", "strided", "reversed", "unaligned", "array.array", "memoryview"]))
    base = np.array(values, dtype=dt)
    if layout == "strided":
        wide = np.zeros(2 * len(values), dtype=dt)
        wide[::2] = base
        out = wide[::2]
    elif layout == "reversed":
        out = base[::-1].copy()[::-1]
    elif layout == "unaligned" and dt.itemsize > 1:
        raw = np.zeros(len(values) * dt.itemsize + 1, dtype=np.uint8)
        out = raw[1:].view(dt)
        out[:] = base
    elif layout == "array.array" and dt.byteorder in "=|" or (layout == "array.array" and dt.isnative):
        code = {"i1": "b", "i2": "h", "i4": "i", "i8": "q", "u1": "B", "u2": "H", "u4": "I", "u8": "Q",
                "f4": "f", "f8": "d"}.get(np.dtype(dtype).str[1:])
        out = array.array(code, base.tolist()) if code else base
    elif layout == "memoryview":
        out = memoryview(base)
    else:
        out = base
    return out, np.asarray(out).tolist()


@st.composite
def array_turns(draw):
    """A turn with array fields, and the same turn with lists."""
    token_dtype = draw(st.sampled_from(INT_DTYPES))
    tokens = st.integers(0, limit_of(token_dtype))
    prompt, prompt_list = draw(laid_out(draw(st.lists(tokens, max_size=8)), token_dtype))
    completion, completion_list = draw(laid_out(draw(st.lists(tokens, max_size=8)), token_dtype))
    logprob_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    n = max(0, len(completion_list) + draw(st.integers(-1, 1)))
    values = draw(st.lists(st.floats(-30.0, 0.0), min_size=n, max_size=n))
    logprobs, logprob_list = draw(laid_out(values, logprob_dtype))
    return Turn(prompt, completion, logprobs), Turn(prompt_list, completion_list, logprob_list)


@st.composite
def batches(draw):
    groups_arrays, groups_lists = [], []
    for _ in range(draw(st.integers(1, 3))):
        trajs_a, trajs_l = [], []
        for _ in range(draw(st.integers(1, 3))):
            pairs = draw(st.lists(array_turns(), min_size=1, max_size=3))
            reward = draw(st.floats(-1.0, 1.0))
            trajs_a.append(Trajectory([a for a, _ in pairs], reward))
            trajs_l.append(Trajectory([b for _, b in pairs], reward))
        groups_arrays.append(TrajectoryGroup(trajs_a))
        groups_lists.append(TrajectoryGroup(trajs_l))
    return groups_arrays, groups_lists


def cookbook_content(d):
    """A cookbook Datum as plain values: its chunks' tokens, its loss
    inputs (dtype, values) and its spans."""
    chunks = [list(c.tokens) for c in d.model_input.chunks]
    assert all(type(t) is int for c in d.model_input.chunks for t in c.tokens)
    inputs = {k: (td.dtype, td.to_numpy().tolist()) for k, td in d.loss_fn_inputs.items()}
    return chunks, inputs, d.model_input_spans, d.loss_fn_input_spans


def contents(result):
    """Datums as plain values (model-input tokens as ints whatever their
    container) and their metadata."""
    datums, metadata = result
    out = []
    for d in datums:
        (chunk,) = d.model_input.chunks
        tokens = [int(t) for t in chunk.tokens]
        inputs = {k: (td.dtype, td.to_numpy().dtype.str, td.to_numpy().tolist()) for k, td in d.loss_fn_inputs.items()}
        out.append((type(chunk.tokens), tokens, inputs))
    return out, metadata


@given(batches(), st.booleans(), st.sampled_from(["list", "numpy"]))
def test_evsys_arrays_give_the_datums_of_the_equal_lists(batch, merge_turns, model_input_tokens):
    arrays, lists = batch
    advantages = trd.compute_advantages(lists)
    expected = trd.assemble_training_data(
        lists, advantages, merge_turns=merge_turns, model_input_tokens=model_input_tokens
    )
    got = trd.assemble_training_data(arrays, advantages, merge_turns=merge_turns, model_input_tokens=model_input_tokens)
    assert contents(got) == contents(expected)
    if model_input_tokens == "list":
        # Lists of Python ints, whatever the input was.
        for datum in got[0]:
            tokens = datum.model_input.chunks[0].tokens
            assert type(tokens) is list and all(type(t) is int for t in tokens)


def _cookbook_trajectory(turns, as_arrays: bool):
    transitions = []
    for prompt, completion, logprobs in turns:
        chunk = EncodedTextChunk.model_construct(tokens=prompt) if as_arrays else EncodedTextChunk(tokens=prompt)
        transitions.append(
            NS(
                ob=tinker.ModelInput(chunks=[chunk]),
                ac=NS(tokens=completion, logprobs=logprobs, sequence_id="s"),  # (what the cookbook reads)
                reward=0.0,
                metrics={},
            )
        )
    return NS(transitions=transitions)


def _the_cookbooks_trajectory_to_data():
    """tinker-cookbook's own function, or None where it does not import."""
    try:
        from tinker_cookbook.rl import data_processing
    except ImportError:
        return None
    return data_processing.trajectory_to_data


@given(st.lists(array_turns(), min_size=1, max_size=3), st.booleans())
def test_cookbook_arrays_give_the_datums_of_the_equal_lists_or_the_cookbooks_outcome(pairs, include_provenance):
    # Without tinker-cookbook, action buffers are read as the equal lists;
    # with it, they get the cookbook's own outcome (contract §9: its failure,
    # or, where it reads them, its Datums), not ours.
    pairs = [(a, b) for a, b in pairs if len(a.logprobs) == len(a.completion_tokens)]
    arrays = [(a.prompt_tokens, a.completion_tokens, a.logprobs) for a, _ in pairs]
    lists = [(b.prompt_tokens, b.completion_tokens, b.logprobs) for _, b in pairs]

    def outcome(function, turns, as_arrays):
        try:
            datums = function(_cookbook_trajectory(turns, as_arrays), 0.5, include_provenance)
        except Exception as e:
            return ("raised", type(e).__name__, str(e))
        return [cookbook_content(d) for d in datums]

    theirs = _the_cookbooks_trajectory_to_data()
    expected = outcome(theirs, arrays, True) if theirs else outcome(cookbook.trajectory_to_data, lists, False)
    assert outcome(cookbook.trajectory_to_data, arrays, True) == expected


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (np.array([3, -1], dtype=np.int16), ValueError, "token -1 is outside 0..2147483647 (prompt_tokens[1])"),
        (np.array([2**31], dtype=np.int64), ValueError, "token 2147483648 is outside 0..2147483647 (prompt_tokens[0])"),
        (np.array([2**63], dtype=np.uint64), ValueError, "token 9223372036854775808 is outside"),
        (np.array([1.0, 2.0]), TypeError, "prompt_tokens has dtype float64, not an integer dtype"),
        (memoryview(np.array([1.0])), TypeError, "prompt_tokens holds floats, not integers"),
        (np.zeros((2, 2), dtype=np.int32), ValueError, "prompt_tokens must be 1-D"),
        (memoryview(bytes(4)).cast("B", (2, 2)), ValueError, "prompt_tokens must be 1-D, got a buffer of shape [2, 2]"),
        (memoryview(np.zeros(2, dtype=np.complex64)), TypeError, "prompt_tokens is a buffer of format 'Zf'"),
    ],
)
def test_bad_token_arrays_are_located_errors(bad, error, message):
    batch = [TrajectoryGroup([Trajectory([Turn([1], [2], [-0.5]), Turn(bad, [2], [-0.5])], 1.0)])]
    with pytest.raises(error) as raised:
        trd.assemble_training_data(batch, [[0.0]])
    assert str(raised.value).startswith("group 0, trajectory 0, turn 1: " + message), str(raised.value)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.array([-0.5, np.nan], dtype=np.float32), "logprob nan is not finite (logprobs[1])"),
        (np.array([np.inf], dtype=">f8"), "logprob inf is not finite (logprobs[0])"),
        (np.array([1e300]), "logprob 1e300 overflows float32 (logprobs[0])"),
    ],
)
def test_bad_logprob_arrays_are_located_errors(bad, message):
    batch = [TrajectoryGroup([Trajectory([Turn([1], [2, 3], bad)], 1.0)])]
    with pytest.raises(ValueError) as raised:
        trd.assemble_training_data(batch, [[0.0]])
    assert str(raised.value) == "group 0, trajectory 0, turn 0: " + message


def test_vocab_size_holds_for_arrays():
    batch = [TrajectoryGroup([Trajectory([Turn(np.array([1, 7], dtype=np.int32), [2], [-0.5])], 1.0)])]
    with pytest.raises(ValueError, match=r"token 7 is outside the vocabulary \(vocab_size=5\) \(prompt_tokens\[1\]\)"):
        trd.assemble_training_data(batch, [[0.0]], vocab_size=5)


@pytest.mark.parametrize("model_input_tokens", ["list", "numpy"])
def test_arrays_are_neither_kept_nor_changed(model_input_tokens):
    import weakref

    prompt = np.arange(1, 6, dtype=np.int32)
    completion = np.array([7, 8], dtype=">i8")
    logprobs = np.array([-0.5, -0.25], dtype=np.float32)
    before = [a.copy() for a in (prompt, completion, logprobs)]
    batch = [TrajectoryGroup([Trajectory([Turn(prompt, completion, logprobs)], 1.0)])]
    datums, _ = trd.assemble_training_data(batch, [[0.5]], model_input_tokens=model_input_tokens)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip((prompt, completion, logprobs), before))
    # A kept Datum holds only its own data: the inputs go when dropped.
    gone = [weakref.ref(a) for a in (prompt, completion, logprobs)]
    del batch, prompt, completion, logprobs
    assert all(ref() is None for ref in gone)
    assert datums[0].model_input.to_ints() == [1, 2, 3, 4, 5, 7]
