//! Exact `int`s and `float`s read in place from a list or tuple: the inner
//! loops that read tokens and logprobs.
//!
//! Through the stable ABI's functions (`PyList_GetItem`, then
//! `PyLong_AsLongLongAndOverflow` or `PyFloat_AsDouble`) an item costs two
//! calls; here it is a few loads, as CPython's own macros and Cython read
//! them (bench/RESULTS.md has the measurements). This is why the wheel is
//! built per CPython version, not as one abi3 wheel.
//!
//! An `int` is read from its digits only in the layouts probed at import
//! ([`probe_int_layout`]: CPython 3.11's `ob_size`, 3.12+'s `lv_tag`),
//! and only when it has a single 30-bit digit; any other int, and any
//! interpreter whose ints the probe does not recognise, goes through
//! `PyLong_AsLongLongAndOverflow`. None of this runs Python code.

use std::sync::atomic::{AtomicU8, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

/// How an exact `int`'s value is read: by the C API.
pub const BY_API: u8 = 0;
/// CPython 3.11: `ob_size` is the sign times the number of digits.
pub const BY_OB_SIZE: u8 = 1;
/// CPython 3.12+: `lv_tag` holds the number of digits (above 3 flag bits)
/// and the sign (its low 2 bits: 0 positive, 1 zero, 2 negative).
pub const BY_LV_TAG: u8 = 2;

static INT_LAYOUT: AtomicU8 = AtomicU8::new(BY_API);

/// The start of an int, as `cpython/longintrepr.h` of 3.11 lays it out.
#[repr(C)]
struct LongBySize {
    head: ffi::PyVarObject,
    digit: u32,
}

/// The start of an int, as `cpython/longintrepr.h` of 3.12+ lays it out.
#[repr(C)]
struct LongByTag {
    head: ffi::PyObject,
    lv_tag: usize,
    digit: u32,
}

/// `lv_tag` below this: at most one digit.
const COMPACT_TAG: usize = 2 << 3;

/// A list's or tuple's items, borrowed, for a read loop.
pub struct RawItems {
    seq: *mut ffi::PyObject,
    list: bool,
}

impl RawItems {
    /// # Safety
    /// `seq` is a live list (`list`) or tuple (not `list`), held alive by
    /// the caller for as long as this value is used.
    pub unsafe fn new(seq: *mut ffi::PyObject, list: bool) -> Self {
        RawItems { seq, list }
    }

    /// The items as they are now, borrowed.
    ///
    /// # Safety
    /// Valid until Python code runs: it may resize the list or free its
    /// items. The caller runs none while it uses the slice or its items,
    /// and takes the slice anew after running any.
    #[inline]
    pub unsafe fn now(&self) -> &[*mut ffi::PyObject] {
        // SAFETY: `seq` is a live list or tuple (`new`): its first
        // `ob_size` slots are its items, as CPython's GET_ITEM macros read
        // them; an empty list may have no item array at all.
        unsafe {
            let len = usize::try_from(ffi::Py_SIZE(self.seq)).unwrap_or(0);
            let first = if self.list {
                (*self.seq.cast::<ffi::PyListObject>()).ob_item
            } else {
                (&raw mut (*self.seq.cast::<ffi::PyTupleObject>()).ob_item).cast::<*mut ffi::PyObject>()
            };
            if len == 0 || first.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(first, len)
            }
        }
    }
}

/// How this interpreter's exact ints are read (chosen at import): one of
/// the `BY_` constants, for [`int_in_place`].
pub fn int_read() -> u8 {
    INT_LAYOUT.load(Ordering::Relaxed)
}

/// An exact `int`'s value, if `item` (borrowed, possibly NULL) is one that
/// fits in an i64. Runs no Python code.
///
/// # Safety
/// `item` is NULL or a live object, and `LAYOUT` is [`int_read`]'s
/// answer (a constant, so that each read loop is made for one layout).
#[inline]
pub unsafe fn int_in_place<const LAYOUT: u8>(item: *mut ffi::PyObject) -> Option<i64> {
    // SAFETY: `item` is live (caller). On CPython 3.11+ (the only versions
    // the probe accepts a layout for) an exact int, zero included, is at
    // least its header plus one digit long, so the loads below stay inside
    // it; the layout was checked against known values at import
    // (`probe_int_layout`).
    unsafe {
        if item.is_null() || ffi::Py_TYPE(item) != &raw mut ffi::PyLong_Type {
            return None;
        }
        match LAYOUT {
            BY_OB_SIZE => {
                let long = &*item.cast::<LongBySize>();
                // -1, 0 or 1
                if long.head.ob_size.wrapping_add(1) as usize <= 2 {
                    return Some(long.head.ob_size as i64 * i64::from(long.digit));
                }
            }
            BY_LV_TAG => {
                let long = &*item.cast::<LongByTag>();
                if long.lv_tag < COMPACT_TAG {
                    return Some((1 - (long.lv_tag & 3) as i64) * i64::from(long.digit));
                }
            }
            _ => {}
        }
        let mut overflow = 0;
        let v = ffi::PyLong_AsLongLongAndOverflow(item, &raw mut overflow);
        (overflow == 0).then_some(v)
    }
}

