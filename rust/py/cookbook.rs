//! The tinker-cookbook front door: groups (`trajectories_G`) of trajectories
//! (`transitions`) of transitions (`ob`, a `tinker.ModelInput`; `ac` with
//! `tokens`, `maybe_logprobs`, `sequence_id`; `metrics`), read one
//! trajectory at a time into a plain [`Trajectory`] and assembled as
//! tinker-cookbook 0.6.1's `rl.data_processing` does: rows merged while each
//! observation extends the sequence so far, `mask`, parse-error masking and
//! provenance spans.
//!
//! A non-text chunk is one opaque element per position: the first holds
//! `-(id + 1)` (`id` numbers the distinct chunks of the trajectory, equal
//! chunks sharing one), the rest [`CONTINUATION`]; so comparing elements
//! compares chunks by equality, as the cookbook does, and a chunk's
//! positions have target 0.

use pyo3::exceptions::{PyAssertionError, PyValueError};
use std::cell::RefCell;
use std::ops::Range;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList};

use crate::error::{ErrorKind, InputError, Location, StepName};
use crate::plan::{plan_rows, Keep, Merge, Piece, Plan, Row, Trajectory, TurnSpan};
use crate::py::assemble::SIGNAL_CHECK_ROWS;
use crate::py::build::{
    self, ChunkOut, Column, DatumClasses, Dtype, FilledColumns, FilledRow, LossInput, LossKey, ModelInputOut,
    RowColumns, RowMeta, SpanClasses,
};
use crate::py::read::{any_real, attr, Item, ItemKind, Items, MAX_TOKEN};

/// The positions of a non-text chunk after its first.
pub const CONTINUATION: i64 = i64::MIN;

/// A non-text chunk of length 0 is one element that takes no position:
/// `ZERO_WIDTH - id`. Rows are planned with it (the cookbook compares it as
/// it compares any chunk) and filled without it.
const ZERO_WIDTH: i64 = i64::MIN / 2;

fn is_zero_width(e: i64) -> bool {
    e <= ZERO_WIDTH && e != CONTINUATION
}

/// What a transition contributes besides its elements.
struct TransitionIn<'py> {
    sequence_id: Option<Bound<'py, PyAny>>,
    masked: bool,
    /// Its logprobs as given, into [`TrajectoryIn::raw_logprobs`].
    logprobs: std::ops::Range<usize>,
    /// Whether any of them is an `int`.
    int_logprobs: bool,
}

/// A token list as read: its elements `first..first + len`, of which
/// `first + from..` were copied into the trajectory's store at `stored`
/// right after reading them, when every item was an exact `int` read with
/// the collector off (so no Python code ran meanwhile, not even a
/// finalizer: see `Items::read_tokens`): the store's ints are the values read,
/// whatever user code run later (a property, `metrics.get`) does to the
/// caller's list. Elements without a copy are made anew from the values.
struct Source {
    first: usize,
    len: usize,
    from: usize,
    stored: Option<usize>,
}

impl Source {
    /// Reads `tokens` into `out`'s elements; `ob_start`, where the
    /// observation they are part of starts.
    fn read<'py>(
        tokens: &Items<'py>,
        field: &str,
        at: Location,
        out: &mut TrajectoryIn<'py>,
        ob_start: Option<usize>,
    ) -> PyResult<()> {
        let first = out.plain.elements.len();
        let exact = tokens.read_tokens(field, MAX_TOKEN + 1, at, &mut out.plain.elements)?;
        let len = tokens.len();
        let from = ob_start.map_or(0, |start| out.repeated(start, first, len));
        let mut stored = None;
        if exact {
            let mut store = out.store.borrow_mut();
            let store = store.get_or_insert_with(|| {
                let list = PyList::empty(tokens.py());
                build::untrack_list(&list); // ints only
                list
            });
            let at = store.len();
            stored = tokens.append_to(store, from, len)?.then_some(at);
        }
        out.sources.push(Source {
            first,
            len,
            from,
            stored,
        });
        Ok(())
    }
}

