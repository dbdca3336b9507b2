"""tinker-cookbook's own `rl.train.main` in the modes throughput-minded
users turn on, stock vs tinker_rl_data.cookbook.install() (the default: its
pieces and the collector held to the step), tiny workload, 3 steps, against
support/fake_tinker.py (support/trainer_run.py, each variant against a
fresh fake service):

- stream_minibatch_config (2 minibatches per step): a step's groups are
  fixed, their split into minibatches is completion order, so each step's
  two forward_backward bodies are compared as one multiset of Datums; every
  metric but time/* equal (floats within float32 rounding: the KL and
  entropy means sum in minibatch order) in every step.
- async_config (max_steps_off_policy=1): which step trains a group is
  completion order (two stock runs differ there too), so the run's bodies
  are compared as one multiset of Datums, and the metrics in the steps that
  trained the same groups in both runs (support/trainer_checks.py's
  same_groups_steps); every step logs.
- async_config with a spawn pool of 2 workers: the same, and the workers
  ran the driver's pieces.

Costs on the 2-core machine (load ~1-4): stream-minibatch ~16 s, async
~15 s, async with the pool ~27 s (118 s at load 10).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

try:
    import tinker_cookbook.rl.train  # noqa: F401
except ImportError as exc:
    cookbook_unavailable(exc)

RUNNER = Path(__file__).resolve().parents[1] / "support" / "trainer_run.py"

from support.trainer_checks import canonical_bodies, comparable, compare_metrics, compare_run_bodies, same_groups_steps  # noqa: E402

STEPS = 3
VARIANTS = ["stock", "installed+gc"]


def run_trainer(tmp: Path, *flags: str) -> dict[str, tuple]:
    record, out = tmp / "record", tmp / "out.json"
    cmd = [sys.executable, str(RUNNER), "--workload", "tiny", "--variant", ";".join(VARIANTS)]
    cmd += ["--steps", str(STEPS), "--record", str(record), "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == VARIANTS
    return {r["variant"]: (canonical_bodies(record / str(i)), r["metrics"], r) for i, r in enumerate(results)}


def test_stream_minibatch(tmp_path):
    runs = run_trainer(tmp_path, "--stream-minibatch", "--minibatches", "2")
    stock_bodies, stock_metrics, _ = runs["stock"]
    bodies, metrics, result = runs["installed+gc"]
    assert len(stock_bodies) == 2 * STEPS and all(stock_bodies.values())
    assert compare_run_bodies(stock_bodies, bodies, per=2) is None
    assert len(comparable(metrics)) == STEPS
    assert compare_metrics(stock_metrics, metrics) is None, compare_metrics(stock_metrics, metrics)
    assert "optim/kl_sample_train_v1" in metrics[0]
    stats = result["collector"]
    assert stats["steps"] == STEPS and stats["step_collections"] == STEPS


def check_async(runs: dict[str, tuple]) -> None:
    stock_bodies, stock_metrics, _ = runs["stock"]
    bodies, metrics, result = runs["installed+gc"]
    assert len(stock_bodies) == STEPS and all(stock_bodies.values())
    assert compare_run_bodies(stock_bodies, bodies, per=0) is None
    assert len(comparable(metrics)) == STEPS == len(comparable(stock_metrics))
    steps = same_groups_steps(stock_bodies, bodies)
    assert compare_metrics(stock_metrics, metrics, steps) is None, compare_metrics(stock_metrics, metrics, steps)
    stats = result["collector"]
    assert stats["steps"] == STEPS and stats["step_collections"] == STEPS


def test_async(tmp_path):
    check_async(run_trainer(tmp_path, "--async", "--off-policy", "1"))


def test_async_with_a_spawn_pool(tmp_path):
    runs = run_trainer(tmp_path, "--async", "--off-policy", "1", "--executor", "process:2")
    check_async(runs)
    result = runs["installed+gc"][2]
    driver = set(result["installed"])
    workers = result["workers"]
    assert workers and all(w["how"] == "installed" and set(w["installed"]) == driver for w in workers)
    assert all(w["counters"]["gc_steps"] == w["counters"]["rollouts"] >= 1 for w in workers)
    # every group the run sampled (async may start groups it never trains)
    assert sum(w["counters"]["rollouts"] for w in workers) >= 2 * STEPS
