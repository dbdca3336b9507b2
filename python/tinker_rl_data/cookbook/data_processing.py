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

Errors are raised where the cookbook raises them, of the same class or a
subclass: the cookbook's ``DataValidationError`` cases and missing logprobs
raise :class:`DataValidationError` (this module's), a subclass of
``tinker_cookbook.exceptions.DataValidationError`` when tinker_cookbook is
importable and always of ``ValueError``; our messages also say where
(``group G, trajectory T, transition U: ...``).

No import of tinker_cookbook or torch happens at import of this module.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from typing import Any, Callable, Iterable, Sequence

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
    """The group's ``get_total_rewards()`` when it has the method (the
    cookbook's TrajectoryGroup), else the same sum read by attribute: each
    trajectory's transition rewards plus its final reward, lengths checked
    as the cookbook's safezip does."""
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
    groups: list[Any], advantages: list[list[float]], include_provenance: bool, strip_location: str = ""
) -> tuple[list[Any], list[dict[str, int]]]:
    """One core call: the Datums and their metadata dicts; provenance
    attached, core errors mapped."""
    from .. import _core
    from ..rows import cookbook_datums

    try:
        # Made by the core with the GC still paused, and returned as it is:
        # the young collection due for the new objects runs at the caller's
        # next allocation.
        return cookbook_datums(groups, advantages, include_provenance)
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


def assemble_training_data(
    trajectory_groups_P: Iterable[Any], advantages_P: Iterable[Any], include_provenance: bool = True
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

    result = _assemble(groups, advantages, include_provenance)

    if pending is not None:
        if type(pending) is ValueError and str(pending).startswith("zip() argument"):
            # The cookbook's safezip raises this ValueError; ours says where.
            what = "the trajectories and their advantages" if where else "trajectory_groups_P and advantages_P"
            raise ValueError(f"{where}{what} differ in length ({pending})") from None
        raise pending
    return result


def trajectory_to_data(traj: Any, traj_advantage: float, include_provenance: bool = True) -> list[Any]:
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

    ``traj_advantage`` is taken as ``float(traj_advantage)``, as
    ``assemble_training_data`` passes it.
    """
    where = "group 0, trajectory 0, "
    return _assemble([_GroupView([traj])], [[float(traj_advantage)]], include_provenance, strip_location=where)[0]


# --------------------------------------------------------------------------
# The pieces: each function fitted to the installed cookbook's signature


def fitted(mine: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``make`` of a piece replacing the cookbook's function by ``mine``:
    tinker-cookbook 0.5.x's data processing has no ``include_provenance``
    argument and attaches no provenance, so ours is called with
    ``include_provenance=False`` there. Raises TypeError when the
    parameters differ otherwise (the piece then stays out)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        theirs = list(inspect.signature(original).parameters)
        params = list(inspect.signature(mine).parameters)
        if "include_provenance" in params and "include_provenance" not in theirs:
            params.remove("include_provenance")
            if params != theirs:
                raise TypeError(f"the cookbook's {original.__name__} takes ({', '.join(theirs)})")

            @functools.wraps(mine)
            def without_provenance(*args: Any, **kwargs: Any) -> Any:
                return mine(*args, include_provenance=False, **kwargs)

            without_provenance.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
            return without_provenance
        if params != theirs:
            raise TypeError(f"the cookbook's {original.__name__} takes ({', '.join(theirs)}), ours ({', '.join(params)})")
        return mine

    return make


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


def _piece(name: str, mine: Callable[..., Any], probe: Callable[[Any, Any], None]) -> Piece:
    return Piece("tinker_cookbook.rl.data_processing", name, "data", fitted(mine), probe)


PIECES = (
    _piece("compute_advantages", compute_advantages, probe_compute_advantages),
    _piece("assemble_training_data", assemble_training_data, probe_assemble_training_data),
    _piece("trajectory_to_data", trajectory_to_data, probe_trajectory_to_data),
    _piece("remove_constant_reward_groups", remove_constant_reward_groups, probe_remove_constant_reward_groups),
)

FEATURE = Feature("data", "cookbook data processing", PIECES, switch=False)
