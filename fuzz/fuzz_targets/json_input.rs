//! JSON inputs are user input: any JSON converts to a tensor of each dtype
//! that agrees with its shape, or to an error; never a panic.

#![no_main]

mod common;

use isorun_protocol::{DType, TensorSpec};
use isorun_tensors::json_input::tensor_from_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("json_input", data, || run(data)));

fn run(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    for dtype in DType::ALL {
        let spec = TensorSpec { name: "x".into(), dtype, shape: None };
        match tensor_from_json(&spec, &value) {
            Ok(tensor) => {
                assert_eq!(tensor.dtype, dtype);
                tensor.validate(|_| None).expect("a tensor made from JSON agrees with its shape");
            }
            Err(message) => assert!(message.starts_with("input 'x': "), "{message}"),
        }
    }
}
