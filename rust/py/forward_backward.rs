//! A `tinker.types.ForwardBackwardRequest` read into `wire::Request`, then
//! written as one `bytes` object.
//!
//! The readers take what tinker and this package make as it is: token lists
//! of exact ints (read in place), integer numpy arrays, float32 / int64
//! `TensorData` arrays, `str` and `bytes` objects. Strs and bytes, which do
//! not change, are borrowed until the bytes are written; arrays, whose
//! memory user code run by a later Datum could reallocate, are held as
//! objects and their memory is looked at only once the whole request has
//! been read, while it is written (no Python code runs then). Only memory
//! the core owns is touched with the GIL released. Anything else (another dtype, numpy scalars, user
//! objects, what tinker refuses) goes, one chunk, tensor or span at a time,
//! to tinker's own encoder (`tinker_rl_data.wire`), so that its bytes and
//! its exceptions are tinker's by construction. An exception is raised
//! again, same class, with where it happened in front:
//! `datum 3, model_input chunk 1: ...`.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::fmt::Display;
use std::mem::MaybeUninit;

use numpy::{Element as _, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyList, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};

use crate::forward_backward::{
    sort_map, write_owned, Chunk, ConfigValue, DType, Datum, KeyOrder, Part, Payload, Request, Shape, Span, Tensor,
    TensorData,
};
use crate::py::read::numbers::{contiguous_bytes, Kind, Numbers, Slice, Value};
use crate::py::read::{describe, exact_int, pairs, Items, Pair};

/// From this size on the bytes are written with the GIL released: below
/// it, the copy is too short for other threads to gain from the switch.
const DETACH_AT: usize = 1 << 20;

/// What the encoder takes from tinker, by attribute (`tinker_rl_data.wire`
/// gathers them).
#[derive(FromPyObject)]
pub struct TinkerParts<'py> {
    encoded_text_chunk: Bound<'py, PyType>,
    image_chunk: Bound<'py, PyType>,
    dmel_chunk: Bound<'py, PyType>,
    sampled_span: Bound<'py, PyType>,
    /// tinker's bytes of one `Chunk`, `Tensor` or `ProvenanceSpan` message.
    chunk_bytes: Bound<'py, PyAny>,
    tensor_bytes: Bound<'py, PyAny>,
    span_bytes: Bound<'py, PyAny>,
    /// `(message, field, value) -> value` as a proto message of that class
    /// stores it, or what protobuf raises.
    stored: Bound<'py, PyAny>,
    /// A map key as the proto maps store it, or what protobuf raises.
    map_key: Bound<'py, PyAny>,
    /// The installed protobuf's deterministic order of a key and its prefix.
    longer_key_first: bool,
}

/// tinker's `forward_backward` request bytes for `request`.
pub fn encode_forward_backward<'py>(
    request: &Bound<'py, PyAny>,
    forward_only: &Bound<'py, PyAny>,
    parts: &TinkerParts<'py>,
) -> PyResult<Bound<'py, PyBytes>> {
    let held = Held::default();
    let reader = Reader {
        parts,
        held: &held,
        order: if parts.longer_key_first {
            KeyOrder::LongerFirst
        } else {
            KeyOrder::ShorterFirst
        },
        pairs: Cell::default(),
        datum: Cell::new(0),
    };
    let message = reader.request(request, forward_only)?;
    // Every attribute has been read: from here on no Python code runs
    // until the bytes are written, so the arrays' memory stays put.
    let arrays = held.arrays.borrow();
    let mut bytes = Vec::with_capacity(arrays.len());
    for array in arrays.iter() {
        // SAFETY: no Python code runs from here until the bytes are
        // written (`written` runs none before it is done with `bytes`).
        match unsafe { array.bytes() } {
            Some(b) => bytes.push(b),
            None => return Err(array.changed()),
        }
    }
    // SAFETY: as above.
    unsafe { written(request.py(), &message, &bytes) }
}

/// The longest `bytes` field protobuf serializes (2 GiB - 1).
const MAX_FIELD: usize = i32::MAX as usize;

