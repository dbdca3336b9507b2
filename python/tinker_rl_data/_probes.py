"""The probes that decide, on the user's machine, whether a piece goes in.

Each probe runs the function found installed (``original``) and ours on a
small input set shipped here and raises :class:`ProbeFailed` with a short
reason when they differ. The inputs are built from the installed packages'
own classes, so a changed tinker or tinker-cookbook (fields renamed, a
constructor changed) fails the probe instead of a training step.

What each compares:

- the request encoder: tinker's own ``AsyncTrainingResource.forward_backward``
  run with its post stubbed, once with tinker's message builder and once with
  ours, over every chunk type, dense and sparse tensors, both provenance arms
  and both kinds of ``loss_fn_config`` value: the posted bodies parse to equal
  messages, and ours is tinker's message serialized deterministically;
- the data processing: the Datums to the request byte (through tinker's own
  encoder) and the metadata, over multi-turn merges, images, parse-error
  masks, provenance, constant, empty and one-trajectory groups, and the
  exception class where the original raises;
- the step's metrics: equal keys, values within the contract's tolerance.
"""

from __future__ import annotations

import inspect
import math
import types as pytypes
from typing import Any, Callable


class ProbeFailed(Exception):
    """Ours and the installed function differ (or the probe input cannot be
    built with the installed classes); the message says how."""


def _check(condition: bool, reason: str) -> None:
    if not condition:
        raise ProbeFailed(reason)


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # the probe compares what the original raises too
        return "raised", exc


def _same_outcome(theirs: tuple[str, Any], mine: tuple[str, Any], what: str) -> bool:
    """Whether both raised (ours of the original's class or a subclass), or
    neither did; raises ProbeFailed otherwise."""
    if theirs[0] == "raised":
        _check(
            mine[0] == "raised" and isinstance(mine[1], type(theirs[1])),
            f"{what}: the original raised {type(theirs[1]).__name__}, ours "
            + (f"raised {type(mine[1]).__name__}" if mine[0] == "raised" else "returned"),
        )
        return False
    _check(mine[0] == "ok", f"{what}: the original returned, ours raised {mine[1]!r}")
    return True


# --------------------------------------------------------------------------
# tinker: the forward_backward request


def _requests() -> list[tuple[Any, bool]]:
    import numpy as np
    from tinker import types

    def text(tokens: Any) -> Any:
        return types.EncodedTextChunk.model_construct(tokens=tokens)

    dense = types.TensorData.from_numpy(np.array([0.5, -1.25, 3.0], dtype=np.float32))
    ints = types.TensorData.from_numpy(np.array([7, 8, 9], dtype=np.int64))
    sparse = types.TensorData(
        data=[2.5, -1.0], dtype="float32", shape=[2, 3], sparse_crow_indices=[0, 1, 2], sparse_col_indices=[2, 0]
    )
    chunks = [
        text([1, 2, 3]),
        text(np.array([4, 5], dtype=np.int32)),
        types.ImageChunk(data=b"\x89PNG probe", format="png", expected_tokens=2),
        types.DmelChunk(dmel=b"\x00\x01\x02"),
    ]
    plain = types.Datum(
        model_input=types.ModelInput(chunks=chunks[:2]),
        loss_fn_inputs={"target_tokens": ints, "weights": dense, "advantages": sparse},
    )
    mixed = types.Datum(
        model_input=types.ModelInput(chunks=chunks), loss_fn_inputs={"target_tokens": ints, "logprobs": dense}
    )
    spans = types.Datum(model_input=types.ModelInput(chunks=[text([1, 2, 3, 4])]), loss_fn_inputs={"x": ints})
    spans = spans.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id="p", offset=1, length=2),
            types.SampledProvenanceSpan(sequence_id="s", offset=0, length=2),
        ],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id="s", length=3)],
    )

    def request(data: list[Any], config: Any, seq_id: Any) -> Any:
        return types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(
                data=data, loss_fn="importance_sampling", loss_fn_config=config
            ),
            model_id="probe-model",
            seq_id=seq_id,
        )

    return [
        (request([plain, mixed, spans], {"clip": 0.2, "mode": "token", "a": 1.0}, 3), False),
        (request([plain], None, None), True),
        (request([], {}, 0), False),
    ]


