//! The front doors: one reader per input shape, each yielding, trajectory
//! by trajectory, the same plain description the rest of the pipeline
//! works on ([`TrajectoryIn`]), and saying what its rows carry
//! ([`FrontDoor`]).
//!
//! - `evsys`: groups of trajectories of turns (`prompt_tokens`,
//!   `completion_tokens`, `logprobs`), the evsys API;
//! - `cookbook`: tinker-cookbook's groups of trajectories of transitions
//!   (an observation `ModelInput`, an action with logprobs).
//!
//! Token and logprob sequences in either may be lists, tuples, any
//! iterable, or buffers of numbers (`read::Items`); the int-sharing rule
//! for model-input lists is one for both (`ints`).

pub mod cookbook;
pub mod evsys;
pub mod ints;

use std::ops::Range;

use pyo3::prelude::*;

use crate::errors::Location;
use crate::plan::{Keep, Merge, Row, Segment, Trajectory};
use crate::py::build::{FilledColumns, LossInput, MetadataKind, SpanOut};
use ints::SharedInts;

/// One trajectory as read, whatever its front door.
#[derive(Default)]
pub struct TrajectoryIn<'py> {
    /// Its turns' elements: tokens, and non-text chunks as opaque elements
    /// (see `cookbook`).
    pub plain: Trajectory,
    /// Parallel to the elements: each completion element's logprob. Only
    /// completion entries are written (each door writes all of them, 0.0
    /// where none was given) and read (`fill.rs`); the others keep whatever
    /// an earlier trajectory left, so the prompt's span is never zeroed.
    pub logprobs: Vec<f32>,
    /// The distinct non-text chunks, by id (`cookbook`).
    pub chunks: Vec<Bound<'py, PyAny>>,
    /// Whether some non-text chunk has length 0 (`cookbook`).
    pub has_zero_width: bool,
    pub ints: SharedInts<'py>,
    /// Scratch of `pipeline::input_chunks` (a row's text runs), kept so
    /// that a row allocates nothing for it.
    pub runs: Vec<Range<usize>>,
    /// Its group, its index in the group, its advantage.
    pub place: Place,
}

#[derive(Clone, Copy, Default)]
pub struct Place {
    pub group: usize,
    pub trajectory: usize,
    pub advantage: f32,
}

impl TrajectoryIn<'_> {
    /// Empty, keeping its buffers for the next trajectory.
    pub fn clear(&mut self, shared_ints: bool, merge: Merge) {
        self.plain.clear();
        // `logprobs` is kept as it is: see its field.
        self.chunks.clear();
        self.has_zero_width = false;
        self.ints.reset(shared_ints, merge);
    }
}

/// What a front door's rows are and carry.
#[derive(Clone, Copy)]
pub struct RowRule {
    pub merge: Merge,
    pub keep: Keep,
    /// Whether rows carry a `mask` column.
    pub mask: bool,
    /// Whether the model input is an int32 array (else chunks of lists).
    pub int32_inputs: bool,
}

/// `(model_input spans, loss_fn_input spans)` of a row.
pub type Provenance<'py> = (Vec<SpanOut<'py>>, Vec<SpanOut<'py>>);

/// The rows closed before turn `turn`: those ending before it, and the one
/// ending at it if `pending` (the turn's context, read, does not extend it).
#[derive(Clone, Copy)]
pub struct ClosedBefore {
    pub turn: usize,
    pub pending: bool,
}

impl ClosedBefore {
    pub fn contains(self, row: &Row) -> bool {
        let end = row.first_turn + row.n_turns;
        end < self.turn || (self.pending && end == self.turn)
    }
}

/// A planned row as the pipeline hands it to its front door.
pub struct RowView<'a> {
    pub row: &'a Row,
    /// Its segments, without zero-width elements (which take no position).
    pub segments: &'a [Segment],
    /// Its segments as planned.
    pub planned: &'a [Segment],
    /// The end of the turns of the trajectory's rows before (0 for its
    /// first).
    pub since: usize,
    pub location: Location,
}

/// An input shape: the pipeline (`pipeline.rs`) reads, plans, fills and
/// builds through it.
pub trait FrontDoor<'py> {
    fn rule(&self) -> RowRule;

    /// Reads the batch's next trajectory into `out` (cleared by the
    /// caller); `false` when there is none left.
    fn read_next(&mut self, out: &mut TrajectoryIn<'py>) -> PyResult<bool>;

    /// After `read_next` failed: which rows of what it read the replaced
    /// code would have built before failing, so that their errors come
    /// first. The door may adjust `traj` (e.g. lay out the observation it
    /// had read); the pipeline plans it and builds those rows.
    fn rows_before_the_error(&self, _traj: &mut TrajectoryIn<'py>) -> Option<ClosedBefore> {
        None
    }

    /// A completion element's `(advantage, mask)` in turn `turn`.
    fn weights(&self, traj: &TrajectoryIn<'py>, turn: usize) -> (f32, f32) {
        let _ = turn;
        (traj.place.advantage, 1.0)
    }

    /// The row's checks (before it is filled) and its provenance spans.
    fn check_row(&self, _traj: &TrajectoryIn<'py>, _row: &RowView<'_>) -> PyResult<Option<Provenance<'py>>> {
        Ok(None)
    }

    /// The row's `loss_fn_inputs`, from its filled columns.
    fn loss_inputs(&self, row: &RowView<'_>, columns: FilledColumns<'py>) -> PyResult<Vec<LossInput<'py>>>;

    /// What each Datum's metadata is.
    fn metadata(&self) -> MetadataKind<'_, 'py>;
}

/// The span of elements `segments` come from.
pub fn element_span(segments: &[Segment]) -> Range<usize> {
    let start = segments.iter().map(|p| p.elements.start).min().unwrap_or(0);
    let end = segments.iter().map(|p| p.elements.end).max().unwrap_or(0);
    start..end
}
