//! Filled rows into tinker's objects, for both front doors: one Datum
//! builder and one metadata builder.
//!
//! The builder has two ways of making each object, chosen once per process
//! by `rows.py`: *direct* (`direct.rs`: each instance gets exactly the
//! fields its public constructor would give it, without its per-token
//! validation, which the rows do not need), on a tinker whose classes
//! `rows.py` has checked field for field against their constructors when
//! first needed; or tinker's *public* constructors, called as a user would
//! (`TensorData.from_numpy`, `ModelInput(chunks=...)`, `Datum(...)`, the
//! span classes), anywhere else.

pub mod columns;
pub mod direct;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyType};

use crate::py::classes::Classes;

pub use columns::{Column, FilledColumns, RowColumns, Unwritten};
pub use direct::untrack_list;

/// A row's model input as built: an int32 array of tokens (one text chunk),
/// or its chunks.
pub enum ModelInputOut<'py> {
    Tokens(Bound<'py, PyAny>),
    /// A single chunk, the common case (no Vec to allocate per row).
    Chunk(ChunkOut<'py>),
    Chunks(Vec<ChunkOut<'py>>),
}

/// A chunk of a row's model input: a run of tokens, or a non-text chunk as
/// given.
pub enum ChunkOut<'py> {
    /// A new, untracked list of ints.
    Text(Bound<'py, PyList>),
    Given(Bound<'py, PyAny>),
}

/// A provenance span as planned: `(sequence_id, offset, length, sampled)`.
pub type SpanOut<'py> = (Bound<'py, PyAny>, usize, usize, bool);

/// The keys of `loss_fn_inputs`.
#[derive(Clone, Copy)]
pub enum LossKey {
    TargetTokens,
    Logprobs,
    Advantages,
    Mask,
}

/// The dtypes of `TensorData`.
#[derive(Clone, Copy)]
pub enum Dtype {
    Int64,
    Float32,
}

// Names interned once per process by `intern!`: interning anew per Datum
// cost 6% of a cookbook call.
impl LossKey {
    fn name(self, py: Python<'_>) -> &Bound<'_, PyString> {
        match self {
            LossKey::TargetTokens => intern!(py, "target_tokens"),
            LossKey::Logprobs => intern!(py, "logprobs"),
            LossKey::Advantages => intern!(py, "advantages"),
            LossKey::Mask => intern!(py, "mask"),
        }
    }
}

impl Dtype {
    fn name(self, py: Python<'_>) -> &Bound<'_, PyString> {
        match self {
            Dtype::Int64 => intern!(py, "int64"),
            Dtype::Float32 => intern!(py, "float32"),
        }
    }
}

/// One loss input: its key, its dtype, its array (of the row's positions).
pub struct LossInput<'py> {
    pub key: LossKey,
    pub dtype: Dtype,
    pub array: Bound<'py, PyAny>,
}

impl<'py> LossInput<'py> {
    pub fn new(key: LossKey, dtype: Dtype, array: Bound<'py, PyAny>) -> Self {
        LossInput { key, dtype, array }
    }
}

/// Where a row came from: its group, trajectory and turns.
pub struct RowMeta {
    pub group: usize,
    pub trajectory: usize,
    pub first_turn: usize,
    pub n_turns: usize,
}

/// Everything one Datum is made of.
pub struct FilledRow<'py> {
    pub model_input: ModelInputOut<'py>,
    pub loss_inputs: Vec<LossInput<'py>>,
    /// `(model_input_spans, loss_fn_input_spans)`, when it has provenance.
    pub provenance: Option<(Vec<SpanOut<'py>>, Vec<SpanOut<'py>>)>,
    /// Positions (`len(S) - 1`).
    pub n: usize,
    pub meta: RowMeta,
}

/// What a front door's Datum metadata is.
pub enum MetadataKind<'a, 'py> {
    /// The evsys API's `DatumMetadata(group_idx, traj_idx, turn_idx, tags,
    /// n_turns)`, each with its own copy of its group's tags.
    Dataclass {
        class: &'a Bound<'py, PyType>,
        tags: &'a [Bound<'py, PyList>],
    },
    /// tinker-cookbook's `{"group_idx": g, "traj_idx": t}`.
    Dict,
}

/// Makes Datums and their metadata, directly or through tinker's public
/// constructors.
pub struct Builder<'py> {
    pub classes: Classes<'py>,
    pub direct: bool,
}

