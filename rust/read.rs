//! Reading the user's Python objects: attributes, sequences (list, tuple,
//! 1-D numpy array, any iterable) and their scalars, with located errors.
//! The per-item loops use the C API directly: this is where the time goes.

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
            let message = format!(
                "{} object has no attribute '{}'",
                type_name(obj),
                name.to_string_lossy()
            );
            input_error(InputError::new(ErrorKind::Type, at, message))
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
/// Its length is taken once: should user code run while we read (an
/// `__index__`, a `__float__`) and grow a list, the rows laid out for the
/// old length stay right; a shrunk list gives an IndexError.
pub struct Items<'py> {
    seq: Seq<'py>,
    len: usize,
}

enum Seq<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
}

impl<'py> Items<'py> {
    /// Reads `obj` (the field `what` at `at`) as a sequence of `kind` items.
    pub fn of(obj: &Bound<'py, PyAny>, what: &str, kind: ItemKind, at: Location) -> PyResult<Self> {
        if let Ok(list) = obj.cast::<PyList>() {
            return Ok(Items::list(list.clone()));
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return Ok(Items {
                len: tuple.len(),
                seq: Seq::Tuple(tuple.clone()),
            });
        }
        let py = obj.py();
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            check_array(array, what, kind, at)?;
            // tolist() gives exact Python ints and floats: the list path.
            return Ok(Items::list(
                obj.call_method0(intern!(py, "tolist"))?.cast_into::<PyList>()?,
            ));
        }
        if obj.is_instance_of::<PyString>() {
            return Err(not_a_sequence(obj, what, at));
        }
        match obj.try_iter() {
            Ok(iter) => Ok(Items::list(PyList::new(py, iter.collect::<PyResult<Vec<_>>>()?)?)),
            Err(e) if e.is_instance_of::<PyTypeError>(py) => Err(not_a_sequence(obj, what, at)),
            Err(e) => Err(e),
        }
    }

    fn list(list: Bound<'py, PyList>) -> Self {
        Items {
            len: list.len(),
            seq: Seq::List(list),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Borrowed item `i`; an error if a list shrank under us.
    #[inline(always)]
    pub fn get(&self, i: usize) -> PyResult<*mut ffi::PyObject> {
        let item = unsafe {
            match &self.seq {
                Seq::List(l) => ffi::PyList_GetItem(l.as_ptr(), i as ffi::Py_ssize_t),
                Seq::Tuple(t) => ffi::PyTuple_GetItem(t.as_ptr(), i as ffi::Py_ssize_t),
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

    fn as_ptr(&self) -> *mut ffi::PyObject {
        match &self.seq {
            Seq::List(l) => l.as_ptr(),
            Seq::Tuple(t) => t.as_ptr(),
        }
    }

    pub fn py(&self) -> Python<'py> {
        match &self.seq {
            Seq::List(l) => l.py(),
            Seq::Tuple(t) => t.py(),
        }
    }
}

fn check_array(array: &Bound<'_, PyUntypedArray>, what: &str, kind: ItemKind, at: Location) -> PyResult<()> {
    if array.ndim() != 1 {
        let message = format!("{what} must be 1-D, got an array of shape {:?}", array.shape());
        return Err(input_error(InputError::new(ErrorKind::Value, at, message)));
    }
    let (accepted, expected): (&[u8], &str) = match kind {
        ItemKind::Token => (b"iubO", "an integer"),
        ItemKind::Real => (b"iubfO", "a real"),
        ItemKind::Object => (b"O", "an object"),
    };
    if !accepted.contains(&array.dtype().kind()) {
        let dtype = array.dtype().str()?.to_string();
        let message = format!("{what} has dtype {dtype}, not {expected} dtype");
        return Err(input_error(InputError::new(ErrorKind::Type, at, message)));
    }
    Ok(())
}

#[cold]
fn not_a_sequence(obj: &Bound<'_, PyAny>, what: &str, at: Location) -> PyErr {
    let message = format!("{what} must be a sequence, got {}", type_name(obj));
    input_error(InputError::new(ErrorKind::Type, at, message))
}

/// Names an item of a field in messages: `prompt_tokens[5]`.
#[derive(Clone, Copy)]
pub struct Item<'a> {
    pub field: &'a str,
    pub index: usize,
}

/// Reads every token of `items`, checking each is an int in
/// `0..=MAX_TOKEN`, and hands `(i, value, item)` to `sink` (`item` borrowed).
/// Returns whether every item was an exact `int`.
#[inline(always)]
pub fn read_tokens(
    items: &Items<'_>,
    field: &str,
    at: Location,
    mut sink: impl FnMut(usize, i64, *mut ffi::PyObject) -> PyResult<()>,
) -> PyResult<bool> {
    let mut all_exact = true;
    for i in 0..items.len() {
        let item = items.get(i)?;
        let value = if unsafe { ffi::PyLong_CheckExact(item) } != 0 {
            let mut overflow = 0;
            let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(item, &mut overflow) };
            if overflow != 0 {
                None
            } else {
                Some(v)
            }
        } else {
            all_exact = false;
            index_value(items.py(), item)?
        };
        match value {
            Some(v) if (0..=MAX_TOKEN).contains(&v) => sink(i, v, item)?,
            _ => return Err(bad_token(&items.get_bound(i)?, Item { field, index: i }, at)),
        }
    }
    Ok(all_exact)
}

/// `list(prompt) + completion[:-1]`, made by CPython's own list copying
/// (one C loop each): the same int objects, shared. For turns whose tokens
/// were all exact ints; `None` if the sequences changed length meanwhile.
pub fn shared_model_input<'py>(prompt: &Items<'py>, completion: &Items<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = prompt.py();
    let (p_len, c_len) = (prompt.len as ffi::Py_ssize_t, completion.len as ffi::Py_ssize_t);
    unsafe {
        let out = Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(prompt.as_ptr()))?;
        if c_len > 1 {
            // All of the completion, then its last token off again: no
            // temporary sequence for `completion[:-1]`.
            let end = p_len + c_len;
            if ffi::PyList_SetSlice(out.as_ptr(), p_len, p_len, completion.as_ptr()) < 0
                || ffi::PyList_SetSlice(out.as_ptr(), end - 1, end, std::ptr::null_mut()) < 0
            {
                return Err(PyErr::fetch(py));
            }
        }
        let out = out.cast_into::<PyList>()?;
        // Nothing runs user code between reading the items and here; the
        // check keeps the rows and the model input in step regardless.
        Ok((out.len() == (prompt.len + completion.len).saturating_sub(1)).then_some(out))
    }
}

