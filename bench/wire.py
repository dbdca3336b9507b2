"""Request bytes (contract §10): tinker_rl_data.encode_forward_backward
against tinker's own encoder, on the workloads of bench/workloads.py.

1. Encoding: one forward_backward request holding a workload's Datums,
   by tinker (`forward_backward_request_to_proto(request)` +
   `SerializeToString()`, what `AsyncTrainingResource.forward_backward`
   runs) and by ours, in turn; for the Datums of
   `assemble_training_data` with list and numpy model input, and of
   `tinker_rl_data.cookbook.assemble_training_data` with provenance (read
   from cookbook-shaped objects, so tinker_cookbook is not needed).
2. Rollouts to request bytes: compute_advantages + assemble_training_data +
   encoding, with our encoder and with tinker's.
3. In the trainer's conditions: the Datums of a step
   (`tinker_rl_data.cookbook.assemble_training_data`, provenance) cut into
   requests by tinker's own chunker (`TrainingClient._chunked_requests_generator`,
   its default 5 MB / 1024 Datums per request), encoded one request after
   another, each freed before the next, by tinker's encoder and then by
   ours (as a stock step and an installed step follow each other): per step
   time and minor page faults, in a child process each with huge pages for
   large outputs on and off (TINKER_RL_DATA_HUGEPAGES=0).

Medians of --repeats runs (default 7) after a warm-up, GC enabled; each
run's result is freed outside the clock. Ratios are within one run. The
encoders are timed each after an untimed run of its own (right after
tinker's encoder, whose freed memory goes back to the system, ours page-
faults its whole output in afresh: reported beside, with the faults).

    python bench/wire.py [--repeats N] [--workload NAME ...]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import tinker  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.types import ForwardBackwardInput, ForwardBackwardRequest  # noqa: E402

import tinker_rl_data as trd  # noqa: E402
from tinker_rl_data import cookbook  # noqa: E402
from tinker_rl_data import encode_forward_backward  # noqa: E402
from workloads import WORKLOADS, positions  # noqa: E402


def request(datums) -> ForwardBackwardRequest:
    return ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(data=datums, loss_fn="importance_sampling"),
        model_id="model",
        seq_id=1,
    )


def tinkers(req) -> bytes:
    return forward_backward_request_to_proto(req).SerializeToString()


def ours(req) -> bytes:
    return encode_forward_backward(req)


def cookbook_shaped(groups) -> list:
    """The rollouts as tinker-cookbook objects would hold them, read by
    attribute: each turn a transition whose observation is the prompt and
    whose action has a sequence_id (so the Datums carry provenance spans)."""
    out = []
    for g, group in enumerate(groups):
        trajectories = [
            SimpleNamespace(
                transitions=[
                    SimpleNamespace(
                        ob=tinker.ModelInput.from_ints(list(turn.prompt_tokens)),
                        ac=SimpleNamespace(
                            tokens=list(turn.completion_tokens),
                            logprobs=list(turn.logprobs),
                            sequence_id=f"seq-{g}-{t}-{u}",
                        ),
                        reward=0.0,
                        episode_done=u == len(traj.turns) - 1,
                        metrics={},
                    )
                    for u, turn in enumerate(traj.turns)
                ],
                final_ob=tinker.ModelInput.empty(),
            )
            for t, traj in enumerate(group.trajectories)
        ]
        rewards = [t.reward for t in group.trajectories]
        out.append(SimpleNamespace(trajectories_G=trajectories, final_rewards_G=rewards, metrics_G=[{}] * len(rewards)))
    return out


def group_advantages(cb_groups) -> list[list[float]]:
    return [[r - sum(g.final_rewards_G) / len(g.final_rewards_G) for r in g.final_rewards_G] for g in cb_groups]


def alternate(fns: dict, repeats: int, settle: bool = False) -> dict[str, float]:
    """Median seconds of each function, run in turn, after a warm-up each.
    With ``settle``, each timed run follows an untimed run of the same
    function: it is timed in the memory state its own runs leave (right
    after the other encoder freed its memory, the output's pages are
    faulted in afresh, see ``page_faults``)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if settle:
                fn()
            t0 = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t0)
            del result
    return {name: statistics.median(t) for name, t in times.items()}


def page_faults(fn, before) -> int:
    """Minor page faults of one ``fn()`` run right after ``before()``."""
    import resource

    before()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start


