"""Faults: tinker-cookbook's own `rl.train.main` (tiny workload, 2 steps, a
group's members sharing their first prompt) against the fake tinker service
answering by a seeded fault schedule (support/fake_tinker.py `Faults`: 5xx,
429 + Retry-After, 408, empty-body 400, closed connections, lost answers,
slow answers, try_again / complete_metadata polls, 410 on sample futures;
where asked, non-retryable 400s). All runs are one process
(support/trainer_run.py): stock first, then the variants, each against a
fresh service with its run's schedule.

- With retryable faults, install() (defaults) sends, retries and gets
  answered the same requests on every path as stock, samples and trains the
  same sequences (forward_backward bodies equal as Datum sets); coalesced
  sampling trains the same Datums from fewer requests.
- A non-retryable 400 (a prompt the service rejects) fails the run with the
  exception class stock fails with, within a bounded time (no hang).
- Under RetryOnFailure and MinViableGroup with one-off 400s on single
  samples, coalesced sampling trains as many Datums as stock: a merged
  request that fails is sent again one caller at a time, so the strategy
  sees each trajectory's failure, not k at once.

The schedule is keyed on what a request asks for, not on arrival order, so
the runs see the same faults (support/fake_tinker.py). Not compared: the
telemetry and heartbeat paths (their counts follow the clock), the order of
a group's Datums (which member gets which draw is arrival order), and the
coalesced runs' request counts (fewer requests, each of k samples meeting
the faults of its k samples). MinViableGroup's outcome depends on which
trajectories finish first, in stock as in the variants.

Cost: one process, ten runs of 2 steps; about 25 s of CPU (a third of it
the imports); the runs' own wall adds up to 25-35 s, most of it tinker's
retry backoffs (1 s and more per retried request); the whole file took
55-125 s of wall on two cores shared with three other test streams.
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

# The script that runs the cookbook's loop against the fake service (and
# writes its bodies and requests.json).
RUNNER = Path(__file__).resolve().parents[1] / "support" / "trainer_run.py"

STEPS = 2
TIMEOUT = 300  # seconds for all the runs: a hang fails the test, not the suite
# The transport pieces' titles in status().
LEAN_REQUESTS = ("step requests sent lean", "future polls sent lean", "request futures freed when dropped")
if tuple(int(n) for n in __import__("tinker").__version__.split(".")[:2]) >= (0, 38):
    LEAN_REQUESTS += ("sample calls run lean",)  # the sample path reproduces tinker 0.38.0's
# Paths whose counts depend on time, not on the requests made.
TIMED = {"/api/v1/telemetry", "/api/v1/session_heartbeat"}


# One process (support/trainer_run.py): stock first (install() is not
# undone between runs), each run against a fresh service with its schedule.
RETRYABLE = "seed=3,rate=0.15"  # every retryable fault but 408 and 500 (503 is), on every faulted path
REJECT = "seed=1,rate=0,reject=0.2"  # prompts the service rejects with a 400 (not retried)
ONE_OFF = "seed=1,rate=0,bad=0.15"  # a sample's request answered 400 once (not retried)
RUNS = {
    "stock": RETRYABLE,
    "stock@failfast": REJECT,
    "stock@retry": ONE_OFF,
    "stock@minviable": ONE_OFF,
    "installed": RETRYABLE,
    "installed@failfast": REJECT,
    "installed+coalesce": RETRYABLE,
    "installed+coalesce@failfast": REJECT,
    "installed+coalesce@retry": ONE_OFF,
    "installed+coalesce@minviable": ONE_OFF,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("faults")
    record, out = tmp / "record", tmp / "out.json"
    cmd = [sys.executable, str(RUNNER), "--workload", "tiny", "--variant", ";".join(RUNS)]
    cmd += ["--steps", str(STEPS), "--record", str(record), "--out", str(out), "--shared-prompt"]
    cmd += ["--faults", ";".join(RUNS.values())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == list(RUNS)
    for i, r in enumerate(results):
        r["bodies"] = datum_sets(record / str(i))
    return {r["variant"]: r for r in results}


def datum_sets(record: Path) -> dict[str, list[bytes]]:
    """Each recorded forward_backward request's Datums, each serialized
    deterministically, sorted (a group's members may come in another
    order: which of its concurrent sample calls gets which draw is their
    arrival order at the service)."""
    from tinker.proto import tinker_public_pb2 as pb

    out = {}
    for path in sorted(record.glob("fwdbwd-*.pb")):
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(path.read_bytes())
        out[path.name] = sorted(d.SerializeToString(deterministic=True) for d in msg.data)
    return out


def datums(run: dict) -> int:
    return sum(len(v) for v in run["bodies"].values())


def requests(run: dict) -> dict[str, dict]:
    return {path: v for path, v in run["requests"]["paths"].items() if path not in TIMED}


def fault_kinds(run: dict) -> set[str]:
    return {kind for v in run["requests"]["paths"].values() for kind in v["faults"]}


# ---------------------------------------------------------------------------
# retryable faults: nothing lost, nothing different


def test_the_schedule_faults_every_kind_of_request(runs):
    stock = runs["stock"]
    faulted = {path for path, v in stock["requests"]["paths"].items() if v["faults"]}
    assert {"/api/v1/asample", "/api/v1/retrieve_future"} <= faulted, stock["requests"]
    assert len(fault_kinds(stock)) >= 5, stock["requests"]
    assert sum(v["retried"] for v in requests(stock).values()) > 0


def test_installed_meets_the_faults_as_stock(runs):
    stock, installed = runs["stock"], runs["installed"]
    assert stock["error"] is None and installed["error"] is None
    # the step's requests and future polls sent by tinker_rl_data.tinker.transport
    assert all(title in installed["installed"] for title in LEAN_REQUESTS), installed["installed"]
    # received, retried, answered and faults by kind, per path
    assert requests(installed) == requests(stock)
    assert installed["requests"]["samples"] == stock["requests"]["samples"]
    assert installed["bodies"] == stock["bodies"] and datums(stock) > 0
    assert len(installed["metrics"]) == len(stock["metrics"]) == STEPS


def test_coalesced_trains_the_same_datums_from_fewer_requests(runs):
    stock, coalesced = runs["stock"], runs["installed+coalesce"]
    assert coalesced["error"] is None and coalesced["coalesced"]["merged_requests"] > 0
    assert coalesced["requests"]["samples"] == stock["requests"]["samples"]
    assert coalesced["bodies"] == stock["bodies"]
    asample = "/api/v1/asample"
    assert coalesced["requests"]["paths"][asample]["answered"] < stock["requests"]["paths"][asample]["answered"]
    assert len(coalesced["metrics"]) == STEPS


# ---------------------------------------------------------------------------
# a non-retryable fault: the same exception class, no hang (TIMEOUT)


@pytest.mark.parametrize("variant", ["installed@failfast", "installed+coalesce@failfast"])
def test_a_rejected_prompt_fails_as_stock(runs, variant):
    stock = runs["stock@failfast"]
    assert stock["error"] is not None and "reject" in fault_kinds(stock)
    assert runs[variant]["error"] == stock["error"]
    if variant == "installed@failfast":
        assert requests(runs[variant]) == requests(stock)


# ---------------------------------------------------------------------------
# rollout_error_tolerance: a merged request's failure is no wider than one
# sample's


@pytest.mark.parametrize("strategy", ["retry", "minviable"])
def test_coalesced_sampling_trains_stocks_datums_under_a_tolerance_strategy(runs, strategy):
    # MinViableGroup retries a failure only while the group is below its
    # floor: which trajectories finished first is timing, in stock as here
    # (the one-off 400s come back before any trajectory finishes).
    stock, coalesced = runs[f"stock@{strategy}"], runs[f"installed+coalesce@{strategy}"]
    assert stock["error"] is None and coalesced["error"] is None
    assert "bad" in fault_kinds(stock) and "bad" in fault_kinds(coalesced)
    assert datums(coalesced) == datums(stock)
    assert coalesced["bodies"] == stock["bodies"]
    # Per step: the same episodes; trajectory errors no more than stock's
    # (a merged request's failure is no trajectory's when its callers then
    # succeed alone) and no group skipped where stock skipped none.
    for ours, theirs in zip(coalesced["metrics"], stock["metrics"], strict=True):
        assert ours["env/all/total_episodes"] == theirs["env/all/total_episodes"]
        assert ours.get("rollout_errors/total", 0) <= theirs.get("rollout_errors/total", 0)
        assert ours.get("rollout_errors/groups_skipped", 0) <= theirs.get("rollout_errors/groups_skipped", 0)
    assert any("rollout_errors/total" in m for m in stock["metrics"])  # stock met failures


def test_merged_requests_failed_and_were_sent_again_alone(runs):
    # counts() is the process's: the last run's holds the earlier ones'
    counts = runs["installed+coalesce@minviable"]["coalesced"]
    assert counts["split_requests"] > 0 and counts["split_calls"] >= 2 * counts["split_requests"]