/// One trajectory as read.
#[derive(Default)]
struct TrajectoryIn<'py> {
    plain: Trajectory,
    /// Parallel to the elements: each action token's own logprob.
    logprobs: Vec<f32>,
    /// Each transition's logprobs as given, and whether each was an `int`.
    raw_logprobs: Vec<f64>,
    raw_is_int: Vec<bool>,
    transitions: Vec<TransitionIn<'py>>,
    /// The distinct non-text chunks, by id.
    chunks: Vec<Bound<'py, PyAny>>,
    /// The token lists read, in order: text chunks share their ints, from
    /// `store`.
    sources: Vec<Source>,
    /// The ints of the token lists read (see [`Source`]), in order. The
    /// trajectory's last text chunk, when it is all of the store's start,
    /// takes the store itself (`text_tokens`).
    store: RefCell<Option<Bound<'py, PyList>>>,
    /// The elements of the observation of the transition being read, once
    /// read: if reading it then fails, the cookbook would still have acted
    /// on it (built the row it closes) first.
    pending_ob: Option<std::ops::Range<usize>>,
    has_zero_width: bool,
    /// The sequence so far, as the cookbook accumulates it: to know which
    /// observation tokens repeat it (and so are in no Datum).
    sequence: Vec<i64>,
}

impl TrajectoryIn<'_> {
    /// Empty, keeping its buffers for the next trajectory.
    fn clear(&mut self) {
        let TrajectoryIn {
            plain,
            logprobs,
            raw_logprobs,
            raw_is_int,
            transitions,
            chunks,
            sources,
            store,
            pending_ob,
            has_zero_width,
            sequence,
        } = self;
        plain.clear();
        logprobs.clear();
        raw_logprobs.clear();
        raw_is_int.clear();
        transitions.clear();
        chunks.clear();
        sources.clear();
        *store.get_mut() = None;
        *pending_ob = None;
        *has_zero_width = false;
        sequence.clear();
    }

    /// How many of the `len` elements from `first` (of the observation
    /// starting at `ob_start`) repeat the sequence so far, if the
    /// observation read up to them extends it: those go in no Datum unless
    /// the rest of the observation turns out not to extend it.
    fn repeated(&self, ob_start: usize, first: usize, len: usize) -> usize {
        let ob = &self.plain.elements[ob_start..first + len];
        let common = ob.len().min(self.sequence.len());
        if ob[..common] == self.sequence[..common] {
            common.saturating_sub(first - ob_start)
        } else {
            0
        }
    }

    /// The sequence after a transition: its observation's new elements
    /// (all of it, when it does not extend the sequence), then its action.
    fn extend_sequence(&mut self, ob: Range<usize>, action: Range<usize>) {
        let ob = &self.plain.elements[ob];
        if ob.starts_with(&self.sequence) {
            self.sequence.extend_from_slice(&ob[self.sequence.len()..]);
        } else {
            self.sequence.clear();
            self.sequence.extend_from_slice(ob);
        }
        self.sequence.extend_from_slice(&self.plain.elements[action]);
    }
}

fn located(kind: ErrorKind, at: Location, message: impl Into<String>) -> PyErr {
    InputError::new(kind, at, message).into()
}

fn chunk_id<'py>(chunks: &mut Vec<Bound<'py, PyAny>>, chunk: Bound<'py, PyAny>) -> PyResult<usize> {
    for (id, known) in chunks.iter().enumerate() {
        if known.is(&chunk) || known.eq(&chunk)? {
            return Ok(id);
        }
    }
    chunks.push(chunk);
    Ok(chunks.len() - 1)
}

/// Whether the transition was flagged for masking after a parse error
/// (`float(metrics.get("parse_error_masked", 0.0)) >= 1`, as the cookbook reads it).
fn parse_error_masked(transition: &Bound<'_, PyAny>, at: Location) -> PyResult<bool> {
    let py = transition.py();
    let metrics = attr(transition, intern!(py, "metrics"), at)?;
    let flag = metrics.call_method1(intern!(py, "get"), (intern!(py, "parse_error_masked"), 0.0))?;
    let flag = match flag.cast_exact::<PyFloat>() {
        Ok(f) => f.value(),
        // float() of anything else, a str "1" included.
        Err(_) => py.get_type::<PyFloat>().call1((flag,))?.extract::<f64>()?,
    };
    Ok(flag >= 1.0)
}

