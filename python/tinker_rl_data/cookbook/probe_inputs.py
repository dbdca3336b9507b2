"""The probes' inputs for the cookbook's pieces: batches built from the
installed tinker-cookbook's own classes (so a changed class fails a probe,
not a training step), and Datums as tinker's own encoder puts them on the
wire."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["CookbookBatches", "assembly_args", "datum_bytes", "probe_datums"]


class CookbookBatches:
    """The installed cookbook's classes, and probe batches built from them."""

    def __init__(self) -> None:
        import tinker
        from tinker_cookbook.completers import TokensWithLogprobs
        from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

        self.tinker = tinker
        self.tokens_with_logprobs = TokensWithLogprobs
        self.trajectory = Trajectory
        self.group_class = TrajectoryGroup
        self.transition = Transition
        self.provenance = "sequence_id" in inspect.signature(TokensWithLogprobs).parameters

    def ob(self, *chunks: Any) -> Any:
        return self.tinker.ModelInput(chunks=list(chunks))

    def text(self, *tokens: int) -> Any:
        return self.tinker.EncodedTextChunk(tokens=list(tokens))

    def image(self, n: int) -> Any:
        return self.tinker.types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=n)

    def step(self, ob: Any, tokens: list[int], reward: float = 0.0, sequence_id: Any = "s", **metrics: float) -> Any:
        extra = {"sequence_id": sequence_id} if self.provenance else {}
        ac = self.tokens_with_logprobs(tokens=tokens, maybe_logprobs=[-0.5 - 0.25 * i for i in range(len(tokens))], **extra)
        return self.transition(ob=ob, ac=ac, reward=reward, episode_done=False, metrics=dict(metrics))

    def traj(self, *transitions: Any) -> Any:
        return self.trajectory(transitions=list(transitions), final_ob=self.ob())

    def group(self, trajectories: list[Any], rewards: list[float]) -> Any:
        return self.group_class(trajectories_G=trajectories, final_rewards_G=rewards, metrics_G=[{} for _ in rewards])

    def trajectories(self) -> list[Any]:
        """Single and multi-turn (merged and not), images, a parse-error mask,
        a transition without a sequence id."""
        ob, text, image, step = self.ob, self.text, self.image, self.step
        return [
            self.traj(step(ob(text(1, 2, 3)), [4, 5], reward=1.0)),
            self.traj(step(ob(text(1, 2)), [3], reward=0.5), step(ob(text(1, 2, 3, 9)), [10, 11])),
            self.traj(step(ob(text(1, 2)), [3]), step(ob(text(7, 8)), [9, 10], reward=2.0)),
            self.traj(step(ob(text(1), image(2), text(5)), [6, 7]), step(ob(text(1), image(2), text(5, 6, 7, 8)), [9])),
            self.traj(step(ob(text(1, 2)), [3, 4], parse_error_masked=1.0), step(ob(text(1, 2, 3, 4, 5)), [6])),
            self.traj(step(ob(text(1, 2)), [3], sequence_id=None), step(ob(text(1, 2, 3, 4)), [5])),
        ]

    def batches(self) -> list[list[Any]]:
        trajs = self.trajectories()
        return [
            [self.group(trajs[:3], [0.0, 1.0, 0.25]), self.group(trajs[3:], [1.0, 0.0, -1.0])],
            [self.group([trajs[0], trajs[1]], [1.0, 1.0])],  # constant
            [self.group([trajs[2]], [0.5])],  # one trajectory
            [self.group([], [])],  # empty
            [],
        ]


def datum_bytes(datums: Any) -> bytes:
    """The Datums as tinker's own encoder puts them on the wire."""
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=list(datums), loss_fn="importance_sampling"),
        model_id="probe",
    )
    return forward_backward_request_to_proto(request).SerializeToString(deterministic=True)


def assembly_args(batch: list[Any]) -> tuple[list[Any], list[list[float]]]:
    """``assemble_training_data``'s arguments for ``batch``: one advantage per trajectory."""
    return batch, [[0.5 - j for j in range(len(g.trajectories_G))] for g in batch]


def probe_datums() -> list[Any]:
    """The Datums of the first probe batch, assembled by the cookbook's
    ``assemble_training_data`` (as its module holds it: the cookbook's, or
    ours where installed, which its probe found equal)."""
    from tinker_cookbook.rl.data_processing import assemble_training_data

    batch = CookbookBatches().batches()[0]
    return list(assemble_training_data(*assembly_args(batch))[0])
