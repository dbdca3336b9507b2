"""Whether this Python's ``signal`` module builds a handler's repr when it
reads one (CPython before 3.13, and 3.12's early patch releases): what the
workers' signal piece is for. Written from CPython's own behaviour, not
from the piece's probe."""

from __future__ import annotations

import signal


class CountedRepr:
    """A handler (or a coroutine's result) that counts its reprs."""

    reprs = 0

    def __call__(self, *args: object) -> None:
        pass

    def __repr__(self) -> str:
        type(self).reprs += 1
        return "counted"


def signal_reprs_handlers() -> bool:
    CountedRepr.reprs = 0
    previous = signal.signal(signal.SIGUSR1, CountedRepr())
    try:
        signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return CountedRepr.reprs > 0
