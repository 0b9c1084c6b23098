//! Casts an input to the dtype its signature declares, as Keras's `predict`
//! does, where no value changes meaning: NumPy's default float64 to float32
//! (always; values beyond float32's range become ±inf, as in Keras), any
//! float to a wider float, integers to integers where every value fits, and
//! integers to floats where every value is exact, and between the two 16-bit
//! floats (float16, bfloat16: neither is wider than the other) where every
//! value is exact, so a bfloat16 of 1e10 is refused rather than becoming
//! float16's inf. Anything else (a float to an integer, a value that does not
//! fit) is refused with what to do.

use half::{bf16, f16};
use isorun_protocol::DType;

/// Whether `given` may become `wanted` at all (the values are checked as
/// they are converted); `Err` says why not and what to do.
pub fn allowed(name: &str, given: DType, wanted: DType) -> Result<(), String> {
    let ok = match (kind(given), kind(wanted)) {
        // float16 and bfloat16 are both 16 bits but neither holds the other:
        // each value is checked as it is converted (`write`).
        (Some(Kind::Float(from)), Some(Kind::Float(to))) => {
            to >= from || (given, wanted) == (DType::Float64, DType::Float32)
        }
        (Some(Kind::Int), Some(Kind::Float(_))) | (Some(Kind::Int), Some(Kind::Int)) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("input '{name}': expected dtype {wanted}, given {given}{}", hint(name, wanted)))
    }
}

/// What to tell a user who must convert an input themselves.
pub fn hint(name: &str, wanted: DType) -> String {
    match numpy_name(wanted) {
        Some(np) => format!("; convert it first: {name}.astype(np.{np})"),
        None => String::new(),
    }
}

/// The cast's description for records: `float64→float32`.
pub fn describe(given: DType, wanted: DType) -> String {
    format!("{given}→{wanted}")
}

/// Converts little-endian elements of `given` in `bytes` (whole elements)
/// to `wanted`, appending to `out`; `first` is the index of the first
/// element, for messages. `Err` names the first value that does not fit.
pub fn convert(
    name: &str,
    given: DType,
    wanted: DType,
    bytes: &[u8],
    first: u64,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let size = given.element_size().unwrap_or(1);
    for (i, element) in bytes.chunks_exact(size).enumerate() {
        let value = read(given, element);
        if !write(wanted, value, out) {
            let shown = match value {
                Value::Int(v) => v.to_string(),
                Value::Float(v) => v.to_string(),
            };
            let np = numpy_name(wanted).unwrap_or("...");
            let beyond = match (value, largest_finite(wanted)) {
                (Value::Float(v), Some(largest)) => v.is_finite() && v.abs() > largest,
                _ => false,
            };
            let (problem, what_to_do) = if beyond {
                (
                    format!("is beyond {wanted}'s range (±{})", largest_finite(wanted).unwrap_or(f64::NAN)),
                    format!("scale the values, or give {wanted} values"),
                )
            } else if matches!(kind(wanted), Some(Kind::Float(_))) {
                (
                    format!("is not exact in {wanted}"),
                    format!("round them yourself if that is meant: {name}.astype(np.{np})"),
                )
            } else {
                (
                    format!("does not fit in {wanted}"),
                    format!("give values that fit ({name}.astype(np.{np}) would wrap them)"),
                )
            };
            return Err(format!(
                "input '{name}': expected dtype {wanted}, given {given} whose element {} ({shown}) {problem}; {what_to_do}",
                first + i as u64,
            ));
        }
    }
    Ok(())
}

