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

use std::borrow::Cow;

use crate::kl::{
    add_penalties, discounted_future_sum, masked_diff, post_diff, DiffSums, Penalty, PenaltyRow, Recurrence,
};
use crate::py::build::{direct, Column, Unwritten};
use crate::py::classes::Classes;
use crate::py::errors::guarded;
use crate::py::errors::{leave_to_cookbook, unsupported};
use crate::py::gc::GcPaused;
use crate::py::read::numbers::{Kind, Numbers, Slice, Value};
use crate::py::read::{exact_float, exact_int, type_name};
use crate::py::step::sequence;
use crate::torch_sum::{torch_sum, LANES};

/// One float input of a Datum (a loss input, or its scored logprobs), held
/// from when it is found until it is read: an array is looked at only in
/// [`Held::read`], while no Python code runs (so it is read once, and no
/// pointer into it outlives the read); a list's floats are copied when
/// found.
enum Held<'py> {
    Array { numbers: Numbers<'py>, role: Role },
    Copied(Vec<f32>),
}

#[derive(Clone, Copy)]
enum Role {
    /// A loss input; `floats`: its `TensorData` says float32 (an int64 one
    /// holds no floats).
    Loss { floats: bool },
    /// A response's `prompt_logprobs_np`: from position 1 on, a NaN being
    /// tinker's `None` (which torch refuses).
    Scored,
}

/// Values as torch's float32 tensor of them holds them (`.to(float32)`
/// rounding), and whether that tensor is contiguous (a strided one is
/// summed in another order).
struct Values<'a> {
    values: Cow<'a, [f32]>,
    contiguous: bool,
}

impl Held<'_> {
    /// How many values it holds (as found; [`Held::read`] checks it again).
    fn len(&self) -> usize {
        match self {
            Held::Array { numbers, role } => {
                let start = usize::from(matches!(role, Role::Scored) && numbers.len() > 0);
                numbers.len() - start
            }
            Held::Copied(values) => values.len(),
        }
    }

    /// Its values, or why they are the cookbook's to read.
    ///
    /// # Safety
    /// No Python code runs while the result lives (an array's memory is
    /// borrowed, and Python code could resize or free it).
    unsafe fn read(&self) -> Result<Values<'_>, &'static str> {
        let (numbers, role) = match self {
            Held::Copied(values) => {
                return Ok(Values {
                    values: Cow::Borrowed(values),
                    contiguous: true,
                })
            }
            Held::Array { numbers, role } => (numbers, *role),
        };
        // SAFETY: the caller's promise.
        let view = unsafe { numbers.view() }.ok_or("an array changed while it was read")?;
        let (start, no_nan) = match role {
            Role::Scored => (usize::from(view.len() > 0), true),
            Role::Loss { floats } => {
                if !floats && view.kind() == Kind::Float {
                    return Err("an int64 TensorData holds floats");
                }
                // `torch.from_numpy` refuses a negative stride; a repeated
                // element (stride 0) is the cookbook's too.
                if view.len() > 1 && view.stride() <= 0 {
                    return Err("a loss input has a stride torch refuses or repeats");
                }
                (0, false)
            }
        };
        let float32 = view.kind() == Kind::Float && view.width() == 4;
        let contiguous = !float32 || view.len() <= 1 || view.stride() == 4;
        if let Some(Slice::F32(values)) = view.slice() {
            let values = &values[start.min(values.len())..];
            if no_nan && values.iter().any(|v| v.is_nan()) {
                return Err("a scored position has no logprob");
            }
            return Ok(Values {
                values: Cow::Borrowed(values),
                contiguous,
            });
        }
        let mut out = Vec::with_capacity(view.len().saturating_sub(start));
        view.for_each(|i, v| {
            let v = match v {
                Value::Int(v) => v as f32,
                Value::Float(v) if !(no_nan && v.is_nan()) => v as f32,
                Value::Float(_) => return Err("a scored position has no logprob"),
                Value::Huge(_) => return Err("a tensor holds integers above 2**63"),
            };
            if i >= start {
                out.push(v);
            }
            Ok(())
        })?;
        Ok(Values {
            values: Cow::Owned(out),
            contiguous,
        })
    }
}

