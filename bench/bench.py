"""Benchmark: tinker_rl_data against the plain-Python reference of the contract (docs/contract.md),
on the workloads of bench/workloads.py and a scaling series, with CPython's own floor
(reading every input object once; building the model-input lists). Python's GC stays enabled, as in
real use. Writes bench/RESULTS.md (and bench/scaling.png with matplotlib).

    python bench/bench.py [--quick] [--no-50m] [--repeats N] [--results PATH]

Then the rows issues 7-11 ask for, each measured when the installed build
has its feature and reported as "n/a (not in this build)" otherwise:
model_input_tokens="numpy" (pipeline, memory, assembly alone against the
read floor), merge_turns on multi_turn_agent, the advantage estimators and
remove_constant_reward_groups, tinker_rl_data.cookbook against
tinker-cookbook 0.6.1 (skipped with a note when tinker_cookbook does not
import), the end-to-end table of bench/e2e.py (up to the request bytes), the
RSS kept by keeping one Datum of a large batch, interrupt latency, and the
request encoding of bench/wire.py (tinker_rl_data.encode_forward_backward against tinker's).
Comparing two builds in one run: bench/compare_wheels.py.

Times are medians of >= 5 runs after a warm-up; each run's results are kept
alive until its clock stops and freed outside it, for every implementation.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import numpy as np  # noqa: E402
import tinker  # noqa: E402

import evsys_style  # noqa: E402
from support import reference  # noqa: E402
import tinker_rl_data as trd  # noqa: E402
from e2e import NA, features, memory  # noqa: E402
from workloads import WORKLOADS, Workload, merged_positions, positions, to_cookbook  # noqa: E402

try:  # an internal name: the module may be renamed
    from tinker_rl_data.rows import direct  # noqa: E402

    DIRECT_PATH = direct()
except ImportError:
    DIRECT_PATH = "unknown"

def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def reset_hwm() -> bool:
    try:  # writing 5 resets the peak-RSS mark (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timed(fn, repeats: int) -> list[float]:
    """Seconds per run, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result  # freed outside the clock
    return times


def memory_probe(workload: str, impl: str, scale: float) -> None:
    import json

    groups = WORKLOADS[workload].build(scale=scale)
    advantages = trd.compute_advantages(groups)
    calls = {
        "pipeline": lambda: pipeline(trd)(groups),
        "pipeline_numpy": lambda: pipeline(trd, model_input_tokens="numpy")(groups),
        "merged": lambda: pipeline(trd, merge_turns=True)(groups),
        "arrays": lambda: trd.assemble_arrays(groups, advantages),
    }
    if impl.startswith("cookbook"):  # converted before the baseline is taken
        cb_groups = to_cookbook(groups)
        if impl == "cookbook":
            from tinker_cookbook.rl import data_processing as cb
        else:
            from tinker_rl_data import cookbook as cb
        del groups, advantages
        calls = {impl: lambda: pipeline(cb)(cb_groups)}
    gc.collect()
    before = rss_kib()
    if not reset_hwm():
        print(json.dumps([float("nan"), float("nan")]))
        return
    result = calls[impl]()
    peak, held = hwm_kib() - before, rss_kib() - before
    print(json.dumps([peak / 1024, held / 1024]))
    del result


def read_floor(groups):
    """Touching every input token and logprob object once, at C speed: a
    floor for any implementation that reads Python lists."""
    return [
        (sum(turn.prompt_tokens), sum(turn.completion_tokens), sum(turn.logprobs))
        for g in groups
        for t in g.trajectories
        for turn in t.turns
    ]


def list_floor(groups):
    """Only the model-input lists every Datum must hold, built by CPython's
    own list slicing and concatenation."""
    return [
        turn.prompt_tokens + turn.completion_tokens[:-1]
        for g in groups
        for t in g.trajectories
        for turn in t.turns
    ]


def other_thread_share(call, seconds: float = 2.0) -> float:
    """The share of a busy Python thread's progress kept while `call` runs
    in a loop beside it, against the same thread running alone."""
    import threading

    def spin(stop, out):
        n = 0
        while not stop.is_set():
            n += 1
        out.append(n)

    rates = []
    for busy in (False, True):
        stop, out = threading.Event(), []
        thread = threading.Thread(target=spin, args=(stop, out))
        thread.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if busy:
                call()
            else:
                time.sleep(0.01)
        stop.set()
        thread.join()
        rates.append(out[0] / (time.perf_counter() - t0))
    return rates[1] / rates[0]


