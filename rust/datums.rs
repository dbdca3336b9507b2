//! Building tinker's objects from the rows without their constructors'
//! per-token validation (the rows are already checked): each instance gets
//! the fields its public constructor would give it. `datums.py` checks at
//! import that the result is field for field the public one, and uses the
//! public constructors instead wherever it is not.

use numpy::ndarray::ArrayView1;
use numpy::{Element, PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyString, PyType};
use pyo3::{ffi, intern};

use crate::error::Location;

pub struct DatumClasses<'py> {
    pub datum: Bound<'py, PyType>,
    pub model_input: Bound<'py, PyType>,
    pub chunk: Bound<'py, PyType>,
    pub tensor_data: Bound<'py, PyType>,
    pub metadata: Bound<'py, PyType>,
}

type NewFunc =
    unsafe extern "C" fn(*mut ffi::PyTypeObject, *mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// An instance of `cls` made by `new` with no arguments and no `__init__`.
fn new_instance<'py>(cls: &Bound<'py, PyType>, new: NewFunc) -> PyResult<Bound<'py, PyAny>> {
    unsafe {
        let args = ffi::PyTuple_New(0);
        let obj = new(cls.as_type_ptr(), args, std::ptr::null_mut());
        ffi::Py_DecRef(args);
        Bound::from_owned_ptr_or_err(cls.py(), obj)
    }
}

/// Just allocated: for objects whose `__dict__` is then set whole
/// (pydantic models, as `model_construct` does).
fn allocated<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    new_instance(cls, ffi::PyType_GenericNew)
}

/// `object.__new__(cls)`, through `object`'s own `tp_new`: unlike a bare
/// allocation it also sets up the instance's compact attribute storage, so
/// the fields set next need no dict of their own (by callgrind, a Datum's
/// attribute stores took a third of its instructions without it).
fn object_new<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    let slot = unsafe { ffi::PyType_GetSlot(&raw mut ffi::PyBaseObject_Type, ffi::Py_tp_new) };
    if slot.is_null() {
        return Err(PyErr::fetch(cls.py()));
    }
    // Safety: the `tp_new` slot of `object` holds a `newfunc`.
    new_instance(cls, unsafe {
        std::mem::transmute::<*mut std::ffi::c_void, NewFunc>(slot)
    })
}

/// A dataclass instance with its fields set, in order, as its `__init__`
/// sets them: through `object.__setattr__` (frozen classes refuse their
/// own), so Python keeps them in the instance's compact attribute storage.
fn dataclass<'py, const N: usize>(
    cls: &Bound<'py, PyType>,
    fields: [(&Bound<'py, PyString>, &Bound<'py, PyAny>); N],
) -> PyResult<Bound<'py, PyAny>> {
    let obj = object_new(cls)?;
    for (name, value) in fields {
        set(&obj, name, value)?;
    }
    Ok(obj)
}

fn set(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let rc = unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if rc < 0 {
        Err(PyErr::fetch(obj.py()))
    } else {
        Ok(())
    }
}

/// A pydantic model as `model_construct` leaves it: fields, the set
/// fields, no extra, no private state.
fn pydantic_model<'py>(
    cls: &Bound<'py, PyType>,
    fields: &Bound<'py, PyDict>,
    set_field: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let obj = allocated(cls)?;
    set(&obj, intern!(py, "__dict__"), fields.as_any())?;
    set(
        &obj,
        intern!(py, "__pydantic_fields_set__"),
        &untracked(PySet::new(py, [set_field])?.into_any()),
    )?;
    set(&obj, intern!(py, "__pydantic_extra__"), &py.None().into_bound(py))?;
    set(&obj, intern!(py, "__pydantic_private__"), &py.None().into_bound(py))?;
    Ok(obj)
}

/// Takes a container holding only atoms (ints, strs) off the cyclic GC's
/// books, as CPython does itself for such tuples and dicts: it can be in no
/// cycle, and every collection would otherwise walk it (for a token list,
/// item by item) -- with a large heap that cost more than building it.
fn untracked(obj: Bound<'_, PyAny>) -> Bound<'_, PyAny> {
    unsafe { ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) };
    obj
}

