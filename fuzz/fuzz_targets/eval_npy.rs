//! A folder of `.npy` arrays is user input: the bytes, split at the marker
//! `\0NPY\0` into `label.npy` and `x.npy` (the same bytes for both when
//! there is no marker), give a dataset whose batches agree with their
//! shapes, or an error; never a panic, an abort or an allocation the bytes
//! do not pay for.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

const MARKER: &[u8] = b"\0NPY\0";

fuzz_target!(|data: &[u8]| common::bounded("eval_npy", data, || run(data)));

fn run(data: &[u8]) {
    let (label, x) = match data.windows(MARKER.len()).position(|w| w == MARKER) {
        Some(i) => (&data[..i], &data[i + MARKER.len()..]),
        None => (data, data),
    };
    common::write("npy/label.npy", label);
    let x = common::write("npy/x.npy", x);
    common::exercise_dataset(x.parent().expect("in the folder"), false);
}
