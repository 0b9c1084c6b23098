//! `tf.Example` records are user input: any bytes decode to an example or
//! an error, and examples (split at the marker `\0EX\0`, framed as one
//! TFRecord file) go through the dataset's conversions to batches or a
//! clear error; never a panic, an abort or an allocation the bytes do not
//! pay for.

#![no_main]

mod common;

use isorun_eval::example::Example;
use isorun_eval::tfrecord::write_record;
use libfuzzer_sys::fuzz_target;
use prost::Message;

const MARKER: &[u8] = b"\0EX\0";

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(MARKER.len()).position(|w| w == MARKER) {
        parts.push(&rest[..i]);
        rest = &rest[i + MARKER.len()..];
    }
    parts.push(rest);
    parts
}

fuzz_target!(|data: &[u8]| common::bounded("example", data, || run(data)));

fn run(data: &[u8]) {
    let records = split(data);
    let mut file = Vec::new();
    for record in &records {
        if let Ok(example) = Example::decode(*record) {
            for (name, feature) in example.features.iter().flat_map(|f| f.feature.iter()) {
                let _ = (feature.kind_name(), feature.len(), example.get(name));
            }
            // Not compared whole: a NaN value is not equal to itself.
            let again =
                Example::decode(example.encode_to_vec().as_slice()).expect("an example decodes from its encoding");
            assert_eq!(again.features.map(|f| f.feature.len()), example.features.map(|f| f.feature.len()));
        }
        write_record(&mut file, record);
    }
    let path = common::write("x.tfrecord", &file);
    common::exercise_dataset(&path, records.len() % 2 == 0);
}
