//! tinker-cookbook's KL penalty passes (`rl.metrics.incorporate_kl_penalty`,
//! `compute_post_kl`, `_full_sequence_inputs`,
//! `discounted_future_sum_vectorized`; distillation's
//! `incorporate_kl_penalty`) over the Datums' own buffers and the scoring
//! responses' arrays. The arithmetic is `crate::kl`.
//!
//! Only what the cookbook's torch code would read exactly is read: tinker's
//! own classes, dense tensors, scored logprobs that `torch.tensor` makes a
//! float32 tensor of, equal lengths. Anything else is [`Unsupported`] and
//! nothing has been written: the Python layer runs the cookbook's function.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyType};

use crate::kl::{discounted_future_sum, masked_diff, penalized_advantages, DiffSums, Penalty, PostKlSums};
use crate::py::build::direct;
use crate::py::errors::guarded;
use crate::py::gc::GcPaused;
use crate::py::read::numbers::{Kind, Numbers, Slice, Value};
use crate::py::read::{exact_float, exact_int, type_name};
use crate::py::step::{leave_to_cookbook as left, sequence as exact_items, unsupported};
use crate::torch_sum::{torch_sum, LANES};

/// `(Datum, ModelInput, EncodedTextChunk, TensorData, SampleResponse)`.
pub type KlClasses<'py> = (
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
);

/// float32 values, copied out of the memory they were read from (no
/// pointer into an array is kept while other user objects are read).
struct F32s {
    values: Vec<f32>,
    /// The array's stride in bytes.
    stride: isize,
    /// Whether it is float32: `torch.from_numpy` makes a tensor of its
    /// memory, as strided; of any other a conversion makes a new one.
    float32: bool,
}

impl F32s {
    fn new(values: Vec<f32>) -> F32s {
        F32s {
            values,
            stride: 4,
            float32: false,
        }
    }

    fn slice(&self) -> &[f32] {
        &self.values
    }

    /// Whether torch's float32 tensor of these values is contiguous (a
    /// strided one is summed in another order).
    fn contiguous(&self) -> bool {
        !self.float32 || self.values.len() <= 1 || self.stride == 4
    }

    /// Elements `start..` of a buffer as float32, as torch's `.to(float32)`
    /// rounds them; `None` at a NaN when `no_nan` (tinker's `None`), at an
    /// unsigned value above `i64::MAX`, or if user code changed the array.
    fn of_buffer(numbers: &Numbers<'_>, start: usize, no_nan: bool) -> Option<F32s> {
        // SAFETY: only copies run while the view lives; no Python code.
        let view = unsafe { numbers.view() }?;
        let (stride, float32) = (view.stride(), view.kind() == Kind::Float && view.width() == 4);
        if let Some(Slice::F32(values)) = view.slice() {
            let values = &values[start.min(values.len())..];
            if no_nan && values.iter().any(|v| v.is_nan()) {
                return None;
            }
            return Some(F32s {
                values: values.to_vec(),
                stride,
                float32,
            });
        }
        let mut out = Vec::with_capacity(view.len().saturating_sub(start));
        view.for_each(|i, v| {
            let v = match v {
                Value::Int(v) => v as f32,
                Value::Float(v) if !(no_nan && v.is_nan()) => v as f32,
                _ => return Err(()),
            };
            if i >= start {
                out.push(v);
            }
            Ok(())
        })
        .ok()?;
        Some(F32s {
            values: out,
            stride,
            float32,
        })
    }
}