/// A loss input of datum `i` (`to_torch()`, then `.float()` or the float32
/// promotion the cookbook's arithmetic does). `float_only`: only a float32
/// `TensorData` (an int64 one would change the dtype of the cookbook's
/// arithmetic).
fn loss_input<'py>(
    inputs: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
    tensor_data: &Bound<'py, PyType>,
    float_only: bool,
    i: usize,
) -> PyResult<Held<'py>> {
    let py = inputs.py();
    let tensor = inputs
        .get_item(key)?
        .ok_or_else(|| unsupported(format!("datum {i}: loss_fn_inputs has no {key}")))?;
    if !tensor.get_type().is(tensor_data) || !tensor.getattr(intern!(py, "sparse_crow_indices"))?.is_none() {
        return Err(unsupported(format!("datum {i}: {key} is not a dense TensorData")));
    }
    let dtype = tensor.getattr(intern!(py, "dtype"))?;
    let floats = dtype.eq(intern!(py, "float32"))?;
    if !(floats || (!float_only && dtype.eq(intern!(py, "int64"))?)) {
        return Err(unsupported(format!("datum {i}: {key} has dtype {dtype}")));
    }
    let array = tensor.getattr(intern!(py, "_numpy"))?;
    match Numbers::of(&array)? {
        Some(Ok(numbers)) if floats || !matches!(numbers.kind(), Kind::Float) => Ok(Held::Array {
            numbers,
            role: Role::Loss { floats },
        }),
        _ => Err(unsupported(format!("datum {i}: {key} is not a 1-D array of numbers"))),
    }
}

/// A scored sequence's logprobs from position 1 on, as `torch.tensor(
/// logprobs[1:])` makes them a float32 tensor: of a list or tuple, exact
/// floats (and ints within 2**53, which it makes the same float32 values).
fn listed<'py>(logprobs: &Bound<'py, PyAny>, i: usize) -> PyResult<Held<'py>> {
    let items = sequence(logprobs, "prompt logprobs")?;
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
    Ok(Held::Copied(out))
}

/// What the cookbook's `torch.tensor(logprobs[1:])` reads of scoring
/// result `i`. Of tinker's `SampleResponse` (`responses`), its
/// `prompt_logprobs` without making the list: the list when one was made
/// or given, else the float32 array (a NaN there is a `None` in the list,
/// which torch refuses).
fn scored_logprobs<'py>(
    item: &Bound<'py, PyAny>,
    responses: bool,
    response_class: &Bound<'py, PyType>,
    i: usize,
) -> PyResult<Held<'py>> {
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
        Some(Ok(numbers)) => Ok(Held::Array {
            numbers,
            role: Role::Scored,
        }),
        _ => Err(unsupported(format!("datum {i}: the response has no prompt logprobs"))),
    }
}

/// One Datum's inputs, found (not yet read).
struct Found<'py> {
    inputs: Bound<'py, PyDict>,
    sampled: Held<'py>,
    mask: Held<'py>,
    advantages: Option<Held<'py>>,
    scored: Held<'py>,
    /// Positions.
    n: usize,
}

/// One Datum's values, read.
struct Read<'a> {
    sampled: Values<'a>,
    mask: Values<'a>,
    advantages: Option<Values<'a>>,
    scored: Values<'a>,
}

impl Found<'_> {
    /// Its values, all of `n` positions.
    ///
    /// # Safety
    /// No Python code runs while the result lives (see [`Held::read`]).
    unsafe fn read(&self, i: usize) -> PyResult<Read<'_>> {
        let why = |e: &str| unsupported(format!("datum {i}: {e}"));
        // SAFETY: the caller's promise, for all four.
        let read = unsafe {
            Read {
                sampled: self.sampled.read().map_err(why)?,
                mask: self.mask.read().map_err(why)?,
                advantages: self.advantages.as_ref().map(|a| a.read()).transpose().map_err(why)?,
                scored: self.scored.read().map_err(why)?,
            }
        };
        let n = self.n;
        let same = read.sampled.values.len() == n
            && read.mask.values.len() == n
            && read.scored.values.len() == n
            && read.advantages.as_ref().is_none_or(|a| a.values.len() == n);
        if !same {
            return Err(why("an array changed while it was read"));
        }
        Ok(read)
    }
}

