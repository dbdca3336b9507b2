//! Every exception type of the core, in one place: bad input as Python
//! exceptions (`ValidationError` and the rest), the fallback (`Unsupported`:
//! an input left to the function a native pass replaces), and the guard
//! that keeps a Rust panic from aborting the interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::PyErr;
use pyo3::PyResult;

use crate::errors::{ErrorKind, InputError};
use crate::fill::Unfilled;

create_exception!(
    _core,
    ValidationError,
    PyValueError,
    "A row the cookbook's data processing rejects as invalid (its DataValidationError cases)."
);

impl From<InputError> for PyErr {
    #[cold]
    fn from(e: InputError) -> PyErr {
        match e.kind {
            ErrorKind::Type => PyTypeError::new_err(e.to_string()),
            ErrorKind::Value => PyValueError::new_err(e.to_string()),
            ErrorKind::Validation => ValidationError::new_err(e.to_string()),
        }
    }
}

impl From<Unfilled> for PyErr {
    #[cold]
    fn from(e: Unfilled) -> PyErr {
        internal_error(&e.to_string())
    }
}

#[cold]
fn internal_error(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("internal error in tinker_rl_data (please report): {what}"))
}

/// Runs `f`, turning a Rust panic into a `RuntimeError` that any
/// `except Exception` catches (PyO3's own `PanicException` does not).
pub fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(internal_error(&what))
    })
}

// The fallback: an input a native pass of the cookbook's data processing,
// step or KL passes does not read exactly.
create_exception!(
    tinker_rl_data._core,
    Unsupported,
    PyException,
    "An input the native pass does not read exactly; the caller runs tinker-cookbook's own function instead."
);

#[cold]
pub fn unsupported(why: String) -> PyErr {
    Unsupported::new_err(why)
}

/// An exception raised while reading (a missing attribute, a property's
/// error) leaves the input to the cookbook's function, which raises its own
/// exception in its own order. What is not an `Exception`
/// (`KeyboardInterrupt`) goes up as it is.
pub fn leave_to_cookbook(py: Python<'_>, err: PyErr) -> PyErr {
    if err.is_instance_of::<Unsupported>(py) || !err.is_instance_of::<PyException>(py) {
        return err;
    }
    let left = unsupported(err.to_string());
    left.set_cause(py, Some(err));
    left
}
