//! The one rule by which model-input lists share the caller's int objects,
//! for both front doors.
//!
//! Right after a token sequence is read, if every item was an exact `int`
//! read with the collector off (so no Python code ran, not even a
//! finalizer: see `Items::read_tokens`), the part of it a row needs is
//! copied by CPython, sharing the ints, into the list of the row it opens
//! or extends: that row's *store*. Copying right away, not when the row is
//! built, keeps the values read whatever user code run later (a property,
//! `metrics.get`) does to the caller's list. Context tokens that only
//! repeat the row's sequence so far (an agent's prompt repeating the
//! conversation) are not copied: no row needs them twice. A row's text
//! chunk is then its store, cut after its last input token, or slices of
//! stores; elements without a copy (from buffers, bools, numpy ints, user
//! objects, or read with a collector user code turned on) get ints made
//! anew from the values read.
//!
//! Which store a sequence goes to only saves copies: rows find their tokens
//! by element index, and a store is taken whole only by a row that covers
//! all it holds.

use std::ops::Range;

use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::errors::Location;
use crate::plan::{Element, Merge};
use crate::py::build;
use crate::py::read::{Items, TokensRead};

/// Whether a token sequence is part of a turn's context (prompt,
/// observation) or its completion (action).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Context,
    Completion,
}

/// A token sequence as read: elements `first..first + len`, of which
/// `first + from..` were copied into store `stored.0` from index `stored.1`.
struct Source {
    first: usize,
    len: usize,
    from: usize,
    stored: Option<(usize, usize)>,
}

/// A list of shared ints and the span of elements it holds copies of.
struct Store<'py> {
    /// `None` once a row has taken it.
    list: Option<Bound<'py, PyList>>,
    elements: Range<usize>,
}

/// Whether the current turn's context extends the open row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// Everything read so far repeats the row's sequence.
    Undecided,
    Extends,
    NewRow,
}

/// One trajectory's shared ints.
pub struct SharedInts<'py> {
    /// Whether rows want lists of ints at all (not for int32 model input).
    enabled: bool,
    merge: Merge,
    stores: Vec<Store<'py>>,
    sources: Vec<Source>,
    /// The open row's sequence so far, as read.
    sequence: Vec<Element>,
    /// The open row's store.
    open: Option<usize>,
    context_start: usize,
    context: Context,
}

impl Default for SharedInts<'_> {
    fn default() -> Self {
        SharedInts {
            enabled: false,
            merge: Merge::PerTurn,
            stores: Vec::new(),
            sources: Vec::new(),
            sequence: Vec::new(),
            open: None,
            context_start: 0,
            context: Context::NewRow,
        }
    }
}

impl<'py> SharedInts<'py> {
    /// Empty, for a trajectory whose rows are planned by `merge`; `enabled`
    /// when rows want lists of ints.
    pub fn reset(&mut self, enabled: bool, merge: Merge) {
        self.enabled = enabled;
        self.merge = merge;
        self.stores.clear();
        self.sources.clear();
        self.sequence.clear();
        self.open = None;
    }

    /// A turn (transition) begins at element `start`.
    pub fn begin_turn(&mut self, start: usize) {
        if self.merge == Merge::PerTurn {
            self.sequence.clear();
        }
        self.context_start = start;
        self.context = if self.sequence.is_empty() {
            Context::NewRow
        } else {
            Context::Undecided
        };
        if self.context == Context::NewRow {
            self.open = None;
        }
    }

    /// A turn ends: its context was `elements[context]`, its completion
    /// `elements[completion]`. The sequence so far follows the planner's
    /// rule (`plan.rs`): extended by the context's new part, or begun anew
    /// with it, then the completion.
    pub fn end_turn(&mut self, elements: &[Element], context: Range<usize>, completion: Range<usize>) {
        if !self.enabled {
            return;
        }
        let ob = &elements[context];
        if !self.sequence.is_empty() && ob.starts_with(&self.sequence) {
            self.sequence.extend_from_slice(&ob[self.sequence.len()..]);
        } else {
            self.sequence.clear();
            self.sequence.extend_from_slice(ob);
        }
        self.sequence.extend_from_slice(&elements[completion]);
    }

    /// Reads `tokens` (each below `limit`) onto `elements`, and copies what
    /// a row needs of them into its store (see the module doc). Says which
    /// item first was no `int` (a numpy integer, a buffer's first), if any.
    pub fn read(
        &mut self,
        tokens: &Items<'py>,
        field: &str,
        limit: i64,
        at: Location,
        role: Role,
        elements: &mut Vec<Element>,
    ) -> PyResult<Option<usize>> {
        let first = elements.len();
        let TokensRead { exact, not_int } = tokens.read_tokens(field, limit, at, elements)?;
        let len = tokens.len();
        if !self.enabled {
            return Ok(not_int);
        }
        let from = match role {
            Role::Context => self.repeated(elements, first, len),
            Role::Completion => {
                self.settle_context(elements.len() - len);
                0
            }
        };
        let mut stored = None;
        if exact && from < len {
            let store = self.open_store(tokens.py());
            let entry = &mut self.stores[store];
            let list = entry
                .list
                .as_ref()
                .expect("the open row's store is not taken while reading");
            let offset = list.len();
            if tokens.append_to(list, from, len)? {
                stored = Some((store, offset));
                let copied = first + from..first + len;
                entry.elements = if entry.elements.is_empty() {
                    copied
                } else {
                    entry.elements.start..copied.end
                };
            }
        }
        self.sources.push(Source {
            first,
            len,
            from,
            stored,
        });
        Ok(not_int)
    }

