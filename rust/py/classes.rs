//! The Python classes the core reads and builds, held here instead of
//! passed on every call: tinker's, bound by the Python layer that resolves
//! them (`tinker_rl_data.rows.classes()` calls `bind_classes`), and numpy's
//! scalar types.
//!
//! tinker's are bound, not looked up here, so that the core and the Python
//! layer always agree on them: when `rows.classes()` resolves them again
//! (its cache cleared, tinker reloaded) it binds them again, and every call
//! from then on reads the new ones. A native call made before any binding
//! asks `rows.classes()` once, at its start, before it reads anything.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

/// tinker's classes, as bound.
struct BoundClasses {
    datum: Py<PyType>,
    model_input: Py<PyType>,
    text_chunk: Py<PyType>,
    tensor_data: Py<PyType>,
    prompt_span: Py<PyType>,
    sampled_span: Py<PyType>,
    sample_response: Py<PyType>,
}

static BOUND: Mutex<Option<Arc<BoundClasses>>> = Mutex::new(None);

fn bound() -> Option<Arc<BoundClasses>> {
    BOUND.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// tinker's classes for one call.
pub struct Classes<'py> {
    pub datum: Bound<'py, PyType>,
    pub model_input: Bound<'py, PyType>,
    pub text_chunk: Bound<'py, PyType>,
    pub tensor_data: Bound<'py, PyType>,
    /// `PromptProvenanceSpan` (a placeholder class where tinker has none).
    pub prompt_span: Bound<'py, PyType>,
    /// `SampledProvenanceSpan` (likewise).
    pub sampled_span: Bound<'py, PyType>,
    pub sample_response: Bound<'py, PyType>,
}

impl<'py> Classes<'py> {
    /// The bound classes; the first time, once `rows.classes()` has bound
    /// them. Call before reading any input: it may run Python code.
    pub fn get(py: Python<'py>) -> PyResult<Self> {
        let classes = if let Some(classes) = bound() {
            classes
        } else {
            py.import(intern!(py, "tinker_rl_data.rows"))?
                .call_method0(intern!(py, "classes"))?;
            bound().ok_or_else(|| PyRuntimeError::new_err("tinker_rl_data.rows.classes() bound no classes"))?
        };
        let get = |class: &Py<PyType>| class.bind(py).clone();
        Ok(Classes {
            datum: get(&classes.datum),
            model_input: get(&classes.model_input),
            text_chunk: get(&classes.text_chunk),
            tensor_data: get(&classes.tensor_data),
            prompt_span: get(&classes.prompt_span),
            sampled_span: get(&classes.sampled_span),
            sample_response: get(&classes.sample_response),
        })
    }
}

/// Binds tinker's classes for every native call from now on (the ones
/// bound before are let go).
#[pyfunction(name = "bind_classes")]
#[pyo3(signature = (*, datum, model_input, text_chunk, tensor_data, prompt_span, sampled_span, sample_response))]
pub fn py_bind_classes(
    datum: Py<PyType>,
    model_input: Py<PyType>,
    text_chunk: Py<PyType>,
    tensor_data: Py<PyType>,
    prompt_span: Py<PyType>,
    sampled_span: Py<PyType>,
    sample_response: Py<PyType>,
) {
    let new = Arc::new(BoundClasses {
        datum,
        model_input,
        text_chunk,
        tensor_data,
        prompt_span,
        sampled_span,
        sample_response,
    });
    let old = BOUND.lock().unwrap_or_else(PoisonError::into_inner).replace(new);
    // Released after the lock: letting a class go may run Python code.
    drop(old);
}

/// What `dict_mean`'s `np.mean` takes as a number besides Python's int and
/// float: `(numpy.floating, numpy.integer, numpy.bool_)`, looked up once.
pub fn numpy_numbers(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static NUMBERS: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    NUMBERS
        .get_or_try_init(py, || {
            let numpy = py.import("numpy")?;
            let types = [
                numpy.getattr("floating")?,
                numpy.getattr("integer")?,
                numpy.getattr("bool_")?,
            ];
            Ok::<_, PyErr>(PyTuple::new(py, types)?.unbind())
        })
        .map(|numbers| numbers.bind(py))
}
