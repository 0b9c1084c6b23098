//! Tensor elements as JSON (`--values`): nested lists in the tensor's shape;
//! floats in the shortest form that reads back to the same value at their
//! own width; NaN and infinities as the strings `"NaN"`, `"Infinity"`,
//! `"-Infinity"`; 64-bit integers exactly; strings as UTF-8 where valid,
//! otherwise `{"base64": "..."}`.

use base64::Engine;
use half::{bf16, f16};
use isorun_protocol::{DType, Tensor, TensorData};
use serde_json::{Number, Value};

/// The most JSON values (lists and elements) one tensor's `--values` may
/// take: each costs the supervisor tens of bytes, and a worker chooses the
/// shape (`[2^40, 0]` holds no element but 2^40 empty lists).
pub const MAX_JSON_VALUES: u64 = 1 << 24;

/// How many JSON values (every list at every level, and the elements) the
/// tensor's nested form takes, saturating.
pub fn json_value_count(shape: &[u64]) -> u64 {
    let mut lists = 1u64;
    let mut total = 0u64;
    for &dim in shape {
        total = total.saturating_add(lists);
        lists = lists.saturating_mul(dim);
    }
    total.saturating_add(lists)
}

/// The tensor's elements as nested JSON lists (a bare value for a scalar),
/// or why they are too many to give as JSON.
pub fn tensor_values(tensor: &Tensor) -> Result<Value, String> {
    let count = json_value_count(&tensor.shape);
    if count > MAX_JSON_VALUES {
        return Err(format!(
            "shape {:?} makes {count} JSON values, more than the {MAX_JSON_VALUES} isorun gives as values; write the \
             output as .npy instead (--output-dir)",
            tensor.shape
        ));
    }
    let flat: Vec<Value> = match &tensor.data {
        TensorData::Strings(strings) => strings.iter().map(|s| string_value(s)).collect(),
        TensorData::Dense(bytes) => dense_values(tensor.dtype, bytes),
        TensorData::Shared(_) => Vec::new(),
    };
    Ok(nest(&tensor.shape, &mut flat.into_iter()))
}

fn nest(shape: &[u64], flat: &mut impl Iterator<Item = Value>) -> Value {
    match shape.split_first() {
        None => flat.next().unwrap_or(Value::Null),
        Some((&n, rest)) => Value::Array((0..n).map(|_| nest(rest, flat)).collect()),
    }
}