/// A transition's observation into `out`'s elements: tokens, and each
/// non-text chunk as opaque elements.
fn read_observation<'py>(
    transition: &Bound<'py, PyAny>,
    text_chunk: &Bound<'py, PyAny>,
    at: Location,
    out: &mut TrajectoryIn<'py>,
) -> PyResult<()> {
    let py = transition.py();
    let start = out.plain.elements.len();
    let ob = attr(transition, intern!(py, "ob"), at)?;
    let chunks = Items::of_attr(&ob, intern!(py, "chunks"), "ob.chunks", ItemKind::Object, at)?;
    let mut length_error = None;
    for c in 0..chunks.len() {
        let chunk = chunks.get(c)?;
        // The exact class first: pydantic's isinstance goes through ABCMeta.
        if chunk.get_type().is(text_chunk) || chunk.is_instance(text_chunk)? {
            let tokens = Items::of_attr(&chunk, intern!(py, "tokens"), "ob tokens", ItemKind::Token, at)?;
            Source::read(&tokens, "ob tokens", at, out, Some(start))?;
        } else {
            // The cookbook asks a chunk its length only after it has acted
            // on the observation (closing the row before it): an error here
            // is raised once the observation is laid out, as if of length 1.
            let length = match attr(&chunk, intern!(py, "length"), at).and_then(|l| l.extract::<usize>()) {
                Ok(length) => length,
                Err(e) => {
                    length_error.get_or_insert(e);
                    1
                }
            };
            let id = chunk_id(&mut out.chunks, chunk)? as i64;
            if length == 0 {
                out.plain.elements.push(ZERO_WIDTH - id);
                out.has_zero_width = true;
            } else {
                out.plain.elements.push(-id - 1);
                out.plain.elements.extend(std::iter::repeat_n(CONTINUATION, length - 1));
            }
        }
    }
    out.pending_ob = Some(start..out.plain.elements.len());
    if let Some(e) = length_error {
        return Err(e);
    }
    Ok(())
}

fn read_trajectory<'py>(
    trajectory: &Bound<'py, PyAny>,
    text_chunk: &Bound<'py, PyAny>,
    g: usize,
    t: usize,
    out: &mut TrajectoryIn<'py>,
) -> PyResult<()> {
    let py = trajectory.py();
    let at = Location::trajectory(g, t);
    let transitions = Items::of_attr(
        trajectory,
        intern!(py, "transitions"),
        "transitions",
        ItemKind::Object,
        at,
    )?;
    for u in 0..transitions.len() {
        let at = Location::turn(g, t, u).named(StepName::Transition);
        let transition = transitions.get(u)?;
        let start = out.plain.elements.len();
        read_observation(&transition, text_chunk, at, out)?;
        let ac = attr(&transition, intern!(py, "ac"), at)?;
        let tokens = Items::of_attr(&ac, intern!(py, "tokens"), "ac.tokens", ItemKind::Token, at)?;
        let mid = out.plain.elements.len();
        Source::read(&tokens, "ac.tokens", at, out, None)?;
        let n_tokens = tokens.len();
        let logprobs = match ac.getattr_opt(intern!(py, "maybe_logprobs"))? {
            Some(l) => l,
            None => attr(&ac, intern!(py, "logprobs"), at)?,
        };
        if logprobs.is_none() {
            return Err(located(
                ErrorKind::Value,
                at,
                "logprobs are not available (ac.maybe_logprobs is None)",
            ));
        }
        let logprobs = Items::of(&logprobs, "ac.logprobs", ItemKind::Real, at)?;
        let raw_start = out.raw_logprobs.len();
        let int_logprobs =
            logprobs.read_any_reals("logprob", "ac.logprobs", at, &mut out.raw_logprobs, &mut out.raw_is_int)?;
        out.logprobs.resize(out.plain.elements.len(), 0.0);
        let n = logprobs.len().min(n_tokens);
        for (dst, &v) in out.logprobs[mid..mid + n]
            .iter_mut()
            .zip(&out.raw_logprobs[raw_start..])
        {
            *dst = v as f32; // torch's float32, overflow to inf included
        }
        let sequence_id = ac.getattr_opt(intern!(py, "sequence_id"))?.filter(|s| !s.is_none());
        let masked = parse_error_masked(&transition, at)?;
        out.extend_sequence(start..mid, mid..out.plain.elements.len());
        out.plain.turns.push(TurnSpan {
            prompt: start..mid,
            completion: mid..out.plain.elements.len(),
        });
        out.pending_ob = None;
        out.transitions.push(TransitionIn {
            sequence_id,
            masked,
            logprobs: raw_start..out.raw_logprobs.len(),
            int_logprobs,
        });
    }
    Ok(())
}

