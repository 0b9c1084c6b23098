//! The allocation bound (see `isorun-alloc-bound`) for the report crate's
//! readers of files it did not write this run and that `reader_bounds.rs`
//! does not cover: `--journal` files (and the records resumed from them)
//! and reports read back (`--baseline`, `report diff`, `report merge`,
//! `report table`). Each is fed seeds, a few hundred seeded mutations of
//! each, and files of many tiny JSON values. Every test measures, so this
//! binary holds bounded tests only, each holding `serial()` (the count is
//! process-wide).

use isorun_alloc_bound::{bounded, mutations, serial, CountingAllocator};
use isorun_engine::Model;
use isorun_report::journal::{read_journal, resumed_record};
use isorun_report::{read_report, SCHEMA_VERSION};
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const MUTATIONS: usize = 300;

fn seeds() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/journal");
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    all.sort();
    all
}

/// Reads `bytes` as a journal, resuming every record, and as a report.
fn read_every_way(label: &str, bytes: &[u8], dir: &Path) {
    let path = dir.join("journal.jsonl");
    std::fs::write(&path, bytes).unwrap();
    let model = Model::saved_model("m", "/models/m");
    bounded(label, bytes.len() as u64, || {
        if let Ok(records) = read_journal(&path) {
            for (_, record) in records {
                let _ = resumed_record(record, &model);
            }
        }
    });
    let path = dir.join("report.json");
    std::fs::write(&path, bytes).unwrap();
    bounded(label, bytes.len() as u64, || read_report(&path).is_ok());
}

fn a_report(units: usize) -> String {
    let unit = r#"{"model": "m", "path": "/models/m", "status": "ok", "wall_ms": 1, "outputs": [{"name": "y", "dtype": "float32", "shape": [2], "values": [0.5, 1.5]}]}"#;
    format!(
        r#"{{"schema_version": {SCHEMA_VERSION}, "summary": {{"ok": {units}}}, "units": [{}]}}"#,
        vec![unit; units].join(", ")
    )
}

#[test]
fn journals_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (i, seed) in seeds().iter().enumerate() {
        let bytes = std::fs::read(seed).unwrap();
        read_every_way(&seed.display().to_string(), &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, i as u64, MUTATIONS).enumerate() {
            read_every_way(&format!("{} mutation {m}", seed.display()), &mutated, dir.path());
        }
    }
}

#[test]
fn reports_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let report = a_report(3);
    let path = dir.path().join("report.json");
    std::fs::write(&path, &report).unwrap();
    read_report(&path).expect("the report reads");
    for (m, mutated) in mutations(report.as_bytes(), 99, MUTATIONS).enumerate() {
        read_every_way(&format!("a report mutation {m}"), &mutated, dir.path());
    }
}

/// A JSON list of `count` zeros: two bytes of file per value.
fn zeros(count: usize) -> String {
    let mut text = String::with_capacity(2 * count + 2);
    text.push('[');
    for i in 0..count {
        text.push_str(if i == 0 { "0" } else { ",0" });
    }
    text.push(']');
    text
}

#[test]
fn journal_lines_of_many_tiny_values_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let line = format!("{{\"key\": \"a\", \"model\": \"m\", \"status\": \"ok\", \"x\": {}}}\n", zeros(4 << 20));
    read_every_way("a journal line of 4 Mi zeros", line.as_bytes(), dir.path());
}

#[test]
fn reports_of_many_tiny_values_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let report = format!(
        r#"{{"schema_version": {SCHEMA_VERSION}, "units": [{{"model": "m", "status": "ok", "x": {}}}]}}"#,
        zeros(4 << 20)
    );
    read_every_way("a report of 4 Mi zeros", report.as_bytes(), dir.path());
}

/// An honest report of a 1000-class model (its full confusion matrix, a
/// million `0`) is read, within the records' floor: `json_cost`'s
/// `RECORD_FLOOR` (256 MiB) instead of 64 MiB, since every parsed number
/// costs a `serde_json::Value` whoever reads it (SECURITY.md).
#[test]
fn a_report_with_a_thousand_class_confusion_matrix_is_read_within_the_records_floor() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let row = format!("[{}]", vec!["0"; 1000].join(","));
    let report = format!(
        r#"{{"schema_version": {SCHEMA_VERSION}, "units": [{{"model": "m", "status": "ok", "confusion_matrix": [{}]}}]}}"#,
        vec![row.as_str(); 1000].join(",")
    );
    let path = dir.path().join("report.json");
    std::fs::write(&path, &report).unwrap();
    let n = report.len() as u64;
    let (read, peak) = isorun_alloc_bound::measure("a 1000-class report", n, || read_report(&path).map(|_| ()));
    assert!(read.is_ok(), "an honest 1000-class report was refused: {read:?}");
    let floor = isorun_tensors::json_cost::RECORD_FLOOR;
    assert!(peak.refused == 0 && peak.bytes <= floor.max(16 * n), "{peak}");
}