/// Finds every Datum's `logprobs`, `mask` (and `advantages` when
/// `advantages`) with scoring result `i`; lengths must agree. Nothing is
/// read yet: see [`Found::read`].
fn find_all<'py>(
    data: &Bound<'py, PyAny>,
    scored: &Bound<'py, PyAny>,
    responses: bool,
    advantages: bool,
    classes: &Classes<'py>,
) -> PyResult<Vec<Found<'py>>> {
    let py = data.py();
    let (datum_class, tensor_data, response_class) = (&classes.datum, &classes.tensor_data, &classes.sample_response);
    let data = sequence(data, "data_D")?;
    let scored = sequence(scored, "scored logprobs")?;
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
            .map_err(|_| unsupported(format!("datum {i}: loss_fn_inputs is not a dict")))?
            .clone();
        let sampled = loss_input(&inputs, intern!(py, "logprobs"), tensor_data, true, i)?;
        let mask = loss_input(&inputs, intern!(py, "mask"), tensor_data, false, i)?;
        let advantages = if advantages {
            Some(loss_input(&inputs, intern!(py, "advantages"), tensor_data, false, i)?)
        } else {
            None
        };
        let scored = scored_logprobs(&scored.get(i)?, responses, response_class, i)?;
        let n = mask.len();
        if sampled.len() != n || scored.len() != n || advantages.as_ref().is_some_and(|a| a.len() != n) {
            return Err(unsupported(format!(
                "datum {i}: lengths differ (torch would broadcast or raise)"
            )));
        }
        out.push(Found {
            inputs,
            sampled,
            mask,
            advantages,
            scored,
            n,
        });
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

/// How torch sums a float32 tensor here (`cookbook/kl.py` finds it once):
/// `lanes` floats per vector, and `torch(array, contiguous) -> float`,
/// torch's own sum, for a tensor of `GRAIN_SIZE` elements or more (its
/// split depends on torch's threads).
#[pyclass(frozen, module = "tinker_rl_data._core")]
pub struct TorchSum {
    lanes: usize,
    torch: Py<PyAny>,
}

#[pymethods]
impl TorchSum {
    #[new]
    fn new(lanes: usize, torch: Py<PyAny>) -> Self {
        TorchSum { lanes, torch }
    }
}

impl TorchSum {
    /// torch's `Tensor.sum()` of `values` (as a contiguous tensor, or as a
    /// strided one).
    fn sum(&self, py: Python<'_>, values: &[f32], contiguous: bool) -> PyResult<f32> {
        if let Some(sum) = torch_sum(values, self.lanes, contiguous) {
            return Ok(sum);
        }
        let array = PyArray1::from_slice(py, values);
        let sum = self.torch.bind(py).call1((array, contiguous))?;
        // A float32 value as a Python float: exact.
        exact_float(&sum)
            .map(|v| v as f32)
            .ok_or_else(|| unsupported(format!("torch's sum is a {}", type_name(&sum))))
    }
}

