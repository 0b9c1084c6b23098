//! Element types, with one name each that is used everywhere: JSON records,
//! error messages, the CLI. The numeric codes are TensorFlow's `DataType`
//! enum, so that the worker and the SavedModel reader convert without tables.
//! TF1 graphs also have reference dtypes (`DT_FLOAT_REF` = `DT_FLOAT` + 100,
//! the dtype of a `VariableV2`'s output) in their signatures; TensorFlow
//! feeds and fetches them as the base dtype, and so does isorun.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A tensor element type isorun can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    Float32,
    Float64,
    Float16,
    BFloat16,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Bool,
    /// Byte strings (TensorFlow's `DT_STRING`), not necessarily UTF-8.
    String,
}

impl DType {
    pub const ALL: [DType; 14] = [
        DType::Float32,
        DType::Float64,
        DType::Float16,
        DType::BFloat16,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Bool,
        DType::String,
    ];

    /// The name used in records and messages (`float32`, `int64`, `string`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::UInt8 => "uint8",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Bool => "bool",
            DType::String => "string",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element in the dense layout; `None` for strings.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DType::Int8 | DType::UInt8 | DType::Bool => 1,
            DType::Float16 | DType::BFloat16 | DType::Int16 | DType::UInt16 => 2,
            DType::Float32 | DType::Int32 | DType::UInt32 => 4,
            DType::Float64 | DType::Int64 | DType::UInt64 => 8,
            DType::String => return None,
        })
    }

    /// TensorFlow's `DataType` code (`DT_FLOAT` = 1, ...).
    pub fn tf_code(self) -> i32 {
        match self {
            DType::Float32 => 1,
            DType::Float64 => 2,
            DType::Int32 => 3,
            DType::UInt8 => 4,
            DType::Int16 => 5,
            DType::Int8 => 6,
            DType::String => 7,
            DType::Int64 => 9,
            DType::Bool => 10,
            DType::BFloat16 => 14,
            DType::UInt16 => 17,
            DType::Float16 => 19,
            DType::UInt32 => 22,
            DType::UInt64 => 23,
        }
    }

    /// The dtype of a TensorFlow `DataType` code; a reference code
    /// (`DT_FLOAT_REF`, 101) gives its base dtype (`Float32`), as TensorFlow
    /// fetches it.
    pub fn from_tf_code(code: i32) -> Option<DType> {
        let base = base_tf_code(code);
        DType::ALL.into_iter().find(|d| d.tf_code() == base)
    }
}

/// TensorFlow's `kDataTypeRefOffset`: `DT_FLOAT_REF` is `DT_FLOAT` + 100.
const REF_OFFSET: i32 = 100;

/// True for TensorFlow's reference dtypes (`DT_*_REF`, 101 to 199), as
/// TensorFlow's `IsRefType` says.
fn is_ref_tf_code(code: i32) -> bool {
    code > REF_OFFSET && code < 2 * REF_OFFSET
}

/// The code with a reference dtype's offset taken off (`BaseType`): 101 gives 1.
fn base_tf_code(code: i32) -> i32 {
    if is_ref_tf_code(code) {
        code - REF_OFFSET
    } else {
        code
    }
}

/// The name of any TensorFlow `DataType` code, for messages and `inspect`:
/// isorun's name where it has one, TensorFlow's where isorun cannot carry
/// the dtype (`resource`), with `_ref` after a reference dtype's base name
/// (`float32_ref`).
pub fn tf_code_name(code: i32) -> String {
    let base = base_tf_code(code);
    let name = match DType::from_tf_code(base) {
        Some(d) => d.name(),
        None => match base {
            8 => "complex64",
            18 => "complex128",
            20 => "resource",
            21 => "variant",
            _ => return format!("tensorflow dtype {code}"),
        },
    };
    if is_ref_tf_code(code) {
        format!("{name}_ref")
    } else {
        name.to_string()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_tf_code(d.tf_code()), Some(d));
        }
        assert_eq!(DType::from_name("float"), None);
        assert_eq!(tf_code_name(20), "resource");
    }

    #[test]
    fn reference_dtypes_are_their_base_dtype_with_a_ref_name() {
        // DT_FLOAT_REF, DT_INT64_REF, DT_STRING_REF: fed and fetched as the base.
        assert_eq!(DType::from_tf_code(101), Some(DType::Float32));
        assert_eq!(DType::from_tf_code(109), Some(DType::Int64));
        assert_eq!(DType::from_tf_code(107), Some(DType::String));
        assert_eq!(tf_code_name(101), "float32_ref");
        assert_eq!(tf_code_name(120), "resource_ref");
        assert_eq!(tf_code_name(1), "float32");
        // DT_INVALID_REF (100) is no dtype; nor are codes past the ref range.
        assert_eq!(DType::from_tf_code(100), None);
        assert_eq!(DType::from_tf_code(201), None);
        assert_eq!(tf_code_name(100), "tensorflow dtype 100");
        assert_eq!(tf_code_name(199), "tensorflow dtype 199");
        assert_eq!(tf_code_name(201), "tensorflow dtype 201");
    }
}
