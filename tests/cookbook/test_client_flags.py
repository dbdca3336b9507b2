"""Under the flags a real service sends in its client config
(`/api/v1/client/config`, tinker's `ClientConfigResponse`): tinker-cookbook's
own `rl.train.main` (support/trainer_run.py: tiny workload, 2 steps, stock
and then `tinker_rl_data.cookbook.install()`, each against a fresh fake
service answering those flags) sends the same forward_backward bodies and
logs the same metrics installed as stock; the client took each flag's path,
as the fake service counted it (the retrieve_futures long poll, zstd bodies,
httpx's own transport); and `tinker_rl_data.status()` says that the lean
transport stands aside exactly when the service saw no step request come
through pyqwest, from the moment the first client fetched the flags.
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

from support.trainer_checks import canonical_bodies, comparable, compare_metrics  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
RUNNER = TESTS / "support" / "trainer_run.py"
STEPS = 2
VARIANTS = ["stock", "installed+gc"]  # installed+gc: install() as users call it
STEP_PATHS = ("/api/v1/asample", "/api/v1/retrieve_future", "/api/v1/forward_backward", "/api/v1/optim_step")
PYQWEST_OFF = "stands aside: the service turned pyqwest off (use_pyqwest_transport: false)"
LEAN_PIECES = ("step requests sent lean", "future polls sent lean")

CONFIGS = {
    "retrieve_futures": {"sample_use_retrieve_futures": True},
    "compressed": {"proto_compress_fwdbwd": True},
    "retrieve_futures+compressed": {"sample_use_retrieve_futures": True, "proto_compress_fwdbwd": True},
    "httpx": {"use_pyqwest_transport": False},
    # as the real service: HTTPS, HTTP/2 by ALPN, sampling that takes time (held polls)
    "retrieve_futures, HTTP/2, latency": {"sample_use_retrieve_futures": True},
}
RUN_OPTIONS = {"retrieve_futures, HTTP/2, latency": ["--tls", "--latency", "base=0.05,token=0"]}


@pytest.fixture(scope="module", params=list(CONFIGS))
def runs(request, tmp_path_factory):
    config = CONFIGS[request.param]
    tmp = tmp_path_factory.mktemp(request.param.replace("+", "-").replace(", ", "-").replace("/", ""))
    record, out = tmp / "record", tmp / "out.json"
    cmd = [sys.executable, str(RUNNER), "--workload", "tiny", "--variant", ";".join(VARIANTS), "--steps", str(STEPS)]
    cmd += ["--record", str(record), "--out", str(out), "--client-config", json.dumps(config)]
    cmd += RUN_OPTIONS.get(request.param, [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results] == VARIANTS
    return config, {r["variant"]: (canonical_bodies(record / str(i)), r) for i, r in enumerate(results)}


def test_the_same_bodies_and_metrics_as_stock(runs):
    _, by_variant = runs
    (stock_bodies, stock), (bodies, installed) = by_variant["stock"], by_variant["installed+gc"]
    assert len(stock["steps"]) == len(installed["steps"]) == STEPS
    assert len(stock_bodies) == STEPS and all(stock_bodies.values())  # one forward_backward a step
    assert bodies == stock_bodies
    assert len(comparable(stock["metrics"])) == STEPS
    assert compare_metrics(stock["metrics"], installed["metrics"]) is None, compare_metrics(
        stock["metrics"], installed["metrics"]
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_client_took_the_flags_path(runs, variant):
    config, by_variant = runs
    result = by_variant[variant][1]
    paths = result["requests"]["paths"]
    samples = paths["/api/v1/asample"]["answered"]
    assert samples > 0

    # sample_use_retrieve_futures: each sampling session's long poll reports
    # the samples done, and each sample's payload is fetched once after that
    # (api_future_impl), never polled for before.
    if config.get("sample_use_retrieve_futures"):
        polls = paths.get("/api/v1/retrieve_futures", {})
        assert polls.get("answered", 0) > 0, paths
        if result["mode"]["latency"]:  # the service took time: some polls waited for it
            assert polls.get("held", 0) > 0, polls
        assert polls.get("acknowledged", 0) > 0, polls  # the ids fetched, reported back
        fetches = paths["/api/v1/retrieve_future"]
        assert fetches.get("sample_polls", 0) == 0, fetches
        assert fetches.get("sample_fetches", 0) == samples, fetches
    else:
        assert "/api/v1/retrieve_futures" not in paths

    # proto_compress_fwdbwd: every forward_backward body zstd-compressed.
    forward_backward = paths["/api/v1/forward_backward"]
    assert forward_backward["received"] == STEPS
    expected = STEPS if config.get("proto_compress_fwdbwd") else 0
    assert forward_backward.get("compressed", 0) == expected, forward_backward

    # use_pyqwest_transport: which client wrote each step request.
    sender = "pyqwest" if config.get("use_pyqwest_transport", True) else "httpx"
    if result["mode"]["tls"]:
        sender = "HTTP/2"  # pyqwest's and httpx's alike
    for path in STEP_PATHS:
        assert paths[path]["senders"] == {sender: paths[path]["received"]}, (path, paths[path])


def test_status_says_the_lean_transport_stands_aside_when_no_request_went_through_pyqwest(runs):
    config, by_variant = runs
    installed = by_variant["installed+gc"][1]
    paths = installed["requests"]["paths"]
    through_pyqwest = sum(paths[p]["senders"].get("pyqwest", 0) for p in STEP_PATHS)
    if installed["mode"]["tls"] and config.get("use_pyqwest_transport", True):
        # HTTP/2 does not tell its writer: tinker's pyqwest transport, unless the flag turned it off
        through_pyqwest = sum(paths[p]["senders"].get("HTTP/2", 0) for p in STEP_PATHS)
    status = installed["status"]
    transport = next(line for line in status.splitlines() if line.split()[:1] == ["transport"])
    from tinker_rl_data.tinker import transport as feature

    pieces, lean = len(feature.PIECES), len(feature._LEAN)  # the lean ones need pyqwest; the rest do not
    if through_pyqwest:
        assert transport.split()[1:4] == ["on,", str(pieces), "of"], status
        assert "stands aside" not in status, status
    else:
        assert transport.split()[1:5] == ["partly", "on,", str(pieces - lean), "of"], status
        for piece in LEAN_PIECES:
            assert f"{piece}: {PYQWEST_OFF}" in status, status


CHILD = """
import json, os, sys, warnings
sys.path.insert(0, sys.argv[1])
os.environ["TINKER_API_KEY"] = "tml-fake-key"
import tinker
import tinker_rl_data
import tinker_rl_data.cookbook
from support.fake_tinker import FakeTinker

