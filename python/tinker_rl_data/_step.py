"""The rest of tinker-cookbook 0.6.1's RL step around the data, native.

Re-exported by :mod:`tinker_rl_data.cookbook` (which :func:`install` puts
them into the cookbook's modules)::

    compute_kl_sample_train(data_D, training_logprobs_D)      # rl.metrics
    compute_trajectory_metrics(trajectory_groups_P, taglist_P)  # rl.metric_util
    remove_mask(datum)                                        # rl.train._remove_mask
    rollout_usage(trajectory_groups)                          # rl.train
    training_usage(data_D)                                    # rl.train

Each reads its input once, in the Rust core (``rust/py/step.rs``), where the
cookbook makes a torch tensor or a dataclass per Datum, or reads every group
again per tag. Keys and integer results are the cookbook's; float metrics
are accumulated in float64 (the cookbook's KL means are float32 tensor
means, its other means numpy's float64 ones), so they agree with the
cookbook's to float32 rounding.

Any input the native pass does not read exactly (objects of other types
than the cookbook's, a tensor on another device, a case where the cookbook
raises) goes to the cookbook's own function, read no further: results and
exceptions are then the cookbook's by construction.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _core

__all__ = [
    "compute_kl_sample_train",
    "compute_trajectory_metrics",
    "remove_mask",
    "rollout_usage",
    "training_usage",
]

#: The cookbook module each replaced function is defined in, by its name there.
HOMES = {
    "compute_kl_sample_train": "tinker_cookbook.rl.metrics",
    "compute_trajectory_metrics": "tinker_cookbook.rl.metric_util",
    "_remove_mask": "tinker_cookbook.rl.train",
    "rollout_usage": "tinker_cookbook.rl.train",
    "training_usage": "tinker_cookbook.rl.train",
}

# What dict_mean's np.mean takes as a number besides Python's int and float.
_NUMPY_NUMBERS = (np.floating, np.integer, np.bool_)


class _Classes(NamedTuple):
    # (ModelInput, EncodedTextChunk): read by their public fields.
    inputs: tuple[type, type]
    # Read or built field by field, only where _build found tinker's layout.
    tensor_data: type | None
    datum: tuple[type, type, type, type] | None


_classes: _Classes | None = None


def _tinker_classes() -> _Classes:
    global _classes
    if _classes is None:
        import tinker
        from tinker.types import EncodedTextChunk

        from . import _build

        direct = _build.DIRECT
        _classes = _Classes(
            inputs=(tinker.ModelInput, EncodedTextChunk),
            tensor_data=tinker.TensorData if direct else None,
            datum=(tinker.Datum, tinker.TensorData, tinker.PromptProvenanceSpan, tinker.SampledProvenanceSpan)
            if direct
            else None,
        )
    return _classes


#: The cookbook's own functions by name, filled by the patch layer when it
#: installs ours (so that the originals are found once they are replaced).
ORIGINALS: dict[str, Callable[..., Any]] = {}


def _cookbook(name: str, why: Exception) -> Callable[..., Any]:
    """The cookbook's own function ``name`` (the original even once
    installed), for an input the native pass leaves to it."""
    function = ORIGINALS.get(name)
    if function is None:
        try:
            function = getattr(importlib.import_module(HOMES[name]), name)
        except ImportError as exc:
            raise TypeError(f"{why}; tinker_cookbook's own {name}, which takes such input, is not importable") from exc
    return function


def _token_usage() -> Any:
    from tinker_cookbook.utils.cost_estimation import TokenUsage

    return TokenUsage


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
            data_D, training_logprobs_D, _tinker_classes().tensor_data, getattr(torch, "Tensor", None)
        )
    except _core.Unsupported as why:
        return _cookbook("compute_kl_sample_train", why)(data_D, training_logprobs_D)  # type: ignore[no-any-return]
    return {"optim/kl_sample_train_v1": v1, "optim/kl_sample_train_v2": v2, "optim/entropy": entropy}


def _own_total_rewards() -> Any:
    """The cookbook's ``TrajectoryGroup.get_total_rewards``: a group whose
    class has it as it is has its total rewards summed natively."""
    types = sys.modules.get("tinker_cookbook.rl.types")
    group = getattr(types, "TrajectoryGroup", None)
    return getattr(group, "get_total_rewards", None)


def compute_trajectory_metrics(trajectory_groups_P: list[Any], taglist_P: list[list[str]]) -> dict[str, float]:
    """tinker_cookbook's ``rl.metric_util.compute_trajectory_metrics``: the
    same keys, in the same order, under ``env/all/`` and (when some tag
    selects a strict subset of the groups) ``env/<tag>/``.

    The groups are read once and summed per tag, where the cookbook reads
    them once per tag and once more for all.
    """
    try:
        return _core.trajectory_metrics(
            trajectory_groups_P, taglist_P, _tinker_classes().inputs, _own_total_rewards(), _NUMPY_NUMBERS
        )
    except _core.Unsupported as why:
        return _cookbook("compute_trajectory_metrics", why)(trajectory_groups_P, taglist_P)  # type: ignore[no-any-return]


def remove_mask(datum: Any) -> Any:
    """tinker_cookbook's ``rl.train._remove_mask``: a new Datum without the
    ``mask`` loss input (which tinker's losses do not take), every other
    field kept, provenance spans included.

    Built directly, as the assembled Datums are, where the cookbook's
    ``dataclasses.replace`` runs ``Datum.__init__`` and ``__post_init__``
    again; through ``dataclasses.replace`` where tinker's layout is not the
    one ``_build`` checked, or the Datum is not a plain one.
    """
    classes = _tinker_classes().datum
    if classes is not None:
        try:
            return _core.datum_without_mask(datum, classes)
        except _core.Unsupported:
            pass
    return dataclasses.replace(datum, loss_fn_inputs={k: v for k, v in datum.loss_fn_inputs.items() if k != "mask"})


def rollout_usage(trajectory_groups: Any) -> Any:
    """tinker_cookbook's ``rl.train.rollout_usage``: a ``TokenUsage`` of
    the action tokens sampled and the observation tokens prefilled, split
    by the prefix-cache hits the sampler reported."""
    try:
        sampled, cached, prompt = _core.rollout_counts(trajectory_groups, _tinker_classes().inputs)
    except _core.Unsupported as why:
        return _cookbook("rollout_usage", why)(trajectory_groups)
    return _token_usage()(sampled=sampled, prefill_cached=cached, prefill_uncached=prompt - cached)


def training_usage(data_D: list[Any]) -> Any:
    """tinker_cookbook's ``rl.train.training_usage``: a ``TokenUsage`` of
    the model-input tokens of the Datums."""
    try:
        trained = _core.training_tokens(data_D, _tinker_classes().inputs)
    except _core.Unsupported as why:
        return _cookbook("training_usage", why)(data_D)
    return _token_usage()(trained=trained)
