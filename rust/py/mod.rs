//! The PyO3 glue: reading the user's objects (`read`, its in-place reads of
//! exact ints and floats in `exact`, and one reader per input shape:
//! `evsys`, `cookbook`), turning planned rows into tinker's
//! objects (`build`), the pipeline that joins them (`assemble`), the
//! exported functions (`exports`), and the rest of tinker-cookbook's RL
//! step around the data (`step`). The numeric work lives outside, in plain
//! Rust (`plan`, `rows`, `advantages`).

pub mod assemble;
pub mod build;
pub mod cookbook;
pub mod errors;
pub mod evsys;
pub mod exact;
pub mod exports;
pub mod read;
pub mod step;
