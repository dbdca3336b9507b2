//! Reading the user's Python objects: attributes, sequences and their
//! scalars, with located errors. Sequences are lists and tuples (their
//! exact ints and floats read in place: `exact`), buffers of numbers (read
//! as memory: `buffer`), or any other iterable (copied into a list).
//!
//! Any of them may run user code while it is read (`__index__`,
//! `__float__`, `__iter__`, a property), and that code may change or free
//! whatever it can reach. So containers are held by strong references for
//! as long as they are read; an item is borrowed only while an exact `int`
//! or `float` is read in place (`exact.rs`: no Python code runs), and is
//! held strongly before anything that can run some; every value is read
//! once.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyAttributeError, PyOverflowError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::{ffi, intern};

use crate::errors::{ErrorKind, InputError, Location};
use crate::plan::Element;
use crate::py::gc::collector_off;
use exact::{float_in_place, int_in_place, int_read, RawItems, BY_API, BY_LV_TAG, BY_OB_SIZE};
use numbers::{Kind, NotNumbers, Numbers, Slice, Value, View};

pub mod exact;
pub mod numbers;

pub const MAX_TOKEN: i64 = i32::MAX as i64;

thread_local! {
    /// One-shot iterators (an object that is its own iterator: a generator,
    /// `iter(list)`) this thread has read as sequences: whoever hands a
    /// refused input on to another function compares the count before and
    /// after, since that function would find them exhausted.
    static ONE_SHOT_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether `obj` is its own iterator (a generator, `iter(list)`, `map`):
/// read once, it is gone.
pub fn is_one_shot(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is held alive; the check reads its type's slots.
    unsafe { ffi::PyIter_Check(obj.as_ptr()) != 0 }
}

/// How many one-shot iterators this thread has read as sequences so far.
pub fn one_shot_reads() -> u64 {
    ONE_SHOT_READS.with(std::cell::Cell::get)
}

/// `obj.name`; a missing attribute is a located `TypeError` naming it.
pub fn attr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>, at: Location) -> PyResult<Bound<'py, PyAny>> {
    obj.getattr(name).map_err(|e| {
        if e.is_instance_of::<PyAttributeError>(obj.py()) {
            let message = format!(
                "{} object has no attribute '{}'",
                type_name(obj),
                name.to_string_lossy()
            );
            InputError::new(ErrorKind::Type, at, message).into()
        } else {
            e
        }
    })
}

/// What the items of a sequence must be, to vet a numpy array's dtype
/// before reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Token,
    Real,
    Object,
    /// Per-group rows: also a 2-D numpy array, read row by row.
    Rows,
}

/// A sequence's items, from a list, tuple or buffer held alive here. Its
/// length is taken once: should user code grow a list while it is read, the
/// rows laid out for the old length stay right; reading a list that shrank
/// meanwhile is a located `RuntimeError`.
pub struct Items<'py> {
    py: Python<'py>,
    seq: Seq<'py>,
    len: usize,
    what: &'static str,
    at: Location,
}