/// The penalized advantages of every Datum (written back, each a new
/// float32 `TensorData`); the cookbook's float32 batch mean of the masked
/// differences, and their float32 sums and the mask sums per Datum.
/// `teacher`: distillation's penalty, `scored` being each teacher's
/// logprobs; else `rl.metrics`'s, `scored` being the base model's
/// responses. `gamma`: the discount, when `kl_discount_factor > 0`.
///
/// Each Datum's four inputs are read once, in one pass where no Python
/// code runs: its advantages into its new array, its masked differences
/// and its mask into one scratch buffer for the whole batch (the penalty
/// needs the batch mean of all Datums before it can be added).
fn penalize(
    data: &Bound<'_, PyAny>,
    scored: &Bound<'_, PyAny>,
    teacher: bool,
    coef: &Bound<'_, PyAny>,
    gamma: Option<&Bound<'_, PyAny>>,
    direct_build: bool,
    summing: &TorchSum,
) -> PyResult<(f32, Vec<f32>, Vec<f32>)> {
    let py = data.py();
    let classes = Classes::get(py)?;
    if !LANES.contains(&summing.lanes) {
        return Err(unsupported(format!(
            "torch's sum with {} lanes is not reproduced",
            summing.lanes
        )));
    }
    let coef = scalar(coef, "kl_penalty_coef")?;
    let gamma = gamma.map(|g| scalar(g, "kl_discount_factor")).transpose()?;
    let paused = GcPaused::new(py);
    let found = find_all(data, scored, !teacher, true, &classes)?;
    if found.is_empty() {
        return Err(unsupported("no Datums (the cookbook divides 0 by 0)".into()));
    }
    let mut columns: Vec<Unwritten<'_, f32>> = found.iter().map(|f| Unwritten::new(py, f.n)).collect();
    // Per Datum: `(sampled - scored) * mask` then `mask`, back to back.
    let mut scratch: Vec<f32> = Vec::with_capacity(2 * found.iter().map(|f| f.n).sum::<usize>());
    let mut contiguous_masks = Vec::with_capacity(found.len());
    for (i, (f, column)) in found.iter().zip(&mut columns).enumerate() {
        // SAFETY: no Python code runs until `read` is dropped at the end of
        // this iteration: only Rust arithmetic and copies into memory this
        // code owns.
        let read = unsafe { f.read(i) }?;
        let (s, b, m) = (&read.sampled.values, &read.scored.values, &read.mask.values);
        scratch.extend((0..f.n).map(|k| masked_diff(s[k], b[k], m[k])));
        scratch.extend_from_slice(m);
        contiguous_masks.push(read.mask.contiguous);
        let advantages = read.advantages.as_ref().expect("found with advantages");
        for (slot, &a) in column.slots().iter_mut().zip(advantages.values.iter()) {
            slot.write(a);
        }
    }
    // SAFETY: each column's `n` elements were written just above.
    let mut columns: Vec<Column<'_, f32>> = columns.into_iter().map(|c| unsafe { c.assume_written() }).collect();
    // Per Datum: `((sampled - scored) * mask).sum()` (a new, contiguous
    // tensor) and `mask.sum()`; then Python's `sum` of each, in order.
    let mut sums = DiffSums::default();
    let (mut diff_sums, mut mask_sums) = (Vec::with_capacity(found.len()), Vec::with_capacity(found.len()));
    for ((diffs, mask), &contiguous) in per_datum(&scratch, &found).zip(&contiguous_masks) {
        let (diff, mask) = (summing.sum(py, diffs, true)?, summing.sum(py, mask, contiguous)?);
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
    let mut rows: Vec<PenaltyRow<'_>> = per_datum(&scratch, &found)
        .zip(&mut columns)
        .map(|((diffs, mask), column)| PenaltyRow {
            advantages: column.slice_mut(),
            diffs,
            mask,
        })
        .collect();
    add_penalties(&mut rows, penalty, gamma);
    drop(rows);
    drop(paused);
    let tensor_data = &classes.tensor_data;
    let float32 = intern!(py, "float32");
    for (f, column) in found.iter().zip(columns) {
        let array = column.into_array().into_any();
        let tensor = if direct_build {
            direct::tensor(tensor_data, float32, &array, f.n)?
        } else {
            tensor_data.call_method1(intern!(py, "from_numpy"), (array,))?
        };
        f.inputs.set_item(intern!(py, "advantages"), tensor)?;
    }
    Ok((sums.mean(), diff_sums, mask_sums))
}

/// Each Datum's masked differences and mask in `scratch` (laid out back
/// to back, Datum after Datum, by [`penalize`]).
fn per_datum<'s>(scratch: &'s [f32], found: &'s [Found<'_>]) -> impl Iterator<Item = (&'s [f32], &'s [f32])> + 's {
    let mut rest = scratch;
    found.iter().map(move |f| {
        let (datum, tail) = rest.split_at(2 * f.n);
        rest = tail;
        datum.split_at(f.n)
    })
}

