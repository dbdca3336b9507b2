//! The rest of tinker-cookbook's RL step around the data: the KL metrics of
//! a trained batch (`rl.metrics.compute_kl_sample_train`), the trajectory
//! metrics and token usage of a step's groups (`rl.metric_util.
//! compute_trajectory_metrics`, `rl.train.rollout_usage` /
//! `training_usage`), a Datum without its `mask` (`rl.train._remove_mask`).
//!
//! Each reads what the cookbook's function reads, once. An input it does
//! not read exactly (another type than the cookbook's, a case where the
//! cookbook raises) is an [`Unsupported`](crate::py::errors::Unsupported) exception, read no further: the
//! Python layer then runs the cookbook's own function, so that results and
//! exceptions are always the cookbook's. Only lists and tuples are read, so
//! an iterator is left unconsumed for it.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};

use crate::errors::Location;
use crate::py::classes::Classes;
pub use crate::py::errors::unsupported;
use crate::py::read::{exact_float, exact_int, type_name, Items};
use crate::step::Number;

pub mod kl_sample_train;
pub mod remove_mask;
pub mod trajectory_metrics;
pub mod usage;

/// A list's or tuple's items. Anything else (an iterator the cookbook's
/// function would consume) is left to it unread.
pub fn sequence<'py>(obj: &Bound<'py, PyAny>, what: &'static str) -> PyResult<Items<'py>> {
    Items::of_exact_sequence(obj, what)
        .ok_or_else(|| unsupported(format!("{what} is a {}, not a list or tuple", type_name(obj))))
}

pub fn sequence_of<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    what: &'static str,
) -> PyResult<Items<'py>> {
    sequence(&obj.getattr(name)?, what)
}

/// An exact `int` or a `bool` (what Python's `sum()` adds as ints).
pub fn int_value(obj: &Bound<'_, PyAny>) -> Option<i64> {
    exact_int(obj).or_else(|| obj.cast::<PyBool>().ok().map(|b| i64::from(b.is_true())))
}

/// A token count: an exact int below 2**32, so that no sum of them
/// overflows (Python's ints do not).
pub fn count(obj: &Bound<'_, PyAny>, at: Location, what: &str) -> PyResult<i64> {
    int_value(obj)
        .filter(|v| v.unsigned_abs() < 1 << 32)
        .ok_or_else(|| unsupported(format!("{at}: {what} is not an int below 2**32")))
}

/// An exact `float`, `int` or `bool`; not an int that a float cannot hold.
pub fn number(obj: &Bound<'_, PyAny>) -> Option<Number> {
    if let Some(v) = exact_float(obj) {
        return Some(Number::float(v));
    }
    int_value(obj)
        .filter(|v| v.unsigned_abs() <= 1 << 53)
        .map(|v| Number::int(v as f64))
}

/// `model_input.length`: for tinker's `ModelInput`, the sum of its chunks'
/// lengths, a text chunk's read as `len(tokens)` (what its property
/// returns) and any other chunk's by its `length` property.
pub fn model_input_length(model_input: &Bound<'_, PyAny>, classes: &Classes<'_>, at: Location) -> PyResult<i64> {
    let py = model_input.py();
    if !model_input.get_type().is(&classes.model_input) {
        return count(
            &model_input.getattr(intern!(py, "length"))?,
            at,
            "a model input's length",
        );
    }
    let chunks = sequence_of(model_input, intern!(py, "chunks"), "chunks")?;
    let mut n = 0;
    for i in 0..chunks.len() {
        let chunk = chunks.get(i)?;
        n += if chunk.get_type().is(&classes.text_chunk) {
            chunk.getattr(intern!(py, "tokens"))?.len()? as i64
        } else {
            count(&chunk.getattr(intern!(py, "length"))?, at, "a chunk's length")?
        };
    }
    Ok(n)
}

/// What `rollout_usage` and the trajectory metrics count of a transition.
#[derive(Default)]
pub struct Counts {
    /// Action tokens.
    pub sampled: i64,
    /// Observation tokens.
    pub prompt: i64,
    /// Observation tokens the sampler billed as prefix-cache hits.
    pub cached: i64,
}

impl Counts {
    pub fn add_transition(
        &mut self,
        transition: &Bound<'_, PyAny>,
        classes: &Classes<'_>,
        at: Location,
    ) -> PyResult<()> {
        let py = transition.py();
        let ac = transition.getattr(intern!(py, "ac"))?;
        self.sampled += ac.getattr(intern!(py, "tokens"))?.len()? as i64;
        self.prompt += model_input_length(&transition.getattr(intern!(py, "ob"))?, classes, at)?;
        let cached = ac.getattr(intern!(py, "prompt_cache_hit_tokens"))?;
        self.cached += count(&cached, at, "prompt_cache_hit_tokens")?;
        Ok(())
    }
}
