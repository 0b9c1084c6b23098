//! Inputs written as JSON (`.json` files, stdin, `--input NAME=@JSON`, and
//! `pipe` requests): nested lists whose shape is their nesting, converted to
//! the dtype the signature declares, and only where that is exact: a JSON
//! integer into float32 is fine, 1.5 into int64 is an error naming the input.
//! Floats also take "NaN", "Infinity" and "-Infinity"; strings take UTF-8
//! text or `{"base64": "..."}`. The grammar of a value (leaves, shape,
//! nesting limits) is `json_value`'s, which `eval`'s JSON Lines reads too.

use crate::json_value::{Leaf, Node, WalkError, Walker};
use half::{bf16, f16};
use isorun_protocol::{DType, ErrorKind, ModelError, SignatureInfo, Tensor, TensorSpec};
use serde_json::Value;
use std::path::Path;

/// The signature `key` of the meta graph tagged `tags`, read from
/// `saved_model.pb` without TensorFlow (JSON inputs need its dtypes); for
/// an `.onnx` file, its graph's inputs and outputs (`tags` and `key` do not
/// apply: an ONNX model has one graph), read without ONNX Runtime.
pub fn signature_of(dir: &Path, tags: &[String], key: &str) -> Result<SignatureInfo, ModelError> {
    if is_onnx_file(dir) {
        let model = isorun_onnxproto::read_model(dir)
            .map_err(|e| ModelError::new(ErrorKind::LoadFailed, isorun_protocol::with_causes(&e)))?;
        return model.signature();
    }
    let model_error = |e: isorun_tfproto::SavedModelError| ModelError::new(e.kind(), e.to_string());
    let graphs = isorun_tfproto::read_saved_model(dir).map_err(model_error)?;
    let graph = isorun_tfproto::find_meta_graph(&graphs, tags, dir).map_err(model_error)?;
    // Only the signature asked for: others may hold dtypes isorun cannot carry.
    let (info, _) = isorun_tfproto::signature(&graph.def, key).map_err(model_error)?;
    Ok(info)
}

/// Whether `path` names an ONNX model (a file ending `.onnx`) rather than a SavedModel folder.
pub fn is_onnx_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx")) && !path.is_dir()
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

/// Converts one JSON input for the signature input `spec`: walked by the
/// grammar JSON Lines uses too (`json_value`), each leaf converted as it is
/// met.
pub fn tensor_from_json(spec: &TensorSpec, value: &Value) -> Result<Tensor, String> {
    let name = &spec.name;
    let at = |i: u64, node: &Value| format!("input '{name}': element {i} is {}", node.describe());
    let (mut strings, mut bytes) = (Vec::new(), Vec::new());
    let (mut leaves, mut wrong) = (0u64, None);
    let mut walker = Walker::new("", |node: &Value, leaf| {
        let i = leaves;
        leaves += 1;
        if wrong.is_some() {
            return;
        }
        if spec.dtype == DType::String {
            match leaf {
                Leaf::String(s) => strings.push(s.into_bytes()),
                Leaf::Bytes(b) => strings.push(b),
                _ => wrong = Some(format!("{}, not a string or {{\"base64\": ...}}", at(i, node))),
            }
            return;
        }
        if !push_element(spec.dtype, &leaf, &mut bytes) {
            wrong = Some(format!("{}, which is not exactly a {}", at(i, node), spec.dtype));
        }
    });
    match walker.walk(value, 0) {
        Ok(()) => {}
        Err(WalkError::Ragged(detail)) => return Err(format!("input '{name}': nested lists are ragged ({detail})")),
        Err(WalkError::Syntax(reason)) => return Err(format!("input '{name}': {reason}")),
    }
    let shape = walker.dims();
    if let Some(reason) = wrong {
        return Err(reason);
    }
    Ok(match spec.dtype {
        DType::String => Tensor::strings(shape, strings),
        dtype => Tensor::dense(dtype, shape, bytes),
    })
}

/// Appends `leaf` as one element of `dtype` (not a string); false when it
/// is not exactly one: a JSON integer fits a float, 1.5 does not fit int64.
fn push_element(dtype: DType, leaf: &Leaf, bytes: &mut Vec<u8>) -> bool {
    fn int<T: TryFrom<i128>>(leaf: &Leaf) -> Option<T> {
        T::try_from(integer(leaf)?).ok()
    }
    let mut put = |element: &[u8]| {
        bytes.extend_from_slice(element);
        true
    };
    let float = leaf.as_f64();
    match dtype {
        DType::Float32 => float.is_some_and(|f| put(&(f as f32).to_le_bytes())),
        DType::Float64 => float.is_some_and(|f| put(&f.to_le_bytes())),
        DType::Float16 => float.is_some_and(|f| put(&f16::from_f64(f).to_le_bytes())),
        DType::BFloat16 => float.is_some_and(|f| put(&bf16::from_f64(f).to_le_bytes())),
        DType::Bool => matches!(leaf, Leaf::Bool(b) if put(&[u8::from(*b)])),
        DType::Int8 => int::<i8>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::Int16 => int::<i16>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::Int32 => int::<i32>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::Int64 => int::<i64>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::UInt8 => int::<u8>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::UInt16 => int::<u16>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::UInt32 => int::<u32>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::UInt64 => int::<u64>(leaf).is_some_and(|v| put(&v.to_le_bytes())),
        DType::String => false,
    }
}

/// An integer, from a JSON integer or a float with no fractional part.
fn integer(leaf: &Leaf) -> Option<i128> {
    let Leaf::Number(n) = leaf else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 1.8e19).then_some(f as i128)
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
