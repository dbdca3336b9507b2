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

To switch a cookbook training run, before it starts::

    import tinker_rl_data.cookbook
    tinker_rl_data.cookbook.install()

which replaces the four functions in every loaded tinker_cookbook module that
holds them (``rl.data_processing``, ``rl.train``, the distillation trainers),
so modules imported later get them too, and with them the rest of the RL
step's per-Datum and per-group work (``_step.py``)::

    compute_kl_sample_train(data_D, training_logprobs_D)        # rl.metrics
    compute_trajectory_metrics(trajectory_groups_P, taglist_P)  # rl.metric_util
    remove_mask(datum)            # rl.train._remove_mask
    rollout_usage(trajectory_groups), training_usage(data_D)    # rl.train

:func:`uninstall` puts the originals back.

Errors are raised where the cookbook raises them, of the same class or a
subclass: the cookbook's ``DataValidationError`` cases and missing logprobs
raise :class:`DataValidationError` (this module's), a subclass of
``tinker_cookbook.exceptions.DataValidationError`` when tinker_cookbook is
importable and always of ``ValueError``; our messages also say where
(``group G, trajectory T, transition U: ...``).

No import of tinker_cookbook or torch happens at import of this module.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Iterable, Sequence

from . import _core
from . import wire as _wire
from ._step import (
    HOMES as _STEP_HOMES,
)
from ._step import ORIGINALS as _step_originals
from ._step import (
    compute_kl_sample_train,
    compute_trajectory_metrics,
    remove_mask,
    rollout_usage,
    training_usage,
)

__all__ = [
    "assemble_training_data",
    "compute_advantages",
    "compute_kl_sample_train",
    "compute_trajectory_metrics",
    "install",
    "remove_constant_reward_groups",
    "remove_mask",
    "rollout_usage",
    "trajectory_to_data",
    "training_usage",
    "uninstall",
]

#: The tinker-cookbook version whose behaviour this module reproduces and
#: whose tests (tests/test_cookbook.py) it passes.
VERIFIED_COOKBOOK_VERSION = "0.6.1"

# The cookbook's own logger (``logging.getLogger(__name__)`` in its
# rl/data_processing.py), so that filters and handlers set up for the
# cookbook's warning see ours.
logger = logging.getLogger("tinker_cookbook.rl.data_processing")

_COOKBOOK_MODULE = "tinker_cookbook.rl.data_processing"
#: The cookbook module each replaced function is defined in, by its name there.
_HOMES = {
    **dict.fromkeys(
        ("compute_advantages", "assemble_training_data", "trajectory_to_data", "remove_constant_reward_groups"),
        _COOKBOOK_MODULE,
    ),
    **_STEP_HOMES,
}


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
    from ._build import cookbook_datums

    try:
        # Made by the core with the GC still paused, and returned as it is:
        # the young collection due for the new objects runs at the caller's
        # next allocation.
        return cookbook_datums(groups, advantages, include_provenance)
    except ValueError as exc:
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
# install / uninstall

# The cookbook's functions install() replaced (the dict _step looks them up in).
_originals = _step_originals
# Whether install() installed the request encoder (so uninstall() removes it).
_wire_installed = False


def _ours() -> dict[str, Any]:
    module = sys.modules[__name__]
    return {name: getattr(module, name.lstrip("_")) for name in _HOMES}


def _cookbook_modules() -> list[Any]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and (name == "tinker_cookbook" or name.startswith("tinker_cookbook."))
    ]


def _replace(old_by_name: dict[str, Any], new_by_name: dict[str, Any]) -> int:
    """In every loaded tinker_cookbook module, every attribute that is one of
    ``old_by_name``'s functions (under any name) becomes its counterpart."""
    counterpart = {id(old_by_name[name]): new_by_name[name] for name in _HOMES}
    olds = {id(f): f for f in old_by_name.values()}
    n = 0
    for module in _cookbook_modules():
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if id(value) in olds and olds[id(value)] is value:
                setattr(module, attr, counterpart[id(value)])
                n += 1
    return n


def install(force: bool = False, wire: bool = True) -> None:
    """Use this module's functions in tinker_cookbook, and (``wire=True``)
    tinker_rl_data's request encoder in tinker (:func:`tinker_rl_data.install`).

    Replaces ``compute_advantages``, ``assemble_training_data``,
    ``trajectory_to_data`` and ``remove_constant_reward_groups`` (of
    ``rl.data_processing``), ``compute_kl_sample_train`` (``rl.metrics``),
    ``compute_trajectory_metrics`` (``rl.metric_util``), ``_remove_mask``,
    ``rollout_usage`` and ``training_usage`` (``rl.train``) in the module
    that defines each and in every other loaded tinker_cookbook module that
    holds them (``rl.train``, ``distillation.train_on_policy``,
    ``distillation.sdft``, ...); modules imported afterwards take them from
    there. Imports those four modules. Calling it again is harmless.

    Raises RuntimeError for a tinker-cookbook version other than
    ``VERIFIED_COOKBOOK_VERSION`` (whose behaviour has not been checked), or
    with ``wire=True`` a tinker version the encoder has not been checked
    against, unless ``force=True``; ImportError when tinker_cookbook is not
    installed.
    """
    global _wire_installed
    import tinker_cookbook

    version = getattr(tinker_cookbook, "__version__", None)
    if version != VERIFIED_COOKBOOK_VERSION and not force:
        raise RuntimeError(
            f"tinker_rl_data.cookbook reproduces tinker-cookbook {VERIFIED_COOKBOOK_VERSION}, "
            f"but tinker-cookbook {version} is installed: its data processing may differ. "
            "Call install(force=True) to use it anyway."
        )
    if wire and not _wire.installed():
        _wire.install(force=force)  # refuses an unverified tinker before anything is replaced
        _wire_installed = True
    homes = {module: importlib.import_module(module) for module in set(_HOMES.values())}
    ours = _ours()
    if not _originals:
        current = {name: getattr(homes[module], name) for name, module in _HOMES.items()}
        if any(current[name] is ours[name] for name in _HOMES):
            raise RuntimeError("tinker_cookbook already holds tinker_rl_data's functions")
        _originals.update(current)
    _replace(_originals, ours)


def uninstall() -> None:
    """Put the cookbook's own functions back wherever :func:`install` (or a
    module imported after it) placed ours, and tinker's encoder if
    :func:`install` installed ours. Harmless when not installed."""
    global _wire_installed
    if _wire_installed:
        _wire.uninstall()
        _wire_installed = False
    if not _originals:
        return
    _replace(_ours(), _originals)
    _originals.clear()
