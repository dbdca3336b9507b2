"""The native module's boundary: its functions' parameters, and tinker's
classes bound into it once rather than passed on every call."""

from __future__ import annotations

import inspect
import subprocess
import sys

from tinker_rl_data import _core


def _signatures():
    for name, value in vars(_core).items():
        if isinstance(value, type):
            value = value.__new__ if "__new__" in vars(value) else None
        text = getattr(value, "__text_signature__", None)
        if callable(value) and text:
            # PyO3 writes `$module` / `$cls` first: not a parameter the caller passes.
            yield name, inspect.signature(value)


def test_no_native_function_takes_more_than_five_positional_parameters():
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signatures = dict(_signatures())
    assert {"kl_penalty", "assemble_datums", "compute_advantages"} <= set(signatures)
    over = {
        name: str(signature)
        for name, signature in signatures.items()
        if sum(p.kind in positional for p in signature.parameters.values()) > 5
    }
    assert over == {}


CHILD = """
import numpy as np
import tinker
from tinker_rl_data import _core, rows

def datum(cls):
    tokens = tinker.TensorData.from_numpy(np.array([2, 3], dtype=np.int64))
    return cls(model_input=tinker.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": tokens})

# First use: the core asks rows.classes() for them, once.
assert type(_core.datum_without_mask(datum(tinker.Datum))) is tinker.Datum
assert rows.classes.cache_info().misses == 1, rows.classes.cache_info()

# Resolved again, to another class: the core reads the new one.
class Datum(tinker.Datum):
    pass

tinker.Datum = Datum
rows.classes.cache_clear()
assert rows.classes().datum is Datum
assert type(_core.datum_without_mask(datum(Datum))) is Datum
try:
    _core.datum_without_mask(datum(Datum.__mro__[1]))
except _core.Unsupported as e:
    print("left:", e)
"""


def test_the_core_reads_the_classes_rows_resolved_last():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("left: a Datum, not a tinker.Datum"), done.stdout
