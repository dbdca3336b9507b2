//! tinker-rl-data's native core. `advantages`, `rows` and `error` are plain
//! Rust (unit-tested with `cargo test`); `read`, `datums` and `py` are the PyO3 glue.

pub mod advantages;
mod datums;
pub mod error;
mod py;
mod read;
pub mod rows;
#[cfg(test)]
mod rows_fuzz;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(py::py_compute_advantages, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_reward_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_assemble_arrays, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_assemble_datums, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_panic_probe, m)?)?;
    Ok(())
}