/// A loss input of datum `i` as float32 (`to_torch()`, then `.float()` or
/// the float32 promotion the cookbook's arithmetic does). `float_only`:
/// only a float32 `TensorData` (an int64 one would change the dtype of the
/// cookbook's arithmetic).
fn loss_input(
    inputs: &Bound<'_, PyDict>,
    key: &Bound<'_, PyString>,
    tensor_data: &Bound<'_, PyType>,
    float_only: bool,
    i: usize,
) -> PyResult<F32s> {
    let py = inputs.py();
    let tensor = inputs
        .get_item(key)?
        .ok_or_else(|| unsupported(format!("datum {i}: loss_fn_inputs has no {key}")))?;
    if !tensor.get_type().is(tensor_data) || !tensor.getattr(intern!(py, "sparse_crow_indices"))?.is_none() {
        return Err(unsupported(format!("datum {i}: {key} is not a dense TensorData")));
    }
    let dtype = tensor.getattr(intern!(py, "dtype"))?;
    let float = dtype.eq(intern!(py, "float32"))?;
    if !(float || (!float_only && dtype.eq(intern!(py, "int64"))?)) {
        return Err(unsupported(format!("datum {i}: {key} has dtype {dtype}")));
    }
    let array = tensor.getattr(intern!(py, "_numpy"))?;
    let numbers = match Numbers::of(&array)? {
        Some(Ok(b)) if float || !matches!(b.kind(), Kind::Float) => b,
        _ => return Err(unsupported(format!("datum {i}: {key} is not a 1-D array of numbers"))),
    };
    let values = F32s::of_buffer(&numbers, 0, false)
        .ok_or_else(|| unsupported(format!("datum {i}: {key} holds huge integers")))?;
    // `torch.from_numpy` refuses a negative stride; a repeated element
    // (stride 0) is the cookbook's too.
    if values.slice().len() > 1 && values.stride <= 0 {
        return Err(unsupported(format!("datum {i}: {key} has stride {}", values.stride)));
    }
    Ok(values)
}

/// A scored sequence's logprobs from position 1 on, as `torch.tensor(
/// logprobs[1:])` makes them a float32 tensor: of a list or tuple, exact
/// floats (and ints within 2**53, which it makes the same float32 values).
fn listed(logprobs: &Bound<'_, PyAny>, i: usize) -> PyResult<F32s> {
    let items = exact_items(logprobs, "prompt logprobs")?;
    let mut out = Vec::with_capacity(items.len().saturating_sub(1));
    for k in 1..items.len() {
        let item = items.get(k)?;
        let v = exact_float(&item).or_else(|| {
            exact_int(&item)
                .filter(|v| v.unsigned_abs() <= 1 << 53)
                .map(|v| v as f64)
        });
        match v {
            Some(v) => out.push(v as f32),
            None => {
                return Err(unsupported(format!(
                    "datum {i}: prompt logprob {k} is a {}, not a float",
                    type_name(&item)
                )))
            }
        }
    }
    Ok(F32s::new(out))
}

/// What the cookbook's `torch.tensor(logprobs[1:])` reads of scoring
/// result `i`. Of tinker's `SampleResponse` (`responses`), its
/// `prompt_logprobs` without making the list: the list when one was made
/// or given, else the float32 array (a NaN there is a `None` in the list,
/// which torch refuses).
fn scored_logprobs(
    item: &Bound<'_, PyAny>,
    responses: bool,
    response_class: &Bound<'_, PyType>,
    i: usize,
) -> PyResult<F32s> {
    let py = item.py();
    if !responses {
        return listed(item, i);
    }
    if !item.get_type().is(response_class) {
        return listed(&item.getattr(intern!(py, "prompt_logprobs"))?, i);
    }
    let cached = item.getattr(intern!(py, "__dict__"))?;
    if let Some(list) = cached.cast::<PyDict>()?.get_item(intern!(py, "prompt_logprobs"))? {
        return listed(&list, i);
    }
    let given = item.getattr(intern!(py, "_prompt_logprobs_list"))?;
    if !given.is_none() {
        return listed(&given, i);
    }
    let array = item.getattr(intern!(py, "prompt_logprobs_np"))?;
    match Numbers::of(&array)? {
        Some(Ok(numbers)) => {
            let start = usize::from(numbers.len() > 0);
            F32s::of_buffer(&numbers, start, true)
                .ok_or_else(|| unsupported(format!("datum {i}: a scored position has no logprob")))
        }
        _ => Err(unsupported(format!("datum {i}: the response has no prompt logprobs"))),
    }
}

