//! Fresh numpy arrays for a row's columns: written through plain slices
//! before anyone else can see them, and handed on only once every element
//! was written.

use std::mem::MaybeUninit;

use numpy::{Element, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::fill::{fill_row, Inputs, RowOut, Unfilled};
use crate::plan::{self, Segment};

/// A fresh 1-D numpy array, not yet written, that this code alone can see:
/// it is written through [`Unwritten::slots`] and becomes a [`Column`] only
/// by the caller's promise that every element was written. Saves zeroing
/// memory that [`crate::fill::fill_row`] writes in full anyway.
pub struct Unwritten<'py, T: Element> {
    array: Bound<'py, PyArray1<T>>,
}

impl<'py, T: Element> Unwritten<'py, T> {
    pub fn new(py: Python<'py>, n: usize) -> Self {
        Unwritten {
            // SAFETY: the memory is uninitialized; it is exposed only as
            // `MaybeUninit` (by `slots`) until the caller vouches for it.
            array: unsafe { PyArray1::new(py, n, false) },
        }
    }

    /// The elements, for writing.
    pub fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        let n = self.array.len();
        // SAFETY: the array was created here, is contiguous, and no other
        // view of its memory exists (it is handed on only by consuming
        // `self`); `MaybeUninit<T>` has `T`'s layout and claims nothing.
        unsafe { std::slice::from_raw_parts_mut(self.array.data().cast::<MaybeUninit<T>>(), n) }
    }

    /// # Safety
    /// Every element was written through [`Unwritten::slots`].
    pub unsafe fn assume_written(self) -> Column<'py, T> {
        Column { array: self.array }
    }

    /// The first `n` elements as the array, shortened in place.
    ///
    /// # Safety
    /// Those `n` elements were written through [`Unwritten::slots`].
    pub unsafe fn assume_written_prefix(self, n: usize) -> PyResult<Bound<'py, PyArray1<T>>> {
        if n < self.array.len() {
            // SAFETY: no reference into the array's memory is alive (slices
            // from `slots` borrow `self`, consumed here), so numpy may
            // reallocate it.
            unsafe { self.array.resize(n)? };
        }
        Ok(self.array)
    }
}

/// A fresh 1-D numpy array whose every element is initialized, that this
/// code alone can see until [`Column::into_array`] hands it on.
pub struct Column<'py, T: Element> {
    array: Bound<'py, PyArray1<T>>,
}

impl<'py, T: Element> Column<'py, T> {
    pub fn zeros(py: Python<'py>, n: usize) -> Self {
        Column {
            array: PyArray1::zeros(py, n, false),
        }
    }

    /// The elements.
    pub fn slice_mut(&mut self) -> &mut [T] {
        // SAFETY: the array was created here, is contiguous, and no
        // reference to it exists outside `self` (it is handed on only by
        // consuming `self`), so this is the only view of its memory; every
        // element is initialized (`zeros`, or `Unwritten::assume_written`).
        // numpy's `readwrite()` would check the same at run time, per array.
        unsafe { self.array.as_slice_mut() }.expect("a fresh 1-D array is contiguous")
    }

    pub fn into_array(self) -> Bound<'py, PyArray1<T>> {
        self.array
    }

    /// Marks the array read-only, as handed to users who must not write it.
    pub fn into_read_only(self) -> Bound<'py, PyArray1<T>> {
        // SAFETY: `as_array_ptr` is the live array object; clearing the
        // WRITEABLE flag is what `arr.flags.writeable = False` does.
        unsafe {
            (*self.array.as_array_ptr()).fields.flags &= !numpy::npyffi::NPY_ARRAY_WRITEABLE;
        }
        self.array
    }
}

/// One row's output columns, fresh numpy arrays of its `n` positions.
pub struct RowColumns<'py> {
    inputs: Option<Unwritten<'py, i32>>,
    targets: Unwritten<'py, i64>,
    logprobs: Unwritten<'py, f32>,
    advantages: Unwritten<'py, f32>,
    mask: Option<Unwritten<'py, f32>>,
}

/// A row's columns as [`RowColumns::fill`] wrote them.
pub struct FilledColumns<'py> {
    pub inputs: Option<Column<'py, i32>>,
    pub targets: Column<'py, i64>,
    pub logprobs: Column<'py, f32>,
    pub advantages: Column<'py, f32>,
    pub mask: Option<Column<'py, f32>>,
}

impl<'py> RowColumns<'py> {
    /// With an int32 model-input column when `int32_inputs`, a mask column
    /// when `mask`.
    pub fn new(py: Python<'py>, n: usize, int32_inputs: bool, mask: bool) -> Self {
        RowColumns {
            inputs: int32_inputs.then(|| Unwritten::new(py, n)),
            targets: Unwritten::new(py, n),
            logprobs: Unwritten::new(py, n),
            advantages: Unwritten::new(py, n),
            mask: mask.then(|| Unwritten::new(py, n)),
        }
    }

    /// Writes the row (see [`fill_row`]); a row its segments do not spell in
    /// full is an internal error, never an array with unwritten elements.
    pub fn fill(
        mut self,
        segments: &[Segment],
        elements: &[plan::Element],
        logprobs: &[f32],
        weights: impl Fn(usize) -> (f32, f32),
    ) -> Result<FilledColumns<'py>, Unfilled> {
        let out = RowOut {
            inputs: self.inputs.as_mut().map_or(Inputs::None, |c| Inputs::I32(c.slots())),
            targets: self.targets.slots(),
            logprobs: self.logprobs.slots(),
            advantages: self.advantages.slots(),
            mask: self.mask.as_mut().map(Unwritten::slots),
        };
        fill_row(segments, elements, logprobs, weights, out)?;
        // SAFETY: `fill_row` returned `Ok`: it wrote every element of every
        // column it was given, and it was given all of them.
        unsafe {
            Ok(FilledColumns {
                inputs: self.inputs.map(|c| c.assume_written()),
                targets: self.targets.assume_written(),
                logprobs: self.logprobs.assume_written(),
                advantages: self.advantages.assume_written(),
                mask: self.mask.map(|c| c.assume_written()),
            })
        }
    }
}
