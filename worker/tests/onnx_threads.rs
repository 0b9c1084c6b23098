//! Whether a zygote may open ONNX Runtime's library before it forks: the
//! fork server refuses to fork a process with more than one thread, and
//! ONNX Runtime's environment (its thread pools) must be made after the
//! fork. Opening the library (its `dlopen`, static initializers included)
//! must start no thread. One test in this binary, so that no other test's
//! thread is counted.

mod common;

use common::library;
use std::path::Path;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Opening the library starts no thread; the environment and a session
/// with one intra-op and one inter-op thread start none either (counts
/// printed for the record).
#[test]
fn opening_onnx_runtime_starts_no_thread() {
    // As isorun starts its workers (telemetry off: no thread of its own, no
    // database in the home folder). The one test here: nothing else reads
    // the environment meanwhile.
    std::env::set_var("ORT_DISABLE_TELEMETRY", "1");
    let library = library();
    let before = threads();
    let builder = ort::init_from(&library).unwrap_or_else(|e| panic!("{}: {e}", library.display()));
    let opened = threads();
    assert_eq!(opened, before, "opening {} started {} threads", library.display(), opened - before);
    let environment = builder.with_telemetry(false).build().unwrap();
    let with_environment = threads();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/mlp.onnx");
    let session = ort::session::Session::builder(&environment)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .with_inter_threads(1)
        .unwrap()
        .commit_from_file(&model)
        .unwrap();
    let with_session = threads();
    eprintln!(
        "threads: {before} before, {opened} with the library open, {with_environment} with the environment, \
         {with_session} with a session (intra 1, inter 1)"
    );
    drop(session);
}
