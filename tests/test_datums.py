"""The direct construction path gives what tinker's public constructors give."""

from __future__ import annotations

import numpy as np
import pytest
import tinker

from tinker_rl_data import datums as wrapping


def public(tokens, target, logprobs, advantages):
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(target),
            "logprobs": tinker.TensorData.from_numpy(logprobs),
            "advantages": tinker.TensorData.from_numpy(advantages),
        },
    )


def rows(n):
    rng = np.random.default_rng(n)
    return (
        rng.integers(0, 2**31 - 1, n).tolist(),
        rng.integers(0, 2**31 - 1, n).astype(np.int64),
        rng.standard_normal(n).astype(np.float32),
        rng.standard_normal(n).astype(np.float32),
    )


def test_this_tinker_takes_the_direct_path():
    # tinker 0.38's layout is known; a change there must be noticed here.
    assert wrapping.DIRECT_PATH


@pytest.mark.parametrize("n", [1, 2, 17, 1000])
def test_direct_datum_is_field_for_field_public(n):
    args = rows(n)
    offsets = np.array([0, n], dtype=np.int64)
    (ours,) = wrapping.wrap_rows([args[0]], *args[1:], offsets)
    assert wrapping.same_datum(ours, public(*args))
    # and the comparison can fail: a different token, a different dtype
    changed = [args[0][0] + 1] + args[0][1:]
    assert not wrapping.same_datum(ours, public(changed, *args[1:]))
    assert not wrapping.same_datum(ours, public(args[0], args[1].astype(np.float64), *args[2:]))


def test_gc_paused_restores_the_previous_state():
    import gc

    assert gc.isenabled()
    with wrapping.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with wrapping.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
