"""A tinker-cookbook RL environment on token lists, shaped like
:mod:`.workloads`' batches (plus `tiny`), for running the cookbook's own `rl.train.main`
without a renderer, a tokenizer download or a dataset.

Each group is one task: its envs share the task's first prompt (or, by
default, differ from it in the last token, so that every sample request is
distinct and two runs get the same tokens for the same env; see
:mod:`.fake_tinker`), each env runs `turns` turns, and a turn's next prompt
is the sequence so far plus `observation` tokens derived from the action (so
the cookbook merges the turns into one datum, as in multi_turn_agent). The
last step's reward is the parity of the action's token sum; each step
reports `format` and `correct`, each group the workload's tags (7 distinct).
With ``garbage`` (a :mod:`.garbage` spec), the envs, the group's grading and
the dataset's builder make cyclic garbage as real ones do.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

import chz
import tinker
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult

from .garbage import Garbage, cycles
from .workloads import VOCAB, WORKLOADS, Workload

LOOP_WORKLOADS: dict[str, Workload] = {
    **WORKLOADS,
    "tiny": Workload("tiny", 2, 4, 2, 16, 8, observation=4),
}


class TokenEnv(Env):
    def __init__(self, prompt: list[int], turns: int, observation: int, garbage: Garbage = Garbage()) -> None:
        self.seq = prompt
        self.turns_left = turns
        self.observation = observation
        self.garbage = garbage

    async def initial_observation(self):
        return tinker.ModelInput.from_ints(self.seq), []

    async def step(self, action, *, extra=None) -> StepResult:
        if self.garbage.step:
            judged = cycles(self.garbage.step * 2**20, self.garbage.node)  # held across the judge's await, then dropped
            await asyncio.sleep(0)
            del judged
        self.turns_left -= 1
        done = self.turns_left <= 0
        reward = float(sum(action) % 2) if done else 0.0
        metrics = {"format": 1.0, "correct": reward}
        if done:
            return StepResult(reward, True, tinker.ModelInput.empty(), [], metrics=metrics)
        obs = [(t * 7 + 3) % VOCAB for t in action[-self.observation :]] if self.observation else []
        self.seq = self.seq + list(action) + obs
        return StepResult(reward, False, tinker.ModelInput.from_ints(self.seq), [], metrics=metrics)


@dataclass
class TokenGroupBuilder(EnvGroupBuilder):
    prompt: list[int]
    samples: int
    turns: int
    observation: int
    tag: str
    shared_prompt: bool
    garbage: Garbage = Garbage()

    async def make_envs(self) -> Sequence[Env]:
        prompts = [
            self.prompt if self.shared_prompt else self.prompt[:-1] + [(self.prompt[-1] + i) % VOCAB]
            for i in range(self.samples)
        ]
        return [TokenEnv(p, self.turns, self.observation, self.garbage) for p in prompts]

    async def compute_group_rewards(self, trajectory_group, env_group):
        self.garbage.grade_group(len(trajectory_group))  # no await: one synchronous stretch
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return [self.tag]


class TokenDataset(RLDataset):
    def __init__(
        self, workload: Workload, steps: int, seed: int, shared_prompt: bool, batch_scale: int = 1,
        garbage: Garbage = Garbage(),
    ) -> None:
        self.workload, self.steps, self.seed, self.shared_prompt = workload, steps, seed, shared_prompt
        self.batch_scale = batch_scale
        self.garbage = garbage
        # Alive when the loop starts, dropped in the first step (its first batch).
        self.setup_garbage = cycles(garbage.start * 2**20, garbage.node) if garbage.start else None

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        w = self.workload
        self.setup_garbage = None
        rng = random.Random(f"{self.seed}-{index}")
        return [
            TokenGroupBuilder(
                prompt=[rng.randrange(VOCAB) for _ in range(w.prompt)],
                samples=w.samples,
                turns=w.turns,
                observation=w.observation,
                tag=f"task{g % 7}",
                shared_prompt=self.shared_prompt,
                garbage=self.garbage,
            )
            for g in range(w.groups * self.batch_scale)
        ]

    def __len__(self) -> int:
        return self.steps


@chz.chz
class TokenDatasetBuilder(RLDatasetBuilder):
    workload: str
    steps: int
    seed: int = 0
    shared_prompt: bool = False
    batch_scale: int = 1
    garbage: str = ""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        workload = LOOP_WORKLOADS[self.workload]
        garbage = Garbage.parse(self.garbage)
        return TokenDataset(workload, self.steps, self.seed, self.shared_prompt, self.batch_scale, garbage), None


class StubTokenizer:
    """What the trainer asks of a tokenizer (printing a group's datums)."""

    eos_token_id = 0
    bos_token_id = 0
    name_or_path = "stub"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def decode(self, tokens, skip_special_tokens: bool = False) -> str:
        if isinstance(tokens, int):
            tokens = [tokens]
        return "".join(chr(0x4E00 + int(t) % 0x5000) for t in tokens)
