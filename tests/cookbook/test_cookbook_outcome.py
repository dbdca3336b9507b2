"""The cookbook's outcome wherever the native pass refuses (issue 49).

Each input below is one the native pass refuses, or one it would read where
tinker-cookbook 0.6.1 fails: the cookbook's own ``rl.data_processing``
function, ours called directly and ours installed must end the same way,
with the same result (Datums to the wire byte) or the same exception
(class, ``str``, ``args``), ours carrying its located message as a PEP 678
note. Under ``python -O`` the cookbook's ``assert`` vanishes and so does
ours (a subprocess); without tinker_cookbook, ours keeps its own located
exceptions (a subprocess).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace as NS
from unittest import mock

import pytest

from conftest import cookbook_unavailable

try:
    import numpy as np
    import tinker
    import torch
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.exceptions import DataValidationError
    from tinker_cookbook.rl import data_processing as cookbook
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition
except ImportError as exc:
    cookbook_unavailable(exc)

from test_data_processing import assert_same_assembly, assert_same_datums, ob, outcome, step, text

from tinker_rl_data import cookbook as ours


def acted(observation, action, metrics=None):
    return Transition(ob=observation, ac=action, reward=0.0, episode_done=False, metrics=metrics or {})


def action(tokens, logprobs="default", sequence_id="s"):
    if isinstance(logprobs, str):
        logprobs = [-0.5] * len(tokens)
    return TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs, sequence_id=sequence_id)


class Logprobs(list):
    pass


# name: (transitions, what the cookbook does: an exception class or "ok")
CASES = {
    # A missing attribute: the cookbook's AttributeError (ours: a located TypeError).
    "ob_none": ([acted(None, action([2, 3]))], AttributeError),
    "ac_none": ([acted(ob(text(1)), None)], AttributeError),
    "no_ac": ([NS(ob=ob(text(1)), reward=0.0, metrics={})], AttributeError),
    "no_metrics": ([NS(ob=ob(text(1)), ac=action([2, 3]), reward=0.0)], AttributeError),
    "no_tokens": ([acted(ob(text(1)), NS(logprobs=[-0.5], sequence_id="s"))], AttributeError),
    # A token that is not an integer: pydantic's ValidationError (ours: a located TypeError).
    "float_token": ([step(ob(text(1)), [2, 3.0])], "ValidationError"),
    "str_token": ([step(ob(text(1)), ["7"])], "ValidationError"),
    "none_token": ([step(ob(text(1)), [2, None])], "ValidationError"),
    # A token outside 0..2**31-1: the cookbook builds a Datum (ours refused it).
    "token_2_31": ([step(ob(text(1)), [2, 2**31])], "ok"),
    "negative_token": ([step(ob(text(1, -1)), [2])], "ok"),
    "token_2_63": ([step(ob(text(1)), [2, 2**63 - 1])], "ok"),
    "token_2_64": ([step(ob(text(1)), [2, 2**64])], ValueError),  # torch's overflow
    # Accepted by the native pass, not by the cookbook.
    "tuple_logprobs": ([acted(ob(text(1)), action([2, 3], (-0.5, -0.25)))], TypeError),
    "numpy_logprobs": ([acted(ob(text(1)), action([2, 3], np.array([-0.5, -0.25])))], AssertionError),
    "numpy_int_token": ([acted(ob(text(1)), action([2, np.int64(3)]))], "ValidationError"),
    "numpy_tokens": ([acted(ob(text(1)), action(np.array([2, 3], dtype=np.int32)))], ValueError),
    "numpy_tokens_no_id": ([acted(ob(text(1)), action(np.array([2, 3]), sequence_id=None))], "ValidationError"),
    "no_sequence_id": ([acted(ob(text(1)), NS(tokens=[2, 3], logprobs=[-0.5, -0.25]))], AttributeError),
    "no_sequence_id_later": (
        [step(ob(text(1)), [2]), acted(ob(text(1, 2, 5)), NS(tokens=[6], logprobs=[-0.5]))],
        AttributeError,
    ),
    # Read natively, as the cookbook reads them (no fallback needed).
    "bool_token": ([step(ob(text(1)), [2, True])], "ok"),
    "tuple_tokens": ([acted(ob(text(1)), action((2, 3)))], "ok"),
    "list_subclass_logprobs": ([acted(ob(text(1)), action([2, 3], Logprobs([-0.5, -0.25])))], "ok"),
    # Logprobs of other types (issue 53): torch infers the dtype from them,
    # or refuses them, where float() would read a number.
    "bool_logprobs": ([acted(ob(text(1)), action([2, 3], [True, False]))], ValueError),
    "numpy_int_logprobs": ([acted(ob(text(1)), action([2, 3], [np.int64(-1), np.int64(-2)]))], "ok"),
    "numpy_int32_logprobs": ([acted(ob(text(1)), action([2, 3], [np.int32(-1), np.int32(-2)]))], "ok"),
    "numpy_float32_logprobs": ([acted(ob(text(1)), action([2, 3], [np.float32(-0.5), np.float32(-1)]))], "ok"),
    "numpy_float16_logprobs": ([acted(ob(text(1)), action([2, 3], [np.float16(-0.5), np.float16(-1)]))], "ok"),
    "numpy_float64_logprobs": ([acted(ob(text(1)), action([2, 3], [np.float64(-0.5), np.float64(-1)]))], "ok"),
    "numpy_bool_logprobs": ([acted(ob(text(1)), action([2, 3], [np.bool_(True), -0.5]))], "ok"),
    "decimal_logprobs": ([acted(ob(text(1)), action([2, 3], [Decimal("-0.5"), Decimal("-1")]))], RuntimeError),
    "fraction_logprobs": ([acted(ob(text(1)), action([2, 3], [Fraction(-1, 2), Fraction(-1)]))], RuntimeError),
    "zero_d_array_logprobs": ([acted(ob(text(1)), action([2, 3], [np.array(-0.5), np.array(-1.0)]))], TypeError),
    "zero_d_tensor_logprobs": ([acted(ob(text(1)), action([2, 3], [torch.tensor(-0.5), torch.tensor(-1.0)]))], "ok"),
    "huge_int_logprobs": ([acted(ob(text(1)), action([2, 3], [2**70, -1]))], ValueError),
    "huge_int_with_a_float": ([acted(ob(text(1)), action([2, 3], [2**70, -1.0]))], "ok"),
    "bool_logprobs_after_context": ([acted(ob(text(1, 4)), action([2, 3], [True, False]))], "ok"),
    # Tokens of other types.
    "decimal_token": ([step(ob(text(1)), [2, Decimal(3)])], "ValidationError"),
    "fraction_token": ([step(ob(text(1)), [2, Fraction(3)])], "ValidationError"),
    "zero_d_array_token": ([step(ob(text(1)), [2, np.array(3)])], "ValidationError"),
    "numpy_uint64_token": ([step(ob(text(1)), [2, np.uint64(3)])], "ValidationError"),
    "numpy_bool_token": ([step(ob(text(1)), [2, np.bool_(True)])], "ValidationError"),
    "token_2_70": ([step(ob(text(1)), [2, 2**70])], ValueError),
    # The cookbook's own checks: its class (ours was a subclass), its message.
    "one_token": ([step(ob(text(1)), [])], DataValidationError),
    "missing_logprobs": ([step(ob(text(1)), [2], logprobs=None)], ValueError),
    "logprobs_too_long": ([step(ob(text(1)), [2, 3], logprobs=[-1.0, -2.0, -3.0])], AssertionError),
}


def traj_of(name):
    return Trajectory(transitions=CASES[name][0], final_ob=ob())


def batch_with(traj):
    """Two groups of two: the case is group 1's trajectory 1."""
    good = Trajectory(transitions=[step(ob(text(1, 5)), [2, 3])], final_ob=ob())
    groups = [
        TrajectoryGroup(trajectories_G=[good, good], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}]),
        TrajectoryGroup(trajectories_G=[good, traj], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}]),
    ]
    return groups, [[0.5, -0.5], torch.tensor([0.25, -0.25])]


