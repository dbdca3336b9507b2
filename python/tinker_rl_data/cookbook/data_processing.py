"""A fast, exact drop-in for tinker-cookbook 0.6.1's ``tinker_cookbook.rl.data_processing``.

Same names, signatures and results as the cookbook's module::

    compute_advantages(trajectory_groups_P)
    assemble_training_data(trajectory_groups_P, advantages_P, include_provenance=True)
    trajectory_to_data(traj, traj_advantage, include_provenance=True)
    remove_constant_reward_groups(trajectory_groups_P)

Inputs are the cookbook's own objects (``TrajectoryGroup``, ``Trajectory``,
``Transition``, ``TokensWithLogprobs``, ``tinker.ModelInput``), read by
attribute: using this module needs neither tinker_cookbook nor, except for
:func:`compute_advantages`, torch. The per-position work (merging turns into
Datums, targets, logprobs, advantages, masks, provenance spans) is one call
of the Rust core; this module does per-group and per-Datum Python only.

Its pieces (:data:`PIECES`, feature ``data``) put the four functions into
every loaded tinker_cookbook module that holds them (``rl.data_processing``,
``rl.train``, the distillation trainers) when
:func:`tinker_rl_data.cookbook.install` runs.

An input the native pass refuses (the cookbook's ``DataValidationError``
cases, missing logprobs, a logprob list that does not match its tokens, a
missing attribute, a token that is not an integer or outside 0..2**31-1, a
length mismatch of groups and advantages) goes to the cookbook's own
function: the one :func:`tinker_rl_data.cookbook.install` replaced, or,
called directly, ``tinker_cookbook.rl.data_processing``'s as that module
holds it. So the outcome there is the cookbook's by construction: its
result where it makes one (a token above 2**31-1, which tinker's encoder
refuses when the request is made; under ``python -O``, a Datum whose
logprobs do not match its tokens), else its exception (class, message,
attributes), to which our message, saying where (``group G, trajectory T,
transition U: ...``), is added as a note (PEP 678) where it says more.
Inputs the cookbook reads otherwise than the native pass would (logprobs
that are not a list, or hold what is neither a ``float`` nor an exact
``int`` within i64: a bool, a numpy integer, a ``Decimal``; a token that is
not an ``int``, a numpy integer or a buffer of them, an action without
``sequence_id``) go to it as well: the core finds them as it reads, with no
Python step per token; so does an advantage given to ``trajectory_to_data``
that is not a ``float``. The cookbook reads the batch again, so user code in
it (a property) runs again; one-shot iterators are not read twice: where
the groups or advantages are one, or the native pass has read one inside
the batch (a generator of transitions, of chunks), ours raises its own
exception then, with a note saying why. Called directly, the fallback is
the cookbook's own code, never a wrapper the cookbook's module holds around
ours (:func:`_module_function`).

Without tinker_cookbook, ours raises its own exceptions: the cookbook's
``DataValidationError`` cases and missing logprobs raise
:class:`DataValidationError` (this module's, a ``ValueError``; a subclass
of ``tinker_cookbook.exceptions.DataValidationError`` where that is
importable), the others the classes of the contract's §4, all saying where;
and it reads buffers of numbers, tuples of logprobs and actions without
``sequence_id``.

No import of tinker_cookbook or torch happens at import of this module.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable, Iterable, Sequence

from .. import features
from ..errors import Unsupported, left_to
from ..patch.feature import Feature
from ..patch.piece import Piece, check, outcome, same_outcome
from .probe_inputs import CookbookBatches, assembly_args, datum_bytes

__all__ = [
    "PIECES",
    "assemble_training_data",
    "compute_advantages",
    "remove_constant_reward_groups",
    "trajectory_to_data",
]

# The cookbook's own logger (``logging.getLogger(__name__)`` in its
# rl/data_processing.py), so that filters and handlers set up for the
# cookbook's warning see ours.
logger = logging.getLogger("tinker_cookbook.rl.data_processing")


# --------------------------------------------------------------------------
# Errors


_error_class: type[ValueError] | None = None


def _data_validation_error() -> type[ValueError]:
    """This module's DataValidationError: a subclass of the cookbook's
    ``DataValidationError`` when tinker_cookbook is importable (and so of
    ``ValueError``), else of ``ValueError`` alone. Built on first use so that
    importing this module does not import tinker_cookbook."""
    global _error_class
    if _error_class is None:
        bases: tuple[type, ...]
        try:
            from tinker_cookbook.exceptions import DataValidationError as CookbookError
        except ImportError:
            bases = (ValueError,)
        else:
            bases = (CookbookError,) if issubclass(CookbookError, ValueError) else (CookbookError, ValueError)
        _error_class = type(
            "DataValidationError",
            bases,
            {
                "__module__": __name__,
                "__qualname__": "DataValidationError",
                "__doc__": "A trajectory the cookbook's data processing rejects "
                "(missing logprobs, fewer than 2 tokens, a sequence ending in an image); "
                "the message starts with where.",
            },
        )
    return _error_class


def __getattr__(name: str) -> Any:
    # ``tinker_rl_data.cookbook.DataValidationError`` exists (and pickles)
    # without importing tinker_cookbook at import of this module.
    if name == "DataValidationError":
        return _data_validation_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------
# Rewards and advantages


def _total_rewards(group: Any) -> list[Any]:
    """The group's ``get_total_rewards()``, as the cookbook calls it. Only
    where tinker_cookbook is not importable, a group without the method
    gives the same sum read by attribute: each trajectory's transition
    rewards plus its final reward, lengths checked as the cookbook's
    safezip does."""
    if _cookbook_present():
        return group.get_total_rewards()
    method = getattr(group, "get_total_rewards", None)
    if callable(method):
        return method()
    return [
        sum(transition.reward for transition in trajectory.transitions) + final_reward
        for trajectory, final_reward in zip(group.trajectories_G, group.final_rewards_G, strict=True)
    ]


def compute_advantages(trajectory_groups_P: Iterable[Any]) -> list[Any]:
    """Per group, the total rewards minus their mean, as the cookbook computes them.

    Returns a list (one per group) of torch tensors of shape ``(G,)``,
    bit-identical to tinker_cookbook 0.6.1's ``compute_advantages``: the
    same torch operations on the same values (``torch.tensor(rewards)``
    then ``rewards - rewards.mean()``; float32 for float rewards). torch is
    imported here, when called, not at import of this module.
    """
    import torch

    advantages_P = []
    for traj_group in trajectory_groups_P:
        rewards_G = torch.tensor(_total_rewards(traj_group))
        advantages_P.append(rewards_G - rewards_G.mean())
    return advantages_P


def remove_constant_reward_groups(trajectory_groups_P: Sequence[Any]) -> Any:
    """The groups whose trajectories' total rewards are not all equal.

    As the cookbook: when no group is left, logs the warning "All rewards
    are uniform. There will be no gradient" on the logger
    ``tinker_cookbook.rl.data_processing`` and returns
    ``trajectory_groups_P[0:1]`` (a singleton, or empty for an empty input)
    so downstream code that expects a non-empty list does not break.
    """
    new_groups = []
    for group in trajectory_groups_P:
        rewards = _total_rewards(group)
        if not all(x == rewards[0] for x in rewards):
            new_groups.append(group)
    if not new_groups:
        logger.warning("All rewards are uniform. There will be no gradient")
        return trajectory_groups_P[0:1]
    return new_groups


# --------------------------------------------------------------------------
# Training data


class _GroupView:
    """What the core reads of a group: the trajectories, as already iterated
    here (so a prefix of them when the batch stops early)."""

    __slots__ = ("trajectories_G",)

    def __init__(self, trajectories: list[Any]) -> None:
        self.trajectories_G = trajectories


def _assemble(
    groups: list[Any],
    advantages: list[list[float]],
    include_provenance: bool,
    strip_location: str = "",
    exact: bool = False,
) -> tuple[list[Any], list[dict[str, int]]]:
    """One core call: the Datums and their metadata dicts; provenance
    attached, core errors mapped. ``exact``: an input the cookbook reads
    otherwise than the core would accept it (a token that is no ``int``,
    logprobs that are no list, an action without ``sequence_id``) raises
    :class:`~tinker_rl_data.errors.Unsupported`."""
    from .. import _core
    from ..rows import cookbook_datums

    try:
        # Made by the core with the GC still paused, and returned as it is:
        # the young collection due for the new objects runs at the caller's
        # next allocation.
        return cookbook_datums(groups, advantages, include_provenance, exact)
    except _core.ValidationError as exc:
        # Only the core's own DataValidationError cases: an exception raised
        # by user code while reading passes through as it is.
        message = str(exc)
        if strip_location and message.startswith(strip_location):
            message = message[len(strip_location) :]
        raise _data_validation_error()(message) from exc


_SEQUENCES = (list, tuple)


def _exact_pairs(trajectories: Any, values: Any) -> bool:
    """Whether the trajectories and advantages are a list or tuple each, of
    one length, the advantages all exact floats: pairing them runs no user
    code and cannot fail."""
    return (
        type(trajectories) in _SEQUENCES
        and type(values) in _SEQUENCES
        and len(trajectories) == len(values)
        and (not values or set(map(type, values)) == {float})
    )


def _plain_values(advantages_G: Any) -> Any:
    """A 1-D torch tensor's values as Python numbers (``tolist()``: one call,
    not one 0-d tensor per trajectory); ``float()`` of each is what it is of
    the tensor's own items. Anything else as it is."""
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and type(advantages_G) is torch.Tensor
        and advantages_G.dim() == 1
        and not advantages_G.is_complex()
    ):
        return advantages_G.tolist()
    return advantages_G


