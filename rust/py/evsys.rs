//! The evsys front door: groups (`trajectories`, `tags`) of trajectories
//! (`reward`, `turns`) of turns (`prompt_tokens`, `completion_tokens`,
//! `logprobs`), read in two sweeps into plain [`Trajectory`]s.
//!
//! Sweep 1 ([`read_structure`]) opens every sequence and checks rewards,
//! advantages and tags; sweep 2 ([`read_values`]) reads one trajectory's
//! tokens and logprobs at a time. The first problem of a sweep, in batch
//! order, is the one reported.

use std::ops::Range;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::error::{ErrorKind, InputError, Location};
use crate::plan::{Trajectory, TurnSpan};
use crate::py::read::{attr, read_real, read_tags, ItemKind, Items};

/// One turn's sequences, opened (held alive), not yet read.
pub struct TurnIn<'py> {
    pub prompt: Items<'py>,
    pub completion: Items<'py>,
    pub logprobs: Items<'py>,
}

pub struct TrajectoryIn {
    pub group: usize,
    pub index: usize,
    pub advantage: f32,
    /// Into [`Batch::turns`].
    pub turns: Range<usize>,
}

/// The batch after sweep 1.
pub struct Batch<'py> {
    /// Each group's tags (a new list), when asked for.
    pub tags: Vec<Bound<'py, PyList>>,
    pub trajectories: Vec<TrajectoryIn>,
    pub turns: Vec<TurnIn<'py>>,
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
pub fn read_structure<'py>(
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
            batch.trajectories.push(TrajectoryIn {
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

/// Sweep 2 for one trajectory: its elements into `out` and, at the same
/// index in `logprobs`, each completion token's fitted logprob (0 past the
/// turn's logprobs). Entries at prompt elements are left as they were:
/// nothing reads them, and not zeroing them saves a pass.
/// `limit` bounds the tokens (the vocabulary size, or 2**31). Returns
/// whether every value read was an exact `int` / `float`: then no Python
/// code ran while reading, and the caller's lists are as they were read.
pub fn read_values(
    batch: &Batch<'_>,
    trajectory: &TrajectoryIn,
    limit: i64,
    out: &mut Trajectory,
    logprobs: &mut Vec<f32>,
    fit: &mut FitReport,
) -> PyResult<bool> {
    out.clear();
    let mut exact = true;
    for (u, turn) in batch.turns[trajectory.turns.clone()].iter().enumerate() {
        let at = Location::turn(trajectory.group, trajectory.index, u);
        let start = out.elements.len();
        exact &= turn.prompt.read_tokens("prompt_tokens", limit, at, &mut out.elements)?;
        exact &= turn
            .completion
            .read_tokens("completion_tokens", limit, at, &mut out.elements)?;
        let completion = start + turn.prompt.len()..out.elements.len();
        if logprobs.len() < completion.end {
            logprobs.resize(completion.end, 0.0);
        }
        let fitted = completion.start..completion.end.min(completion.start + turn.logprobs.len());
        exact &= turn.logprobs.read_logprobs(at, &mut logprobs[fitted.clone()])?;
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
        out.turns.push(TurnSpan {
            prompt: start..completion.start,
            completion,
        });
    }
    Ok(exact)
}
