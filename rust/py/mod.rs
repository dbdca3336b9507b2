//! The PyO3 glue, one pipeline for both front doors:
//!
//! - `read`: reading the user's objects (sequences, their exact ints and
//!   floats in place, buffers of numbers as memory), with located errors;
//! - `source`: the front doors (`evsys`, `cookbook`), each reading its input
//!   shape into the same plain trajectory, and the int-sharing rule (`ints`);
//! - `pipeline`: read -> plan -> fill -> build, once;
//! - `build`: filled rows into tinker's objects (directly or through its
//!   public constructors) and their metadata;
//! - `classes`: tinker's classes, bound once by the Python layer, and
//!   numpy's scalar types;
//! - `gc`: the cyclic GC held off for a call; `errors`: exceptions and the
//!   panic guard; `forward_backward`: tinker's forward_backward request
//!   read for its bytes; `step`: the rest of tinker-cookbook's RL step
//!   around the data (its metrics and usage counts, read from the Datums'
//!   buffers); `sample`: tinker's sample request read for its JSON body;
//!   `kl`: the KL penalty passes; `exports`: every exported function and
//!   the one `register`.
//!
//! Each glue module that has arithmetic keeps it outside, in the plain Rust
//! module of the same name (`crate::kl`, `crate::step`,
//! `crate::forward_backward`, `crate::sample`), beside `plan`, `fill` and
//! `advantages`.

pub mod build;
pub mod classes;
pub mod errors;
pub mod exports;
pub mod forward_backward;
pub mod gc;
pub mod kl;
pub mod pipeline;
pub mod read;
pub mod sample;
pub mod source;
pub mod step;
