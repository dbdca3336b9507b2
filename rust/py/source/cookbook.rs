//! The tinker-cookbook front door: groups (`trajectories_G`) of trajectories
//! (`transitions`) of transitions (`ob`, a `tinker.ModelInput`; `ac` with
//! `tokens`, `logprobs`, `sequence_id`; `metrics`), read one
//! trajectory at a time and assembled as tinker-cookbook 0.6.1's
//! `rl.data_processing` does: rows merged while each observation extends
//! the sequence so far, `mask`, parse-error masking, provenance spans, and
//! its errors in its order.
//!
//! A non-text chunk is one element per position ([`Element`]: its start,
//! then its rest), numbered by equality with the trajectory's other chunks,
//! so that comparing elements compares chunks as the cookbook does; a
//! chunk's positions have target 0. A chunk of length 0 is one zero-width
//! element: rows are planned with it and filled without it (`pipeline.rs`).

use std::ops::Range;

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyList};

use crate::errors::{ErrorKind, InputError, Location, StepName};
use crate::plan::{Element, Keep, Merge, Row, Segment, TurnSpan};
use crate::py::build::{Column, Dtype, FilledColumns, LossInput, LossKey, MetadataKind};
use crate::py::errors::unsupported;
use crate::py::read::{any_real, attr, is_one_shot, type_name, Item, ItemKind, Items, MAX_TOKEN};
use crate::py::source::ints::Role;
use crate::py::source::{ClosedBefore, FrontDoor, Place, Provenance, RowRule, RowView, TrajectoryIn};

/// What a transition contributes besides its elements.
struct TransitionIn<'py> {
    sequence_id: Option<Bound<'py, PyAny>>,
    masked: bool,
    /// Its logprobs as given, into [`Cookbook::raw_logprobs`].
    logprobs: Range<usize>,
    /// Whether any of them is an `int`.
    int_logprobs: bool,
}

/// The cookbook batch, read group by group as the cookbook iterates it.
pub struct Cookbook<'py> {
    groups: Items<'py>,
    advantages: Items<'py>,
    text_chunk: Bound<'py, PyAny>,
    provenance: bool,
    /// Leave to the cookbook's own function (`Unsupported`) what it reads
    /// otherwise than this door would accept it: a token that is no `int`,
    /// logprobs that are no list or hold what is neither a `float` nor an
    /// `int` within i64, an action without `sequence_id`.
    exact: bool,
    /// The group being read: its trajectories and advantages, and the next
    /// `(group, trajectory)`.
    group: Option<(Items<'py>, Items<'py>)>,
    next: (usize, usize),
    // The trajectory read last (rows are made from it before the next).
    transitions: Vec<TransitionIn<'py>>,
    raw_logprobs: Vec<f64>,
    raw_is_int: Vec<bool>,
    /// The elements of the observation of the transition being read, once
    /// read: if reading it then fails, the cookbook would still have acted
    /// on it (built the row it closes) first.
    pending_ob: Option<Range<usize>>,
}

impl<'py> Cookbook<'py> {
    /// `provenance`: attach provenance spans where the cookbook does;
    /// `exact`: see [`Cookbook::exact`].
    pub fn open(
        groups: &Bound<'py, PyAny>,
        advantages: &Bound<'py, PyAny>,
        text_chunk: Bound<'py, PyAny>,
        provenance: bool,
        exact: bool,
    ) -> PyResult<Self> {
        Ok(Cookbook {
            groups: Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?,
            advantages: Items::of(advantages, "advantages", ItemKind::Rows, Location::BATCH)?,
            text_chunk,
            provenance,
            exact,
            group: None,
            next: (0, 0),
            transitions: Vec::new(),
            raw_logprobs: Vec::new(),
            raw_is_int: Vec::new(),
            pending_ob: None,
        })
    }

