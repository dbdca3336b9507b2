"""The shapes of the seeded synthetic rollout batches: the workloads of the
benchmarks' tables (bench/RESULTS.md) and, as token-list environments
(:mod:`.cookbook_env`), of the trainer runs the tests make. bench/workloads.py
re-exports them with its counts and conversions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tinker_rl_data.evsys import TrajectoryGroup

# numpy and tinker_rl_data are imported where used, so that the workload
# names can be listed (scripts/demo.sh checks its argument) before the
# package is installed.

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
        import numpy as np

        from tinker_rl_data.evsys import Trajectory, TrajectoryGroup, Turn

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
