"""The one patch layer: every name tinker_rl_data replaces in tinker and
tinker-cookbook (:data:`REGISTRY`), how each is decided on the user's
machine, and the transaction that installs and uninstalls them.

A piece goes in only when, at install time,

- its module imports and holds the name,
- what the name holds is the package's own function (code from the
  installed package's files; a user's or another library's function there
  is kept), and
- its probe (``_probes``) finds ours giving what that function gives, on
  inputs built from the installed classes.

Otherwise it is left as it is with one warning saying why, and the other
pieces still go in. An untested version whose probes pass is installed with
one warning. ``strict=True`` (or ``TINKER_RL_DATA_STRICT=1``) raises
:class:`InstallError` instead of warning, and installs nothing;
``TINKER_RL_DATA_DISABLE=1`` makes install a no-op that says so.

One call is one transaction: every replacement it chose is made, or, on
any error, none. :func:`uninstall` puts back exactly what install replaced
(where the name still holds ours) and nothing else.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

logger = logging.getLogger("tinker_rl_data")

#: The versions the test suite runs against, per package.
VERIFIED_VERSIONS = {"tinker": ("0.36.0", "0.38.0"), "tinker_cookbook": ("0.5.8", "0.6.1")}

_DISTRIBUTIONS = {"tinker": "tinker", "tinker_cookbook": "tinker-cookbook"}


class InstallError(RuntimeError):
    """Raised by a strict install (``strict=True`` or ``TINKER_RL_DATA_STRICT=1``)
    when a piece cannot go in; nothing was installed."""


class InstallWarning(UserWarning):
    """A piece left out, or a version the tests have not run against."""


@dataclass(frozen=True)
class Piece:
    """One replacement: ``module.name`` becomes ``make(original)``.

    ``option`` is the install() argument that selects it; ``defined_in`` the
    module whose code the original must be (``module`` unless the name is
    imported there); ``spread``: every other loaded module of the package
    holding the same function gets ours too (``from ... import`` copies).
    ``make`` and ``probe`` are ``"module:function"`` references in this
    package, imported when the piece is installed. ``since``: the first
    release whose function ours reproduces (an older one is left as it is
    without a warning). ``undo``: a reference called at uninstall.
    """

    package: str
    module: str
    name: str
    option: str
    make: str
    probe: str
    defined_in: str = ""
    spread: bool = True
    label: str = ""
    since: str = ""
    undo: str = ""

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}"


def _cookbook_piece(module: str, name: str, option: str, ours: str, since: str = "") -> Piece:
    probe = f"._probes:probe_{name.lstrip('_')}"
    return Piece("tinker_cookbook", f"tinker_cookbook.{module}", name, option, ours, probe, since=since)


def _release(version: str | None) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.6.2.dev3+g1" -> (0, 6, 2)."""
    match = re.match(r"\d+(?:\.\d+)*", version or "")
    return tuple(int(n) for n in match.group().split(".")) if match else ()


