//! Reading the user's Python objects: attributes, sequences (list, tuple,
//! 1-D numpy array, any iterable) and their scalars, with located errors.
//! The per-item loops use the C API directly: this is where the time goes.

use std::os::raw::c_long;

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};
use pyo3::{ffi, intern};

use crate::error::{ErrorKind, InputError, Location};
use crate::py::input_error;

pub const MAX_TOKEN: i64 = i32::MAX as i64;

/// `obj.name`; a missing attribute is a located `TypeError` naming it.
pub fn attr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>, at: Location) -> PyResult<Bound<'py, PyAny>> {
    obj.getattr(name).map_err(|e| {
        if e.is_instance_of::<PyAttributeError>(obj.py()) {
            input_error(InputError::new(
                ErrorKind::Type,
                at,
                format!("{} object has no attribute '{}'", type_name(obj), name.to_string_lossy()),
            ))
        } else {
            e
        }
    })
}

/// What the items of a sequence must be, to vet a numpy array's dtype
/// before reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Token,
    Real,
    Object,
}

/// A sequence's items, borrowed from a list or tuple that this holds alive.
pub enum Items<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Items<'py> {
    /// Reads `obj` (the field `what` at `at`) as a sequence of `kind` items.
    pub fn of(obj: &Bound<'py, PyAny>, what: &str, kind: ItemKind, at: Location) -> PyResult<Self> {
        if let Ok(list) = obj.cast::<PyList>() {
            return Ok(Items::List(list.clone()));
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return Ok(Items::Tuple(tuple.clone()));
        }
        let py = obj.py();
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            if array.ndim() != 1 {
                return Err(input_error(InputError::new(
                    ErrorKind::Value,
                    at,
                    format!("{what} must be 1-D, got an array of shape {:?}", array.shape()),
                )));
            }
            let dtype_kind = array.dtype().kind();
            let accepted: &[u8] = match kind {
                ItemKind::Token => b"iubO",
                ItemKind::Real => b"iubfO",
                ItemKind::Object => b"O",
            };
            if !accepted.contains(&dtype_kind) {
                let dtype = array.dtype().str()?.to_string();
                let expected = if kind == ItemKind::Token { "an integer" } else { "a real" };
                return Err(input_error(InputError::new(
                    ErrorKind::Type,
                    at,
                    format!("{what} has dtype {dtype}, not {expected} dtype"),
                )));
            }
            // tolist() gives exact Python ints and floats: the list path.
            return Ok(Items::List(obj.call_method0(intern!(py, "tolist"))?.cast_into::<PyList>()?));
        }
        if obj.is_instance_of::<PyString>() {
            return Err(not_a_sequence(obj, what, at));
        }
        match obj.try_iter() {
            Ok(iter) => {
                let items = iter.collect::<PyResult<Vec<_>>>()?;
                Ok(Items::List(PyList::new(py, items)?))
            }
            Err(e) if e.is_instance_of::<PyTypeError>(py) => Err(not_a_sequence(obj, what, at)),
            Err(e) => Err(e),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Items::List(l) => l.len(),
            Items::Tuple(t) => t.len(),
        }
    }

    /// Borrowed item `i`; an error if a list shrank under us.
    #[inline(always)]
    pub fn get(&self, i: usize) -> PyResult<*mut ffi::PyObject> {
        let item = unsafe {
            match self {
                Items::List(l) => ffi::PyList_GetItem(l.as_ptr(), i as ffi::Py_ssize_t),
                Items::Tuple(t) => ffi::PyTuple_GetItem(t.as_ptr(), i as ffi::Py_ssize_t),
            }
        };
        if item.is_null() {
            Err(PyErr::fetch(self.py()))
        } else {
            Ok(item)
        }
    }

    pub fn get_bound(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        let item = self.get(i)?;
        Ok(unsafe { Bound::from_borrowed_ptr(self.py(), item) })
    }

    fn py(&self) -> Python<'py> {
        match self {
            Items::List(l) => l.py(),
            Items::Tuple(t) => t.py(),
        }
    }
}

#[cold]
fn not_a_sequence(obj: &Bound<'_, PyAny>, what: &str, at: Location) -> PyErr {
    input_error(InputError::new(
        ErrorKind::Type,
        at,
        format!("{what} must be a sequence, got {}", type_name(obj)),
    ))
}

/// Appends every token of `items` to `out`, checking each is an int in
/// `0..=MAX_TOKEN`. Returns whether all were exact ints, whose objects the
/// model input can then share.
pub fn read_tokens(items: &Items<'_>, what: &str, at: Location, out: &mut Vec<i32>) -> PyResult<bool> {
    let n = items.len();
    out.reserve(n);
    let mut all_exact = true;
    for i in 0..n {
        let item = items.get(i)?;
        let exact = unsafe { ffi::PyLong_CheckExact(item) } != 0;
        let value = if exact {
            let mut overflow = 0;
            let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(item, &mut overflow) };
            if overflow != 0 { None } else { Some(v) }
        } else {
            all_exact = false;
            index_value(items.py(), item)?
        };
        match value {
            Some(v) if (0..=MAX_TOKEN).contains(&v) => out.push(v as i32),
            _ => return Err(bad_token(&items.get_bound(i)?, what, i, at)),
        }
    }
    Ok(all_exact)
}

