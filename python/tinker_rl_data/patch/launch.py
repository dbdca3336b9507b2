"""The launcher, handed the features' declarations and the install function
(:mod:`tinker_rl_data.__main__` hands them): run a cookbook recipe or a
script as ``python`` runs it, its arguments untouched, and install when it
first imports tinker or tinker-cookbook (:class:`_Watch`); or ``check``: the
probes alone. Two spellings, one function::

    tinker-rl-data run -m tinker_cookbook.recipes.math_rl.train key=value ...
    python -m tinker_rl_data run train.py --flag ...
    tinker-rl-data check

What the program prints is what python prints: its output, its uncaught
exception's traceback from the program's first frame (:func:`_as_python`),
its exit status (a KeyboardInterrupt's SIGINT death included), python's
own message for a script that cannot be opened or a module not found.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import io
import os
import sys
import threading
import types
from typing import Any, Callable, Sequence

from .feature import Feature, selected
from .report import DISTRIBUTIONS

_USAGE = """usage: tinker-rl-data run {flags} (-m MODULE | SCRIPT) [ARGS ...]
       tinker-rl-data check {flags}
       (or python -m tinker_rl_data ...)

run: runs MODULE (as `python -m MODULE`) or SCRIPT (as `python SCRIPT`) as
__main__ with ARGS as its sys.argv[1:], and installs tinker_rl_data into
tinker and tinker-cookbook (tinker_rl_data.cookbook.install() with the
options given) when it first imports one of them, printing the report to
stderr then. TINKER_RL_DATA_SKIP, _STRICT and _DISABLE apply, as set when
that import runs.

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
    from .report import OUT
    from .transaction import probe

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
    chosen = selected(catalog, options)
    packages = {piece.requires for f in catalog if f.name in chosen for piece in f.pieces} & set(DISTRIBUTIONS)
    watch = _Watch(sorted(packages), lambda: print(install(**options), file=sys.stderr))
    if args[0] == "-m":
        return _as_python(_run_module, args[1], args[2:], watch)
    return _as_python(_run_script, args[0], args[1:], watch)


# --------------------------------------------------------------------------
# The install, when the program first imports what it patches


