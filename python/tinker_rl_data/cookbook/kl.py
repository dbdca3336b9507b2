"""tinker-cookbook 0.6.1's KL penalty passes, native::

    incorporate_kl_penalty(data_D, base_sampling_client, kl_penalty_coef, kl_discount_factor)  # rl.metrics
    compute_post_kl(data_D, post_sampling_client)                  # rl.metrics
    score_sequences(sampling_client, sequence_inputs)              # rl.metrics
    _full_sequence_inputs(data_D)                                  # rl.metrics
    discounted_future_sum_vectorized(x, gamma)                     # rl.metrics
    distillation_incorporate_kl_penalty(data_D, teacher_clients_D, dataset_indices_D,
                                        kl_penalty_coef, kl_discount_factor)
                                      # distillation.train_on_policy.incorporate_kl_penalty

The scoring calls are the cookbook's, the same requests in the same order.
The per-token arithmetic runs in the Rust core (``rust/kl.rs``) over the
Datums' own buffers and the responses' ``prompt_logprobs_np`` arrays, as
torch runs it: float32, one operation at a time in the cookbook's order, the
discounted sum as its sequential float32 recurrence (bit for bit). Each
Datum's ``advantages`` become a new float32 ``TensorData``, as the cookbook
writes them.

The penalty passes' batch means are the cookbook's float32 ones, bit for
bit: each Datum's sum is torch's CPU ``Tensor.sum()`` (ATen's cascade sum,
reproduced in ``rust/torch_sum.rs`` for the vector width of the kernel
torch runs, found from ``torch.backends.cpu.get_cpu_capability()`` and
checked against torch's own sums once; a Datum of 32768 positions or more,
which torch sums in chunks over its threads, is summed by torch itself),
the Datums' sums added in order as Python's ``sum`` does, then one float32
division. So ``kl_policy_base``, ``teacher_kl`` and its per-dataset
values are the cookbook's, and so are all advantages. Where the sum's
order is not reproduced (another capability), the penalty passes are the
cookbook's. ``compute_post_kl``'s means are torch's own ``mean()`` of the
differences made here, so they are the cookbook's too.

Inputs the native pass does not take exactly (other classes than tinker's,
sparse or int64 logprobs, scored logprobs that torch would broadcast or
refuse, a torch default dtype other than float32) go to the cookbook's own
function: after the scoring calls, with a client that replays the responses
already received, so no request is sent twice. Each reason is logged once
at INFO on the ``tinker_rl_data`` logger.

Its pieces (:data:`PIECES`, feature ``kl``) put ``make_X(original)`` of
each into the cookbook's modules; those fall back to the ``original`` they
were made with. The module-level functions, for calling directly, fall back
to the cookbook's function as its module holds it when called.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import sys
from typing import Any, AsyncIterator, Callable, Iterable

from .. import _core, features
from ..errors import ProbeFailed, left_to
from ..patch.feature import Feature
from ..patch.piece import Piece, check, outcome, run_to_end, same_metrics, same_outcome
from ..rows import classes, direct

__all__ = [
    "PIECES",
    "compute_post_kl",
    "discounted_future_sum_vectorized",
    "distillation_incorporate_kl_penalty",
    "full_sequence_inputs",
    "incorporate_kl_penalty",
    "score_sequences",
]

logger = logging.getLogger("tinker_rl_data")

_METRICS = "tinker_cookbook.rl.metrics"
_DISTILLATION = "tinker_cookbook.distillation.train_on_policy"


def _float32_default() -> str | None:
    """Why torch.tensor(list of floats) would not be float32, if it would not."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_default_dtype() is not torch.float32:
        return f"torch's default dtype is {torch.get_default_dtype()}"
    return None


@contextlib.asynccontextmanager
async def _span(name: str) -> AsyncIterator[None]:
    """The cookbook's ``trace.scope`` span of its function ``name``."""
    trace = sys.modules.get("tinker_cookbook.utils.trace")
    if trace is None:
        yield
    else:
        async with trace.scope_span(name):
            yield


class _Ready:
    """An answer already at hand, as tinker's ``APIFuture`` hands it out."""

    def __init__(self, value: Any) -> None:
        self._value = value

    async def _get(self) -> Any:
        return self._value

    def coroutine(self) -> Any:
        return self._get()

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def __await__(self) -> Any:
        return self._get().__await__()


