"""A plain-Python implementation of the contract (docs/contract.md), written
from the contract (not from the package), to compare the package against. Slow on purpose:
one Python step per token, tinker's public constructors for every Datum.

§3-§4 (per-turn rows, bad input), §6 (merged multi-turn rows), §7
(advantage baselines and scaling, computed exactly with Fractions and
rounded once), §8 (remove_constant_reward_groups, vocab_size), and the
input forms API-PLAN.md fixes (tags, 2-D advantages, a single group,
numbers too large for a float)."""

from __future__ import annotations

import logging
import math
import numbers
import operator
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import tinker

MAX_TOKEN = 2**31 - 1
BASELINES = ("mean", "leave_one_out")

logger = logging.getLogger("tinker_rl_data")


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


class _Seq:
    """A sequence as contract §4 reads it: a list (or list subclass) is read
    later, item by item, up to the length it had when opened (a list that
    shrank meanwhile is a located RuntimeError); a tuple likewise; anything
    else is read once, now (a numpy array through tolist(), any other
    iterable through iter())."""

    def __init__(self, obj, where, what, rows=False):
        self.where, self.what = where, what
        at = f"{where}: " if where else ""  # batch-level problems have no location
        if isinstance(obj, list):
            self.src, self.n, self.getitem, self.size = obj, list.__len__(obj), list.__getitem__, list.__len__
            return
        if isinstance(obj, tuple):
            self.src, self.n, self.getitem, self.size = obj, tuple.__len__(obj), tuple.__getitem__, tuple.__len__
            return
        if isinstance(obj, np.ndarray):
            if obj.ndim != 1 and not (rows and obj.ndim == 2):
                raise ValueError(f"{at}{what} must be 1-D")
            items = obj.tolist()
        elif isinstance(obj, str):
            raise TypeError(f"{at}{what} must be a sequence, got str")
        else:
            try:
                iterator = iter(obj)
            except TypeError:
                raise TypeError(f"{at}{what} must be a sequence, got {type(obj).__name__}") from None
            items = [x for x in iterator]
        self.src, self.n, self.getitem, self.size = items, len(items), list.__getitem__, list.__len__

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.size(self.src):
            where = f"{self.where}: " if self.where else ""
            raise RuntimeError(f"{where}{self.what} changed size while being read (it had {self.n} items)")
        return self.getitem(self.src, i)

    def __iter__(self):
        return (self[i] for i in range(self.n))


def _seq(obj, where, what):
    return _Seq(obj, where, what)


def _groups(groups):
    """One group passed where a sequence of groups belongs is a TypeError; a
    list or tuple is read as it is, any other iterable once, into a list."""
    if isinstance(groups, (list, tuple)):
        return groups
    if hasattr(groups, "trajectories"):
        raise TypeError(f"trajectory_groups must be a sequence of groups, got a single {type(groups).__name__}")
    try:
        iterator = iter(groups)
    except TypeError:
        return groups
    return list(iterator)


def _batch(groups, what="trajectory_groups"):
    return _Seq(groups, "", what)


def _real(x, where, what, float32):
    if isinstance(x, (str, bytes)) or x is None or isinstance(x, complex):
        raise TypeError(f"{where}: {what} {x!r} is not a real number")
    try:
        v = float(x)
    except TypeError:
        raise TypeError(f"{where}: {what} {x!r} is not a real number") from None
    except OverflowError:
        raise ValueError(f"{where}: {what} {_short(x)} is too large for a float") from None
    if not math.isfinite(v) or (float32 and not _finite_as_float32(v)):
        raise ValueError(f"{where}: {what} {x!r} is not finite")
    return v


def _short(x):
    text = repr(x)
    return text if len(text) <= 40 else text[:20] + "..." + text[-10:]


def _finite_as_float32(v):
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(v)))


def _token(x, where, vocab_size=None, name=None, index=None):
    """Read with operator.index, once; a TypeError from it means "not an
    integer", anything else it raises goes up as it is."""
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{where}: token {type(x).__name__} is not an integer") from None
    if not 0 <= v <= MAX_TOKEN:
        raise ValueError(f"{where}: token {v} is outside 0..{MAX_TOKEN}")
    if vocab_size is not None and v >= vocab_size:
        raise ValueError(f"{where}: token {v} is outside the vocabulary (vocab_size={vocab_size}) ({name}[{index}])")
    return v