/// `incorporate_kl_penalty`'s pass after the scoring calls (see
/// [`penalize`]); `summing`: how torch sums here. Unsupported input is
/// left unwritten.
#[pyfunction(name = "kl_penalty")]
#[pyo3(signature = (data, scored, *, teacher, coef, gamma, direct, summing))]
pub fn py_kl_penalty<'py>(
    data: &Bound<'py, PyAny>,
    scored: &Bound<'py, PyAny>,
    teacher: bool,
    coef: &Bound<'py, PyAny>,
    gamma: Option<Bound<'py, PyAny>>,
    direct: bool,
    summing: &Bound<'py, TorchSum>,
) -> PyResult<(f32, Vec<f32>, Vec<f32>)> {
    guarded(|| {
        penalize(data, scored, teacher, coef, gamma.as_ref(), direct, summing.get())
            .map_err(|e| leave_to_cookbook(data.py(), e))
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

/// `compute_post_kl`'s flat differences: of every Datum in order, its
/// `logprobs - scored` where its mask is > 0 (the cookbook's
/// `torch.cat([(prev - new)[mask > 0], ...])`), as a float32 array, for
/// torch's own `mean()`.
#[pyfunction(name = "post_kl_diffs")]
pub fn py_post_kl_diffs<'py>(
    data: &Bound<'py, PyAny>,
    scored: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    guarded(|| {
        let run = || {
            let py = data.py();
            let classes = Classes::get(py)?;
            let _paused = GcPaused::new(py);
            let found = find_all(data, scored, true, false, &classes)?;
            if found.is_empty() {
                return Err(unsupported("no Datums (torch.cat of nothing raises)".into()));
            }
            let mut flat = Vec::new();
            for (i, f) in found.iter().enumerate() {
                // SAFETY: no Python code runs until `read` is dropped at
                // the end of this iteration (Rust arithmetic only).
                let read = unsafe { f.read(i) }?;
                let (s, b, m) = (&read.sampled.values, &read.scored.values, &read.mask.values);
                flat.extend((0..f.n).filter(|&k| m[k] > 0.0).map(|k| post_diff(s[k], b[k])));
            }
            Ok(PyArray1::from_vec(py, flat))
        };
        run().map_err(|e| leave_to_cookbook(data.py(), e))
    })
}

/// `_full_sequence_inputs`: each Datum's model input with its last target
/// token appended, as `ModelInput.append_int` makes it (built directly
/// when `direct`, else by `append_int` itself).
#[pyfunction(name = "full_sequence_inputs")]
#[pyo3(signature = (data, *, direct))]
pub fn py_full_sequence_inputs<'py>(data: &Bound<'py, PyAny>, direct: bool) -> PyResult<Bound<'py, PyList>> {
    guarded(|| full_sequence_inputs(data, direct).map_err(|e| leave_to_cookbook(data.py(), e)))
}

fn full_sequence_inputs<'py>(data: &Bound<'py, PyAny>, direct_build: bool) -> PyResult<Bound<'py, PyList>> {
    let py = data.py();
    let classes = Classes::get(py)?;
    let (datum_class, model_input_class, chunk_class, tensor_data) = (
        &classes.datum,
        &classes.model_input,
        &classes.text_chunk,
        &classes.tensor_data,
    );
    // Four new objects per Datum: without the pause, young collections
    // would walk them again and again.
    let _paused = GcPaused::new(py);
    let data = sequence(data, "data_D")?;
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
        let g =
            exact_float(gamma).ok_or_else(|| unsupported(format!("gamma is a {}, not a float", type_name(gamma))))?;
        if let Ok(a) = x.cast::<PyArray1<f32>>() {
            return discounted(a, g as f32);
        }
        if let Ok(a) = x.cast::<PyArray1<f64>>() {
            return discounted(a, g);
        }
        Err(unsupported(format!("x is a {}, not a 1-D float array", type_name(x))))
    })
}

fn discounted<'py, T: Recurrence + numpy::Element>(
    x: &Bound<'py, PyArray1<T>>,
    gamma: T,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let x = x.readonly();
    let x = x.as_slice().map_err(|_| unsupported("x is not contiguous".into()))?;
    let mut out = Column::<T>::zeros(py, x.len());
    discounted_future_sum(x, gamma, out.slice_mut());
    Ok(out.into_array().into_any())
}
