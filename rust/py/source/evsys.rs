//! The evsys front door: groups (`trajectories`, `tags`) of trajectories
//! (`reward`, `turns`) of turns (`prompt_tokens`, `completion_tokens`,
//! `logprobs`), read in two sweeps.
//!
//! Sweep 1 ([`read_structure`]) opens every sequence and checks rewards,
//! advantages and tags; sweep 2 ([`Evsys::read`]) reads one trajectory's
//! tokens and logprobs at a time. The first problem of a sweep, in batch
//! order, is the one reported. Rows are one per turn, or merged while each
//! prompt extends the sequence so far; each has `target_tokens`,
//! `logprobs` and `advantages`, and a `DatumMetadata`.

use std::ops::Range;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyType};

use crate::errors::{ErrorKind, InputError, Location};
use crate::plan::{Keep, Merge, TurnSpan};
use crate::py::build::{Dtype, FilledColumns, LossInput, LossKey, MetadataKind};
use crate::py::read::{attr, read_real, read_tags, ItemKind, Items, MAX_TOKEN};
use crate::py::source::ints::Role;
use crate::py::source::{FrontDoor, Place, RowRule, RowView, TrajectoryIn};

/// One turn's sequences, opened (held alive), not yet read.
struct TurnIn<'py> {
    prompt: Items<'py>,
    completion: Items<'py>,
    logprobs: Items<'py>,
}

struct TrajectoryAt {
    group: usize,
    index: usize,
    advantage: f32,
    /// Into [`Batch::turns`].
    turns: Range<usize>,
}

/// The batch after sweep 1.
struct Batch<'py> {
    /// Each group's tags (a new list), when asked for.
    tags: Vec<Bound<'py, PyList>>,
    trajectories: Vec<TrajectoryAt>,
    turns: Vec<TurnIn<'py>>,
}

fn trajectories_of<'py>(group: &Bound<'py, PyAny>, g: usize) -> PyResult<Items<'py>> {
    let at = Location::group(g);
    Items::of_attr(
        group,
        intern!(group.py(), "trajectories"),
        "trajectories",
        ItemKind::Object,
        at,
    )
}

fn reward_of(trajectory: &Bound<'_, PyAny>, at: Location) -> PyResult<f64> {
    read_real(
        &attr(trajectory, intern!(trajectory.py(), "reward"), at)?,
        "reward",
        false,
        at,
    )
}

/// Every trajectory's reward, in batch order, and each group's count.
pub struct Rewards {
    pub sizes: Vec<usize>,
    pub all: Vec<f64>,
}

impl Rewards {
    /// Each group's rewards.
    pub fn groups(&self) -> impl Iterator<Item = &[f64]> {
        self.sizes.iter().scan(0, |start, &size| {
            let group = &self.all[*start..*start + size];
            *start += size;
            Some(group)
        })
    }
}

/// The batch's rewards, checked.
pub fn read_rewards(groups: &Bound<'_, PyAny>) -> PyResult<Rewards> {
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let mut rewards = Rewards {
        sizes: Vec::with_capacity(groups.len()),
        all: Vec::new(),
    };
    for g in 0..groups.len() {
        let trajectories = trajectories_of(&groups.get(g)?, g)?;
        for t in 0..trajectories.len() {
            rewards
                .all
                .push(reward_of(&trajectories.get(t)?, Location::trajectory(g, t))?);
        }
        rewards.sizes.push(trajectories.len());
    }
    Ok(rewards)
}

