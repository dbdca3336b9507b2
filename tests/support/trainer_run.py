"""One trainer run, in its own process: tinker-cookbook's own `rl.train.main`
(unmodified) with tinker's real client against the fake tinker service
(:mod:`support.fake_tinker`), on a token-list workload
(:mod:`support.cookbook_env`). The trainer tests run it, and bench/trainer.py
runs it once per variant and run for its tables.

    python tests/support/trainer_run.py --workload tiny --variant "stock;installed+gc" \
        --steps 2 --record DIR --out OUT.json [RUN OPTIONS]

--variant is one variant or several, ";"-separated (stock first: install()
is not undone between them), each run in this process against a fresh
service, recording its forward_backward bodies in DIR (DIR/<i> with
several) and its result in OUT.json (a list with several):

  stock         tinker-cookbook and tinker as installed
  installed     tinker_rl_data.cookbook.install(gc=False) (collector left alone)
  installed+gc  tinker_rl_data.cookbook.install(): the collector held to the step
                (tinker_rl_data.cookbook.gc_step; installed+gc:headroom=0.5&young=700
                sets StepCollector's arguments by its configure())
  installed+coalesce
                install(coalesce=True): with --shared-prompt, a group's first
                sample calls go out as one request (installed+coalesce:young=5000
                sets the collector's arguments as installed+gc's do)
  VARIANT/no-huge-pages
                VARIANT with huge pages for large outputs off (the caller sets
                TINKER_RL_DATA_HUGEPAGES=0 in this process's environment)
  VARIANT/user-step, VARIANT/user-loop
                a user's hook on the step function
                (do_train_step_and_get_sampling_client) or the loop
                (do_sync_training) put there before install(), which keeps it
  VARIANT/no-crossing
                VARIANT with the sample path's calls awaited at once taken to
                tinker's loop as tinker takes them (run_coroutine_threadsafe,
                tinker's future, wrap_future) rather than in batches
  VARIANT/no-wire
                VARIANT with tinker's SamplingClient.sample answered in this
                process, no request sent (the draws the fake service would
                make, tinker's decode of them); the CPU of making and decoding
                them is left out of the step's: what the step costs the client
                besides its samples' wire (the floor's caller side)
  VARIANT/guard-only (after those)
                the loop does not end the step around a step function that is
                not the collector's, so with /user-step only the guard bounds memory
  VARIANT@failfast, VARIANT@retry, VARIANT@minviable
                VARIANT with rollout_error_tolerance FailFast, RetryOnFailure,
                MinViableGroup (as --tolerance, per variant)

With --tls the fake service is reached over HTTPS, HTTP/2 chosen by ALPN
(one connection carries the run's requests, as with the real service;
over plain HTTP/1.1 each request in flight holds a connection of its own).

With --client-config JSON the fake service answers tinker's client config
with those flags (:class:`support.fake_tinker.FakeTinker`'s ``client_config``:
``{"sample_use_retrieve_futures": true}``, ``{"use_pyqwest_transport": false}``, ...)
and serves what they make the client send.

With --faults SPEC (one for all, or one per ";"-separated variant) the
service answers by a seeded fault schedule (:class:`support.fake_tinker.Faults`);
a run that raises records its exception's class and the next one runs.

A result holds per step the wall and client CPU (the process's, all
threads), the rollout phase (dataset batch to the train step) and the train
phase (`do_train_step_and_get_sampling_client`), GC time and collections by
generation (gc.callbacks), RSS (its peak within the step sampled every 20 ms
with --soak only: each read of /proc/self/statm costs ~0.3 ms of CPU in a
process this size); per run the logged metrics, the requests per path the
service received, what the package installed and what its rollout workers
reported (tinker_rl_data.cookbook.workers.seen()), and (installed) what
``tinker_rl_data.status()`` printed after the run (``status``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # run as a script: `support` is imported from tests/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from support.thread_cpu import thread_cpu, thread_groups  # noqa: E402

MODEL = "fake/model-8b"
# A variant's suffix: the same, with huge pages for large outputs off
# (the caller sets TINKER_RL_DATA_HUGEPAGES=0 in the run's process).
NO_HUGE_PAGES = "/no-huge-pages"


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
        by_generation = bucket.setdefault("gc_ms_by_generation", [0.0, 0.0, 0.0])
        by_generation[info["generation"]] += ms
        if info["generation"] == 2:
            bucket["gc_full_ms"] = bucket.get("gc_full_ms", 0.0) + ms

    def mark(self, name: str) -> None:
        import resource

        cpu = time.process_time() - LOCAL_SAMPLER_CPU[0]
        now = (time.perf_counter(), cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        if name == "step_start":
            self.current = {"gc_ms": 0.0, "gc_full_ms": 0.0, "collections": [0, 0, 0], "marks": {}}
            self.current["rss_start_mb"] = self._rss() / 2**20
            self.current["maxrss_start_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            self._rss_peak = 0
            self.steps.append(self.current)
            self._threads = (thread_cpu(), os.times())
        if self.current is not None:
            self.current["marks"][name] = now
        if name == "step_end" and self.current is not None:
            from support.garbage import Counted

            self.current["garbage_alive"] = Counted.alive  # counted garbage nodes alive at the step's end
            self.current["rss_mb"] = self._rss() / 2**20
            self.current["rss_peak_mb"] = max(self._rss_peak, self._rss()) / 2**20
            self.current["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            # Where the step's CPU went: per thread (the caller's loop,
            # tinker's loop thread, pyqwest's native ones) and the kernel's part.
            threads, times = self._threads
            self.current["threads_cpu_s"] = thread_groups(threads, thread_cpu())
            self.current["system_cpu_s"] = os.times().system - times.system
            self.current = None


def _rss_reader():
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    return read


GUARD_ONLY = "/guard-only"
NO_CROSSING = "/no-crossing"
NO_WIRE = "/no-wire"
# A /no-wire run's local sampler: the process CPU spent in it (left out of
# the steps'), and the sequences it answered.
LOCAL_SAMPLER_CPU = [0.0]
LOCAL_SAMPLES = [0]


def local_sampler(seed: int) -> Callable[[], None]:
    """tinker's ``SamplingClient.sample`` answered in this process: each
    call's draws as the fake service's (:class:`support.fake_tinker.Service`:
    its prompt key, its draws, its proto answer), decoded by tinker, on a
    future of the caller's loop done at once. The thread CPU spent in it is
    added to LOCAL_SAMPLER_CPU. Returns the undo."""
    import asyncio

    import tinker
    from support.fake_tinker import Service
    from tinker.proto.response_conv import deserialize_proto_response

    service = Service(seed, None)
    original = vars(tinker.SamplingClient)["sample"]
    LOCAL_SAMPLER_CPU[0], LOCAL_SAMPLES[0] = 0.0, 0  # this run's

    def sample(self, prompt, num_samples, sampling_params, *args, **kwargs):
        start = time.thread_time()
        params = {"max_tokens": sampling_params.max_tokens, "temperature": sampling_params.temperature}
        key, max_tokens, _ = service._sample_key({"prompt": {"chunks": [{"tokens": prompt.to_ints()}]}, "sampling_params": params})
        draws = service._draws(key, num_samples, take=True)
        response = deserialize_proto_response(service.sample_response(key, tuple(draws), max_tokens), tinker.SampleResponse)
        future = asyncio.get_running_loop().create_future()
        future.set_result(response)
        LOCAL_SAMPLES[0] += num_samples
        LOCAL_SAMPLER_CPU[0] += time.thread_time() - start
        return future

    tinker.SamplingClient.sample = sample
    return lambda: setattr(tinker.SamplingClient, "sample", original)
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


def run(args: argparse.Namespace) -> None:
    """Each of --variant's variants in turn, in this process; the result (a
    list with several) written to --out."""
    probe = Probe(sample_rss=args.soak)
    os.environ["TINKER_API_KEY"] = "tml-fake-bench-key"  # the fake service takes any key
    from support.fake_tinker import FakeTinker

    import tinker_cookbook.rl.train as train
    from tinker_cookbook.tokenizer_utils import register_tokenizer
    from tinker_cookbook.utils import cost_estimation, ml_log

    from support.cookbook_env import StubTokenizer, TokenDataset

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
    import gc
    import resource

    from support.cookbook_env import LOOP_WORKLOADS, TokenDatasetBuilder

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
    if variant.endswith(NO_CROSSING):
        from tinker_rl_data.tinker import sample_path

        variant = variant.removesuffix(NO_CROSSING)
        sample_path._awaited_at_once = lambda frame: False  # (a fresh process per run)
    user_undo = []
    no_wire = variant.endswith(NO_WIRE)
    variant = variant.removesuffix(NO_WIRE)
    if no_wire and args.executor:
        raise SystemExit("/no-wire answers the driver's samples: its rollout workers' would still go over the wire")
    for suffix, name in USER_WRAPPERS.items():
        if variant.endswith(suffix):
            variant = variant.removesuffix(suffix)
            user_undo.append(user_wrapper(train, name))
    if "/" in variant:  # a suffix out of the order they are read in (see the module's docstring)
        raise SystemExit(f"variant {label!r}: {variant[variant.index('/'):]!r} is not a suffix here")
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
        elif variant.partition(":")[0] == "installed+coalesce":  # (with the collector's options too)
            _gc_step.configure(**gc_config)
            tinker_rl_data.cookbook.install(kl=args.install_kl, coalesce=True)
            collector = _gc_step.COLLECTOR
        else:
            tinker_rl_data.cookbook.install(gc=False, kl=args.install_kl)

    if no_wire:  # after install(): ours stands aside for the local sampler
        user_undo.append(local_sampler(args.seed))
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
    from support.garbage import Counted, sample_peak

    Counted.peak = Counted.alive
    if sample_peak not in gc.callbacks:
        gc.callbacks.append(sample_peak)  # the garbage alive at once (with a "+counted" --garbage)
    error = None
    groups = workload.groups * args.batch_scale
    modes: dict[str, Any] = {}
    if args.async_:
        modes["async_config"] = train.AsyncConfig(max_steps_off_policy=args.off_policy, groups_per_batch=groups)
    if args.stream_minibatch:
        modes["stream_minibatch_config"] = train.StreamMinibatchConfig(
            groups_per_batch=groups, num_minibatches=args.minibatches
        )
    with tempfile.TemporaryDirectory() as log_path, FakeTinker(
        seed=args.seed, record=record, faults=faults, latency=args.latency,
        client_config=json.loads(args.client_config) if args.client_config else None, tls=args.tls,
    ) as fake:
        executor = make_executor(args.executor)
        config = train.Config(
            learning_rate=1e-5,
            dataset_builder=TokenDatasetBuilder(
                workload=args.workload, steps=args.steps, seed=args.seed, shared_prompt=args.shared_prompt,
                batch_scale=args.batch_scale, garbage=args.garbage,
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
                "gc_ms_by_generation": s.get("gc_ms_by_generation", [0.0, 0.0, 0.0]),
                "rss_mb": s["rss_mb"],
                "garbage_alive": s["garbage_alive"],
                "rss_start_mb": s["rss_start_mb"],
                "rss_peak_mb": s["rss_peak_mb"],
                "maxrss_start_mb": s["maxrss_start_mb"],  # the process's peak so far
                "maxrss_mb": s["maxrss_mb"],
                "threads_cpu_s": s["threads_cpu_s"],
                "system_cpu_s": s["system_cpu_s"],
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
        # per path, with --record: the fake service's tally (/no-wire: the local sampler's samples)
        "requests": {**(fake.requests or {}), "samples": LOCAL_SAMPLES[0]} if no_wire else fake.requests,
        "error": error,
        "garbage_peak_nodes": Counted.peak,
        "installed": [] if variant == "stock" else [t for t, _ in tinker_rl_data.status().installed],
        "status": None if variant == "stock" else str(tinker_rl_data.status()),
        "left_to_cookbook": left,
        "workers": _workers.seen(),
        "children_cpu_s": children_cpu() - children_cpu_start,
        "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "mode": {"executor": args.executor, "async": args.async_, "stream_minibatch": args.stream_minibatch,
                 "batch_scale": args.batch_scale, "garbage": args.garbage,
                 "latency": args.latency, "client_config": args.client_config, "tls": args.tls},
    }
    logging.getLogger("tinker_rl_data").removeHandler(left_handler)
    return out


def make_executor(spec: str | None) -> Any:
    """``process:N`` / ``forkserver:N`` (a ProcessPoolExecutor of N workers
    started so), ``ray:N`` (support/ray_executor.py), or None."""
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
        from support.ray_executor import RayExecutor

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
# the command line


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a run, which bench/trainer.py takes too and passes on
    (:func:`run_flags`)."""
    p.add_argument("--steps", type=int, default=3)
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
        help="the fake service's seeded fault schedule (tests/support/fake_tinker.py Faults: SEED or "
        "key=value,...; one per ';'-separated variant if as many); a run that raises is reported (its "
        "exception class) and the next one runs",
    )
    p.add_argument(
        "--latency", default=None,
        help="the fake service takes time (tests/support/fake_tinker.py Latency: key=value,... or 'on' for its "
        "defaults: 0.5 s + 4 ms per token a sample, 512 at once, results by long polls)",
    )
    p.add_argument(
        "--client-config", default=None,
        help="the flags the fake service's /api/v1/client/config answers, as JSON (fields of tinker's "
        "ClientConfigResponse, e.g. '{\"sample_use_retrieve_futures\": true}')",
    )
    p.add_argument("--tls", action="store_true",
                   help="the fake service over HTTPS, HTTP/2 by ALPN, as the real service is reached")
    p.add_argument("--tolerance", choices=("failfast", "retry", "minviable"), default=None,
                   help="rollout_error_tolerance: FailFast, RetryOnFailure, MinViableGroup (default: the cookbook's)")
    p.add_argument("--rollout-timeout", type=float, default=None, help="per_rollout_timeout of --tolerance")
    p.add_argument("--soak", action="store_true", help="also sample RSS every 20 ms for each step's peak")
    p.add_argument("--executor", default=None, help="process:N, forkserver:N or ray:N: the rollouts in N workers")
    p.add_argument("--async", dest="async_", action="store_true", help="AsyncConfig (off-policy)")
    p.add_argument("--off-policy", type=int, default=1, help="--async's max_steps_off_policy")
    p.add_argument("--stream-minibatch", action="store_true", help="StreamMinibatchConfig")
    p.add_argument("--minibatches", type=int, default=2, help="--stream-minibatch's num_minibatches")
    p.add_argument("--batch-scale", "--scale", dest="batch_scale", type=int, default=1,
                   help="K times the workload's groups per step (4: the 4x batches)")
    p.add_argument("--garbage", default="", help="cyclic garbage the environment makes (support/garbage.py): "
                   "step:MB (each env.step), grade:MB (each group's grading, synchronous), start:MB (alive at "
                   "the loop's start, dropped in the first step); '+' joins several")


