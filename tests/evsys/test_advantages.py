"""docs/contract.md §7: advantage baselines ("mean", "leave_one_out") and scaling by the
group's sample standard deviation, against the reference (exact arithmetic,
rounded once) and against hand-computed values."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import reference
import tinker_rl_data as trd
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

REL = 1e-12

reward_values = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.integers(-100, 100),
    st.sampled_from([0.0, -0.0, 0.1, 1.0, -1.0, 0.5, 1e-300, 5e-324, 1e6]),
)


@st.composite
def reward_lists(draw):
    """Groups of 0, 1, 2 and many trajectories, with equal, distinct or
    partly equal rewards."""
    n = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 40)))
    kind = draw(st.sampled_from(["equal", "distinct", "two values", "any"]))
    if kind == "equal":
        return [draw(reward_values)] * n
    if kind == "distinct":
        return draw(st.lists(st.floats(-1e3, 1e3), min_size=n, max_size=n, unique=True))
    if kind == "two values":
        a, b = draw(reward_values), draw(reward_values)
        return [draw(st.sampled_from([a, b])) for _ in range(n)]
    return draw(st.lists(reward_values, min_size=n, max_size=n))


def batch_of(reward_groups):
    return [TrajectoryGroup([Trajectory([Turn([1], [2], [-1.0])], reward=r) for r in rs]) for rs in reward_groups]


options = st.fixed_dictionaries(
    {},
    optional={
        "baseline": st.sampled_from(["mean", "leave_one_out"]),
        "scale_by_std": st.booleans(),
        "eps": st.sampled_from([1e-6, 0.0, 1e-12, 1e-3, 0.5, 2.0]),
        "normalize": st.just(True),
    },
)


def tolerance(rs, ref, kwargs):
    """1e-12 relative to the group's scale: the largest |reward| (every
    implementation's rounding of the mean is relative to that), divided by
    what the deviations are divided by when scaled. Relative to the result
    alone would demand exact arithmetic where rewards nearly cancel."""
    scale = max(abs(r) for r in rs)
    if kwargs.get("scale_by_std"):
        scale /= statistics.stdev(rs) + kwargs.get("eps", 1e-6)
    return REL * max(abs(ref), scale) + 1e-300


def assert_close(ours, theirs, reward_groups, kwargs):
    assert len(ours) == len(theirs) == len(reward_groups)
    for got, expected, rs in zip(ours, theirs, reward_groups):
        assert isinstance(got, list) and len(got) == len(expected) == len(rs)
        assert all(type(a) is float for a in got)
        if len(rs) < 2:
            assert got == [float(r) for r in rs]  # a group of one keeps its reward, whatever the options
            continue
        if kwargs.get("scale_by_std") and kwargs.get("eps", 1e-6) == 0 and statistics.stdev(rs) < 1e-150:
            # eps=0 on a constant group is 0 / 0, which docs/contract.md §7 leaves open (the
            # reference gives 0.0); on a near-constant one of subnormal rewards
            # the variance underflows a float.
            continue
        for a, b in zip(got, expected):
            assert math.isfinite(a)
            assert abs(a - b) <= tolerance(rs, b, kwargs), (a, b, rs, kwargs)


@given(st.lists(reward_lists(), max_size=4), options)
def test_matches_the_reference(reward_groups, kwargs):
    batch = batch_of(reward_groups)
    ours = trd.compute_advantages(batch, **kwargs)
    theirs = reference.compute_advantages(batch, **kwargs)
    assert_close(ours, theirs, reward_groups, kwargs)


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
@pytest.mark.parametrize("scale_by_std", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 7])
@pytest.mark.parametrize("equal", [True, False])
def test_every_option_on_every_group_size(baseline, scale_by_std, n, equal):
    rs = [0.25] * n if equal else [float(i * i) - 3.5 for i in range(n)]
    batch = batch_of([rs, [], [4.0], rs])
    kwargs = {"baseline": baseline, "scale_by_std": scale_by_std}
    ours = trd.compute_advantages(batch, **kwargs)
    assert ours[1] == [] and ours[2] == [4.0]
    assert_close(ours, reference.compute_advantages(batch, **kwargs), [rs, [], [4.0], rs], kwargs)
    if equal and n >= 2:
        # Equal rewards carry no signal: every advantage is (very nearly) 0.
        assert all(abs(a) <= 1e-12 for a in ours[0])


def by_hand(rs, baseline, scale_by_std, eps=1e-6):
    n = len(rs)
    if baseline == "mean":
        devs = [r - sum(rs) / n for r in rs]
    else:
        devs = [r - (sum(rs) - r) / (n - 1) for r in rs]
    if scale_by_std:
        mean = sum(rs) / n
        s = math.sqrt(sum((r - mean) ** 2 for r in rs) / (n - 1))
        devs = [d / (s + eps) for d in devs]
    return devs


@pytest.mark.parametrize(
    "rs, baseline, scale_by_std, expected",
    [
        # mean 3: deviations -2 -1 0 3
        ([1.0, 2.0, 3.0, 6.0], "mean", False, [-2.0, -1.0, 0.0, 3.0]),
        # RLOO: r_i - (12 - r_i) / 3  =  1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
        ([1.0, 2.0, 3.0, 6.0], "leave_one_out", False, [1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0]),
        # two rewards: RLOO is the difference to the other one
        ([0.0, 1.0], "leave_one_out", False, [-1.0, 1.0]),
        ([0.0, 1.0], "mean", False, [-0.5, 0.5]),
        # sample variance of 1 2 3 6 is (4 + 1 + 0 + 9) / 3
        ([1.0, 2.0, 3.0, 6.0], "mean", True, [d / (math.sqrt(14 / 3) + 1e-6) for d in (-2, -1, 0, 3)]),
        ([1.0, 2.0, 3.0, 6.0], "leave_one_out", True, [d * 4 / 3 / (math.sqrt(14 / 3) + 1e-6) for d in (-2, -1, 0, 3)]),
        # 0 and 1: sample std sqrt(1/2)
        ([0.0, 1.0], "mean", True, [-0.5 / (math.sqrt(0.5) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)]),
    ],
)
def test_hand_computed_values(rs, baseline, scale_by_std, expected):
    assert by_hand(rs, baseline, scale_by_std) == pytest.approx(expected, rel=1e-14, abs=1e-14)
    for fn in (trd.compute_advantages, reference.compute_advantages):
        (got,) = fn(batch_of([rs]), baseline=baseline, scale_by_std=scale_by_std)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), fn


def test_eps_is_added_to_the_standard_deviation():
    rs = [0.0, 1.0]
    s = math.sqrt(0.5)
    for eps in (0.0, 0.25, 3.0):
        (got,) = trd.compute_advantages(batch_of([rs]), scale_by_std=True, eps=eps)
        assert got == pytest.approx([-0.5 / (s + eps), 0.5 / (s + eps)], rel=1e-12)
    # Equal rewards with the default eps: 0 / (0 + eps) = 0.
    (got,) = trd.compute_advantages(batch_of([[2.0, 2.0, 2.0]]), scale_by_std=True)
    assert got == [0.0, 0.0, 0.0]


def test_defaults_are_todays_mean_baseline():
    rs = [[3.0, -1.0, 0.5], [2.0], [], [1.0, 1.0]]
    batch = batch_of(rs)
    expected = trd.compute_advantages(batch)
    assert trd.compute_advantages(batch, normalize=True, baseline="mean", scale_by_std=False, eps=1e-6) == expected
    assert_close(expected, reference.compute_advantages(batch), rs, {})
    assert trd.compute_advantages(batch, normalize=False) == [[3.0, -1.0, 0.5], [2.0], [], [1.0, 1.0]]
    # normalize=False with the default baseline and no scaling is fine, whatever eps.
    assert trd.compute_advantages(batch, normalize=False, baseline="mean", scale_by_std=False, eps=0.5) == [
        [3.0, -1.0, 0.5], [2.0], [], [1.0, 1.0]
    ]


INVALID = [
    {"normalize": False, "baseline": "leave_one_out"},
    {"normalize": False, "scale_by_std": True},
    {"normalize": False, "baseline": "leave_one_out", "scale_by_std": True},
    {"baseline": "rloo"},
    {"baseline": "Mean"},
    {"baseline": ""},
    {"baseline": None},
    {"baseline": "grpo", "scale_by_std": True},
    {"eps": -1e-9},
    {"eps": -1.0},
    {"eps": math.nan},
    {"eps": math.inf},
    {"eps": -math.inf},
    {"eps": -1e-9, "scale_by_std": True},
    {"eps": math.nan, "scale_by_std": True},
]


@pytest.mark.parametrize("kwargs", INVALID, ids=[repr(k) for k in INVALID])
@pytest.mark.parametrize("rs", [[[1.0, 2.0]], [[1.0]], [[]], []], ids=["group of 2", "group of 1", "empty group", "no groups"])
def test_invalid_options_are_value_errors(kwargs, rs):
    for fn in (trd.compute_advantages, reference.compute_advantages):
        with pytest.raises(ValueError):
            fn(batch_of(rs), **kwargs)
