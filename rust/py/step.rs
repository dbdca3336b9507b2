//! The rest of tinker-cookbook's RL step around the data: the KL metrics of
//! a trained batch (`rl.metrics.compute_kl_sample_train`), the trajectory
//! metrics and token usage of a step's groups (`rl.metric_util.
//! compute_trajectory_metrics`, `rl.train.rollout_usage` /
//! `training_usage`), a Datum without its `mask` (`rl.train._remove_mask`).
//!
//! Each reads what the cookbook's function reads, once. An input it does
//! not read exactly (another type than the cookbook's, a case where the
//! cookbook raises) is an [`Unsupported`] exception, read no further: the
//! Python layer then runs the cookbook's own function, so that results and
//! exceptions are always the cookbook's. Only lists and tuples are read, so
//! an iterator is left unconsumed for it.

use numpy::PyUntypedArray;
use pyo3::exceptions::PyException;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple, PyType};

use crate::error::{Location, StepName};
use crate::metrics::{summarize, GroupStats, KeyedSums, KlSums, Number, Real, RewardSum, Summary};
use crate::py::build::direct::{dataclass, is_tracked, untrack_dict};
use crate::py::errors::guarded;
use crate::py::read::numbers::{array_view, Slice};
use crate::py::read::{exact_float, exact_int, type_name, Items};

pyo3::create_exception!(
    tinker_rl_data._core,
    Unsupported,
    PyException,
    "An input the native pass does not read exactly; the caller runs tinker-cookbook's own function instead."
);

#[cold]
fn unsupported(why: String) -> PyErr {
    Unsupported::new_err(why)
}

/// An exception raised while reading (a missing attribute, a property's
/// error) leaves the input to the cookbook's function, which raises its own
/// exception in its own order. What is not an `Exception`
/// (`KeyboardInterrupt`) goes up as it is.
fn leave_to_cookbook(py: Python<'_>, err: PyErr) -> PyErr {
    if err.is_instance_of::<Unsupported>(py) || !err.is_instance_of::<PyException>(py) {
        return err;
    }
    let left = unsupported(err.to_string());
    left.set_cause(py, Some(err));
    left
}

/// A list's or tuple's items. Anything else (an iterator the cookbook's
/// function would consume) is left to it unread.
fn items<'py>(obj: &Bound<'py, PyAny>, what: &'static str) -> PyResult<Items<'py>> {
    Items::of_exact_sequence(obj, what)
        .ok_or_else(|| unsupported(format!("{what} is a {}, not a list or tuple", type_name(obj))))
}

fn items_of<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>, what: &'static str) -> PyResult<Items<'py>> {
    items(&obj.getattr(name)?, what)
}

/// An exact `int` or a `bool` (what Python's `sum()` adds as ints).
fn int_value(obj: &Bound<'_, PyAny>) -> Option<i64> {
    exact_int(obj).or_else(|| obj.cast::<PyBool>().ok().map(|b| i64::from(b.is_true())))
}

/// A token count: an exact int below 2**32, so that no sum of them
/// overflows (Python's ints do not).
fn count(obj: &Bound<'_, PyAny>, at: Location, what: &str) -> PyResult<i64> {
    int_value(obj)
        .filter(|v| v.unsigned_abs() < 1 << 32)
        .ok_or_else(|| unsupported(format!("{at}: {what} is not an int below 2**32")))
}

/// An exact `float`, `int` or `bool`; not an int that a float cannot hold.
fn number(obj: &Bound<'_, PyAny>) -> Option<Number> {
    if let Some(v) = exact_float(obj) {
        return Some(Number::float(v));
    }
    int_value(obj)
        .filter(|v| v.unsigned_abs() <= 1 << 53)
        .map(|v| Number::int(v as f64))
}

/// tinker's classes whose instances are read by field, not by property.
pub type InputClasses<'py> = (Bound<'py, PyType>, Bound<'py, PyType>);

