"""The collector held to the step in the trainer a user runs:
tinker-cookbook's own `rl.train.main` against the fake service, with
environments that make cyclic garbage as real ones do
(tests/support/garbage.py: graders, judges, a setup's structures). Stock
and installed each in a process of its own; installed's peak RSS may not
exceed stock's by more than a quarter (the measure a user's out-of-memory
kill goes by). Sizes small enough for CI, large enough that the previous
policy (the young generations held to the step's end, the setup frozen at
the loop's start) failed each."""

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


def run(tmp: Path, variant: str, workload: str, garbage: str, steps: int, *flags: str) -> dict:
    out = tmp / f"{variant}.json"
    cmd = [sys.executable, str(RUNNER), "--workload", workload, "--variant", variant, "--steps", str(steps)]
    cmd += ["--record", str(tmp / f"record-{variant}"), "--out", str(out), "--garbage", garbage, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def stock_and_installed(tmp: Path, workload: str, garbage: str, steps: int = 2, *flags: str) -> tuple[dict, dict]:
    stock = run(tmp, "stock", workload, garbage, steps, *flags)
    ours = run(tmp, "installed+gc", workload, garbage, steps, *flags)
    assert ours["collector"]["steps"] >= steps - 1, ours["collector"]
    return stock, ours


def assert_peak_within_a_quarter(stock: dict, ours: dict) -> None:
    assert ours["peak_rss_mb"] <= 1.25 * stock["peak_rss_mb"], (
        ours["peak_rss_mb"], stock["peak_rss_mb"], ours["collector"])


def test_a_synchronous_grading_s_garbage(tmp_path):
    # each group graded in one synchronous stretch: 2 x 300 MB of 50 KB gradings a step
    stock, ours = stock_and_installed(tmp_path, "tiny", "grade:300")
    assert_peak_within_a_quarter(stock, ours)


def test_each_env_step_s_garbage(tmp_path):
    # 512 env.steps a step, each 2 MB of cycles held across an await (128 at once)
    stock, ours = stock_and_installed(tmp_path, "multi_turn_agent", "step:2")
    assert_peak_within_a_quarter(stock, ours)


def test_the_setup_s_garbage_dropped_in_the_first_step(tmp_path):
    # 400 MB alive when the loop starts, dropped in the first step, then each
    # step's graders' garbage on top; counted nodes: freed by the first step's end
    stock, ours = stock_and_installed(tmp_path, "tiny", "start:400+grade:100+counted", 3)
    assert_peak_within_a_quarter(stock, ours)
    assert ours["steps"][0]["garbage_alive"] < 1_000, [s["garbage_alive"] for s in ours["steps"]]


def test_the_async_trainer(tmp_path):
    stock, ours = stock_and_installed(tmp_path, "tiny", "grade:300", 3, "--async")
    assert_peak_within_a_quarter(stock, ours)
