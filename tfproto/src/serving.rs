//! TF Serving's warm-up requests (`assets.extra/tf_serving_warmup_requests`,
//! one `tensorflow.serving.PredictionLog` per TFRecord record) decoded into
//! isorun's own types, so that `isorun run --warmup-inputs` can feed a model
//! the requests its authors chose. The file is untrusted: every size, shape
//! and count it claims is checked before anything is allocated for it.
//!
//! Decisions (TF Serving's own behaviour where it has one):
//! - A `PredictRequest` runs `model_spec.signature_name`, empty meaning the
//!   caller's default; its inputs are `TensorProto`s. `output_filter` is
//!   not applied: every output comes back.
//! - `ClassificationRequest`, `RegressionRequest` and each task of a
//!   `MultiInferenceRequest` give serialized `tf.Example`s, for the
//!   signature's one string input. With `example_list_with_context`, each
//!   example is the context's bytes followed by the example's, as TF
//!   Serving makes them (protobuf merging: the example's features win).
//! - A `TensorProto` gives its elements in `tensor_content` (exactly shape
//!   × element size bytes) or in the dtype's typed field; fewer typed values
//!   than elements repeat the last one, none at all are zeros, as in
//!   TensorFlow's `Tensor::FromProto`. More values than elements is an
//!   error (TensorFlow drops them silently).
//! - One byte budget per record, the caller's: decoding the record (what
//!   prost may allocate for every element and entry it holds, walked on the
//!   wire before decoding: `cost`), then every tensor, string list and
//!   copy of examples made from it, each taken from the budget before it is
//!   allocated. A shape's claim is what it costs (one `float_val` for
//!   [16777216] is 64 MiB), and so is an empty string or `tf.Example` (its
//!   `Vec`): a record makes at most its budget, however many inputs, tasks
//!   or examples it holds.
//! - `session_run_log` and `predict_streamed_log` are refused by name.

mod cost;

use isorun_protocol::{tf_code_name, DType, Tensor};
use prost::Message;
use std::mem::size_of;

/// TF Serving's messages, only the fields isorun reads; tags as in
/// `tensorflow_serving/apis/{prediction_log,predict,classification,
/// regression,inference,input,model}.proto` and
/// `tensorflow/core/framework/{tensor,tensor_shape}.proto`.
pub mod proto {
    use std::collections::BTreeMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PredictionLog {
        #[prost(oneof = "prediction_log::LogType", tags = "2, 3, 4, 5, 6, 7")]
        pub log_type: Option<prediction_log::LogType>,
    }

    pub mod prediction_log {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum LogType {
            #[prost(message, tag = "2")]
            ClassifyLog(super::ClassifyLog),
            #[prost(message, tag = "3")]
            RegressLog(super::RegressLog),
            #[prost(message, tag = "4")]
            MultiInferenceLog(super::MultiInferenceLog),
            #[prost(message, tag = "5")]
            SessionRunLog(super::Skipped),
            #[prost(message, tag = "6")]
            PredictLog(super::PredictLog),
            #[prost(message, tag = "7")]
            PredictStreamedLog(super::Skipped),
        }
    }

