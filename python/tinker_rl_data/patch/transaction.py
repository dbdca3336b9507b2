"""The transaction that installs and uninstalls the pieces of the features
it is handed (:class:`~.feature.Feature`; the package's are registered in
:mod:`tinker_rl_data.features`).

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
from typing import Any, Iterable, Iterator, Sequence

from .. import switches
from ..errors import InstallError, InstallWarning, NotNeeded, ProbeFailed
from .feature import Feature
from .piece import Piece, release
from .report import DISTRIBUTIONS, NOT_FOR_VERSION, OUT, SKIPPED, TESTED_VERSIONS, Entry, Report

__all__ = ["install", "installed", "probe", "status", "uninstall"]

logger = logging.getLogger("tinker_rl_data")


@dataclass
class _Installed:
    piece: Piece
    feature: Feature
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
    features: dict[str, Feature] = {}
    for record in _installed.values():
        report.entries[record.piece.where] = Entry(record.piece.title, record.piece.feature, sites=list(record.sites))
        features.setdefault(record.feature.name, record.feature)
    for feature in features.values():
        report.features.append((feature.name, feature.description))
        for piece in feature.pieces:  # as install() told them: a piece for a later release than the one found
            found = report.versions.get(piece.package)
            if piece.where not in report.entries and piece.since and found and release(found) < release(piece.since):
                report.entries[piece.where] = Entry(
                    piece.title, piece.feature, NOT_FOR_VERSION, why=f"ours reproduces {piece.since} and later; {found} differs"
                )
        if feature.status is not None:
            report.notes.extend(feature.status())
        if feature.aside is not None:
            for where, why in feature.aside().items():
                if where in report.entries:
                    report.entries[where].aside = why
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
    """What installing ``piece`` replaces, with ours made and probed; raises
    :class:`_Left` saying why it stays out."""
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
    for record in _installed.values():  # another feature's piece of ours holds the name: ours goes over it
        if original is not None and record.ours is original:
            original = record.original
            break
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
        probe_ms = (time.perf_counter() - start) * 1e3
        report.entries[piece.where].probe_ms = probe_ms
        report.probe_ms += probe_ms

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
# The transaction, by phase


def _warn(message: str, stacklevel: int = 4) -> None:
    """An InstallWarning pointing at the line that called install() (4:
    from transaction.install, called by cookbook.install or tinker_rl_data.install)."""
    warnings.warn(message, InstallWarning, stacklevel=stacklevel)


@dataclass
class _Choice:
    """The pieces one install() call decides, and the features they come from."""

    pieces: list[Piece] = field(default_factory=list)
    feature: dict[Piece, Feature] = field(default_factory=dict)


def _select(catalog: Sequence[Feature], chosen: set[str], report: Report) -> _Choice:
    """The chosen features' pieces, less ``TINKER_RL_DATA_SKIP``'s."""
    skip = switches.skipped()
    report.features = [(feature.name, feature.description) for feature in catalog]
    report.not_asked = {f.name: f.state_when_not_asked for f in catalog if f.name not in chosen}
    report.skipped = sorted(skip)
    choice = _Choice()
    for feature in catalog:
        if feature.name not in chosen or feature.name in skip:
            continue
        for piece in feature.pieces:
            report.entries[piece.where] = Entry(piece.title, piece.feature)
            if piece.name.rpartition(".")[2] in skip or piece.title in skip:
                report.entries[piece.where].state = SKIPPED
                report.entries[piece.where].why = "skipped by TINKER_RL_DATA_SKIP"
                continue
            choice.pieces.append(piece)
            choice.feature[piece] = feature
    return choice


def _drop_missing_packages(choice: _Choice, report: Report) -> None:
    """A package that is not installed: one entry for its pieces, not one each."""
    for package in dict.fromkeys(piece.requires for piece in choice.pieces):
        # (the standard library has no distribution to look for)
        if package in DISTRIBUTIONS and report.versions.get(package) is None:
            missing = [piece for piece in choice.pieces if piece.requires == package]
            for piece in missing:
                del report.entries[piece.where]
            title = f"{DISTRIBUTIONS[package]} pieces ({len(missing)})"
            report.entries[package] = Entry(title, "", OUT, why=f"{package} is not importable")
            choice.pieces = [piece for piece in choice.pieces if piece.requires != package]


def _decide(choice: _Choice, report: Report) -> list[_Plan]:
    """A plan for each piece that goes in; the others' entries say why not."""
    for module in dict.fromkeys(piece.module for piece in choice.pieces):
        # All first, so that every module holding a name is loaded when its
        # sites are found; one that fails is reported by its pieces.
        try:
            importlib.import_module(module)
        except Exception:
            pass
    plans: list[_Plan] = []
    for piece in choice.pieces:
        entry = report.entries[piece.where]
        if piece in _installed:
            entry.sites = list(_installed[piece].sites)
            continue
        try:
            plans.append(_plan(piece, report))
        except _Left as left:
            entry.state, entry.why = (NOT_FOR_VERSION if left.expected else OUT), str(left)
    return plans


