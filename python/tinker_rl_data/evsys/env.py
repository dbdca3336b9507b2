"""Input types: what a rollout produced, group by group.

Every function of the package also takes any objects with these attribute
names (duck typing); token and logprob sequences may be lists, tuples or 1-D
numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import numpy as np
import numpy.typing as npt

__all__ = ["Trajectory", "TrajectoryGroup", "Turn"]

Tokens = Union[Sequence[int], npt.NDArray[np.integer]]
Logprobs = Union[Sequence[float], npt.NDArray[np.floating]]


@dataclass
class Turn:
    """One assistant turn: the full context the policy saw, what it sampled,
    and the sampler's logprob of each sampled token."""

    prompt_tokens: Tokens
    completion_tokens: Tokens
    logprobs: Logprobs
    text: str = ""


@dataclass
class Trajectory:
    turns: list[Turn]
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrajectoryGroup:
    """The rollouts sampled for one task; advantages are relative to it."""

    trajectories: list[Trajectory]
    tags: list[str] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]
