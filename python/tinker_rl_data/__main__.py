"""``python -m tinker_rl_data run ...`` / ``check``, and the ``tinker-rl-data``
console script: the launcher (:mod:`tinker_rl_data.patch.launch`) handed
the package's features and ``cookbook.install``."""

from __future__ import annotations

import sys

from . import cookbook, features
from .patch import launch


def main(argv: list[str] | None = None) -> int:
    return launch.main(argv, features.declared(), cookbook.install)


def console() -> None:
    """The ``tinker-rl-data`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console()
