//! tinker's `ForwardBackwardRequest` as protobuf bytes: the messages of
//! tinker 0.38's `tinker_public.proto` that the request uses, their sizes
//! and their writing. No PyO3: `py/forward_backward.rs` reads a request into these types.
//!
//! The bytes are those python-protobuf's `SerializeToString(deterministic=True)`
//! makes of the message tinker's `forward_backward_request_to_proto` builds:
//! fields in number order; a proto3 scalar left out at its default value
//! unless it is a oneof member or `optional` (a oneof message is written
//! even when empty, as tinker always sets one); map entries with both key
//! and value, sorted by key ([`sort_map`]). Raw byte fields (tokens, tensor
//! data) are native-endian, as numpy's `tobytes()` gives them; doubles are
//! little-endian, as protobuf's fixed64 is.

use std::cmp::Ordering;
use std::mem::MaybeUninit;

/// The bytes of a `bytes` field.
#[derive(Debug)]
pub enum Payload<'a> {
    /// Memory that stays as it is while the request lives (a `bytes`
    /// object's).
    Bytes(&'a [u8]),
    /// Array `i` of the table given to [`Request::measured`]: memory that
    /// may change until then (a numpy array's), so looked at only then.
    Array(usize),
    /// Read from Python ints or converted from another dtype.
    Int32s(Vec<i32>),
    Int64s(Vec<i64>),
}

impl Payload<'_> {
    fn len<S: Sink>(&self, s: &S) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Array(i) => s.array_len(*i),
            Payload::Int32s(v) => v.len() * 4,
            Payload::Int64s(v) => v.len() * 8,
        }
    }
}

/// A message given by its fields, or as the bytes tinker's own encoder made
/// of it (the fallback for anything the fast readers leave to tinker).
#[derive(Debug)]
pub enum Part<'a, M> {
    Fields(M),
    Encoded(&'a [u8]),
}

#[derive(Debug)]
pub struct Request<'a> {
    pub model_id: &'a [u8],
    pub seq_id: i32,
    pub data: Vec<Datum<'a>>,
    pub loss_fn: &'a [u8],
    /// Sorted by [`sort_map`], as every map here.
    pub loss_fn_config: Vec<(&'a [u8], f64)>,
    pub forward_only: bool,
    pub loss_fn_config_v2: Vec<(&'a [u8], ConfigValue<'a>)>,
}

#[derive(Clone, Copy, Debug)]
pub enum ConfigValue<'a> {
    Number(f64),
    Text(&'a [u8]),
}

#[derive(Debug, Default)]
pub struct Datum<'a> {
    pub model_input: Vec<Part<'a, Chunk<'a>>>,
    pub loss_fn_inputs: Vec<(&'a [u8], Part<'a, Tensor<'a>>)>,
    pub model_input_spans: Vec<Part<'a, Span<'a>>>,
    pub loss_fn_input_spans: Vec<Part<'a, Span<'a>>>,
}

#[derive(Debug)]
pub enum Chunk<'a> {
    /// Tokens as int32 bytes.
    Text(Payload<'a>),
    Image {
        data: &'a [u8],
        format: &'a [u8],
        expected_tokens: Option<i32>,
    },
    Dmel(&'a [u8]),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DType {
    Float32 = 1,
    Int64 = 2,
}

#[derive(Debug)]
pub struct Tensor<'a> {
    pub dtype: DType,
    pub shape: Shape,
    pub data: TensorData<'a>,
}

/// A tensor's dims, the first two kept without an allocation (tinker's and
/// this package's tensors have one or two).
#[derive(Debug, Default)]
pub struct Shape {
    len: usize,
    first: [i64; 2],
    all: Vec<i64>,
}

impl Shape {
    pub fn push(&mut self, dim: i64) {
        if self.len < self.first.len() {
            self.first[self.len] = dim;
        } else {
            if self.all.is_empty() {
                self.all.extend_from_slice(&self.first);
            }
            self.all.push(dim);
        }
        self.len += 1;
    }

    pub fn dims(&self) -> &[i64] {
        if self.all.is_empty() {
            &self.first[..self.len]
        } else {
            &self.all
        }
    }
}