/// The context and action lengths each transition adds to a row.
fn contributions(pieces: &[Piece], row: &Row) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); row.n_turns];
    for piece in pieces {
        let slot = &mut out[piece.turn - row.first_turn];
        if piece.completion {
            slot.1 += piece.elements.len();
        } else {
            slot.0 += piece.elements.len();
        }
    }
    out
}

/// `(sequence_id, offset, length, sampled)`.
type Span<'py> = build::SpanOut<'py>;

/// `(model_input spans, target spans)`.
type Provenance<'py> = (Vec<Span<'py>>, Vec<Span<'py>>);

/// The cookbook's provenance for a row: `(model_input spans, target spans)`
/// when every transition with tokens has a sequence id and some action
/// token is a target.
fn provenance<'py>(
    traj: &TrajectoryIn<'py>,
    row: &Row,
    parts: &[(usize, usize)],
    at: Location,
) -> PyResult<Option<Provenance<'py>>> {
    let mut spans: Vec<Span<'py>> = Vec::new();
    let mut offset = 0;
    for (k, &(context, action)) in parts.iter().enumerate() {
        let id = traj.transitions[row.first_turn + k].sequence_id.as_ref();
        if context + action > 0 {
            let Some(id) = id else { return Ok(None) };
            // tinker's span classes refuse an empty id, even where the
            // cookbook then attaches no provenance.
            if !id.is_truthy()? {
                let message = format!("{at}: a provenance span's sequence_id must be non-empty");
                return Err(PyValueError::new_err(message));
            }
            if context > 0 {
                spans.push((id.clone(), offset, context, false));
            }
            if action > 0 {
                spans.push((id.clone(), 0, action, true));
            }
        }
        offset += context + action;
    }
    let Some((first, rest)) = spans.split_first() else {
        return Ok(None);
    };
    let mut targets: Vec<Span<'py>> = Vec::with_capacity(spans.len());
    if first.2 > 1 {
        targets.push((first.0.clone(), first.1 + 1, first.2 - 1, first.3));
    }
    targets.extend(rest.iter().cloned());
    if !targets.iter().any(|s| s.3) {
        return Ok(None);
    }
    let mut inputs = spans;
    let last = inputs.last_mut().expect("spans is not empty");
    if last.2 == 1 {
        inputs.pop();
    } else {
        last.2 -= 1;
    }
    Ok(Some((inputs, targets)))
}

/// The logprob column as the cookbook builds it, where that differs from
/// each action token's own logprob in float32: each transition's context
/// zeros then its logprobs as given, back to back, without the first. That
/// is shifted when a transition's logprobs are not as long as its action,
/// and int64 (torch's choice) when every value left is a Python int.
enum LogprobColumn {
    Float(Vec<f32>),
    Int(Vec<i64>),
}