enum Seq<'py> {
    List(Bound<'py, PyList>),
    Tuple(Bound<'py, PyTuple>),
    /// Numbers in memory (no Python object per element).
    Numbers(Numbers<'py>),
}

impl<'py> Items<'py> {
    /// Reads `obj` (the field `what` at `at`) as a sequence of `kind` items.
    pub fn of(obj: &Bound<'py, PyAny>, what: &'static str, kind: ItemKind, at: Location) -> PyResult<Self> {
        let py = obj.py();
        let items = |seq: Seq<'py>, len: usize| Items { py, seq, len, what, at };
        let list = |list: Bound<'py, PyList>| items(Seq::List(list.clone()), list.len());
        if let Ok(l) = obj.cast::<PyList>() {
            return Ok(list(l.clone()));
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return Ok(items(Seq::Tuple(tuple.clone()), tuple.len()));
        }
        let numbers = matches!(kind, ItemKind::Token | ItemKind::Real);
        if let Ok(array) = obj.cast::<PyUntypedArray>() {
            check_array(array, what, kind, at)?;
            if !(numbers && array.ndim() == 1 && array.dtype().kind() != b'O') {
                // tolist() gives exact Python ints and floats (a 2-D array,
                // a list of rows): the list path.
                return Ok(list(obj.call_method0(intern!(py, "tolist"))?.cast_into::<PyList>()?));
            }
        }
        if numbers {
            match Numbers::of(obj)? {
                Some(Ok(buffer)) => {
                    if kind == ItemKind::Token && buffer.kind() == Kind::Float {
                        let message = format!("{what} holds floats, not integers ({})", type_name(obj));
                        return Err(InputError::new(ErrorKind::Type, at, message).into());
                    }
                    let len = buffer.len();
                    return Ok(items(Seq::Numbers(buffer), len));
                }
                Some(Err(NotNumbers::Shape(shape))) => {
                    let message = format!("{what} must be 1-D, got a buffer of shape {shape:?}");
                    return Err(InputError::new(ErrorKind::Value, at, message).into());
                }
                Some(Err(NotNumbers::Format(format))) => {
                    let message = format!(
                        "{what} is a buffer of format '{format}', not of numbers ({})",
                        type_name(obj)
                    );
                    return Err(InputError::new(ErrorKind::Type, at, message).into());
                }
                None => {}
            }
        }
        if obj.is_instance_of::<PyString>() {
            return Err(not_a_sequence(obj, what, at));
        }
        if is_one_shot(obj) {
            ONE_SHOT_READS.with(|n| n.set(n.get() + 1));
        }
        match obj.try_iter() {
            Ok(iter) => Ok(list(PyList::new(py, iter.collect::<PyResult<Vec<_>>>()?)?)),
            Err(e) if e.is_instance_of::<PyTypeError>(py) => Err(not_a_sequence(obj, what, at)),
            Err(e) => Err(e),
        }
    }

    /// The items of an exact list or tuple (`None` for anything else,
    /// subclasses included: one may iterate otherwise than its storage).
    pub fn of_exact_sequence(obj: &Bound<'py, PyAny>, what: &'static str) -> Option<Self> {
        let py = obj.py();
        let items = |seq: Seq<'py>, len: usize| Items {
            py,
            seq,
            len,
            what,
            at: Location::BATCH,
        };
        if let Ok(list) = obj.cast_exact::<PyList>() {
            Some(items(Seq::List(list.clone()), list.len()))
        } else if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
            Some(items(Seq::Tuple(tuple.clone()), tuple.len()))
        } else {
            None
        }
    }

    /// `obj.name` (a located `TypeError` when missing) read as [`Items::of`]
    /// reads a sequence.
    pub fn of_attr(
        obj: &Bound<'py, PyAny>,
        name: &Bound<'py, PyString>,
        what: &'static str,
        kind: ItemKind,
        at: Location,
    ) -> PyResult<Self> {
        Self::of(&attr(obj, name, at)?, what, kind, at)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn py(&self) -> Python<'py> {
        self.py
    }

    /// Item `i`, held strongly (of a buffer: a new int or float).
    pub fn get(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        match &self.seq {
            Seq::List(l) => l.get_item(i).map_err(|_| self.shrank()),
            Seq::Tuple(t) => t.get_item(i),
            Seq::Numbers(numbers) => {
                // SAFETY: the view is dropped before any Python code runs.
                let element = unsafe { numbers.view() }.and_then(|view| view.get(i));
                match element {
                    Some(Value::Int(v)) => Ok(v.into_pyobject(self.py)?.into_any()),
                    Some(Value::Huge(v)) => Ok(v.into_pyobject(self.py)?.into_any()),
                    Some(Value::Float(v)) => Ok(PyFloat::new(self.py, v).into_any()),
                    None => Err(self.shrank()),
                }
            }
        }
    }

    /// `read(view)` of the first `len` elements of the buffer as it is now.
    ///
    /// # Safety
    /// `read` runs no Python code (the view points into memory that Python
    /// code could reallocate).
    unsafe fn with_view<T>(&self, numbers: &Numbers<'py>, read: impl FnOnce(View<'_>) -> T) -> PyResult<T> {
        // SAFETY: the view lives only inside `read` (the caller's promise).
        match unsafe { numbers.view() }.and_then(|view| view.first(self.len)) {
            Some(view) => Ok(read(view)),
            None => Err(self.shrank()),
        }
    }

    #[cold]
    fn shrank(&self) -> PyErr {
        let message = format!(
            "{} changed size while being read (it had {} items)",
            self.what, self.len
        );
        PyRuntimeError::new_err(InputError::new(ErrorKind::Value, self.at, message).to_string())
    }

    fn current_len(&self) -> usize {
        match &self.seq {
            Seq::List(l) => l.len(),
            Seq::Tuple(t) => t.len(),
            Seq::Numbers(n) => n.len(), // not read: buffers share no ints
        }
    }

    /// Appends items `a..b` to `out`, sharing them, copied by CPython in C
    /// (no Python code runs, even for subclasses); `false`, appending
    /// nothing, if a list is now shorter than `b` (or this is a buffer:
    /// it holds no ints to share). Of an exact list or tuple, a prefix at
    /// least half its length is appended whole and its tail cut off: one
    /// copy, no temporary slice.
    pub fn append_to(&self, out: &Bound<'py, PyList>, a: usize, b: usize) -> PyResult<bool> {
        let len = self.current_len();
        let seq = match &self.seq {
            Seq::List(l) => l.as_any(),
            Seq::Tuple(t) => t.as_any(),
            Seq::Numbers(_) => return Ok(false),
        };
        if len < b {
            return Ok(false);
        }
        let end = out.len();
        let exact = seq.is_exact_instance_of::<PyList>() || seq.is_exact_instance_of::<PyTuple>();
        if a == 0 && exact && len - b <= b {
            out.set_slice(end, end, seq)?;
            if b < len {
                out.del_slice(end + b, end + len)?;
            }
        } else {
            let part = match &self.seq {
                Seq::List(l) => l.get_slice(a, b).into_any(),
                Seq::Tuple(t) => t.get_slice(a, b).into_any(),
                Seq::Numbers(_) => unreachable!("returned above"),
            };
            out.set_slice(end, end, &part)?;
        }
        Ok(true)
    }
}

