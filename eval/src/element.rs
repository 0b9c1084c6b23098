//! The elements columnar sources hand (an `.npy` element type: numbers of
//! a dtype, or fixed-width byte or unicode strings) read one at a time: a
//! leaf shared by the sources that produce them and the conversions that
//! consume them.

use isorun_protocol::DType;
use isorun_tensors::npy::Element;

/// A number read from a dense element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i64),
    /// A `uint64` past `i64::MAX`.
    BigUnsigned(u64),
    Float(f64),
}

impl Number {
    /// As a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::BigUnsigned(u) => u as f64,
            Number::Float(f) => f,
        }
    }
}

/// The number in `bytes` (one element); `None` for string elements.
pub fn number(element: Element, bytes: &[u8]) -> Option<Number> {
    let Element::Dense(dtype, big_endian) = element else { return None };
    let mut raw = [0u8; 8];
    let n = bytes.len().min(8);
    raw[..n].copy_from_slice(&bytes[..n]);
    if big_endian {
        raw[..n].reverse();
    }
    let b2 = [raw[0], raw[1]];
    let b4 = [raw[0], raw[1], raw[2], raw[3]];
    Some(match dtype {
        DType::Float32 => Number::Float(f64::from(f32::from_le_bytes(b4))),
        DType::Float64 => Number::Float(f64::from_le_bytes(raw)),
        DType::Float16 => Number::Float(f64::from(half::f16::from_le_bytes(b2).to_f32())),
        DType::BFloat16 => Number::Float(f64::from(half::bf16::from_le_bytes(b2).to_f32())),
        DType::Int8 => Number::Int(i64::from(raw[0] as i8)),
        DType::Int16 => Number::Int(i64::from(i16::from_le_bytes(b2))),
        DType::Int32 => Number::Int(i64::from(i32::from_le_bytes(b4))),
        DType::Int64 => Number::Int(i64::from_le_bytes(raw)),
        DType::UInt8 => Number::Int(i64::from(raw[0])),
        DType::UInt16 => Number::Int(i64::from(u16::from_le_bytes(b2))),
        DType::UInt32 => Number::Int(i64::from(u32::from_le_bytes(b4))),
        DType::UInt64 => {
            let u = u64::from_le_bytes(raw);
            i64::try_from(u).map_or(Number::BigUnsigned(u), Number::Int)
        }
        DType::Bool => Number::Int(i64::from(raw[0] != 0)),
        DType::String => return None,
    })
}

/// The byte string in `bytes` (one element of a string array); `None` for numbers.
pub fn string(element: Element, bytes: &[u8]) -> Option<Vec<u8>> {
    match element {
        Element::Bytes(_) => {
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            Some(bytes[..end].to_vec())
        }
        Element::Unicode(_, big_endian) => {
            let mut s = String::new();
            for unit in bytes.chunks_exact(4) {
                let raw = [unit[0], unit[1], unit[2], unit[3]];
                let code = if big_endian { u32::from_be_bytes(raw) } else { u32::from_le_bytes(raw) };
                s.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            Some(s.trim_end_matches('\0').as_bytes().to_vec())
        }
        Element::Dense(..) => None,
    }
}

/// Whether the element holds integers (or bools).
pub fn is_integer(element: Element) -> bool {
    matches!(element, Element::Dense(d, _) if !matches!(d, DType::Float16 | DType::Float32 | DType::Float64 | DType::BFloat16 | DType::String))
}
