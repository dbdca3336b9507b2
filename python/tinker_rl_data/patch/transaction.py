"""The transaction that installs and uninstalls the pieces
(:func:`tinker_rl_data.patch.registry.pieces`).

A piece goes in only when, at install time,

- its module imports and holds the name,
- what the name holds is the package's own function (code from the
  installed package's files; a user's or another library's function there
  is kept), and
- its probe finds ours giving what that function gives, on inputs built
  from the installed classes.

Otherwise it is left as it is with one warning saying why, and the other
pieces still go in: a run is never stopped by install() unless it is
strict (``strict=True`` or ``TINKER_RL_DATA_STRICT=1``: then
:class:`InstallError` is raised and nothing is installed). An untested
version whose probes pass is installed with one warning.

Each call is one transaction over the pieces it chose: every one of their
sites is replaced, or, if replacing any fails, none is. :func:`uninstall`
puts back exactly what install replaced (where the name still holds ours)
and nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .. import switches
from ..errors import InstallError, InstallWarning, NotNeeded, ProbeFailed
from .piece import Piece, release
from .registry import pieces
from .report import DISTRIBUTIONS, TESTED_VERSIONS, Report

__all__ = ["install", "installed", "status", "uninstall"]

logger = logging.getLogger("tinker_rl_data")


@dataclass
class _Installed:
    piece: Piece
    original: Any
    ours: Any
    owner: str
    sites: list[str]
    holders: list[tuple[Any, str]] = field(default_factory=list)


_installed: dict[Piece, _Installed] = {}


def _version(package: str) -> str | None:
    module = sys.modules.get(package)
    if module is None:
        try:
            module = importlib.import_module(package)
        except Exception:
            return None
    found = getattr(module, "__version__", None)
    if found is None:
        from importlib import metadata

        try:
            found = metadata.version(DISTRIBUTIONS[package])
        except metadata.PackageNotFoundError:
            return None
    return str(found)


def _runtime(report: Report) -> None:
    from .. import _core

    report.versions = {package: _version(package) for package in TESTED_VERSIONS}
    report.int_read = str(_core.INT_READ)
    if report.versions["tinker"] is not None:
        from ..rows import direct_construction

        why = direct_construction()
        report.construction = "direct" if why is None else f"tinker's public constructors ({why})"


def status() -> Report:
    """What tinker_rl_data has installed now, and the runtime it found."""
    report = Report()
    _runtime(report)
    for record in _installed.values():
        report.installed.append((record.piece.title, list(record.sites)))
        report.features[record.piece.title] = record.piece.feature
    if any(piece.feature == "coalesce" for piece in _installed):
        from ..tinker import coalesce

        report.merged = dict(coalesce.counts())
    if any(piece.feature == "workers" for piece in _installed):
        from ..cookbook import workers

        report.workers = workers.describe()
    return report


# --------------------------------------------------------------------------
# Deciding each piece


class _Left(Exception):
    """A piece that stays out; the message says why. ``expected``: nothing
    to warn about (a tested version that does not have the name)."""

    def __init__(self, why: str, expected: bool = False) -> None:
        super().__init__(why)
        self.expected = expected


def _package_modules(package: str) -> Iterator[Any]:
    for name, module in list(sys.modules.items()):
        if module is not None and (name == package or name.startswith(package + ".")):
            yield module


def _in_package(function: Any, package: str) -> bool:
    """Whether ``function``'s code is in one of ``package``'s files."""
    code = getattr(function, "__code__", None)
    module = sys.modules.get(package)
    root = os.path.dirname(os.path.realpath(getattr(module, "__file__", None) or "/nonexistent/x"))
    return code is not None and os.path.realpath(code.co_filename).startswith(root + os.sep)


def _is_own(function: Any, piece: Piece) -> bool:
    """Whether ``function`` is the installed package's own: defined in the
    module it should be, its code in one of the package's files (the
    package's own decorators included), not a user's or another library's
    function put there, wrapped or not."""
    return getattr(function, "__module__", None) == (piece.defined_in or piece.module) and _in_package(
        function, piece.package
    )


class _ThreadQuiet(logging.Filter):
    """Drops the records up to WARNING that one thread logs (a filter runs
    in the thread that logs); other threads' pass."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or threading.get_ident() != self.thread


