//! Turning filled rows into tinker's objects without their constructors'
//! per-token validation (the rows are already checked): each instance gets
//! exactly the fields its public constructor would give it. `_build.py`
//! checks at import that the result is field for field the public one, and
//! uses the public constructors instead wherever it is not.

use std::mem::MaybeUninit;

use numpy::{Element, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyString, PyTuple, PyType};

/// tinker's classes (and the metadata class) that rows are built into.
pub struct DatumClasses<'py> {
    pub datum: Bound<'py, PyType>,
    pub model_input: Bound<'py, PyType>,
    pub chunk: Bound<'py, PyType>,
    pub tensor_data: Bound<'py, PyType>,
    pub metadata: Bound<'py, PyType>,
}

/// `(Datum, ModelInput, EncodedTextChunk, TensorData, DatumMetadata)`, as
/// the exported functions take them.
pub type ClassTuple<'py> = (
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
);

impl<'py> From<ClassTuple<'py>> for DatumClasses<'py> {
    fn from((datum, model_input, chunk, tensor_data, metadata): ClassTuple<'py>) -> Self {
        DatumClasses {
            datum,
            model_input,
            chunk,
            tensor_data,
            metadata,
        }
    }
}

/// A fresh 1-D numpy array that this code alone can see until
/// [`Column::into_array`] hands it on: it is written through a plain slice.
pub struct Column<'py, T: Element> {
    array: Bound<'py, PyArray1<T>>,
}

impl<'py, T: Element> Column<'py, T> {
    pub fn zeros(py: Python<'py>, n: usize) -> Self {
        Column {
            array: PyArray1::zeros(py, n, false),
        }
    }

    /// Not yet written: every element must be written (through
    /// [`Column::slots`]) before the array is handed on. Saves zeroing
    /// memory that [`crate::rows::fill_row`] writes in full anyway.
    pub fn unwritten(py: Python<'py>, n: usize) -> Self {
        Column {
            // SAFETY: the memory is uninitialized; it is exposed only as
            // `MaybeUninit` (by `slots`) until written.
            array: unsafe { PyArray1::new(py, n, false) },
        }
    }

    /// The elements, for writing.
    pub fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        let n = self.array.len();
        // SAFETY: as in `slice_mut`, this is the only view of the array's
        // `n` contiguous elements; `MaybeUninit<T>` has `T`'s layout and
        // makes no claim that they are initialized.
        unsafe { std::slice::from_raw_parts_mut(self.array.data().cast::<MaybeUninit<T>>(), n) }
    }

    /// The elements, once written (always so for [`Column::zeros`]).
    pub fn slice_mut(&mut self) -> &mut [T] {
        // SAFETY: the array was created here, is contiguous, and no
        // reference to it exists outside `self` (it is handed on only by
        // consuming `self`), so this is the only view of its memory. numpy's
        // `readwrite()` would check the same at run time, per array.
        unsafe { self.array.as_slice_mut() }.expect("a fresh 1-D array is contiguous")
    }

    /// The first `n` elements (all written) as the array, shortened in place.
    pub fn truncated(self, n: usize) -> PyResult<Bound<'py, PyArray1<T>>> {
        if n < self.array.len() {
            // SAFETY: no reference into the array's memory is alive (slices
            // from `slots` borrow `self`, consumed here), so numpy may
            // reallocate it.
            unsafe { self.array.resize(n)? };
        }
        Ok(self.array)
    }

    pub fn into_array(self) -> Bound<'py, PyArray1<T>> {
        self.array
    }

    /// Marks the array read-only, as handed to users who must not write it.
    pub fn into_read_only(self) -> Bound<'py, PyArray1<T>> {
        // SAFETY: `as_array_ptr` is the live array object; clearing the
        // WRITEABLE flag is what `arr.flags.writeable = False` does.
        unsafe {
            (*self.array.as_array_ptr()).fields.flags &= !numpy::npyffi::NPY_ARRAY_WRITEABLE;
        }
        self.array
    }
}

