"""tinker_rl_data for a tinker-cookbook trainer: :func:`install` before it
starts, and the native functions it puts in, importable by name.

Each module here is one feature, holding its functions, their probes and
their pieces: :mod:`.data_processing` (``rl.data_processing``),
:mod:`.step` (the step's metrics and usage), :mod:`.kl` (the KL penalty
and distillation passes), :mod:`.gc_step` (the collector held to the step),
:mod:`.workers` (the same install in a rollout executor's workers).

Importing this package imports every feature's module, these and
tinker's (:mod:`tinker_rl_data.tinker`), each registering its declaration
in :mod:`tinker_rl_data.features`: the whole list, which :func:`install`
reads (its keywords, the report's lines), and whoever needs it imports
this package first.
"""

from __future__ import annotations

from typing import Any

from .. import features
from ..patch import transaction
from ..patch.feature import InstallCall
from ..patch.report import Report
# Every feature's module (data_processing and step: below), each registering
# its FEATURE: the report has a line for every one.
from ..tinker import coalesce, request_bytes, transport  # noqa: F401
from . import gc_step, kl, workers  # noqa: F401
from .data_processing import assemble_training_data as assemble_training_data
from .data_processing import compute_advantages as compute_advantages
from .data_processing import remove_constant_reward_groups as remove_constant_reward_groups
from .data_processing import trajectory_to_data as trajectory_to_data
from .step import compute_kl_sample_train as compute_kl_sample_train
from .step import compute_trajectory_metrics as compute_trajectory_metrics
from .step import remove_mask as remove_mask
from .step import rollout_usage as rollout_usage
from .step import training_usage as training_usage

__all__ = [
    "assemble_training_data",
    "compute_advantages",
    "compute_kl_sample_train",
    "compute_trajectory_metrics",
    "install",
    "remove_constant_reward_groups",
    "remove_mask",
    "rollout_usage",
    "trajectory_to_data",
    "training_usage",
    "uninstall",
]


def install(*, strict: bool | None = None, **options: Any) -> Report:
    """Put tinker_rl_data into tinker-cookbook and tinker; returns the report
    (``print()`` it; :func:`tinker_rl_data.status` gives the same later).

    Always: the cookbook's data processing (``compute_advantages``,
    ``assemble_training_data``, ``trajectory_to_data``,
    ``remove_constant_reward_groups``) and the rest of its RL step
    (``compute_kl_sample_train``, ``compute_trajectory_metrics``,
    ``_remove_mask``, ``rollout_usage``, ``training_usage``), in the module
    that defines each and every other loaded tinker_cookbook module holding
    the same function. Imports those modules.

    - ``wire`` (on): tinker's ``forward_backward`` and ``sample`` request
      bytes made by the Rust core (:mod:`tinker_rl_data.tinker`).
    - ``kl`` (on): the KL penalty and distillation passes (:mod:`.kl`):
      the same scoring requests; advantages and metrics bit-identical.
    - ``gc`` (on): Python's cyclic collector held to the trainer's step
      (:mod:`.gc_step`): changes when it runs, not what is computed.
      ``gc_headroom``: a full collection inside a step once the memory of
      Python's small objects grew by this fraction since the last one
      (default ``TINKER_RL_DATA_GC_HEADROOM`` or 0.25).
    - always, where a rollout executor runs the rollouts in other processes
      (a spawn or forkserver pool, Ray): each worker installs the same
      features with the same switches before its first rollout, decided by
      its own probes (:mod:`.workers`); ``status()`` lists the workers seen.
    - ``coalesce`` (off, opt-in): concurrent identical single-sample calls
      as one request (:mod:`tinker_rl_data.tinker.coalesce`): the same
      distribution of samples, not the same draws.
    - ``strict``: raise :class:`tinker_rl_data.InstallError` (and install
      nothing) where a piece would be left out; default
      ``TINKER_RL_DATA_STRICT=1`` or off.

    Each piece goes in only where its probe, run here on the installed
    versions, finds ours equal to what it replaces; a piece that fails, is
    missing, or whose name holds a function that is not the package's own
    (a user's, a fork's wrapper) is left as it is with one warning, and the
    others go in. An untested version whose probes pass installs with one
    warning. ``TINKER_RL_DATA_SKIP`` leaves features or pieces out;
    ``TINKER_RL_DATA_DISABLE=1`` makes it a no-op (:mod:`tinker_rl_data.switches`).
    Calling it again is harmless; :func:`uninstall` undoes it.

    The keywords (keyword-only) come from the features' declarations
    (:mod:`tinker_rl_data.features`): one per feature with a switch, then the options
    they read; an unknown one raises TypeError.
    """
    chosen = features.chosen(options)
    declared = [f for f in features.declared() if f.name in chosen]
    values = {**features.options(), **options}
    call = InstallCall(chosen, {o.name: values[o.name] for f in declared for o in f.options}, strict, features.__name__)
    for feature in declared:
        if feature.configure is not None:
            feature.configure(call.options)
    report = transaction.install(features.declared(), chosen, owner=__name__, strict=strict)
    for feature in declared:
        if feature.installed is not None:
            feature.installed(call)
    return report


def uninstall() -> None:
    """Put back what :func:`install` replaced; a request encoder installed
    before by :func:`tinker_rl_data.install` stays. Harmless when not
    installed."""
    transaction.uninstall(owner=__name__)
    for feature in features.declared():
        if feature.uninstalled is not None:
            feature.uninstalled()


install.__signature__ = features.signature()  # type: ignore[attr-defined]


def __getattr__(name: str) -> Any:
    # ``tinker_rl_data.cookbook.DataValidationError`` exists (and pickles)
    # without importing tinker_cookbook at import of this package.
    if name == "DataValidationError":
        from .data_processing import _data_validation_error

        return _data_validation_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
