"""The rest of tinker-cookbook's RL step (tinker_rl_data.cookbook.step,
re-exported by tinker_rl_data.cookbook) against the real tinker-cookbook 0.6.1.

Differential: random inputs go through the cookbook's own functions
(compute_kl_sample_train, compute_trajectory_metrics, _remove_mask,
rollout_usage, training_usage, captured before any install) and through
ours; the outcomes must be the same: an exception of the same class, or
equal results (keys, order and integers identical, floats within float32
rounding of the values averaged). The native pass is also called directly,
so that a fallback to the cookbook's function cannot hide a wrong native
result, and the inputs the trainer makes must take it.

Needs tinker_cookbook (``bash scripts/install_cookbook.sh``); skipped where it
is absent, except when TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (CI).
"""

from __future__ import annotations

import asyncio
import gc
import math

import numpy as np
import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook
    import torch
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl import data_processing as cookbook_data
    from tinker_cookbook.rl import metric_util, metrics, train
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition
    from tinker_cookbook.utils.cost_estimation import TokenUsage
except ImportError as exc:
    cookbook_unavailable(exc)

import tinker
from hypothesis import event as hypothesis_event
from hypothesis import given
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st
from tinker.types import ImageChunk

from support.cookbook_strategies import batches
from support.tinker_bytes import wire_bytes
from tinker_rl_data import InstallWarning, _core, rows
from tinker_rl_data.cookbook import step as _step
from tinker_rl_data import cookbook as ours

# The cookbook's own functions, the reference (an install elsewhere cannot
# swap them: they are read here, at import, and checked to be the cookbook's).
COOKBOOK = {
    "compute_kl_sample_train": metrics.compute_kl_sample_train,
    "compute_trajectory_metrics": metric_util.compute_trajectory_metrics,
    "_remove_mask": train._remove_mask,
    "rollout_usage": train.rollout_usage,
    "training_usage": train.training_usage,
}
assert all(f.__module__.startswith("tinker_cookbook.") for f in COOKBOOK.values())


def event(what: str) -> None:
    """A hypothesis event (``--hypothesis-show-statistics``), when in a property."""
    if currently_in_test_context():
        hypothesis_event(what)


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return "raised", exc


def assert_same_outcome(theirs, mine, compare):
    if theirs[0] == "raised":
        assert mine[0] == "raised", f"the cookbook raised {theirs[1]!r}, ours returned {mine[1]!r}"
        assert isinstance(mine[1], type(theirs[1])), f"the cookbook raised {theirs[1]!r}, ours {mine[1]!r}"
        return
    if mine[0] == "raised":
        raise AssertionError(f"the cookbook returned, ours raised {mine[1]!r}") from mine[1]
    compare(theirs[1], mine[1])


# Below this float32 has fewer digits than 24 bits (subnormals).
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def close(ours_value: float, theirs: float, scale: float) -> bool:
    """Equal within float32 rounding of values of magnitude ``scale`` (the
    mean magnitude of what was averaged: an average whose terms cancel is
    exact only to their size, not to its own)."""
    if math.isnan(theirs) or math.isinf(theirs):
        return ours_value == theirs or (math.isnan(theirs) and math.isnan(ours_value))
    return math.isclose(ours_value, theirs, rel_tol=1e-5, abs_tol=1e-5 * scale + FLOAT32_TINY)


# --------------------------------------------------------------------------
# compute_kl_sample_train

logprob_values = st.one_of(st.floats(-30.0, 0.0, width=32), st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, -0.0]))
mask_values = st.one_of(st.sampled_from([0.0, 1.0]), st.sampled_from([0.0, 1.0, 0.5, -1.0, 2.0, float("nan")]))


