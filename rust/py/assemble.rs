//! The evsys front door's pipeline (the cookbook's is in `cookbook.rs`):
//! read (`evsys.rs`) -> plan (rows per turn or merged) -> fill (the numeric
//! core, straight into each row's own arrays) -> build (tinker's objects).

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::plan::{plan_rows, Keep, Merge, Piece, Plan, Trajectory};
use crate::py::build::{
    self, DatumClasses, Dtype, FilledRow, LossInput, LossKey, ModelInputOut, RowColumns, RowMeta, Unwritten,
};
use crate::py::evsys::{self, Batch, FitReport, TrajectoryIn};
use crate::py::read::MAX_TOKEN;
use crate::rows::{fill_row, Inputs, RowOut};

/// What the caller asked for.
#[derive(Clone, Copy)]
pub struct Options {
    pub merge: Merge,
    /// Tokens must be below this: the vocabulary size, or 2**31.
    pub token_limit: i64,
    pub model_input: ModelInputKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ModelInputKind {
    /// A list of Python ints (sharing the caller's where it can).
    List,
    /// A read-only int32 numpy array.
    Int32,
}

impl Options {
    pub fn new(merge_turns: bool, vocab_size: Option<i64>, model_input: ModelInputKind) -> Self {
        Options {
            merge: if merge_turns {
                Merge::WhilePromptExtends
            } else {
                Merge::PerTurn
            },
            token_limit: vocab_size.map_or(MAX_TOKEN + 1, |v| v.min(MAX_TOKEN + 1)),
            model_input,
        }
    }
}

/// How often (in rows built) pending signals are checked while building.
pub const SIGNAL_CHECK_ROWS: usize = 256;

/// Walks the batch one trajectory at a time: reads it (sweep 2), plans its
/// rows and hands each to `row`, with the trajectory and whether its values
/// were all exact. Pending signals (Ctrl-C) are checked before each
/// trajectory, so a long call stops within one trajectory's work.
fn for_each_row<'py>(
    py: Python<'py>,
    batch: &Batch<'py>,
    options: Options,
    fit: &mut FitReport,
    mut row: impl FnMut(&TrajectoryIn, &Trajectory, &[f32], &Plan, usize, bool) -> PyResult<()>,
) -> PyResult<()> {
    let mut trajectory = Trajectory::default();
    let mut logprobs = Vec::new();
    let mut plan = Plan::default();
    for traj in &batch.trajectories {
        py.check_signals()?;
        let exact = evsys::read_values(batch, traj, options.token_limit, &mut trajectory, &mut logprobs, fit)?;
        plan_rows(&trajectory, options.merge, Keep::WithCompletionTarget, &mut plan);
        for r in 0..plan.rows.len() {
            row(traj, &trajectory, &logprobs, &plan, r, exact)?;
        }
    }
    Ok(())
}

/// The evsys Datums and their `DatumMetadata`.
pub fn evsys_datums<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    classes: &DatumClasses<'py>,
    options: Options,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, FitReport)> {
    let py = groups.py();
    let batch = evsys::read_structure(groups, advantages, true)?;
    let mut fit = FitReport::default();
    let mut rows = Vec::new();
    for_each_row(
        py,
        &batch,
        options,
        &mut fit,
        |traj, trajectory, logprobs, plan, r, exact| {
            let row = &plan.rows[r];
            let pieces = plan.pieces_of(row);
            let n = row.len - 1;
            let columns = RowColumns::new(py, n, options.model_input == ModelInputKind::Int32, false).fill(
                pieces,
                &trajectory.elements,
                logprobs,
                |_| (traj.advantage, 1.0),
            )?;
            let tokens = match columns.inputs {
                Some(column) => column.into_read_only().into_any(),
                None => model_input_list(&batch, traj, trajectory, pieces, n, exact)?.into_any(),
            };
            rows.push(FilledRow {
                model_input: ModelInputOut::Tokens(tokens),
                provenance: None,
                loss_inputs: vec![
                    LossInput {
                        key: LossKey::TargetTokens,
                        dtype: Dtype::Int64,
                        array: columns.targets.into_array().into_any(),
                    },
                    LossInput {
                        key: LossKey::Logprobs,
                        dtype: Dtype::Float32,
                        array: columns.logprobs.into_array().into_any(),
                    },
                    LossInput {
                        key: LossKey::Advantages,
                        dtype: Dtype::Float32,
                        array: columns.advantages.into_array().into_any(),
                    },
                ],
                n,
                meta: RowMeta {
                    group: traj.group,
                    trajectory: traj.index,
                    first_turn: row.first_turn,
                    n_turns: row.n_turns,
                },
            });
            Ok(())
        },
    )?;
    let datums = PyList::empty(py);
    let metadata = PyList::empty(py);
    for (i, row) in rows.into_iter().enumerate() {
        if i % SIGNAL_CHECK_ROWS == SIGNAL_CHECK_ROWS - 1 {
            py.check_signals()?;
        }
        metadata.append(build::metadata(
            &classes.metadata,
            &row.meta,
            &batch.tags[row.meta.group],
        )?)?;
        datums.append(build::datum(classes, None, row)?)?;
    }
    Ok((datums, metadata, fit))
}

