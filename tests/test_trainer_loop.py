"""tinker-cookbook's own `rl.train.main` against bench/fake_tinker.py, tiny
workload, 2 steps, each variant in a fresh process: with
tinker_rl_data.cookbook.install() (and with the collector held to the step)
the forward_backward bodies are the same protobuf messages as stock's and
the logged metrics are equal."""

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

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from trainer import canonical_bodies, comparable, compare_metrics  # noqa: E402

STEPS = 2


def run(tmp_path: Path, variant: str) -> tuple[dict[str, bytes], list[dict]]:
    record, out = tmp_path / variant, tmp_path / f"{variant}.json"
    cmd = [sys.executable, str(BENCH / "trainer.py"), "--child", "--workload", "tiny", "--variant", variant]
    cmd += ["--steps", str(STEPS), "--record", str(record), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert len(result["steps"]) == STEPS
    return canonical_bodies(record), result["metrics"]


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    return run(tmp_path_factory.mktemp("stock"), "stock")


@pytest.mark.parametrize("variant", ["installed", "installed+gc"])
def test_same_requests_and_metrics(stock, variant, tmp_path):
    bodies, metrics = run(tmp_path, variant)
    # one forward_backward per step, each with the tiny batch's datums
    assert len(stock[0]) == STEPS and all(stock[0].values())
    assert bodies == stock[0]
    assert len(comparable(metrics)) == STEPS and "optim/kl_sample_train_v1" in metrics[0]
    assert compare_metrics(stock[1], metrics) is None, compare_metrics(stock[1], metrics)
