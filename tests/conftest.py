"""Shared test helpers: hypothesis strategies for rollout batches and a
field-by-field comparison of Datums."""

from __future__ import annotations

import gc
import os
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

settings.register_profile(
    "ci", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

MAX_TOKEN = 2**31 - 1


def cookbook_unavailable(exc: ImportError) -> None:
    """For a test module that needs tinker-cookbook, which failed to import:
    skip the module, or fail it when TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (CI)."""
    if os.environ.get("TINKER_RL_DATA_REQUIRE_COOKBOOK") == "1":
        raise RuntimeError(
            f"TINKER_RL_DATA_REQUIRE_COOKBOOK=1 but tinker_cookbook is not importable ({exc}); "
            "run `bash scripts/install_cookbook.sh`"
        ) from exc
    pytest.skip(
        f"tinker_cookbook is not importable ({exc}): the differential tests against it need "
        "`bash scripts/install_cookbook.sh` (set TINKER_RL_DATA_REQUIRE_COOKBOOK=1 to make this an error)",
        allow_module_level=True,
    )

tokens = st.one_of(
    st.integers(0, 1000),
    st.sampled_from([0, 1, 255, 256, 2**30 - 1, 2**30, MAX_TOKEN - 1, MAX_TOKEN]),
    st.integers(0, MAX_TOKEN),
)
logprob_values = st.floats(-30.0, 0.0, allow_nan=False, allow_infinity=False)


@st.composite
def sequences(draw, elements, np_dtype):
    """The same values as a list, a tuple or a 1-D numpy array."""
    values = draw(st.lists(elements, max_size=10))
    kind = draw(st.sampled_from(["list", "tuple", "array"]))
    if kind == "tuple":
        return tuple(values)
    if kind == "array":
        return np.array(values, dtype=draw(st.sampled_from(np_dtype)))
    return values


@st.composite
def turns(draw):
    prompt = draw(sequences(tokens, [np.int64]))
    completion = draw(sequences(tokens, [np.int64]))
    # Logprobs around the completion's length: shorter, equal, longer.
    n = max(0, len(completion) + draw(st.integers(-2, 2)))
    values = draw(st.lists(logprob_values, min_size=n, max_size=n))
    kind = draw(st.sampled_from(["list", "tuple", "array"]))
    logprobs = tuple(values) if kind == "tuple" else np.array(values) if kind == "array" else values
    return Turn(prompt, completion, logprobs)


rewards = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)


@st.composite
def groups(draw, max_groups=4, max_trajectories=4, max_turns=3):
    out = []
    for _ in range(draw(st.integers(0, max_groups))):
        trajs = [
            Trajectory(draw(st.lists(turns(), max_size=max_turns)), reward=draw(rewards))
            for _ in range(draw(st.integers(0, max_trajectories)))
        ]
        out.append(TrajectoryGroup(trajs, tags=draw(st.lists(st.sampled_from(["math", "code", "x"]), max_size=2))))
    return out


def datum_content(d):
    """Everything a Datum carries, as plain comparable values."""
    tokens = d.model_input.to_ints()
    assert all(type(x) is int for x in tokens)
    assert list(d.loss_fn_inputs) == ["target_tokens", "logprobs", "advantages"]
    out = {"model_input": tokens, "n_chunks": len(d.model_input.chunks)}
    for key, td in d.loss_fn_inputs.items():
        arr = td.to_numpy()
        out[key] = (td.dtype, list(td.shape), str(arr.dtype), arr.tolist())
    return out


def _python_code() -> None:
    """A Python function's start: where 3.12+ runs a collection that is due."""


def young_collections(call: Callable[[], Any]) -> tuple[int, int]:
    """How many automatic collections ran inside ``call()``, and right
    after it, at the caller's first allocation (any generation: 3.14's
    incremental collector reports its young collections as generation 1).
    Exact on 3.11, where a collection runs at the allocation that sets it
    off; from 3.12 it waits for the interpreter's next check (a Python
    function's start, here), so one due inside the call may be counted
    after it."""
    runs: list[str] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append("collection")

    gc.collect()
    gc.callbacks.append(record)
    try:
        result = call()  # held: freeing its objects would lower the count due
        inside = len(runs)
        made_after = set()  # the caller's first container (sets have no free list)
        _python_code()  # from 3.12 on, a collection due runs here, not at the allocation
        after = len(runs) - inside
        assert result is not None and made_after is not None
        return inside, after
    finally:
        gc.callbacks.remove(record)


def pytest_report_header(config):
    import tinker
    import tinker_rl_data

    return f"tinker_rl_data {tinker_rl_data.__version__} from {tinker_rl_data.__file__}; tinker {tinker.__version__}"


def pytest_sessionstart(session):
    # The tests are of the installed wheel, not of the source tree.
    import tinker_rl_data

    assert "site-packages" in tinker_rl_data.__file__, tinker_rl_data.__file__
