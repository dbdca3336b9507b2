//! `rl.train.rollout_usage` and `training_usage`: token counts.

use pyo3::intern;
use pyo3::prelude::*;

use super::{model_input_length, sequence, sequence_of, Counts};
use crate::errors::{Location, StepName};
use crate::py::classes::Classes;

pub fn rollout_counts(groups: &Bound<'_, PyAny>, classes: &Classes<'_>) -> PyResult<(i64, i64, i64)> {
    let py = groups.py();
    let groups = sequence(groups, "trajectory_groups")?;
    let mut counts = Counts::default();
    for g in 0..groups.len() {
        let trajectories = sequence_of(&groups.get(g)?, intern!(py, "trajectories_G"), "trajectories_G")?;
        for t in 0..trajectories.len() {
            let transitions = sequence_of(&trajectories.get(t)?, intern!(py, "transitions"), "transitions")?;
            for u in 0..transitions.len() {
                let at = Location::turn(g, t, u).named(StepName::Transition);
                counts.add_transition(&transitions.get(u)?, classes, at)?;
            }
        }
    }
    Ok((counts.sampled, counts.cached, counts.prompt))
}

pub fn training_tokens(data: &Bound<'_, PyAny>, classes: &Classes<'_>) -> PyResult<i64> {
    let py = data.py();
    let data = sequence(data, "data_D")?;
    let mut n = 0;
    for i in 0..data.len() {
        let model_input = data.get(i)?.getattr(intern!(py, "model_input"))?;
        n += model_input_length(&model_input, classes, Location::BATCH)?;
    }
    Ok(n)
}
