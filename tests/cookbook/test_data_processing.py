"""tinker_rl_data.cookbook against the real tinker-cookbook 0.6.1.

Differential: every random batch (built from the cookbook's own types) goes
through the cookbook's rl.data_processing and through ours, and the outcomes
must be the same: equal Datums field by field, identical wire bytes, equal
metadata, the same groups kept, bit-identical advantage tensors, or the
same exception (class, message, args): where the native pass refuses, ours
is the cookbook's own function's outcome (tests/cookbook/test_cookbook_outcome.py).

Needs tinker_cookbook (``bash scripts/install_cookbook.sh``); skipped where it
is absent, except when TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (CI), where its
absence is an error.
"""

from __future__ import annotations

import logging
import sys

import pytest

from conftest import cookbook_unavailable
from support.tinker_bytes import wire_bytes

try:
    import tinker_cookbook
    import torch
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl import data_processing as cookbook
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition
except ImportError as exc:
    cookbook_unavailable(exc)

import tinker
from hypothesis import event, given
from hypothesis import strategies as st
from tinker.types import ImageChunk

from support.cookbook_strategies import batches, rewards, trajectory
from tinker_rl_data import InstallWarning
from tinker_rl_data.patch.report import TESTED_VERSIONS
from tinker_rl_data import cookbook as ours

# The implementation under test, read at call time (so a harness check can
# put another one here).
IMPL = ours


# --------------------------------------------------------------------------
# Outcomes and their comparison


