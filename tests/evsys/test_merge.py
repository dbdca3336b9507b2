"""docs/contract.md §6: merged multi-turn rows (`merge_turns=True`) against the plain-Python
reference, on random trajectories whose prompts extend the sequence so far,
almost extend it, or start again."""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager

import numpy as np
import pytest
import tinker
from hypothesis import given
from hypothesis import strategies as st

from support import reference
import tinker_rl_data as trd
from conftest import MAX_TOKEN, datum_content, logprob_values, rewards
from support.tinker_bytes import wire_bytes
from test_properties import junk_batches, outcome
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

# Mostly a small alphabet, so that a fresh prompt sometimes extends by chance
# and a changed token is often close to the original.
small_tokens = st.one_of(st.integers(0, 12), st.sampled_from([0, 1, 2**30, MAX_TOKEN - 1, MAX_TOKEN]))

PROMPT_KINDS = [
    "extend",  # the sequence so far + an observation (maybe none)
    "exact",  # the sequence so far, nothing added
    "differ",  # one token of the sequence so far changed, + an observation
    "missing",  # one token of the sequence so far left out, + an observation
    "drop_last",  # the sequence so far without its last token (a dropped EOS), + an observation
    "prefix",  # a strict prefix of the sequence so far
    "reset",  # an unrelated prompt
    "empty",  # no prompt at all
]


def container(draw, values, dtypes):
    kind = draw(st.sampled_from(["list", "tuple", "array"]))
    if kind == "tuple":
        return tuple(values)
    if kind == "array":
        return np.array(values, dtype=draw(st.sampled_from(dtypes)))
    return list(values)


@st.composite
def merge_trajectories(draw, max_turns=5):
    """A trajectory whose turn u's prompt is built from turn u-1's
    prompt + completion (the sequence so far, whatever the merge decided)."""
    so_far = None
    turns = []
    for _ in range(draw(st.integers(0, max_turns))):
        kind = draw(st.sampled_from(PROMPT_KINDS))
        observation = draw(st.lists(small_tokens, max_size=4))
        if so_far is None or kind == "reset":
            prompt = draw(st.lists(small_tokens, max_size=8))
        elif kind == "empty":
            prompt = []
        elif kind == "exact":
            prompt = list(so_far)
        elif kind == "prefix":
            prompt = so_far[: draw(st.integers(0, max(len(so_far) - 1, 0)))]
        elif kind in ("differ", "missing") and so_far:
            i = draw(st.integers(0, len(so_far) - 1))
            prompt = list(so_far)
            if kind == "differ":
                prompt[i] = draw(small_tokens.filter(lambda x, old=so_far[i]: x != old))
            else:
                del prompt[i]
            prompt += observation
        elif kind == "drop_last" and so_far:
            prompt = so_far[:-1] + observation
        else:
            prompt = list(so_far) + observation
        completion = draw(st.lists(small_tokens, max_size=5))
        n = max(0, len(completion) + draw(st.integers(-2, 2)))  # logprobs shorter, equal, longer
        logprobs = draw(st.lists(logprob_values, min_size=n, max_size=n))
        turns.append(
            Turn(
                container(draw, prompt, [np.int64, np.int32, np.uint32]),
                container(draw, completion, [np.int64, np.int32]),
                container(draw, logprobs, [np.float64, np.float32]),
            )
        )
        so_far = list(prompt) + list(completion)
    return Trajectory(turns, reward=draw(rewards))


@st.composite
def merge_batches(draw, max_groups=3, max_trajectories=3):
    batch, advantages = [], []
    for _ in range(draw(st.integers(0, max_groups))):
        trajs = draw(st.lists(merge_trajectories(), max_size=max_trajectories))
        batch.append(TrajectoryGroup(trajs, tags=draw(st.lists(st.sampled_from(["math", "code"]), max_size=2))))
        advantages.append(draw(st.lists(st.floats(-10.0, 10.0), min_size=len(trajs), max_size=len(trajs))))
    return batch, advantages