fn check_array(array: &Bound<'_, PyUntypedArray>, what: &'static str, kind: ItemKind, at: Location) -> PyResult<()> {
    let dims_ok = array.ndim() == 1 || (kind == ItemKind::Rows && array.ndim() == 2);
    if !dims_ok {
        let expected = if kind == ItemKind::Rows { "1-D or 2-D" } else { "1-D" };
        let message = format!("{what} must be {expected}, got an array of shape {:?}", array.shape());
        return Err(InputError::new(ErrorKind::Value, at, message).into());
    }
    let (accepted, expected): (&[u8], &str) = match kind {
        ItemKind::Token => (b"iubO", "an integer"),
        ItemKind::Real => (b"iubfO", "a real"),
        ItemKind::Rows if array.ndim() == 2 => (b"iubfO", "a real"),
        ItemKind::Object | ItemKind::Rows => (b"O", "an object"),
    };
    if !accepted.contains(&array.dtype().kind()) {
        let dtype = array.dtype().str()?.to_string();
        let message = format!("{what} has dtype {dtype}, not {expected} dtype");
        return Err(InputError::new(ErrorKind::Type, at, message).into());
    }
    Ok(())
}

#[cold]
fn not_a_sequence(obj: &Bound<'_, PyAny>, what: &'static str, at: Location) -> PyErr {
    let message = format!("{what} must be a sequence, got {}", type_name(obj));
    InputError::new(ErrorKind::Type, at, message).into()
}

/// The value of an exact `int` that fits in an i64 (not a `bool`, not a
/// subclass). Runs no Python code.
pub fn exact_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    // SAFETY: `obj` is held alive; the in-place read runs no Python code,
    // and BY_API reads through the C API whatever the layout.
    unsafe { int_in_place::<BY_API>(obj.as_ptr()) }
}

/// The value of an exact `float` (not a subclass). Runs no Python code.
pub fn exact_float(obj: &Bound<'_, PyAny>) -> Option<f64> {
    // SAFETY: `obj` is held alive; the read runs no Python code.
    unsafe { float_in_place(obj.as_ptr()) }
}

/// A mapping's `(key, value)` pair.
pub type Pair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A mapping's pairs, as `mapping.items()` gives them, appended to `out`:
/// all of them taken before any is read, so that code a value runs cannot
/// change the mapping under the walk. An exact dict is walked in C.
pub fn pairs<'py>(mapping: &Bound<'py, PyAny>, out: &mut Vec<Pair<'py>>) -> PyResult<()> {
    if let Ok(dict) = mapping.cast_exact::<PyDict>() {
        out.reserve(dict.len());
        let mut pos = 0;
        // No Python code runs while a dict is walked.
        while let Some(pair) = next_pair(dict, &mut pos) {
            out.push(pair);
        }
        return Ok(());
    }
    for pair in mapping.call_method0(intern!(mapping.py(), "items"))?.try_iter()? {
        out.push(pair?.extract()?);
    }
    Ok(())
}

/// The pair of `dict` at or after `pos` (moved past it), held strongly.
#[inline]
fn next_pair<'py>(dict: &Bound<'py, PyDict>, pos: &mut ffi::Py_ssize_t) -> Option<Pair<'py>> {
    let py = dict.py();
    let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `dict` is held alive; PyDict_Next bounds `pos` by the dict's
    // entries as they are now and hands out borrowed references, which are
    // taken strongly here, before any Python code can run.
    unsafe {
        if ffi::PyDict_Next(dict.as_ptr(), pos, &raw mut key, &raw mut value) == 0 {
            return None;
        }
        Some((Bound::from_borrowed_ptr(py, key), Bound::from_borrowed_ptr(py, value)))
    }
}

/// Reads mappings' pairs as `mapping.items()` gives them, with one buffer
/// reused from mapping to mapping (a reader per pass, not per mapping).
#[derive(Default)]
pub struct PairReader<'py> {
    /// The pairs of the mapping being read not yet handed over.
    rest: Vec<Pair<'py>>,
}

