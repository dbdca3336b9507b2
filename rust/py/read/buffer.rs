//! Sequences of numbers read as memory: anything with the buffer protocol
//! (numpy arrays, `array.array`, `memoryview`, `bytes`), one-dimensional,
//! of any integer (8-64 bits, signed or not), bool or float (16-64 bits)
//! format, contiguous or strided, either byte order, aligned or not.
//!
//! No Python object is made or read per element: tinker's sampler already
//! returns each sequence as arrays (`tokens_np`, `logprobs_np`), and this
//! reads them at memory speed instead of through `tolist()`.

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;

/// What an element of a buffer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Signed,
    Unsigned,
    Bool,
    Float,
}

/// A number as stored, widened.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    Int(i64),
    /// An unsigned value above `i64::MAX`.
    Huge(u64),
    Float(f64),
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(v) => v as f64,
            Number::Huge(v) => v as f64,
            Number::Float(v) => v,
        }
    }
}

/// A one-dimensional buffer of numbers, held (and so kept alive and
/// unresizable by its exporter) until dropped.
pub struct NumberBuffer {
    /// Boxed: the exporter may keep pointers into the `Py_buffer` it filled.
    view: Box<ffi::Py_buffer>,
    kind: Kind,
    width: usize,
    /// Whether elements are stored in the other byte order than this machine's.
    swapped: bool,
    len: usize,
    stride: isize,
}

/// Why an object's buffer is not a sequence of numbers.
pub enum NotNumbers {
    /// It has more or fewer than one dimension: its shape.
    Shape(Vec<isize>),
    /// Its elements are not numbers of a supported width: its format.
    Format(String),
}

impl NumberBuffer {
    /// The buffer of `obj`, if it exports one (`Ok(None)` if it does not).
    pub fn of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Result<Self, NotNumbers>>> {
        // SAFETY: `obj` is a live object; the check only reads its type.
        if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
            return Ok(None);
        }
        // SAFETY: a zeroed `Py_buffer` is what `PyObject_GetBuffer` expects
        // to fill (all its fields are integers and pointers).
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `obj` is live and `view` points to a `Py_buffer` that
        // outlives the call; on success the view holds a reference to the
        // exporter and must be released (`Drop`), on failure an exception
        // is set and nothing needs releasing.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &raw mut *view, ffi::PyBUF_RECORDS_RO) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // Owned from here: released on drop, whatever is found wrong below.
        let mut buffer = NumberBuffer {
            view,
            kind: Kind::Unsigned,
            width: 0,
            swapped: false,
            len: 0,
            stride: 0,
        };
        Ok(Some(buffer.describe().map(|()| buffer)))
    }

    /// Sets the element layout from the view the exporter filled.
    fn describe(&mut self) -> Result<(), NotNumbers> {
        let view = &*self.view;
        let shape: Vec<isize> = if view.shape.is_null() {
            vec![view.len / view.itemsize.max(1)]
        } else {
            // SAFETY: the exporter filled `ndim` shape entries.
            (0..view.ndim).map(|d| unsafe { *view.shape.add(d as usize) }).collect()
        };
        if view.ndim != 1 {
            return Err(NotNumbers::Shape(shape));
        }
        let format = if view.format.is_null() {
            "B".to_string() // the buffer protocol's default: unsigned bytes
        } else {
            // SAFETY: the exporter's format is a NUL-terminated string that
            // lives as long as the view.
            unsafe { CStr::from_ptr(view.format) }.to_string_lossy().into_owned()
        };
        let width = usize::try_from(view.itemsize).unwrap_or(0);
        let Some((kind, swapped)) = parse_format(&format, width) else {
            return Err(NotNumbers::Format(format));
        };
        self.stride = if view.strides.is_null() {
            view.itemsize
        } else {
            // SAFETY: the exporter filled one stride entry (ndim is 1).
            unsafe { *view.strides }
        };
        self.len = usize::try_from(shape[0]).unwrap_or(0);
        (self.kind, self.width, self.swapped) = (kind, width, swapped);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Element `i`, if `i < len`.
    pub fn get(&self, i: usize) -> Option<Number> {
        let mut value = None;
        if i < self.len {
            let Ok(()) = self.each_of(i..i + 1, |_, v| {
                value = Some(v);
                Ok::<(), std::convert::Infallible>(())
            });
        }
        value
    }

    /// Calls `put(i, value)` for every element in order, stopping at the
    /// first error `put` returns. Runs no Python code.
    #[inline]
    pub fn for_each<E>(&self, put: impl FnMut(usize, Number) -> Result<(), E>) -> Result<(), E> {
        self.each_of(0..self.len, put)
    }

    #[inline]
    fn each_of<E>(
        &self,
        range: std::ops::Range<usize>,
        mut put: impl FnMut(usize, Number) -> Result<(), E>,
    ) -> Result<(), E> {
        debug_assert!(range.end <= self.len);
        macro_rules! each {
            ($t:ty, $widen:expr) => {{
                let base = self.view.buf.cast::<u8>().cast_const();
                for i in range {
                    // SAFETY: element `i < len` lies at `base + i * stride`
                    // inside the exporter's memory (a 1-D buffer of `len`
                    // elements of `width` bytes, held until `self` drops);
                    // it may be unaligned, so it is read unaligned.
                    let raw = unsafe {
                        base.offset(i as isize * self.stride)
                            .cast::<$t>()
                            .read_unaligned()
                    };
                    let raw = if self.swapped { raw.swap_bytes() } else { raw };
                    put(i, $widen(raw))?;
                }
            }};
        }
        match (self.kind, self.width) {
            (Kind::Signed, 1) => each!(i8, |v: i8| Number::Int(i64::from(v))),
            (Kind::Signed, 2) => each!(i16, |v: i16| Number::Int(i64::from(v))),
            (Kind::Signed, 4) => each!(i32, |v: i32| Number::Int(i64::from(v))),
            (Kind::Signed, 8) => each!(i64, Number::Int),
            (Kind::Unsigned | Kind::Bool, 1) => each!(u8, |v: u8| Number::Int(i64::from(v))),
            (Kind::Unsigned, 2) => each!(u16, |v: u16| Number::Int(i64::from(v))),
            (Kind::Unsigned, 4) => each!(u32, |v: u32| Number::Int(i64::from(v))),
            (Kind::Unsigned, 8) => each!(u64, |v: u64| i64::try_from(v).map_or(Number::Huge(v), Number::Int)),
            (Kind::Float, 2) => each!(u16, |v: u16| Number::Float(f64::from(f16_to_f32(v)))),
            (Kind::Float, 4) => each!(u32, |v: u32| Number::Float(f64::from(f32::from_bits(v)))),
            (Kind::Float, 8) => each!(u64, |v: u64| Number::Float(f64::from_bits(v))),
            _ => unreachable!("parse_format accepts only these widths"),
        }
        Ok(())
    }

    /// Whether the elements are native-order int32s laid out back to back
    /// (tinker's `tokens_np`): read as a plain slice.
    pub fn as_i32_slice(&self) -> Option<&[i32]> {
        let aligned = self.view.buf.cast::<i32>().is_aligned();
        let plain = self.kind == Kind::Signed && self.width == 4 && !self.swapped && self.stride == 4;
        // SAFETY: `len` aligned, contiguous, native int32s in memory the
        // exporter keeps alive while `self` holds the view.
        (plain && aligned).then(|| unsafe { std::slice::from_raw_parts(self.view.buf.cast::<i32>(), self.len) })
    }

    /// As [`NumberBuffer::as_i32_slice`], for float32 (`logprobs_np`).
    pub fn as_f32_slice(&self) -> Option<&[f32]> {
        let aligned = self.view.buf.cast::<f32>().is_aligned();
        let plain = self.kind == Kind::Float && self.width == 4 && !self.swapped && self.stride == 4;
        // SAFETY: as in `as_i32_slice`, for float32s.
        (plain && aligned).then(|| unsafe { std::slice::from_raw_parts(self.view.buf.cast::<f32>(), self.len) })
    }
}

