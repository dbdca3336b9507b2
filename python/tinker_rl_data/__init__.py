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
processing, step metrics, KL passes, GC held to the step, rollout workers),
``tinker/`` (request bytes, coalesced sampling, transport), ``features``
(the features' order and the registry of their declarations), ``rows`` (Datums for both front doors),
``patch/`` (features' declarations, pieces, install transaction, report,
launcher), ``switches`` (every environment variable), ``errors``.
The contract is in the README, ``docs/contract.md`` and the docstrings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._core import __version__ as __version__
from .errors import InstallError as InstallError
from .errors import InstallWarning as InstallWarning
from .patch.report import Report as Report
from .patch.transaction import status as status
from .tinker.forward_backward import encode_forward_backward as encode_forward_backward
from .tinker.sample import encode_sample_request as encode_sample_request

if TYPE_CHECKING:
    from .evsys import Advantages as Advantages
    from .evsys import DatumMetadata as DatumMetadata
    from .evsys import RowArrays as RowArrays
    from .evsys import assemble_arrays as assemble_arrays
    from .evsys import assemble_training_data as assemble_training_data
    from .evsys import compute_advantages as compute_advantages
    from .evsys import compute_trajectory_metrics as compute_trajectory_metrics
    from .evsys import remove_constant_reward_groups as remove_constant_reward_groups

# Exactly the replaced module's names, so `import *` brings the same ones;
# the others are public too, imported by name (explicit re-exports above).
__all__ = ["DatumMetadata", "assemble_training_data", "compute_advantages", "compute_trajectory_metrics"]

def install(*, strict: bool | None = None) -> Report:
    """Make tinker send ``forward_backward`` and ``sample`` request bytes made
    by the Rust core, where their probes find them equal to tinker's on this
    machine (the policy: :mod:`tinker_rl_data.patch.transaction`). Returns
    the report; calling it again is harmless; :func:`uninstall` undoes it."""
    from . import cookbook  # noqa: F401  (every feature's module: the report has a line for each)
    from . import features
    from .patch import transaction
    from .tinker import request_bytes

    return transaction.install(features.declared(), (request_bytes.FEATURE.name,), owner=__name__, strict=strict)


def uninstall() -> None:
    """Put back everything tinker_rl_data installed (these pieces, and the
    cookbook's if :func:`tinker_rl_data.cookbook.install` put them in).
    Harmless when nothing is installed."""
    from .patch import transaction

    transaction.uninstall()


#: The evsys front door's names, imported (with numpy and tinker) at their
#: first use: importing the package imports nothing of the user's stack, so
#: the launcher can run a program before its first line does.
_EVSYS = (
    "Advantages",
    "DatumMetadata",
    "RowArrays",
    "assemble_arrays",
    "assemble_training_data",
    "compute_advantages",
    "compute_trajectory_metrics",
    "remove_constant_reward_groups",
)


def __getattr__(name: str) -> Any:
    if name in _EVSYS:
        from . import evsys

        return getattr(evsys, name)
    if name in ("evsys", "rows"):  # (imported with the package before)
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
