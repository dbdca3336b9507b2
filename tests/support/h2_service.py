"""The fake tinker service over HTTPS and HTTP/2, as the real service is
reached: a TLS server on 127.0.0.1 in a thread of the test's process,
HTTP/2 negotiated by ALPN (the `h2` package, which tinker's own httpx
dependency brings), HTTP/1.1 for a client that offers nothing else. Its
answers are the fake service's (:class:`fake_tinker.Service`, the same
handlers the trainer tests run against); each request is recorded as it
arrives (:attr:`H2Service.requests`: method, path, HTTP version, headers in
order, body as sent).

The certificate is self-signed, for IP 127.0.0.1, made here by the
`openssl` command line tool (present wherever OpenSSL is; neither `trustme`
nor `cryptography` is installed with tinker). A client trusts it through
``SSL_CERT_FILE`` = :attr:`H2Service.cert_file` ,
which both of tinker's transports read when they are made: httpx's default
SSL context and pyqwest's ``tls_include_system_certs=True`` (rustls'
native roots).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from .fake_tinker import HttpProtocol, Service, hold


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    version: str  # "HTTP/2" or "HTTP/1.1"
    headers: list[tuple[str, str]]  # as received, in order (HTTP/2: its pseudo-headers first)
    body: bytes  # as sent (before any content-encoding is undone)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key): a self-signed certificate for 127.0.0.1, PEM
    files in `directory`. Not a CA's (CA:FALSE): rustls, pyqwest's TLS,
    refuses a CA certificate as the server's own (CaUsedAsEndEntity)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the `openssl` command is needed to make the test's certificate")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "server.key", "-out", "server.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-addext", "basicConstraints=critical,CA:FALSE",
         "-addext", "extendedKeyUsage=serverAuth"],
        cwd=directory, check=True, capture_output=True,
    )
    return directory / "server.pem", directory / "server.key"


class H2Connection(asyncio.Protocol):
    """One TLS connection: HTTP/2 when ALPN chose it, else the fake
    service's own HTTP/1.1 protocol."""

    def __init__(self, service: Service, live: set[H2Connection]) -> None:
        self.service = service
        self.live = live  # the server's open connections (closed when it stops)
        self.transport: asyncio.Transport | None = None
        self.http1: HttpProtocol | None = None
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.streams: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self.outgoing: dict[int, memoryview] = {}  # answers waiting for flow-control window

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Called once the TLS handshake is done: ALPN's choice is known.
        self.transport = transport  # type: ignore[assignment]
        self.live.add(self)
        if transport.get_extra_info("ssl_object").selected_alpn_protocol() != "h2":
            self.http1 = HttpProtocol(self.service)
            self.http1.connection_made(transport)
            return
        self.conn.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self.http1 is not None:
            self.http1.data_received(data)
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            assert self.transport is not None
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.streams[event.stream_id] = (list(event.headers), bytearray())
            elif isinstance(event, h2.events.DataReceived):
                self.streams[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._answer(event.stream_id, *self.streams.pop(event.stream_id))
            elif isinstance(event, h2.events.StreamReset):
                self.streams.pop(event.stream_id, None)
                self.outgoing.pop(event.stream_id, None)
            elif isinstance(event, h2.events.WindowUpdated):
                self._send_waiting()
            elif isinstance(event, h2.events.ConnectionTerminated):
                assert self.transport is not None
                self.transport.close()
        self._flush()

    def _answer(self, stream_id: int, headers: list[tuple[str, str]], body: bytearray) -> None:
        fields = dict(headers)
        method, path = fields[":method"], fields[":path"]
        name = path.split("?", 1)[0]
        raw = bytes(body)
        if self.service.on_request is not None:
            self.service.on_request(method, path, headers, raw, "HTTP/2")
        self.service._count(name, "sender:HTTP/2")  # (over HTTP/1.1, the client that wrote it)
        if fields.get("content-encoding") == "zstd":
            import zstandard

            self.service._count(name, "compressed")
            raw = zstandard.ZstdDecompressor().decompress(raw)
        try:
            status, ctype, out, how = self.service.handle(method, path, raw)
        except Exception as exc:  # a bug here must show, not hang the client
            print(f"h2_service: {method} {path}: {exc!r}", file=sys.stderr, flush=True)
            status, ctype, out, how = 500, "application/json", json.dumps({"error": repr(exc)}).encode(), {}

        def alive() -> bool:
            """The stream still open for an answer (h2 keeps a stream the
            client reset, closed, until a new one prunes it)."""
            stream = self.conn.streams.get(stream_id)
            return stream is not None and not stream.closed and self.transport is not None and not self.transport.is_closing()

        def respond(status: int, ctype: str, out: bytes, extra: dict[str, str] | None = None) -> None:
            if not alive():
                return  # reset or closed meanwhile
            reply = [(":status", str(status)), ("content-type", ctype), *(extra or {}).items()]
            reply.append(("content-length", str(len(out))))
            try:
                self.conn.send_headers(stream_id, reply, end_stream=not out)
            except h2.exceptions.StreamClosedError:
                return
            if out:
                self.outgoing[stream_id] = memoryview(out)
                self._send_waiting()
            self._flush()

        if hold(self.service, how, method, name, raw, respond, alive):  # the latency model's long polls
            return
        if how.get("close"):  # a closed connection, or a lost answer
            assert self.transport is not None
            self.transport.close()
            return
        if how.get("delay"):
            asyncio.get_running_loop().call_later(how["delay"], respond, status, ctype, out, how.get("headers"))
        else:
            respond(status, ctype, out, how.get("headers"))

    def _send_waiting(self) -> None:
        """As much of each waiting answer as the peer's windows allow."""
        for stream_id, data in list(self.outgoing.items()):
            while data:
                size = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size, len(data))
                if size <= 0:
                    break
                self.conn.send_data(stream_id, data[:size].tobytes(), end_stream=size == len(data))
                data = data[size:]
            if data:
                self.outgoing[stream_id] = data
            else:
                del self.outgoing[stream_id]

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.live.discard(self)
        if self.http1 is not None:
            self.http1.transport = None


class H2Service:
    """The fake service over HTTPS/HTTP/2 in a thread; a context manager
    giving :attr:`base_url` (``https://127.0.0.1:PORT``), :attr:`cert_file`
    (the certificate a client must trust: ``SSL_CERT_FILE``) and :attr:`requests` (every request received, in
    order of arrival)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.requests: list[Request] = []
        self.base_url = ""
        self.cert_file = Path()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._live: set[H2Connection] = set()

    def _record(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, version: str) -> None:
        self.requests.append(Request(method, path.split("?", 1)[0], version, headers, body))

    def __enter__(self) -> H2Service:
        self._tmp = tempfile.TemporaryDirectory(prefix="h2-service-")
        self.cert_file, key = make_certificate(Path(self._tmp.name))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, key)
        context.set_alpn_protocols(["h2", "http/1.1"])
        service = Service(self.seed, None)
        service.on_request = self._record
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="h2-service", daemon=True)
        self._thread.start()
        start = self._loop.create_server(lambda: H2Connection(service, self._live), "127.0.0.1", 0, ssl=context)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(30)
        self.base_url = f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for connection in list(self._live):  # the clients' pooled connections
            if connection.transport is not None:
                connection.transport.abort()
        await asyncio.wait_for(self._server.wait_closed(), 10)

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        if self._tmp is not None:
            self._tmp.cleanup()