#: Every replacement tinker_rl_data makes, in the order install() makes them.
REGISTRY: tuple[Piece, ...] = (
    Piece(
        "tinker",
        "tinker.resources.training",
        "forward_backward_request_to_proto",
        "wire",
        ".wire:make_request_builder",
        "._probes:probe_encoder",
        defined_in="tinker.proto.request_conv",
        spread=False,
        label="forward_backward request bytes",
    ),
    Piece(
        "tinker",
        "tinker.resources.sampling",
        "model_dump",
        "wire",
        ".sampling:make_model_dump",
        ".sampling:probe_sample_body",
        defined_in="tinker._compat",
        spread=False,
        label="sample request bytes",
    ),
    Piece(
        "tinker",
        "tinker.lib.public_interfaces.sampling_client",
        "SamplingClient.sample",
        "coalesce",
        "._coalesce:make_sample",
        "._coalesce:probe_sample",
        spread=False,
        label="coalesced sampling",
    ),
    *(
        _cookbook_piece("rl.data_processing", name, "data", ".cookbook:ours_for")
        for name in ("compute_advantages", "assemble_training_data", "trajectory_to_data", "remove_constant_reward_groups")
    ),
    _cookbook_piece("rl.metrics", "compute_kl_sample_train", "step", ".cookbook:ours_for"),
    _cookbook_piece("rl.metric_util", "compute_trajectory_metrics", "step", ".cookbook:ours_for"),
    *(
        _cookbook_piece("rl.train", name, "step", ".cookbook:ours_for")
        for name in ("_remove_mask",)
    ),
    *(
        _cookbook_piece("rl.train", name, "step", ".cookbook:ours_for", since="0.6.1")
        for name in ("rollout_usage", "training_usage")
    ),
    # The KL penalty and distillation passes (``_kl.py``).
    *(
        Piece(
            "tinker_cookbook",
            f"tinker_cookbook.{module}",
            name,
            "kl",
            "._kl:ours_for",
            f"._kl:probe_{probe}",
            label=name if module == "rl.metrics" else f"{module}.{name}",
            since="0.6.1",  # 0.5.x scores through compute_logprobs_async
        )
        for module, name, probe in (
            ("rl.metrics", "incorporate_kl_penalty", "incorporate_kl_penalty"),
            ("rl.metrics", "compute_post_kl", "compute_post_kl"),
            ("rl.metrics", "score_sequences", "score_sequences"),
            ("rl.metrics", "_full_sequence_inputs", "full_sequence_inputs"),
            ("rl.metrics", "discounted_future_sum_vectorized", "discounted_future_sum_vectorized"),
            ("distillation.train_on_policy", "incorporate_kl_penalty", "distillation_incorporate_kl_penalty"),
        )
    ),
    # install() in the rollout executor's workers (``_workers.py``).
    Piece(
        "tinker_cookbook",
        "tinker_cookbook.rl.rollouts",
        "_run_rollout_sync",
        "workers",
        "._workers:make_entry",
        "._workers:probe_entry",
        spread=False,
        label="rollout workers install too",
        undo="._workers:uninstalled",
    ),
    # The GC held to the step: the training loops and their once-per-step
    # functions wrapped (``_gc_step.py``).
    *(
        Piece(
            "tinker_cookbook",
            "tinker_cookbook.rl.train",
            name,
            "gc",
            "._gc_step:make_wrapper",
            "._gc_step:probe_wrapper",
            label=f"GC held to the step: {name}",
            undo="._gc_step:uninstalled",
        )
        for name in (
            "do_sync_training",
            "do_async_training",
            "do_sync_training_with_stream_minibatch",
            "do_train_step_and_get_sampling_client",
            "do_train_step_streaming_and_get_sampling_client",
        )
    ),
)


def _resolve(reference: str) -> Callable[..., Any]:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module, __package__), name)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------
# State and report


@dataclass
class _Installed:
    piece: Piece
    original: Any
    ours: Any
    owner: str
    sites: list[str]
    holders: list[tuple[Any, str]] = field(default_factory=list)


_installed: dict[Piece, _Installed] = {}


