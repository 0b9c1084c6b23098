//! The allocation bound (see `isorun-alloc-bound`) for the Keras files the
//! supervisor reads without Python (`.keras` archives, full-model `.h5`
//! files, their model configs), through the public API of
//! `isorun_engine::keras::files`: the fixtures, a few hundred seeded
//! mutations of each, and configs of many tiny JSON values. Every test
//! measures, so this binary holds bounded tests only, each holding
//! `serial()` (the count is process-wide).

use isorun_alloc_bound::{bounded, mutations, serial, CountingAllocator};
use isorun_engine::keras::files::{describe_config, h5_is_full_model, read_h5, read_keras};
use std::io::Write;
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const MUTATIONS: usize = 200;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Reads `bytes` as a `.keras` archive and as an `.h5` file.
fn read(label: &str, bytes: &[u8], dir: &Path) {
    let n = bytes.len() as u64;
    let keras = dir.join("x.keras");
    std::fs::write(&keras, bytes).unwrap();
    bounded(label, n, || read_keras(&keras).is_ok());
    let h5 = dir.join("x.h5");
    std::fs::write(&h5, bytes).unwrap();
    bounded(label, n, || h5_is_full_model(&h5).is_ok());
    bounded(label, n, || read_h5(&h5).is_ok());
}

#[test]
fn keras_files_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let fixtures = [
        "tests/fixtures/keras/iris.keras",
        "tests/fixtures/keras/lambda.keras",
        "tests/fixtures/keras/multi.keras",
        "tests/fixtures/keras/truncated.keras",
        "tests/fixtures/keras/ckpts/seq.h5",
        "tests/fixtures/keras/keras2/k2_seq.h5",
        "tests/fixtures/keras/keras2/k2_local.h5",
    ];
    for (i, fixture) in fixtures.iter().enumerate() {
        let path = repo().join(fixture);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        read(fixture, &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, i as u64, MUTATIONS).enumerate() {
            read(&format!("{fixture} mutation {m}"), &mutated, dir.path());
        }
    }
}

/// A `.keras` archive whose `config.json` is `config`.
fn keras_with_config(config: &[u8]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("config.json", options).unwrap();
    zip.write_all(config).unwrap();
    zip.start_file("metadata.json", options).unwrap();
    zip.write_all(br#"{"keras_version": "3.0.0"}"#).unwrap();
    zip.finish().unwrap().into_inner()
}

#[test]
fn keras_configs_of_many_tiny_values_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let zeros = format!("[{}]", vec!["0"; 4 << 20].join(","));
    let config = format!(r#"{{"class_name": "Sequential", "config": {{"layers": [], "x": {zeros}}}}}"#);
    read("a .keras config of 4 Mi zeros", &keras_with_config(config.as_bytes()), dir.path());
}

#[test]
fn keras_configs_of_many_layers_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![r#"{"class_name":"Dense","config":{}}"#; 200_000].join(",");
    let config = format!(r#"{{"class_name": "Sequential", "config": {{"layers": [{layers}]}}}}"#);
    read("a .keras config of 200,000 layers", &keras_with_config(config.as_bytes()), dir.path());
    let value: serde_json::Value = serde_json::from_str(&config).unwrap();
    bounded("describing a config of 200,000 layers", config.len() as u64, || describe_config(&value).code.is_none());
}

#[test]
fn keras_archives_whose_entries_claim_gigabytes_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = keras_with_config(br#"{"class_name": "Sequential", "config": {"layers": []}}"#);
    let claimed = 0xffff_fff0u32.to_le_bytes();
    bytes[22..26].copy_from_slice(&claimed);
    let central = bytes.windows(4).position(|w| w == b"PK\x01\x02").expect("a central header");
    bytes[central + 24..central + 28].copy_from_slice(&claimed);
    read("a config.json claiming 4 GiB", &bytes, dir.path());
}

#[test]
fn a_small_archive_whose_config_inflates_to_tens_of_mib_of_zeros_stays_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // ~60 MiB of `0,` deflates to a few hundred KB: the bound is the archive's.
    let zeros = format!("[{}]", vec!["0"; 30 << 20].join(","));
    let config = format!(r#"{{"class_name": "Sequential", "config": {{"layers": [], "x": {zeros}}}}}"#);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("config.json", options).unwrap();
    zip.write_all(config.as_bytes()).unwrap();
    let bytes = zip.finish().unwrap().into_inner();
    assert!(bytes.len() < 1 << 20, "{} bytes", bytes.len());
    let keras = dir.path().join("x.keras");
    std::fs::write(&keras, &bytes).unwrap();
    let refused = bounded("a .keras archive inflating to 60 MiB of zeros", bytes.len() as u64, || {
        let error = read_keras(&keras).unwrap_err().to_string();
        error.contains("config.json") && error.contains("inflates to more than")
    });
    assert!(refused, "the archive's config was not refused for what it inflates to");
}