def _replace(plans: list[_Plan]) -> None:
    """Every site of every plan gets ours, or (raising) none does."""
    done: list[tuple[Any, str, Any]] = []
    try:
        for plan in plans:
            for holder, attr in plan.sites:
                previous = vars(holder)[attr]
                setattr(holder, attr, plan.ours)
                done.append((holder, attr, previous))
    except BaseException:
        for holder, attr, value in reversed(done):
            setattr(holder, attr, value)
        raise


def _record(plans: list[_Plan], choice: _Choice, owner: str, report: Report) -> None:
    for plan in plans:
        sites = [_site_name(holder, attr) for holder, attr in plan.sites]
        _installed[plan.piece] = _Installed(
            plan.piece, choice.feature[plan.piece], plan.original, plan.ours, owner, sites, list(plan.sites)
        )
        report.entries[plan.piece.where].sites = sites


def _tell(plans: list[_Plan], failed: list[tuple[str, str]], report: Report) -> None:
    """The warnings (an untested version, each piece left out) and the log line."""
    for package in sorted({plan.piece.package for plan in plans} & set(TESTED_VERSIONS)):
        found = report.versions.get(package)
        if found not in TESTED_VERSIONS[package]:
            _warn(
                f"tinker_rl_data: {DISTRIBUTIONS[package]} {found} is not a version the tests ran against "
                f"({', '.join(TESTED_VERSIONS[package])}); its pieces passed their probes and are installed",
                stacklevel=5,
            )
    for title, why in failed:
        _warn(f"tinker_rl_data: {title} not installed: {why}", stacklevel=5)
    if report.fast_construction is False:
        logger.info("tinker_rl_data: Datums go through tinker's public constructors (slower): %s", report.construction)
    logger.info(
        "tinker_rl_data: %d piece(s) installed, %d left, probes %.0f ms",
        len(report.installed),
        len(report.left),
        report.probe_ms,
    )


def _disabled(report: Report) -> Report:
    report.disabled = True
    report.versions = {package: _version(package) for package in TESTED_VERSIONS}
    return report


def _decided(catalog: Sequence[Feature], chosen: Iterable[str], report: Report) -> tuple[_Choice, list[_Plan]]:
    """The phases before anything is replaced: the runtime, the pieces
    chosen, and a plan for each that goes in."""
    _runtime(report)
    choice = _select(catalog, set(chosen), report)
    _drop_missing_packages(choice, report)
    return choice, _decide(choice, report)


def install(catalog: Sequence[Feature], chosen: Iterable[str], *, owner: str, strict: bool | None = None) -> Report:
    """Install every piece of the features of ``catalog`` named in ``chosen``
    (less ``TINKER_RL_DATA_SKIP``) that its probe accepts; return the report
    (its lines: every feature of ``catalog``). See the module's doc."""
    strict = switches.strict(strict)
    report = Report()
    if switches.disabled():
        logger.info("tinker_rl_data: TINKER_RL_DATA_DISABLE=1, nothing installed")
        return _disabled(report)
    choice, plans = _decided(catalog, chosen, report)
    failed = [(e.title, e.why) for e in report.entries.values() if e.state == OUT]
    if strict and failed:
        raise InstallError("tinker_rl_data: nothing installed (strict):\n" + "\n".join(f"  {t}: {w}" for t, w in failed))
    try:
        _replace(plans)
    except Exception as exc:
        if strict:
            raise
        _warn(f"tinker_rl_data: nothing installed: {type(exc).__name__}: {exc}")
        for plan in plans:
            entry = report.entries[plan.piece.where]
            entry.state, entry.why = OUT, f"not installed: {type(exc).__name__}: {exc}"
        return report
    _record(plans, choice, owner, report)
    _tell(plans, failed, report)
    return report


def probe(catalog: Sequence[Feature], chosen: Iterable[str]) -> Report:
    """What install() would do, replacing nothing: every chosen piece
    decided by its probe; those that would go in are reported in, with
    the sites they would replace."""
    report = Report()
    if switches.disabled():
        return _disabled(report)
    _, plans = _decided(catalog, chosen, report)
    for plan in plans:
        report.entries[plan.piece.where].sites = [_site_name(holder, attr) for holder, attr in plan.sites]
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
