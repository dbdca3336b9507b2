//! tinker-rl-data's native core.
//!
//! Plain Rust, unit-tested with `cargo test`: `plan` (where rows begin and
//! end), `rows` (the numeric core that writes a row's columns),
//! `advantages`, `kl` (the cookbook's KL penalty arithmetic), `metrics` (tinker-cookbook's per-step metrics), `error`,
//! `wire` (tinker's request bytes). The PyO3 glue is the `py` folder.

pub mod advantages;
pub mod error;
pub mod kl;
pub mod metrics;
pub mod plan;
mod py;
pub mod rows;
#[cfg(test)]
mod rows_fuzz;
pub mod wire;

use pyo3::prelude::*;

use py::exports;

// The read loops take items from a list's array without holding them,
// which only the GIL makes safe (rust/py/exact.rs).
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("INT_READ", py::read::exact::probe_int_layout(m.py())?)?;
    m.add_class::<exports::Fitted>()?;
    m.add_class::<exports::BuiltDatums>()?;
    m.add_class::<exports::Rows>()?;
    m.add_function(wrap_pyfunction!(exports::py_compute_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_reward_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_varied_reward_groups, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_assemble_arrays, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_assemble_datums, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_assemble_cookbook, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_encode_forward_backward, m)?)?;
    m.add_function(wrap_pyfunction!(exports::py_panic_probe, m)?)?;
    m.add("Unsupported", m.py().get_type::<py::step::Unsupported>())?;
    m.add_function(wrap_pyfunction!(py::step::py_kl_sample_train, m)?)?;
    m.add_function(wrap_pyfunction!(py::step::py_trajectory_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(py::step::py_rollout_counts, m)?)?;
    m.add_function(wrap_pyfunction!(py::step::py_training_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(py::step::py_datum_without_mask, m)?)?;
    m.add_function(wrap_pyfunction!(py::kl::py_kl_penalty, m)?)?;
    m.add_function(wrap_pyfunction!(py::kl::py_post_kl, m)?)?;
    m.add_function(wrap_pyfunction!(py::kl::py_full_sequence_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(py::kl::py_discounted_future_sum, m)?)?;
    Ok(())
}
