//! The JSON Lines of `isorun pipe`: a request line `{"id": ..., "inputs":
//! {NAME: nested list}}` becomes tensors for the signature, outputs become an
//! answer line `{"id": ..., "outputs": {NAME: {dtype, shape, values}}}`, and
//! anything wrong becomes an error line `{"id": ..., "error": {kind, code?,
//! message}}`. One module, so that `pipe` and the benchmark's in-process
//! floor (`isorun-worker --in-process --pipe`) read and write the very same
//! lines. Requests that queue up can be run as one batch ([`batchable`],
//! then [`crate::batch::join`] and [`crate::batch::split`]): each answer
//! holds only its own request's rows.

use crate::json_input::tensors_for_signature;
use crate::values::tensor_values;
use isorun_protocol::{SignatureInfo, Tensor, TensorData};
use serde_json::{json, Map, Value};

/// A request line taken apart: its id (null when it has none) and its
/// tensors, or the error line that answers it.
pub type Request = Result<(Value, Vec<(String, Tensor)>), Value>;

/// Parses one request line for `signature`.
pub fn parse_request(signature: &SignatureInfo, line: &[u8]) -> Request {
    let request: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => return Err(error_line(Value::Null, "bad_request", None, &format!("not valid JSON: {e}"))),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(Value::Object(inputs)) = request.get("inputs") else {
        let message = "expected {\"id\": ..., \"inputs\": {NAME: nested list, ...}}";
        return Err(error_line(id, "bad_request", None, message));
    };
    let inputs: Vec<(String, Value)> = inputs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    match tensors_for_signature(signature, &inputs) {
        Ok(tensors) => Ok((id, tensors)),
        Err(e) => Err(error_line(id, e.kind.name(), None, &e.message)),
    }
}

/// The answer line for `outputs`.
pub fn answer_line(id: Value, outputs: &[(String, Tensor)]) -> Value {
    let mut answer = Map::new();
    for (name, tensor) in outputs {
        let values = match tensor_values(tensor) {
            Ok(values) => values,
            Err(message) => return error_line(id, "output_write", None, &format!("output {name}: {message}")),
        };
        answer.insert(name.clone(), json!({ "dtype": tensor.dtype.name(), "shape": tensor.shape, "values": values }));
    }
    json!({ "id": id, "outputs": answer })
}

/// An error line.
pub fn error_line(id: Value, kind: &str, code: Option<&str>, message: &str) -> Value {
    let mut error = Map::new();
    error.insert("kind".into(), json!(kind));
    if let Some(code) = code {
        error.insert("code".into(), json!(code));
    }
    error.insert("message".into(), json!(message));
    json!({ "id": id, "error": error })
}

