"""Seeded synthetic rollout batches shaped like real RL steps (SPEC §5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinker_rl_data.env import Trajectory, TrajectoryGroup, Turn

VOCAB = 151_000


@dataclass(frozen=True)
class Workload:
    name: str
    groups: int
    samples: int
    turns: int
    prompt: int
    completion: int
    observation: int = 0  # tokens the environment adds between turns

    def build(self, scale: float = 1.0, seed: int = 0) -> list[TrajectoryGroup]:
        """The batch, with `scale` times the groups."""
        rng = np.random.default_rng(seed)
        out = []
        for g in range(max(1, round(self.groups * scale))):
            first_prompt = rng.integers(0, VOCAB, self.prompt).tolist()
            trajectories = []
            for _ in range(self.samples):
                prompt, turns = first_prompt, []
                for _ in range(self.turns):
                    completion = rng.integers(0, VOCAB, self.completion).tolist()
                    logprobs = (-rng.exponential(1.0, self.completion)).tolist()
                    turns.append(Turn(list(prompt), completion, logprobs))
                    prompt = prompt + completion + rng.integers(0, VOCAB, self.observation).tolist()
                trajectories.append(Trajectory(turns, reward=float(rng.integers(0, 2))))
            out.append(TrajectoryGroup(trajectories, tags=[f"task{g % 7}"]))
        return out


WORKLOADS = {
    w.name: w
    for w in [
        Workload("single_turn_long", 64, 16, 1, 512, 1024),
        Workload("multi_turn_agent", 16, 8, 4, 1024, 512, observation=64),
        Workload("many_short", 512, 16, 1, 64, 32),
    ]
}


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