/// `model_input.length`: for tinker's `ModelInput`, the sum of its chunks'
/// lengths, a text chunk's read as `len(tokens)` (what its property
/// returns) and any other chunk's by its `length` property.
fn model_input_length(model_input: &Bound<'_, PyAny>, classes: &InputClasses<'_>, at: Location) -> PyResult<i64> {
    let py = model_input.py();
    let (model_input_class, text_chunk_class) = classes;
    if !model_input.get_type().is(model_input_class) {
        return count(
            &model_input.getattr(intern!(py, "length"))?,
            at,
            "a model input's length",
        );
    }
    let chunks = items_of(model_input, intern!(py, "chunks"), "chunks")?;
    let mut n = 0;
    for i in 0..chunks.len() {
        let chunk = chunks.get(i)?;
        n += if chunk.get_type().is(text_chunk_class) {
            chunk.getattr(intern!(py, "tokens"))?.len()? as i64
        } else {
            count(&chunk.getattr(intern!(py, "length"))?, at, "a chunk's length")?
        };
    }
    Ok(n)
}

/// What `rollout_usage` and the trajectory metrics count of a transition.
#[derive(Default)]
struct Counts {
    /// Action tokens.
    sampled: i64,
    /// Observation tokens.
    prompt: i64,
    /// Observation tokens the sampler billed as prefix-cache hits.
    cached: i64,
}

impl Counts {
    fn add_transition(
        &mut self,
        transition: &Bound<'_, PyAny>,
        classes: &InputClasses<'_>,
        at: Location,
    ) -> PyResult<()> {
        let py = transition.py();
        let ac = transition.getattr(intern!(py, "ac"))?;
        self.sampled += ac.getattr(intern!(py, "tokens"))?.len()? as i64;
        self.prompt += model_input_length(&transition.getattr(intern!(py, "ob"))?, classes, at)?;
        let cached = ac.getattr(intern!(py, "prompt_cache_hit_tokens"))?;
        self.cached += count(&cached, at, "prompt_cache_hit_tokens")?;
        Ok(())
    }
}

// --------------------------------------------------------------------------
// compute_kl_sample_train

/// A loss input's numpy array: a dense `TensorData`'s own, read as a field
/// where `_build` found tinker's layout (`tensor_data` given), else its
/// `to_numpy()` (which densifies a sparse one, as `to_torch()` does).
fn loss_input_array<'py>(
    tensor: &Bound<'py, PyAny>,
    tensor_data: Option<&Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = tensor.py();
    match tensor_data {
        Some(class) if tensor.get_type().is(class) && tensor.getattr(intern!(py, "sparse_crow_indices"))?.is_none() => {
            tensor.getattr(intern!(py, "_numpy"))
        }
        _ => tensor.call_method0(intern!(py, "to_numpy")),
    }
}

/// A training logprob tensor's numpy array: a torch tensor's `.numpy()`, a
/// view of its memory (for the CPU tensors without grad that tinker's
/// `to_torch()` makes; for others it raises, and the cookbook's function
/// runs). Anything but a plain `torch.Tensor` is the cookbook's: it indexes
/// a numpy array with a torch mask, for one, as numpy reads an index array.
fn training_array<'py>(
    tensor: &Bound<'py, PyAny>,
    torch_tensor: Option<&Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyAny>> {
    match torch_tensor {
        Some(class) if tensor.get_type().is(class) => tensor.call_method0(intern!(tensor.py(), "numpy")),
        _ => Err(unsupported(format!("a {}, not a torch.Tensor", type_name(tensor)))),
    }
}

/// Datum `i`'s loss input `key`, as a numpy array.
fn loss_input<'py>(
    inputs: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
    tensor_data: Option<&Bound<'py, PyType>>,
    i: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let tensor = inputs
        .get_item(key)?
        .ok_or_else(|| unsupported(format!("datum {i}: loss_fn_inputs has no {key}")))?;
    loss_input_array(&tensor, tensor_data)
}

