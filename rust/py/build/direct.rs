//! Instances of tinker's classes made without their constructors: each gets
//! exactly the fields its public constructor would give it (`rows.py`
//! checks that at import), and what can be in no cycle is taken off the
//! cyclic GC's books.

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyString, PyTuple, PyType};

type NewFunc =
    unsafe extern "C" fn(*mut ffi::PyTypeObject, *mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// An instance of `cls` made by `new` with no arguments and no `__init__`.
fn new_instance<'py>(cls: &Bound<'py, PyType>, new: NewFunc) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let args = PyTuple::empty(py);
    // SAFETY: `new` is a `tp_new` slot (of `object`, or the generic one);
    // both accept any heap type deriving from `object` with an args tuple
    // and no kwargs, and return a new reference or NULL with an exception.
    unsafe { Bound::from_owned_ptr_or_err(py, new(cls.as_type_ptr(), args.as_ptr(), std::ptr::null_mut())) }
}

/// Just allocated: for objects whose `__dict__` is then set whole
/// (pydantic models, as `model_construct` does).
fn allocated<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    new_instance(cls, ffi::PyType_GenericNew)
}

/// `object.__new__(cls)`, through `object`'s own `tp_new`: unlike a bare
/// allocation it also sets up the instance's compact attribute storage, so
/// the fields set next need no dict of their own (without it, a Datum's
/// attribute stores cost most of building it).
fn object_new<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: reading a slot of the static `object` type.
    let slot = unsafe { ffi::PyType_GetSlot(&raw mut ffi::PyBaseObject_Type, ffi::Py_tp_new) };
    if slot.is_null() {
        return Err(PyErr::fetch(cls.py()));
    }
    // SAFETY: the `tp_new` slot of `object` holds a `newfunc`.
    new_instance(cls, unsafe {
        std::mem::transmute::<*mut std::ffi::c_void, NewFunc>(slot)
    })
}

/// A dataclass instance with its fields set, in order, as its `__init__`
/// sets them: through `object.__setattr__` (frozen classes refuse their
/// own), so Python keeps them in the instance's compact attribute storage.
pub fn dataclass<'py, const N: usize>(
    cls: &Bound<'py, PyType>,
    fields: [(&Bound<'py, PyString>, &Bound<'py, PyAny>); N],
) -> PyResult<Bound<'py, PyAny>> {
    let obj = object_new(cls)?;
    for (name, value) in fields {
        generic_set(&obj, name, value)?;
    }
    Ok(obj)
}

/// `object.__setattr__(obj, name, value)`.
fn generic_set(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    // SAFETY: three live objects; the call borrows them and returns -1 with
    // an exception set on failure.
    let rc = unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if rc < 0 {
        Err(PyErr::fetch(obj.py()))
    } else {
        Ok(())
    }
}

/// A pydantic model as `model_construct` leaves it: fields, the set
/// fields, no extra, no private state.
pub fn pydantic_model<'py>(
    cls: &Bound<'py, PyType>,
    fields: &Bound<'py, PyDict>,
    set_field: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let obj = allocated(cls)?;
    generic_set(&obj, intern!(py, "__dict__"), fields.as_any())?;
    let fields_set = PySet::new(py, [set_field])?;
    untrack_set(&fields_set);
    generic_set(&obj, intern!(py, "__pydantic_fields_set__"), fields_set.as_any())?;
    generic_set(&obj, intern!(py, "__pydantic_extra__"), &py.None().into_bound(py))?;
    generic_set(&obj, intern!(py, "__pydantic_private__"), &py.None().into_bound(py))?;
    Ok(obj)
}

/// Takes a list holding only atoms (ints, strs) off the cyclic GC's books,
/// as CPython does itself for such tuples and dicts: it can be in no cycle,
/// and every collection would otherwise walk it item by item (with a large
/// heap, that cost more than building it).
pub fn untrack_list(list: &Bound<'_, PyList>) {
    // SAFETY: a list is a GC object; untracking one is always allowed.
    unsafe { ffi::PyObject_GC_UnTrack(list.as_ptr().cast()) };
}

fn untrack_set(set: &Bound<'_, PySet>) {
    // SAFETY: a set is a GC object; untracking one is always allowed.
    unsafe { ffi::PyObject_GC_UnTrack(set.as_ptr().cast()) };
}

/// Takes a dict whose keys and values are all untracked off the GC's books,
/// as CPython does itself: it tracks the dict again should a container be
/// stored in it.
pub fn untrack_dict(dict: &Bound<'_, PyDict>) {
    // SAFETY: a dict is a GC object; untracking one is always allowed.
    unsafe { ffi::PyObject_GC_UnTrack(dict.as_ptr().cast()) };
}

