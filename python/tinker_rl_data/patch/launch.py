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
import importlib
import importlib.machinery
import io
import os
import sys
import threading
import types
from typing import Any, Callable, Sequence

from . import _importlib_bootstrap_watch as hooks
from .feature import Feature, selected
from .report import DISTRIBUTIONS

_USAGE = """usage: tinker-rl-data run {flags} (-m MODULE | SCRIPT) [ARGS ...]
       tinker-rl-data check {flags}
       (or python -m tinker_rl_data ...)

run: runs MODULE (as `python -m MODULE`) or SCRIPT (as `python SCRIPT`) as
__main__ with ARGS as its sys.argv[1:], and installs tinker_rl_data into
tinker and tinker-cookbook (tinker_rl_data.cookbook.install() with the
options given) once the program's first import of one of them has returned,
printing the report to stderr then. TINKER_RL_DATA_SKIP, _STRICT and
_DISABLE apply, as set when that import returns.

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
# The install, once the program's first import of what it patches returned

_IDLE, _WATCHING, _INSTALLING, _DONE = "idle", "watching", "installing", "done"


class _Watch:
    """Runs ``install`` once, when a thread's outermost import call (an
    ``import`` statement, runpy's own ``__import__``, ``importlib.import_module``)
    returns to the program, holding no import lock, and one of ``packages``
    (tinker, tinker_cookbook) has been imported in full by then: the
    pieces go in where the program would put them with ``install()`` right
    after its first import of them (what it set up before, environment
    variables and switches included, is in effect), before its next line.

    Never inside an import: there, the importing thread holds the module
    locks of what it imports, and a probe's thread importing the same
    modules would wait on them for ever while that thread waits for the
    probe. So a module that does its work while it is imported gets the
    install once that import returns.

    The hooks (:mod:`._importlib_bootstrap_watch`) count each thread's
    import calls; the thread whose outermost call ends first installs, with
    the hooks taken off (the exact originals back) before it starts. Other
    threads never wait for it (a thread waiting would hold its own locks,
    a logging handler's say, which the install may need): one that uses
    tinker while the install runs in another uses tinker's own code until
    the pieces are in, as with ``install()`` called in one thread. A load the hooks do not see (a loader called by hand,
    ``importlib._bootstrap._gcd_import``, an extension's import): the
    install runs at the end of the thread's next import call made holding
    no import lock. A package already imported (a ``.pth`` file's import),
    or none to wait for: the install runs at :meth:`start`. None imported by
    the end of a program that ran: a note at exit says nothing was
    installed."""

    def __init__(self, packages: Sequence[str], install: Callable[[], None]) -> None:
        self.packages = tuple(packages)
        self.install = install
        self.state = _IDLE
        self.lock = threading.Lock()
        self.calls = hooks.Calls()
        self.hooked: list[tuple[Any, str, Any, Any]] = []
        self.program: types.ModuleType | None = None

    def start(self, program: types.ModuleType) -> None:
        """Before ``program`` (its ``__main__``) runs."""
        self.program = program
        if not self.packages or self._loaded():
            self.state = _INSTALLING
            self._install()
            return
        self.state = _WATCHING
        for holder, name in ((builtins, "__import__"), (importlib, "import_module")):
            original = getattr(holder, name)
            hook = hooks.counted(original, self.calls, self._returned)
            setattr(holder, name, hook)
            self.hooked.append((holder, name, original, hook))
        atexit.register(self._never)

    def _returned(self) -> None:
        """A thread's outermost import call has ended (returned or raised)."""
        if self.state == _DONE:
            return
        if self.state == _WATCHING:
            if not self._loaded() or _holds_import_lock():
                return
            with self.lock:
                mine = self.state == _WATCHING
                if mine:
                    self.state = _INSTALLING
            if mine:
                self._unhook()
                self._install()
                return
        # Installing in another thread: this one goes on without waiting for
        # it. A wait here would hold whatever this thread holds (a logging
        # handler's lock, a lock of the program's) while the install may need it.

    def _install(self) -> None:
        try:
            self.install()
        finally:
            self.state = _DONE

    def _unhook(self) -> None:
        for holder, name, original, hook in self.hooked:
            if getattr(holder, name, None) is hook:  # (a program's own hook over ours stays; ours passes through)
                setattr(holder, name, original)

    def _loaded(self) -> bool:
        """Whether one of the packages is imported in full (not still running its code)."""
        for name in self.packages:
            module = sys.modules.get(name)
            if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
                return True
        return False

    def _never(self) -> None:
        # Not for a program that never began (python's own error said why).
        if self.state == _DONE or getattr(self.program, "__loader__", None) is None:
            return
        if self._loaded():
            why = "the program imported " + " or ".join(p for p in self.packages if p in sys.modules)
            why += " where the launcher does not see imports, and made no import after it"
        else:
            why = "the program never imported " + " or ".join(self.packages)
            why += " (the launcher installs at the first import of one)"
        print(f"tinker_rl_data: nothing installed: {why}", file=sys.stderr)


def _holds_import_lock() -> bool:
    """Whether this thread holds a module's import lock (is inside an
    import, one the hooks did not see included)."""
    me = threading.get_ident()
    try:
        locks = list(importlib._bootstrap._module_locks.values())  # type: ignore[attr-defined]
    except AttributeError:  # (not this CPython's importlib: the hooks' count alone)
        return False
    for ref in locks:
        lock = ref()
        if lock is not None and getattr(lock, "owner", None) == me:
            return True
    return False


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
