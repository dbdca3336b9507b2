"""The launcher is as invisible as ``python``: a program run by
``tinker-rl-data run`` sees what it would under ``python`` (nothing of its
stack imported before its first line, its own setup before its imports in
effect, ``__main__`` its module until the interpreter exits), and the pieces
go in at its first import of tinker or tinker-cookbook, with the same report.

Each program here runs in a fresh interpreter, under python and under the
launcher, each with a timeout (a hang fails, it does not block the run);
the expectation is what python printed (the launcher's other tests:
tests/patch/test_transaction.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import cookbook_unavailable

STACK = ("torch", "tinker", "tinker_cookbook", "numpy")
LAUNCHER = [sys.executable, "-m", "tinker_rl_data", "run"]
CONSOLE = Path(sys.executable).parent / "tinker-rl-data"
TIMEOUT = 120  # s: a launcher run takes a few (it imports torch via the cookbook)
NOT_IMPORTED = "tinker_rl_data: nothing installed: the program never imported tinker or tinker_cookbook"


def program(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(body))
    return path


def started(tmp_path: Path, *command: str) -> subprocess.Popen[str]:
    # The environment without the variables a program below sets itself.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("TINKER_RL_DATA_")}
    env.pop("PYTHONPATH", None)  # (the module found as python -m finds it: the current directory)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    # (its own process group: a hung one is killed with its children)
    return subprocess.Popen(list(command), env=env, cwd=tmp_path, text=True, start_new_session=True, **pipes)


def finished(process: subprocess.Popen[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``process`` run to its end; a hang fails the test (its group killed)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"hung: {' '.join(map(str, process.args))} still running after {timeout} s\n{out}{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def run(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    done = finished(started(tmp_path, *command))
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


# --------------------------------------------------------------------------
# The launcher's runs, against python's

LAUNCHERS = ("tinker-rl-data", "python -m tinker_rl_data")
# The launcher's lines on stderr: its install report, its note at exit, and
# its install's warnings (without tinker_cookbook: its pieces not installed).
REPORT = re.compile(r"^tinker_rl_data \d\S* \| .*\n(?:  .*\n)*", re.M)
NOTE = re.compile(r"^tinker_rl_data: nothing installed: .*\n", re.M)
WARNING = re.compile(r"^.*: InstallWarning: tinker_rl_data: .*\n(?:  .*\n)?", re.M)


def launcher(spelling: str) -> list[str]:
    if spelling == "python -m tinker_rl_data":
        return [sys.executable, "-m", "tinker_rl_data"]
    if not CONSOLE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"the console script is not installed beside {sys.executable}")
        pytest.skip(f"the console script is not installed beside {sys.executable}")
    return [str(CONSOLE)]


def under_both(tmp_path: Path, target: list[str], *spellings: str) -> list[subprocess.CompletedProcess[str]]:
    """``target`` (``[script]`` or ``["-m", module]``) run by python, then by
    each spelling of the launcher given, at once."""
    commands = [[sys.executable, *target]] + [[*launcher(s), "run", *target] for s in spellings]
    processes = [started(tmp_path, *command) for command in commands]
    return [finished(p) for p in processes]


def launcher_lines(stderr: str) -> tuple[str, int]:
    """``stderr`` less the launcher's lines, and its number of install reports."""
    return WARNING.sub("", NOTE.sub("", REPORT.sub("", stderr))), len(REPORT.findall(stderr))


def same_as_python(
    python: subprocess.CompletedProcess[str], launched: subprocess.CompletedProcess[str], reports: int
) -> None:
    """The launcher's run printed what python's did, and ``reports`` install reports."""
    stderr, count = launcher_lines(launched.stderr)
    assert (launched.stdout, stderr, launched.returncode) == (python.stdout, python.stderr, python.returncode)
    assert count == reports, launched.stderr


def target(path: Path, spelling: str) -> list[str]:
    return [str(path)] if spelling == "script" else ["-m", path.stem]


# --------------------------------------------------------------------------
# An uncaught exception, an exit, a file or module not found: as python
# tells them (issue 53, defect 8)

ENDINGS = {
    "an exception": """
        def fail():
            raise ValueError("the program's own")

        fail()
        """,
    "KeyboardInterrupt": """
        def interrupted():
            raise KeyboardInterrupt

        interrupted()
        """,
    "SystemExit with a message": """
        import sys

        sys.exit("the program says goodbye")
        """,
    "SystemExit with a status": """
        raise SystemExit(3)
        """,
    "its own excepthook": """
        import sys
        import traceback

        def hook(kind, value, tb):
            frames = [frame.name for frame in traceback.extract_tb(tb)]
            print("hook", kind.__name__, frames, frames == [f.name for f in traceback.extract_tb(value.__traceback__)])

        sys.excepthook = hook

        def fail():
            raise ValueError("for the hook")

        fail()
        """,
    "a syntax error": """
        print("never printed"
        """,
}


