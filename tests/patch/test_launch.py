"""The launcher is as invisible as ``python``: a program run by
``tinker-rl-data run`` sees what it would under ``python`` (nothing of its
stack imported before its first line, its own setup before its imports in
effect, ``__main__`` its module until the interpreter exits), and the pieces
go in at its first import of tinker or tinker-cookbook, with the same report.

Each program here is run both ways, as a script and with ``-m``, in a fresh
interpreter (the launcher's other tests: tests/patch/test_transaction.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

STACK = ("torch", "tinker", "tinker_cookbook", "numpy")
LAUNCHER = [sys.executable, "-m", "tinker_rl_data", "run"]
NOT_IMPORTED = "tinker_rl_data: nothing installed: the program never imported tinker or tinker_cookbook"


def program(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(body))
    return path


def run(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    # The environment without the variables a program below sets itself.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("TINKER_RL_DATA_")}
    env.pop("PYTHONPATH", None)  # (the module found as python -m finds it: the current directory)
    done = subprocess.run(list(command), env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def each_way(tmp_path: Path, script: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """The program under python and under the launcher, as a script and as a module."""
    return {
        "python": run(tmp_path, sys.executable, str(script), "arg"),
        "python -m": run(tmp_path, sys.executable, "-m", script.stem, "arg"),
        "launcher": run(tmp_path, *LAUNCHER, str(script), "arg"),
        "launcher -m": run(tmp_path, *LAUNCHER, "-m", script.stem, "arg"),
    }


def test_a_program_sets_the_environment_before_importing_torch_as_under_python(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    script = program(
        tmp_path,
        f"""
        import sys
        print("imported first", [m for m in {STACK!r} if m in sys.modules])
        import os
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        print("threads", torch.get_num_threads())
        """,
    )
    runs = each_way(tmp_path, script)
    assert {how: done.stdout for how, done in runs.items()} == {how: "imported first []\nthreads 1\n" for how in runs}
    assert NOT_IMPORTED in runs["launcher"].stderr and NOT_IMPORTED in runs["launcher -m"].stderr


def test_a_switch_the_program_sets_before_importing_the_cookbook_is_obeyed(tmp_path):
    try:
        import tinker_cookbook  # noqa: F401
    except ImportError as exc:
        cookbook_unavailable(exc)
    script = program(
        tmp_path,
        """
        import os
        os.environ["TINKER_RL_DATA_SKIP"] = "gc"
        from tinker_cookbook.rl import data_processing
        import tinker_rl_data
        import tinker_rl_data.cookbook
        from tinker_rl_data.patch import transaction
        launched = bool(tinker_rl_data.status().installed)
        if not launched:  # under python: the program's own install, as its docs say
            tinker_rl_data.cookbook.install()
        print(transaction.installed("gc"), transaction.installed("data"))
        print(data_processing.compute_advantages.__module__.startswith("tinker_rl_data."))
        """,
    )
    runs = each_way(tmp_path, script)
    assert {how: done.stdout for how, done in runs.items()} == {how: "False True\nTrue\n" for how in runs}
    for how in ("launcher", "launcher -m"):
        report = runs[how].stderr
        assert re.search(r"^  gc +off \(TINKER_RL_DATA_SKIP\)", report, re.M), report
        assert re.search(r"^  data +on, 4 of 4 ", report, re.M) and NOT_IMPORTED not in report, report


def test_an_atexit_handler_pickles_a_function_of_main(tmp_path):
    script = program(
        tmp_path,
        """
        import atexit
        import pickle
        import sys

        def double(x):
            return 2 * x

        def at_exit():
            print("pickled", pickle.loads(pickle.dumps(double))(21), sys.modules["__main__"].double is double)

        atexit.register(at_exit)
        """,
    )
    runs = each_way(tmp_path, script)
    assert {how: done.stdout for how, done in runs.items()} == {how: "pickled 42 True\n" for how in runs}
    assert all("Error" not in done.stderr for done in runs.values()), {how: done.stderr for how, done in runs.items()}