def _tags(group, g):
    """API-PLAN: missing or None -> []; otherwise an iterable of str, not a
    str itself; a new list per DatumMetadata."""
    tags = getattr(group, "tags", None)
    if tags is None:
        return []
    if isinstance(tags, str):
        raise TypeError(f"group {g}: tags must be an iterable of str, not a str ({tags!r})")
    items = list(_Seq(tags, f"group {g}", "tags"))
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"group {g}: tags[{i}] {item!r} is not a str")
    return items


def rewards_of(groups):
    out = []
    for g, group in enumerate(_batch(_groups(groups))):
        rs = []
        for t, traj in enumerate(_seq(_attr(group, "trajectories", _where(g)), _where(g), "trajectories")):
            rs.append(_real(_attr(traj, "reward", _where(g, t)), _where(g, t), "reward", False))
        out.append(rs)
    return out


def _check_advantage_options(normalize, baseline, scale_by_std, eps):
    if not isinstance(baseline, str) or baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if isinstance(eps, (str, bytes)) or eps is None or isinstance(eps, complex):
        raise TypeError(f"eps must be a real number, got {eps!r}")
    try:
        e = float(eps)
    except OverflowError:
        raise ValueError(f"eps must be finite and >= 0, got {_short(eps)}") from None
    if not math.isfinite(e) or e < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if not normalize and (baseline != "mean" or scale_by_std):
        raise ValueError("normalize=False (the raw rewards) cannot be combined with baseline= or scale_by_std=")
    return e


def group_advantages(rs, *, baseline="mean", scale_by_std=False, eps=1e-6):
    """docs/contract.md §7 for one group of 2+ rewards, in exact arithmetic (the standard
    deviation to 60 digits), each result rounded once to a float."""
    n = len(rs)
    exact = [Fraction(r) for r in rs]
    total = sum(exact, Fraction(0))
    if baseline == "mean":
        devs = [r - total / n for r in exact]
    else:  # leave_one_out: r_i - mean of the others
        devs = [r - (total - r) / (n - 1) for r in exact]
    if not scale_by_std:
        return [float(d) for d in devs]
    mean = total / n
    var = sum(((r - mean) ** 2 for r in exact), Fraction(0)) / (n - 1)  # sample variance
    with localcontext() as ctx:
        ctx.prec = 60
        s = (Decimal(var.numerator) / Decimal(var.denominator)).sqrt()
        denominator = s + Decimal(eps)
        if denominator == 0:  # eps=0 on a constant group: every deviation is exactly 0
            assert all(d == 0 for d in devs)
            return [0.0] * n
        return [float(Decimal(d.numerator) / Decimal(d.denominator) / denominator) for d in devs]


def compute_advantages(groups, *, normalize=True, baseline="mean", scale_by_std=False, eps=1e-6):
    eps = _check_advantage_options(normalize, baseline, scale_by_std, eps)
    out = []
    for rs in rewards_of(groups):
        if normalize and len(rs) >= 2:
            out.append(group_advantages(rs, baseline=baseline, scale_by_std=bool(scale_by_std), eps=eps))
        else:
            out.append(list(rs))
    return out


def remove_constant_reward_groups(groups):
    """docs/contract.md §8: the groups (same objects, in order) whose rewards are not all
    equal; a group of 0 or 1 trajectories is constant."""
    groups = list(_groups(groups))
    per_group = rewards_of(groups)
    kept = [group for group, rs in zip(groups, per_group) if any(r != rs[0] for r in rs)]
    if not kept:
        logger.warning("remove_constant_reward_groups: every group has constant rewards; none remain")
    return kept


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
    n_turns: int = 1


def fit_logprobs(logprobs, completion):
    return (list(logprobs) + [0.0] * len(completion))[: len(completion)]


def turn_rows(prompt, completion, logprobs, advantage):
    """(model_input, targets, logprobs, advantages) or None, position by position."""
    fitted = fit_logprobs(logprobs, completion)
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


