//! `.npz` files are user input: a zip archive of `.npy` arrays, whose
//! entries may lie about their sizes. Any bytes give arrays or an error.

#![no_main]

mod common;

use isorun_tensors::npy::read_npz;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| common::bounded("npz", data, || run(data)));

fn run(data: &[u8]) {
    let Ok(arrays) = read_npz(std::io::Cursor::new(data), Path::new("fuzz.npz")) else { return };
    for (_, tensor) in arrays {
        tensor.validate(|_| None).expect("a tensor read from a file agrees with its shape");
    }
}
