"""The checks of a trainer run against stock's, shared by the trainer-loop
tests and bench/trainer.py: the recorded forward_backward bodies parsed and
re-serialized deterministically (map order is per process), compared
exactly, or as multisets of Datums where a mode's order is not
deterministic; the logged metrics but ``time/*``, integers equal and floats
within float32 rounding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def canonical_bodies(record: Path) -> dict[str, bytes]:
    """Each recorded forward_backward body, re-serialized deterministically."""
    from tinker.proto import tinker_public_pb2 as pb

    out = {}
    for path in sorted(record.glob("fwdbwd-*.pb")):
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(path.read_bytes())
        out[path.name] = msg.SerializeToString(deterministic=True)
    return out


def datum_multiset(body: bytes) -> list[bytes]:
    """A request's Datums, each serialized deterministically, sorted."""
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    return sorted(d.SerializeToString(deterministic=True) for d in msg.data)


def compare_bodies(a: dict[str, bytes], b: dict[str, bytes], any_order: bool = False) -> str | None:
    """None when equal. ``any_order`` (groups sharing a prompt): a request's
    Datums may come in another order, as which of a group's concurrent
    sample calls gets which draw is their arrival order at the service."""
    if a.keys() != b.keys():
        return f"requests differ: {sorted(a)} vs {sorted(b)}"
    for name in a:
        if a[name] != b[name] and not (any_order and datum_multiset(a[name]) == datum_multiset(b[name])):
            return f"{name} differs ({len(a[name])} vs {len(b[name])} bytes)"
    return None


def compare_run_bodies(a: dict[str, bytes], b: dict[str, bytes], per: int | None, any_order: bool = False) -> str | None:
    """compare_bodies, or with ``per`` (request_order) the Datums of each
    chunk of ``per`` requests (0: all of them) as multisets."""
    if per is None:
        return compare_bodies(a, b, any_order)
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} requests"

    def chunks(bodies: dict[str, bytes]) -> list[list[bytes]]:
        names = sorted(bodies)
        size = per or len(names) or 1
        return [sorted(d for n in names[i : i + size] for d in datum_multiset(bodies[n])) for i in range(0, len(names), size)]

    for i, (x, y) in enumerate(zip(chunks(a), chunks(b))):
        if x != y:
            return f"request chunk {i}: the Datums differ ({len(x)} vs {len(y)})"
    return None


def same_groups_steps(a: dict[str, bytes], b: dict[str, bytes]) -> list[int]:
    """Async (one request per step): the steps whose request holds the same
    Datums (as a multiset) in both runs, i.e. trained the same groups."""
    names = sorted(a)
    return [i for i, n in enumerate(names) if n in b and datum_multiset(a[n]) == datum_multiset(b[n])]


def comparable(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def compare_metrics(a: list[dict[str, Any]], b: list[dict[str, Any]], steps: list[int] | None = None) -> str | None:
    """None when equal: same keys, integers and strings equal, floats within
    float32 rounding (relative 1e-5, absolute 1e-5 of a unit-size term).
    ``steps``: only those steps (async: the steps that trained the same
    groups in both runs, same_groups_steps)."""
    a, b = comparable(a), comparable(b)
    if steps is not None and len(a) == len(b):
        a, b = [a[i] for i in steps], [b[i] for i in steps]
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} logged steps"
    for step, (x, y) in enumerate(zip(a, b)):
        if x.keys() != y.keys():
            return f"step {step}: keys differ: {sorted(x.keys() ^ y.keys())}"
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, float) or isinstance(v, float):
                if not (u == v or (math.isnan(u) and math.isnan(v)) or math.isclose(u, v, rel_tol=1e-5, abs_tol=1e-5)):
                    return f"step {step}: {k}: {u!r} vs {v!r}"
            elif u != v:
                return f"step {step}: {k}: {u!r} vs {v!r}"
    return None