fn add_datum(sums: &mut KlSums, sampling: &Slice<'_>, training: &Slice<'_>, mask: &Slice<'_>) -> bool {
    fn with_mask<S: Real, T: Real>(sums: &mut KlSums, s: &[S], t: &[T], mask: &Slice<'_>) -> bool {
        match mask {
            Slice::F32(m) => sums.add_datum(s, t, m),
            Slice::F64(m) => sums.add_datum(s, t, m),
            Slice::I64(m) => sums.add_datum(s, t, m),
            Slice::I32(_) => return false,
        }
        true
    }
    match (sampling, training) {
        (Slice::F32(s), Slice::F32(t)) => with_mask(sums, s, t, mask),
        (Slice::F32(s), Slice::F64(t)) => with_mask(sums, s, t, mask),
        (Slice::F64(s), Slice::F32(t)) => with_mask(sums, s, t, mask),
        (Slice::F64(s), Slice::F64(t)) => with_mask(sums, s, t, mask),
        // Integer logprobs: the cookbook's float32 promotion (and, when all
        // are integers, its failing mean) is left to it.
        _ => false,
    }
}

fn slice_len(slice: &Slice<'_>) -> usize {
    match slice {
        Slice::I32(v) => v.len(),
        Slice::I64(v) => v.len(),
        Slice::F32(v) => v.len(),
        Slice::F64(v) => v.len(),
    }
}

fn kl_sample_train<'py>(
    data: &Bound<'py, PyAny>,
    training_logprobs: &Bound<'py, PyAny>,
    tensor_data: Option<&Bound<'py, PyType>>,
    torch_tensor: Option<&Bound<'py, PyType>>,
) -> PyResult<(f64, f64, f64)> {
    let py = data.py();
    let data = items(data, "data_D")?;
    let training = items(training_logprobs, "training_logprobs_D")?;
    if data.len() != training.len() {
        return Err(unsupported(format!(
            "{} Datums and {} training logprob tensors (safezip raises)",
            data.len(),
            training.len()
        )));
    }
    let mut sums = KlSums::default();
    for i in 0..data.len() {
        let inputs = data.get(i)?.getattr(intern!(py, "loss_fn_inputs"))?;
        let inputs = inputs
            .cast_exact::<PyDict>()
            .map_err(|_| unsupported(format!("datum {i}: loss_fn_inputs is not a dict")))?;
        let sampling = loss_input(inputs, intern!(py, "logprobs"), tensor_data, i)?;
        let mask = loss_input(inputs, intern!(py, "mask"), tensor_data, i)?;
        let training = training_array(&training.get(i)?, torch_tensor)?;
        let arrays = (
            sampling.cast::<PyUntypedArray>(),
            training.cast::<PyUntypedArray>(),
            mask.cast::<PyUntypedArray>(),
        );
        let (Ok(s), Ok(t), Ok(m)) = arrays else {
            return Err(unsupported(format!("datum {i}: a tensor is not a numpy array")));
        };
        // SAFETY: no Python code runs from here to the end of the Datum's
        // sums (plain Rust over the slices; errors are made after).
        let views = unsafe { (array_view(s), array_view(t), array_view(m)) };
        let (Some(s), Some(t), Some(m)) = (
            views.0.as_ref().and_then(|v| v.slice()),
            views.1.as_ref().and_then(|v| v.slice()),
            views.2.as_ref().and_then(|v| v.slice()),
        ) else {
            return Err(unsupported(format!(
                "datum {i}: a tensor is not a contiguous 1-D float array"
            )));
        };
        let (ns, nt, nm) = (slice_len(&s), slice_len(&t), slice_len(&m));
        if ns != nm || nt != nm {
            return Err(unsupported(format!(
                "datum {i}: {ns} logprobs, {nt} training logprobs, {nm} mask values"
            )));
        }
        if !add_datum(&mut sums, &s, &t, &m) {
            return Err(unsupported(format!("datum {i}: integer logprobs")));
        }
    }
    let m = sums
        .metrics()
        .ok_or_else(|| unsupported("no position has mask > 0 (the cookbook's assert)".into()))?;
    Ok((m.v1, m.v2, m.entropy))
}

/// `compute_kl_sample_train`'s `(v1, v2, entropy)`, in one pass over the
/// Datums' buffers. `tensor_data`: tinker's class, when its fields may be
/// read directly; `torch_tensor`: `torch.Tensor` (`None` without torch).
#[pyfunction(name = "kl_sample_train")]
pub fn py_kl_sample_train<'py>(
    data: &Bound<'py, PyAny>,
    training_logprobs: &Bound<'py, PyAny>,
    tensor_data: Option<Bound<'py, PyType>>,
    torch_tensor: Option<Bound<'py, PyType>>,
) -> PyResult<(f64, f64, f64)> {
    guarded(|| {
        kl_sample_train(data, training_logprobs, tensor_data.as_ref(), torch_tensor.as_ref())
            .map_err(|e| leave_to_cookbook(data.py(), e))
    })
}

