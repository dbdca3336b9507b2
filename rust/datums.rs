//! Building tinker's objects from the rows without their constructors'
//! per-token validation (the rows are already checked): each instance gets
//! the fields its public constructor would give it. `datums.py` checks at
//! import that the result is field for field the public one, and uses the
//! public constructors instead wherever it is not.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PySlice, PyString, PyType};
use pyo3::{ffi, intern};

use crate::error::Location;

pub struct DatumClasses<'py> {
    pub datum: Bound<'py, PyType>,
    pub model_input: Bound<'py, PyType>,
    pub chunk: Bound<'py, PyType>,
    pub tensor_data: Bound<'py, PyType>,
    pub metadata: Bound<'py, PyType>,
}

/// `object.__new__(cls)` with `__dict__` set to `fields`, as
/// `object.__setattr__` would (frozen classes refuse their own setattr).
fn instance<'py>(cls: &Bound<'py, PyType>, fields: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let obj = unsafe {
        let args = ffi::PyTuple_New(0);
        let obj = ffi::PyType_GenericNew(cls.as_type_ptr(), args, std::ptr::null_mut());
        ffi::Py_DecRef(args);
        Bound::from_owned_ptr_or_err(py, obj)?
    };
    set(&obj, intern!(py, "__dict__"), fields.as_any())?;
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
fn pydantic_model<'py>(cls: &Bound<'py, PyType>, fields: &Bound<'py, PyDict>, set_field: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let obj = instance(cls, fields)?;
    set(&obj, intern!(py, "__pydantic_fields_set__"), PySet::new(py, [set_field])?.as_any())?;
    set(&obj, intern!(py, "__pydantic_extra__"), &py.None().into_bound(py))?;
    set(&obj, intern!(py, "__pydantic_private__"), &py.None().into_bound(py))?;
    Ok(obj)
}

fn tensor<'py>(cls: &Bound<'py, PyType>, dtype: &Bound<'py, PyString>, view: Bound<'py, PyAny>, n: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let fields = PyDict::new(py);
    fields.set_item(intern!(py, "dtype"), dtype)?;
    fields.set_item(intern!(py, "shape"), PyList::new(py, [n])?)?;
    fields.set_item(intern!(py, "sparse_crow_indices"), py.None())?;
    fields.set_item(intern!(py, "sparse_col_indices"), py.None())?;
    fields.set_item(intern!(py, "_numpy"), view)?;
    instance(cls, &fields)
}

/// One Datum and one DatumMetadata per row; the Datums' tensors are views
/// of the flat `columns` (targets, logprobs, advantages).
pub fn build_datums<'py>(
    classes: &DatumClasses<'py>,
    model_inputs: Vec<Bound<'py, PyList>>,
    columns: [&Bound<'py, PyAny>; 3],
    offsets: &[i64],
    kept: &[Location],
    tags: &[Option<Bound<'py, PyAny>>],
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let py = classes.datum.py();
    let keys = [intern!(py, "target_tokens"), intern!(py, "logprobs"), intern!(py, "advantages")];
    let dtypes = [intern!(py, "int64"), intern!(py, "float32"), intern!(py, "float32")];
    let datums = PyList::empty(py);
    let metadata = PyList::empty(py);
    for ((tokens, bounds), at) in model_inputs.into_iter().zip(offsets.windows(2)).zip(kept) {
        let (start, end) = (bounds[0] as isize, bounds[1] as isize);
        let n = (end - start) as usize;

        let chunk_fields = PyDict::new(py);
        chunk_fields.set_item(intern!(py, "tokens"), tokens)?;
        chunk_fields.set_item(intern!(py, "type"), intern!(py, "encoded_text"))?;
        let chunk = pydantic_model(&classes.chunk, &chunk_fields, intern!(py, "tokens"))?;
        let input_fields = PyDict::new(py);
        input_fields.set_item(intern!(py, "chunks"), PyList::new(py, [chunk])?)?;
        let model_input = pydantic_model(&classes.model_input, &input_fields, intern!(py, "chunks"))?;

        let loss_fn_inputs = PyDict::new(py);
        let slice = PySlice::new(py, start, end, 1);
        for ((key, dtype), column) in keys.iter().zip(&dtypes).zip(columns) {
            loss_fn_inputs.set_item(key, tensor(&classes.tensor_data, dtype, column.get_item(&slice)?, n)?)?;
        }
        let datum_fields = PyDict::new(py);
        datum_fields.set_item(intern!(py, "model_input"), model_input)?;
        datum_fields.set_item(intern!(py, "loss_fn_inputs"), loss_fn_inputs)?;
        datum_fields.set_item(intern!(py, "model_input_spans"), py.None())?;
        datum_fields.set_item(intern!(py, "loss_fn_input_spans"), py.None())?;
        datums.append(instance(&classes.datum, &datum_fields)?)?;

        let g = at.group.unwrap_or(0);
        let meta_fields = PyDict::new(py);
        meta_fields.set_item(intern!(py, "group_idx"), g)?;
        meta_fields.set_item(intern!(py, "traj_idx"), at.trajectory.unwrap_or(0))?;
        meta_fields.set_item(intern!(py, "turn_idx"), at.turn.unwrap_or(0))?;
        let group_tags = match &tags[g] {
            Some(t) => unsafe { Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(t.as_ptr()))? },
            None => PyList::empty(py).into_any(),
        };
        meta_fields.set_item(intern!(py, "tags"), group_tags)?;
        metadata.append(instance(&classes.metadata, &meta_fields)?)?;
    }
    Ok((datums, metadata))
}
