//! A `tinker.types.SampleRequest` read for the JSON body tinker's
//! `AsyncSamplingResource.asample` posts (`crate::sample` writes it).
//!
//! Only what tinker's own validation makes is taken: instances of exactly
//! tinker's request, chunk and params classes, exact ints, floats, bools,
//! strs and bytes, token lists of exact ints. For anything else (a
//! subclass, a `model_construct`ed oddity, a NaN, a str without UTF-8) the
//! reader says `None` and the caller (`tinker_rl_data.sampling`) lets
//! tinker make the whole body, so its bytes and exceptions are tinker's.
//! Fields are written in each class's declaration order, `None` fields
//! left out (`exclude_none=True`); the Python side checks that tinker's
//! classes still declare exactly these fields before using this reader.
//!
//! Reading runs no Python code: attribute reads of fields held in the
//! instances' dicts, and ints read in place.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::errors::Location;
use crate::py::errors::guarded;
use crate::py::read::{ItemKind, Items};
use crate::sample::Json;

/// tinker's classes, by attribute (`tinker_rl_data.sampling` gathers them).
#[derive(FromPyObject)]
pub struct SampleParts<'py> {
    sample_request: Bound<'py, PyType>,
    model_input: Bound<'py, PyType>,
    encoded_text_chunk: Bound<'py, PyType>,
    image_chunk: Bound<'py, PyType>,
    image_asset_pointer_chunk: Bound<'py, PyType>,
    dmel_chunk: Bound<'py, PyType>,
    sampling_params: Bound<'py, PyType>,
    tensor_data: Bound<'py, PyType>,
}

/// What the reader does with a value it does not take: gives up on the
/// request (tinker makes the body).
type Taken = Option<()>;

/// The body of `request`, or `None` when tinker's code should make it.
#[pyfunction(name = "encode_sample_request")]
pub fn py_encode_sample_request<'py>(
    request: &Bound<'py, PyAny>,
    parts: SampleParts<'py>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    guarded(|| {
        let mut json = Json::with_capacity(256);
        let body = Writer {
            parts: &parts,
            json: &mut json,
        }
        .request(request)
        .map(|()| json.into_bytes());
        Ok(body.map(|b| PyBytes::new(request.py(), &b)))
    })
}

/// The JSON of a prompt (`ModelInput`) followed by that of its
/// `SamplingParams` (two objects, so the pair reads back one way): equal
/// for two `sample` calls exactly when their requests' bodies carry the
/// same prompt and parameters. `None` when either is something this reader
/// does not take.
#[pyfunction(name = "sample_prompt_key")]
pub fn py_sample_prompt_key<'py>(
    prompt: &Bound<'py, PyAny>,
    sampling_params: &Bound<'py, PyAny>,
    parts: SampleParts<'py>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    guarded(|| {
        let mut json = Json::with_capacity(256);
        let mut writer = Writer {
            parts: &parts,
            json: &mut json,
        };
        let key = writer
            .model_input(prompt)
            .and_then(|()| writer.sampling_params(sampling_params));
        Ok(key.map(|()| PyBytes::new(prompt.py(), &json.into_bytes())))
    })
}

struct Writer<'a, 'py> {
    parts: &'a SampleParts<'py>,
    json: &'a mut Json,
}

