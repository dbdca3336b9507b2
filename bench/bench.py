"""Benchmark: tinker_rl_data against the plain-Python reference of SPEC.md,
on the SPEC §5 workloads and a scaling series, with CPython's own floor
(reading every input object once; building the model-input lists). Python's GC stays enabled, as in
real use. Writes bench/RESULTS.md (and bench/scaling.png with matplotlib).

    python bench/bench.py [--quick] [--no-50m]

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
import reference  # noqa: E402
import tinker_rl_data as trd  # noqa: E402
from tinker_rl_data.datums import DIRECT_PATH  # noqa: E402
from workloads import WORKLOADS, Workload, positions  # noqa: E402

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


def memory(workload: str, impl: str, scale: float = 1.0) -> tuple[float, float]:
    """(peak RSS growth during one call, RSS held by its result), MiB, in a
    fresh process: in this one, freed memory would be reused and hide both."""
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, "--memory-probe", workload, impl, str(scale)],
        check=True, capture_output=True, text=True,
    ).stdout
    peak, held = json.loads(out.splitlines()[-1])
    return peak, held


def memory_probe(workload: str, impl: str, scale: float) -> None:
    import json

    groups = WORKLOADS[workload].build(scale=scale)
    advantages = trd.compute_advantages(groups)
    calls = {
        "pipeline": lambda: pipeline(trd)(groups),
        "arrays": lambda: trd.assemble_arrays(groups, advantages),
    }
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


def pipeline(module):
    def run(groups):
        advantages = module.compute_advantages(groups)
        return module.assemble_training_data(groups, advantages)

    return run


def row(name, impl, seconds, n_pos, n_datums, refs=(None, None), mem=None):
    """`refs`: the medians of the SPEC reference and of the evsys-style port."""
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


def fmt(rows: list[dict]) -> str:
    lines = [
        "| workload | implementation | median ms | ns / position | us / datum | speed-up vs SPEC reference"
        " | vs evsys-style port | peak RSS growth / result size |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = " | ".join(f"{x:.1f}x" if x else "" for x in r["ratios"])
        mem = ""
        if r["mem"]:
            peak, held = r["mem"]
            mem = f"{peak:.0f} / {held:.0f} MiB = {peak / held:.2f}" if held > 0 else f"{peak:.0f} MiB"
        lines.append(
            f"| {r['workload']} | {r['impl']} | {r['ms']:.1f} | {r['ns_pos']:.1f} | {r['us_datum']:.2f} | {ratio} | {mem} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller scaling series")
    parser.add_argument("--no-50m", action="store_true", help="skip the 50 M position run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-probe", nargs=3, metavar=("WORKLOAD", "IMPL", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        workload, impl, scale = args.memory_probe
        memory_probe(workload, impl, float(scale))
        return
    repeats = 3 if args.quick else args.repeats
    assert gc.isenabled()
    rows: list[dict] = []

    for name, workload in WORKLOADS.items():
        groups = workload.build()
        n_pos, n_datums = positions(groups)
        advantages = trd.compute_advantages(groups)
        ref = timed(lambda: pipeline(reference)(groups), repeats)
        port = timed(lambda: pipeline(evsys_style)(groups), repeats)
        ours = timed(lambda: pipeline(trd)(groups), repeats)
        arrays = timed(lambda: trd.assemble_arrays(groups, advantages), repeats)
        refs = (statistics.median(ref), statistics.median(port))
        rows.append(row(name, "reference (plain Python, SPEC, checks every value)", ref, n_pos, n_datums))
        rows.append(row(name, "evsys-style port (plain Python, no checks)", port, n_pos, n_datums))
        rows.append(row(name, "tinker_rl_data", ours, n_pos, n_datums, refs, memory(name, "pipeline")))
        rows.append(
            row(name, "tinker_rl_data.assemble_arrays", arrays, n_pos, n_datums, refs, memory(name, "arrays"))
        )
        for label, fn in [
            ("floor: sum() over every input list", read_floor),
            ("floor: P + C[:-1] for every turn", list_floor),
        ]:
            rows.append(row(name, label, timed(lambda: fn(groups), repeats), n_pos, n_datums, refs))
        print("\n".join(fmt(rows[-6:]).splitlines()[2:]), flush=True)
        del groups, advantages
        gc.collect()

    # Advantages and metrics alone, on many small groups.
    small = Workload("advantages_4096x16", 4096, 16, 1, 4, 4).build()
    n_traj = 4096 * 16
    for fn in ("compute_advantages", "compute_trajectory_metrics"):
        ref = timed(lambda: getattr(reference, fn)(small), repeats * 2)
        port = timed(lambda: getattr(evsys_style, fn)(small), repeats * 2)
        ours = timed(lambda: getattr(trd, fn)(small), repeats * 2)
        refs = (statistics.median(ref), statistics.median(port))
        rows.append(row(f"{fn} 4096x16", "reference (plain Python, SPEC, checks every value)", ref, n_traj, n_traj))
        rows.append(row(f"{fn} 4096x16", "evsys-style port (plain Python, no checks)", port, n_traj, n_traj))
        rows.append(row(f"{fn} 4096x16", "tinker_rl_data", ours, n_traj, n_traj, refs))
    del small

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
        peak, held = memory("single_turn_long", "pipeline", scale)
        big = (n_pos, n_datums, seconds, peak, held)
        print(f"50M run: {n_pos:,} positions in {seconds:.2f} s", flush=True)

    write_results(rows, scaling, big, repeats, gil)


def write_results(rows, scaling, big, repeats, gil) -> None:
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
        "The SPEC reference (tests/reference.py) checks every value as SPEC §4 asks; the evsys-style port",
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
    text = "\n".join(lines) + "\n"
    (HERE / "RESULTS.md").write_text(text)
    print(text)
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