impl<'py> Builder<'py> {
    pub fn py(&self) -> Python<'py> {
        self.classes.datum.py()
    }

    /// The Datum of a filled row.
    pub fn datum(&self, row: FilledRow<'py>) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py();
        let chunks = PyList::empty(py);
        let append = |part: ChunkOut<'py>| match part {
            ChunkOut::Text(tokens) => chunks.append(self.text_chunk(tokens.as_any())?),
            ChunkOut::Given(chunk) => chunks.append(chunk),
        };
        match row.model_input {
            ModelInputOut::Tokens(tokens) => chunks.append(self.text_chunk(&tokens)?)?,
            ModelInputOut::Chunk(part) => append(part)?,
            ModelInputOut::Chunks(parts) => parts.into_iter().try_for_each(append)?,
        }
        let classes = &self.classes;
        let model_input = if self.direct {
            direct::model_input(&classes.model_input, &chunks)?
        } else {
            classes
                .model_input
                .call((), Some(&kwargs(py, [("chunks", chunks.as_any())])?))?
        };
        let loss_fn_inputs = PyDict::new(py);
        for input in &row.loss_inputs {
            let tensor = if self.direct {
                direct::tensor(&classes.tensor_data, input.dtype.name(py), &input.array, row.n)?
            } else {
                classes
                    .tensor_data
                    .call_method1(intern!(py, "from_numpy"), (&input.array,))?
            };
            loss_fn_inputs.set_item(input.key.name(py), tensor)?;
        }
        let none = py.None().into_bound(py);
        let (input_spans, target_spans) = match &row.provenance {
            Some((inputs, targets)) => (self.spans(inputs)?, self.spans(targets)?),
            None => (none.clone(), none),
        };
        if self.direct {
            direct::datum(
                &classes.datum,
                &model_input,
                &loss_fn_inputs,
                (&input_spans, &target_spans),
            )
        } else {
            let fields = kwargs(
                py,
                [
                    ("model_input", &model_input),
                    ("loss_fn_inputs", loss_fn_inputs.as_any()),
                    ("model_input_spans", &input_spans),
                    ("loss_fn_input_spans", &target_spans),
                ],
            )?;
            classes.datum.call((), Some(&fields))
        }
    }

    /// An `EncodedTextChunk` of `tokens`: a list of ints, or an int32 array
    /// (which tinker's constructor would turn into a list, so it is set as
    /// `model_construct` sets it).
    fn text_chunk(&self, tokens: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py();
        let chunk = &self.classes.text_chunk;
        if self.direct {
            direct::text_chunk(chunk, tokens)
        } else if tokens.is_instance_of::<PyList>() {
            chunk.call((), Some(&kwargs(py, [("tokens", tokens)])?))
        } else {
            chunk.call_method(
                intern!(py, "model_construct"),
                (),
                Some(&kwargs(py, [("tokens", tokens)])?),
            )
        }
    }

    fn spans(&self, spans: &[SpanOut<'py>]) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py();
        let list = PyList::empty(py);
        for (sequence_id, offset, length, sampled) in spans {
            let cls = if *sampled {
                &self.classes.sampled_span
            } else {
                &self.classes.prompt_span
            };
            let span = if self.direct {
                direct::span(cls, sequence_id, *offset, *length)?
            } else {
                let fields = kwargs(
                    py,
                    [
                        ("sequence_id", sequence_id),
                        ("offset", &offset.into_pyobject(py)?.into_any()),
                        ("length", &length.into_pyobject(py)?.into_any()),
                    ],
                )?;
                cls.call((), Some(&fields))?
            };
            list.append(span)?;
        }
        Ok(list.into_any())
    }

    /// A row's metadata.
    pub fn metadata(&self, kind: &MetadataKind<'_, 'py>, meta: &RowMeta) -> PyResult<Bound<'py, PyAny>> {
        let py = self.py();
        match kind {
            MetadataKind::Dict => {
                // A dict of ints: CPython keeps it off the GC's books.
                let dict = PyDict::new(py);
                dict.set_item(intern!(py, "group_idx"), meta.group)?;
                dict.set_item(intern!(py, "traj_idx"), meta.trajectory)?;
                Ok(dict.into_any())
            }
            MetadataKind::Dataclass { class, tags } => {
                let tags = &tags[meta.group];
                let tags = tags.get_slice(0, tags.len());
                let values = [
                    meta.group.into_pyobject(py)?.into_any(),
                    meta.trajectory.into_pyobject(py)?.into_any(),
                    meta.first_turn.into_pyobject(py)?.into_any(),
                    tags.into_any(),
                    meta.n_turns.into_pyobject(py)?.into_any(),
                ];
                if self.direct {
                    let [g, t, u, tags, n] = &values;
                    direct::dataclass(
                        class,
                        [
                            (intern!(py, "group_idx"), g),
                            (intern!(py, "traj_idx"), t),
                            (intern!(py, "turn_idx"), u),
                            (intern!(py, "tags"), tags),
                            (intern!(py, "n_turns"), n),
                        ],
                    )
                } else {
                    class.call1(pyo3::types::PyTuple::new(py, values)?)
                }
            }
        }
    }
}

fn kwargs<'py, const N: usize>(
    py: Python<'py>,
    items: [(&'static str, &Bound<'py, PyAny>); N],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in items {
        dict.set_item(key, value)?;
    }
    Ok(dict)
}
