//! The cyclic GC held off for a call.

use pyo3::ffi;
use pyo3::prelude::*;

/// Python's cyclic GC held off for a whole call, reading and building:
/// every container allocated counts toward a collection, and with a large
/// live heap (the caller's batch) the collections they set off multiplied
/// the cost per Datum by up to 5. Nothing made here can form a cycle, so
/// nothing is lost; cyclic garbage that user code run while reading (a
/// property, an `__index__`) makes is collected after. Restores exactly the
/// state it found, whatever such code did to it meanwhile: the collector is
/// the caller's, and a call leaves it as the caller had it.
pub struct GcPaused {
    was_enabled: bool,
}

impl GcPaused {
    pub fn new(_py: Python<'_>) -> Self {
        // SAFETY: attached to the interpreter (`_py`); the call only flips
        // the collector's flag and returns its previous value.
        let was_enabled = unsafe { ffi::PyGC_Disable() } == 1;
        GcPaused { was_enabled }
    }
}

/// Whether the cyclic collector is off (user code may have turned it back
/// on inside a [`GcPaused`] call).
pub fn collector_off(_py: Python<'_>) -> bool {
    // SAFETY: attached to the interpreter (`_py`); reads the collector's flag.
    unsafe { ffi::PyGC_IsEnabled() == 0 }
}

impl Drop for GcPaused {
    fn drop(&mut self) {
        // SAFETY: dropped where it was made, with the thread attached; the
        // calls only set the collector's flag.
        unsafe {
            if self.was_enabled {
                ffi::PyGC_Enable();
            } else {
                ffi::PyGC_Disable();
            }
        }
    }
}