def _native_assemble_training_data(
    trajectory_groups_P: Iterable[Any],
    advantages_P: Iterable[Any],
    include_provenance: bool = True,
    *,
    exact: bool = False,
) -> tuple[list[Any], list[dict[str, int]]]:
    """Training Datums for every trajectory of every group, and their metadata.

    The result of tinker_cookbook 0.6.1's ``assemble_training_data``, Datum
    for Datum: each trajectory is cut into Datums as ``trajectory_to_data``
    does (with advantage ``float(advantages_P[g][t])``), in batch order; the
    metadata list holds ``{"group_idx": g, "traj_idx": t}`` per Datum.

    Groups and advantages are paired as the cookbook's ``safezip`` does
    (``zip(strict=True)``, outer and per group): a length mismatch raises
    ``ValueError`` (whose message here starts with where) after the pairs
    before it have been processed, so an error in those is raised first,
    as in the cookbook. The same holds for an advantage that ``float()``
    rejects.

    A batch the native pass refuses is left to the cookbook's own function
    (see the module's doc): its result, or its exception.
    """
    groups: list[Any] = []
    advantages: list[list[float]] = []
    pending: Exception | None = None
    where = ""
    try:
        for i_group, (traj_group, advantages_G) in enumerate(zip(trajectory_groups_P, advantages_P, strict=True)):
            where = f"group {i_group}: "
            values = _plain_values(advantages_G)
            trajectories_G = traj_group.trajectories_G
            if isinstance(trajectories_G, Iterator):
                _python_reads.one_shot = getattr(_python_reads, "one_shot", 0) + 1
            if _exact_pairs(trajectories_G, values):
                # What the loop below would make, without a Python step per
                # trajectory: float() of a float is itself and runs no code.
                groups.append(_GroupView(list(trajectories_G)))
                advantages.append(list(values))
                where = ""
                continue
            trajectories: list[Any] = []
            row: list[float] = []
            groups.append(_GroupView(trajectories))
            advantages.append(row)
            for i_traj, (traj, traj_advantage) in enumerate(zip(trajectories_G, values, strict=True)):
                where = f"group {i_group}, trajectory {i_traj}: "
                row.append(float(traj_advantage))
                trajectories.append(traj)
                where = f"group {i_group}: "
            where = ""
    except Exception as exc:  # raised after the pairs before it, as the cookbook does
        pending = exc

    result = _assemble(groups, advantages, include_provenance, exact=exact)

    if pending is not None:
        if type(pending) is ValueError and str(pending).startswith("zip() argument"):
            # The cookbook's safezip raises this ValueError; ours says where.
            what = "the trajectories and their advantages" if where else "trajectory_groups_P and advantages_P"
            raise ValueError(f"{where}{what} differ in length ({pending})") from None
        raise pending
    return result


