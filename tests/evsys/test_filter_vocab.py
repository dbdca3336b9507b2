"""docs/contract.md §8: remove_constant_reward_groups, and the vocab_size check of
assemble_training_data / assemble_arrays (per turn and merged)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import reference
import tinker_rl_data as trd
from conftest import datum_content, logprob_values
from test_merge import meta_tuples, warnings_logged
from test_properties import outcome
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

# --- remove_constant_reward_groups -----------------------------------------

few_rewards = st.sampled_from([0.0, -0.0, 1.0, 0.5, 1, True, np.float32(0.5), np.float64(1.0)])


@st.composite
def reward_batches(draw):
    return [
        TrajectoryGroup(
            [Trajectory([Turn([1], [2], [-1.0])], reward=draw(few_rewards)) for _ in range(draw(st.integers(0, 4)))],
            tags=draw(st.sampled_from([[], ["a"]])),
        )
        for _ in range(draw(st.integers(0, 5)))
    ]


@given(reward_batches(), st.sampled_from(["list", "tuple", "generator"]))
def test_filter_keeps_the_same_objects_in_order(batch, kind):
    arg = tuple(batch) if kind == "tuple" else (g for g in batch) if kind == "generator" else batch
    with warnings_logged() as records:
        kept = trd.remove_constant_reward_groups(arg)
    with warnings_logged() as their_records:
        expected = reference.remove_constant_reward_groups(batch)
    assert type(kept) is list
    assert [id(g) for g in kept] == [id(g) for g in expected]
    # Independently of the reference: a group stays iff two of its rewards differ.
    assert [id(g) for g in kept] == [id(g) for g in batch if len({float(t.reward) for t in g.trajectories}) > 1]
    assert len(records) == len(their_records) == (0 if kept else 1)
    assert all(r.levelname == "WARNING" and r.name == "tinker_rl_data" for r in records)


def test_filter_examples():
    def group(*rewards):
        return TrajectoryGroup([Trajectory([], reward=r) for r in rewards])

    a, b, c, d, e = group(1.0, 0.0), group(), group(2.0), group(0.5, 0.5, 0.5), group(0.5, 0.5, 0.25)
    assert trd.remove_constant_reward_groups([a, b, c, d, e]) == [a, e]
    kept = trd.remove_constant_reward_groups([a, b, c, d, e])
    assert kept[0] is a and kept[1] is e
    assert trd.remove_constant_reward_groups([group(0.0, -0.0)]) == []  # 0.0 == -0.0


def test_filter_warns_once_when_none_remain(caplog):
    groups = [TrajectoryGroup([Trajectory([], reward=1.0)] * 3), TrajectoryGroup([])]
    with caplog.at_level("WARNING", logger="tinker_rl_data"):
        assert trd.remove_constant_reward_groups(groups) == []
    assert len([r for r in caplog.records if r.name == "tinker_rl_data"]) == 1


def test_filter_of_no_groups_is_empty_and_warns(caplog):
    # docs/contract.md §8 read literally: none remain, so [] and one warning (as
    # tinker-cookbook, which warns on an empty list too).
    with caplog.at_level("WARNING", logger="tinker_rl_data"):
        assert trd.remove_constant_reward_groups([]) == []
    assert len([r for r in caplog.records if r.name == "tinker_rl_data"]) == 1


def test_filter_does_not_warn_when_some_remain(caplog):
    groups = [TrajectoryGroup([Trajectory([], reward=1.0)] * 3), TrajectoryGroup([Trajectory([], reward=r) for r in (0, 1)])]
    with caplog.at_level("WARNING", logger="tinker_rl_data"):
        assert trd.remove_constant_reward_groups(groups) == [groups[1]]
    assert not [r for r in caplog.records if r.name == "tinker_rl_data"]


@pytest.mark.parametrize(
    "reward, exc, text",
    [(math.nan, ValueError, "not finite"), (math.inf, ValueError, "not finite"), (-math.inf, ValueError, "not finite"),
     (np.float64("nan"), ValueError, "not finite"), ("1.0", TypeError, "reward"), (None, TypeError, "reward"),
     (10**400, ValueError, "too large for a float")],
)
def test_filter_reward_errors_are_located(reward, exc, text):
    # The bad reward sits in group 2, trajectory 1; group 1 is constant, so a
    # filter that stopped reading at its first decision would miss it.
    groups = [
        TrajectoryGroup([Trajectory([], reward=0.0), Trajectory([], reward=1.0)]),
        TrajectoryGroup([Trajectory([], reward=1.0)]),
        TrajectoryGroup([Trajectory([], reward=0.0), Trajectory([], reward=reward), Trajectory([], reward=1.0)]),
    ]
    for fn in (trd.remove_constant_reward_groups, reference.remove_constant_reward_groups):
        with pytest.raises(exc) as info:
            fn(groups)
        assert str(info.value).startswith("group 2, trajectory 1: "), (fn, str(info.value))
        assert text in str(info.value), (fn, str(info.value))


def test_filter_nan_in_a_group_that_already_differs():
    # Rewards 0 and 1 already differ; the NaN after them must still be found.
    groups = [TrajectoryGroup([Trajectory([], reward=r) for r in (0.0, 1.0, math.nan)])]
    with pytest.raises(ValueError, match=r"^group 0, trajectory 2: "):
        trd.remove_constant_reward_groups(groups)


def test_filter_of_a_single_group_is_a_type_error():
    group = TrajectoryGroup([Trajectory([], reward=r) for r in (0.0, 1.0)])
    with pytest.raises(TypeError, match="^trajectory_groups must be a sequence of groups, got a single TrajectoryGroup"):
        trd.remove_constant_reward_groups(group)


def test_filter_does_not_modify_its_input():
    groups = [TrajectoryGroup([Trajectory([], reward=r) for r in rs]) for rs in ([1.0, 1.0], [0.0, 2.0], [3.0])]
    before = [(id(g), [t.reward for t in g.trajectories]) for g in groups]
    copy = list(groups)
    trd.remove_constant_reward_groups(groups)
    assert groups == copy and [(id(g), [t.reward for t in g.trajectories]) for g in groups] == before


# --- vocab_size ---------------------------------------------------------------

V = 151936
MODES = [
    ("assemble_training_data", False),
    ("assemble_training_data", True),
    ("assemble_arrays", False),
    ("assemble_arrays", True),
]


def vocab_batch(turn):
    """Group 1, trajectory 1, turn 1 is `turn`; every other token is small."""
    good = lambda: Turn([1, 2, 3], [4, 5], [-0.5, -0.25])  # noqa: E731
    groups = [TrajectoryGroup([Trajectory([good(), good()], 0.5) for _ in range(2)]) for _ in range(2)]
    groups[1].trajectories[1].turns[1] = turn
    return groups, [[0.5, -0.5], [0.5, -0.5]]


def call(name, merge, batch, advantages, vocab_size):
    return getattr(trd, name)(batch, advantages, merge_turns=merge, vocab_size=vocab_size)


PLACES = [
    # (turn, field, index): a token V at field[index] of group 1, trajectory 1, turn 1
    (Turn([1, 2, 3, 4], [5, 6], [-1.0, -1.0]), "prompt_tokens", 3),
    (Turn([1, 2, 3, 4], [5, 6, 7], [-1.0] * 3), "completion_tokens", 2),
    (Turn([1, 2, 3], [5], [-1.0]), "completion_tokens", 0),
    # turns that yield no row of their own
    (Turn([1, 2, 3], [], []), "prompt_tokens", 0),
    (Turn([], [5], [-1.0]), "completion_tokens", 0),
    (Turn([9, 9], [], [-1.0, -2.0]), "prompt_tokens", 1),
]


def with_token(turn, field, index, token):
    values = list(getattr(turn, field))
    values[index] = token
    return Turn(**{**vars(turn), field: values})


@pytest.mark.parametrize("name, merge", MODES)
@pytest.mark.parametrize("turn, field, index", PLACES)
def test_vocab_boundary(name, merge, turn, field, index):
    # V - 1 passes,
    batch, advantages = vocab_batch(with_token(turn, field, index, V - 1))
    call(name, merge, batch, advantages, V)
    # V fails, located, naming the token and V,
    batch, advantages = vocab_batch(with_token(turn, field, index, V))
    with pytest.raises(ValueError) as info:
        call(name, merge, batch, advantages, V)
    expected = f"group 1, trajectory 1, turn 1: token {V} is outside the vocabulary (vocab_size={V}) ({field}[{index}])"
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        reference.assemble_training_data(batch, advantages, merge_turns=merge, vocab_size=V)
    assert str(info.value) == expected
    # and without vocab_size nothing is checked beyond 0..2**31-1.
    call(name, merge, batch, advantages, None)


@pytest.mark.parametrize("name, merge", MODES)
def test_vocab_as_numpy_arrays_and_numpy_size(name, merge):
    turn = Turn(np.array([1, 2, 3], dtype=np.int32), np.array([4, 99], dtype=np.int64), np.array([-1.0, -1.0]))
    batch, advantages = vocab_batch(turn)
    call(name, merge, batch, advantages, np.int64(100))
    with pytest.raises(ValueError, match=r"^group 1, trajectory 1, turn 1: token 99 is outside the vocabulary \(vocab_size=99\) \(completion_tokens\[1\]\)$"):
        call(name, merge, batch, advantages, 99)


def test_vocab_does_not_change_the_rows():
    turn = Turn([1, 2, 3], [4, 99], [-1.0, -2.0])
    batch, advantages = vocab_batch(turn)
    for merge in (False, True):
        expected = [datum_content(d) for d in trd.assemble_training_data(batch, advantages, merge_turns=merge)[0]]
        ours = [datum_content(d) for d in trd.assemble_training_data(batch, advantages, merge_turns=merge, vocab_size=100)[0]]
        assert ours == expected


small = st.integers(0, 40)


@st.composite
def vocab_batches(draw):
    """Small tokens against a small vocabulary, so that batches fail at random
    places; now and then a NaN logprob or reward to check the order."""
    batch, advantages = [], []
    for _ in range(draw(st.integers(1, 3))):
        trajs = []
        for _ in range(draw(st.integers(0, 3))):
            turns = []
            for _ in range(draw(st.integers(0, 3))):
                p, c = draw(st.lists(small, max_size=5)), draw(st.lists(small, max_size=4))
                lp = draw(st.lists(st.one_of(logprob_values, st.just(math.nan)) if draw(st.integers(0, 9)) == 0 else logprob_values,
                                   min_size=len(c), max_size=len(c)))
                turns.append(Turn(p, c, lp))
            reward = math.nan if draw(st.integers(0, 19)) == 0 else draw(st.floats(-1, 1))
            trajs.append(Trajectory(turns, reward=reward))
        batch.append(TrajectoryGroup(trajs))
        advantages.append([draw(st.floats(-1, 1)) for _ in trajs])
    return batch, advantages


@given(vocab_batches(), st.integers(1, 45), st.booleans())
def test_the_first_problem_is_reported_like_the_reference(case, vocab_size, merge):
    batch, advantages = case
    ours = outcome(lambda b, a: trd.assemble_training_data(b, a, merge_turns=merge, vocab_size=vocab_size), batch, advantages)
    theirs = outcome(
        lambda b, a: reference.assemble_training_data(b, a, merge_turns=merge, vocab_size=vocab_size), batch, advantages
    )
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        assert [datum_content(d) for d in ours[1][0]] == [datum_content(d) for d in theirs[1][0]]
        assert meta_tuples(ours[1][1]) == meta_tuples(theirs[1][1])
    elif "vocabulary" in theirs[1]:
        assert ours[1] == theirs[1]  # the same token at the same place
    else:
        assert ours[1].split(":")[0] == theirs[1].split(":")[0], (ours, theirs)
    arrays = outcome(lambda b, a: trd.assemble_arrays(b, a, merge_turns=merge, vocab_size=vocab_size), batch, advantages)
    assert arrays[0] == theirs[0]
    if arrays[0] != "ok" and "vocabulary" in theirs[1]:
        assert arrays[1] == theirs[1]