/// A row's model input as built: one text chunk's tokens (a list of ints
/// or an int32 array), or (tinker-cookbook rows) the chunk list itself.
pub enum ModelInputOut<'py> {
    Tokens(Bound<'py, PyAny>),
    Chunks(Vec<ChunkOut<'py>>),
}

/// A chunk of a tinker-cookbook row's model input: a run of tokens, or a
/// non-text chunk as given.
pub enum ChunkOut<'py> {
    /// A new, untracked list of ints.
    Text(Bound<'py, PyList>),
    Given(Bound<'py, PyAny>),
}

/// A provenance span as planned: `(sequence_id, offset, length, sampled)`.
pub type SpanOut<'py> = (Bound<'py, PyAny>, usize, usize, bool);

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

/// The keys of `loss_fn_inputs`.
#[derive(Clone, Copy)]
pub enum LossKey {
    TargetTokens,
    Logprobs,
    Advantages,
    Mask,
}

/// The dtypes of `TensorData`.
#[derive(Clone, Copy)]
pub enum Dtype {
    Int64,
    Float32,
}

// Names interned once per process by `intern!`: interning anew per Datum
// cost 6% of a cookbook call.
impl LossKey {
    fn name(self, py: Python<'_>) -> &Bound<'_, PyString> {
        match self {
            LossKey::TargetTokens => intern!(py, "target_tokens"),
            LossKey::Logprobs => intern!(py, "logprobs"),
            LossKey::Advantages => intern!(py, "advantages"),
            LossKey::Mask => intern!(py, "mask"),
        }
    }
}

impl Dtype {
    fn name(self, py: Python<'_>) -> &Bound<'_, PyString> {
        match self {
            Dtype::Int64 => intern!(py, "int64"),
            Dtype::Float32 => intern!(py, "float32"),
        }
    }
}

/// One loss input: its key, its dtype, its array.
pub struct LossInput<'py> {
    pub key: LossKey,
    pub dtype: Dtype,
    pub array: Bound<'py, PyAny>,
}

/// Everything one Datum is made of.
pub struct FilledRow<'py> {
    pub model_input: ModelInputOut<'py>,
    pub loss_inputs: Vec<LossInput<'py>>,
    /// `(model_input_spans, loss_fn_input_spans)`, when it has provenance.
    pub provenance: Option<(Vec<SpanOut<'py>>, Vec<SpanOut<'py>>)>,
    /// Positions (`len(S) - 1`).
    pub n: usize,
    pub meta: RowMeta,
}

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
/// the fields set next need no dict of their own (by callgrind, a Datum's
/// attribute stores took a third of its instructions without it).
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
fn pydantic_model<'py>(
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
fn untrack_frozen(obj: &Bound<'_, PyAny>) {
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

fn tensor<'py>(cls: &Bound<'py, PyType>, input: &LossInput<'py>, n: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let none = py.None().into_bound(py);
    let shape = PyList::new(py, [n])?;
    untrack_list(&shape);
    let tensor = dataclass(
        cls,
        [
            (intern!(py, "dtype"), input.dtype.name(py).as_any()),
            (intern!(py, "shape"), shape.as_any()),
            (intern!(py, "sparse_crow_indices"), &none),
            (intern!(py, "sparse_col_indices"), &none),
            (intern!(py, "_numpy"), &input.array),
        ],
    )?;
    // A str, an untracked list of ints, None and a numeric array.
    untrack_frozen(&tensor);
    Ok(tensor)
}

/// The Datum of a row, built directly; `spans` makes its provenance spans.
pub fn datum<'py>(
    classes: &DatumClasses<'py>,
    spans: Option<&SpanClasses<'py>>,
    row: FilledRow<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = classes.datum.py();
    let chunks = match row.model_input {
        ModelInputOut::Tokens(tokens) => PyList::new(py, [text_chunk(&classes.chunk, &tokens)?])?,
        ModelInputOut::Chunks(chunks) => {
            let list = PyList::empty(py);
            for chunk in chunks {
                let chunk = match chunk {
                    ChunkOut::Text(tokens) => text_chunk(&classes.chunk, tokens.as_any())?,
                    ChunkOut::Given(chunk) => chunk,
                };
                list.append(chunk)?;
            }
            list
        }
    };
    let input_fields = PyDict::new(py);
    input_fields.set_item(intern!(py, "chunks"), chunks)?;
    let model_input = pydantic_model(&classes.model_input, &input_fields, intern!(py, "chunks"))?;
    let loss_fn_inputs = PyDict::new(py);
    for input in &row.loss_inputs {
        loss_fn_inputs.set_item(input.key.name(py), tensor(&classes.tensor_data, input, row.n)?)?;
    }
    // Strs to untracked TensorData.
    untrack_dict(&loss_fn_inputs);
    let none = py.None().into_bound(py);
    let (input_spans, target_spans) = match (&row.provenance, spans) {
        (Some((inputs, targets)), Some(classes)) => (span_list(classes, inputs)?, span_list(classes, targets)?),
        _ => (none.clone(), none.clone()),
    };
    let (input_spans, target_spans) = (&input_spans, &target_spans);
    dataclass(
        &classes.datum,
        [
            (intern!(py, "model_input"), &model_input),
            (intern!(py, "loss_fn_inputs"), loss_fn_inputs.as_any()),
            (intern!(py, "model_input_spans"), input_spans),
            (intern!(py, "loss_fn_input_spans"), target_spans),
        ],
    )
}