/// The message's bytes, in a `bytes` object allocated once at its size;
/// `arrays`: the bytes of its arrays.
///
/// # Safety
/// No Python code runs until it returns, but after `arrays` is last used
/// (an error it raises): `arrays` point into memory that Python code could
/// reallocate. It runs none itself before that.
unsafe fn written<'py>(py: Python<'py>, message: &Request<'_>, arrays: &[&[u8]]) -> PyResult<Bound<'py, PyBytes>> {
    let message = message.measured(arrays);
    if message.longest_payload() > MAX_FIELD {
        // What tinker's encoder (upb) raises for such a field, made here
        // before anything is allocated.
        let error = py.import("google.protobuf.message")?.getattr("EncodeError")?;
        return Err(PyErr::from_value(error.call1((format!(
            "Failed to serialize proto: a bytes field of {} bytes is over protobuf's limit of {MAX_FIELD}",
            message.longest_payload()
        ),))?));
    }
    let len = message.len();
    let size = isize::try_from(len).expect("request larger than isize::MAX");
    // SAFETY: with a NULL source, PyBytes_FromStringAndSize returns a new
    // reference to a bytes object of `size` bytes left to its maker to
    // fill (or NULL with an exception set). It runs no Python code: a
    // bytes object is no GC object, so no collection starts.
    let bytes = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(std::ptr::null(), size))? };
    // SAFETY: the object's `len` bytes, which no one else sees before it is
    // returned; MaybeUninit: written, never read, here.
    let out =
        unsafe { std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(bytes.as_ptr()).cast::<MaybeUninit<u8>>(), len) };
    crate::pages::advise_huge_pages(out.as_ptr().cast::<u8>(), len);
    if len >= DETACH_AT {
        // The memory of Python objects (arrays, strs, bytes) is copied with
        // the GIL held, so that no other thread can resize an array
        // meanwhile; then the payloads the message owns, without it.
        let owned = message.write_borrowed(out);
        py.detach(|| write_owned(&owned, out));
    } else {
        message.write_to(out);
    }
    Ok(bytes.cast_into::<PyBytes>()?)
}

/// The Python objects whose memory a `Request` borrows, kept until its
/// bytes are written. Only added to: what it hands out stays valid as long
/// as it lives.
#[derive(Default)]
struct Held<'py> {
    /// Strs and bytes, whose memory does not change.
    objects: RefCell<Vec<Bound<'py, PyAny>>>,
    /// The request's [`Payload::Array`]s, by index.
    arrays: RefCell<Vec<HeldArray<'py>>>,
}

/// A C-contiguous numpy array whose bytes are a payload, held until they
/// are written, and the index of its Datum.
struct HeldArray<'py> {
    array: Bound<'py, PyUntypedArray>,
    dtype: DType32,
    datum: usize,
}

/// The dtypes of arrays written as they are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DType32 {
    Int32,
    Int64,
    Float32,
}

impl HeldArray<'_> {
    /// Its bytes now, if it is still a C-contiguous array of its dtype.
    ///
    /// # Safety
    /// No Python code runs while the slice lives.
    unsafe fn bytes(&self) -> Option<&[u8]> {
        let dtype = self.array.dtype();
        let same = dtype.is_native_byteorder() != Some(false)
            && match self.dtype {
                DType32::Int32 => dtype.kind() == b'i' && dtype.itemsize() == 4,
                DType32::Int64 => dtype.kind() == b'i' && dtype.itemsize() == 8,
                DType32::Float32 => dtype.kind() == b'f' && dtype.itemsize() == 4,
            };
        // SAFETY: no Python code runs while the slice lives (the caller's promise).
        same.then(|| unsafe { contiguous_bytes(&self.array) }).flatten()
    }

    /// User code changed the array (its dtype or layout) after it was read.
    #[cold]
    fn changed(&self) -> PyErr {
        PyRuntimeError::new_err(format!(
            "datum {}: a numpy array of it changed (dtype or layout) while the request was read",
            self.datum
        ))
    }
}

impl<'py> Held<'py> {
    /// # Safety
    /// `len` bytes at `data` belong to `owner` and stay allocated while it lives.
    unsafe fn keep<'h>(&'h self, owner: Bound<'py, PyAny>, data: *const u8, len: usize) -> &'h [u8] {
        if len == 0 {
            return &[];
        }
        self.objects.borrow_mut().push(owner);
        // SAFETY: (caller) the memory lives as long as `owner`, which `self`
        // holds until it is dropped, and `'h` borrows `self`.
        unsafe { std::slice::from_raw_parts(data, len) }
    }

    /// A str's UTF-8, or `None` for one that has none (lone surrogates).
    fn str<'h>(&'h self, s: &Bound<'py, PyString>) -> Option<&'h [u8]> {
        let utf8 = s.to_str().ok()?;
        // SAFETY: CPython keeps a str's UTF-8 form inside the object, from
        // when it is first asked for until the object is freed.
        Some(unsafe { self.keep(s.clone().into_any(), utf8.as_ptr(), utf8.len()) })
    }

