"""tinker-rl-data: RL rollouts to ``tinker.Datum`` training rows, with a Rust core.

A drop-in for ``evsys_sdk.training.data_processing``::

    from tinker_rl_data import assemble_training_data, compute_advantages

``install()`` makes tinker send ``forward_backward`` request bytes made by
the Rust core (:mod:`tinker_rl_data.wire`), where probes run on this machine
find them equal to tinker's; it returns a report of what went in, and
``status()`` gives the same later. ``uninstall()`` undoes every install.
For a tinker-cookbook trainer, :func:`tinker_rl_data.cookbook.install`.

The contract (inputs, rows, errors) is in ``docs/contract.md`` of the
repository and in the functions' docstrings.
"""

from ._core import __version__ as __version__
from .data_processing import Advantages as Advantages
from .data_processing import DatumMetadata as DatumMetadata
from .data_processing import RowArrays as RowArrays
from .data_processing import assemble_arrays as assemble_arrays
from .data_processing import assemble_training_data as assemble_training_data
from .data_processing import compute_advantages as compute_advantages
from .data_processing import compute_trajectory_metrics as compute_trajectory_metrics
from .data_processing import remove_constant_reward_groups as remove_constant_reward_groups
from ._patch import InstallError as InstallError
from ._patch import InstallWarning as InstallWarning
from ._patch import Report as Report
from ._patch import status as status
from .wire import install as install
from .wire import uninstall as uninstall

# Exactly the replaced module's names, so `import *` brings the same ones;
# the others are public too, imported by name (explicit re-exports above).
__all__ = ["DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"]
