//! Bad input as Python exceptions, and the guard that keeps a Rust panic
//! from aborting the interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;
use pyo3::PyResult;

use crate::error::{ErrorKind, InputError};
use crate::rows::Unfilled;

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
