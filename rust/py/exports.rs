//! The functions the native module exports (each `py_<op>` as `<op>`):
//! thin wrappers that convert arguments and results around the pipeline
//! and the plain numeric modules, under a panic guard.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple, PyType};

use crate::advantages::{extend_group_advantages, is_constant, reward_stats, AdvantageRule, Baseline};
use crate::py::build::Builder;
use crate::py::classes::Classes;
use crate::py::errors::guarded;
use crate::py::errors::{leave_to_cookbook, Unsupported};
use crate::py::forward_backward::{encode_forward_backward, TinkerParts};
use crate::py::gc::GcPaused;
use crate::py::pipeline;
use crate::py::source::cookbook::Cookbook;
use crate::py::source::evsys::{read_rewards, Evsys, FitReport, Options};
use crate::py::step::kl_sample_train::kl_sample_train;
use crate::py::step::remove_mask::datum_without_mask;
use crate::py::step::trajectory_metrics::{trajectory_metrics, Reading};
use crate::py::step::usage::{rollout_counts, training_tokens};

/// Adds every export to the native module: the one list of them.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("INT_READ", crate::py::read::exact::probe_int_layout(m.py())?)?;
    m.add("Unsupported", m.py().get_type::<Unsupported>())?;
    m.add(
        "ValidationError",
        m.py().get_type::<crate::py::errors::ValidationError>(),
    )?;
    m.add_class::<Fitted>()?;
    m.add_class::<BuiltDatums>()?;
    m.add_class::<Rows>()?;
    m.add_class::<crate::py::kl::TorchSum>()?;
    m.add_function(wrap_pyfunction!(crate::py::classes::py_bind_classes, m)?)?;
    m.add_function(wrap_pyfunction!(py_compute_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(py_reward_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(py_varied_reward_groups, m)?)?;
    m.add_function(wrap_pyfunction!(py_assemble_arrays, m)?)?;
    m.add_function(wrap_pyfunction!(py_assemble_datums, m)?)?;
    m.add_function(wrap_pyfunction!(py_assemble_cookbook, m)?)?;
    m.add_function(wrap_pyfunction!(py_encode_forward_backward, m)?)?;
    m.add_function(wrap_pyfunction!(py_kl_sample_train, m)?)?;
    m.add_function(wrap_pyfunction!(py_trajectory_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(py_rollout_counts, m)?)?;
    m.add_function(wrap_pyfunction!(py_training_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(py_datum_without_mask, m)?)?;
    m.add_function(wrap_pyfunction!(py_panic_probe, m)?)?;
    m.add_function(wrap_pyfunction!(py_one_shot_reads, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::gc::program_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::gc::program_set_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::gc::after_fork_in_child, m)?)?;
    crate::py::gc::register(m)?;
    m.add_function(wrap_pyfunction!(crate::py::sample::py_encode_sample_request, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::sample::py_sample_prompt_key, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::kl::py_kl_penalty, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::kl::py_post_kl_diffs, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::kl::py_full_sequence_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::kl::py_discounted_future_sum, m)?)?;
    m.add_function(wrap_pyfunction!(crate::py::kl::py_torch_sum, m)?)?;
    Ok(())
}

/// How the logprobs of turns were fitted to their completions: counts, and
/// the first such turn as `(group, trajectory, turn)`.
#[pyclass(frozen, get_all, module = "tinker_rl_data._core")]
pub struct Fitted {
    padded: usize,
    truncated: usize,
    first: Option<(usize, usize, usize)>,
}

impl From<FitReport> for Fitted {
    fn from(f: FitReport) -> Self {
        Fitted {
            padded: f.padded,
            truncated: f.truncated,
            first: f
                .first
                .map(|at| (at.group.unwrap_or(0), at.trajectory.unwrap_or(0), at.turn.unwrap_or(0))),
        }
    }
}

/// The result of `assemble_datums`: `result` is the `(datums, metadata)`
/// pair the public function returns as it is (made here, with the GC still
/// paused: see `py_assemble_datums`). The public-constructor path makes
/// one in Python, so both paths give the same thing.
#[pyclass(frozen, get_all, module = "tinker_rl_data._core")]
pub struct BuiltDatums {
    result: Py<PyTuple>,
    fitted: Py<Fitted>,
}

/// The result of `assemble_arrays`: flat columns, row `i` is
/// `row_offsets[i]..row_offsets[i + 1]`.
#[pyclass(frozen, get_all, module = "tinker_rl_data._core")]
pub struct Rows {
    input_tokens: Py<PyArray1<i64>>,
    target_tokens: Py<PyArray1<i64>>,
    logprobs: Py<PyArray1<f32>>,
    advantages: Py<PyArray1<f32>>,
    row_offsets: Py<PyArray1<i64>>,
    group_idx: Py<PyArray1<i64>>,
    traj_idx: Py<PyArray1<i64>>,
    turn_idx: Py<PyArray1<i64>>,
    n_turns: Py<PyArray1<i64>>,
    fitted: Py<Fitted>,
}

/// How many one-shot iterators (generators, iterators) this thread's
/// native passes have read as sequences: a caller that would hand a refused
/// input to another function checks that none was read meanwhile.
#[pyfunction(name = "one_shot_reads")]
pub fn py_one_shot_reads() -> u64 {
    crate::py::read::one_shot_reads()
}

/// Advantages per group; the arguments are checked by the Python layer.
#[pyfunction(name = "compute_advantages")]
pub fn py_compute_advantages(
    groups: &Bound<'_, PyAny>,
    normalize: bool,
    leave_one_out: bool,
    scale_by_std: bool,
    eps: f64,
) -> PyResult<Vec<Vec<f64>>> {
    guarded(|| {
        let rule = AdvantageRule {
            normalize,
            baseline: if leave_one_out {
                Baseline::LeaveOneOut
            } else {
                Baseline::Mean
            },
            scale_by_std,
            eps,
        };
        let rewards = read_rewards(groups)?;
        Ok(rewards
            .groups()
            .map(|group| {
                let mut advantages = Vec::with_capacity(group.len());
                extend_group_advantages(group, rule, &mut advantages);
                advantages
            })
            .collect())
    })
}

/// `(mean, population std, n_trajectories, n_groups)`, or `None` without
/// trajectories.
#[pyfunction(name = "reward_metrics")]
pub fn py_reward_metrics(groups: &Bound<'_, PyAny>) -> PyResult<Option<(f64, f64, usize, usize)>> {
    guarded(|| {
        let rewards = read_rewards(groups)?;
        Ok(reward_stats(&rewards.all).map(|s| (s.mean, s.std, rewards.all.len(), rewards.sizes.len())))
    })
}

/// The indices of the groups whose rewards are not all equal.
#[pyfunction(name = "varied_reward_groups")]
pub fn py_varied_reward_groups(groups: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    guarded(|| {
        let rewards = read_rewards(groups)?;
        Ok(rewards
            .groups()
            .enumerate()
            .filter(|(_, group)| !is_constant(group))
            .map(|(g, _)| g)
            .collect())
    })
}

#[pyfunction(name = "assemble_arrays")]
pub fn py_assemble_arrays(
    groups: &Bound<'_, PyAny>,
    advantages: &Bound<'_, PyAny>,
    merge_turns: bool,
    vocab_size: Option<i64>,
) -> PyResult<Rows> {
    guarded(|| {
        let py = groups.py();
        let _gc = GcPaused::new(py);
        let mut door = Evsys::open(groups, advantages, Options::new(merge_turns, vocab_size, false), None)?;
        let capacity = door.per_turn_positions();
        let rows = pipeline::arrays(py, &mut door, capacity)?;
        Ok(Rows {
            input_tokens: rows.input_tokens.unbind(),
            target_tokens: rows.targets.unbind(),
            logprobs: rows.logprobs.unbind(),
            advantages: rows.advantages.unbind(),
            row_offsets: rows.offsets.unbind(),
            group_idx: rows.group_idx.unbind(),
            traj_idx: rows.traj_idx.unbind(),
            turn_idx: rows.turn_idx.unbind(),
            n_turns: rows.n_turns.unbind(),
            fitted: Py::new(py, Fitted::from(door.fit()))?,
        })
    })
}

/// The evsys API's Datums and their `DatumMetadata` (`metadata_class`),
/// built directly into tinker's classes when `direct`, else through their
/// public constructors.
///
/// The GC stays paused until the object returned exists: the first
/// container made after it resumes sets off the young collection the new
/// objects are due, and that is then the caller's next allocation, not one
/// of ours (the Python wrapper returns `result` without making another).
#[pyfunction(name = "assemble_datums")]
#[pyo3(signature = (groups, advantages, *, metadata_class, merge_turns, vocab_size, numpy_tokens, direct))]
pub fn py_assemble_datums<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    metadata_class: Bound<'py, PyType>,
    merge_turns: bool,
    vocab_size: Option<i64>,
    numpy_tokens: bool,
    direct: bool,
) -> PyResult<Bound<'py, BuiltDatums>> {
    guarded(|| {
        let py = groups.py();
        let classes = Classes::get(py)?;
        let _gc = GcPaused::new(py);
        let builder = Builder { classes, direct };
        let options = Options::new(merge_turns, vocab_size, numpy_tokens);
        let mut door = Evsys::open(groups, advantages, options, Some(metadata_class))?;
        let (datums, metadata) = pipeline::datums(&mut door, &builder)?;
        let built = BuiltDatums {
            result: PyTuple::new(py, [datums.into_any(), metadata.into_any()])?.unbind(),
            fitted: Py::new(py, Fitted::from(door.fit()))?,
        };
        Bound::new(py, built)
    })
}

/// tinker-cookbook's rows: `(datums, [{"group_idx": g, "traj_idx": t}])`,
/// with provenance spans where the cookbook attaches them when
/// `provenance`; built as `assemble_datums` builds them. The GC stays
/// paused until the tuple exists, as in `py_assemble_datums`. `exact`:
/// raise `Unsupported` where the cookbook reads the input otherwise than
/// this door would accept it (`source/cookbook.rs`).
#[pyfunction(name = "assemble_cookbook")]
#[pyo3(signature = (groups, advantages, *, provenance, direct, exact = false))]
pub fn py_assemble_cookbook<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    provenance: bool,
    direct: bool,
    exact: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    guarded(|| {
        let py = groups.py();
        let classes = Classes::get(py)?;
        let _gc = GcPaused::new(py);
        let builder = Builder { classes, direct };
        let text_chunk = builder.classes.text_chunk.clone().into_any();
        let mut door = Cookbook::open(groups, advantages, text_chunk, provenance, exact)?;
        let (datums, metadata) = pipeline::datums(&mut door, &builder)?;
        PyTuple::new(py, [datums.into_any(), metadata.into_any()])
    })
}

