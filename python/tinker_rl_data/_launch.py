"""``python -m tinker_rl_data.cookbook run ...``: install, then run a cookbook
recipe (a module, as ``python -m`` would) or a script as ``__main__``, its
arguments untouched.

    python -m tinker_rl_data.cookbook run -m tinker_cookbook.recipes.math_rl.train key=value ...
    python -m tinker_rl_data.cookbook run train.py --flag ...
"""

from __future__ import annotations

import runpy
import sys

USAGE = """usage: python -m tinker_rl_data.cookbook run [--no-wire] [--no-gc] [--coalesce] [--no-kl] [--strict] (-m MODULE | SCRIPT) [ARGS ...]

Installs tinker_rl_data into tinker-cookbook (tinker_rl_data.cookbook.install()),
prints what it installed to stderr, then runs MODULE (as `python -m MODULE`) or
SCRIPT as __main__ with ARGS as its sys.argv[1:]."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "run":
        print(USAGE, file=sys.stderr)
        return 2
    args = argv[1:]
    options: dict[str, bool | None] = {"wire": True, "gc": True, "coalesce": False, "kl": True, "strict": None}
    # --kl (the default now) is still taken.
    while args and args[0] in ("--no-wire", "--no-gc", "--coalesce", "--kl", "--no-kl", "--strict"):
        flag = args.pop(0)
        if flag in ("--strict", "--coalesce", "--kl"):
            options[flag[2:]] = True
        else:
            options[flag[5:]] = None if flag == "--no-gc" else False
    if not args or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        return 2

    from tinker_rl_data import cookbook

    report = cookbook.install(
        wire=bool(options["wire"]), gc=options["gc"], coalesce=bool(options["coalesce"]),
        kl=bool(options["kl"]),
        strict=options["strict"],
    )
    print(report, file=sys.stderr)
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = args[0], args[1:]
        sys.argv = [script, *rest]
        runpy.run_path(script, run_name="__main__")
    return 0
