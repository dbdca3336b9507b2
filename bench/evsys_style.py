"""A straight plain-Python port in the style of the module we replace
(evsys_sdk.training.data_processing, itself a port of tinker-cookbook's):
no input checks, one Python step per token position, tinker's public
constructors (numpy instead of torch for the tensors). It is the fastest
plain-Python baseline, next to the contract reference, which also checks every
value as docs/contract.md §4 asks. It follows the contract's shift for empty prompts, so the
rows are the same as the package's on the benchmark batches."""

from __future__ import annotations

import numpy as np
import tinker


def compute_advantages(groups, *, normalize=True):
    out = []
    for group in groups:
        rewards = [t.reward for t in group.trajectories]
        if normalize and len(rewards) >= 2:
            mean = sum(rewards) / len(rewards)
            out.append([r - mean for r in rewards])
        else:
            out.append(list(rewards))
    return out


def _turn_to_datum(turn, advantage):
    prompt, completion = list(turn.prompt_tokens), list(turn.completion_tokens)
    if not completion or len(prompt) + len(completion) < 2:
        return None
    logprobs = (list(turn.logprobs) + [0.0] * len(completion))[: len(completion)]
    full = prompt + completion
    n = len(full) - 1
    first = max(len(prompt) - 1, 0)
    skipped = 1 if not prompt else 0
    lps = [0.0] * first + logprobs[skipped:]
    advs = [0.0] * first + [advantage] * (n - first)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.array(full[1:], dtype=np.int64)),
            "logprobs": tinker.TensorData.from_numpy(np.array(lps, dtype=np.float32)),
            "advantages": tinker.TensorData.from_numpy(np.array(advs, dtype=np.float32)),
        },
    )


def assemble_training_data(groups, advantages):
    datums, metadata = [], []
    for g, (group, group_advantages) in enumerate(zip(groups, advantages)):
        for t, (traj, advantage) in enumerate(zip(group.trajectories, group_advantages)):
            for u, turn in enumerate(traj.turns):
                datum = _turn_to_datum(turn, advantage)
                if datum is not None:
                    datums.append(datum)
                    metadata.append((g, t, u))
    return datums, metadata


def compute_trajectory_metrics(groups):
    rewards = [t.reward for g in groups for t in g.trajectories]
    if not rewards:
        return {}
    mean = sum(rewards) / len(rewards)
    return {
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "reward/n_trajectories": float(len(rewards)),
        "reward/n_groups": float(len(groups)),
    }
