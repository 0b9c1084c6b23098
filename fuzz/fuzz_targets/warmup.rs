//! A TF Serving warm-up file lives in the model's folder, so the model's
//! author writes it: any bytes of a record give the requests it holds,
//! their tensors made, or an error; never a panic or an allocation past
//! the record's budget (a shape claiming any size from one value, or a
//! length prost would believe, included).

#![no_main]

mod common;

use isorun_tfproto::serving::{decode_prediction_log, record_budget, RequestInputs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("warmup", data, || run(data)));

/// As `runner/src/warmup.rs` decodes a record: with the record's budget.
fn run(data: &[u8]) {
    let Ok(requests) = decode_prediction_log(data, record_budget(data.len())) else { return };
    for request in requests {
        if let RequestInputs::Tensors(tensors) = &request.inputs {
            for (name, tensor) in tensors {
                tensor.validate(|_| None).unwrap_or_else(|e| panic!("input {name}: {e}"));
            }
        }
    }
}
