"""tinker-rl-data: RL rollouts to ``tinker.Datum`` training rows, with a Rust core.

For a tinker-cookbook trainer, one line before it starts::

    import tinker_rl_data.cookbook
    print(tinker_rl_data.cookbook.install())

(or ``tinker-rl-data run -m <recipe> ...``). :func:`install` alone makes
tinker send request bytes made by the Rust core; :func:`status` says what
is in effect; :func:`uninstall` undoes every install.

A drop-in for ``evsys_sdk.training.data_processing``::

    from tinker_rl_data import assemble_training_data, compute_advantages

Layout: ``evsys/`` (that front door), ``cookbook/`` (the cookbook's data
processing, step metrics, KL passes, GC held to the step, rollout workers;
``cookbook.features``, the list of every feature), ``tinker/`` (request
bytes, coalesced sampling), ``rows`` (Datums for both front doors),
``patch/`` (features' declarations, pieces, install transaction, report,
launcher), ``switches`` (every environment variable), ``errors``.
The contract is in the README, ``docs/contract.md`` and the docstrings.
"""

from ._core import __version__ as __version__
from .errors import InstallError as InstallError
from .errors import InstallWarning as InstallWarning
from .evsys import Advantages as Advantages
from .evsys import DatumMetadata as DatumMetadata
from .evsys import RowArrays as RowArrays
from .evsys import assemble_arrays as assemble_arrays
from .evsys import assemble_training_data as assemble_training_data
from .evsys import compute_advantages as compute_advantages
from .evsys import compute_trajectory_metrics as compute_trajectory_metrics
from .evsys import remove_constant_reward_groups as remove_constant_reward_groups
from .patch.report import Report as Report
from .patch.transaction import status as status
from .tinker.forward_backward import encode_forward_backward as encode_forward_backward
from .tinker import install as install
from .tinker import uninstall as uninstall
from .tinker.sample import encode_sample_request as encode_sample_request

# Exactly the replaced module's names, so `import *` brings the same ones;
# the others are public too, imported by name (explicit re-exports above).
__all__ = ["DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"]
