"""install() in the cookbook's rollout workers (tinker_rl_data.cookbook.workers).

The fast tests check the piece and its pickling in this process and the
worker's install in a fresh interpreter (a failing probe: one warning, the
rest installed; strict: the task raises). The trainer tests run
tinker-cookbook's own `rl.train.main` (bench/trainer.py's child mode, tiny
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

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook.rl.rollouts as rollouts
    import tinker_cookbook.rl.train  # noqa: F401
except ImportError as exc:
    cookbook_unavailable(exc)

from tinker_rl_data.cookbook import workers as _workers
from tinker_rl_data.patch import transaction as _patch
from tinker_rl_data import cookbook as tcookbook

BENCH = Path(__file__).resolve().parents[2] / "bench"

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


def test_the_gc_headroom_option_is_carried_as_the_workers_variable(monkeypatch):
    from tinker_rl_data.cookbook import gc_step

    monkeypatch.delenv("TINKER_RL_DATA_GC_HEADROOM", raising=False)
    tcookbook.install(gc_headroom=0.05)
    try:
        settings = pickle.loads(pickle.dumps(rollouts._run_rollout_sync)).settings
        assert ("TINKER_RL_DATA_GC_HEADROOM", "0.05") in settings.env
        # what the worker's collector reads when its first rollout starts
        monkeypatch.setenv("TINKER_RL_DATA_GC_HEADROOM", dict(settings.env)["TINKER_RL_DATA_GC_HEADROOM"])
        assert gc_step.headroom_from_env() == 0.05
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


def test_a_result_brings_the_workers_report_back():
    _workers.reset()
    result = {"a": 1}
    back = pickle.loads(pickle.dumps(_workers._Delivery(("elsewhere", 7), {"how": "installed", "installed": ["x"]}, {"rollouts": 1}, result)))
    assert back == result
    back = pickle.loads(pickle.dumps(_workers._Delivery(("elsewhere", 7), None, {"rollouts": 2}, None)))
    assert back is None
    [entry] = _workers.seen()
    assert entry["how"] == "installed" and entry["counters"] == {"rollouts": 2} and entry["pid"] == 7
    assert _workers.describe()[0].startswith("elsewhere:7 installed: 1 piece(s); 2 rollout(s)")
    _workers.reset()


WORKER = textwrap.dedent(
    """
    import dataclasses, json, sys, warnings
    from tinker_rl_data import errors as _patch
    from tinker_rl_data.cookbook import data_processing, workers as _workers
    from tinker_rl_data.errors import ProbeFailed
    from tinker_rl_data.patch import registry

    def failing(original, ours):
        raise ProbeFailed("made to fail")

    data_processing.PIECES = tuple(
        dataclasses.replace(p, probe=failing) if p.name == "remove_constant_reward_groups" else p
        for p in data_processing.PIECES
    )
    registry.pieces.cache_clear()
    settings = _workers.Settings(("data", "gc", "step", "wire"), sys.argv[1] == "strict", (), ("another-host", 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            state = _workers._set_up(settings)
        except _patch.InstallError as exc:
            print(json.dumps({"raised": str(exc)}))
            sys.exit(0)
    ours = [str(w.message) for w in caught if issubclass(w.category, _patch.InstallWarning)]
    print(json.dumps({"how": state.how, "installed": state.installed, "left": state.left, "warnings": ours,
                      "collector": state.collector is not None and state.collector.active}))
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
    cmd = [sys.executable, str(BENCH / "trainer.py"), "--child", "--workload", "tiny", "--variant", ";".join(variants)]
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


def test_ray_executor(tmp_path):
    pytest.importorskip("ray")
    check_pool_run(run_trainer(tmp_path, ["stock", "installed+gc"], "--executor", "ray:2"))
