"""Two builds of tinker_rl_data in one run: the regression check issues 10
and 11 ask for ("within 5% of the previous commit's wheel, in the same run").

    python bench/compare_wheels.py OLD.whl NEW.whl [--repeats 5] [--rounds 3] [--callgrind]

Each wheel is unpacked into a temporary directory (nothing is installed);
each measurement runs in a fresh process with that directory first on
sys.path, the two builds alternating round by round so that the machine's
drift hits both alike. Times: compute_advantages + assemble_training_data
and assemble_arrays on the workloads of bench/workloads.py (median of --repeats per
round, median over rounds). With --callgrind (valgrind installed), also the
instruction count of one assemble_training_data call per build on each
workload, which the noise of a shared machine does not move.

Build the previous commit's wheel with e.g.
    git worktree add /tmp/prev HEAD~1 && (cd /tmp/prev && maturin build --release --out dist)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CALLS = ("pipeline", "assemble_arrays")


def worker(repeats: int) -> None:
    import gc
    import time

    sys.path[:0] = [str(HERE)]
    import tinker_rl_data as trd
    from workloads import WORKLOADS, positions

    out = {"file": trd.__file__, "version": trd.__version__}
    for name, w in WORKLOADS.items():
        groups = w.build()
        n_pos, _ = positions(groups)
        advantages = trd.compute_advantages(groups)
        calls = {
            "pipeline": lambda: trd.assemble_training_data(groups, trd.compute_advantages(groups)),
            "assemble_arrays": lambda: trd.assemble_arrays(groups, advantages),
        }
        for call, fn in calls.items():
            fn()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                result = fn()
                times.append(time.perf_counter() - t0)
                del result
            out[f"{name}/{call}"] = statistics.median(times) / n_pos * 1e9
        del groups, advantages
        gc.collect()
    print(json.dumps(out))


def callgrind_worker(name: str, skip: bool) -> None:
    """Build the batch, make one warm-up call, then (unless `skip`) the
    measured call: the difference of the two processes' counts is one call."""
    sys.path[:0] = [str(HERE)]
    import tinker_rl_data as trd
    from workloads import WORKLOADS

    groups = WORKLOADS[name].build()
    advantages = trd.compute_advantages(groups)
    trd.assemble_training_data(groups, advantages)
    if not skip:
        trd.assemble_training_data(groups, advantages)


def run_worker(site: Path, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([sys.executable, __file__, *args], env=env, check=True,
                          capture_output=True, text=True).stdout


def instructions(site: Path, name: str) -> int | None:
    """Instructions of one assemble_training_data call (callgrind, whole
    process minus the same process without the call)."""
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    counts = []
    for extra in ([], ["--callgrind-skip"]):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "cg.out"
            r = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                 sys.executable, __file__, "--callgrind-worker", name, *extra],
                env=env, capture_output=True, text=True)
            if r.returncode != 0:
                return None
            summary = next((l for l in out.read_text().splitlines() if l.startswith("summary:")), None)
            if summary is None:
                return None
            counts.append(int(summary.split()[1]))
    return counts[0] - counts[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, nargs="?")
    parser.add_argument("new", type=Path, nargs="?")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--callgrind-only", action="store_true", help="skip the timings")
    parser.add_argument("--workload", nargs="*", help="callgrind only these workloads (default: all)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--callgrind-worker", help=argparse.SUPPRESS)
    parser.add_argument("--callgrind-skip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeats)
        return
    if args.callgrind_worker:
        callgrind_worker(args.callgrind_worker, args.callgrind_skip)
        return
    if not (args.old and args.new):
        parser.error("give two wheels: OLD.whl NEW.whl")
    with tempfile.TemporaryDirectory() as tmp:
        sites = {}
        for label, wheel in (("old", args.old), ("new", args.new)):
            site = Path(tmp) / label
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
            sites[label] = site
        per = {"old": [], "new": []}
        for r in range(0 if args.callgrind_only else args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for label in order:
                res = json.loads(run_worker(sites[label], ["--worker", "--repeats", str(args.repeats)])
                                 .splitlines()[-1])
                assert res["file"].startswith(str(sites[label])), res["file"]
                per[label].append(res)
                print(f"round {r + 1} {label}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in res.items() if "/" in k), flush=True)
        keys = [k for k in per["old"][0] if "/" in k] if per["old"] else []
        if keys:
            print(f"\nns per position, median over {args.rounds} rounds of medians of {args.repeats}; "
                  f"old = {args.old.name}, new = {args.new.name}\n")
            print("| workload / call | old | new | new / old |")
            print("| --- | ---: | ---: | ---: |")
        for k in keys:
            o = statistics.median(x[k] for x in per["old"])
            n = statistics.median(x[k] for x in per["new"])
            flag = "" if n / o <= 1.05 else " (> 5% slower)"
            print(f"| {k} | {o:.1f} | {n:.1f} | {n / o:.3f}{flag} |")
        if args.callgrind or args.callgrind_only:
            print("\ninstructions of one assemble_training_data call (callgrind)\n")
            print("| workload | old | new | new / old |")
            print("| --- | ---: | ---: | ---: |")
            sys.path[:0] = [str(HERE)]
            from workloads import WORKLOADS

            for name in args.workload or WORKLOADS:
                o, n = instructions(sites["old"], name), instructions(sites["new"], name)
                if o is None or n is None:
                    print(f"| {name} | callgrind failed | | |")
                    continue
                print(f"| {name} | {o:,} | {n:,} | {n / o:.3f} |", flush=True)


if __name__ == "__main__":
    main()
