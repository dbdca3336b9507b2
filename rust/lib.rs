//! tinker-rl-data's native core.
//!
//! Plain Rust, unit-tested with `cargo test`: `plan` (where rows begin and
//! end), `rows` (the numeric core that writes a row's columns),
//! `advantages`, `kl` (the cookbook's KL penalty arithmetic), `torch_sum` (torch's float32 `Tensor.sum()`), `metrics` (tinker-cookbook's per-step metrics), `error`,
//! `wire` (tinker's request bytes), `sample_json` (its sample request's JSON),
//! `pages` (huge pages for large outputs). The PyO3 glue is the `py` folder.

pub mod advantages;
pub mod error;
pub mod kl;
pub mod metrics;
pub mod pages;
pub mod plan;
mod py;
pub mod rows;
#[cfg(test)]
mod rows_fuzz;
pub mod sample_json;
pub mod torch_sum;
pub mod wire;

use pyo3::prelude::*;

use py::exports;

// The read loops take items from a list's array without holding them,
// which only the GIL makes safe (rust/py/read/exact.rs).
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    exports::register(m)
}