/// One Datum's tensors, read.
struct Read {
    inputs: Option<Py<PyDict>>,
    sampled: F32s,
    mask: F32s,
    advantages: Option<F32s>,
    scored: F32s,
}

/// Reads every Datum's `logprobs`, `mask` (and `advantages` when
/// `advantages`) with scoring result `i`; lengths must agree.
fn read_all(
    data: &Bound<'_, PyAny>,
    scored: &Bound<'_, PyAny>,
    responses: bool,
    advantages: bool,
    classes: &KlClasses<'_>,
) -> PyResult<Vec<Read>> {
    let py = data.py();
    let (datum_class, _, _, tensor_data, response_class) = classes;
    let data = exact_items(data, "data_D")?;
    let scored = exact_items(scored, "scored logprobs")?;
    if data.len() != scored.len() {
        return Err(unsupported(format!(
            "{} Datums, {} scoring results",
            data.len(),
            scored.len()
        )));
    }
    let mut out = Vec::with_capacity(data.len());
    for i in 0..data.len() {
        let datum = data.get(i)?;
        if !datum.get_type().is(datum_class) {
            return Err(unsupported(format!("datum {i} is a {}", type_name(&datum))));
        }
        let inputs = datum.getattr(intern!(py, "loss_fn_inputs"))?;
        let inputs = inputs
            .cast_exact::<PyDict>()
            .map_err(|_| unsupported(format!("datum {i}: loss_fn_inputs is not a dict")))?;
        let read = Read {
            sampled: loss_input(inputs, intern!(py, "logprobs"), tensor_data, true, i)?,
            mask: loss_input(inputs, intern!(py, "mask"), tensor_data, false, i)?,
            advantages: if advantages {
                Some(loss_input(inputs, intern!(py, "advantages"), tensor_data, false, i)?)
            } else {
                None
            },
            scored: scored_logprobs(&scored.get(i)?, responses, response_class, i)?,
            inputs: advantages.then(|| inputs.clone().unbind()),
        };
        let n = read.mask.slice().len();
        let same = read.sampled.slice().len() == n
            && read.scored.slice().len() == n
            && read.advantages.as_ref().is_none_or(|a| a.slice().len() == n);
        if !same {
            return Err(unsupported(format!(
                "datum {i}: lengths differ (torch would broadcast or raise)"
            )));
        }
        out.push(read);
    }
    Ok(out)
}

/// A Python float or int as the float32 scalar torch multiplies a float32
/// tensor by; finite.
fn scalar(value: &Bound<'_, PyAny>, what: &str) -> PyResult<f32> {
    let v = exact_float(value).or_else(|| {
        exact_int(value)
            .filter(|v| v.unsigned_abs() <= 1 << 24)
            .map(|v| v as f64)
    });
    match v.map(|v| v as f32) {
        Some(v) if v.is_finite() => Ok(v),
        _ => Err(unsupported(format!(
            "{what} is not a float32-finite float or small int"
        ))),
    }
}

/// How torch sums a float32 tensor here: `lanes` floats per vector, and
/// `torch(array, contiguous) -> float`, torch's own sum, for a tensor of
/// `GRAIN_SIZE` elements or more (its split depends on torch's threads).
struct Summing<'a, 'py> {
    lanes: usize,
    torch: &'a Bound<'py, PyAny>,
}