impl<'py> PairReader<'py> {
    /// Hands every pair of `mapping` to `each`, in order, as if all had
    /// been taken before the first was handed over: code that `each` runs
    /// cannot change which pairs (or which values) it is handed.
    ///
    /// `quiet(key, value)` (which runs no Python code: a type check) says
    /// that `each` runs none for that pair either. An exact dict's pairs are
    /// handed over as the dict is walked while they are quiet, without a
    /// copy (nothing can change the dict meanwhile); at its first other
    /// pair, that pair and the rest are taken into the buffer first. Any
    /// other mapping's `items()` is taken whole first.
    pub fn for_each(
        &mut self,
        mapping: &Bound<'py, PyAny>,
        quiet: impl Fn(&Bound<'py, PyAny>, &Bound<'py, PyAny>) -> bool,
        mut each: impl FnMut(Bound<'py, PyAny>, Bound<'py, PyAny>) -> PyResult<()>,
    ) -> PyResult<()> {
        self.rest.clear();
        if let Ok(dict) = mapping.cast_exact::<PyDict>() {
            let mut pos = 0;
            loop {
                let Some((key, value)) = next_pair(dict, &mut pos) else {
                    return Ok(());
                };
                if !quiet(&key, &value) {
                    self.rest.push((key, value));
                    while let Some(pair) = next_pair(dict, &mut pos) {
                        self.rest.push(pair);
                    }
                    break;
                }
                each(key, value)?;
            }
        } else {
            pairs(mapping, &mut self.rest)?;
        }
        for (key, value) in self.rest.drain(..) {
            each(key, value)?;
        }
        Ok(())
    }
}

/// Names an item of a field in messages: `prompt_tokens[5]`.
#[derive(Clone, Copy)]
pub struct Item<'a> {
    pub field: &'a str,
    pub index: usize,
}

impl std::fmt::Display for Item<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, " ({}[{}])", self.field, self.index)
    }
}

/// How a token was read: an exact `int` (its reading ran no Python code),
/// an instance of a subclass of `int` (`bool` included), or another object
/// read with `operator.index` (a numpy integer, say).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Exact,
    IntSubclass,
    Other,
}

/// Token `i` of `items`: an integer in `0..limit` (`limit` is the
/// vocabulary size when given, else `MAX_TOKEN + 1`), and how it was read.
#[inline]
pub fn token_at(items: &Items<'_>, i: usize, field: &str, limit: i64, at: Location) -> PyResult<(i64, TokenKind)> {
    // Held strongly: an error made below can set off a collection whose
    // finalizers change the list (the fast path has declined this item).
    let item = items.get(i)?;
    let at_item = Item { field, index: i };
    if item.is_exact_instance_of::<PyInt>() {
        let value = item.extract::<i64>().map_or(Integer::TooLarge, Integer::Value);
        return match value {
            Integer::Value(v) if (0..limit).contains(&v) => Ok((v, TokenKind::Exact)),
            _ => Err(bad_token(&item, value, at_item, limit, at)),
        };
    }
    let kind = if item.is_instance_of::<PyInt>() {
        TokenKind::IntSubclass
    } else {
        TokenKind::Other
    };
    match index_value(&item)? {
        Integer::Value(v) if (0..limit).contains(&v) => Ok((v, kind)),
        value => Err(bad_token(&item, value, at_item, limit, at)),
    }
}

/// How a token sequence was read ([`Items::read_tokens`]).
pub struct TokensRead {
    /// Every item an exact `int`, read with the collector off.
    pub exact: bool,
    /// The first item that is not an instance of `int` (a buffer's first),
    /// if any.
    pub not_int: Option<usize>,
}

