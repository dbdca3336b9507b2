"""install() in the cookbook's rollout workers (tinker_rl_data.cookbook.workers).

The fast tests check the piece and its pickling in this process (by value
too), the driver's bounded record of 2,000 workers, a worker's side of a
rollout in this process (no `resource` module, macOS units, threads, no
coalescing, a feature's `worker` hook around each rollout), and the worker's install in a fresh interpreter (a failing
probe: one warning, the rest installed; strict: the task raises). Spawn
pools of one worker with a stand-in rollout (tests/support/worker_pool.py):
a worker that cannot import the package or its core runs the cookbook's
rollout; a worker's own SKIP / DISABLE / GC_HEADROOM lose to the driver's
(~12 s each). The trainer tests run
tinker-cookbook's own `rl.train.main` (support/trainer_run.py, tiny
workload, stock first, then installed, each against a fresh fake service)
with a spawn process pool of 2 and, when `ray` is importable, a Ray-backed
Executor of 2 workers: every forward_backward body equal to stock's (sync
training: the order is the batch's), every metric but time/* equal, and the
workers' own reports (tinker_rl_data.cookbook.workers.seen(), carried back with
their results) show that each installed the driver's pieces and ran the
rollouts as GC steps. Async and stream-minibatch modes: tests/cookbook/test_trainer_modes.py.

Costs on the 2-core machine (load ~1-4): the fast tests ~11 s (two fresh
interpreters); the spawn pool ~25 s (each worker imports torch and the
cookbook once); Ray ~45 s (a local cluster started per variant, ~690 MB per
worker; 116 s at load 10), skipped without `ray` (a test and bench
dependency only: .ci/run installs it in the 3.12 leg).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook.rl.rollouts as rollouts
    import tinker_cookbook.rl.train  # noqa: F401
except ImportError as exc:
    cookbook_unavailable(exc)

from tinker_rl_data.cookbook import gc_step
from tinker_rl_data.cookbook import workers as _workers
from tinker_rl_data.errors import ProbeFailed
from tinker_rl_data.patch import transaction as _patch
from tinker_rl_data.patch.feature import Feature
from tinker_rl_data.patch.piece import Piece
from tinker_rl_data import cookbook as tcookbook

RUNNER = Path(__file__).resolve().parents[1] / "support" / "trainer_run.py"

from support import worker_pool  # noqa: E402
from support.signals import CountedRepr, signal_reprs_handlers  # noqa: E402
from support.trainer_checks import canonical_bodies, comparable, compare_metrics  # noqa: E402

STEPS = 2
ROLLOUTS = 2 * STEPS  # tiny: 2 groups per step


@pytest.fixture
def installed():
    report = tcookbook.install()
    try:
        yield report
    finally:
        tcookbook.uninstall()


def test_the_entry_is_installed_and_carries_the_settings(installed):
    assert _workers.WORKERS_TITLE in [title for title, _ in installed.installed]
    entry = rollouts._run_rollout_sync
    assert isinstance(entry, _workers.RolloutEntry)
    assert entry.original.__module__ == "tinker_cookbook.rl.rollouts"
    sent = pickle.loads(pickle.dumps(entry))
    assert type(sent) is _workers._WorkerEntry
    assert sent.settings.options == ("data", "gc", "kl", "step", "transport", "wire", "workers")
    assert sent.settings.driver[1] == os.getpid()
    assert sent.settings.strict is False


def test_uninstall_stops_new_workers_from_installing(installed):
    entry = rollouts._run_rollout_sync
    tcookbook.uninstall()
    assert not isinstance(rollouts._run_rollout_sync, _workers.RolloutEntry)
    assert _workers.current() is None
    # A task pickled from an entry still held somewhere: no settings, the
    # worker installs nothing and runs the cookbook's function.
    assert pickle.loads(pickle.dumps(entry)).settings is None


def test_coalesce_and_strict_are_carried():
    tcookbook.install(coalesce=True, gc=False, strict=False)
    try:
        settings = pickle.loads(pickle.dumps(rollouts._run_rollout_sync)).settings
        assert settings.options == ("coalesce", "data", "kl", "step", "transport", "wire", "workers")
    finally:
        tcookbook.uninstall()


def test_the_switches_travel_as_the_driver_resolved_them(monkeypatch):
    monkeypatch.setenv("TINKER_RL_DATA_GC_HEADROOM", "0.1")
    monkeypatch.setenv("TINKER_RL_DATA_SKIP", "compute_post_kl")
    monkeypatch.setenv("TINKER_RL_DATA_HUGEPAGES", "0")
    tcookbook.install(gc_headroom=0.3)
    try:
        settings = pickle.loads(pickle.dumps(rollouts._run_rollout_sync)).settings
        assert settings.gc_headroom == "0.3"  # the argument, not the variable
        assert settings.skip == ("compute_post_kl",) and settings.strict is False
        # the other variables (CI's TINKER_RL_DATA_REQUIRE_COOKBOOK too) fill in only
        assert ("TINKER_RL_DATA_HUGEPAGES", "0") in settings.env
        assert not {name for name, _ in settings.env} & set(_workers.APPLIED)
    finally:
        tcookbook.uninstall()
        gc_step.configure()


def test_asyncio_run_builds_no_repr_of_its_result_once_installed():
    """What the signal piece is for: before CPython 3.13, asyncio.run (the
    cookbook's _run_rollout_sync, once per group rollout in a worker)
    built the repr of its coroutine's result when it reset SIGINT."""
    import signal

    async def rollout():
        return CountedRepr()

    reprs_stock = signal_reprs_handlers()
    if sys.version_info[:2] == (3, 11):
        assert reprs_stock  # 3.12's patch releases differ; 3.13 fixed it
    if sys.version_info >= (3, 13):
        assert not reprs_stock
    # asyncio.run sets its own SIGINT handler only over Python's default
    # one, as a spawned worker has it (an earlier test here, or Ray, may
    # have set another in this process).
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        check_asyncio_run_once_installed(rollout, reprs_stock)
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert signal_reprs_handlers() == reprs_stock


def check_asyncio_run_once_installed(rollout, reprs_stock: bool) -> None:
    import asyncio
    import signal

    CountedRepr.reprs = 0
    asyncio.run(rollout())
    assert (CountedRepr.reprs > 0) == reprs_stock
    handlers = [CountedRepr(), signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler, print]
    before = []
    for handler in handlers:
        previous = signal.signal(signal.SIGUSR1, handler)
        before.append((previous, signal.getsignal(signal.SIGUSR1), signal.signal(signal.SIGUSR1, previous)))
    report = tcookbook.install()
    try:
        installed = _workers.SIGNAL_TITLE in [title for title, _ in report.installed]
        assert installed == reprs_stock, report.left
        CountedRepr.reprs = 0
        asyncio.run(rollout())
        assert CountedRepr.reprs == 0
        assert not signal_reprs_handlers()
        for handler, (previous, read, restored) in zip(handlers, before):
            # the same values, of the same types, as before install()
            got = signal.signal(signal.SIGUSR1, handler)
            got = (got, signal.getsignal(signal.SIGUSR1), signal.signal(signal.SIGUSR1, got))
            assert [type(x) for x in got] == [type(x) for x in (previous, read, restored)]
            assert got == (previous, read, restored)
    finally:
        tcookbook.uninstall()


def deliver(worker, how="installed", summary=None, counters=None, delta=None, result=None):
    """What the driver gets from a worker's result: the result, with the report recorded."""
    counters = counters or {}
    delta = {k: v for k, v in counters.items() if k in _workers.ADDITIVE} if delta is None else delta
    return pickle.loads(pickle.dumps(_workers._Delivery(worker, how, summary, counters, delta, result)))


def test_a_result_brings_the_workers_report_back():
    _workers.reset()
    result = {"a": 1}
    assert deliver(("elsewhere", 7, "t"), summary={"installed": ["x"]}, counters={"rollouts": 1}, result=result) == result
    assert deliver(("elsewhere", 7, "t"), counters={"rollouts": 2}, delta={"rollouts": 1}) is None
    [entry] = _workers.seen()
    assert entry["how"] == "installed" and entry["counters"] == {"rollouts": 2} and entry["pid"] == 7
    assert _workers.describe()[1].startswith("elsewhere:7 installed: 1 piece(s); 2 rollout(s)")
    _workers.reset()


@pytest.mark.parametrize("identity", [None, ("host", 7), ("host", "7", "t"), 42, ["h", 7, "t", "x"]])
def test_a_result_with_a_malformed_identity_counts_as_an_unknown_worker(identity):
    _workers.reset()
    assert deliver(identity, summary={"installed": ["x"]}, counters={"rollouts": 1}, result="r") == "r"
    assert deliver(identity, counters={"rollouts": 3}, delta={"rollouts": 2}) is None
    [entry] = _workers.seen()
    assert (entry["host"], entry["pid"]) == _workers.UNKNOWN_WORKER[:2] and entry["counters"] == {"rollouts": 3}
    assert _workers.totals()["workers"] == 1 and _workers.totals()["counters"] == {"rollouts": 3}
    _workers.reset()


def test_two_thousand_workers_keep_a_bounded_record(monkeypatch):
    """A run that recycles its workers (max_tasks_per_child, Ray) sees
    thousands: the driver keeps totals and the last few, and a new
    worker's first result does not render the driver's status."""
    import tracemalloc

    def no_status():
        raise AssertionError("a worker's result rendered the driver's status")

    _workers.reset()
    monkeypatch.setattr(_patch, "status", no_status)
    tracemalloc.start()
    try:
        for i in range(2000):
            if i == 200:
                before = tracemalloc.get_traced_memory()[0]
            # the same host and pid: two containers' processes, told apart by the token
            worker = ("host", 1000 + i % 1000, f"token{i}")
            left = [("compute_post_kl", "probe failed")] if i % 10 == 0 else []
            summary = {"options": ["data", "gc"], "installed": [f"piece {k}" for k in range(20)], "left": left}
            deliver(worker, "installed" if i % 100 else "failed", summary, {"rollouts": 1, "gc_steps": 1, "peak_rss_mb": i})
            deliver(worker, "installed" if i % 100 else "failed", None, {"rollouts": 3, "gc_steps": 3, "peak_rss_mb": i}, {"rollouts": 2, "gc_steps": 2})
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(_workers.seen()) == _workers.SHOWN == 8
    assert [e["pid"] for e in _workers.seen()] == [1000 + i % 1000 for i in range(1992, 2000)]
    total = _workers.totals()
    assert total["workers"] == 2000 and total["how"] == {"installed": 1980, "failed": 20}
    assert total["left"] == {"compute_post_kl": 200}
    assert total["counters"] == {"rollouts": 6000, "gc_steps": 6000, "peak_rss_mb": 1999}
    lines = _workers.describe()
    assert len(lines) == 9
    assert lines[0] == (
        "totals: 2000 worker(s) (last 8 shown): 20 failed, 1980 installed; 6000 rollout(s), GC steps 6000; "
        "left: compute_post_kl (200)"
    )
    assert grown < 64 * 1024, grown  # 1,800 more workers: nothing kept per worker
    _workers.reset()


def rollout_here(monkeypatch, options=("data",), **settings):
    """The worker's side of a rollout, in this process as a worker without
    the pieces would run it (rollouts._run_rollout_sync the stand-in), and
    its result as the driver gets it."""
    for key in _workers.APPLIED:
        monkeypatch.delenv(key, raising=False)  # the worker sets the driver's
    monkeypatch.setattr(_workers, "_worker", None)
    monkeypatch.setattr(rollouts, "_run_rollout_sync", worker_pool.rollout)
    settings = _workers.Settings(tuple(options), False, driver=("the-driver", 1, "x"), **settings)
    return pickle.loads(pickle.dumps(_workers.run_rollout(settings, "task")))


def test_a_rollout_returns_where_there_is_no_resource_module(monkeypatch):
    """Windows has no `resource`: the rollout's result still comes back,
    without the worker's peak RSS."""
    assert not _patch.installed()
    _workers.reset()
    monkeypatch.setitem(sys.modules, "resource", None)
    back = rollout_here(monkeypatch, options=())
    assert back["task"] == "task" and back["how"] == "installed"
    [entry] = _workers.seen()
    assert "peak_rss_mb" not in entry["counters"] and entry["counters"]["rollouts"] == 1
    _workers.reset()


def test_peak_rss_is_in_mib_on_macos_too(monkeypatch):
    import resource

    assert not _patch.installed()
    _workers.reset()
    peak = {}
    for platform in ("linux", "darwin"):
        monkeypatch.setattr(sys, "platform", platform)
        rollout_here(monkeypatch, options=())
        peak[platform] = _workers.seen()[-1]["counters"]["peak_rss_mb"]
        _workers.reset()
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB; macOS: bytes
    assert peak["linux"] == round(kib / 1024) and peak["darwin"] == round(kib / 2**20)


def test_without_coalescing_no_sample_calls_are_reported(monkeypatch):
    import tinker_rl_data.tinker.coalesce  # noqa: F401 (imported in every worker that installs)

    assert not _patch.installed()
    _workers.reset()
    rollout_here(monkeypatch, options=())
    assert "sample calls" not in "\n".join(_workers.describe())
    assert "merged_calls" not in _workers.seen()[0]["counters"]
    _workers.reset()


class RolloutsSeen:
    """A feature's part in a worker (a WorkerPart): counts the rollouts it
    wrapped, raised ones too."""

    def __init__(self, start):
        self.start, self.entered, self.exited = start, 0, 0

    @contextlib.contextmanager
    def rollout(self):
        self.entered += 1
        try:
            yield
        finally:
            self.exited += 1

    def counters(self):
        return {"fake_rollouts": self.exited}


def _wrapped(original):
    return functools.wraps(original)(lambda *args, **kwargs: original(*args, **kwargs))


def _same_json(original, ours):
    if ours({"a": [1]}) != original({"a": [1]}):
        raise ProbeFailed("other text")


@pytest.mark.parametrize("skipped", [False, True])
def test_a_features_worker_hook_wraps_each_rollout(monkeypatch, skipped):
    """A feature's `worker` hook, in a worker where its pieces went in: its
    part wraps each rollout (one that raises too) and its counters travel
    back with the results; where they were skipped, no hook call."""
    parts = []

    def worker(start):
        parts.append(RolloutsSeen(start))
        return parts[-1]

    piece = Piece("json", "dumps", "fake", _wrapped, _same_json, spread=False)
    catalog = types.ModuleType("fake_catalog")
    catalog.declared = lambda: (Feature("fake", "a feature of the test", (piece,), worker=worker),)
    monkeypatch.setitem(sys.modules, "fake_catalog", catalog)
    assert not _patch.installed()
    _workers.reset()
    try:
        back = rollout_here(monkeypatch, options=("fake",), catalog="fake_catalog", skip=("fake",) if skipped else ())
        settings = _workers._worker.settings

        def fails(task):
            raise ValueError("the rollout failed")

        monkeypatch.setattr(rollouts, "_run_rollout_sync", fails)
        with pytest.raises(ValueError, match="the rollout failed"):
            _workers.run_rollout(settings, "task")
    finally:
        _patch.uninstall(owner=_workers.OWNER)
    counters = _workers.seen()[0]["counters"]
    _workers.reset()
    if skipped:
        assert back["installed"] == [] and parts == [] and "fake_rollouts" not in counters
        return
    assert back["installed"] and len(parts) == 1
    [part] = parts
    assert (part.start.inherited, part.start.driver) == (False, False)
    assert part.entered == part.exited == 2 and counters["fake_rollouts"] == 1  # as of the first result


def test_rollouts_in_threads_add_up(monkeypatch):
    """A Ray actor with max_concurrency > 1 runs rollouts in threads: every
    rollout is counted once in the driver's totals."""
    from concurrent.futures import ThreadPoolExecutor

    assert not _patch.installed()
    _workers.reset()
    rollout_here(monkeypatch, options=())
    settings = _workers._worker.settings
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(8) as threads:
            list(threads.map(lambda i: pickle.loads(pickle.dumps(_workers.run_rollout(settings, i))), range(2000)))
    finally:
        sys.setswitchinterval(previous)
    assert _workers.totals()["counters"]["rollouts"] == 2001
    assert _workers.seen()[0]["counters"]["rollouts"] == 2001
    _workers.reset()


def test_the_entry_and_a_result_pickle_by_value(installed):
    """cloudpickle.register_pickle_by_value(workers): nothing of the
    module's (its locks) travels with the entry or a result."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(_workers)
    try:
        sent = pickle.loads(cloudpickle.dumps(rollouts._run_rollout_sync))
        assert type(sent) is _workers._WorkerEntry and sent.settings == _workers.current()
        _workers.reset()
        assert pickle.loads(cloudpickle.dumps(_workers._Delivery(("h", 1, "t"), "installed", {}, {"rollouts": 1}, {}, 5))) == 5
        assert _workers.seen()[0]["pid"] == 1
    finally:
        cloudpickle.unregister_pickle_by_value(_workers)
        _workers.reset()


def spawn_pool(**initargs):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=worker_pool.set_up_worker, initargs=tuple(initargs.values())
    )


@pytest.mark.parametrize("missing", ["tinker_rl_data._core", "tinker_rl_data"])
def test_a_worker_without_the_package_runs_the_cookbooks_rollout(installed, missing, capfd):
    """A Ray node without the wheel, a platform without the native core:
    unpickling the task needs nothing of ours; the worker runs the
    cookbook's own rollout and says so once; the driver hears it ran stock."""
    _workers.reset()
    with spawn_pool(unimportable=(missing,)) as pool:
        results = [pool.submit(rollouts._run_rollout_sync, i).result(timeout=600) for i in range(3)]
    assert [r["task"] for r in results] == [0, 1, 2]
    assert all(r["how"] is None for r in results)  # nothing of ours ran there
    [entry] = _workers.seen()
    assert entry["how"] == "stock" and entry["counters"] == {"rollouts": 3}
    assert entry["left"][0][0] == "tinker_rl_data" and "Error" in entry["left"][0][1]  # why it does not load
    assert _workers.totals()["how"] == {"stock": 1}
    assert any(line.startswith("totals: 1 worker(s): 1 stock; 3 rollout(s)") for line in _workers.describe())
    assert capfd.readouterr().err.count("the package does not load here") == 1
    _workers.reset()


@pytest.mark.parametrize("headroom", [0.3, 0])
def test_a_worker_applies_the_drivers_switches_over_its_own(monkeypatch, headroom):
    """install(gc_headroom=0.3) wins over an inherited
    TINKER_RL_DATA_GC_HEADROOM=0.1, and a node's own SKIP / DISABLE do not
    change what the driver's install means there; 0 is 0 there too (the
    tightest bound, as in the driver; `off` is no bound)."""
    monkeypatch.setenv("TINKER_RL_DATA_GC_HEADROOM", "0.1")  # inherited by the worker
    _workers.reset()
    tcookbook.install(gc_headroom=headroom)
    try:
        node = {"TINKER_RL_DATA_SKIP": "kl", "TINKER_RL_DATA_DISABLE": "1"}
        with spawn_pool(unimportable=(), env=node) as pool:
            back = pool.submit(rollouts._run_rollout_sync, "task").result(timeout=600)
        driver = [title for title, _ in _patch.status().installed]
    finally:
        tcookbook.uninstall()
        gc_step.configure()
        _workers.reset()
    assert back["how"] == "installed" and back["headroom"] == headroom and back["headroom"] is not None
    # (the entry piece stays out there: the stand-in holds its name)
    assert "compute_post_kl" in back["installed"] and set(back["installed"]) == set(driver) - {_workers.WORKERS_TITLE}
    assert back["env"].get("TINKER_RL_DATA_GC_HEADROOM") == repr(float(headroom)) and "TINKER_RL_DATA_DISABLE" not in back["env"]


WORKER = textwrap.dedent(
    """
    import dataclasses, json, sys, warnings
    from tinker_rl_data import errors as _patch
    from tinker_rl_data.cookbook import data_processing, workers as _workers
    from tinker_rl_data.errors import ProbeFailed

    def failing(original, ours):
        raise ProbeFailed("made to fail")

    data_processing.FEATURE = dataclasses.replace(
        data_processing.FEATURE,
        pieces=tuple(
            dataclasses.replace(p, probe=failing) if p.name == "remove_constant_reward_groups" else p
            for p in data_processing.FEATURE.pieces
        ),
    )
    settings = _workers.Settings(("data", "gc", "step", "wire"), sys.argv[1] == "strict", driver=("another-host", 1, "x"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            state = _workers._set_up(settings)
        except _patch.InstallError as exc:
            print(json.dumps({"raised": str(exc)}))
            sys.exit(0)
    ours = [str(w.message) for w in caught if issubclass(w.category, _patch.InstallWarning)]
    print(json.dumps({"how": state.how, "installed": state.installed, "left": state.left, "warnings": ours,
                      "collector": "gc" in state.parts}))
    """
)


@pytest.mark.parametrize("strict", [False, True])
def test_a_worker_whose_probe_fails(strict):
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, "strict" if strict else "lenient"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if strict:
        assert "remove_constant_reward_groups" in out["raised"] and "made to fail" in out["raised"]
        return
    assert out["how"] == "installed" and out["collector"] is True
    assert "remove_constant_reward_groups" not in out["installed"] and "assemble_training_data" in out["installed"]
    assert [title for title, _ in out["left"]] == ["remove_constant_reward_groups"]
    assert len(out["warnings"]) == 1 and "made to fail" in out["warnings"][0] and "rollout worker" in out["warnings"][0]


# ---------------------------------------------------------------------------
# the real trainer with a rollout executor


def run_trainer(tmp: Path, variants: list[str], *flags: str, timeout: float = 600) -> dict[str, tuple]:
    record, out = tmp / "record", tmp / "out.json"
    cmd = [sys.executable, str(RUNNER), "--workload", "tiny", "--variant", ";".join(variants)]
    cmd += ["--steps", str(STEPS), "--record", str(record), "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == variants
    return {r["variant"]: (canonical_bodies(record / str(i)), r["metrics"], r) for i, r in enumerate(results)}


def check_pool_run(runs: dict[str, tuple]) -> None:
    stock_bodies, stock_metrics, stock = runs["stock"]
    bodies, metrics, result = runs["installed+gc"]
    assert len(stock_bodies) == STEPS and all(stock_bodies.values())
    assert bodies == stock_bodies
    assert len(comparable(metrics)) == STEPS
    assert compare_metrics(stock_metrics, metrics) is None, compare_metrics(stock_metrics, metrics)
    # Stock's workers say nothing (nothing of ours is there).
    assert stock["workers"] == []
    # Each worker installed what the driver did and ran its rollouts as GC
    # steps; together, every rollout of the run.
    driver = set(result["installed"])
    workers = result["workers"]
    assert 1 <= len(workers) <= 2
    for worker in workers:
        assert worker["how"] == "installed" and worker["left"] == [], worker
        assert set(worker["installed"]) == driver
        assert worker["pid"] != os.getpid()
        counters = worker["counters"]
        assert counters["gc_steps"] == counters["rollouts"] >= 1 and counters["gc_froze"] > 0
    assert sum(w["counters"]["rollouts"] for w in workers) == ROLLOUTS
    # the driver's collector held to the step as without a pool
    assert result["collector"]["steps"] == STEPS


def test_spawn_pool(tmp_path):
    check_pool_run(run_trainer(tmp_path, ["stock", "installed+gc"], "--executor", "process:2"))


def test_the_driver_s_status_counts_the_sample_requests_its_workers_made(tmp_path):
    """With the rollouts in workers, their sample requests are made there:
    the driver's status counts them as the service did (without coalescing,
    what it would have sent; with it, the calls it merged)."""
    runs = run_trainer(tmp_path, ["installed+gc", "installed+coalesce"], "--executor", "process:2", "--shared-prompt")
    plain, coalesced = runs["installed+gc"][2], runs["installed+coalesce"][2]
    sent = plain["requests"]["paths"]["/api/v1/asample"]["answered"]
    sent_coalesced = coalesced["requests"]["paths"]["/api/v1/asample"]["answered"]
    assert 0 < sent_coalesced < sent
    hint = [line.strip() for line in plain["status"].splitlines() if "coalesced sampling would have sent" in line]
    assert len(hint) == 1, plain["status"]
    assert hint[0].startswith(f"sampling: of {sent} requests of one sample, {sent - sent_coalesced} went out"), hint
    assert f"would have sent about {sent_coalesced} of them" in hint[0], hint
    merged = re.search(r"coalesced sampling: (\d+) calls sent as (\d+) requests", coalesced["status"])
    assert merged is not None, coalesced["status"]
    calls, requests = map(int, merged.groups())
    assert calls > requests > 0 and sent - (calls - requests) == sent_coalesced, (calls, requests, sent, sent_coalesced)


def test_ray_executor(tmp_path):
    pytest.importorskip("ray")
    check_pool_run(run_trainer(tmp_path, ["stock", "installed+gc"], "--executor", "ray:2"))


class _SentBy:
    """An entry as a driver of another version pickles it: its settings with
    a field this version lacks, or without one it needs."""

    def __init__(self, settings):
        self.settings = settings

    def __reduce__(self):
        return _workers._reduce_by_source(_workers._ENTRY_CALL, _workers._LOAD_ENTRY, settings=self.settings, receive=_workers._RECEIVE)


def test_an_entry_from_a_driver_of_another_version_never_breaks_the_unpickling():
    # Unpickled in the pool's own worker loop, where an exception breaks the
    # pool for every later task: each one must load, every time.
    plain = _workers._plain(_workers.Settings(("data",), False, driver=("another-host", 1, "x")))
    newer = pickle.dumps(_SentBy({**plain, "added_by_a_newer_driver": 1}))
    for _ in range(2):
        entry = pickle.loads(newer)
        assert isinstance(entry, _workers._WorkerEntry) and entry.settings.options == ("data",)
    older = pickle.dumps(_SentBy({k: v for k, v in plain.items() if k != "options"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = [pickle.loads(older) for _ in range(2)]
    assert all(isinstance(e, _workers._WorkerEntry) and e.settings is None for e in entries)
    assert len([w for w in caught if "not readable here" in str(w.message)]) <= 1