impl Summing<'_, '_> {
    /// torch's `Tensor.sum()` of `values` (as a contiguous tensor, or as a
    /// strided one).
    fn sum(&self, values: &[f32], contiguous: bool) -> PyResult<f32> {
        if let Some(sum) = torch_sum(values, self.lanes, contiguous) {
            return Ok(sum);
        }
        let py = self.torch.py();
        let array = PyArray1::from_slice(py, values);
        let sum = self.torch.call1((array, contiguous))?;
        // A float32 value as a Python float: exact.
        exact_float(&sum)
            .map(|v| v as f32)
            .ok_or_else(|| unsupported(format!("torch's sum is a {}", type_name(&sum))))
    }
}

/// The penalized advantages of every Datum (written back, each a new
/// float32 `TensorData`); the cookbook's float32 batch mean of the masked
/// differences, and their float32 sums and the mask sums per Datum.
/// `teacher`: distillation's penalty, else `rl.metrics`'s. `gamma`: the
/// discount, when `kl_discount_factor > 0`.
#[allow(clippy::too_many_arguments)]
fn penalize(
    data: &Bound<'_, PyAny>,
    scored: &Bound<'_, PyAny>,
    responses: bool,
    teacher: bool,
    coef: &Bound<'_, PyAny>,
    gamma: Option<&Bound<'_, PyAny>>,
    classes: &KlClasses<'_>,
    direct_build: bool,
    summing: &Summing<'_, '_>,
) -> PyResult<(f32, Vec<f32>, Vec<f32>)> {
    let py = data.py();
    if !LANES.contains(&summing.lanes) {
        return Err(unsupported(format!(
            "torch's sum with {} lanes is not reproduced",
            summing.lanes
        )));
    }
    let coef = scalar(coef, "kl_penalty_coef")?;
    let gamma = gamma.map(|g| scalar(g, "kl_discount_factor")).transpose()?;
    let paused = GcPaused::new(py);
    let read = read_all(data, scored, responses, true, classes)?;
    if read.is_empty() {
        return Err(unsupported("no Datums (the cookbook divides 0 by 0)".into()));
    }
    // Per Datum: `((sampled - scored) * mask).sum()` (a new, contiguous
    // tensor) and `mask.sum()`; then Python's `sum` of each, in order.
    let mut sums = DiffSums::default();
    let (mut diff_sums, mut mask_sums) = (Vec::with_capacity(read.len()), Vec::with_capacity(read.len()));
    let mut diffs = Vec::new();
    for r in &read {
        let (s, b, m) = (r.sampled.slice(), r.scored.slice(), r.mask.slice());
        diffs.clear();
        diffs.extend((0..m.len()).map(|k| masked_diff(s[k], b[k], m[k])));
        let (diff, mask) = (summing.sum(&diffs, true)?, summing.sum(m, r.mask.contiguous())?);
        sums.add(diff, mask);
        diff_sums.push(diff);
        mask_sums.push(mask);
    }
    let penalty = if teacher {
        // `-kl_penalty_coef` in Python, then rounded: negation is exact.
        Penalty::Teacher { neg_coef: -coef }
    } else {
        Penalty::Base { coef, avg: sums.mean() }
    };
    let mut new = Vec::with_capacity(read.len());
    for r in &read {
        let advantages = r.advantages.as_ref().expect("read with advantages");
        let mut out = vec![0.0f32; r.mask.slice().len()];
        penalized_advantages(
            advantages.slice(),
            r.sampled.slice(),
            r.scored.slice(),
            r.mask.slice(),
            penalty,
            gamma,
            &mut out,
        );
        new.push(out);
    }
    let inputs: Vec<Py<PyDict>> = read.into_iter().filter_map(|r| r.inputs).collect();
    drop(paused);
    let (_, _, _, tensor_data, _) = classes;
    let float32 = intern!(py, "float32");
    let mut tensors = Vec::with_capacity(new.len());
    for values in new {
        let n = values.len();
        let array = PyArray1::from_vec(py, values).into_any();
        tensors.push(if direct_build {
            direct::tensor(tensor_data, float32, &array, n)?
        } else {
            tensor_data.call_method1(intern!(py, "from_numpy"), (array,))?
        });
    }
    for (dict, tensor) in inputs.iter().zip(tensors) {
        dict.bind(py).set_item(intern!(py, "advantages"), tensor)?;
    }
    Ok((sums.mean(), diff_sums, mask_sums))
}

