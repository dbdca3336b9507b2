"""Rollout groups to importance-sampling training rows.

Same functions, signatures and output as ``evsys_sdk.training.data_processing``
(a port of ``tinker_cookbook.rl.data_processing``); the per-token work runs in
the Rust core (``tinker_rl_data._core``), one call per batch. The options
(``merge_turns``, ``vocab_size``, ``model_input_tokens``, advantage
baselines) are opt-in: with default arguments the output is the replaced
module's. The full contract is in ``docs/contract.md``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Literal, NamedTuple, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt
import tinker

from .. import _core
from ..rows import build_datums
from .metadata import DatumMetadata

__all__ = [
    "Advantages",
    "DatumMetadata",
    "RowArrays",
    "assemble_arrays",
    "assemble_training_data",
    "compute_advantages",
    "compute_trajectory_metrics",
    "remove_constant_reward_groups",
]

logger = logging.getLogger("tinker_rl_data")

#: Per group, one advantage per trajectory: sequences of reals, 1-D numpy
#: arrays, or one 2-D array of shape (groups, trajectories).
Advantages = Union[Sequence[Union[Sequence[float], npt.NDArray[Any]]], npt.NDArray[Any]]

Group = TypeVar("Group")

BASELINES = ("mean", "leave_one_out")


def compute_advantages(
    trajectory_groups: Iterable[Any],
    *,
    normalize: bool = True,
    baseline: Literal["mean", "leave_one_out"] = "mean",
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> list[list[float]]:
    """``advantages[group][trajectory]``, float64, per group of 2+:

    - ``baseline="mean"`` (default): reward minus the group mean
      (tinker-cookbook's "GRPO", Dr. GRPO);
    - ``baseline="leave_one_out"``: reward minus the mean of the group's
      other rewards (RLOO);
    - ``scale_by_std=True``: then divided by the group's sample standard
      deviation plus ``eps`` (GRPO as DeepSeekMath, verl and TRL define it).

    A group of one keeps its reward, an empty group gives ``[]``;
    ``normalize=False`` gives the raw rewards and takes no other option.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if not normalize and (baseline != "mean" or scale_by_std):
        raise ValueError("normalize=False gives the raw rewards: it takes no baseline or scale_by_std")
    try:
        eps_value = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}") from None
    if not (math.isfinite(eps_value) and eps_value >= 0.0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    return _core.compute_advantages(
        _groups(trajectory_groups), bool(normalize), baseline == "leave_one_out", bool(scale_by_std), eps_value
    )


def remove_constant_reward_groups(trajectory_groups: Iterable[Group]) -> list[Group]:
    """The groups (the same objects, in order) whose rewards are not all
    equal: the others give every trajectory advantage 0 and no gradient.
    Groups of 0 or 1 trajectories are constant. When none remain, ``[]`` and
    one warning on the ``tinker_rl_data`` logger."""
    groups = list(_groups(trajectory_groups))
    kept = [groups[g] for g in _core.varied_reward_groups(groups)]
    if not kept:
        logger.warning("all %d group(s) have constant rewards; none remain (no gradient)", len(groups))
    return kept


def assemble_training_data(
    trajectory_groups: Iterable[Any],
    advantages: Advantages,
    *,
    merge_turns: bool = False,
    vocab_size: int | None = None,
    model_input_tokens: Literal["list", "numpy"] = "list",
) -> tuple[list[tinker.Datum], list[DatumMetadata]]:
    """One ``tinker.Datum`` per assistant turn with a completion, in order
    group -> trajectory -> turn, each with its :class:`DatumMetadata`.

    ``loss_fn_inputs`` holds ``target_tokens`` (int64, the next token of each
    position), ``logprobs`` and ``advantages`` (float32, the sampler logprob
    and the trajectory's advantage on completion targets, 0 on prompt
    positions: that zero masks the loss to the completion). Each Datum owns
    its arrays: keeping one keeps only its own data.

    - ``merge_turns=True``: consecutive turns of a trajectory share one Datum
      while each turn's prompt starts with the sequence so far (prompts and
      completions before it); ``DatumMetadata.n_turns`` says how many.
    - ``vocab_size``: every token read must be below it (a ``ValueError``).
    - ``model_input_tokens="numpy"``: each model input's tokens are a
      read-only int32 numpy array instead of a list of ints; tinker's wire
      encoder takes it as it is (same request bytes), and no Python int is
      made per token.
    """
    if model_input_tokens not in ("list", "numpy"):
        raise ValueError(f"model_input_tokens must be 'list' or 'numpy', got {model_input_tokens!r}")
    built = build_datums(
        _groups(trajectory_groups),
        advantages,
        bool(merge_turns),
        _vocab_size(vocab_size),
        model_input_tokens == "numpy",
        DatumMetadata,
    )
    _warn_fitted(built.fitted)
    return built.result


class RowArrays(NamedTuple):
    """The training rows as flat arrays: row ``i`` is
    ``[row_offsets[i], row_offsets[i + 1])`` of the per-position arrays."""

    input_tokens: npt.NDArray[np.int64]  # each row's sequence without its last token
    target_tokens: npt.NDArray[np.int64]  # the next token of each position
    logprobs: npt.NDArray[np.float32]  # sampler logprob on completion targets, else 0
    advantages: npt.NDArray[np.float32]  # trajectory advantage on completion targets, else 0
    row_offsets: npt.NDArray[np.int64]  # one more than rows
    group_idx: npt.NDArray[np.int64]  # per row
    traj_idx: npt.NDArray[np.int64]  # per row
    turn_idx: npt.NDArray[np.int64]  # per row: its first turn
    n_turns: npt.NDArray[np.int64]  # per row: turns it covers


def assemble_arrays(
    trajectory_groups: Iterable[Any],
    advantages: Advantages,
    *,
    merge_turns: bool = False,
    vocab_size: int | None = None,
) -> RowArrays:
    """The rows of :func:`assemble_training_data` as flat numpy arrays, for
    callers who pack rows themselves (no Datum objects are made)."""
    rows = _core.assemble_arrays(_groups(trajectory_groups), advantages, bool(merge_turns), _vocab_size(vocab_size))
    _warn_fitted(rows.fitted)
    return RowArrays(
        rows.input_tokens,
        rows.target_tokens,
        rows.logprobs,
        rows.advantages,
        rows.row_offsets,
        rows.group_idx,
        rows.traj_idx,
        rows.turn_idx,
        rows.n_turns,
    )


def compute_trajectory_metrics(groups: Iterable[Any]) -> dict[str, float]:
    """Reward statistics over every trajectory of every group; ``{}`` when
    there are none."""
    stats = _core.reward_metrics(_groups(groups))
    if stats is None:
        return {}
    mean, std, n_trajectories, n_groups = stats
    return {
        "reward/mean": mean,
        "reward/std": std,
        "reward/n_trajectories": float(n_trajectories),
        "reward/n_groups": float(n_groups),
    }


def _groups(groups: Any) -> Any:
    """The groups as a list or tuple (an iterator is read once here), and
    one clear error for a single group passed where a sequence belongs."""
    if isinstance(groups, (list, tuple)):
        return groups
    if hasattr(groups, "trajectories"):
        raise TypeError(
            f"trajectory_groups must be a sequence of groups, got a single {type(groups).__name__}"
            " (wrap it in a list)"
        )
    try:
        iterator = iter(groups)
    except TypeError:
        return groups  # the core names what it got
    return list(iterator)


def _vocab_size(vocab_size: Any) -> int | None:
    if vocab_size is None:
        return None
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise TypeError(f"vocab_size must be an int or None, got {type(vocab_size).__name__}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    return min(int(vocab_size), 2**31)


def _warn_fitted(fitted: _core.Fitted) -> None:
    if fitted.first is None:
        return
    g, t, u = fitted.first
    logger.warning(
        "logprobs of %d turn(s) did not match their completion length (%d padded with 0.0, %d truncated); "
        "the first is group %d, trajectory %d, turn %d",
        fitted.padded + fitted.truncated,
        fitted.padded,
        fitted.truncated,
        g,
        t,
        u,
    )
