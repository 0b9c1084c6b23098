//! Keras model files are user input, read in the supervisor without
//! Python: any bytes, as a `.keras` zip or a full-model `.h5` file, give
//! what the file says of itself or an error; any JSON, as a model config,
//! gives a description and the first layer with code, if any; never a
//! panic, an abort or an allocation the bytes do not pay for.

#![no_main]

mod common;

use isorun_engine::keras::files::{code_in_config, describe_config, h5_is_full_model, read_h5, read_keras};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("keras_config", data, || run(data)));

fn run(data: &[u8]) {
    let keras = common::write("x.keras", data);
    let _ = read_keras(&keras);
    let h5 = common::write("x.h5", data);
    let _ = h5_is_full_model(&h5);
    let _ = read_h5(&h5);
    if let Ok(config) = serde_json::from_slice::<serde_json::Value>(data) {
        let info = describe_config(&config);
        assert_eq!(info.code.is_some(), code_in_config(&config).is_some());
    }
}