/// tinker's `PromptProvenanceSpan` and `SampledProvenanceSpan`.
pub struct SpanClasses<'py> {
    pub prompt: Bound<'py, PyType>,
    pub sampled: Bound<'py, PyType>,
}

/// Provenance spans (frozen dataclasses) with their fields set as their
/// `__init__` sets them; the caller has checked what `__post_init__` would.
fn span_list<'py>(classes: &SpanClasses<'py>, spans: &[SpanOut<'py>]) -> PyResult<Bound<'py, PyAny>> {
    let py = classes.prompt.py();
    let list = PyList::empty(py);
    for (sequence_id, offset, length, sampled) in spans {
        let cls = if *sampled { &classes.sampled } else { &classes.prompt };
        let span = dataclass(
            cls,
            [
                (intern!(py, "sequence_id"), sequence_id),
                (intern!(py, "offset"), &offset.into_pyobject(py)?.into_any()),
                (intern!(py, "length"), &length.into_pyobject(py)?.into_any()),
            ],
        )?;
        // Two ints and the caller's sequence id: when that is an atom (a
        // str), the span can be in no cycle.
        if !is_tracked(sequence_id) {
            untrack_frozen(&span);
        }
        list.append(span)?;
    }
    Ok(list.into_any())
}

/// Where a row came from: its group, trajectory and turns (the evsys API's
/// `DatumMetadata`; the cookbook's `{"group_idx", "traj_idx"}`).
pub struct RowMeta {
    pub group: usize,
    pub trajectory: usize,
    pub first_turn: usize,
    pub n_turns: usize,
}

/// A `DatumMetadata` (a dataclass) with its own copy of the group's tags.
pub fn metadata<'py>(
    cls: &Bound<'py, PyType>,
    meta: &RowMeta,
    tags: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let tags = tags.get_slice(0, tags.len());
    dataclass(
        cls,
        [
            (intern!(py, "group_idx"), &meta.group.into_pyobject(py)?.into_any()),
            (intern!(py, "traj_idx"), &meta.trajectory.into_pyobject(py)?.into_any()),
            (intern!(py, "turn_idx"), &meta.first_turn.into_pyobject(py)?.into_any()),
            (intern!(py, "tags"), tags.as_any()),
            (intern!(py, "n_turns"), &meta.n_turns.into_pyobject(py)?.into_any()),
        ],
    )
}

/// Python's cyclic GC held off for a whole call, reading and building:
/// every container allocated counts toward a collection, and with a large
/// live heap (the caller's batch) the collections they set off multiplied
/// the cost per Datum by up to 5. Nothing made here can form a cycle, so
/// nothing is lost; cyclic garbage that user code run while reading (a
/// property, an `__index__`) makes is collected after. Restores the state
/// it found, unless such code changed it meanwhile.
pub struct GcPaused {
    was_enabled: bool,
}

impl GcPaused {
    pub fn new(_py: Python<'_>) -> Self {
        // SAFETY: attached to the interpreter (`_py`); the call only flips
        // the collector's flag and returns its previous value.
        let was_enabled = unsafe { ffi::PyGC_Disable() } == 1;
        GcPaused { was_enabled }
    }
}

/// Whether the cyclic collector is off (user code may have turned it back
/// on inside a [`GcPaused`] call).
pub fn collector_off(_py: Python<'_>) -> bool {
    // SAFETY: attached to the interpreter (`_py`); reads the collector's flag.
    unsafe { ffi::PyGC_IsEnabled() == 0 }
}

impl Drop for GcPaused {
    fn drop(&mut self) {
        if self.was_enabled {
            // SAFETY: dropped where it was made, with the thread attached.
            unsafe { ffi::PyGC_Enable() };
        }
    }
}