@st.composite
def kl_inputs(draw, clean: bool = False):
    """Datums with ``logprobs`` and ``mask`` (float32 TensorData, as the
    cookbook's Datums hold them) and training logprobs as the trainer gets
    them (float32 CPU torch tensors). Unless ``clean``, also what only the
    cookbook's function takes or rejects: int64 tensors, no mask, lengths
    that differ, float64, bfloat16, grad-requiring, strided or numpy
    training tensors, a tuple or generator of tensors."""
    data, training, expected = [], [], []
    for _ in range(draw(st.integers(0 if not clean else 1, 5))):
        n = draw(st.integers(1 if clean else 0, 12))
        logprobs = np.array(draw(st.lists(logprob_values, min_size=n, max_size=n)), dtype=np.float32)
        mask = np.array(draw(st.lists(mask_values, min_size=n, max_size=n)), dtype=np.float32)
        if clean and n:
            mask[draw(st.integers(0, n - 1))] = 1.0
        learned = logprobs + np.array(draw(st.lists(st.floats(-1, 1, width=32), min_size=n, max_size=n)), np.float32)
        inputs = {"target_tokens": tinker.TensorData.from_numpy(np.zeros(n, np.int64))}
        kind = "clean" if clean else draw(st.sampled_from(["clean"] * 8 + ["int_logprobs", "int_mask", "no_mask", "no_logprobs"]))
        inputs["logprobs"] = tinker.TensorData.from_numpy(logprobs.round().astype(np.int64) if kind == "int_logprobs" else logprobs)
        if kind != "no_mask":
            inputs["mask"] = tinker.TensorData.from_numpy((mask > 0).astype(np.int64) if kind == "int_mask" else mask)
        if kind == "no_logprobs":
            del inputs["logprobs"]
        data.append(tinker.Datum(model_input=tinker.ModelInput.from_ints([0] * n), loss_fn_inputs=inputs))
        tensor = torch.from_numpy(learned)
        if not clean:
            change = draw(st.sampled_from(["none"] * 8 + ["f64", "bf16", "grad", "strided", "numpy", "longer", "shorter"]))
            if change == "f64":
                tensor = tensor.double()
            elif change == "bf16":
                tensor = tensor.bfloat16()
            elif change == "grad":
                tensor = tensor.clone().requires_grad_(True)
            elif change == "strided":
                tensor = torch.stack([tensor, tensor], dim=1)[:, 0]
            elif change == "numpy":
                tensor = learned
            elif change == "longer":
                tensor = torch.cat([tensor, torch.zeros(1)])
            elif change == "shorter" and n:
                tensor = tensor[:-1]
            event(f"kl input: {kind} datum, {change} training tensor")
        training.append(tensor)
    container = "list"
    if not clean:
        container = draw(st.sampled_from(["list"] * 6 + ["tuple", "generator", "one more tensor", "one fewer tensor"]))
        if container == "one more tensor":
            training.append(torch.zeros(3))
        elif container == "one fewer tensor":
            training = training[:-1]
        event(f"kl input: training logprobs as a {container}")
    return data, training, container


def given_as(tensors, container):
    """The training tensors in the container drawn (made anew per call: a
    generator is consumed)."""
    if container == "tuple":
        return tuple(tensors)
    if container == "generator":
        return (t for t in tensors)
    return list(tensors)


def kl_scales(data, training) -> dict[str, float]:
    """The mean magnitude of what each metric averages (float64, plain numpy)."""
    diffs, sampled = [], []
    for d, t in zip(data, training):
        s = d.loss_fn_inputs["logprobs"].to_numpy().astype(np.float64)
        on = d.loss_fn_inputs["mask"].to_numpy() > 0
        t = t.detach().float().numpy() if isinstance(t, torch.Tensor) else t
        diffs.append(s[on] - np.asarray(t, np.float64)[on])
        sampled.append(s[on])
    d, s = np.concatenate(diffs), np.concatenate(sampled)
    return {
        "optim/kl_sample_train_v1": float(np.mean(np.abs(d))),
        "optim/kl_sample_train_v2": float(0.5 * np.mean(d**2)),
        "optim/entropy": float(np.mean(np.abs(s))),
    }


def assert_same_kl(theirs, mine, scales):
    assert list(mine) == list(theirs)
    for key, value in theirs.items():
        assert type(mine[key]) is float
        assert close(mine[key], value, scales[key]), (key, mine[key], value)


