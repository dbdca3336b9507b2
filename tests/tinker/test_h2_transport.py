"""tinker's own client sampling over HTTPS and HTTP/2, as it reaches the
real service: the fake service behind TLS with a certificate made by the
test, HTTP/2 chosen by ALPN (tests/support/h2_service.py), trusted through
``SSL_CERT_FILE``. Every request tinker's client makes (session set-up by
httpx's transport, the sample path by pyqwest's) arrives as HTTP/2, and
the sample path's requests on the wire are the ones tinker's client handed
its transport.

The hook for a patched client: the ``sample_over_h2`` fixture runs
concurrent cookbook-style sample calls against a fresh service and returns
what arrived (:class:`SampleRun`); :func:`comparable` is what two runs'
requests are compared by (a patch must send what stock tinker sends).
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from support.h2_service import H2Service, Request

try:
    import tinker
    from pyqwest.httpx import AsyncPyqwestTransport
    from pyqwest.httpx._transport import convert_headers
    from tinker import types
except ImportError as exc:  # pragma: no cover - tinker is a test dependency here
    pytest.skip(f"tinker with pyqwest is needed: {exc}", allow_module_level=True)

if shutil.which("openssl") is None:
    pytest.skip("the `openssl` command makes the test's certificate", allow_module_level=True)

MODEL = "fake/model"
SAMPLE_PATHS = ("/api/v1/asample", "/api/v1/retrieve_future")
# Random or measured per request, or each run's own port: compared by name only.
VOLATILE = {"x-idempotency-key", "x-tinker-create-promise-roundtrip-time", ":authority", "host"}
PROMPTS = [[11, 12, 13, 14 + i, 15 * i] for i in range(6)]
MAX_TOKENS = 8


@dataclass
class SampleRun:
    """One run's results and what the service received, in order of
    arrival; `handed`: what tinker's httpx layer handed pyqwest's adapter
    for the sample paths (path, headers, body)."""

    results: list[Any]
    wire: list[Request]
    handed: list[tuple[str, list[tuple[str, str]], bytes]] = field(default_factory=list)

    def sample_requests(self) -> list[Request]:
        return [r for r in self.wire if r.path in SAMPLE_PATHS]


def comparable(requests: list[Request]) -> Counter:
    """The sample paths' requests as a multiset of (method, path, HTTP
    version, headers in order, body), the volatile headers' values masked:
    two clients that send the same requests compare equal whatever the
    order they arrive in."""
    return Counter(
        (r.method, r.path, r.version, tuple((k, "*" if k in VOLATILE else v) for k, v in r.headers), r.body)
        for r in requests
        if r.path in SAMPLE_PATHS
    )


@contextmanager
def tinkers_leak_ignored() -> Iterator[None]:
    """tinker 0.38's startup config fetch makes a one-off httpx pool it
    never closes (InternalClientHolder._fetch_client_config): its
    connection is collected unclosed whenever the collector runs, a stock
    leak, not the harness's. Its ResourceWarning is ignored while the
    client lives, and it is collected before leaving."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed", ResourceWarning)
        yield
        gc.collect()


