"""The user's trainer step: tinker-cookbook's own `rl.train.main` (default
sync path, unmodified) with tinker's real client, against a fake tinker
service in its own process on 127.0.0.1 that answers at once
(bench/fake_tinker.py), so only the client's time is counted.

Per workload (bench/cookbook_env.py: bench/workloads.py's shapes as a
token-list environment, plus `tiny`), each variant runs N steps in a fresh
process, variants alternating, --runs times:

  stock         tinker-cookbook and tinker as installed
  installed     tinker_rl_data.cookbook.install(gc=False) (collector left alone)
  installed+gc  tinker_rl_data.cookbook.install(): the collector held to the step
                (tinker_rl_data.cookbook.gc_step; options by its configure(), below)
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

With --faults SPEC the fake service answers by a seeded fault schedule
(bench/fake_tinker.py `Faults`), each run's result has its requests per
path (received, retried, answered, faults) and the class of the exception
the run raised (then the next run goes on), or None.

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
                concurrent.futures.Executor (bench/ray_executor.py; `ray`
                must be installed: a local `ray.init(num_cpus=N)`)
  --async       AsyncConfig(max_steps_off_policy=--off-policy (1),
                groups_per_batch=the workload's groups): off-policy, groups
                streamed into the next step; a step is the time between two
                logged steps
  --stream-minibatch
                StreamMinibatchConfig(groups_per_batch=the workload's groups,
                num_minibatches=--minibatches (2))
  --batch-scale K
                K times the workload's groups per step

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

A variant's options for the collector: installed+gc:headroom=0.1&young=700
(StepCollector's arguments, set by tinker_rl_data.cookbook.gc_step.configure()).
VARIANT/user-step, VARIANT/user-loop: a user's hook on the step function
(do_train_step_and_get_sampling_client) or the loop (do_sync_training) put
there before install(), which keeps it. VARIANT/guard-only (after those):
the loop does not end the step around a step function that is not the
collector's, so with /user-step only the guard bounds memory. Per step, the RSS at its start and
its peak (sampled every 20 ms, with --soak only: each read of /proc/self/statm costs ~0.3 ms of
CPU in a process this size, a thread no user runs) are in the raw results; --soak prints them.
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
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

# The checks a run is compared with are the tests' (tests/support/trainer_checks.py).
from support.trainer_checks import (  # noqa: E402
    canonical_bodies,
    compare_bodies,
    compare_metrics,
    compare_run_bodies,
    comparable,
    same_groups_steps,
)

MODEL = "fake/model-8b"
VARIANTS = ("stock", "installed", "installed+gc")
# A variant's suffix: the same, with huge pages for large outputs off
# (TINKER_RL_DATA_HUGEPAGES=0 in its process).
NO_HUGE_PAGES = "/no-huge-pages"
TARGETS = {"single_turn_long": 1.6, "many_short": 1.35, "multi_turn_agent": 1.3}


# ---------------------------------------------------------------------------
# one run, in its own process


class Probe:
    """Marks of the step's phases and the collector's work, per step."""

    def __init__(self, sample_rss: bool) -> None:
        import gc

        self.gc = gc
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.cookbook_train_step: Any = None
        self.outside = {"gc_ms": 0.0, "collections": [0, 0, 0]}
        self._gc_start = 0.0
        self._rss = _rss_reader()
        self._rss_peak = 0
        gc.callbacks.append(self._on_gc)
        import threading

        # RSS sampled every 20 ms: the peak within each step (--soak only).
        if sample_rss:
            threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self) -> None:
        while True:
            rss = self._rss()
            if rss > self._rss_peak:
                self._rss_peak = rss
            time.sleep(0.02)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        bucket = self.current if self.current is not None else self.outside
        ms = (time.perf_counter() - self._gc_start) * 1e3
        bucket["gc_ms"] += ms
        bucket["collections"][info["generation"]] += 1
        if info["generation"] == 2:
            bucket["gc_full_ms"] = bucket.get("gc_full_ms", 0.0) + ms

    def mark(self, name: str) -> None:
        import resource

        now = (time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        if name == "step_start":
            self.current = {"gc_ms": 0.0, "gc_full_ms": 0.0, "collections": [0, 0, 0], "marks": {}}
            self.current["rss_start_mb"] = self._rss() / 2**20
            self.current["maxrss_start_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            self._rss_peak = 0
            self.steps.append(self.current)
        if self.current is not None:
            self.current["marks"][name] = now
        if name == "step_end" and self.current is not None:
            self.current["rss_mb"] = self._rss() / 2**20
            self.current["rss_peak_mb"] = max(self._rss_peak, self._rss()) / 2**20
            self.current["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            self.current = None


def _rss_reader():
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    return read


GUARD_ONLY = "/guard-only"
USER_WRAPPERS = {"/user-step": "do_train_step_and_get_sampling_client", "/user-loop": "do_sync_training"}


def user_wrapper(train: Any, name: str) -> Callable[[], None]:
    """A user's hook on rl.train's function ``name`` (counts its calls)."""
    import functools

    original = getattr(train, name)

    @functools.wraps(original)
    async def traced(*a, **kw):
        traced.calls += 1
        return await original(*a, **kw)

    traced.calls = 0
    setattr(train, name, traced)
    return lambda: setattr(train, name, original)


def kl_options(args: argparse.Namespace) -> dict[str, Any]:
    """The trainer's KL penalty options: against the base model (the fake
    service scores prompts with seeded logprobs)."""
    if not args.kl_coef:
        return {}
    import tinker_cookbook.rl.train as train

    return {
        "kl_penalty_coef": args.kl_coef,
        "kl_discount_factor": args.kl_discount,
        "kl_reference_config": train.KLReferenceConfig(base_model=MODEL),
    }


def tolerance_options(args: argparse.Namespace, tolerance: str | None) -> dict[str, Any]:
    """The trainer's `rollout_error_tolerance` (--tolerance or a variant's
    @suffix, --rollout-timeout)."""
    if tolerance is None:
        return {}
    from tinker_cookbook.rl.rollout_strategy import FailFast, MinViableGroup, RetryOnFailure

    timeout = args.rollout_timeout
    strategy = {
        "failfast": lambda: FailFast(),
        "retry": lambda: RetryOnFailure(per_rollout_timeout=timeout or 0),
        "minviable": lambda: MinViableGroup(per_rollout_timeout=timeout),
    }[tolerance]()
    return {"rollout_error_tolerance": strategy}


def run_child(args: argparse.Namespace) -> None:
    probe = Probe(sample_rss=args.soak)
    os.environ["TINKER_API_KEY"] = "tml-fake-bench-key"  # the fake service takes any key
    from fake_tinker import FakeTinker

    import tinker_cookbook.rl.train as train
    from tinker_cookbook.tokenizer_utils import register_tokenizer
    from tinker_cookbook.utils import cost_estimation, ml_log

    from cookbook_env import StubTokenizer, TokenDataset

    # No pricing download (the run logs token counts only, as when it fails).
    cost_estimation._pricing_fetched = True
    cost_estimation._pricing_entries = None
    register_tokenizer(MODEL, StubTokenizer)

    original_get_batch = TokenDataset.get_batch

    def get_batch(self, index):
        # Async: the dataloader runs ahead; a step starts where the last ended.
        if not args.async_ or not probe.steps:
            probe.mark("step_start")
        return original_get_batch(self, index)

    TokenDataset.get_batch = get_batch

    probe.cookbook_train_step = train.do_train_step_and_get_sampling_client
    probe.cookbook_streaming_step = train.do_train_step_streaming_and_get_sampling_client

    logged: list[dict[str, Any]] = []
    original_setup = ml_log.setup_logging

    def setup_logging(*a, **kw):
        logger = original_setup(*a, **kw)
        original_log = logger.log_metrics

        def log_metrics(metrics, step=None, *la, **lkw):
            if probe.current is not None and step is not None and step < args.steps:
                logged.append({"step": step, **metrics})
                probe.mark("step_end")
                if args.async_ and step + 1 < args.steps:
                    probe.mark("step_start")
            return original_log(metrics, step, *la, **lkw)

        logger.log_metrics = log_metrics
        return logger

    ml_log.setup_logging = setup_logging

    # Variants after the first (";"-separated, stock first) run in this same
    # process, each against a fresh fake service: the test's shortcut.
    variants = args.variant.split(";")
    results = []
    for i, variant in enumerate(variants):
        record = args.record if len(variants) == 1 else str(Path(args.record) / str(i))
        probe.steps.clear()
        logged.clear()
        faults = None
        if args.faults:  # one schedule for all, or ";"-separated, one per variant
            specs = args.faults.split(";")
            faults = specs[i] if len(specs) == len(variants) else args.faults
        results.append(run_variant(args, variant, record, probe, logged, train, FakeTinker, faults))
    Path(args.out).write_text(json.dumps(results if len(variants) > 1 else results[0]))


def run_variant(args, variant, record, probe, logged, train, FakeTinker, faults=None) -> dict[str, Any]:
    import asyncio
    import resource

    from cookbook_env import LOOP_WORKLOADS, TokenDatasetBuilder

    # The timing hook goes around whatever install() put in: install() sees
    # the cookbook's own function (a hook there would be kept as a user's).
    train.do_train_step_and_get_sampling_client = probe.cookbook_train_step
    train.do_train_step_streaming_and_get_sampling_client = probe.cookbook_streaming_step
    collector = None
    label, variant = variant, variant.removesuffix(NO_HUGE_PAGES)
    variant, _, tolerance = variant.partition("@")  # VARIANT@failfast|retry|minviable: its own --tolerance
    # VARIANT/user-step, VARIANT/user-loop: a user's hook (code outside
    # tinker_rl_data) on the step or the loop function before install(),
    # which keeps it there.
    # VARIANT/guard-only: no step's end but the step pieces' (for the guard
    # alone, with /user-step).
    guard_only = variant.endswith(GUARD_ONLY)
    variant = variant.removesuffix(GUARD_ONLY)
    user_undo = []
    for suffix, name in USER_WRAPPERS.items():
        if variant.endswith(suffix):
            variant = variant.removesuffix(suffix)
            user_undo.append(user_wrapper(train, name))
    if variant != "stock":  # installed, installed+gc, installed+gc:key=value,...
        import tinker_rl_data.cookbook
        from tinker_rl_data.cookbook import gc_step as _gc_step

        gc_config = json.loads(args.gc_config)
        for item in filter(None, variant.partition(":")[2].replace("&", ",").split(",")):
            key, _, value = item.partition("=")
            gc_config[key] = None if value == "None" else float(value) if "." in value else int(value)
        if variant.startswith("installed+gc"):
            # install()'s own collector, with these options (configure())
            _gc_step.configure(**gc_config)
            tinker_rl_data.cookbook.install(kl=args.install_kl)
            collector = _gc_step.COLLECTOR
            if guard_only:
                collector._add_step_ends = lambda loop_function: []
                user_undo.append(lambda: vars(collector).pop("_add_step_ends"))
        elif variant == "installed+coalesce":
            tinker_rl_data.cookbook.install(kl=args.install_kl, coalesce=True)
            collector = _gc_step.COLLECTOR
        else:
            tinker_rl_data.cookbook.install(gc=False, kl=args.install_kl)

    inner_train_step = train.do_train_step_and_get_sampling_client

    async def train_step(*a, **kw):
        probe.mark("train_start")
        try:
            return await inner_train_step(*a, **kw)
        finally:
            probe.mark("train_end")

    train.do_train_step_and_get_sampling_client = train_step

    inner_streaming_step = train.do_train_step_streaming_and_get_sampling_client

    async def streaming_step(*a, **kw):
        probe.mark("train_start")
        try:
            return await inner_streaming_step(*a, **kw)
        finally:
            probe.mark("train_end")

    train.do_train_step_streaming_and_get_sampling_client = streaming_step
    from tinker_rl_data.cookbook import workers as _workers

    _workers.reset()

    # What tinker_rl_data left to the cookbook's own functions (logged once
    # per reason at INFO).
    import logging

    left: list[str] = []

    class Left(logging.Handler):
        def emit(self, entry: logging.LogRecord) -> None:
            if "left to tinker-cookbook" in entry.getMessage():
                left.append(entry.getMessage())

    left_handler = Left(logging.INFO)
    logging.getLogger("tinker_rl_data").addHandler(left_handler)
    logging.getLogger("tinker_rl_data").setLevel(logging.INFO)

    workload = LOOP_WORKLOADS[args.workload]
    error = None
    groups = workload.groups * args.batch_scale
    modes: dict[str, Any] = {}
    if args.async_:
        modes["async_config"] = train.AsyncConfig(max_steps_off_policy=args.off_policy, groups_per_batch=groups)
    if args.stream_minibatch:
        modes["stream_minibatch_config"] = train.StreamMinibatchConfig(
            groups_per_batch=groups, num_minibatches=args.minibatches
        )
    with tempfile.TemporaryDirectory() as log_path, FakeTinker(seed=args.seed, record=record, faults=faults) as fake:
        executor = make_executor(args.executor)
        config = train.Config(
            learning_rate=1e-5,
            dataset_builder=TokenDatasetBuilder(
                workload=args.workload, steps=args.steps, seed=args.seed, shared_prompt=args.shared_prompt,
                batch_scale=args.batch_scale,
            ),
            model_name=MODEL,
            max_tokens=workload.completion,
            log_path=log_path,
            base_url=fake.base_url,
            recipe_name="bench_trainer",
            **kl_options(args),
            **tolerance_options(args, tolerance or args.tolerance),
            **modes,
        )
        t0 = time.perf_counter()
        children_cpu_start = children_cpu()
        try:
            asyncio.run(train.main(config, rollout_executor=executor))
        except Exception as exc:
            if not args.faults:
                raise
            error = f"{type(exc).__module__}.{type(exc).__qualname__}"  # with --faults: reported, next variant
        finally:
            for undo in user_undo:
                undo()
        total = time.perf_counter() - t0

    steps = []
    for s in probe.steps:
        m = s["marks"]
        if "step_end" not in m or "train_start" not in m:  # a batch the cookbook skipped (every group failed)
            continue
        nan = (math.nan, math.nan, math.nan)
        m.setdefault("train_start", nan)
        m.setdefault("train_end", nan)
        steps.append(
            {
                "wall_ms": (m["step_end"][0] - m["step_start"][0]) * 1e3,
                "cpu_ms": (m["step_end"][1] - m["step_start"][1]) * 1e3,
                "rollout_wall_ms": (m["train_start"][0] - m["step_start"][0]) * 1e3,
                "rollout_cpu_ms": (m["train_start"][1] - m["step_start"][1]) * 1e3,
                "train_wall_ms": (m["train_end"][0] - m["train_start"][0]) * 1e3,
                "train_cpu_ms": (m["train_end"][1] - m["train_start"][1]) * 1e3,
                "faults": m["step_end"][2] - m["step_start"][2],
                "train_faults": m["train_end"][2] - m["train_start"][2],
                "gc_ms": s["gc_ms"],
                "gc_full_ms": s["gc_full_ms"],
                "collections": s["collections"],
                "rss_mb": s["rss_mb"],
                "rss_start_mb": s["rss_start_mb"],
                "rss_peak_mb": s["rss_peak_mb"],
                "maxrss_start_mb": s["maxrss_start_mb"],  # the process's peak so far
                "maxrss_mb": s["maxrss_mb"],
            }
        )
    out = {
        "workload": args.workload,
        "variant": label,
        "steps": steps,
        "outside": probe.outside,
        "total_s": total,
        "server_cpu_s": fake.cpu_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "metrics": list(logged),
        "python": sys.version.split()[0],
        "collector": None if collector is None else vars(collector.stats),
        "coalesced": coalesced_counts(),
        "requests": fake.requests,  # per path, with --record: bench/fake_tinker.py's tally
        "error": error,
        "installed": [] if variant == "stock" else [t for t, _ in tinker_rl_data.status().installed],
        "left_to_cookbook": left,
        "workers": _workers.seen(),
        "children_cpu_s": children_cpu() - children_cpu_start,
        "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "mode": {"executor": args.executor, "async": args.async_, "stream_minibatch": args.stream_minibatch,
                 "batch_scale": args.batch_scale},
    }
    logging.getLogger("tinker_rl_data").removeHandler(left_handler)
    return out


def make_executor(spec: str | None) -> Any:
    """``process:N`` / ``forkserver:N`` (a ProcessPoolExecutor of N workers
    started so), ``ray:N`` (bench/ray_executor.py), or None."""
    if not spec:
        return None
    kind, _, n = spec.partition(":")
    workers = int(n or 2)
    if kind in ("process", "spawn", "forkserver"):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("forkserver" if kind == "forkserver" else "spawn")
        return ProcessPoolExecutor(max_workers=workers, mp_context=context)
    if kind == "ray":
        from ray_executor import RayExecutor

        return RayExecutor(workers)
    raise SystemExit(f"--executor: unknown kind {kind!r} (process:N, forkserver:N, ray:N)")


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (pool workers, the
    fake service once it exits)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def coalesced_counts() -> dict[str, int] | None:
    """Sample calls merged by install(coalesce=True) in this process."""
    module = sys.modules.get("tinker_rl_data.tinker.coalesce")
    return None if module is None else module.counts()


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
        "| page faults (train) | peak RSS MB (workers) | bodies, metrics | workers' install |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
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
                f"{s['peak_rss_mb']:,.0f}{workers_rss(by_variant[v])} | {checks[name].get(v, '')} | {workers_seen(by_variant[v])} |"
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


def mode_flags(args: argparse.Namespace) -> list[str]:
    out = ["--executor", args.executor] if args.executor else []
    out += ["--async", "--off-policy", str(args.off_policy)] if args.async_ else []
    out += ["--stream-minibatch", "--minibatches", str(args.minibatches)] if args.stream_minibatch else []
    out += ["--batch-scale", str(args.batch_scale)] if args.batch_scale != 1 else []
    return out


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
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--workload", action="append", default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kl-coef", type=float, default=0.0, help="kl_penalty_coef (> 0: KL against the base model)")
    p.add_argument("--kl-discount", type=float, default=0.0, help="kl_discount_factor")
    p.add_argument("--install-kl", action="store_true", default=True, help="install(kl=True), the default")
    p.add_argument("--no-install-kl", dest="install_kl", action="store_false",
                   help="install(kl=False): the KL passes left to the cookbook")
    p.add_argument(
        "--shared-prompt",
        action="store_true",
        help="a group's members share the first prompt (as GRPO groups do); what installed+coalesce merges",
    )
    p.add_argument("--gc-config", default="{}", help="StepCollector arguments as JSON")
    p.add_argument(
        "--faults", default=None,
        help="the fake service's seeded fault schedule (bench/fake_tinker.py Faults: SEED or key=value,...; "
        "with --child, one per ';'-separated variant if as many); a run that raises is reported (its "
        "exception class) and the next one runs",
    )
    p.add_argument("--tolerance", choices=("failfast", "retry", "minviable"), default=None,
                   help="rollout_error_tolerance: FailFast, RetryOnFailure, MinViableGroup (default: the cookbook's)")
    p.add_argument("--rollout-timeout", type=float, default=None, help="per_rollout_timeout of --tolerance")
    p.add_argument("--soak", action="store_true", help="also print RSS, full collections and GC ms per step")
    p.add_argument("--executor", default=None, help="process:N, forkserver:N or ray:N: the rollouts in N workers")
    p.add_argument("--async", dest="async_", action="store_true", help="AsyncConfig (off-policy)")
    p.add_argument("--off-policy", type=int, default=1, help="--async's max_steps_off_policy")
    p.add_argument("--stream-minibatch", action="store_true", help="StreamMinibatchConfig")
    p.add_argument("--minibatches", type=int, default=2, help="--stream-minibatch's num_minibatches")
    p.add_argument("--batch-scale", "--scale", dest="batch_scale", type=int, default=1,
                   help="K times the workload's groups per step (4: the 4x batches)")
    p.add_argument("--out", default=None, help="also write the table and raw results here (.md, .json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.workload = args.workload[0]
        run_child(args)
        return

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
                    cmd = [sys.executable, __file__, "--child", "--workload", name, "--variant", v]
                    cmd += ["--steps", str(args.steps), "--seed", str(args.seed), "--record", str(record)]
                    cmd += ["--out", str(out), "--gc-config", args.gc_config]
                    cmd += ["--kl-coef", str(args.kl_coef), "--kl-discount", str(args.kl_discount)]
                    cmd += [] if args.install_kl else ["--no-install-kl"]
                    cmd += ["--shared-prompt"] if args.shared_prompt else []
                    cmd += ["--faults", args.faults] if args.faults else []
                    cmd += ["--tolerance", args.tolerance] if args.tolerance else []
                    cmd += ["--rollout-timeout", str(args.rollout_timeout)] if args.rollout_timeout else []
                    cmd += ["--soak"] if args.soak else []
                    cmd += mode_flags(args)
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
    if args.soak:
        table += "\n\n" + render_soak(results)
    print()
    print(table)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(table + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