seen = {"at install": str(tinker_rl_data.cookbook.install())}
with FakeTinker(record=sys.argv[2], client_config=json.loads(sys.argv[3])) as fake:
    service = tinker.ServiceClient(base_url=fake.base_url)
    seen["client made"] = str(tinker_rl_data.status())  # (its holder is made at its first call)
    warnings.simplefilter("ignore", FutureWarning)
    service.get_server_capabilities()  # the first call: the client config fetched
    seen["first call"] = str(tinker_rl_data.status())
    service.holder.close()
seen["requests"] = fake.requests["paths"]
print(json.dumps(seen))
"""


@pytest.mark.parametrize("config", [{"use_pyqwest_transport": False}, {}], ids=["pyqwest off", "defaults"])
def test_status_tells_from_the_first_call_before_any_step_request(config, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(TESTS), str(tmp_path / "record"), json.dumps(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert "/api/v1/client/config" in seen["requests"] and not set(STEP_PATHS) & set(seen["requests"])
    for moment in ("at install", "client made"):  # the flag not known yet
        assert "stands aside" not in seen[moment], seen[moment]
    if config.get("use_pyqwest_transport", True):
        assert "stands aside" not in seen["first call"], seen["first call"]
    else:
        for piece in LEAN_PIECES:
            assert f"{piece}: {PYQWEST_OFF}" in seen["first call"], seen["first call"]
