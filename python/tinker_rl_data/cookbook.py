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

import functools
import inspect
import logging
import sys
from typing import Any, Callable, Iterable, Sequence

from ._patch import VERIFIED_VERSIONS
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

#: The tinker-cookbook versions the tests run against (``_patch.py`` holds the list).
VERIFIED_COOKBOOK_VERSIONS = VERIFIED_VERSIONS["tinker_cookbook"]

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
    from . import _core
    from ._build import cookbook_datums

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
# install / uninstall (the patch layer, ``_patch.py``, does the work)

_OURS: dict[str, Callable[..., Any]] = {
    "compute_advantages": compute_advantages,
    "assemble_training_data": assemble_training_data,
    "trajectory_to_data": trajectory_to_data,
    "remove_constant_reward_groups": remove_constant_reward_groups,
    "compute_kl_sample_train": compute_kl_sample_train,
    "compute_trajectory_metrics": compute_trajectory_metrics,
    "_remove_mask": remove_mask,
    "rollout_usage": rollout_usage,
    "training_usage": training_usage,
}


def ours_for(original: Any) -> Any:
    """Our replacement of the cookbook's function ``original``, fitted to its
    signature: tinker-cookbook 0.5.x's data processing has no
    ``include_provenance`` argument and attaches no provenance, so ours is
    called with ``include_provenance=False`` there. Raises TypeError when
    the parameters differ otherwise (the piece then stays out)."""
    mine = _OURS[original.__name__]
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


def install(
    force: bool = False,
    wire: bool = True,
    *,
    gc: bool | None = True,
    coalesce: bool = False,
    kl: bool = True,
    strict: bool | None = None,
) -> Any:
    """Use this module's functions in tinker_cookbook and (``wire=True``)
    tinker_rl_data's request encoder in tinker; returns the report (which
    prints readably; :func:`tinker_rl_data.status` gives the same later).

    Replaces ``compute_advantages``, ``assemble_training_data``,
    ``trajectory_to_data`` and ``remove_constant_reward_groups`` (of
    ``rl.data_processing``), ``compute_kl_sample_train`` (``rl.metrics``),
    ``compute_trajectory_metrics`` (``rl.metric_util``), ``_remove_mask``,
    ``rollout_usage`` and ``training_usage`` (``rl.train``) in the module
    that defines each and in every other loaded tinker_cookbook module that
    holds the same function (``rl.train``, the distillation trainers);
    modules imported afterwards take them from there. Imports those modules.

    ``gc=True`` (the default) holds Python's cyclic collector to the
    trainer's step (``_gc_step.py``): while ``rl.train``'s training loop
    runs, the setup's objects are frozen once, only young collections run
    inside a step and one full collection at its end; a guard collects
    early when RSS grows by 512 MiB or 4 M objects survive within a step;
    the collector's state is put back when the loop ends or raises, and on
    :func:`uninstall`. It changes when the collector runs, not what is
    computed or sent. ``gc=None`` (or False) leaves the collector alone.

    ``kl=True`` (the default) replaces, for ``kl_penalty_coef > 0`` and
    on-policy distillation, the KL passes too (``_kl.py``): ``rl.metrics``'s
    ``incorporate_kl_penalty``, ``compute_post_kl``, ``score_sequences``,
    ``_full_sequence_inputs``, ``discounted_future_sum_vectorized`` and
    ``distillation.train_on_policy.incorporate_kl_penalty``: the same
    scoring requests, and advantages and penalty metrics bit-identical to
    the cookbook's (the batch means are torch's float32 sums, reproduced
    for the CPU capability torch runs at; their probe checks that on this
    machine, and where it fails these pieces are the cookbook's).
    ``compute_post_kl``'s means are torch's own ``mean()`` of the
    differences made natively, so the cookbook's too. ``kl=False`` leaves
    them all to the cookbook.

    ``coalesce=True`` (opt-in) merges concurrent ``SamplingClient.sample``
    calls on one client with an identical prompt and sampling parameters,
    ``num_samples=1`` and no seed (a GRPO group's first turn) into one
    request with ``num_samples=k``, one sequence handed back per caller:
    the same distribution of samples, not the same draws; the shared prompt
    is billed and prefix-cached once; a group's first samples fail or
    succeed together. ``tinker_rl_data.status()`` reports how many
    requests were merged.

    Each piece goes in only where its probe, run here on the installed
    versions, finds ours equal to the cookbook's; a piece that fails, is
    missing, or whose name holds a function that is not the cookbook's own
    (a user's, a fork's wrapper) is left as it is, with one warning; a
    version outside the tested ones whose probes pass installs with one
    warning. Nothing here stops a run, unless ``strict=True`` (or
    ``TINKER_RL_DATA_STRICT=1``): then :class:`tinker_rl_data.InstallError`
    is raised and nothing is installed. ``TINKER_RL_DATA_DISABLE=1`` makes
    it a no-op. Calling it again is harmless. ``force`` is accepted for
    older callers and has no effect.
    """
    from . import _patch

    del force
    options = {"data", "step"} | ({"kl"} if kl else set()) | ({"wire"} if wire else set()) | ({"gc"} if gc else set())
    if coalesce:
        options.add("coalesce")
    options.add("workers")
    report = _patch.install(options, owner=__name__, strict=strict)
    from . import _workers

    _workers.follow(options, strict)
    return report


def uninstall() -> None:
    """Put back what :func:`install` replaced (the cookbook's functions
    wherever ours are, and tinker's message builder if :func:`install`
    installed ours); an encoder installed before by
    :func:`tinker_rl_data.install` stays. Harmless when not installed."""
    from . import _patch

    _patch.uninstall(owner=__name__)
    from . import _workers

    _workers.stop()


if __name__ == "__main__":
    from tinker_rl_data._launch import main

    sys.exit(main(sys.argv[1:]))