    /// The next trajectory and its advantage (as the cookbook takes it: any
    /// float, NaN included), opening groups as it goes.
    fn next_trajectory(&mut self) -> PyResult<Option<(Bound<'py, PyAny>, Place)>> {
        let py = self.groups.py();
        loop {
            let (g, t) = self.next;
            if let Some((trajectories, advantages)) = &self.group {
                if t < trajectories.len() {
                    let at = Location::trajectory(g, t);
                    let item = Item {
                        field: "advantages",
                        index: t,
                    };
                    let advantage = any_real(&advantages.get(t)?, "advantage", item, at)?.0 as f32;
                    self.next = (g, t + 1);
                    let place = Place {
                        group: g,
                        trajectory: t,
                        advantage,
                    };
                    return Ok(Some((trajectories.get(t)?, place)));
                }
                self.group = None;
                self.next = (g + 1, 0);
                continue;
            }
            if g >= self.groups.len() {
                return Ok(None);
            }
            let at = Location::group(g);
            let group = self.groups.get(g)?;
            let trajectories = Items::of_attr(
                &group,
                intern!(py, "trajectories_G"),
                "trajectories_G",
                ItemKind::Object,
                at,
            )?;
            let advantages = Items::of(&self.advantages.get(g)?, "advantages", ItemKind::Real, at)?;
            self.group = Some((trajectories, advantages));
        }
    }

