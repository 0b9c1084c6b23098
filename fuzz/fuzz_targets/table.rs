//! Parquet and Arrow IPC datasets are user input: any bytes, as
//! `x.parquet`, `x.arrow` or `x.feather` (the input's first byte picks
//! which), give batches through the dataset's conversions or an error
//! naming the file; never a panic, a hang or an allocation the bytes do
//! not pay for (a footer, a page header or a message claiming sizes
//! included).

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("table", data, || run(data)));

fn run(data: &[u8]) {
    let Some((&pick, file)) = data.split_first() else { return };
    let name = match pick % 3 {
        0 => "x.parquet",
        1 => "x.arrow",
        _ => "x.feather",
    };
    let path = common::write(name, file);
    common::exercise_dataset(&path, false);
}