ORIGINALS = {name: getattr(cookbook, name) for name in ("assemble_training_data", "trajectory_to_data")}


@pytest.fixture(params=["direct", "installed"])
def route(request):
    """Ours as called, once the cookbook's outcome is known: directly (not
    installed), or as install() puts it into the cookbook's module (and ours
    called directly then too); the originals back after."""

    def modules():
        if request.param == "direct":
            return [ours]
        ours.install()
        assert cookbook.trajectory_to_data is not ORIGINALS["trajectory_to_data"]
        return [ours, cookbook]

    try:
        yield modules
    finally:
        ours.uninstall()
    assert all(getattr(cookbook, name) is f for name, f in ORIGINALS.items())


def assert_same_exception(theirs, mine, where):
    """The cookbook's exception, ours with our located message as a note."""
    assert mine[0] == "raised", f"the cookbook raised {theirs[1]!r}, ours returned"
    a, b = theirs[1], mine[1]
    assert type(b) is type(a), f"{type(a).__name__}: {a} / ours {type(b).__name__}: {b}"
    assert str(b) == str(a)
    assert b.args == a.args
    notes = getattr(b, "__notes__", [])
    assert len(notes) == 1 and notes[0].startswith(where), notes
    assert notes[0] != str(a)
    assert not getattr(a, "__notes__", None)  # the cookbook's own, called itself, has none


