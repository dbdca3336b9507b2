"""Client CPU per sample call (issue 41): N concurrent
`await sampling_client.sample(...)` calls as tinker-cookbook makes them
(`completers.TinkerTokenCompleter`: one prompt, `num_samples=1`,
`SamplingParams(stop=..., max_tokens=..., temperature=...)`), tinker's real
ServiceClient / SamplingClient against the fake service
(tests/support/fake_tinker.py) on loopback, which answers at once; each
call is one `asample` request and one `retrieve_future` request.

Variants, each in a fresh process (the GC off in every one), in turn,
--rounds times:

  stock      tinker as installed
  installed  tinker_rl_data.cookbook.install(gc=False) first (the collector
             is off in every variant anyway)
  floor      the same two requests per sample sent through tinker's own
             transport object: the pyqwest `HTTPTransport` its client holds
             (behind pyqwest's httpx adapter), through `pyqwest.Client`
             (buffered reads), headers prebuilt (those tinker handed the
             transport in the warm-up, a fresh idempotency key and the
             round-trip time per request), bodies as tinker's
             (`json.dumps` of the same dict), the JSON future parsed,
             tinker's own proto decode of the SampleResponse
             (`deserialize_proto_response`); no retries, no limits; run
             on the caller's loop

Each process makes its clients, runs N calls through tinker (warm-up:
connections, sessions, caches), then the N timed calls (the floor's through
its path). Client CPU: `time.process_time()` over the timed calls, every
thread of the process (the caller's loop, tinker's loop thread, pyqwest's
native threads); beside it per thread, from /proc/self/task. The fake
service runs in its own process (its CPU is not counted).

The wire: the service captures every request (fake_tinker --capture); the
`asample` and `retrieve_future` requests each variant sent (warm-up and timed)
must equal stock's of the same round (stock runs first) as multisets of
(method, path, headers in order, body), the values of the idempotency key,
the round-trip-time header and host (each process's own service port)
aside; the table says whether they do.

    python bench/client_cpu.py [--n 2000] [--rounds 3] [--variants stock,installed,floor]
                               [--prompt-tokens 64] [--max-tokens 32] [--out PATH]

Defaults: many_short's shape (tests/support/workloads.py: 64-token
prompts, 32 sampled tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]

from support.fake_tinker import FakeTinker, read_capture  # noqa: E402
from support.thread_cpu import thread_cpu, thread_groups  # noqa: E402

MODEL = "fake/model"
STOP = [151645]  # a renderer's stop token
SAMPLE_PATHS = ("/api/v1/asample", "/api/v1/retrieve_future")
VARIANTS = ("stock", "installed", "floor")
# Headers whose value is random or a measurement, and the host (each
# process has its own service port): compared by name only.
VOLATILE = {"x-idempotency-key", "x-tinker-create-promise-roundtrip-time", "host"}


def prompt_tokens(i: int, length: int) -> list[int]:
    """Sample i's prompt: distinct per call, as the cookbook's groups are."""
    return [(i * 7919 + j * 104729) % 151_000 for j in range(length)]


class Floor:
    """The floor: sample calls as the two requests alone, through the
    pyqwest transport tinker's client holds, with what tinker handed that
    transport in the warm-up as the template (`record`)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[list[tuple[str, str]], bytes]] = {}  # path -> (headers, body)

    def record(self) -> Any:
        """Patch pyqwest's httpx adapter to keep the first request of each
        sample path as tinker hands it to the transport; returns the undo."""
        from pyqwest.httpx import AsyncPyqwestTransport, _transport

        original = AsyncPyqwestTransport.handle_async_request
        seen = self.seen

        async def handle_async_request(transport: Any, request: Any) -> Any:
            path = request.url.path
            if path in SAMPLE_PATHS and path not in seen:
                seen[path] = (list(_transport.convert_headers(request).items()), request.content)
            return await original(transport, request)

        AsyncPyqwestTransport.handle_async_request = handle_async_request
        return lambda: setattr(AsyncPyqwestTransport, "handle_async_request", original)

    def prepare(self, sampling_client: Any, base_url: str) -> None:
        import pyqwest
        from tinker.lib.internal_client_holder import ClientConnectionPoolType

        holder = sampling_client.holder
        pool = holder._get_client_connection_pool(ClientConnectionPoolType.SAMPLE)
        adapter = pool._clients[0]._client._transport  # tinker's httpx client -> pyqwest's adapter
        self.client = pyqwest.Client(adapter._transport)  # the pyqwest HTTPTransport itself
        self.sampling_client = sampling_client
        self.urls = {path: base_url + path for path in SAMPLE_PATHS}
        self.templates = {path: json.loads(body) for path, (_, body) in self.seen.items()}
        self.headers = {path: headers for path, (headers, _) in self.seen.items()}

    def _headers(self, path: str, body: bytes, roundtrip: float | None = None) -> list[tuple[str, str]]:
        import uuid

        out = []
        for name, value in self.headers[path]:
            if name == "x-idempotency-key":
                value = f"stainless-python-retry-{uuid.uuid4()}"
            elif name == "x-tinker-create-promise-roundtrip-time":
                value = str(roundtrip)
            elif name == "content-length":  # where tinker puts it (else the transport appends it)
                value = str(len(body))
            out.append((name, value))
        return out

    @staticmethod
    def _body(template: dict[str, Any], **fields: Any) -> bytes:
        # As httpx writes `json=` bodies.
        body = json.dumps({**template, **fields}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return body.encode()

    async def sample(self, tokens: list[int]) -> Any:
        from tinker import types
        from tinker.proto.response_conv import deserialize_proto_response

        seq_id = self.sampling_client._request_id_counter
        self.sampling_client._request_id_counter += 1
        asample, retrieve = SAMPLE_PATHS
        prompt = {"chunks": [{"tokens": tokens, "type": "encoded_text"}]}
        t0 = time.time()
        body = self._body(self.templates[asample], seq_id=seq_id, prompt=prompt)
        response = await self.client.post(self.urls[asample], self._headers(asample, body), body)
        if response.status != 200:
            raise RuntimeError(f"floor: asample answered {response.status}: {response.content[:200]!r}")
        future = json.loads(response.content)
        roundtrip = time.time() - t0
        body = self._body(self.templates[retrieve], request_id=future["request_id"])
        response = await self.client.post(self.urls[retrieve], self._headers(retrieve, body, roundtrip), body)
        if response.status != 200 or "application/x-protobuf" not in response.headers.get("content-type", ""):
            raise RuntimeError(f"floor: retrieve_future answered {response.status}: {response.content[:200]!r}")
        return deserialize_proto_response(response.content, types.SampleResponse)


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    gc.disable()
    os.environ["TINKER_API_KEY"] = "tml-fake-bench-key"  # the fake service takes any key
    if args.child == "installed":
        from tinker_rl_data import cookbook

        cookbook.install(gc=False)
    import tinker
    from tinker import types

    floor = Floor() if args.child == "floor" else None
    undo = floor.record() if floor is not None else None
    params = types.SamplingParams(stop=STOP, max_tokens=args.max_tokens, temperature=1.0)

    async def cookbook_call(sampling_client: Any, prompt: Any) -> Any:
        # What TinkerTokenCompleter.__call__ does around the request.
        result = await sampling_client.sample(prompt=prompt, num_samples=1, sampling_params=params)
        return result.sequences[0]

    async def timed(call: Any, inputs: list[Any]) -> tuple[float, float, dict[str, float]]:
        await asyncio.sleep(0.2)  # the warm-up's stragglers (closes, heartbeats) settle
        assert not gc.isenabled(), "the collector must be off in every variant"
        threads = thread_cpu()
        t0, c0 = time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(call(x) for x in inputs))
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        by_thread = thread_groups(threads, thread_cpu())
        assert len(results) == len(inputs)
        return cpu, wall, by_thread

    with FakeTinker(capture=args.capture) as fake:
        service = tinker.ServiceClient(base_url=fake.base_url)
        sampling_client = service.create_sampling_client(base_model=MODEL).result()
        warm = [types.ModelInput.from_ints(prompt_tokens(i, args.prompt_tokens)) for i in range(args.n)]
        timed_tokens = [prompt_tokens(args.n + i, args.prompt_tokens) for i in range(args.n)]

        async def main() -> tuple[float, float, dict[str, float]]:
            await asyncio.gather(*(cookbook_call(sampling_client, p) for p in warm))
            if floor is not None:
                undo()
                floor.prepare(sampling_client, fake.base_url)
                return await timed(floor.sample, timed_tokens)
            prompts = [types.ModelInput.from_ints(t) for t in timed_tokens]
            return await timed(lambda p: cookbook_call(sampling_client, p), prompts)

        cpu, wall, by_thread = asyncio.run(main())
    return {"variant": args.child, "cpu_s": cpu, "wall_s": wall, "threads": by_thread}


