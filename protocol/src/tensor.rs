//! A tensor as it travels between processes and files: a dtype, a shape and
//! the elements in TensorFlow's own dense little-endian layout (or a list of
//! byte strings). Keeping the raw layout means no conversion on either side:
//! the worker copies it into a `TF_Tensor`, the supervisor into a `.npy` file.

use crate::DType;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::fmt;

/// Where a tensor's elements are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TensorData {
    /// Dense elements, little-endian, row-major; bools are one byte each.
    Dense(ByteBuf),
    /// One byte string per element, row-major.
    Strings(Vec<ByteBuf>),
    /// Dense elements held outside the message, in shared-memory region N of
    /// the envelope that carried it (see `isorun-transport`).
    Shared(u32),
}

/// A tensor: dtype, shape, elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: TensorData,
}

/// Why a tensor's parts do not agree with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorError {
    /// The shape's element count overflows.
    ShapeOverflow { shape: Vec<u64> },
    /// The data holds another number of bytes than dtype and shape need.
    ByteLength { expected: u64, actual: u64 },
    /// A string tensor holds another number of elements than its shape.
    StringCount { expected: u64, actual: u64 },
    /// Strings given for a dense dtype, or dense bytes for strings.
    Layout { dtype: DType },
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorError::ShapeOverflow { shape } => write!(f, "shape {shape:?} has too many elements"),
            TensorError::ByteLength { expected, actual } => {
                write!(f, "data holds {actual} bytes but dtype and shape need {expected}")
            }
            TensorError::StringCount { expected, actual } => {
                write!(f, "data holds {actual} strings but the shape needs {expected}")
            }
            TensorError::Layout { dtype } => write!(f, "data layout does not fit dtype {dtype}"),
        }
    }
}

impl std::error::Error for TensorError {}

impl Tensor {
    /// A dense tensor from raw little-endian bytes.
    pub fn dense(dtype: DType, shape: Vec<u64>, bytes: Vec<u8>) -> Tensor {
        Tensor { dtype, shape, data: TensorData::Dense(ByteBuf::from(bytes)) }
    }

    /// A string tensor.
    pub fn strings(shape: Vec<u64>, strings: Vec<Vec<u8>>) -> Tensor {
        Tensor {
            dtype: DType::String,
            shape,
            data: TensorData::Strings(strings.into_iter().map(ByteBuf::from).collect()),
        }
    }

    /// Number of elements the shape describes, `None` on overflow.
    pub fn element_count(shape: &[u64]) -> Option<u64> {
        shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Checks that dtype, shape and data agree. Every tensor that comes from
    /// another process or a file goes through this before it is used.
    /// `shared_len` gives the length of a `Shared` region, if known.
    pub fn validate(&self, shared_len: impl Fn(u32) -> Option<u64>) -> Result<(), TensorError> {
        let count = Tensor::element_count(&self.shape)
            .ok_or_else(|| TensorError::ShapeOverflow { shape: self.shape.clone() })?;
        match (&self.data, self.dtype.element_size()) {
            (TensorData::Strings(strings), None) => {
                if strings.len() as u64 != count {
                    return Err(TensorError::StringCount { expected: count, actual: strings.len() as u64 });
                }
            }
            (TensorData::Dense(bytes), Some(size)) => check_len(count, size, bytes.len() as u64)?,
            (TensorData::Shared(region), Some(size)) => {
                let actual = shared_len(*region).ok_or(TensorError::Layout { dtype: self.dtype })?;
                check_len(count, size, actual)?
            }
            _ => return Err(TensorError::Layout { dtype: self.dtype }),
        }
        Ok(())
    }
}

fn check_len(count: u64, size: usize, actual: u64) -> Result<(), TensorError> {
    let expected = count.checked_mul(size as u64).ok_or(TensorError::ByteLength { expected: u64::MAX, actual })?;
    if expected != actual {
        return Err(TensorError::ByteLength { expected, actual });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_checks_lengths_against_shapes() {
        let no_shared = |_| None;
        assert!(Tensor::dense(DType::Float32, vec![2, 3], vec![0; 24]).validate(no_shared).is_ok());
        assert_eq!(
            Tensor::dense(DType::Float32, vec![2, 3], vec![0; 23]).validate(no_shared),
            Err(TensorError::ByteLength { expected: 24, actual: 23 })
        );
        assert!(matches!(
            Tensor::dense(DType::Int64, vec![u64::MAX, 4], vec![]).validate(no_shared),
            Err(TensorError::ShapeOverflow { .. })
        ));
        assert!(matches!(
            Tensor::dense(DType::Int64, vec![1 << 62], vec![]).validate(no_shared),
            Err(TensorError::ByteLength { .. })
        ));
        assert_eq!(
            Tensor::strings(vec![3], vec![b"a".to_vec()]).validate(no_shared),
            Err(TensorError::StringCount { expected: 3, actual: 1 })
        );
        let wrong_layout = Tensor { dtype: DType::String, shape: vec![1], data: TensorData::Dense(ByteBuf::new()) };
        assert_eq!(wrong_layout.validate(no_shared), Err(TensorError::Layout { dtype: DType::String }));
        let shared = Tensor { dtype: DType::UInt8, shape: vec![4], data: TensorData::Shared(0) };
        assert!(shared.validate(|r| (r == 0).then_some(4)).is_ok());
        assert!(shared.validate(|_| None).is_err());
        // A scalar has one element.
        assert!(Tensor::dense(DType::Bool, vec![], vec![1]).validate(no_shared).is_ok());
    }
}