class _Replay:
    """A sampling client that answers with the responses already received,
    in the order they are asked for: the cookbook's function then runs on
    exactly what ours read, and sends no request again."""

    def __init__(self, answers: Iterable[Any]) -> None:
        self._answers = iter(answers)

    def sample(self, *args: Any, **kwargs: Any) -> _Ready:
        return _Ready(next(self._answers))

    def compute_logprobs(self, *args: Any, **kwargs: Any) -> _Ready:
        return _Ready(next(self._answers))


# --------------------------------------------------------------------------
# the scoring calls


async def _score(sampling_client: Any, sequence_inputs: list[Any]) -> tuple[list[Any], Any]:
    """``score_sequences``'s calls and usage, keeping the responses."""
    from tinker_cookbook.utils.cost_estimation import TokenUsage

    # One SamplingParams for all: frozen, and the same request fields.
    params = classes().sampling_params(max_tokens=1)
    async with _span("score_sequences"):
        responses = await asyncio.gather(
            *[
                sampling_client.sample(
                    prompt=sequence_input,
                    num_samples=1,
                    sampling_params=params,
                    include_prompt_logprobs=True,
                ).coroutine()
                for sequence_input in sequence_inputs
            ]
        )
    prompt_tokens = sum(sequence_input.length for sequence_input in sequence_inputs)
    cached_tokens = sum(r.prompt_cache_hit_tokens for r in responses)
    usage = TokenUsage(
        sampled=sum(len(seq.tokens) for r in responses for seq in r.sequences),
        prefill_cached=cached_tokens,
        prefill_uncached=prompt_tokens - cached_tokens,
    )
    return responses, usage


async def score_sequences(sampling_client: Any, sequence_inputs: list[Any]) -> tuple[list[list[float | None]], Any]:
    """tinker_cookbook's ``rl.metrics.score_sequences``: the prompt logprobs
    of each sequence (one ``sample`` request each, ``max_tokens=1``,
    ``include_prompt_logprobs=True``, run concurrently) and the usage.

    The lists are the responses' own ``prompt_logprobs``; the passes below
    read the responses' arrays instead and make no list.
    """
    responses, usage = await _score(sampling_client, sequence_inputs)
    return [r.prompt_logprobs for r in responses], usage


def make_full_sequence_inputs(original: Callable[..., Any]) -> Callable[..., Any]:
    def full_sequence_inputs(data_D: list[Any]) -> list[Any]:
        """tinker_cookbook's ``rl.metrics._full_sequence_inputs``: each Datum's
        model input with its last target token appended (the unshifted
        sequence), as ``ModelInput.append_int`` makes it. The last target is
        read from the array, where the cookbook makes a list of all of them."""
        try:
            return _core.full_sequence_inputs(data_D, direct=direct())
        except _core.Unsupported as why:
            return left_to(original, "_full_sequence_inputs", why)(data_D)  # type: ignore[no-any-return]

    return full_sequence_inputs


def _sequences(data_D: Any) -> tuple[list[Any] | None, str]:
    """The sequences to score, or None and why the cookbook's function
    takes the input."""
    if type(data_D) not in (list, tuple) or not data_D:
        return None, "data_D is empty or not a list"
    try:
        return _core.full_sequence_inputs(data_D, direct=direct()), ""
    except _core.Unsupported as why:
        return None, str(why)


# --------------------------------------------------------------------------
# the passes


#: ``Vectorized<float>::size()`` of the sum kernel torch runs, by CPU
#: capability, first guess first. torch registers no AVX512 sum kernel (its
#: ``REGISTER_DISPATCH`` leaves AVX512 and SVE256 to the next one down):
#: AVX512 runs AVX2's; ARM's DEFAULT (NEON) is 4 or 8 floats by version.
_LANES = {"AVX2": (8,), "AVX512": (8, 16), "DEFAULT": (8, 4), "SVE256": (8, 4)}

_lanes: int | str | None = None


def _sum_samples() -> list[Any]:
    """float32 arrays of mixed magnitudes, around every length where
    torch's cascade sum changes its shape."""
    import numpy as np

    rng = np.random.default_rng(5)
    lengths = [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 257, 1023, 1024, 1025, 4096, 4097, 20000]
    return [(rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32) for n in lengths]


