//! A `--journal` file is anyone's to edit who can write its folder: any
//! bytes give records by key or an error naming the line, and any record
//! is resumed (model and path the run's) or run again; never a panic.

#![no_main]

mod common;

use isorun_engine::Model;
use isorun_report::journal::{read_journal, resumed_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("journal", data, || run(data)));

fn run(data: &[u8]) {
    let path = common::write("journal.jsonl", data);
    let Ok(records) = read_journal(&path) else { return };
    let model = Model::saved_model("m", "/models/m");
    for (_, record) in records {
        if let Some(resumed) = resumed_record(record, &model) {
            assert_eq!(resumed["model"], "m");
            assert_eq!(resumed["path"], "/models/m");
            assert_eq!(resumed["resumed"], true);
        }
    }
}