    /// How many leading elements of the context sequence at
    /// `elements[first..first + len]` only repeat the row's sequence so far;
    /// decides whether the context extends the row as soon as it can tell.
    fn repeated(&mut self, elements: &[Element], first: usize, len: usize) -> usize {
        if self.context != Context::Undecided {
            return 0;
        }
        let ob = &elements[self.context_start..first + len];
        let common = ob.len().min(self.sequence.len());
        if ob[..common] != self.sequence[..common] {
            self.new_row();
            return 0;
        }
        if ob.len() > self.sequence.len() {
            self.context = Context::Extends;
        }
        (self.sequence.len() - (first - self.context_start)).min(len)
    }

    /// Before the completion at `end` (the context's end): a context that
    /// only repeated the sequence extends the row if it is all of it.
    fn settle_context(&mut self, end: usize) {
        if self.context == Context::Undecided {
            if end - self.context_start == self.sequence.len() {
                self.context = Context::Extends;
            } else {
                self.new_row();
            }
        }
    }

    fn new_row(&mut self) {
        self.context = Context::NewRow;
        self.open = None;
    }

    /// The open row's store, made on first use.
    fn open_store(&mut self, py: Python<'py>) -> usize {
        if let Some(store) = self.open {
            return store;
        }
        let list = PyList::empty(py);
        build::untrack_list(&list); // ints only
        self.stores.push(Store {
            list: Some(list),
            elements: 0..0,
        });
        let store = self.stores.len() - 1;
        self.open = Some(store);
        store
    }

    /// A text run of a row, `elements[range]` for each range of `run` in
    /// order, as a new list of ints sharing the stores' ints (made from the
    /// values where there are none). `row` is the span of elements of the
    /// row's turns; `last`: no later chunk of the row needs a store, so a
    /// run that is all of a store's start, with the store holding nothing
    /// outside `row`, takes the store itself, cut after the run.
    pub fn text(
        &mut self,
        py: Python<'py>,
        elements: &[Element],
        run: &[Range<usize>],
        row: &Range<usize>,
        last: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let parts = self.parts(run);
        if let [Part::Stored(store, range)] = &parts[..] {
            let entry = &mut self.stores[*store];
            let whole = range.start == 0 && row.start <= entry.elements.start && entry.elements.end <= row.end;
            if last && whole {
                if let Some(list) = entry.list.take() {
                    list.del_slice(range.end, list.len())?;
                    return Ok(list);
                }
            }
        }
        let part_list = |part: Part| -> PyResult<Bound<'py, PyList>> {
            match part {
                Part::Stored(store, range) => match &self.stores[store].list {
                    Some(store_list) => Ok(store_list.get_slice(range.start, range.end)),
                    None => unreachable!("a store is taken only by a row that holds all it holds"),
                },
                Part::Values(range) => PyList::new(py, elements[range].iter().map(|e| e.target())),
            }
        };
        let mut parts = parts.into_iter();
        // The first part's new list is the result's start: no copy of it.
        let out = match parts.next() {
            Some(part) => part_list(part)?,
            None => PyList::empty(py),
        };
        build::untrack_list(&out);
        for part in parts {
            let end = out.len();
            out.set_slice(end, end, part_list(part)?.as_any())?;
        }
        Ok(out)
    }

    /// The run as consecutive parts: ranges of a store, or of elements whose
    /// ints are made anew.
    fn parts(&self, run: &[Range<usize>]) -> Vec<Part> {
        let mut parts: Vec<Part> = Vec::new();
        for r in run {
            let mut k = self.sources.partition_point(|s| s.first + s.len <= r.start);
            let mut a = r.start;
            while a < r.end {
                // Every token element was read from a source.
                let source = self.sources.get(k);
                let b = source.map_or(r.end, |s| r.end.min(s.first + s.len));
                let part = match source.and_then(|s| s.stored.map(|(store, at)| (store, at, s.first + s.from))) {
                    Some((store, at, first)) if a >= first => Part::Stored(store, at + a - first..at + b - first),
                    _ => Part::Values(a..b),
                };
                match (parts.last_mut(), &part) {
                    (Some(Part::Stored(store, before)), Part::Stored(next_store, next))
                        if store == next_store && before.end == next.start =>
                    {
                        before.end = next.end;
                    }
                    (Some(Part::Values(before)), Part::Values(next)) if before.end == next.start => {
                        before.end = next.end;
                    }
                    _ => parts.push(part),
                }
                (a, k) = (b, k + 1);
            }
        }
        parts
    }
}

/// Part of a text run: a range of a store, or a range of elements.
enum Part {
    Stored(usize, Range<usize>),
    Values(Range<usize>),
}