impl FromIterator<i64> for Shape {
    fn from_iter<I: IntoIterator<Item = i64>>(dims: I) -> Self {
        let mut shape = Shape::default();
        dims.into_iter().for_each(|d| shape.push(d));
        shape
    }
}

#[derive(Debug)]
pub enum TensorData<'a> {
    Dense(Payload<'a>),
    SparseCsr {
        values: Payload<'a>,
        crow_indices: Payload<'a>,
        col_indices: Payload<'a>,
    },
}

/// A provenance span: a run of a prompt's or of a sampled sequence's tokens.
#[derive(Debug)]
pub struct Span<'a> {
    pub sampled: bool,
    pub sequence_id: &'a [u8],
    pub offset: i64,
    pub length: i64,
}

/// How python-protobuf orders map keys when one is a prefix of another
/// (else both order by bytes). upb (protobuf 4.21+'s default backend) puts
/// the longer key first; the pure-Python and C++ backends the shorter. The
/// Python layer asks the installed protobuf.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeyOrder {
    ShorterFirst,
    LongerFirst,
}

impl KeyOrder {
    pub fn compare(self, a: &[u8], b: &[u8]) -> Ordering {
        let common = a.len().min(b.len());
        a[..common].cmp(&b[..common]).then_with(|| match self {
            KeyOrder::ShorterFirst => a.len().cmp(&b.len()),
            KeyOrder::LongerFirst => b.len().cmp(&a.len()),
        })
    }
}

/// Sorts a map's entries as deterministic serialization does; of entries
/// with the same key the last one stays, as when they are assigned in turn.
pub fn sort_map<V>(entries: &mut Vec<(&[u8], V)>, order: KeyOrder) {
    entries.sort_by(|a, b| order.compare(a.0, b.0)); // stable: equal keys keep their order
    entries.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            std::mem::swap(later, kept);
        }
        same
    });
}

impl<'a> Request<'a> {
    /// The sizes of the request and of every message in it, computed once,
    /// with `arrays` the bytes of its [`Payload::Array`]s.
    pub fn measured<'r>(&'r self, arrays: &'r [&'r [u8]]) -> Measured<'r, 'a> {
        let mut sizer = Sizer {
            arrays,
            ..Sizer::default()
        };
        self.emit(&mut sizer);
        Measured {
            request: self,
            arrays,
            len: sizer.len,
            longest_payload: sizer.longest_payload,
            sizes: sizer.sizes,
        }
    }

    pub fn to_vec(&self, arrays: &[&[u8]]) -> Vec<u8> {
        let measured = self.measured(arrays);
        let mut out = Vec::with_capacity(measured.len);
        measured.write_to(&mut out.spare_capacity_mut()[..measured.len]);
        // SAFETY: write_to wrote all `len` bytes.
        unsafe { out.set_len(measured.len) };
        out
    }
}

/// A request with the body size of each message in it, in the order they
/// are written (each before its own contents).
pub struct Measured<'r, 'a> {
    request: &'r Request<'a>,
    arrays: &'r [&'r [u8]],
    len: usize,
    longest_payload: usize,
    sizes: Vec<usize>,
}

impl Measured<'_, '_> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The longest `bytes` / `string` field body: protobuf (upb) refuses to
    /// serialize one over `i32::MAX` bytes, though the message as a whole
    /// may be longer.
    pub fn longest_payload(&self) -> usize {
        self.longest_payload
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes the request into `out`, which must be exactly
    /// [`len`](Self::len) long; every byte gets written.
    pub fn write_to(&self, out: &mut [MaybeUninit<u8>]) {
        let mut w = Writer {
            out,
            pos: 0,
            sizes: self.sizes.iter(),
            arrays: self.arrays,
            owned: None,
        };
        self.request.emit(&mut w);
        assert_eq!(w.pos, w.out.len(), "request size mismatch");
    }

    /// As [`write_to`](Self::write_to), but the payloads the request owns
    /// (its `Int32s` and `Int64s`) are left unwritten, each returned with
    /// its place, for [`write_owned`] to copy: that copy touches only memory
    /// the request owns, so it can run with the GIL released.
    pub fn write_borrowed<'m>(&'m self, out: &mut [MaybeUninit<u8>]) -> Vec<(usize, &'m [u8])> {
        let mut owned = Vec::new();
        let mut w = Writer {
            out,
            pos: 0,
            sizes: self.sizes.iter(),
            arrays: self.arrays,
            owned: Some(&mut owned),
        };
        self.request.emit(&mut w);
        assert_eq!(w.pos, w.out.len(), "request size mismatch");
        owned
    }
}

