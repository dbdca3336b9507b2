"""tinker_rl_data.tinker.sample_path: ``SamplingClient.sample`` run lean.

Each case runs a sampling client against the fake service
(tests/support/fake_tinker.py) in a fresh process, stock and installed,
and compares what a user sees: the result or the exception (class and
message), the requests the service received per path, the telemetry
events tinker logged (by name and severity), the sample's requests on the
wire (compared in tests/tinker/test_transport.py, whose children now take
this path too).

- retries: 5xx, 429 and closed connections on asample and the future's
  polls (tinker's retry handler and the holder's retries);
- a non-retryable 400: the same exception and the same fatal telemetry;
- ``sample_no_retries`` from the service's flags: one attempt, the same
  exception;
- stuck detection (``RetryConfig(progress_timeout=...)``): the same
  ``APIConnectionError`` when no call makes progress;
- the limits: tinker's ``sample_max_concurrent_requests`` (the retry
  handler's semaphore) and the dispatch semaphore bound the calls in flight
  as stock's do (counted at the service);
- a client ours does not reproduce (a subclass, a user's function on the
  instance or on tinker's class after install()) runs tinker's ``sample``:
  the user's code is called;
- the probe refuses a tinker whose sample path's source changed;
- a call awaited at once crosses to tinker's loop and back in batches
  (counted); one whose future is held (blocked on with ``result()`` inside
  the caller's loop, gathered later) is tinker's future, as stock's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def run(case: str, variant: str, tmp: Path) -> dict:
    out = tmp / f"{case}-{variant}.json"
    proc = subprocess.run(
        [sys.executable, __file__, case, variant, str(out)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def both(case: str, tmp: Path) -> tuple[dict, dict]:
    stock, installed = run(case, "stock", tmp), run(case, "installed", tmp)
    assert stock["lean_calls"] == 0
    return stock, installed


# What each case asks of the service: faults, latency, flags; and of the client.
CASES = {
    "retries": {"faults": "seed=5,rate=0.3,kinds=500+503+429+closed+lost", "n": 12},
    "rejected": {"faults": "seed=1,rate=0,bad=1", "n": 1},
    "no-retries": {"faults": "seed=2,rate=1,kinds=410", "config": {"sample_no_retries": True}, "n": 1},
    "stuck": {"latency": "base=6,token=0,hold=1", "progress_timeout": 1.5, "n": 2},
    "limits": {"latency": "base=0.3,token=0,slots=4096", "config": {"sample_max_concurrent_requests": 7}, "n": 40},
    "held": {"latency": "base=0.05,token=0", "n": 6},
}


@pytest.mark.parametrize("case", ["retries", "rejected", "no-retries", "stuck"])
def test_a_sample_call_ends_as_stocks(case, tmp_path):
    stock, installed = both(case, tmp_path)
    assert installed["lean_calls"] == CASES[case]["n"], installed
    assert installed["crossed"] == CASES[case]["n"], installed  # each awaited at once
    assert installed["outcomes"] == stock["outcomes"]
    assert installed["requests"] == stock["requests"]
    assert installed["telemetry"] == stock["telemetry"]
    if case != "retries":
        assert any(o[0] == "raised" for o in stock["outcomes"]), stock["outcomes"]  # the case can fail
    else:
        assert stock["faults"], "the schedule faulted nothing"


def test_the_concurrent_calls_are_bounded_by_tinkers_limits(tmp_path):
    stock, installed = both("limits", tmp_path)
    assert installed["lean_calls"] == CASES["limits"]["n"]
    assert installed["outcomes"] == stock["outcomes"]
    # tinker's retry handler takes sample_max_concurrent_requests from the
    # service's flags: at most 7 sample calls in flight, each one request.
    assert stock["most_in_flight"] == 7
    assert installed["most_in_flight"] == stock["most_in_flight"]


def test_a_held_future_is_tinkers_and_may_be_blocked_on_inside_the_loop(tmp_path):
    # Not awaited at once: the caller keeps tinker's future, blocks on its
    # result() inside its running loop (tinker's loop thread completes it,
    # as stock's), gathers the others later.
    stock, installed = both("held", tmp_path)
    assert installed["lean_calls"] == CASES["held"]["n"] and installed["crossed"] == 0, installed
    assert installed["outcomes"] == stock["outcomes"]
    assert installed["held_types"] == stock["held_types"] == ["_AwaitableFutureCompatWrapper"] * CASES["held"]["n"]


def test_the_crossing_delivers_each_outcome_and_the_callers_cancel():
    # The mechanism alone, two loops in this process: results in a batch
    # in their callers' order, an exception, a caller's cancel reaching the
    # task, a task factory's refusal reaching the caller (as
    # run_coroutine_threadsafe's callback sets it on the future).
    import threading

    from tinker_rl_data.tinker import sample_path as sampling

    tinker_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=tinker_loop.run_forever, daemon=True)
    thread.start()
    started, cancelled = threading.Event(), threading.Event()

    async def value(x):
        await asyncio.sleep(0.001)
        assert asyncio.get_running_loop() is tinker_loop
        return x

    async def fails():
        raise KeyError("k")

    async def long():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def refuse(loop, coro, **kwargs):
        raise RuntimeError("no task here")

    async def main():
        caller = asyncio.get_running_loop()
        crossing = functools.partial(sampling._crossing, tinker_loop, caller)
        assert await asyncio.gather(*(crossing(value(i)) for i in range(200))) == list(range(200))
        with pytest.raises(KeyError):
            await crossing(fails())
        waiter = crossing(long())
        assert await caller.run_in_executor(None, started.wait, 10)
        waiter.cancel()
        assert await caller.run_in_executor(None, cancelled.wait, 10)
        tinker_loop.call_soon_threadsafe(tinker_loop.set_task_factory, refuse)
        with pytest.raises(RuntimeError, match="no task here"):
            await crossing(value(1))

    try:
        asyncio.run(main())
    finally:
        tinker_loop.call_soon_threadsafe(tinker_loop.stop)
        thread.join(10)
        tinker_loop.close()


FORK_CHECK = """
import asyncio, os
from tinker_rl_data.tinker import sample_path as sampling
loop = asyncio.new_event_loop()
sampling._batch(sampling._deliveries, loop, sampling._deliver)
pid = os.fork()
if pid == 0:  # the child: its exit code says what it found
    os._exit(0 if not sampling._deliveries and not sampling._starts else 3)
