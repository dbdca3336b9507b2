"""The cyclic GC held off across a public call that makes many objects."""

from __future__ import annotations

import functools
import gc
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def gc_paused(fn: F) -> F:
    """Runs ``fn`` with the cyclic GC off, then restores the state it found.

    The Rust core pauses it too, for its own work; pausing here as well
    keeps the Python wrapping around the core call (its result object, the
    tuple returned) from setting off the young collection that the new
    objects are due. That collection walks every new container, as it would
    after any call that returns them; it runs at the caller's next
    allocation instead of inside this call (what tinker_rl_data 0.1 did).
    """

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused  # type: ignore[return-value]
