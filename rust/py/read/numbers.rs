//! Sequences of numbers read as memory: anything with the buffer protocol
//! (numpy arrays, `array.array`, `memoryview`, `bytes`), one-dimensional,
//! of any integer (8-64 bits, signed or not), bool or float (16-64 bits)
//! format, contiguous or strided, either byte order, aligned or not.
//!
//! No Python object is made or read per element: tinker's sampler already
//! returns each sequence as arrays (`tokens_np`, `logprobs_np`), and this
//! reads them at memory speed instead of through `tolist()`. The one reader
//! of such memory for every pass (the front doors, the cookbook step, the
//! request encoder).

use std::ffi::CStr;
use std::marker::PhantomData;

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
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

/// A buffer's element as stored, widened.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    /// An unsigned value above `i64::MAX`.
    Huge(u64),
    Float(f64),
}

impl Value {
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Huge(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

/// Why an object's buffer is not a sequence of numbers.
pub enum NotNumbers {
    /// It has more or fewer than one dimension: its shape.
    Shape(Vec<isize>),
    /// Its elements are not numbers of a supported width: its format.
    Format(String),
}

/// How the elements of a one-dimensional buffer lie in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub kind: Kind,
    /// Bytes per element.
    pub width: usize,
    /// Whether elements are stored in the other byte order than this machine's.
    pub swapped: bool,
    pub len: usize,
    /// Bytes from one element to the next (negative for a reversed view).
    pub stride: isize,
}

/// A sequence of numbers in memory: a numpy array, or anything else with
/// the buffer protocol (`array.array`, `memoryview`, `bytes`).
///
/// Python code can reallocate an array's memory (`ndarray.resize(...,
/// refcheck=False)` does, even while a buffer of it is exported), so an
/// array is held as the object, and its memory is looked at only through
/// [`Numbers::view`], for a read during which no Python code runs; its
/// header is read then, the array's own description of its memory, with no
/// buffer export (numpy's builds a format string and a cached record per
/// call). Any other exporter's elements are copied out when opened: its
/// buffer is held for no longer than that.
pub struct Numbers<'py> {
    source: Source<'py>,
    /// As found when opened.
    layout: Layout,
}

enum Source<'py> {
    Array(Bound<'py, PyUntypedArray>),
    /// The elements, back to back, in 8-byte words (so aligned for any width).
    Copied(Vec<u64>),
}

impl<'py> Numbers<'py> {
    /// The numbers of `obj`, if it is a numpy array or exports a buffer
    /// (`Ok(None)` if it does neither). The exporter's own code may run.
    pub fn of(obj: &Bound<'py, PyAny>) -> PyResult<Option<Result<Self, NotNumbers>>> {
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            if let Some(layout) = array_layout(array) {
                return Ok(Some(Ok(Numbers {
                    source: Source::Array(array.clone()),
                    layout,
                })));
            }
        }
        // SAFETY: the view is used below with no Python code run, and dropped.
        let view = match unsafe { Exported::of(obj)? } {
            None => return Ok(None),
            Some(Err(e)) => return Ok(Some(Err(e))),
            Some(Ok(view)) => view,
        };
        let layout = view.layout;
        let mut words = vec![0u64; (layout.len * layout.width).div_ceil(8)];
        let base = view.view.buf.cast::<u8>().cast_const();
        let dst = words.as_mut_ptr().cast::<u8>();
        for i in 0..layout.len {
            // SAFETY: element `i < len` is `width` bytes at `base + i * stride`
            // in the exporter's memory, held by `view`; `dst` has room for
            // `len * width` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.offset(i as isize * layout.stride),
                    dst.add(i * layout.width),
                    layout.width,
                );
            }
        }
        drop(view);
        let layout = Layout {
            stride: layout.width as isize,
            ..layout
        };
        Ok(Some(Ok(Numbers {
            source: Source::Copied(words),
            layout,
        })))
    }

    pub fn len(&self) -> usize {
        self.layout.len
    }

    pub fn kind(&self) -> Kind {
        self.layout.kind
    }

    /// The elements as they are now; `None` if the array's memory is no
    /// longer a one-dimensional buffer of numbers (user code changed it).
    ///
    /// # Safety
    /// No Python code runs while the view lives: it could resize or free
    /// the memory the view points into.
    pub unsafe fn view(&self) -> Option<View<'_>> {
        match &self.source {
            // SAFETY: the caller's promise.
            Source::Array(array) => unsafe { array_view(array) },
            Source::Copied(words) => Some(View {
                data: words.as_ptr().cast::<u8>(),
                layout: self.layout,
                _memory: PhantomData,
            }),
        }
    }
}