def run_flags(args: argparse.Namespace) -> list[str]:
    """:func:`add_run_options`' options as parsed, as flags again."""
    out = ["--steps", str(args.steps), "--seed", str(args.seed), "--gc-config", args.gc_config]
    out += ["--kl-coef", str(args.kl_coef), "--kl-discount", str(args.kl_discount)]
    out += [] if args.install_kl else ["--no-install-kl"]
    out += ["--shared-prompt"] if args.shared_prompt else []
    out += ["--faults", args.faults] if args.faults else []
    out += ["--latency", args.latency] if args.latency else []
    out += ["--client-config", args.client_config] if args.client_config else []
    out += ["--tls"] if args.tls else []
    out += ["--tolerance", args.tolerance] if args.tolerance else []
    out += ["--rollout-timeout", str(args.rollout_timeout)] if args.rollout_timeout else []
    out += ["--soak"] if args.soak else []
    out += ["--executor", args.executor] if args.executor else []
    out += ["--async", "--off-policy", str(args.off_policy)] if args.async_ else []
    out += ["--stream-minibatch", "--minibatches", str(args.minibatches)] if args.stream_minibatch else []
    out += ["--batch-scale", str(args.batch_scale)] if args.batch_scale != 1 else []
    out += ["--garbage", args.garbage] if args.garbage else []
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, help="tiny, or a shape of tests/support/workloads.py")
    p.add_argument("--variant", required=True, help="a variant, or several ';'-separated (stock first)")
    p.add_argument("--record", required=True, help="the fake service records each run's requests here")
    p.add_argument("--out", required=True, help="the result (JSON)")
    add_run_options(p)
    run(p.parse_args())


if __name__ == "__main__":
    main()