def _summing() -> int | str:
    """How many floats torch's sum kernel takes per vector here, checked
    against torch's own sums; or why torch's sums are not reproduced."""
    global _lanes
    if _lanes is None:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
        samples = _sum_samples()
        theirs = [torch.from_numpy(a).sum().item() for a in samples]
        theirs_strided = [_torch_sum(a, False) for a in samples]
        found: int | str = f"torch's float32 sum under CPU capability {capability} is not reproduced"
        for lanes in _LANES.get(capability, ()):
            ours = [_core.torch_sum(a, lanes, True) for a in samples]
            strided = [_core.torch_sum(a, lanes, False) for a in samples]
            if _same_floats(ours, theirs) and _same_floats(strided, theirs_strided):
                found = lanes
                break
        _lanes = found
    return _lanes


def _same_floats(ours: list[float | None], theirs: list[float]) -> bool:
    import numpy as np

    if any(v is None for v in ours):
        return False
    return np.array(ours, np.float32).tobytes() == np.array(theirs, np.float32).tobytes()


def _torch_sum(values: Any, contiguous: bool) -> float:
    """torch's own ``Tensor.sum()`` of ``values`` as a contiguous or a
    strided float32 tensor (strided ones are summed in another order)."""
    import torch

    tensor = torch.from_numpy(values)
    if not contiguous:
        tensor = torch.empty(2 * len(values), dtype=torch.float32)[::2].copy_(tensor)
    return float(tensor.sum().item())


def _penalty(
    data_D: Any, scored: Any, teacher: bool, coef: Any, discount: Any
) -> tuple[float, list[float], list[float]] | Exception | str:
    """The native penalty pass (advantages written back) and its sums, or
    the reason it leaves the call to the cookbook: ``scored`` are the base
    model's responses, or (``teacher``) each teacher's logprobs."""
    reason = _float32_default()
    if reason is not None:
        return reason
    lanes = _summing()
    if isinstance(lanes, str):
        return lanes
    gamma = discount if discount > 0 else None
    summing = _core.TorchSum(lanes, _torch_sum)
    try:
        return _core.kl_penalty(data_D, scored, teacher=teacher, coef=coef, gamma=gamma, direct=direct(), summing=summing)
    except _core.Unsupported as unsupported:
        return unsupported


def make_incorporate_kl_penalty(original: Callable[..., Any]) -> Callable[..., Any]:
    async def incorporate_kl_penalty(
        data_D: list[Any], base_sampling_client: Any, kl_penalty_coef: float, kl_discount_factor: float
    ) -> tuple[dict[str, float], Any]:
        """tinker_cookbook's ``rl.metrics.incorporate_kl_penalty``: scores each
        Datum's sequence under ``base_sampling_client`` and adds
        ``kl_penalty_coef * mask * (avg - diff)`` (discounted when
        ``kl_discount_factor > 0``) to its advantages, ``diff`` being the
        masked ``logprobs - base logprob`` and ``avg`` its float32 batch mean,
        returned as ``kl_policy_base`` with the scoring calls' usage (all as
        the cookbook's, bit for bit)."""
        name = "incorporate_kl_penalty"
        sequences, why = _sequences(data_D)
        if sequences is None:
            return await left_to(original, name, why)(data_D, base_sampling_client, kl_penalty_coef, kl_discount_factor)  # type: ignore[no-any-return]
        async with _span(name):
            responses, usage = await _score(base_sampling_client, sequences)
            result = _penalty(data_D, responses, False, kl_penalty_coef, kl_discount_factor)
        if not isinstance(result, tuple):
            cookbooks = left_to(original, name, result)
            return await cookbooks(data_D, _Replay(responses), kl_penalty_coef, kl_discount_factor)  # type: ignore[no-any-return]
        return {"kl_policy_base": result[0]}, usage

    return incorporate_kl_penalty


def _post_means(flat: Any) -> tuple[float, float]:
    """The cookbook's two means of the flat differences, by torch itself
    (a contiguous float32 tensor of the same values as its ``torch.cat``,
    so the same sums, threads and all)."""
    import torch

    diffs = torch.from_numpy(flat)
    return diffs.mean().item(), 0.5 * (diffs**2).mean().item()


