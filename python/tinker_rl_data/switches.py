"""Every environment variable of the package, read here and nowhere else on
the Python side (:data:`VARIABLES`; the native core reads the two marked
"the core" itself, where documented in ``rust/``). install()'s options and
the launcher's flags come from the features' declarations
(:mod:`tinker_rl_data.features`, which also renders the switches table).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

__all__ = [
    "GC_HEADROOM",
    "PREFIX",
    "VARIABLES",
    "Variable",
    "disabled",
    "gc_headroom",
    "ours",
    "skipped",
    "strict",
    "variable",
]

PREFIX = "TINKER_RL_DATA_"


@dataclass(frozen=True)
class Variable:
    """One environment variable: its switch-table row, and who reads it."""

    name: str
    default: str
    description: str
    example: str
    read_by: str = "switches"


DISABLE = PREFIX + "DISABLE"
STRICT = PREFIX + "STRICT"
SKIP = PREFIX + "SKIP"
GC_HEADROOM = PREFIX + "GC_HEADROOM"
HUGEPAGES = PREFIX + "HUGEPAGES"
INT_READ = PREFIX + "INT_READ"

#: Every variable, in the switches table's order.
VARIABLES = (
    Variable(STRICT, "off", "a piece that cannot go in raises `InstallError`; nothing installed", "1"),
    Variable(SKIP, "empty", "leaves out features or pieces by name", "gc,_remove_mask"),
    Variable(DISABLE, "unset", "`install()` installs nothing and says so (to bisect a difference)", "1"),
    Variable(
        GC_HEADROOM,
        "0.25",
        "a full collection inside a step once Python's small objects grew by this fraction since the last one "
        "(`0`: at once; `off`: none until the step's end)",
        "0.5",
    ),
    Variable(HUGEPAGES, "on", "no huge-page advice on fresh outputs of 4 MiB and more", "0", read_by="the core, per call"),
    Variable(
        INT_READ, "in place", "exact ints read through CPython's C API (read at import)", "api", read_by="the core, at import"
    ),
)


def variable(name: str) -> Variable:
    """The :class:`Variable` called ``name``."""
    (found,) = [v for v in VARIABLES if v.name == name]
    return found


def _flag(name: str) -> bool:
    return os.environ.get(name, "") == "1"


def disabled() -> bool:
    """``TINKER_RL_DATA_DISABLE=1``."""
    return _flag(DISABLE)


def strict(argument: bool | None) -> bool:
    """install()'s ``strict`` argument, or ``TINKER_RL_DATA_STRICT=1`` when it is None."""
    return argument if argument is not None else _flag(STRICT)


def skipped() -> frozenset[str]:
    """The features and piece names in ``TINKER_RL_DATA_SKIP``."""
    return frozenset(part.strip() for part in os.environ.get(SKIP, "").split(",") if part.strip())


def gc_headroom(default: float | None) -> float | None:
    """``TINKER_RL_DATA_GC_HEADROOM`` as a fraction (``0.25`` or ``25%``;
    ``off`` or ``none``: None); ``default`` when unset, or with a
    warning when not a number >= 0 (a typo does not stop a training run)."""
    raw = os.environ.get(GC_HEADROOM, "").strip()
    if not raw:
        return default
    if raw.lower() in ("off", "none"):
        return None
    try:
        value = float(raw.removesuffix("%")) / (100 if raw.endswith("%") else 1)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        warnings.warn(f"{GC_HEADROOM}={raw!r} is not a fraction >= 0 (e.g. 0.25) or off: {default} used", stacklevel=3)
        return default
    return value


def ours() -> dict[str, str]:
    """The package's variables set in this process (what a rollout worker is handed)."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}


#: The proxy variables httpx reads (not the package's: read here so that
#: every environment read of the package is in this module).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def proxy_set() -> bool:
    """Whether a proxy variable is set (a client that would use it is left
    to tinker by the transport feature)."""
    return any(os.environ.get(name) for name in PROXY_VARIABLES)
