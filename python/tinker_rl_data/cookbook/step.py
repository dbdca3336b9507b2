"""The rest of tinker-cookbook 0.6.1's RL step around the data, native::

    compute_kl_sample_train(data_D, training_logprobs_D)      # rl.metrics
    compute_trajectory_metrics(trajectory_groups_P, taglist_P)  # rl.metric_util
    remove_mask(datum)                                        # rl.train._remove_mask
    rollout_usage(trajectory_groups)                          # rl.train
    training_usage(data_D)                                    # rl.train

Each reads its input once, in the Rust core (``rust/py/step/``), where the
cookbook makes a torch tensor or a dataclass per Datum, or reads every group
again per tag. Keys and integer results are the cookbook's; the trajectory
metrics' means are numpy's float64 ones to the bit (its pairwise order)
where the values averaged are Python numbers; the KL metrics (the
cookbook's are float32 tensor means) and means over other numpy scalars
are accumulated in float64 and agree with the cookbook's to float32
rounding.

Any input the native pass does not read exactly (objects of other types
than the cookbook's, a tensor on another device, a case where the cookbook
raises) goes to the cookbook's own function, read no further: results and
exceptions are then the cookbook's by construction. Installed (the pieces
in :data:`PIECES`, feature ``step``), each is ``make(original)`` and falls
back to that original; the module-level functions, for calling directly,
fall back to the cookbook's function as its module holds it when called.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

from .. import _core, features
from ..errors import left_to
from ..patch.feature import Feature
from ..patch.piece import Piece, check, outcome, same_metrics, same_outcome
from ..rows import direct
from .probe_inputs import CookbookBatches, datum_bytes, probe_datums

__all__ = [
    "PIECES",
    "compute_kl_sample_train",
    "compute_trajectory_metrics",
    "remove_mask",
    "rollout_usage",
    "training_usage",
]

Function = Callable[..., Any]


def _token_usage() -> Any:
    from tinker_cookbook.utils.cost_estimation import TokenUsage

    return TokenUsage


# --------------------------------------------------------------------------
# compute_kl_sample_train


def make_compute_kl_sample_train(original: Function) -> Function:
    def compute_kl_sample_train(data_D: list[Any], training_logprobs_D: list[Any]) -> dict[str, float]:
        """tinker_cookbook's ``rl.metrics.compute_kl_sample_train``: over every
        position whose ``mask`` is > 0, the mean of sampling minus training
        logprob (``optim/kl_sample_train_v1``), half the mean of its square
        (``_v2``) and minus the mean sampling logprob (``optim/entropy``).

        One pass over the Datums' own buffers and the training tensors' memory
        (a torch tensor's ``.numpy()`` view, no copy), summed in float64.
        """
        torch = sys.modules.get("torch")  # a torch tensor means torch is loaded
        try:
            v1, v2, entropy = _core.kl_sample_train(
                data_D, training_logprobs_D, direct=direct(), torch_tensor=getattr(torch, "Tensor", None)
            )
        except _core.Unsupported as why:
            return left_to(original, "compute_kl_sample_train", why)(data_D, training_logprobs_D)  # type: ignore[no-any-return]
        return {"optim/kl_sample_train_v1": v1, "optim/kl_sample_train_v2": v2, "optim/entropy": entropy}

    return compute_kl_sample_train


def _own_total_rewards() -> Any:
    """The cookbook's ``TrajectoryGroup.get_total_rewards``: a group whose
    class has it as it is has its total rewards summed natively."""
    types = sys.modules.get("tinker_cookbook.rl.types")
    group = getattr(types, "TrajectoryGroup", None)
    return getattr(group, "get_total_rewards", None)


# --------------------------------------------------------------------------
# compute_trajectory_metrics


def make_compute_trajectory_metrics(original: Function) -> Function:
    def compute_trajectory_metrics(trajectory_groups_P: list[Any], taglist_P: list[list[str]]) -> dict[str, float]:
        """tinker_cookbook's ``rl.metric_util.compute_trajectory_metrics``: the
        same keys, in the same order, under ``env/all/`` and (when some tag
        selects a strict subset of the groups) ``env/<tag>/``.

        The groups are read once and summed per tag, where the cookbook reads
        them once per tag and once more for all.
        """
        try:
            return _core.trajectory_metrics(trajectory_groups_P, taglist_P, _own_total_rewards())
        except _core.Unsupported as why:
            return left_to(original, "compute_trajectory_metrics", why)(trajectory_groups_P, taglist_P)  # type: ignore[no-any-return]

    return compute_trajectory_metrics




# --------------------------------------------------------------------------
# _remove_mask, rollout_usage, training_usage


def remove_mask(datum: Any) -> Any:
    """tinker_cookbook's ``rl.train._remove_mask``: a new Datum without the
    ``mask`` loss input (which tinker's losses do not take), every other
    field kept, provenance spans included.

    Built directly, as the assembled Datums are, where the cookbook's
    ``dataclasses.replace`` runs ``Datum.__init__`` and ``__post_init__``
    again; through ``dataclasses.replace`` where tinker's layout is not the
    one ``rows`` checked, or the Datum is not a plain one.
    """
    if direct():
        try:
            return _core.datum_without_mask(datum)
        except _core.Unsupported:
            pass
    return dataclasses.replace(datum, loss_fn_inputs={k: v for k, v in datum.loss_fn_inputs.items() if k != "mask"})


def make_rollout_usage(original: Function) -> Function:
    def rollout_usage(trajectory_groups: Any) -> Any:
        """tinker_cookbook's ``rl.train.rollout_usage``: a ``TokenUsage`` of
        the action tokens sampled and the observation tokens prefilled, split
        by the prefix-cache hits the sampler reported."""
        try:
            sampled, cached, prompt = _core.rollout_counts(trajectory_groups)
        except _core.Unsupported as why:
            return left_to(original, "rollout_usage", why)(trajectory_groups)
        return _token_usage()(sampled=sampled, prefill_cached=cached, prefill_uncached=prompt - cached)

    return rollout_usage


def make_training_usage(original: Function) -> Function:
    def training_usage(data_D: list[Any]) -> Any:
        """tinker_cookbook's ``rl.train.training_usage``: a ``TokenUsage`` of
        the model-input tokens of the Datums."""
        try:
            trained = _core.training_tokens(data_D)
        except _core.Unsupported as why:
            return left_to(original, "training_usage", why)(data_D)
        return _token_usage()(trained=trained)

    return training_usage




# --------------------------------------------------------------------------
# The probes


def _same_metrics(theirs: dict[str, Any], mine: dict[str, Any], what: str) -> None:
    # The contract's tolerance for metrics summed in float64 against the
    # cookbook's float32 or numpy sums: float32 rounding.
    same_metrics(theirs, mine, what, tolerance=1e-5)


def probe_compute_kl_sample_train(original: Any, ours: Any) -> None:
    import torch

    data = probe_datums()
    training = [
        torch.tensor([-0.25 * ((i + j) % 5) for j in range(len(d.loss_fn_inputs["target_tokens"].data))])
        for i, d in enumerate(data)
    ]
    theirs, mine = outcome(original, data, training), outcome(ours, data, training)
    if same_outcome(theirs, mine, "the probe Datums"):
        _same_metrics(theirs[1], mine[1], "the probe Datums")


def probe_compute_trajectory_metrics(original: Any, ours: Any) -> None:
    cookbook = CookbookBatches()
    batch = cookbook.batches()[0]
    for tags in ([["a"], ["b"]], [["a"], ["a"]], [[], ["x", "y"]]):
        theirs, mine = outcome(original, batch, tags), outcome(ours, batch, tags)
        if same_outcome(theirs, mine, f"tags {tags}"):
            _same_metrics(theirs[1], mine[1], f"tags {tags}")


def probe_remove_mask(original: Any, ours: Any) -> None:
    data = probe_datums()
    check(datum_bytes(map(original, data)) == datum_bytes(map(ours, data)), "other Datums")


def _usage(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def probe_rollout_usage(original: Any, ours: Any) -> None:
    for i, batch in enumerate(CookbookBatches().batches()):
        theirs, mine = outcome(original, batch), outcome(ours, batch)
        if same_outcome(theirs, mine, f"batch {i}"):
            check(_usage(theirs[1]) == _usage(mine[1]), f"batch {i}: {_usage(mine[1])} != {_usage(theirs[1])}")


def probe_training_usage(original: Any, ours: Any) -> None:
    data = probe_datums()
    check(_usage(original(data)) == _usage(ours(data)), "other usage")


def _piece(module: str, name: str, make: Callable[[Function], Function], probe: Callable[[Any, Any], None], since: str = "") -> Piece:
    return Piece(f"tinker_cookbook.{module}", name, "step", make, probe, since=since)


PIECES = (
    _piece("rl.metrics", "compute_kl_sample_train", make_compute_kl_sample_train, probe_compute_kl_sample_train),
    _piece("rl.metric_util", "compute_trajectory_metrics", make_compute_trajectory_metrics, probe_compute_trajectory_metrics),
    _piece("rl.train", "_remove_mask", lambda original: remove_mask, probe_remove_mask),
    _piece("rl.train", "rollout_usage", make_rollout_usage, probe_rollout_usage, since="0.6.1"),
    _piece("rl.train", "training_usage", make_training_usage, probe_training_usage, since="0.6.1"),
)

FEATURE = features.register(__name__, Feature("step", "cookbook step metrics and usage", PIECES, switch=False))

# For calling directly (not installed): each falls back to the cookbook's
# function as its module holds it when called.
compute_kl_sample_train, compute_trajectory_metrics, _, rollout_usage, training_usage = (p.direct() for p in PIECES)