def _tinker_method_with(builder: Callable[[Any], Any]) -> Callable[..., Any]:
    """tinker's own ``AsyncTrainingResource.forward_backward`` (as defined,
    below any wrapper) reading ``builder`` for ``forward_backward_request_to_proto``:
    a copy of the function with its own globals, so tinker's module is not
    touched while probing."""
    from tinker.resources import training

    method = inspect.unwrap(training.AsyncTrainingResource.forward_backward)
    code = getattr(method, "__code__", None)
    if not isinstance(code, pytypes.CodeType):
        raise ProbeFailed("tinker's AsyncTrainingResource.forward_backward is not a Python function")
    _check(
        "forward_backward_request_to_proto" in code.co_names and method.__globals__ is vars(training),
        "tinker's forward_backward no longer builds its message with "
        "tinker.resources.training.forward_backward_request_to_proto",
    )
    namespace = dict(method.__globals__)
    namespace["forward_backward_request_to_proto"] = builder
    return pytypes.FunctionType(code, namespace, method.__name__, method.__defaults__, method.__closure__)


def _posted_body(method: Callable[..., Any], request: Any, forward_only: bool) -> bytes:
    """What ``method`` posts for ``request`` (no compression), its post stubbed."""
    posted: list[bytes] = []

    async def post(path: str, *, body: bytes, **_: Any) -> None:
        _check(path == "/api/v1/forward_backward", f"tinker's forward_backward posts to {path!r}")
        posted.append(body)

    resource = pytypes.SimpleNamespace(
        _client=pytypes.SimpleNamespace(_client_config=pytypes.SimpleNamespace(proto_compress_fwdbwd=False)),
        _post=post,
    )
    coroutine = method(resource, request=request, forward_only=forward_only)
    try:
        coroutine.send(None)
    except StopIteration:
        pass
    else:
        coroutine.close()
        raise ProbeFailed("tinker's forward_backward waits on something besides its post")
    _check(len(posted) == 1 and isinstance(posted[0], bytes), "tinker's forward_backward did not post one bytes body")
    return posted[0]


def probe_encoder(original: Any, ours: Any) -> None:
    from tinker.proto import tinker_public_pb2 as public_pb

    stock_method, our_method = _tinker_method_with(original), _tinker_method_with(ours)
    for i, (request, forward_only) in enumerate(_requests()):
        expected = original(request)
        expected.forward_only = forward_only
        stock = _posted_body(stock_method, request, forward_only)
        mine = _posted_body(our_method, request, forward_only)
        parse = public_pb.ForwardBackwardRequest.FromString
        _check(parse(stock) == expected, f"request {i}: tinker's own body is not its message (probe out of date)")
        _check(parse(mine) == expected, f"request {i}: our body parses to another message than tinker's")
        _check(
            mine == expected.SerializeToString(deterministic=True),
            f"request {i}: our body is not tinker's message serialized deterministically",
        )


# --------------------------------------------------------------------------
# tinker-cookbook: the data processing


class _Cookbook:
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


def _datum_bytes(datums: Any) -> bytes:
    """The Datums as tinker's own encoder puts them on the wire."""
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=list(datums), loss_fn="importance_sampling"),
        model_id="probe",
    )
    return forward_backward_request_to_proto(request).SerializeToString(deterministic=True)


def _tensor_values(advantages: Any) -> list[tuple[Any, ...]]:
    return [(str(a.dtype), tuple(a.shape), a.tolist()) for a in advantages]


def probe_compute_advantages(original: Any, ours: Any) -> None:
    for i, batch in enumerate(_Cookbook().batches()):
        theirs, mine = _outcome(original, batch), _outcome(ours, batch)
        if _same_outcome(theirs, mine, f"batch {i}"):
            _check(_tensor_values(theirs[1]) == _tensor_values(mine[1]), f"batch {i}: other advantages")


def _assembly_args(cookbook: _Cookbook, batch: list[Any]) -> tuple[list[Any], list[list[float]]]:
    return batch, [[0.5 - j for j in range(len(g.trajectories_G))] for g in batch]