/// `since`: the first transition whose logprobs the cookbook gathers into
/// this row (empty transitions before `row.first_turn` add theirs too).
fn cookbook_logprobs(
    traj: &TrajectoryIn<'_>,
    row: &Row,
    since: usize,
    parts: &[(usize, usize)],
    at: Location,
) -> PyResult<Option<LogprobColumn>> {
    let transitions = &traj.transitions[since..row.first_turn + row.n_turns];
    let lead = row.first_turn - since;
    let part = |k: usize| if k < lead { (0, 0) } else { parts[k - lead] };
    let aligned = transitions
        .iter()
        .enumerate()
        .all(|(k, tr)| tr.logprobs.len() == part(k).1);
    let any_int = transitions.iter().any(|tr| tr.int_logprobs);
    if aligned && !any_int {
        return Ok(None);
    }
    let mut column: Vec<(f64, bool)> = Vec::with_capacity(row.len);
    for (k, tr) in transitions.iter().enumerate() {
        column.extend(std::iter::repeat_n((0.0, false), part(k).0));
        let raw = tr.logprobs.clone();
        column.extend(
            traj.raw_logprobs[raw.clone()]
                .iter()
                .copied()
                .zip(traj.raw_is_int[raw].iter().copied()),
        );
    }
    if column.len() != row.len {
        let message = format!(
            "{at}: the transitions' logprobs and tokens make {} and {} positions",
            column.len(),
            row.len
        );
        return Err(PyAssertionError::new_err(message));
    }
    let column = &column[1..];
    Ok(Some(if column.iter().all(|c| c.1) {
        LogprobColumn::Int(column.iter().map(|c| c.0 as i64).collect())
    } else {
        LogprobColumn::Float(column.iter().map(|c| c.0 as f32).collect())
    }))
}

/// The model input `S[:-1]` as chunks: runs of tokens as text chunks, each
/// non-text chunk as it was given; `zero_width` are the chunks of length 0
/// with the position they stand before. `last_row`: no later row of the
/// trajectory needs the store.
fn input_chunks<'py>(
    py: Python<'py>,
    traj: &TrajectoryIn<'py>,
    pieces: &[Piece],
    zero_width: &[(usize, usize)],
    n: usize,
    last_row: bool,
) -> PyResult<Vec<ChunkOut<'py>>> {
    let elements = &traj.plain.elements;
    let mut chunks = Vec::new();
    // The current text run, as ranges of elements.
    let mut run: Vec<Range<usize>> = Vec::new();
    let flush = |run: &mut Vec<Range<usize>>, chunks: &mut Vec<ChunkOut<'py>>, last: bool| -> PyResult<()> {
        if !run.is_empty() {
            chunks.push(ChunkOut::Text(text_tokens(py, traj, run, last)?));
            run.clear();
        }
        Ok(())
    };
    let mut zero_width = zero_width.iter().peekable();
    let mut position = 0;
    for piece in pieces {
        let (mut i, end) = (piece.elements.start, piece.elements.end);
        while i < end && position < n {
            while let Some(&(_, id)) = zero_width.next_if(|z| z.0 == position) {
                flush(&mut run, &mut chunks, false)?;
                chunks.push(ChunkOut::Given(traj.chunks[id].clone()));
            }
            if elements[i] >= 0 {
                // Tokens up to the next non-text element, zero-width chunk or `n`.
                let next_zero_width = zero_width.peek().map_or(usize::MAX, |z| z.0);
                let limit = end.min(i + (n.min(next_zero_width) - position));
                let len = if traj.chunks.is_empty() {
                    limit - i // no non-text elements in the trajectory
                } else {
                    elements[i..limit].iter().position(|&e| e < 0).unwrap_or(limit - i)
                };
                match run.last_mut() {
                    Some(last) if last.end == i => last.end += len,
                    _ => run.push(i..i + len),
                }
                i += len;
                position += len;
            } else {
                if elements[i] != CONTINUATION {
                    flush(&mut run, &mut chunks, false)?;
                    chunks.push(ChunkOut::Given(traj.chunks[(-(elements[i] + 1)) as usize].clone()));
                }
                i += 1;
                position += 1;
            }
        }
    }
    while let Some(&(_, id)) = zero_width.next_if(|z| z.0 == position) {
        flush(&mut run, &mut chunks, false)?;
        chunks.push(ChunkOut::Given(traj.chunks[id].clone()));
    }
    flush(&mut run, &mut chunks, last_row)?;
    Ok(chunks)
}