def pipeline(module, **kw):
    def run(groups):
        advantages = module.compute_advantages(groups)
        return module.assemble_training_data(groups, advantages, **kw)

    return run


def young_gc_after(run, repeats: int = 3) -> float:
    """Seconds of the young collection due after one call, with its result
    held (``gc.collect(0)`` right after it): CPython runs it at the next
    allocation after the call, so it is not in the call's time."""
    times = []
    for _ in range(repeats):
        result = run()
        t0 = time.perf_counter()
        gc.collect(0)
        times.append(time.perf_counter() - t0)
        del result
    return statistics.median(times)


def row(name, impl, seconds, n_pos, n_datums, refs=(None, None), mem=None):
    """`refs`: the medians of the contract reference and of the evsys-style port."""
    med = statistics.median(seconds)
    return {
        "workload": name,
        "impl": impl,
        "ms": med * 1e3,
        "ns_pos": med / n_pos * 1e9,
        "us_datum": med / n_datums * 1e6,
        "ratios": [(r / med) if r else None for r in refs],
        "mem": mem,
    }


def na_row(name, impl, why):
    return {"workload": name, "impl": impl, "na": why}


def fmt(rows: list[dict]) -> str:
    lines = [
        "| workload | implementation | median ms | ns / position | us / datum | speed-up vs contract reference"
        " | vs evsys-style port | peak RSS growth / result size |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "na" in r:
            lines.append(f"| {r['workload']} | {r['impl']} | {r['na']} | | | | | |")
            continue
        ratio = " | ".join(f"{x:.1f}x" if x else "" for x in r["ratios"])
        mem = ""
        if r["mem"]:
            peak, held = r["mem"]
            mem = f"{peak:.0f} / {held:.0f} MiB = {peak / held:.2f}" if held > 0 else f"{peak:.0f} MiB"
        lines.append(
            f"| {r['workload']} | {r['impl']} | {r['ms']:.1f} | {r['ns_pos']:.1f} | {r['us_datum']:.2f} | {ratio} | {mem} |"
        )
    return "\n".join(lines)


def ratio_cell(num, den, target=None) -> str:
    if num is None or den is None:
        return NA
    r = num / den
    return f"{r:.2f}x" + (f" (target <= {target}x)" if target else "")


def young_gc_section(young_rows) -> list[str]:
    lines = [
        "## The young collection after a call",
        "",
        "A call holds the cyclic GC off; the young collection its new objects are due (it walks each",
        "new container once, as after any call that returns them) runs at the caller's next allocation,",
        "so it is not in the times above. Its own time, result held (`gc.collect(0)` right after the",
        "call); the end-to-end table below includes it (in its encoding column).",
        "",
        "| workload | tinker_rl_data pipeline ms | young collection after it ms |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {call * 1e3:.1f} | {young * 1e3:.1f} |" for name, call, young in young_rows]
    return ["\n".join(lines)]


def floor_section(floor_rows) -> list[str]:
    """Issue 9: assembly alone (advantages given) in numpy mode against
    CPython reading every input int and float once."""
    lines = [
        "## Assembly alone against the CPython read floor",
        "",
        "assemble_training_data with the advantages already computed, against `floor: sum() over every",
        "input list` above (same run). Issue 9's target: numpy mode <= 1.3x the floor.",
        "",
        "| workload | list model input ms | numpy model input ms | read floor ms | list / floor | numpy / floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, _n_pos, asm_list, asm_np, floor in floor_rows:
        np_ms = f"{asm_np * 1e3:.1f}" if asm_np else NA
        lines.append(f"| {name} | {asm_list * 1e3:.1f} | {np_ms} | {floor * 1e3:.1f} | "
                     f"{asm_list / floor:.2f}x | {ratio_cell(asm_np, floor, 1.3)} |")
    return ["\n".join(lines)]


def count_sent(datums) -> int:
    return sum(d.model_input.length for d in datums)


def merge_section(feat, repeats) -> list[str]:
    """Issue 8: merge_turns=True on multi_turn_agent against the per-turn call."""
    groups = WORKLOADS["multi_turn_agent"].build()
    advantages = trd.compute_advantages(groups)
    n_pos, n_datums = positions(groups)
    m_pos, m_datums = merged_positions(groups)
    lines = [
        "## merge_turns on multi_turn_agent",
        "",
        f"Per-turn rows: {n_pos:,} positions in {n_datums} datums; merged (docs/contract.md §6, counted in plain Python):",
        f"{m_pos:,} positions in {m_datums} datums ({m_pos / n_pos:.2f} of the positions). Advantages given;",
        "the merged call reads the same input and writes the merged rows. Issue 8's target: <= 1.3x.",
        "",
        "| call | per-turn ms | merge_turns=True ms | merged / per-turn | positions out (per-turn -> merged) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    calls = [("assemble_training_data", trd.assemble_training_data, feat["merge_turns"], {}),
             ("assemble_arrays", trd.assemble_arrays, feat["merge_turns_arrays"], {})]
    if feat["numpy_tokens"] is None:
        calls.append(('assemble_training_data, model_input_tokens="numpy"', trd.assemble_training_data,
                      feat["merge_turns"], {"model_input_tokens": "numpy"}))
    for label, fn, why, kw in calls:
        per_turn = statistics.median(timed(lambda: fn(groups, advantages, **kw), repeats))
        if why:
            lines.append(f"| {label} | {per_turn * 1e3:.1f} | {why} | | |")
            continue
        try:
            merged = statistics.median(timed(lambda: fn(groups, advantages, merge_turns=True, **kw), repeats))
            out = fn(groups, advantages, merge_turns=True, **kw)
            sent = int(len(out.input_tokens)) if hasattr(out, "input_tokens") else count_sent(out[0])
            del out
        except Exception as exc:
            lines.append(f"| {label} | {per_turn * 1e3:.1f} | failed: {type(exc).__name__}: {exc} | | |")
            continue
        lines.append(f"| {label} | {per_turn * 1e3:.1f} | {merged * 1e3:.1f} | "
                     f"{ratio_cell(merged, per_turn, 1.3)} | {n_pos:,} -> {sent:,} |")
    del groups, advantages
    gc.collect()
    return ["\n".join(lines)]


def interleaved(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Medians of two calls timed alternately (one warm-up each), so that
    the drift of a shared machine hits both alike."""
    fn_a(), fn_b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((fn_a, ta), (fn_b, tb)):
            t0 = time.perf_counter()
            result = fn()
            out.append(time.perf_counter() - t0)
            del result
    return statistics.median(ta), statistics.median(tb)


def advantages_section(feat, small, repeats) -> list[str]:
    """Issue 8: the estimators and the filter against today's compute_advantages,
    each timed alternately with it."""
    n = len(small) * len(small[0].trajectories)
    base_fn = lambda: trd.compute_advantages(small)  # noqa: E731
    lines = [
        f"## Advantage estimators and the constant-reward filter ({len(small)} groups x {len(small[0].trajectories)})",
        "",
        "Each call timed alternately with the default compute_advantages (same run, interleaved).",
        "Issue 8's target: <= 1.2x.",
        "",
        "| call | median ms | ns / trajectory | default compute_advantages ms | vs compute_advantages() |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    variants = [
        ('baseline="leave_one_out"', lambda: trd.compute_advantages(small, baseline="leave_one_out"),
         feat["baselines"]),
        ("scale_by_std=True", lambda: trd.compute_advantages(small, scale_by_std=True), feat["baselines"]),
        ('baseline="leave_one_out", scale_by_std=True',
         lambda: trd.compute_advantages(small, baseline="leave_one_out", scale_by_std=True), feat["baselines"]),
        ("remove_constant_reward_groups(groups)",
         lambda: trd.remove_constant_reward_groups(small), feat["remove_constant_reward_groups"]),
    ]
    for label, fn, why in variants:
        if why:
            lines.append(f"| {label} | {why} | | | |")
            continue
        try:
            base, t = interleaved(base_fn, fn, repeats)
        except Exception as exc:
            lines.append(f"| {label} | failed: {type(exc).__name__}: {exc} | | | |")
            continue
        lines.append(f"| {label} | {t * 1e3:.2f} | {t / n * 1e9:.0f} | {base * 1e3:.2f} | "
                     f"{ratio_cell(t, base, 1.2)} |")
    return ["\n".join(lines)]


COOKBOOK_TARGETS = {"single_turn_long": 40, "multi_turn_agent": 25, "many_short": 20}


def cookbook_section(feat, repeats) -> list[str]:
    """Issue 7: tinker_rl_data.cookbook against tinker-cookbook 0.6.1's own
    compute_advantages + assemble_training_data (provenance on)."""
    head = [
        "## tinker-cookbook drop-in (tinker_rl_data.cookbook)",
        "",
        "compute_advantages + assemble_training_data (include_provenance=True, the default), timed",
        "alternately (one of each per round), on the",
        "rollouts converted to tinker-cookbook 0.6.1 types (outside the clock; multi_turn_agent's",
        "observations extend the previous turn, so both merge it). ns / position counts the per-turn",
        "positions. Issue 7's targets: >= 40x / 25x / 20x; peak memory <= 1.2x the result.",
        "The young collection due after a call (its new objects, result held) runs at the caller's",
        "next allocation, outside both calls' times; its own time, for each side, is in the last two",
        "columns (tinker-cookbook runs with the GC on, so most of its collections fall inside its call).",
        "",
    ]
    if feat["tinker_cookbook"]:
        return ["\n".join(head + [f"Not measured: tinker-cookbook {feat['tinker_cookbook']}."])]
    from tinker_cookbook.rl import data_processing as cb

    lines = head + [
        "| workload | positions sent | tinker-cookbook ms | ns / position | tinker_rl_data.cookbook ms | ns / position"
        " | speed-up | peak RSS growth / result: cookbook | ours | young GC after: cookbook ms | ours ms"
        " | speed-up, young GC counted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ours_mod = None
    if feat["trd_cookbook"] is None:
        from tinker_rl_data import cookbook as ours_mod
    for name in WORKLOADS:
        groups = WORKLOADS[name].build()
        n_pos, _ = positions(groups)
        cb_groups = to_cookbook(groups)
        del groups
        theirs_run, ours_run = (lambda: pipeline(cb)(cb_groups)), (lambda: pipeline(ours_mod)(cb_groups))
        ours = failure = None
        try:
            # Alternately, so that the drift of a shared machine hits both alike.
            theirs, ours = interleaved(theirs_run, ours_run, repeats) if ours_mod else (None, None)
        except Exception as exc:
            failure = f"failed: {type(exc).__name__}: {exc}"
        if ours is None:
            theirs = statistics.median(timed(theirs_run, repeats))
        sent = count_sent(pipeline(cb)(cb_groups)[0])
        mem_theirs = mem_cell(memory(name, "cookbook"))
        young_theirs = young_gc_after(theirs_run)
        gc_theirs = f"{young_theirs * 1e3:.1f}"
        if ours is None:
            ours_cells = f"{failure or feat['trd_cookbook']} | | | {mem_theirs} | | {gc_theirs} | | |"
        else:
            target = COOKBOOK_TARGETS[name]
            gc_ours = young_gc_after(ours_run)
            ours_cells = (f"{ours * 1e3:.1f} | {ours / n_pos * 1e9:.1f} | {theirs / ours:.1f}x (target >= {target}x)"
                          f" | {mem_theirs} | {mem_cell(memory(name, 'cookbook_ours'))} | {gc_theirs}"
                          f" | {gc_ours * 1e3:.1f} | {(theirs + young_theirs) / (ours + gc_ours):.1f}x |")
        lines.append(f"| {name} | {sent:,} | {theirs * 1e3:.1f} | {theirs / n_pos * 1e9:.1f} | {ours_cells}")
        print(lines[-1], flush=True)
        del cb_groups
        gc.collect()
    return ["\n".join(lines)]


def mem_cell(m) -> str:
    if m is None:
        return "probe failed"
    peak, held = m
    return f"{peak:.0f} / {held:.0f} MiB = {peak / held:.2f}" if held > 0 else f"{peak:.0f} MiB"


def e2e_section(repeats) -> list[str]:
    import e2e

    result = e2e.run(list(WORKLOADS), repeats, log=lambda s: print(s, flush=True))
    return [e2e.markdown(result)]


def wire_section(repeats) -> list[str]:
    """Request bytes: tinker_rl_data.encode_forward_backward against tinker's encoder (bench/wire.py)."""
    try:
        import wire
    except ImportError as exc:  # a build without tinker_rl_data.encode_forward_backward
        return [f"## Request bytes\n\n{NA}: {exc}"]
    log = lambda s: print(s, flush=True)  # noqa: E731
    encoding = [row for name in WORKLOADS for row in wire.encoding_rows(name, repeats, log)]
    pipeline = [row for name in WORKLOADS for row in wire.pipeline_rows(name, repeats, log)]
    return [wire.markdown(encoding, pipeline, repeats)]


def retention_probe(mode: str) -> None:
    """Keep one Datum per step of a 6.3 M-position batch (4x single_turn_long)
    for 4 steps; print the RSS kept per step, MiB."""
    import json

    groups = WORKLOADS["single_turn_long"].build(scale=4)
    advantages = trd.compute_advantages(groups)
    kw = {"model_input_tokens": "numpy"} if mode == "numpy" else {}
    module = evsys_style if mode == "port" else trd
    kept = []
    module.assemble_training_data(groups, advantages, **kw)  # warm-up
    gc.collect()
    before = rss_kib()
    steps = 4
    for _ in range(steps):
        datums, _meta = module.assemble_training_data(groups, advantages, **kw)
        kept.append(datums[0])
        del datums, _meta
        gc.collect()
    print(json.dumps((rss_kib() - before) / 1024 / steps))


def retention_section(feat) -> list[str]:
    """Issue 11: RSS kept per step by keeping one Datum of a large batch."""
    import json
    import subprocess

    lines = [
        "## Keeping one Datum of a large batch",
        "",
        "Each of 4 steps assembles 4x single_turn_long (6.3 M positions) and keeps its first Datum (a",
        "replay buffer, a logged sample); RSS kept per step, fresh process. One Datum's own arrays are",
        "24 KiB (1,535 positions x (8 + 4 + 4) bytes), its model-input list 12 KiB of pointers.",
        "",
        "| path | RSS kept per step |",
        "| --- | ---: |",
    ]
    modes = [("tinker_rl_data, list model input", "list", None),
             ('tinker_rl_data, model_input_tokens="numpy"', "numpy", feat["numpy_tokens"]),
             ("evsys-style port (tinker's public constructors)", "port", None)]
    for label, mode, why in modes:
        if why:
            lines.append(f"| {label} | {why} |")
            continue
        out = subprocess.run([sys.executable, __file__, "--retention-probe", mode],
                             check=True, capture_output=True, text=True).stdout
        lines.append(f"| {label} | {json.loads(out.splitlines()[-1]):.1f} MiB |")
        print(lines[-1], flush=True)
    return ["\n".join(lines)]


def interrupt_section() -> list[str]:
    """Issue 11: how soon a signal's KeyboardInterrupt arrives during a long
    assemble_training_data call (SIGALRM from setitimer, so the time the
    signal was sent is known without another thread needing the GIL)."""
    import signal

    groups = WORKLOADS["single_turn_long"].build(scale=8)
    advantages = trd.compute_advantages(groups)
    t = statistics.median(timed(lambda: trd.assemble_training_data(groups, advantages), 3))

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    latencies, finished = [], 0
    try:
        for frac in (0.1, 0.3, 0.5, 0.7, 0.2, 0.4):
            gc.collect()
            delay = t * frac
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                result = trd.assemble_training_data(groups, advantages)
                t1 = time.perf_counter()
                del result
                finished += 1
                try:  # the interrupt arrives here, after the call
                    time.sleep(1.0)
                except KeyboardInterrupt:
                    pass
                latencies.append(t1 - t0 - delay)
            except KeyboardInterrupt:
                latencies.append(time.perf_counter() - t0 - delay)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    n_pos, _ = positions(groups)
    del groups, advantages
    gc.collect()
    lines = [
        "## Interrupt latency",
        "",
        f"assemble_training_data on 8x single_turn_long ({n_pos:,} positions, {t * 1e3:.0f} ms a call); a",
        "SIGALRM whose handler raises KeyboardInterrupt is sent at 10-70% of the call. Latency: from the",
        "signal to the exception (or to the call's return, when the call did not notice it).",
        "",
        f"- median latency {statistics.median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms "
        f"({max(latencies) / t * 100:.0f}% of the call); {finished} of {len(latencies)} calls returned a result "
        "before the exception. Issue 11's target: within 0.1 s or 10% of the call.",
    ]
    print(lines[-1], flush=True)
    return ["\n".join(lines)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller scaling series")
    parser.add_argument("--no-50m", action="store_true", help="skip the 50 M position run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-probe", nargs=3, metavar=("WORKLOAD", "IMPL", "SCALE"), help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS.md",
                        help="where to write the results (the chart is written only with the default)")
    parser.add_argument("--retention-probe", metavar="MODE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.retention_probe:
        retention_probe(args.retention_probe)
        return
    if args.memory_probe:
        workload, impl, scale = args.memory_probe
        memory_probe(workload, impl, float(scale))
        return
    repeats = 3 if args.quick else args.repeats
    assert gc.isenabled()
    rows: list[dict] = []

    feat = features()
    floor_rows: list[tuple] = []
    young_rows: list[tuple] = []
    for name, workload in WORKLOADS.items():
        groups = workload.build()
        n_pos, n_datums = positions(groups)
        advantages = trd.compute_advantages(groups)
        ref = timed(lambda: pipeline(reference)(groups), repeats)
        port = timed(lambda: pipeline(evsys_style)(groups), repeats)
        ours = timed(lambda: pipeline(trd)(groups), repeats)
        arrays = timed(lambda: trd.assemble_arrays(groups, advantages), repeats)
        refs = (statistics.median(ref), statistics.median(port))
        rows.append(row(name, "reference (plain Python, contract, checks every value)", ref, n_pos, n_datums))
        rows.append(row(name, "evsys-style port (plain Python, no checks)", port, n_pos, n_datums))
        rows.append(row(name, "tinker_rl_data", ours, n_pos, n_datums, refs, memory(name, "pipeline")))
        numpy_label = 'tinker_rl_data, model_input_tokens="numpy"'
        if feat["numpy_tokens"] is None:
            ours_np = timed(lambda: pipeline(trd, model_input_tokens="numpy")(groups), repeats)
            rows.append(row(name, numpy_label, ours_np, n_pos, n_datums, refs, memory(name, "pipeline_numpy")))
        else:
            rows.append(na_row(name, numpy_label, feat["numpy_tokens"]))
        rows.append(
            row(name, "tinker_rl_data.assemble_arrays", arrays, n_pos, n_datums, refs, memory(name, "arrays"))
        )
        floors = {}
        for label, fn in [
            ("floor: sum() over every input list", read_floor),
            ("floor: P + C[:-1] for every turn", list_floor),
        ]:
            floors[fn] = timed(lambda: fn(groups), repeats)
            rows.append(row(name, label, floors[fn], n_pos, n_datums, refs))
        # Assembly alone (advantages given), list and numpy model input, against the read floor.
        asm_list = timed(lambda: trd.assemble_training_data(groups, advantages), repeats)
        asm_np = None
        if feat["numpy_tokens"] is None:
            asm_np = timed(lambda: trd.assemble_training_data(groups, advantages, model_input_tokens="numpy"), repeats)
        floor_rows.append((name, n_pos, statistics.median(asm_list), asm_np and statistics.median(asm_np),
                           statistics.median(floors[read_floor])))
        young_rows.append((name, statistics.median(ours), young_gc_after(lambda: pipeline(trd)(groups))))
        print("\n".join(fmt(rows[-7:]).splitlines()[2:]), flush=True)
        del groups, advantages
        gc.collect()

    extra: list[str] = []
    extra += floor_section(floor_rows)
    extra += young_gc_section(young_rows)
    extra += merge_section(feat, repeats)
    # Advantages and metrics alone, on many small groups.
    small = Workload("advantages_4096x16", 4096, 16, 1, 4, 4).build()
    n_traj = 4096 * 16
    for fn in ("compute_advantages", "compute_trajectory_metrics"):
        ref = timed(lambda: getattr(reference, fn)(small), repeats * 2)
        port = timed(lambda: getattr(evsys_style, fn)(small), repeats * 2)
        ours = timed(lambda: getattr(trd, fn)(small), repeats * 2)
        refs = (statistics.median(ref), statistics.median(port))
        rows.append(row(f"{fn} 4096x16", "reference (plain Python, contract, checks every value)", ref, n_traj, n_traj))
        rows.append(row(f"{fn} 4096x16", "evsys-style port (plain Python, no checks)", port, n_traj, n_traj))
        rows.append(row(f"{fn} 4096x16", "tinker_rl_data", ours, n_traj, n_traj, refs))
    extra += advantages_section(feat, small, repeats * 2)
    del small
    extra += cookbook_section(feat, repeats)
    extra += e2e_section(repeats)
    extra += wire_section(repeats)
    extra += retention_section(feat)
    extra += interrupt_section()

    # How much of a call other Python threads (rollout workers) get to run.
    groups = WORKLOADS["single_turn_long"].build()
    advantages = trd.compute_advantages(groups)
    gil = {fn.__name__: other_thread_share(lambda: fn(groups, advantages)) for fn in (trd.assemble_arrays, trd.assemble_training_data)}
    del groups, advantages
    gc.collect()

    # Scaling: cost per position from 1x to 16x single_turn_long.
    scaling = []
    base = WORKLOADS["single_turn_long"]
    for scale in ([1, 4] if args.quick else [1, 2, 4, 8, 16]):
        groups = base.build(scale=scale)
        n_pos, n_datums = positions(groups)
        t = timed(lambda: pipeline(trd)(groups), repeats)
        scaling.append((scale, n_pos, statistics.median(t) / n_pos * 1e9))
        print(f"scale {scale}x: {n_pos:,} positions, {scaling[-1][2]:.1f} ns/position", flush=True)
        del groups
        gc.collect()
    big = None
    if not args.no_50m:
        scale = 50e6 / 1_571_840  # single_turn_long has 1,571,840 positions
        groups = base.build(scale=scale)
        n_pos, n_datums = positions(groups)
        t0 = time.perf_counter()
        result = pipeline(trd)(groups)
        seconds = time.perf_counter() - t0
        del result, groups
        gc.collect()
        peak, held = memory("single_turn_long", "pipeline", scale) or (float("nan"), float("nan"))
        big = (n_pos, n_datums, seconds, peak, held)
        print(f"50M run: {n_pos:,} positions in {seconds:.2f} s", flush=True)

    write_results(rows, scaling, big, repeats, gil, extra, args.results)


def write_results(rows, scaling, big, repeats, gil, extra=(), out: Path = HERE / "RESULTS.md") -> None:
    per_pos = [s[2] for s in scaling]
    spread = (max(per_pos) / min(per_pos) - 1) * 100 if per_pos else float("nan")
    mid = statistics.median(per_pos) if per_pos else float("nan")
    low, high = ((min(per_pos) / mid - 1) * 100, (max(per_pos) / mid - 1) * 100) if per_pos else (0, 0)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [
        "# Benchmark results",
        "",
        f"Machine: {os.cpu_count()} cores, {cpu}; Linux {platform.release()}; Python {platform.python_version()}; "
        f"tinker {tinker.__version__}; numpy {np.__version__}; tinker_rl_data {trd.__version__} "
        f"(direct Datum path: {DIRECT_PATH}).",
        f"Median of {repeats} runs after a warm-up, GC enabled, one process; ratios are against the",
        "reference measured in the same run. The pipeline is compute_advantages + assemble_training_data.",
        "The contract reference (tests/support/reference.py) checks every value as docs/contract.md §4 asks; the evsys-style port",
        "(bench/evsys_style.py) is the module we replace, without checks: the fastest plain-Python baseline.",
        "The two floor rows are not implementations: they time CPython alone reading every input object",
        "once, and building the model-input lists any implementation must return.",
        "",
        fmt(rows),
        "",
        "## Scaling (single_turn_long, pipeline)",
        "",
        "| scale | positions | ns / position |",
        "| ---: | ---: | ---: |",
        *[f"| {s}x | {n:,} | {v:.1f} |" for s, n, v in scaling],
        "",
        f"ns/position across the series: {low:+.0f}% to {high:+.0f}% of its median; max/min - 1 = {spread:.0f}%.",
    ]
    lines += [
        "",
        "## Other Python threads during a call",
        "",
        "A thread counting in a Python loop, while single_turn_long is assembled over and over beside it,",
        "keeps this share of the rate it has alone (with a second thread both share the GIL; 0.5 would be",
        "an even split):",
        "",
        *[f"- {name}: {share:.2f}" for name, share in gil.items()],
    ]
    if big:
        n_pos, n_datums, secs, peak, held = big
        lines += ["", f"50 M run: {n_pos:,} positions, {n_datums:,} datums in {secs:.2f} s; "
                  f"peak RSS growth {peak:.0f} MiB, held by the result {held:.0f} MiB."]
    for block in extra:
        lines += ["", *block.splitlines()]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text)
    if out.resolve() != (HERE / "RESULTS.md").resolve():
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([s[1] / 1e6 for s in scaling], [s[2] * s[1] / 1e9 for s in scaling], "o-", label="tinker_rl_data")
        ax.set_xlabel("positions (millions)")
        ax.set_ylabel("seconds per call")
        ax.set_title("assemble pipeline, single_turn_long scaled")
        ax.grid(True)
        fig.savefig(HERE / "scaling.png", dpi=100, bbox_inches="tight")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