def probe_assemble_training_data(original: Any, ours: Any) -> None:
    cookbook = _Cookbook()
    for i, batch in enumerate(cookbook.batches()):
        args = _assembly_args(cookbook, batch)
        theirs, mine = _outcome(original, *args), _outcome(ours, *args)
        if _same_outcome(theirs, mine, f"batch {i}"):
            (their_data, their_meta), (my_data, my_meta) = theirs[1], mine[1]
            _check(_datum_bytes(their_data) == _datum_bytes(my_data), f"batch {i}: other Datums")
            _check(list(their_meta) == list(my_meta), f"batch {i}: other metadata")


def probe_trajectory_to_data(original: Any, ours: Any) -> None:
    cookbook = _Cookbook()
    bad = cookbook.traj(cookbook.step(cookbook.ob(), []))  # fewer than 2 tokens: the cookbook raises
    for i, traj in enumerate([*cookbook.trajectories(), bad]):
        theirs, mine = _outcome(original, traj, -0.75), _outcome(ours, traj, -0.75)
        if _same_outcome(theirs, mine, f"trajectory {i}"):
            _check(_datum_bytes(theirs[1]) == _datum_bytes(mine[1]), f"trajectory {i}: other Datums")


def probe_remove_constant_reward_groups(original: Any, ours: Any) -> None:
    for i, batch in enumerate(_Cookbook().batches()):
        theirs, mine = _outcome(original, batch), _outcome(ours, batch)
        if _same_outcome(theirs, mine, f"batch {i}"):
            _check([id(g) for g in theirs[1]] == [id(g) for g in mine[1]], f"batch {i}: other groups kept")


# --------------------------------------------------------------------------
# tinker-cookbook: the rest of the step


def _close(a: Any, b: Any) -> bool:
    """Equal, or (floats) within float32 rounding of the larger magnitude:
    the contract's tolerance for metrics summed in float64 against the
    cookbook's float32 or numpy sums."""
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))
    return bool(a == b)


def _same_metrics(theirs: dict[str, Any], mine: dict[str, Any], what: str) -> None:
    _check(list(theirs) == list(mine), f"{what}: other keys ({sorted(set(theirs) ^ set(mine))[:3]} differ)")
    for key in theirs:
        _check(_close(theirs[key], mine[key]), f"{what}: {key} is {mine[key]!r}, the original's {theirs[key]!r}")


def _probe_datums() -> list[Any]:
    cookbook = _Cookbook()
    from tinker_cookbook.rl.data_processing import assemble_training_data as _  # noqa: F401 (importable)

    from .cookbook import assemble_training_data

    batch = cookbook.batches()[0]
    return list(assemble_training_data(*_assembly_args(cookbook, batch))[0])


def probe_compute_kl_sample_train(original: Any, ours: Any) -> None:
    import torch

    data = _probe_datums()
    training = [
        torch.tensor([-0.25 * ((i + j) % 5) for j in range(len(d.loss_fn_inputs["target_tokens"].data))])
        for i, d in enumerate(data)
    ]
    theirs, mine = _outcome(original, data, training), _outcome(ours, data, training)
    if _same_outcome(theirs, mine, "the probe Datums"):
        _same_metrics(theirs[1], mine[1], "the probe Datums")


def probe_compute_trajectory_metrics(original: Any, ours: Any) -> None:
    cookbook = _Cookbook()
    batch = cookbook.batches()[0]
    for tags in ([["a"], ["b"]], [["a"], ["a"]], [[], ["x", "y"]]):
        theirs, mine = _outcome(original, batch, tags), _outcome(ours, batch, tags)
        if _same_outcome(theirs, mine, f"tags {tags}"):
            _same_metrics(theirs[1], mine[1], f"tags {tags}")


def probe_remove_mask(original: Any, ours: Any) -> None:
    data = _probe_datums()
    _check(_datum_bytes(map(original, data)) == _datum_bytes(map(ours, data)), "other Datums")


def _usage(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def probe_rollout_usage(original: Any, ours: Any) -> None:
    for i, batch in enumerate(_Cookbook().batches()):
        theirs, mine = _outcome(original, batch), _outcome(ours, batch)
        if _same_outcome(theirs, mine, f"batch {i}"):
            _check(_usage(theirs[1]) == _usage(mine[1]), f"batch {i}: {_usage(mine[1])} != {_usage(theirs[1])}")


def probe_training_usage(original: Any, ours: Any) -> None:
    data = _probe_datums()
    _check(_usage(original(data)) == _usage(ours(data)), "other usage")