def outcome(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:
        return "raised", exc


def describe(result):
    """Hypothesis events (``--hypothesis-show-statistics``): what the batches exercised."""
    kind, value = result
    if kind == "raised":
        event(f"cookbook raised {type(value).__name__}")
        return
    datums = value[0] if isinstance(value, tuple) else value
    event(f"{min(len(datums), 4)}{'+' if len(datums) >= 4 else ''} Datums")
    for d in datums:
        event("some Datum with provenance" if d.model_input_spans is not None else "some Datum without provenance")
        if d.loss_fn_inputs["advantages"].dtype == "int64":
            event("some Datum with int64 advantages")
        if any(not isinstance(c, tinker.EncodedTextChunk) for c in d.model_input.chunks):
            event("some Datum with an image")


def assert_same_outcome(theirs, mine, compare):
    if theirs[0] == "raised":
        assert mine[0] == "raised", f"the cookbook raised {theirs[1]!r}, ours returned {mine[1]!r}"
        assert type(mine[1]) is type(theirs[1]), (
            f"the cookbook raised {type(theirs[1]).__module__}.{type(theirs[1]).__qualname__}: {theirs[1]}; "
            f"ours raised {type(mine[1]).__module__}.{type(mine[1]).__qualname__}: {mine[1]}"
        )
        assert (str(mine[1]), mine[1].args) == (str(theirs[1]), theirs[1].args)
        return
    if mine[0] == "raised":
        raise AssertionError(f"the cookbook returned, ours raised {mine[1]!r}") from mine[1]
    compare(theirs[1], mine[1])


def chunk_fields(chunk):
    if isinstance(chunk, tinker.EncodedTextChunk):
        return (type(chunk), chunk.type, [(type(t), t) for t in chunk.tokens])
    return (type(chunk), chunk.model_dump())


def tensor_fields(td):
    arr = td.to_numpy()
    return (
        type(td),
        td.dtype,
        td.shape,
        td.sparse_crow_indices,
        td.sparse_col_indices,
        arr.dtype.str,
        arr.shape,
        arr.tobytes(),
    )


def span_fields(spans):
    if spans is None:
        return None
    return [(type(s), s.sequence_id, s.offset, s.length) for s in spans]


def datum_fields(d):
    return {
        "type": type(d),
        "model_input_type": type(d.model_input),
        "chunks": [chunk_fields(c) for c in d.model_input.chunks],
        "keys": list(d.loss_fn_inputs),
        "tensors": {k: tensor_fields(v) for k, v in d.loss_fn_inputs.items()},
        "model_input_spans": span_fields(d.model_input_spans),
        "loss_fn_input_spans": span_fields(d.loss_fn_input_spans),
    }


def assert_same_datums(theirs, mine):
    assert type(mine) is type(theirs) is list
    assert len(mine) == len(theirs), f"{len(theirs)} Datums from the cookbook, {len(mine)} from ours"
    for i, (a, b) in enumerate(zip(theirs, mine)):
        assert datum_fields(b) == datum_fields(a), f"Datum {i} differs"
    theirs_wire, mine_wire = outcome(wire_bytes, theirs), outcome(wire_bytes, mine)
    if theirs_wire[0] == "ok" and mine_wire[0] == "ok":
        assert mine_wire[1] == theirs_wire[1], "wire bytes differ"
    else:
        assert_same_outcome(theirs_wire, mine_wire, lambda x, y: None)


def assert_same_assembly(theirs, mine):
    (data_a, meta_a), (data_b, meta_b) = theirs, mine
    assert type(mine) is tuple
    assert_same_datums(data_a, data_b)
    assert type(meta_b) is list
    assert [(type(m), list(m.items())) for m in meta_b] == [(type(m), list(m.items())) for m in meta_a]
    assert all(type(v) is int for m in meta_b for v in m.values())


def assert_same_tensors(theirs, mine):
    assert type(mine) is list and len(mine) == len(theirs)
    for a, b in zip(theirs, mine):
        assert type(b) is type(a)
        assert (b.dtype, tuple(b.shape)) == (a.dtype, tuple(a.shape))
        assert b.numpy().tobytes() == a.numpy().tobytes()


# --------------------------------------------------------------------------
# Advantages given to assemble_training_data


@st.composite
def advantages_for(draw, batch):
    """What a caller passes: the cookbook's own compute_advantages (float32
    tensors), lists of Python floats, or either with a length mismatch
    (outer or in one group)."""
    kind = draw(st.sampled_from(["computed", "computed", "computed", "floats", "floats", "mismatch"]))
    if kind == "floats":
        values = st.one_of(rewards, st.sampled_from([0.0, -0.0, 1e300, -1e-320, 2**60]))
        return [draw(st.lists(values, min_size=len(g.trajectories_G), max_size=len(g.trajectories_G))) for g in batch]
    advantages = cookbook.compute_advantages(batch)
    if kind == "mismatch":
        if not advantages or draw(st.booleans()):
            if advantages and draw(st.booleans()):
                advantages = advantages[:-1]
            else:
                advantages = [*advantages, torch.zeros(1)]
        else:
            g = draw(st.integers(0, len(advantages) - 1))
            t = advantages[g]
            advantages[g] = t[:-1] if len(t) and draw(st.booleans()) else torch.cat([t, torch.zeros(1)])
    return advantages


# --------------------------------------------------------------------------
# Differential properties


@given(st.data())
def test_assemble_training_data_matches_the_cookbook(data):
    batch = data.draw(batches())
    advantages = data.draw(advantages_for(batch))
    include_provenance = data.draw(st.booleans())
    theirs = outcome(cookbook.assemble_training_data, batch, advantages, include_provenance)
    mine = outcome(IMPL.assemble_training_data, batch, advantages, include_provenance)
    describe(theirs)
    assert_same_outcome(theirs, mine, assert_same_assembly)


@given(st.data())
def test_the_public_constructor_path_matches_the_cookbook_too(data):
    # Where tinker's layout is unknown, both front doors build through its
    # public constructors (spans included): the same Datums.
    from tinker_rl_data import rows

    batch = data.draw(batches(max_groups=2))
    advantages = cookbook.compute_advantages(batch)
    include_provenance = data.draw(st.booleans())
    theirs = outcome(cookbook.assemble_training_data, batch, advantages, include_provenance)
    checked = rows.direct_construction
    rows.direct_construction = lambda: "as if tinker's layout were unknown"
    try:
        mine = outcome(IMPL.assemble_training_data, batch, advantages, include_provenance)
    finally:
        rows.direct_construction = checked
    assert_same_outcome(theirs, mine, assert_same_assembly)


@given(st.data())
def test_assemble_training_data_default_provenance_matches(data):
    batch = data.draw(batches(max_groups=2))
    advantages = cookbook.compute_advantages(batch)
    theirs = outcome(cookbook.assemble_training_data, batch, advantages)
    mine = outcome(IMPL.assemble_training_data, batch, advantages)
    assert_same_outcome(theirs, mine, assert_same_assembly)


@given(
    st.tuples(st.sampled_from(["clean", "wild"]), st.sampled_from(["all", "mixed", "none"])).flatmap(
        lambda args: trajectory(args[0], max_transitions=6, with_ids=args[1])
    ),
    st.floats(allow_nan=False),
    st.booleans(),
)
def test_trajectory_to_data_matches_the_cookbook(traj, advantage, include_provenance):
    theirs = outcome(cookbook.trajectory_to_data, traj, advantage, include_provenance=include_provenance)
    mine = outcome(IMPL.trajectory_to_data, traj, advantage, include_provenance=include_provenance)
    describe(theirs)
    assert_same_outcome(theirs, mine, assert_same_datums)


@given(trajectory("faults", max_transitions=6), rewards)
def test_trajectory_to_data_with_faults_matches_the_cookbook(traj, advantage):
    theirs = outcome(cookbook.trajectory_to_data, traj, advantage)
    mine = outcome(IMPL.trajectory_to_data, traj, advantage)
    describe(theirs)
    assert_same_outcome(theirs, mine, assert_same_datums)


def reward_groups():
    """Groups whose rewards are often all equal; int rewards, NaN, empty
    groups, and final rewards one more or one fewer than the trajectories
    now and then."""
    reward = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), rewards, st.integers(-2, 2), st.just(float("nan")))

    @st.composite
    def group(draw):
        n = draw(st.integers(0, 4))
        trajs = [
            Trajectory(
                transitions=[
                    Transition(
                        ob=tinker.ModelInput(chunks=[]),
                        ac=TokensWithLogprobs(tokens=[], maybe_logprobs=[]),
                        reward=draw(reward),
                        episode_done=True,
                    )
                    for _ in range(draw(st.integers(0, 4)))
                ],
                final_ob=tinker.ModelInput(chunks=[]),
            )
            for _ in range(n)
        ]
        m = draw(st.sampled_from([n] * 10 + [n + 1, max(n - 1, 0)]))
        final = draw(st.lists(reward, min_size=m, max_size=m))
        return TrajectoryGroup(trajectories_G=trajs, final_rewards_G=final, metrics_G=[{} for _ in range(n)])

    return st.lists(group(), max_size=4)


