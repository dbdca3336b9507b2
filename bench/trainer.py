"""The user's trainer step: tinker-cookbook's own `rl.train.main` (default
sync path, unmodified) with tinker's real client, against a fake tinker
service in its own process on 127.0.0.1 that answers at once
(tests/support/fake_tinker.py), so only the client's time is counted, or
(--latency) after the time a service takes.

Per workload (tests/support/cookbook_env.py: tests/support/workloads.py's
shapes as a token-list environment, plus `tiny`), each variant runs N steps
in a fresh process (tests/support/trainer_run.py, the runner the trainer
tests use, which lists the variants' suffixes), variants alternating, --runs
times:

  stock         tinker-cookbook and tinker as installed
  installed     tinker_rl_data.cookbook.install(gc=False) (collector left alone)
  installed+gc  tinker_rl_data.cookbook.install(): the collector held to the step
                (tinker_rl_data.cookbook.gc_step; installed+gc:headroom=0.5&young=700
                sets StepCollector's arguments by its configure())
  VARIANT/no-huge-pages
                VARIANT with huge pages for large outputs off
                (TINKER_RL_DATA_HUGEPAGES=0)
  installed+coalesce
                tinker_rl_data.cookbook.install(coalesce=True): with
                --shared-prompt, a group's first sample calls go out as one
                request (the fake service draws per sample, so the draws and
                the bodies are stock's)
  VARIANT@failfast, VARIANT@retry, VARIANT@minviable
                VARIANT with rollout_error_tolerance FailFast,
                RetryOnFailure, MinViableGroup (as --tolerance, per variant)
  VARIANT/user-step, VARIANT/user-loop, VARIANT/guard-only
                a user's hook kept by install(); the guard alone

With --faults SPEC the fake service answers by a seeded fault schedule
(tests/support/fake_tinker.py `Faults`), each run's result has its requests
per path (received, retried, answered, faults) and the class of the
exception the run raised (then the next run goes on), or None.

Per step: wall and client CPU (the process's, all threads), the rollout
phase (dataset batch to the train step) and the train phase
(`do_train_step_and_get_sampling_client`), GC time and collections by
generation (gc.callbacks), RSS; per run, peak RSS. The first step of each
run is reported apart (connections, first calls); the table gives medians
over the later steps of all runs. Every run's forward_backward bodies
(recorded by the fake service) and logged metrics (but `time/*`) are
compared with the first stock run's: bodies parsed as protobuf and
re-serialized deterministically (map order is per process), metrics equal
(integers) or within float32 rounding (floats, see docs/contract.md §9).

Modes users run (each applies to every variant of the invocation):

  --executor process:N | forkserver:N | ray:N
                the group rollouts in N worker processes:
                `rl.train.main(config, rollout_executor=...)` with a
                ProcessPoolExecutor (spawn or forkserver) or a Ray-backed
                concurrent.futures.Executor (tests/support/ray_executor.py;
                `ray` must be installed: a local `ray.init(num_cpus=N)`)
  --async       AsyncConfig(max_steps_off_policy=--off-policy (1),
                groups_per_batch=the workload's groups): off-policy, groups
                streamed into the next step; a step is the time between two
                logged steps
  --stream-minibatch
                StreamMinibatchConfig(groups_per_batch=the workload's groups,
                num_minibatches=--minibatches (2))
  --batch-scale K
                K times the workload's groups per step
  --latency SPEC
                the fake service takes time (tests/support/fake_tinker.py
                `Latency`; `on`: 0.5 s + 4 ms per token a sample, 512
                sequences at once, the rest queued; forward_backward and
                optim_step 50 ms each; a poll of a future not ready held until
                it is): the table gains what the service saw
  --tls         the fake service over HTTPS, HTTP/2 by ALPN, as the real
                service is reached (plain HTTP/1.1 otherwise: a connection for
                each request in flight)
  --client-config JSON
                the flags the fake service's /api/v1/client/config answers
                (fields of tinker's ClientConfigResponse, e.g.
                '{"sample_use_retrieve_futures": true, "proto_compress_fwdbwd": true}'
                or '{"use_pyqwest_transport": false}'), and what they make
                the client send served (tests/support/fake_tinker.py)
  --garbage KIND:MB[+KIND:MB]
                the environment makes cyclic garbage as real ones do
                (tests/support/garbage.py): step:MB every env.step (held
                across an await), grade:MB each group's grading (one
                synchronous stretch, 50 KB gradings), start:MB alive when the
                loop starts and dropped in the first step

With a rollout executor, each run also reports what its workers installed
(tinker_rl_data.cookbook.workers.seen(): pieces, rollouts, GC steps, coalesced
calls). Async and stream-minibatch bodies are compared as multisets of
Datums over the whole run (which group lands in which request depends on
completion order); async metrics are compared in the steps that trained the
same groups as the reference run (same_groups_steps), stream-minibatch's in
every step.

    python bench/trainer.py [--steps N] [--runs R] [--workload NAME ...]
                            [--variants stock,installed,installed+gc] [--out PATH]
                            [--executor KIND:N] [--async] [--stream-minibatch]

With --soak, the RSS at each step's start and its peak (sampled every 20 ms:
each read of /proc/self/statm costs ~0.3 ms of CPU in a process this size, a
thread no user runs) are printed per step too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path[:0] = [str(HERE), str(TESTS)]

# Each run is the tests' runner (tests/support/trainer_run.py), compared by
# the tests' checks (tests/support/trainer_checks.py).
from support.trainer_checks import (  # noqa: E402
    canonical_bodies,
    compare_metrics,
    compare_run_bodies,
    comparable,
    same_groups_steps,
)
from support.trainer_run import NO_HUGE_PAGES, add_run_options, run_flags  # noqa: E402

RUNNER = TESTS / "support" / "trainer_run.py"

VARIANTS = ("stock", "installed", "installed+gc")
TARGETS = {"single_turn_long": 1.6, "many_short": 1.35, "multi_turn_agent": 1.3}


# ---------------------------------------------------------------------------
# comparing runs


def request_order(args: argparse.Namespace, requests: int) -> int | None:
    """How many consecutive requests (in seq_id order) hold one step's
    groups in a mode whose order is not deterministic: stream-minibatch,
    each step's requests (a step's groups are fixed, their split into
    minibatches, and tinker's into requests, is completion order): the
    run's ``requests`` over its steps; async, the whole run (0: which step
    trains a group depends on completion order too); None: each request in
    order. With shared prompts, each step's requests too: which member of a
    group gets which draw is arrival order, and tinker's chunker may cut a
    group across two requests."""
    if args.async_:
        return 0
    if args.stream_minibatch or args.shared_prompt:
        return requests // args.steps if requests % args.steps == 0 else 0
    return None


# ---------------------------------------------------------------------------
# the table


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict[str, Any]], skip_first: bool = True) -> dict[str, float]:
    steps = [s for r in runs for s in (r["steps"][1:] if skip_first and len(r["steps"]) > 1 else r["steps"])]
    keys = ["wall_ms", "cpu_ms", "rollout_wall_ms", "rollout_cpu_ms", "train_wall_ms", "train_cpu_ms", "gc_ms", "gc_full_ms", "rss_mb"]
    keys += ["faults", "train_faults"]
    out = {k: med([s.get(k, math.nan) for s in steps]) for k in keys}
    out["full_collections"] = med([s["collections"][2] for s in steps])
    out["young_collections"] = med([s["collections"][0] + s["collections"][1] for s in steps])
    out["peak_rss_mb"] = med([r["peak_rss_mb"] for r in runs])
    # Sequences the service sampled per step (with --record: its tally).
    per_step = [(r.get("requests") or {}).get("samples", 0) / len(r["steps"]) for r in runs if r["steps"]]
    out["samples"] = med(per_step)
    out["n_steps"] = len(steps)
    return out


def workers_rss(runs: list[dict[str, Any]]) -> str:
    if not any(r.get("mode", {}).get("executor") for r in runs):
        return ""
    return f" ({med([r.get('workers_peak_rss_mb', math.nan) for r in runs]):,.0f})"


def render(results: dict[str, dict[str, list[dict[str, Any]]]], checks: dict[str, dict[str, str]], args) -> str:
    variants = list(dict.fromkeys(v for r in results.values() for v in r))
    python = next(r["python"] for w in results.values() for v in w.values() for r in v)
    lines = [
        f"tinker-cookbook `rl.train.main` ({describe_mode(args)}), tinker's client, fake service on loopback; "
        f"Python {python}; {args.steps} steps per run, {args.runs} run(s) per variant, alternating; "
        "medians over steps after each run's first (ms per step)",
        "",
        "| workload | variant | wall | ratio | client CPU | ratio | rollout CPU | train CPU | GC (full) | collections full / young "
        "| page faults (train) | peak RSS MB (workers) | samples / step | client CPU us / sample | bodies, metrics | workers' install |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, by_variant in results.items():
        base = summarize(by_variant["stock"]) if "stock" in by_variant else None
        for v in variants:
            if v not in by_variant:
                continue
            s = summarize(by_variant[v])
            ratio = f"{base['wall_ms'] / s['wall_ms']:.2f}x" if base else ""
            cpu_ratio = f"{base['cpu_ms'] / s['cpu_ms']:.2f}x" if base else ""
            lines.append(
                f"| {name} | {v} | {s['wall_ms']:,.0f} | {ratio} | {s['cpu_ms']:,.0f} | {cpu_ratio} | {s['rollout_cpu_ms']:,.0f} | "
                f"{s['train_cpu_ms']:,.0f} | {s['gc_ms']:,.0f} ({s['gc_full_ms']:,.0f}) | "
                f"{s['full_collections']:.0f} / {s['young_collections']:.0f} | "
                f"{s['faults']:,.0f} ({s['train_faults']:,.0f}) | "
                f"{s['peak_rss_mb']:,.0f}{workers_rss(by_variant[v])} | {s['samples']:,.0f} | "
                f"{s['cpu_ms'] * 1e3 / s['samples'] if s['samples'] else math.nan:,.0f} | "
                f"{checks[name].get(v, '')} | {workers_seen(by_variant[v])} |"
            )
    return "\n".join(lines)


def render_threads(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Where each variant's client CPU went a step (medians over steps
    after each run's first): per thread (the caller's loop is MainThread,
    tinker's loop thread runs ``_background_thread_func``, pyqwest's native
    threads are tokio-rt-worker), and the kernel's part of all of them."""
    lines = ["Client CPU a step by thread, ms (medians after each run's first step; kernel: the system part of all threads):", ""]
    for name, by_variant in results.items():
        for v, runs in by_variant.items():
            steps = [s for r in runs for s in r["steps"][1:] if "threads_cpu_s" in s]
            if not steps:
                continue
            names = list(dict.fromkeys(t for s in steps for t in s["threads_cpu_s"]))
            per = {t: med([s["threads_cpu_s"].get(t, 0.0) * 1e3 for s in steps]) for t in names}
            shown = ", ".join(f"{t} {ms:,.0f}" for t, ms in sorted(per.items(), key=lambda kv: -kv[1]) if ms >= 1)
            kernel = med([s["system_cpu_s"] * 1e3 for s in steps])
            aside = " (MainThread and kernel include the local sampler, left out of the client CPU)" if "/no-wire" in v else ""
            lines.append(f"- {name} {v}: {shown}; kernel {kernel:,.0f}{aside}")
    return "\n".join(lines)


