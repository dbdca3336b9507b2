"""End to end: rollouts to request bytes, on the workloads of bench/workloads.py.

Each path runs what a training step runs between scored rollouts and the
bytes of a forward_backward request: compute_advantages, then
assemble_training_data, then the encoder `AsyncTrainingResource.forward_backward`
runs: for tinker_rl_data's paths ours (`tinker_rl_data.encode_forward_backward`, what
`tinker_rl_data.install()` and `tinker_rl_data.cookbook.install()` make
tinker use) when the build has it, for the others tinker's own
(`tinker.proto.request_conv.forward_backward_request_to_proto` +
`SerializeToString()`). tinker's encoder is also timed on every path's
Datums, and the total with it is shown beside.

Paths: tinker_rl_data with list model input; with model_input_tokens="numpy";
with merge_turns=True (multi_turn_agent); the evsys-style port
(bench/evsys_style.py); tinker-cookbook 0.6.1's own functions on the same
rollouts as cookbook types; tinker_rl_data.cookbook on those same cookbook
objects. A path whose feature is not in the installed build is reported as
"n/a (not in this build)"; the cookbook paths are skipped with a note when
tinker_cookbook does not import.

    python bench/e2e.py [--repeats N] [--workload NAME ...] [--no-memory] [--profile PATH]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import tinker_rl_data as trd  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.types import ForwardBackwardInput, ForwardBackwardRequest  # noqa: E402

import evsys_style  # noqa: E402
from workloads import WORKLOADS, cookbook_available, merged_positions, positions, to_cookbook  # noqa: E402

NA = "n/a (not in this build)"


def memory(workload: str, impl: str, scale: float = 1.0) -> tuple[float, float]:
    """(peak RSS growth during one call, RSS held by its result), MiB, in a
    fresh process (`bench.py --memory-probe`): in this one, freed memory would be reused and hide both."""
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(HERE / "bench.py"), "--memory-probe", workload, impl, str(scale)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:  # reported, not fatal: the timings are still worth writing
        print(f"memory probe {workload} {impl} failed:\n{proc.stderr[-2000:]}", file=sys.stderr, flush=True)
        return None
    peak, held = json.loads(proc.stdout.splitlines()[-1])
    return peak, held


def _has_kw(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def features() -> dict[str, str | None]:
    """Feature -> None when the installed build has it, else why not."""
    out: dict[str, str | None] = {
        "numpy_tokens": None if _has_kw(trd.assemble_training_data, "model_input_tokens") else NA,
        "merge_turns": None if _has_kw(trd.assemble_training_data, "merge_turns") else NA,
        "merge_turns_arrays": None if _has_kw(trd.assemble_arrays, "merge_turns") else NA,
        "baselines": None
        if _has_kw(trd.compute_advantages, "baseline") and _has_kw(trd.compute_advantages, "scale_by_std")
        else NA,
        "remove_constant_reward_groups": None if hasattr(trd, "remove_constant_reward_groups") else NA,
        "wire": None if encode_forward_backward is not None else NA,
    }
    try:
        mod = importlib.import_module("tinker_rl_data.cookbook")
        ok = all(hasattr(mod, n) for n in ("compute_advantages", "assemble_training_data"))
        out["trd_cookbook"] = None if ok else NA
    except ImportError:
        out["trd_cookbook"] = NA
    except Exception as exc:  # a module that fails to import for another reason
        out["trd_cookbook"] = f"n/a (tinker_rl_data.cookbook failed to import: {type(exc).__name__}: {exc})"
    why = cookbook_available()
    out["tinker_cookbook"] = (
        None
        if why is None
        else f"skipped: tinker_cookbook does not import ({why}); install it with "
        "`bash scripts/install_cookbook.sh` or `pip install torch chz pillow blobfile datasets termcolor "
        "&& pip install --no-deps tinker-cookbook==0.6.1`"
    )
    return out


def request_of(datums) -> ForwardBackwardRequest:
    return ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(data=datums, loss_fn="importance_sampling"),
        model_id="model",
        seq_id=1,
    )


def encode(datums, deterministic: bool = False) -> bytes:
    """What tinker's own forward_backward sends: the request's proto bytes."""
    return forward_backward_request_to_proto(request_of(datums)).SerializeToString(deterministic=deterministic)


try:
    from tinker_rl_data import encode_forward_backward
except ImportError:  # a build without the encoder
    encode_forward_backward = None


def encode_ours(datums) -> bytes:
    """What tinker sends after tinker_rl_data.install(): the same message."""
    return encode_forward_backward(request_of(datums))


class Route:
    """One way from rollouts to datums: advantages(inputs) -> adv;
    assemble(inputs, adv) -> datums. `cookbook`: takes cookbook objects.
    `ours`: a tinker_rl_data path, whose request bytes our encoder makes
    when the build has it."""

    def __init__(self, label, advantages, assemble, cookbook=False, merged=False, why=None, ours=True):
        self.label, self.advantages, self.assemble = label, advantages, assemble
        self.cookbook, self.merged, self.why = cookbook, merged, why
        self.encode = encode_ours if ours and encode_forward_backward is not None else encode


def paths(workload: str, feat: dict[str, str | None]) -> list[Route]:
    out = [
        Route(
            "tinker_rl_data, list model input",
            trd.compute_advantages,
            lambda g, a: trd.assemble_training_data(g, a)[0],
        ),
        Route(
            'tinker_rl_data, model_input_tokens="numpy"',
            trd.compute_advantages,
            lambda g, a: trd.assemble_training_data(g, a, model_input_tokens="numpy")[0],
            why=feat["numpy_tokens"],
        ),
    ]
    if workload == "multi_turn_agent":
        numpy_kw = {} if feat["numpy_tokens"] else {"model_input_tokens": "numpy"}
        out.append(
            Route(
                "tinker_rl_data, merge_turns=True" + (', numpy' if numpy_kw else ""),
                trd.compute_advantages,
                lambda g, a: trd.assemble_training_data(g, a, merge_turns=True, **numpy_kw)[0],
                merged=True,
                why=feat["merge_turns"],
            )
        )
    out.append(Route("evsys-style port (plain Python)", evsys_style.compute_advantages,
                     lambda g, a: evsys_style.assemble_training_data(g, a)[0], ours=False))
    if feat["tinker_cookbook"] is None:
        from tinker_cookbook.rl import data_processing as cb

        out.append(Route("tinker-cookbook 0.6.1 (torch)", cb.compute_advantages,
                         lambda g, a: cb.assemble_training_data(g, a)[0], cookbook=True, merged=True, ours=False))
    else:
        out.append(Route("tinker-cookbook 0.6.1 (torch)", None, None, cookbook=True, merged=True,
                         why="skipped: tinker_cookbook does not import (see the note)", ours=False))
    if feat["trd_cookbook"] is None and feat["tinker_cookbook"] is None:
        ours = importlib.import_module("tinker_rl_data.cookbook")
        out.append(Route("tinker_rl_data.cookbook", ours.compute_advantages,
                         lambda g, a: ours.assemble_training_data(g, a)[0], cookbook=True, merged=True))
    else:
        out.append(Route("tinker_rl_data.cookbook", None, None, cookbook=True, merged=True,
                         why=feat["trd_cookbook"] or "skipped: its input here is tinker_cookbook's types"))
    return out


def run_once(path: Route, inputs):
    """(advantages s, assembly s, encoding s, tinker's encoding s, request
    bytes): the path's encoder, then tinker's on the same Datums (the same
    run when the path's is tinker's); the results are freed outside the
    clocks."""
    t0 = time.perf_counter()
    adv = path.advantages(inputs)
    t1 = time.perf_counter()
    datums = path.assemble(inputs, adv)
    t2 = time.perf_counter()
    body = path.encode(datums)
    enc = time.perf_counter() - t2
    n = len(body)
    del body
    enc_tinker = enc
    if path.encode is not encode:
        t3 = time.perf_counter()
        body = encode(datums)
        enc_tinker = time.perf_counter() - t3
        del body
    del adv, datums
    return t1 - t0, t2 - t1, enc, enc_tinker, n


def measure(path: Route, inputs, repeats: int) -> dict:
    run_once(path, inputs)  # warm-up
    runs = [run_once(path, inputs) for _ in range(repeats)]
    total = [a + b + c for a, b, c, _, _ in runs]
    return {
        "total": statistics.median(total),
        "total_tinker": statistics.median(a + b + d for a, b, _, d, _ in runs),
        "adv": statistics.median(r[0] for r in runs),
        "asm": statistics.median(r[1] for r in runs),
        "enc": statistics.median(r[2] for r in runs),
        "enc_tinker": statistics.median(r[3] for r in runs),
        "enc_share": statistics.median(r[2] / t for r, t in zip(runs, total)),
        "encoder": "tinker_rl_data's" if path.encode is encode_ours else "tinker's",
        "bytes": runs[0][4],
    }


def sent_positions(datums) -> int:
    return sum(d.model_input.length for d in datums)


def check_bytes(label_a, datums_a, label_b, datums_b) -> str:
    same = encode(datums_a, True) == encode(datums_b, True)
    return f"{label_b}: request bytes {'identical to' if same else 'DIFFER from'} {label_a}'s"


def run(workload_names, repeats: int, with_memory: bool = True, log=print) -> dict:
    """Measure every path on every workload; returns rows and notes."""
    feat = features()
    rows, notes = [], []
    for why in {feat["tinker_cookbook"]} - {None}:
        notes.append(f"tinker-cookbook rows {why}")
    for name in workload_names:
        groups = WORKLOADS[name].build()
        n_pos, n_datums = positions(groups)
        m_pos, m_datums = merged_positions(groups)
        cb_groups = to_cookbook(groups) if feat["tinker_cookbook"] is None else None
        results: dict[str, dict] = {}
        outputs = {}
        for p in paths(name, feat):
            r = {"workload": name, "path": p.label, "n_pos": n_pos, "merged": p.merged}
            if p.why:
                r["na"] = p.why
                rows.append(r)
                log(f"{name:18} {p.label:45} {p.why}")
                continue
            inputs = cb_groups if p.cookbook else groups
            try:
                datums = p.assemble(inputs, p.advantages(inputs))
                r["sent"] = sent_positions(datums)
                r["datums"] = len(datums)
                outputs[p.label] = datums
                m = measure(p, inputs, repeats)
            except Exception as exc:  # report, never crash the bench
                r["na"] = f"failed: {type(exc).__name__}: {exc}"
                rows.append(r)
                log(f"{name:18} {p.label:45} {r['na']}")
                continue
            r.update(m)
            results[p.label] = m
            rows.append(r)
            log(f"{name:18} {p.label:45} {m['total'] * 1e3:8.1f} ms {m['total'] / n_pos * 1e9:7.1f} ns/pos "
                f"{m['bytes'] / r['sent']:5.1f} B/sent pos, {m['encoder']} encoder {m['enc_share'] * 100:3.0f}% "
                f"(with tinker's: {m['total_tinker'] * 1e3:.1f} ms)")
        base = {
            "list": results.get("tinker_rl_data, list model input"),
            "port": results.get("evsys-style port (plain Python)"),
            "cookbook": results.get("tinker-cookbook 0.6.1 (torch)"),
        }
        for r in rows:
            if r["workload"] == name and "total" in r:
                r["ratios"] = {k: (b["total"] / r["total"] if b else None) for k, b in base.items()}
        ref = outputs.get("tinker_rl_data, list model input")
        for label in ('tinker_rl_data, model_input_tokens="numpy"',):
            if ref is not None and label in outputs:
                notes.append(f"{name}: " + check_bytes("list mode", ref, label, outputs[label]))
        if "tinker-cookbook 0.6.1 (torch)" in outputs and "tinker_rl_data.cookbook" in outputs:
            notes.append(f"{name}: " + check_bytes("tinker-cookbook", outputs["tinker-cookbook 0.6.1 (torch)"],
                                                   "tinker_rl_data.cookbook", outputs["tinker_rl_data.cookbook"]))
        if name == "multi_turn_agent":
            notes.append(f"{name}: {n_pos:,} positions in {n_datums} per-turn rows; {m_pos:,} positions in "
                         f"{m_datums} rows after merging (docs/contract.md §6, as tinker-cookbook merges)")
        del groups, cb_groups, outputs, results
        gc.collect()
    mem = []
    if with_memory:
        for name in workload_names:
            for impl, label, why in [
                ("pipeline", "list model input", None),
                ("pipeline_numpy", 'model_input_tokens="numpy"', feat["numpy_tokens"]),
            ]:
                if why:
                    mem.append((name, label, why))
                    continue
                mem.append((name, label, memory(name, impl) or "probe failed"))
    return {"rows": rows, "notes": notes, "memory": mem, "repeats": repeats}


def _x(v) -> str:
    return f"{v:.1f}x" if v else ""


def fmt(result: dict) -> str:
    lines = [
        "| workload | path | positions sent | median ms | ns / position | bytes / position sent"
        " | advantages / assembly / encoding ms | encoder | share in the encoder"
        " | with tinker's encoder: encoding / total ms"
        " | vs list tokens | vs evsys-style port | vs tinker-cookbook |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        if "na" in r:
            lines.append(f"| {r['workload']} | {r['path']} | | {r['na']} | | | | | | | | | |")
            continue
        q = r["ratios"]
        lines.append(
            f"| {r['workload']} | {r['path']} | {r['sent']:,} | {r['total'] * 1e3:.1f} | "
            f"{r['total'] / r['n_pos'] * 1e9:.1f} | {r['bytes'] / r['sent']:.1f} | "
            f"{r['adv'] * 1e3:.1f} / {r['asm'] * 1e3:.1f} / {r['enc'] * 1e3:.1f} | {r['encoder']} | "
            f"{r['enc_share'] * 100:.0f}% | {r['enc_tinker'] * 1e3:.1f} / {r['total_tinker'] * 1e3:.1f} | "
            f"{_x(q['list'])} | {_x(q['port'])} | {_x(q['cookbook'])} |"
        )
    return "\n".join(lines)


def fmt_memory(result: dict) -> str:
    lines = [
        "| workload | model input | peak RSS growth | held by the result | peak / result |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, label, m in result["memory"]:
        if isinstance(m, str):
            lines.append(f"| {name} | {label} | {m} | | |")
        else:
            peak, held = m
            ratio = f"{peak / held:.2f}" if held > 0 else ""
            lines.append(f"| {name} | {label} | {peak:.0f} MiB | {held:.0f} MiB | {ratio} |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    return "\n".join([
        "## End to end: rollouts to request bytes",
        "",
        "compute_advantages + assemble_training_data + the request encoding every `forward_backward` call runs:",
        "ours (`tinker_rl_data.encode_forward_backward`, as after `tinker_rl_data.install()`) on tinker_rl_data's paths, tinker's",
        "`forward_backward_request_to_proto(...).SerializeToString()` on the others (\"encoder\"); tinker's is also",
        "timed on every path's Datums, its total beside.",
        f"Median of {result['repeats']} runs after a warm-up, GC enabled. ns / position",
        "counts the package's per-turn rows (per turn) for every path, so a path that merges turns is",
        "credited with the positions it did not have to send; \"positions sent\" are the model-input",
        "positions in the request. The tinker-cookbook paths run on the same rollouts converted to",
        "cookbook types (outside the clock), with provenance on (its default; every action has a",
        "sequence_id). Ratios: that column's path's median over this row's (> 1: this row is faster), same run.",
        "",
        fmt(result),
        "",
        *[f"- {n}" for n in result["notes"]],
        "",
        "Peak RSS growth during one compute_advantages + assemble_training_data call against the RSS its",
        "result holds (fresh process per figure):",
        "",
        fmt_memory(result),
    ])


def profile(workload: str, out: Path) -> None:
    """cProfile of one end-to-end call per available path, top functions by
    own time, written to `out`."""
    import cProfile
    import io
    import pstats

    feat = features()
    groups = WORKLOADS[workload].build()
    cb_groups = to_cookbook(groups) if feat["tinker_cookbook"] is None else None
    text = []
    for p in paths(workload, feat):
        if p.why:
            continue
        inputs = cb_groups if p.cookbook else groups
        run_once(p, inputs)
        prof = cProfile.Profile()
        prof.enable()
        run_once(p, inputs)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        text.append(f"=== {workload}: {p.label}\n{s.getvalue()}")
    out.write_text("\n".join(text))
    print(f"profile written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", type=Path, help="write a cProfile of one call per path on --workload[0]")
    args = parser.parse_args()
    if args.profile:
        profile(args.workload[0], args.profile)
        return
    result = run(args.workload, max(args.repeats, 1), with_memory=not args.no_memory)
    print()
    print(markdown(result))


if __name__ == "__main__":
    main()
