"""Contract §4 (docs/contract.md): bad input raises a located TypeError / ValueError before any
output, and the inputs are never modified."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tinker_rl_data as trd
from tinker_rl_data import _core
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn


def batch(bad_turn=None, reward=1.0):
    """Group 2, trajectory 1, turn 1 is `bad_turn` (or a good one)."""
    good = lambda: Turn([1, 2, 3], [4, 5], [-0.5, -0.25])  # noqa: E731
    groups = [TrajectoryGroup([Trajectory([good(), good()], 0.5) for _ in range(2)]) for _ in range(3)]
    if bad_turn is not None:
        groups[2].trajectories[1].turns[1] = bad_turn
    groups[2].trajectories[1].reward = reward
    return groups


ADVANTAGES = [[0.5, -0.5]] * 3


def snapshot(obj):
    """A deep, comparable picture of an input (numpy arrays included)."""
    if isinstance(obj, np.ndarray):
        return ("ndarray", str(obj.dtype), obj.shape, repr(obj.tolist()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(snapshot(x) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, snapshot(v)) for k, v in obj.items()))
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, snapshot(vars(obj)))
    return (type(obj).__name__, repr(obj))


def raises_located(exc, where, fn, *args, contains=()):
    before = snapshot(args)
    with pytest.raises(exc) as info:
        fn(*args)
    message = str(info.value)
    assert message.startswith(where + ": "), message
    for part in contains:
        assert part in message, message
    assert snapshot(args) == before, "inputs were modified"
    return message


TURN = "group 2, trajectory 1, turn 1"
TRAJ = "group 2, trajectory 1"


@pytest.mark.parametrize(
    "token, shown",
    [(1.0, "1.0"), ("7", "'7'"), (None, "None"), (2.5, "2.5"), (np.float64(3.0), "3.0"), (complex(1, 0), "(1+0j)")],
)
@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
def test_token_not_an_integer_is_a_type_error(token, shown, field):
    turn = Turn([1, 2, 3], [4, 5], [-0.5, -0.25])
    getattr(turn, field)[1] = token
    raises_located(TypeError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=(shown, f"{field}[1]"))


@pytest.mark.parametrize("token", [-1, 2**31, 2**63, -(2**70), 10**30])
def test_token_out_of_range_is_a_value_error(token):
    turn = Turn([1, token, 3], [4, 5], [-0.5, -0.25])
    message = raises_located(ValueError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=(str(token),))
    assert "outside 0..2147483647" in message


def test_spec_example_message():
    turn = Turn([1, 2147483648], [4, 5], [-0.5, -0.25])
    message = raises_located(ValueError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES)
    assert message.startswith("group 2, trajectory 1, turn 1: token 2147483648 is outside 0..2147483647")


def test_bool_and_numpy_integers_are_tokens():
    turn = Turn([True, np.int64(7), np.uint16(9)], [np.int32(4), False], [-0.5, -0.25])
    datums, _ = trd.assemble_training_data(batch(turn), ADVANTAGES)
    tokens = datums[-1].model_input.to_ints()
    assert tokens == [1, 7, 9, 4] and all(type(t) is int for t in tokens)


@pytest.mark.parametrize("logprob, shown", [("x", "'x'"), (None, "None"), (1j, "1j"), ([1.0], "[1.0]"), (b"1", "b'1'")])
def test_logprob_not_a_real_number_is_a_type_error(logprob, shown):
    turn = Turn([1, 2, 3], [4, 5], [-0.5, logprob])
    raises_located(TypeError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=(shown, "logprobs[1]"))


@pytest.mark.parametrize("logprob", [math.nan, math.inf, -math.inf, -1e300, np.float64("nan")])
def test_non_finite_logprob_is_a_value_error(logprob):
    turn = Turn([1, 2, 3], [4, 5], [logprob, -0.25])
    raises_located(ValueError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=("logprobs[0]",))


def test_logprobs_past_the_completion_are_checked_too():
    turn = Turn([1, 2, 3], [4, 5], [-0.5, -0.25, math.nan])
    raises_located(ValueError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=("nan",))


REWARD_FUNCTIONS = [
    lambda g: trd.compute_advantages(g),
    lambda g: trd.compute_trajectory_metrics(g),
    lambda g: trd.assemble_training_data(g, ADVANTAGES),
]


@pytest.mark.parametrize("fn", REWARD_FUNCTIONS, ids=["advantages", "metrics", "assemble"])
@pytest.mark.parametrize("reward", ["1.0", None, 1j, [1.0]])
def test_reward_not_a_real_number_is_a_type_error(fn, reward):
    raises_located(TypeError, TRAJ, fn, batch(reward=reward), contains=("reward", repr(reward)))


@pytest.mark.parametrize("fn", REWARD_FUNCTIONS, ids=["advantages", "metrics", "assemble"])
@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_is_a_value_error(fn, reward):
    raises_located(ValueError, TRAJ, fn, batch(reward=reward), contains=("reward", "not finite"))


@pytest.mark.parametrize("advantage, exc", [("0.5", TypeError), (None, TypeError), (math.nan, ValueError), (math.inf, ValueError), (1e39, ValueError)])
def test_bad_advantage(advantage, exc):
    advantages = [[0.5, -0.5], [0.5, -0.5], [0.5, advantage]]
    raises_located(exc, TRAJ, trd.assemble_training_data, batch(), advantages, contains=("advantage",))


def test_advantages_shape():
    with pytest.raises(ValueError, match=r"^advantages has 2 groups for 3 trajectory groups"):
        trd.assemble_training_data(batch(), ADVANTAGES[:2])
    raises_located(ValueError, "group 1", trd.assemble_training_data, batch(), [[0.5, -0.5], [0.5], [0.5, -0.5]],
                   contains=("1 entries for 2 trajectories",))
    with pytest.raises(ValueError, match="2-D|1-D"):
        trd.assemble_training_data(batch(), [[0.5, -0.5], np.zeros((2, 1)), [0.5, -0.5]])


class Missing:
    """An object lacking every attribute."""


@pytest.mark.parametrize(
    "where, build, attribute",
    [
        ("group 2", lambda b: b.__setitem__(2, Missing()), "trajectories"),
        (TRAJ, lambda b: b[2].trajectories.__setitem__(1, Missing()), "reward"),
        (TURN, lambda b: b[2].trajectories[1].turns.__setitem__(1, Missing()), "prompt_tokens"),
        (TURN, lambda b: delattr(b[2].trajectories[1].turns[1], "completion_tokens"), "completion_tokens"),
        (TURN, lambda b: delattr(b[2].trajectories[1].turns[1], "logprobs"), "logprobs"),
        (TRAJ, lambda b: delattr(b[2].trajectories[1], "turns"), "turns"),
    ],
)
def test_missing_attribute_is_a_type_error_naming_it(where, build, attribute):
    b = batch()
    build(b)
    raises_located(TypeError, where, trd.assemble_training_data, b, ADVANTAGES, contains=(f"'{attribute}'",))


@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens", "logprobs"])
def test_arrays_must_be_one_dimensional(field):
    turn = Turn([1, 2, 3], [4, 5], [-0.5, -0.25])
    setattr(turn, field, np.zeros((2, 2), dtype=np.float64 if field == "logprobs" else np.int64))
    raises_located(ValueError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=(field, "1-D"))


def test_float_token_arrays_are_refused():
    turn = Turn(np.array([1.0, 2.0]), [4, 5], [-0.5, -0.25])
    raises_located(TypeError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=("float64",))


@pytest.mark.parametrize("value", [5, None, "abc"])
def test_non_sequences_are_type_errors(value):
    turn = Turn(value, [4, 5], [-0.5, -0.25])
    raises_located(TypeError, TURN, trd.assemble_training_data, batch(turn), ADVANTAGES, contains=("prompt_tokens",))


def test_successful_calls_leave_inputs_unchanged():
    b = batch(Turn(np.array([1, 2]), (3, 4), np.array([-1.0, -2.0], dtype=np.float32)))
    before = snapshot(b)
    advantages = trd.compute_advantages(b)
    trd.assemble_training_data(b, advantages)
    trd.assemble_arrays(b, advantages)
    trd.compute_trajectory_metrics(b)
    assert snapshot(b) == before


def test_a_rust_panic_surfaces_as_an_exception():
    with pytest.raises(RuntimeError, match=re.escape("internal error in tinker_rl_data (please report): panic probe")):
        _core._panic_probe()


class Boom(Exception):
    pass


class ExplodingReward:
    turns = [Turn([1], [2], [-1.0])]

    @property
    def reward(self):
        raise Boom("reward property")


class ExplodingSequence(list):
    def __iter__(self):
        raise Boom("iter")


class LyingLength:
    """Claims 1000 items, holds 2."""

    def __len__(self):
        return 1000

    def __iter__(self):
        return iter([1, 2])


class ExplodingGroup(TrajectoryGroup):
    @property
    def rewards(self):  # never needed: rewards are read per trajectory
        raise Boom("rewards property")


@pytest.mark.parametrize("fn", REWARD_FUNCTIONS, ids=["advantages", "metrics", "assemble"])
def test_an_exception_from_a_property_propagates(fn):
    b = batch()
    b[1].trajectories[0] = ExplodingReward()
    with pytest.raises(Boom, match="reward property"):
        fn(b)


def test_an_exception_from_iter_propagates_and_a_lying_len_is_ignored():
    class Seq:
        def __iter__(self):
            raise Boom("iter")

    with pytest.raises(Boom):
        trd.assemble_training_data(batch(Turn(Seq(), [4, 5], [-0.5, -0.25])), ADVANTAGES)
    datums, _ = trd.assemble_training_data(batch(Turn(LyingLength(), [4, 5], [-0.5, -0.25])), ADVANTAGES)
    assert datums[-1].model_input.to_ints() == [1, 2, 4]
    groups = [ExplodingGroup([Trajectory([Turn([1], [2, 3], [-1.0, -1.0])], 1.0)])]
    assert trd.compute_advantages(groups) == [[1.0]]


class Growing:
    """An integer whose __index__ appends to the list it sits in."""

    def __init__(self, host):
        self.host = host

    def __index__(self):
        self.host.append(99)
        return 5


class Shrinking(Growing):
    def __index__(self):
        self.host.clear()
        return 5


def test_a_list_changed_while_read_gives_a_clean_result_or_error():
    prompt = [1, 2]
    prompt.append(Growing(prompt))
    datums, _ = trd.assemble_training_data(batch(Turn(prompt, [4, 5], [-0.5, -0.25])), ADVANTAGES)
    # Rows are laid out for the length seen first; the appended items are not read.
    assert datums[-1].model_input.to_ints() == [1, 2, 5, 4]
    prompt = [1, 2]
    prompt.append(Shrinking(prompt))
    prompt.append(7)
    # A list that shrank while being read is a located RuntimeError (contract §4).
    with pytest.raises(RuntimeError, match=f"^{TURN}: prompt_tokens changed size while being read"):
        trd.assemble_training_data(batch(Turn(prompt, [4, 5], [-0.5, -0.25])), ADVANTAGES)
