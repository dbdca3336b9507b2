"""The direct construction path gives what tinker's public constructors give."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tinker
from hypothesis import given

from conftest import groups
from tinker_rl_data import compute_advantages
from tinker_rl_data import datums as rows


KNOWN_LAYOUT = tuple(int(x) for x in tinker.__version__.split(".")[:2]) >= (0, 38)
direct_only = pytest.mark.skipif(not rows.DIRECT_PATH, reason="this tinker uses the public constructors")


@pytest.mark.skipif(not KNOWN_LAYOUT, reason="older tinker: the public constructors are used")
def test_this_tinker_takes_the_direct_path():
    # tinker 0.38's layout is known; a change there must be noticed here.
    assert rows.DIRECT_PATH


@direct_only
@given(groups())
def test_direct_datums_are_field_for_field_public(batch):
    advantages = compute_advantages(batch)
    ours, our_meta, our_fitted = rows._direct(batch, advantages)
    theirs, their_meta, their_fitted = rows._public(batch, advantages)
    assert len(ours) == len(theirs)
    assert all(map(rows.same_datum, ours, theirs))
    assert our_meta == their_meta and our_fitted == their_fitted
    # Metadata tags are each the row's own list, not the group's.
    for m in our_meta:
        assert m.tags == list(batch[m.group_idx].tags) and m.tags is not batch[m.group_idx].tags


def public(tokens, target):
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tinker.TensorData.from_numpy(target)},
    )


def test_the_comparison_can_fail():
    a = public([1, 2], np.array([2, 3]))
    assert rows.same_datum(a, public([1, 2], np.array([2, 3])))
    assert not rows.same_datum(a, public([1, 3], np.array([2, 3])))
    assert not rows.same_datum(a, public([1, 2], np.array([2, 4])))
    assert not rows.same_datum(a, public([1, 2], np.array([2.0, 3.0])))


def test_gc_paused_restores_the_previous_state():
    assert gc.isenabled()
    with rows.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with rows.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@direct_only
def test_only_containers_of_atoms_are_untracked():
    """The direct path takes token lists, shape lists and pydantic's
    field-name sets off the cyclic GC's books (they hold only ints or strs,
    so they can be in no cycle); every other container stays tracked."""
    batch = rows._probe_batch()
    (datum, *_), (meta, *_), _ = rows._direct(batch, [[0.5, -0.5]])
    chunk = datum.model_input.chunks[0]
    untracked = [chunk.tokens, chunk.__pydantic_fields_set__, datum.model_input.__pydantic_fields_set__]
    untracked += [td.shape for td in datum.loss_fn_inputs.values()]
    assert not any(gc.is_tracked(c) for c in untracked)
    assert all(type(x) in (int, str) for c in untracked for x in c)
    tracked = [datum, datum.loss_fn_inputs, datum.model_input, datum.model_input.chunks, chunk, meta, meta.tags]
    tracked += list(datum.loss_fn_inputs.values())
    assert all(gc.is_tracked(c) for c in tracked)
