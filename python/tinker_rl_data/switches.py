"""Every switch of the package in one place: the environment variables and
install()'s options. The README's table is this one.

Environment variables (read when install() runs, except where said):

==============================  =========  ===============================================
name                            default    what it does
==============================  =========  ===============================================
``TINKER_RL_DATA_DISABLE``      unset      ``1``: install() installs nothing and says so
``TINKER_RL_DATA_STRICT``       unset      ``1``: as ``strict=True``: a piece that cannot
                                           go in raises InstallError, nothing installed
``TINKER_RL_DATA_SKIP``         empty      comma-separated features (``wire``, ``transport``, ``data``,
                                           ``step``, ``kl``, ``gc``, ``coalesce``,
                                           ``workers``) or piece
                                           names (``compute_post_kl``, ``model_dump``)
                                           left out, as if not asked for
``TINKER_RL_DATA_GC_HEADROOM``  ``0.15``   the GC guard's bound: collect early once RSS
                                           passes the step's start by this fraction
                                           (``10%``; ``off``: no RSS bound), read when
                                           a training loop starts
``TINKER_RL_DATA_HUGEPAGES``    ``1``      ``0``: no huge-page advice on large fresh
                                           outputs (read by the core per call)
``TINKER_RL_DATA_INT_READ``     fast       ``api``: exact ints read through CPython's C API
                                           instead of in place (read once, at import)
==============================  =========  ===============================================

install() options (``tinker_rl_data.cookbook.install``; ``tinker_rl_data.install``
takes ``strict`` and installs ``wire`` alone):

============  =========  =====================================================
option        default    what it selects
============  =========  =====================================================
``wire``      on         tinker's forward_backward and sample request bytes
``transport`` on         tinker's step requests sent lean over its transport
(always)      on         the cookbook's data processing (``data``), the rest
                         of its RL step (``step``), and the same install in
                         a rollout executor's workers (``workers``)
``kl``        on         the KL penalty and distillation passes
``gc``        on         Python's cyclic collector held to the trainer's step
``gc_headroom`` 0.15     its memory guard (``TINKER_RL_DATA_GC_HEADROOM``)
``coalesce``  off        concurrent identical single-sample calls as one request
``strict``    off        raise instead of warn (see ``TINKER_RL_DATA_STRICT``)
============  =========  =====================================================
"""

from __future__ import annotations

import os

__all__ = ["FEATURES", "disabled", "skipped", "strict"]

#: The features a piece belongs to, in the order the report lists them, with
#: what each is, for the report.
FEATURES: dict[str, str] = {
    "wire": "tinker's request bytes",
    "transport": "tinker's step requests sent lean",
    "data": "cookbook data processing",
    "step": "cookbook step metrics and usage",
    "kl": "cookbook KL penalty passes",
    "gc": "GC held to the trainer's step",
    "coalesce": "coalesced sampling",
    "workers": "the same install in rollout workers",
}

#: Features install() selects unless told otherwise (``coalesce`` is opt-in).
DEFAULT_FEATURES = frozenset({"wire", "transport", "data", "step", "kl", "gc", "workers"})


def _flag(name: str) -> bool:
    return os.environ.get(name, "") == "1"


def disabled() -> bool:
    """``TINKER_RL_DATA_DISABLE=1``."""
    return _flag("TINKER_RL_DATA_DISABLE")


def strict(argument: bool | None) -> bool:
    """install()'s ``strict`` argument, or ``TINKER_RL_DATA_STRICT=1`` when it is None."""
    return argument if argument is not None else _flag("TINKER_RL_DATA_STRICT")


def skipped() -> frozenset[str]:
    """The features and piece names in ``TINKER_RL_DATA_SKIP``."""
    return frozenset(part.strip() for part in os.environ.get("TINKER_RL_DATA_SKIP", "").split(",") if part.strip())
