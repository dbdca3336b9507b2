"""Rollout groups to importance-sampling training rows.

Same functions, signatures and output as ``evsys_sdk.training.data_processing``
(a port of ``tinker_cookbook.rl.data_processing``); the per-token work runs in
the Rust core (``tinker_rl_data._core``), one call per batch.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Sequence

import numpy as np
import tinker

from . import _core
from .datums import DatumMetadata, build_rows

logger = logging.getLogger("tinker_rl_data")


def compute_advantages(trajectory_groups: Sequence[Any], *, normalize: bool = True) -> list[list[float]]:
    """``advantages[group][trajectory]``: with ``normalize``, each reward
    minus its group's mean (for groups of 2+); otherwise the rewards."""
    return _core.compute_advantages(trajectory_groups, bool(normalize))


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
    datums, metadata, fitted = build_rows(_as_sequence(trajectory_groups), advantages)
    _warn_fitted(fitted)
    return datums, metadata


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


def assemble_arrays(trajectory_groups: Sequence[Any], advantages: Sequence[Sequence[float]]) -> RowArrays:
    """The rows of :func:`assemble_training_data` as flat numpy arrays, for
    callers who pack rows themselves (no Datum objects are made)."""
    inputs, targets, logprobs, advs, offsets, group_idx, traj_idx, turn_idx, fitted = _core.assemble_arrays(
        _as_sequence(trajectory_groups), advantages
    )
    _warn_fitted(fitted)
    return RowArrays(inputs, targets, logprobs, advs, offsets, group_idx, traj_idx, turn_idx)


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


def _as_sequence(groups: Sequence[Any]) -> Sequence[Any]:
    # An iterator is read once here: the public path walks the groups twice.
    return groups if isinstance(groups, (list, tuple)) else list(groups)


def _warn_fitted(fitted_turns: int) -> None:
    if fitted_turns:
        logger.warning(
            "logprobs of %d turn(s) did not match their completion length; "
            "padded with 0.0 or truncated to fit",
            fitted_turns,
        )