/// An exact `float`'s value, if `item` (borrowed, possibly NULL) is one.
/// Runs no Python code.
///
/// # Safety
/// `item` is NULL or a live object.
#[inline]
pub unsafe fn float_in_place(item: *mut ffi::PyObject) -> Option<f64> {
    // SAFETY: `item` is live (caller); an exact float holds its value in
    // `ob_fval`, which the macro reads.
    unsafe {
        (!item.is_null() && ffi::Py_TYPE(item) == &raw mut ffi::PyFloat_Type).then(|| ffi::PyFloat_AS_DOUBLE(item))
    }
}

/// Chooses how [`int_in_place`] reads ints on this interpreter: the layout
/// its version documents in `cpython/longintrepr.h`, if single-digit ints
/// read that way give back known values and larger ones are not taken for
/// single-digit; else the C API. Returns the choice, for the log.
///
/// `TINKER_RL_DATA_INT_READ=api` in the environment chooses the C API: the
/// tests run the fallback that way, as an interpreter with another layout
/// would.
pub fn probe_int_layout(py: Python<'_>) -> PyResult<&'static str> {
    let sys = py.import("sys")?;
    let version_info = sys.getattr("version_info")?;
    let version: (u32, u32) = (
        version_info.getattr("major")?.extract()?,
        version_info.getattr("minor")?.extract()?,
    );
    let int_info = sys.getattr("int_info")?;
    let thirty_bit = int_info.getattr("bits_per_digit")?.extract::<u32>()? == 30
        && int_info.getattr("sizeof_digit")?.extract::<usize>()? == 4;
    // The layouts are CPython's (build.rs refuses other interpreters; this
    // is the run-time half of that check).
    let cpython = sys.getattr("implementation")?.getattr("name")?.extract::<String>()? == "cpython";
    let candidate = match version {
        _ if !cpython => BY_API,
        (3, 11) => BY_OB_SIZE,
        (3, minor) if minor >= 12 => BY_LV_TAG,
        _ => BY_API,
    };
    let forced_api = std::env::var_os("TINKER_RL_DATA_INT_READ").is_some_and(|v| v == "api");
    let layout = if !forced_api && thirty_bit && candidate != BY_API && reads_known_ints(py, candidate)? {
        candidate
    } else {
        BY_API
    };
    INT_LAYOUT.store(layout, Ordering::Relaxed);
    Ok(match layout {
        BY_OB_SIZE => "digits in place (CPython 3.11 ob_size)",
        BY_LV_TAG => "digits in place (CPython 3.12+ lv_tag)",
        _ => "PyLong_AsLongLongAndOverflow",
    })
}

fn reads_known_ints(py: Python<'_>, layout: u8) -> PyResult<bool> {
    let single = [0, 1, -1, 5, -5, 256, 257, -257, (1 << 30) - 1, 1 - (1 << 30)];
    let multi = [1 << 30, -(1 << 30), i64::MAX, i64::MIN];
    let mut ok = true;
    for v in single.into_iter().chain(multi) {
        let int = v.into_pyobject(py)?;
        // SAFETY: `int` is a live exact int, held for the call.
        let read = unsafe {
            match layout {
                BY_OB_SIZE => int_in_place::<BY_OB_SIZE>(int.as_ptr()),
                _ => int_in_place::<BY_LV_TAG>(int.as_ptr()),
            }
        };
        ok &= read == Some(v);
        // Multi-digit ints must be left to the C API: read with it only,
        // they give the same value, so also check the layout would not
        // have taken them as single-digit.
        if multi.contains(&v) {
            // SAFETY: as above.
            ok &= !unsafe { single_digit(int.as_ptr(), layout) };
        }
    }
    Ok(ok)
}

/// Whether `layout` says this int has at most one digit.
///
/// # Safety
/// `int` is a live exact int.
unsafe fn single_digit(int: *mut ffi::PyObject, layout: u8) -> bool {
    // SAFETY: `int` is a live exact int (caller); its header is read.
    unsafe {
        match layout {
            BY_OB_SIZE => (*int.cast::<LongBySize>()).head.ob_size.unsigned_abs() <= 1,
            BY_LV_TAG => (*int.cast::<LongByTag>()).lv_tag < COMPACT_TAG,
            _ => false,
        }
    }
}
