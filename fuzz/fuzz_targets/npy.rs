//! `.npy` files are user input: any bytes must give a tensor that agrees
//! with its shape, or an error; never a panic, an abort or an allocation
//! the bytes do not pay for. What isorun reads, it writes back identically.

#![no_main]

mod common;

use isorun_tensors::npy::{read_npy, write_npy};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| common::bounded("npy", data, || run(data)));

fn run(data: &[u8]) {
    // In an .npz the stream's length is the archive's claim, which may lie.
    let _ = read_npy(data, (data.len() as u64).saturating_mul(1000).max(1 << 40), Path::new("lying.npy"));

    let Ok(tensor) = read_npy(data, data.len() as u64, Path::new("fuzz.npy")) else { return };
    tensor.validate(|_| None).expect("a tensor read from a file agrees with its shape");
    let mut written = Vec::new();
    write_npy(&mut written, &tensor).expect("writing into memory");
    let back =
        read_npy(written.as_slice(), written.len() as u64, Path::new("back.npy")).expect("isorun reads what it writes");
    assert_eq!(back, tensor);
}