def native_kl(data, training):
    return _core.kl_sample_train(data, training, direct=True, torch_tensor=torch.Tensor)


@given(kl_inputs())
def test_kl_sample_train_matches_the_cookbook(inputs):
    data, training, container = inputs
    theirs = outcome(COOKBOOK["compute_kl_sample_train"], data, given_as(training, container))
    mine = outcome(ours.compute_kl_sample_train, data, given_as(training, container))
    event(f"the cookbook {'raised ' + type(theirs[1]).__name__ if theirs[0] == 'raised' else 'returned'}")
    assert_same_outcome(theirs, mine, lambda a, b: assert_same_kl(a, b, kl_scales(data, training)))
    native = outcome(native_kl, data, given_as(training, container))
    if native[0] == "ok":  # checked on its own: a fallback must not hide a wrong native result
        assert theirs[0] == "ok", f"the cookbook raised {theirs[1]!r}, the native pass returned"
        assert_same_kl(theirs[1], dict(zip(theirs[1], native[1])), kl_scales(data, training))
    else:
        assert isinstance(native[1], _core.Unsupported), native[1]
    event("native" if native[0] == "ok" else "left to the cookbook")


@given(kl_inputs(clean=True))
def test_kl_of_the_trainers_inputs_is_native_and_matches(inputs):
    data, training, _ = inputs
    theirs = COOKBOOK["compute_kl_sample_train"](data, training)
    native = dict(zip(theirs, native_kl(data, training)))  # raises Unsupported should it not take them
    assert_same_kl(theirs, native, kl_scales(data, training))
    assert ours.compute_kl_sample_train(data, training) == native


# --------------------------------------------------------------------------
# compute_trajectory_metrics, rollout_usage


METRIC_KEYS = ["format", "correct", "x", "total_turns", "reward/total", "by_group/frac_mixed", "ac_tokens_per_turn"]
TAGS = ["math", "code", "all", "a/b", *[f"t{i}" for i in range(8)]]


def metric_values(wild: bool):
    plain = st.one_of(
        st.floats(-1e3, 1e3),
        st.integers(-5, 5),
        st.booleans(),
        st.none(),
        st.floats(-1e3, 1e3, width=32).map(np.float32),
        st.integers(-5, 5).map(np.int64),
    )
    odd = st.one_of(st.sampled_from([float("nan"), float("inf"), "text", 2**70]), st.just(np.float64(0.5)))
    return st.one_of(plain, plain, plain, odd) if wild else plain


def rewards(wild: bool):
    plain = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0, 0.1, 0.2, 0.7]), st.floats(-10, 10), st.integers(-3, 3))
    odd = st.sampled_from([float("nan"), float("inf"), True, 2**60, np.float32(0.5)])
    return st.one_of(plain, plain, plain, odd) if wild else plain


@st.composite
def observations(draw, wild: bool):
    chunks = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 3)) == 0:
            expected = draw(st.one_of(st.integers(0, 4), st.none()) if wild else st.integers(0, 4))
            chunks.append(ImageChunk(data=b"\x89PNG", format="png", expected_tokens=expected))
        else:
            chunks.append(tinker.EncodedTextChunk(tokens=draw(st.lists(st.integers(0, 9), max_size=6))))
    return tinker.ModelInput(chunks=chunks)


@st.composite
def transitions(draw, wild: bool):
    cached = draw(st.one_of(st.integers(0, 9), st.sampled_from([True, 1.5, 2**40])) if wild else st.integers(0, 9))
    ac = TokensWithLogprobs(
        tokens=draw(st.lists(st.integers(0, 9), max_size=6)), maybe_logprobs=None, prompt_cache_hit_tokens=cached
    )
    metrics = draw(st.dictionaries(st.sampled_from(METRIC_KEYS), metric_values(wild), max_size=3))
    return Transition(ob=draw(observations(wild)), ac=ac, reward=draw(rewards(wild)), episode_done=False, metrics=metrics)


class ScaledRewards(TrajectoryGroup):
    """A group class of a user's: its own get_total_rewards."""

    def get_total_rewards(self):
        return [2 * r for r in super().get_total_rewards()]


