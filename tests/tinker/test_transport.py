"""tinker_rl_data.tinker.transport: tinker's step requests sent lean.

- On the wire (the fake service, fake_tinker.py --capture, records every request as
  received): a sampling client's samples and compute_logprobs, a training
  client's forward_backward and optim_step, each with its future polls,
  send the same requests installed as stock: method, path, header lines
  in order, bodies; but the idempotency key's random part and the
  round-trip-time header's value. Each variant runs in its own process.
- A connection closed in the middle of a response is retried as tinker
  retries it (the same requests received, the same answer); a service
  that answers nothing leaves, once the callers are cancelled, no task on
  tinker's loop and no thread behind.
- With coalesced sampling on too, merged requests go out lean.
- The install probes fail for a post, or a future poll, that sends another
  request or reads an answer otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

# The fake service (tests/support/fake_tinker.py).
FAKE_DIRS = [Path(__file__).resolve().parents[1] / "support"]
PATHS = ("/api/v1/asample", "/api/v1/retrieve_future", "/api/v1/forward_backward", "/api/v1/optim_step")
VOLATILE = "x-tinker-create-promise-roundtrip-time"


def run_child(variant: str, tmp: Path) -> dict:
    out = tmp / f"{variant}.json"
    proc = subprocess.run(
        [sys.executable, __file__, variant, str(tmp / variant), str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def comparable(wire: list[dict]) -> list[tuple]:
    """The step's requests, but the two volatile values (and the port)."""
    out = []
    for request in wire:
        if request["path"] not in PATHS:
            continue
        headers = []
        for name, value in request["headers"]:
            if name.lower() == "x-idempotency-key":
                value = value[: len("stainless-python-retry-")] + f"<{len(value)}>"
            elif name.lower() == VOLATILE:
                value = "<time>"
            elif name.lower() == "host":  # each run's service has its own port
                value = value.rpartition(":")[0]
            headers.append((name, value))
        out.append((request["method"], request["path"], request["version"], headers, request["body"]))
    return out


def test_an_idempotency_key_is_a_uuid4_as_tinkers_is():
    import uuid

    from tinker._base_client import BaseClient

    from tinker_rl_data.tinker import transport

    prefix = "stainless-python-retry-"
    theirs = BaseClient._idempotency_key(None)
    keys = [transport._idempotency_key() for _ in range(20_000)]
    assert len(set(keys)) == len(keys)
    for key in [theirs, *keys]:
        assert key.startswith(prefix) and len(key) == len(theirs)
        parsed = uuid.UUID(key[len(prefix):])
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == key[len(prefix):]
    # every random bit drawn: each hex digit but the version's takes several values
    digits = [key[len(prefix):].replace("-", "") for key in keys]
    assert all(len({d[i] for d in digits}) == 16 for i in range(32) if i not in (12, 16))
    assert {d[12] for d in digits} == {"4"} and {d[16] for d in digits} == set("89ab")


def test_the_step_requests_on_the_wire_are_stocks(tmp_path):
    stock, installed = run_child("stock", tmp_path), run_child("installed", tmp_path)
    assert installed["lean"] >= 8, installed  # each call and poll went lean
    assert stock["results"] == installed["results"]
    theirs, ours = comparable(stock["wire"]), comparable(installed["wire"])
    assert {path for _, path, *_ in theirs} == set(PATHS)
    assert len(ours) == len(theirs)
    for mine, stocks in zip(ours, theirs):
        assert mine == stocks


# A service that takes time (fake_tinker.py's `Latency`): sequences wait for
# one of 2 sampler slots, a poll of a future not ready is held 0.15 s then
# answered try_again, training requests take their time one after another.
LATENCY = "base=0.4,token=0,slots=2,hold=0.15,fb=0.3,fb_token=0,optim=0.2"


