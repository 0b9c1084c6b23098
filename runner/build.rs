//! For the wheel's `isorun-worker` only (feature `wheel`): the index of
//! oneDNN's sgemm in the libtensorflow it links, as the worker's own build
//! finds it (`worker/libtensorflow_build.rs`). No RUNPATH: the wheel's
//! worker finds libtensorflow through the supervisor.

#[path = "../worker/libtensorflow_build.rs"]
mod libtensorflow_build;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_WHEEL").is_none() {
        return;
    }
    if let Some(dir) = libtensorflow_build::library_dir() {
        libtensorflow_build::emit_sgemm_index(&dir);
    }
}