/// `incorporate_kl_penalty`'s pass after the scoring calls (see
/// [`penalize`]); `lanes` and `torch_sum` say how torch sums (see
/// [`Summing`]). Unsupported input is left unwritten.
#[pyfunction(name = "kl_penalty")]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (data, scored, responses, teacher, coef, gamma, classes, direct, lanes, torch_sum))]
pub fn py_kl_penalty<'py>(
    data: &Bound<'py, PyAny>,
    scored: &Bound<'py, PyAny>,
    responses: bool,
    teacher: bool,
    coef: &Bound<'py, PyAny>,
    gamma: Option<Bound<'py, PyAny>>,
    classes: KlClasses<'py>,
    direct: bool,
    lanes: usize,
    torch_sum: &Bound<'py, PyAny>,
) -> PyResult<(f32, Vec<f32>, Vec<f32>)> {
    guarded(|| {
        let summing = Summing {
            lanes,
            torch: torch_sum,
        };
        penalize(
            data,
            scored,
            responses,
            teacher,
            coef,
            gamma.as_ref(),
            &classes,
            direct,
            &summing,
        )
        .map_err(|e| left(data.py(), e))
    })
}

/// torch's CPU `Tensor.sum()` of the float32 tensor of `x` (contiguous
/// when `contiguous`, else strided) with `lanes` floats per vector; `None`
/// for `GRAIN_SIZE` elements or more, or a width not reproduced.
#[pyfunction(name = "torch_sum")]
pub fn py_torch_sum(x: &Bound<'_, PyAny>, lanes: usize, contiguous: bool) -> PyResult<Option<f32>> {
    guarded(|| {
        let a = x
            .cast::<PyArray1<f32>>()
            .map_err(|_| unsupported(format!("x is a {}, not a 1-D float32 array", type_name(x))))?;
        let x = a.readonly();
        let x = x.as_slice().map_err(|_| unsupported("x is not contiguous".into()))?;
        Ok(torch_sum(x, lanes, contiguous))
    })
}

/// `compute_post_kl`'s `(kl_pre_post_v1, kl_pre_post_v2)` from the scoring
/// responses, summed in float64.
#[pyfunction(name = "post_kl")]
pub fn py_post_kl<'py>(
    data: &Bound<'py, PyAny>,
    scored: &Bound<'py, PyAny>,
    classes: KlClasses<'py>,
) -> PyResult<(f64, f64)> {
    guarded(|| {
        let run = || {
            let _paused = GcPaused::new(data.py());
            let read = read_all(data, scored, true, false, &classes)?;
            if read.is_empty() {
                return Err(unsupported("no Datums (torch.cat of nothing raises)".into()));
            }
            let mut sums = PostKlSums::default();
            for r in &read {
                sums.add(r.sampled.slice(), r.scored.slice(), r.mask.slice());
            }
            Ok(sums.metrics())
        };
        run().map_err(|e| left(data.py(), e))
    })
}

/// `_full_sequence_inputs`: each Datum's model input with its last target
/// token appended, as `ModelInput.append_int` makes it (built directly
/// when `direct`, else by `append_int` itself).
#[pyfunction(name = "full_sequence_inputs")]
pub fn py_full_sequence_inputs<'py>(
    data: &Bound<'py, PyAny>,
    classes: KlClasses<'py>,
    direct: bool,
) -> PyResult<Bound<'py, PyList>> {
    guarded(|| full_sequence_inputs(data, &classes, direct).map_err(|e| left(data.py(), e)))
}