    /// A message whose fields isorun does not read.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Skipped {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PredictLog {
        #[prost(message, optional, tag = "1")]
        pub request: Option<PredictRequest>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClassifyLog {
        #[prost(message, optional, tag = "1")]
        pub request: Option<ExamplesRequest>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegressLog {
        #[prost(message, optional, tag = "1")]
        pub request: Option<ExamplesRequest>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MultiInferenceLog {
        #[prost(message, optional, tag = "1")]
        pub request: Option<MultiInferenceRequest>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelSpec {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "3")]
        pub signature_name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PredictRequest {
        #[prost(message, optional, tag = "1")]
        pub model_spec: Option<ModelSpec>,
        #[prost(btree_map = "string, message", tag = "2")]
        pub inputs: BTreeMap<String, TensorProto>,
    }

    /// `ClassificationRequest` and `RegressionRequest`: the same two fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExamplesRequest {
        #[prost(message, optional, tag = "1")]
        pub model_spec: Option<ModelSpec>,
        #[prost(message, optional, tag = "2")]
        pub input: Option<Input>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MultiInferenceRequest {
        #[prost(message, repeated, tag = "1")]
        pub tasks: Vec<InferenceTask>,
        #[prost(message, optional, tag = "2")]
        pub input: Option<Input>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InferenceTask {
        #[prost(message, optional, tag = "1")]
        pub model_spec: Option<ModelSpec>,
        #[prost(string, tag = "2")]
        pub method_name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Input {
        #[prost(oneof = "input::Kind", tags = "1, 2")]
        pub kind: Option<input::Kind>,
    }

    pub mod input {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Kind {
            #[prost(message, tag = "1")]
            ExampleList(super::ExampleList),
            #[prost(message, tag = "2")]
            ExampleListWithContext(super::ExampleListWithContext),
        }
    }

    /// `tf.Example`s kept serialized (a message and `bytes` share the wire
    /// format): they go to the model as they are.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExampleList {
        #[prost(bytes = "vec", repeated, tag = "1")]
        pub examples: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExampleListWithContext {
        #[prost(bytes = "vec", repeated, tag = "1")]
        pub examples: Vec<Vec<u8>>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub context: Option<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int32, tag = "1")]
        pub dtype: i32,
        #[prost(message, optional, tag = "2")]
        pub tensor_shape: Option<TensorShapeProto>,
        #[prost(bytes = "vec", tag = "4")]
        pub tensor_content: Vec<u8>,
        #[prost(float, repeated, tag = "5")]
        pub float_val: Vec<f32>,
        #[prost(double, repeated, tag = "6")]
        pub double_val: Vec<f64>,
        #[prost(int32, repeated, tag = "7")]
        pub int_val: Vec<i32>,
        #[prost(bytes = "vec", repeated, tag = "8")]
        pub string_val: Vec<Vec<u8>>,
        #[prost(int64, repeated, tag = "10")]
        pub int64_val: Vec<i64>,
        #[prost(bool, repeated, tag = "11")]
        pub bool_val: Vec<bool>,
        /// float16 and bfloat16: each value's 16 bits in an int32.
        #[prost(int32, repeated, tag = "13")]
        pub half_val: Vec<i32>,
        #[prost(uint32, repeated, tag = "16")]
        pub uint32_val: Vec<u32>,
        #[prost(uint64, repeated, tag = "17")]
        pub uint64_val: Vec<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "2")]
        pub dim: Vec<Dim>,
        #[prost(bool, tag = "3")]
        pub unknown_rank: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dim {
        #[prost(int64, tag = "1")]
        pub size: i64,
    }
}

/// TensorFlow's limit on a shape's rank (`TensorShape::MaxDimensions`).
const MAX_RANK: usize = 254;

/// Which of TF Serving's request types a warm-up request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Predict,
    Classify,
    Regress,
    MultiInference,
}

impl RequestKind {
    /// The name in records: `predict`, `classify`, `regress`, `multi_inference`.
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Predict => "predict",
            RequestKind::Classify => "classify",
            RequestKind::Regress => "regress",
            RequestKind::MultiInference => "multi_inference",
        }
    }
}

/// What a request gives the model.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestInputs {
    /// A `PredictRequest`'s tensors, by input name (sorted).
    Tensors(Vec<(String, Tensor)>),
    /// Serialized `tf.Example`s, for a signature's one string input.
    Examples(Vec<Vec<u8>>),
}

/// One request to run: its kind, the signature it names (`None`: the
/// caller's default), its inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingRequest {
    pub kind: RequestKind,
    pub signature: Option<String>,
    pub inputs: RequestInputs,
}

/// Every warm-up record may make this much, besides [`BUDGET_PER_RECORD_BYTE`]
/// per byte of its own: a warm-up request is a handful of examples (32 MiB
/// is a batch of 40 float32 images of 224 × 224 × 3), while a shape can
/// claim any size from one value.
pub const BUDGET_BASE: u64 = 32 << 20;

/// What each byte of a record adds to its budget: a record of tensors in
/// `tensor_content` costs about twice its length to decode (prost copies a
/// `bytes` field through a temporary buffer), and must fit however large.
pub const BUDGET_PER_RECORD_BYTE: u64 = 4;

/// The budget of a record of `len` bytes: [`BUDGET_BASE`] and
/// [`BUDGET_PER_RECORD_BYTE`] per byte. So a record makes at most 32 MiB
/// and 4 times its own length (with the record itself, under
/// max(64 MiB, 16 × its length) in all).
pub fn record_budget(len: usize) -> u64 {
    BUDGET_BASE.saturating_add(BUDGET_PER_RECORD_BYTE.saturating_mul(len as u64))
}