def meta_tuples(metas):
    return [(m.group_idx, m.traj_idx, m.turn_idx, m.tags, m.n_turns) for m in metas]


def rows_of(datums, metas):
    """The reference's Datums as the flat arrays of RowArrays."""
    offsets = [0]
    out = {"input_tokens": [], "target_tokens": [], "logprobs": [], "advantages": []}
    for d in datums:
        out["input_tokens"] += d.model_input.to_ints()
        for key in ("target_tokens", "logprobs", "advantages"):
            out[key] += d.loss_fn_inputs[key].tolist()
        offsets.append(len(out["target_tokens"]))
    out["row_offsets"] = offsets
    for key in ("group_idx", "traj_idx", "turn_idx", "n_turns"):
        out[key] = [getattr(m, key) for m in metas]
    return out


def assert_rows_equal(rows, expected):
    assert rows.logprobs.dtype == np.float32 and rows.advantages.dtype == np.float32
    for key, values in expected.items():
        assert getattr(rows, key).tolist() == values, key


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextmanager
def warnings_logged():
    handler = _Records()
    log = logging.getLogger("tinker_rl_data")
    log.addHandler(handler)
    try:
        yield handler.records
    finally:
        log.removeHandler(handler)


@given(merge_batches())
def test_merged_rows_match_the_reference(case):
    batch, advantages = case
    ours, our_meta = trd.assemble_training_data(batch, advantages, merge_turns=True)
    theirs, their_meta = reference.assemble_training_data(batch, advantages, merge_turns=True)
    assert [datum_content(d) for d in ours] == [datum_content(d) for d in theirs]
    assert meta_tuples(our_meta) == meta_tuples(their_meta)
    assert all(type(d) is tinker.Datum for d in ours)
    assert all(isinstance(m, trd.DatumMetadata) for m in our_meta)
    assert wire_bytes(ours) == wire_bytes(theirs)


@given(merge_batches())
def test_merged_arrays_match_the_reference(case):
    batch, advantages = case
    rows = trd.assemble_arrays(batch, advantages, merge_turns=True)
    assert_rows_equal(rows, rows_of(*reference.assemble_training_data(batch, advantages, merge_turns=True)))


@given(merge_batches())
def test_default_is_one_row_per_turn(case):
    batch, advantages = case
    theirs, their_meta = reference.assemble_training_data(batch, advantages)
    expected = [datum_content(d) for d in theirs]
    for kwargs in ({}, {"merge_turns": False}):
        ours, our_meta = trd.assemble_training_data(batch, advantages, **kwargs)
        assert [datum_content(d) for d in ours] == expected
        assert meta_tuples(our_meta) == meta_tuples(their_meta)
        assert all(m.n_turns == 1 for m in our_meta)
        assert wire_bytes(ours) == wire_bytes(theirs)
        assert_rows_equal(trd.assemble_arrays(batch, advantages, **kwargs), rows_of(theirs, their_meta))


def completion_targets(datums, metas):
    """(group, trajectory, target, logprob, advantage) of every position whose
    advantage is not 0, sorted."""
    out = []
    for d, m in zip(datums, metas):
        columns = [d.loss_fn_inputs[key].tolist() for key in ("target_tokens", "logprobs", "advantages")]
        out += [(m.group_idx, m.traj_idx, *position) for position in zip(*columns) if position[2] != 0]
    return sorted(out)


@given(merge_batches())
def test_merging_trains_on_the_same_completion_tokens(case):
    """Independent of the reference: every completion token is a target in the
    merged rows exactly as often as in the per-turn rows (once, but the first
    token of a completion with no prompt before it), with its own logprob and
    the trajectory's advantage; merging only drops repeated prompt positions."""
    batch, advantages = case
    assert completion_targets(*trd.assemble_training_data(batch, advantages, merge_turns=True)) == completion_targets(
        *trd.assemble_training_data(batch, advantages)
    )


