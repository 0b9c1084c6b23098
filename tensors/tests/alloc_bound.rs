//! The allocation bound (see `isorun-alloc-bound`) for the tensor readers
//! the supervisor runs on user files: `.npy` and `.npz` (`--input`,
//! `--inputs`, golden files) and JSON inputs. Each is fed real files, a few
//! hundred seeded mutations of each, and files whose headers claim far more
//! than they hold. Every test measures, so this binary holds bounded tests
//! only, each holding `serial()` (the count is process-wide).

use isorun_alloc_bound::{bounded, mutations, serial, CountingAllocator};
use isorun_protocol::{DType, TensorSpec};
use isorun_tensors::inputs::load_inputs;
use isorun_tensors::json_input::tensor_from_json;
use isorun_tensors::npy::{read_npy, read_npy_file, read_npz, read_npz_file, read_npz_file_shared};
use std::io::Write;
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const MUTATIONS: usize = 300;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Files under `dir` (recursively) whose name ends with `suffix`, sorted.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn npy_fixtures() -> Vec<PathBuf> {
    let mut all = files(&repo().join("fuzz/seeds/npy"), ".npy");
    all.extend(files(&repo().join("tests/fixtures/expected"), ".npy").into_iter().step_by(3));
    all.extend(files(&repo().join("tests/fixtures/eval/data/npy"), ".npy"));
    assert!(all.len() > 20, "{all:?}");
    all
}

fn npz_fixtures() -> Vec<PathBuf> {
    let mut all = vec![repo().join("examples/inputs.npz")];
    all.extend(files(&repo().join("fuzz/seeds/npz"), ".npz"));
    all.extend(files(&repo().join("tests/fixtures/keras/inputs"), ".npz"));
    all.extend(files(&repo().join("tests/fixtures/expected"), ".npz").into_iter().step_by(4));
    assert!(all.len() > 10, "{all:?}");
    all
}

/// Reads `bytes` as an `.npy` stream (true length, and a length that lies
/// as an `.npz` entry's may), as a file and as an `--input`.
fn read_npy_every_way(label: &str, bytes: &[u8], dir: &Path) {
    let n = bytes.len() as u64;
    bounded(label, n, || read_npy(bytes, n, Path::new("x.npy")).is_ok());
    bounded(label, n, || read_npy(bytes, n.saturating_mul(1000).max(1 << 40), Path::new("x.npy")).is_ok());
    let path = dir.join("x.npy");
    std::fs::write(&path, bytes).unwrap();
    bounded(label, n, || read_npy_file(&path).is_ok());
    bounded(label, n, || load_inputs(&[format!("x={}", path.display())], &[]).is_ok());
}

fn read_npz_every_way(label: &str, bytes: &[u8], dir: &Path) {
    let n = bytes.len() as u64;
    bounded(label, n, || read_npz(std::io::Cursor::new(bytes), Path::new("x.npz")).is_ok());
    let path = dir.join("x.npz");
    std::fs::write(&path, bytes).unwrap();
    bounded(label, n, || read_npz_file(&path).is_ok());
    bounded(label, n, || read_npz_file_shared(&path, 1 << 10).is_ok());
    bounded(label, n, || load_inputs(&[], std::slice::from_ref(&path)).is_ok());
}

#[test]
fn npy_fixtures_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (i, fixture) in npy_fixtures().iter().enumerate() {
        let bytes = std::fs::read(fixture).unwrap();
        read_npy_every_way(&fixture.display().to_string(), &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, i as u64, MUTATIONS).enumerate() {
            read_npy_every_way(&format!("{} mutation {m}", fixture.display()), &mutated, dir.path());
        }
    }
}

#[test]
fn npz_fixtures_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (i, fixture) in npz_fixtures().iter().enumerate() {
        let bytes = std::fs::read(fixture).unwrap();
        read_npz_every_way(&fixture.display().to_string(), &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, 1000 + i as u64, MUTATIONS).enumerate() {
            read_npz_every_way(&format!("{} mutation {m}", fixture.display()), &mutated, dir.path());
        }
    }
}

fn npy_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut text = header.to_string();
    while !(10 + text.len() + 1).is_multiple_of(64) {
        text.push(' ');
    }
    text.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn npy_headers_that_claim_more_than_the_file_holds_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let claims = [
        "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
        "{'descr': '|S2147483647', 'fortran_order': False, 'shape': (1000000,), }",
        "{'descr': '<U536870911', 'fortran_order': False, 'shape': (1000000,), }",
        "{'descr': '|S1', 'fortran_order': False, 'shape': (18446744073709551615,), }",
        "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 1099511627776), }",
    ];
    for claim in claims {
        read_npy_every_way(claim, &npy_with_header(claim, &[7; 4096]), dir.path());
    }
    // A version 2 header claiming 4 GiB of header.
    let mut bytes = b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec();
    bytes.extend_from_slice(&[b' '; 1024]);
    read_npy_every_way("v2 header claiming 4 GiB", &bytes, dir.path());
}

