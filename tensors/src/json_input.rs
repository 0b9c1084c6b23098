//! Inputs written as JSON (`.json` files, stdin, `--input NAME=@JSON`, and
//! `pipe` requests): nested lists whose shape is their nesting, converted to
//! the dtype the signature declares, and only where that is exact: a JSON
//! integer into float32 is fine, 1.5 into int64 is an error naming the input.
//! Floats also take "NaN", "Infinity" and "-Infinity"; strings take UTF-8
//! text or `{"base64": "..."}`.

use base64::Engine;
use half::{bf16, f16};
use isorun_protocol::{DType, ErrorKind, ModelError, SignatureInfo, Tensor, TensorSpec};
use serde_json::Value;
use std::path::Path;

/// The signature `key` of the meta graph tagged `tags`, read from
/// `saved_model.pb` without TensorFlow (JSON inputs need its dtypes).
pub fn signature_of(dir: &Path, tags: &[String], key: &str) -> Result<SignatureInfo, ModelError> {
    let model_error = |e: isorun_tfproto::SavedModelError| ModelError::new(e.kind(), e.to_string());
    let graphs = isorun_tfproto::read_saved_model(dir).map_err(model_error)?;
    let graph = isorun_tfproto::find_meta_graph(&graphs, tags, dir).map_err(model_error)?;
    // Only the signature asked for: others may hold dtypes isorun cannot carry.
    let (info, _) = isorun_tfproto::signature(&graph.def, key).map_err(model_error)?;
    Ok(info)
}

/// Converts JSON inputs for a signature. The name `""` stands for a bare
/// nested list, which fits a signature with exactly one input.
pub fn tensors_for_signature(
    signature: &SignatureInfo,
    json: &[(String, Value)],
) -> Result<Vec<(String, Tensor)>, ModelError> {
    let mismatch = |message: String| ModelError::new(ErrorKind::InputMismatch, message);
    let takes = || signature.inputs.iter().map(TensorSpec::describe).collect::<Vec<_>>().join(", ");
    json.iter()
        .map(|(name, value)| {
            let spec = if name.is_empty() {
                match signature.inputs.as_slice() {
                    [only] => only,
                    _ => {
                        return Err(mismatch(format!(
                            "a bare JSON list fits a signature with one input; '{}' takes: {}",
                            signature.key,
                            takes()
                        )))
                    }
                }
            } else {
                signature.inputs.iter().find(|s| &s.name == name).ok_or_else(|| {
                    mismatch(format!("unknown input '{name}'; signature '{}' takes: {}", signature.key, takes()))
                })?
            };
            Ok((spec.name.clone(), tensor_from_json(spec, value).map_err(mismatch)?))
        })
        .collect()
}