@pytest.fixture
def sample_over_h2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., SampleRun]]:
    """`run(prompts=PROMPTS)`: a fresh service over HTTPS/HTTP/2 and a fresh
    tinker ServiceClient / SamplingClient trusting it, one
    `await sampling_client.sample(...)` per prompt, concurrently, as
    tinker-cookbook's TinkerTokenCompleter makes it. Install a patch
    before calling it to run the patched client; call it twice to compare
    (`comparable(a.wire) == comparable(b.wire)`)."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-fake-test-key")  # the fake service takes any key
    handed: list[tuple[str, list[tuple[str, str]], bytes]] = []
    original = AsyncPyqwestTransport.handle_async_request

    async def handle_async_request(transport: Any, request: Any) -> Any:
        if request.url.path in SAMPLE_PATHS:
            handed.append((request.url.path, list(convert_headers(request).items()), request.content))
        return await original(transport, request)

    monkeypatch.setattr(AsyncPyqwestTransport, "handle_async_request", handle_async_request)

    def run(prompts: list[list[int]] = PROMPTS) -> SampleRun:
        handed.clear()
        params = types.SamplingParams(stop=[151645], max_tokens=MAX_TOKENS, temperature=1.0)
        with H2Service() as service, tinkers_leak_ignored():
            # Read when tinker's transports are made: httpx's SSL context, pyqwest's rustls roots.
            monkeypatch.setenv("SSL_CERT_FILE", str(service.cert_file))
            with tinker.ServiceClient(base_url=service.base_url) as client:
                sampling_client = client.create_sampling_client(base_model=MODEL).result()

                async def call(tokens: list[int]) -> Any:
                    prompt = types.ModelInput.from_ints(tokens)
                    return await sampling_client.sample(prompt=prompt, num_samples=1, sampling_params=params)

                async def main() -> list[Any]:
                    return await asyncio.gather(*(call(t) for t in prompts))

                results = asyncio.run(main())
            return SampleRun(results, list(service.requests), list(handed))

    yield run


def test_tinker_samples_over_http2(sample_over_h2):
    run = sample_over_h2()

    assert [len(r.sequences) for r in run.results] == [1] * len(PROMPTS)
    assert all(len(r.sequences[0].tokens) == MAX_TOKENS for r in run.results)
    # Every request, the session's (httpx's transport) and the samples'
    # (pyqwest's), negotiated HTTP/2 over TLS.
    assert {r.version for r in run.wire} == {"HTTP/2"}
    assert {dict(r.headers)[":scheme"] for r in run.wire} == {"https"}
    paths = Counter(r.path for r in run.wire)
    assert paths["/api/v1/asample"] == paths["/api/v1/retrieve_future"] == len(PROMPTS)

    # On the wire: what tinker handed its transport, header for header
    # (after HTTP/2's pseudo-headers), body for body.
    wire = sorted((r.path, [h for h in r.headers if not h[0].startswith(":")], r.body) for r in run.sample_requests())
    assert wire == sorted(run.handed)
    asample = [r for r in run.sample_requests() if r.path == "/api/v1/asample"]
    assert all(("x-tinker-sampling-backpressure", "1") in r.headers for r in asample)
    retrieve = [r for r in run.sample_requests() if r.path == "/api/v1/retrieve_future"]
    assert all(("accept", "application/x-protobuf") in r.headers for r in retrieve)


def test_two_stock_runs_compare_equal(sample_over_h2):
    # The hook's comparison: stock against stock is equal (a patched run
    # is held to the same), and it sees a changed request.
    first, second = sample_over_h2(), sample_over_h2()
    assert comparable(first.wire) == comparable(second.wire)
    changed = sample_over_h2(prompts=[*PROMPTS[:-1], [*PROMPTS[-1], 1]])
    assert comparable(changed.wire) != comparable(first.wire)


def test_lean_requests_equal_tinkers_over_http2(sample_over_h2, monkeypatch):
    # tinker_rl_data's transport feature sends the sample path's requests
    # itself, over the same pyqwest transport: on the wire over TLS and
    # HTTP/2 they are stock's.
    from tinker._base_client import AsyncAPIClient

    from tinker_rl_data.tinker import transport

    stock = sample_over_h2()
    monkeypatch.setattr(AsyncAPIClient, "post", transport.make_post(AsyncAPIClient.post))
    sent = transport._sent[0]
    ours = sample_over_h2()
    assert transport._sent[0] - sent == 2 * len(PROMPTS) and not ours.handed  # none through the adapter
    assert {r.version for r in ours.wire} == {"HTTP/2"}
    assert comparable(ours.wire) == comparable(stock.wire)
    assert [r.sequences[0].tokens for r in ours.results] == [r.sequences[0].tokens for r in stock.results]
