"""What a spawn pool's worker imports by name in tests/cookbook/test_workers.py:
an initializer that makes the worker what a test needs (a module it cannot
import, its own TINKER_RL_DATA_* variables) and a stand-in for the
cookbook's ``_run_rollout_sync`` that reports what the worker did. Imports
nothing of tinker_rl_data."""

from __future__ import annotations

import os
import sys
from typing import Any


def set_up_worker(unimportable: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
    for name in unimportable:
        sys.modules[name] = None  # type: ignore[assignment]  # "import name" raises ImportError
    os.environ.update(env or {})
    import tinker_cookbook.rl.rollouts as rollouts

    rollouts._run_rollout_sync = rollout


def rollout(task: Any) -> dict[str, Any]:
    """The task back, with what this worker installed (None where the package is not loaded)."""
    workers = sys.modules.get("tinker_rl_data.cookbook.workers")
    state = getattr(workers, "_worker", None)
    collector = getattr(getattr(state, "parts", {}).get("gc"), "collector", None)
    return {
        "task": task,
        "how": getattr(state, "how", None),
        "installed": getattr(state, "installed", None),
        "headroom": getattr(collector, "headroom", None),
        "env": {k: v for k, v in os.environ.items() if k.startswith("TINKER_RL_DATA_")},
    }