/// What one record may still make, in bytes: decoding it and every tensor
/// and example list made from it draw on the one budget, each before it is
/// allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The record's whole budget.
    pub total: u64,
    /// What is left of it.
    pub left: u64,
}

impl Budget {
    pub fn new(total: u64) -> Budget {
        Budget { total, left: total }
    }

    /// Takes `bytes` from what is left, or gives back `Err(left)` and takes nothing.
    fn take(&mut self, bytes: u128) -> Result<(), u64> {
        match u64::try_from(bytes) {
            Ok(bytes) if bytes <= self.left => {
                self.left -= bytes;
                Ok(())
            }
            _ => Err(self.left),
        }
    }
}

/// What one element of a list of byte strings costs: its `Vec` and its
/// bytes ([`string_heap`]).
fn string_cost(len: usize) -> u128 {
    size_of::<Vec<u8>>() as u128 + string_heap(len)
}

/// What a byte string's own allocation costs: its bytes and, where it has
/// any, the allocator's bookkeeping.
fn string_heap(len: usize) -> u128 {
    if len == 0 {
        0
    } else {
        16 + len as u128
    }
}

/// Why a `PredictionLog` gives no request to run.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("not a PredictionLog protobuf ({0})")]
    Decode(String),
    #[error(
        "decoding it may take {bytes} bytes (for the number and size of its fields), over the record's budget of \
         {budget}"
    )]
    DecodeTooLarge { bytes: u64, budget: u64 },
    #[error("a PredictionLog with no request in it")]
    NoRequest,
    #[error("{0} warm-up requests are not supported (only predict, classify, regress and multi_inference logs)")]
    Unsupported(&'static str),
    #[error("a {kind} request with no input examples", kind = .0.name())]
    NoExamples(RequestKind),
    #[error("a multi_inference request with no tasks")]
    NoTasks,
    #[error(
        "a {kind} request whose examples make {bytes} bytes, over the {left} left of the record's budget of {budget}",
        kind = .kind.name()
    )]
    ExamplesTooLarge { kind: RequestKind, bytes: u128, left: u64, budget: u64 },
    #[error("a predict request with no inputs")]
    NoInputs,
    #[error("input '{input}'")]
    Tensor {
        input: String,
        #[source]
        source: TensorProtoError,
    },
}