@given(reward_groups())
def test_compute_advantages_matches_the_cookbook(groups):
    theirs = outcome(cookbook.compute_advantages, groups)
    mine = outcome(IMPL.compute_advantages, groups)
    assert_same_outcome(theirs, mine, assert_same_tensors)


def test_an_overridden_get_total_rewards_is_called():
    class Scaled(TrajectoryGroup):
        def get_total_rewards(self):
            return [10 * r for r in super().get_total_rewards()]

    traj = Trajectory(transitions=[step(ob(text(1)), [2])], final_ob=ob())
    groups = [Scaled(trajectories_G=[traj, traj], final_rewards_G=[0.25, 1.0], metrics_G=[{}, {}])]
    assert_same_tensors(cookbook.compute_advantages(groups), ours.compute_advantages(groups))
    assert ours.compute_advantages(groups)[0].tolist() == [-3.75, 3.75]


@given(st.one_of(reward_groups(), batches()))
def test_remove_constant_reward_groups_matches_the_cookbook(groups):
    records = {}

    class Capture(logging.Handler):
        def emit(self, record):
            records.setdefault(self.name, []).append((record.name, record.levelno, record.getMessage()))

    logger = logging.getLogger("tinker_cookbook.rl.data_processing")
    handler = Capture()
    logger.addHandler(handler)
    try:
        handler.name = "theirs"
        theirs = outcome(cookbook.remove_constant_reward_groups, groups)
        handler.name = "mine"
        mine = outcome(IMPL.remove_constant_reward_groups, groups)
    finally:
        logger.removeHandler(handler)

    def same_groups(a, b):
        assert type(b) is type(a)
        assert [id(g) for g in b] == [id(g) for g in a]

    assert_same_outcome(theirs, mine, same_groups)
    assert records.get("mine") == records.get("theirs")


