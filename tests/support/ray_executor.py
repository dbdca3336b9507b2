"""A `concurrent.futures.Executor` over Ray, as a user would write one for
`rl.train.main(config, rollout_executor=...)`: each `submit(fn, *args)` is
one Ray task (`num_cpus=1`) calling `fn(*args)` in one of Ray's worker
processes, which Ray reuses across tasks; its `ObjectRef.future()` is the
Future. A local cluster of `num_cpus=max_workers` is started on first use
(~3 s here, ~690 MB per worker) and stopped by `shutdown()`. The workers get
the driver's `sys.path` entries on their PYTHONPATH (the environment classes
of :mod:`.cookbook_env` are pickled by reference).

Ray is a bench and test dependency only (`pip install ray`).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Executor, Future
from typing import Any, Callable


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


class RayExecutor(Executor):
    def __init__(self, max_workers: int = 2) -> None:
        import ray

        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            paths = [p for p in sys.path if p and os.path.isdir(p)]
            env = {k: v for k, v in os.environ.items() if k.startswith(("TINKER_", "PYTHONHASHSEED"))}
            env["PYTHONPATH"] = os.pathsep.join(paths)
            ray.init(
                num_cpus=max_workers,
                include_dashboard=False,
                log_to_driver=True,
                logging_level="WARNING",
                runtime_env={"env_vars": env},
            )
            self._started = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_call)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        return self._remote.remote(fn, args, kwargs).future()  # type: ignore[no-any-return]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