/// `operator.index(item)` as i64; `None` when it does not fit. Non-integers
/// (floats, str, None, ...) are a `TypeError` raised by the caller.
#[cold]
fn index_value(py: Python<'_>, item: *mut ffi::PyObject) -> PyResult<Option<i64>> {
    let obj = unsafe { Bound::from_borrowed_ptr(py, item) };
    if unsafe { ffi::PyIndex_Check(item) } == 0 {
        return Ok(None);
    }
    let index = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(obj.as_ptr())) }?;
    Ok(index.extract::<i64>().ok())
}

#[cold]
fn bad_token(item: &Bound<'_, PyAny>, what: &str, i: usize, at: Location) -> PyErr {
    let is_int = unsafe { ffi::PyIndex_Check(item.as_ptr()) } != 0;
    let (kind, message) = if is_int {
        (ErrorKind::Value, format!("token {} is outside 0..{MAX_TOKEN} ({what}[{i}])", describe(item)))
    } else {
        (ErrorKind::Type, format!("token {} of type {} is not an integer ({what}[{i}])", describe(item), type_name(item)))
    };
    input_error(InputError::new(kind, at, message))
}

/// A finite real number, also finite once rounded to float32 (the wire
/// dtype of logprobs and advantages) when `float32` is set.
pub fn read_real(item: &Bound<'_, PyAny>, what: &str, float32: bool, at: Location) -> PyResult<f64> {
    read_real_ptr(item.py(), item.as_ptr(), what, float32, at)
}

#[inline(always)]
fn read_real_ptr(py: Python<'_>, item: *mut ffi::PyObject, what: &str, float32: bool, at: Location) -> PyResult<f64> {
    let v = unsafe { ffi::PyFloat_AsDouble(item) };
    if v == -1.0 && unsafe { !ffi::PyErr_Occurred().is_null() } {
        return Err(bad_real(py, item, what, at));
    }
    let fits = if float32 { (v as f32).is_finite() } else { v.is_finite() };
    if !fits {
        return Err(not_finite(v, what, float32, at));
    }
    Ok(v)
}

#[cold]
fn bad_real(py: Python<'_>, item: *mut ffi::PyObject, what: &str, at: Location) -> PyErr {
    let err = PyErr::fetch(py);
    if !err.is_instance_of::<PyTypeError>(py) {
        return err;
    }
    let obj = unsafe { Bound::from_borrowed_ptr(py, item) };
    input_error(InputError::new(
        ErrorKind::Type,
        at,
        format!("{what} {} of type {} is not a real number", describe(&obj), type_name(&obj)),
    ))
}

#[cold]
fn not_finite(v: f64, what: &str, float32: bool, at: Location) -> PyErr {
    let message = if v.is_finite() && float32 {
        format!("{what} {v:e} overflows float32")
    } else {
        format!("{what} {} is not finite", py_float_repr(v))
    };
    input_error(InputError::new(ErrorKind::Value, at, message))
}

fn py_float_repr(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        v.to_string()
    }
}

/// Appends the logprobs of `items` fitted to `len` (truncated, or padded
/// with 0.0); every given logprob is checked, kept or not. Returns whether
/// the length differed.
pub fn read_fitted_logprobs(items: &Items<'_>, len: usize, at: Location, out: &mut Vec<f32>) -> PyResult<bool> {
    let n = items.len();
    out.reserve(len);
    for i in 0..n {
        let item = items.get(i)?;
        let v = if unsafe { ffi::PyFloat_CheckExact(item) } != 0 {
            let v = unsafe { ffi::PyFloat_AsDouble(item) };
            if !(v as f32).is_finite() {
                return Err(not_finite(v, &format!("logprob (logprobs[{i}])"), true, at));
            }
            v
        } else {
            read_real_ptr(items.py(), item, &format!("logprob (logprobs[{i}])"), true, at)?
        };
        if i < len {
            out.push(v as f32);
        }
    }
    out.extend(std::iter::repeat_n(0.0, len.saturating_sub(n)));
    Ok(n != len)
}

/// A new list `prompt + completion[:-1]` of exact ints: the objects
/// themselves where they already are exact ints (ints are immutable), new
/// ints from the validated `values` otherwise.
pub fn model_input_list<'py>(
    py: Python<'py>,
    prompt: &Items<'py>,
    completion: &Items<'py>,
    values: &[i32],
    all_exact: bool,
) -> PyResult<Bound<'py, PyList>> {
    let n = values.len() - 1;
    let p = prompt.len();
    let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n as ffi::Py_ssize_t))? };
    for i in 0..n {
        let obj = if all_exact {
            let item = if i < p { prompt.get(i)? } else { completion.get(i - p)? };
            unsafe { ffi::Py_IncRef(item) };
            item
        } else {
            let item = unsafe { ffi::PyLong_FromLong(values[i] as c_long) };
            if item.is_null() {
                return Err(PyErr::fetch(py));
            }
            item
        };
        // Steals the reference; the new list's slots are empty, so no error.
        unsafe { ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, obj) };
    }
    Ok(list.cast_into::<PyList>()?)
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// `repr(obj)`, shortened: error messages name the bad value, not a page of it.
pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    let text = obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into());
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}