@pytest.mark.parametrize("variant", ["stock", "installed"])
def test_a_service_that_takes_time_answers_what_one_that_does_not_answers(variant, tmp_path):
    instant, slow = run_child(f"{variant}@gather", tmp_path), run_child(f"{variant}@latency", tmp_path)
    # The 4 at once draw in arrival order: the same draws, in any order.
    assert slow["results"][:5] == instant["results"][:5]
    assert sorted(slow["results"][5:]) == sorted(instant["results"][5:])
    seen = slow["requests"]["latency"]
    # 2 samples and compute_logprobs one after another, then 4 at once on 2
    # slots: two waves. Each result was taken by a held poll once ready.
    assert seen["fetched"] == 7
    assert seen["busy_slot_s"] == pytest.approx(7 * 0.4, rel=0.1)
    assert slow["gathered_s"] >= 0.8 > instant["gathered_s"]
    assert seen["try_again"] >= 7  # every poll held past 0.15 s was answered try_again and polled again
    assert seen["fetch_delay_max_s"] < 0.1
    assert slow["elapsed_s"] >= 3 * 0.4 + 0.8 + 0.3 + 0.2
    if variant == "installed":
        assert slow["lean"] >= instant["lean"]


def test_coalesced_sampling_goes_out_lean(tmp_path):
    run = run_child("coalesced", tmp_path)
    if not run["coalescing"]:
        pytest.skip("coalesced sampling is not installed with this tinker")
    assert run["merged"] > 0 and run["lean"] > 0, run


# --------------------------------------------------------------------------
# A response cut short; a service that never answers


