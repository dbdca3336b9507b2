"""What a feature module declares for each name it replaces: a
:class:`Piece`, and the helpers its probe uses.

A feature module (``tinker_rl_data.tinker.*``, ``tinker_rl_data.cookbook.*``)
holds, next to each other, the code of a replacement, its ``make(original)``
and its probe, and lists its pieces in a module-level ``PIECES`` tuple;
:mod:`tinker_rl_data.patch.registry` only collects those tuples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ProbeFailed

__all__ = ["Piece", "ProbeFailed", "check", "outcome", "release", "same_outcome"]

Make = Callable[[Callable[..., Any]], Callable[..., Any]]
Probe = Callable[[Callable[..., Any], Callable[..., Any]], None]


@dataclass(frozen=True)
class Piece:
    """One replacement: ``module.name`` becomes ``make(original)``.

    ``feature``: the install() option that selects it (``switches.FEATURES``).
    ``make(original)`` builds ours around the function found installed (a
    fallback calls that ``original``); ``probe(original, ours)`` raises
    :class:`ProbeFailed` when they differ on this machine. ``name`` may be
    ``Class.attribute``. ``defined_in``: the module whose code the original
    must be (``module`` unless the name is imported there); ``spread``: every
    other loaded module of the package holding the same function gets ours
    too (``from ... import`` copies); ``since``: the first release whose
    function ours reproduces (an older one is left as it is without a
    warning); ``undo``: called at uninstall; ``needs``: the package without
    which the piece has nothing to do (its own package unless said: the
    standard library's piece for the cookbook's rollouts needs the cookbook).
    """

    module: str
    name: str
    feature: str
    make: Make
    probe: Probe
    defined_in: str = ""
    spread: bool = True
    label: str = ""
    since: str = ""
    undo: Callable[[], None] | None = None
    needs: str = ""

    @property
    def package(self) -> str:
        """The top-level package the piece patches (``tinker``, ``tinker_cookbook``)."""
        return self.module.partition(".")[0]

    @property
    def requires(self) -> str:
        """The package that must be importable for the piece to go in."""
        return self.needs or self.package

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}"


def release(version: str | None) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.6.2.dev3+g1" -> (0, 6, 2)."""
    match = re.match(r"\d+(?:\.\d+)*", version or "")
    return tuple(int(n) for n in match.group().split(".")) if match else ()


# --------------------------------------------------------------------------
# For probes


def check(condition: bool, reason: str) -> None:
    """Raises :class:`ProbeFailed` with ``reason`` unless ``condition``."""
    if not condition:
        raise ProbeFailed(reason)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``("raised", exception)``."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # the probe compares what the original raises too
        return "raised", exc


def same_outcome(theirs: tuple[str, Any], mine: tuple[str, Any], what: str) -> bool:
    """Whether both returned (True) or both raised, ours of the original's
    class or a subclass (False); raises ProbeFailed otherwise."""
    if theirs[0] == "raised":
        check(
            mine[0] == "raised" and isinstance(mine[1], type(theirs[1])),
            f"{what}: the original raised {type(theirs[1]).__name__}, ours "
            + (f"raised {type(mine[1]).__name__}" if mine[0] == "raised" else "returned"),
        )
        return False
    check(mine[0] == "ok", f"{what}: the original returned, ours raised {mine[1]!r}")
    return True