// --------------------------------------------------------------------------
// compute_trajectory_metrics

/// Metric keys (exact strs) and the ids [`KeyedSums`] knows them by.
struct MetricKeys<'py> {
    ids: Bound<'py, PyDict>,
    names: Vec<Bound<'py, PyString>>,
}

impl<'py> MetricKeys<'py> {
    fn id(&mut self, key: &Bound<'py, PyAny>) -> PyResult<usize> {
        let Ok(name) = key.cast_exact::<PyString>() else {
            return Err(unsupported(format!("a metric key is a {}, not a str", type_name(key))));
        };
        if let Some(id) = self.ids.get_item(name)? {
            return id.extract();
        }
        let id = self.names.len();
        self.ids.set_item(name, id)?;
        self.names.push(name.clone());
        Ok(id)
    }
}

/// What the trajectory metrics read besides the groups: tinker's input
/// classes, the cookbook's own `TrajectoryGroup.get_total_rewards` (a group
/// whose class has it is summed here), numpy's scalar number types.
struct Reading<'a, 'py> {
    classes: &'a InputClasses<'py>,
    own_total_rewards: Option<&'a Bound<'py, PyAny>>,
    numpy_numbers: &'a Bound<'py, PyTuple>,
}

impl<'py> Reading<'_, 'py> {
    /// A metric's value as `np.mean` takes it: a Python or numpy real.
    fn metric_value(&self, value: &Bound<'py, PyAny>, at: Location) -> PyResult<f64> {
        if let Some(n) = number(value) {
            return Ok(n.value);
        }
        if value.is_instance_of::<pyo3::types::PyFloat>() || value.is_instance(self.numpy_numbers.as_any())? {
            return value.extract();
        }
        Err(unsupported(format!("{at}: a metric value is a {}", type_name(value))))
    }

    /// One metrics dict's values, `None` skipped as `dict_mean` skips it.
    fn add_metrics(
        &self,
        metrics: &Bound<'py, PyAny>,
        sums: &mut KeyedSums,
        keys: &mut MetricKeys<'py>,
        at: Location,
    ) -> PyResult<()> {
        let Ok(metrics) = metrics.cast_exact::<PyDict>() else {
            return Err(unsupported(format!(
                "{at}: metrics are a {}, not a dict",
                type_name(metrics)
            )));
        };
        for (key, value) in metrics {
            if !value.is_none() {
                sums.add(keys.id(&key)?, self.metric_value(&value, at)?);
            }
        }
        Ok(())
    }

    fn group(&self, group: &Bound<'py, PyAny>, g: usize, keys: &mut MetricKeys<'py>) -> PyResult<GroupStats> {
        let py = group.py();
        let trajectories = items_of(group, intern!(py, "trajectories_G"), "trajectories_G")?;
        let own_rewards = match self.own_total_rewards {
            Some(own) => group.get_type().getattr(intern!(py, "get_total_rewards"))?.is(own),
            None => false,
        };
        let final_rewards = if own_rewards {
            let final_rewards = items_of(group, intern!(py, "final_rewards_G"), "final_rewards_G")?;
            if final_rewards.len() != trajectories.len() {
                return Err(unsupported(format!(
                    "group {g}: trajectories_G and final_rewards_G differ in length"
                )));
            }
            Some(final_rewards)
        } else {
            None
        };
        let mut stats = GroupStats::default();
        let mut counts = Counts::default();
        let mut totals = Vec::with_capacity(trajectories.len());
        let mut totals_known = own_rewards;
        for t in 0..trajectories.len() {
            let transitions = items_of(&trajectories.get(t)?, intern!(py, "transitions"), "transitions")?;
            stats.trajectories += 1;
            stats.turns += transitions.len() as i64;
            let mut reward = RewardSum::default();
            for u in 0..transitions.len() {
                let at = Location::turn(g, t, u).named(StepName::Transition);
                let transition = transitions.get(u)?;
                counts.add_transition(&transition, self.classes, at)?;
                if totals_known {
                    match number(&transition.getattr(intern!(py, "reward"))?) {
                        Some(r) => reward.add(r),
                        None => totals_known = false,
                    }
                }
                let metrics = transition.getattr(intern!(py, "metrics"))?;
                self.add_metrics(&metrics, &mut stats.transition_metrics, keys, at)?;
            }
            if let (true, Some(final_rewards)) = (totals_known, &final_rewards) {
                match number(&final_rewards.get(t)?).and_then(|f| reward.total(f)) {
                    Some(total) => totals.push(total),
                    None => totals_known = false,
                }
            }
        }
        if !totals_known {
            // A sum whose rounding depends on CPython's sum(), or another
            // get_total_rewards: the group's own method says.
            totals.clear();
            let given = group.call_method0(intern!(py, "get_total_rewards"))?;
            let given = items(&given, "get_total_rewards()")?;
            for t in 0..given.len() {
                let total = number(&given.get(t)?)
                    .ok_or_else(|| unsupported(format!("group {g}: a total reward is not an int or float")))?;
                totals.push(total.value);
            }
        }
        stats.set_rewards(&totals);
        stats.ac_tokens = counts.sampled;
        stats.ob_tokens = counts.prompt;
        stats.cached_ob_tokens = counts.cached;
        let metrics = items_of(group, intern!(py, "metrics_G"), "metrics_G")?;
        for t in 0..metrics.len() {
            self.add_metrics(
                &metrics.get(t)?,
                &mut stats.trajectory_metrics,
                keys,
                Location::trajectory(g, t),
            )?;
        }
        Ok(stats)
    }
}