impl<'py> Writer<'_, 'py> {
    fn request(&mut self, r: &Bound<'py, PyAny>) -> Taken {
        let py = r.py();
        exactly(r, &self.parts.sample_request)?;
        self.json.begin_object();
        self.int_field(r, intern!(py, "num_samples"))?;
        self.json.key("prompt");
        self.model_input(&get(r, intern!(py, "prompt"))?)?;
        self.json.key("sampling_params");
        self.sampling_params(&get(r, intern!(py, "sampling_params"))?)?;
        self.opt_str_field(r, intern!(py, "base_model"))?;
        self.opt_str_field(r, intern!(py, "model_path"))?;
        self.opt_str_field(r, intern!(py, "sampling_session_id"))?;
        self.opt_int_field(r, intern!(py, "seq_id"))?;
        self.opt_bool_field(r, intern!(py, "prompt_logprobs"))?;
        self.int_field(r, intern!(py, "topk_prompt_logprobs"))?;
        self.int_field(r, intern!(py, "topk_sample_logprobs"))?;
        let target = get(r, intern!(py, "target_prompt_logprobs"))?;
        if !target.is_none() {
            self.json.key("target_prompt_logprobs");
            self.tensor_data(&target)?;
        }
        self.int_field(r, intern!(py, "prompt_alt_tokens_k"))?;
        self.opt_int_field(r, intern!(py, "prompt_logprobs_last_n"))?;
        self.opt_bool_field(r, intern!(py, "record_stability_info"))?;
        self.literal_field(r, intern!(py, "type"), "sample")?;
        self.json.end_object();
        Some(())
    }

    fn model_input(&mut self, m: &Bound<'py, PyAny>) -> Taken {
        let py = m.py();
        exactly(m, &self.parts.model_input)?;
        let chunks = get(m, intern!(py, "chunks"))?;
        let chunks = chunks.cast_exact::<PyList>().ok()?;
        self.json.begin_object();
        self.json.key("chunks");
        self.json.begin_array();
        // An index loop: the list is held, and nothing run here can change it.
        for i in 0..chunks.len() {
            self.chunk(&chunks.get_item(i).ok()?)?;
        }
        self.json.end_array();
        self.json.end_object();
        Some(())
    }

    fn chunk(&mut self, c: &Bound<'py, PyAny>) -> Taken {
        let py = c.py();
        let parts = self.parts;
        let class = c.get_type();
        self.json.begin_object();
        if class.is(&parts.encoded_text_chunk) {
            self.json.key("tokens");
            self.int_list(&get(c, intern!(py, "tokens"))?, true)?;
            self.literal_field(c, intern!(py, "type"), "encoded_text")?;
        } else if class.is(&parts.image_chunk) {
            self.bytes_field(c, intern!(py, "data"))?;
            self.str_field(c, intern!(py, "format"))?;
            self.opt_int_field(c, intern!(py, "expected_tokens"))?;
            self.literal_field(c, intern!(py, "type"), "image")?;
        } else if class.is(&parts.image_asset_pointer_chunk) {
            self.str_field(c, intern!(py, "format"))?;
            self.str_field(c, intern!(py, "location"))?;
            self.opt_int_field(c, intern!(py, "expected_tokens"))?;
            self.literal_field(c, intern!(py, "type"), "image_asset_pointer")?;
        } else if class.is(&parts.dmel_chunk) {
            self.bytes_field(c, intern!(py, "dmel"))?;
            self.literal_field(c, intern!(py, "type"), "dmel")?;
        } else {
            return None;
        }
        self.json.end_object();
        Some(())
    }

    fn sampling_params(&mut self, p: &Bound<'py, PyAny>) -> Taken {
        let py = p.py();
        exactly(p, &self.parts.sampling_params)?;
        self.json.begin_object();
        self.opt_int_field(p, intern!(py, "max_tokens"))?;
        self.opt_int_field(p, intern!(py, "seed"))?;
        let stop = get(p, intern!(py, "stop"))?;
        if !stop.is_none() {
            self.json.key("stop");
            self.stop(&stop)?;
        }
        self.float_field(p, intern!(py, "temperature"))?;
        self.int_field(p, intern!(py, "top_k"))?;
        self.float_field(p, intern!(py, "top_p"))?;
        self.json.end_object();
        Some(())
    }

    /// `Union[str, Sequence[str], Sequence[int]]`: a str, or a list or tuple
    /// all of strs or all of ints.
    fn stop(&mut self, stop: &Bound<'py, PyAny>) -> Taken {
        if let Ok(s) = stop.cast_exact::<PyString>() {
            self.json.string(s.to_str().ok()?);
            return Some(());
        }
        let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = stop.cast_exact::<PyList>() {
            list.iter().collect()
        } else {
            stop.cast_exact::<PyTuple>().ok()?.iter().collect()
        };
        self.json.begin_array();
        if items.first().is_some_and(Bound::is_exact_instance_of::<PyString>) {
            for s in &items {
                self.json.string(s.cast_exact::<PyString>().ok()?.to_str().ok()?);
            }
        } else {
            for v in &items {
                self.json.int(exact_int(v)?);
            }
        }
        self.json.end_array();
        Some(())
    }

    /// tinker's JSON `TensorData`: `data` all ints or all floats, as
    /// validation leaves `Union[List[int], List[float]]`.
    fn tensor_data(&mut self, td: &Bound<'py, PyAny>) -> Taken {
        let py = td.py();
        exactly(td, &self.parts.tensor_data)?;
        let data = get(td, intern!(py, "data"))?;
        let data = data.cast_exact::<PyList>().ok()?;
        self.json.begin_object();
        self.json.key("data");
        if data.get_item(0).is_ok_and(|v| v.is_exact_instance_of::<PyFloat>()) {
            self.json.begin_array();
            for v in data.iter() {
                if !self.json.float(v.cast_exact::<PyFloat>().ok()?.value()) {
                    return None;
                }
            }
            self.json.end_array();
        } else {
            self.int_list(data.as_any(), false)?;
        }
        let dtype = get(td, intern!(py, "dtype"))?;
        let dtype = dtype.cast_exact::<PyString>().ok()?.to_str().ok()?;
        if !matches!(dtype, "int64" | "float32") {
            return None;
        }
        self.json.key("dtype");
        self.json.string(dtype);
        for name in [
            intern!(py, "shape"),
            intern!(py, "sparse_crow_indices"),
            intern!(py, "sparse_col_indices"),
        ] {
            let v = get(td, name)?;
            if !v.is_none() {
                self.json.key(name.to_str().ok()?);
                v.cast_exact::<PyList>().ok()?;
                self.int_list(&v, false)?;
            }
        }
        self.json.end_object();
        Some(())
    }

    /// A list (or, for `Sequence[int]` fields, a tuple) of exact ints.
    fn int_list(&mut self, v: &Bound<'py, PyAny>, tuple_too: bool) -> Taken {
        let tuple = tuple_too && v.is_exact_instance_of::<PyTuple>();
        if !(tuple || v.is_exact_instance_of::<PyList>()) {
            return None;
        }
        let items = Items::of(v, "tokens", ItemKind::Token, Location::BATCH).ok()?;
        let mut ints: Vec<i32> = Vec::new();
        if items.read_exact_ints(&mut ints) {
            self.json.ints(&ints);
            return Some(());
        }
        // Past int32 (or a non-int, which gives up): one at a time.
        self.json.begin_array();
        for i in 0..items.len() {
            self.json.int(exact_int(&items.get(i).ok()?)?);
        }
        self.json.end_array();
        Some(())
    }

    fn int_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = exact_int(&get(obj, name)?)?;
        self.json.key(name.to_str().ok()?);
        self.json.int(v);
        Some(())
    }

    fn opt_int_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = get(obj, name)?;
        if v.is_none() {
            return Some(());
        }
        self.json.key(name.to_str().ok()?);
        self.json.int(exact_int(&v)?);
        Some(())
    }

    fn opt_bool_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = get(obj, name)?;
        if v.is_none() {
            return Some(());
        }
        let v = v.cast_exact::<PyBool>().ok()?.is_true();
        self.json.key(name.to_str().ok()?);
        self.json.bool(v);
        Some(())
    }

    /// A float field: an exact float, or an exact int (a default such as
    /// `temperature: float = 1`), which pydantic writes as a float.
    fn float_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = get(obj, name)?;
        let v = match v.cast_exact::<PyFloat>() {
            Ok(f) => f.value(),
            Err(_) => exact_int(&v)? as f64, // rounded to nearest, as float(int) rounds
        };
        self.json.key(name.to_str().ok()?);
        self.json.float(v).then_some(())
    }

    fn str_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = get(obj, name)?;
        let s = v.cast_exact::<PyString>().ok()?.to_str().ok()?;
        self.json.key(name.to_str().ok()?);
        self.json.string(s);
        Some(())
    }

    fn opt_str_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        if get(obj, name)?.is_none() {
            return Some(());
        }
        self.str_field(obj, name)
    }

    /// A `Literal[...]` field of one value: written only when it holds it.
    fn literal_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>, value: &str) -> Taken {
        let v = get(obj, name)?;
        if v.cast_exact::<PyString>().ok()?.to_str().ok()? != value {
            return None;
        }
        self.json.key(name.to_str().ok()?);
        self.json.string(value);
        Some(())
    }

    /// A `bytes` field, which tinker's field serializer writes as base64.
    fn bytes_field(&mut self, obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Taken {
        let v = get(obj, name)?;
        let data = v.cast_exact::<PyBytes>().ok()?.as_bytes();
        self.json.key(name.to_str().ok()?);
        self.json.base64(data);
        Some(())
    }
}

fn exactly(obj: &Bound<'_, PyAny>, class: &Bound<'_, PyType>) -> Taken {
    obj.get_type().is(class).then_some(())
}

/// A field's value; a missing one (a `model_construct` without it) gives up.
fn get<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    obj.getattr(name).ok()
}

/// The value of an exact `int` (not a bool) that fits in an i64.
fn exact_int(v: &Bound<'_, PyAny>) -> Option<i64> {
    v.cast_exact::<PyInt>().ok()?.extract::<i64>().ok()
}
