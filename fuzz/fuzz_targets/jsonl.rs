//! A JSON Lines dataset is user input: any bytes, as `x.jsonl`, give
//! examples that go through the dataset's conversions to batches, or an
//! error naming the line; never a panic, a hang or an allocation the bytes
//! do not pay for.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("jsonl", data, || run(data)));

fn run(data: &[u8]) {
    let path = common::write("x.jsonl", data);
    common::exercise_dataset(&path, false);
    common::exercise_dataset(&path, true);
}