@given(merge_batches())
def test_fitting_warning_at_most_once_per_call(case):
    batch, advantages = case
    mismatched = any(
        len(list(turn.logprobs)) != len(list(turn.completion_tokens))
        for g in batch
        for t in g.trajectories
        for turn in t.turns
    )
    with warnings_logged() as records:
        trd.assemble_training_data(batch, advantages, merge_turns=True)
    fitted = [r for r in records if r.getMessage().startswith("logprobs of ")]
    assert len(fitted) <= 1 and len(records) == len(fitted)
    if not mismatched:
        assert fitted == []


@given(junk_batches(), st.booleans())
def test_junk_is_refused_in_merged_mode_like_the_reference(case, merge):
    batch, advantages = case
    ours = outcome(lambda b, a: trd.assemble_training_data(b, a, merge_turns=merge), batch, advantages)
    theirs = outcome(lambda b, a: reference.assemble_training_data(b, a, merge_turns=merge), batch, advantages)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        assert [datum_content(d) for d in ours[1][0]] == [datum_content(d) for d in theirs[1][0]]
        assert meta_tuples(ours[1][1]) == meta_tuples(theirs[1][1])
    else:
        assert ours[1].split(":")[0] == theirs[1].split(":")[0], (ours, theirs)


def test_datum_metadata_n_turns_defaults_to_one():
    assert trd.DatumMetadata(3) == trd.DatumMetadata(3, 0, 0, [], 1)
    assert trd.DatumMetadata(3, n_turns=4).n_turns == 4


def content(inputs, targets, logprobs, advantages):
    n = len(targets)
    return {
        "model_input": inputs,
        "n_chunks": 1,
        "target_tokens": ("int64", [n], "int64", targets),
        "logprobs": ("float32", [n], "float32", logprobs),
        "advantages": ("float32", [n], "float32", advantages),
    }


def worked_example():
    a0, a1 = 0.75, -0.5  # the trajectories' advantages (exact in float32)
    traj0 = Trajectory(
        [
            # turn 0: S = [] -> start; S = 1 2 | 3 4   (| : completion from here)
            Turn([1, 2], [3, 4], [-0.5, -0.25]),
            # turn 1: the prompt starts with S = [1 2 3 4]: new part [5]; S = 1 2 3 4 5 | 6
            Turn([1, 2, 3, 4, 5], [6], [-0.125]),
            # turn 2: [1 2 3 9] does not start with S (9 != 4): close turns 0-1, start again
            #         S = 1 2 3 9 | 7 8, logprobs [-1.0] padded to [-1.0, 0.0]
            Turn([1, 2, 3, 9], [7, 8], [-1.0]),
            # turn 3: the prompt is S exactly, no completion: merged, adds nothing
            Turn([1, 2, 3, 9, 7, 8], [], []),
            # turn 4: [1 2] is shorter than S: close turns 2-3, start again with
            #         S = 1 2 and no completion: closed at the end with no
            #         completion target, so dropped
            Turn([1, 2], [], [-3.0]),
        ]
    )
    traj1 = Trajectory(
        [
            # turn 0: empty prompt: S = | 5 6 7, logprobs [-1, -2, -3, -4] truncated to 3
            Turn([], [5, 6, 7], [-1.0, -2.0, -3.0, -4.0]),
            # turn 1: extends with observation [8]; S = | 5 6 7 8 | 9
            Turn([5, 6, 7, 8], [9], [-2.5]),
        ]
    )
    return [TrajectoryGroup([traj0, traj1], tags=["w"])], [[a0, a1]]