/// Copies the payloads [`Measured::write_borrowed`] left out into `out`.
pub fn write_owned(owned: &[(usize, &[u8])], out: &mut [MaybeUninit<u8>]) {
    for &(at, bytes) in owned {
        copy_into(&mut out[at..at + bytes.len()], bytes);
    }
}

fn copy_into(dst: &mut [MaybeUninit<u8>], bytes: &[u8]) {
    assert_eq!(dst.len(), bytes.len());
    // SAFETY: `dst` is `bytes.len()` long (checked), a different allocation
    // from `bytes`; MaybeUninit<u8> is laid out as u8.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_mut_ptr().cast::<u8>(), bytes.len()) };
}

// ---------------------------------------------------------------------------
// The messages, each written once for both sinks: the sizer and the writer.

/// Something written as a protobuf message body.
trait Message {
    fn emit<S: Sink>(&self, s: &mut S);
}

impl<M: Message> Message for Part<'_, M> {
    fn emit<S: Sink>(&self, s: &mut S) {
        match self {
            Part::Fields(m) => m.emit(s),
            Part::Encoded(bytes) => s.raw(bytes),
        }
    }
}

impl Message for Request<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.string(1, self.model_id);
        if self.seq_id != 0 {
            s.varint_field(2, i64::from(self.seq_id) as u64); // int32: negative sign-extended
        }
        for datum in &self.data {
            s.message(3, datum);
        }
        s.string(4, self.loss_fn);
        for &(key, value) in &self.loss_fn_config {
            s.message(5, &MapEntry(key, Double(value)));
        }
        if self.forward_only {
            s.varint_field(6, 1);
        }
        for &(key, value) in &self.loss_fn_config_v2 {
            s.message(7, &MapEntry(key, &value));
        }
    }
}

/// A map entry: key (field 1) and value (field 2), both always written.
struct MapEntry<'k, V>(&'k [u8], V);

/// A map entry's value.
trait EntryValue {
    fn emit_as_value<S: Sink>(&self, s: &mut S);
}

/// A `double` field, always written.
struct Double(f64);

impl Double {
    fn emit_at<S: Sink>(&self, field: u32, s: &mut S) {
        s.tag(field, FIXED64);
        s.raw(&self.0.to_le_bytes());
    }
}

impl EntryValue for Double {
    fn emit_as_value<S: Sink>(&self, s: &mut S) {
        self.emit_at(2, s);
    }
}

impl<M: Message> EntryValue for &M {
    fn emit_as_value<S: Sink>(&self, s: &mut S) {
        s.message(2, *self);
    }
}

impl<V: EntryValue> Message for MapEntry<'_, V> {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.bytes(1, self.0);
        self.1.emit_as_value(s);
    }
}

impl Message for ConfigValue<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        // A oneof: written even at its default.
        match *self {
            ConfigValue::Number(v) => Double(v).emit_at(1, s),
            ConfigValue::Text(text) => s.bytes(2, text),
        }
    }
}

impl Message for Datum<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        for chunk in &self.model_input {
            s.message(1, chunk);
        }
        for (key, tensor) in &self.loss_fn_inputs {
            s.message(2, &MapEntry(key, tensor));
        }
        for span in &self.model_input_spans {
            s.message(3, span);
        }
        for span in &self.loss_fn_input_spans {
            s.message(4, span);
        }
    }
}

/// A `Chunk`'s oneof member, the body of its submessage.
struct ChunkBody<'c, 'a>(&'c Chunk<'a>);

impl Message for Chunk<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        let field = match self {
            Chunk::Text(_) => 1,
            Chunk::Image { .. } => 2,
            Chunk::Dmel(_) => 3,
        };
        s.message(field, &ChunkBody(self));
    }
}

