//! The Python-facing functions (exported without the `py_` prefix): walk the
//! user's groups, write rows straight into numpy buffers, return them.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyArray1, PyArrayMethods, ToPyArray};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};

use crate::advantages::{extend_group_advantages, reward_stats};
use crate::datums::{build_datums, Columns, DatumClasses};
use crate::error::{ErrorKind, InputError, Location};
use crate::read::{attr, read_logprobs, read_real, read_tokens, shared_model_input, IntList, ItemKind, Items};
use crate::rows::{fill_advantages, row_offsets, RowMut, TurnShape};

#[cold]
pub fn input_error(e: InputError) -> PyErr {
    match e.kind {
        ErrorKind::Type => PyTypeError::new_err(e.to_string()),
        ErrorKind::Value => PyValueError::new_err(e.to_string()),
    }
}

/// Runs `f`, turning a Rust panic into a `RuntimeError` that any
/// `except Exception` catches (PyO3's own `PanicException` does not).
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(PyRuntimeError::new_err(format!(
            "internal error in tinker_rl_data (please report): {what}"
        )))
    })
}

fn trajectories_of<'py>(groups: &Items<'py>, g: usize) -> PyResult<Items<'py>> {
    let at = Location::group(g);
    let trajectories = attr(&groups.get_bound(g)?, intern!(groups.py(), "trajectories"), at)?;
    Items::of(&trajectories, "trajectories", ItemKind::Object, at)
}

fn reward_of(trajectory: &Bound<'_, PyAny>, at: Location) -> PyResult<f64> {
    read_real(
        &attr(trajectory, intern!(trajectory.py(), "reward"), at)?,
        "reward",
        false,
        at,
    )
}

/// Each group's trajectory count and all rewards, in order, checked.
fn read_rewards(groups: &Bound<'_, PyAny>) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let mut sizes = Vec::with_capacity(groups.len());
    let mut rewards = Vec::new();
    for g in 0..groups.len() {
        let trajectories = trajectories_of(&groups, g)?;
        for t in 0..trajectories.len() {
            rewards.push(reward_of(&trajectories.get_bound(t)?, Location::trajectory(g, t))?);
        }
        sizes.push(trajectories.len());
    }
    Ok((sizes, rewards))
}

#[pyfunction(name = "compute_advantages")]
pub fn py_compute_advantages(groups: &Bound<'_, PyAny>, normalize: bool) -> PyResult<Vec<Vec<f64>>> {
    guarded(|| {
        let (sizes, rewards) = read_rewards(groups)?;
        let mut rest = &rewards[..];
        let mut out = Vec::with_capacity(sizes.len());
        for size in sizes {
            let (group, tail) = rest.split_at(size);
            let mut advantages = Vec::with_capacity(size);
            extend_group_advantages(group, normalize, &mut advantages);
            out.push(advantages);
            rest = tail;
        }
        Ok(out)
    })
}

/// `(mean, population std, n_trajectories, n_groups)`, or `None` without
/// trajectories.
#[pyfunction(name = "reward_metrics")]
pub fn py_reward_metrics(groups: &Bound<'_, PyAny>) -> PyResult<Option<(f64, f64, usize, usize)>> {
    guarded(|| {
        let (sizes, rewards) = read_rewards(groups)?;
        Ok(reward_stats(&rewards).map(|s| (s.mean, s.std, rewards.len(), sizes.len())))
    })
}

/// A turn, found and its sequences opened, not yet read.
struct TurnPlan<'py> {
    prompt: Items<'py>,
    completion: Items<'py>,
    logprobs: Items<'py>,
    at: Location,
    advantage: f32,
}

impl TurnPlan<'_> {
    fn shape(&self) -> TurnShape {
        TurnShape {
            prompt_len: self.prompt.len(),
            completion_len: self.completion.len(),
        }
    }
}

/// The batch's structure: every turn (kept or not, all are checked), each
/// group's tags; rewards and advantages checked on the way.
struct Plan<'py> {
    turns: Vec<TurnPlan<'py>>,
    tags: Vec<Option<Bound<'py, PyAny>>>,
}