impl Drop for NumberBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful `PyObject_GetBuffer`
        // and is released once, here; values of this type live inside a
        // call that holds the GIL (in `Items<'py>`) and drop there.
        unsafe { ffi::PyBuffer_Release(&raw mut *self.view) };
    }
}

/// The element kind of a struct-module format, and whether it is stored in
/// the other byte order; `None` for anything but one number of `width`
/// bytes (the width the exporter reports is the truth: `l` is 4 or 8 bytes
/// depending on the prefix and the platform).
fn parse_format(format: &str, width: usize) -> Option<(Kind, bool)> {
    let (order, code) = match format.as_bytes() {
        [code] => (b'@', *code),
        [order @ (b'@' | b'=' | b'<' | b'>' | b'!'), code] => (*order, *code),
        _ => return None,
    };
    let swapped = match order {
        b'<' => cfg!(target_endian = "big"),
        b'>' | b'!' => cfg!(target_endian = "little"),
        _ => false,
    };
    let kind = match code {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => Kind::Signed,
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' => Kind::Unsigned,
        b'?' => Kind::Bool,
        b'e' | b'f' | b'd' => Kind::Float,
        _ => return None,
    };
    let widths: &[usize] = match kind {
        Kind::Signed | Kind::Unsigned => &[1, 2, 4, 8],
        Kind::Bool => &[1],
        Kind::Float => &[2, 4, 8],
    };
    let width_matches = match code {
        b'e' => width == 2,
        b'f' => width == 4,
        b'd' => width == 8,
        _ => true,
    };
    (widths.contains(&width) && width_matches).then_some((kind, swapped))
}

/// An IEEE half-precision value, exactly (every f16 is an f32).
fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        // Subnormal: mantissa * 2**-24, exact in f32.
        (0, m) => {
            let value = m as f32 * 2f32.powi(-24);
            return if sign == 0 { value } else { -value };
        }
        (0x1f, 0) => 0xff << 23,
        (0x1f, m) => (0xff << 23) | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_give_kind_and_order() {
        let native_little = cfg!(target_endian = "little");
        assert_eq!(parse_format("i", 4), Some((Kind::Signed, false)));
        assert_eq!(parse_format("<i", 4), Some((Kind::Signed, !native_little)));
        assert_eq!(parse_format(">q", 8), Some((Kind::Signed, native_little)));
        assert_eq!(parse_format("=H", 2), Some((Kind::Unsigned, false)));
        assert_eq!(parse_format("l", 8), Some((Kind::Signed, false)));
        assert_eq!(parse_format("e", 2), Some((Kind::Float, false)));
        assert_eq!(parse_format("?", 1), Some((Kind::Bool, false)));
        assert_eq!(parse_format("f", 8), None);
        assert_eq!(parse_format("Zf", 8), None);
        assert_eq!(parse_format("T{i:a:}", 4), None);
        assert_eq!(parse_format("2i", 8), None);
        assert_eq!(parse_format("i", 3), None);
    }

    #[test]
    fn half_floats_are_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }
}