fn full_sequence_inputs<'py>(
    data: &Bound<'py, PyAny>,
    classes: &KlClasses<'py>,
    direct_build: bool,
) -> PyResult<Bound<'py, PyList>> {
    let py = data.py();
    let (datum_class, model_input_class, chunk_class, tensor_data, _) = classes;
    let data = exact_items(data, "data_D")?;
    let out = PyList::empty(py);
    for i in 0..data.len() {
        let datum = data.get(i)?;
        if !datum.get_type().is(datum_class) {
            return Err(unsupported(format!("datum {i} is a {}", type_name(&datum))));
        }
        let inputs = datum.getattr(intern!(py, "loss_fn_inputs"))?;
        let targets = inputs
            .cast_exact::<PyDict>()
            .map_err(|_| unsupported(format!("datum {i}: loss_fn_inputs is not a dict")))?
            .get_item(intern!(py, "target_tokens"))?
            .ok_or_else(|| unsupported(format!("datum {i}: no target_tokens")))?;
        let dense = targets.get_type().is(tensor_data)
            && targets.getattr(intern!(py, "sparse_crow_indices"))?.is_none()
            && targets.getattr(intern!(py, "dtype"))?.eq(intern!(py, "int64"))?;
        let array = targets.getattr(intern!(py, "_numpy"))?;
        let last = match Numbers::of(&array)? {
            // SAFETY: one element read, no Python code, while the view lives.
            Some(Ok(b)) if dense && b.len() > 0 => unsafe { b.view() }.and_then(|v| v.get(v.len() - 1)),
            _ => None,
        };
        let Some(Value::Int(token)) = last else {
            return Err(unsupported(format!(
                "datum {i}: target_tokens is not a non-empty 1-D int64 array"
            )));
        };
        let model_input = datum.getattr(intern!(py, "model_input"))?;
        let chunks = if direct_build && model_input.get_type().is(model_input_class) {
            Some(model_input.getattr(intern!(py, "chunks"))?)
        } else {
            None
        };
        let sequence = match chunks {
            // `self.chunks + [EncodedTextChunk(tokens=[token])]`: the same
            // chunk objects, in a new list.
            Some(chunks) if chunks.is_exact_instance_of::<PyList>() => {
                let tokens = PyList::new(py, [token])?;
                let all = PyList::new(py, chunks.cast::<PyList>()?.iter())?;
                all.append(direct::text_chunk(chunk_class, tokens.as_any())?)?;
                direct::model_input(model_input_class, &all)?
            }
            _ => model_input.call_method1(intern!(py, "append_int"), (token,))?,
        };
        out.append(sequence)?;
    }
    Ok(out)
}

/// `discounted_future_sum_vectorized` of a contiguous float32 or float64
/// array (torch keeps `x`'s dtype; `gamma` rounded to it).
#[pyfunction(name = "discounted_future_sum")]
pub fn py_discounted_future_sum<'py>(x: &Bound<'py, PyAny>, gamma: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    guarded(|| {
        let py = x.py();
        let g =
            exact_float(gamma).ok_or_else(|| unsupported(format!("gamma is a {}, not a float", type_name(gamma))))?;
        if let Ok(a) = x.cast::<PyArray1<f32>>() {
            let x = a.readonly();
            let x = x.as_slice().map_err(|_| unsupported("x is not contiguous".into()))?;
            let mut out = vec![0.0f32; x.len()];
            discounted_future_sum(x, g as f32, &mut out);
            return Ok(PyArray1::from_vec(py, out).into_any());
        }
        if let Ok(a) = x.cast::<PyArray1<f64>>() {
            let x = a.readonly();
            let x = x.as_slice().map_err(|_| unsupported("x is not contiguous".into()))?;
            let mut out = vec![0.0f64; x.len()];
            discounted_future_sum(x, g, &mut out);
            return Ok(PyArray1::from_vec(py, out).into_any());
        }
        Err(unsupported(format!("x is a {}, not a 1-D float array", type_name(x))))
    })
}
