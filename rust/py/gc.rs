//! The cyclic GC held off for a call.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The calls in flight in this process and the collector's flag as the
/// program has it while they are (what the first found, or what the program
/// set since).
struct Pauses {
    in_flight: usize,
    program_enabled: bool,
}

// Only touched with the thread attached: never contended under the GIL, and
// the count stays right without it.
static PAUSES: Mutex<Pauses> = Mutex::new(Pauses {
    in_flight: 0,
    program_enabled: false,
});

thread_local! {
    // This thread's calls in flight: what a forked child still has of them.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn pauses() -> MutexGuard<'static, Pauses> {
    // Nothing panics while it is held: a poisoned lock still holds a count.
    PAUSES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Python's cyclic GC held off for a whole call, reading and building: the
/// token reads share the caller's ints only while no collection (so no
/// finalizer) can run ([`collector_off`]), and every container allocated
/// counts toward a collection. Nothing made here can form a cycle, so
/// nothing is lost; cyclic garbage that user code run while reading (a
/// property, an `__index__`) makes is collected after.
///
/// One pause for all the calls in flight in the process (two threads whose
/// calls overlap while one waits in a property that released the GIL; a
/// property that makes another call): the first records the flag and turns
/// the collector off, the last puts the program's flag back. The program's
/// flag is what the first found, or what the program set while calls were
/// in flight: a `gc.enable()` (by code a call runs, or by another thread
/// meanwhile) is seen, as the flag is on when a call starts or ends, and
/// kept; a `gc.disable()` then finds the flag off already and is seen only
/// where the program's gc functions say so ([`program_set_enabled`]: the
/// cookbook's collector policy, while it holds).
pub struct GcPaused {
    // Dropped on the thread that made it (the thread's depth).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl GcPaused {
    pub fn new(_py: Python<'_>) -> Self {
        let mut pauses = pauses();
        // SAFETY: attached to the interpreter (`_py`); the call only flips
        // the collector's flag and returns its previous value.
        let was_enabled = unsafe { ffi::PyGC_Disable() } == 1;
        // With calls in flight the flag is off unless the program turned it
        // on meanwhile.
        pauses.program_enabled = was_enabled || (pauses.in_flight > 0 && pauses.program_enabled);
        pauses.in_flight += 1;
        DEPTH.with(|depth| depth.set(depth.get() + 1));
        GcPaused {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for GcPaused {
    fn drop(&mut self) {
        let mut pauses = pauses();
        DEPTH.with(|depth| depth.set(depth.get().saturating_sub(1)));
        pauses.in_flight = pauses.in_flight.saturating_sub(1);
        // SAFETY: dropped where it was made, with the thread attached; the
        // calls only read or set the collector's flag.
        unsafe {
            if ffi::PyGC_IsEnabled() == 1 {
                pauses.program_enabled = true; // the program's gc.enable() meanwhile
            }
            if pauses.in_flight > 0 || !pauses.program_enabled {
                ffi::PyGC_Disable(); // the calls still in flight hold it off
            } else {
                ffi::PyGC_Enable();
            }
        }
    }
}

/// Whether the cyclic collector is off (user code may have turned it back
/// on inside a [`GcPaused`] call).
pub fn collector_off(_py: Python<'_>) -> bool {
    // SAFETY: attached to the interpreter (`_py`); reads the collector's flag.
    unsafe { ffi::PyGC_IsEnabled() == 0 }
}

/// Whether the collector is on as the program has it: its flag, or, while
/// native calls hold it off, the flag they put back when the last ends.
#[pyfunction(name = "gc_program_enabled")]
pub fn program_enabled(_py: Python<'_>) -> bool {
    let pauses = pauses();
    // SAFETY: attached to the interpreter (`_py`); reads the collector's flag.
    let now = unsafe { ffi::PyGC_IsEnabled() } == 1;
    now || (pauses.in_flight > 0 && pauses.program_enabled)
}

/// The program set the collector's flag (its `gc.enable()` / `gc.disable()`
/// as the cookbook's collector policy sees them, after the call): with
/// native calls in flight, the last one puts this back.
#[pyfunction(name = "gc_program_set_enabled")]
pub fn program_set_enabled(_py: Python<'_>, enabled: bool) {
    let mut pauses = pauses();
    if pauses.in_flight > 0 {
        pauses.program_enabled = enabled;
    }
}

/// In a forked child only the forking thread goes on: the calls in flight
/// are its own (a property that forks), if any; with none, the program's
/// flag back.
#[pyfunction(name = "_gc_after_fork_in_child")]
pub fn after_fork_in_child(_py: Python<'_>) {
    let mut pauses = pauses();
    let own = DEPTH.with(Cell::get);
    if pauses.in_flight > own {
        pauses.in_flight = own;
        if own == 0 && pauses.program_enabled {
            // SAFETY: attached to the interpreter (`_py`); sets the flag.
            unsafe { ffi::PyGC_Enable() };
        }
    }
}

/// Registers [`after_fork_in_child`] with `os.register_at_fork`.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("after_in_child", module.getattr("_gc_after_fork_in_child")?)?;
    py.import("os")?.call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}