def encoding_rows(name: str, repeats: int, log) -> list[dict]:
    groups = WORKLOADS[name].build()
    n_pos, _ = positions(groups)
    advantages = trd.compute_advantages(groups)
    cb_groups = cookbook_shaped(groups)
    cases = {
        "list model input": lambda: trd.assemble_training_data(groups, advantages)[0],
        'model_input_tokens="numpy"': lambda: trd.assemble_training_data(
            groups, advantages, model_input_tokens="numpy"
        )[0],
        "tinker_rl_data.cookbook, provenance": lambda: cookbook.assemble_training_data(
            cb_groups, group_advantages(cb_groups)
        )[0],
    }
    rows = []
    for label, make in cases.items():
        req = request(make())
        same = ours(req) == forward_backward_request_to_proto(req).SerializeToString(deterministic=True)
        t = alternate({"tinker": lambda: tinkers(req), "ours": lambda: ours(req)}, repeats, settle=True)
        after = alternate({"tinker": lambda: tinkers(req), "ours": lambda: ours(req)}, repeats)["ours"]
        sent = sum(d.model_input.length for d in req.forward_backward_input.data)
        row = {
            "workload": name, "datums": label, "n": len(req.forward_backward_input.data), "sent": sent,
            "bytes": len(ours(req)), "tinker": t["tinker"], "ours": t["ours"], "same": same, "n_pos": n_pos,
            "after": after, "faults": page_faults(lambda: ours(req), lambda: tinkers(req)),
        }
        log(f"{name:18} {label:38} tinker {t['tinker'] * 1e3:7.1f} ms  ours {t['ours'] * 1e3:6.1f} ms  "
            f"{t['tinker'] / t['ours']:5.1f}x  (right after tinker's: {after * 1e3:.1f} ms, "
            f"{row_faults(row)} page faults)  bytes {'identical' if same else 'DIFFER'}")
        rows.append(row)
        del req
        gc.collect()
    return rows


def row_faults(row) -> str:
    return f"{row['faults']:,}"


def pipeline_rows(name: str, repeats: int, log) -> list[dict]:
    groups = WORKLOADS[name].build()
    n_pos, _ = positions(groups)
    rows = []
    for label, tokens in [("list model input", "list"), ('model_input_tokens="numpy"', "numpy")]:
        def run(encode, tokens=tokens):
            advantages = trd.compute_advantages(groups)
            datums, _ = trd.assemble_training_data(groups, advantages, model_input_tokens=tokens)
            return encode(request(datums))

        t = alternate({"tinker": lambda: run(tinkers), "ours": lambda: run(ours)}, repeats)
        log(f"{name:18} rollouts -> bytes, {label:26} tinker's encoder {t['tinker'] * 1e3:7.1f} ms  "
            f"ours {t['ours'] * 1e3:6.1f} ms  {t['ours'] / t['tinker']:.2f}x the time")
        rows.append({"workload": name, "datums": label, "tinker": t["tinker"], "ours": t["ours"], "n_pos": n_pos})
        gc.collect()
    return rows


def tinkers_chunks(datums) -> list[list]:
    """The Datums of each request tinker's TrainingClient would send."""
    from tinker.lib.public_interfaces.training_client import TrainingClient
    from tinker.types.client_config_response import ClientConfigResponse

    client = SimpleNamespace(holder=SimpleNamespace(_client_config=ClientConfigResponse()))
    return [chunk.data for chunk in TrainingClient._chunked_requests_generator(client, datums)]


def loop_child(name: str, repeats: int) -> dict:
    """Per step: every request encoded by tinker, then by ours, each freed
    at once; medians of the step times and page faults."""
    import resource

    groups = WORKLOADS[name].build()
    cb_groups = cookbook_shaped(groups)
    datums = cookbook.assemble_training_data(cb_groups, group_advantages(cb_groups))[0]
    requests = [request(chunk) for chunk in tinkers_chunks(datums)]
    assert all(ours(r) == forward_backward_request_to_proto(r).SerializeToString(deterministic=True) for r in requests)

    def step(encode) -> tuple[float, int]:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        for r in requests:
            body = encode(r)
            del body
        return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    runs: dict[str, list[tuple[float, int]]] = {"tinker": [], "ours": []}
    step(tinkers), step(ours)
    for _ in range(repeats):
        runs["tinker"].append(step(tinkers))
        runs["ours"].append(step(ours))
    out = {"workload": name, "requests": len(requests), "datums": len(datums)}
    for k, v in runs.items():
        out[k] = statistics.median(t for t, _ in v)
        out[k + "_faults"] = statistics.median(f for _, f in v)
    return out