@dataclass
class Report:
    """What an install did (or, from :func:`status`, what is in effect)."""

    installed: list[tuple[str, list[str]]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    fast_construction: bool | None = None
    int_read: str = ""
    probe_ms: float = 0.0
    disabled: bool = False
    merged: dict[str, int] = field(default_factory=dict)
    probe_times: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        def version(package: str) -> str:
            found = self.versions.get(package)
            if found is None:
                return f"{_DISTRIBUTIONS[package]} not installed"
            verified = "verified" if found in VERIFIED_VERSIONS[package] else "not in the tested versions"
            return f"{_DISTRIBUTIONS[package]} {found} ({verified})"

        from . import __version__

        lines = [f"tinker_rl_data {__version__}: " + ", ".join(version(p) for p in VERIFIED_VERSIONS)]
        if self.disabled:
            lines.append("  disabled by TINKER_RL_DATA_DISABLE=1: nothing installed")
            return "\n".join(lines)
        lines.append(f"  installed ({len(self.installed)}):" if self.installed else "  installed: nothing")
        for title, sites in self.installed:
            lines.append(f"    {title:<34} {', '.join(sites)}")
        if self.left:
            lines.append(f"  left as they are ({len(self.left)}):")
            lines.extend(f"    {title:<34} {why}" for title, why in self.left)
        if self.kept:
            lines.append("  sites kept (they hold another function): " + ", ".join(self.kept))
        if self.fast_construction is not None:
            lines.append(
                "  Datum construction: "
                + ("direct (fast)" if self.fast_construction else "tinker's public constructors (slower)")
                + f"; int read: {self.int_read}"
            )
        if self.probe_ms:
            lines.append(f"  probes: {self.probe_ms:.0f} ms")
        if self.merged:
            lines.append(
                f"  coalesced sampling: {self.merged.get('merged_calls', 0)} calls sent as "
                f"{self.merged.get('merged_requests', 0)} requests"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"Report({fields})"


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
            found = metadata.version(_DISTRIBUTIONS[package])
        except metadata.PackageNotFoundError:
            return None
    return str(found)


def _runtime(report: Report) -> None:
    from . import _core

    report.versions = {package: _version(package) for package in VERIFIED_VERSIONS}
    report.int_read = str(_core.INT_READ)
    if "tinker" in sys.modules or report.versions["tinker"] is not None:
        from . import _build

        report.fast_construction = bool(_build.DIRECT)


def status() -> Report:
    """What tinker_rl_data has installed now, and the runtime it found."""
    report = Report()
    _runtime(report)
    report.installed = [(record.piece.title, list(record.sites)) for record in _installed.values()]
    if any(piece.option == "coalesce" for piece in _installed):
        from . import _coalesce

        report.merged = dict(_coalesce.counts())
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
    if original is None:
        found = report.versions.get(piece.package)
        older = bool(piece.since) and _release(found) < _release(piece.since)
        raise _Left(f"{piece.module} has no {piece.name}" + (f" (added in {piece.since})" if older else ""), expected=older)
    found = report.versions.get(piece.package)
    if piece.since and _release(found) < _release(piece.since):
        raise _Left(f"ours reproduces {piece.since} and later; {found} differs", expected=True)
    if not _is_own(original, piece):
        owner = f"{getattr(original, '__module__', '?')}.{getattr(original, '__qualname__', type(original).__name__)}"
        raise _Left(f"{piece.where} holds {owner}, not {_DISTRIBUTIONS[piece.package]}'s own: kept")
    try:
        ours = _resolve(piece.make)(original)
    except Exception as exc:
        raise _Left(f"ours cannot be made for this version ({type(exc).__name__}: {exc})") from None
    start = time.perf_counter()
    quiet = logging.root.manager.disable
    report.probe_times[piece.title] = start
    logging.disable(logging.WARNING)  # the probes' constant groups make the cookbook warn
    try:
        _resolve(piece.probe)(original, ours)
    except Exception as exc:
        what = "" if type(exc).__name__ == "ProbeFailed" else f"{type(exc).__name__}: "
        raise _Left(f"probe failed: {what}{exc}") from None
    finally:
        logging.disable(quiet)
        report.probe_times[piece.title] = (time.perf_counter() - start) * 1e3
        report.probe_ms += report.probe_times[piece.title]

    sites = [(holder, attr)]
    if piece.spread:
        for other in _package_modules(piece.package):
            if other is module:
                continue
            for attr, value in list(vars(other).items()):
                if value is original:
                    sites.append((other, attr))
                elif (
                    attr == piece.name
                    and callable(value)
                    and not _is_ours(value)
                    and not _in_package(value, piece.package)
                ):
                    report.kept.append(f"{other.__name__}.{attr}")
    return _Plan(piece, original, ours, sites)


def _site_name(holder: Any, attr: str) -> str:
    if isinstance(holder, type):
        return f"{holder.__module__}.{holder.__qualname__}.{attr}"
    return f"{holder.__name__}.{attr}"


def _is_ours(value: Any) -> bool:
    return any(value is record.ours for record in _installed.values())


# --------------------------------------------------------------------------
# The transaction


def _strict(strict: bool | None) -> bool:
    return strict if strict is not None else os.environ.get("TINKER_RL_DATA_STRICT", "") == "1"


def _warn(message: str) -> None:
    warnings.warn(message, InstallWarning, stacklevel=4)


def install(options: Iterable[str], *, owner: str, strict: bool | None = None) -> Report:
    """Install every piece of ``REGISTRY`` whose option is in ``options`` and
    that the probes accept; return the report. See the module's doc."""
    strict = _strict(strict)
    report = Report()
    if os.environ.get("TINKER_RL_DATA_DISABLE", "") == "1":
        report.disabled = True
        report.versions = {package: _version(package) for package in VERIFIED_VERSIONS}
        logger.info("tinker_rl_data: TINKER_RL_DATA_DISABLE=1, nothing installed")
        return report
    _runtime(report)
    chosen = set(options)
    pieces = [piece for piece in REGISTRY if piece.option in chosen]
    for package in dict.fromkeys(piece.package for piece in pieces):
        if report.versions.get(package) is None:  # not installed: one entry, not one per piece
            n = sum(piece.package == package for piece in pieces)
            report.left.append((f"{_DISTRIBUTIONS[package]} pieces ({n})", f"{package} is not importable"))
            pieces = [piece for piece in pieces if piece.package != package]
    for module in dict.fromkeys(piece.module for piece in pieces):
        # All first, so that every module holding a name is loaded when its
        # sites are found; one that fails is reported by its pieces.
        try:
            importlib.import_module(module)
        except Exception:
            pass
    plans: list[_Plan] = []
    quiet: set[str] = set()
    for piece in pieces:
        if piece in _installed:
            report.installed.append((piece.title, list(_installed[piece].sites)))
            continue
        try:
            plans.append(_plan(piece, report))
        except _Left as left:
            report.left.append((piece.title, str(left)))
            if left.expected:
                quiet.add(piece.title)

    failed = [(title, why) for title, why in report.left if title not in quiet]
    if strict and failed:
        raise InstallError("tinker_rl_data: nothing installed (strict):\n" + "\n".join(f"  {t}: {w}" for t, w in failed))
    done: list[tuple[Any, str, Any]] = []
    try:
        for plan in plans:
            for module, attr in plan.sites:
                previous = vars(module)[attr]
                setattr(module, attr, plan.ours)
                done.append((module, attr, previous))
    except BaseException as exc:
        for module, attr, value in reversed(done):
            setattr(module, attr, value)
        if strict or not isinstance(exc, Exception):
            raise
        _warn(f"tinker_rl_data: nothing installed: {type(exc).__name__}: {exc}")
        report.installed = [entry for entry in report.installed if entry[0] not in {p.piece.title for p in plans}]
        return report

    for plan in plans:
        sites = [_site_name(holder, attr) for holder, attr in plan.sites]
        _installed[plan.piece] = _Installed(plan.piece, plan.original, plan.ours, owner, sites, list(plan.sites))
        report.installed.append((plan.piece.title, sites))
    _originals_changed()

    for package in sorted({plan.piece.package for plan in plans}):
        found = report.versions.get(package)
        if found not in VERIFIED_VERSIONS[package]:
            _warn(
                f"tinker_rl_data: {_DISTRIBUTIONS[package]} {found} is not a version the tests ran against "
                f"({', '.join(VERIFIED_VERSIONS[package])}); its pieces passed their probes and are installed"
            )
    for title, why in failed:
        _warn(f"tinker_rl_data: {title} not installed: {why}")
    if report.fast_construction is False:
        logger.info("tinker_rl_data: tinker's Datum layout is not the one checked; Datums go through its public constructors (slower)")
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
        if piece.undo:
            _resolve(piece.undo)()
    _originals_changed()


def installed(option: str | None = None) -> bool:
    """Whether some piece (of ``option``, when given) is installed."""
    return any(option is None or piece.option == option for piece in _installed)


def original(module: str, name: str) -> Any:
    """The function ``module.name`` held before install, or None."""
    for piece, record in _installed.items():
        if piece.module == module and piece.name == name:
            return record.original
    return None


def _originals_changed() -> None:
    # The native passes hand inputs they do not take to the installed
    # original (not to ours, which the home module now holds).
    from . import _kl, _step

    _step.ORIGINALS.clear()
    _step.ORIGINALS.update({piece.name: record.original for piece, record in _installed.items() if piece.option == "step"})
    _kl.ORIGINALS.clear()
    _kl.ORIGINALS.update(
        {(piece.module, piece.name): record.original for piece, record in _installed.items() if piece.option == "kl"}
    )