    fn read_trajectory(&mut self, trajectory: &Bound<'py, PyAny>, out: &mut TrajectoryIn<'py>) -> PyResult<()> {
        let py = trajectory.py();
        let Place {
            group: g,
            trajectory: t,
            ..
        } = out.place;
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
            out.ints.begin_turn(start);
            self.read_observation(&transition, at, out)?;
            let ac = attr(&transition, intern!(py, "ac"), at)?;
            let tokens = self.action_tokens(&ac, at)?;
            let mid = out.plain.elements.len();
            let elements = &mut out.plain.elements;
            let not_int = out
                .ints
                .read(&tokens, "ac.tokens", MAX_TOKEN + 1, at, Role::Completion, elements)?;
            self.check_int(not_int, "ac.tokens", at)?;
            let n_tokens = tokens.len();
            // The cookbook reads `ac.logprobs`: its class's property gives
            // `maybe_logprobs` or raises when that is None; a subclass or
            // another type may give something else.
            let logprobs = match ac.getattr(intern!(py, "logprobs")) {
                Ok(l) => l,
                Err(err) => match ac.getattr_opt(intern!(py, "maybe_logprobs"))? {
                    Some(m) if m.is_none() => {
                        return Err(located(
                            ErrorKind::Validation,
                            at,
                            "logprobs are not available (ac.maybe_logprobs is None)",
                        ))
                    }
                    _ => return Err(err),
                },
            };
            if logprobs.is_none() {
                return Err(located(
                    ErrorKind::Validation,
                    at,
                    "logprobs are not available (ac.logprobs is None)",
                ));
            }
            // The cookbook adds them to a list (`[0.0] * n + ac.logprobs`).
            if self.exact && !logprobs.is_instance_of::<PyList>() {
                let message = format!("{at}: ac.logprobs is a {}, not a list", type_name(&logprobs));
                return Err(unsupported(message));
            }
            let logprobs = Items::of(&logprobs, "ac.logprobs", ItemKind::Real, at)?;
            let raw_start = self.raw_logprobs.len();
            let int_logprobs = logprobs.read_any_reals(
                "logprob",
                "ac.logprobs",
                at,
                self.exact,
                &mut self.raw_logprobs,
                &mut self.raw_is_int,
            )?;
            let end = out.plain.elements.len();
            if out.logprobs.len() < end {
                out.logprobs.resize(end, 0.0);
            }
            let n = logprobs.len().min(n_tokens);
            for (dst, &v) in out.logprobs[mid..mid + n]
                .iter_mut()
                .zip(&self.raw_logprobs[raw_start..])
            {
                *dst = v as f32; // torch's float32, overflow to inf included
            }
            out.logprobs[mid + n..end].fill(0.0);
            let sequence_id = ac.getattr_opt(intern!(py, "sequence_id"))?;
            if self.exact && sequence_id.is_none() {
                let message = format!("{at}: {} object has no attribute 'sequence_id'", type_name(&ac));
                return Err(unsupported(message));
            }
            let sequence_id = sequence_id.filter(|s| !s.is_none());
            let masked = parse_error_masked(&transition, at)?;
            out.ints.end_turn(&out.plain.elements, start..mid, mid..end);
            out.plain.turns.push(TurnSpan {
                prompt: start..mid,
                completion: mid..end,
            });
            self.pending_ob = None;
            self.transitions.push(TransitionIn {
                sequence_id,
                masked,
                logprobs: raw_start..self.raw_logprobs.len(),
                int_logprobs,
            });
        }
        Ok(())
    }

    /// A transition's observation into `out`'s elements: tokens, and each
    /// non-text chunk as opaque elements.
    fn read_observation(
        &mut self,
        transition: &Bound<'py, PyAny>,
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
            if chunk.get_type().is(&self.text_chunk) || chunk.is_instance(&self.text_chunk)? {
                let tokens = Items::of_attr(&chunk, intern!(py, "tokens"), "ob tokens", ItemKind::Token, at)?;
                let elements = &mut out.plain.elements;
                let not_int = out
                    .ints
                    .read(&tokens, "ob tokens", MAX_TOKEN + 1, at, Role::Context, elements)?;
                self.check_int(not_int, &format!("ob.chunks[{c}].tokens"), at)?;
            } else {
                // The cookbook asks a chunk its length only after it has
                // acted on the observation (closing the row before it): an
                // error here is raised once the observation is laid out, as
                // if of length 1.
                let length = match attr(&chunk, intern!(py, "length"), at).and_then(|l| l.extract::<usize>()) {
                    Ok(length) => length,
                    Err(e) => {
                        length_error.get_or_insert(e);
                        1
                    }
                };
                let id = chunk_id(&mut out.chunks, chunk)?;
                if length == 0 {
                    out.plain.elements.push(Element::zero_width(id));
                    out.has_zero_width = true;
                } else {
                    out.plain.elements.push(Element::chunk_start(id));
                    out.plain
                        .elements
                        .extend(std::iter::repeat_n(Element::chunk_rest(), length - 1));
                }
            }
        }
        self.pending_ob = Some(start..out.plain.elements.len());
        match length_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<'py> FrontDoor<'py> for Cookbook<'py> {
    fn rule(&self) -> RowRule {
        RowRule {
            merge: Merge::WhilePromptExtends,
            keep: Keep::NonEmpty,
            mask: true,
            int32_inputs: false,
        }
    }

    fn read_next(&mut self, out: &mut TrajectoryIn<'py>) -> PyResult<bool> {
        self.transitions.clear();
        self.raw_logprobs.clear();
        self.raw_is_int.clear();
        self.pending_ob = None;
        let Some((trajectory, place)) = self.next_trajectory()? else {
            return Ok(false);
        };
        out.place = place;
        self.read_trajectory(&trajectory, out)?;
        Ok(true)
    }

    fn rows_before_the_error(&self, traj: &mut TrajectoryIn<'py>) -> Option<ClosedBefore> {
        let u = self.transitions.len();
        traj.plain.turns.truncate(u);
        if let Some(ob) = self.pending_ob.clone() {
            // The failing transition's observation, with no action: it
            // closes the row before it unless it extends it.
            traj.plain.turns.push(TurnSpan {
                prompt: ob.clone(),
                completion: ob.end..ob.end,
            });
        }
        let n = traj.plain.elements.len();
        if traj.logprobs.len() < n {
            traj.logprobs.resize(n, 0.0);
        }
        Some(ClosedBefore {
            turn: u,
            pending: self.pending_ob.is_some(),
        })
    }

    /// Parse-error-masked transitions train on nothing: mask 0, advantage 0.
    fn weights(&self, traj: &TrajectoryIn<'py>, turn: usize) -> (f32, f32) {
        if self.transitions[turn].masked {
            (0.0, 0.0)
        } else {
            (traj.place.advantage, 1.0)
        }
    }

    fn check_row(&self, traj: &TrajectoryIn<'py>, row: &RowView<'_>) -> PyResult<Option<Provenance<'py>>> {
        let at = row.location.named(StepName::Transition);
        // The cookbook makes the spans while it reads each transition, so
        // their errors come before those of building the row.
        let provenance = if self.provenance {
            provenance(&self.transitions, row.row, &contributions(row.segments, row.row), at)?
        } else {
            None
        };
        let last = row.planned.last().map(|p| traj.plain.elements[p.elements.end - 1]);
        if last.is_some_and(|e| !e.is_token()) {
            let message = "the datum's last chunk must be a text chunk (images carry no loss; remove them first)";
            return Err(located(ErrorKind::Validation, at, message));
        }
        if row.row.len < 2 {
            return Err(located(
                ErrorKind::Validation,
                at,
                "need at least 2 tokens for input/target split",
            ));
        }
        Ok(provenance)
    }

    fn loss_inputs(&self, row: &RowView<'_>, columns: FilledColumns<'py>) -> PyResult<Vec<LossInput<'py>>> {
        let py = self.groups.py();
        let n = row.row.len - 1;
        let at = row.location.named(StepName::Transition);
        let parts = contributions(row.segments, row.row);
        let FilledColumns {
            targets,
            logprobs: mut lps,
            advantages,
            mask,
            ..
        } = columns;
        let logprobs = match self.logprob_column(row.row, row.since, &parts, at)? {
            None => LossInput::new(LossKey::Logprobs, Dtype::Float32, lps.into_array().into_any()),
            Some(LogprobColumn::Float(column)) => {
                lps.slice_mut().copy_from_slice(&column);
                LossInput::new(LossKey::Logprobs, Dtype::Float32, lps.into_array().into_any())
            }
            Some(LogprobColumn::Int(column)) => {
                let mut ints = Column::<i64>::zeros(py, n);
                ints.slice_mut().copy_from_slice(&column);
                LossInput::new(LossKey::Logprobs, Dtype::Int64, ints.into_array().into_any())
            }
        };
        // No action token among the targets: the cookbook's advantages are
        // all Python ints there, so torch makes them int64.
        let advantages = if row.row.completion_target {
            LossInput::new(LossKey::Advantages, Dtype::Float32, advantages.into_array().into_any())
        } else {
            LossInput::new(
                LossKey::Advantages,
                Dtype::Int64,
                Column::<i64>::zeros(py, n).into_array().into_any(),
            )
        };
        let mask = mask.expect("the cookbook's rows have a mask");
        Ok(vec![
            LossInput::new(LossKey::TargetTokens, Dtype::Int64, targets.into_array().into_any()),
            logprobs,
            advantages,
            LossInput::new(LossKey::Mask, Dtype::Float32, mask.into_array().into_any()),
        ])
    }

    fn metadata(&self) -> MetadataKind<'_, 'py> {
        MetadataKind::Dict
    }
}