@st.composite
def step_groups(draw, wild: bool = False):
    """A step's trajectory groups (cookbook types). ``wild``: also empty
    groups, mismatched final rewards, NaN/inf/bool/huge rewards and metric
    values, string metrics, images of unknown size, odd cache counts, a
    user's get_total_rewards."""
    groups = []
    for _ in range(draw(st.integers(0 if wild else 1, 5))):
        n = draw(st.integers(0 if wild else 1, 4))
        trajectories = [
            Trajectory(transitions=draw(st.lists(transitions(wild), max_size=3)), final_ob=tinker.ModelInput(chunks=[]))
            for _ in range(n)
        ]
        m = draw(st.sampled_from([n] * 8 + [n + 1, max(n - 1, 0)])) if wild else n
        cls = draw(st.sampled_from([TrajectoryGroup] * 5 + [ScaledRewards]))
        groups.append(
            cls(
                trajectories_G=trajectories,
                final_rewards_G=draw(st.lists(rewards(wild), min_size=m, max_size=m)),
                metrics_G=draw(st.lists(st.dictionaries(st.sampled_from(METRIC_KEYS), metric_values(wild), max_size=2), max_size=n + 1)),
            )
        )
    return groups


@st.composite
def taglists(draw, n_groups: int, wild: bool = False):
    """Per group its tags: one tag for all (trivial), a few, many, repeats;
    now and then more or fewer taglists than groups."""
    pool = st.sampled_from(TAGS[: draw(st.sampled_from([1, 2, 3, len(TAGS)]))])
    out = [draw(st.lists(pool, max_size=draw(st.sampled_from([1, 2, 5])))) for _ in range(n_groups)]
    if draw(st.integers(0, 9)) == 0:
        out = out[:-1] if out and draw(st.booleans()) else [*out, ["math"]]
    if wild and out and draw(st.integers(0, 9)) == 0:
        out[0] = [*out[0], 3]  # a tag that is not a str
    event(f"{len({t for tags in out for t in tags})} distinct tags")
    return out


def averaged_values(groups):
    """The metric values compute_trajectory_metrics averages."""
    for g in groups:
        for t in g.trajectories_G:
            yield from (v for tr in t.transitions for v in tr.metrics.values())
        yield from (v for m in g.metrics_G for v in m.values())


def numpy_promoted(groups) -> float | None:
    """None when numpy averages every metric as float64 (Python numbers,
    float subclasses): ours then equals it to the bit. Else (a float32 or
    other numpy scalar among the values: numpy's promotion decides) the
    magnitude ours is within float32 rounding of."""
    if not any(isinstance(v, np.generic) and not isinstance(v, float) for v in averaged_values(groups)):
        return None
    values = [1.0]
    for g in groups:
        for t in g.trajectories_G:
            values += [float(tr.reward) for tr in t.transitions]
        values += [float(r) for r in g.final_rewards_G if isinstance(r, (int, float, np.number))]
    values += [float(v) for v in averaged_values(groups) if isinstance(v, (int, float, np.number))]
    finite = [abs(v) for v in values if math.isfinite(v)]
    return 4 * max(finite)  # a total reward sums up to four


def assert_same_metrics(theirs, mine, scale=None):
    """Trajectory metrics: the same keys in order, of the same types, the
    same values to the bit (their means are numpy's pairwise sums), or with
    ``scale`` (:func:`numpy_promoted`) floats within float32 rounding."""
    assert type(mine) is dict
    assert list(mine) == list(theirs)
    for key, value in theirs.items():
        assert type(mine[key]) is type(value), (key, mine[key], value)
        if scale is None or isinstance(value, int):
            assert repr(mine[key]) == repr(value), (key, mine[key], value)
        else:
            assert close(mine[key], value, scale), (key, mine[key], value)


def native_metrics(groups, tags):
    return _core.trajectory_metrics(groups, tags, _step._own_total_rewards())


