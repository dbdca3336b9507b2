"""The launcher, handed the features' declarations and the install function
(:mod:`tinker_rl_data.__main__` hands them): install, then run a cookbook
recipe or a script, its arguments untouched; or ``check``: the probes alone.
Two spellings, one function::

    tinker-rl-data run -m tinker_cookbook.recipes.math_rl.train key=value ...
    python -m tinker_rl_data run train.py --flag ...
    tinker-rl-data check
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
from typing import Any, Callable, Sequence

from .feature import Feature, selected
from .report import OUT
from .transaction import probe

_USAGE = """usage: tinker-rl-data run {flags} (-m MODULE | SCRIPT) [ARGS ...]
       tinker-rl-data check {flags}
       (or python -m tinker_rl_data ...)

run: installs tinker_rl_data into tinker and tinker-cookbook
(tinker_rl_data.cookbook.install() with the options given), prints the report
to stderr, then runs MODULE (as `python -m MODULE`) or SCRIPT as __main__ with
ARGS as its sys.argv[1:]. TINKER_RL_DATA_SKIP, _STRICT and _DISABLE apply.

check: runs every probe on the installed tinker and tinker-cookbook and
prints the report (and its details), installing nothing and running nothing
else; exits 1 when a piece of a selected feature stays out."""


def flags(catalog: Sequence[Feature]) -> dict[str, tuple[str, bool]]:
    """Each flag: (install()'s keyword, its value)."""
    found = {f.flag: (f.name, not f.default) for f in catalog if f.switch}
    found["--strict"] = ("strict", True)
    return found


def usage(catalog: Sequence[Feature]) -> str:
    return _USAGE.format(flags=" ".join(f"[{flag}]" for flag in flags(catalog)))


def _options(args: list[str], catalog: Sequence[Feature]) -> dict[str, bool]:
    """The flags at the front of ``args`` (taken off it) as install()'s keywords."""
    known = flags(catalog)
    options: dict[str, bool] = {}
    while args and args[0] in known:
        name, value = known[args.pop(0)]
        options[name] = value
    return options


def check(catalog: Sequence[Feature], options: dict[str, Any]) -> int:
    """``tinker-rl-data check``: 0 when every piece of the selected features
    goes in (or is not for this version, or skipped), 1 otherwise."""
    report = probe(catalog, selected(catalog, options))
    print(report)
    print()
    print(report.details())
    return 1 if report.disabled or any(e.state == OUT for e in report.entries.values()) else 0


def main(argv: list[str] | None, catalog: Sequence[Feature], install: Callable[..., Any]) -> int:
    """Runs ``argv`` (``sys.argv[1:]`` when None); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("run", "check"):
        print(usage(catalog), file=sys.stderr)
        return 2
    command = args.pop(0)
    options = _options(args, catalog)
    if command == "check":
        if args:
            print(usage(catalog), file=sys.stderr)
            return 2
        return check(catalog, options)
    if not args or (args[0] == "-m" and len(args) < 2):
        print(usage(catalog), file=sys.stderr)
        return 2
    print(install(**options), file=sys.stderr)
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        sys.argv = [module, *rest]
        _first_path(os.getcwd())
        runpy.run_module(module, init_globals=_MAIN_GLOBALS, run_name="__main__", alter_sys=True)
    else:
        script, rest = args[0], args[1:]
        sys.argv = [script, *rest]
        _first_path(os.path.dirname(os.path.realpath(script)))
        runpy.run_path(script, init_globals=_MAIN_GLOBALS, run_name="__main__")
    return 0


# What ``__main__`` holds before its code runs, as with python: the
# builtins module (exec alone would put in its dict).
_MAIN_GLOBALS = {"__builtins__": builtins}


def _first_path(entry: str) -> None:
    """``sys.path[0]`` as ``python -m module`` (the current directory) or
    ``python script.py`` (the script's directory) sets it, in place of the
    launcher's own (the console script's directory): a recipe's sibling
    modules import as without the launcher. Nothing under ``-P``."""
    if sys.flags.safe_path:
        return
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)