fn string_value(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

/// A float as JSON, or one of the strings for values JSON cannot hold.
/// `text` is the shortest decimal that reads back to the same value at the
/// float's own width.
fn float_value(value: f64, text: impl FnOnce() -> String) -> Value {
    if value.is_nan() {
        Value::String("NaN".into())
    } else if value.is_infinite() {
        Value::String(if value > 0.0 { "Infinity" } else { "-Infinity" }.into())
    } else {
        let text = text();
        // The shortest round-trip text, kept as written (serde_json's
        // arbitrary_precision keeps the digits instead of widening to f64).
        serde_json::from_str::<Number>(&text).map(Value::Number).unwrap_or(Value::Null)
    }
}

/// Shortest decimal for a 16-bit float: the fewest significant digits that
/// parse back to the same bits.
fn shortest_half(value: f32, back: impl Fn(f32) -> bool) -> String {
    for digits in 1..=9 {
        let text = format!("{value:.*e}", digits - 1);
        if let Ok(parsed) = text.parse::<f32>() {
            if back(parsed) {
                return plain(parsed_text(&text));
            }
        }
    }
    value.to_string()
}

fn parsed_text(text: &str) -> f64 {
    text.parse::<f64>().unwrap_or(0.0)
}

/// A decimal in plain notation for moderate magnitudes, as `f64` prints it.
fn plain(value: f64) -> String {
    let text = format!("{value}");
    if text.contains('.') || text.contains('e') || text.contains("inf") || text.contains("NaN") {
        text
    } else {
        format!("{text}.0")
    }
}

fn dense_values(dtype: DType, bytes: &[u8]) -> Vec<Value> {
    macro_rules! ints {
        ($t:ty, $n:expr) => {
            bytes.chunks_exact($n).map(|c| Value::from(<$t>::from_le_bytes(c.try_into().unwrap()))).collect()
        };
    }
    match dtype {
        DType::Float32 => bytes
            .chunks_exact(4)
            .map(|c| {
                let v = f32::from_le_bytes(c.try_into().unwrap());
                float_value(f64::from(v), || ryu_like_f32(v))
            })
            .collect(),
        DType::Float64 => bytes
            .chunks_exact(8)
            .map(|c| {
                let v = f64::from_le_bytes(c.try_into().unwrap());
                float_value(v, || plain(v))
            })
            .collect(),
        DType::Float16 => bytes
            .chunks_exact(2)
            .map(|c| {
                let v = f16::from_le_bytes([c[0], c[1]]);
                float_value(v.to_f64(), || shortest_half(v.to_f32(), |p| f16::from_f32(p) == v))
            })
            .collect(),
        DType::BFloat16 => bytes
            .chunks_exact(2)
            .map(|c| {
                let v = bf16::from_le_bytes([c[0], c[1]]);
                float_value(v.to_f64(), || shortest_half(v.to_f32(), |p| bf16::from_f32(p) == v))
            })
            .collect(),
        DType::Int8 => ints!(i8, 1),
        DType::Int16 => ints!(i16, 2),
        DType::Int32 => ints!(i32, 4),
        DType::Int64 => ints!(i64, 8),
        DType::UInt8 => ints!(u8, 1),
        DType::UInt16 => ints!(u16, 2),
        DType::UInt32 => ints!(u32, 4),
        DType::UInt64 => ints!(u64, 8),
        DType::Bool => bytes.iter().map(|&b| Value::Bool(b != 0)).collect(),
        DType::String => Vec::new(),
    }
}

/// Shortest round-trip text of an `f32` (Rust's `Display` for `f32` is exactly that).
fn ryu_like_f32(v: f32) -> String {
    let text = format!("{v}");
    if text.contains('.') || text.contains('e') {
        text
    } else {
        format!("{text}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32], shape: Vec<u64>) -> Tensor {
        Tensor::dense(DType::Float32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    #[test]
    fn floats_are_shortest_for_their_width_and_specials_are_strings() {
        let t = f32s(&[0.1, 1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-30], vec![2, 3]);
        assert_eq!(
            serde_json::to_string(&tensor_values(&t).unwrap()).unwrap(),
            r#"[[0.1,1.0,"NaN"],["Infinity","-Infinity",1e-30]]"#
        );
        let h = Tensor::dense(
            DType::Float16,
            vec![2],
            [f16::from_f32(0.1), f16::from_f32(-2.5)].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        assert_eq!(serde_json::to_string(&tensor_values(&h).unwrap()).unwrap(), "[0.1,-2.5]");
    }

    #[test]
    fn int64_exact_bools_and_scalars() {
        let t = Tensor::dense(DType::Int64, vec![2], [i64::MAX, -1].iter().flat_map(|v| v.to_le_bytes()).collect());
        assert_eq!(serde_json::to_string(&tensor_values(&t).unwrap()).unwrap(), "[9223372036854775807,-1]");
        let b = Tensor::dense(DType::Bool, vec![], vec![1]);
        assert_eq!(tensor_values(&b).unwrap(), Value::Bool(true));
    }

    #[test]
    fn strings_are_utf8_or_base64() {
        let t = Tensor::strings(vec![2], vec![b"caf\xc3\xa9".to_vec(), b"\xff\xfe".to_vec()]);
        assert_eq!(serde_json::to_string(&tensor_values(&t).unwrap()).unwrap(), r#"["café",{"base64":"//4="}]"#);
    }

    #[test]
    fn shapes_that_make_too_many_json_values_are_refused() {
        let empty = Tensor::dense(DType::Float32, vec![1 << 40, 0], Vec::new());
        let error = tensor_values(&empty).unwrap_err();
        assert!(error.contains("[1099511627776, 0]") && error.contains("--output-dir"), "{error}");
        assert_eq!(json_value_count(&[]), 1);
        assert_eq!(json_value_count(&[2, 3]), 1 + 2 + 6);
        assert_eq!(json_value_count(&[u64::MAX, u64::MAX, 2]), u64::MAX);
        let fine = Tensor::dense(DType::Float32, vec![3, 0], Vec::new());
        assert_eq!(tensor_values(&fine).unwrap().to_string(), "[[],[],[]]");
    }
}