/// A text run's tokens as a list sharing the store's ints (the values read
/// where the store has none). `last`: no later chunk needs the store, so a
/// run that is the store's start takes the store itself, cut after it: no
/// copy, and no reference counting of its ints.
fn text_tokens<'py>(
    py: Python<'py>,
    traj: &TrajectoryIn<'py>,
    run: &[Range<usize>],
    last: bool,
) -> PyResult<Bound<'py, PyList>> {
    // The run as consecutive parts: store ranges (`true`) or element
    // ranges made anew from the values (`false`).
    let mut parts: Vec<(bool, Range<usize>)> = Vec::new();
    for r in run {
        let mut k = traj.sources.partition_point(|s| s.first + s.len <= r.start);
        let mut a = r.start;
        while a < r.end {
            // Every token element was read from a source.
            let source = traj.sources.get(k);
            let b = source.map_or(r.end, |s| r.end.min(s.first + s.len));
            let part = match source.and_then(|s| s.stored.map(|at| (at, s.first + s.from))) {
                Some((at, first)) if a >= first => (true, at + a - first..at + b - first),
                _ => (false, a..b),
            };
            match parts.last_mut() {
                Some((stored, last)) if *stored == part.0 && last.end == part.1.start => last.end = part.1.end,
                _ => parts.push(part),
            }
            (a, k) = (b, k + 1);
        }
    }
    let whole_start = matches!(&parts[..], [(true, range)] if range.start == 0);
    if last && whole_start && traj.store.borrow().is_some() {
        let store = traj.store.borrow_mut().take().expect("the store was just there");
        store.del_slice(parts[0].1.end, store.len())?;
        return Ok(store);
    }
    let store = traj.store.borrow();
    if let ([(true, range)], Some(store)) = (&parts[..], store.as_ref()) {
        let out = store.get_slice(range.start, range.end);
        build::untrack_list(&out);
        return Ok(out);
    }
    let out = PyList::empty(py);
    build::untrack_list(&out);
    for (stored, range) in parts {
        let end = out.len();
        let part = match store.as_ref() {
            Some(store) if stored => store.get_slice(range.start, range.end),
            _ => PyList::new(py, &traj.plain.elements[range])?,
        };
        out.set_slice(end, end, part.as_any())?;
    }
    Ok(out)
}

/// `pieces` without their zero-width elements, and those as `(position in
/// S, chunk id)`.
fn without_zero_width(pieces: &[Piece], elements: &[i64]) -> (Vec<Piece>, Vec<(usize, usize)>) {
    let mut kept = Vec::with_capacity(pieces.len());
    let mut zero_width = Vec::new();
    let mut position = 0;
    for piece in pieces {
        let mut start = piece.elements.start;
        for i in piece.elements.clone() {
            if is_zero_width(elements[i]) {
                if start < i {
                    kept.push(Piece {
                        elements: start..i,
                        ..piece.clone()
                    });
                }
                zero_width.push((position, (ZERO_WIDTH - elements[i]) as usize));
                start = i + 1;
            } else {
                position += 1;
            }
        }
        if start < piece.elements.end {
            kept.push(Piece {
                elements: start..piece.elements.end,
                ..piece.clone()
            });
        }
    }
    (kept, zero_width)
}