# --------------------------------------------------------------------------
# The cookbook behaviours the core must reproduce, one input each


def ob(*chunks):
    return tinker.ModelInput(chunks=list(chunks))


def text(*tokens):
    return tinker.EncodedTextChunk(tokens=list(tokens))


def image(n):
    return ImageChunk(data=b"\x89PNG", format="png", expected_tokens=n)


def step(observation, tokens, logprobs="default", sequence_id="s", metrics=None):
    if logprobs == "default":
        logprobs = [-0.5] * len(tokens)
    return Transition(
        ob=observation,
        ac=TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs, sequence_id=sequence_id),
        reward=0.0,
        episode_done=False,
        metrics=metrics or {},
    )


class DoubledLogprobs(TokensWithLogprobs):
    """A subclass's own reading of its logprobs (the cookbook reads ``.logprobs``)."""

    @property
    def logprobs(self):
        return [2 * x for x in self.maybe_logprobs]


class ZeroLogprobsWhenMissing(TokensWithLogprobs):
    @property
    def logprobs(self):
        return [0.0] * len(self.tokens) if self.maybe_logprobs is None else self.maybe_logprobs


def acted(observation, action):
    return Transition(ob=observation, ac=action, reward=0.0, episode_done=False, metrics={})


CASES = {
    # A Datum whose positions after the first are all observation: int64 advantages, no provenance.
    "all_observation": [step(ob(text(1, 2, 3)), [])],
    # Int logprobs and nothing else after the first position: int64 logprobs.
    "int_logprobs": [step(ob(text(5)), [6, 7], logprobs=[-1, -2])],
    # An empty first observation: the target spans start with SampledProvenanceSpan(offset=1).
    "sampled_first": [step(ob(), [6, 7, 8])],
    "sampled_first_length_1": [step(ob(), [6]), step(ob(text(6, 9)), [8])],
    # Logprobs one too long: AssertionError; compensated within one Datum: values shift, no error.
    "logprobs_too_long": [step(ob(text(5)), [6, 7], logprobs=[-1.0, -2.0, -3.0])],
    "logprobs_compensated": [
        step(ob(text(5)), [6, 7], logprobs=[-1.0, -2.0, -3.0]),
        step(ob(text(5, 6, 7, 9)), [10, 11], logprobs=[-4.0]),
    ],
    # Missing logprobs raise even for an empty action.
    "missing_logprobs_empty_action": [step(ob(text(5, 6)), [], logprobs=None)],
    # The Datum before a reset is built (and may fail) before the next transition's logprobs are read.
    "short_datum_before_missing_logprobs": [step(ob(text(5)), []), step(ob(text(9)), [], logprobs=None)],
    "ends_in_image": [step(ob(text(5, 6), image(2)), [])],
    "image_of_length_0_last_in_input": [step(ob(text(5, 6), image(0)), [1])],
    "image_of_length_0_first": [step(ob(image(0), text(6)), [1])],
    "image_first": [step(ob(image(2), text(5)), [1])],
    "image_of_unknown_length": [step(ob(text(5, 6), ImageChunk(data=b"x", format="png")), [1])],
    "same_image_other_length_resets": [step(ob(image(1), text(5)), [6]), step(ob(image(2), text(5, 6, 7)), [8])],
    "one_token": [step(ob(text(5)), [])],
    "empty_observation_resets": [step(ob(text(5)), [6, 7]), step(ob(), [8, 9])],
    "nothing_at_all": [step(ob(), []), step(ob(), [])],
    "one_token_then_empty": [step(ob(text(1)), []), step(ob(), [])],
    "masked_int": [step(ob(text(5)), [6, 7], metrics={"parse_error_masked": 1})],
    "masked_true_no_observation": [step(ob(), [6, 7], metrics={"parse_error_masked": True})],
    "not_masked_below_1": [step(ob(text(5)), [6, 7], metrics={"parse_error_masked": 0.9999999})],
    "masked_metric_not_a_number": [step(ob(text(5)), [6, 7], metrics={"parse_error_masked": "x"})],
    "no_sequence_id_later": [step(ob(text(5)), [6, 7]), step(ob(text(5, 6, 7, 8)), [9], sequence_id=None)],
    "no_sequence_id_on_an_empty_transition": [step(ob(text(5)), [6, 7]), step(ob(text(5, 6, 7)), [], sequence_id=None)],
    "only_prompt_targets": [step(ob(text(5, 6, 7)), [])],
    "empty_sequence_id": [step(ob(text(5)), [6, 7], sequence_id="")],
    "empty_sequence_id_prompt_only": [step(ob(text(5, 6)), [], sequence_id="")],
    "empty_sequence_id_after_none": [step(ob(text(5)), [6], sequence_id=None), step(ob(text(5, 6)), [7], sequence_id="")],
    # The first chunk repeats the sequence so far (not kept), the second extends it / diverges from it.
    "chunk_repeats_then_extends": [step(ob(text(1, 2)), [3]), step(ob(text(1, 2, 3), text(7, 8)), [9])],
    "chunk_repeats_then_diverges": [step(ob(text(1, 2)), [3]), step(ob(text(1, 2), text(4)), [9])],
    # A zero-width image first: the first action token is position 0, no target.
    "zero_width_image_then_the_first_action": [step(ob(image(0)), [6]), step(ob(image(0), text(6, 7)), [])],
    "chunk_repeats_then_ends_short": [step(ob(text(1, 2)), [3, 4]), step(ob(text(1, 2, 3)), [9])],
    "a_subclasss_own_logprobs": [acted(ob(text(5)), DoubledLogprobs(tokens=[6, 7], maybe_logprobs=[-1.0, -2.0]))],
    "a_subclasss_logprobs_where_none_are_sampled": [
        acted(ob(text(5)), ZeroLogprobsWhenMissing(tokens=[6, 7], maybe_logprobs=None))
    ],
}