/// The groups each tag names, tags in order of first appearance, a group
/// once per time its taglist names the tag (the cookbook's `tag2trajgroups`
/// over `zip(taglist_P, trajectory_groups_P)`).
fn tag_members<'py>(taglists: &Items<'py>, n_groups: usize) -> PyResult<Vec<(Bound<'py, PyString>, Vec<usize>)>> {
    let py = taglists.py();
    let index = PyDict::new(py);
    let mut tags: Vec<(Bound<'py, PyString>, Vec<usize>)> = Vec::new();
    for g in 0..taglists.len().min(n_groups) {
        let taglist = items(&taglists.get(g)?, "taglist")?;
        for i in 0..taglist.len() {
            let tag = taglist.get(i)?;
            let Ok(tag) = tag.cast_exact::<PyString>() else {
                return Err(unsupported(format!(
                    "group {g}: a tag is a {}, not a str",
                    type_name(&tag)
                )));
            };
            let k = if let Some(k) = index.get_item(tag)? {
                k.extract()?
            } else {
                index.set_item(tag, tags.len())?;
                tags.push((tag.clone(), Vec::new()));
                tags.len() - 1
            };
            tags[k].1.push(g);
        }
    }
    Ok(tags)
}

/// A summary's metrics into `out` as `{prefix}{key}`: the base metrics,
/// then the metric means, then the by-group fractions, each `set` in the
/// order the cookbook's `dict.update`s make (a later key of the same name
/// replaces the value and keeps the place).
fn write_summary<'py>(out: &Bound<'py, PyDict>, prefix: &str, s: &Summary, keys: &MetricKeys<'py>) -> PyResult<()> {
    let py = out.py();
    let metrics = PyDict::new(py);
    metrics.set_item(intern!(py, "ac_tokens_per_turn"), s.ac_tokens_per_turn())?;
    metrics.set_item(intern!(py, "ob_tokens_per_turn"), s.ob_tokens_per_turn())?;
    metrics.set_item(intern!(py, "turns_per_episode"), s.turns_per_episode())?;
    metrics.set_item(intern!(py, "total_episodes"), s.episodes)?;
    metrics.set_item(intern!(py, "total_turns"), s.turns)?;
    metrics.set_item(intern!(py, "total_ac_tokens"), s.ac_tokens)?;
    metrics.set_item(intern!(py, "total_ob_tokens"), s.ob_tokens)?;
    metrics.set_item(intern!(py, "total_cached_ob_tokens"), s.cached_ob_tokens)?;
    metrics.set_item(intern!(py, "reward/total"), s.reward)?;
    for &(key, mean) in &s.metric_means {
        metrics.set_item(&keys.names[key], mean)?;
    }
    metrics.set_item(intern!(py, "by_group/frac_mixed"), s.frac_mixed)?;
    metrics.set_item(intern!(py, "by_group/frac_all_good"), s.frac_all_good)?;
    metrics.set_item(intern!(py, "by_group/frac_all_bad"), s.frac_all_bad)?;
    for (key, value) in metrics {
        let key = key.cast::<PyString>()?.to_str()?;
        out.set_item(format!("{prefix}{key}"), value)?;
    }
    Ok(())
}

