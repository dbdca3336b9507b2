"""The client's CPU per RL step of tinker-cookbook's trainer (issue 19), as
shipped and with `tinker_rl_data.cookbook.install()`.

Per workload (bench/workloads.py, as tinker-cookbook types), the pieces the
trainer's default sync path runs on the client around one forward_backward,
each timed on its own, through the trainer modules' own names (so one code
path measures both variants; install()/uninstall() switches between them):

  trajectory metrics   rl.metric_util.compute_trajectory_metrics(groups, taglist)
  rollout usage        rl.train.rollout_usage(groups)
  data processing      rl.train's compute_advantages + assemble_training_data
  remove mask          [rl.train._remove_mask(d) for d in data]
  request encoding     ForwardBackwardRequest + tinker's forward_backward_request_to_proto(...)
                       .SerializeToString(), as tinker's forward_backward runs it; in the
                       installed variant tinker_rl_data.encode_forward_backward, when
                       this build has it
  response decode      tinker's deserialize_forward_backward_output of a response with one
                       float32 logprob per position, + rl.train._training_logprobs_from_fwd_bwd
                       (TensorData.to_torch() per Datum), unchanged by install()
  KL metrics           rl.metrics.compute_kl_sample_train(data, training_logprobs)
  training usage       rl.train.training_usage(data)

Also measured, outside the step total: tinker's own chunk sizing before it
encodes (`_estimate_datum_bytes_count_proto` per Datum).

Each transition reports two metrics (`format`, `correct`), as the math
environments do; each group's logging tags are the workload's (7 distinct,
so the cookbook computes per-tag metrics). The two variants run
alternately (ABBA), GC enabled, median of --repeats after a warm-up.

    python bench/step.py [--repeats N] [--workload NAME ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import numpy as np  # noqa: E402

from workloads import WORKLOADS, cookbook_available, to_cookbook  # noqa: E402

PIECES = [
    ("trajectory metrics", "rl.metric_util.compute_trajectory_metrics"),
    ("rollout usage", "rl.train.rollout_usage"),
    ("data processing", "compute_advantages + assemble_training_data"),
    ("remove mask", "rl.train._remove_mask per Datum"),
    ("request encoding", "forward_backward request bytes"),
    ("response decode", "tinker's decode + to_torch per Datum"),
    ("KL metrics", "rl.metrics.compute_kl_sample_train"),
    ("training usage", "rl.train.training_usage"),
]
REPLACED = {"trajectory metrics", "rollout usage", "data processing", "remove mask", "KL metrics", "training usage"}
TARGETS = {"single_turn_long": 25.0, "multi_turn_agent": 20.0, "many_short": 8.0}


def wire_encoder():
    """tinker_rl_data.encode_forward_backward, when this build has it."""
    try:
        return importlib.import_module("tinker_rl_data").encode_forward_backward
    except (ImportError, AttributeError):
        return None


def request(datums):
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    return ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(data=datums, loss_fn="importance_sampling"),
        model_id="model",
        seq_id=1,
    )


def tinker_encode(datums) -> bytes:
    """What tinker's AsyncTrainingResource.forward_backward makes."""
    from tinker.proto.request_conv import forward_backward_request_to_proto

    message = forward_backward_request_to_proto(request(datums))
    message.forward_only = False
    return message.SerializeToString()


def response_bytes(data, seed: int = 0) -> bytes:
    """A forward_backward response as the server sends it (protobuf): one
    ArrayRecord with one float32 logprob per position of every Datum, near
    the sampled ones (so the KL metrics are small, as in training)."""
    from tinker.proto import tinker_public_pb2 as pb

    rng = np.random.default_rng(seed)
    sampled = [d.loss_fn_inputs["logprobs"].to_numpy() for d in data]
    values = np.concatenate(sampled).astype(np.float32)
    values += rng.normal(0.0, 0.01, values.size).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sampled])]).astype(np.int64) * 4
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(data))
    record.fields["logprobs"].CopyFrom(
        pb.BatchedTensor(data=values.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)
    )
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    out.metrics["loss:sum"] = 1.0
    return out.SerializeToString()


def cookbook_batch(name: str):
    """The workload as cookbook groups, two metrics per transition, and
    the groups' logging tags."""
    groups = WORKLOADS[name].build()
    cb = to_cookbook(groups)
    for group in cb:
        for trajectory in group.trajectories_G:
            for transition in trajectory.transitions:
                transition.metrics.update(format=1.0, correct=float(len(transition.ac.tokens) % 2))
    return groups, cb, [list(g.tags) for g in groups]