/// `S[:-1]` of a row as a list of ints. When every value of the trajectory
/// was an exact int or float read with the collector off, no Python code
/// ran since its tokens were read (see `Items::read_tokens`), so the
/// caller's sequences still hold exactly those ints: the list
/// shares them, copied slice by slice by CPython. Otherwise (bools, numpy
/// integers, user objects) it is made from the values read.
fn model_input_list<'py>(
    batch: &Batch<'py>,
    traj: &TrajectoryIn,
    trajectory: &Trajectory,
    pieces: &[Piece],
    n: usize,
    exact: bool,
) -> PyResult<Bound<'py, PyList>> {
    let py = batch.turns[traj.turns.start].prompt.py();
    if exact {
        let out = PyList::empty(py);
        // It will hold only ints: off the GC's books.
        build::untrack_list(&out);
        for piece in pieces {
            let turn = &batch.turns[traj.turns.start + piece.turn];
            let span = &trajectory.turns[piece.turn];
            let (items, field_start) = if piece.completion {
                (&turn.completion, span.completion.start)
            } else {
                (&turn.prompt, span.prompt.start)
            };
            let (a, b) = (piece.elements.start - field_start, piece.elements.end - field_start);
            if !items.append_to(&out, a, b)? {
                return model_input_from_values(py, trajectory, pieces, n);
            }
        }
        out.del_slice(n, n + 1)?;
        debug_assert_eq!(out.len(), n);
        return Ok(out);
    }
    model_input_from_values(py, trajectory, pieces, n)
}

fn model_input_from_values<'py>(
    py: Python<'py>,
    trajectory: &Trajectory,
    pieces: &[Piece],
    n: usize,
) -> PyResult<Bound<'py, PyList>> {
    let values = pieces
        .iter()
        .flat_map(|p| trajectory.elements[p.elements.clone()].iter());
    let out = PyList::new(py, values.take(n))?;
    build::untrack_list(&out);
    Ok(out)
}

/// The rows as flat columns (row `i` is `offsets[i]..offsets[i + 1]`).
pub struct FlatRows<'py> {
    pub input_tokens: Bound<'py, PyArray1<i64>>,
    pub targets: Bound<'py, PyArray1<i64>>,
    pub logprobs: Bound<'py, PyArray1<f32>>,
    pub advantages: Bound<'py, PyArray1<f32>>,
    pub offsets: Bound<'py, PyArray1<i64>>,
    pub group_idx: Bound<'py, PyArray1<i64>>,
    pub traj_idx: Bound<'py, PyArray1<i64>>,
    pub turn_idx: Bound<'py, PyArray1<i64>>,
    pub n_turns: Bound<'py, PyArray1<i64>>,
    pub fit: FitReport,
}

fn index(i: usize) -> i64 {
    i64::try_from(i).expect("an index fits in i64")
}

pub fn evsys_arrays<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    options: Options,
) -> PyResult<FlatRows<'py>> {
    let py = groups.py();
    let batch = evsys::read_structure(groups, advantages, false)?;
    // Per turn the sizes are known now; merged rows are shorter.
    let capacity: usize = batch
        .turns
        .iter()
        .map(|t| (t.prompt.len() + t.completion.len()).saturating_sub(1))
        .sum();
    let mut inputs = Unwritten::<i64>::new(py, capacity);
    let mut targets = Unwritten::<i64>::new(py, capacity);
    let mut lps = Unwritten::<f32>::new(py, capacity);
    let mut advs = Unwritten::<f32>::new(py, capacity);
    let mut offsets = vec![0i64];
    let (mut group_idx, mut traj_idx, mut turn_idx, mut n_turns) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut fit = FitReport::default();
    let mut end = 0;
    for_each_row(
        py,
        &batch,
        options,
        &mut fit,
        |traj, trajectory, logprobs, plan, r, _| {
            let row = &plan.rows[r];
            let start = end;
            end = start + row.len - 1;
            let out = RowOut {
                inputs: Inputs::I64(&mut inputs.slots()[start..end]),
                targets: &mut targets.slots()[start..end],
                logprobs: &mut lps.slots()[start..end],
                advantages: &mut advs.slots()[start..end],
                mask: None,
            };
            fill_row(
                plan.pieces_of(row),
                &trajectory.elements,
                logprobs,
                |_| (traj.advantage, 1.0),
                out,
            )?;
            offsets.push(index(end));
            group_idx.push(index(traj.group));
            traj_idx.push(index(traj.index));
            turn_idx.push(index(row.first_turn));
            n_turns.push(index(row.n_turns));
            Ok(())
        },
    )?;
    // Rows fill the columns from the start; merged rows leave a tail unused.
    // SAFETY: each row's `fill_row` returned `Ok`, writing its positions in
    // full, and the rows cover `0..end` back to back.
    let (input_tokens, targets, logprobs, advantages) = unsafe {
        (
            inputs.assume_written_prefix(end)?,
            targets.assume_written_prefix(end)?,
            lps.assume_written_prefix(end)?,
            advs.assume_written_prefix(end)?,
        )
    };
    Ok(FlatRows {
        input_tokens,
        targets,
        logprobs,
        advantages,
        offsets: PyArray1::from_vec(py, offsets),
        group_idx: PyArray1::from_vec(py, group_idx),
        traj_idx: PyArray1::from_vec(py, traj_idx),
        turn_idx: PyArray1::from_vec(py, turn_idx),
        n_turns: PyArray1::from_vec(py, n_turns),
        fit,
    })
}
