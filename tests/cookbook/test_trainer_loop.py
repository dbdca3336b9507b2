"""tinker-cookbook's own `rl.train.main` against support/fake_tinker.py, tiny
workload, 2 steps, stock first and then each variant, in one fresh process
(support/trainer_run.py; each run against a fresh fake service), with a KL
penalty against the base model (discounted): with
tinker_rl_data.cookbook.install() (its KL passes included, and with the
collector held to the step) the forward_backward bodies are the same
protobuf messages as stock's and the logged metrics are equal (the KL
penalty's mean exactly)."""

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

from support.trainer_checks import canonical_bodies, comparable, compare_metrics  # noqa: E402

STEPS = 2


VARIANTS = ["stock", "installed", "installed+gc"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    record, out = tmp / "record", tmp / "out.json"
    cmd = [sys.executable, str(RUNNER), "--workload", "tiny", "--variant", ";".join(VARIANTS)]
    cmd += ["--steps", str(STEPS), "--record", str(record), "--out", str(out), "--kl-coef", "0.1", "--kl-discount", "0.9"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == VARIANTS
    return {
        r["variant"]: (canonical_bodies(record / str(i)), r["metrics"], r) for i, r in enumerate(results)
    }


@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_same_requests_and_metrics(runs, variant):
    stock_bodies, stock_metrics, _ = runs["stock"]
    bodies, metrics, result = runs[variant]
    assert len(result["steps"]) == STEPS
    # one forward_backward per step, each with the tiny batch's datums
    assert len(stock_bodies) == STEPS and all(stock_bodies.values())
    assert bodies == stock_bodies
    assert len(comparable(metrics)) == STEPS and "optim/kl_sample_train_v1" in metrics[0]
    assert compare_metrics(stock_metrics, metrics) is None, compare_metrics(stock_metrics, metrics)
    # The KL penalty went through the native pass.
    assert "incorporate_kl_penalty" in result["installed"] and result["left_to_cookbook"] == []
    kl = [[v for k, v in m.items() if k.endswith("kl_policy_base")] for m in comparable(metrics)]
    assert all(len(v) == 1 for v in kl), metrics[0].keys()
    assert kl == [[v for k, v in m.items() if k.endswith("kl_policy_base")] for m in comparable(stock_metrics)]


def test_the_collector_held_to_the_step(runs):
    stats = runs["installed+gc"][2]["collector"]
    assert stats["steps"] == STEPS and stats["step_collections"] == STEPS and stats["froze"] > 0
    assert stats["renewals"] == 1 and not stats["stepped_aside"]  # the freeze at the first step's end
    # full collections: each step's end, the renewal's second one over what
    # is left unfrozen, and any the memory bound armed (none here: tiny)
    full = [s["collections"][2] for s in runs["installed+gc"][2]["steps"]]
    assert full == [2, 1] and stats["guard_collections"] == 0, (full, stats)