def normalized(request: dict[str, Any]) -> tuple:
    headers = tuple((k, "*" if k in VOLATILE else v) for k, v in request["headers"])
    return request["method"], request["path"], headers, request["body"]


def wire_of(capture: Path) -> Counter:
    """The sample paths' requests in a capture, as a multiset."""
    return Counter(normalized(r) for r in read_capture(capture) if r["path"] in SAMPLE_PATHS)


def wire_difference(ours: Counter, stock: Counter) -> str | None:
    if ours == stock:
        return None
    extra, missing = ours - stock, stock - ours
    example = next(iter(extra or missing))
    return (f"{sum(extra.values())} requests not in stock's, {sum(missing.values())} of stock's missing; "
            f"e.g. {'extra' if extra else 'missing'}: {example[:3]} body {example[3][:120]!r}")


def run_variant(variant: str, args: argparse.Namespace, capture: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", variant, "--n", str(args.n), "--capture", str(capture),
           "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def markdown(results: dict[str, Any]) -> str:
    n, variants = results["n"], results["variants"]
    per_call = {v: statistics.median(r["cpu_s"] for r in runs) / n * 1e3 for v, runs in variants.items()}
    lines = [
        f"Client CPU per sample call: N = {n:,} concurrent `await sampling_client.sample(...)`, "
        f"{results['prompt_tokens']}-token prompts, max_tokens {results['max_tokens']}; median of "
        f"{results['rounds']} fresh processes per variant (the GC off), all threads of the client process.",
        "",
        "| variant | client CPU ms / call | runs (ms / call) | wall s (median) | / floor | / stock | wire = stock's |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for v, runs in variants.items():
        each = ", ".join(f"{r['cpu_s'] / n * 1e3:.2f}" for r in runs)
        wall = statistics.median(r["wall_s"] for r in runs)
        floor = f"{per_call[v] / per_call['floor']:.1f}x" if "floor" in per_call else "-"
        stock = f"{per_call[v] / per_call['stock']:.2f}x" if "stock" in per_call else "-"
        diffs = [r["wire"] for r in runs if r.get("wire")]
        same = "-" if v == "stock" else ("yes" if not diffs else f"NO in {len(diffs)} of {len(runs)} runs")
        lines.append(f"| {v} | {per_call[v]:.2f} | {each} | {wall:.2f} | {floor} | {stock} | {same} |")
    if any(r.get("wire") for runs in variants.values() for r in runs):
        lines += ["", "Wire differences (first run of each): "]
        lines += [f"- {v}: {next(r['wire'] for r in runs if r.get('wire'))}" for v, runs in variants.items()
                  if any(r.get("wire") for r in runs)]
    lines += ["", "CPU per thread (ms / call, median run; Python threads by name, native ones by kernel name):"]
    for v, runs in variants.items():
        mid = sorted(runs, key=lambda r: r["cpu_s"])[len(runs) // 2]
        groups = ", ".join(f"{name} {cpu / n * 1e3:.2f}" for name, cpu in mid["threads"].items())
        lines.append(f"- {v}: {groups}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="concurrent sample calls (timed; as many in the warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per variant")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--capture", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_child(args)))
        return
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    results: dict[str, Any] = {
        "n": args.n, "rounds": args.rounds, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "variants": {v: [] for v in variants},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            wires = {}
            for v in variants:
                capture = Path(tmp) / f"{v}-{round_}.jsonl"
                row = run_variant(v, args, capture)
                wires[v] = wire_of(capture)
                if v != "stock" and "stock" in wires:
                    row["wire"] = wire_difference(wires[v], wires["stock"])
                results["variants"][v].append(row)
                print(f"round {round_ + 1}/{args.rounds} {v:9} {row['cpu_s'] / args.n * 1e3:6.2f} ms CPU / call  "
                      f"wall {row['wall_s']:.2f} s  wire {'-' if v == 'stock' else row['wire'] or 'same'}", flush=True)
    print()
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
