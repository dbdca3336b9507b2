"""A plain-Python implementation of SPEC.md, written from the contract
(not from the package), to compare the package against. Slow on purpose:
one Python step per token, tinker's public constructors for every Datum."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import tinker

MAX_TOKEN = 2**31 - 1


class Located(Exception):
    pass


def _where(g, t=None, u=None):
    parts = [f"group {g}"]
    if t is not None:
        parts.append(f"trajectory {t}")
    if u is not None:
        parts.append(f"turn {u}")
    return ", ".join(parts)


def _attr(obj, name, where):
    try:
        return getattr(obj, name)
    except AttributeError:
        raise TypeError(f"{where}: {type(obj).__name__} object has no attribute '{name}'") from None


def _seq(obj, where, what):
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1:
            raise ValueError(f"{where}: {what} must be 1-D")
        return obj.tolist()
    return list(obj)


def _real(x, where, what, float32):
    if isinstance(x, (str, bytes)) or x is None or isinstance(x, complex):
        raise TypeError(f"{where}: {what} {x!r} is not a real number")
    try:
        v = float(x)
    except TypeError:
        raise TypeError(f"{where}: {what} {x!r} is not a real number") from None
    if not math.isfinite(v) or (float32 and not _finite_as_float32(v)):
        raise ValueError(f"{where}: {what} {x!r} is not finite")
    return v


def _finite_as_float32(v):
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(v)))


def _token(x, where):
    if isinstance(x, float) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{where}: token {x!r} is not an integer")
    v = int(x)
    if not 0 <= v <= MAX_TOKEN:
        raise ValueError(f"{where}: token {v} is outside 0..{MAX_TOKEN}")
    return v


def rewards_of(groups):
    out = []
    for g, group in enumerate(groups):
        rs = []
        for t, traj in enumerate(_seq(_attr(group, "trajectories", _where(g)), _where(g), "trajectories")):
            rs.append(_real(_attr(traj, "reward", _where(g, t)), _where(g, t), "reward", False))
        out.append(rs)
    return out


def compute_advantages(groups, *, normalize=True):
    out = []
    for rs in rewards_of(groups):
        if normalize and len(rs) >= 2:
            m = sum(rs) / len(rs)
            out.append([r - m for r in rs])
        else:
            out.append(list(rs))
    return out


def compute_trajectory_metrics(groups):
    per_group = rewards_of(groups)
    rs = [r for g in per_group for r in g]
    if not rs:
        return {}
    m = sum(rs) / len(rs)
    return {
        "reward/mean": m,
        "reward/std": math.sqrt(sum((r - m) * (r - m) for r in rs) / len(rs)),
        "reward/n_trajectories": float(len(rs)),
        "reward/n_groups": float(len(per_group)),
    }


@dataclass
class Meta:
    group_idx: int
    traj_idx: int = 0
    turn_idx: int = 0
    tags: list = field(default_factory=list)


def turn_rows(prompt, completion, logprobs, advantage):
    """(model_input, targets, logprobs, advantages) or None, position by position."""
    fitted = (list(logprobs) + [0.0] * len(completion))[: len(completion)]
    full = list(prompt) + list(completion)
    if not completion or len(full) < 2:
        return None
    inputs, targets, lps, advs = [], [], [], []
    for j in range(len(full) - 1):
        inputs.append(full[j])
        targets.append(full[j + 1])
        k = j + 1 - len(prompt)  # index of the target within the completion
        if k >= 0:
            lps.append(fitted[k])
            advs.append(advantage)
        else:
            lps.append(0.0)
            advs.append(0.0)
    return inputs, targets, lps, advs


def assemble_training_data(groups, advantages):
    """Checks the batch in two sweeps, as SPEC's contract has it: first its
    structure, rewards and advantages, then every token and logprob; each
    sweep reports the first problem in batch order."""
    groups = list(groups)
    advantages = list(advantages)
    if len(advantages) != len(groups):
        raise ValueError(f"advantages has {len(advantages)} groups for {len(groups)} trajectory groups")
    planned = []  # (g, t, u, prompt, completion, logprobs, advantage, tags)
    for g, group in enumerate(groups):
        trajs = _seq(_attr(group, "trajectories", _where(g)), _where(g), "trajectories")
        advs = _seq(advantages[g], _where(g), "advantages")
        if len(advs) != len(trajs):
            raise ValueError(f"{_where(g)}: advantages has {len(advs)} entries for {len(trajs)} trajectories")
        tags = list(getattr(group, "tags", None) or ())
        for t, traj in enumerate(trajs):
            _real(_attr(traj, "reward", _where(g, t)), _where(g, t), "reward", False)
            a = _real(advs[t], _where(g, t), "advantage", True)
            for u, turn in enumerate(_seq(_attr(traj, "turns", _where(g, t)), _where(g, t), "turns")):
                w = _where(g, t, u)
                fields = [_seq(_attr(turn, name, w), w, name) for name in ("prompt_tokens", "completion_tokens", "logprobs")]
                planned.append((g, t, u, *fields, a, tags))
    datums, metas = [], []
    for g, t, u, p, c, lp, a, tags in planned:
        w = _where(g, t, u)
        p = [_token(x, w) for x in p]
        c = [_token(x, w) for x in c]
        lp = [_real(x, w, "logprob", True) for x in lp]
        rows = turn_rows(p, c, lp, a)
        if rows is None:
            continue
        inputs, targets, lps, advs_ = rows
        datums.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(inputs),
                loss_fn_inputs={
                    "target_tokens": tinker.TensorData.from_numpy(np.array(targets, dtype=np.int64)),
                    "logprobs": tinker.TensorData.from_numpy(np.array(lps, dtype=np.float32)),
                    "advantages": tinker.TensorData.from_numpy(np.array(advs_, dtype=np.float32)),
                },
            )
        )
        metas.append(Meta(g, t, u, list(tags)))
    return datums, metas
