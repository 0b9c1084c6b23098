//! The allocation bound (see `isorun-alloc-bound`) for `.onnx` files, which
//! the supervisor reads without ONNX Runtime (`ls`, `inspect`, a run's
//! plan): the fixtures, a few hundred seeded mutations of each, lengths
//! that lie, and files of many tiny messages. Every test measures, so this
//! binary holds bounded tests only, each holding `serial()` (the count is
//! process-wide).

use isorun_alloc_bound::{bounded, mutations, serial, CountingAllocator};
use isorun_onnxproto::read_model;
use std::path::Path;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// Reads `bytes` as `DIR/model.onnx`, under the bound; whether it is a model does not matter.
fn read(label: &str, bytes: &[u8], dir: &Path) -> Result<(), String> {
    let path = dir.join("model.onnx");
    std::fs::write(&path, bytes).unwrap();
    bounded(label, bytes.len() as u64, || read_model(&path).map(drop).map_err(|e| e.to_string()))
}

/// A length-delimited field `tag` holding `body`.
fn field(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![(tag << 3) | 2];
    let mut length = body.len() as u64;
    while length >= 0x80 {
        out.push((length as u8) | 0x80);
        length >>= 7;
    }
    out.push(length as u8);
    out.extend_from_slice(body);
    out
}

fn model(graph: &[u8]) -> Vec<u8> {
    [vec![0x08, 8], field(7, graph)].concat()
}

#[test]
fn fixtures_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx");
    let names =
        ["mlp.onnx", "dtypes.onnx", "sequence_map.onnx", "ir3_initializer_inputs.onnx", "external/external.onnx"];
    for (i, name) in names.iter().enumerate() {
        let bytes = std::fs::read(fixtures.join(name)).unwrap();
        read(name, &bytes, dir.path()).unwrap();
        for (m, mutated) in mutations(&bytes, i as u64, 300).enumerate() {
            let _ = read(&format!("{name} mutation {m}"), &mutated, dir.path());
        }
    }
}

#[test]
fn files_of_many_tiny_messages_are_refused_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // 4 Mi nameless, typeless inputs: two bytes each on the wire, far more in memory.
    let inputs = field(11, &[]).repeat(4 << 20);
    let error = read("4 Mi empty inputs", &model(&inputs), dir.path()).unwrap_err();
    assert!(error.contains("describe more names, types and dimensions than isorun reads"), "{error}");
    // One input of 4 Mi empty dimensions.
    let shape = field(1, &[]).repeat(4 << 20);
    let tensor_type = [vec![0x08, 1], field(2, &shape)].concat();
    let input = field(11, &[field(1, b"x"), field(2, &field(1, &tensor_type))].concat());
    let _ = read("an input of 4 Mi dimensions", &model(&input), dir.path()).unwrap_err();
    // 2 Mi initializers of distinct four-letter names (all kept, to leave them out of the inputs).
    let letters = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-";
    let mut initializers = Vec::new();
    for n in 0..(2usize << 20) {
        let name: Vec<u8> = (0..4).map(|d| letters[(n >> (6 * d)) & 63]).collect();
        initializers.extend(field(5, &field(8, &name)));
    }
    let _ = read("2 Mi named initializers", &model(&initializers), dir.path());
}

#[test]
fn lengths_that_claim_more_than_there_is_are_never_allocated() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut lying = vec![0x08, 8, 0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    lying.extend_from_slice(&[0; 64]);
    read("a graph claiming 4 GiB", &lying, dir.path()).unwrap_err();
    // An input whose name claims 2^62 bytes, inside a graph that claims to hold it.
    let mut name = vec![0x0a];
    name.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    let input = [vec![0x5a, name.len() as u8], name].concat();
    read("an input name claiming 2^62 bytes", &model(&input), dir.path()).unwrap_err();
    // A tensor's external-data location claiming 1 GiB in a small file.
    let entry = [vec![0x0a, 0x80, 0x80, 0x80, 0x80, 0x04], vec![b'l'; 32]].concat();
    let tensor = [field(8, b"w"), vec![0x6a, entry.len() as u8], entry].concat();
    read("an external-data key claiming 1 GiB", &model(&field(5, &tensor)), dir.path()).unwrap_err();
}