impl Message for ChunkBody<'_, '_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        match self.0 {
            Chunk::Text(tokens) => {
                if tokens.len(s) > 0 {
                    s.payload(1, tokens);
                }
            }
            Chunk::Image {
                data,
                format,
                expected_tokens,
            } => {
                s.string(1, data);
                s.string(2, format);
                if let Some(n) = expected_tokens {
                    s.varint_field(3, i64::from(*n) as u64); // proto3 optional: written when set
                }
            }
            Chunk::Dmel(dmel) => s.string(1, dmel),
        }
    }
}

impl Message for Tensor<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        match &self.data {
            TensorData::Dense(values) => s.payload(1, values), // a oneof member: even when empty
            TensorData::SparseCsr { .. } => s.message(2, &SparseCsr(&self.data)),
        }
        s.varint_field(3, self.dtype as u64);
        let dims = self.shape.dims();
        if !dims.is_empty() {
            let packed: usize = dims.iter().map(|&d| varint_len(d as u64)).sum();
            s.tag(4, LEN);
            s.varint(packed as u64);
            for &d in dims {
                s.varint(d as u64);
            }
        }
    }
}

struct SparseCsr<'t, 'a>(&'t TensorData<'a>);

impl Message for SparseCsr<'_, '_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        if let TensorData::SparseCsr {
            values,
            crow_indices,
            col_indices,
        } = self.0
        {
            for (field, payload) in [(1, values), (2, crow_indices), (3, col_indices)] {
                if payload.len(s) > 0 {
                    s.payload(field, payload);
                }
            }
        }
    }
}

/// The arm of a span's oneof, the body of its submessage.
struct SpanArm<'s, 'a>(&'s Span<'a>);

impl Message for Span<'_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        s.message(if self.sampled { 2 } else { 1 }, &SpanArm(self));
    }
}

impl Message for SpanArm<'_, '_> {
    fn emit<S: Sink>(&self, s: &mut S) {
        let span = self.0;
        s.string(1, span.sequence_id);
        if span.offset != 0 {
            s.varint_field(2, span.offset as u64);
        }
        if span.length != 0 {
            s.varint_field(3, span.length as u64);
        }
    }
}

// ---------------------------------------------------------------------------
// Wire primitives.

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

pub fn varint_len(v: u64) -> usize {
    // 7 bits a byte; 0 takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Where a message goes: counted ([`Sizer`]) or written ([`Writer`]).
trait Sink: Sized {
    fn raw(&mut self, bytes: &[u8]);
    fn int32s(&mut self, values: &[i32]);
    fn int64s(&mut self, values: &[i64]);

    fn varint(&mut self, mut v: u64) {
        let mut buf = [0u8; 10];
        let mut n = 0;
        while v >= 0x80 {
            buf[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        buf[n] = v as u8;
        self.raw(&buf[..=n]);
    }

    fn tag(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field << 3 | u32::from(wire_type)));
    }

    fn varint_field(&mut self, field: u32, v: u64) {
        self.tag(field, VARINT);
        self.varint(v);
    }

    /// A length-delimited field, written even when empty.
    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.tag(field, LEN);
        self.varint(bytes.len() as u64);
        self.raw(bytes);
    }

    /// A proto3 `string` or `bytes` field: left out when empty.
    fn string(&mut self, field: u32, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.bytes(field, bytes);
        }
    }

    fn payload(&mut self, field: u32, payload: &Payload<'_>) {
        self.tag(field, LEN);
        self.varint(payload.len(self) as u64);
        match payload {
            Payload::Bytes(b) => self.raw(b),
            Payload::Array(i) => self.array(*i),
            Payload::Int32s(v) => self.int32s(v),
            Payload::Int64s(v) => self.int64s(v),
        }
    }

    /// The bytes of the request's [`Payload::Array`] `i`.
    fn array(&mut self, i: usize);
    fn array_len(&self, i: usize) -> usize;

    /// A message field, written even when empty.
    fn message<M: Message>(&mut self, field: u32, m: &M);
}

/// Counts the bytes, and records each message's body size.
#[derive(Default)]
struct Sizer<'r> {
    arrays: &'r [&'r [u8]],
    len: usize,
    /// The longest single write of bytes: a `bytes` / `string` body (a
    /// varint is at most 10).
    longest_payload: usize,
    sizes: Vec<usize>,
}