/// The largest finite value of a 16-bit float dtype, whose range a value
/// is checked against.
fn largest_finite(dtype: DType) -> Option<f64> {
    match dtype {
        DType::Float16 => Some(f16::MAX.to_f64()),
        DType::BFloat16 => Some(bf16::MAX.to_f64()),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Kind {
    /// A float of this many bits.
    Float(u8),
    Int,
}

fn kind(dtype: DType) -> Option<Kind> {
    Some(match dtype {
        DType::Float16 | DType::BFloat16 => Kind::Float(16),
        DType::Float32 => Kind::Float(32),
        DType::Float64 => Kind::Float(64),
        DType::Int8
        | DType::Int16
        | DType::Int32
        | DType::Int64
        | DType::UInt8
        | DType::UInt16
        | DType::UInt32
        | DType::UInt64 => Kind::Int,
        DType::Bool | DType::String => return None,
    })
}

/// NumPy's name of a dtype, for an `.astype(np.NAME)` hint: isorun's
/// own name, but `bool_`; none for what NumPy has no dtype of (bfloat16,
/// strings).
fn numpy_name(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::Bool => Some("bool_"),
        DType::BFloat16 | DType::String => None,
        other => Some(other.name()),
    }
}

#[derive(Clone, Copy)]
enum Value {
    Int(i128),
    Float(f64),
}

fn read(dtype: DType, b: &[u8]) -> Value {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    match dtype {
        DType::Float64 => Value::Float(f64::from_le_bytes(arr(8))),
        DType::Float32 => Value::Float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        DType::Float16 => Value::Float(f16::from_le_bytes([b[0], b[1]]).to_f64()),
        DType::BFloat16 => Value::Float(bf16::from_le_bytes([b[0], b[1]]).to_f64()),
        DType::Int8 => Value::Int(i128::from(b[0] as i8)),
        DType::Int16 => Value::Int(i128::from(i16::from_le_bytes([b[0], b[1]]))),
        DType::Int32 => Value::Int(i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        DType::Int64 => Value::Int(i128::from(i64::from_le_bytes(arr(8)))),
        DType::UInt8 => Value::Int(i128::from(b[0])),
        DType::UInt16 => Value::Int(i128::from(u16::from_le_bytes([b[0], b[1]]))),
        DType::UInt32 => Value::Int(i128::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        DType::UInt64 => Value::Int(i128::from(u64::from_le_bytes(arr(8)))),
        // Refused by `allowed`.
        DType::Bool | DType::String => Value::Int(0),
    }
}

/// Appends `value` as `dtype`; `false` where it does not fit or is not exact.
fn write(dtype: DType, value: Value, out: &mut Vec<u8>) -> bool {
    macro_rules! int {
        ($t:ty) => {
            match value {
                Value::Int(v) => match <$t>::try_from(v) {
                    Ok(v) => out.extend(v.to_le_bytes()),
                    Err(_) => return false,
                },
                Value::Float(_) => return false,
            }
        };
    }
    match dtype {
        DType::Float32 => match value {
            // float64 → float32 rounds (and overflows to ±inf), as Keras does.
            Value::Float(v) => out.extend((v as f32).to_le_bytes()),
            Value::Int(v) => {
                let f = v as f32;
                if f as i128 != v {
                    return false;
                }
                out.extend(f.to_le_bytes())
            }
        },
        DType::Float64 => match value {
            Value::Float(v) => out.extend(v.to_le_bytes()),
            Value::Int(v) => {
                let f = v as f64;
                if f as i128 != v {
                    return false;
                }
                out.extend(f.to_le_bytes())
            }
        },
        DType::Float16 | DType::BFloat16 => {
            let Value::Float(v) = value else { return false };
            // Only the other 16-bit float comes here (`allowed`): through
            // f64, which holds both exactly, and back; a value that rounds
            // (or overflows to inf) does not fit.
            let (bytes, back) = if dtype == DType::Float16 {
                let h = f16::from_f64(v);
                (h.to_le_bytes(), h.to_f64())
            } else {
                let h = bf16::from_f64(v);
                (h.to_le_bytes(), h.to_f64())
            };
            if back != v && !(v.is_nan() && back.is_nan()) {
                return false;
            }
            out.extend(bytes)
        }
        DType::Int8 => int!(i8),
        DType::Int16 => int!(i16),
        DType::Int32 => int!(i32),
        DType::Int64 => int!(i64),
        DType::UInt8 => int!(u8),
        DType::UInt16 => int!(u16),
        DType::UInt32 => int!(u32),
        DType::UInt64 => int!(u64),
        DType::Bool | DType::String => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cast(given: DType, wanted: DType, bytes: &[u8]) -> Result<Vec<u8>, String> {
        allowed("x", given, wanted)?;
        let mut out = Vec::new();
        convert("x", given, wanted, bytes, 0, &mut out)?;
        Ok(out)
    }

    #[test]
    fn float64_becomes_float32_even_out_of_range() {
        let bytes: Vec<u8> = [1.5f64, 1e300].iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = cast(DType::Float64, DType::Float32, &bytes).unwrap();
        assert_eq!(out[..4], 1.5f32.to_le_bytes());
        assert_eq!(out[4..], f32::INFINITY.to_le_bytes());
    }

    #[test]
    fn integers_cast_where_every_value_fits() {
        let bytes: Vec<u8> = [7i64, -3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = cast(DType::Int64, DType::Int32, &bytes).unwrap();
        assert_eq!(out, [7i32.to_le_bytes(), (-3i32).to_le_bytes()].concat());
        let big: Vec<u8> = [1i64, 3_000_000_000].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            cast(DType::Int64, DType::Int32, &big).unwrap_err(),
            "input 'x': expected dtype int32, given int64 whose element 1 (3000000000) does not fit in int32; \
             give values that fit (x.astype(np.int32) would wrap them)"
        );
        let inexact: Vec<u8> = (1i64 << 24 | 1).to_le_bytes().to_vec();
        assert!(cast(DType::Int64, DType::Float32, &inexact).unwrap_err().contains("is not exact in float32"));
        assert!(cast(DType::Int64, DType::Float64, &inexact).is_ok());
    }

    #[test]
    fn floats_never_become_integers() {
        assert_eq!(
            allowed("x", DType::Float64, DType::Int64).unwrap_err(),
            "input 'x': expected dtype int64, given float64; convert it first: x.astype(np.int64)"
        );
        assert!(allowed("x", DType::Float32, DType::Float16).is_err());
        assert!(allowed("x", DType::String, DType::Float32).is_err());
    }

    #[test]
    fn the_two_half_floats_convert_only_where_every_value_is_exact() {
        let bf = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect() };
        // 1.5 and -256 are exact in both; inf and NaN stay what they are.
        let out = cast(DType::BFloat16, DType::Float16, &bf(&[1.5, -256.0, f32::INFINITY])).unwrap();
        let halves: Vec<f32> = out.chunks(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        assert_eq!(halves, [1.5, -256.0, f32::INFINITY]);
        // bfloat16's 1e10 used to become float16's inf without a word.
        assert_eq!(
            cast(DType::BFloat16, DType::Float16, &bf(&[1.0, 1e10])).unwrap_err(),
            "input 'x': expected dtype float16, given bfloat16 whose element 1 (9999220736) is beyond \
             float16's range (±65504); scale the values, or give float16 values"
        );
        // float16 holds 11 significant bits, bfloat16 8: 1 + 2^-10 would round.
        let h: Vec<u8> = [1.0f32, 1.0 + 1.0 / 1024.0].iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let error = cast(DType::Float16, DType::BFloat16, &h).unwrap_err();
        assert!(error.contains("element 1 (1.0009765625) is not exact in bfloat16"), "{error}");
        assert!(cast(DType::Float16, DType::BFloat16, &h[..2]).is_ok());
    }
}
