"""A fake tinker service for measuring the client: every endpoint tinker
0.38's client calls during tinker-cookbook's `rl.train.main`, answered at once.

It runs in its own process (asyncio, one thread) on 127.0.0.1 only, so the
trainer's process holds the client alone. Sampling returns seeded random
tokens with logprobs: each sample's draw (and sequence id) depends only on
the request's prompt and sampling parameters and on how many samples of
that prompt came before it, so k requests of one sample and one request of
k samples (coalesced sampling) get the same draws. forward_backward parses
the protobuf body and answers one float32 logprob per target position,
each Datum's seeded by its own target tokens; with --record DIR it writes every
forward_backward body to DIR/fwdbwd-<seq_id>.pb. The server exits when its
parent process dies or after --timeout seconds.

    python bench/fake_tinker.py [--seed N] [--record DIR] [--timeout S] [--parent-pid PID]

prints `port <N>` on stdout once it listens. From Python, `FakeTinker()` is
a context manager that starts it and gives `base_url`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

VOCAB = 151_000
MODEL_ID = "fake-model-0"


class Service:
    def __init__(self, seed: int, record: Path | None) -> None:
        import numpy as np
        from tinker.proto import tinker_public_pb2 as pb

        self.np = np
        self.pb = pb
        self.seed = seed
        self.record = record
        self.futures: dict[str, tuple[str, Any]] = {}
        self.next_id = 0
        self.seen: dict[int, int] = {}  # sample content key -> requests so far
        self.base_model = "fake/model"
        self.sessions = 0
        self.counts: dict[str, int] = {}
        self.unknown: list[str] = []

    def _future(self, kind: str, payload: Any, **extra: Any) -> dict[str, Any]:
        self.next_id += 1
        rid = f"req-{self.next_id}"
        self.futures[rid] = (kind, payload)
        return {"request_id": rid, **extra}

    # Each handler returns (status, content type, body bytes).
    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        name = path.split("?", 1)[0]
        self.counts[name] = self.counts.get(name, 0) + 1
        if name == "/api/v1/forward_backward":
            return self._json(self.forward_backward(body))
        req = json.loads(body) if body else {}
        if name == "/api/v1/asample":
            return self._json(self.asample(req))
        if name == "/api/v1/retrieve_future":
            return self.retrieve(req)
        if name in ("/api/v1/client/config", "/api/v1/client/dynamic_config"):
            return self._json({})
        if name == "/api/v1/create_session":
            self.sessions += 1
            return self._json({"type": "create_session", "session_id": f"session-{self.sessions}"})
        if name == "/api/v1/session_heartbeat":
            return self._json({"type": "session_heartbeat"})
        if name == "/api/v1/telemetry":
            return self._json({"status": "accepted"})
        if name == "/api/v1/healthz":
            return self._json({"status": "ok"})
        if name == "/api/v1/get_server_capabilities":
            return self._json({"supported_models": [{"model_name": self.base_model, "trainable": True}]})
        if name == "/api/v1/create_model":
            self.base_model = req.get("base_model", self.base_model)
            return self._json(self._future("json", {"model_id": MODEL_ID, "type": "create_model"}, model_id=MODEL_ID))
        if name == "/api/v1/get_info":
            lora = req.get("lora_config") or {}
            return self._json(
                {
                    "type": "get_info",
                    "model_data": {"arch": "fake", "model_name": self.base_model, "tokenizer_id": self.base_model},
                    "model_id": MODEL_ID,
                    "is_lora": True,
                    "lora_rank": lora.get("rank", 32),
                    "model_name": self.base_model,
                }
            )
        if name == "/api/v1/optim_step":
            lr = float((req.get("adam_params") or {}).get("learning_rate", 0.0))
            return self._json(self._future("json", {"metrics": {"optim/fake_lr": lr}}, model_id=MODEL_ID))
        if name == "/api/v1/save_weights_for_sampler":
            seq = req.get("seq_id", 0)
            out: dict[str, Any] = {"type": "save_weights_for_sampler"}
            if req.get("path"):
                out["path"] = f"tinker://{MODEL_ID}/sampler_weights/{req['path']}"
            else:
                out["sampling_session_id"] = f"sampler-{seq}"
            return self._json(self._future("json", out, model_id=MODEL_ID))
        if name == "/api/v1/save_weights":
            out = {"type": "save_weights", "path": f"tinker://{MODEL_ID}/weights/{req.get('path') or req.get('seq_id')}"}
            return self._json(self._future("json", out, model_id=MODEL_ID))
        if name == "/api/v1/create_sampling_session":
            sid = f"sampler-s{req.get('sampling_session_seq_id', 0)}"
            return self._json({"type": "create_sampling_session", "sampling_session_id": sid})
        if name.startswith("/api/v1/samplers/"):
            sid = name.rsplit("/", 1)[-1]
            return self._json({"sampler_id": sid, "base_model": self.base_model})
        if name == "/api/v1/cancel_future" or (name.startswith("/api/v1/sessions/") and name.endswith("/finish")):
            return self._json({})
        self.unknown.append(f"{method} {name}")
        print(f"fake_tinker: unknown endpoint {method} {name}", file=sys.stderr, flush=True)
        return 404, "application/json", b'{"error": "unknown endpoint"}'

    @staticmethod
    def _json(obj: Any) -> tuple[int, str, bytes]:
        return 200, "application/json", json.dumps(obj).encode()

    def asample(self, req: dict[str, Any]) -> dict[str, Any]:
        tokens: list[int] = []
        for chunk in req["prompt"]["chunks"]:
            tokens.extend(chunk.get("tokens", ()))
        params = req.get("sampling_params", {})
        n = int(req.get("num_samples", 1))
        max_tokens = int(params.get("max_tokens") or 16)
        # Each sample is drawn by (prompt, parameters, how many of that
        # prompt came before): k requests of one sample and one request of
        # k samples get the same draws (coalesced sampling is comparable).
        head = f"{max_tokens}|{params.get('temperature')}|".encode()
        key = zlib.crc32(array("i", tokens).tobytes(), zlib.crc32(head))
        k = self.seen.get(key, 0)
        self.seen[key] = k + n
        ids = [f"seq-{key:08x}-{k + i}" for i in range(n)]
        scored = len(tokens) if req.get("prompt_logprobs") else 0
        return self._future("sample", (key, k, n, max_tokens, scored), sample_sequence_ids=ids)

    def sample_response(self, key: int, k: int, n: int, max_tokens: int, scored: int = 0) -> bytes:
        np, pb = self.np, self.pb
        msg = pb.SampleResponse()
        for i in range(n):
            rng = np.random.default_rng([self.seed, key, k + i])
            seq = msg.sequences.add()
            seq.stop_reason = pb.STOP_REASON_LENGTH
            seq.tokens = rng.integers(0, VOCAB, max_tokens, dtype=np.int32).tobytes()
            seq.logprobs = (-rng.exponential(1.0, max_tokens)).astype(np.float32).tobytes()
        if scored:  # a scoring call: the prompt's logprobs, none for its first token
            prompt = (-rng.exponential(1.0, scored)).astype(np.float32)
            prompt[0] = np.nan
            msg.prompt_logprobs = prompt.tobytes()
        return msg.SerializeToString()

    def forward_backward(self, body: bytes) -> dict[str, Any]:
        np, pb = self.np, self.pb
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(body)
        if self.record is not None:
            (self.record / f"fwdbwd-{msg.seq_id:06d}.pb").write_bytes(body)
        # Each Datum's logprobs are drawn by its own targets, so a batch in
        # another order gets the same per-Datum logprobs.
        lengths = []
        parts = []
        for datum in msg.data:
            target = datum.loss_fn_inputs["target_tokens"]
            lengths.append(target.shape[0] if target.shape else 0)
            rng = np.random.default_rng([self.seed, zlib.crc32(target.dense)])
            parts.append((-rng.exponential(1.0, lengths[-1])).astype(np.float32))
        logprobs = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        out = pb.ForwardBackwardOutput()
        out.loss_fn_output_type = "ArrayRecord"
        out.metrics["loss:sum"] = float(logprobs.sum(dtype=np.float64))
        record = out.loss_fn_outputs.add()
        record.num_datums = len(lengths)
        field = record.fields["logprobs"]
        field.dtype = pb.DTYPE_FLOAT32
        field.data = logprobs.tobytes()
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64) * 4, out=offsets[1:])
        field.offsets = offsets.tobytes()
        return self._future("proto", out.SerializeToString(), model_id=MODEL_ID)

    def retrieve(self, req: dict[str, Any]) -> tuple[int, str, bytes]:
        entry = self.futures.pop(req["request_id"], None)
        if entry is None:
            return 410, "application/json", b'{"error": "no such future"}'
        kind, payload = entry
        if kind == "sample":
            return 200, "application/x-protobuf", self.sample_response(*payload)
        if kind == "proto":
            return 200, "application/x-protobuf", payload
        return self._json(payload)


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies (what httpx and
    pyqwest send)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body, used = self._chunked(end + 4)
                if body is None:
                    return
            else:
                length = int(headers.get("content-length", "0"))
                if len(self.buf) < end + 4 + length:
                    return
                body = bytes(self.buf[end + 4 : end + 4 + length])
                used = end + 4 + length
            del self.buf[:used]
            method, path, _ = head[0].split(" ", 2)
            if headers.get("content-encoding") == "zstd":
                import zstandard

                body = zstandard.ZstdDecompressor().decompress(body)
            try:
                status, ctype, out = self.service.handle(method, path, body)
            except Exception as exc:  # a bug here must show, not hang the client
                print(f"fake_tinker: {method} {path}: {exc!r}", file=sys.stderr, flush=True)
                status, ctype, out = 500, "application/json", json.dumps({"error": repr(exc)}).encode()
            reason = {200: "OK", 404: "Not Found", 410: "Gone", 500: "Internal Server Error"}[status]
            assert self.transport is not None
            self.transport.write(
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n"
                f"content-length: {len(out)}\r\n\r\n".encode()
                + out
            )

    def _chunked(self, start: int) -> tuple[bytes | None, int]:
        body = bytearray()
        pos = start
        while True:
            nl = self.buf.find(b"\r\n", pos)
            if nl < 0:
                return None, 0
            size = int(bytes(self.buf[pos:nl]).split(b";")[0], 16)
            if len(self.buf) < nl + 2 + size + 2:
                return None, 0
            body += self.buf[nl + 2 : nl + 2 + size]
            pos = nl + 2 + size + 2
            if size == 0:
                return bytes(body), pos


async def serve(args: argparse.Namespace) -> None:
    record = Path(args.record) if args.record else None
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
    service = Service(args.seed, record)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpProtocol(service), "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        if args.parent_pid and os.getppid() != args.parent_pid:
            break
    server.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", default=None, help="write forward_backward bodies here")
    p.add_argument("--timeout", type=float, default=3600.0, help="exit after this many seconds")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is no longer the parent")
    asyncio.run(serve(p.parse_args()))


class FakeTinker:
    """Starts the fake service in a child process; `base_url` once entered."""

    def __init__(self, seed: int = 0, record: Path | str | None = None, timeout: float = 3600.0) -> None:
        self.seed, self.record, self.timeout = seed, record, timeout
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.cpu_s = 0.0  # the service's CPU time, read when it stops

    def __enter__(self) -> FakeTinker:
        cmd = [sys.executable, __file__, "--seed", str(self.seed), "--timeout", str(self.timeout)]
        cmd += ["--parent-pid", str(os.getpid())]
        if self.record is not None:
            cmd += ["--record", str(self.record)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.proc.kill()
            raise RuntimeError(f"fake tinker did not start: {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            try:
                fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    main()