impl Sizer<'_> {
    fn add(&mut self, n: usize) {
        self.len += n;
        self.longest_payload = self.longest_payload.max(n);
    }
}

impl Sink for Sizer<'_> {
    fn raw(&mut self, bytes: &[u8]) {
        self.add(bytes.len());
    }
    fn array(&mut self, i: usize) {
        self.add(self.arrays[i].len());
    }
    fn array_len(&self, i: usize) -> usize {
        self.arrays[i].len()
    }
    fn int32s(&mut self, values: &[i32]) {
        self.add(values.len() * 4);
    }
    fn int64s(&mut self, values: &[i64]) {
        self.add(values.len() * 8);
    }
    fn varint(&mut self, v: u64) {
        self.len += varint_len(v);
    }
    fn message<M: Message>(&mut self, field: u32, m: &M) {
        let slot = self.sizes.len();
        self.sizes.push(0); // before its submessages': the writer needs it first
        let start = self.len;
        m.emit(self);
        let body = self.len - start;
        self.sizes[slot] = body;
        self.tag(field, LEN);
        self.varint(body as u64);
    }
}

/// Writes into memory that may be uninitialized.
struct Writer<'o, 's> {
    out: &'o mut [MaybeUninit<u8>],
    pos: usize,
    /// The sizer's message sizes, taken in the same order.
    sizes: std::slice::Iter<'s, usize>,
    arrays: &'s [&'s [u8]],
    /// Where the owned payloads go instead of `out`, when they are left for
    /// [`write_owned`].
    owned: Option<&'o mut Vec<(usize, &'s [u8])>>,
}

impl<'s> Writer<'_, 's> {
    /// The next `n` bytes, to be written.
    fn next(&mut self, n: usize) -> &mut [MaybeUninit<u8>] {
        let start = self.pos;
        self.pos += n;
        &mut self.out[start..self.pos]
    }

    /// An owned payload's bytes: written, or left for [`write_owned`].
    fn owned_bytes(&mut self, bytes: &[u8]) {
        match &mut self.owned {
            Some(owned) => {
                // SAFETY: `bytes` is a payload of the request, which outlives
                // the `'s` borrow the writer was made with (`write_borrowed`
                // borrows the measured request for it).
                let bytes: &'s [u8] = unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) };
                owned.push((self.pos, bytes));
                self.pos += bytes.len();
            }
            None => self.raw(bytes),
        }
    }
}

