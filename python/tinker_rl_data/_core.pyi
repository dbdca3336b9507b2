"""The Rust core (PyO3). Private: use the functions of ``tinker_rl_data``."""

from typing import Any, Callable, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "INT_READ",
    "Fitted",
    "BuiltDatums",
    "Rows",
    "TorchSum",
    "bind_classes",
    "compute_advantages",
    "reward_metrics",
    "varied_reward_groups",
    "assemble_arrays",
    "assemble_datums",
    "assemble_cookbook",
    "encode_forward_backward",
    "_panic_probe",
    "one_shot_reads",
    "gc_program_enabled",
    "gc_program_set_enabled",
    "_gc_after_fork_in_child",
    "Unsupported",
    "ValidationError",
    "kl_sample_train",
    "trajectory_metrics",
    "rollout_counts",
    "training_tokens",
    "datum_without_mask",
    "encode_sample_request",
    "sample_prompt_key",
    "kl_penalty",
    "post_kl_diffs",
    "full_sequence_inputs",
    "discounted_future_sum",
    "torch_sum",
]

__version__: str
# How exact ints are read on this interpreter (chosen at import).
INT_READ: str

@final
class Fitted:
    @property
    def padded(self) -> int: ...
    @property
    def truncated(self) -> int: ...
    @property
    def first(self) -> tuple[int, int, int] | None: ...

@final
class BuiltDatums:
    @property
    def result(self) -> tuple[list[Any], list[Any]]: ...
    @property
    def fitted(self) -> Fitted: ...

@final
class Rows:
    @property
    def input_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def target_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def advantages(self) -> npt.NDArray[np.float32]: ...
    @property
    def row_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def group_idx(self) -> npt.NDArray[np.int64]: ...
    @property
    def traj_idx(self) -> npt.NDArray[np.int64]: ...
    @property
    def turn_idx(self) -> npt.NDArray[np.int64]: ...
    @property
    def n_turns(self) -> npt.NDArray[np.int64]: ...
    @property
    def fitted(self) -> Fitted: ...

def compute_advantages(
    groups: Any, normalize: bool, leave_one_out: bool, scale_by_std: bool, eps: float
) -> list[list[float]]: ...
def reward_metrics(groups: Any) -> tuple[float, float, int, int] | None: ...
def varied_reward_groups(groups: Any) -> list[int]: ...
def assemble_arrays(groups: Any, advantages: Any, merge_turns: bool, vocab_size: int | None) -> Rows: ...

# tinker's classes (rust/py/classes.rs): bound by tinker_rl_data.rows.classes(),
# read from the binding by every call below that reads or builds tinker's objects.
def bind_classes(
    *,
    datum: type,
    model_input: type,
    text_chunk: type,
    tensor_data: type,
    prompt_span: type,
    sampled_span: type,
    sample_response: type,
) -> None: ...
def assemble_datums(
    groups: Any,
    advantages: Any,
    *,
    metadata_class: type,
    merge_turns: bool,
    vocab_size: int | None,
    numpy_tokens: bool,
    direct: bool,
) -> BuiltDatums: ...
def assemble_cookbook(
    groups: Any, advantages: Any, *, provenance: bool, direct: bool, exact: bool = False
) -> tuple[list[Any], list[dict[str, int]]]: ...
def encode_forward_backward(request: Any, forward_only: Any, parts: Any) -> bytes: ...
def _panic_probe() -> None: ...
def one_shot_reads() -> int:
    """How many one-shot iterators this thread's native passes have read as sequences."""

# The native calls' GC pause, counted process-wide (rust/py/gc.rs).
def gc_program_enabled() -> bool: ...
def gc_program_set_enabled(enabled: bool) -> None: ...
def _gc_after_fork_in_child() -> None: ...

# tinker-cookbook's RL step around the data (rust/py/step/, python/tinker_rl_data/cookbook/step.py).

class ValidationError(ValueError):
    """A row tinker-cookbook's data processing rejects with its
    DataValidationError; tinker_rl_data.cookbook raises it as that class."""

class Unsupported(Exception):
    """An input the native pass does not read exactly; the caller runs
    tinker-cookbook's own function instead."""

def kl_sample_train(
    data: Any, training_logprobs: Any, *, direct: bool, torch_tensor: type | None
) -> tuple[float, float, float]: ...
def trajectory_metrics(groups: Any, taglists: Any, own_total_rewards: Any) -> dict[str, Any]: ...
def rollout_counts(groups: Any) -> tuple[int, int, int]: ...
def training_tokens(data: Any) -> int: ...
def datum_without_mask(datum: Any) -> Any: ...

# tinker's sample request JSON (rust/py/sample.rs, python/tinker_rl_data/tinker/sample.py):
# None when the request is not the core's to write.

def encode_sample_request(request: Any, parts: Any) -> bytes | None: ...
def sample_prompt_key(prompt: Any, sampling_params: Any, parts: Any) -> bytes | None: ...
# tinker-cookbook's KL penalty passes (rust/py/kl.rs, python/tinker_rl_data/cookbook/kl.py).

@final
class TorchSum:
    """How torch sums a float32 tensor here: ``lanes`` floats per vector,
    and ``torch(array, contiguous)``, torch's own sum, for long tensors."""

    def __new__(cls, lanes: int, torch: Callable[[npt.NDArray[np.float32], bool], float]) -> TorchSum: ...

def kl_penalty(
    data: Any,
    scored: Any,
    *,
    teacher: bool,
    coef: Any,
    gamma: Any,
    direct: bool,
    summing: TorchSum,
) -> tuple[float, list[float], list[float]]: ...
def post_kl_diffs(data: Any, scored: Any) -> npt.NDArray[np.float32]: ...
def full_sequence_inputs(data: Any, *, direct: bool) -> list[Any]: ...
def discounted_future_sum(x: npt.NDArray[Any], gamma: float) -> npt.NDArray[Any]: ...
def torch_sum(x: npt.NDArray[np.float32], lanes: int, contiguous: bool) -> float | None: ...
