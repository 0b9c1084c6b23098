//! A CSV dataset is user input: any bytes, as `x.csv`, give examples that go
//! through the dataset's conversions to batches, or an error naming the
//! line; never a panic, a hang or an allocation the bytes do not pay for.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("csv", data, || run(data)));

fn run(data: &[u8]) {
    let path = common::write("x.csv", data);
    common::exercise_dataset(&path, false);
}