/// Sweep 1: the batch's structure, rewards, advantages and (with `with_tags`) tags.
fn read_structure<'py>(
    groups: &Bound<'py, PyAny>,
    advantages: &Bound<'py, PyAny>,
    with_tags: bool,
) -> PyResult<Batch<'py>> {
    let py = groups.py();
    let groups = Items::of(groups, "trajectory_groups", ItemKind::Object, Location::BATCH)?;
    let advantages = Items::of(advantages, "advantages", ItemKind::Rows, Location::BATCH)?;
    if advantages.len() != groups.len() {
        let message = format!(
            "advantages has {} groups for {} trajectory groups",
            advantages.len(),
            groups.len()
        );
        return Err(InputError::new(ErrorKind::Value, Location::BATCH, message).into());
    }
    let mut batch = Batch {
        tags: Vec::new(),
        trajectories: Vec::new(),
        turns: Vec::new(),
    };
    for g in 0..groups.len() {
        let at = Location::group(g);
        let group = groups.get(g)?;
        let trajectories = trajectories_of(&group, g)?;
        let group_advantages = Items::of(&advantages.get(g)?, "advantages", ItemKind::Real, at)?;
        if group_advantages.len() != trajectories.len() {
            let message = format!(
                "advantages has {} entries for {} trajectories",
                group_advantages.len(),
                trajectories.len()
            );
            return Err(InputError::new(ErrorKind::Value, at, message).into());
        }
        if with_tags {
            batch.tags.push(read_tags(&group, at)?);
        }
        for t in 0..trajectories.len() {
            let at = Location::trajectory(g, t);
            let trajectory = trajectories.get(t)?;
            reward_of(&trajectory, at)?;
            #[allow(clippy::cast_possible_truncation)] // float32 is the wire dtype; overflow is checked
            let advantage = read_real(&group_advantages.get(t)?, "advantage", true, at)? as f32;
            let turns = Items::of_attr(&trajectory, intern!(py, "turns"), "turns", ItemKind::Object, at)?;
            let first = batch.turns.len();
            for u in 0..turns.len() {
                let at = Location::turn(g, t, u);
                let turn = turns.get(u)?;
                let field = |name, what, kind| Items::of_attr(&turn, name, what, kind, at);
                batch.turns.push(TurnIn {
                    prompt: field(intern!(py, "prompt_tokens"), "prompt_tokens", ItemKind::Token)?,
                    completion: field(intern!(py, "completion_tokens"), "completion_tokens", ItemKind::Token)?,
                    logprobs: field(intern!(py, "logprobs"), "logprobs", ItemKind::Real)?,
                });
            }
            batch.trajectories.push(TrajectoryAt {
                group: g,
                index: t,
                advantage,
                turns: first..batch.turns.len(),
            });
        }
    }
    Ok(batch)
}

/// How the logprobs of turns were fitted to their completions.
#[derive(Clone, Copy, Debug, Default)]
pub struct FitReport {
    pub padded: usize,
    pub truncated: usize,
    pub first: Option<Location>,
}

/// What the caller asked for.
#[derive(Clone, Copy)]
pub struct Options {
    pub merge: Merge,
    /// Tokens must be below this: the vocabulary size, or 2**31.
    pub token_limit: i64,
    /// Model input as an int32 array (else a list of ints).
    pub int32_inputs: bool,
}

impl Options {
    pub fn new(merge_turns: bool, vocab_size: Option<i64>, int32_inputs: bool) -> Self {
        Options {
            merge: if merge_turns {
                Merge::WhilePromptExtends
            } else {
                Merge::PerTurn
            },
            token_limit: vocab_size.map_or(MAX_TOKEN + 1, |v| v.min(MAX_TOKEN + 1)),
            int32_inputs,
        }
    }
}

/// The evsys batch after sweep 1, as a front door.
pub struct Evsys<'py> {
    batch: Batch<'py>,
    options: Options,
    metadata_class: Option<Bound<'py, PyType>>,
    fit: FitReport,
    /// The next trajectory to read.
    next: usize,
}

impl<'py> Evsys<'py> {
    /// Sweep 1 over `groups` and their `advantages`; `metadata_class` is
    /// `DatumMetadata` when Datums are built (their tags are read then).
    pub fn open(
        groups: &Bound<'py, PyAny>,
        advantages: &Bound<'py, PyAny>,
        options: Options,
        metadata_class: Option<Bound<'py, PyType>>,
    ) -> PyResult<Self> {
        let batch = read_structure(groups, advantages, metadata_class.is_some())?;
        Ok(Evsys {
            batch,
            options,
            metadata_class,
            fit: FitReport::default(),
            next: 0,
        })
    }

