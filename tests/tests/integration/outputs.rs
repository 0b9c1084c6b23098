//! One gate for everything a worker sends back: outputs that are legal on
//! the wire but absurd (zero elements in 2^40 rows, one long string among
//! millions of empty ones, a rank deeper than TensorFlow allows, a dtype
//! that changes between batches) become that unit's clear outcome; the
//! supervisor survives and the other models keep their records.

use crate::util::{fake_models, isorun_fault, run, write_input, Ran};
use std::path::Path;

fn run_models(root: &Path, models: &[&str], extra: &[&str]) -> Ran {
    fake_models(&root.join("models"), models);
    let input = write_input(root);
    let mut command = isorun_fault(&[]);
    command.arg(root.join("models")).arg(format!("--input=x={}", input.display())).args(extra);
    run(&mut command)
}

fn assert_good(ran: &Ran) {
    let good = ran.record("good");
    assert_eq!(good["status"], "ok", "{good}");
    assert_eq!(good["outputs"]["x"]["values"], serde_json::json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), "{good}");
}

#[test]
fn zero_elements_in_two_to_the_forty_rows_with_values_is_the_units_error() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_models(tmp.path(), &["fault-zero-huge", "good"], &["--values"]);
    assert_eq!(ran.code, Some(1), "the supervisor survives: {}", ran.stderr);
    let huge = ran.record("fault-zero-huge");
    assert_eq!(huge["status"], "error", "{huge}");
    assert_eq!(huge["error"]["kind"], "output_write", "{huge}");
    let message = huge["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("output y: shape [1099511627776, 0]") && message.contains("--output-dir"), "{message}");
    assert_good(&ran);
}

#[test]
fn zero_elements_in_two_to_the_forty_rows_without_values_are_ok_and_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ran = run_models(tmp.path(), &["fault-zero-huge", "good"], &["--output-dir", out.to_str().unwrap()]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let huge = ran.record("fault-zero-huge");
    assert_eq!(huge["outputs"]["y"]["shape"], serde_json::json!([1u64 << 40, 0]), "{huge}");
    let written = isorun_tensors::npy::read_npy_file(&out.join("fault-zero-huge/y.npy")).unwrap();
    assert_eq!(written.shape, [1 << 40, 0]);
}

#[test]
fn one_long_string_among_millions_is_an_error_with_output_dir_not_30_gigabytes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ran = run_models(tmp.path(), &["fault-wide-strings", "good"], &["--output-dir", out.to_str().unwrap()]);
    assert_eq!(ran.code, Some(1), "the supervisor survives: {}", ran.stderr);
    let wide = ran.record("fault-wide-strings");
    assert_eq!(wide["status"], "error", "{wide}");
    assert_eq!(wide["error"]["kind"], "output_write", "{wide}");
    let message = wide["error"]["message"].as_str().unwrap();
    assert!(message.contains("text.npy") && message.contains("3000000 strings of up to 10000 bytes"), "{message}");
    assert!(!out.join("fault-wide-strings/text.npy").exists(), "nothing half-written");
    let leftovers: Vec<_> = std::fs::read_dir(out.join("fault-wide-strings")).unwrap().collect();
    assert!(leftovers.is_empty(), "no temporary file left: {leftovers:?}");
    assert!(out.join("good/x.npy").is_file(), "the good model's outputs are written");
}

#[test]
fn a_rank_deeper_than_tensorflow_allows_is_a_protocol_error() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_models(tmp.path(), &["fault-deep-rank", "good"], &["--values"]);
    assert_eq!(ran.code, Some(1), "the supervisor survives: {}", ran.stderr);
    let deep = ran.record("fault-deep-rank");
    assert_eq!(deep["status"], "protocol_error", "{deep}");
    let message = deep["error"]["message"].as_str().unwrap();
    assert!(message.contains("output y has rank 100000, more than TensorFlow's 254"), "{message}");
    assert_good(&ran);
}

#[test]
fn a_dtype_that_changes_between_batches_is_an_error_not_a_corrupt_npy() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ran =
        run_models(tmp.path(), &["fault-dtype-flip"], &["--batch-size", "1", "--output-dir", out.to_str().unwrap()]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let flip = ran.record("fault-dtype-flip");
    assert_eq!(flip["status"], "error", "{flip}");
    let message = flip["error"]["message"].as_str().unwrap();
    assert!(message.contains("output 'x' changes dtype between batches (float32 and int32)"), "{message}");
    assert!(!out.join("fault-dtype-flip/x.npy").exists(), "no corrupt .npy for the unit");
}
