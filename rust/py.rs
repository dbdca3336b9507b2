//! The Python-facing functions (exported without the `py_` prefix): walk the
//! user's groups, hand flat buffers to the numeric core, return numpy arrays.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyArray1, ToPyArray};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::intern;

use crate::advantages::{extend_group_advantages, reward_stats};
use crate::error::{ErrorKind, InputError, Location};
use crate::read::{attr, model_input_list, read_fitted_logprobs, read_real, read_tokens, ItemKind, Items};
use crate::rows::{fill_rows, TurnSpan};

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
        Err(PyRuntimeError::new_err(format!("internal error in tinker_rl_data (please report): {what}")))
    })
}

/// Each group's trajectory count and all rewards, in order, checked.
fn read_rewards(groups: &Bound<'_, PyAny>) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let py = groups.py();
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let mut sizes = Vec::with_capacity(groups.len());
    let mut rewards = Vec::new();
    for g in 0..groups.len() {
        let at = Location::group(g);
        let trajectories = attr(&groups.get_bound(g)?, intern!(py, "trajectories"), at)?;
        let trajectories = Items::of(&trajectories, "trajectories", ItemKind::Object, at)?;
        for t in 0..trajectories.len() {
            let at = Location::trajectory(g, t);
            let reward = attr(&trajectories.get_bound(t)?, intern!(py, "reward"), at)?;
            rewards.push(read_real(&reward, "reward", false, at)?);
        }
        sizes.push(trajectories.len());
    }
    Ok((sizes, rewards))
}

#[pyfunction(name = "compute_advantages")]
pub fn py_compute_advantages(groups: &Bound<'_, PyAny>, normalize: bool) -> PyResult<Vec<Vec<f64>>> {
    guarded(|| {
        let (sizes, rewards) = read_rewards(groups)?;
        let mut out = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for size in sizes {
            let mut advantages = Vec::with_capacity(size);
            extend_group_advantages(&rewards[start..start + size], normalize, &mut advantages);
            out.push(advantages);
            start += size;
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

/// Everything read from the batch, validated, before any row is filled.
#[derive(Default)]
struct Batch<'py> {
    spans: Vec<TurnSpan>,
    tokens: Vec<i32>,
    logprobs: Vec<f32>,
    model_inputs: Vec<Bound<'py, PyList>>,
    /// (group, trajectory, turn) of each kept turn.
    index: [Vec<i64>; 3],
    fitted_turns: usize,
}

fn read_batch<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    with_model_inputs: bool,
) -> PyResult<Batch<'py>> {
    let py = groups.py();
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let advantages = Items::of(advantages, "advantages", ItemKind::Object, Location::BATCH)?;
    if advantages.len() != groups.len() {
        return Err(input_error(InputError::new(
            ErrorKind::Value,
            Location::BATCH,
            format!("advantages has {} groups for {} trajectory groups", advantages.len(), groups.len()),
        )));
    }
    let mut batch = Batch::default();
    for g in 0..groups.len() {
        let at = Location::group(g);
        let trajectories = attr(&groups.get_bound(g)?, intern!(py, "trajectories"), at)?;
        let trajectories = Items::of(&trajectories, "trajectories", ItemKind::Object, at)?;
        let group_advantages = Items::of(&advantages.get_bound(g)?, "advantages", ItemKind::Real, at)?;
        if group_advantages.len() != trajectories.len() {
            return Err(input_error(InputError::new(
                ErrorKind::Value,
                at,
                format!("advantages has {} entries for {} trajectories", group_advantages.len(), trajectories.len()),
            )));
        }
        for t in 0..trajectories.len() {
            let at = Location::trajectory(g, t);
            let trajectory = trajectories.get_bound(t)?;
            read_real(&attr(&trajectory, intern!(py, "reward"), at)?, "reward", false, at)?;
            let advantage = read_real(&group_advantages.get_bound(t)?, "advantage", true, at)? as f32;
            let turns = attr(&trajectory, intern!(py, "turns"), at)?;
            let turns = Items::of(&turns, "turns", ItemKind::Object, at)?;
            for u in 0..turns.len() {
                read_turn(&turns.get_bound(u)?, Location::turn(g, t, u), advantage, with_model_inputs, &mut batch)?;
            }
        }
    }
    Ok(batch)
}

fn read_turn<'py>(
    turn: &Bound<'py, PyAny>,
    at: Location,
    advantage: f32,
    with_model_inputs: bool,
    batch: &mut Batch<'py>,
) -> PyResult<()> {
    let py = turn.py();
    let prompt = Items::of(&attr(turn, intern!(py, "prompt_tokens"), at)?, "prompt_tokens", ItemKind::Token, at)?;
    let completion =
        Items::of(&attr(turn, intern!(py, "completion_tokens"), at)?, "completion_tokens", ItemKind::Token, at)?;
    let logprobs = Items::of(&attr(turn, intern!(py, "logprobs"), at)?, "logprobs", ItemKind::Real, at)?;

    let start = batch.tokens.len();
    let prompt_exact = read_tokens(&prompt, "prompt_tokens", at, &mut batch.tokens)?;
    let completion_exact = read_tokens(&completion, "completion_tokens", at, &mut batch.tokens)?;
    let (p, c) = (prompt.len(), completion.len());
    if !TurnSpan::is_kept(p, c) {
        // Still checked, but no row: drop its tokens and vet its logprobs.
        batch.tokens.truncate(start);
        read_fitted_logprobs(&logprobs, 0, at, &mut Vec::new())?;
        return Ok(());
    }
    if with_model_inputs {
        // Built before the logprobs are read: reading those may run user
        // code (__float__), which must not change the lists under us.
        let values = &batch.tokens[start..];
        batch.model_inputs.push(model_input_list(py, &prompt, &completion, values, prompt_exact && completion_exact)?);
    }
    if read_fitted_logprobs(&logprobs, c, at, &mut batch.logprobs)? {
        batch.fitted_turns += 1;
    }
    batch.spans.push(TurnSpan { prompt_len: p, completion_len: c, advantage });
    let (g, t, u) = (at.group.unwrap_or(0), at.trajectory.unwrap_or(0), at.turn.unwrap_or(0));
    for (column, value) in batch.index.iter_mut().zip([g, t, u]) {
        column.push(value as i64);
    }
    Ok(())
}

