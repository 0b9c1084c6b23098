//! The whole output path, as the supervisor takes what a worker sends
//! back: frame → the engine's gate (`check_outputs`) → the unit's record →
//! JSON values, the `.npy` writer and the `--batch-size` join. Any bytes end
//! in a record or a clear error: never a panic, an abort or an allocation
//! the bytes do not pay for (run with -malloc_limit_mb).

#![no_main]

mod common;

use isorun_engine::{check_outputs, Model, OutputInfo, UnitReport};
use isorun_protocol::{Outcome, UnitResult, WorkerMessage};
use isorun_transport::{decode, read_frame, DEFAULT_MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fn take(message: WorkerMessage) {
    let WorkerMessage::Finished { result: UnitResult::Ok { outputs }, .. } = message else { return };
    if check_outputs(&outputs).is_err() {
        return;
    }
    let mut report = UnitReport::new(0, Outcome::Ok);
    for (name, tensor) in &outputs {
        let values = isorun_tensors::values::tensor_values(tensor).ok();
        report.outputs.push(OutputInfo {
            name: name.clone(),
            dtype: tensor.dtype,
            shape: tensor.shape.clone(),
            values,
        });
        let mut bytes = Vec::new();
        if isorun_tensors::npy::write_npy(&mut bytes, tensor).is_ok() {
            let back =
                isorun_tensors::npy::read_npy(bytes.as_slice(), bytes.len() as u64, std::path::Path::new("o.npy"))
                    .expect("a written .npy reads back");
            assert_eq!(back.shape, tensor.shape);
        }
    }
    let model = Model::saved_model("m", "/m");
    let record = isorun_report::record::unit_record(&model, &report);
    let _ = record.to_string();
    // Joined with itself, as two batches of its own rows.
    let rows: Vec<u64> = [&outputs, &outputs]
        .iter()
        .map(|o| o.first().and_then(|(_, t)| t.shape.first().copied()).unwrap_or(0))
        .collect();
    let _ = isorun_tensors::batch::join(vec![outputs.clone(), outputs], &rows);
}

fuzz_target!(|data: &[u8]| common::bounded("outputs", data, || run(data)));

fn run(data: &[u8]) {
    let mut stream = data;
    while let Ok(message) = read_frame::<WorkerMessage>(&mut stream, DEFAULT_MAX_FRAME) {
        take(message);
    }
    if let Ok(message) = decode::<WorkerMessage>(data) {
        take(message);
    }
}