/// Converts one JSON input for the signature input `spec`.
pub fn tensor_from_json(spec: &TensorSpec, value: &Value) -> Result<Tensor, String> {
    let name = &spec.name;
    let mut shape = Vec::new();
    let mut probe = value;
    while let Value::Array(items) = probe {
        shape.push(items.len() as u64);
        match items.first() {
            Some(first) => probe = first,
            None => break,
        }
    }
    let mut leaves = Vec::new();
    flatten(value, &shape, &mut leaves).map_err(|e| format!("input '{name}': {e}"))?;
    let at = |i: usize| format!("input '{name}': element {i}");
    if spec.dtype == DType::String {
        let strings = leaves
            .iter()
            .enumerate()
            .map(|(i, v)| {
                string_bytes(v).ok_or_else(|| format!("{} is {v}, not a string or {{\"base64\": ...}}", at(i)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Tensor::strings(shape, strings));
    }
    let mut bytes = Vec::with_capacity(leaves.len() * spec.dtype.element_size().unwrap_or(1));
    for (i, leaf) in leaves.iter().enumerate() {
        let wrong = || format!("{} is {leaf}, which is not exactly a {}", at(i), spec.dtype);
        match spec.dtype {
            DType::Float32 => bytes.extend((float(leaf).ok_or_else(wrong)? as f32).to_le_bytes()),
            DType::Float64 => bytes.extend(float(leaf).ok_or_else(wrong)?.to_le_bytes()),
            DType::Float16 => bytes.extend(f16::from_f64(float(leaf).ok_or_else(wrong)?).to_le_bytes()),
            DType::BFloat16 => bytes.extend(bf16::from_f64(float(leaf).ok_or_else(wrong)?).to_le_bytes()),
            DType::Bool => bytes.push(u8::from(leaf.as_bool().ok_or_else(wrong)?)),
            DType::Int8 => {
                bytes.extend(i8::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::Int16 => {
                bytes.extend(i16::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::Int32 => {
                bytes.extend(i32::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::Int64 => {
                bytes.extend(i64::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::UInt8 => {
                bytes.extend(u8::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::UInt16 => {
                bytes.extend(u16::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::UInt32 => {
                bytes.extend(u32::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::UInt64 => {
                bytes.extend(u64::try_from(integer(leaf).ok_or_else(wrong)?).map_err(|_| wrong())?.to_le_bytes())
            }
            DType::String => unreachable!("handled above"),
        }
    }
    Ok(Tensor::dense(spec.dtype, shape, bytes))
}

/// Collects the leaves in row-major order, checking the nesting is rectangular.
fn flatten<'a>(value: &'a Value, shape: &[u64], out: &mut Vec<&'a Value>) -> Result<(), String> {
    match (value, shape.split_first()) {
        (Value::Array(items), Some((&n, rest))) => {
            if items.len() as u64 != n {
                return Err(format!("nested lists are ragged (a list of {} where {n} were expected)", items.len()));
            }
            items.iter().try_for_each(|item| flatten(item, rest, out))
        }
        (Value::Array(_), None) => Err("nested lists are ragged (a list where a value was expected)".into()),
        (_, Some(_)) => Err(format!("nested lists are ragged ({value} where a list was expected)")),
        (leaf, None) => {
            out.push(leaf);
            Ok(())
        }
    }
}

fn float(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// An integer, from a JSON integer or a float with no fractional part.
fn integer(value: &Value) -> Option<i128> {
    let Value::Number(n) = value else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 1.8e19).then_some(f as i128)
}

fn string_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Object(map) if map.len() == 1 => {
            let encoded = map.get("base64")?.as_str()?;
            base64::engine::general_purpose::STANDARD.decode(encoded).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::TensorData;
    use serde_json::json;

    fn spec(dtype: DType) -> TensorSpec {
        TensorSpec { name: "x".into(), dtype, shape: None }
    }

    #[test]
    fn nesting_gives_the_shape_and_integers_fit_floats() {
        let t = tensor_from_json(&spec(DType::Float32), &json!([[1, 2.5], [3, "NaN"]])).unwrap();
        assert_eq!(t.shape, [2, 2]);
        let TensorData::Dense(bytes) = &t.data else { panic!() };
        assert_eq!(&bytes[..8], [1f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat());
        let scalar = tensor_from_json(&spec(DType::Int64), &json!(7)).unwrap();
        assert_eq!(scalar.shape, Vec::<u64>::new());
        let empty = tensor_from_json(&spec(DType::Int64), &json!([])).unwrap();
        assert_eq!(empty.shape, [0]);
    }

    #[test]
    fn inexact_values_are_errors_naming_the_input() {
        assert_eq!(
            tensor_from_json(&spec(DType::Int64), &json!([1, 1.5])).unwrap_err(),
            "input 'x': element 1 is 1.5, which is not exactly a int64"
        );
        assert!(tensor_from_json(&spec(DType::UInt8), &json!([256])).unwrap_err().contains("256"));
        assert!(tensor_from_json(&spec(DType::Int64), &json!(2.0)).is_ok());
        assert!(tensor_from_json(&spec(DType::Bool), &json!([1])).is_err());
        assert_eq!(
            tensor_from_json(&spec(DType::Float32), &json!([[1, 2], [3]])).unwrap_err(),
            "input 'x': nested lists are ragged (a list of 1 where 2 were expected)"
        );
    }

    #[test]
    fn strings_are_text_or_base64() {
        let t = tensor_from_json(&spec(DType::String), &json!(["hi", {"base64": "//4="}])).unwrap();
        assert_eq!(t, Tensor::strings(vec![2], vec![b"hi".to_vec(), vec![0xff, 0xfe]]));
        assert!(tensor_from_json(&spec(DType::String), &json!([1])).is_err());
    }
}