class _Watch(importlib.abc.MetaPathFinder):
    """Runs ``install`` once, when the program's first import of one of
    ``packages`` (tinker, tinker_cookbook) has run to its end: the
    pieces go in where the program would put them with ``install()`` as
    its first import of them, never before (what the program sets up
    before it, environment variables and switches included, is in effect).
    The finder wraps those packages' loaders until then, and takes itself
    off ``sys.meta_path`` before installing. A package already imported
    (a ``.pth`` file's import), or none to wait for: the install runs at
    :meth:`start`. None imported by the end: a note at exit says nothing
    was installed."""

    def __init__(self, packages: Sequence[str], install: Callable[[], None]) -> None:
        self.packages = tuple(packages)
        self.install = install
        self.done = False
        self.lock = threading.Lock()
        self.depth = threading.local()
        self.program: types.ModuleType | None = None

    def start(self, program: types.ModuleType) -> None:
        """Before ``program`` (its ``__main__``) runs."""
        self.program = program
        if not self.packages or any(p in sys.modules for p in self.packages):
            self._fire()
            return
        sys.meta_path.insert(0, self)
        atexit.register(self._never)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if self.done or fullname not in self.packages:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None

    def executed(self, loader: Any, module: Any) -> None:
        """``module``'s code, run by ``loader`` with the depth of the
        watched imports counted (one package's may import another's)."""
        self.depth.n = getattr(self.depth, "n", 0) + 1
        try:
            loader.exec_module(module)
        finally:
            self.depth.n -= 1
        if self.depth.n == 0:
            self._fire()

    def _fire(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        self.install()

    def _never(self) -> None:
        # Not for a program that never began (python's own error said why).
        if not self.done and getattr(self.program, "__loader__", None) is not None:
            print(
                "tinker_rl_data: nothing installed: the program never imported "
                + " or ".join(self.packages)
                + " (the launcher installs at the first import of one)",
                file=sys.stderr,
            )


class _Loader(importlib.abc.Loader):
    """A watched package's loader, as the other finders found it, for its
    one import: the module gets the loader itself back before its code
    runs (``__loader__`` and ``__spec__.loader`` are the usual ones)."""

    def __init__(self, loader: Any, watch: _Watch) -> None:
        self.loader = loader
        self.watch = watch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.watch.executed(self.loader, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


# --------------------------------------------------------------------------
# The program, as python runs it


def _as_python(run: Callable[..., int], *args: Any) -> int:
    """``run(*args)``; an exception (not SystemExit) leaves it as it left the
    program, to the interpreter's own exit path (its atexit order, its exit
    status, a KeyboardInterrupt's death by SIGINT), and is printed by the
    ``sys.excepthook`` the program had then, handed the traceback from the
    program's first frame: the launcher's are python's own (none for a
    script; runpy's two, ``<frozen runpy>``, for ``-m``, a directory or a
    zip file)."""
    try:
        return run(*args)
    except SystemExit:
        raise
    except BaseException:
        program_hook = sys.excepthook

        def excepthook(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
            sys.excepthook = program_hook  # (once)
            tb = _from_program(tb)
            value.__traceback__ = tb
            if getattr(sys, "last_traceback", None) is not None:
                sys.last_traceback = tb
            program_hook(kind, value, tb)

        sys.excepthook = excepthook
        raise


def _from_program(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` past the launcher's frames: from the one after the runner's
    (:func:`_run_script`, :func:`_run_module`); None when the error was the
    runner's own (a script's SyntaxError: python prints no frame)."""
    entry = tb
    while entry is not None:
        if entry.tb_frame.f_code in _RUNNERS:
            return entry.tb_next
        entry = entry.tb_next
    return tb


def _program_name() -> str:
    """The launcher's name as python gives its own in its errors (as it was
    invoked): ``tinker-rl-data``, or ``python -m tinker_rl_data``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return f"{sys.orig_argv[0]} -m {spec.name.removesuffix('.__main__')}"
    return os.path.basename(sys.argv[0])


def _fresh_main() -> types.ModuleType:
    """A new ``__main__`` in ``sys.modules``, holding what python's holds
    before a program runs; it stays there after the program's code, for
    its atexit handlers (pickling its functions by name) as under python."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def _run_module(module: str, rest: list[str], watch: _Watch) -> int:
    """As ``python -m module rest...``: runpy's own entry for ``-m``
    (``sys.argv[0]`` "-m" while the module is found, then its file;
    ``__spec__`` its spec), in the fresh ``__main__``; runpy prints python's
    message for a module not found."""
    import runpy

    sys.argv = ["-m", *rest]
    _first_path(os.getcwd())
    watch.start(_fresh_main())
    runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
    return 0


def _run_script(script: str, rest: list[str], watch: _Watch) -> int:
    """As ``python script rest...``: a file run in the fresh ``__main__``
    (``__file__`` the path python gives it, and takes back once the code has
    run; ``__spec__`` None); a directory or zip file with a ``__main__.py``
    run as python runs one; python's message and status 2 for a file that
    cannot be opened."""
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    if _importer(path):
        import runpy

        sys.argv = [script, *rest]
        _first_path(path, always=True)
        watch.start(_fresh_main())
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return 0
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as exc:
        print(f"{_program_name()}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr)
        return 2
    sys.argv = [script, *rest]
    _first_path(os.path.dirname(os.path.realpath(script)))
    code = compile(source, path, "exec")
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    watch.start(main)
    try:
        exec(code, vars(main))
    finally:  # as python does once a script's code has run (before its atexit handlers)
        vars(main).pop("__file__", None)
        vars(main).pop("__cached__", None)
    return 0


_RUNNERS = frozenset({_run_module.__code__, _run_script.__code__})


def _importer(path: str) -> bool:
    """Whether python runs ``path`` as a directory or zip file (one of
    ``sys.path_hooks`` takes it), not as a script."""
    for hook in sys.path_hooks:
        try:
            hook(path)
        except ImportError:
            continue
        return True
    return False


def _first_path(entry: str, always: bool = False) -> None:
    """``sys.path[0]`` as ``python -m module`` (the current directory) or
    ``python script.py`` (the script's directory) sets it, in place of the
    launcher's own (the console script's directory): a recipe's sibling
    modules import as without the launcher. Nothing under ``-P``, except
    for a directory or zip file run (``always``), which python puts there too."""
    if sys.flags.safe_path and not always:
        return
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)
