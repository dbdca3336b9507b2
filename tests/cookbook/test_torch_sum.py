"""rust/torch_sum.rs against torch itself: our float32 sum of a 1-D float32
array must be bit for bit torch's CPU ``Tensor.sum()`` of it, contiguous
or strided, at the vector width tinker_rl_data.cookbook.kl finds for this
machine's CPU capability (and, in a subprocess, for torch's DEFAULT one:
``ATEN_CPU_CAPABILITY``).

Needs torch (installed with tinker-cookbook); skipped where it is absent,
except when TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import cookbook_unavailable

try:
    import torch
except ImportError as exc:
    cookbook_unavailable(exc)

from hypothesis import given
from hypothesis import strategies as st

from tinker_rl_data import _core
from tinker_rl_data.cookbook import kl as _kl

GRAIN_SIZE = 32768

# Where the cascade changes shape: 4 accumulators (ilp), 8 or 16 lanes,
# 16 rows per level, torch's parallel split.
BOUNDARIES = [4, 7, 8, 15, 16, 31, 32, 63, 64, 255, 256, 511, 512, 1023, 1024, 4095, 4096, 8191, 8192,
              16383, 16384, GRAIN_SIZE - 1, GRAIN_SIZE]

lengths = st.one_of(
    st.integers(0, 70),
    st.builds(lambda b, d: max(0, b + d), st.sampled_from(BOUNDARIES), st.integers(-2, 2)),
    st.integers(0, 40_000),
)


@st.composite
def arrays(draw):
    """float32 values of mixed magnitudes: logprob differences, masks,
    magnitudes 10**-30 to 10**30 (subnormals, cancellation, overflow)."""
    n = draw(lengths)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["mixed", "mixed", "logprobs", "mask", "huge", "exact"]))
    if kind == "mixed":
        spread = draw(st.integers(0, 30))
        values = rng.standard_normal(n) * 10.0 ** rng.integers(-spread, spread + 1, n)
    elif kind == "logprobs":
        values = -rng.exponential(2.0, n) * (rng.random(n) < 0.7)
    elif kind == "mask":
        values = rng.choice([0.0, 1.0, 1.0, 0.5], n)
    elif kind == "huge":
        values = rng.choice([3e38, -3e38, 1e-45, -1e-40, 1.0], n)
    else:
        values = rng.integers(-1000, 1000, n).astype(np.float64)
    with np.errstate(over="ignore"):
        return values.astype(np.float32)


def lanes() -> int:
    found = _kl._summing()
    assert isinstance(found, int), found
    return found


def bits(value) -> bytes:
    return np.float32(value).tobytes()


def nan_or_bits(value) -> bytes:
    return b"nan" if np.isnan(value) else bits(value)


@given(arrays())
def test_contiguous_sums_are_torchs(values):
    ours = _core.torch_sum(values, lanes(), True)
    if len(values) >= GRAIN_SIZE:
        assert ours is None  # torch's split depends on its threads: torch sums
        return
    assert nan_or_bits(ours) == nan_or_bits(torch.from_numpy(values).sum().item())


@given(arrays(), st.integers(2, 3))
def test_strided_sums_are_torchs(values, step):
    strided = np.repeat(values, step)[::step]
    assert len(values) <= 1 or strided.strides == (4 * step,)
    ours = _core.torch_sum(values, lanes(), False)
    if len(values) >= GRAIN_SIZE:
        assert ours is None
        return
    theirs = torch.from_numpy(strided).sum().item()
    assert nan_or_bits(ours) == nan_or_bits(theirs)
    assert nan_or_bits(_kl._torch_sum(values, False)) == nan_or_bits(theirs)


def test_other_widths_are_not_torchs_here():
    # The samples tell the widths apart, so the check can fail.
    samples = _kl._sum_samples()
    theirs = [torch.from_numpy(a).sum().item() for a in samples]
    for other in {4, 8, 16} - {lanes()}:
        assert not _kl._same_floats([_core.torch_sum(a, other, True) for a in samples], theirs)
    assert _core.torch_sum(samples[5], 5, True) is None


CHILD = """
import json, sys
import numpy as np, torch
from tinker_rl_data import _core
from tinker_rl_data.cookbook import kl as _kl
lanes = _kl._summing()
rng = np.random.default_rng(11)
bad = []
for n in list(range(0, 80)) + [255, 256, 511, 512, 513, 1024, 4097, 8192, 8193, 16385, 32767]:
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-12, 12, n)).astype(np.float32)
    for contiguous in (True, False):
        t = torch.from_numpy(a if contiguous else np.repeat(a, 2)[::2])
        if isinstance(lanes, int) and np.float32(_core.torch_sum(a, lanes, contiguous)).tobytes() != t.sum().numpy().tobytes():
            bad.append(n)
print(json.dumps([torch.backends.cpu.get_cpu_capability(), lanes, bad]))
"""


def test_the_default_capability_is_found_and_reproduced():
    # torch registers no AVX512 sum kernel: an AVX512 or AVX2 machine runs
    # AVX2's, tested above; DEFAULT's generic vectors in a child process
    # (ATEN_CPU_CAPABILITY only lowers the capability torch picks).
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU runs torch at {torch.backends.cpu.get_cpu_capability()}")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["DEFAULT", 8, []]