impl Sink for Writer<'_, '_> {
    fn raw(&mut self, bytes: &[u8]) {
        copy_into(self.next(bytes.len()), bytes);
    }
    fn array(&mut self, i: usize) {
        let bytes = self.arrays[i];
        self.raw(bytes);
    }
    fn array_len(&self, i: usize) -> usize {
        self.arrays[i].len()
    }
    fn int32s(&mut self, values: &[i32]) {
        // SAFETY: an i32 slice is readable as its bytes (no padding; u8 has
        // alignment 1), in native order as numpy's tobytes() gives them.
        self.owned_bytes(unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), values.len() * 4) });
    }
    fn int64s(&mut self, values: &[i64]) {
        // SAFETY: as in `int32s`.
        self.owned_bytes(unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), values.len() * 8) });
    }
    fn message<M: Message>(&mut self, field: u32, m: &M) {
        let len = *self.sizes.next().expect("a message the sizer did not see");
        self.tag(field, LEN);
        self.varint(len as u64);
        let end = self.pos + len;
        m.emit(self);
        assert_eq!(self.pos, end, "message size mismatch");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(data: Vec<Datum<'_>>) -> Request<'_> {
        Request {
            model_id: b"",
            seq_id: 0,
            data,
            loss_fn: b"",
            loss_fn_config: vec![],
            forward_only: false,
            loss_fn_config_v2: vec![],
        }
    }

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut w = Vec::new();
        let mut s = VecSink(&mut w);
        s.varint(v);
        w
    }

    /// A plain sink for testing the provided methods.
    struct VecSink<'v>(&'v mut Vec<u8>);

    impl Sink for VecSink<'_> {
        fn raw(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn array(&mut self, i: usize) {
            self.0.extend_from_slice(ARRAYS[i]);
        }
        fn array_len(&self, i: usize) -> usize {
            ARRAYS[i].len()
        }
        fn int32s(&mut self, values: &[i32]) {
            for v in values {
                self.0.extend_from_slice(&v.to_ne_bytes());
            }
        }
        fn int64s(&mut self, values: &[i64]) {
            for v in values {
                self.0.extend_from_slice(&v.to_ne_bytes());
            }
        }
        fn message<M: Message>(&mut self, field: u32, m: &M) {
            let mut body = Vec::new();
            m.emit(&mut VecSink(&mut body));
            self.bytes(field, &body);
        }
    }

    #[test]
    fn varints_as_the_protobuf_encoding_guide_gives_them() {
        assert_eq!(varint_bytes(0), [0x00]);
        assert_eq!(varint_bytes(1), [0x01]);
        assert_eq!(varint_bytes(150), [0x96, 0x01]);
        assert_eq!(varint_bytes(300), [0xac, 0x02]);
        // A negative int32 or int64 takes ten bytes.
        assert_eq!(
            varint_bytes(-2i64 as u64),
            [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        for v in [0, 1, 127, 128, 16383, 16384, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(varint_len(v), varint_bytes(v).len(), "{v}");
        }
    }

    #[test]
    fn defaults_are_left_out_but_oneof_members_and_map_entries_are_written() {
        // An empty request is no bytes at all.
        assert_eq!(request(vec![]).to_vec(&[]), b"");
        let datum = Datum {
            model_input: vec![Part::Fields(Chunk::Text(Payload::Int32s(vec![])))],
            loss_fn_inputs: vec![(
                b"",
                Part::Fields(Tensor {
                    dtype: DType::Float32,
                    shape: Shape::default(),
                    data: TensorData::Dense(Payload::Bytes(b"")),
                }),
            )],
            model_input_spans: vec![Part::Fields(Span {
                sampled: true,
                sequence_id: b"",
                offset: 0,
                length: 0,
            })],
            loss_fn_input_spans: vec![],
        };
        let bytes = request(vec![datum]).to_vec(&[]);
        // data { model_input { encoded_text {} }
        //        loss_fn_inputs { key: "" value { dense: "" dtype: FLOAT32 } }
        //        model_input_spans { sampled_tokens {} } }
        let expected = [
            0x1a, 0x12, //
            0x0a, 0x02, 0x0a, 0x00, //
            0x12, 0x08, 0x0a, 0x00, 0x12, 0x04, 0x0a, 0x00, 0x18, 0x01, //
            0x1a, 0x02, 0x12, 0x00,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn scalars_fields_in_number_order() {
        let mut r = request(vec![Datum::default()]);
        r.model_id = b"m";
        r.seq_id = -1;
        r.loss_fn = b"l";
        r.forward_only = true;
        r.loss_fn_config = vec![(b"a", 1.0)];
        r.loss_fn_config_v2 = vec![(b"a", ConfigValue::Number(1.0)), (b"b", ConfigValue::Text(b""))];
        let mut expected = vec![0x0a, 0x01, b'm', 0x10];
        expected.extend(varint_bytes(-1i64 as u64));
        expected.extend([0x1a, 0x00, 0x22, 0x01, b'l']);
        expected.extend([0x2a, 0x0c, 0x0a, 0x01, b'a', 0x11]);
        expected.extend(1.0f64.to_le_bytes());
        expected.extend([0x30, 0x01]);
        expected.extend([0x3a, 0x0e, 0x0a, 0x01, b'a', 0x12, 0x09, 0x09]);
        expected.extend(1.0f64.to_le_bytes());
        expected.extend([0x3a, 0x07, 0x0a, 0x01, b'b', 0x12, 0x02, 0x12, 0x00]);
        assert_eq!(r.to_vec(&[]), expected);
    }

    #[test]
    fn shapes_of_any_length() {
        for n in 0..6 {
            let dims: Vec<i64> = (0..n).map(|d| d * 7 - 3).collect();
            assert_eq!(dims.iter().copied().collect::<Shape>().dims(), dims);
        }
    }

    #[test]
    fn map_order_and_last_assignment_wins() {
        let mut entries: Vec<(&[u8], i32)> = vec![(b"b", 0), (b"a", 1), (b"", 2), (b"ab", 3), (b"a", 4)];
        sort_map(&mut entries, KeyOrder::ShorterFirst);
        assert_eq!(entries, [(&b""[..], 2), (b"a", 4), (b"ab", 3), (b"b", 0)]);
        sort_map(&mut entries, KeyOrder::LongerFirst);
        assert_eq!(entries, [(&b"ab"[..], 3), (b"a", 4), (b"b", 0), (&b""[..], 2)]);
    }

    /// The array table of the requests tested.
    const ARRAYS: &[&[u8]] = &[b"", b"\x01\x02\x03\x04", &[9; 300]];

    fn payload() -> impl Strategy<Value = Payload<'static>> {
        prop_oneof![
            (0..ARRAYS.len()).prop_map(Payload::Array),
            prop::collection::vec(any::<i32>(), 0..5).prop_map(Payload::Int32s),
            prop::collection::vec(any::<i64>(), 0..5).prop_map(Payload::Int64s),
            prop::sample::select(vec![&b""[..], b"x", &[7u8; 200][..]]).prop_map(Payload::Bytes),
        ]
    }

    fn tensor() -> impl Strategy<Value = Tensor<'static>> {
        let data = prop_oneof![
            payload().prop_map(TensorData::Dense),
            (payload(), payload(), payload()).prop_map(|(values, crow_indices, col_indices)| {
                TensorData::SparseCsr {
                    values,
                    crow_indices,
                    col_indices,
                }
            }),
        ];
        (any::<bool>(), prop::collection::vec(any::<i64>(), 0..5), data).prop_map(|(float, dims, data)| Tensor {
            dtype: if float { DType::Float32 } else { DType::Int64 },
            shape: dims.into_iter().collect(),
            data,
        })
    }

    fn datum() -> impl Strategy<Value = Datum<'static>> {
        let chunk = prop_oneof![
            payload().prop_map(Chunk::Text),
            (any::<Option<i32>>()).prop_map(|expected_tokens| Chunk::Image {
                data: &[1u8; 130][..],
                format: b"png",
                expected_tokens,
            }),
            Just(()).prop_map(|()| Chunk::Dmel(b"d")),
        ];
        let span = (any::<bool>(), any::<i64>(), any::<i64>()).prop_map(|(sampled, offset, length)| Span {
            sampled,
            sequence_id: b"seq",
            offset,
            length,
        });
        (
            prop::collection::vec(chunk, 0..3),
            prop::collection::vec(tensor(), 0..3),
            prop::collection::vec(span, 0..3),
        )
            .prop_map(|(chunks, tensors, spans)| Datum {
                model_input: chunks.into_iter().map(Part::Fields).collect(),
                loss_fn_inputs: tensors.into_iter().map(|t| (&b"k"[..], Part::Fields(t))).collect(),
                model_input_spans: spans.into_iter().map(Part::Fields).collect(),
                loss_fn_input_spans: vec![Part::Encoded(b"\x0a\x00")],
            })
    }

    proptest! {
        /// The sizes computed first are the bytes written (`write_to`
        /// asserts it, at every nesting level), and writing into fresh
        /// memory gives what a plain growing buffer gives.
        #[test]
        fn sizes_match_the_bytes_written(data in prop::collection::vec(datum(), 0..4), seq_id in any::<i32>()) {
            let mut r = request(data);
            r.seq_id = seq_id;
            let bytes = r.to_vec(ARRAYS);
            let measured = r.measured(ARRAYS);
            prop_assert_eq!(bytes.len(), measured.len());
            let mut plain = Vec::new();
            r.emit(&mut VecSink(&mut plain));
            prop_assert_eq!(&bytes, &plain);
            // Written in two passes, borrowed then owned payloads: the same bytes.
            let mut split = vec![0u8; measured.len()];
            {
                // SAFETY: u8 and MaybeUninit<u8> have the same layout.
                let out = unsafe { &mut *(std::ptr::from_mut::<[u8]>(&mut split[..]) as *mut [MaybeUninit<u8>]) };
                let owned = measured.write_borrowed(out);
                write_owned(&owned, out);
            }
            prop_assert_eq!(split, plain);
        }
    }
}