/// An `.npz` of one small array, rewritten so that its zip headers claim
/// `claimed` bytes uncompressed.
fn npz_claiming(claimed: u32, deflated: bool) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let method = if deflated { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    zip.start_file("x.npy", zip::write::SimpleFileOptions::default().compression_method(method)).unwrap();
    zip.write_all(&npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (16,), }", &[0; 64])).unwrap();
    let mut bytes = zip.finish().unwrap().into_inner();
    // Local header: uncompressed size at 22; central header: at 24.
    bytes[22..26].copy_from_slice(&claimed.to_le_bytes());
    let central = bytes.windows(4).rposition(|w| w == b"PK\x01\x02").expect("a central header");
    bytes[central + 24..central + 28].copy_from_slice(&claimed.to_le_bytes());
    bytes
}

#[test]
fn npz_entries_that_claim_gigabytes_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for deflated in [false, true] {
        for claimed in [0xffff_fff0, 1 << 31, 200 << 20] {
            let label = format!("npz entry claiming {claimed} bytes (deflated: {deflated})");
            read_npz_every_way(&label, &npz_claiming(claimed, deflated), dir.path());
        }
    }
}

#[test]
fn many_one_byte_strings_stay_within_the_bound() {
    let _serial = serial();
    // `|S1`: one byte in the file per string, a string each in memory.
    let dir = tempfile::tempdir().unwrap();
    let count = 6 << 20;
    let header = format!("{{'descr': '|S1', 'fortran_order': False, 'shape': ({count},), }}");
    read_npy_every_way("6 Mi one-byte strings", &npy_with_header(&header, &vec![b'a'; count]), dir.path());
}

/// `text` as a JSON inputs file, an `--input x=FILE.json` and an inline
/// `--input x=@JSON`, converted for float32, string and int8 inputs.
fn read_json_every_way(label: &str, text: &str, dir: &Path) {
    let n = text.len() as u64;
    let path = dir.join("x.json");
    std::fs::write(&path, text).unwrap();
    let convert = |inputs: isorun_tensors::inputs::Inputs| {
        for (_, value) in &inputs.json {
            for dtype in [DType::Float32, DType::String, DType::Int8] {
                let spec = TensorSpec { name: "x".into(), dtype, shape: None };
                let _ = tensor_from_json(&spec, value).map(|t| t.shape);
            }
        }
    };
    bounded(label, n, || load_inputs(&[], std::slice::from_ref(&path)).map(convert).is_ok());
    bounded(label, n, || load_inputs(&[format!("x={}", path.display())], &[]).map(convert).is_ok());
    bounded(label, n, || load_inputs(&[format!("x=@{text}")], &[]).map(convert).is_ok());
}

#[test]
fn json_inputs_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (i, fixture) in files(&repo().join("fuzz/seeds/json_input"), ".json").iter().enumerate() {
        let text = std::fs::read_to_string(fixture).unwrap();
        read_json_every_way(&fixture.display().to_string(), &text, dir.path());
        for (m, mutated) in mutations(text.as_bytes(), 2000 + i as u64, MUTATIONS).enumerate() {
            if let Ok(text) = String::from_utf8(mutated) {
                read_json_every_way(&format!("{} mutation {m}", fixture.display()), &text, dir.path());
            }
        }
    }
}

#[test]
fn large_json_inputs_of_small_elements_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let zeros = 4 << 20;
    let mut text = String::with_capacity(2 * zeros + 2);
    text.push('[');
    for i in 0..zeros {
        text.push_str(if i == 0 { "0" } else { ",0" });
    }
    text.push(']');
    read_json_every_way("a JSON list of 4 Mi zeros", &text, dir.path());
    let nested = format!("[{}]", vec!["[]"; 2 << 20].join(","));
    read_json_every_way("a JSON list of 2 Mi empty lists", &nested, dir.path());
    let strings = format!("{{\"x\": [{}]}}", vec!["\"\""; 2 << 20].join(","));
    read_json_every_way("a JSON list of 2 Mi empty strings", &strings, dir.path());
    let objects = format!("[{}]", vec![r#"{"a":{"b":0}}"#; 1 << 20].join(","));
    read_json_every_way("a JSON list of 1 Mi small objects", &objects, dir.path());
    let layers = format!("[{}]", vec![r#"{"class_name":"Dense","config":{}}"#; 200_000].join(","));
    read_json_every_way("a JSON list of 200,000 layer-like objects", &layers, dir.path());
    // Just under the count json_cost allows: parsed, and still within the bound.
    let layer = format!(r#"{{"class_name":"{}","config":{{}}}}"#, "D".repeat(100));
    let layers = format!("[{}]", vec![layer.as_str(); 100_000].join(","));
    assert!(isorun_tensors::json_cost::check_json_cost(layers.as_bytes()).is_ok());
    read_json_every_way("a JSON list of 100,000 wordier objects", &layers, dir.path());
    let pairs = format!("[{}]", vec![r#"["abcdefghijklmnopqrstuvwxyz0123456789",[1.5e-10]]"#; 1 << 19].join(","));
    assert!(isorun_tensors::json_cost::check_json_cost(pairs.as_bytes()).is_ok());
    read_json_every_way("a JSON list of 512 Ki pairs", &pairs, dir.path());
}
