//! The one pipeline behind every exported assembly function, whatever the
//! front door (`source`): read a trajectory -> plan its rows (`plan.rs`)
//! -> fill each row's columns straight into its own arrays (`fill.rs`) ->
//! build tinker's objects (`build`). Pending signals (Ctrl-C) are checked
//! before each trajectory and every [`SIGNAL_CHECK_ROWS`] Datums built.

use std::ops::Range;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::errors::Location;
use crate::fill::{fill_row, Inputs, RowOut};
use crate::plan::{plan_rows, Element, ElementKind, Plan, Row, Segment};
use crate::py::build::{Builder, ChunkOut, FilledRow, ModelInputOut, RowColumns, RowMeta, Unwritten};
use crate::py::source::{element_span, FrontDoor, RowView, TrajectoryIn};

/// How often (in rows built) pending signals are checked while building.
pub const SIGNAL_CHECK_ROWS: usize = 256;

/// Every Datum of the batch and its metadata, in batch order.
pub fn datums<'py, D: FrontDoor<'py>>(
    door: &mut D,
    builder: &Builder<'py>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let py = builder.py();
    let rule = door.rule();
    let mut traj = TrajectoryIn::default();
    let mut plan = Plan::default();
    let mut rows = Vec::new();
    loop {
        py.check_signals()?;
        traj.clear(!rule.int32_inputs, rule.merge);
        match door.read_next(&mut traj) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                if let Some(closed) = door.rows_before_the_error(&mut traj) {
                    plan_rows(&traj.plain, rule.merge, rule.keep, &mut plan);
                    let mut since = 0;
                    for r in 0..plan.rows.len() {
                        if closed.contains(&plan.rows[r]) {
                            filled_row(py, &*door, &mut traj, &plan, r, since)?;
                            since = plan.rows[r].first_turn + plan.rows[r].n_turns;
                        }
                    }
                }
                return Err(e);
            }
        }
        plan_rows(&traj.plain, rule.merge, rule.keep, &mut plan);
        let mut since = 0;
        for r in 0..plan.rows.len() {
            rows.push(filled_row(py, &*door, &mut traj, &plan, r, since)?);
            since = plan.rows[r].first_turn + plan.rows[r].n_turns;
        }
    }
    let metadata_kind = door.metadata();
    let datums = PyList::empty(py);
    let metadata = PyList::empty(py);
    for (i, row) in rows.into_iter().enumerate() {
        if i % SIGNAL_CHECK_ROWS == SIGNAL_CHECK_ROWS - 1 {
            py.check_signals()?;
        }
        metadata.append(builder.metadata(&metadata_kind, &row.meta)?)?;
        datums.append(builder.datum(row)?)?;
    }
    Ok((datums, metadata))
}

/// Row `r` of `plan`, checked, filled and laid out as a Datum's parts.
fn filled_row<'py, D: FrontDoor<'py>>(
    py: Python<'py>,
    door: &D,
    traj: &mut TrajectoryIn<'py>,
    plan: &Plan,
    r: usize,
    since: usize,
) -> PyResult<FilledRow<'py>> {
    let rule = door.rule();
    let row = &plan.rows[r];
    let planned = plan.segments_of(row);
    let (stripped, zero_width);
    let (segments, row) = if traj.has_zero_width {
        (stripped, zero_width) = without_zero_width(planned, &traj.plain.elements);
        // Position 0 is no target: a completion that a zero-width chunk put
        // after it in the plan may now start the row.
        let (mut len, mut completion_target) = (0, false);
        for segment in &stripped {
            completion_target |= segment.completion && (len > 0 || segment.elements.len() > 1);
            len += segment.elements.len();
        }
        (
            &stripped[..],
            &Row {
                len,
                completion_target,
                ..row.clone()
            },
        )
    } else {
        zero_width = Vec::new();
        (planned, row)
    };
    let place = traj.place;
    let view = RowView {
        row,
        segments,
        planned,
        since,
        location: Location::turn(place.group, place.trajectory, row.first_turn),
    };
    let provenance = door.check_row(traj, &view)?;
    let n = row.len - 1;
    let mut columns = RowColumns::new(py, n, rule.int32_inputs, rule.mask).fill(
        segments,
        &traj.plain.elements,
        &traj.logprobs,
        |turn| door.weights(traj, turn),
    )?;
    let model_input = match columns.inputs.take() {
        Some(tokens) => ModelInputOut::Tokens(tokens.into_read_only().into_any()),
        None => input_chunks(py, traj, segments, &zero_width, n)?,
    };
    let loss_inputs = door.loss_inputs(&view, columns)?;
    Ok(FilledRow {
        model_input,
        loss_inputs,
        provenance,
        n,
        meta: RowMeta {
            group: place.group,
            trajectory: place.trajectory,
            first_turn: row.first_turn,
            n_turns: row.n_turns,
        },
    })
}

