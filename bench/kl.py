"""The client's CPU in tinker-cookbook 0.6.1's KL penalty passes, stock and
tinker_rl_data's (tinker_rl_data.cookbook.kl), with a scoring client that answers
at once (so only the client's own work is counted).

Per workload (bench/workloads.py; one Datum per trajectory, turns merged
as the cookbook merges them, mask 1 on action positions):

  KL penalty, discount 0    rl.metrics.incorporate_kl_penalty(data, client, 0.1, 0.0)
  KL penalty, discount 0.9  rl.metrics.incorporate_kl_penalty(data, client, 0.1, 0.9)
  post-update KL            rl.metrics.compute_post_kl(data, client)
  distillation penalty      distillation.train_on_policy.incorporate_kl_penalty(data, teachers, ...)

and `discounted_future_sum_vectorized` of one 32,768-element float32
tensor. Each pass's floor is its scoring calls alone: the same client
answering the same calls, gathered as the cookbook gathers them (one
asyncio Task per Datum; for distillation, tinker's `compute_logprobs`
list of each response), which any implementation keeping the cookbook's
requests pays; "above the floor" compares what is left. The fake client's responses are tinker `SampleResponse`s with
`prompt_logprobs_np` (as tinker's decoder makes them), made afresh before
each run (a response caches its list once made). CPU is
`time.process_time()` around each call; stock and ours alternate, median of
--repeats after a warm-up.

    python bench/kl.py [--repeats N] [--workload NAME ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import numpy as np  # noqa: E402

from workloads import VOCAB, WORKLOADS, cookbook_available  # noqa: E402

TARGETS = {"KL penalty, discount 0": 20.0, "KL penalty, discount 0.9": 1000.0, "discounted sum, 32k": 2000.0}


def datums(name: str, seed: int = 0) -> list:
    """Datums of the workload's shape: one per trajectory."""
    import tinker

    w = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    # Positions: the first prompt, then per turn the completion (mask 1) and
    # the observation after it (mask 0); the last token is only a target.
    pieces = [(w.prompt, 0.0)]
    for t in range(w.turns):
        pieces.append((w.completion, 1.0))
        if t < w.turns - 1:
            pieces.append((w.observation, 0.0))
    mask_full = np.concatenate([np.full(n, m, np.float32) for n, m in pieces])
    n = len(mask_full) - 1
    mask = mask_full[1:].copy()
    out = []
    for _ in range(w.groups * w.samples):
        tokens = rng.integers(0, VOCAB, n + 1)
        logprobs = (-rng.exponential(1.0, n)).astype(np.float32) * mask
        inputs = {
            "target_tokens": tinker.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "logprobs": tinker.TensorData.from_numpy(logprobs),
            "advantages": tinker.TensorData.from_numpy(mask * np.float32(rng.integers(0, 2) - 0.5)),
            "mask": tinker.TensorData.from_numpy(mask.copy()),
        }
        out.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:n].tolist()), loss_fn_inputs=inputs))
    return out


class Ready:
    def __init__(self, value):
        self.value = value

    async def _get(self):
        return self.value

    def coroutine(self):
        return self._get()


class Client:
    """Answers the i-th scoring call at once with the i-th prepared response."""

    def __init__(self, responses):
        self.responses = responses
        self.i = 0

    def _next(self):
        r = self.responses[self.i]
        self.i += 1
        return r

    def sample(self, prompt, num_samples, sampling_params, include_prompt_logprobs=False, **_):
        return Ready(self._next())

    def compute_logprobs(self, prompt, prompt_logprobs_last_n=None):
        # tinker's compute_logprobs returns the response's list.
        return Ready(self._next().prompt_logprobs)