    /// How the logprobs of the turns read were fitted.
    pub fn fit(&self) -> FitReport {
        self.fit
    }

    /// Positions of the rows one per turn: an upper bound of any plan's.
    pub fn per_turn_positions(&self) -> usize {
        self.batch
            .turns
            .iter()
            .map(|t| (t.prompt.len() + t.completion.len()).saturating_sub(1))
            .sum()
    }
}

impl<'py> FrontDoor<'py> for Evsys<'py> {
    fn rule(&self) -> RowRule {
        RowRule {
            merge: self.options.merge,
            keep: Keep::WithCompletionTarget,
            mask: false,
            int32_inputs: self.options.int32_inputs,
        }
    }

    /// Sweep 2 for one trajectory: its elements and, at the same index in
    /// `logprobs`, each completion token's fitted logprob (0 past the
    /// turn's logprobs; entries at prompt elements are left as they were:
    /// nothing reads them).
    fn read_next(&mut self, out: &mut TrajectoryIn<'py>) -> PyResult<bool> {
        let Some(trajectory) = self.batch.trajectories.get(self.next) else {
            return Ok(false);
        };
        self.next += 1;
        out.place = Place {
            group: trajectory.group,
            trajectory: trajectory.index,
            advantage: trajectory.advantage,
        };
        let limit = self.options.token_limit;
        let fit = &mut self.fit;
        for (u, turn) in self.batch.turns[trajectory.turns.clone()].iter().enumerate() {
            let at = Location::turn(trajectory.group, trajectory.index, u);
            let elements = &mut out.plain.elements;
            let start = elements.len();
            out.ints.begin_turn(start);
            out.ints
                .read(&turn.prompt, "prompt_tokens", limit, at, Role::Context, elements)?;
            let mid = elements.len();
            out.ints.read(
                &turn.completion,
                "completion_tokens",
                limit,
                at,
                Role::Completion,
                elements,
            )?;
            let completion = mid..elements.len();
            let logprobs = &mut out.logprobs;
            if logprobs.len() < completion.end {
                logprobs.resize(completion.end, 0.0);
            }
            let fitted = completion.start..completion.end.min(completion.start + turn.logprobs.len());
            turn.logprobs.read_logprobs(at, &mut logprobs[fitted.clone()])?;
            logprobs[fitted.end..completion.end].fill(0.0);
            let (n_logprobs, n_completion) = (turn.logprobs.len(), completion.len());
            if n_logprobs != n_completion {
                if n_logprobs < n_completion {
                    fit.padded += 1;
                } else {
                    fit.truncated += 1;
                }
                fit.first.get_or_insert(at);
            }
            out.ints.end_turn(elements, start..mid, completion.clone());
            out.plain.turns.push(TurnSpan {
                prompt: start..mid,
                completion,
            });
        }
        Ok(true)
    }

    fn loss_inputs(&self, _row: &RowView<'_>, columns: FilledColumns<'py>) -> PyResult<Vec<LossInput<'py>>> {
        Ok(vec![
            LossInput::new(
                LossKey::TargetTokens,
                Dtype::Int64,
                columns.targets.into_array().into_any(),
            ),
            LossInput::new(
                LossKey::Logprobs,
                Dtype::Float32,
                columns.logprobs.into_array().into_any(),
            ),
            LossInput::new(
                LossKey::Advantages,
                Dtype::Float32,
                columns.advantages.into_array().into_any(),
            ),
        ])
    }

    fn metadata(&self) -> MetadataKind<'_, 'py> {
        match &self.metadata_class {
            Some(class) => MetadataKind::Dataclass {
                class,
                tags: &self.batch.tags,
            },
            None => MetadataKind::Dict,
        }
    }
}