/// `operator.index(item)` as i64; `None` when it is no integer or does not
/// fit in one (the caller then raises).
#[cold]
fn index_value(py: Python<'_>, item: *mut ffi::PyObject) -> PyResult<Option<i64>> {
    if unsafe { ffi::PyIndex_Check(item) } == 0 {
        return Ok(None);
    }
    let index = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(item)) }?;
    Ok(index.extract::<i64>().ok())
}

#[cold]
fn bad_token(item: &Bound<'_, PyAny>, at_item: Item<'_>, at: Location) -> PyErr {
    let Item { field, index } = at_item;
    let (kind, message) = if unsafe { ffi::PyIndex_Check(item.as_ptr()) } != 0 {
        (
            ErrorKind::Value,
            format!("token {} is outside 0..{MAX_TOKEN} ({field}[{index}])", describe(item)),
        )
    } else {
        let message = format!(
            "token {} of type {} is not an integer ({field}[{index}])",
            describe(item),
            type_name(item)
        );
        (ErrorKind::Type, message)
    };
    input_error(InputError::new(kind, at, message))
}

/// Reads every logprob of `items` (each a real number, finite as float32)
/// and hands `(k, value)` to `sink`.
#[inline(always)]
pub fn read_logprobs(items: &Items<'_>, at: Location, mut sink: impl FnMut(usize, f32)) -> PyResult<()> {
    for k in 0..items.len() {
        let item = items.get(k)?;
        // Nearly always a finite exact float, read inline; anything else
        // takes the general path, which also raises the errors.
        let fast = match unsafe { ffi::PyFloat_CheckExact(item) } != 0 {
            true => Some(unsafe { ffi::PyFloat_AsDouble(item) } as f32).filter(|v| v.is_finite()),
            false => None,
        };
        let v = match fast {
            Some(v) => v,
            None => real_value(
                items.py(),
                item,
                "logprob",
                true,
                Some(Item {
                    field: "logprobs",
                    index: k,
                }),
                at,
            )? as f32,
        };
        sink(k, v);
    }
    Ok(())
}