impl Items<'_> {
    /// The items, borrowed, for loops that read exact ints and floats.
    fn raw(&self) -> RawItems {
        let (seq, list) = match &self.seq {
            Seq::List(l) => (l.as_ptr(), true),
            Seq::Tuple(t) => (t.as_ptr(), false),
            Seq::Numbers(_) => unreachable!("buffers are read by their own loops"),
        };
        // SAFETY: `self` holds the list or tuple alive, and the loops that
        // use the result hold `self`.
        unsafe { RawItems::new(seq, list) }
    }

    /// Reads items `0..len` in order: `fast` takes each exact one it can,
    /// borrowed, straight from the container's item array; `slow(k)` reads
    /// item `k` when `fast` declines it (and may run Python code, so the
    /// array is taken anew after it). `put(k, value)` stores each value.
    ///
    /// # Safety
    /// `fast` and `put` run no Python code: the item array they are handed
    /// is borrowed, and Python code could resize the list or free items.
    #[inline]
    unsafe fn read_each<T>(
        &self,
        fast: impl Fn(*mut ffi::PyObject) -> Option<T>,
        mut slow: impl FnMut(usize) -> PyResult<T>,
        mut put: impl FnMut(usize, T),
    ) -> PyResult<()> {
        let items = self.raw();
        let mut k = 0;
        while k < self.len {
            {
                // SAFETY: no Python code runs while `now` and its items are
                // used (`fast` and `put` run none, the caller's promise);
                // `slow` runs after.
                let now = unsafe { items.now() };
                let end = now.len().min(self.len);
                while k < end {
                    let Some(v) = fast(now[k]) else { break };
                    put(k, v);
                    k += 1;
                }
            }
            if k < self.len {
                put(k, slow(k)?);
                k += 1;
            }
        }
        Ok(())
    }

    /// Appends every token (see [`token_at`]) to `out`. Exact ints in range
    /// are read in place, with no reference counting; anything else goes
    /// through `token_at`.
    ///
    /// Says whether they were all exact `int`s read with the collector off
    /// ([`TokensRead::exact`]): then no Python code ran, and none can run
    /// until the caller runs some (no collection can start, so no
    /// finalizer), so the sequence still holds exactly the ints read. User
    /// code run earlier may have turned the collector back on: then a
    /// collection set off by any allocation could run finalizers that change
    /// the sequence before it is copied. Also says which item first was no
    /// `int` at all ([`TokensRead::not_int`]).
    pub fn read_tokens(&self, field: &str, limit: i64, at: Location, out: &mut Vec<Element>) -> PyResult<TokensRead> {
        if let Seq::Numbers(numbers) = &self.seq {
            // SAFETY: the view is dropped before the error is made; reading
            // runs no Python code.
            let read = unsafe { self.with_view(numbers, |view| read_buffer_tokens(&view, limit, out)) }?;
            return match read {
                Ok(()) => Ok(TokensRead {
                    exact: false,
                    not_int: (self.len > 0).then_some(0),
                }),
                Err((value, k)) => Err(buffer_token_error(value, Item { field, index: k }, limit, at)),
            };
        }
        let quiet = collector_off(self.py());
        let mut read = match int_read() {
            BY_OB_SIZE => self.read_tokens_as::<BY_OB_SIZE>(field, limit, at, out),
            BY_LV_TAG => self.read_tokens_as::<BY_LV_TAG>(field, limit, at, out),
            _ => self.read_tokens_as::<BY_API>(field, limit, at, out),
        }?;
        read.exact &= quiet;
        Ok(read)
    }

    fn read_tokens_as<const LAYOUT: u8>(
        &self,
        field: &str,
        limit: i64,
        at: Location,
        out: &mut Vec<Element>,
    ) -> PyResult<TokensRead> {
        out.reserve(self.len);
        let start = out.len();
        let slots = &mut out.spare_capacity_mut()[..self.len];
        let mut exact = true;
        let mut not_int = None;
        // SAFETY: `fast` reads an exact int in place and `put` stores a
        // value: neither runs Python code.
        unsafe {
            self.read_each(
                // SAFETY: `read_each` passes a live item (or NULL).
                |item| int_in_place::<LAYOUT>(item).filter(|v| (0..limit).contains(v)),
                |i| {
                    // Takes the item anew (strongly) and says what is wrong.
                    let (v, kind) = token_at(self, i, field, limit, at)?;
                    exact &= kind == TokenKind::Exact;
                    if kind == TokenKind::Other {
                        not_int.get_or_insert(i);
                    }
                    Ok(v)
                },
                |i, v| {
                    slots[i].write(Element::token(v));
                },
            )?;
        }
        // SAFETY: `read_each` stored every slot up to `start + self.len`.
        unsafe { out.set_len(start + self.len) };
        Ok(TokensRead { exact, not_int })
    }

    /// Appends every item to `out` if all are exact ints that fit in `T`,
    /// read in place; else says `false` at the first that is not (what is
    /// in `out` then is unspecified). Runs no Python code: the encoder hands
    /// a declined sequence to tinker's own (numpy's int32 conversion, say).
    pub fn read_exact_ints<T: TryFrom<i64>>(&self, out: &mut Vec<T>) -> bool {
        if let Seq::Numbers(_) = self.seq {
            return false;
        }
        match int_read() {
            BY_OB_SIZE => self.read_exact_ints_as::<BY_OB_SIZE, T>(out),
            BY_LV_TAG => self.read_exact_ints_as::<BY_LV_TAG, T>(out),
            _ => self.read_exact_ints_as::<BY_API, T>(out),
        }
    }

    fn read_exact_ints_as<const LAYOUT: u8, T: TryFrom<i64>>(&self, out: &mut Vec<T>) -> bool {
        /// Asks the CPU to start loading `object`'s header; a hint, no access.
        #[inline]
        fn prefetch(object: *mut ffi::PyObject) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(object.cast::<i8>().cast_const());
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = object;
        }

        let items = self.raw();
        // SAFETY: no Python code runs while `now` and its items are used.
        let now = unsafe { items.now() };
        let Some(now) = now.get(..self.len) else {
            return false;
        };
        out.reserve(now.len());
        let start = out.len();
        let slots = &mut out.spare_capacity_mut()[..now.len()];
        for (k, (slot, &item)) in slots.iter_mut().zip(now).enumerate() {
            // Each int is its own object, and waiting for each in turn is
            // most of the loop's time: ask for one 16 items ahead.
            if let Some(&ahead) = now.get(k + 16) {
                prefetch(ahead);
            }
            // SAFETY: a live item of the list or tuple `self` holds.
            match unsafe { int_in_place::<LAYOUT>(item) }.and_then(|v| T::try_from(v).ok()) {
                Some(v) => _ = slot.write(v),
                None => return false,
            }
        }
        // SAFETY: every slot up to `start + now.len()` was written.
        unsafe { out.set_len(start + now.len()) };
        true
    }

    /// Appends every item as [`any_real`] reads it (`field[k]` in
    /// messages) to `values`, and whether each was an `int` to `is_int`;
    /// says whether any was. `torch_alike`: an item that is neither a
    /// `float` (a subclass included) nor an exact `int` within i64 is
    /// [`Unsupported`](crate::py::errors::unsupported): torch infers its
    /// own dtype from it (bool, a numpy integer) or refuses it (a
    /// `Decimal`, a 0-d array), where `float()` would read a number.
    pub fn read_any_reals(
        &self,
        what: &str,
        field: &str,
        at: Location,
        torch_alike: bool,
        values: &mut Vec<f64>,
        is_int: &mut Vec<bool>,
    ) -> PyResult<bool> {
        if let Seq::Numbers(numbers) = &self.seq {
            // SAFETY: reading the view runs no Python code.
            let int = unsafe {
                self.with_view(numbers, |view| {
                    values.reserve(self.len);
                    let Ok(()) = view.for_each(|_, v| {
                        values.push(v.as_f64());
                        Ok::<(), std::convert::Infallible>(())
                    });
                    view.kind() != Kind::Float
                })
            }?;
            is_int.resize(is_int.len() + self.len, int);
            return Ok(int && self.len > 0);
        }
        let start = values.len();
        values.reserve(self.len);
        let int_start = is_int.len();
        is_int.resize(int_start + self.len, false);
        let is_int = &mut is_int[int_start..];
        let slots = &mut values.spare_capacity_mut()[..self.len];
        let mut any_int = false;
        // SAFETY: `fast` reads an exact float in place and `put` stores a
        // value: neither runs Python code.
        unsafe {
            self.read_each(
                // SAFETY: `read_each` passes a live item (or NULL).
                |item| float_in_place(item),
                |k| {
                    let item = self.get(k)?;
                    if torch_alike && !(item.is_instance_of::<PyFloat>() || exact_int(&item).is_some()) {
                        let why = format!(
                            "{at}: {field}[{k}] is a {}, which torch reads otherwise",
                            type_name(&item)
                        );
                        return Err(crate::py::errors::unsupported(why));
                    }
                    let (v, int) = any_real(&item, what, Item { field, index: k }, at)?;
                    is_int[k] = int;
                    any_int |= int;
                    Ok(v)
                },
                |k, v| {
                    slots[k].write(v);
                },
            )?;
        }
        // SAFETY: `read_each` stored every slot up to `start + self.len`.
        unsafe { values.set_len(start + self.len) };
        Ok(any_int)
    }

    /// Reads every logprob (see [`logprob_at`]), writing the first
    /// `out.len()` of them to `out`; says whether all were exact `float`s.
    pub fn read_logprobs(&self, at: Location, out: &mut [f32]) -> PyResult<bool> {
        if let Seq::Numbers(numbers) = &self.seq {
            // SAFETY: the view is dropped before the error is made; reading
            // runs no Python code.
            let read = unsafe { self.with_view(numbers, |view| read_buffer_logprobs(&view, out)) }?;
            return match read {
                Ok(()) => Ok(false),
                Err((v, k)) => Err(buffer_logprob_error(v, k, at)),
            };
        }
        let mut exact = true;
        // SAFETY: `fast` reads an exact float in place and `put` stores a
        // value: neither runs Python code.
        unsafe {
            self.read_each(
                // float32 is the wire dtype; overflow is checked.
                // SAFETY: `read_each` passes a live item (or NULL).
                #[allow(clippy::cast_possible_truncation)]
                |item| float_in_place(item).map(|v| v as f32).filter(|v| v.is_finite()),
                |k| {
                    let (v, is_exact) = logprob_at(self, k, at)?;
                    exact &= is_exact;
                    Ok(v)
                },
                |k, v| {
                    if let Some(slot) = out.get_mut(k) {
                        *slot = v;
                    }
                },
            )?;
        }
        Ok(exact)
    }
}

