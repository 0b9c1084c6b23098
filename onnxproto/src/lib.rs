//! What isorun reads of an ONNX model (`ModelProto`) without ONNX Runtime:
//! the IR version, opsets, producer, the graph's inputs and outputs (types
//! and symbolic dimensions) and the external-data files its tensors keep
//! their bytes in. The supervisor uses it to list and inspect `.onnx` files
//! and to decide what it can of a model before any worker loads it.
//!
//! An `.onnx` file holds its weights inline (up to protobuf's 2 GiB) and is
//! untrusted, so it is not decoded whole with `prost`: that would hold every
//! initializer's bytes in memory and trust every length the file claims.
//! [`read_model`] walks the wire format itself over a buffered file, keeps
//! only the fields above, seeks past tensor payloads and node contents it
//! does not need, checks every claimed length against the bytes its
//! enclosing message has left, and counts what it keeps against a budget
//! proportional to the file (SECURITY.md, "The allocation bound").

mod model;
mod walker;

pub use model::{Dim, ElemType, ExternalFile, OnnxModel, Opset, ValueInfo, ValueType};
pub use walker::{parse_model, read_model, OnnxError, MAX_NESTING};