/// A one-dimensional numpy array's elements as they are now, read from its
/// header (no buffer export, no Python code run); `None` if they are not
/// numbers read here.
///
/// # Safety
/// No Python code runs while the view lives: it could resize or free the
/// array's memory.
pub unsafe fn array_view<'a>(array: &'a Bound<'_, PyUntypedArray>) -> Option<View<'a>> {
    let layout = array_layout(array)?;
    // SAFETY: the array is alive (borrowed for `'a`); its data pointer is read.
    let data = unsafe { (*array.as_array_ptr()).fields.data }.cast::<u8>().cast_const();
    Some(View {
        data,
        layout,
        _memory: PhantomData,
    })
}

/// A numpy array's elements as its header describes them, if it is
/// one-dimensional and of a number type read here. No Python code runs.
fn array_layout(array: &Bound<'_, PyUntypedArray>) -> Option<Layout> {
    if array.ndim() != 1 {
        return None;
    }
    let dtype = array.dtype();
    let width = dtype.itemsize();
    let kind = match (dtype.kind(), width) {
        (b'i', 1 | 2 | 4 | 8) => Kind::Signed,
        (b'u', 1 | 2 | 4 | 8) => Kind::Unsigned,
        (b'b', 1) => Kind::Bool,
        (b'f', 2 | 4 | 8) => Kind::Float,
        _ => return None,
    };
    Some(Layout {
        kind,
        width,
        swapped: dtype.is_native_byteorder() == Some(false),
        len: array.shape()[0],
        stride: array.strides()[0],
    })
}

/// A numpy array's bytes as `tobytes()` gives them, when it is C-contiguous
/// (any shape), for a read during which no Python code runs.
///
/// # Safety
/// No Python code runs while the slice lives: it could resize or free the
/// array's memory.
pub unsafe fn contiguous_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> Option<&'a [u8]> {
    if !array.is_c_contiguous() {
        return None;
    }
    let len = array.shape().iter().product::<usize>() * array.dtype().itemsize();
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: a C-contiguous array's elements are the `len` bytes at its
    // data pointer, in memory it (or its base, which it holds) owns, which
    // stays put while no Python code runs (the caller's promise).
    Some(unsafe { std::slice::from_raw_parts((*array.as_array_ptr()).fields.data.cast::<u8>(), len) })
}

/// Elements in memory, seen for one read.
pub struct View<'a> {
    data: *const u8,
    layout: Layout,
    _memory: PhantomData<&'a ()>,
}

/// A view's elements as a plain slice, when they are aligned, native-order
/// and back to back.
pub enum Slice<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl<'a> View<'a> {
    pub fn len(&self) -> usize {
        self.layout.len
    }

    /// Its first `len` elements, if it has that many.
    pub fn first(self, len: usize) -> Option<Self> {
        (len <= self.layout.len).then_some(View {
            layout: Layout { len, ..self.layout },
            ..self
        })
    }

    pub fn kind(&self) -> Kind {
        self.layout.kind
    }

    /// Bytes per element.
    pub fn width(&self) -> usize {
        self.layout.width
    }

    /// Bytes from one element to the next.
    pub fn stride(&self) -> isize {
        self.layout.stride
    }

    /// Value `i`, if `i < len`.
    pub fn get(&self, i: usize) -> Option<Value> {
        let mut value = None;
        if i < self.layout.len {
            let Ok(()) = self.each_of(i..i + 1, |_, v| {
                value = Some(v);
                Ok::<(), std::convert::Infallible>(())
            });
        }
        value
    }

    /// Calls `put(i, value)` for every element in order, stopping at the
    /// first error `put` returns.
    #[inline]
    pub fn for_each<E>(&self, put: impl FnMut(usize, Value) -> Result<(), E>) -> Result<(), E> {
        self.each_of(0..self.layout.len, put)
    }