/// The model input `S[:-1]` as chunks: runs of tokens as text chunks, each
/// non-text chunk as it was given; `zero_width` are the chunks of length 0
/// with the position they stand before.
fn input_chunks<'py>(
    py: Python<'py>,
    traj: &mut TrajectoryIn<'py>,
    segments: &[Segment],
    zero_width: &[(usize, usize)],
    n: usize,
) -> PyResult<ModelInputOut<'py>> {
    let TrajectoryIn {
        plain,
        chunks: given,
        ints,
        runs: run,
        ..
    } = traj;
    let elements = &plain.elements;
    let span = element_span(segments);
    let mut chunks = Chunks::default();
    // The current text run, as ranges of elements.
    run.clear();
    let mut flush = |run: &mut Vec<Range<usize>>, chunks: &mut Chunks<'py>, last: bool| -> PyResult<()> {
        if !run.is_empty() {
            chunks.push(ChunkOut::Text(ints.text(py, elements, run, &span, last)?));
            run.clear();
        }
        Ok(())
    };
    let mut zero_width = zero_width.iter().peekable();
    let mut position = 0;
    for segment in segments {
        let (mut i, end) = (segment.elements.start, segment.elements.end);
        while i < end && position < n {
            while let Some(&(_, id)) = zero_width.next_if(|z| z.0 == position) {
                flush(run, &mut chunks, false)?;
                chunks.push(ChunkOut::Given(given[id].clone()));
            }
            if elements[i].is_token() {
                // Tokens up to the next non-text element, zero-width chunk or `n`.
                let next_zero_width = zero_width.peek().map_or(usize::MAX, |z| z.0);
                let limit = end.min(i + (n.min(next_zero_width) - position));
                let len = if given.is_empty() {
                    limit - i // no non-text elements in the trajectory
                } else {
                    elements[i..limit]
                        .iter()
                        .position(|e| !e.is_token())
                        .unwrap_or(limit - i)
                };
                match run.last_mut() {
                    Some(last) if last.end == i => last.end += len,
                    _ => run.push(i..i + len),
                }
                i += len;
                position += len;
            } else {
                if let ElementKind::ChunkStart(id) = elements[i].kind() {
                    flush(run, &mut chunks, false)?;
                    chunks.push(ChunkOut::Given(given[id].clone()));
                }
                i += 1;
                position += 1;
            }
        }
    }
    while let Some(&(_, id)) = zero_width.next_if(|z| z.0 == position) {
        flush(run, &mut chunks, false)?;
        chunks.push(ChunkOut::Given(given[id].clone()));
    }
    flush(run, &mut chunks, true)?;
    Ok(match chunks {
        Chunks { first: Some(one), rest } if rest.is_empty() => ModelInputOut::Chunk(one),
        Chunks { first, mut rest } => {
            rest.splice(0..0, first);
            ModelInputOut::Chunks(rest)
        }
    })
}

/// A row's chunks in order, the first outside the Vec (most rows have one).
#[derive(Default)]
struct Chunks<'py> {
    first: Option<ChunkOut<'py>>,
    rest: Vec<ChunkOut<'py>>,
}

impl<'py> Chunks<'py> {
    fn push(&mut self, chunk: ChunkOut<'py>) {
        if self.first.is_none() {
            self.first = Some(chunk);
        } else {
            self.rest.push(chunk);
        }
    }
}

/// `segments` without their zero-width elements, and those as `(position in
/// S, chunk id)`.
fn without_zero_width(segments: &[Segment], elements: &[Element]) -> (Vec<Segment>, Vec<(usize, usize)>) {
    let mut kept = Vec::with_capacity(segments.len());
    let mut zero_width = Vec::new();
    let mut position = 0;
    for segment in segments {
        let mut start = segment.elements.start;
        for i in segment.elements.clone() {
            if let ElementKind::ZeroWidth(id) = elements[i].kind() {
                if start < i {
                    kept.push(Segment {
                        elements: start..i,
                        ..segment.clone()
                    });
                }
                zero_width.push((position, id));
                start = i + 1;
            } else {
                position += 1;
            }
        }
        if start < segment.elements.end {
            kept.push(Segment {
                elements: start..segment.elements.end,
                ..segment.clone()
            });
        }
    }
    (kept, zero_width)
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
}

fn index(i: usize) -> i64 {
    i64::try_from(i).expect("an index fits in i64")
}

/// Every row of the batch as flat columns, no Datums; `capacity` bounds
/// the positions of all rows (their sum, one row per turn).
pub fn arrays<'py, D: FrontDoor<'py>>(py: Python<'py>, door: &mut D, capacity: usize) -> PyResult<FlatRows<'py>> {
    let rule = door.rule();
    let mut inputs = Unwritten::<i64>::new(py, capacity);
    let mut targets = Unwritten::<i64>::new(py, capacity);
    let mut lps = Unwritten::<f32>::new(py, capacity);
    let mut advs = Unwritten::<f32>::new(py, capacity);
    let mut offsets = vec![0i64];
    let (mut group_idx, mut traj_idx, mut turn_idx, mut n_turns) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut traj = TrajectoryIn::default();
    let mut plan = Plan::default();
    let mut end = 0;
    loop {
        py.check_signals()?;
        traj.clear(false, rule.merge);
        if !door.read_next(&mut traj)? {
            break;
        }
        plan_rows(&traj.plain, rule.merge, rule.keep, &mut plan);
        for row in &plan.rows {
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
                plan.segments_of(row),
                &traj.plain.elements,
                &traj.logprobs,
                |turn| door.weights(&traj, turn),
                out,
            )?;
            offsets.push(index(end));
            group_idx.push(index(traj.place.group));
            traj_idx.push(index(traj.place.trajectory));
            turn_idx.push(index(row.first_turn));
            n_turns.push(index(row.n_turns));
        }
    }
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
    })
}