/// A finite real number (also finite once rounded to float32, the wire
/// dtype of advantages, when `float32` is set).
pub fn read_real(item: &Bound<'_, PyAny>, what: &str, float32: bool, at: Location) -> PyResult<f64> {
    real_value(item.py(), item.as_ptr(), what, float32, None, at)
}

fn real_value(
    py: Python<'_>,
    item: *mut ffi::PyObject,
    what: &str,
    float32: bool,
    at_item: Option<Item<'_>>,
    at: Location,
) -> PyResult<f64> {
    let v = unsafe { ffi::PyFloat_AsDouble(item) };
    if v == -1.0 && unsafe { !ffi::PyErr_Occurred().is_null() } {
        return Err(not_real(py, item, what, at_item, at));
    }
    let fits = if float32 { (v as f32).is_finite() } else { v.is_finite() };
    if !fits {
        return Err(not_finite(v, what, float32, at_item, at));
    }
    Ok(v)
}

fn suffix(at_item: Option<Item<'_>>) -> String {
    at_item
        .map(|Item { field, index }| format!(" ({field}[{index}])"))
        .unwrap_or_default()
}

#[cold]
fn not_real(py: Python<'_>, item: *mut ffi::PyObject, what: &str, at_item: Option<Item<'_>>, at: Location) -> PyErr {
    // A TypeError means "not a real number"; anything else the object
    // raised (its own __float__ failing) goes up as it is.
    let err = PyErr::fetch(py);
    if !err.is_instance_of::<PyTypeError>(py) {
        return err;
    }
    let obj = unsafe { Bound::from_borrowed_ptr(py, item) };
    let message = format!(
        "{what} {} of type {} is not a real number{}",
        describe(&obj),
        type_name(&obj),
        suffix(at_item)
    );
    input_error(InputError::new(ErrorKind::Type, at, message))
}

#[cold]
fn not_finite(v: f64, what: &str, float32: bool, at_item: Option<Item<'_>>, at: Location) -> PyErr {
    let message = if v.is_finite() && float32 {
        format!("{what} {v:e} overflows float32{}", suffix(at_item))
    } else {
        format!("{what} {} is not finite{}", py_float_repr(v), suffix(at_item))
    };
    input_error(InputError::new(ErrorKind::Value, at, message))
}

fn py_float_repr(v: f64) -> String {
    match v {
        v if v.is_nan() => "nan".into(),
        f64::INFINITY => "inf".into(),
        f64::NEG_INFINITY => "-inf".into(),
        v => v.to_string(),
    }
}

/// Builds a model input list slot by slot, for turns with bools or numpy
/// integers among their tokens: exact ints are shared (they are immutable),
/// the others become new exact ints.
pub struct IntList<'py> {
    list: Bound<'py, PyList>,
}

impl<'py> IntList<'py> {
    pub fn new(py: Python<'py>, len: usize) -> PyResult<Self> {
        // A new list's slots are NULL until set; dropping it early is safe.
        let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len as ffi::Py_ssize_t))? };
        Ok(IntList {
            list: list.cast_into::<PyList>()?,
        })
    }

    #[inline(always)]
    pub fn set(&mut self, i: usize, value: i64, item: *mut ffi::PyObject) -> PyResult<()> {
        let obj = if unsafe { ffi::PyLong_CheckExact(item) } != 0 {
            unsafe { ffi::Py_IncRef(item) };
            item
        } else {
            let obj = unsafe { ffi::PyLong_FromLongLong(value) };
            if obj.is_null() {
                return Err(PyErr::fetch(self.list.py()));
            }
            obj
        };
        // Steals the reference; `i` is in range, so this cannot fail.
        unsafe { ffi::PyList_SetItem(self.list.as_ptr(), i as ffi::Py_ssize_t, obj) };
        Ok(())
    }

    pub fn into_list(self) -> Bound<'py, PyList> {
        self.list
    }
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `repr(obj)`, shortened: error messages name the bad value, not a page of it.
pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    let text = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}
