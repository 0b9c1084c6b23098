//! The model as isorun sees it, in its own types: what `ls`, `inspect` and
//! the run planner need, apart from how it was read off the wire.

use isorun_protocol::{DType, ErrorKind, ModelError, SignatureInfo, TensorSpec};
use std::fmt;
use std::path::{Path, PathBuf};

/// What isorun reads of one `.onnx` file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OnnxModel {
    /// The file read.
    pub path: PathBuf,
    /// `ModelProto.ir_version`.
    pub ir_version: i64,
    /// `opset_import`, in file order; the default domain is `""` (shown as `ai.onnx`).
    pub opsets: Vec<Opset>,
    pub producer_name: String,
    pub producer_version: String,
    /// `GraphProto.name`.
    pub graph_name: String,
    /// The graph's inputs a caller feeds: those that name an initializer
    /// (every initializer is listed as an input below IR version 4) are left out.
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    /// How many listed inputs were initializers, left out of `inputs`.
    pub initializer_inputs: usize,
    /// The files beside the model that tensors keep their data in
    /// (`data_location: EXTERNAL`), sorted by location, each once.
    pub external_data: Vec<ExternalFile>,
}

impl OnnxModel {
    /// The folder the model's external data is resolved against.
    pub fn folder(&self) -> &Path {
        self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
    }

    /// The graph's inputs and outputs as a signature (an ONNX model has one
    /// graph, no signature keys: `key` is the graph's name, `graph` when it
    /// has none), for the same input checks and casts a SavedModel's
    /// signature gets. A symbolic or unknown dimension is `None`.
    ///
    /// An input or output isorun cannot carry (a sequence, map, sparse
    /// tensor, or an element type such as complex64 or float8) is
    /// `unsupported_dtype`, naming it, its type and what to do: isorun's
    /// tensors are dense, of its dtypes.
    pub fn signature(&self) -> Result<SignatureInfo, ModelError> {
        let spec = |value: &ValueInfo, role: &str| -> Result<TensorSpec, ModelError> {
            let unsupported = |why: String| {
                ModelError::new(
                    ErrorKind::UnsupportedDtype,
                    format!("{}: {role} '{}' is {}: {why}", self.path.display(), value.name, value.value_type),
                )
            };
            let ValueType::Tensor { elem, shape } = &value.value_type else {
                let hint = match &value.value_type {
                    ValueType::Sequence(inner) if matches!(**inner, ValueType::Map { .. }) => {
                        "; a scikit-learn classifier's ZipMap: convert it with skl2onnx's option \
                         {'zipmap': False} to get a probabilities tensor"
                    }
                    _ => "",
                };
                return Err(unsupported(format!("isorun carries dense tensors only{hint}")));
            };
            let dtype = elem.dtype().ok_or_else(|| unsupported("isorun has no dtype for its elements".into()))?;
            let shape = shape.as_ref().map(|dims| {
                dims.iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Some(*n),
                        Dim::Symbolic(_) | Dim::Unknown => None,
                    })
                    .collect()
            });
            Ok(TensorSpec { name: value.name.clone(), dtype, shape })
        };
        let inputs = self.inputs.iter().map(|v| spec(v, "input")).collect::<Result<Vec<_>, _>>()?;
        let mut outputs = self.outputs.iter().map(|v| spec(v, "output")).collect::<Result<Vec<_>, _>>()?;
        outputs.sort_by(|a, b| a.name.cmp(&b.name));
        let key = if self.graph_name.is_empty() { "graph".to_string() } else { self.graph_name.clone() };
        Ok(SignatureInfo { key, inputs, outputs })
    }
}

/// One `OperatorSetIdProto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opset {
    pub domain: String,
    pub version: i64,
}

impl Opset {
    /// The domain as ONNX names it: `ai.onnx` for the default (empty) one.
    pub fn domain_name(&self) -> &str {
        if self.domain.is_empty() {
            "ai.onnx"
        } else {
            &self.domain
        }
    }
}

/// One graph input or output (`ValueInfoProto`).
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub value_type: ValueType,
}

