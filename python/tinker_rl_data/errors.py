"""Every exception type of the package, and the one way a native pass
leaves an input to the function it replaces.

- :class:`InstallError`: a strict install (``strict=True`` or
  ``TINKER_RL_DATA_STRICT=1``) found a piece that cannot go in; nothing was
  installed.
- :class:`InstallWarning`: a piece left out, or a version the tests have
  not run against (the run goes on).
- :class:`ProbeFailed`: a probe found ours and the installed function
  different (the piece stays out; the message says how).
- :class:`NotNeeded`: a probe found the installed function already does
  what ours would (the piece stays out, without a warning).
- :class:`Unsupported` (the core's): an input a native pass does not read
  exactly; the caller hands it to the original function (:func:`left_to`).
- :class:`ValidationError` (the core's): the contract's bad-input cases;
  the front doors raise them as their documented classes (evsys:
  ``ValueError`` subclasses; the cookbook: its own function's outcome,
  or, without tinker_cookbook, its ``DataValidationError``).
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import threading
from typing import Any, Callable

from ._core import Unsupported as Unsupported
from ._core import ValidationError as ValidationError

__all__ = ["InstallError", "InstallWarning", "NotNeeded", "ProbeFailed", "Unsupported", "ValidationError", "current", "left_to"]

logger = logging.getLogger("tinker_rl_data")


class InstallError(RuntimeError):
    """Raised by a strict install (``strict=True`` or ``TINKER_RL_DATA_STRICT=1``)
    when a piece cannot go in; nothing was installed."""


class InstallWarning(UserWarning):
    """A piece left out, or a version the tests have not run against."""


class ProbeFailed(Exception):
    """Ours and the installed function differ (or the probe input cannot be
    built with the installed classes); the message says how."""


class NotNeeded(ProbeFailed):
    """The installed function already does what ours would (a newer
    release fixed it): the piece stays out, listed as not for this
    version, without a warning."""


_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def left_to(original: Callable[..., Any], what: str, why: Exception | str) -> Callable[..., Any]:
    """``original``, for an input the native ``what`` leaves to it; the
    reason is logged once per function and reason at INFO on the
    ``tinker_rl_data`` logger (a Datum's index is not part of the reason)."""
    reason = re.sub(r"^datum \d+: ", "", str(why))
    with _logged_lock:
        new = (what, reason) not in _logged
        _logged.add((what, reason))
    if new:
        logger.info("tinker_rl_data: %s left to the original function: %s", what, reason)
    # current(): its error says why it was needed (`is True`: a mock answers any attribute)
    if getattr(original, "_looked_up_when_called", False) is True:
        return functools.partial(original, _why=str(why))
    return original


def current(module: str, name: str) -> Callable[..., Any]:
    """A function calling ``module.name`` as that module holds it when
    called: the fallback of our functions called directly, not installed
    (where ours is installed, it falls back to the original in turn)."""

    def original(*args: Any, _why: str = "", **kwargs: Any) -> Any:
        try:
            function = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            package = module.partition(".")[0]
            raise TypeError(
                f"{_why + '; ' if _why else ''}{package}'s own {name}, which takes such input, is not importable"
            ) from exc
        return function(*args, **kwargs)

    original.__qualname__ = original.__name__ = name
    original._looked_up_when_called = True  # type: ignore[attr-defined]
    return original