class CutShort:
    """A local HTTP/1.1 server: the first request to /api/v1/asample gets
    the head and part of its body, then the connection closes; every
    other request gets a complete answer."""

    ANSWER = b'{"request_id": "r-1", "sample_sequence_ids": ["s-1"]}'

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CutShort:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(asyncio.sleep(0.05))  # the transports' closing callbacks
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
                )
                body = await reader.readexactly(length)
                self.received.append(head.split(b"\r\n")[0] + b" " + body)
                reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(self.ANSWER)
                if len(self.received) == 1:
                    writer.write(reply + self.ANSWER[:10])
                    await writer.drain()
                    writer.close()
                    return
                writer.write(reply + self.ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chain(exc):
    """An exception's chain of causes as callers and tracebacks read it:
    each one's class, text, the class of its context, and its response's
    extensions (names, and trailers)."""
    out = []
    while exc is not None:
        response = getattr(exc, "response", None)
        extensions = getattr(response, "extensions", None) or {}
        trailers = extensions["get_trailers"]().multi_items() if "get_trailers" in extensions else None
        out.append((type(exc).__name__, str(exc), type(exc.__context__).__name__, sorted(extensions), trailers))
        exc = exc.__cause__
    return out


def _asample(client, retries=2):
    from tinker import types

    request = types.SampleRequest(
        sampling_session_id="s", seq_id=1, num_samples=1, prompt=types.ModelInput.from_ints([1, 2]),
        sampling_params=types.SamplingParams(max_tokens=2),
    )
    return client.sampling.asample(request=request, max_retries=retries)


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
@pytest.mark.parametrize("variant", ["stock", "ours"])
def test_a_response_cut_short_is_retried_as_tinker_retries_it(variant, monkeypatch):
    from tinker._base_client import AsyncAPIClient
    from tinker._client import AsyncTinker

    from tinker_rl_data.tinker import transport

    if variant == "ours":
        monkeypatch.setattr(AsyncAPIClient, "post", transport.make_post(AsyncAPIClient.post))
    monkeypatch.setattr("tinker._base_client.INITIAL_RETRY_DELAY", 0.01)
    sent = transport._sent[0]

    async def main(port):
        client = AsyncTinker(api_key="tml-test-key", base_url=f"http://127.0.0.1:{port}")
        try:
            return await _asample(client)
        finally:
            await client.close()

    with CutShort() as server:
        future = asyncio.run(main(server.port))
    assert future.request_id == "r-1"
    assert len(server.received) == 2 and server.received[0] == server.received[1]
    assert (transport._sent[0] > sent) == (variant == "ours")


def recorded(script, **client_options):
    """A tinker client whose pyqwest transport answers ``script`` and
    records the requests, and that recorder."""
    from pyqwest.httpx import AsyncPyqwestTransport
    from tinker._client import AsyncTinker

    from tinker_rl_data.tinker import transport

    recorder = transport._Recorder(script)
    client = AsyncTinker(api_key="tml-test-key", base_url="http://127.0.0.1:9", **client_options)
    client._client._transport = AsyncPyqwestTransport(recorder)
    return client, recorder


# A change made to a client after its first request: (what it is, whether
# the second request still goes lean; else tinker's post sends it).
CLIENT_CHANGES = {
    "default header": lambda c: c._custom_headers.__setitem__("X-Added-Later", "1"),
    "default query": lambda c: c._custom_query.__setitem__("added", "later"),
    "a default query value changed in place": lambda c: c._custom_query["tags"].append("b"),
    "an httpx client header": lambda c: c._client.headers.__setitem__("X-Added-Later", "1"),
    "an httpx client query": lambda c: setattr(c._client, "params", {"q": "1"}),
    "the timeout changed in place": lambda c: setattr(c.timeout, "read", 0.5),
    "a request timeout 45.0 after 45": None,  # (the second request's option)
    "an httpx event hook": lambda c: c._client.event_hooks["request"].append(_hook),
    "an idempotency key of the instance's own": lambda c: setattr(c, "_idempotency_key", lambda: "mine"),
}
LEAN_AFTER = {"an httpx event hook": False, "an idempotency key of the instance's own": False}
_hooked: list[str] = []


async def _hook(request) -> None:
    _hooked.append(request.url.path)


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
@pytest.mark.parametrize("change", list(CLIENT_CHANGES))
def test_a_client_changed_after_its_first_request_sends_what_tinker_sends(change, monkeypatch):
    # tinker builds each request from the client as it is then; ours made
    # its template at the first request, and leaves to tinker's post what
    # it does not do (hooks, a method of the instance's own).
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.tinker import transport

    import httpx
    from tinker.types.future_retrieve_request import FutureRetrieveRequest

    answer = (200, [("content-type", "application/json")], b'{"type": "try_again"}')

    async def main(post):
        monkeypatch.setattr(AsyncAPIClient, "post", post)
        timeout = httpx.Timeout(60.0, connect=5.0)  # its own (tinker's default is one object, shared)
        client, recorder = recorded([answer, answer], default_query={"tags": ["a"]}, timeout=timeout)
        poll = FutureRetrieveRequest(request_id="r-1")
        timed = CLIENT_CHANGES[change] is None
        _hooked.clear()
        try:
            await client.futures.retrieve(request=poll, **({"timeout": 45} if timed else {}))
            if not timed:
                CLIENT_CHANGES[change](client)
            await client.futures.retrieve(request=poll, **({"timeout": 45.0} if timed else {}))
        finally:
            await client.close()
        return [transport._comparable_request(r) for r in recorder.requests], _hooked[:]

    theirs = asyncio.run(main(AsyncAPIClient.post))
    sent = transport._sent[0]
    mine = asyncio.run(main(transport.make_post(AsyncAPIClient.post)))
    assert transport._sent[0] == sent + 1 + LEAN_AFTER.get(change, True)
    assert theirs[0][0] != theirs[0][1] or theirs[1], theirs  # the change reached tinker's second request
    assert mine == theirs


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
@pytest.mark.parametrize("location", ["/api/v1/elsewhere", "http://[::1"])
def test_a_redirect_its_transport_answers_is_followed_as_tinkers_httpx_client_follows_it(location, monkeypatch):
    # pyqwest follows a redirect itself, but answers one whose Location it
    # cannot use; tinker's httpx client then follows it (or fails to, a
    # connection error tinker retries).
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.tinker import transport

    monkeypatch.setattr("tinker._base_client.INITIAL_RETRY_DELAY", 0.01)
    moved = (307, [("location", location), ("content-length", "0")], b"")
    answer = (200, [("content-type", "application/json")], b'{"request_id": "r-1"}')

    async def main(post, retries):
        monkeypatch.setattr(AsyncAPIClient, "post", post)
        client, recorder = recorded([moved, answer])
        try:
            got = _comparable(await _asample(client, retries=retries))
        except Exception as exc:
            got = chain(exc)
        finally:
            await client.close()
        return got, [transport._comparable_request(r) for r in recorder.requests]

    for retries in (0, 2):
        theirs = asyncio.run(main(AsyncAPIClient.post, retries))
        sent = transport._sent[0]
        mine = asyncio.run(main(transport.make_post(AsyncAPIClient.post), retries))
        assert transport._sent[0] > sent  # it went lean
        assert len(theirs[1]) == (2 if location.startswith("/") else 1 + (retries > 0)), theirs  # followed; retried
        assert mine == theirs


def _comparable(result):
    return result.model_dump() if hasattr(result, "model_dump") else result


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
@pytest.mark.parametrize("answer", ["a response cut short", "a 500", "a 400", "a connection refused", "a timeout"])
def test_an_error_not_retried_raises_what_tinker_raises(answer, monkeypatch):
    # The whole chain (tinker's telemetry logs it): a connection error from
    # the adapter's error (ours reads the answer whole, tinker's adapter as
    # a stream), a status error raised while tinker handles httpx's.
    from tinker._base_client import AsyncAPIClient
    from tinker._client import AsyncTinker

    from tinker_rl_data.tinker import transport

    script = {
        "a 500": (500, [("content-type", "application/json")], b'{"error": "x"}'),
        "a 400": (400, [("content-type", "application/json")], b'{"error": "bad"}'),
        "a connection refused": ConnectionRefusedError("refused"),
        "a timeout": TimeoutError("timed out"),
    }.get(answer)

    async def main(port):
        if script is None:
            client = AsyncTinker(api_key="tml-test-key", base_url=f"http://127.0.0.1:{port}")
        else:
            client, _ = recorded([script])
        try:
            await _asample(client, retries=0)
        except Exception as exc:
            return chain(exc)
        finally:
            await client.close()

    chains = {}
    for variant in ("stock", "ours"):
        with monkeypatch.context() as m:
            if variant == "ours":
                m.setattr(AsyncAPIClient, "post", transport.make_post(AsyncAPIClient.post))
            with CutShort() as server:
                chains[variant] = asyncio.run(main(server.port))
    assert chains["stock"] and chains["stock"][0][2] != "NoneType", chains
    assert chains["ours"] == chains["stock"]


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
def test_an_answer_that_does_not_decode_is_retried_as_tinker_retries_it(monkeypatch):
    # httpx's send reads (and decodes) the body inside tinker's try: a body
    # that does not decode is a connection error, retried.
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.tinker import transport

    monkeypatch.setattr("tinker._base_client.INITIAL_RETRY_DELAY", 0.01)
    undecodable = (200, [("content-type", "application/json"), ("content-encoding", "deflate")], b"not deflate")
    answer = (200, [("content-type", "application/json")], b'{"request_id": "r-1"}')

    async def main(post, script, retries):
        monkeypatch.setattr(AsyncAPIClient, "post", post)
        client, recorder = recorded(script)
        try:
            got = ("returned", (await _asample(client, retries)).request_id)
        except Exception as exc:
            got = ("raised", type(exc).__name__, type(exc.__cause__).__name__)
        finally:
            await client.close()
        return got, [transport._comparable_request(r) for r in recorder.requests]

    for script, retries in (([undecodable, answer], 1), ([undecodable], 0)):
        theirs = asyncio.run(main(AsyncAPIClient.post, script, retries))
        sent = transport._sent[0]
        mine = asyncio.run(main(transport.make_post(AsyncAPIClient.post), script, retries))
        assert transport._sent[0] > sent
        assert mine == theirs
    assert theirs[0] == ("raised", "APIConnectionError", "DecodingError")


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
def test_a_client_closed_while_a_request_waits_to_retry_stays_closed(monkeypatch):
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.tinker import transport

    failed = (500, [("content-type", "application/json"), ("retry-after-ms", "300")], b"{}")
    answer = (200, [("content-type", "application/json")], b'{"request_id": "r-1"}')

    async def main(post):
        monkeypatch.setattr(AsyncAPIClient, "post", post)
        client, recorder = recorded([failed, answer])
        call = asyncio.ensure_future(_asample(client))
        await asyncio.sleep(0.1)  # the call sleeps before its retry
        await client.close()
        try:
            got = ("returned", (await call).request_id)
        except Exception as exc:
            got = ("raised", type(exc).__name__, repr(exc.__cause__))
        return got, len(recorder.requests), client.is_closed()

    theirs = asyncio.run(main(AsyncAPIClient.post))
    mine = asyncio.run(main(transport.make_post(AsyncAPIClient.post)))
    assert theirs[0][0] == "raised" and theirs[2], theirs
    assert mine == theirs


@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")  # tinker's own
@pytest.mark.parametrize("where", ["on the class", "on the futures resource"])
def test_a_users_wrapper_of_tinkers_post_still_sees_the_future_polls(where, monkeypatch):
    # functools.wraps gives a wrapper tinker's names: the poll must still go
    # through it (tinker's raw retrieve calls the post its resource holds).
    import contextlib
    import functools
    import types as pytypes

    from tinker import types
    from tinker._base_client import AsyncAPIClient
    from tinker.lib import api_future_impl

    from tinker_rl_data.tinker import transport

    tinkers_post = AsyncAPIClient.post
    seen = []

    @functools.wraps(tinkers_post)
    async def instrumented(self, path, **kwargs):
        seen.append(path)
        return await tinkers_post(self, path, **kwargs)

    if where == "on the class":
        monkeypatch.setattr(AsyncAPIClient, "post", instrumented)
    fetch = transport.make_fetch(api_future_impl._APIFuture._fetch_via_rest)

    async def main():
        answer = (200, [("content-type", "application/json")], b'{"type": "try_again"}')
        client, _ = recorded([answer])
        if where == "on the futures resource":
            client.futures._post = pytypes.MethodType(instrumented, client)
        future = object.__new__(api_future_impl._APIFuture)
        future.model_cls = types.SampleResponse
        future.holder = pytypes.SimpleNamespace(aclient=lambda kind: contextlib.nullcontext(client))
        future.untyped_future = types.UntypedAPIFuture(request_id="r-1")
        future.request_type = "Sample"
        future.request_queue_roundtrip_time = 0.5
        try:
            return await fetch(future, api_future_impl._LoopState(), 0)
        finally:
            await client.close()

    outcome = asyncio.run(main())
    assert type(outcome).__name__ == "_TryAgain"
    assert seen == ["/api/v1/retrieve_future"]


def test_an_awaited_calls_futures_are_freed_without_the_collector(tmp_path):
    # 16 awaited sample calls, the collector off: tinker's futures of each
    # call sit in a cycle of callbacks (stock keeps them until a full
    # collection); installed, they are freed as the caller drops them.
    runs = {variant: run_child(variant, tmp_path) for variant in ("freed-stock", "freed")}
    assert runs["freed"]["calls"] == 16 and runs["freed"]["alive"] == 0, runs["freed"]
    print("stock leaves", runs["freed-stock"]["alive"], "of", 2 * runs["freed-stock"]["calls"])


def test_a_sample_calls_future_on_tinkers_loop_does_not_wake_that_loop(tmp_path):
    # 16 awaited sample calls: each call's _APIFuture starts its polling on
    # tinker's loop, from that loop; stock wakes the loop for it twice
    # (the task started through call_soon_threadsafe, its result chained
    # back the same way); installed, neither: the loop is woken once by the
    # call's caller and once by each of its two answers (pyqwest's). The
    # answers are the same.
    runs = {variant: run_child(variant, tmp_path) for variant in ("hops-stock", "hops")}
    stock, ours = runs["hops-stock"], runs["hops"]
    assert ours["calls"] == stock["calls"] == 16 and ours["tokens"] == stock["tokens"], runs
    assert ours["hops"] <= 3 * ours["calls"] < stock["hops"], runs
    print("wakes of tinker's loop, 16 calls: stock", stock["hops"], "installed", ours["hops"])


@pytest.mark.parametrize("variant", ["cancel", "cancel-polling"])
def test_cancelled_callers_leave_no_task_or_thread_behind(variant, tmp_path):
    # The service holds every sample's answer for 30 s ("cancel"), or
    # answers every poll of its future "try again" (tinker's polling loop,
    # started on its own loop, is running); the callers are cancelled after
    # a second (as Ctrl-C cancels asyncio.run's task).
    run = run_child(variant, tmp_path)
    assert run["lean"] > 0 and run["cancelled"] == 20, run
    assert run["tasks_after"] <= run["tasks_before"], run
    assert run["threads_after"] <= run["threads_before"], run


# --------------------------------------------------------------------------
# The probe


def test_the_probe_refuses_a_post_that_differs_from_tinkers(monkeypatch):
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.errors import ProbeFailed
    from tinker_rl_data.tinker import transport

    original = AsyncAPIClient.post
    transport.probe_post(original, transport.make_post(original))  # passes as made
    with monkeypatch.context() as m:  # a JSON body written with spaces
        m.setattr(transport, "_httpx_json", lambda data: json.dumps(data).encode())
        with pytest.raises(ProbeFailed, match="requests differ"):
            transport.probe_post(original, transport.make_post(original))
    with monkeypatch.context() as m:  # pyqwest's errors raised unmapped
        m.setattr(transport, "_as_httpx_error", lambda exc, request: exc)
        with pytest.raises(ProbeFailed, match="callers get"):
            transport.probe_post(original, transport.make_post(original))


def test_the_probe_refuses_a_future_poll_that_differs_from_tinkers(monkeypatch):
    from tinker.lib.api_future_impl import _APIFuture

    from tinker_rl_data.errors import ProbeFailed
    from tinker_rl_data.tinker import transport

    original = _APIFuture._fetch_via_rest
    transport.probe_fetch(original, transport.make_fetch(original))  # passes as made
    with monkeypatch.context() as m:  # the poll sent to another path
        m.setattr(transport, "_RETRIEVE_PATH", "/api/v1/retrieve_futures")
        with pytest.raises(ProbeFailed, match="requests differ"):
            transport.probe_fetch(original, transport.make_fetch(original))
    with monkeypatch.context() as m:  # a protobuf answer read as JSON
        m.setattr(transport._Answer, "content_type", lambda self: "application/json")
        with pytest.raises(ProbeFailed, match="the loop gets"):
            transport.probe_fetch(original, transport.make_fetch(original))


@pytest.mark.parametrize("case", ["a cancel unwound slowly", "a cancel swallowed", "cancelled once done"])
def test_a_future_awaited_on_tinkers_loop_is_cancelled_as_tinkers(case):
    # Awaited on the loop that runs it (as _APIFuture's is), with a timeout
    # or while future() is cancelled: the caller's outcome, how soon it has
    # it, and future()'s state, as with tinker's own function.
    from tinker.lib.internal_client_holder import InternalClientHolder

    from tinker_rl_data.tinker import futures

    original = InternalClientHolder.run_coroutine_threadsafe

    async def call(made):
        loop = asyncio.get_running_loop()
        box = {}

        async def work():
            if case == "cancelled once done":  # future().cancel() before the task's outcome reaches it
                loop.call_soon(lambda: box["future"].future().cancel())
                return "ok"
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if case == "a cancel swallowed":
                    return "swallowed"
                await asyncio.sleep(1.0)  # an asynchronous clean-up
                raise

        future = box["future"] = made(futures._Holder(loop), work())
        start = time.perf_counter()
        try:
            outcome = await asyncio.wait_for(future, None if case == "cancelled once done" else 0.1)
        except BaseException as exc:  # CancelledError too: an outcome compared
            outcome = type(exc).__name__
        waited = time.perf_counter() - start
        await asyncio.sleep(1.2)  # the task's clean-up ends
        return outcome, waited < 0.6, future.future().cancelled()

    got = {name: asyncio.run(call(made)) for name, made in
           (("stock", original), ("ours", futures.make_run_coroutine_threadsafe(original)))}
    assert got["stock"][1] and got["stock"][0] in ("TimeoutError", "CancelledError"), got
    assert got["ours"] == got["stock"]


def test_the_probe_refuses_request_futures_that_differ_from_tinkers():
    from tinker.lib.internal_client_holder import InternalClientHolder

    from tinker_rl_data.errors import ProbeFailed
    from tinker_rl_data.tinker import futures

    original = InternalClientHolder.run_coroutine_threadsafe
    ours = futures.make_run_coroutine_threadsafe(original)
    futures.probe_run_coroutine_threadsafe(original, ours)  # passes as made

    async def nothing():
        return None

    def answers_none_on_its_loop(holder, coro):
        if asyncio._get_running_loop() is holder.get_loop():
            coro.close()
            return ours(holder, nothing())
        return ours(holder, coro)

    with pytest.raises(ProbeFailed, match="awaited on tinker's loop"):
        futures.probe_run_coroutine_threadsafe(original, answers_none_on_its_loop)
    with pytest.raises(ProbeFailed, match="kept its callbacks"):  # tinker's own keeps them
        futures.probe_run_coroutine_threadsafe(original, original)


def test_the_probe_refuses_a_call_on_tinkers_loop_that_never_ends_and_leaves_nothing_pending(monkeypatch, caplog):
    from tinker.lib.internal_client_holder import InternalClientHolder

    from tinker_rl_data.errors import ProbeFailed
    from tinker_rl_data.tinker import futures

    original = InternalClientHolder.run_coroutine_threadsafe
    ours = futures.make_run_coroutine_threadsafe(original)

    def hangs_on_its_loop(holder, coro):
        if asyncio._get_running_loop() is holder.get_loop():
            coro.close()
            return ours(holder, asyncio.sleep(3600))
        return ours(holder, coro)

    monkeypatch.setattr(futures, "_PROBE_WAIT", 0.5)
    threads = set(threading.enumerate())
    with pytest.raises(ProbeFailed, match="did not finish in 0.5 s"):
        futures.probe_run_coroutine_threadsafe(original, hangs_on_its_loop)
    gc.collect()  # a pending task of a closed loop logs as it is destroyed
    assert not [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert set(threading.enumerate()) == threads


# --------------------------------------------------------------------------
# Child processes: one variant each


def child(variant: str, record: str, out: str) -> None:
    sys.path[:0] = [str(d) for d in FAKE_DIRS if (d / "fake_tinker.py").exists()]
    os.environ["TINKER_API_KEY"] = "tml-fake-test-key"
    from fake_tinker import FakeTinker, read_capture

    import tinker
    from tinker import types

    import tinker_rl_data.cookbook
    from tinker_rl_data.tinker import coalesce, transport

    # @gather: 4 samples at once after the step's calls; @latency: so, from
    # a service that takes time.
    latency = LATENCY if variant.endswith("@latency") else None
    gather = variant.endswith(("@latency", "@gather"))
    variant = variant.removesuffix("@latency").removesuffix("@gather")
    coalescing = False
    if variant not in ("stock", "freed-stock", "hops-stock"):
        report = tinker_rl_data.cookbook.install(gc=False, coalesce=variant == "coalesced")
        installed = {title for title, _ in report.installed}
        assert {piece.title for piece in transport.PIECES} <= installed, report
        coalescing = any(title == coalesce.PIECES[0].title for title, _ in report.installed)
    prompt = types.ModelInput.from_ints(list(range(1, 40)))
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    result: dict = {"variant": variant, "coalescing": variant != "stock" and coalescing}
    faults = {"cancel": "seed=1,rate=1,kinds=slow,slow=30", "cancel-polling": "seed=1,rate=1,kinds=try_again"}.get(variant)
    Path(record).mkdir(parents=True, exist_ok=True)
    wire = Path(record) / "wire.jsonl"
    started = time.monotonic()
    with FakeTinker(record=record, capture=wire, faults=faults, latency=latency) as fake:
        service = tinker.ServiceClient(base_url=fake.base_url)
        sampler = service.create_sampling_client(base_model="fake/model")
        sampler = sampler.result() if hasattr(sampler, "result") else sampler  # 0.38: a future of it
        if variant.startswith("cancel"):
            result.update(cancel(sampler, prompt, params))
        elif variant.startswith("freed"):
            result.update(freed(sampler, prompt, params))
        elif variant.startswith("hops"):
            result.update(hops(sampler, prompt, params))
        elif variant == "coalesced":

            async def group():
                return await asyncio.gather(*(sampler.sample_async(prompt, 1, params) for _ in range(8)))

            asyncio.run(group())
            result["merged"] = coalesce.counts()["merged_requests"]
        else:
            results = [sampler.sample(prompt, 1, params).result() for _ in range(2)]
            results.append(sampler.compute_logprobs(prompt).result())
            trainer = service.create_lora_training_client(base_model="fake/model", rank=8)
            datum = types.Datum(
                model_input=types.ModelInput.from_ints([1, 2, 3]),
                loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4], dtype="int64", shape=[3])},
            )
            results.append(trainer.forward_backward([datum], "cross_entropy").result())
            results.append(trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result())

            async def four_at_once():
                return await asyncio.gather(*(sampler.sample_async(prompt, 1, params) for _ in range(4)))

            if gather:
                t0 = time.monotonic()
                results.extend(asyncio.run(four_at_once()))
                result["gathered_s"] = time.monotonic() - t0
            result["elapsed_s"] = time.monotonic() - started
            result["results"] = json.loads(json.dumps(results, default=repr))
        result["lean"] = transport._sent[0]
    result["requests"] = fake.requests
    if not variant.startswith(("cancel", "freed", "hops")):
        result["wire"] = [{**r, "body": r["body"].hex()} for r in read_capture(wire)]
    Path(out).write_text(json.dumps(result))


