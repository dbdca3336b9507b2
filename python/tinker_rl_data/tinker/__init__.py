"""What goes to tinker: its request bytes made by the Rust core
(:mod:`.forward_backward`, :mod:`.sample`) and coalesced sampling
(:mod:`.coalesce`), each module declaring its pieces.

:func:`install` here (``tinker_rl_data.install``) puts in the request bytes
alone, for a program that sends its own Datums; a cookbook trainer uses
:func:`tinker_rl_data.cookbook.install`, which includes them.
"""

from __future__ import annotations

from ..patch import transaction
from ..patch.report import Report
from . import request_bytes

__all__ = ["install", "uninstall"]


def install(*, strict: bool | None = None) -> Report:
    """Make tinker send ``forward_backward`` and ``sample`` request bytes made
    by the Rust core, where their probes find them equal to tinker's on this
    machine (the policy: :mod:`tinker_rl_data.patch.transaction`). Returns
    the report; calling it again is harmless; :func:`uninstall` undoes it."""
    from ..cookbook import features  # (the list of every feature: for the report's lines)

    return transaction.install(features.declared(), (request_bytes.FEATURE.name,), owner="tinker_rl_data", strict=strict)


def uninstall() -> None:
    """Put back everything tinker_rl_data installed (these pieces, and the
    cookbook's if :func:`tinker_rl_data.cookbook.install` put them in).
    Harmless when nothing is installed."""
    transaction.uninstall()
