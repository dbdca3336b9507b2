"""Properties of the rows that hold for every batch (hypothesis), bad input
fuzzed from Python, and behaviour under threads and repetition."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import reference
import tinker_rl_data as trd
from conftest import datum_content, groups
from tinker_rl_data.rows import direct

DIRECT_PATH = direct()
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn


def kept_turns(batch):
    for g, group in enumerate(batch):
        for t, traj in enumerate(group.trajectories):
            for u, turn in enumerate(traj.turns):
                p, c = list(turn.prompt_tokens), list(turn.completion_tokens)
                if c and len(p) + len(c) >= 2:
                    yield g, t, u, p, c, list(turn.logprobs)


@given(groups(), st.booleans())
def test_every_completion_token_is_a_target_once_with_its_own_logprob(batch, normalize):
    advantages = trd.compute_advantages(batch, normalize=normalize)
    datums, meta = trd.assemble_training_data(batch, advantages)
    kept = list(kept_turns(batch))
    assert len(datums) == len(meta) == len(kept)
    for d, m, (g, t, u, p, c, lp) in zip(datums, meta, kept):
        assert (m.group_idx, m.traj_idx, m.turn_idx) == (g, t, u)
        targets = d.loss_fn_inputs["target_tokens"].tolist()
        logprobs = d.loss_fn_inputs["logprobs"].tolist()
        advs = d.loss_fn_inputs["advantages"].tolist()
        a = float(np.float32(advantages[g][t]))
        first = max(len(p) - 1, 0)  # first position whose target is a completion token
        # Completion targets: each completion token (but an unpredicted first
        # one) exactly once, in order, with its own logprob and the advantage.
        skipped = 1 if not p else 0
        assert targets[first:] == c[skipped:]
        fitted = (lp + [0.0] * len(c))[: len(c)]
        assert logprobs[first:] == [float(np.float32(x)) for x in fitted[skipped:]]
        assert advs[first:] == [a] * (len(c) - skipped)
        # Prompt positions carry 0 in both.
        assert logprobs[:first] == [0.0] * first and advs[:first] == [0.0] * first
        assert targets[:first] == p[1:]
    for group_advantages in (advantages if normalize else []):
        if len(group_advantages) >= 2:
            assert abs(math.fsum(group_advantages)) <= 1e-9 * max(1.0, max(map(abs, group_advantages)))


junk_tokens = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, True, False]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=3),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
)
junk_reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.none(),
    st.text(max_size=3),
    st.sampled_from([1e39, -1e39, 3.4e38, np.float32(-1.5), np.float64("nan"), True]),
)


@st.composite
def junk_batches(draw):
    def seq(elements):
        values = draw(st.lists(elements, max_size=5))
        return tuple(values) if draw(st.booleans()) else values

    out = []
    for _ in range(draw(st.integers(1, 3))):
        trajs = []
        for _ in range(draw(st.integers(0, 3))):
            turns = [Turn(seq(junk_tokens), seq(junk_tokens), seq(junk_reals)) for _ in range(draw(st.integers(0, 2)))]
            trajs.append(Trajectory(turns, reward=draw(junk_reals)))
        out.append(TrajectoryGroup(trajs))
    advantages = [[draw(junk_reals) for _ in g.trajectories] for g in out]
    return out, advantages


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


@given(junk_batches())
def test_junk_is_refused_like_the_reference_and_never_crashes(case):
    batch, advantages = case
    ours = outcome(trd.assemble_training_data, batch, advantages)
    theirs = outcome(reference.assemble_training_data, batch, advantages)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        assert [datum_content(d) for d in ours[1][0]] == [datum_content(d) for d in theirs[1][0]]
    else:
        # Same class, and located at the same place.
        assert ours[1].split(":")[0] == theirs[1].split(":")[0], (ours, theirs)
    for fn in ("compute_advantages", "compute_trajectory_metrics"):
        ours, theirs = outcome(getattr(trd, fn), batch), outcome(getattr(reference, fn), batch)
        assert ours[0] == theirs[0], (fn, ours, theirs)


def medium_batch():
    rng = np.random.default_rng(7)
    return [
        TrajectoryGroup(
            [
                Trajectory(
                    [Turn(rng.integers(0, 50_000, 200).tolist(), rng.integers(0, 50_000, 100).tolist(), (-rng.random(100)).tolist())],
                    reward=float(rng.random()),
                )
                for _ in range(8)
            ],
            tags=["t"],
        )
        for _ in range(16)
    ]


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_rss_is_flat_over_300_calls():
    batch = medium_batch()
    advantages = trd.compute_advantages(batch)
    for _ in range(20):  # allocator warm-up
        trd.assemble_training_data(batch, advantages)
    gc.collect()
    before = rss_kib()
    for _ in range(300):
        trd.assemble_training_data(batch, advantages)
        trd.assemble_arrays(batch, advantages)
        trd.compute_advantages(batch)
        trd.compute_trajectory_metrics(batch)
    gc.collect()
    assert rss_kib() - before < 10 * 1024


def test_threads_agree_with_a_single_thread():
    batch = medium_batch()
    advantages = trd.compute_advantages(batch)
    expected = [datum_content(d) for d in trd.assemble_training_data(batch, advantages)[0]]
    results, errors = [], []

    def work():
        try:
            for _ in range(10):
                results.append([datum_content(d) for d in trd.assemble_training_data(batch, advantages)[0]])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(results) == 60
    assert all(r == expected for r in results)
    assert gc.isenabled()


def test_no_references_are_leaked_or_lost():
    """Every input object's reference count is back where it was once the
    results are gone (a leak would pin the caller's ints; a lost reference
    would crash later)."""
    import sys

    token, logprob, reward = 2**31 - 7, -0.123456789, 0.75
    prompt, completion, logprobs = [token] * 5, [token, 12345678], [logprob, logprob]
    batch = [
        TrajectoryGroup([Trajectory([Turn(prompt, completion, logprobs), Turn((token, 1), (token,), (logprob,))], reward=reward)],
                        tags=["t"])
    ]
    watched = [token, logprob, reward, prompt, completion, logprobs, batch[0].tags]
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(3):
        advantages = trd.compute_advantages(batch)
        datums, meta = trd.assemble_training_data(batch, advantages)
        if DIRECT_PATH:  # the direct path shares the caller's ints, from lists and tuples
            assert datums[0].model_input.to_ints()[0] is token
            assert datums[1].model_input.to_ints()[0] is token
        rows = trd.assemble_arrays(batch, advantages)
        metrics = trd.compute_trajectory_metrics(batch)
        del advantages, datums, meta, rows, metrics
    gc.collect()
    assert [sys.getrefcount(x) for x in watched] == before


def test_an_error_late_in_the_batch_leaves_no_references_behind():
    import sys

    token = 2**31 - 9
    prompt = [token] * 4
    good = Trajectory([Turn(prompt, [token, token], [-1.0, -1.0])], reward=1.0)
    bad = Trajectory([Turn([1], [2**31], [-1.0])], reward=1.0)
    batch = [TrajectoryGroup([good, good]), TrajectoryGroup([good, bad])]
    before = sys.getrefcount(token), sys.getrefcount(prompt)
    for _ in range(3):
        with pytest.raises(ValueError, match="^group 1, trajectory 1, turn 0: token 2147483648"):
            trd.assemble_training_data(batch, [[0.0, 0.0], [0.0, 0.0]])
    gc.collect()
    assert (sys.getrefcount(token), sys.getrefcount(prompt)) == before


def test_ints_are_read_in_place_on_the_cpythons_we_ship_for():
    # The properties above then test the in-place read (rust/py/read/exact.rs),
    # not only the C API fallback; their tokens include 2**30 - 1 (one
    # digit), 2**30 and 2**31 - 1 (two digits, read by the C API).
    from tinker_rl_data import _core

    if sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 14):
        assert _core.INT_READ.startswith("digits in place"), _core.INT_READ


INT_READ_SCRIPT = """
import json
import tinker_rl_data as trd
from tinker_rl_data import _core
from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

tokens = [0, 1, 255, 256, 2**30 - 1, 2**30, 2**31 - 1, 7, 2**30 + 1]
turns = [Turn(tokens[:k], tokens[k:], [-0.5] * (len(tokens) - k)) for k in range(1, len(tokens))]
groups = [TrajectoryGroup([Trajectory([turn], float(k)) for k, turn in enumerate(turns)])]
datums, _ = trd.assemble_training_data(groups, trd.compute_advantages(groups))
rows = [[d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].tolist()] for d in datums]
print(json.dumps([_core.INT_READ, tokens, rows]))
"""


def test_the_c_api_int_read_gives_the_same_datums():
    # The fallback for an interpreter whose int layout the probe does not
    # know, forced by the environment variable; ints of one and two digits.
    outputs = []
    for extra in ({}, {"TINKER_RL_DATA_INT_READ": "api"}):
        done = subprocess.run(
            [sys.executable, "-c", INT_READ_SCRIPT],
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.splitlines()[-1]))
    (default_read, tokens, default_rows), (api_read, _, api_rows) = outputs
    assert api_read == "PyLong_AsLongLongAndOverflow", api_read
    assert api_rows == default_rows == [[tokens[:-1], tokens[1:]]] * (len(tokens) - 1)