fn trajectory_metrics<'py>(
    groups: &Bound<'py, PyAny>,
    taglists: &Bound<'py, PyAny>,
    reading: &Reading<'_, 'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let py = groups.py();
    let groups = items(groups, "trajectory_groups_P")?;
    let taglists = items(taglists, "taglist_P")?;
    let mut keys = MetricKeys {
        ids: PyDict::new(py),
        names: Vec::new(),
    };
    let stats = (0..groups.len())
        .map(|g| reading.group(&groups.get(g)?, g, &mut keys))
        .collect::<PyResult<Vec<_>>>()?;
    let summary = |members: &[usize]| {
        summarize(&stats, members)
            .ok_or_else(|| unsupported("a group has no trajectories (grp_rewards[0] raises)".into()))
    };
    let out = PyDict::new(py);
    let tags = tag_members(&taglists, groups.len())?;
    if tags.iter().any(|(_, members)| members.len() < groups.len()) {
        for (tag, members) in &tags {
            write_summary(&out, &format!("env/{}/", tag.to_str()?), &summary(members)?, &keys)?;
        }
    }
    let all: Vec<usize> = (0..groups.len()).collect();
    write_summary(&out, "env/all/", &summary(&all)?, &keys)?;
    Ok(out)
}

/// `compute_trajectory_metrics(trajectory_groups_P, taglist_P)`: the
/// groups read once, summed per tag and for all.
#[pyfunction(name = "trajectory_metrics")]
pub fn py_trajectory_metrics<'py>(
    groups: &Bound<'py, PyAny>,
    taglists: &Bound<'py, PyAny>,
    input_classes: InputClasses<'py>,
    own_total_rewards: Option<Bound<'py, PyAny>>,
    numpy_numbers: Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded(|| {
        let reading = Reading {
            classes: &input_classes,
            own_total_rewards: own_total_rewards.as_ref(),
            numpy_numbers: &numpy_numbers,
        };
        trajectory_metrics(groups, taglists, &reading).map_err(|e| leave_to_cookbook(groups.py(), e))
    })
}

// --------------------------------------------------------------------------
// rollout_usage, training_usage

fn rollout_counts(groups: &Bound<'_, PyAny>, classes: &InputClasses<'_>) -> PyResult<(i64, i64, i64)> {
    let py = groups.py();
    let groups = items(groups, "trajectory_groups")?;
    let mut counts = Counts::default();
    for g in 0..groups.len() {
        let trajectories = items_of(&groups.get(g)?, intern!(py, "trajectories_G"), "trajectories_G")?;
        for t in 0..trajectories.len() {
            let transitions = items_of(&trajectories.get(t)?, intern!(py, "transitions"), "transitions")?;
            for u in 0..transitions.len() {
                let at = Location::turn(g, t, u).named(StepName::Transition);
                counts.add_transition(&transitions.get(u)?, classes, at)?;
            }
        }
    }
    Ok((counts.sampled, counts.cached, counts.prompt))
}

/// `rollout_usage`'s counts: `(sampled, prefill_cached, prompt tokens)`.
#[pyfunction(name = "rollout_counts")]
pub fn py_rollout_counts(groups: &Bound<'_, PyAny>, input_classes: InputClasses<'_>) -> PyResult<(i64, i64, i64)> {
    guarded(|| rollout_counts(groups, &input_classes).map_err(|e| leave_to_cookbook(groups.py(), e)))
}