def check_trajectory_metrics(groups, tags, must_be_native: bool):
    theirs = outcome(COOKBOOK["compute_trajectory_metrics"], groups, tags)
    mine = outcome(ours.compute_trajectory_metrics, groups, tags)
    scale = numpy_promoted(groups)
    event(f"the cookbook {'raised ' + type(theirs[1]).__name__ if theirs[0] == 'raised' else 'returned'}")
    assert_same_outcome(theirs, mine, lambda a, b: assert_same_metrics(a, b, scale))
    native = outcome(native_metrics, groups, tags)
    if native[0] == "ok":
        assert theirs[0] == "ok", f"the cookbook raised {theirs[1]!r}, the native pass returned"
        assert_same_metrics(theirs[1], native[1], scale)
    else:
        assert isinstance(native[1], _core.Unsupported), native[1]
        assert not must_be_native, native[1]
    event("native" if native[0] == "ok" else "left to the cookbook")


@given(step_groups().flatmap(lambda g: st.tuples(st.just(g), taglists(len(g)))))
def test_trajectory_metrics_of_the_trainers_groups_are_native_and_match(inputs):
    check_trajectory_metrics(*inputs, must_be_native=True)


@given(step_groups(wild=True).flatmap(lambda g: st.tuples(st.just(g), taglists(len(g), wild=True))))
def test_trajectory_metrics_match_the_cookbook(inputs):
    check_trajectory_metrics(*inputs, must_be_native=False)


def test_trajectory_metrics_of_one_group_and_of_none():
    group, tags = groups_of([1.0, 0.0]), [["math"]]
    for batch, taglist in (([group], tags), ([group], [[]]), ([], []), ([group, group], [["a"], ["a", "a"]])):
        check_trajectory_metrics(batch, taglist, must_be_native=True)


class MutatingScalar(np.float32):
    """A numpy scalar whose float() empties the dict that holds it and
    lies (np.mean never calls it)."""

    calls = 0

    def __float__(self):
        MutatingScalar.calls += 1
        self.host.clear()
        return 99.0


class SpoofedClass:
    """Claims to be a numpy float32 through a ``__class__`` property that
    rewrites the dict that holds it."""

    calls = 0

    @property
    def __class__(self):
        SpoofedClass.calls += 1
        self.host.update(late=5.0, before=-7.0)
        return np.float32


def hostile_metric_groups(kind):
    """One group whose second transition's metrics hold a hostile value
    between plain ones (read in place, then the rest taken first)."""
    metrics = {"before": 1.0, "x": None}
    value = MutatingScalar(0.5) if kind == "float" else SpoofedClass()
    value.host = metrics
    metrics.update(hostile=value, after=np.float32(0.25), n=3)
    group = groups_of([1.0, 0.0])
    group.trajectories_G[0].transitions[0].metrics.update(before=2.0, n=1)
    group.trajectories_G[1].transitions[0].metrics = metrics
    return [group], [["math"]]


@pytest.mark.parametrize("kind", ["float", "__class__"])
def test_a_metric_value_that_would_rewrite_its_dict_is_left_to_the_cookbook_unread(kind):
    hostile = MutatingScalar if kind == "float" else SpoofedClass
    theirs = outcome(COOKBOOK["compute_trajectory_metrics"], *hostile_metric_groups(kind))
    hostile.calls = 0
    native = outcome(native_metrics, *hostile_metric_groups(kind))
    assert native[0] == "raised" and isinstance(native[1], _core.Unsupported), native
    assert hostile.calls == 0, "the native pass ran the value's own code"
    mine = outcome(ours.compute_trajectory_metrics, *hostile_metric_groups(kind))
    assert_same_outcome(theirs, mine, assert_same_metrics)


def test_metrics_read_in_place_then_taken_first_match_the_cookbook():
    # Exact numbers read as the dict is walked, numpy scalars (read by C
    # code) after the rest was taken; the reader's buffer reused dict to dict.
    group = groups_of([1.0, 0.0, 1.0])
    for i, trajectory in enumerate(group.trajectories_G):
        trajectory.transitions[0].metrics.update(
            {"a": 1.0 + i, "b": np.float32(0.5 * i), "c": i, "d": None, "e": np.int64(i) if i else 2.5}
        )
    group.metrics_G[1].update(b=np.float64(4.0), f=True)
    check_trajectory_metrics([group], [["math"]], must_be_native=True)