/// tinker's `forward_backward` request bytes (`tinker_rl_data.wire`
/// passes what it takes from tinker as `parts`).
#[pyfunction(name = "encode_forward_backward")]
pub fn py_encode_forward_backward<'py>(
    request: &Bound<'py, PyAny>,
    forward_only: &Bound<'py, PyAny>,
    parts: TinkerParts<'py>,
) -> PyResult<Bound<'py, PyBytes>> {
    guarded(|| encode_forward_backward(request, forward_only, &parts))
}

// The rest of tinker-cookbook's RL step (`step`): an input the native pass
// does not read exactly raises `Unsupported`, and the Python layer runs the
// cookbook's own function.

/// `compute_kl_sample_train`'s `(v1, v2, entropy)`, in one pass over the
/// Datums' buffers. `direct`: tinker's `TensorData` fields may be read
/// directly; `torch_tensor`: `torch.Tensor` (`None` without torch).
#[pyfunction(name = "kl_sample_train")]
#[pyo3(signature = (data, training_logprobs, *, direct, torch_tensor))]
pub fn py_kl_sample_train<'py>(
    data: &Bound<'py, PyAny>,
    training_logprobs: &Bound<'py, PyAny>,
    direct: bool,
    torch_tensor: Option<Bound<'py, PyType>>,
) -> PyResult<(f64, f64, f64)> {
    guarded(|| {
        let tensor_data = if direct {
            Some(Classes::get(data.py())?.tensor_data)
        } else {
            None
        };
        kl_sample_train(data, training_logprobs, tensor_data.as_ref(), torch_tensor.as_ref())
            .map_err(|e| leave_to_cookbook(data.py(), e))
    })
}