def merged_rows(turns, advantage):
    """docs/contract.md §6 for one trajectory: turns is a list of (prompt, completion,
    logprobs), already checked. Yields (first_turn, n_turns, rows) for every
    Datum kept, rows as turn_rows gives them."""
    seq, completion_flag, lps, advs = [], [], [], []
    first, covered = 0, 0

    def close():
        if len(seq) < 2 or not any(completion_flag[1:]):
            return None  # no target is a completion token: dropped
        inputs, targets, out_lps, out_advs = [], [], [], []
        for j in range(len(seq) - 1):
            inputs.append(seq[j])
            targets.append(seq[j + 1])
            out_lps.append(lps[j + 1])  # each target carries its own logprob
            out_advs.append(advs[j + 1])
        return inputs, targets, out_lps, out_advs

    for u, (prompt, completion, logprobs) in enumerate(turns):
        prompt = list(prompt)
        if seq and prompt[: len(seq)] == seq:
            new = prompt[len(seq):]
        else:
            if covered:
                rows = close()
                if rows is not None:
                    yield first, covered, rows
            seq, completion_flag, lps, advs = [], [], [], []
            first, covered = u, 0
            new = prompt
        for x in new:
            seq.append(x)
            completion_flag.append(False)
            lps.append(0.0)
            advs.append(0.0)
        for x, lp in zip(completion, fit_logprobs(logprobs, completion)):
            seq.append(x)
            completion_flag.append(True)
            lps.append(lp)
            advs.append(advantage)
        covered += 1
    if covered:
        rows = close()
        if rows is not None:
            yield first, covered, rows


def _advantage_rows(advantages):
    """A sequence (per group) of sequences or 1-D arrays, or a 2-D numpy
    array whose row g is group g."""
    return _Seq(advantages, "", "advantages", rows=True)


def _datum(inputs, targets, lps, advs):
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(inputs),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.array(targets, dtype=np.int64)),
            "logprobs": tinker.TensorData.from_numpy(np.array(lps, dtype=np.float32)),
            "advantages": tinker.TensorData.from_numpy(np.array(advs, dtype=np.float32)),
        },
    )


def assemble_training_data(groups, advantages, *, merge_turns=False, vocab_size=None):
    """Checks the batch in two sweeps, as the contract has it: first its
    structure, rewards, advantages and tags, then every token and logprob;
    each sweep reports the first problem in batch order."""
    groups = _batch(_groups(groups))
    advantages = _advantage_rows(advantages)
    if vocab_size is not None:
        vocab_size = operator.index(vocab_size)
    if len(advantages) != len(groups):
        raise ValueError(f"advantages has {len(advantages)} groups for {len(groups)} trajectory groups")
    planned = []  # (g, t, u, prompt, completion, logprobs, advantage, tags)
    for g, group in enumerate(groups):
        trajs = _seq(_attr(group, "trajectories", _where(g)), _where(g), "trajectories")
        advs = _seq(advantages[g], _where(g), "advantages")
        if len(advs) != len(trajs):
            raise ValueError(f"{_where(g)}: advantages has {len(advs)} entries for {len(trajs)} trajectories")
        tags = _tags(group, g)
        group_planned = []
        for t, traj in enumerate(trajs):
            _real(_attr(traj, "reward", _where(g, t)), _where(g, t), "reward", False)
            a = _real(advs[t], _where(g, t), "advantage", True)
            for u, turn in enumerate(_seq(_attr(traj, "turns", _where(g, t)), _where(g, t), "turns")):
                w = _where(g, t, u)
                fields = [_seq(_attr(turn, name, w), w, name) for name in ("prompt_tokens", "completion_tokens", "logprobs")]
                group_planned.append((g, t, u, *fields, a))
        planned.extend((*p, tags) for p in group_planned)
    checked = []  # the same, tokens and logprobs checked
    for g, t, u, p, c, lp, a, tags in planned:
        w = _where(g, t, u)
        p = [_token(x, w, vocab_size, "prompt_tokens", i) for i, x in enumerate(p)]
        c = [_token(x, w, vocab_size, "completion_tokens", i) for i, x in enumerate(c)]
        lp = [_real(x, w, "logprob", True) for x in lp]
        checked.append((g, t, u, p, c, lp, a, tags))
    datums, metas = [], []
    if not merge_turns:
        for g, t, u, p, c, lp, a, tags in checked:
            rows = turn_rows(p, c, lp, a)
            if rows is None:
                continue
            datums.append(_datum(*rows))
            metas.append(Meta(g, t, u, list(tags)))
        return datums, metas
    by_trajectory = {}
    for g, t, u, p, c, lp, a, tags in checked:
        by_trajectory.setdefault((g, t), (a, tags, []))[2].append((p, c, lp))
    for (g, t), (a, tags, turns) in by_trajectory.items():
        for first, n_turns, rows in merged_rows(turns, a):
            datums.append(_datum(*rows))
            metas.append(Meta(g, t, first, list(tags), n_turns))
    return datums, metas