fn loss_input(key: LossKey, dtype: Dtype, array: Bound<'_, PyAny>) -> LossInput<'_> {
    LossInput { key, dtype, array }
}

/// One row as the cookbook builds it, with its provenance.
/// `last_row`: the trajectory's last (its chunks may take the store).
#[allow(clippy::too_many_arguments)]
fn cookbook_row<'py>(
    classes: &DatumClasses<'py>,
    traj: &TrajectoryIn<'py>,
    row: &Row,
    pieces: &[Piece],
    (g, t, advantage): (usize, usize, f32),
    since: usize,
    span_classes: Option<&SpanClasses<'py>>,
    last_row: bool,
) -> PyResult<FilledRow<'py>> {
    let py = classes.datum.py();
    let at = Location::turn(g, t, row.first_turn).named(StepName::Transition);
    let last = pieces.last().map_or(0, |p| traj.plain.elements[p.elements.end - 1]);
    let (stripped, zero_width);
    let (pieces, row) = if traj.has_zero_width {
        (stripped, zero_width) = without_zero_width(pieces, &traj.plain.elements);
        let len = stripped.iter().map(|p| p.elements.len()).sum();
        (&stripped[..], &Row { len, ..row.clone() })
    } else {
        zero_width = Vec::new();
        (pieces, row)
    };
    let parts = contributions(pieces, row);
    // The cookbook makes the spans while it reads each transition, so their
    // errors come before those of building the row.
    let provenance = match span_classes {
        Some(_) => provenance(traj, row, &parts, at)?,
        None => None,
    };
    if last < 0 {
        let message = "the datum's last chunk must be a text chunk (images carry no loss; remove them first)";
        return Err(located(ErrorKind::Value, at, message));
    }
    if row.len < 2 {
        return Err(located(
            ErrorKind::Value,
            at,
            "need at least 2 tokens for input/target split",
        ));
    }
    let n = row.len - 1;
    // Parse-error-masked transitions train on nothing: mask 0, advantage 0.
    let weights = |u: usize| {
        if traj.transitions[u].masked {
            (0.0, 0.0)
        } else {
            (advantage, 1.0)
        }
    };
    let FilledColumns {
        targets,
        logprobs: mut lps,
        advantages: advs,
        mask,
        ..
    } = RowColumns::new(py, n, false, true).fill(pieces, &traj.plain.elements, &traj.logprobs, weights)?;
    let mask = mask.expect("asked for a mask");
    let mut logprobs = None;
    match cookbook_logprobs(traj, row, since, &parts, at)? {
        None => {}
        Some(LogprobColumn::Float(column)) => lps.slice_mut().copy_from_slice(&column),
        Some(LogprobColumn::Int(column)) => {
            let mut ints = Column::<i64>::zeros(py, n);
            ints.slice_mut().copy_from_slice(&column);
            logprobs = Some(loss_input(
                LossKey::Logprobs,
                Dtype::Int64,
                ints.into_array().into_any(),
            ));
        }
    }
    let logprobs =
        logprobs.unwrap_or_else(|| loss_input(LossKey::Logprobs, Dtype::Float32, lps.into_array().into_any()));
    // No action token among the targets: the cookbook's advantages are all
    // Python ints there, so torch makes them int64.
    let advantages = if row.completion_target {
        loss_input(LossKey::Advantages, Dtype::Float32, advs.into_array().into_any())
    } else {
        loss_input(
            LossKey::Advantages,
            Dtype::Int64,
            Column::<i64>::zeros(py, n).into_array().into_any(),
        )
    };
    let filled = FilledRow {
        model_input: ModelInputOut::Chunks(input_chunks(py, traj, pieces, &zero_width, n, last_row)?),
        provenance,
        loss_inputs: vec![
            loss_input(LossKey::TargetTokens, Dtype::Int64, targets.into_array().into_any()),
            logprobs,
            advantages,
            loss_input(LossKey::Mask, Dtype::Float32, mask.into_array().into_any()),
        ],
        n,
        meta: RowMeta {
            group: g,
            trajectory: t,
            first_turn: row.first_turn,
            n_turns: row.n_turns,
        },
    };
    Ok(filled)
}