def _native_trajectory_to_data(
    traj: Any, traj_advantage: float, include_provenance: bool = True, *, exact: bool = False
) -> list[Any]:
    """The Datums of one trajectory, as tinker_cookbook 0.6.1's ``trajectory_to_data``.

    Consecutive transitions merge into one Datum while each observation
    extends the sequence so far (observation and action tokens, image
    chunks compared as elements); an observation that does not starts a
    new Datum. Each Datum has ``loss_fn_inputs`` ``target_tokens``,
    ``logprobs``, ``advantages``, ``mask`` with the cookbook's dtypes and
    values (observation positions: logprob 0.0, advantage 0, mask 0.0;
    action positions: the sampled logprobs, ``traj_advantage``, mask 1.0,
    or advantage 0.0 and mask 0.0 when the transition's
    ``metrics["parse_error_masked"] >= 1``), and provenance spans when the
    cookbook attaches them (``include_provenance``, every action in the
    Datum with a ``sequence_id``, and at least one action token a target).

    A trajectory the native pass refuses is left to the cookbook's own
    function, as in ``assemble_training_data``; so is an advantage that is
    not a ``float`` (with an int, the cookbook's advantages are int64).
    Without tinker_cookbook, ``traj_advantage`` is taken as
    ``float(traj_advantage)``, as ``assemble_training_data`` passes it.
    """
    if exact and type(traj_advantage) is not float:
        # The cookbook puts it in the advantages as it is (ints make them int64).
        raise Unsupported(f"traj_advantage is a {type(traj_advantage).__name__}, not a float")
    where = _NOT_WHERE["trajectory_to_data"]
    groups, advantages = [_GroupView([traj])], [[float(traj_advantage)]]
    return _assemble(groups, advantages, include_provenance, strip_location=where, exact=exact)[0]


