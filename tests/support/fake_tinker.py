"""A fake tinker service for measuring the client: every endpoint tinker
0.38's client calls during tinker-cookbook's `rl.train.main`, answered at once
(or, with --latency, after the time a service takes).

It runs in its own process (asyncio, one thread) on 127.0.0.1 only, so the
trainer's process holds the client alone. Sampling returns seeded random
tokens with logprobs: each sample's draw (and sequence id) depends only on
the request's prompt and sampling parameters and on how many samples of
that prompt came before it, so k requests of one sample and one request of
k samples (coalesced sampling) get the same draws (with faults, the draws of
a sample future that never answers, 410 or failed, go to the next samples
of its prompt: a resubmission draws what the lost request would have). forward_backward parses
the protobuf body and answers one float32 logprob per target position,
each Datum's seeded by its own target tokens; with --record DIR it writes every
forward_backward body to DIR/fwdbwd-<seq_id>.pb, and when it stops, the
requests it received, retried and answered per path to DIR/requests.json
(`Service.tally`). The server exits when its parent process dies, on
SIGTERM or after --timeout seconds. With --capture FILE (`FakeTinker(capture=...)`)
it appends each request as received (method, path, HTTP version, headers,
body) to FILE, read back by `read_capture`.

With --latency SPEC (opt-in; `FakeTinker(latency=SPEC)`), the service takes
time (`Latency`): a sample's result is ready base + per-token seconds after a
sampler slot starts it (N slots, the rest queued in arrival order),
forward_backward and optim_step take their times one after another, and a
poll of a future not yet ready is held (a long poll) until it is or until
`hold` seconds, then answered try_again, as tinker's client expects.

With --client-config JSON (opt-in; `FakeTinker(client_config={...})`), the
service answers `/api/v1/client/config` with those of tinker's
`ClientConfigResponse` flags (any of its fields; an unknown name is refused)
and serves what they make tinker's client send: with
`sample_use_retrieve_futures`, `/api/v1/retrieve_futures`, one long poll per
sampling session and clone with cursors and acknowledged ids, each sample
future reported there once ready (its payload then fetched by one
`retrieve_future`, as tinker's `_APIFuture` does); with
`proto_compress_fwdbwd`, zstd forward_backward bodies (`Content-Encoding:
zstd`, decompressed and recorded as the plain body); with
`sample_join_sampling_session`, `/api/v1/join_sampling_session`; with
`use_pyqwest_transport: false`, httpx's own transport (HTTP/1.1 here: httpx
speaks HTTP/2 only over TLS). requests.json counts, per path, the bodies
received compressed (`compressed`) and which client sent the requests
(`senders`: `httpx`, whose h11 writes header names as given and Host first,
or `pyqwest`, whose hyper writes them lowercase); with
`sample_use_retrieve_futures`, the ids the polls acknowledged
(retrieve_futures' `acknowledged`) and the retrieve_future requests for
sample futures after their session's poll reported them (`sample_fetches`)
and before (`sample_polls`).

With --faults SPEC (opt-in; `FakeTinker(faults=SPEC)`), a seeded schedule
of faults (`Faults`): HTTP 500/503, 429 with Retry-After, 408, an empty-body
400, a closed connection, a lost response (done, then the connection
closed unanswered), a slow answer, `try_again` and `complete_metadata`
polls, 410 on a sample future, and, only where asked, non-retryable 400s
and failed futures. Whether a request is faulted depends only on the seed,
its path, what it asks for and how many times that was asked before, not
on arrival order or timing: two runs sending the same requests see the
same faults. The paths the client flags add (`/api/v1/retrieve_futures`,
`/api/v1/join_sampling_session`) are counted, never faulted: a long poll's
cursor depends on timing, so a schedule keyed by it would not repeat.

    python tests/support/fake_tinker.py [--seed N] [--record DIR] [--faults SPEC] [--latency SPEC] [--timeout S]
                                        [--parent-pid PID] [--capture FILE] [--client-config JSON]

prints `port <N>` on stdout once it listens. From Python, `FakeTinker()` is
a context manager that starts it and gives `base_url`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any, Callable

VOCAB = 151_000
MODEL_ID = "fake-model-0"


# Paths the schedule faults and the kinds each may get. 410 and
# complete_metadata only where tinker's client handles them (a sample's
# future; a poll that allows a metadata-only answer), else try_again.
FAULT_PATHS = {
    "/api/v1/asample": ("500", "503", "429", "408", "closed", "lost", "slow"),
    "/api/v1/retrieve_future": (
        "500", "503", "429", "408", "empty400", "try_again", "complete_metadata", "410", "closed", "lost", "slow",
    ),
    "/api/v1/forward_backward": ("500", "503", "429", "408", "closed", "lost", "slow"),
    "/api/v1/optim_step": ("500", "503", "429", "408", "closed", "lost", "slow"),
}


class Faults:
    """A seeded fault schedule. SPEC is `SEED` or comma-separated
    `key=value`s:

      seed=N      the schedule's seed (default 0)
      rate=R      each request on a FAULT_PATHS path is answered with one of
                  its retryable faults with probability R (default 0.05)
      kinds=A+B   only these kinds (default: all of the path's)
      bad=R       an asample is answered 400 with a body (tinker raises
                  BadRequestError, no retry) with probability R, per attempt
      reject=R    a prompt (with its sampling parameters) is rejected: every
                  asample of it answered 400 with a body, with probability R
      failed=R    a sample's future answers {"error", "category": "server"}
                  (tinker raises RequestFailedError) with probability R
      slow=S      a slow answer waits S seconds (default 0.2)

    A request's draws are hashes of (seed, path, key, attempt) for each of
    its keys: what it asks for (an asample's prompt and parameters with the
    index of each sample it asks for; a forward_backward's or optim_step's
    seq_id; a poll's, its future's keys) and how many requests with that
    key came before on that path, so the schedule does not depend on
    arrival order; a request of k samples meets the faults of its k
    samples' requests alone (the first one drawn).
    """

    def __init__(self, spec: str) -> None:
        opts = {"seed": spec} if spec.strip().lstrip("-").isdigit() else dict(
            item.split("=", 1) for item in spec.split(",") if item
        )
        unknown = set(opts) - {"seed", "rate", "kinds", "bad", "reject", "failed", "slow"}
        if unknown:
            raise ValueError(f"unknown fault options {sorted(unknown)} in {spec!r}")
        self.seed = int(opts.get("seed", 0))
        self.rate = float(opts.get("rate", 0.05))
        self.kinds = set(opts["kinds"].split("+")) if "kinds" in opts else None
        self.bad = float(opts.get("bad", 0.0))
        self.reject = float(opts.get("reject", 0.0))
        self.failed = float(opts.get("failed", 0.0))
        self.slow = float(opts.get("slow", 0.2))
        self.attempts: dict[tuple[str, str], int] = {}

    def draw(self, *parts: object) -> float:
        digest = hashlib.blake2b("|".join(map(str, (self.seed, *parts))).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64

    def attempt(self, path: str, key: str) -> int:
        n = self.attempts.get((path, key), 0)
        self.attempts[(path, key)] = n + 1
        return n

    def pick(self, path: str, key: str, attempt: int) -> str | None:
        """The retryable fault for this request, if any."""
        kinds = [k for k in FAULT_PATHS.get(path, ()) if self.kinds is None or k in self.kinds]
        if not kinds or self.draw("fault", path, key, attempt) >= self.rate:
            return None
        return kinds[int(self.draw("kind", path, key, attempt) * len(kinds))]


class Latency:
    """A service that takes time. SPEC is comma-separated `key=value`s:

      base=S     a sample sequence's time before its first token (default 0.5)
      token=S    and per token of its max_tokens (default 0.004)
      slots=N    sequences sampled at once (default 512): a request of k
                 samples is k sequences, each started when a slot frees, in
                 arrival order (FIFO); its result is ready when its last
                 sequence ends
      fb=S       a forward_backward's time (default 0.05), plus
      fb_token=S per target token of its Datums (default 2e-6)
      optim=S    an optim_step's time (default 0.05); training requests run
                 one at a time, in arrival order (one model)
      hold=S     a retrieve_future of a future not yet ready is held (a long
                 poll) until it is, or S seconds (default 10), then answered
                 try_again (queue_state active): tinker's client polls again;
                 a retrieve_futures poll with nothing new, until a sample of
                 its session is ready or S seconds, then answered empty
      held=N     at most N polls held at once (default 4096: each is an open
                 connection); a poll past it is answered try_again at once

    What it measured is in requests.json's "latency" (`Service.latency_json`):
    the sampler's busy slot-seconds and its span (first sample request to
    last sequence's end), slot-seconds free with nothing queued and seconds
    with no sequence at all (the service waiting for the client), and how
    long after a result was ready the poll that took it was answered.
    """

    def __init__(self, spec: str) -> None:
        opts = dict(item.split("=", 1) for item in spec.split(",") if item and item != "on")
        unknown = set(opts) - {"base", "token", "slots", "fb", "fb_token", "optim", "hold", "held"}
        if unknown:
            raise ValueError(f"unknown latency options {sorted(unknown)} in {spec!r}")
        self.base = float(opts.get("base", 0.5))
        self.token = float(opts.get("token", 0.004))
        self.slots = int(opts.get("slots", 512))
        self.fb = float(opts.get("fb", 0.05))
        self.fb_token = float(opts.get("fb_token", 2e-6))
        self.optim = float(opts.get("optim", 0.05))
        self.hold = float(opts.get("hold", 10.0))
        self.held = int(opts.get("held", 4096))


class Timeline:
    """The latency model's state in the service: the sampler's slots and
    FIFO queue, the training lane, which futures are not ready yet and the
    polls held for them."""

    def __init__(self, latency: Latency) -> None:
        from collections import deque

        self.latency = latency
        self.queue: deque[list[Any]] = deque()  # [request id, sequences not started, seconds each]
        self.running = 0
        self.left: dict[str, int] = {}  # sample future -> sequences not finished
        self.pending: set[str] = set()  # futures not ready
        self.ready_at: dict[str, float] = {}  # sample future -> when it became ready
        self.waiters: dict[str, list[Callable[[], None]]] = {}  # future -> held polls
        self.on_ready: Callable[[str], None] | None = None  # told each future once ready
        self.held = 0
        self.train_free = 0.0
        # measured
        self.train_s = 0.0  # the training lane's seconds (forward_backward, optim_step)
        self.first = self.last = None  # type: float | None
        self.busy = 0.0  # slot-seconds sampling
        self.starved = 0.0  # slot-seconds free with nothing queued
        self.idle = 0.0  # seconds with no sequence running and none queued
        self.changed = 0.0
        self.fetch_delays: list[float] = []
        self.try_agains = 0

    def _account(self, now: float) -> None:
        if self.first is not None:
            dt = now - self.changed
            self.busy += self.running * dt
            if not self.queue:
                self.starved += (self.latency.slots - self.running) * dt
                if not self.running:
                    self.idle += dt
        self.changed = now

    def sample(self, rid: str, n: int, max_tokens: int) -> None:
        now = time.monotonic()
        self._account(now)
        if self.first is None:
            self.first = self.changed = now
        self.pending.add(rid)
        self.left[rid] = n
        self.queue.append([rid, n, self.latency.base + self.latency.token * max_tokens])
        self._start(now)

    def _start(self, now: float) -> None:
        loop = asyncio.get_running_loop()
        while self.queue and self.running < self.latency.slots:
            entry = self.queue[0]
            take = min(entry[1], self.latency.slots - self.running)
            entry[1] -= take
            self.running += take
            loop.call_later(entry[2], self._finish, entry[0], take)
            if entry[1] == 0:
                self.queue.popleft()

    def _finish(self, rid: str, n: int) -> None:
        now = time.monotonic()
        self._account(now)
        self.running -= n
        self.last = now
        self.left[rid] -= n
        if self.left[rid] == 0:
            del self.left[rid]
            self.ready_at[rid] = now
            self._ready(rid)
        self._start(now)

    def train(self, rid: str, seconds: float) -> None:
        now = time.monotonic()
        self.train_s += seconds
        self.train_free = max(now, self.train_free) + seconds
        self.pending.add(rid)
        asyncio.get_running_loop().call_later(self.train_free - now, self._ready, rid)

    def _ready(self, rid: str) -> None:
        self.pending.discard(rid)
        if self.on_ready is not None:
            self.on_ready(rid)
        for answer in self.waiters.pop(rid, ()):
            answer()

    def fetched(self, rid: str) -> None:
        ready = self.ready_at.pop(rid, None)
        if ready is not None:
            self.fetch_delays.append(time.monotonic() - ready)

    def json(self) -> dict[str, Any]:
        delays = sorted(self.fetch_delays)
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        return {
            "spec": vars(self.latency),
            "sampler_span_s": span,
            "busy_slot_s": self.busy,
            "train_s": self.train_s,
            "starved_slot_s": self.starved,
            "idle_s": self.idle,
            "fetched": len(delays),
            "fetch_delay_mean_s": sum(delays) / len(delays) if delays else None,
            "fetch_delay_p50_s": delays[len(delays) // 2] if delays else None,
            "fetch_delay_max_s": delays[-1] if delays else None,
            "try_again": self.try_agains,
        }


def _load_pb2() -> Any:
    """tinker's protobuf messages, without importing the `tinker` package
    (seconds of CPU per service started)."""
    import importlib.util

    spec = importlib.util.find_spec("tinker")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "proto" / "tinker_public_pb2.py"
    module_spec = importlib.util.spec_from_file_location("tinker.proto.tinker_public_pb2", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def client_config_flags() -> set[str]:
    """The field names of tinker's `ClientConfigResponse`, read from its
    source (importing `tinker` costs seconds of CPU per service started)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("tinker")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "types" / "client_config_response.py"
    tree = ast.parse(path.read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ClientConfigResponse")
    return {n.target.id for n in model.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


class Completions:
    """One sampling session's (and clone's) completions as
    `/api/v1/retrieve_futures` serves them: each sample future, once ready,
    is an event numbered by the next cursor; a poll trims the events at or
    before its `prev_cursor` (seen) and gets the rest and the last cursor.
    A poll with nothing new waits in `waiters` (a long poll)."""

    def __init__(self) -> None:
        from collections import deque

        self.events: deque[tuple[int, dict[str, Any]]] = deque()
        self.cursor = 0
        self.waiters: list[Callable[[], None]] = []

    def add(self, completion: dict[str, Any]) -> None:
        self.cursor += 1
        self.events.append((self.cursor, completion))
        waiters, self.waiters = self.waiters, []
        for answer in waiters:
            answer()

    def after(self, prev_cursor: int) -> list[dict[str, Any]]:
        while self.events and self.events[0][0] <= prev_cursor:
            self.events.popleft()
        return [completion for _, completion in self.events]


class Service:
    def __init__(
        self, seed: int, record: Path | None, faults: Faults | None = None, latency: Latency | None = None,
        client_config: dict[str, Any] | None = None,
    ) -> None:
        import numpy as np

        if faults is not None and latency is not None:
            raise ValueError("faults and a latency model are not combined")
        self.timeline = Timeline(latency) if latency is not None else None
        # The flags /api/v1/client/config answers (tinker's defaults for the rest).
        self.client_config = dict(client_config or {})
        unknown = set(self.client_config) - client_config_flags()
        if unknown:
            raise ValueError(f"not flags of tinker's ClientConfigResponse: {sorted(unknown)}")
        # sample_use_retrieve_futures: each sample future is reported to its
        # session's long poll once ready (rid -> (session, clone), payload size).
        self.report_samples = bool(self.client_config.get("sample_use_retrieve_futures"))
        self.completions: dict[tuple[str, int], Completions] = {}
        self.to_report: dict[str, tuple[tuple[str, int], int]] = {}
        self.joined: dict[str, int] = {}  # sampling session -> clients joined
        self.reported: set[str] = set()  # sample futures a session's poll was answered with
        if self.timeline is not None:
            self.timeline.on_ready = self._report

        self.np = np
        self.pb = _load_pb2()
        self.seed = seed
        self.record = record
        self.futures: dict[str, tuple[str, Any]] = {}
        self.next_id = 0
        self.seen: dict[int, int] = {}  # sample content key -> samples drawn so far
        self.freed: dict[int, list[int]] = {}  # sample content key -> draws given back (410, failed)
        self.base_model = "fake/model"
        self.sessions = 0
        self.unknown: list[str] = []
        self.faults = faults
        # Per path: requests received, of them retried (one already received
        # with the same seq_id / future id), answered (a 200 sent), faults
        # by kind; samples: sequences sent in sample results.
        self.tally: dict[str, dict[str, Any]] = {}
        self.identities: set[tuple[str, Any]] = set()
        self.done: dict[tuple[str, Any], dict[str, Any]] = {}  # answers already made (a lost one resent)
        self.fault_keys: dict[str, list[str]] = {}  # future id -> its keys in the schedule
        self.path_futures: dict[str, int] = {}
        self.current = ""
        self.samples = 0
        # Called with each request as it arrives: (method, path, headers as
        # received, in order, body, HTTP version); --capture writes them.
        self.on_request: Callable[[str, str, list[tuple[str, str]], bytes, str], None] | None = None

    def _count(self, path: str, what: str, n: int = 1) -> None:
        entry = self.tally.setdefault(path, {"received": 0, "retried": 0, "answered": 0, "faults": {}})
        if what in ("received", "retried", "answered"):
            entry[what] += n
        elif what in ("compressed", "acknowledged", "sample_fetches", "sample_polls", "held"):  # see the callers
            entry[what] = entry.get(what, 0) + n
        elif what.startswith("sender:"):  # which client sent it (HttpProtocol.sender)
            senders = entry.setdefault("senders", {})
            senders[what[7:]] = senders.get(what[7:], 0) + n
        else:
            entry["faults"][what] = entry["faults"].get(what, 0) + n

    def tally_json(self) -> dict[str, Any]:
        """What `requests.json` holds: per path, requests received, retried,
        answered and faulted by kind; sequences sampled; the schedule."""
        faults = None if self.faults is None else {k: v for k, v in vars(self.faults).items() if k != "attempts"}
        if faults is not None and faults["kinds"] is not None:
            faults["kinds"] = sorted(faults["kinds"])
        latency = self.timeline.json() if self.timeline is not None else None
        return {"paths": self.tally, "samples": self.samples, "faults": faults, "latency": latency}

    def _future(self, kind: str, payload: Any, fault_key: list[str] | None = None, **extra: Any) -> dict[str, Any]:
        self.next_id += 1
        rid = f"req-{self.next_id}"
        self.futures[rid] = (kind, payload)
        if self.faults is not None:
            if fault_key is None:  # keyed by its path and how many futures that path made before
                n = self.path_futures[self.current] = self.path_futures.get(self.current, 0) + 1
                fault_key = [f"{self.current}#{n}"]
            self.fault_keys[rid] = fault_key
        return {"request_id": rid, **extra}

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes, dict[str, Any]]:
        """(status, content type, body, how): `how` may ask to close the
        connection unanswered (`close`), answer late (`delay`) or add
        headers (`headers`)."""
        name = path.split("?", 1)[0]
        self._count(name, "received")
        if self.report_samples and name == "/api/v1/retrieve_future":
            # A sample future's payload fetched after its session's poll
            # reported it, or polled for before (tinker polling it itself).
            rid = json.loads(body).get("request_id")
            if rid in self.reported:
                self._count(name, "sample_fetches")
            elif self.futures.get(rid, ("",))[0] == "sample":
                self._count(name, "sample_polls")
        timeline = self.timeline
        if timeline is not None and name == "/api/v1/retrieve_future":
            rid = json.loads(body).get("request_id")
            if rid in timeline.pending:
                if timeline.held >= timeline.latency.held:
                    timeline.try_agains += 1
                    return (*self._json({"type": "try_again", "request_id": rid, "queue_state": "active"}), {})
                return 0, "", b"", {"hold": rid}
        if name == "/api/v1/retrieve_futures":
            return self.retrieve_futures(body)
        if self.faults is not None and name in FAULT_PATHS:
            out = self.faulted(name, body)
        else:
            out = (*self.answer(method, name, body), {})
        if out[0] == 200 and not out[3].get("close"):
            self._count(name, "answered")
        return out

    def faulted(self, name: str, body: bytes) -> tuple[int, str, bytes, dict[str, Any]]:
        faults = self.faults
        assert faults is not None
        # The request's identity (retried when seen before) and its key in the schedule.
        if name == "/api/v1/forward_backward":
            msg = self.pb.ForwardBackwardRequest()
            msg.ParseFromString(body)
            identity: Any = (msg.model_id, msg.seq_id)
            keys = [f"fwdbwd/{msg.seq_id}"]
            req: dict[str, Any] = {}
        else:
            req = json.loads(body) if body else {}
            if name == "/api/v1/retrieve_future":
                identity = req.get("request_id")
                keys = self.fault_keys.get(identity, [str(identity)])
            elif name == "/api/v1/asample":
                identity = (req.get("sampling_session_id"), req.get("seq_id"))
                content, _, _ = self._sample_key(req)
                done = self.done.get((name, identity))
                draws = done["_draws"] if done else self._draws(content, int(req.get("num_samples", 1)))
                # One key per sample: a request of k samples meets the
                # faults of each of its samples' requests alone (coalesced
                # sampling meets the faults unmerged requests meet).
                keys = [f"{content:08x}/{i}" for i in draws]
            else:
                identity = (req.get("model_id"), req.get("seq_id"))
                keys = [f"optim/{req.get('seq_id')}"]
        if (name, json.dumps(identity)) in self.identities:
            self._count(name, "retried")
        self.identities.add((name, json.dumps(identity)))
        # Each key in order, as its own request would: the first faulted
        # one fails the request (its attempt counted, the later keys' not:
        # they were never asked alone); none faulted, every key's counted.
        kind = None
        for key in keys:
            attempt = faults.attempts.get((name, key), 0)
            if name == "/api/v1/asample" and faults.reject and faults.draw("reject", key.split("/")[0]) < faults.reject:
                kind = "reject"
            elif name == "/api/v1/asample" and faults.bad and faults.draw("bad", key, attempt) < faults.bad:
                kind = "bad"
            elif (
                name == "/api/v1/retrieve_future" and faults.failed and self.futures.get(identity, ("",))[0] == "sample"
                and faults.draw("failed", key, attempt) < faults.failed
            ):
                kind = "failed"
            else:
                kind = faults.pick(name, key, attempt)
            if kind is not None:
                faults.attempt(name, key)
                break
        else:
            for key in keys:
                faults.attempt(name, key)
        if kind in ("reject", "bad"):
            self._count(name, kind)
            return 400, "application/json", json.dumps({"error": f"{kind} request (fake_tinker fault)"}).encode(), {}
        if kind == "failed":
            self._give_back(identity)
            self._count(name, "failed")
            return (*self._json({"error": "sampling failed (fake_tinker fault)", "category": "server"}), {})
        if name == "/api/v1/retrieve_future":
            entry = self.futures.get(identity)
            if kind == "410" and (entry is None or entry[0] != "sample"):
                kind = "try_again"
            if kind == "complete_metadata" and not req.get("allow_metadata_only"):
                kind = "try_again"
        if kind is not None:
            self._count(name, kind)
        if kind in ("500", "503"):
            return int(kind), "application/json", b'{"error": "fake_tinker fault"}', {}
        if kind == "429":
            return 429, "application/json", b'{"error": "rate limited (fake_tinker fault)"}', {"headers": {"retry-after": "1"}}
        if kind == "408":
            return 408, "application/json", b'{"type": "try_again", "queue_state": "active"}', {}
        if kind == "empty400":
            return 400, "application/json", b"", {}
        if kind == "try_again":
            return (*self._json({"type": "try_again", "request_id": identity, "queue_state": "active"}), {})
        if kind == "complete_metadata":
            return (*self._json({"status": "complete_metadata", "response_payload_size": 1024}), {})
        if kind == "410":
            self._give_back(identity)
            return 410, "application/json", b'{"error": "promise expired (fake_tinker fault)"}', {}
        if kind == "closed":
            return 0, "", b"", {"close": True}
        if name == "/api/v1/retrieve_future" and kind == "lost":
            entry = self.futures.get(identity)
            out = self.answer("POST", name, body)
            if entry is not None:
                self.futures[identity] = entry  # the answer was lost: the future stays
                if entry[0] == "sample":
                    self.samples -= len(entry[1][1])
            return (*out, {"close": True})
        if name == "/api/v1/retrieve_future":
            out = self.answer("POST", name, body)
            return (*out, {"delay": faults.slow} if kind == "slow" else {})
        done = self.done.get((name, identity))
        if done is not None:  # a lost answer's request again: the same answer
            out = self._json({k: v for k, v in done.items() if k != "_draws"})
        else:
            out = self.answer("POST", name, body, keys)
            if out[0] == 200:
                answer = json.loads(out[2])
                if name == "/api/v1/asample":
                    answer["_draws"] = [int(k.split("/")[1]) for k in keys]
                self.done[(name, identity)] = answer
        if kind == "lost":
            return (*out, {"close": True})
        if kind == "slow":
            return (*out, {"delay": faults.slow})
        return (*out, {})

    # Each handler returns (status, content type, body bytes).
    def answer(self, method: str, name: str, body: bytes, fault_key: list[str] | None = None) -> tuple[int, str, bytes]:
        self.current = name
        if name == "/api/v1/forward_backward":
            return self._json(self.forward_backward(body, fault_key))
        req = json.loads(body) if body else {}
        if name == "/api/v1/asample":
            return self._json(self.asample(req, fault_key))
        if name == "/api/v1/retrieve_future":
            return self.retrieve(req)
        if name == "/api/v1/client/config":
            return self._json(self.client_config)
        if name == "/api/v1/client/dynamic_config":
            return self._json({})
        if name == "/api/v1/join_sampling_session":
            sid = req.get("sampling_session_id", "")
            joined = self.joined[sid] = self.joined.get(sid, 0) + 1  # the original client is 0
            return self._json({"type": "join_sampling_session", "client_counter": joined})
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
            answer = self._future("json", {"metrics": {"optim/fake_lr": lr}}, fault_key, model_id=MODEL_ID)
            if self.timeline is not None:
                self.timeline.train(answer["request_id"], self.timeline.latency.optim)
            return self._json(answer)
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

    @staticmethod
    def _sample_key(req: dict[str, Any]) -> tuple[int, int, list[int]]:
        tokens: list[int] = []
        for chunk in req["prompt"]["chunks"]:
            tokens.extend(chunk.get("tokens", ()))
        params = req.get("sampling_params", {})
        max_tokens = int(params.get("max_tokens") or 16)
        head = f"{max_tokens}|{params.get('temperature')}|".encode()
        return zlib.crc32(array("i", tokens).tobytes(), zlib.crc32(head)), max_tokens, tokens

    def _draws(self, key: int, n: int, take: bool = False) -> list[int]:
        """The draws of the next n samples of this prompt: those given back
        first (smallest first), then new ones."""
        freed = sorted(self.freed.get(key, ()))
        start = self.seen.get(key, 0)
        draws = freed[:n] + list(range(start, start + n - len(freed[:n])))
        if take:
            self.freed[key] = freed[n:]
            self.seen[key] = start + n - len(freed[:n])
        return draws

    def _give_back(self, rid: Any) -> None:
        """A sample future that will never answer (410, failed): its draws
        go to the next samples of its prompt, as if it had not been asked
        (the resubmission draws what the lost request would have)."""
        entry = self.futures.pop(rid, None)
        if entry is not None and entry[0] == "sample":
            self.freed.setdefault(entry[1][0], []).extend(entry[1][1])

    def asample(self, req: dict[str, Any], fault_key: list[str] | None = None) -> dict[str, Any]:
        n = int(req.get("num_samples", 1))
        # Each sample is drawn by (prompt, parameters, how many of that
        # prompt came before): k requests of one sample and one request of
        # k samples get the same draws (coalesced sampling is comparable).
        key, max_tokens, tokens = self._sample_key(req)
        draws = self._draws(key, n, take=True)
        ids = [f"seq-{key:08x}-{i}" for i in draws]
        scored = len(tokens) if req.get("prompt_logprobs") else 0
        answer = self._future("sample", (key, tuple(draws), max_tokens, scored), fault_key, sample_sequence_ids=ids)
        if self.report_samples:
            target = (str(req.get("sampling_session_id")), int(req.get("seq_id") or 0) // 1_000_000_000)
            # about the payload's bytes (tinker reserves them before its fetch)
            self.to_report[answer["request_id"]] = (target, n * (8 * max_tokens + 16) + 4 * scored + 8)
            if self.timeline is None:
                self._report(answer["request_id"])
        if self.timeline is not None:
            self.timeline.sample(answer["request_id"], n, max_tokens)
        return answer

    def _report(self, rid: str) -> None:
        """A sample future ready: an event of its session's completions."""
        entry = self.to_report.pop(rid, None)
        if entry is not None:
            target, size = entry
            completion = {"state": "finished", "request_id": rid, "response_payload_uncompressed_size": size}
            self.completions.setdefault(target, Completions()).add(completion)

    def retrieve_futures(self, body: bytes) -> tuple[int, str, bytes, dict[str, Any]]:
        """A session's poll: its completions after `prev_cursor` at once, or
        (none, and not `timeout: 0`) held until one comes or the hold ends
        (`hold`: the latency model's `hold`, else 30 s as
        tinker's service holds it)."""
        name = "/api/v1/retrieve_futures"
        req = json.loads(body)
        target = req["target"]
        queue = self.completions.setdefault(
            (str(target["sampling_session_id"]), int(target.get("cloned_sampler_id") or 0)), Completions()
        )
        self._count(name, "acknowledged", len(req.get("retrieved_request_ids") or ()))
        prev = int(req.get("prev_cursor") or 0)
        timeout = req.get("timeout")
        if queue.after(prev) or timeout == 0:
            self._count(name, "answered")
            return (*self.poll_answer(queue, prev), {})
        hold = self.timeline.latency.hold if self.timeline is not None else 30.0
        seconds = hold if timeout is None else min(float(timeout), hold)
        return 0, "", b"", {"poll": (queue, prev, seconds)}

    def poll_answer(self, queue: Completions, prev: int) -> tuple[int, str, bytes]:
        completions = queue.after(prev)
        self.reported.update(c["request_id"] for c in completions)
        return self._json({"completions": completions, "cursor": queue.cursor})

    def sample_response(self, key: int, draws: tuple[int, ...], max_tokens: int, scored: int = 0) -> bytes:
        np, pb = self.np, self.pb
        msg = pb.SampleResponse()
        for draw in draws:
            rng = np.random.default_rng([self.seed, key, draw])
            seq = msg.sequences.add()
            seq.stop_reason = pb.STOP_REASON_LENGTH
            seq.tokens = rng.integers(0, VOCAB, max_tokens, dtype=np.int32).tobytes()
            seq.logprobs = (-rng.exponential(1.0, max_tokens)).astype(np.float32).tobytes()
        if scored:  # a scoring call: the prompt's logprobs, none for its first token
            prompt = (-rng.exponential(1.0, scored)).astype(np.float32)
            prompt[0] = np.nan
            msg.prompt_logprobs = prompt.tobytes()
        return msg.SerializeToString()

    def forward_backward(self, body: bytes, fault_key: list[str] | None = None) -> dict[str, Any]:
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
        answer = self._future("proto", out.SerializeToString(), fault_key, model_id=MODEL_ID)
        if self.timeline is not None:
            latency = self.timeline.latency
            self.timeline.train(answer["request_id"], latency.fb + latency.fb_token * sum(lengths))
        return answer

    def retrieve(self, req: dict[str, Any]) -> tuple[int, str, bytes]:
        entry = self.futures.pop(req["request_id"], None)
        if entry is None:
            return 410, "application/json", b'{"error": "no such future"}'
        kind, payload = entry
        if self.timeline is not None:
            self.timeline.fetched(req["request_id"])
        if kind == "sample":
            self.samples += len(payload[1])
            return 200, "application/x-protobuf", self.sample_response(*payload)
        if kind == "proto":
            return 200, "application/x-protobuf", payload
        return self._json(payload)


REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout", 410: "Gone",
    429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable",
}


def hold(
    service: Service, how: dict[str, Any], method: str, name: str, body: bytes,
    respond: Callable[[int, str, bytes], None], alive: Callable[[], bool] = lambda: True,
) -> bool:
    """Whether the answer is held (the latency model's long polls), to be
    given later by ``respond(status, content type, body)``: a poll of a
    sample future not ready (``how["hold"]``: its result once ready, or
    try_again after the model's `hold` seconds), a session's poll with
    nothing new (``how["poll"]``: its completions once one comes, or empty
    after its seconds). A poll no longer ``alive()`` when its answer comes
    (an HTTP/2 stream the client reset) is dropped, its future left to the
    client's next poll. Counted per path as ``held``."""
    if "hold" in how:
        service._count("/api/v1/retrieve_future", "held")
        _hold_future(service, how["hold"], method, body, respond, alive)
        return True
    if "poll" in how:
        service._count(name, "held")
        _hold_session_poll(service, name, *how["poll"], respond, alive)
        return True
    return False


def _hold_future(
    service: Service, rid: str, method: str, body: bytes, respond: Callable[[int, str, bytes], None],
    alive: Callable[[], bool],
) -> None:
    timeline = service.timeline
    assert timeline is not None
    timeline.held += 1
    done = False

    def answer(ready: bool) -> None:
        nonlocal done
        if done:
            return
        done = True
        timeline.held -= 1
        if not alive():
            return
        if ready:
            status, ctype, out = service.answer(method, "/api/v1/retrieve_future", body)
        else:
            timeline.try_agains += 1
            status, ctype, out = service._json({"type": "try_again", "request_id": rid, "queue_state": "active"})
        if status == 200:
            service._count("/api/v1/retrieve_future", "answered")
        respond(status, ctype, out)

    timeline.waiters.setdefault(rid, []).append(lambda: answer(True))
    asyncio.get_running_loop().call_later(timeline.latency.hold, answer, False)


def _hold_session_poll(
    service: Service, name: str, queue: Completions, prev: int, seconds: float, respond: Callable[[int, str, bytes], None],
    alive: Callable[[], bool],
) -> None:
    done = False

    def answer() -> None:
        nonlocal done
        if done:
            return
        done = True
        if answer in queue.waiters:
            queue.waiters.remove(answer)
        if not alive():
            return
        service._count(name, "answered")
        respond(*service.poll_answer(queue, prev))

    queue.waiters.append(answer)
    asyncio.get_running_loop().call_later(seconds, answer)


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
            method, path, version = head[0].split(" ", 2)
            if self.service.on_request is not None:
                fields = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in head[1:])]
                self.service.on_request(method, path, fields, body, version)
            name = path.split("?", 1)[0]
            self.service._count(name, f"sender:{self.sender(head)}")
            if headers.get("content-encoding") == "zstd":  # proto_compress_fwdbwd: handled as the plain body
                import zstandard

                self.service._count(name, "compressed")
                body = zstandard.ZstdDecompressor().decompress(body)
            try:
                status, ctype, out, how = self.service.handle(method, path, body)
            except Exception as exc:  # a bug here must show, not hang the client
                print(f"fake_tinker: {method} {path}: {exc!r}", file=sys.stderr, flush=True)
                status, ctype, out, how = 500, "application/json", json.dumps({"error": repr(exc)}).encode(), {}
            assert self.transport is not None
            if hold(self.service, how, method, name, body, self._respond):
                continue
            if how.get("close"):  # a closed connection, or a lost answer
                self.transport.close()
                self.buf.clear()
                return
            reason = REASONS[status]
            headers = "".join(f"{k}: {v}\r\n" for k, v in how.get("headers", {}).items())
            reply = (
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\n{headers}"
                f"content-length: {len(out)}\r\n\r\n".encode()
                + out
            )
            if how.get("delay"):
                asyncio.get_running_loop().call_later(how["delay"], self._write, reply)
            else:
                self.transport.write(reply)

    @staticmethod
    def sender(head: list[str]) -> str:
        """Which client wrote this request head: `httpx` (h11 writes the
        names as httpx gives them: Host first, capitalized), `pyqwest`
        (hyper writes them lowercase), or `other`."""
        names = [line.partition(":")[0] for line in head[1:]]
        if names and names[0] == "Host":
            return "httpx"
        return "pyqwest" if names and all(n == n.lower() for n in names) else "other"

    def _respond(self, status: int, ctype: str, out: bytes) -> None:
        self._write(self._reply(status, ctype, out))

    def _reply(self, status: int, ctype: str, out: bytes) -> bytes:
        return f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: {ctype}\r\ncontent-length: {len(out)}\r\n\r\n".encode() + out

    def _write(self, reply: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)

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
    faults = Faults(args.faults) if args.faults else None
    client_config = json.loads(args.client_config) if args.client_config else None
    service = Service(args.seed, record, faults, Latency(args.latency) if args.latency else None, client_config)
    if args.capture:
        service.on_request = capture_to(Path(args.capture))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if args.tls:  # HTTPS, HTTP/2 by ALPN (HTTP/1.1 for a client offering nothing else), as the real service
        import ssl

        if "support" not in sys.modules:  # run as a script: the package beside it, this module as its own
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            sys.modules["support.fake_tinker"] = sys.modules[__name__]
        from support.h2_service import H2Connection

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(Path(args.tls) / "server.pem", Path(args.tls) / "server.key")
        context.set_alpn_protocols(["h2", "http/1.1"])
        live: set[Any] = set()
        server = await loop.create_server(
            lambda: H2Connection(service, live), "127.0.0.1", args.port, backlog=1024, ssl=context
        )
    else:
        server = await loop.create_server(lambda: HttpProtocol(service), "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
        if args.parent_pid and os.getppid() != args.parent_pid:
            break
    server.close()
    if record is not None:
        (record / "requests.json").write_text(json.dumps(service.tally_json(), indent=1))


def capture_to(path: Path) -> Callable[[str, str, list[tuple[str, str]], bytes, str], None]:
    """A `Service.on_request` writing each request as a JSON line to
    `path` (read back by `read_capture`)."""
    out = path.open("a", buffering=1)

    def on_request(method: str, path: str, headers: list[tuple[str, str]], body: bytes, version: str) -> None:
        line = {"method": method, "path": path, "version": version, "headers": headers, "body": body.hex()}
        out.write(json.dumps(line) + "\n")

    return on_request


def read_capture(path: Path | str) -> list[dict[str, Any]]:
    """The requests `capture_to` wrote: method, path, version, headers
    (name, value) in order, body (bytes)."""
    lines = Path(path).read_text().splitlines()
    return [{**r, "body": bytes.fromhex(r["body"])} for r in map(json.loads, lines)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", default=None, help="write forward_backward bodies and requests.json here")
    p.add_argument("--faults", default=None, help="a seeded fault schedule (see Faults): SEED or key=value,...")
    p.add_argument("--latency", default=None, help="a service that takes time (see Latency): key=value,... or on")
    p.add_argument("--timeout", type=float, default=3600.0, help="exit after this many seconds")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is no longer the parent")
    p.add_argument("--capture", default=None, help="append every request received to this file (JSON lines)")
    p.add_argument("--tls", default=None, help="serve HTTPS (HTTP/2 by ALPN) with DIR/server.pem and DIR/server.key")
    p.add_argument(
        "--client-config", default=None,
        help="the flags /api/v1/client/config answers, as JSON (fields of tinker's ClientConfigResponse)",
    )
    asyncio.run(serve(p.parse_args()))


class FakeTinker:
    """Starts the fake service in a child process; `base_url` once entered;
    with `record`, `requests` (`Service.tally_json`) once exited.
    `client_config`: the flags its `/api/v1/client/config` answers. With
    `tls`, HTTPS with HTTP/2 by ALPN, as the real service is reached
    (:mod:`support.h2_service`'s connections; its self-signed certificate
    trusted through ``SSL_CERT_FILE`` in this process while entered)."""

    def __init__(
        self, seed: int = 0, record: Path | str | None = None, timeout: float = 3600.0, faults: str | None = None,
        capture: Path | str | None = None, latency: str | None = None, client_config: dict[str, Any] | None = None,
        tls: bool = False,
    ) -> None:
        self.tls = tls
        self._tls_dir: Any = None
        self._cert_env: tuple[str | None] | None = None
        self.seed, self.record, self.timeout, self.faults = seed, record, timeout, faults
        self.latency = latency  # a `Latency` SPEC: the service takes time
        self.client_config = client_config
        self.capture = capture  # a file each request received is appended to (`read_capture`)
        self.requests: dict[str, Any] | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.cpu_s = 0.0  # the service's CPU time, read when it stops

    def __enter__(self) -> FakeTinker:
        cmd = [sys.executable, __file__, "--seed", str(self.seed), "--timeout", str(self.timeout)]
        cmd += ["--parent-pid", str(os.getpid())]
        if self.record is not None:
            cmd += ["--record", str(self.record)]
        if self.faults:
            cmd += ["--faults", self.faults]
        if self.latency:
            cmd += ["--latency", self.latency]
        if self.capture is not None:
            cmd += ["--capture", str(self.capture)]
        if self.client_config:
            cmd += ["--client-config", json.dumps(self.client_config)]
        if self.tls:
            import tempfile

            from .h2_service import make_certificate

            self._tls_dir = tempfile.TemporaryDirectory(prefix="fake-tinker-tls-")
            try:
                make_certificate(Path(self._tls_dir.name))
            except BaseException:
                self._drop_tls()
                raise
            cmd += ["--tls", self._tls_dir.name]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.proc.kill()
            self.proc.wait()
            self._drop_tls()
            raise RuntimeError(f"fake tinker did not start: {line!r}")
        self.base_url = f"{'https' if self.tls else 'http'}://127.0.0.1:{int(line.split()[1])}"
        if self._tls_dir is not None:
            self._cert_env = (os.environ.get("SSL_CERT_FILE"),)  # as it was, to put back
            os.environ["SSL_CERT_FILE"] = str(Path(self._tls_dir.name) / "server.pem")  # read by tinker's transports when made
        return self

    def _drop_tls(self) -> None:
        """The certificate's directory removed, ``SSL_CERT_FILE`` as it was."""
        if self._tls_dir is None:
            return
        if self._cert_env is not None:  # set by __enter__
            (before,) = self._cert_env
            if before is None:
                os.environ.pop("SSL_CERT_FILE", None)
            else:
                os.environ["SSL_CERT_FILE"] = before
        self._tls_dir.cleanup()
        self._tls_dir = self._cert_env = None

    def __exit__(self, *exc: object) -> None:
        try:
            self._stop()
        finally:
            self._drop_tls()

    def _stop(self) -> None:
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
            if self.record is not None and (Path(self.record) / "requests.json").exists():
                self.requests = json.loads((Path(self.record) / "requests.json").read_text())


if __name__ == "__main__":
    main()