/// [`Items::read_tokens`] of a buffer's elements: each checked to be a
/// token below `limit`; else the first that is not, and its index.
fn read_buffer_tokens(view: &View<'_>, limit: i64, out: &mut Vec<Element>) -> Result<(), (Value, usize)> {
    if let Some(Slice::I32(ints)) = view.slice() {
        // tinker's `tokens_np`: plain loops the compiler vectorizes.
        if let Some(k) = ints.iter().position(|&v| !(0..limit).contains(&i64::from(v))) {
            return Err((Value::Int(i64::from(ints[k])), k));
        }
        out.extend(ints.iter().map(|&v| Element::token(i64::from(v))));
        return Ok(());
    }
    out.reserve(view.len());
    view.for_each(|k, v| match v {
        Value::Int(v) if (0..limit).contains(&v) => {
            out.push(Element::token(v));
            Ok(())
        }
        _ => Err((v, k)),
    })
}

#[cold]
fn buffer_token_error(value: Value, at_item: Item<'_>, limit: i64, at: Location) -> PyErr {
    let (value, described) = match value {
        Value::Int(v) => (Integer::Value(v), v.to_string()),
        Value::Huge(v) => (Integer::TooLarge, v.to_string()),
        Value::Float(v) => (Integer::Not, v.to_string()),
    };
    token_error(&described, "float", value, at_item, limit, at)
}