def test_remove_mask_with_a_loss_input_that_rewrites_the_dict_while_checked_ends_like_the_cookbook():
    def datum():
        inputs = {}

        class Spoofed:
            @property
            def __class__(self):
                inputs.clear()
                inputs["late"] = 1
                return tinker.TensorData

        inputs["target_tokens"] = tinker.TensorData.from_numpy(np.zeros(2, np.int64))
        inputs["spoofed"] = Spoofed()
        inputs["mask"] = tinker.TensorData.from_numpy(np.ones(2, np.float32))
        d = tinker.Datum(model_input=tinker.ModelInput.from_ints([1, 2]), loss_fn_inputs={})
        object.__setattr__(d, "loss_fn_inputs", inputs)
        return d

    def fields(d):
        return [(k, type(v).__name__) for k, v in d.loss_fn_inputs.items()]

    theirs = COOKBOOK["_remove_mask"](datum())
    assert fields(ours.remove_mask(datum())) == fields(theirs) == [("target_tokens", "TensorData"), ("spoofed", "Spoofed")]
    if rows.direct():
        assert fields(_core.datum_without_mask(datum())) == fields(theirs)


def groups_of(rewards_per_group):
    """Groups of one-transition trajectories with the given final rewards."""
    step = Transition(
        ob=tinker.ModelInput.from_ints([1, 2]),
        ac=TokensWithLogprobs(tokens=[3], maybe_logprobs=[-0.5]),
        reward=0.0,
        episode_done=True,
        metrics={"format": 1.0},
    )
    traj = Trajectory(transitions=[step], final_ob=tinker.ModelInput(chunks=[]))
    return TrajectoryGroup(
        trajectories_G=[traj] * len(rewards_per_group),
        final_rewards_G=list(rewards_per_group),
        metrics_G=[{} for _ in rewards_per_group],
    )


@given(st.one_of(step_groups(), step_groups(wild=True)))
def test_rollout_usage_matches_the_cookbook(groups):
    theirs = outcome(COOKBOOK["rollout_usage"], groups)
    mine = outcome(ours.rollout_usage, groups)

    def same(a, b):
        assert type(b) is type(a) is TokenUsage and b == a
        assert all(type(getattr(b, f)) is type(getattr(a, f)) for f in ("sampled", "prefill_cached", "prefill_uncached"))

    assert_same_outcome(theirs, mine, same)


# --------------------------------------------------------------------------
# training_usage, _remove_mask


@st.composite
def assembled(draw):
    """Datums as the trainer makes them, by the cookbook's assembly or ours
    (built directly), with provenance or without."""
    batch = draw(batches())
    include_provenance = draw(st.booleans())
    assemble = draw(st.sampled_from([cookbook_data.assemble_training_data, ours.assemble_training_data]))
    try:
        data, _ = assemble(batch, cookbook_data.compute_advantages(batch), include_provenance)
    except Exception:
        data = []
    event(f"{min(len(data), 3)}{'+' if len(data) >= 3 else ''} Datums")
    return data


def unsized_image_datum():
    chunks = [tinker.EncodedTextChunk(tokens=[1, 2]), ImageChunk(data=b"x", format="png")]
    return tinker.Datum(model_input=tinker.ModelInput(chunks=chunks), loss_fn_inputs={})


@given(assembled(), st.booleans())
def test_training_usage_matches_the_cookbook(data, odd):
    if odd:
        data = [*data, unsized_image_datum()]  # its length raises ValueError
    theirs = outcome(COOKBOOK["training_usage"], data)
    mine = outcome(ours.training_usage, data)
    assert_same_outcome(theirs, mine, lambda a, b: (type(b) is type(a)) and b == a or pytest.fail(f"{a} != {b}"))
    if not odd:
        assert _core.training_tokens(data) == theirs[1].trained