/// Why a `TensorProto` is not a tensor isorun can feed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorProtoError {
    #[error("dtype {0}: not one isorun can feed")]
    DType(String),
    #[error("no shape, or a shape of unknown rank")]
    UnknownShape,
    #[error("shape of rank {0}, over TensorFlow's 254")]
    Rank(usize),
    #[error("dimension {0} in the shape: sizes are at least 0")]
    NegativeDim(i64),
    #[error("shape {shape:?} makes {bytes} bytes, over the {left} left of the record's budget of {budget}")]
    TooLarge { shape: Vec<u64>, bytes: u128, left: u64, budget: u64 },
    #[error("tensor_content holds {actual} bytes; shape {shape:?} of {dtype} needs {expected}")]
    ContentLength { shape: Vec<u64>, dtype: DType, expected: u64, actual: u64 },
    #[error("{field} holds {given} values; shape {shape:?} has {elements} elements")]
    TooManyValues { field: &'static str, given: u64, shape: Vec<u64>, elements: u64 },
    #[error("{field} value {value} does not fit {dtype}")]
    OutOfRange { field: &'static str, value: i64, dtype: DType },
}

/// Decodes one record of a warm-up file into the requests it holds (one,
/// or one per task of a `MultiInferenceRequest`). Decoding and everything
/// made from the record draw on one `budget` of bytes, each before it is
/// allocated: what prost may take for the record's fields first (walked
/// before decoding, see `cost`), then each tensor or example list.
pub fn decode_prediction_log(bytes: &[u8], budget: u64) -> Result<Vec<ServingRequest>, ServingError> {
    use proto::prediction_log::LogType;
    let mut budget = Budget::new(budget);
    let decoding = cost::decode_cost(bytes);
    budget.take(decoding.into()).map_err(|_| ServingError::DecodeTooLarge { bytes: decoding, budget: budget.total })?;
    let log = proto::PredictionLog::decode(bytes).map_err(|e| ServingError::Decode(e.to_string()))?;
    let signature = |spec: &Option<proto::ModelSpec>| {
        spec.as_ref().map(|s| s.signature_name.clone()).filter(|name| !name.is_empty())
    };
    let mut examples_request = |kind, request: Option<proto::ExamplesRequest>| {
        let request = request.ok_or(ServingError::NoRequest)?;
        let inputs = RequestInputs::Examples(examples(kind, request.input, &mut budget)?);
        Ok(vec![ServingRequest { kind, signature: signature(&request.model_spec), inputs }])
    };
    match log.log_type.ok_or(ServingError::NoRequest)? {
        LogType::PredictLog(log) => {
            let request = log.request.ok_or(ServingError::NoRequest)?;
            if request.inputs.is_empty() {
                return Err(ServingError::NoInputs);
            }
            let signature = signature(&request.model_spec);
            let tensors = request
                .inputs
                .into_iter()
                .map(|(name, proto)| match tensor_from_proto(proto, &mut budget) {
                    Ok(tensor) => Ok((name, tensor)),
                    Err(source) => Err(ServingError::Tensor { input: name, source }),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![ServingRequest { kind: RequestKind::Predict, signature, inputs: RequestInputs::Tensors(tensors) }])
        }
        LogType::ClassifyLog(log) => examples_request(RequestKind::Classify, log.request),
        LogType::RegressLog(log) => examples_request(RequestKind::Regress, log.request),
        LogType::MultiInferenceLog(log) => {
            let request = log.request.ok_or(ServingError::NoRequest)?;
            if request.tasks.is_empty() {
                return Err(ServingError::NoTasks);
            }
            let kind = RequestKind::MultiInference;
            let list = examples(kind, request.input, &mut budget)?;
            // Every task gets its own copy of the examples, and a request of its own.
            let copy = list.iter().map(|e| string_cost(e.len())).sum::<u128>()
                + (size_of::<Vec<u8>>() + size_of::<ServingRequest>()) as u128;
            let bytes = copy.saturating_mul(request.tasks.len() as u128);
            budget.take(bytes).map_err(|left| ServingError::ExamplesTooLarge {
                kind,
                bytes,
                left,
                budget: budget.total,
            })?;
            Ok(request
                .tasks
                .iter()
                .map(|task| ServingRequest {
                    kind,
                    signature: signature(&task.model_spec),
                    inputs: RequestInputs::Examples(list.clone()),
                })
                .collect())
        }
        LogType::SessionRunLog(_) => Err(ServingError::Unsupported("session_run_log")),
        LogType::PredictStreamedLog(_) => Err(ServingError::Unsupported("predict_streamed_log")),
    }
}

/// The serialized examples of an `Input`: each with the context's bytes
/// first, when there is a context; those copies taken from `budget` before
/// they are made (a list without a context is the decoded one, moved).
fn examples(kind: RequestKind, input: Option<proto::Input>, budget: &mut Budget) -> Result<Vec<Vec<u8>>, ServingError> {
    use proto::input::Kind;
    let list = match input.and_then(|i| i.kind) {
        None => return Err(ServingError::NoExamples(kind)),
        Some(Kind::ExampleList(list)) => list.examples,
        Some(Kind::ExampleListWithContext(list)) => {
            let context = list.context.unwrap_or_default();
            let bytes = list.examples.iter().map(|e| string_cost(context.len() + e.len())).sum::<u128>();
            budget.take(bytes).map_err(|left| ServingError::ExamplesTooLarge {
                kind,
                bytes,
                left,
                budget: budget.total,
            })?;
            list.examples.into_iter().map(|example| [context.as_slice(), &example].concat()).collect()
        }
    };
    if list.is_empty() {
        return Err(ServingError::NoExamples(kind));
    }
    Ok(list)
}

/// The tensor a `TensorProto` describes, its bytes taken from `budget`
/// before it is made (strings count their `Vec`s too; `tensor_content` is
/// the decoded buffer, moved, already paid for by decoding).
pub fn tensor_from_proto(proto: proto::TensorProto, budget: &mut Budget) -> Result<Tensor, TensorProtoError> {
    let dtype = DType::from_tf_code(proto.dtype).ok_or_else(|| TensorProtoError::DType(tf_code_name(proto.dtype)))?;
    let shape_proto = proto.tensor_shape.as_ref().filter(|s| !s.unknown_rank).ok_or(TensorProtoError::UnknownShape)?;
    if shape_proto.dim.len() > MAX_RANK {
        return Err(TensorProtoError::Rank(shape_proto.dim.len()));
    }
    let shape = shape_proto
        .dim
        .iter()
        .map(|d| u64::try_from(d.size).map_err(|_| TensorProtoError::NegativeDim(d.size)))
        .collect::<Result<Vec<u64>, _>>()?;
    // In u128: a product of up to 254 dimensions below 2^63 may still overflow; then it is too large anyway.
    let elements = shape.iter().try_fold(1u128, |acc, &d| acc.checked_mul(u128::from(d))).unwrap_or(u128::MAX);
    let Some(size) = dtype.element_size() else {
        return strings(proto, shape, elements, budget);
    };
    let bytes = elements.saturating_mul(size as u128);
    if !proto.tensor_content.is_empty() {
        if u128::from(proto.tensor_content.len() as u64) != bytes {
            return Err(TensorProtoError::ContentLength {
                shape,
                dtype,
                expected: u64::try_from(bytes).unwrap_or(u64::MAX),
                actual: proto.tensor_content.len() as u64,
            });
        }
        return Ok(Tensor::dense(dtype, shape, proto.tensor_content));
    }
    if let Err(left) = budget.take(bytes) {
        return Err(TensorProtoError::TooLarge { shape, bytes, left, budget: budget.total });
    }
    // Within the budget, so within u64 and usize.
    let (elements, bytes) = (elements as u64, bytes as usize);
    let mut out = Vec::with_capacity(bytes);
    let filled = Fill { elements, shape: &shape, size };
    match dtype {
        DType::Float32 => filled.fill("float_val", &proto.float_val, &mut out, |v, o| o.extend(v.to_le_bytes()))?,
        DType::Float64 => filled.fill("double_val", &proto.double_val, &mut out, |v, o| o.extend(v.to_le_bytes()))?,
        DType::Int64 => filled.fill("int64_val", &proto.int64_val, &mut out, |v, o| o.extend(v.to_le_bytes()))?,
        DType::UInt32 => filled.fill("uint32_val", &proto.uint32_val, &mut out, |v, o| o.extend(v.to_le_bytes()))?,
        DType::UInt64 => filled.fill("uint64_val", &proto.uint64_val, &mut out, |v, o| o.extend(v.to_le_bytes()))?,
        DType::Bool => filled.fill("bool_val", &proto.bool_val, &mut out, |v, o| o.push(u8::from(*v)))?,
        DType::Int32 | DType::Int16 | DType::Int8 | DType::UInt16 | DType::UInt8 => {
            narrow("int_val", &proto.int_val, dtype)?;
            filled.fill("int_val", &proto.int_val, &mut out, |v, o| o.extend(&v.to_le_bytes()[..size]))?
        }
        DType::Float16 | DType::BFloat16 => {
            narrow("half_val", &proto.half_val, DType::UInt16)?;
            filled.fill("half_val", &proto.half_val, &mut out, |v, o| o.extend(&v.to_le_bytes()[..2]))?
        }
        DType::String => unreachable!("strings have no element size"),
    }
    Ok(Tensor::dense(dtype, shape, out))
}

/// A dense tensor's elements from a typed field, as TensorFlow fills them.
struct Fill<'a> {
    elements: u64,
    shape: &'a [u64],
    size: usize,
}

impl Fill<'_> {
    /// `values` (fewer than the elements: the last repeated; none: zeros)
    /// encoded by `put` into `out`, which has room for every element.
    fn fill<T>(
        &self,
        field: &'static str,
        values: &[T],
        out: &mut Vec<u8>,
        put: impl Fn(&T, &mut Vec<u8>),
    ) -> Result<(), TensorProtoError> {
        if values.len() as u64 > self.elements {
            return Err(TensorProtoError::TooManyValues {
                field,
                given: values.len() as u64,
                shape: self.shape.to_vec(),
                elements: self.elements,
            });
        }
        for value in values {
            put(value, out);
        }
        match values.last() {
            Some(last) => {
                let mut one = Vec::with_capacity(self.size);
                put(last, &mut one);
                for _ in values.len() as u64..self.elements {
                    out.extend_from_slice(&one);
                }
            }
            None => out.resize(self.elements as usize * self.size, 0),
        }
        Ok(())
    }
}

