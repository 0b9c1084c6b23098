//! An `.npz` dataset is user input: any bytes, as `x.npz`, give a dataset
//! whose batches agree with their shapes, or an error; never a panic, an
//! abort or an allocation the bytes do not pay for (the headers' claims are
//! checked before rows are read).

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("eval_npz", data, || run(data)));

fn run(data: &[u8]) {
    let path = common::write("x.npz", data);
    common::exercise_dataset(&path, false);
}
