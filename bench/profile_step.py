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


def package(path: str) -> str:
    """The top-level package (or stdlib module) a frame's file belongs to."""
    if "site-packages/" in path:
        rest = path.split("site-packages/", 1)[1]
    elif "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    else:
        rest = path
    head = rest.split("/", 1)[0]
    return head.removesuffix(".py") or path


def summarize(raw: Path, top: int = 25) -> str:
    own_pkg: collections.Counter[str] = collections.Counter()
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
        own_fn[f"{fn} ({package(file)})"] += n
        names = {(FRAME.match(f) or [None, f])[1] for f in frames}
        for name in UNDER:
            if name in names:
                under[name] += n
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "self time by package:"]
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
    args, run = p.parse_known_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = Path(args.out).with_suffix(".txt")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [spy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--"]
        cmd += [sys.executable, str(RUNNER), *run, "--record", f"{tmp}/record", "--out", f"{tmp}/run.json"]
        subprocess.run(cmd, check=True)
    print(summarize(raw))


if __name__ == "__main__":
    main()