# --------------------------------------------------------------------------
# The cookbook's outcome where the native pass refuses

_MODULE = "tinker_cookbook.rl.data_processing"

# One-shot iterators this thread's Python part of a pass read (a group's
# ``trajectories_G``); the core counts those it reads itself.
_python_reads = threading.local()


def _one_shot_reads() -> int:
    from .. import _core

    return _core.one_shot_reads() + getattr(_python_reads, "one_shot", 0)

# Set while this thread runs the cookbook's own function in place of ours:
# the cookbook's assemble_training_data calls trajectory_to_data through its
# module, which holds ours once installed, and ours then calls the
# cookbook's at once, so that what runs is the cookbook's code throughout.
_in_cookbook = threading.local()

# What the location of trajectory_to_data's messages leaves out: it is of
# one trajectory.
_NOT_WHERE = {"trajectory_to_data": "group 0, trajectory 0, "}

# The location our messages start with.
_LOCATION = re.compile(r"^group \d+(?:, trajectory \d+)?(?:, transition \d+)?: ")


@functools.cache
def _cookbook_present() -> bool:
    """Whether tinker_cookbook is importable (asked once, without importing it)."""
    try:
        return importlib.util.find_spec("tinker_cookbook") is not None
    except (ImportError, ValueError):
        return False


# Set on the functions install() puts into the cookbook's modules: each
# falls back to the function it replaced.
_INSTALLED = "_tinker_rl_data_installed"


def _module_function(name: str) -> Callable[[], Callable[..., Any] | None]:
    """The fallback of our functions called directly: the cookbook's own
    ``name``, or None where its module does not import. Where ours is
    installed, the module's (it falls back to what it replaced); where the
    module holds the cookbook's function, that one; where it holds anything
    else (a wrapper around ours, a ``partial``, a mock, ours called
    directly), the cookbook's own code from a private copy of the module:
    a wrapper around ours would only come back here."""

    def original() -> Callable[..., Any] | None:
        try:
            module = importlib.import_module(_MODULE)
        except Exception:  # not installed, or its torch or tinker does not import
            return None
        held = getattr(module, name, None)
        # (`is True`: a mock answers any attribute with a truthy mock)
        if getattr(held, _INSTALLED, False) is True or getattr(held, "__globals__", None) is vars(module):
            return held
        copy = _private_copy()
        return getattr(copy, name, None) if copy is not None else None

    return original


@functools.cache
def _private_copy() -> Any:
    """The cookbook's data-processing module run again into a module object
    of its own (not in ``sys.modules``): its functions are the cookbook's
    code, calling one another, whatever the real module now holds. None if
    it cannot be loaded."""
    try:
        spec = importlib.util.find_spec(_MODULE)
        if spec is None or spec.loader is None:
            return None
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
    except Exception:
        return None
    return copy


def _any_input(*args: Any, **kwargs: Any) -> bool:
    return True


