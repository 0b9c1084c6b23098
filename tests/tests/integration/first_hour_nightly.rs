//! Issue 26, section 5: what surprised a nightly job silently (resumed
//! records without their values, a merge of missing shards, only the first
//! breach, colours in a log file, inspect's two forms of an unknown
//! dimension, the GPU a worker never had, `doctor` without `--json`).

use crate::util::{fake_models, isorun_fault, run, write_input, Ran};
use std::path::Path;

/// `isorun run` of the fault worker on `root/models` with a journal.
fn journaled(root: &Path, extra: &[&str]) -> Ran {
    let input = write_input(root);
    run(isorun_fault(&[])
        .arg(root.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--json", "--journal"])
        .arg(root.join("journal.jsonl"))
        .args(extra))
}

#[test]
fn resume_with_values_reruns_units_journaled_without_them_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good", "other"]);
    let first = journaled(tmp.path(), &[]);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert!(first.record("good")["outputs"]["x"].get("values").is_none());

    let second = journaled(tmp.path(), &["--resume", "--values"]);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    for id in ["good", "other"] {
        let record = second.record(id);
        assert!(record.get("resumed").is_none(), "a line without values is computed again: {record}");
        assert!(record["outputs"]["x"]["values"].is_array(), "{record}");
    }
    let warnings: Vec<&str> = second.stderr.lines().filter(|l| l.contains("without --values")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {}", second.stderr);
    assert!(warnings[0].contains("2 unit(s)"), "{}", warnings[0]);

    // Now journaled with their values: resumed with them, and no warning.
    let third = journaled(tmp.path(), &["--resume", "--values"]);
    assert_eq!(third.record("good")["resumed"], true, "{}", third.stderr);
    assert!(third.record("good")["outputs"]["x"]["values"].is_array());
    assert!(!third.stderr.contains("without --values"), "{}", third.stderr);
}