/// When reading transition `u` failed: checks the rows the cookbook would
/// have built before it got there (it builds each as the next observation
/// closes it), so that the first error is the cookbook's.
fn rows_before_the_error<'py>(
    classes: &DatumClasses<'py>,
    traj: &mut TrajectoryIn<'py>,
    plan: &mut Plan,
    place: (usize, usize, f32),
    span_classes: Option<&SpanClasses<'py>>,
) -> PyResult<()> {
    let u = traj.transitions.len();
    traj.plain.turns.truncate(u);
    if let Some(ob) = traj.pending_ob.clone() {
        // The failing transition's observation, with no action: it closes
        // the row before it unless it extends it.
        traj.plain.turns.push(TurnSpan {
            prompt: ob.clone(),
            completion: ob.end..ob.end,
        });
    }
    traj.logprobs.resize(traj.plain.elements.len(), 0.0);
    plan_rows(&traj.plain, Merge::WhilePromptExtends, Keep::NonEmpty, plan);
    // Closed before `u`: rows that end before it, and the one ending at it
    // if `u`'s observation (when read) does not extend it.
    let pending = traj.pending_ob.is_some();
    let closed = plan.rows.iter().filter(|r| {
        let end = r.first_turn + r.n_turns;
        end < u || (pending && end == u)
    });
    let mut since = 0;
    for row in closed {
        cookbook_row(
            classes,
            traj,
            row,
            plan.pieces_of(row),
            place,
            since,
            span_classes,
            false,
        )?;
        since = row.first_turn + row.n_turns;
    }
    Ok(())
}

/// Datums (keys `target_tokens`, `logprobs`, `advantages`, `mask`, with
/// provenance spans where the cookbook attaches them, when `span_classes`
/// are given), and each datum's metadata `{"group_idx": g, "traj_idx": t}`.
pub fn cookbook_datums<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    classes: &DatumClasses<'py>,
    span_classes: Option<&SpanClasses<'py>>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let py = groups.py();
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let advantages = Items::of(advantages, "advantages", ItemKind::Rows, Location::BATCH)?;
    let mut rows = Vec::new();
    let mut plan = Plan::default();
    let mut traj = TrajectoryIn::default();
    for g in 0..groups.len() {
        let at = Location::group(g);
        let group = groups.get(g)?;
        let trajectories = Items::of_attr(
            &group,
            intern!(py, "trajectories_G"),
            "trajectories_G",
            ItemKind::Object,
            at,
        )?;
        let group_advantages = Items::of(&advantages.get(g)?, "advantages", ItemKind::Real, at)?;
        for t in 0..trajectories.len() {
            py.check_signals()?;
            let at = Location::trajectory(g, t);
            // Any float, as the cookbook takes it (its advantages may be NaN).
            let item = Item {
                field: "advantages",
                index: t,
            };
            let advantage = any_real(&group_advantages.get(t)?, "advantage", item, at)?.0 as f32;
            traj.clear();
            if let Err(e) = read_trajectory(&trajectories.get(t)?, classes.chunk.as_any(), g, t, &mut traj) {
                rows_before_the_error(classes, &mut traj, &mut plan, (g, t, advantage), span_classes)?;
                return Err(e);
            }
            plan_rows(&traj.plain, Merge::WhilePromptExtends, Keep::NonEmpty, &mut plan);
            let mut since = 0;
            for (r, row) in plan.rows.iter().enumerate() {
                let pieces = plan.pieces_of(row);
                rows.push(cookbook_row(
                    classes,
                    &traj,
                    row,
                    pieces,
                    (g, t, advantage),
                    since,
                    span_classes,
                    r + 1 == plan.rows.len(),
                )?);
                since = row.first_turn + row.n_turns;
            }
        }
    }
    let datums = PyList::empty(py);
    let metadata = PyList::empty(py);
    for (i, row) in rows.into_iter().enumerate() {
        if i % SIGNAL_CHECK_ROWS == SIGNAL_CHECK_ROWS - 1 {
            py.check_signals()?;
        }
        // A dict of ints: CPython keeps it off the GC's books.
        let meta = PyDict::new(py);
        meta.set_item(intern!(py, "group_idx"), row.meta.group)?;
        meta.set_item(intern!(py, "traj_idx"), row.meta.trajectory)?;
        metadata.append(meta)?;
        datums.append(build::datum(classes, span_classes, row)?)?;
    }
    Ok((datums, metadata))
}