def render_latency(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """With --latency, what the service saw (fake_tinker's `Timeline`), per
    variant, medians over runs: its sampler's span (first sample request to
    the last sequence's end), the share of its slot-seconds busy, the
    seconds per step between sampling passes with nothing running or queued
    (the service waiting for the client), polls answered try_again, and how
    long after a result was ready the poll that took it was answered; and
    the service's own time a step: its slot-seconds over its slots (the
    sampling waves, packed) plus its training lane's seconds, what a step
    would take with a client that costs nothing, beside the step's wall."""
    lines = [
        "What the service saw (its sampler, over each run's steps):",
        "",
        "| workload | variant | sampler span s | slots busy | sampler idle s / step | try_again | ready -> answered ms (mean) "
        "| service's own time s / step (sampling + training) | step / own time |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, by_variant in results.items():
        for v, runs in by_variant.items():
            seen = [(r["requests"] or {}).get("latency") or {} for r in runs]
            seen = [x for x in seen if x]
            if not seen:
                continue
            slots = seen[0]["spec"]["slots"]
            span = med([x["sampler_span_s"] for x in seen])
            busy = med([x["busy_slot_s"] / (slots * x["sampler_span_s"]) for x in seen if x["sampler_span_s"]])
            idle = med([x["idle_s"] / max(1, len(r["steps"]) - 1) for x, r in zip(seen, runs)])
            tries = med([x["try_again"] for x in seen])
            delay = med([(x["fetch_delay_mean_s"] or 0.0) * 1e3 for x in seen])
            sampling = med([x["busy_slot_s"] / slots / len(r["steps"]) for x, r in zip(seen, runs)])
            training = med([x.get("train_s", 0.0) / len(r["steps"]) for x, r in zip(seen, runs)])
            wall = med([s["wall_ms"] / 1e3 for r in runs for s in (r["steps"][1:] or r["steps"])])
            lines.append(
                f"| {name} | {v} | {span:,.1f} | {busy:.0%} | {idle:,.2f} | {tries:,.0f} | {delay:,.1f} "
                f"| {sampling + training:,.2f} ({sampling:,.2f} + {training:,.2f}) | {wall / (sampling + training):.2f}x |"
            )
    return "\n".join(lines)


def render_soak(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Per step (each variant's first run): RSS at the step's end and its
    peak within the step (MB), full collections, GC ms; then the growth of
    the step-end RSS from step 5 to the last."""
    lines = []
    for name, by_variant in results.items():
        variants = [v for v in by_variant if by_variant[v]]
        runs = {v: by_variant[v][0]["steps"] for v in variants}
        lines += [
            f"{name}: per step, RSS at the step's end / its peak in the step (MB), full collections, GC ms",
            "",
            "| step | " + " | ".join(f"{v} RSS end / peak | full | GC ms" for v in variants) + " |",
            "| ---: | " + " | ".join("---: | ---: | ---:" for _ in variants) + " |",
        ]
        for i in range(max(len(r) for r in runs.values())):
            cells = []
            for v in variants:
                st = runs[v][i] if i < len(runs[v]) else None
                cells.append(
                    "- | - | -" if st is None
                    else f"{st['rss_mb']:,.0f} / {st['rss_peak_mb']:,.0f} | {st['collections'][2]} | {st['gc_ms']:,.0f}"
                )
            lines.append(f"| {i} | " + " | ".join(cells) + " |")
        lines.append("")
        for v in variants:
            st = runs[v]
            if len(st) > 6:
                tail = st[5:]
                ends = [x["rss_mb"] for x in tail]
                peaks = [x["rss_peak_mb"] for x in tail]
                full = sorted({x["collections"][2] for x in st})
                lines.append(
                    f"- {v}: steps 5-{len(st) - 1}: RSS at the end {min(ends):,.0f}-{max(ends):,.0f} MB "
                    f"(last - step 5: {ends[-1] - ends[0]:+,.0f}), peak {min(peaks):,.0f}-{max(peaks):,.0f} MB "
                    f"(last - step 5: {peaks[-1] - peaks[0]:+,.0f}); full collections per step: {full}; "
                    f"process peak {by_variant[v][0]['peak_rss_mb']:,.0f} MB"
                )
        lines.append("")
    return "\n".join(lines)


def describe_mode(args: argparse.Namespace) -> str:
    parts = []
    if args.executor:
        parts.append(f"rollout_executor {args.executor}")
    if args.async_:
        parts.append(f"async (max_steps_off_policy={args.off_policy})")
    if args.stream_minibatch:
        parts.append(f"stream-minibatch ({args.minibatches} minibatches)")
    if args.batch_scale != 1:
        parts.append(f"{args.batch_scale}x groups per step")
    if args.garbage:
        parts.append(f"garbage {args.garbage}")
    if args.latency:
        parts.append(f"service latency {args.latency}")
    if args.client_config:
        parts.append(f"client config {args.client_config}")
    if args.tls:
        parts.append("HTTPS/HTTP2")
    return ", ".join(parts) or "sync, defaults"


def workers_seen(runs: list[dict[str, Any]]) -> str:
    """What the runs' workers reported: workers, rollouts, pieces, GC steps."""
    entries = [e for r in runs for e in r.get("workers", [])]
    if not entries:
        return ""
    pieces = sorted({len(e.get("installed", ())) for e in entries})
    rollouts = sum(e.get("counters", {}).get("rollouts", 0) for e in entries)
    gc_steps = sum(e.get("counters", {}).get("gc_steps", 0) for e in entries)
    merged = sum(e.get("counters", {}).get("merged_calls", 0) for e in entries)
    out = f"{len(entries)} workers: {'/'.join(map(str, pieces))} pieces, {rollouts} rollouts, {gc_steps} GC steps"
    return out + (f", {merged} calls merged" if merged else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--workload", action="append", default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="also write the table and raw results here (.md, .json)")
    add_run_options(p)
    args = p.parse_args()

    from workloads import cookbook_available

    if (why := cookbook_available()) is not None:
        sys.exit(f"tinker_cookbook is not importable ({why})")
    names = args.workload or ["tiny", "single_turn_long", "multi_turn_agent", "many_short"]
    variants = args.variants.split(",")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    checks: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results[name] = {v: [] for v in variants}
            checks[name] = {}
            reference: tuple[dict[str, bytes], list[dict[str, Any]]] | None = None
            for run in range(args.runs):
                order = variants if run % 2 == 0 else variants[::-1]
                for v in order:
                    record = Path(tmp) / f"{name}-{v}-{run}"
                    out = Path(tmp) / f"{name}-{v}-{run}.json"
                    cmd = [sys.executable, str(RUNNER), "--workload", name, "--variant", v]
                    cmd += ["--record", str(record), "--out", str(out), *run_flags(args)]
                    t0 = time.perf_counter()
                    env = {**os.environ, "TINKER_RL_DATA_HUGEPAGES": "0"} if v.endswith(NO_HUGE_PAGES) else None
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                    if proc.returncode != 0:
                        sys.exit(f"{name} {v} failed:\n{proc.stderr[-4000:]}")
                    r = json.loads(out.read_text())
                    results[name][v].append(r)
                    bodies = canonical_bodies(record)
                    if reference is None:
                        reference = (bodies, r["metrics"])
                        verdict = f"reference ({len(bodies)} requests)"
                    else:
                        any_order = args.shared_prompt
                        per = request_order(args, len(reference[0]))
                        steps = None
                        if args.async_:
                            # Which groups a step trained is known here only
                            # when each step sent one request.
                            one_each = len(reference[0]) == len(bodies) == len(comparable(r["metrics"]))
                            steps = same_groups_steps(reference[0], bodies) if one_each and not args.stream_minibatch else []
                        problems = [
                            x
                            for x in (
                                compare_run_bodies(reference[0], bodies, per, any_order),
                                compare_metrics(reference[1], r["metrics"], steps),
                            )
                            if x
                        ]
                        same = "equal up to Datum order" if any_order or per is not None else "equal"
                        verdict = "; ".join(problems) if problems else f"{same} ({len(bodies)} requests)"
                        if steps:
                            verdict += f"; metrics compared in the {len(steps)} of {len(bodies)} steps that trained the same groups"
                        elif steps is not None:
                            verdict += "; metrics not compared (which step trains a group is completion order)"
                    prev = checks[name].get(v)
                    checks[name][v] = verdict if prev in (None, verdict) or prev.startswith("reference") else f"{prev}; {verdict}"
                    walls = ", ".join(f"{s['wall_ms']:,.0f}" for s in r["steps"])
                    print(f"{name} {v} run {run}: steps {walls} ms; {verdict} ({time.perf_counter() - t0:.0f} s)", flush=True)
    table = render(results, checks, args)
    table += "\n\n" + render_threads(results)
    if args.latency:
        table += "\n\n" + render_latency(results)
    if args.soak:
        table += "\n\n" + render_soak(results)
    print()
    print(table)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(table + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
