"""The launcher's import hooks (:class:`tinker_rl_data.patch.launch._Watch`):
``builtins.__import__`` and ``importlib.import_module`` counted per thread,
so that the install runs when a thread's outermost import call has
returned, holding no import lock.

This file's name holds "importlib" and "_bootstrap" on purpose: ``warnings``
skips such frames as it skips importlib's own, so that a module's
``warnings.warn(..., stacklevel=2)`` at import still names the line that
imported it (and a DeprecationWarning there still shows in ``__main__``), as
under python. The import's exception leaves without this file's frame in
its traceback (the install's own, a strict InstallError, keeps it). What
remains visible: the hooks' frames to ``inspect.stack()`` while an import
runs."""

from __future__ import annotations

import threading
from typing import Any, Callable


class Calls(threading.local):
    """One thread's import calls in progress through the hooks."""

    depth = 0


def counted(original: Callable[..., Any], calls: Calls, returned: Callable[[], None]) -> Callable[..., Any]:
    """``original`` (``__import__`` or ``import_module``) as it is, to its
    caller: the same arguments, result and exception; ``inspect.signature``
    and ``help`` see the original (``__wrapped__``). When a thread's outermost
    call ends (returning or raising), ``returned()`` runs."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        depth = calls.depth
        calls.depth = depth + 1
        try:
            return original(*args, **kwargs)
        except BaseException as exc:
            # This frame's own entry, first in the traceback: off it, as the
            # frames of importlib are (a bare raise adds none back).
            tb = exc.__traceback__
            if tb is not None and tb.tb_frame.f_code is hook.__code__:
                exc.__traceback__ = tb.tb_next
            raise
        finally:
            calls.depth = depth
            if not depth:
                returned()

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(hook, name, getattr(original, name, None))
    hook.__wrapped__ = original  # type: ignore[attr-defined]
    return hook
