//! Refuses to build for an interpreter the read loops are unsound on.
//!
//! `rust/py/read/exact.rs` reads a list's items and an int's digits in place, in
//! CPython's object layouts, borrowing items that only the GIL keeps alive.
//! PyPy and GraalPy have other layouts; a free-threaded CPython lets another
//! thread free an item mid-read (`PYTHON_GIL=0` keeps the GIL off even for a
//! module that declares it needs it).

use pyo3_build_config::PythonImplementation;

fn main() {
    let config = pyo3_build_config::get();
    let refuse = |why: &str| -> ! {
        eprintln!(
            "error: tinker-rl-data cannot be built for this interpreter: {why}.\n\
             Its read loops use CPython's object layouts with the GIL held; \
             use a CPython >= 3.11 with the GIL (not a free-threaded 3.13t/3.14t build)."
        );
        std::process::exit(1);
    };
    match config.implementation() {
        PythonImplementation::CPython => {}
        other => refuse(&format!("{other:?} is not CPython")),
    }
    if config.is_free_threaded() {
        refuse("it is a free-threaded CPython");
    }
}
