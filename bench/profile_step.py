"""Where a trainer run's time goes: py-spy (every thread of the trainer's
process, not the fake service's) over one run of tests/support/trainer_run.py,
summarized by package and by function.

    python bench/profile_step.py --out prof [trainer_run options: --workload many_short
        --variant installed+gc --steps 2 --batch-scale 16 --shared-prompt ...]

writes prof.txt (py-spy's raw stacks, one line per stack with its count:
flamegraph.pl draws it) and prints, as shares of the samples taken:
the self time of each package (the innermost frame's file: tinker,
tinker_cookbook, tinker_rl_data, httpx, asyncio, ...) and of the 25 busiest
functions, and the time under each of a few frames (the step's phases).
`py-spy` must be installed (pip install py-spy; a profiling tool only).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE.parent / "tests" / "support" / "trainer_run.py"

# A frame in py-spy's raw output: "function (path/to/file.py:line)".
FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")

# The frames whose inclusive time is shown: the step's phases and the
# usual suspects.
UNDER = (
    "do_train_step_and_get_sampling_client",
    "do_group_rollout",
    "assemble_training_data",
    "forward_backward",
    "_result_async",
    "sample_async",
    "gc_collect",
)


# Packages a frame's time is charged to (the rest is the standard library's
# or the interpreter's: the event loop, threads, imports).
OWNERS = ("tinker_rl_data", "tinker_cookbook", "tinker", "pyqwest", "httpx", "httpcore", "pydantic", "numpy", "torch")


@functools.cache
def package(path: str) -> str:
    """The top-level package (or stdlib module) of a frame's file. py-spy
    shortens paths to their shortest unique suffix (``retry_handler.py``):
    such a file is looked for under the owners' installed directories."""
    head = path.split("/", 1)[0].removesuffix(".py")
    if head in OWNERS or path.startswith("<"):
        return head
    for name in OWNERS:
        spec = importlib.util.find_spec(name)
        if spec and any(next(Path(root).rglob(path), None) for root in spec.submodule_search_locations or ()):
            return name
    return head


def owner(frames: list[str]) -> str:
    """The package a sample's time is charged to: the innermost frame's of
    one of OWNERS (a standard-library leaf goes to its caller's), else
    "stdlib / interpreter" (the event loop, a thread's wait, an import)."""
    for frame in reversed(frames):
        match = FRAME.match(frame)
        name = package(match.group("file")) if match else ""
        if name in OWNERS:
            return name
    return "stdlib / interpreter"


def summarize(raw: Path, top: int = 25) -> str:
    own_pkg: collections.Counter[str] = collections.Counter()
    owners: collections.Counter[str] = collections.Counter()
    own_fn: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if frames and frames[0].startswith("process "):  # the fake service's, with --subprocesses
            continue
        total += n
        leaf = FRAME.match(frames[-1])
        file = leaf.group("file") if leaf else frames[-1]
        fn = leaf.group("fn") if leaf else frames[-1]
        own_pkg[package(file)] += n
        owners[owner(frames)] += n
        own_fn[f"{fn} ({package(file)})"] += n
        names = {(FRAME.match(f) or [None, f])[1] for f in frames}
        for name in UNDER:
            if name in names:
                under[name] += n
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "charged to (innermost frame of a package, standard library to its caller):"]
    lines += [f"  {k:<40} {v / total:6.1%}" for k, v in owners.most_common()]
    lines += ["", "self time by package:"]
    lines += [f"  {k:<40} {v / total:6.1%}" for k, v in own_pkg.most_common(15)]
    lines += ["", "self time by function:"]
    lines += [f"  {k:<70} {v / total:6.1%}" for k, v in own_fn.most_common(top)]
    lines += ["", "time under:"]
    lines += [f"  {k:<40} {under[k] / total:6.1%}" for k in UNDER]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="prof.txt (raw stacks) is written here")
    p.add_argument("--rate", type=int, default=50, help="samples per second")
    p.add_argument("--summarize", action="store_true", help="only summarize the existing prof.txt")
    p.add_argument("--gil", action="store_true", help="only the thread holding the GIL (py-spy --gil): where CPU goes, not waits")
    args, run = p.parse_known_args()
    raw = Path(args.out).with_suffix(".txt")
    if args.summarize:
        print(summarize(raw))
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [spy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), *(["--gil"] if args.gil else []), "--"]
        cmd += [sys.executable, str(RUNNER), *run, "--record", f"{tmp}/record", "--out", f"{tmp}/run.json"]
        subprocess.run(cmd, check=True)
    print(summarize(raw))


if __name__ == "__main__":
    main()
