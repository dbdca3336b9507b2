//! `rl.metrics.compute_kl_sample_train`: the KL metrics of a trained batch,
//! one pass over the Datums' buffers.

use numpy::PyUntypedArray;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyType};

use super::{sequence, type_name, unsupported};
use crate::py::read::numbers::{array_view, Slice, View};
use crate::step::{KlSums, Real};

/// A loss input's numpy array: a dense `TensorData`'s own, read as a field
/// where `_build` found tinker's layout (`tensor_data` given), else its
/// `to_numpy()` (which densifies a sparse one, as `to_torch()` does).
fn loss_input_array<'py>(
    tensor: &Bound<'py, PyAny>,
    tensor_data: Option<&Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = tensor.py();
    match tensor_data {
        Some(class) if tensor.get_type().is(class) && tensor.getattr(intern!(py, "sparse_crow_indices"))?.is_none() => {
            tensor.getattr(intern!(py, "_numpy"))
        }
        _ => tensor.call_method0(intern!(py, "to_numpy")),
    }
}

/// A training logprob tensor's numpy array: a torch tensor's `.numpy()`, a
/// view of its memory (for the CPU tensors without grad that tinker's
/// `to_torch()` makes; for others it raises, and the cookbook's function
/// runs). Anything but a plain `torch.Tensor` is the cookbook's: it indexes
/// a numpy array with a torch mask, for one, as numpy reads an index array.
fn training_array<'py>(
    tensor: &Bound<'py, PyAny>,
    torch_tensor: Option<&Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyAny>> {
    match torch_tensor {
        Some(class) if tensor.get_type().is(class) => tensor.call_method0(intern!(tensor.py(), "numpy")),
        _ => Err(unsupported(format!("a {}, not a torch.Tensor", type_name(tensor)))),
    }
}

/// Datum `i`'s loss input `key`, as a numpy array.
fn loss_input<'py>(
    inputs: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
    tensor_data: Option<&Bound<'py, PyType>>,
    i: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let tensor = inputs
        .get_item(key)?
        .ok_or_else(|| unsupported(format!("datum {i}: loss_fn_inputs has no {key}")))?;
    loss_input_array(&tensor, tensor_data)
}

fn add_datum(sums: &mut KlSums, sampling: &Slice<'_>, training: &Slice<'_>, mask: &Slice<'_>) -> bool {
    fn with_mask<S: Real, T: Real>(sums: &mut KlSums, s: &[S], t: &[T], mask: &Slice<'_>) -> bool {
        match mask {
            Slice::F32(m) => sums.add_datum(s, t, m),
            Slice::F64(m) => sums.add_datum(s, t, m),
            Slice::I64(m) => sums.add_datum(s, t, m),
            Slice::I32(_) => return false,
        }
        true
    }
    match (sampling, training) {
        (Slice::F32(s), Slice::F32(t)) => with_mask(sums, s, t, mask),
        (Slice::F32(s), Slice::F64(t)) => with_mask(sums, s, t, mask),
        (Slice::F64(s), Slice::F32(t)) => with_mask(sums, s, t, mask),
        (Slice::F64(s), Slice::F64(t)) => with_mask(sums, s, t, mask),
        // Integer logprobs: the cookbook's float32 promotion (and, when all
        // are integers, its failing mean) is left to it.
        _ => false,
    }
}

fn slice_len(slice: &Slice<'_>) -> usize {
    match slice {
        Slice::I32(v) => v.len(),
        Slice::I64(v) => v.len(),
        Slice::F32(v) => v.len(),
        Slice::F64(v) => v.len(),
    }
}

pub fn kl_sample_train<'py>(
    data: &Bound<'py, PyAny>,
    training_logprobs: &Bound<'py, PyAny>,
    tensor_data: Option<&Bound<'py, PyType>>,
    torch_tensor: Option<&Bound<'py, PyType>>,
) -> PyResult<(f64, f64, f64)> {
    let py = data.py();
    let data = sequence(data, "data_D")?;
    let training = sequence(training_logprobs, "training_logprobs_D")?;
    if data.len() != training.len() {
        return Err(unsupported(format!(
            "{} Datums and {} training logprob tensors (safezip raises)",
            data.len(),
            training.len()
        )));
    }
    let mut sums = KlSums::default();
    for i in 0..data.len() {
        let inputs = data.get(i)?.getattr(intern!(py, "loss_fn_inputs"))?;
        let inputs = inputs
            .cast_exact::<PyDict>()
            .map_err(|_| unsupported(format!("datum {i}: loss_fn_inputs is not a dict")))?;
        let sampling = loss_input(inputs, intern!(py, "logprobs"), tensor_data, i)?;
        let mask = loss_input(inputs, intern!(py, "mask"), tensor_data, i)?;
        let training = training_array(&training.get(i)?, torch_tensor)?;
        let arrays = (
            sampling.cast::<PyUntypedArray>(),
            training.cast::<PyUntypedArray>(),
            mask.cast::<PyUntypedArray>(),
        );
        let (Ok(s), Ok(t), Ok(m)) = arrays else {
            return Err(unsupported(format!("datum {i}: a tensor is not a numpy array")));
        };
        // SAFETY: no Python code runs from here to the end of the Datum's
        // sums (plain Rust over the slices; errors are made after).
        let views = unsafe { (array_view(s), array_view(t), array_view(m)) };
        let (Some(s), Some(t), Some(m)) = (
            views.0.as_ref().and_then(View::slice),
            views.1.as_ref().and_then(View::slice),
            views.2.as_ref().and_then(View::slice),
        ) else {
            return Err(unsupported(format!(
                "datum {i}: a tensor is not a contiguous 1-D float array"
            )));
        };
        let (ns, nt, nm) = (slice_len(&s), slice_len(&t), slice_len(&m));
        if ns != nm || nt != nm {
            return Err(unsupported(format!(
                "datum {i}: {ns} logprobs, {nt} training logprobs, {nm} mask values"
            )));
        }
        if !add_datum(&mut sums, &s, &t, &m) {
            return Err(unsupported(format!("datum {i}: integer logprobs")));
        }
    }
    let m = sums
        .metrics()
        .ok_or_else(|| unsupported("no position has mask > 0 (the cookbook's assert)".into()))?;
    Ok((m.v1, m.v2, m.entropy))
}
