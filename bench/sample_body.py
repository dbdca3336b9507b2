"""tinker's `sample` request bodies: ours (tinker_rl_data.tinker.sample, the
replacement `make_model_dump` gives for `tinker.resources.sampling.model_dump`)
against tinker's (`model_dump(request, exclude_unset=False, exclude_none=True,
mode="json")` + httpx's `json.dumps(ensure_ascii=False, separators=(",", ":"),
allow_nan=False).encode()`), on the requests an RL step sends:

- scoring: single_turn_long's KL scoring calls (`rl.metrics.score_sequences`
  -> `compute_logprobs`): one request per Datum over its whole sequence
  (1,024 sequences of 1,535 tokens, the sequence's last token a chunk of its
  own as `_full_sequence_inputs` appends it), `max_tokens=1`,
  `prompt_logprobs=True`;
- rollouts: every turn's prompt of a workload (`TinkerTokenCompleter`:
  `num_samples=1`, stop strings, `max_tokens`, `temperature`), as
  `SamplingClient._send_asample_request` builds the request.

Each set of requests is built once; the clock covers only the bodies.
Medians of --repeats runs (default 7) after a warm-up; the bodies are
checked equal first. Ratios are within one run.

    python bench/sample_body.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import tinker._compat  # noqa: E402
from tinker import types  # noqa: E402

from tinker_rl_data.tinker.sample import ASAMPLE_ARGS, httpx_json, make_model_dump  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

STOP = ["<|im_end|>", "<|endoftext|>"]


def request(prompt: types.ModelInput, params: types.SamplingParams, seq_id: int, logprobs: bool) -> types.SampleRequest:
    return types.SampleRequest(
        sampling_session_id="sampling-session-0",
        seq_id=seq_id,
        num_samples=1,
        prompt=prompt,
        sampling_params=params,
        prompt_logprobs=logprobs,
        topk_prompt_logprobs=0,
        topk_sample_logprobs=0,
        target_prompt_logprobs=None,
        prompt_alt_tokens_k=0,
        prompt_logprobs_last_n=None,
        record_stability_info=False,
    )


def scoring_requests(name: str) -> list[types.SampleRequest]:
    out = []
    for group in WORKLOADS[name].build():
        for traj in group.trajectories:
            for turn in traj.turns:
                sequence = list(turn.prompt_tokens) + list(turn.completion_tokens)
                prompt = types.ModelInput.from_ints(sequence[:-2]).append_int(sequence[-2])
                out.append(request(prompt, types.SamplingParams(max_tokens=1), len(out), True))
    return out


def rollout_requests(name: str) -> list[types.SampleRequest]:
    w = WORKLOADS[name]
    params = types.SamplingParams(stop=STOP, max_tokens=w.completion, temperature=1.0)
    out = []
    for group in w.build():
        for traj in group.trajectories:
            for turn in traj.turns:
                out.append(request(types.ModelInput.from_ints(list(turn.prompt_tokens)), params, len(out), False))
    return out


def tinkers(requests) -> None:
    dump = tinker._compat.model_dump
    for r in requests:
        httpx_json(dump(r, **ASAMPLE_ARGS))


OURS = make_model_dump(tinker._compat.model_dump)


def ours(requests) -> None:
    for r in requests:
        OURS(r, **ASAMPLE_ARGS)


def median_seconds(fn, requests, repeats: int) -> float:
    fn(requests)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(requests)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sets = [
        ("single_turn_long scoring sequences", scoring_requests("single_turn_long")),
        ("multi_turn_agent prompts", rollout_requests("multi_turn_agent")),
        ("single_turn_long prompts", rollout_requests("single_turn_long")),
        ("many_short prompts", rollout_requests("many_short")),
    ]
    print("| requests | count | tokens | JSON MB | tinker ms | ours ms | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, requests in sets:
        size = 0
        for r in requests:
            body = OURS(r, **ASAMPLE_ARGS)
            assert isinstance(body, bytes) and body == httpx_json(tinker._compat.model_dump(r, **ASAMPLE_ARGS))
            size += len(body)
        tokens = sum(r.prompt.length for r in requests)
        theirs_s = median_seconds(tinkers, requests, args.repeats)
        ours_s = median_seconds(ours, requests, args.repeats)
        print(
            f"| {name} | {len(requests):,} | {tokens:,} | {size / 1e6:.1f} | {theirs_s * 1e3:,.1f} "
            f"| {ours_s * 1e3:,.1f} | {theirs_s / ours_s:.1f}x |"
        )


if __name__ == "__main__":
    main()