/// Reads and checks the whole batch, then fills the rows with the GIL
/// released. Returns `(model_inputs, input_tokens, target_tokens, logprobs,
/// advantages, row_offsets, group_idx, traj_idx, turn_idx, fitted_turns)`;
/// `model_inputs` (a list of int lists) when asked for, else `input_tokens`
/// (flat int64), the other one `None`.
#[pyfunction(name = "assemble")]
pub fn py_assemble<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    model_inputs: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    guarded(|| {
        let py = groups.py();
        let batch = read_batch(groups, advantages, model_inputs)?;
        let Batch { spans, tokens, logprobs, model_inputs: lists, index, fitted_turns } = batch;
        let rows = py.detach(|| fill_rows(&spans, &tokens, &logprobs, !model_inputs));
        drop((tokens, logprobs));
        let (model_inputs, input_tokens): (Bound<'py, PyAny>, Bound<'py, PyAny>) = if model_inputs {
            (PyList::new(py, lists)?.into_any(), py.None().into_bound(py))
        } else {
            (py.None().into_bound(py), PyArray1::from_vec(py, rows.input_tokens).into_any())
        };
        let [group_idx, traj_idx, turn_idx] = index;
        PyTuple::new(
            py,
            [
                model_inputs,
                input_tokens,
                PyArray1::from_vec(py, rows.targets).into_any(),
                PyArray1::from_vec(py, rows.logprobs).into_any(),
                PyArray1::from_vec(py, rows.advantages).into_any(),
                PyArray1::from_vec(py, rows.offsets).into_any(),
                group_idx.to_pyarray(py).into_any(),
                traj_idx.to_pyarray(py).into_any(),
                turn_idx.to_pyarray(py).into_any(),
                fitted_turns.into_pyobject(py)?.into_any(),
            ],
        )
    })
}

/// Panics on purpose, so a test can show a panic surfaces as an exception.
#[pyfunction(name = "_panic_probe")]
pub fn py_panic_probe() -> PyResult<()> {
    guarded(|| panic!("panic probe"))
}