def _replayable_assembly(trajectory_groups_P: Any, advantages_P: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether the cookbook's function can read the batch after ours did:
    no one-shot iterator for the groups, the advantages or a group's
    advantages."""
    try:
        if isinstance(trajectory_groups_P, Iterator) or isinstance(advantages_P, Iterator):
            return False
        return not any(isinstance(advantages_G, Iterator) for advantages_G in advantages_P)
    except Exception:  # advantages_P is not iterable: the cookbook says so
        return True


def _cookbook_outcome(
    name: str, original: Callable[..., Any], refused: Exception, strip: str, args: Any, kwargs: Any
) -> Any:
    """The cookbook's ``original`` on the input ours refused: its result, or
    its exception with our located message (less ``strip``) as a note where
    that says more."""
    message = str(refused).removeprefix(strip)
    original = left_to(original, name, f"{type(refused).__name__}: {_LOCATION.sub('', message)}")
    was = getattr(_in_cookbook, "active", False)
    _in_cookbook.active = True
    try:
        return original(*args, **kwargs)
    except Exception as theirs:
        if message and message != str(theirs) and message not in getattr(theirs, "__notes__", ()):
            theirs.add_note(message)
        raise
    finally:
        _in_cookbook.active = was


def _front(
    name: str,
    native: Callable[..., Any],
    original_of: Callable[[], Callable[..., Any] | None],
    exact: Callable[[], bool],
    replayable: Callable[..., bool],
    fixed: dict[str, Any],
    signature: inspect.Signature,
) -> Callable[..., Any]:
    """Ours: ``native`` (with the ``fixed`` arguments), and for an input it
    refuses, the outcome of the cookbook's function ``original_of()``
    (called with the caller's arguments) when there is one and the input
    can be read again; else ours as it is. ``exact()``: whether the native
    pass leaves to the cookbook what the cookbook reads otherwise than it
    would accept it."""

    def front(*args: Any, **kwargs: Any) -> Any:
        if getattr(_in_cookbook, "active", False):
            original = original_of()
            if original is not None and original is not front:
                return original(*args, **kwargs)
        reads = _one_shot_reads()
        try:
            return native(*args, **fixed, **kwargs, exact=exact())
        except Exception as exc:  # the cookbook's function decides (below)
            refused = exc
        if _one_shot_reads() != reads:
            # The cookbook's function would find the iterators read: fewer
            # Datums, silently. Ours says what it refused instead.
            _read_once(refused)
        original = original_of() if replayable(*args, **kwargs) else None
        if original is None or original is front:
            if isinstance(refused, Unsupported):  # no cookbook to leave it to after all
                return native(*args, **fixed, **kwargs)
            raise refused
        return _cookbook_outcome(name, original, refused, _NOT_WHERE.get(name, ""), args, kwargs)

    functools.update_wrapper(front, native)
    del front.__wrapped__  # type: ignore[attr-defined]
    front.__name__ = front.__qualname__ = name
    front.__signature__ = signature  # type: ignore[attr-defined]
    return front


_ONE_SHOT_NOTE = (
    "not left to tinker_cookbook's own function: the input holds a one-shot iterator "
    "(a generator) that was read here, and would be found exhausted there; pass a list"
)


def _read_once(refused: Exception) -> None:
    """Raises ``refused`` as ours, for an input whose one-shot iterators the
    native pass has read: an input the cookbook reads otherwise
    (``Unsupported``) as a ``TypeError`` saying where and what."""
    if isinstance(refused, Unsupported):
        error = TypeError(str(refused))
        error.add_note(_ONE_SHOT_NOTE)
        raise error from None
    refused.add_note(_ONE_SHOT_NOTE)
    raise refused


def _public(native: Callable[..., Any]) -> inspect.Signature:
    """``native``'s signature without its keyword-only ``exact``."""
    sig = inspect.signature(native)
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "exact"])


# --------------------------------------------------------------------------
# The pieces: each function fitted to the installed cookbook's signature


