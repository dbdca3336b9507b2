"""The launcher: install, then run a cookbook recipe or a script, its
arguments untouched. Three spellings, one function::

    tinker-rl-data run -m tinker_cookbook.recipes.math_rl.train key=value ...
    python -m tinker_rl_data run train.py --flag ...
    python -m tinker_rl_data.cookbook run ...      (the older spelling)
"""

from __future__ import annotations

import runpy
import sys

USAGE = """usage: tinker-rl-data run [--no-wire] [--no-transport] [--no-kl] [--no-gc] [--coalesce] [--strict] (-m MODULE | SCRIPT) [ARGS ...]
       (or python -m tinker_rl_data run ...)

Installs tinker_rl_data into tinker and tinker-cookbook
(tinker_rl_data.cookbook.install() with the options given), prints the report
to stderr, then runs MODULE (as `python -m MODULE`) or SCRIPT as __main__ with
ARGS as its sys.argv[1:]. TINKER_RL_DATA_SKIP, _STRICT and _DISABLE apply."""

_FLAGS = {
    "--no-wire": ("wire", False),
    "--no-transport": ("transport", False),
    "--no-kl": ("kl", False),
    "--no-gc": ("gc", False),
    "--coalesce": ("coalesce", True),
    "--strict": ("strict", True),
}


def main(argv: list[str] | None = None) -> int:
    """Runs ``argv`` (``sys.argv[1:]`` when None); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "run":
        print(USAGE, file=sys.stderr)
        return 2
    args.pop(0)
    options: dict[str, bool] = {}
    while args and args[0] in _FLAGS:
        name, value = _FLAGS[args.pop(0)]
        options[name] = value
    if not args or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        return 2

    from .. import cookbook

    print(cookbook.install(**options), file=sys.stderr)  # type: ignore[arg-type]
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = args[0], args[1:]
        sys.argv = [script, *rest]
        runpy.run_path(script, run_name="__main__")
    return 0


def console() -> None:
    """The ``tinker-rl-data`` console script."""
    sys.exit(main())