def responses(data, seed: int = 1) -> list:
    import tinker

    rng = np.random.default_rng(seed)
    out = []
    for d in data:
        n = d.model_input.length + 1
        scores = (-rng.exponential(1.0, n)).astype(np.float32)
        scores[0] = np.nan
        seq = tinker.SampledSequence(
            stop_reason="length", sequence_id="s", tokens_np=np.zeros(1, np.int32), logprobs_np=np.zeros(1, np.float32)
        )
        out.append(tinker.SampleResponse(sequences=[seq], prompt_logprobs_np=scores, prompt_cache_hit_tokens=n // 2))
    return out


def timed(loop, make_call) -> float:
    call = make_call()
    gc.collect()
    start = time.process_time()
    if asyncio.iscoroutine(call):
        loop.run_until_complete(call)
    else:
        call()
    return time.process_time() - start


def measure(name: str, repeats: int, log=print) -> dict:
    import torch
    from tinker_cookbook.distillation import train_on_policy
    from tinker_cookbook.rl import metrics

    from tinker_rl_data.cookbook import kl as _kl

    data = datums(name)
    prepared = responses(data)
    loop = asyncio.new_event_loop()

    def fresh():
        # New response objects over the same arrays: none has its list yet.
        import tinker

        return [
            tinker.SampleResponse(sequences=r.sequences, prompt_logprobs_np=r.prompt_logprobs_np,
                                  prompt_cache_hit_tokens=r.prompt_cache_hit_tokens)
            for r in prepared
        ]

    import tinker

    sequences = metrics._full_sequence_inputs(data)
    params = tinker.SamplingParams(max_tokens=1)

    # A fresh client is made before the clock starts, as for stock and ours.
    async def scoring_floor(client):
        return await asyncio.gather(*[
            client.sample(prompt=s, num_samples=1, sampling_params=params, include_prompt_logprobs=True).coroutine()
            for s in sequences
        ])

    async def teacher_floor(client):
        return await asyncio.gather(*[client.compute_logprobs(s).coroutine() for s in sequences])

    def in_loop(floor):
        return lambda: floor(Client(fresh()))

    def penalty(f, gamma):
        return lambda: f(data, Client(fresh()), 0.1, gamma)

    def distill(f):
        def make():
            client = Client(fresh())
            return f(data, [client] * len(data), [i % 3 for i in range(len(data))], 1.0, 0.0)

        return make

    scoring, teaching = in_loop(scoring_floor), in_loop(teacher_floor)
    cases = {
        "KL penalty, discount 0": (penalty(metrics.incorporate_kl_penalty, 0.0), penalty(_kl.incorporate_kl_penalty, 0.0), scoring),
        "KL penalty, discount 0.9": (penalty(metrics.incorporate_kl_penalty, 0.9), penalty(_kl.incorporate_kl_penalty, 0.9), scoring),
        "post-update KL": (lambda: metrics.compute_post_kl(data, Client(fresh())), lambda: _kl.compute_post_kl(data, Client(fresh())), scoring),
        "distillation penalty": (distill(train_on_policy.incorporate_kl_penalty), distill(_kl.distillation_incorporate_kl_penalty), teaching),
    }
    if name == "single_turn_long":
        x = torch.randn(32_768, generator=torch.Generator().manual_seed(0))
        cases["discounted sum, 32k"] = (
            lambda: (lambda: metrics.discounted_future_sum_vectorized(x, 0.9)),
            lambda: (lambda: _kl.discounted_future_sum_vectorized(x, 0.9)),
            None,
        )
    result = {"workload": name, "datums": len(data), "positions": sum(len(d.loss_fn_inputs["mask"].to_numpy()) for d in data), "cases": {}}
    for case, (stock, ours, floor) in cases.items():
        runs = {"stock": [], "ours": [], "floor": []}
        variants = [("stock", stock), ("ours", ours)] + ([("floor", floor)] if floor else [])
        for rep in range(repeats + 1):
            for variant, make in variants if rep % 2 == 0 else variants[::-1]:
                seconds = timed(loop, make)
                if rep:
                    runs[variant].append(seconds)
        s, o = statistics.median(runs["stock"]), statistics.median(runs["ours"])
        f = statistics.median(runs["floor"]) if floor else 0.0
        result["cases"][case] = (s, o, f)
        above = f"{(s - f) / (o - f):7.1f}x above the floor {f * 1e3:.2f} ms" if floor and o > f else ""
        log(f"{name:18} {case:26} stock {s * 1e3:9.2f} ms  ours {o * 1e3:7.3f} ms  {s / o:7.1f}x  {above}")
    loop.close()
    return result


def markdown(results: list[dict], repeats: int) -> str:
    lines = [
        "## tinker-cookbook's KL penalty passes: stock and tinker_rl_data's",
        "",
        f"`python bench/kl.py --repeats {repeats}`: client CPU (`process_time`) per call with a scoring client "
        f"that answers at once, medians of {repeats} after a warm-up, stock and ours alternating in one process.",
        "",
        "| workload | pass | stock, ms | ours, ms | speed-up | target | floor: the scoring calls alone, ms | speed-up above the floor | floor-bound ceiling |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for case, (s, o, f) in r["cases"].items():
            target = f"{TARGETS[case]:.0f}x" if case in TARGETS else ""
            floor = f"{f * 1e3:.2f} | {(s - f) / (o - f):.1f}x | {s / f:.1f}x" if f and o > f else "- | - | -"
            lines.append(f"| {r['workload']} ({r['datums']} Datums, {r['positions']:,} positions) | {case} | "
                         f"{s * 1e3:.2f} | {o * 1e3:.3f} | {s / o:.1f}x | {target} | {floor} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here (bench/RESULTS.md holds the last run)")
    args = parser.parse_args()
    why = cookbook_available()
    if why is not None:
        sys.exit(f"bench/kl.py needs tinker-cookbook (bash scripts/install_cookbook.sh): {why}")
    repeats = max(args.repeats, 1)
    results = [measure(name, repeats) for name in args.workload]
    text = markdown(results, repeats)
    print()
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
