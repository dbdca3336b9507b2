//! tinker-rl-data's native core.
//!
//! Plain Rust, unit-tested with `cargo test`: `plan` (where rows begin and
//! end), `fill` (the numeric core that writes a row's columns),
//! `advantages`, `kl` (the cookbook's KL penalty arithmetic), `torch_sum`
//! (torch's float32 `Tensor.sum()`), `step` (tinker-cookbook's per-step
//! metrics), `errors`, `forward_backward` (tinker's request bytes),
//! `sample` (its sample request's JSON),
//! `pages` (huge pages for large outputs). The PyO3 glue is the `py` folder.

pub mod advantages;
pub mod errors;
pub mod fill;
#[cfg(test)]
mod fill_fuzz;
pub mod forward_backward;
pub mod kl;
pub mod pages;
pub mod plan;
mod py;
pub mod sample;
pub mod step;
pub mod torch_sum;

use pyo3::prelude::*;

use py::exports;

// The read loops take items from a list's array without holding them,
// which only the GIL makes safe (rust/py/read/exact.rs).
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    exports::register(m)
}