def run_step(cb, taglist, response: bytes, encode) -> tuple[dict[str, float], int]:
    """One step's client pieces, each timed; returns seconds per piece and
    the request size."""
    from tinker.proto.response_conv import deserialize_forward_backward_output
    from tinker_cookbook.rl import metric_util, metrics, train

    out: dict[str, float] = {}
    clock = time.perf_counter

    t = clock()
    metric_util.compute_trajectory_metrics(cb, taglist)
    out["trajectory metrics"] = clock() - t

    t = clock()
    train.rollout_usage(cb)
    out["rollout usage"] = clock() - t

    t = clock()
    advantages = train.compute_advantages(cb)
    data, _ = train.assemble_training_data(cb, advantages)
    out["data processing"] = clock() - t

    t = clock()
    remove_mask = train._remove_mask
    sent = [remove_mask(d) for d in data]
    out["remove mask"] = clock() - t

    t = clock()
    body = encode(sent)
    out["request encoding"] = clock() - t

    t = clock()
    training_logprobs = train._training_logprobs_from_fwd_bwd(deserialize_forward_backward_output(response))
    out["response decode"] = clock() - t

    t = clock()
    metrics.compute_kl_sample_train(data, training_logprobs)
    out["KL metrics"] = clock() - t

    t = clock()
    train.training_usage(data)
    out["training usage"] = clock() - t

    size = len(body)
    del advantages, data, sent, body, training_logprobs
    return out, size


def chunk_sizing(data) -> float:
    """tinker's per-Datum size estimate before it splits a request (unchanged)."""
    from tinker.lib.public_interfaces.training_client import _estimate_datum_bytes_count_proto

    t = time.perf_counter()
    sum(_estimate_datum_bytes_count_proto(d) for d in data)
    return time.perf_counter() - t


def measure(name: str, repeats: int, log=print) -> dict:
    import tinker_rl_data.cookbook as ours

    _, cb, taglist = cookbook_batch(name)
    ours.uninstall()
    from tinker_cookbook.rl import train

    data, _ = train.assemble_training_data(cb, train.compute_advantages(cb))
    response = response_bytes(data)
    sizing = chunk_sizing([train._remove_mask(d) for d in data])
    del data
    wire = wire_encoder()
    variants = {
        "shipped": (ours.uninstall, tinker_encode),
        "installed": (ours.install, (lambda d: wire(request(d))) if wire else tinker_encode),
    }
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    sizes = {}
    order = ["shipped", "installed"]
    for rep in range(repeats + 1):  # the first is a warm-up
        for variant in order if rep % 2 == 0 else order[::-1]:
            switch, encode = variants[variant]
            switch()
            seconds, sizes[variant] = run_step(cb, taglist, response, encode)
            if rep:
                runs[variant].append(seconds)
            gc.collect()
    ours.uninstall()
    result = {
        "workload": name,
        "wire": wire is not None,
        "chunk_sizing": sizing,
        "request_bytes": sizes,
        "pieces": {},
    }
    for piece, _ in PIECES:
        result["pieces"][piece] = {v: statistics.median(r[piece] for r in runs[v]) for v in variants}
    result["step"] = {v: statistics.median(sum(r.values()) for r in runs[v]) for v in variants}
    s, i = result["step"]["shipped"], result["step"]["installed"]
    log(f"{name:18} step {s * 1e3:8.1f} ms shipped, {i * 1e3:7.1f} ms installed: {s / i:5.1f}x")
    return result


def fmt(result: dict) -> str:
    step = result["step"]
    enc = "tinker_rl_data.encode_forward_backward" if result["wire"] else "tinker's encoder (no tinker_rl_data.encode_forward_backward in this build)"
    lines = [
        f"### {result['workload']}",
        "",
        f"Request encoding in the installed variant: {enc}.",
        "",
        "| piece | tinker-cookbook as shipped, ms | share | with install(), ms | share | speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for piece, what in PIECES:
        p = result["pieces"][piece]
        a, b = p["shipped"], p["installed"]
        ours = piece in REPLACED or (piece == "request encoding" and result["wire"])
        mark = "" if ours else " (tinker's)"
        lines.append(
            f"| {piece}{mark}: {what} | {a * 1e3:.2f} | {a / step['shipped'] * 100:.1f}% | "
            f"{b * 1e3:.2f} | {b / step['installed'] * 100:.1f}% | {a / b:.1f}x |"
        )
    a, b = step["shipped"], step["installed"]
    target = TARGETS[result["workload"]]
    lines.append(f"| **whole step** | **{a * 1e3:.1f}** | | **{b * 1e3:.1f}** | | **{a / b:.1f}x** (target {target:.0f}x) |")
    lines += [
        "",
        f"Not in the step total: tinker's chunk sizing before it encodes, {result['chunk_sizing'] * 1e3:.1f} ms "
        "(the same in both).",
    ]
    return "\n".join(lines)


def markdown(results: list[dict], repeats: int) -> str:
    return "\n\n".join(
        [
            "## The client's RL step: tinker-cookbook 0.6.1 as shipped and with tinker_rl_data.cookbook.install()",
            f"`python bench/step.py --repeats {repeats}`: medians of {repeats} steps per variant, the variants "
            "alternating (ABBA) in one process, GC enabled; each piece's median and its share of its "
            "variant's median step. Ratios are within one run (the machine is shared: absolute times drift).",
            *[fmt(r) for r in results],
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=HERE / "STEP.md", help="where the markdown goes")
    args = parser.parse_args()
    why = cookbook_available()
    if why is not None:
        sys.exit(f"bench/step.py needs tinker-cookbook (bash scripts/install_cookbook.sh): {why}")
    results = [measure(name, max(args.repeats, 1)) for name in args.workload]
    text = markdown(results, max(args.repeats, 1))
    print()
    print(text)
    args.out.write_text(text + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