fn plan_batch<'py>(groups: &Bound<'py, PyAny>, advantages: &Bound<'py, PyAny>, with_tags: bool) -> PyResult<Plan<'py>> {
    let py = groups.py();
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let advantages = Items::of(advantages, "advantages", ItemKind::Object, Location::BATCH)?;
    if advantages.len() != groups.len() {
        let message = format!(
            "advantages has {} groups for {} trajectory groups",
            advantages.len(),
            groups.len()
        );
        return Err(input_error(InputError::new(ErrorKind::Value, Location::BATCH, message)));
    }
    let mut plan = Plan {
        turns: Vec::new(),
        tags: Vec::new(),
    };
    for g in 0..groups.len() {
        let at = Location::group(g);
        let trajectories = trajectories_of(&groups, g)?;
        let group_advantages = Items::of(&advantages.get_bound(g)?, "advantages", ItemKind::Real, at)?;
        if group_advantages.len() != trajectories.len() {
            let message = format!(
                "advantages has {} entries for {} trajectories",
                group_advantages.len(),
                trajectories.len()
            );
            return Err(input_error(InputError::new(ErrorKind::Value, at, message)));
        }
        if with_tags {
            plan.tags.push(
                groups
                    .get_bound(g)?
                    .getattr_opt(intern!(py, "tags"))?
                    .filter(|t| !t.is_none()),
            );
        }
        for t in 0..trajectories.len() {
            let at = Location::trajectory(g, t);
            let trajectory = trajectories.get_bound(t)?;
            reward_of(&trajectory, at)?;
            let advantage = read_real(&group_advantages.get_bound(t)?, "advantage", true, at)? as f32;
            let turns = Items::of(
                &attr(&trajectory, intern!(py, "turns"), at)?,
                "turns",
                ItemKind::Object,
                at,
            )?;
            for u in 0..turns.len() {
                let at = Location::turn(g, t, u);
                let turn = turns.get_bound(u)?;
                let field = |name, what, kind| Items::of(&attr(&turn, name, at)?, what, kind, at);
                plan.turns.push(TurnPlan {
                    prompt: field(intern!(py, "prompt_tokens"), "prompt_tokens", ItemKind::Token)?,
                    completion: field(intern!(py, "completion_tokens"), "completion_tokens", ItemKind::Token)?,
                    logprobs: field(intern!(py, "logprobs"), "logprobs", ItemKind::Real)?,
                    at,
                    advantage,
                });
            }
        }
    }
    Ok(plan)
}

/// The rows of a planned batch, in numpy arrays; `input_tokens` and
/// `model_inputs` only as asked.
struct Assembled<'py> {
    kept: Vec<Location>,
    input_tokens: Option<Bound<'py, PyArray1<i64>>>,
    model_inputs: Vec<Bound<'py, PyList>>,
    targets: Bound<'py, PyArray1<i64>>,
    logprobs: Bound<'py, PyArray1<f32>>,
    advantages: Bound<'py, PyArray1<f32>>,
    offsets: Vec<i64>,
    fitted_turns: usize,
}

fn assemble_rows<'py>(
    py: Python<'py>,
    plan: &Plan<'py>,
    with_input_tokens: bool,
    with_model_inputs: bool,
) -> PyResult<Assembled<'py>> {
    let kept: Vec<&TurnPlan> = plan.turns.iter().filter(|t| t.shape().is_kept()).collect();
    let shapes: Vec<TurnShape> = kept.iter().map(|t| t.shape()).collect();
    let offsets = row_offsets(&shapes);
    let total = *offsets.last().unwrap() as usize;
    // numpy's allocator asks the kernel for huge pages on large arrays:
    // far fewer page faults than a plain Vec (seen in perf profiles).
    let input_tokens = with_input_tokens.then(|| PyArray1::<i64>::zeros(py, total, false));
    let targets = PyArray1::<i64>::zeros(py, total, false);
    let logprobs = PyArray1::<f32>::zeros(py, total, false);
    let advantages = PyArray1::<f32>::zeros(py, total, false);
    // Safety: the arrays are new and not shared with Python code until
    // returned; nothing else can view them while these slices live.
    let (input_slice, target_slice, logprob_slice, advantage_slice) = unsafe {
        (
            match &input_tokens {
                Some(a) => a.as_slice_mut()?,
                None => &mut [][..],
            },
            targets.as_slice_mut()?,
            logprobs.as_slice_mut()?,
            advantages.as_slice_mut()?,
        )
    };
    let mut model_inputs = Vec::with_capacity(if with_model_inputs { kept.len() } else { 0 });
    let mut fitted_turns = 0;
    let mut row = 0;
    for turn in &plan.turns {
        let shape = turn.shape();
        let at = turn.at;
        if !shape.is_kept() {
            read_tokens(&turn.prompt, "prompt_tokens", at, |_, _, _| Ok(()))?;
            read_tokens(&turn.completion, "completion_tokens", at, |_, _, _| Ok(()))?;
            read_logprobs(&turn.logprobs, at, |_, _| ())?;
            continue;
        }
        let span = offsets[row] as usize..offsets[row + 1] as usize;
        let n = span.len();
        let inputs = if input_slice.is_empty() {
            &mut [][..]
        } else {
            &mut input_slice[span.clone()]
        };
        let mut writer = RowMut::new(shape, inputs, &mut target_slice[span.clone()], &mut logprob_slice[span]);
        let p = shape.prompt_len;
        let prompt_exact = read_tokens(&turn.prompt, "prompt_tokens", at, |i, v, _| {
            writer.set_token(i, v);
            Ok(())
        })?;
        let completion_exact = read_tokens(&turn.completion, "completion_tokens", at, |i, v, _| {
            writer.set_token(p + i, v);
            Ok(())
        })?;
        if with_model_inputs {
            // Built before the logprobs are read: reading those may run user
            // code (__float__), which must not change the lists under us.
            let shared = if prompt_exact && completion_exact {
                shared_model_input(&turn.prompt, &turn.completion)?
            } else {
                None
            };
            model_inputs.push(match shared {
                Some(list) => list,
                None => model_input_list(turn, n)?,
            });
        }
        let c = shape.completion_len;
        read_logprobs(&turn.logprobs, at, |k, v| {
            if k < c {
                writer.set_logprob(k, v)
            }
        })?;
        if turn.logprobs.len() != c {
            fitted_turns += 1;
        }
        row += 1;
    }
    let row_advantages: Vec<f32> = kept.iter().map(|t| t.advantage).collect();
    py.detach(|| fill_advantages(&shapes, &row_advantages, &offsets, advantage_slice));
    Ok(Assembled {
        kept: kept.iter().map(|t| t.at).collect(),
        input_tokens,
        model_inputs,
        targets,
        logprobs,
        advantages,
        offsets,
        fitted_turns,
    })
}