/// Takes an instance of a frozen tinker class (a frozen dataclass or
/// pydantic model) off the GC's books when each of its fields holds an atom
/// or an untracked object: as with CPython's own tuples of atoms, nothing it
/// holds can lead back to it, and its fields cannot be reassigned. Every
/// later collection (young, then older ones in the caller's training loop)
/// would otherwise walk it.
pub fn untrack_frozen(obj: &Bound<'_, PyAny>) {
    // SAFETY: `obj` is alive; its type's flags are read through the
    // limited API, and only an instance of a GC type is untracked.
    unsafe {
        let gc_type = ffi::PyType_GetFlags(ffi::Py_TYPE(obj.as_ptr())) & ffi::Py_TPFLAGS_HAVE_GC != 0;
        if gc_type {
            ffi::PyObject_GC_UnTrack(obj.as_ptr().cast());
        }
    }
}

/// Whether the GC tracks `obj` (never, for an atom).
pub fn is_tracked(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is alive; the call only reads its GC state.
    unsafe { ffi::PyObject_GC_IsTracked(obj.as_ptr()) == 1 }
}

/// An `EncodedTextChunk` holding `tokens` (a list of ints or an int32 array).
pub fn text_chunk<'py>(cls: &Bound<'py, PyType>, tokens: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    if let Ok(list) = tokens.cast::<PyList>() {
        untrack_list(list);
    }
    let fields = PyDict::new(py);
    fields.set_item(intern!(py, "tokens"), tokens)?;
    fields.set_item(intern!(py, "type"), intern!(py, "encoded_text"))?;
    untrack_dict(&fields);
    let chunk = pydantic_model(cls, &fields, intern!(py, "tokens"))?;
    // Frozen, holding an untracked list or a numeric array and a str.
    untrack_frozen(&chunk);
    Ok(chunk)
}

/// A `ModelInput` of `chunks`.
pub fn model_input<'py>(cls: &Bound<'py, PyType>, chunks: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let fields = PyDict::new(py);
    fields.set_item(intern!(py, "chunks"), chunks)?;
    pydantic_model(cls, &fields, intern!(py, "chunks"))
}

/// A `TensorData` of a fresh 1-D array of `n` elements of `dtype`.
pub fn tensor<'py>(
    cls: &Bound<'py, PyType>,
    dtype: &Bound<'py, PyString>,
    array: &Bound<'py, PyAny>,
    n: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let none = py.None().into_bound(py);
    let shape = PyList::new(py, [n])?;
    untrack_list(&shape);
    let tensor = dataclass(
        cls,
        [
            (intern!(py, "dtype"), dtype.as_any()),
            (intern!(py, "shape"), shape.as_any()),
            (intern!(py, "sparse_crow_indices"), &none),
            (intern!(py, "sparse_col_indices"), &none),
            (intern!(py, "_numpy"), array),
        ],
    )?;
    // A str, an untracked list of ints, None and a numeric array.
    untrack_frozen(&tensor);
    Ok(tensor)
}

/// A `Datum` of its parts (`loss_fn_inputs`: strs to untracked tensors).
pub fn datum<'py>(
    cls: &Bound<'py, PyType>,
    model_input: &Bound<'py, PyAny>,
    loss_fn_inputs: &Bound<'py, PyDict>,
    spans: (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    untrack_dict(loss_fn_inputs);
    dataclass(
        cls,
        [
            (intern!(py, "model_input"), model_input),
            (intern!(py, "loss_fn_inputs"), loss_fn_inputs.as_any()),
            (intern!(py, "model_input_spans"), spans.0),
            (intern!(py, "loss_fn_input_spans"), spans.1),
        ],
    )
}

/// A provenance span (a frozen dataclass) with its fields set as its
/// `__init__` sets them; the caller has checked what `__post_init__` would.
pub fn span<'py>(
    cls: &Bound<'py, PyType>,
    sequence_id: &Bound<'py, PyAny>,
    offset: usize,
    length: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let span = dataclass(
        cls,
        [
            (intern!(py, "sequence_id"), sequence_id),
            (intern!(py, "offset"), &offset.into_pyobject(py)?.into_any()),
            (intern!(py, "length"), &length.into_pyobject(py)?.into_any()),
        ],
    )?;
    // Two ints and the caller's sequence id: when that is an atom (a str),
    // the span can be in no cycle.
    if !is_tracked(sequence_id) {
        untrack_frozen(&span);
    }
    Ok(span)
}
