"""The direct construction path gives what tinker's public constructors give."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest
import tinker
from hypothesis import given

from conftest import groups
from support.tinker_bytes import wire_bytes
from tinker_rl_data import compute_advantages
from tinker_rl_data import rows
from tinker_rl_data.evsys.metadata import DatumMetadata


KNOWN_LAYOUT = tuple(int(x) for x in tinker.__version__.split(".")[:2]) >= (0, 38)
direct_only = pytest.mark.skipif(not rows.direct(), reason="this tinker uses the public constructors")


@pytest.mark.skipif(not KNOWN_LAYOUT, reason="older tinker: the public constructors are used")
def test_this_tinker_takes_the_direct_path():
    # tinker 0.38's layout is known; a change there must be noticed here.
    assert rows.direct()


def from_flat_rows(batch, advantages, merge_turns, numpy_tokens):
    """The Datums built in Python through tinker's public constructors from
    the core's flat rows (`assemble_arrays`): independent of the builder."""
    from tinker.types import EncodedTextChunk

    from tinker_rl_data import assemble_arrays

    rows_ = assemble_arrays(batch, advantages, merge_turns=merge_turns)
    bounds = rows_.row_offsets.tolist()
    datums = []
    for a, b in zip(bounds, bounds[1:]):
        inputs = rows_.input_tokens[a:b]
        if numpy_tokens:
            tokens = inputs.astype(np.int32)
            tokens.flags.writeable = False
            model_input = tinker.ModelInput(chunks=[EncodedTextChunk.model_construct(tokens=tokens)])
        else:
            model_input = tinker.ModelInput.from_ints(inputs.tolist())
        loss_fn_inputs = {
            "target_tokens": tinker.TensorData.from_numpy(rows_.target_tokens[a:b].copy()),
            "logprobs": tinker.TensorData.from_numpy(rows_.logprobs[a:b].copy()),
            "advantages": tinker.TensorData.from_numpy(rows_.advantages[a:b].copy()),
        }
        datums.append(tinker.Datum(model_input=model_input, loss_fn_inputs=loss_fn_inputs))
    return datums


@direct_only
@given(groups())
def test_direct_datums_are_field_for_field_public(batch):
    advantages = compute_advantages(batch)
    for merge_turns, numpy_tokens in [(False, False), (True, False), (False, True)]:
        direct = rows._evsys(batch, advantages, merge_turns, None, numpy_tokens, True, DatumMetadata)
        public = rows._evsys(batch, advantages, merge_turns, None, numpy_tokens, False, DatumMetadata)
        (ours, our_meta), our_fitted = direct.result, direct.fitted
        (theirs, their_meta), their_fitted = public.result, public.fitted
        assert len(ours) == len(theirs)
        assert all(map(rows.same_datum, ours, theirs))
        assert wire_bytes(ours) == wire_bytes(theirs)  # tinker's own encoder, independent of same_datum
        assert all(map(rows.same_datum, ours, from_flat_rows(batch, advantages, merge_turns, numpy_tokens)))
        assert our_meta == their_meta
        assert (our_fitted.padded, our_fitted.truncated, our_fitted.first) == (
            their_fitted.padded,
            their_fitted.truncated,
            their_fitted.first,
        )
    # Metadata tags are each the row's own list, not the group's.
    for m in our_meta:
        assert m.tags == list(batch[m.group_idx].tags) and m.tags is not batch[m.group_idx].tags


@direct_only
def test_cookbook_datums_built_directly_are_field_for_field_public():
    # Image chunks and both span arms (the cookbook suite compares many more
    # batches against tinker-cookbook itself, on whichever path is chosen).
    batch = rows._cookbook_probe_batch()
    ours, our_meta = rows._cookbook(batch, [[0.5]], True, True)
    theirs, their_meta = rows._cookbook(batch, [[0.5]], True, False)
    assert len(ours) == len(theirs) == 1 and ours[0].model_input_spans
    assert all(map(rows.same_datum, ours, theirs)) and our_meta == their_meta
    assert wire_bytes(ours) == wire_bytes(theirs)


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


def test_the_gc_state_is_restored_exactly():
    # The core pauses the GC while it builds objects, and leaves it as found.
    batch = rows._probe_batch()
    assert gc.isenabled()
    rows.build_datums(batch, [[0.5, -0.5]], False, None, False, DatumMetadata)
    assert gc.isenabled()
    gc.disable()
    try:
        rows.build_datums(batch, [[0.5, -0.5]], False, None, False, DatumMetadata)
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Toggling:
    """An evsys turn whose prompt_tokens property sets the GC to `to`."""

    completion_tokens, logprobs = [3, 4], [-0.5, -0.5]

    def __init__(self, to: bool) -> None:
        self.to = to

    @property
    def prompt_tokens(self):
        gc.enable() if self.to else gc.disable()
        return [1, 2]