/// The rows of each request when `requests` can run as one batch: every
/// request gives the same inputs in the same order, with the same dtypes
/// and the same dimensions after the first, all of a request's inputs have
/// the same first dimension, and the signature leaves every input's first
/// dimension unknown (a model built for a fixed batch takes no other).
/// `None` when they cannot.
pub fn batchable(signature: &SignatureInfo, requests: &[&[(String, Tensor)]]) -> Option<Vec<u64>> {
    let first = requests.first()?;
    let open_batch = |name: &str| {
        signature
            .inputs
            .iter()
            .find(|spec| spec.name == name)
            .is_some_and(|spec| spec.shape.as_ref().is_none_or(|dims| dims.first().is_some_and(Option::is_none)))
    };
    if first.is_empty() || !first.iter().all(|(name, _)| open_batch(name)) {
        return None;
    }
    let mut rows = Vec::with_capacity(requests.len());
    for request in requests {
        if request.len() != first.len() {
            return None;
        }
        let mut request_rows = None;
        for ((name, tensor), (first_name, first_tensor)) in request.iter().zip(first.iter()) {
            let same = name == first_name
                && tensor.dtype == first_tensor.dtype
                && !tensor.shape.is_empty()
                && tensor.shape.len() == first_tensor.shape.len()
                && tensor.shape[1..] == first_tensor.shape[1..]
                && matches!(
                    (&tensor.data, &first_tensor.data),
                    (TensorData::Dense(_), TensorData::Dense(_)) | (TensorData::Strings(_), TensorData::Strings(_))
                );
            if !same || *request_rows.get_or_insert(tensor.shape[0]) != tensor.shape[0] {
                return None;
            }
        }
        rows.push(request_rows?);
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{join, split};
    use isorun_protocol::{DType, TensorSpec};

    fn signature(first: Option<u64>) -> SignatureInfo {
        SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![
                TensorSpec { name: "x".into(), dtype: DType::Float32, shape: Some(vec![first, Some(2)]) },
                TensorSpec { name: "k".into(), dtype: DType::String, shape: Some(vec![first]) },
            ],
            outputs: Vec::new(),
        }
    }

    fn request(signature: &SignatureInfo, line: &str) -> Vec<(String, Tensor)> {
        parse_request(signature, line.as_bytes()).unwrap().1
    }

    #[test]
    fn queued_requests_run_as_one_batch_and_each_answer_holds_its_own_rows() {
        let sig = signature(None);
        let a = request(&sig, r#"{"id": 1, "inputs": {"x": [[1, 2]], "k": ["a"]}}"#);
        let b = request(&sig, r#"{"id": 2, "inputs": {"x": [[3, 4], [5, 6]], "k": ["b", "c"]}}"#);
        let rows = batchable(&sig, &[&a, &b]).expect("same inputs, open first dimension");
        assert_eq!(rows, [1, 2]);
        let joined = join(vec![a.clone(), b.clone()], &rows).unwrap();
        assert_eq!(joined[0].1.shape, [3, 2]);
        // A model that echoes its inputs: the split gives each request back.
        let parts = split(joined, &rows).unwrap();
        assert_eq!(parts, [a, b]);
    }

    #[test]
    fn requests_that_differ_or_a_fixed_batch_run_alone() {
        let sig = signature(None);
        let a = request(&sig, r#"{"inputs": {"x": [[1, 2]], "k": ["a"]}}"#);
        let only_x = request(&sig, r#"{"inputs": {"x": [[1, 2]]}}"#);
        let swapped = request(&sig, r#"{"inputs": {"k": ["a"], "x": [[1, 2]]}}"#);
        let ragged = request(&sig, r#"{"inputs": {"x": [[1, 2], [3, 4]], "k": ["a"]}}"#);
        assert!(batchable(&sig, &[&a, &only_x]).is_none());
        assert!(batchable(&sig, &[&a, &swapped]).is_none());
        assert!(batchable(&sig, &[&a, &ragged]).is_none(), "x has 2 rows and k 1");
        let fixed = signature(Some(1));
        let a = request(&fixed, r#"{"inputs": {"x": [[1, 2]], "k": ["a"]}}"#);
        assert!(batchable(&fixed, &[&a, &a]).is_none());
    }

    #[test]
    fn an_output_without_a_row_per_input_row_cannot_be_split() {
        let outputs = vec![("loss".to_string(), Tensor::dense(DType::Float32, vec![], vec![0; 4]))];
        let error = split(outputs, &[1, 2]).unwrap_err();
        assert!(error.contains("'loss'"), "{error}");
    }

    #[test]
    fn bad_lines_are_error_lines_that_keep_the_id() {
        let sig = signature(None);
        let error = parse_request(&sig, b"{nope").unwrap_err();
        assert_eq!(error["error"]["kind"], "bad_request");
        let error = parse_request(&sig, br#"{"id": "q7", "inputs": {"y": [1]}}"#).unwrap_err();
        assert_eq!(error["id"], "q7");
        assert!(error["error"]["message"].as_str().unwrap().contains("unknown input 'y'"));
    }
}