/// A `TypeProto`.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueType {
    /// A dense tensor; `shape` is `None` when the rank is unknown.
    Tensor {
        elem: ElemType,
        shape: Option<Vec<Dim>>,
    },
    SparseTensor {
        elem: ElemType,
        shape: Option<Vec<Dim>>,
    },
    Sequence(Box<ValueType>),
    Map {
        key: ElemType,
        value: Box<ValueType>,
    },
    Optional(Box<ValueType>),
    Opaque {
        domain: String,
        name: String,
    },
    /// No type given (or one this reader does not know).
    Unknown,
}

impl ValueType {
    /// The element type of a dense tensor, `None` for anything else.
    pub fn tensor_elem(&self) -> Option<ElemType> {
        match self {
            ValueType::Tensor { elem, .. } => Some(*elem),
            _ => None,
        }
    }

    /// The dimensions of a dense or sparse tensor of known rank.
    pub fn dims(&self) -> Option<&[Dim]> {
        match self {
            ValueType::Tensor { shape, .. } | ValueType::SparseTensor { shape, .. } => shape.as_deref(),
            _ => None,
        }
    }

    /// `float32`, `sequence<map<int64, float32>>`, ...: the type without its shape.
    pub fn kind_name(&self) -> String {
        match self {
            ValueType::Tensor { elem, .. } => elem.name(),
            ValueType::SparseTensor { elem, .. } => format!("sparse_tensor<{}>", elem.name()),
            ValueType::Sequence(inner) => format!("sequence<{inner}>"),
            ValueType::Map { key, value } => format!("map<{}, {value}>", key.name()),
            ValueType::Optional(inner) => format!("optional<{inner}>"),
            ValueType::Opaque { domain, name } if domain.is_empty() => format!("opaque<{name}>"),
            ValueType::Opaque { domain, name } => format!("opaque<{domain}.{name}>"),
            ValueType::Unknown => "unknown".into(),
        }
    }
}

/// `float32[batch, 3]`, `string[?]`, `float32 (unknown rank)`, `sequence<...>`.
impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind_name())?;
        match self {
            ValueType::Tensor { shape, .. } | ValueType::SparseTensor { shape, .. } => match shape {
                Some(dims) => {
                    f.write_str("[")?;
                    for (i, dim) in dims.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{dim}")?;
                    }
                    f.write_str("]")
                }
                None => f.write_str(" (unknown rank)"),
            },
            _ => Ok(()),
        }
    }
}

/// One dimension of a tensor's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(u64),
    /// A named, symbolic size (`dim_param`: `batch`, `sequence`).
    Symbolic(String),
    /// Neither (or a negative `dim_value`).
    Unknown,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(size) => write!(f, "{size}"),
            Dim::Symbolic(name) => f.write_str(name),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// `TensorProto.DataType`, the number as the file has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ElemType(pub i32);

impl ElemType {
    /// isorun's dtype for it, where isorun has one.
    pub fn dtype(self) -> Option<DType> {
        Some(match self.0 {
            1 => DType::Float32,
            2 => DType::UInt8,
            3 => DType::Int8,
            4 => DType::UInt16,
            5 => DType::Int16,
            6 => DType::Int32,
            7 => DType::Int64,
            8 => DType::String,
            9 => DType::Bool,
            10 => DType::Float16,
            11 => DType::Float64,
            12 => DType::UInt32,
            13 => DType::UInt64,
            16 => DType::BFloat16,
            _ => return None,
        })
    }

    /// isorun's name where it has the dtype, else ONNX's (lower case), else `onnx type N`.
    pub fn name(self) -> String {
        if let Some(dtype) = self.dtype() {
            return dtype.name().into();
        }
        let onnx = match self.0 {
            0 => "undefined",
            14 => "complex64",
            15 => "complex128",
            17 => "float8e4m3fn",
            18 => "float8e4m3fnuz",
            19 => "float8e5m2",
            20 => "float8e5m2fnuz",
            21 => "uint4",
            22 => "int4",
            23 => "float4e2m1",
            24 => "float8e8m0",
            25 => "uint2",
            26 => "int2",
            other => return format!("onnx type {other}"),
        };
        onnx.into()
    }
}

/// A file beside the model holding tensors' bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalFile {
    /// The `location` entry as the model has it (relative, no `..`).
    pub location: String,
    /// It, resolved against the model's folder.
    pub path: PathBuf,
    /// How many tensors keep data in it.
    pub tensors: usize,
}