@pytest.mark.parametrize("include_provenance", [True, False])
@pytest.mark.parametrize("advantage", [0.5, 1e300, -0.0])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_the_cookbook(name, advantage, include_provenance):
    traj = Trajectory(transitions=CASES[name], final_ob=ob())
    theirs = outcome(cookbook.trajectory_to_data, traj, advantage, include_provenance=include_provenance)
    mine = outcome(IMPL.trajectory_to_data, traj, advantage, include_provenance=include_provenance)
    assert_same_outcome(theirs, mine, assert_same_datums)
    group = TrajectoryGroup(trajectories_G=[traj, traj], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    batch = [group, group]
    advantages = [[advantage, 0.25], torch.tensor([advantage, 0.25])]
    theirs = outcome(cookbook.assemble_training_data, batch, advantages, include_provenance)
    mine = outcome(IMPL.assemble_training_data, batch, advantages, include_provenance)
    assert_same_outcome(theirs, mine, assert_same_assembly)


def test_the_cases_cover_datums_and_errors():
    # The case list is useful only if it holds both successes and each error class.
    classes = set()
    for transitions in CASES.values():
        kind, value = outcome(cookbook.trajectory_to_data, Trajectory(transitions=transitions, final_ob=ob()), 0.5)
        classes.add(type(value).__name__ if kind == "raised" else "ok")
    assert classes == {"ok", "AssertionError", "ValueError", "DataValidationError"}


# --------------------------------------------------------------------------
# Errors: class and location


def test_errors_are_the_cookbooks_own_and_say_where_in_a_note():
    from tinker_cookbook.exceptions import DataValidationError

    ok = Trajectory(transitions=[step(ob(text(1)), [2])], final_ob=ob())
    bad = Trajectory(transitions=[step(ob(text(1)), [2]), step(ob(), [3])], final_ob=ob())
    group = TrajectoryGroup(trajectories_G=[ok, bad], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    with pytest.raises(DataValidationError) as info:
        ours.assemble_training_data([group, group], [[0.0, 1.0], [0.0, 1.0]])
    assert type(info.value) is DataValidationError  # the cookbook's own
    assert str(info.value) == "need at least 2 tokens for input/target split"
    assert info.value.__notes__ == ["group 0, trajectory 1, transition 1: need at least 2 tokens for input/target split"]
    assert issubclass(ours.DataValidationError, DataValidationError)  # ours, where the cookbook is not to be had


def test_advantage_mismatch_is_safezips_value_error_with_where_in_a_note():
    traj = Trajectory(transitions=[step(ob(text(1)), [2])], final_ob=ob())
    group = TrajectoryGroup(trajectories_G=[traj, traj], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    with pytest.raises(ValueError) as info:
        ours.assemble_training_data([group, group], [[0.0, 1.0], [0.0]])
    assert str(info.value) == "zip() argument 2 is shorter than argument 1"
    assert info.value.__notes__ == [
        "group 1: the trajectories and their advantages differ in length (zip() argument 2 is shorter than argument 1)"
    ]
    with pytest.raises(ValueError) as info:
        ours.assemble_training_data([group], [[0.0, 1.0], [0.0, 1.0]])
    assert str(info.value) == "zip() argument 2 is longer than argument 1"


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-enabled", "gc-disabled"])
def test_the_gc_state_is_left_as_it_was(enabled):
    import gc

    traj = Trajectory(transitions=[step(ob(text(1)), [2])], final_ob=ob())
    group = TrajectoryGroup(trajectories_G=[traj, traj], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    calls = [
        lambda: ours.assemble_training_data([group], [[0.0, 1.0]]),
        lambda: ours.assemble_training_data([group], [[0.0]]),  # a length mismatch
        lambda: ours.trajectory_to_data(traj, 0.5),
    ]
    was = gc.isenabled()
    try:
        for call in calls:
            gc.enable() if enabled else gc.disable()
            outcome(call)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_the_young_collection_due_runs_after_the_call_not_inside_it():
    from conftest import young_collections

    transitions = [step(ob(text(*range(u * 8, u * 8 + 6))), [7, 8]) for u in range(4)]
    group = TrajectoryGroup(
        trajectories_G=[Trajectory(transitions=transitions, final_ob=ob())] * 64,
        final_rewards_G=[0.0] * 64,
        metrics_G=[{}] * 64,
    )
    assert young_collections(lambda: ours.assemble_training_data([group] * 4, [[0.5] * 64] * 4)) == (0, 1)
    assert young_collections(lambda: ours.trajectory_to_data(Trajectory(transitions * 200, final_ob=ob()), 0.5)) == (0, 1)


@pytest.mark.parametrize("rows", [1, 2], ids=["one-datum", "two-datums"])
def test_text_chunks_are_lists_of_their_own(rows):
    """The chunks share the caller's ints, never its lists: changing the
    caller's token lists afterwards changes no Datum, and the reverse."""
    transitions = [step(ob(text(1, 2, 3)), [4, 5, 6])]
    if rows == 2:  # a second observation that does not extend the first
        transitions.append(step(ob(text(9, 8)), [7, 7]))
    callers = [l for tr in transitions for l in (tr.ob.chunks[0].tokens, tr.ac.tokens)]  # the lists read
    datums = ours.trajectory_to_data(Trajectory(transitions=transitions, final_ob=ob()), 0.5)
    assert len(datums) == rows
    tokens = [c.tokens for d in datums for c in d.model_input.chunks]
    before = [list(t) for t in tokens]
    assert before[0] == [1, 2, 3, 4, 5]
    ids = {id(t) for t in tokens} | {id(t) for t in callers}
    assert len(ids) == len(tokens) + len(callers)  # no list shared, between Datums or with the caller
    for t in callers:
        t[:] = [0]
    assert [list(t) for t in tokens] == before
    for t in tokens:
        t.append(42)
    assert all(t == [0] for t in callers)


def test_spans_are_untracked_only_when_their_sequence_id_is_an_atom():
    import gc

    class Id(str):  # a str subclass instance: a GC-tracked object
        pass

    for sequence_id, tracked in (("seq", False), (Id("seq"), True)):
        traj = Trajectory(transitions=[step(ob(text(1, 5)), [2, 3], sequence_id=sequence_id)], final_ob=ob())
        (datum,) = ours.trajectory_to_data(traj, 0.5)
        spans = [*datum.model_input_spans, *datum.loss_fn_input_spans]
        assert spans and all(gc.is_tracked(span) is tracked for span in spans)
        assert gc.is_tracked(datum) and gc.is_tracked(datum.model_input_spans)


def test_advantages_paired_at_once_or_one_by_one_give_the_same_datums():
    """Exact floats in a list are paired with the trajectories at once;
    anything else (ints, a generator) one by one, with float() each."""
    traj = Trajectory(transitions=[step(ob(text(1, 5)), [2, 3])], final_ob=ob())
    group = TrajectoryGroup(trajectories_G=[traj, traj], final_rewards_G=[0.0, 1.0], metrics_G=[{}, {}])
    at_once = ours.assemble_training_data([group], [[-2.0, 1.0]])
    for advantages in ([(-2, 1.0)], [iter([-2.0, 1.0])], [[-2.0, True]]):
        one_by_one = ours.assemble_training_data([group], advantages)
        assert wire_bytes(one_by_one[0]) == wire_bytes(at_once[0])
        assert one_by_one[1] == at_once[1] == [{"group_idx": 0, "traj_idx": t} for t in range(2)]


# --------------------------------------------------------------------------
# install / uninstall


TRAINERS = [
    "tinker_cookbook.rl.data_processing",
    "tinker_cookbook.rl.train",
    "tinker_cookbook.distillation.train_on_policy",
    "tinker_cookbook.distillation.sdft",
]
NAMES = ["compute_advantages", "assemble_training_data", "trajectory_to_data", "remove_constant_reward_groups"]


@pytest.fixture
def trainers():
    import importlib

    modules = [importlib.import_module(name) for name in TRAINERS]
    originals = {name: getattr(cookbook, name) for name in NAMES}
    yield modules, originals
    ours.uninstall()
    assert all(getattr(cookbook, name) is originals[name] for name in NAMES)


def held(module):
    return {name: getattr(module, name) for name in NAMES if hasattr(module, name)}


def installed_ours(name):
    """What install() put in the cookbook's module for ``name``: ours (the
    functions with a native pass are made around the original they fall
    back to, so they are not the module-level ones)."""
    function = getattr(cookbook, name)
    assert function.__module__ == "tinker_rl_data.cookbook.data_processing", function
    assert function.__name__ == name
    if name in ("compute_advantages", "remove_constant_reward_groups"):
        assert function is getattr(ours, name)
    return function


def test_install_replaces_the_names_everywhere_and_uninstall_restores_them(trainers):
    modules, originals = trainers
    before = {m.__name__: held(m) for m in modules}
    assert all(f is originals[n] for h in before.values() for n, f in h.items())
    assert set(before["tinker_cookbook.rl.train"]) >= {"assemble_training_data", "compute_advantages"}

    ours.install()
    for m in modules:
        for name in before[m.__name__]:
            assert getattr(m, name) is installed_ours(name), f"{m.__name__}.{name}"
    ours.install()  # again: harmless
    assert cookbook.compute_advantages is ours.compute_advantages
    assert all(getattr(cookbook, name) is installed_ours(name) for name in NAMES)

    ours.uninstall()
    assert {m.__name__: held(m) for m in modules} == before
    for m in modules:
        for name, f in before[m.__name__].items():
            assert getattr(m, name) is f
    ours.uninstall()  # again: harmless
    assert {m.__name__: held(m) for m in modules} == before


def test_install_reaches_a_module_that_imported_the_names_under_another_name(trainers):
    import types

    module = types.ModuleType("tinker_cookbook._test_alias")
    module.advantages_fn = cookbook.compute_advantages
    sys.modules[module.__name__] = module
    try:
        ours.install()
        assert module.advantages_fn is ours.compute_advantages
        # A module imported after install takes ours from rl.data_processing.
        late = types.ModuleType("tinker_cookbook._test_late")
        late.assemble_training_data = cookbook.assemble_training_data
        sys.modules[late.__name__] = late
        assert late.assemble_training_data is installed_ours("assemble_training_data")
        ours.uninstall()
        assert module.advantages_fn is trainers[1]["compute_advantages"]
        assert late.assemble_training_data is trainers[1]["assemble_training_data"]
    finally:
        sys.modules.pop("tinker_cookbook._test_alias", None)
        sys.modules.pop("tinker_cookbook._test_late", None)


def test_an_untested_version_installs_with_one_warning(trainers, monkeypatch):
    assert tinker_cookbook.__version__ in TESTED_VERSIONS["tinker_cookbook"]
    monkeypatch.setattr(tinker_cookbook, "__version__", "0.7.0")
    with pytest.warns(InstallWarning, match=r"tinker-cookbook 0\.7\.0 is not a version the tests ran against") as caught:
        ours.install()
    assert len(caught) == 1
    assert cookbook.trajectory_to_data is installed_ours("trajectory_to_data")
    ours.uninstall()


def test_the_module_imports_neither_torch_nor_tinker_cookbook():
    import subprocess

    # With both made unimportable, the module still imports and its
    # torch-free functions work on duck-typed groups.
    code = """
import sys
sys.modules["torch"] = None
sys.modules["tinker_cookbook"] = None
from types import SimpleNamespace as NS
import tinker_rl_data.cookbook as c
groups = [NS(trajectories_G=[NS(transitions=[NS(reward=r)])], final_rewards_G=[0.0]) for r in (1.0, 2.0)]
assert c.remove_constant_reward_groups(groups) == groups[:1]
assert c.DataValidationError.__mro__[1:] == (ValueError, Exception, BaseException, object)
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_input_is_what_was_read_when_user_code_changes_the_tokens_after():
    """Text chunks share the caller's ints only where those are still the
    values read: here transition 1's ``metrics.get`` rewrites transition 0's
    observation and action tokens (same length) after they were read."""
    first_ob, first_ac = [1, 2, 3], [4, 5]
    second_ob = first_ob + first_ac + [6]

    class Rewriting(dict):
        def get(self, key, default=None):
            chunk = transitions[0].ob.chunks[0]
            chunk.tokens[:] = [100 + t for t in chunk.tokens]
            transitions[0].ac.tokens[:] = [200 + t for t in transitions[0].ac.tokens]
            return super().get(key, default)

    transitions = [step(ob(text(*first_ob)), list(first_ac)), step(ob(text(*second_ob)), [7, 8])]
    transitions[1] = transitions[1].__class__(**{**transitions[1].__dict__, "metrics": Rewriting()})
    traj = Trajectory(transitions=transitions, final_ob=ob())
    group = TrajectoryGroup(trajectories_G=[traj], final_rewards_G=[1.0], metrics_G=[{}])
    (datum,), _ = ours.assemble_training_data([group], [[0.5]])
    sequence = second_ob + [7, 8]
    assert datum.model_input.to_ints() == sequence[:-1]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == sequence[1:]
    assert transitions[0].ac.tokens == [204, 205]  # the rewrite did run