def fitted(
    name: str, native: Callable[..., Any], replayable: Callable[..., bool] = _any_input
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``make`` of a piece replacing the cookbook's function by ours
    around ``native``, falling back to the ``original`` it replaces.
    tinker-cookbook 0.5.x's data processing has no ``include_provenance``
    argument and attaches no provenance, so ``native`` is called with
    ``include_provenance=False`` there. Raises TypeError when the
    parameters differ otherwise (the piece then stays out)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        theirs = list(inspect.signature(original).parameters)
        signature = _public(native)
        params = list(signature.parameters)
        fixed: dict[str, Any] = {}
        if "include_provenance" in params and "include_provenance" not in theirs:
            params.remove("include_provenance")
            if params != theirs:
                raise TypeError(f"the cookbook's {original.__name__} takes ({', '.join(theirs)})")
            fixed = {"include_provenance": False}
            signature = inspect.signature(original)
        if params != theirs:
            raise TypeError(f"the cookbook's {original.__name__} takes ({', '.join(theirs)}), ours ({', '.join(params)})")
        front = _front(name, native, lambda: original, lambda: True, replayable, fixed, signature)
        setattr(front, _INSTALLED, True)
        return front

    return make


def _direct(name: str, native: Callable[..., Any], replayable: Callable[..., bool] = _any_input) -> Callable[..., Any]:
    """Ours for calling directly: falls back to the cookbook's function as
    its module holds it when called; without tinker_cookbook, ours alone."""
    return _front(name, native, _module_function(name), _cookbook_present, replayable, {}, _public(native))


assemble_training_data = _direct("assemble_training_data", _native_assemble_training_data, _replayable_assembly)
trajectory_to_data = _direct("trajectory_to_data", _native_trajectory_to_data)


def _tensor_values(advantages: Any) -> list[tuple[Any, ...]]:
    return [(str(a.dtype), tuple(a.shape), a.tolist()) for a in advantages]


def probe_compute_advantages(original: Any, ours: Any) -> None:
    for i, batch in enumerate(CookbookBatches().batches()):
        theirs, mine = outcome(original, batch), outcome(ours, batch)
        if same_outcome(theirs, mine, f"batch {i}"):
            check(_tensor_values(theirs[1]) == _tensor_values(mine[1]), f"batch {i}: other advantages")


def probe_assemble_training_data(original: Any, ours: Any) -> None:
    cookbook = CookbookBatches()
    for i, batch in enumerate(cookbook.batches()):
        args = assembly_args(batch)
        theirs, mine = outcome(original, *args), outcome(ours, *args)
        if same_outcome(theirs, mine, f"batch {i}"):
            (their_data, their_meta), (my_data, my_meta) = theirs[1], mine[1]
            check(datum_bytes(their_data) == datum_bytes(my_data), f"batch {i}: other Datums")
            check(list(their_meta) == list(my_meta), f"batch {i}: other metadata")


def probe_trajectory_to_data(original: Any, ours: Any) -> None:
    cookbook = CookbookBatches()
    bad = cookbook.traj(cookbook.step(cookbook.ob(), []))  # fewer than 2 tokens: the cookbook raises
    for i, traj in enumerate([*cookbook.trajectories(), bad]):
        theirs, mine = outcome(original, traj, -0.75), outcome(ours, traj, -0.75)
        if same_outcome(theirs, mine, f"trajectory {i}"):
            check(datum_bytes(theirs[1]) == datum_bytes(mine[1]), f"trajectory {i}: other Datums")


def probe_remove_constant_reward_groups(original: Any, ours: Any) -> None:
    for i, batch in enumerate(CookbookBatches().batches()):
        theirs, mine = outcome(original, batch), outcome(ours, batch)
        if same_outcome(theirs, mine, f"batch {i}"):
            check([id(g) for g in theirs[1]] == [id(g) for g in mine[1]], f"batch {i}: other groups kept")


def _piece(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]], probe: Callable[[Any, Any], None]) -> Piece:
    return Piece(_MODULE, name, "data", make, probe)


def _as_it_is(mine: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``make`` of a piece whose function is ours whatever the original
    (the same Python as the cookbook's: nothing to leave to it)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        if list(inspect.signature(original).parameters) != list(inspect.signature(mine).parameters):
            raise TypeError(f"the cookbook's {original.__name__} takes other parameters")
        return mine

    return make


PIECES = (
    _piece("compute_advantages", _as_it_is(compute_advantages), probe_compute_advantages),
    _piece(
        "assemble_training_data",
        fitted("assemble_training_data", _native_assemble_training_data, _replayable_assembly),
        probe_assemble_training_data,
    ),
    _piece("trajectory_to_data", fitted("trajectory_to_data", _native_trajectory_to_data), probe_trajectory_to_data),
    _piece("remove_constant_reward_groups", _as_it_is(remove_constant_reward_groups), probe_remove_constant_reward_groups),
)

FEATURE = features.register(__name__, Feature("data", "cookbook data processing", PIECES, switch=False))