/// The model input of a turn whose tokens are not all exact ints (bools,
/// numpy integers): read again, new ints where needed, slot by slot.
fn model_input_list<'py>(turn: &TurnPlan<'py>, n: usize) -> PyResult<Bound<'py, PyList>> {
    let mut list = IntList::new(turn.prompt.py(), n)?;
    let p = turn.prompt.len();
    read_tokens(&turn.prompt, "prompt_tokens", turn.at, |i, v, item| {
        list.set(i, v, item)
    })?;
    read_tokens(&turn.completion, "completion_tokens", turn.at, |i, v, item| {
        match p + i < n {
            true => list.set(p + i, v, item),
            false => Ok(()),
        }
    })?;
    Ok(list.into_list())
}

fn index_column<'py>(
    py: Python<'py>,
    kept: &[Location],
    part: impl Fn(&Location) -> Option<usize>,
) -> Bound<'py, PyAny> {
    let column: Vec<i64> = kept.iter().map(|at| part(at).unwrap_or(0) as i64).collect();
    column.to_pyarray(py).into_any()
}

/// The rows as flat arrays: `(input_tokens, target_tokens, logprobs,
/// advantages, row_offsets, group_idx, traj_idx, turn_idx, fitted_turns)`.
#[pyfunction(name = "assemble_arrays")]
pub fn py_assemble_arrays<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    guarded(|| {
        let py = groups.py();
        let plan = plan_batch(groups, advantages, false)?;
        let rows = assemble_rows(py, &plan, true, false)?;
        PyTuple::new(
            py,
            [
                rows.input_tokens.expect("asked for").into_any(),
                rows.targets.into_any(),
                rows.logprobs.into_any(),
                rows.advantages.into_any(),
                rows.offsets.to_pyarray(py).into_any(),
                index_column(py, &rows.kept, |at| at.group),
                index_column(py, &rows.kept, |at| at.trajectory),
                index_column(py, &rows.kept, |at| at.turn),
                rows.fitted_turns.into_pyobject(py)?.into_any(),
            ],
        )
    })
}

/// `(Datum, ModelInput, EncodedTextChunk, TensorData, DatumMetadata)`.
type ClassTuple<'py> = (
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
    Bound<'py, PyType>,
);

/// `(datums, metadata, fitted_turns)`, built straight into the classes
/// given (tinker's `Datum`, `ModelInput`, `EncodedTextChunk`, `TensorData`
/// and our `DatumMetadata`), filling the fields their constructors would.
#[pyfunction(name = "assemble_datums")]
pub fn py_assemble_datums<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    classes: ClassTuple<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    guarded(|| {
        let py = groups.py();
        let plan = plan_batch(groups, advantages, true)?;
        let rows = assemble_rows(py, &plan, false, true)?;
        let (datum, model_input, chunk, tensor_data, metadata) = classes;
        let classes = DatumClasses {
            datum,
            model_input,
            chunk,
            tensor_data,
            metadata,
        };
        let columns = Columns {
            targets: rows.targets,
            logprobs: rows.logprobs,
            advantages: rows.advantages,
        };
        let (datums, metadata) = build_datums(
            &classes,
            rows.model_inputs,
            &columns,
            &rows.offsets,
            &rows.kept,
            &plan.tags,
        )?;
        PyTuple::new(
            py,
            [
                datums.into_any(),
                metadata.into_any(),
                rows.fitted_turns.into_pyobject(py)?.into_any(),
            ],
        )
    })
}

/// Panics on purpose, so a test can show a panic surfaces as an exception.
#[pyfunction(name = "_panic_probe")]
pub fn py_panic_probe() -> PyResult<()> {
    guarded(|| panic!("panic probe"))
}