@pytest.mark.parametrize("spelling", ["script", "-m"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_uncaught_exception_or_exit_is_told_as_python_tells_it(tmp_path, ending, spelling):
    script = program(tmp_path, ENDINGS[ending])
    python, *launched = under_both(tmp_path, target(script, spelling), *LAUNCHERS)
    assert python.returncode != 0
    if ending == "KeyboardInterrupt":
        assert python.returncode == -signal.SIGINT
    for each in launched:
        same_as_python(python, each, reports=0)


@pytest.mark.parametrize("how", LAUNCHERS)
def test_a_script_or_module_not_found_is_told_as_python_tells_it(tmp_path, how):
    python, launched = under_both(tmp_path, ["no_such_script.py"], how)
    # python's message, naming the launcher as it was invoked in place of python.
    name = "tinker-rl-data" if how == "tinker-rl-data" else f"{sys.executable} -m tinker_rl_data"
    assert python.stderr.startswith(f"{sys.executable}: can't open file ") and python.returncode == 2
    assert (launched.stdout, launched.stderr, launched.returncode) == (
        "",
        name + python.stderr.removeprefix(sys.executable),
        2,
    )
    # -m: runpy's message (python's), naming the interpreter (the console
    # script's is the one on its #! line).
    python, launched = under_both(tmp_path, ["-m", "no_such_module"], how)
    interpreter = sys.executable if how != "tinker-rl-data" else CONSOLE.read_text().splitlines()[0].removeprefix("#!")
    assert python.stderr == f"{sys.executable}: No module named no_such_module\n" and python.returncode == 1
    assert (launched.stdout, launched.stderr, launched.returncode) == (
        "",
        interpreter + python.stderr.removeprefix(sys.executable),
        1,
    )


# --------------------------------------------------------------------------
# Whatever the program's first import, it runs to its end and prints what
# python prints; the install runs once (issue 53, defect 1)

ENDING = """
def fail():
    raise RuntimeError("the program's own error, after its imports")


if __name__ == "__main__":
    fail()
"""

FIRST_IMPORTS = {
    "import tinker": """
        import tinker
        print("imported", tinker.__version__)
        """,
    "from tinker import types": """
        from tinker import types
        print("imported", types.__name__)
        """,
    "tinker_cookbook first": """
        import tinker_cookbook
        print("imported", tinker_cookbook.__name__)
        """,
    "a submodule first": """
        import tinker_cookbook.rl.train
        print("imported", tinker_cookbook.rl.train.__name__)
        """,
    # Each thread, once its import returned, sees the pieces in under the
    # launcher (nothing installed under python).
    "in two threads at once": """
        import sys
        import threading

        launched = "tinker_rl_data.patch.launch" in sys.modules
        both = threading.Barrier(2)
        seen = {}

        def first_import(how):
            both.wait()
            if how == "import":
                import tinker
            else:
                from tinker import types
            seen[how] = True

        threads = [threading.Thread(target=first_import, args=(how,)) for how in ("import", "from")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # (the other thread does not wait for the install: seen once both are back)
        from tinker_rl_data.patch import transaction
        installed = transaction.installed() == launched
        print("imported in each thread:", sorted(seen), "the install seen after:", installed)
        """,
    "inside asyncio.run": """
        import asyncio

        async def main():
            import tinker
            from tinker import types
            print("imported in the loop", types.__name__)

        if __name__ == "__main__":
            asyncio.run(main())
        """,
    # The child is python's (multiprocessing runs sys.executable): it
    # imports tinker and installs nothing; the parent's install is the one.
    "in a spawn child": """
        import multiprocessing

        def child():
            import tinker
            print("child imported", tinker.__name__, flush=True)

        if __name__ == "__main__":
            import tinker
            print("parent imported", tinker.__name__, flush=True)
            process = multiprocessing.get_context("spawn").Process(target=child)
            process.start()
            process.join()
            print("child exit", process.exitcode)
        """,
}
COOKBOOK_FIRST = {"tinker_cookbook first", "a submodule first"}


# Each first import run one way (as a script or with -m, by one spelling of
# the launcher); between them, each way is run.
@pytest.mark.parametrize(
    "first, spelling, how",
    [
        ("import tinker", "script", "tinker-rl-data"),
        ("from tinker import types", "-m", "python -m tinker_rl_data"),
        ("tinker_cookbook first", "script", "python -m tinker_rl_data"),
        ("a submodule first", "-m", "tinker-rl-data"),
        ("in two threads at once", "script", "tinker-rl-data"),
        ("inside asyncio.run", "-m", "python -m tinker_rl_data"),
        ("in a spawn child", "-m", "tinker-rl-data"),
    ],
)
def test_whatever_its_first_import_the_program_finishes_installs_once_and_prints_what_python_prints(
    tmp_path, first, spelling, how
):
    if first in COOKBOOK_FIRST:
        try:
            import tinker_cookbook  # noqa: F401
        except ImportError as exc:
            cookbook_unavailable(exc)
    script = program(tmp_path, textwrap.dedent(FIRST_IMPORTS[first]) + ENDING)
    python, launched = under_both(tmp_path, target(script, spelling), how)
    assert "imported" in python.stdout and "RuntimeError: the program's own error" in python.stderr, python.stderr
    same_as_python(python, launched, reports=1)


def test_a_load_the_hooks_do_not_see_installs_at_the_next_import(tmp_path):
    # tinker loaded with no import call around it: the next import statement
    # returns with the pieces in.
    script = program(
        tmp_path,
        """
        import importlib._bootstrap
        import sys

        launched = "tinker_rl_data.patch.launch" in sys.modules
        importlib._bootstrap._gcd_import("tinker")
        from tinker_rl_data.patch import transaction
        print("installed as launched:", transaction.installed() == launched)
        """,
    )
    python, launched = under_both(tmp_path, [str(script)], "python -m tinker_rl_data")
    assert python.stdout == "installed as launched: True\n"
    same_as_python(python, launched, reports=1)


def test_the_import_hooks_are_invisible_to_the_program(tmp_path):
    # Until the program imports tinker the launcher's hooks are on: the same
    # signatures, results, tracebacks (no frame of the hooks), and a module's
    # import-time warning names the line that imported it, as under python
    # (a DeprecationWarning there shows: it is __main__'s).
    (tmp_path / "deprecated_module.py").write_text(
        'import warnings\nwarnings.warn("deprecated_module is deprecated", DeprecationWarning, stacklevel=2)\n'
    )
    (tmp_path / "broken_module.py").write_text('def broken():\n    raise ValueError("broken at import")\n\nbroken()\n')
    script = program(
        tmp_path,
        """
        import builtins
        import importlib
        import inspect
        import traceback

        print(inspect.signature(builtins.__import__), inspect.signature(importlib.import_module))
        print(builtins.__import__.__name__, builtins.__import__.__module__, importlib.import_module.__qualname__)
        import deprecated_module
        for statement in (
            "import no_such_module",
            "import broken_module",
            "importlib.import_module('no_such_module')",
            "from json import no_such_name",
        ):
            try:
                exec(statement)
            except Exception:
                traceback.print_exc()
        print(importlib.import_module("json").__name__, __import__("os.path", fromlist=["sep"]).__name__)
        """,
    )
    python, launched = under_both(tmp_path, [str(script)], "python -m tinker_rl_data")
    assert "deprecated_module.py" not in python.stderr and "DeprecationWarning" in python.stderr
    same_as_python(python, launched, reports=0)


def test_under_python_dev_mode_the_probes_print_nothing(tmp_path):
    # python -X dev: asyncio's debug mode (a loop's slow steps logged) and
    # every warning shown; the probes' own loops and requests show nothing.
    script = program(tmp_path, "import tinker\nprint('imported', tinker.__version__)\n")
    python, launched = [
        finished(p)
        for p in [
            started(tmp_path, sys.executable, "-X", "dev", str(script)),
            started(tmp_path, sys.executable, "-X", "dev", "-m", "tinker_rl_data", "run", str(script)),
        ]
    ]
    same_as_python(python, launched, reports=1)


def test_a_thread_whose_import_ends_while_the_install_runs_does_not_wait_for_it(tmp_path):
    # A background thread's first log record imports a module under its
    # handler's lock (as logging.handlers' SMTPHandler does) while the main
    # thread's `import tinker` installs, which logs too: a thread waiting for
    # the install there would hold that lock for ever (it hung so while other
    # threads waited for the install).
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(3)\n")
    script = program(
        tmp_path,
        """
        import logging, sys, threading, time

        class LazyHandler(logging.StreamHandler):
            def emit(self, record):
                import slowmod  # first use: an import under the handler's lock
                super().emit(record)

        logging.basicConfig(level=logging.INFO, handlers=[LazyHandler(sys.stderr)], format="%(message)s")
        thread = threading.Thread(target=lambda: logging.info("background thread says hi"))
        thread.start()
        time.sleep(0.1)
        import tinker
        thread.join()
        print("finished")
        """,
    )
    python, launched = under_both(tmp_path, [str(script)], "python -m tinker_rl_data")
    assert (python.stdout, python.returncode) == ("finished\n", 0)
    assert (launched.stdout, launched.returncode) == ("finished\n", 0), launched.stderr
    assert launcher_lines(launched.stderr)[1] == 1