fn training_tokens(data: &Bound<'_, PyAny>, classes: &InputClasses<'_>) -> PyResult<i64> {
    let py = data.py();
    let data = items(data, "data_D")?;
    let mut n = 0;
    for i in 0..data.len() {
        let model_input = data.get(i)?.getattr(intern!(py, "model_input"))?;
        n += model_input_length(&model_input, classes, Location::BATCH)?;
    }
    Ok(n)
}

/// `training_usage`'s count: the model-input tokens of the Datums.
#[pyfunction(name = "training_tokens")]
pub fn py_training_tokens(data: &Bound<'_, PyAny>, input_classes: InputClasses<'_>) -> PyResult<i64> {
    guarded(|| training_tokens(data, &input_classes).map_err(|e| leave_to_cookbook(data.py(), e)))
}

// --------------------------------------------------------------------------
// _remove_mask

/// `(Datum, TensorData, PromptProvenanceSpan, SampledProvenanceSpan)`.
pub type DatumClasses<'py> = (
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
);

/// Spans as `Datum.__post_init__` accepts them: `None`, or a list or tuple
/// of provenance spans.
fn checked_spans(spans: &Bound<'_, PyAny>, classes: &DatumClasses<'_>) -> PyResult<bool> {
    if spans.is_none() {
        return Ok(true);
    }
    let (_, _, prompt, sampled) = classes;
    let spans = items(spans, "spans")?;
    for i in 0..spans.len() {
        let span = spans.get(i)?;
        if !(span.is_instance(prompt)? || span.is_instance(sampled)?) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn datum_without_mask<'py>(datum: &Bound<'py, PyAny>, classes: &DatumClasses<'py>) -> PyResult<Bound<'py, PyAny>> {
    let py = datum.py();
    let (datum_class, tensor_data, _, _) = classes;
    if !datum.get_type().is(datum_class) {
        return Err(unsupported(format!("a {}, not a tinker.Datum", type_name(datum))));
    }
    let model_input = datum.getattr(intern!(py, "model_input"))?;
    let inputs = datum.getattr(intern!(py, "loss_fn_inputs"))?;
    let input_spans = datum.getattr(intern!(py, "model_input_spans"))?;
    let target_spans = datum.getattr(intern!(py, "loss_fn_input_spans"))?;
    let Ok(inputs) = inputs.cast_exact::<PyDict>() else {
        return Err(unsupported("loss_fn_inputs is not a dict".into()));
    };
    let kept = PyDict::new(py);
    let mut untracked = true;
    for (key, value) in inputs {
        // __post_init__ keeps a TensorData as it is; it converts anything else.
        if !key.is_exact_instance_of::<PyString>() || !value.is_instance(tensor_data)? {
            return Err(unsupported("a loss input is not a str key to a TensorData".into()));
        }
        if !key.eq(intern!(py, "mask"))? {
            untracked &= !is_tracked(&value);
            kept.set_item(key, value)?;
        }
    }
    let paired = input_spans.is_none() == target_spans.is_none();
    if !(paired && checked_spans(&input_spans, classes)? && checked_spans(&target_spans, classes)?) {
        return Err(unsupported("provenance spans that Datum.__post_init__ rejects".into()));
    }
    if untracked {
        // As the assembled Datums' own (build.rs): untracked tensors only.
        untrack_dict(&kept);
    }
    dataclass(
        datum_class,
        [
            (intern!(py, "model_input"), &model_input),
            (intern!(py, "loss_fn_inputs"), kept.as_any()),
            (intern!(py, "model_input_spans"), &input_spans),
            (intern!(py, "loss_fn_input_spans"), &target_spans),
        ],
    )
}

/// `_remove_mask(datum)`: a new Datum with every field of `datum` but its
/// `loss_fn_inputs`, a new dict without `"mask"`, as
/// `dataclasses.replace` makes it, built directly (`classes` are tinker's,
/// whose layout `_build` checked).
#[pyfunction(name = "datum_without_mask")]
pub fn py_datum_without_mask<'py>(
    datum: &Bound<'py, PyAny>,
    classes: DatumClasses<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    guarded(|| datum_without_mask(datum, &classes).map_err(|e| leave_to_cookbook(datum.py(), e)))
}
