"""What a feature module declares for each name it replaces: a
:class:`Piece`, and the helpers its probe uses.

A feature module (``tinker_rl_data.tinker.*``, ``tinker_rl_data.cookbook.*``)
holds, next to each other, the code of a replacement, its ``make(original)``
and its probe, and declares its pieces in its :class:`~.feature.Feature`.

One probe style: a probe runs the original and ours on the same inputs
(:func:`outcome`, raised exceptions included), compares the outcomes
(:func:`same_outcome`, then the results: :func:`same_metrics` for metric
dicts) and raises :class:`ProbeFailed` saying how they differ (:func:`check`).
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Mapping

from ..errors import ProbeFailed, current

__all__ = ["Piece", "ProbeFailed", "check", "outcome", "release", "run_to_end", "same_metrics", "same_outcome"]

Make = Callable[[Callable[..., Any]], Callable[..., Any]]
Probe = Callable[[Callable[..., Any], Callable[..., Any]], None]


@dataclass(frozen=True)
class Piece:
    """One replacement: ``module.name`` becomes ``make(original)``.

    ``feature``: the name of the :class:`~.feature.Feature` declaring it.
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
        """``module.name``: the piece's key (labels may repeat)."""
        return f"{self.module}.{self.name}"

    def direct(self) -> Callable[..., Any]:
        """Ours for calling directly (not installed): ``make`` of a function
        calling the original as :attr:`module` holds it when called (where
        ours is installed, that falls back to the original in turn)."""
        return self.make(current(self.module, self.name))


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


def run_to_end(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Runs ``coroutine`` to its end, also from inside a running event loop
    (then in a thread); its exception is raised here as it is."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: list[tuple[str, Any]] = []

    def target() -> None:
        result.append(outcome(asyncio.run, coroutine))

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    kind, value = result[0]
    if kind == "raised":
        raise value
    return value


def _close(a: Any, b: Any, tolerance: float) -> bool:
    """Equal, or (floats) within ``tolerance`` of the larger magnitude (at
    least 1); NaN equals NaN."""
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))
    return bool(a == b)


def same_metrics(theirs: Mapping[str, Any], mine: Mapping[str, Any], what: str, tolerance: float = 0.0) -> None:
    """Raises ProbeFailed unless both metric dicts have the same keys in the
    same order and equal values (floats within ``tolerance``, relative)."""
    check(list(theirs) == list(mine), f"{what}: other keys ({sorted(set(theirs) ^ set(mine))[:3]} differ)")
    for key in theirs:
        check(_close(theirs[key], mine[key], tolerance), f"{what}: {key} is {mine[key]!r}, the original's {theirs[key]!r}")


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