    fn bytes<'h>(&'h self, b: &Bound<'py, PyBytes>) -> &'h [u8] {
        let data = b.as_bytes();
        // SAFETY: a bytes object holds its (immutable) contents.
        unsafe { self.keep(b.clone().into_any(), data.as_ptr(), data.len()) }
    }

    /// A C-contiguous array of `dtype` in Datum `datum`, its bytes written
    /// as they are when the request is written.
    fn array(&self, array: &Bound<'py, PyUntypedArray>, dtype: DType32, datum: usize) -> Payload<'static> {
        let mut arrays = self.arrays.borrow_mut();
        arrays.push(HeldArray {
            array: array.clone(),
            dtype,
            datum,
        });
        Payload::Array(arrays.len() - 1)
    }
}

struct Reader<'h, 'py> {
    parts: &'h TinkerParts<'py>,
    held: &'h Held<'py>,
    order: KeyOrder,
    /// A Datum's `loss_fn_inputs` pairs, the buffer reused Datum to Datum.
    pairs: Cell<Vec<Pair<'py>>>,
    /// The index of the Datum being read.
    datum: Cell<usize>,
}

impl<'h, 'py> Reader<'h, 'py> {
    /// What `forward_backward_request_to_proto` reads, in its order.
    fn request(&self, request: &Bound<'py, PyAny>, forward_only: &Bound<'py, PyAny>) -> PyResult<Request<'h>> {
        let py = request.py();
        let model_id = request.getattr(intern!(py, "model_id"));
        let model_id = model_id.and_then(|v| self.string("ForwardBackwardRequest", "model_id", v));
        let model_id = at(py, model_id, || "model_id")?;
        let seq_id = at(py, self.seq_id(request), || "seq_id")?;
        let input = at(py, request.getattr(intern!(py, "forward_backward_input")), || "request")?;
        let loss_fn = input.getattr(intern!(py, "loss_fn"));
        let loss_fn = loss_fn.and_then(|v| self.string("ForwardBackwardRequest", "loss_fn", v));
        let loss_fn = at(py, loss_fn, || "loss_fn")?;
        let (loss_fn_config, loss_fn_config_v2) = self.loss_fn_config(&input)?;
        let data = at(py, input.getattr(intern!(py, "data")), || "forward_backward_input")?;
        // A capacity hint from exact lists and tuples only: `len()` of
        // anything else would run user code tinker never runs.
        let hint = if data.is_exact_instance_of::<PyList>() || data.is_exact_instance_of::<PyTuple>() {
            data.len().unwrap_or(0)
        } else {
            0
        };
        let mut datums = Vec::with_capacity(hint);
        for (i, datum) in at(py, data.try_iter(), || "data")?.enumerate() {
            py.check_signals()?;
            let datum = at(py, datum, || "data")?;
            datums.push(self.datum(i, &datum)?);
        }
        let forward_only = if forward_only.is_exact_instance_of::<PyBool>() {
            forward_only.is_truthy()?
        } else {
            let stored = self.stored("ForwardBackwardRequest", "forward_only", forward_only.clone());
            at(py, stored.and_then(|v| v.extract::<bool>()), || "forward_only")?
        };
        Ok(Request {
            model_id,
            seq_id,
            data: datums,
            loss_fn,
            loss_fn_config,
            forward_only,
            loss_fn_config_v2,
        })
    }

    fn seq_id(&self, request: &Bound<'py, PyAny>) -> PyResult<i32> {
        let seq_id = request.getattr(intern!(request.py(), "seq_id"))?;
        if seq_id.is_none() {
            return Ok(0);
        }
        if let Some(v) = exact_int(&seq_id).and_then(|v| i32::try_from(v).ok()) {
            return Ok(v);
        }
        self.stored("ForwardBackwardRequest", "seq_id", seq_id)?.extract()
    }