impl<'py> Cookbook<'py> {
    /// `ac.tokens`; in [`Cookbook::exact`] mode, a one-shot iterator is left
    /// to the cookbook unread (it takes their length: any iterator fails).
    fn action_tokens(&self, ac: &Bound<'py, PyAny>, at: Location) -> PyResult<Items<'py>> {
        let tokens = attr(ac, intern!(ac.py(), "tokens"), at)?;
        if self.exact && is_one_shot(&tokens) {
            let message = format!("{at}: ac.tokens is a {}, not a sequence", type_name(&tokens));
            return Err(unsupported(message));
        }
        Items::of(&tokens, "ac.tokens", ItemKind::Token, at)
    }

    /// In [`Cookbook::exact`] mode, a token that is no `int` (the cookbook
    /// takes it for a chunk, which tinker's `ModelInput` refuses) leaves the
    /// batch to the cookbook's own function.
    fn check_int(&self, not_int: Option<usize>, field: &str, at: Location) -> PyResult<()> {
        match not_int {
            Some(k) if self.exact => Err(unsupported(format!("{at}: {field}[{k}] is not an int"))),
            _ => Ok(()),
        }
    }
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

impl Cookbook<'_> {
    /// `since`: the first transition whose logprobs the cookbook gathers
    /// into this row (empty transitions before `row.first_turn` add theirs
    /// too).
    fn logprob_column(
        &self,
        row: &Row,
        since: usize,
        parts: &[(usize, usize)],
        at: Location,
    ) -> PyResult<Option<LogprobColumn>> {
        let transitions = &self.transitions[since..row.first_turn + row.n_turns];
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
                self.raw_logprobs[raw.clone()]
                    .iter()
                    .copied()
                    .zip(self.raw_is_int[raw].iter().copied()),
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

/// The context and action lengths each transition adds to a row.
fn contributions(segments: &[Segment], row: &Row) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); row.n_turns];
    for segment in segments {
        let slot = &mut out[segment.turn - row.first_turn];
        if segment.completion {
            slot.1 += segment.elements.len();
        } else {
            slot.0 += segment.elements.len();
        }
    }
    out
}

/// `(sequence_id, offset, length, sampled)`.
type Span<'py> = crate::py::build::SpanOut<'py>;

/// The cookbook's provenance for a row: `(model_input spans, target spans)`
/// when every transition with tokens has a sequence id and some action
/// token is a target.
fn provenance<'py>(
    transitions: &[TransitionIn<'py>],
    row: &Row,
    parts: &[(usize, usize)],
    at: Location,
) -> PyResult<Option<Provenance<'py>>> {
    let mut spans: Vec<Span<'py>> = Vec::new();
    let mut offset = 0;
    for (k, &(context, action)) in parts.iter().enumerate() {
        let id = transitions[row.first_turn + k].sequence_id.as_ref();
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