fn tensor<'py>(
    cls: &Bound<'py, PyType>,
    dtype: &Bound<'py, PyString>,
    view: Bound<'py, PyAny>,
    n: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let none = py.None().into_bound(py);
    dataclass(
        cls,
        [
            (intern!(py, "dtype"), dtype.as_any()),
            (intern!(py, "shape"), &untracked(PyList::new(py, [n])?.into_any())),
            (intern!(py, "sparse_crow_indices"), &none),
            (intern!(py, "sparse_col_indices"), &none),
            (intern!(py, "_numpy"), &view),
        ],
    )
}

/// `column[start:start + len]`, made as numpy's slicing makes it: a view
/// whose base is `column`.
fn view<'py, T: Element>(column: &Bound<'py, PyArray1<T>>, start: usize, len: usize) -> Bound<'py, PyAny> {
    // Safety: `start + len` is within `column` (row offsets come from its
    // length), and the view holds `column` alive as its base.
    unsafe {
        let rows = ArrayView1::from_shape_ptr(len, column.data().add(start) as *const T);
        PyArray1::borrow_from_array(&rows, column.clone().into_any()).into_any()
    }
}

/// The flat per-position columns the Datums' tensors view.
pub struct Columns<'py> {
    pub targets: Bound<'py, PyArray1<i64>>,
    pub logprobs: Bound<'py, PyArray1<f32>>,
    pub advantages: Bound<'py, PyArray1<f32>>,
}

/// One Datum and one DatumMetadata per row.
pub fn build_datums<'py>(
    classes: &DatumClasses<'py>,
    model_inputs: Vec<Bound<'py, PyList>>,
    columns: &Columns<'py>,
    offsets: &[i64],
    kept: &[Location],
    tags: &[Option<Bound<'py, PyAny>>],
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let py = classes.datum.py();
    let none = py.None().into_bound(py);
    let (int64, float32) = (intern!(py, "int64"), intern!(py, "float32"));
    let datums = PyList::empty(py);
    let metadata = PyList::empty(py);
    for ((tokens, bounds), at) in model_inputs.into_iter().zip(offsets.windows(2)).zip(kept) {
        let (start, n) = (bounds[0] as usize, (bounds[1] - bounds[0]) as usize);

        let chunk_fields = PyDict::new(py);
        chunk_fields.set_item(intern!(py, "tokens"), untracked(tokens.into_any()))?;
        chunk_fields.set_item(intern!(py, "type"), intern!(py, "encoded_text"))?;
        let chunk = pydantic_model(&classes.chunk, &chunk_fields, intern!(py, "tokens"))?;
        let input_fields = PyDict::new(py);
        input_fields.set_item(intern!(py, "chunks"), PyList::new(py, [chunk])?)?;
        let model_input = pydantic_model(&classes.model_input, &input_fields, intern!(py, "chunks"))?;

        let loss_fn_inputs = PyDict::new(py);
        let td = &classes.tensor_data;
        loss_fn_inputs.set_item(
            intern!(py, "target_tokens"),
            tensor(td, int64, view(&columns.targets, start, n), n)?,
        )?;
        loss_fn_inputs.set_item(
            intern!(py, "logprobs"),
            tensor(td, float32, view(&columns.logprobs, start, n), n)?,
        )?;
        loss_fn_inputs.set_item(
            intern!(py, "advantages"),
            tensor(td, float32, view(&columns.advantages, start, n), n)?,
        )?;
        datums.append(dataclass(
            &classes.datum,
            [
                (intern!(py, "model_input"), &model_input),
                (intern!(py, "loss_fn_inputs"), loss_fn_inputs.as_any()),
                (intern!(py, "model_input_spans"), &none),
                (intern!(py, "loss_fn_input_spans"), &none),
            ],
        )?)?;

        let g = at.group.unwrap_or(0);
        let group_tags = match &tags[g] {
            Some(t) => unsafe { Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(t.as_ptr()))? },
            None => PyList::empty(py).into_any(),
        };
        metadata.append(dataclass(
            &classes.metadata,
            [
                (intern!(py, "group_idx"), &g.into_pyobject(py)?.into_any()),
                (
                    intern!(py, "traj_idx"),
                    &at.trajectory.unwrap_or(0).into_pyobject(py)?.into_any(),
                ),
                (
                    intern!(py, "turn_idx"),
                    &at.turn.unwrap_or(0).into_pyobject(py)?.into_any(),
                ),
                (intern!(py, "tags"), &group_tags),
            ],
        )?)?;
    }
    Ok((datums, metadata))
}