    /// Floats go into both maps, strs into the second only, as tinker writes them.
    #[allow(clippy::type_complexity)]
    fn loss_fn_config(
        &self,
        input: &Bound<'py, PyAny>,
    ) -> PyResult<(Vec<(&'h [u8], f64)>, Vec<(&'h [u8], ConfigValue<'h>)>)> {
        let py = input.py();
        let (mut numbers, mut values) = (Vec::new(), Vec::new());
        let config = at(py, input.getattr(intern!(py, "loss_fn_config")), || "loss_fn_config")?;
        if config.is_none() {
            return Ok((numbers, values));
        }
        let mut pairs = Vec::new();
        at(py, self::pairs(&config, &mut pairs), || "loss_fn_config")?;
        for (key, value) in pairs {
            let mut entry = || -> PyResult<()> {
                if let Ok(text) = value.cast::<PyString>() {
                    let key = self.key(&key)?;
                    let text = self.string("LossConfigValue", "text", text.clone().into_any())?;
                    values.push((key, ConfigValue::Text(text)));
                } else {
                    let number = match value.cast_exact::<PyFloat>() {
                        Ok(float) => float.value(),
                        Err(_) => py.get_type::<PyFloat>().call1((&value,))?.extract::<f64>()?, // float(v)
                    };
                    let key = self.key(&key)?;
                    numbers.push((key, number));
                    values.push((key, ConfigValue::Number(number)));
                }
                Ok(())
            };
            at(py, entry(), || format!("loss_fn_config[{}]", describe(&key)))?;
        }
        sort_map(&mut numbers, self.order);
        sort_map(&mut values, self.order);
        Ok((numbers, values))
    }

    fn datum(&self, i: usize, datum: &Bound<'py, PyAny>) -> PyResult<Datum<'h>> {
        let py = datum.py();
        self.datum.set(i);
        let here = || format!("datum {i}");
        let chunks = datum.getattr(intern!(py, "model_input"));
        let chunks = at(py, chunks.and_then(|m| m.getattr(intern!(py, "chunks"))), here)?;
        let mut out = Datum::default();
        for (j, chunk) in at(py, chunks.try_iter(), here)?.enumerate() {
            let chunk = at(py, chunk, here)?;
            let chunk = self.chunk(&chunk);
            out.model_input
                .push(at(py, chunk, || format!("datum {i}, model_input chunk {j}"))?);
        }
        let mut pairs = self.pairs.take();
        let inputs = datum.getattr(intern!(py, "loss_fn_inputs"));
        at(py, inputs.and_then(|inputs| self::pairs(&inputs, &mut pairs)), here)?;
        out.loss_fn_inputs.reserve_exact(pairs.len());
        for (name, tensor) in pairs.drain(..) {
            let entry = self.key(&name).and_then(|key| Ok((key, self.tensor(&tensor)?)));
            let entry = at(py, entry, || format!("datum {i}, loss_fn_inputs[{}]", describe(&name)))?;
            out.loss_fn_inputs.push(entry);
        }
        self.pairs.set(pairs);
        sort_map(&mut out.loss_fn_inputs, self.order);
        out.model_input_spans = self.spans(datum, intern!(py, "model_input_spans"), i)?;
        out.loss_fn_input_spans = self.spans(datum, intern!(py, "loss_fn_input_spans"), i)?;
        Ok(out)
    }

    fn chunk(&self, chunk: &Bound<'py, PyAny>) -> PyResult<Part<'h, Chunk<'h>>> {
        let py = chunk.py();
        let parts = self.parts;
        let fields = if is_a(chunk, &parts.encoded_text_chunk)? {
            self.tokens(&chunk.getattr(intern!(py, "tokens"))?).map(Chunk::Text)
        } else if is_a(chunk, &parts.image_chunk)? {
            self.image(chunk)?
        } else if is_a(chunk, &parts.dmel_chunk)? {
            let dmel = chunk.getattr(intern!(py, "dmel"))?;
            dmel.cast_exact::<PyBytes>()
                .ok()
                .map(|b| Chunk::Dmel(self.held.bytes(b)))
        } else {
            None // tinker raises its ValueError
        };
        self.or_tinkers(fields, &parts.chunk_bytes, chunk)
    }

    /// Token bytes of a list or tuple of exact ints in int32 range, or of
    /// a 1-D integer or bool numpy array (converted as numpy converts to
    /// int32: wrapping); `None` for anything else.
    fn tokens(&self, tokens: &Bound<'py, PyAny>) -> Option<Payload<'h>> {
        if let Some(items) = Items::of_exact_sequence(tokens, "tokens") {
            let mut values = Vec::new();
            return items.read_exact_ints(&mut values).then_some(Payload::Int32s(values));
        }
        let Ok(array) = tokens.cast_exact::<PyUntypedArray>() else {
            return None; // what numpy makes of other objects is numpy's to say
        };
        // One numpy will not export as numbers (a datetime, say) is numpy's too.
        let Some(Ok(numbers)) = Numbers::of(tokens).ok().flatten() else {
            return None;
        };
        if numbers.kind() == Kind::Float {
            return None; // numpy's float casts round, saturate and warn as numpy decides
        }
        // SAFETY: the view is read and dropped with no Python code run.
        let view = unsafe { numbers.view() }?;
        if matches!(view.slice(), Some(Slice::I32(_))) && array.is_c_contiguous() {
            return Some(self.held.array(array, DType32::Int32, self.datum.get()));
        }
        let mut values = Vec::with_capacity(view.len());
        let Ok(()) = view.for_each(|_, v| {
            values.push(match v {
                Value::Int(v) => v as i32,
                Value::Huge(v) => v as i32,
                Value::Float(v) => v as i32, // not reached: the kind is checked
            });
            Ok::<(), Infallible>(())
        });
        Some(Payload::Int32s(values))
    }

    fn image(&self, chunk: &Bound<'py, PyAny>) -> PyResult<Option<Chunk<'h>>> {
        let py = chunk.py();
        let data = chunk.getattr(intern!(py, "data"))?;
        let format = chunk.getattr(intern!(py, "format"))?;
        let expected_tokens = chunk.getattr(intern!(py, "expected_tokens"))?;
        let expected_tokens = if expected_tokens.is_none() {
            None
        } else {
            match exact_int(&expected_tokens).and_then(|v| i32::try_from(v).ok()) {
                Some(v) => Some(v),
                None => return Ok(None),
            }
        };
        let (Ok(data), Ok(format)) = (data.cast_exact::<PyBytes>(), format.cast::<PyString>()) else {
            return Ok(None);
        };
        Ok(self.held.str(format).map(|format| Chunk::Image {
            data: self.held.bytes(data),
            format,
            expected_tokens,
        }))
    }

    fn tensor(&self, td: &Bound<'py, PyAny>) -> PyResult<Part<'h, Tensor<'h>>> {
        let fields = self.tensor_fields(td)?;
        self.or_tinkers(fields, &self.parts.tensor_bytes, td)
    }

    /// A TensorData whose array already has its dtype and is C-contiguous,
    /// with a shape and CSR indices (if any) of exact ints, read in tinker's
    /// order of attributes.
    fn tensor_fields(&self, td: &Bound<'py, PyAny>) -> PyResult<Option<Tensor<'h>>> {
        let py = td.py();
        let dtype = td.getattr(intern!(py, "dtype"))?;
        let dtype = match dtype.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) {
            Some("float32") => DType::Float32,
            Some("int64") => DType::Int64,
            _ => return Ok(None),
        };
        let dims = td.getattr(intern!(py, "shape"))?;
        let mut shape = Shape::default();
        if !dims.is_none() {
            let Some(dims) = Items::of_exact_sequence(&dims, "shape") else {
                return Ok(None);
            };
            let mut read = Vec::new();
            if !dims.read_exact_ints::<i64>(&mut read) {
                return Ok(None);
            }
            for d in read {
                shape.push(d);
            }
        }
        let array = td.getattr(intern!(py, "_numpy"))?;
        let Ok(array) = array.cast_exact::<PyUntypedArray>() else {
            return Ok(None);
        };
        let (wanted, dtype32) = match dtype {
            DType::Float32 => (f32::get_dtype(py), DType32::Float32),
            DType::Int64 => (i64::get_dtype(py), DType32::Int64),
        };
        if !array.dtype().is_equiv_to(&wanted) || !array.is_c_contiguous() {
            return Ok(None);
        }
        let values = self.held.array(array, dtype32, self.datum.get());
        let crow_indices = td.getattr(intern!(py, "sparse_crow_indices"))?;
        let data = if crow_indices.is_none() {
            TensorData::Dense(values)
        } else {
            let col_indices = td.getattr(intern!(py, "sparse_col_indices"))?;
            let (mut crow, mut col) = (Vec::new(), Vec::new());
            let ints = |obj: &Bound<'py, PyAny>, out: &mut Vec<i64>| {
                Items::of_exact_sequence(obj, "sparse indices").is_some_and(|items| items.read_exact_ints(out))
            };
            if !ints(&crow_indices, &mut crow) || !ints(&col_indices, &mut col) {
                return Ok(None);
            }
            TensorData::SparseCsr {
                values,
                crow_indices: Payload::Int64s(crow),
                col_indices: Payload::Int64s(col),
            }
        };
        Ok(Some(Tensor { dtype, shape, data }))
    }

    fn spans(
        &self,
        datum: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
        i: usize,
    ) -> PyResult<Vec<Part<'h, Span<'h>>>> {
        let py = datum.py();
        let spans = at(py, datum.getattr(name), || format!("datum {i}"))?;
        if spans.is_none() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (k, span) in at(py, spans.try_iter(), || format!("datum {i}, {name}"))?.enumerate() {
            let span = span.and_then(|span| self.span(&span));
            out.push(at(py, span, || format!("datum {i}, {name}[{k}]"))?);
        }
        Ok(out)
    }

    fn span(&self, span: &Bound<'py, PyAny>) -> PyResult<Part<'h, Span<'h>>> {
        let py = span.py();
        let sampled = is_a(span, &self.parts.sampled_span)?;
        let length = span.getattr(intern!(py, "length"))?;
        let sequence_id = span.getattr(intern!(py, "sequence_id"))?;
        let offset = span.getattr(intern!(py, "offset"))?;
        let sequence_id = sequence_id.cast::<PyString>().ok().and_then(|s| self.held.str(s));
        let fields = match (exact_int(&length), sequence_id, exact_int(&offset)) {
            (Some(length), Some(sequence_id), Some(offset)) => Some(Span {
                sampled,
                sequence_id,
                offset,
                length,
            }),
            _ => None,
        };
        self.or_tinkers(fields, &self.parts.span_bytes, span)
    }

    /// The message read, or tinker's own bytes of `obj`.
    fn or_tinkers<M>(
        &self,
        fields: Option<M>,
        encoder: &Bound<'py, PyAny>,
        obj: &Bound<'py, PyAny>,
    ) -> PyResult<Part<'h, M>> {
        match fields {
            Some(m) => Ok(Part::Fields(m)),
            None => Ok(Part::Encoded(
                self.held.bytes(encoder.call1((obj,))?.cast::<PyBytes>()?),
            )),
        }
    }

    /// A str field's UTF-8; of anything else, what protobuf stores (or raises).
    fn string(&self, message: &str, field: &str, value: Bound<'py, PyAny>) -> PyResult<&'h [u8]> {
        if let Some(utf8) = value.cast::<PyString>().ok().and_then(|s| self.held.str(s)) {
            return Ok(utf8);
        }
        let stored = self.stored(message, field, value)?;
        self.utf8(stored)
    }

    fn key(&self, key: &Bound<'py, PyAny>) -> PyResult<&'h [u8]> {
        if let Some(utf8) = key.cast::<PyString>().ok().and_then(|s| self.held.str(s)) {
            return Ok(utf8);
        }
        self.utf8(self.parts.map_key.call1((key,))?)
    }

    fn stored(&self, message: &str, field: &str, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.parts.stored.call1((message, field, value))
    }

    /// A str protobuf gave back.
    fn utf8(&self, s: Bound<'py, PyAny>) -> PyResult<&'h [u8]> {
        let s = s.cast_into::<PyString>()?;
        match self.held.str(&s) {
            Some(utf8) => Ok(utf8),
            None => Err(s.to_str().expect_err("a str without UTF-8")),
        }
    }
}

/// `err` again with `at` in front of its message, same class, caused by it.
/// One whose class cannot be made from a message alone (a
/// `UnicodeEncodeError`) gets the place as a note instead (PEP 678); a
/// `BaseException` that is no `Exception` (`KeyboardInterrupt`) goes up as
/// it is.
#[cold]
fn located(py: Python<'_>, err: PyErr, at: impl Display) -> PyErr {
    let class = err.get_type(py);
    let value = err.value(py);
    if !value.is_instance_of::<PyException>() {
        return err;
    }
    match class.call1((format!("{at}: {value}"),)) {
        Ok(new) if new.is_exact_instance(&class) => {
            let new = PyErr::from_value(new);
            new.set_cause(py, Some(err));
            new
        }
        _ => {
            // add_note fails only on a broken exception object, which then goes up unchanged
            let _ = value.call_method1(intern!(py, "add_note"), (format!("at {at}"),));
            err
        }
    }
}

fn at<T, D: Display>(py: Python<'_>, result: PyResult<T>, place: impl FnOnce() -> D) -> PyResult<T> {
    result.map_err(|e| located(py, e, place()))
}

/// `isinstance(obj, class)`, without a call for an object of that very class.
fn is_a(obj: &Bound<'_, PyAny>, class: &Bound<'_, PyType>) -> PyResult<bool> {
    if obj.get_type().is(class) {
        return Ok(true);
    }
    obj.is_instance(class)
}
