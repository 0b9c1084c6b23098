//! A predictions file that `isorun rescore` reads is anyone's to edit who
//! can write its folder: a `.parquet` with its `isorun` metadata, or a
//! `.jsonl` with its `.isorun.json` sidecar. Any bytes give batches of
//! targets and the scored output that agree with their own shapes, or an
//! error naming the file; never a panic or an allocation the bytes do not
//! pay for (a description that claims rows or widths included).
//!
//! The input's first byte picks the kind: even, the rest is a `.parquet`;
//! odd, the rest is the sidecar up to the first 0xff byte, then the
//! `.jsonl` lines.

#![no_main]

mod common;

use isorun_eval::predictions::{sidecar, PredictionsReader};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| common::bounded("predictions", data, || run(data)));

/// Batches read: enough to go past the first, few enough to stay fast.
const BATCHES: usize = 4;

fn run(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let path = if pick % 2 == 0 {
        common::write("p.parquet", rest)
    } else {
        let (side, lines) = match rest.iter().position(|&b| b == 0xff) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &[][..]),
        };
        let path = common::write("p.jsonl", lines);
        common::write(&sidecar(Path::new("p.jsonl")).to_string_lossy(), side);
        path
    };
    read(&path);
}

/// As `isorun rescore` reads a file: its description, its signature, the
/// output it names and its slices, then batches.
fn read(path: &Path) {
    let Ok(mut reader) = PredictionsReader::open(path) else { return };
    let _ = reader.signature();
    let output = reader.meta.output.clone();
    let slices = reader.meta.slices.clone();
    if reader.start(&output, &slices).is_err() {
        return;
    }
    for _ in 0..BATCHES {
        match reader.next_batch() {
            Some(Ok(batch)) => {
                let rows = batch.targets.rows;
                assert_eq!(batch.targets.labels.len(), rows, "one label per row");
                let (name, tensor) = &batch.output;
                tensor.validate(|_| None).unwrap_or_else(|e| panic!("output {name}: {e}"));
                assert_eq!(tensor.shape.first().copied(), Some(rows as u64), "output {name}: rows");
            }
            Some(Err(_)) | None => break,
        }
    }
}