/// [`Items::read_logprobs`] of a buffer's elements: each finite as
/// float32; else the first that is not, and its index.
fn read_buffer_logprobs(view: &View<'_>, out: &mut [f32]) -> Result<(), (f64, usize)> {
    if let Some(Slice::F32(floats)) = view.slice() {
        // tinker's `logprobs_np`.
        let n = out.len().min(floats.len());
        out[..n].copy_from_slice(&floats[..n]);
        return match floats.iter().position(|v| !v.is_finite()) {
            Some(k) => Err((f64::from(floats[k]), k)),
            None => Ok(()),
        };
    }
    view.for_each(|k, v| {
        let v = v.as_f64();
        #[allow(clippy::cast_possible_truncation)] // float32 is the wire dtype; overflow is checked
        let single = v as f32;
        if !single.is_finite() {
            return Err((v, k));
        }
        if let Some(slot) = out.get_mut(k) {
            *slot = single;
        }
        Ok(())
    })
}

#[cold]
fn buffer_logprob_error(v: f64, k: usize, at: Location) -> PyErr {
    let suffix = Item {
        field: "logprobs",
        index: k,
    };
    let message = if v.is_finite() {
        format!("logprob {v:e} overflows float32{suffix}")
    } else {
        format!("logprob {} is not finite{suffix}", py_float_repr(v))
    };
    InputError::new(ErrorKind::Value, at, message).into()
}

/// What `operator.index` made of a token.
#[derive(Clone, Copy)]
enum Integer {
    Value(i64),
    TooLarge,
    Not,
}

/// `operator.index(item)`.
#[cold]
fn index_value(item: &Bound<'_, PyAny>) -> PyResult<Integer> {
    let py = item.py();
    // SAFETY: `item` is a strong reference, alive across the call.
    if unsafe { ffi::PyIndex_Check(item.as_ptr()) } == 0 {
        return Ok(Integer::Not);
    }
    // SAFETY: as above; PyNumber_Index returns a new reference or NULL with
    // an exception set, which from_owned_ptr_or_err takes over.
    match unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(item.as_ptr())) } {
        Ok(index) => Ok(index.extract::<i64>().map_or(Integer::TooLarge, Integer::Value)),
        // An `__index__` that returns no int: not an integer.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => Ok(Integer::Not),
        Err(e) => Err(e),
    }
}

#[cold]
fn bad_token(item: &Bound<'_, PyAny>, value: Integer, at_item: Item<'_>, limit: i64, at: Location) -> PyErr {
    token_error(&describe(item), &type_name(item), value, at_item, limit, at)
}

#[cold]
fn token_error(described: &str, type_name: &str, value: Integer, at_item: Item<'_>, limit: i64, at: Location) -> PyErr {
    let (kind, message) = match value {
        Integer::Not => (
            ErrorKind::Type,
            format!("token {described} of type {type_name} is not an integer{at_item}"),
        ),
        Integer::Value(v) if (0..=MAX_TOKEN).contains(&v) => (
            ErrorKind::Value,
            format!("token {v} is outside the vocabulary (vocab_size={limit}){at_item}"),
        ),
        Integer::Value(v) => (
            ErrorKind::Value,
            format!("token {v} is outside 0..{MAX_TOKEN}{at_item}"),
        ),
        Integer::TooLarge => (
            ErrorKind::Value,
            format!("token {described} is outside 0..{MAX_TOKEN}{at_item}"),
        ),
    };
    InputError::new(kind, at, message).into()
}

