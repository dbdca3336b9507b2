"""Seeded synthetic rollout batches shaped like real RL steps: the workloads
of every table in bench/RESULTS.md (their shapes are tests/support/workloads.py's,
which the trainer runs of the tests share), their token counts and the same
rollouts as tinker-cookbook types."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if TESTS not in sys.path:  # the shapes are tests/support's (bench/trainer.py's runs are the tests' runner)
    sys.path.append(TESTS)

from support.workloads import VOCAB, WORKLOADS, Workload  # noqa: E402

if TYPE_CHECKING:
    from tinker_rl_data.evsys import TrajectoryGroup

__all__ = ["VOCAB", "WORKLOADS", "Workload", "positions", "merged_positions", "cookbook_available", "to_cookbook"]


def positions(groups: list[TrajectoryGroup]) -> tuple[int, int]:
    """(token positions, datums) the batch yields."""
    n_pos = n_datums = 0
    for g in groups:
        for t in g.trajectories:
            for turn in t.turns:
                if turn.completion_tokens and len(turn.prompt_tokens) + len(turn.completion_tokens) >= 2:
                    n_pos += len(turn.prompt_tokens) + len(turn.completion_tokens) - 1
                    n_datums += 1
    return n_pos, n_datums


def merged_positions(groups: list[TrajectoryGroup]) -> tuple[int, int]:
    """(token positions, datums) after merging turns whose prompt extends the
    sequence so far (docs/contract.md §6, tinker-cookbook's rule), in plain Python."""
    n_pos = n_datums = 0

    def close(seq_len: int, has_target: bool) -> None:
        nonlocal n_pos, n_datums
        if has_target:
            n_pos += seq_len - 1
            n_datums += 1

    for g in groups:
        for t in g.trajectories:
            seq: list[int] = []
            has_target = False
            for turn in t.turns:
                prompt = list(turn.prompt_tokens)
                if seq and prompt[: len(seq)] == seq:
                    seq = prompt + list(turn.completion_tokens)
                else:
                    close(len(seq), has_target)
                    seq = prompt + list(turn.completion_tokens)
                    has_target = False
                # a completion token is a target unless it is the sequence's first token
                if turn.completion_tokens and len(seq) >= 2:
                    has_target = True
            close(len(seq), has_target)
    return n_pos, n_datums


def cookbook_available() -> str | None:
    """None when tinker_cookbook's RL data types import, else why not."""
    try:
        import tinker_cookbook.completers  # noqa: F401
        import tinker_cookbook.rl.data_processing  # noqa: F401
        import tinker_cookbook.rl.types  # noqa: F401
    except Exception as exc:  # ImportError, or torch failing to load
        return f"{type(exc).__name__}: {exc}"
    return None


def to_cookbook(groups: list[TrajectoryGroup]) -> list:
    """The same rollouts as tinker-cookbook 0.6.1 types: each turn a Transition
    whose ob is ModelInput.from_ints(prompt) and ac a TokensWithLogprobs with
    a sequence_id (so provenance is on); the trajectory's reward is the
    group's final reward (transition rewards 0.0, so the total is the same
    float). multi_turn_agent's prompts extend the previous turn, so the
    cookbook merges its turns."""
    import tinker
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.types import Trajectory as CbTrajectory
    from tinker_cookbook.rl.types import TrajectoryGroup as CbGroup
    from tinker_cookbook.rl.types import Transition

    out = []
    for g, group in enumerate(groups):
        trajectories = []
        for t, traj in enumerate(group.trajectories):
            transitions = []
            for u, turn in enumerate(traj.turns):
                ac = TokensWithLogprobs(
                    tokens=list(turn.completion_tokens),
                    maybe_logprobs=list(turn.logprobs),
                    sequence_id=f"seq-{g}-{t}-{u}",
                )
                transitions.append(
                    Transition(
                        ob=tinker.ModelInput.from_ints(list(turn.prompt_tokens)),
                        ac=ac,
                        reward=0.0,
                        episode_done=u == len(traj.turns) - 1,
                    )
                )
            trajectories.append(CbTrajectory(transitions=transitions, final_ob=tinker.ModelInput.empty()))
        out.append(
            CbGroup(
                trajectories_G=trajectories,
                final_rewards_G=[t.reward for t in group.trajectories],
                metrics_G=[{} for _ in group.trajectories],
            )
        )
    return out
