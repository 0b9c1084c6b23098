//! `.onnx` files are read by the supervisor (`ls`, `inspect`, a run's
//! plan) without ONNX Runtime: any bytes give a model's view or an error,
//! within the allocation bound, whatever lengths they claim.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| common::bounded("onnx_model", data, || run(data)));

fn run(data: &[u8]) {
    let source = std::io::Cursor::new(data);
    let Ok(model) = isorun_onnxproto::parse_model(source, data.len() as u64, Path::new("fuzz/model.onnx")) else {
        return;
    };
    for value in model.inputs.iter().chain(&model.outputs) {
        let _ = (value.value_type.to_string(), value.value_type.tensor_elem().map(|e| (e.dtype(), e.name())));
    }
    for opset in &model.opsets {
        let _ = opset.domain_name();
    }
}
