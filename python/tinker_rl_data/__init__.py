"""tinker-rl-data: RL rollouts to ``tinker.Datum`` training rows, with a Rust core.

A drop-in for ``evsys_sdk.training.data_processing``::

    from tinker_rl_data import assemble_training_data, compute_advantages
"""

from ._core import __version__
from .data_processing import (
    DatumMetadata,
    RowArrays,
    assemble_arrays,
    assemble_training_data,
    compute_advantages,
    compute_trajectory_metrics,
)

# Exactly the replaced module's names, so `import *` brings the same ones;
# `assemble_arrays` and `RowArrays` are public too, imported by name.
__all__ = ["DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"]