def make_compute_post_kl(original: Callable[..., Any]) -> Callable[..., Any]:
    async def compute_post_kl(data_D: list[Any], post_sampling_client: Any) -> tuple[dict[str, float], Any]:
        """tinker_cookbook's ``rl.metrics.compute_post_kl``: over the positions
        whose mask is > 0, the mean of the Datums' logprobs minus those scored
        under ``post_sampling_client`` (``kl_pre_post_v1``) and half the mean of
        its square (``kl_pre_post_v2``), with the usage. The differences are
        made here (float32, as the cookbook's tensors) and averaged by torch, so
        both are the cookbook's, bit for bit."""
        name = "compute_post_kl"
        sequences, why = _sequences(data_D)
        if sequences is None:
            return await left_to(original, name, why)(data_D, post_sampling_client)  # type: ignore[no-any-return]
        async with _span(name):
            responses, usage = await _score(post_sampling_client, sequences)
            reason: Exception | str | None = _float32_default()
            if reason is None:
                try:
                    v1, v2 = _post_means(_core.post_kl_diffs(data_D, responses))
                except _core.Unsupported as unsupported:
                    reason = unsupported
        if reason is not None:
            return await left_to(original, name, reason)(data_D, _Replay(responses))  # type: ignore[no-any-return]
        return {"kl_pre_post_v1": v1, "kl_pre_post_v2": v2}, usage

    return compute_post_kl


def make_discounted_future_sum_vectorized(original: Callable[..., Any]) -> Callable[..., Any]:
    def discounted_future_sum_vectorized(x: Any, gamma: float) -> Any:
        """tinker_cookbook's ``rl.metrics.discounted_future_sum_vectorized``:
        ``out[t] = x[t] + gamma * out[t + 1]`` from the end, in ``x``'s float
        dtype, bit for bit (a contiguous 1-D CPU tensor without grad and a
        Python float ``gamma``; anything else is the cookbook's)."""
        torch = sys.modules.get("torch")
        if torch is not None and type(x) is torch.Tensor and type(gamma) is float:
            # ``numpy()`` itself refuses a tensor that needs grad, lives on another
            # device, is sparse or has its neg/conj bit set; the native sum takes
            # only a contiguous 1-D float32/float64 array. Four checks instead
            # of ten attribute calls, each slow when cold (the call is once per
            # Datum in the cookbook's own loop).
            try:
                array = x.numpy()
            except (RuntimeError, TypeError):
                array = None
            if array is not None:
                try:
                    return torch.from_numpy(_core.discounted_future_sum(array, gamma))
                except _core.Unsupported:
                    pass
        why = "not a plain 1-D float CPU tensor and a float"
        return left_to(original, "discounted_future_sum_vectorized", why)(x, gamma)

    return discounted_future_sum_vectorized


def make_distillation_incorporate_kl_penalty(original: Callable[..., Any]) -> Callable[..., Any]:
    async def distillation_incorporate_kl_penalty(
        data_D: list[Any],
        teacher_clients_D: list[Any],
        dataset_indices_D: list[int],
        kl_penalty_coef: float,
        kl_discount_factor: float,
    ) -> dict[str, float]:
        """tinker_cookbook's ``distillation.train_on_policy.incorporate_kl_penalty``:
        scores each Datum's sequence under its own teacher (``compute_logprobs``)
        and adds ``-kl_penalty_coef * mask * reverse_kl`` (discounted when
        ``kl_discount_factor > 0``) to its advantages, ``reverse_kl`` being the
        masked ``logprobs - teacher logprob``. Metrics: ``teacher_kl`` (the
        float32 batch mean) and ``teacher_kl/dataset_<i>`` per dataset with a
        mask (the Datums' float32 sums added as Python floats), as the
        cookbook's."""
        name = "incorporate_kl_penalty"
        args = (dataset_indices_D, kl_penalty_coef, kl_discount_factor)
        sequences, why = _sequences(data_D)
        indices_ok = (
            type(dataset_indices_D) in (list, tuple)
            and len(dataset_indices_D) >= len(data_D)
            and all(type(i) is int for i in dataset_indices_D[: len(data_D)])
        )
        if sequences is None or not indices_ok:
            why = why or "the dataset indices are not a list of ints, one per Datum"
            return await left_to(original, name, why)(data_D, teacher_clients_D, *args)  # type: ignore[no-any-return]
        async with _span(name):
            teacher_logprobs_D = await asyncio.gather(
                *[
                    teacher_client.compute_logprobs(sequence_input).coroutine()
                    for teacher_client, sequence_input in zip(teacher_clients_D, sequences)
                ]
            )
            result = _penalty(data_D, teacher_logprobs_D, True, kl_penalty_coef, kl_discount_factor)
        if not isinstance(result, tuple):
            replays = [_Replay([logprobs]) for logprobs in teacher_logprobs_D]
            return await left_to(original, name, result)(data_D, replays, *args)  # type: ignore[no-any-return]
        mean, kl_sums, mask_sums = result
        per_dataset: dict[int, tuple[float, float]] = {}
        for i, kl_sum, mask_sum in zip(dataset_indices_D, kl_sums, mask_sums):
            prev_kl, prev_mask = per_dataset.get(i, (0.0, 0.0))
            per_dataset[i] = (prev_kl + kl_sum, prev_mask + mask_sum)
        metrics = {"teacher_kl": mean}
        for i, (kl_sum, mask_sum) in per_dataset.items():
            if mask_sum > 0:
                metrics[f"teacher_kl/dataset_{i}"] = kl_sum / mask_sum
        return metrics

    return distillation_incorporate_kl_penalty