class _TogglingAction:
    """A cookbook action whose tokens property sets the GC to `to`."""

    logprobs, sequence_id = [-0.5, -0.5], None

    def __init__(self, to: bool) -> None:
        self.to = to

    @property
    def tokens(self):
        gc.enable() if self.to else gc.disable()
        return [3, 4]


def _call_toggling(front_door: str, to: bool) -> None:
    from types import SimpleNamespace as NS

    import tinker_rl_data as trd
    from tinker_rl_data import cookbook
    from tinker_rl_data.evsys import Trajectory, TrajectoryGroup

    if front_door == "evsys":
        datums, _ = trd.assemble_training_data([TrajectoryGroup([Trajectory([_Toggling(to)], 1.0)])], [[0.5]])
    else:
        transition = NS(ob=tinker.ModelInput.from_ints([1, 2]), ac=_TogglingAction(to), reward=0.0, metrics={})
        datums = cookbook.trajectory_to_data(NS(transitions=[transition]), 0.5)
    assert len(datums) == 1


@pytest.mark.parametrize("front_door", ["evsys", "cookbook"])
@pytest.mark.parametrize("enabled", [True, False], ids=["gc-on", "gc-off"])
def test_user_code_that_toggles_the_gc_during_a_call(front_door, enabled):
    # A property that turns the collector on during the call: on after it,
    # as plain Python leaves it. One that turns it off finds it off already
    # (the call's pause): the call leaves it as the caller had it (contract §5).
    was = gc.isenabled()
    gc.enable() if enabled else gc.disable()
    try:
        _call_toggling(front_door, to=not enabled)
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


@direct_only
def test_only_containers_of_atoms_are_untracked():
    """The direct path takes off the cyclic GC's books the containers that
    hold only atoms or untracked objects and cannot be changed to hold more
    (frozen tinker classes; dicts, which CPython tracks again when a
    container is stored in them), and the lists of ints it makes (token
    lists, shapes); every other container stays tracked."""
    batch = rows._probe_batch()
    (datum, *_), (meta, *_) = rows._evsys(batch, [[0.5, -0.5]], False, None, False, True, DatumMetadata).result
    chunk = datum.model_input.chunks[0]
    untracked = [chunk.tokens, chunk.__pydantic_fields_set__, datum.model_input.__pydantic_fields_set__]
    untracked += [td.shape for td in datum.loss_fn_inputs.values()]
    assert not any(gc.is_tracked(c) for c in untracked)
    assert all(type(x) in (int, str) for c in untracked for x in c)
    frozen = [chunk, *datum.loss_fn_inputs.values()]
    assert not any(gc.is_tracked(c) for c in [*frozen, chunk.__dict__, datum.loss_fn_inputs])
    tracked = [datum, datum.model_input, datum.model_input.__dict__, datum.model_input.chunks, meta, meta.tags]
    assert all(gc.is_tracked(c) for c in tracked)


@direct_only
def test_a_cycle_made_through_a_tracked_container_is_still_collected():
    import weakref

    batch = rows._probe_batch()
    (datum, *_), _ = rows._evsys(batch, [[0.5, -0.5]], False, None, False, True, DatumMetadata).result
    datum.model_input.chunks.append(datum)  # a cycle, through the tracked chunks list
    chunk = weakref.ref(datum.model_input.chunks[0])
    del datum
    gc.collect()
    assert chunk() is None
    # A dict made untracked is tracked again when a container goes in.
    (datum, *_), _ = rows._evsys(batch, [[0.5, -0.5]], False, None, False, True, DatumMetadata).result
    datum.loss_fn_inputs["cycle"] = [datum]
    assert gc.is_tracked(datum.loss_fn_inputs)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "public-constructors"])
def test_user_code_run_while_reading_runs_with_the_gc_off_on_both_paths(monkeypatch, direct):
    import tinker_rl_data as trd
    from tinker_rl_data.evsys import Trajectory, TrajectoryGroup

    if direct and not rows.direct():
        pytest.skip("this tinker takes the public constructors")
    seen = []

    class Watching:
        completion_tokens, logprobs = [3, 4], [-0.5, -0.5]

        @property
        def prompt_tokens(self):
            seen.append(gc.isenabled())
            return [1, 2]

    monkeypatch.setattr(rows, "direct_construction", (lambda: None) if direct else (lambda: "as if tinker's layout were unknown"))
    assert gc.isenabled()
    datums, _ = trd.assemble_training_data([TrajectoryGroup([Trajectory([Watching()], 1.0)])], [[0.5]])
    assert len(datums) == 1 and seen and not any(seen), seen
    assert gc.isenabled()


def test_importing_the_package_builds_and_encodes_nothing():
    """The direct-construction check and tinker's classes are resolved when
    first needed (a first batch, or install()'s report), not at import."""
    script = (
        "import tinker_rl_data, tinker_rl_data.cookbook, tinker_rl_data.features as f\n"
        "from tinker_rl_data import rows\n"
        "f.declared()\n"
        "print(rows.classes.cache_info().misses, rows.direct_construction.cache_info().misses)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"]