def cancel(sampler, prompt, params) -> dict:
    holder = sampler.holder
    loop = holder.get_loop()

    def tasks() -> int:
        return asyncio.run_coroutine_threadsafe(_count_tasks(), loop).result(10)

    before = {"tasks_before": tasks(), "threads_before": threads()}

    async def callers():
        calls = [asyncio.ensure_future(sampler.sample_async(prompt, 1, params)) for _ in range(20)]
        await asyncio.sleep(1.0)
        for call in calls:
            call.cancel()
        done = await asyncio.gather(*calls, return_exceptions=True)
        return sum(isinstance(d, asyncio.CancelledError) for d in done)

    cancelled = asyncio.run(callers())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and tasks() > before["tasks_before"]:
        time.sleep(0.1)
    return {
        **before,
        "cancelled": cancelled,
        "tasks_after": tasks(),
        "threads_after": threads(),
    }


def freed(sampler, prompt, params) -> dict:
    refs = []

    async def call():
        future = sampler.sample(prompt, 1, params)
        refs.extend([weakref.ref(future), weakref.ref(future.future())])
        return (await future).sequences[0].tokens

    async def calls():
        return await asyncio.gather(*(call() for _ in range(16)))

    gc.collect()
    gc.disable()
    try:
        done = asyncio.run(calls())
        time.sleep(0.2)  # tinker's loop thread finishes running the futures' callbacks
        alive = sum(ref() is not None for ref in refs)
    finally:
        gc.enable()
    return {"calls": len(done), "alive": alive}


def hops(sampler, prompt, params) -> dict:
    """The wakes of tinker's loop (its call_soon_threadsafe calls) over 16
    awaited sample calls, after 16 more as a warm-up."""
    loop = sampler.holder.get_loop()
    original, counted = loop.call_soon_threadsafe, itertools.count()

    def counting(*args, **kwargs):
        next(counted)
        return original(*args, **kwargs)

    async def calls():
        return await asyncio.gather(*(sampler.sample(prompt, 1, params) for _ in range(16)))

    asyncio.run(calls())
    loop.call_soon_threadsafe = counting
    try:
        done = asyncio.run(calls())
    finally:
        del loop.call_soon_threadsafe
    return {"calls": len(done), "hops": next(counted), "tokens": sorted(r.sequences[0].tokens for r in done)}


def threads() -> int:
    """Threads but the loop's default executor's (tinker's asyncify: a
    pool of idle threads, stock's as ours)."""
    return sum(not t.name.startswith("asyncio_") for t in threading.enumerate())


async def _count_tasks() -> int:
    return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])


if __name__ == "__main__":
    child(*sys.argv[1:4])