_, status = os.waitpid(pid, 0)
assert loop in sampling._deliveries  # the parent's are its own
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_keeps_none_of_the_parents_batches():
    # In a fresh single-threaded process (a fork of a process with threads warns).
    proc = subprocess.run([sys.executable, "-c", FORK_CHECK], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("transport", [True, False])
def test_coalesced_sampling_takes_the_lean_path_only_with_the_transport_row(transport, tmp_path):
    variant = "coalesce+transport" if transport else "coalesce"
    ran = run("retries", variant, tmp_path)  # 12 distinct prompts: none merge, each goes beneath
    assert (ran["lean_calls"] == CASES["retries"]["n"]) if transport else (ran["lean_calls"] == 0), ran
    assert all(o[0] == "returned" for o in ran["outcomes"]), ran["outcomes"]


@pytest.mark.parametrize("how", ["subclass", "instance", "class", "module"])
def test_a_client_ours_does_not_reproduce_runs_tinkers_sample(how, tmp_path):
    installed = run(f"user-{how}", "installed", tmp_path)
    assert installed["lean_calls"] == 0
    assert installed["user_calls"] >= 1
    assert installed["outcomes"][0][0] == "returned"


@pytest.mark.parametrize(
    "where",
    ["tinker.lib.retry_handler:RetryHandler.execute", "tinker.lib.internal_client_holder:BytesSemaphore.acquire"],
)
def test_the_probe_refuses_a_function_a_wrapper_was_put_around(where, monkeypatch):
    import functools
    import importlib

    from tinker_rl_data.patch.piece import ProbeFailed
    from tinker_rl_data.tinker import sample_path as sampling

    module_name, _, qualname = where.partition(":")
    cls_name, name = qualname.split(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    theirs = vars(cls)[name]

    @functools.wraps(theirs)
    def traced(*args, **kwargs):  # a tracer's or a mock's wrapper: ours would skip it
        return theirs(*args, **kwargs)

    monkeypatch.setattr(cls, name, traced)
    monkeypatch.setitem(sampling._state, "active", sampling._state["active"])  # the probe's verdict, put back after
    with pytest.raises(ProbeFailed, match=name):
        sampling.probe_sample(None, None)


def test_the_probe_refuses_a_sample_path_that_changed(monkeypatch):
    from tinker_rl_data.patch.piece import ProbeFailed
    from tinker_rl_data.tinker import sample_path as sampling

    monkeypatch.setitem(sampling._state, "active", sampling._state["active"])  # the probe's verdict, put back after
    sampling.probe_sample(None, None)  # tinker 0.38.0's: accepted
    where = next(iter(sampling.REPRODUCED))
    monkeypatch.setitem(sampling.REPRODUCED, where, "0" * 64)
    with pytest.raises(ProbeFailed, match="SamplingClient.sample changed"):
        sampling.probe_sample(None, None)


# ---------------------------------------------------------------------------
# the child


def child(case: str, variant: str, out: str) -> None:
    sys.path[:0] = [str(SUPPORT)]
    os.environ["TINKER_API_KEY"] = "tml-fake-test-key"
    from fake_tinker import FakeTinker

    import tinker
    from tinker import types
    from tinker.lib import telemetry as telemetry_module
    from tinker.lib.retry_handler import RetryConfig

    import tinker_rl_data.cookbook
    from tinker_rl_data.tinker import sample_path as sampling

    spec = CASES.get(case.removeprefix("user-"), {"n": 1}) if not case.startswith("user-") else {"n": 1}
    if variant == "installed":
        tinker_rl_data.cookbook.install(gc=False)
    elif variant.startswith("coalesce"):  # coalesced sampling, with the transport row or without it
        from tinker_rl_data import features
        from tinker_rl_data.patch import transaction

        transaction.probe(features.declared(), ["transport"])  # its probes passed, nothing installed
        tinker_rl_data.cookbook.install(gc=False, coalesce=True, transport=variant == "coalesce+transport")
        assert any(p.title == sampling.PIECES[0].title for p in sampling.PIECES)

    events: list[tuple[str, str]] = []
    original_log = telemetry_module.Telemetry.log

    def log(self, event_name, event_data=None, severity="INFO"):
        events.append((event_name, severity))
        return original_log(self, event_name, event_data, severity)

    telemetry_module.Telemetry.log = log
    original_fatal = telemetry_module.Telemetry.log_fatal_exception

    async def log_fatal_exception(self, exception, severity="ERROR"):
        events.append((f"fatal:{type(exception).__name__}", severity))
        return await original_fatal(self, exception, severity)

    telemetry_module.Telemetry.log_fatal_exception = log_fatal_exception

    result: dict = {"user_calls": 0}
    prompt = types.ModelInput.from_ints(list(range(1, 30)))
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    record = Path(out).with_suffix(".record")
    with FakeTinker(faults=spec.get("faults"), latency=spec.get("latency"), client_config=spec.get("config"), record=record) as fake:
        service = tinker.ServiceClient(base_url=fake.base_url)
        retry_config = RetryConfig(progress_timeout=spec["progress_timeout"]) if "progress_timeout" in spec else None
        sampler = service.create_sampling_client(base_model="fake/model", retry_config=retry_config).result()
        if case == "user-subclass":

            class Mine(type(sampler)):
                def _send_asample_request(self, *args, **kwargs):
                    result["user_calls"] += 1
                    return super()._send_asample_request(*args, **kwargs)

            sampler.__class__ = Mine
        elif case == "user-class":  # a step ours stands in for, patched on tinker's class after install()
            cls = type(sampler)
            theirs_impl = cls._sample_async_impl

            async def _sample_async_impl(self, *args, **kwargs):
                result["user_calls"] += 1
                return await theirs_impl(self, *args, **kwargs)

            cls._sample_async_impl = _sample_async_impl
        elif case == "user-module":  # a name stock's sample reads from its module when called
            from tinker.lib.public_interfaces import sampling_client as module

            theirs_capture = module.capture_exceptions

            def capture_exceptions(*args, **kwargs):
                result["user_calls"] += 1
                return theirs_capture(*args, **kwargs)

            module.capture_exceptions = capture_exceptions
        elif case == "user-instance":
            theirs = sampler._send_asample_request

            def _send_asample_request(*args, **kwargs):
                result["user_calls"] += 1
                return theirs(*args, **kwargs)

            sampler._send_asample_request = _send_asample_request

        async def one(i: int):
            p = types.ModelInput.from_ints([i + 1, *range(1, 30)])
            try:
                response = await sampler.sample(p, 1, params)
                return ["returned", [list(s.tokens) for s in response.sequences]]
            except Exception as e:  # noqa: BLE001 (the outcome compared)
                context = type(e.__context__).__name__ if e.__context__ is not None else None
                return ["raised", type(e).__name__, str(e).split(" for self.request_id")[0], context, e.__suppress_context__]

        most = [0]

        async def watch():  # the sample calls in tinker's retry handler, read every 2 ms
            while True:
                most[0] = max(most[0], sampler.retry_handler._in_retry_loop_count)
                await asyncio.sleep(0.002)

        async def held():
            futures = [sampler.sample(types.ModelInput.from_ints([i + 1, *range(1, 30)]), 1, params) for i in range(spec["n"])]
            result["held_types"] = [type(f).__name__ for f in futures]
            first = futures[0].result(timeout=60)  # blocks this loop; tinker's thread answers
            rest = await asyncio.gather(*futures[1:])
            return [["returned", [list(s.tokens) for s in r.sequences]] for r in (first, *rest)]

        async def main():
            if case == "held":
                return await held()
            watcher = asyncio.ensure_future(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(watch(), sampler.holder.get_loop())))
            try:
                return await asyncio.gather(*(one(i) for i in range(spec["n"])))
            finally:
                watcher.cancel()

        result["outcomes"] = asyncio.run(main())
        result["most_in_flight"] = most[0]
    result["lean_calls"] = sampling.calls[0]
    result["crossed"] = sampling.crossed[0]
    tally = fake.requests or {}
    paths = tally.get("paths", {}) if isinstance(tally, dict) else {}
    result["requests"] = {
        path: {k: v for k, v in counts.items() if k in ("received", "answered", "faults")}
        for path, counts in paths.items()
        if path in ("/api/v1/asample", "/api/v1/retrieve_future")
    }
    result["faults"] = any(v.get("faults") for v in result["requests"].values())
    result["telemetry"] = sorted(e for e in events if not e[0].startswith("session"))
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    child(*sys.argv[1:])