def datum_fields(d):
    """Everything a Datum holds, objects by identity (both keep the inputs'
    own objects) except loss_fn_inputs, a new dict in both."""
    inputs = d.loss_fn_inputs
    return (
        type(d),
        list(vars(d)),
        id(d.model_input),
        type(inputs),
        [(k, type(v), v.dtype, v.shape, v.to_numpy().tobytes()) for k, v in inputs.items()],
        id(d.model_input_spans),
        id(d.loss_fn_input_spans),
    )


@given(assembled(), st.sampled_from(["as assembled", "no mask", "a numpy loss input"]))
def test_remove_mask_matches_the_cookbook(data, change):
    for datum in data:
        if change == "no mask":
            datum = train._remove_mask(datum)
        elif change == "a numpy loss input":
            datum.loss_fn_inputs["weights"] = np.ones(3)  # the dict is mutable: replace() converts it
        theirs, mine = COOKBOOK["_remove_mask"](datum), ours.remove_mask(datum)
        assert datum_fields(mine) == datum_fields(theirs)
        assert mine is not datum and mine.loss_fn_inputs is not datum.loss_fn_inputs
        # The same request bytes (or tinker's same refusal of an image pointer).
        assert_same_outcome(outcome(wire_bytes, [theirs]), outcome(wire_bytes, [mine]), lambda a, b: a == b or pytest.fail())
        assert gc.is_tracked(mine)
        if change == "as assembled" and rows.direct():
            # The trainer's Datums take the direct path.
            direct = _core.datum_without_mask(datum)
            assert datum_fields(direct) == datum_fields(theirs)


def test_remove_mask_through_tinkers_constructors_where_its_layout_is_unknown(monkeypatch):
    monkeypatch.setattr(rows, "direct_construction", lambda: "as if tinker's layout were unknown")
    spans = [tinker.PromptProvenanceSpan(sequence_id="s", offset=0, length=2)]
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"mask": tinker.TensorData.from_numpy(np.ones(2, np.float32))},
    ).with_provenance(spans, spans)
    assert datum_fields(ours.remove_mask(datum)) == datum_fields(COOKBOOK["_remove_mask"](datum))


def test_remove_mask_leaves_a_datum_the_cookbook_rejects_to_it():
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints([1]), loss_fn_inputs={})
    object.__setattr__(datum, "model_input_spans", [])  # unpaired: __post_init__ asserts
    with pytest.raises(AssertionError):
        COOKBOOK["_remove_mask"](datum)
    with pytest.raises(AssertionError):
        ours.remove_mask(datum)


# --------------------------------------------------------------------------
# install / uninstall

# Each trainer module and the step functions it holds, by the cookbook's names.
TRAINERS = {
    "tinker_cookbook.rl.metrics": ["compute_kl_sample_train"],
    "tinker_cookbook.rl.metric_util": ["compute_trajectory_metrics"],
    "tinker_cookbook.rl.train": [
        "compute_kl_sample_train",
        "compute_trajectory_metrics",
        "_remove_mask",
        "rollout_usage",
        "training_usage",
    ],
    "tinker_cookbook.distillation.train_on_policy": ["compute_trajectory_metrics"],
    "tinker_cookbook.distillation.sdft": ["compute_trajectory_metrics"],
}
OURS = {
    "compute_kl_sample_train": ours.compute_kl_sample_train,
    "compute_trajectory_metrics": ours.compute_trajectory_metrics,
    "_remove_mask": ours.remove_mask,
    "rollout_usage": ours.rollout_usage,
    "training_usage": ours.training_usage,
}


def held():
    import importlib

    return {module: {n: getattr(importlib.import_module(module), n) for n in names} for module, names in TRAINERS.items()}


@pytest.fixture
def cookbooks_own():
    """The trainers hold the cookbook's functions before and after the test."""
    originals = {module: {n: COOKBOOK[n] for n in names} for module, names in TRAINERS.items()}
    assert held() == originals
    yield
    ours.uninstall()
    assert held() == originals


