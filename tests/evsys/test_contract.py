"""The package against the plain-Python reference of the contract (docs/contract.md)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import tinker
from hypothesis import given
from hypothesis import strategies as st

from support import reference
from support.tinker_bytes import wire_bytes
import tinker_rl_data as trd
from conftest import datum_content, groups
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn


def one_turn(prompt, completion, logprobs, reward=0.0):
    return [TrajectoryGroup([Trajectory([Turn(prompt, completion, logprobs)], reward=reward)])]


def test_public_names_are_the_replaced_modules():
    assert trd.__all__ == ["DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"]
    assert trd.DatumMetadata(3) == trd.DatumMetadata(group_idx=3, traj_idx=0, turn_idx=0, tags=[])


def test_spec_worked_example():
    datums, meta = trd.assemble_training_data(one_turn([11, 12, 13], [21, 22], [-0.5, -0.25]), [[0.75]])
    assert [datum_content(d) for d in datums] == [
        {
            "model_input": [11, 12, 13, 21],
            "n_chunks": 1,
            "target_tokens": ("int64", [4], "int64", [12, 13, 21, 22]),
            "logprobs": ("float32", [4], "float32", [0.0, 0.0, -0.5, -0.25]),
            "advantages": ("float32", [4], "float32", [0.0, 0.0, 0.75, 0.75]),
        }
    ]
    assert meta == [trd.DatumMetadata(0, 0, 0, [])]


def test_empty_prompt_targets_carry_their_own_logprobs():
    # Deliberate difference 1: the reference shifted these by one.
    (d,), _ = trd.assemble_training_data(one_turn([], [5, 6, 7], [-1.0, -2.0, -3.0]), [[1.0]])
    assert d.model_input.to_ints() == [5, 6]
    assert d.loss_fn_inputs["target_tokens"].tolist() == [6, 7]
    assert d.loss_fn_inputs["logprobs"].tolist() == [-2.0, -3.0]


@pytest.mark.parametrize(
    "advantages",
    [[], [[1.0], [2.0]], [[1.0, 2.0]], [[]]],
    ids=["no groups", "extra group", "extra trajectory", "missing trajectory"],
)
def test_mismatched_advantages_raise(advantages):
    # Deliberate difference 2: the reference's zip silently dropped the rest.
    with pytest.raises(ValueError, match="advantages has"):
        trd.assemble_training_data(one_turn([1], [2, 3], [-1.0, -1.0]), advantages)


def test_skipped_turns():
    batch = [
        TrajectoryGroup(
            [Trajectory([Turn([1, 2], [], []), Turn([], [7], [-1.0]), Turn([], [7, 8], [-1.0, -2.0])])]
        )
    ]
    datums, meta = trd.assemble_training_data(batch, [[0.5]])
    assert [m.turn_idx for m in meta] == [2]
    assert datums[0].loss_fn_inputs["target_tokens"].tolist() == [8]


def test_fitted_logprobs_are_logged_once(caplog):
    batch = [TrajectoryGroup([Trajectory([Turn([1], [2, 3], [-1.0]), Turn([1], [2], [-1.0, -2.0, -3.0])])])]
    with caplog.at_level("WARNING", logger="tinker_rl_data"):
        (short, long_), _ = trd.assemble_training_data(batch, [[1.0]])
    assert short.loss_fn_inputs["logprobs"].tolist() == [-1.0, 0.0]
    assert long_.loss_fn_inputs["logprobs"].tolist() == [-1.0]
    assert [r.getMessage() for r in caplog.records if r.name == "tinker_rl_data"] == [
        "logprobs of 2 turn(s) did not match their completion length (1 padded with 0.0, 1 truncated); "
        "the first is group 0, trajectory 0, turn 0"
    ]


def assert_same_output(batch, advantages):
    ours, our_meta = trd.assemble_training_data(batch, advantages)
    theirs, their_meta = reference.assemble_training_data(batch, advantages)
    assert [datum_content(d) for d in ours] == [datum_content(d) for d in theirs]
    assert [(m.group_idx, m.traj_idx, m.turn_idx, m.tags) for m in our_meta] == [
        (m.group_idx, m.traj_idx, m.turn_idx, m.tags) for m in their_meta
    ]
    assert all(type(d) is tinker.Datum for d in ours)


@given(groups(), st.booleans())
def test_matches_reference_on_random_batches(batch, normalize):
    advantages = trd.compute_advantages(batch, normalize=normalize)
    expected = reference.compute_advantages(batch, normalize=normalize)
    assert len(advantages) == len(expected)
    for ours, theirs in zip(advantages, expected):
        assert len(ours) == len(theirs)
        assert all(type(a) is float and math.isclose(a, b, rel_tol=0, abs_tol=1e-12) for a, b in zip(ours, theirs))
    assert_same_output(batch, advantages)
    metrics, expected = trd.compute_trajectory_metrics(batch), reference.compute_trajectory_metrics(batch)
    assert list(metrics) == list(expected)
    for key in metrics:
        assert type(metrics[key]) is float and math.isclose(metrics[key], expected[key], rel_tol=1e-12, abs_tol=1e-12)


@given(groups(max_groups=3))
def test_row_arrays_match_the_datums(batch):
    advantages = trd.compute_advantages(batch)
    datums, meta = trd.assemble_training_data(batch, advantages)
    rows = trd.assemble_arrays(batch, advantages)
    offsets = rows.row_offsets.tolist()
    assert len(offsets) == len(datums) + 1 and offsets[0] == 0
    for i, d in enumerate(datums):
        a, b = offsets[i], offsets[i + 1]
        assert rows.input_tokens[a:b].tolist() == d.model_input.to_ints()
        for key in ("target_tokens", "logprobs", "advantages"):
            assert getattr(rows, key)[a:b].tolist() == d.loss_fn_inputs[key].tolist()
        assert (rows.group_idx[i], rows.traj_idx[i], rows.turn_idx[i]) == (meta[i].group_idx, meta[i].traj_idx, meta[i].turn_idx)


def test_duck_typed_inputs_and_generators():
    class T:
        def __init__(self):
            self.prompt_tokens = (1, 2)
            self.completion_tokens = np.array([3, 4], dtype=np.int32)
            self.logprobs = np.array([-0.5, -1.5], dtype=np.float32)

    class Tr:
        turns = [T()]
        reward = 2

    class G:
        trajectories = (Tr(), Tr())

    batch = [G()]
    assert trd.compute_advantages(iter(batch)) == [[0.0, 0.0]]
    assert_same_output(batch, [[0.5, -0.5]])
    datums, meta = trd.assemble_training_data(iter(batch), [[0.5, -0.5]])
    assert len(datums) == 2 and meta[0].tags == []


def test_metrics_empty():
    assert trd.compute_trajectory_metrics([]) == {}
    assert trd.compute_trajectory_metrics([TrajectoryGroup([])]) == {}


@given(groups(max_groups=3))
def test_wire_bytes_equal_the_public_constructors(batch):
    advantages = trd.compute_advantages(batch)
    ours, _ = trd.assemble_training_data(batch, advantages)
    theirs, _ = reference.assemble_training_data(batch, advantages)
    assert wire_bytes(ours) == wire_bytes(theirs)


def test_wire_bytes_of_one_fixed_batch_are_non_trivial():
    batch = [TrajectoryGroup([Trajectory([Turn([1, 2, 3], [4, 5], [-0.1, -0.2])], reward=r) for r in (0.0, 1.0)])]
    advantages = trd.compute_advantages(batch)
    ours, _ = trd.assemble_training_data(batch, advantages)
    theirs, _ = reference.assemble_training_data(batch, advantages)
    assert len(wire_bytes(ours)) > 50 and wire_bytes(ours) == wire_bytes(theirs)


def test_datums_pickle_round_trip():
    batch = [TrajectoryGroup([Trajectory([Turn([1, 2, 3], [4, 5], [-0.1, -0.2])], reward=1.0)], tags=["a"])]
    datums, meta = trd.assemble_training_data(batch, [[0.25]])
    restored, restored_meta = pickle.loads(pickle.dumps((datums, meta)))
    assert [datum_content(d) for d in restored] == [datum_content(d) for d in datums]
    assert restored_meta == meta
    assert wire_bytes(restored) == wire_bytes(datums)
