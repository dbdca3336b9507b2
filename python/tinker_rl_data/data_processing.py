"""Rollout groups to importance-sampling training rows.

Same functions, signatures and output as ``evsys_sdk.training.data_processing``
(a port of ``tinker_cookbook.rl.data_processing``); the per-token work runs in
the Rust core (``tinker_rl_data._core``), one call per batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np
import tinker

from . import _core
from .datums import gc_paused, wrap_rows

logger = logging.getLogger("tinker_rl_data")


@dataclass
class DatumMetadata:
    """Where a Datum came from: its group, trajectory and turn, and the
    group's tags."""

    group_idx: int
    traj_idx: int = 0
    turn_idx: int = 0
    tags: list[str] = field(default_factory=list)


def compute_advantages(trajectory_groups: Sequence[Any], *, normalize: bool = True) -> list[list[float]]:
    """``advantages[group][trajectory]``: with ``normalize``, each reward
    minus its group's mean (for groups of 2+); otherwise the rewards."""
    return _core.compute_advantages(trajectory_groups, bool(normalize))


class RowArrays(NamedTuple):
    """The training rows as flat arrays: row ``i`` is
    ``[row_offsets[i], row_offsets[i + 1])`` of the per-position arrays."""

    input_tokens: np.ndarray  # int64: each turn's prompt + completion[:-1]
    target_tokens: np.ndarray  # int64: the next token of each position
    logprobs: np.ndarray  # float32: sampler logprob on completion targets, else 0
    advantages: np.ndarray  # float32: trajectory advantage on completion targets, else 0
    row_offsets: np.ndarray  # int64, one more than rows
    group_idx: np.ndarray  # int64 per row
    traj_idx: np.ndarray  # int64 per row
    turn_idx: np.ndarray  # int64 per row


def _warn_fitted(fitted_turns: int) -> None:
    if fitted_turns:
        logger.warning(
            "logprobs of %d turn(s) did not match their completion length; "
            "padded with 0.0 or truncated to fit",
            fitted_turns,
        )


def _as_list(groups: Sequence[Any]) -> Sequence[Any]:
    # Read once: the core and the tags below both walk the groups.
    return groups if isinstance(groups, (list, tuple)) else list(groups)


def assemble_arrays(trajectory_groups: Sequence[Any], advantages: Sequence[Sequence[float]]) -> RowArrays:
    """The rows of :func:`assemble_training_data` as flat numpy arrays, for
    callers who pack rows themselves (no Datum objects are made)."""
    groups = _as_list(trajectory_groups)
    _, inputs, *arrays, fitted = _core.assemble(groups, advantages, False)
    _warn_fitted(fitted)
    return RowArrays(inputs, *arrays)


def assemble_training_data(
    trajectory_groups: Sequence[Any], advantages: Sequence[Sequence[float]]
) -> tuple[list[tinker.Datum], list[DatumMetadata]]:
    """One ``tinker.Datum`` per assistant turn with a completion, in order
    group -> trajectory -> turn, each with its :class:`DatumMetadata`.

    ``loss_fn_inputs`` holds ``target_tokens`` (int64, the next token of each
    position), ``logprobs`` and ``advantages`` (float32, the sampler logprob
    and the trajectory's advantage on completion targets, 0 on prompt
    positions: that zero masks the loss to the completion).
    """
    groups = _as_list(trajectory_groups)
    with gc_paused():
        model_inputs, _, targets, logprobs, advs, offsets, group_idx, traj_idx, turn_idx, fitted = _core.assemble(
            groups, advantages, True
        )
        tags = [list(getattr(g, "tags", None) or ()) for g in groups]
        datums = wrap_rows(model_inputs, targets, logprobs, advs, offsets)
        metadata = _metadata(group_idx.tolist(), traj_idx.tolist(), turn_idx.tolist(), tags)
    _warn_fitted(fitted)
    return datums, metadata


def _metadata(groups: list[int], trajs: list[int], turns: list[int], tags: list[list[str]]) -> list[DatumMetadata]:
    new, setattr_ = object.__new__, object.__setattr__
    out = []
    for g, t, u in zip(groups, trajs, turns):
        m = new(DatumMetadata)
        setattr_(m, "__dict__", {"group_idx": g, "traj_idx": t, "turn_idx": u, "tags": tags[g][:]})
        out.append(m)
    return out


def compute_trajectory_metrics(groups: Sequence[Any]) -> dict[str, float]:
    """Reward statistics over every trajectory of every group; ``{}`` when
    there are none."""
    stats = _core.reward_metrics(groups)
    if stats is None:
        return {}
    mean, std, n_trajectories, n_groups = stats
    return {
        "reward/mean": mean,
        "reward/std": std,
        "reward/n_trajectories": float(n_trajectories),
        "reward/n_groups": float(n_groups),
    }
