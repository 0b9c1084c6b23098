//! Checks inputs against a signature before TensorFlow sees them, so that a
//! wrong name, dtype or shape is an error that names the input, what the
//! model expects and what was given. The supervisor decides with it before
//! any worker starts (where it can read the signature); the worker again.

use crate::{ErrorKind, ModelError, SignatureInfo, Tensor, TensorSpec};

/// The given inputs in the signature's input order, or the first problem found.
pub fn match_inputs<'a>(
    signature: &SignatureInfo,
    inputs: &'a [(String, Tensor)],
) -> Result<Vec<&'a Tensor>, ModelError> {
    let mismatch = |message: String| ModelError::new(ErrorKind::InputMismatch, message);
    let expected = || signature.inputs.iter().map(TensorSpec::describe).collect::<Vec<_>>().join(", ");
    for (name, _) in inputs {
        if !signature.inputs.iter().any(|s| &s.name == name) {
            return Err(mismatch(format!(
                "unknown input '{name}'; signature '{}' takes: {}",
                signature.key,
                expected()
            )));
        }
    }
    let mut ordered = Vec::with_capacity(signature.inputs.len());
    for spec in &signature.inputs {
        let Some((_, tensor)) = inputs.iter().find(|(name, _)| name == &spec.name) else {
            return Err(mismatch(format!(
                "missing input '{}' ({}, {}); signature '{}' takes: {}",
                spec.name,
                spec.dtype,
                spec.shape_text(),
                signature.key,
                expected()
            )));
        };
        check_one(spec, tensor).map_err(mismatch)?;
        ordered.push(tensor);
    }
    Ok(ordered)
}

fn check_one(spec: &TensorSpec, tensor: &Tensor) -> Result<(), String> {
    let given_shape = format!("[{}]", tensor.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", "));
    if spec.dtype != tensor.dtype {
        return Err(format!("input '{}': expected dtype {}, given {}", spec.name, spec.dtype, tensor.dtype));
    }
    let Some(dims) = &spec.shape else { return Ok(()) };
    if dims.len() != tensor.shape.len() {
        return Err(format!(
            "input '{}': expected shape {} (rank {}), given {} (rank {})",
            spec.name,
            spec.shape_text(),
            dims.len(),
            given_shape,
            tensor.shape.len()
        ));
    }
    for (axis, (want, &got)) in dims.iter().zip(&tensor.shape).enumerate() {
        if let Some(want) = want {
            if *want != got {
                return Err(format!(
                    "input '{}': expected shape {}, given {} (dimension {axis} is {got}, expected {want})",
                    spec.name,
                    spec.shape_text(),
                    given_shape
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn signature() -> SignatureInfo {
        SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![
                TensorSpec { name: "ids".into(), dtype: DType::Int64, shape: Some(vec![None]) },
                TensorSpec { name: "x".into(), dtype: DType::Float32, shape: Some(vec![None, Some(3)]) },
            ],
            outputs: vec![],
        }
    }

    fn f32s(shape: Vec<u64>) -> Tensor {
        let n = Tensor::element_count(&shape).unwrap() as usize;
        Tensor::dense(DType::Float32, shape, vec![0; n * 4])
    }

    fn ids() -> (String, Tensor) {
        ("ids".into(), Tensor::dense(DType::Int64, vec![2], vec![0; 16]))
    }

    fn message(inputs: Vec<(String, Tensor)>) -> String {
        let err = match_inputs(&signature(), &inputs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InputMismatch);
        err.message
    }

    #[test]
    fn inputs_come_back_in_signature_order() {
        let inputs = vec![("x".into(), f32s(vec![2, 3])), ids()];
        let ordered = match_inputs(&signature(), &inputs).unwrap();
        assert_eq!(ordered[0].dtype, DType::Int64);
        assert_eq!(ordered[1].dtype, DType::Float32);
    }

    #[test]
    fn each_mismatch_names_input_expected_and_given() {
        assert_eq!(
            message(vec![ids(), ("x".into(), f32s(vec![2, 3])), ("y".into(), f32s(vec![1]))]),
            "unknown input 'y'; signature 'serving_default' takes: ids (int64, [?]), x (float32, [?, 3])"
        );
        assert_eq!(
            message(vec![ids()]),
            "missing input 'x' (float32, [?, 3]); signature 'serving_default' takes: ids (int64, [?]), x (float32, [?, 3])"
        );
        assert_eq!(
            message(vec![ids(), ("x".into(), Tensor::dense(DType::Float64, vec![2, 3], vec![0; 48]))]),
            "input 'x': expected dtype float32, given float64"
        );
        assert_eq!(
            message(vec![ids(), ("x".into(), f32s(vec![6]))]),
            "input 'x': expected shape [?, 3] (rank 2), given [6] (rank 1)"
        );
        assert_eq!(
            message(vec![ids(), ("x".into(), f32s(vec![2, 4]))]),
            "input 'x': expected shape [?, 3], given [2, 4] (dimension 1 is 4, expected 3)"
        );
    }
}