def loop_rows(name: str, repeats: int, log) -> list[dict]:
    import json
    import os
    import subprocess

    rows = []
    for huge in ("1", "0"):
        env = {**os.environ, "TINKER_RL_DATA_HUGEPAGES": huge}
        cmd = [sys.executable, __file__, "--loop-child", name, "--repeats", str(repeats)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        row = {**json.loads(proc.stdout.splitlines()[-1]), "huge_pages": huge == "1"}
        log(f"{name:18} tinker's chunks ({row['requests']} requests), huge pages {'on ' if row['huge_pages'] else 'off'}: "
            f"tinker {row['tinker'] * 1e3:7.1f} ms ({row['tinker_faults']:,.0f} faults)  ours right after "
            f"{row['ours'] * 1e3:6.1f} ms ({row['ours_faults']:,.0f} faults)  {row['tinker'] / row['ours']:.1f}x")
        rows.append(row)
    return rows


def markdown(encoding: list[dict], pipeline: list[dict], repeats: int, loop: list[dict] | None = None) -> str:
    lines = [
        "## Request bytes: tinker_rl_data.encode_forward_backward against tinker's encoder",
        "",
        f"One forward_backward request of the workload's Datums; median of {repeats} runs, the two encoders",
        "in turn, each timed run after an untimed run of the same encoder (its own memory state), GC enabled.",
        "tinker: `forward_backward_request_to_proto(request).SerializeToString()`; ours:",
        "`tinker_rl_data.encode_forward_backward(request)`, whose bytes equal tinker's",
        "`SerializeToString(deterministic=True)` (checked in the same run). \"Right after tinker's\": ours",
        "timed right after a run of tinker's encoder, whose freed memory leaves our output's pages to be",
        "faulted in afresh (and the page faults of one such run).",
        "",
        "| workload | Datums | count | request MB | tinker ms | ours ms | ns / position (tinker / ours) | speed-up "
        "| ours right after tinker's: ms, page faults | bytes |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in encoding:
        lines.append(
            f"| {r['workload']} | {r['datums']} | {r['n']:,} | {r['bytes'] / 1e6:.1f} | {r['tinker'] * 1e3:.1f} | "
            f"{r['ours'] * 1e3:.1f} | {r['tinker'] / r['sent'] * 1e9:.0f} / {r['ours'] / r['sent'] * 1e9:.1f} | "
            f"{r['tinker'] / r['ours']:.1f}x | {r['after'] * 1e3:.1f}, {row_faults(r)} | "
            f"{'identical' if r['same'] else 'DIFFER'} |"
        )
    lines += [
        "",
        "Rollouts to request bytes (compute_advantages + assemble_training_data + encoding), same run:",
        "",
        "| workload | model input | with tinker's encoder ms | with ours ms | ours / tinker's |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in pipeline:
        lines.append(
            f"| {r['workload']} | {r['datums']} | {r['tinker'] * 1e3:.1f} | {r['ours'] * 1e3:.1f} | "
            f"{r['ours'] / r['tinker']:.2f}x |"
        )
    if loop:
        lines += [
            "",
            "In the trainer's conditions: a step's Datums (tinker_rl_data.cookbook, provenance) in the requests",
            "tinker's chunker cuts, encoded one after another and freed, tinker's encoder then ours; medians per",
            "step, minor page faults per step; huge pages for outputs of 4 MiB and more on / off:",
            "",
            "| workload | requests | huge pages | tinker ms | faults | ours ms | faults | speed-up |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in loop:
            lines.append(
                f"| {r['workload']} | {r['requests']} | {'on' if r['huge_pages'] else 'off'} | "
                f"{r['tinker'] * 1e3:.1f} | {r['tinker_faults']:,.0f} | {r['ours'] * 1e3:.1f} | "
                f"{r['ours_faults']:,.0f} | {r['tinker'] / r['ours']:.1f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workload", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--loop-only", action="store_true", help="only section 3 (tinker's chunks)")
    parser.add_argument("--loop-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = max(args.repeats, 5)
    if args.loop_child:
        import json

        print(json.dumps(loop_child(args.loop_child, repeats)))
        return
    encoding, pipeline, loop = [], [], []
    log = lambda s: print(s, flush=True)  # noqa: E731
    if not args.loop_only:
        for name in args.workload:
            encoding += encoding_rows(name, repeats, log)
        for name in args.workload:
            pipeline += pipeline_rows(name, repeats, log)
    for name in args.workload:
        loop += loop_rows(name, repeats, log)
    print()
    print(markdown(encoding, pipeline, repeats, loop))


if __name__ == "__main__":
    main()