/// Logprob `k` of `items`: a real number, finite as float32. Also says
/// whether it was an exact `float` (read without running Python code).
#[inline]
pub fn logprob_at(items: &Items<'_>, k: usize, at: Location) -> PyResult<(f32, bool)> {
    let item = items.get(k)?; // as in `token_at`
    if let Ok(float) = item.cast_exact::<PyFloat>() {
        // float32 is the wire dtype; overflow is checked.
        let v = float.value() as f32;
        if v.is_finite() {
            return Ok((v, true));
        }
    }
    let at_item = Item {
        field: "logprobs",
        index: k,
    };
    Ok((real_value(&item, "logprob", true, Some(at_item), at)? as f32, false))
}

/// Any real number as `float()` reads it (NaN and infinities included), and
/// whether it is an `int`: tinker-cookbook hands both to torch as they are.
pub fn any_real(item: &Bound<'_, PyAny>, what: &str, at_item: Item<'_>, at: Location) -> PyResult<(f64, bool)> {
    let is_int = item.is_instance_of::<PyInt>();
    let v = item
        .extract::<f64>()
        .map_err(|e| not_real(item, e, what, &at_item.to_string(), at))?;
    Ok((v, is_int))
}

/// A finite real number (also finite once rounded to float32, the wire
/// dtype of advantages, when `float32` is set).
pub fn read_real(item: &Bound<'_, PyAny>, what: &str, float32: bool, at: Location) -> PyResult<f64> {
    real_value(item, what, float32, None, at)
}

fn real_value(
    item: &Bound<'_, PyAny>,
    what: &str,
    float32: bool,
    at_item: Option<Item<'_>>,
    at: Location,
) -> PyResult<f64> {
    let suffix = at_item.map(|i| i.to_string()).unwrap_or_default();
    let v = match item.extract::<f64>() {
        Ok(v) => v,
        Err(e) => return Err(not_real(item, e, what, &suffix, at)),
    };
    #[allow(clippy::cast_possible_truncation)]
    let fits = if float32 { (v as f32).is_finite() } else { v.is_finite() };
    if !fits {
        let message = if v.is_finite() {
            format!("{what} {v:e} overflows float32{suffix}")
        } else {
            format!("{what} {} is not finite{suffix}", py_float_repr(v))
        };
        return Err(InputError::new(ErrorKind::Value, at, message).into());
    }
    Ok(v)
}

#[cold]
fn not_real(item: &Bound<'_, PyAny>, err: PyErr, what: &str, suffix: &str, at: Location) -> PyErr {
    // A TypeError means "not a real number", an OverflowError a number too
    // large for a float; anything else the object raised goes up as it is.
    let py = item.py();
    let (kind, message) = if err.is_instance_of::<PyTypeError>(py) {
        let message = format!(
            "{what} {} of type {} is not a real number{suffix}",
            describe(item),
            type_name(item)
        );
        (ErrorKind::Type, message)
    } else if err.is_instance_of::<PyOverflowError>(py) {
        (
            ErrorKind::Value,
            format!("{what} {} is too large for a float{suffix}", describe(item)),
        )
    } else {
        return err;
    };
    InputError::new(kind, at, message).into()
}

fn py_float_repr(v: f64) -> String {
    match v {
        v if v.is_nan() => "nan".into(),
        f64::INFINITY => "inf".into(),
        f64::NEG_INFINITY => "-inf".into(),
        v => v.to_string(),
    }
}

/// A group's `tags`: missing or `None` give an empty list; otherwise an
/// iterable of `str` (not a `str` itself), copied into a new list.
pub fn read_tags<'py>(group: &Bound<'py, PyAny>, at: Location) -> PyResult<Bound<'py, PyList>> {
    let py = group.py();
    let tags = match group.getattr_opt(intern!(py, "tags"))? {
        Some(tags) if !tags.is_none() => tags,
        _ => return Ok(PyList::empty(py)),
    };
    let bad = |what: String| -> PyErr { InputError::new(ErrorKind::Type, at, what).into() };
    if tags.is_instance_of::<PyString>() {
        return Err(bad(format!(
            "tags must be a sequence of str, got the str {}",
            describe(&tags)
        )));
    }
    let items = Items::of(&tags, "tags", ItemKind::Object, at)?;
    let out = PyList::empty(py);
    for i in 0..items.len() {
        let tag = items.get(i)?;
        if !tag.is_instance_of::<PyString>() {
            return Err(bad(format!(
                "tags[{i}] {} of type {} is not a str",
                describe(&tag),
                type_name(&tag)
            )));
        }
        out.append(tag)?;
    }
    Ok(out)
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
}

/// `repr(obj)`, shortened: error messages name the bad value, not a page of it.
pub fn describe(obj: &Bound<'_, PyAny>) -> String {
    let text = obj.repr().map_or_else(|_| "<unprintable>".into(), |r| r.to_string());
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}