# --------------------------------------------------------------------------
# probes: ours against the installed original on a few Datums


def _probe_data() -> list[Any]:
    """A few Datums: masks partly set, one all zero, an image chunk, a
    one-position Datum."""
    import numpy as np
    import tinker
    from tinker.types import EncodedTextChunk, ImageChunk

    rng = np.random.default_rng(27)
    data = []
    shapes = [(12, "mixed"), (7, "zero"), (1, "one"), (20, "image")]
    for n, kind in shapes:
        tokens = [int(t) for t in rng.integers(0, 1000, n + 1)]
        chunks: list[Any] = [EncodedTextChunk(tokens=tokens[:n])]
        if kind == "image":
            chunks = [
                EncodedTextChunk(tokens=tokens[:4]),
                ImageChunk(data=b"\x89PNG", format="png", expected_tokens=3),
                EncodedTextChunk(tokens=tokens[7:n]),
            ]
        mask = (rng.random(n) < 0.6).astype(np.float32) if kind != "zero" else np.zeros(n, np.float32)
        inputs = {
            "target_tokens": tinker.TensorData.from_numpy(np.array(tokens[1:], np.int64)),
            "logprobs": tinker.TensorData.from_numpy((-rng.random(n) * 3).astype(np.float32) * mask),
            "advantages": tinker.TensorData.from_numpy((rng.standard_normal(n)).astype(np.float32) * mask),
            "mask": tinker.TensorData.from_numpy(mask),
        }
        data.append(tinker.Datum(model_input=tinker.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    return data


def _probe_response(prompt: Any) -> Any:
    """A SampleResponse scoring ``prompt`` as a fixed function of its tokens."""
    import numpy as np
    import tinker

    n = prompt.length
    logprobs = -(np.arange(n, dtype=np.float32) % 7) * np.float32(0.37) - np.float32(0.11)
    logprobs[0] = np.nan
    sequence = tinker.SampledSequence(
        stop_reason="length", sequence_id="probe", tokens_np=np.array([1], np.int32), logprobs_np=np.array([-0.5], np.float32)
    )
    return tinker.SampleResponse(sequences=[sequence], prompt_logprobs_np=logprobs, prompt_cache_hit_tokens=n // 3)


class _ProbeClient:
    """A scoring client that answers at once."""

    def sample(self, prompt: Any, num_samples: int, sampling_params: Any, include_prompt_logprobs: bool = False, **_: Any) -> _Ready:
        return _Ready(_probe_response(prompt))

    def compute_logprobs(self, prompt: Any, prompt_logprobs_last_n: int | None = None) -> _Ready:
        return _Ready(_probe_response(prompt).prompt_logprobs)


def _advantage_bits(data: list[Any]) -> list[bytes]:
    return [d.loss_fn_inputs["advantages"].to_numpy().tobytes() for d in data]


def _awaited(function: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """:func:`outcome` of ``function(*args)`` awaited to its end."""
    return outcome(lambda: run_to_end(function(*args)))


def _compared(theirs: tuple[str, Any], mine: tuple[str, Any], what: str) -> tuple[Any, Any]:
    """Both results; ProbeFailed saying what was raised unless both returned
    (one probe input: an original that raises on it leaves nothing to compare)."""
    same_outcome(theirs, mine, what)
    check(theirs[0] == "ok", f"{what}: the original raised {theirs[1]!r} (the probe is out of date)")
    return theirs[1], mine[1]


def _check_penalty(original: Callable[..., Any], ours: Callable[..., Any], args: Callable[[list[Any]], tuple[Any, ...]]) -> None:
    base = _probe_data()
    theirs_data, ours_data = copy.deepcopy(base), copy.deepcopy(base)
    theirs, mine = _compared(
        _awaited(original, theirs_data, *args(theirs_data)), _awaited(ours, ours_data, *args(ours_data)), "the probe data"
    )
    if isinstance(theirs, dict):
        same_metrics(theirs, mine, "metrics")
    else:
        same_metrics(theirs[0], mine[0], "metrics")
        check(theirs[1] == mine[1], f"usage {mine[1]} != {theirs[1]}")
    check(_advantage_bits(ours_data) == _advantage_bits(theirs_data), "advantages differ")
    check([d.loss_fn_inputs["advantages"].dtype for d in ours_data] == ["float32"] * len(base), "advantages are not float32")


def _check_sums() -> None:
    """Our float32 sums are torch's here (else the penalty passes' means
    would not be the cookbook's)."""
    lanes = _summing()
    if isinstance(lanes, str):
        raise ProbeFailed(lanes)


def probe_incorporate_kl_penalty(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    _check_sums()
    for gamma in (0.0, 0.9):
        _check_penalty(original, ours, lambda data, g=gamma: (_ProbeClient(), 0.5, g))  # type: ignore[misc]


def probe_distillation_incorporate_kl_penalty(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    def args(data: list[Any], gamma: float) -> tuple[Any, ...]:
        return ([_ProbeClient() for _ in data], [i % 2 for i in range(len(data))], 1.0, gamma)

    _check_sums()
    for gamma in (0.0, 0.9):
        _check_penalty(original, ours, lambda data, g=gamma: args(data, g))  # type: ignore[misc]


def probe_compute_post_kl(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    data = _probe_data()
    theirs, mine = _compared(_awaited(original, data, _ProbeClient()), _awaited(ours, data, _ProbeClient()), "the probe data")
    same_metrics(theirs[0], mine[0], "metrics")
    check(mine[1] == theirs[1], f"usage {mine[1]} != {theirs[1]}")


def probe_score_sequences(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    sequences = [d.model_input for d in _probe_data()]
    theirs, mine = _compared(
        _awaited(original, _ProbeClient(), sequences), _awaited(ours, _ProbeClient(), sequences), "the probe sequences"
    )
    check(repr(mine) == repr(theirs), "scores or usage differ")


def probe_full_sequence_inputs(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    data = _probe_data()
    theirs, mine = _compared(outcome(original, data), outcome(ours, data), "the probe data")
    same = len(mine) == len(theirs) and all(
        type(a) is type(b) and a == b and a.model_fields_set == b.model_fields_set
        and [c.model_fields_set for c in a.chunks] == [c.model_fields_set for c in b.chunks]
        for a, b in zip(mine, theirs)
    )
    check(same, "sequences differ")


def probe_discounted_future_sum_vectorized(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    import torch

    x = torch.linspace(-3.0, 2.0, 257, dtype=torch.float32) ** 3
    for gamma in (0.9, 0.3, 1.0):
        theirs, mine = _compared(outcome(original, x, gamma), outcome(ours, x, gamma), f"gamma={gamma}")
        check(mine.dtype == theirs.dtype and mine.numpy().tobytes() == theirs.numpy().tobytes(), f"differs for gamma={gamma}")


def _piece(module: str, name: str, make: Callable[..., Any], probe: Callable[[Any, Any], None]) -> Piece:
    return Piece(
        module,
        name,
        "kl",
        make,
        probe,
        label=name if module == _METRICS else f"{module.removeprefix('tinker_cookbook.')}.{name}",
        since="0.6.1",  # 0.5.x scores through compute_logprobs_async
    )


PIECES = (
    _piece(_METRICS, "incorporate_kl_penalty", make_incorporate_kl_penalty, probe_incorporate_kl_penalty),
    _piece(_METRICS, "compute_post_kl", make_compute_post_kl, probe_compute_post_kl),
    _piece(_METRICS, "score_sequences", lambda original: score_sequences, probe_score_sequences),
    _piece(_METRICS, "_full_sequence_inputs", make_full_sequence_inputs, probe_full_sequence_inputs),
    _piece(
        _METRICS,
        "discounted_future_sum_vectorized",
        make_discounted_future_sum_vectorized,
        probe_discounted_future_sum_vectorized,
    ),
    _piece(
        _DISTILLATION,
        "incorporate_kl_penalty",
        make_distillation_incorporate_kl_penalty,
        probe_distillation_incorporate_kl_penalty,
    ),
)

FEATURE = features.register(__name__, Feature("kl", "cookbook KL penalty passes", PIECES))

# For calling directly (not installed): each falls back to the cookbook's
# function as its module holds it when called.
(
    incorporate_kl_penalty,
    compute_post_kl,
    _,
    full_sequence_inputs,
    discounted_future_sum_vectorized,
    distillation_incorporate_kl_penalty,
) = (p.direct() for p in PIECES)
