"""What a feature module declares: one :class:`Feature`, its name, default,
one-line description, switches, pieces and hooks. The patch layer is handed
these declarations (registered in :mod:`tinker_rl_data.features`) and derives
install()'s options, the launcher's flags, the report's lines, ``status()``
and the switches table from them; it names no feature.

A module in the older style (a ``PIECES`` tuple whose pieces name their
feature) is adapted by one line, registered like every declaration::

    FEATURE = features.register(__name__, Feature("transport", "tinker's transport", PIECES, default=False))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .piece import Piece

__all__ = ["Feature", "InstallCall", "Option", "WorkerPart", "WorkerStart", "selected"]


@dataclass(frozen=True)
class Option:
    """A further keyword of install() that a feature reads (its own
    on/off keyword aside): ``gc_headroom``. ``variable``: the environment
    variable giving the same setting (documented in the switches table)."""

    name: str
    default: Any
    description: str
    variable: str = ""
    example: str = ""


@dataclass(frozen=True)
class InstallCall:
    """What one install() call asked: the features selected (names), the
    selected features' option values, the strict argument, and the module
    listing the declarations (``catalog``, for a rollout worker to find
    the same ones by name)."""

    features: tuple[str, ...]
    options: Mapping[str, Any]
    strict: bool | None
    catalog: str


@dataclass(frozen=True)
class WorkerStart:
    """A rollout worker's install, as its ``worker`` hooks see it:
    ``inherited``: the process had the pieces already (a copy of the
    driver's process, or the driver's own); ``driver``: it is the
    driver's own process."""

    inherited: bool
    driver: bool


class WorkerPart:
    """What a feature does in a rollout worker where its pieces went in
    (what its ``worker`` hook returns): each rollout runs inside
    :meth:`rollout`, and :meth:`counters` are added to the worker's
    counters carried back with every result. Both do nothing unless
    overridden."""

    def rollout(self) -> contextlib.AbstractContextManager[object]:
        """A context manager the rollout runs inside (exited when it raises too)."""
        return contextlib.nullcontext()

    def counters(self) -> Mapping[str, float]:
        """Numbers for the worker's counters, as of now (cumulative)."""
        return {}


@dataclass(frozen=True)
class Feature:
    """One feature of the package.

    ``name``: its install() keyword (when ``switch``), its skip name in
    ``TINKER_RL_DATA_SKIP`` and its report line; ``description``: one line
    for the report and the tables; ``pieces``: what it replaces (each names
    this feature); ``default``: on unless asked otherwise; ``switch``:
    install() takes ``name=`` and the launcher a flag (``--no-name`` for a
    default feature, ``--name`` for an opt-in one); without it the feature
    goes in with every ``cookbook.install()``. ``options``: further
    install() keywords it reads.

    Hooks (each optional): ``configure(options)``, with this feature's
    option values, before the transaction when it is selected;
    ``installed(call)`` after install() (:class:`InstallCall`);
    ``uninstalled()`` after ``cookbook.uninstall()``; ``status()``: lines
    the report adds while some piece of it is installed; ``aside()``: the
    installed pieces (by :attr:`Piece.where`) that hand every call to the
    original now, and why (a flag the service sent), for ``status()``;
    ``worker(start)``:
    in a rollout worker where its pieces went in, once before the first
    rollout (:class:`WorkerStart`), a :class:`WorkerPart` around each
    rollout and for the counters, or None.
    """

    name: str
    description: str
    pieces: tuple[Piece, ...]
    default: bool = True
    switch: bool = True
    options: tuple[Option, ...] = ()
    configure: Callable[[Mapping[str, Any]], None] | None = None
    installed: Callable[[InstallCall], None] | None = None
    uninstalled: Callable[[], None] | None = None
    status: Callable[[], list[str]] | None = None
    aside: Callable[[], Mapping[str, str]] | None = None
    worker: Callable[[WorkerStart], WorkerPart | None] | None = None

    def __post_init__(self) -> None:
        other = [p.where for p in self.pieces if p.feature != self.name]
        if other:
            raise ValueError(f"feature {self.name!r} holds pieces of another feature: {other}")

    @property
    def flag(self) -> str:
        """The launcher's flag (features with a ``switch``)."""
        return f"--no-{self.name}" if self.default else f"--{self.name}"

    @property
    def state_when_not_asked(self) -> str:
        return "off (not asked)" if self.default else "opt-in, not asked"


def selected(catalog: Sequence[Feature], arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The features an install() with these keyword ``arguments`` selects:
    those without a switch, and those whose switch is on."""
    return tuple(f.name for f in catalog if not f.switch or arguments.get(f.name, f.default))
