"""The Rust core (PyO3). Private: use the functions of ``tinker_rl_data``."""

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["__version__", "compute_advantages", "reward_metrics", "assemble_arrays", "assemble_datums", "_panic_probe"]

__version__: str

def compute_advantages(groups: Any, normalize: bool) -> list[list[float]]: ...
def reward_metrics(groups: Any) -> tuple[float, float, int, int] | None: ...
def assemble_arrays(
    groups: Any, advantages: Any
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float32],
    npt.NDArray[np.float32],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    int,
]: ...
def assemble_datums(groups: Any, advantages: Any, classes: tuple[type, type, type, type, type]) -> tuple[list[Any], list[Any], int]: ...
def _panic_probe() -> None: ...
