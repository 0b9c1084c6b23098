//! TFRecord files are user input: any bytes, plain or as a gzip stream,
//! give records or a clear fault, in bounded memory (a length is checked
//! before it is believed) and in a bounded number of steps; and a dataset
//! over them gives batches or an error.

#![no_main]

mod common;

use isorun_eval::tfrecord::RecordReader;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fn read_all(path: &Path, gzip: bool) {
    let Ok(mut reader) = RecordReader::open(path, gzip) else { return };
    let mut data = Vec::new();
    let mut last = None;
    loop {
        match reader.next_record(&mut data) {
            Ok(None) => break,
            Ok(Some(offset)) | Err((offset, _)) => {
                // Every record, good or bad, starts past the one before.
                assert!(last.is_none_or(|l| offset > l), "offset {offset} after {last:?}");
                last = Some(offset);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| common::bounded("tfrecord", data, || run(data)));

fn run(data: &[u8]) {
    let plain = common::write("x.tfrecord", data);
    read_all(&plain, false);
    read_all(&plain, true);
    common::exercise_dataset(&plain, data.len() % 2 == 0);
    if data.starts_with(&[0x1f, 0x8b]) {
        let gzip = common::write("x.tfrecord.gz", data);
        common::exercise_dataset(&gzip, data.len() % 2 == 1);
    }
}