    #[inline]
    fn each_of<E>(
        &self,
        range: std::ops::Range<usize>,
        mut put: impl FnMut(usize, Value) -> Result<(), E>,
    ) -> Result<(), E> {
        let Layout {
            kind,
            width,
            swapped,
            len,
            stride,
        } = self.layout;
        debug_assert!(range.end <= len);
        macro_rules! each {
            ($t:ty, $widen:expr) => {{
                for i in range {
                    // SAFETY: element `i < len` lies at `data + i * stride`
                    // inside the memory the view was made of (a 1-D buffer
                    // of `len` elements of `width` bytes, unchanged while
                    // the view lives); it may be unaligned, so it is read
                    // unaligned.
                    let raw = unsafe {
                        self.data
                            .offset(i as isize * stride)
                            .cast::<$t>()
                            .read_unaligned()
                    };
                    let raw = if swapped { raw.swap_bytes() } else { raw };
                    put(i, $widen(raw))?;
                }
            }};
        }
        match (kind, width) {
            (Kind::Signed, 1) => each!(i8, |v: i8| Value::Int(i64::from(v))),
            (Kind::Signed, 2) => each!(i16, |v: i16| Value::Int(i64::from(v))),
            (Kind::Signed, 4) => each!(i32, |v: i32| Value::Int(i64::from(v))),
            (Kind::Signed, 8) => each!(i64, Value::Int),
            (Kind::Unsigned | Kind::Bool, 1) => each!(u8, |v: u8| Value::Int(i64::from(v))),
            (Kind::Unsigned, 2) => each!(u16, |v: u16| Value::Int(i64::from(v))),
            (Kind::Unsigned, 4) => each!(u32, |v: u32| Value::Int(i64::from(v))),
            (Kind::Unsigned, 8) => each!(u64, |v: u64| i64::try_from(v).map_or(Value::Huge(v), Value::Int)),
            (Kind::Float, 2) => each!(u16, |v: u16| Value::Float(f64::from(f16_to_f32(v)))),
            (Kind::Float, 4) => each!(u32, |v: u32| Value::Float(f64::from(f32::from_bits(v)))),
            (Kind::Float, 8) => each!(u64, |v: u64| Value::Float(f64::from_bits(v))),
            _ => unreachable!("layouts are made only of these widths"),
        }
        Ok(())
    }

    /// The elements as a plain slice, if they are aligned native-order
    /// int32, int64, float32 or float64 laid out back to back (tinker's
    /// `tokens_np` and `logprobs_np`, the cookbook's tensors).
    pub fn slice(&self) -> Option<Slice<'a>> {
        let Layout {
            kind,
            width,
            swapped,
            len,
            stride,
        } = self.layout;
        if swapped || stride != width as isize || self.data.align_offset(width) != 0 {
            return None;
        }
        let data = self.data;
        // Each arm: `len` aligned (checked above), back-to-back native
        // elements of that type in the memory the view was made of,
        // unchanged while it lives.
        match (kind, width) {
            // SAFETY: as above.
            (Kind::Signed, 4) => Some(Slice::I32(unsafe { elements(data, len) })),
            // SAFETY: as above.
            (Kind::Signed, 8) => Some(Slice::I64(unsafe { elements(data, len) })),
            // SAFETY: as above.
            (Kind::Float, 4) => Some(Slice::F32(unsafe { elements(data, len) })),
            // SAFETY: as above.
            (Kind::Float, 8) => Some(Slice::F64(unsafe { elements(data, len) })),
            _ => None,
        }
    }
}

/// `len` elements from `data`.
///
/// # Safety
/// Unless `len` is 0, `data` points at `len` aligned, initialized `T`s that
/// stay unchanged for `'a`.
unsafe fn elements<'a, T>(data: *const u8, len: usize) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: as the caller promises.
        unsafe { std::slice::from_raw_parts(data.cast::<T>(), len) }
    }
}

/// A buffer exported by its object, released on drop.
struct Exported {
    /// Boxed: the exporter may keep pointers into the `Py_buffer` it filled.
    view: Box<ffi::Py_buffer>,
    layout: Layout,
}

impl Exported {
    /// # Safety
    /// The exporter may reallocate its memory once Python code runs (numpy
    /// does on `resize`, buffer or not): the caller reads it with none run.
    unsafe fn of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Result<Self, NotNumbers>>> {
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
        let mut exported = Exported {
            view,
            layout: Layout {
                kind: Kind::Unsigned,
                width: 1,
                swapped: false,
                len: 0,
                stride: 1,
            },
        };
        Ok(Some(exported.describe().map(|()| exported)))
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
        let stride = if view.strides.is_null() {
            view.itemsize
        } else {
            // SAFETY: the exporter filled one stride entry (ndim is 1).
            unsafe { *view.strides }
        };
        let len = usize::try_from(shape[0]).unwrap_or(0);
        self.layout = Layout {
            kind,
            width,
            swapped,
            len,
            stride,
        };
        Ok(())
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful `PyObject_GetBuffer`
        // and is released once, here, inside the call that took it (the
        // GIL held).
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