def expected(name, theirs):
    kind = CASES[name][1]
    if kind == "ok":
        assert theirs[0] == "ok", theirs[1]
    else:
        assert theirs[0] == "raised", "the cookbook returned"
        name_of = kind if isinstance(kind, str) else kind.__name__
        assert type(theirs[1]).__name__ == name_of, repr(theirs[1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_trajectory_to_data_ends_as_the_cookbooks(name, route):
    theirs = outcome(ORIGINALS["trajectory_to_data"], traj_of(name), 0.5)
    expected(name, theirs)
    for module in route():
        mine = outcome(module.trajectory_to_data, traj_of(name), 0.5)
        if theirs[0] == "ok":
            assert mine[0] == "ok", mine[1]
            assert_same_datums(theirs[1], mine[1])
        else:
            assert_same_exception(theirs, mine, "transition ")


@pytest.mark.parametrize("name", sorted(CASES))
def test_assemble_training_data_ends_as_the_cookbooks(name, route):
    theirs = outcome(ORIGINALS["assemble_training_data"], *batch_with(traj_of(name)))
    expected(name, theirs)
    for module in route():
        mine = outcome(module.assemble_training_data, *batch_with(traj_of(name)))
        if theirs[0] == "ok":
            assert mine[0] == "ok", mine[1]
            assert_same_assembly(theirs[1], mine[1])
        else:
            # One note, from the outer call (the cookbook's assemble_training_data
            # calls the trajectory_to_data its module holds: the cookbook's own then).
            assert_same_exception(theirs, mine, "group 1, trajectory 1, transition ")


@pytest.mark.parametrize("advantage", [1, True, np.float32(0.5), torch.tensor(0.25)], ids=["int", "bool", "float32", "tensor"])
def test_trajectory_to_data_with_an_advantage_that_is_not_a_float_is_the_cookbooks(advantage):
    # With an int, the cookbook's advantages are int64 (ours made float32 before).
    traj = Trajectory(transitions=[step(ob(text(1, 5)), [2, 3])], final_ob=ob())
    theirs = outcome(cookbook.trajectory_to_data, traj, advantage)
    mine = outcome(ours.trajectory_to_data, traj, advantage)
    assert theirs[0] == "ok", theirs[1]
    assert_same_datums(theirs[1], mine[1])


@pytest.mark.parametrize("name", ["compute_advantages", "remove_constant_reward_groups"])
def test_a_group_without_get_total_rewards_is_the_cookbooks_attribute_error(name):
    # Ours sums a duck-typed group's rewards only where tinker_cookbook is not importable.
    group = NS(trajectories_G=[Trajectory(transitions=[], final_ob=ob())], final_rewards_G=[1.0])
    theirs = outcome(getattr(cookbook, name), [group])
    mine = outcome(getattr(ours, name), [group])
    assert theirs[0] == mine[0] == "raised"
    assert type(mine[1]) is type(theirs[1]) is AttributeError
    assert (str(mine[1]), mine[1].args) == (str(theirs[1]), theirs[1].args)


def test_the_note_says_where_and_what():
    mine = outcome(ours.trajectory_to_data, traj_of("ob_none"), 0.5)
    assert type(mine[1]) is AttributeError
    assert mine[1].__notes__ == ["transition 0: NoneType object has no attribute 'chunks'"]
    mine = outcome(ours.assemble_training_data, *batch_with(traj_of("token_2_64")))
    assert mine[1].__notes__ == [
        "group 1, trajectory 1, transition 0: token 18446744073709551616 is outside 0..2147483647 (ac.tokens[1])"
    ]


def test_a_length_mismatch_is_safezips_value_error_with_where_as_a_note():
    groups, advantages = batch_with(traj_of("one_token"))
    for short in ([advantages[0], advantages[1][:1]], advantages[:1]):
        theirs = outcome(cookbook.assemble_training_data, groups, short)
        mine = outcome(ours.assemble_training_data, groups, short)
        where = "group 1: " if len(short) == 2 else ""
        assert_same_exception(theirs, mine, where)
        assert str(mine[1]).startswith("zip() argument 2 is shorter than argument 1")


def test_one_shot_iterators_are_not_read_twice():
    # The cookbook's function could not read them again: ours raises its own.
    groups, advantages = batch_with(traj_of("ob_none"))
    with pytest.raises(TypeError, match=r"^group 1, trajectory 1, transition 0: NoneType object has no attribute 'chunks'"):
        ours.assemble_training_data(iter(groups), advantages)
    groups, advantages = batch_with(traj_of("one_token"))
    with pytest.raises(DataValidationError, match=r"^group 1, trajectory 1, transition 0: need at least 2"):
        ours.assemble_training_data(groups, [advantages[0], iter([0.25, -0.25])])


def timed(f):
    """A user's decorator (functools.wraps), as a timing wrapper is."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


WRAPPERS = {
    "decorator": timed,
    "partial": functools.partial,
    "mock": lambda f: mock.Mock(wraps=f),
    "side_effect": lambda f: mock.MagicMock(side_effect=f),
}


@pytest.mark.parametrize("wrap", sorted(WRAPPERS))
@pytest.mark.parametrize("name", ["token_2_31", "one_token", "ob_none"])
@pytest.mark.parametrize("held", ["trajectory_to_data", "assemble_training_data"])
def test_a_wrapper_around_ours_in_the_cookbooks_module_gets_the_cookbooks_outcome(held, name, wrap, route):
    # The cookbook's module holds a user's wrapper around ours (issue 53): a
    # refused input gets the cookbook's outcome, not a RecursionError.
    calls = {
        "trajectory_to_data": lambda f: outcome(f, traj_of(name), 0.5),
        "assemble_training_data": lambda f: outcome(f, *batch_with(traj_of(name))),
    }
    theirs = {function: call(ORIGINALS[function]) for function, call in calls.items()}
    for module in route():
        with mock.patch.object(cookbook, held, WRAPPERS[wrap](getattr(module, held))):
            mine = [(held, calls[held](getattr(cookbook, held)))]  # the wrapper, as the cookbook's users call it
            mine += [(function, call(getattr(ours, function))) for function, call in calls.items()]
        for function, result in mine:
            check_same(function, theirs[function], result)


def check_same(function, theirs, mine):
    """Ours ends as the cookbook's ``function`` did: the same Datums, or its
    exception with our note (of the outer call, or of a wrapped
    trajectory_to_data that the cookbook's own assemble_training_data called)."""
    if theirs[0] == "raised":
        assert_same_exception(theirs, mine, ("group 1, trajectory 1, transition ", "transition "))
        return
    assert mine[0] == "ok", repr(mine[1])
    (assert_same_datums if function == "trajectory_to_data" else assert_same_assembly)(theirs[1], mine[1])


def one_shot(where, tokens):
    """A trajectory whose transitions, or whose observation's chunks, are a
    generator (model_construct keeps what it is given), made anew each call."""
    chunks = [text(1)]
    observation = tinker.ModelInput.model_construct(chunks=(c for c in chunks)) if where == "chunks" else ob(*chunks)
    transitions = [step(observation, tokens)]
    traj = Trajectory.__new__(Trajectory)
    object.__setattr__(traj, "__dict__", {"transitions": transitions, "final_ob": ob()})
    if where == "transitions":
        traj.__dict__["transitions"] = (t for t in transitions)
    return traj


def one_shot_group(where, tokens):
    good = Trajectory(transitions=[step(ob(text(1, 5)), [2, 3])], final_ob=ob())
    trajectories = [good, one_shot(where if where != "trajectories_G" else "", tokens)]
    group = TrajectoryGroup(trajectories_G=trajectories, final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    if where == "trajectories_G":
        group.__dict__["trajectories_G"] = (t for t in trajectories)
    return [group], [[0.5, -0.5]]


@pytest.mark.parametrize("where", ["transitions", "chunks", "trajectories_G"])
def test_a_nested_one_shot_iterator_is_never_read_twice(where, route):
    # Read natively: the cookbook's Datums. Refused (a token the cookbook
    # takes, tinker's encoder later refuses): ours raises its own located
    # error with a note, never the cookbook's function on an exhausted
    # iterator (0 Datums on effe2b1).
    functions = {
        "trajectory_to_data": lambda f, tokens: f(one_shot(where, tokens), 0.5),
        "assemble_training_data": lambda f, tokens: f(*one_shot_group(where, tokens)),
    }
    if where == "trajectories_G":
        del functions["trajectory_to_data"]
    theirs = {name: outcome(call, ORIGINALS[name], [2, 3]) for name, call in functions.items()}
    refused_theirs = {name: outcome(call, ORIGINALS[name], [2, 2**31]) for name, call in functions.items()}
    assert all(r[0] == "ok" and len(r[1]) for r in [*theirs.values(), *refused_theirs.values()])
    for module in route():
        for name, call in functions.items():
            mine = outcome(call, getattr(module, name), [2, 3])
            assert mine[0] == "ok", mine[1]
            (assert_same_assembly if name == "assemble_training_data" else assert_same_datums)(theirs[name][1], mine[1])
            refused = outcome(call, getattr(module, name), [2, 2**31])
            assert refused[0] == "raised", f"{name} returned {refused[1]!r}"
            assert type(refused[1]) is ValueError
            assert "token 2147483648 is outside 0..2147483647" in str(refused[1])
            assert any("one-shot iterator" in note for note in refused[1].__notes__)


@pytest.mark.parametrize("tokens", [[2, 3], [2, 2**31]], ids=["tokens", "a token 2**31"])
def test_action_tokens_in_a_generator_are_the_cookbooks_type_error(tokens, route):
    # The cookbook takes their length: any iterator fails there, whatever it
    # holds; ours leaves it to the cookbook unread (before: Datums, or our
    # ValueError for 2**31).
    def traj():
        ac = TokensWithLogprobs(tokens=[0], maybe_logprobs=[-0.5] * len(tokens), sequence_id="s")
        object.__setattr__(ac, "tokens", (t for t in tokens))
        return Trajectory(transitions=[acted(ob(text(1)), ac)], final_ob=ob())

    theirs = outcome(ORIGINALS["trajectory_to_data"], traj(), 0.5)
    assert theirs[0] == "raised" and type(theirs[1]) is TypeError, theirs
    for module in route():
        mine = outcome(module.trajectory_to_data, traj(), 0.5)
        assert mine[0] == "raised" and type(mine[1]) is TypeError, mine
        assert str(mine[1]) == str(theirs[1])


def test_an_input_the_cookbook_reads_otherwise_in_a_one_shot_iterator_is_a_type_error(route):
    theirs = outcome(ORIGINALS["trajectory_to_data"], one_shot("transitions", [2, np.int64(3)]), 0.5)
    assert theirs[0] == "raised"
    for module in route():
        mine = outcome(module.trajectory_to_data, one_shot("transitions", [2, np.int64(3)]), 0.5)
        assert mine[0] == "raised" and type(mine[1]) is TypeError, mine[1]
        assert str(mine[1]).startswith("group 0, trajectory 0, transition 0: ac.tokens[1] is not an int")
        assert any("one-shot iterator" in note for note in mine[1].__notes__)


def test_inputs_are_not_modified():
    traj = traj_of("tuple_logprobs")
    before = [(t.ob, t.ac.tokens, t.ac.maybe_logprobs, t.ac.sequence_id) for t in traj.transitions]
    outcome(ours.trajectory_to_data, traj, 0.5)
    assert [(t.ob, t.ac.tokens, t.ac.maybe_logprobs, t.ac.sequence_id) for t in traj.transitions] == before


def run_python(code, *flags):
    result = subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


LOGPROBS_TOO_LONG = """
import sys
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl import data_processing as cookbook
from tinker_cookbook.rl.types import Trajectory, Transition
from tinker_rl_data import cookbook as ours

ob = tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=[1])])
ac = TokensWithLogprobs(tokens=[2, 3], maybe_logprobs=[-1.0, -2.0, -3.0], sequence_id="s")
traj = Trajectory(transitions=[Transition(ob=ob, ac=ac, reward=0.0, episode_done=False)], final_ob=ob)

def outcome(f):
    try:
        return "ok", [repr(d) for d in f(traj, 0.5)]
    except Exception as e:
        return "raised", (type(e), str(e), e.args)

theirs = outcome(cookbook.trajectory_to_data)
mine = outcome(ours.trajectory_to_data)
ours.install()
installed = outcome(cookbook.trajectory_to_data)
print(sys.flags.optimize, theirs[0])
assert mine == theirs == installed, (theirs, mine, installed)
"""


def test_under_python_O_the_cookbooks_assert_vanishes_and_ours_too():
    assert run_python(LOGPROBS_TOO_LONG, "-O").split() == ["1", "ok"]
    assert run_python(LOGPROBS_TOO_LONG).split() == ["0", "raised"]


def test_without_tinker_cookbook_ours_keeps_its_own_exceptions():
    code = """
    import sys
    sys.modules["tinker_cookbook"] = None
    from types import SimpleNamespace as NS
    import tinker
    import tinker_rl_data.cookbook as c

    def traj(ob, tokens, logprobs=None, **ac):
        ac = NS(tokens=tokens, logprobs=logprobs or [-0.5] * len(tokens), **ac)
        return NS(transitions=[NS(ob=ob, ac=ac, metrics={})])

    ob = tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=[1])])
    for bad, kind, message in [
        (traj(None, [2], sequence_id="s"), TypeError, "group 0, trajectory 0, transition 0: NoneType object has no"),
        (traj(ob, [2, 2**31], sequence_id="s"), ValueError, "group 0, trajectory 0, transition 0: token 2147483648 is"),
        (traj(ob, [2, 3.0], sequence_id="s"), TypeError, "group 0, trajectory 0, transition 0: token 3.0"),
        (traj(ob, [], sequence_id="s"), c.DataValidationError, "transition 0: need at least 2 tokens"),
    ]:
        try:
            c.trajectory_to_data(bad, 0.5)
        except kind as e:
            assert str(e).startswith(message) and not getattr(e, "__notes__", None), e
        else:
            raise AssertionError(message)
    # What the cookbook would fail on but the native pass reads, read.
    (d,) = c.trajectory_to_data(traj(ob, [2, 3], (-0.5, -0.25)), 0.5)
    assert d.loss_fn_inputs["logprobs"].tolist() == [-0.5, -0.25]
    (d,) = c.trajectory_to_data(traj(ob, [2, 3]), 0.5)
    assert d.model_input.to_ints() == [1, 2]
    print("ok")
    """
    assert run_python(code).split() == ["ok"]