def test_spec_6_worked_example_by_hand():
    batch, advantages = worked_example()
    datums, meta = trd.assemble_training_data(batch, advantages, merge_turns=True)
    expected = [
        # Turns 0-1: S = 1 2 3 4 5 6, completion flags  . . c c . c
        # targets S[1:] = 2 3 4 5 6; target 2 is a prompt token, 3 4 are turn 0's
        # completion, 5 the observation, 6 turn 1's completion.
        content([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], [0.0, -0.5, -0.25, 0.0, -0.125], [0.0, 0.75, 0.75, 0.0, 0.75]),
        # Turns 2-3: S = 1 2 3 9 7 8, flags . . . . c c; 8's logprob is the padding 0.0
        content([1, 2, 3, 9, 7], [2, 3, 9, 7, 8], [0.0, 0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.75, 0.75]),
        # Trajectory 1, turns 0-1: S = 5 6 7 8 9, flags c c c . c; the first
        # completion token 5 is never a target, every target its own logprob
        content([5, 6, 7, 8], [6, 7, 8, 9], [-2.0, -3.0, 0.0, -2.5], [-0.5, -0.5, 0.0, -0.5]),
    ]
    assert [datum_content(d) for d in datums] == expected
    assert meta == [
        trd.DatumMetadata(0, 0, 0, ["w"], n_turns=2),
        trd.DatumMetadata(0, 0, 2, ["w"], n_turns=2),
        trd.DatumMetadata(0, 1, 0, ["w"], n_turns=2),
    ]
    # The reference says the same (so the hypothesis tests compare against a
    # reference that agrees with this hand computation).
    theirs, their_meta = reference.assemble_training_data(batch, advantages, merge_turns=True)
    assert [datum_content(d) for d in theirs] == expected
    assert meta_tuples(their_meta) == meta_tuples(meta)
    assert wire_bytes(datums) == wire_bytes(theirs)
    rows = trd.assemble_arrays(batch, advantages, merge_turns=True)
    assert rows.row_offsets.tolist() == [0, 5, 10, 14]
    assert rows.n_turns.tolist() == [2, 2, 2] and rows.turn_idx.tolist() == [0, 2, 0]


def test_spec_6_worked_example_logs_the_fitting_once(caplog):
    batch, advantages = worked_example()
    with caplog.at_level("WARNING", logger="tinker_rl_data"):
        trd.assemble_training_data(batch, advantages, merge_turns=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "tinker_rl_data"]
    assert len(messages) == 1 and re.match(r"logprobs of \d+ turn\(s\) did not match", messages[0]), messages


def test_worked_example_per_turn_is_unchanged():
    batch, advantages = worked_example()
    datums, meta = trd.assemble_training_data(batch, advantages)
    # Per turn: turns 0, 1, 2 of trajectory 0 and both of trajectory 1 (turns 3
    # and 4 have no completion).
    assert [(m.traj_idx, m.turn_idx, m.n_turns) for m in meta] == [(0, 0, 1), (0, 1, 1), (0, 2, 1), (1, 0, 1), (1, 1, 1)]
    assert datums[1].model_input.to_ints() == [1, 2, 3, 4, 5]
    assert datums[1].loss_fn_inputs["advantages"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.75]


@pytest.mark.parametrize(
    "turns, expected",
    [
        # No turn has a completion: no row at all.
        ([Turn([1, 2], [], []), Turn([1, 2, 3], [], [])], []),
        # An empty first turn (no positions) is closed alone when the next
        # turn's prompt cannot extend an empty sequence.
        ([Turn([], [], []), Turn([1], [2], [-1.0])], [(1, 1)]),
        # A single-token completion with no prompt, then a turn that extends it.
        ([Turn([], [4], [-1.0]), Turn([4, 5], [6], [-1.0])], [(0, 2)]),
        # A single-token completion with no prompt, alone: no position.
        ([Turn([], [4], [-1.0])], []),
        # A trailing turn that resets with only a prompt is dropped.
        ([Turn([1], [2], [-1.0]), Turn([9], [], [])], [(0, 1)]),
        # Three turns that all extend: one row covering all three.
        ([Turn([1], [2], [-1.0]), Turn([1, 2], [3], [-1.0]), Turn([1, 2, 3, 4], [5], [-1.0])], [(0, 3)]),
    ],
)
def test_edge_cases_turn_idx_and_n_turns(turns, expected):
    batch = [TrajectoryGroup([Trajectory(turns)])]
    _, meta = trd.assemble_training_data(batch, [[1.0]], merge_turns=True)
    assert [(m.turn_idx, m.n_turns) for m in meta] == expected
    _, their_meta = reference.assemble_training_data(batch, [[1.0]], merge_turns=True)
    assert [(m.turn_idx, m.n_turns) for m in their_meta] == expected