def test_install_puts_the_step_functions_into_the_trainers_and_uninstall_restores_them(cookbooks_own):
    ours.install()
    for module, functions in held().items():
        for name, function in functions.items():
            # ours made around the cookbook's function: the same code as the public one
            assert function.__code__ is OURS[name].__code__, f"{module}.{name}"
    ours.install()  # again: harmless
    assert train._remove_mask is ours.remove_mask
    ours.uninstall()
    assert train._remove_mask is COOKBOOK["_remove_mask"]
    assert metric_util.compute_trajectory_metrics is COOKBOOK["compute_trajectory_metrics"]


def test_install_of_the_step_functions_on_an_untested_version_warns_once(cookbooks_own, monkeypatch):
    monkeypatch.setattr(tinker_cookbook, "__version__", "0.7.0")
    with pytest.warns(InstallWarning, match=r"0\.7\.0 is not a version the tests ran against") as caught:
        ours.install()
    assert len(caught) == 1
    assert train.training_usage.__code__ is ours.training_usage.__code__
    assert metrics.compute_kl_sample_train.__code__ is ours.compute_kl_sample_train.__code__


def test_the_trainers_train_step_and_kl_run_ours_once_installed(cookbooks_own):
    """rl.train.train_step looks _remove_mask up in its module at call time:
    installed, the Datums it sends are ours (their loss-input dicts hold only
    untracked tensors, so are untracked; dataclasses.replace's are not)."""
    from types import SimpleNamespace

    batch = [groups_of([1.0, 0.0]), groups_of([0.25, 0.5])]
    data, _ = ours.assemble_training_data(batch, ours.compute_advantages(batch))
    sent = []

    class Client:
        def forward_backward(self, data_D, loss_fn, loss_fn_config=None):
            sent.extend(data_D)
            outputs = [{"logprobs": tinker.TensorData.from_numpy(d.loss_fn_inputs["logprobs"].to_numpy() - 0.25)} for d in data_D]

            async def result():
                return tinker.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs)

            return result()

        def optim_step(self, params):
            async def result():
                return SimpleNamespace(metrics={})

            return result()

    def step():
        sent.clear()
        training = asyncio.run(train.train_step(data, Client(), 1e-5, num_substeps=2, loss_fn="importance_sampling"))
        return training, list(sent), train.compute_kl_sample_train(data, training)

    training, theirs_sent, theirs_kl = step()
    ours.install()
    training, mine_sent, mine_kl = step()
    assert [datum_fields(d)[4] for d in mine_sent] == [datum_fields(d)[4] for d in theirs_sent]
    assert all("mask" not in d.loss_fn_inputs for d in mine_sent)
    assert not any(gc.is_tracked(d.loss_fn_inputs) for d in mine_sent)
    assert all(gc.is_tracked(d.loss_fn_inputs) for d in theirs_sent)
    assert_same_kl(theirs_kl, mine_kl, kl_scales(data, training))
    assert mine_kl == dict(zip(mine_kl, native_kl(data, training)))


def test_without_tinker_cookbook_the_native_pass_still_runs_and_the_rest_says_why():
    import subprocess
    import sys

    code = """
import sys
sys.modules["tinker_cookbook"] = None
import numpy as np, tinker, torch
import tinker_rl_data.cookbook as c
mask = tinker.TensorData.from_numpy(np.array([0.0, 1.0], np.float32))
logprobs = tinker.TensorData.from_numpy(np.array([-1.0, -2.0], np.float32))
datum = tinker.Datum(model_input=tinker.ModelInput.from_ints([1, 2]), loss_fn_inputs={"logprobs": logprobs, "mask": mask})
training = [torch.tensor([0.0, -1.5])]
assert c.compute_kl_sample_train([datum], training) == {
    "optim/kl_sample_train_v1": -0.5, "optim/kl_sample_train_v2": 0.125, "optim/entropy": 2.0}
assert "mask" not in c.remove_mask(datum).loss_fn_inputs
try:
    c.compute_kl_sample_train([datum], iter(training))
except TypeError as e:
    assert "not importable" in str(e) and "not a list or tuple" in str(e), e
else:
    raise AssertionError("no TypeError")
"""
    subprocess.run([sys.executable, "-c", code], check=True)