@contextlib.contextmanager
def _quiet_here() -> Iterator[None]:
    """Records up to WARNING from this thread, on every logger there is,
    dropped while the block runs: scoped to this thread, where
    ``logging.disable`` (process-wide, saved and restored) lets another
    thread's install leave logging disabled and silences the program's
    other threads."""
    quiet = _ThreadQuiet()
    loggers = [logging.root, *(x for x in list(logging.Logger.manager.loggerDict.values()) if isinstance(x, logging.Logger))]
    for each in loggers:
        each.addFilter(quiet)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(quiet)


@dataclass
class _Plan:
    piece: Piece
    original: Any
    ours: Any
    sites: list[tuple[Any, str]]


def _plan(piece: Piece, report: Report) -> _Plan:
    try:
        module = importlib.import_module(piece.module)
        if piece.defined_in:
            importlib.import_module(piece.defined_in)
    except Exception as exc:
        raise _Left(f"{piece.module} does not import ({type(exc).__name__}: {exc})") from None
    holder: Any = module
    *owners, attr = piece.name.split(".")
    for owner in owners:  # "Class.method": the class attribute
        holder = vars(holder).get(owner)
        if holder is None:
            break
    original = None if holder is None else vars(holder).get(attr)
    found = report.versions.get(piece.package)
    older = bool(piece.since) and release(found) < release(piece.since)
    if original is None:
        raise _Left(f"{piece.module} has no {piece.name}" + (f" (added in {piece.since})" if older else ""), expected=older)
    if older:
        raise _Left(f"ours reproduces {piece.since} and later; {found} differs", expected=True)
    if not _is_own(original, piece):
        owner = f"{getattr(original, '__module__', '?')}.{getattr(original, '__qualname__', type(original).__name__)}"
        raise _Left(f"{piece.where} holds {owner}, not {DISTRIBUTIONS.get(piece.package, piece.package)}'s own: kept")
    try:
        ours = piece.make(original)
    except Exception as exc:
        raise _Left(f"ours cannot be made for this version ({type(exc).__name__}: {exc})") from None
    start = time.perf_counter()
    try:
        with _quiet_here():  # the probes' constant groups make the cookbook warn
            piece.probe(original, ours)
    except NotNeeded as exc:
        raise _Left(str(exc), expected=True) from None
    except Exception as exc:
        what = "" if isinstance(exc, ProbeFailed) else f"{type(exc).__name__}: "
        raise _Left(f"probe failed: {what}{exc}") from None
    finally:
        report.probe_times[piece.title] = (time.perf_counter() - start) * 1e3
        report.probe_ms += report.probe_times[piece.title]

    sites = [(holder, attr)]
    if piece.spread:
        for other in _package_modules(piece.package):
            if other is module:
                continue
            for name, value in list(vars(other).items()):
                if value is original:
                    sites.append((other, name))
                elif (
                    name == piece.name
                    and callable(value)
                    and not _is_ours(value)
                    and not _in_package(value, piece.package)
                ):
                    report.kept.append(f"{other.__name__}.{name}")
    return _Plan(piece, original, ours, sites)


def _site_name(holder: Any, attr: str) -> str:
    if isinstance(holder, type):
        return f"{holder.__module__}.{holder.__qualname__}.{attr}"
    return f"{holder.__name__}.{attr}"


def _is_ours(value: Any) -> bool:
    return any(value is record.ours for record in _installed.values())


# --------------------------------------------------------------------------
# The transaction


def _warn(message: str) -> None:
    warnings.warn(message, InstallWarning, stacklevel=4)


