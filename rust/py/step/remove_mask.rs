//! `rl.train._remove_mask`: a Datum without its `mask`, built directly.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::{sequence, type_name, unsupported};
use crate::py::build::direct::{dataclass, is_tracked, untrack_dict};
use crate::py::classes::Classes;
use crate::py::read::PairReader;

/// Spans as `Datum.__post_init__` accepts them: `None`, or a list or tuple
/// of provenance spans.
fn checked_spans(spans: &Bound<'_, PyAny>, classes: &Classes<'_>) -> PyResult<bool> {
    if spans.is_none() {
        return Ok(true);
    }
    let spans = sequence(spans, "spans")?;
    for i in 0..spans.len() {
        let span = spans.get(i)?;
        if !(span.is_instance(&classes.prompt_span)? || span.is_instance(&classes.sampled_span)?) {
            return Ok(false);
        }
    }
    Ok(true)
}

pub fn datum_without_mask<'py>(datum: &Bound<'py, PyAny>, classes: &Classes<'py>) -> PyResult<Bound<'py, PyAny>> {
    let py = datum.py();
    let (datum_class, tensor_data) = (&classes.datum, &classes.tensor_data);
    if !datum.get_type().is(datum_class) {
        return Err(unsupported(format!("a {}, not a tinker.Datum", type_name(datum))));
    }
    let model_input = datum.getattr(intern!(py, "model_input"))?;
    let inputs = datum.getattr(intern!(py, "loss_fn_inputs"))?;
    let input_spans = datum.getattr(intern!(py, "model_input_spans"))?;
    let target_spans = datum.getattr(intern!(py, "loss_fn_input_spans"))?;
    let Ok(inputs) = inputs.cast_exact::<PyDict>() else {
        return Err(unsupported("loss_fn_inputs is not a dict".into()));
    };
    let kept = PyDict::new(py);
    let mut untracked = true;
    // An isinstance check of another type than TensorData's own can run
    // code that changes the dict: the reader takes the rest first. An exact
    // TensorData under a str key runs none (str keys compare in C).
    let quiet = |key: &Bound<'py, PyAny>, value: &Bound<'py, PyAny>| {
        key.is_exact_instance_of::<PyString>() && value.get_type().is(tensor_data)
    };
    PairReader::default().for_each(inputs.as_any(), quiet, |key, value| {
        // __post_init__ keeps a TensorData as it is; it converts anything else.
        if !key.is_exact_instance_of::<PyString>() || !value.is_instance(tensor_data)? {
            return Err(unsupported("a loss input is not a str key to a TensorData".into()));
        }
        if !key.eq(intern!(py, "mask"))? {
            untracked &= !is_tracked(&value);
            kept.set_item(key, value)?;
        }
        Ok(())
    })?;
    let paired = input_spans.is_none() == target_spans.is_none();
    if !(paired && checked_spans(&input_spans, classes)? && checked_spans(&target_spans, classes)?) {
        return Err(unsupported("provenance spans that Datum.__post_init__ rejects".into()));
    }
    if untracked {
        // As the assembled Datums' own (build.rs): untracked tensors only.
        untrack_dict(&kept);
    }
    dataclass(
        datum_class,
        [
            (intern!(py, "model_input"), &model_input),
            (intern!(py, "loss_fn_inputs"), kept.as_any()),
            (intern!(py, "model_input_spans"), &input_spans),
            (intern!(py, "loss_fn_input_spans"), &target_spans),
        ],
    )
}
