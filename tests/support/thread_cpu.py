"""CPU seconds per thread of this process, from /proc/self/task (Linux):
where a client's CPU goes between the caller's loop, tinker's loop thread
and pyqwest's native threads (bench/client_cpu.py, the trainer runs)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path


def thread_cpu() -> dict[tuple[int, str], float]:
    """CPU seconds of each live thread of this process, by (tid, name): a
    Python thread by its `threading` name (the caller's is the main thread),
    a native one by its kernel name (pyqwest's: tokio-rt-worker)."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    python_names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        tid = int(task.name)
        name = python_names.get(tid) or stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_groups(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per thread name over the interval (threads that ended
    in it are not counted here; process_time counts them)."""
    groups: Counter[str] = Counter()
    for key, cpu in after.items():
        groups[key[1]] += cpu - before.get(key, 0.0)
    return {name: round(cpu, 3) for name, cpu in groups.most_common() if cpu > 0}