def install(features: Iterable[str], *, owner: str, strict: bool | None = None) -> Report:
    """Install every piece whose feature is in ``features`` (less
    ``TINKER_RL_DATA_SKIP``) and that its probe accepts; return the report.
    See the module's doc."""
    strict = switches.strict(strict)
    report = Report()
    if switches.disabled():
        report.disabled = True
        report.versions = {package: _version(package) for package in TESTED_VERSIONS}
        logger.info("tinker_rl_data: TINKER_RL_DATA_DISABLE=1, nothing installed")
        return report
    _runtime(report)
    chosen = set(features)
    skip = switches.skipped()
    report.not_asked = [f for f in switches.FEATURES if f not in chosen]
    report.skipped = sorted(skip)
    chosen -= skip
    selected = []
    quiet: set[str] = set()  # left for no cause to warn: skipped, or not in an older release
    for piece in pieces():
        if piece.feature not in chosen:
            continue
        report.features[piece.title] = piece.feature
        if piece.name.rpartition(".")[2] in skip or piece.title in skip:
            report.left.append((piece.title, "skipped by TINKER_RL_DATA_SKIP"))
            quiet.add(piece.title)
            continue
        selected.append(piece)
    for package in dict.fromkeys(piece.requires for piece in selected):
        # (the standard library has no distribution to look for)
        if package in DISTRIBUTIONS and report.versions.get(package) is None:  # not installed: one entry, not one per piece
            ours = [piece for piece in selected if piece.requires == package]
            for piece in ours:
                del report.features[piece.title]
            report.left.append((f"{DISTRIBUTIONS[package]} pieces ({len(ours)})", f"{package} is not importable"))
            selected = [piece for piece in selected if piece.requires != package]
    for module in dict.fromkeys(piece.module for piece in selected):
        # All first, so that every module holding a name is loaded when its
        # sites are found; one that fails is reported by its pieces.
        try:
            importlib.import_module(module)
        except Exception:
            pass
    plans: list[_Plan] = []
    for piece in selected:
        if piece in _installed:
            report.installed.append((piece.title, list(_installed[piece].sites)))
            continue
        try:
            plans.append(_plan(piece, report))
        except _Left as left:
            report.left.append((piece.title, str(left)))
            if left.expected:
                quiet.add(piece.title)
                report.older.append(piece.title)

    failed = [(title, why) for title, why in report.left if title not in quiet]
    if strict and failed:
        raise InstallError("tinker_rl_data: nothing installed (strict):\n" + "\n".join(f"  {t}: {w}" for t, w in failed))
    done: list[tuple[Any, str, Any]] = []
    try:
        for plan in plans:
            for holder, attr in plan.sites:
                previous = vars(holder)[attr]
                setattr(holder, attr, plan.ours)
                done.append((holder, attr, previous))
    except BaseException as exc:
        for holder, attr, value in reversed(done):
            setattr(holder, attr, value)
        if strict or not isinstance(exc, Exception):
            raise
        _warn(f"tinker_rl_data: nothing installed: {type(exc).__name__}: {exc}")
        titles = {plan.piece.title for plan in plans}
        report.installed = [entry for entry in report.installed if entry[0] not in titles]
        report.left.extend((title, f"not installed: {type(exc).__name__}: {exc}") for title in titles)
        return report

    for plan in plans:
        sites = [_site_name(holder, attr) for holder, attr in plan.sites]
        _installed[plan.piece] = _Installed(plan.piece, plan.original, plan.ours, owner, sites, list(plan.sites))
        report.installed.append((plan.piece.title, sites))

    for package in sorted({plan.piece.package for plan in plans} & set(TESTED_VERSIONS)):
        found = report.versions.get(package)
        if found not in TESTED_VERSIONS[package]:
            _warn(
                f"tinker_rl_data: {DISTRIBUTIONS[package]} {found} is not a version the tests ran against "
                f"({', '.join(TESTED_VERSIONS[package])}); its pieces passed their probes and are installed"
            )
    for title, why in failed:
        _warn(f"tinker_rl_data: {title} not installed: {why}")
    if report.fast_construction is False:
        logger.info("tinker_rl_data: Datums go through tinker's public constructors (slower): %s", report.construction)
    logger.info(
        "tinker_rl_data: %d piece(s) installed, %d left, probes %.0f ms",
        len(report.installed),
        len(report.left),
        report.probe_ms,
    )
    return report


def uninstall(owner: str | None = None) -> None:
    """Put back the originals of what ``owner``'s install calls (every
    owner's when None) installed, wherever a name still holds ours."""
    for piece, record in list(_installed.items()):
        if owner is not None and record.owner != owner:
            continue
        for holder, attr in record.holders:
            if vars(holder).get(attr) is record.ours:
                setattr(holder, attr, record.original)
        for module in _package_modules(piece.package):
            namespace = vars(module)
            for attr, value in list(namespace.items()):
                if value is record.ours:
                    setattr(module, attr, record.original)
        del _installed[piece]
        if piece.undo is not None:
            piece.undo()


def installed(feature: str | None = None) -> bool:
    """Whether some piece (of ``feature``, when given) is installed."""
    return any(feature is None or piece.feature == feature for piece in _installed)
