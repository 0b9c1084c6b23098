//! The allocation bound (see `isorun-alloc-bound`) for `saved_model.pb`,
//! which the supervisor reads without TensorFlow (`inspect`, JSON inputs'
//! dtypes): the examples' and fixtures' files, a few hundred seeded
//! mutations of each, lengths that lie, and files of many tiny messages.
//! Every test measures, so this binary holds bounded tests only, each
//! holding `serial()` (the count is process-wide).

use isorun_alloc_bound::{bounded, mutations, serial, CountingAllocator};
use isorun_tfproto::{read_saved_model, signatures};
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Reads `bytes` as `DIR/saved_model.pb` and every signature of every graph.
fn read(label: &str, bytes: &[u8], dir: &Path) {
    std::fs::write(dir.join("saved_model.pb"), bytes).unwrap();
    bounded(label, bytes.len() as u64, || {
        if let Ok(graphs) = read_saved_model(dir) {
            for graph in &graphs {
                let _ = signatures(&graph.def);
            }
        }
    });
}

#[test]
fn saved_models_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let models = [
        "examples/models/iris_classifier",
        "examples/models/linear_regressor",
        "tests/fixtures/eval/models/multiclass",
        "fuzz/seeds/saved_model",
    ];
    for (i, model) in models.iter().enumerate() {
        let path = repo().join(model);
        let path = if path.join("saved_model.pb").exists() {
            path.join("saved_model.pb")
        } else {
            path.join("fixed_shape.pb")
        };
        let bytes = std::fs::read(&path).unwrap();
        read(&path.display().to_string(), &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, i as u64, 200).enumerate() {
            read(&format!("{} mutation {m}", path.display()), &mutated, dir.path());
        }
    }
}

/// `count` copies of a field of tag `tag` (length-delimited) holding `body`.
fn repeated(tag: u8, body: &[u8], count: usize) -> Vec<u8> {
    let mut field = vec![(tag << 3) | 2];
    prost::encoding::encode_varint(body.len() as u64, &mut field);
    field.extend_from_slice(body);
    field.repeat(count)
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    repeated(tag, body, 1)
}

#[test]
fn saved_models_of_many_tiny_messages_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // Empty meta graphs: two bytes each.
    read("4 Mi empty meta graphs", &repeated(2, &[], 4 << 20), dir.path());
    // One meta graph of 3 Mi empty tags.
    let tags = message(1, &repeated(4, &[], 3 << 20));
    read("a meta graph of 3 Mi empty tags", &message(2, &tags), dir.path());
    // One signature input whose shape has 4 Mi dimensions.
    let shape = message(3, &repeated(2, &[], 4 << 20));
    let info = [message(1, b"x:0"), vec![0x10, 1], shape].concat();
    let entry = [message(1, b"x"), message(2, &info)].concat();
    let signature = message(1, &entry);
    let def_entry = [message(1, b"serving_default"), message(2, &signature)].concat();
    read("a signature input of 4 Mi dimensions", &message(2, &message(5, &def_entry)), dir.path());
    // Lengths that claim more than there is.
    let mut lying = vec![0x12, 0xff, 0xff, 0xff, 0xff, 0x0f];
    lying.extend_from_slice(&[0; 64]);
    read("a meta graph claiming 4 GiB", &lying, dir.path());
}