/// `compute_trajectory_metrics(trajectory_groups_P, taglist_P)`: the
/// groups read once, summed per tag and for all. `own_total_rewards`: the
/// cookbook's `TrajectoryGroup.get_total_rewards`, as its module holds it.
#[pyfunction(name = "trajectory_metrics")]
pub fn py_trajectory_metrics<'py>(
    groups: &Bound<'py, PyAny>,
    taglists: &Bound<'py, PyAny>,
    own_total_rewards: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded(|| {
        let py = groups.py();
        let reading = Reading {
            classes: &Classes::get(py)?,
            own_total_rewards: own_total_rewards.as_ref(),
            numpy_numbers: crate::py::classes::numpy_numbers(py)?,
        };
        trajectory_metrics(groups, taglists, &reading).map_err(|e| leave_to_cookbook(py, e))
    })
}

/// `rollout_usage`'s counts: `(sampled, prefill_cached, prompt tokens)`.
#[pyfunction(name = "rollout_counts")]
pub fn py_rollout_counts(groups: &Bound<'_, PyAny>) -> PyResult<(i64, i64, i64)> {
    guarded(|| {
        let classes = Classes::get(groups.py())?;
        rollout_counts(groups, &classes).map_err(|e| leave_to_cookbook(groups.py(), e))
    })
}

/// `training_usage`'s count: the model-input tokens of the Datums.
#[pyfunction(name = "training_tokens")]
pub fn py_training_tokens(data: &Bound<'_, PyAny>) -> PyResult<i64> {
    guarded(|| {
        let classes = Classes::get(data.py())?;
        training_tokens(data, &classes).map_err(|e| leave_to_cookbook(data.py(), e))
    })
}

/// `_remove_mask(datum)`: a new Datum with every field of `datum` but its
/// `loss_fn_inputs`, a new dict without `"mask"`, as
/// `dataclasses.replace` makes it, built directly (where `tinker_rl_data.rows` found
/// tinker's layout: the caller's to check).
#[pyfunction(name = "datum_without_mask")]
pub fn py_datum_without_mask<'py>(datum: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    guarded(|| {
        let classes = Classes::get(datum.py())?;
        datum_without_mask(datum, &classes).map_err(|e| leave_to_cookbook(datum.py(), e))
    })
}

/// Panics on purpose, so a test can show a panic surfaces as an exception.
#[pyfunction(name = "_panic_probe")]
pub fn py_panic_probe() -> PyResult<()> {
    guarded(|| panic!("panic probe"))
}