/// Every `int_val` (`half_val`) fits the tensor's narrower dtype.
fn narrow(field: &'static str, values: &[i32], dtype: DType) -> Result<(), TensorProtoError> {
    let (low, high) = match dtype {
        DType::Int8 => (i8::MIN as i32, i8::MAX as i32),
        DType::Int16 => (i16::MIN as i32, i16::MAX as i32),
        DType::UInt8 => (0, u8::MAX as i32),
        DType::UInt16 => (0, u16::MAX as i32),
        _ => return Ok(()),
    };
    match values.iter().find(|v| !(low..=high).contains(*v)) {
        Some(&value) => Err(TensorProtoError::OutOfRange { field, value: value.into(), dtype }),
        None => Ok(()),
    }
}

/// A string tensor: `string_val` (moved) filled as the dense fields are;
/// the list's `Vec`s and the copies the filling makes taken from `budget`.
fn strings(
    proto: proto::TensorProto,
    shape: Vec<u64>,
    elements: u128,
    budget: &mut Budget,
) -> Result<Tensor, TensorProtoError> {
    let mut values = proto.string_val;
    let given = values.len() as u128;
    if given > elements {
        return Err(TensorProtoError::TooManyValues {
            field: "string_val",
            given: given as u64,
            shape,
            elements: u64::try_from(elements).unwrap_or(u64::MAX),
        });
    }
    let fill = values.last().cloned().unwrap_or_default();
    // The list made room for every element, and a copy of the last value for each one past the given.
    let bytes = elements
        .saturating_mul(size_of::<Vec<u8>>() as u128)
        .saturating_add((elements - given).saturating_mul(string_heap(fill.len())));
    if let Err(left) = budget.take(bytes) {
        return Err(TensorProtoError::TooLarge { shape, bytes, left, budget: budget.total });
    }
    // Within the budget, so within usize.
    let elements = elements as usize;
    values.reserve_exact(elements - values.len());
    values.resize(elements, fill);
    Ok(Tensor::strings(shape, values))
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    const LIMIT: u64 = 1 << 20;

    fn convert(proto: TensorProto) -> Result<Tensor, TensorProtoError> {
        tensor_from_proto(proto, &mut Budget::new(LIMIT))
    }

    fn shape(dims: &[i64]) -> Option<TensorShapeProto> {
        Some(TensorShapeProto { dim: dims.iter().map(|&size| Dim { size }).collect(), unknown_rank: false })
    }

    fn floats(dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto { dtype: 1, tensor_shape: shape(dims), float_val: values.to_vec(), ..TensorProto::default() }
    }

    fn predict(signature: &str, inputs: Vec<(&str, TensorProto)>) -> Vec<u8> {
        PredictionLog {
            log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
                request: Some(PredictRequest {
                    model_spec: Some(ModelSpec { name: "m".into(), signature_name: signature.into() }),
                    inputs: inputs.into_iter().map(|(n, t)| (n.to_string(), t)).collect(),
                }),
            })),
        }
        .encode_to_vec()
    }

    fn values(tensor: &Tensor) -> Vec<f32> {
        let isorun_protocol::TensorData::Dense(bytes) = &tensor.data else { panic!("dense") };
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn typed_values_fill_as_tensorflow_does() {
        let full = convert(floats(&[2, 2], &[1.0, 2.0, 3.0, 4.0])).unwrap();
        assert_eq!((full.shape.clone(), values(&full)), (vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]));
        let repeated = convert(floats(&[3], &[1.0, 7.0])).unwrap();
        assert_eq!(values(&repeated), [1.0, 7.0, 7.0]);
        let zeros = convert(floats(&[2], &[])).unwrap();
        assert_eq!(values(&zeros), [0.0, 0.0]);
        let scalar = convert(floats(&[], &[5.0])).unwrap();
        assert_eq!((scalar.shape.clone(), values(&scalar)), (vec![], vec![5.0]));
        let int8 = TensorProto { dtype: 6, tensor_shape: shape(&[2]), int_val: vec![-3, 4], ..TensorProto::default() };
        assert_eq!(convert(int8).unwrap(), Tensor::dense(DType::Int8, vec![2], vec![0xfd, 4]));
        let words = TensorProto {
            dtype: 7,
            tensor_shape: shape(&[2]),
            string_val: vec![b"a".to_vec()],
            ..TensorProto::default()
        };
        assert_eq!(convert(words).unwrap(), Tensor::strings(vec![2], vec![b"a".to_vec(); 2]));
    }

    #[test]
    fn hostile_shapes_and_lengths_are_errors_before_any_allocation() {
        // 2^40 float32 elements from one value (4 TiB): refused by the limit, never allocated.
        let huge = floats(&[1 << 20, 1 << 20], &[1.0]);
        let err = convert(huge).unwrap_err();
        assert!(matches!(err, TensorProtoError::TooLarge { bytes, .. } if bytes == 1 << 42), "{err}");
        assert!(err.to_string().contains("[1048576, 1048576]"), "{err}");
        // A product that overflows 128 bits.
        let overflow = floats(&[i64::MAX, i64::MAX, i64::MAX], &[]);
        assert!(matches!(convert(overflow), Err(TensorProtoError::TooLarge { .. })));
        // Strings repeated to fill a huge shape.
        let strings = TensorProto {
            dtype: 7,
            tensor_shape: shape(&[1 << 40]),
            string_val: vec![b"x".to_vec()],
            ..TensorProto::default()
        };
        assert!(matches!(convert(strings), Err(TensorProtoError::TooLarge { .. })));
        assert_eq!(convert(floats(&[2, -1], &[])), Err(TensorProtoError::NegativeDim(-1)));
        let too_deep = floats(&[1; 255], &[]);
        assert_eq!(convert(too_deep), Err(TensorProtoError::Rank(255)));
        let no_shape = TensorProto { dtype: 1, ..TensorProto::default() };
        assert_eq!(convert(no_shape), Err(TensorProtoError::UnknownShape));
        let content = TensorProto { tensor_content: vec![0; 12], ..floats(&[2, 2], &[]) };
        let err = convert(content).unwrap_err();
        assert_eq!(err.to_string(), "tensor_content holds 12 bytes; shape [2, 2] of float32 needs 16");
        let extra = floats(&[2], &[1.0, 2.0, 3.0]);
        assert!(matches!(convert(extra), Err(TensorProtoError::TooManyValues { given: 3, .. })));
        let wide = TensorProto { dtype: 4, tensor_shape: shape(&[1]), int_val: vec![300], ..TensorProto::default() };
        assert!(matches!(convert(wide), Err(TensorProtoError::OutOfRange { value: 300, .. })));
        let complex = TensorProto { dtype: 8, ..floats(&[1], &[]) };
        assert_eq!(convert(complex), Err(TensorProtoError::DType("complex64".into())));
    }

    #[test]
    fn a_predict_log_names_its_signature_and_inputs() {
        let bytes = predict("", vec![("x", floats(&[1, 2], &[1.0, 2.0]))]);
        let requests = decode_prediction_log(&bytes, LIMIT).unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!((requests[0].kind, requests[0].signature.as_deref()), (RequestKind::Predict, None));
        let RequestInputs::Tensors(tensors) = &requests[0].inputs else { panic!("tensors") };
        assert_eq!(tensors[0].0, "x");
        let named = decode_prediction_log(&predict("double", vec![("x", floats(&[1], &[1.0]))]), LIMIT).unwrap();
        assert_eq!(named[0].signature.as_deref(), Some("double"));
        let err = decode_prediction_log(&predict("", vec![("x", floats(&[1 << 30], &[1.0]))]), LIMIT).unwrap_err();
        assert!(matches!(&err, ServingError::Tensor { input, .. } if input == "x"), "{err}");
        assert!(matches!(decode_prediction_log(&predict("", vec![]), LIMIT), Err(ServingError::NoInputs)));
    }

    #[test]
    fn examples_with_a_context_get_its_bytes_first_and_count_against_the_limit() {
        let log = |context: Vec<u8>, examples: Vec<Vec<u8>>| {
            PredictionLog {
                log_type: Some(prediction_log::LogType::ClassifyLog(ClassifyLog {
                    request: Some(ExamplesRequest {
                        model_spec: None,
                        input: Some(Input {
                            kind: Some(input::Kind::ExampleListWithContext(ExampleListWithContext {
                                examples,
                                context: Some(context),
                            })),
                        }),
                    }),
                })),
            }
            .encode_to_vec()
        };
        let requests = decode_prediction_log(&log(b"C".to_vec(), vec![b"a".to_vec(), b"b".to_vec()]), LIMIT).unwrap();
        assert_eq!(requests[0].kind, RequestKind::Classify);
        assert_eq!(requests[0].inputs, RequestInputs::Examples(vec![b"Ca".to_vec(), b"Cb".to_vec()]));
        // A 64 KiB context for 1000 empty examples is 64 MiB of copies: refused first.
        let err = decode_prediction_log(&log(vec![0; 64 << 10], vec![Vec::new(); 1000]), LIMIT).unwrap_err();
        assert!(matches!(err, ServingError::ExamplesTooLarge { .. }), "{err}");
        assert!(matches!(
            decode_prediction_log(&log(Vec::new(), Vec::new()), LIMIT),
            Err(ServingError::NoExamples(RequestKind::Classify))
        ));
    }

    #[test]
    fn one_budget_covers_every_input_of_a_record() {
        // 100 inputs of 1024 float32 from one value each: 4 KiB apiece, 400 KiB together.
        let inputs: Vec<(String, TensorProto)> =
            (0..100).map(|i| (format!("x{i:02}"), floats(&[1024], &[1.0]))).collect();
        let names: Vec<(&str, TensorProto)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let record = predict("", names);
        assert!(decode_prediction_log(&record, 1 << 20).is_ok());
        let decoding = cost::decode_cost(&record);
        // Room for decoding and ten of them: the eleventh is refused, by name.
        let err = decode_prediction_log(&record, decoding + 10 * 4096 + 100).unwrap_err();
        assert!(matches!(&err, ServingError::Tensor { input, .. } if input == "x10"), "{err}");
        let ServingError::Tensor { source, .. } = &err else { unreachable!() };
        assert_eq!(
            source.to_string(),
            format!("shape [1024] makes 4096 bytes, over the 100 left of the record's budget of {}", decoding + 41060)
        );
        // A budget smaller than what decoding may take: refused before decoding.
        let err = decode_prediction_log(&record, decoding - 1).unwrap_err();
        assert!(matches!(err, ServingError::DecodeTooLarge { bytes, .. } if bytes == decoding), "{err}");
    }

    #[test]
    fn empty_examples_and_tasks_are_not_free() {
        let multi = |tasks: usize, examples: usize| {
            PredictionLog {
                log_type: Some(prediction_log::LogType::MultiInferenceLog(MultiInferenceLog {
                    request: Some(MultiInferenceRequest {
                        tasks: vec![InferenceTask::default(); tasks],
                        input: Some(Input {
                            kind: Some(input::Kind::ExampleList(ExampleList { examples: vec![Vec::new(); examples] })),
                        }),
                    }),
                })),
            }
            .encode_to_vec()
        };
        assert_eq!(decode_prediction_log(&multi(3, 2), LIMIT).unwrap().len(), 3);
        // 100,000 empty examples (200 KB on the wire): 2.4 MB of Vecs, more with growth.
        let err = decode_prediction_log(&multi(1, 100_000), LIMIT).unwrap_err();
        assert!(matches!(err, ServingError::DecodeTooLarge { .. }), "{err}");
        // 1,000 tasks of 1,000 empty examples: a copy each, 24 MB.
        let err = decode_prediction_log(&multi(1000, 1000), 8 << 20).unwrap_err();
        assert!(matches!(err, ServingError::ExamplesTooLarge { .. }), "{err}");
        // Strings filled from one value: each element's Vec counts.
        let strings = TensorProto {
            dtype: 7,
            tensor_shape: shape(&[100_000]),
            string_val: vec![Vec::new()],
            ..TensorProto::default()
        };
        let err = decode_prediction_log(&predict("", vec![("s", strings)]), LIMIT).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.starts_with("shape [100000] makes 2400000 bytes"), "{source}");
    }

    #[test]
    fn unsupported_and_garbage_logs_are_named() {
        let session = PredictionLog { log_type: Some(prediction_log::LogType::SessionRunLog(Skipped {})) };
        let err = decode_prediction_log(&session.encode_to_vec(), LIMIT).unwrap_err();
        assert!(err.to_string().starts_with("session_run_log warm-up requests are not supported"), "{err}");
        assert!(matches!(decode_prediction_log(&[], LIMIT), Err(ServingError::NoRequest)));
        assert!(matches!(decode_prediction_log(&[0xff, 0xff, 0xff], LIMIT), Err(ServingError::Decode(_))));
    }
}
