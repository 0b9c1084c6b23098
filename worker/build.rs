//! Gives `isorun-worker` a fallback RUNPATH to the libtensorflow folder it
//! was linked against, so that running it straight from `target/` works.
//! The supervisor does not rely on it: it sets the library path of every
//! worker it starts from `ISORUN_LIBTENSORFLOW_DIR` or the default cache, so
//! the binaries keep working when moved (RUNPATH yields to that path).
//!
//! It also finds, once, the index of oneDNN's `dnnl_threadpool_interop_sgemm`
//! in that library's full symbol table (`ISORUN_ONEDNN_SGEMM_INDEX`), which
//! the zygote checks and calls before it forks (see `src/onednn.rs`).

use std::path::PathBuf;

// Only `index_of` is used here; the worker uses the rest.
#[allow(dead_code)]
#[path = "src/elf_symbol.rs"]
mod elf_symbol;

fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=ISORUN_LIBTENSORFLOW_DIR");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("ISORUN_LIBTENSORFLOW_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(paths) = std::env::var_os("PKG_CONFIG_PATH") {
        for dir in std::env::split_paths(&paths) {
            if dir.join("tensorflow.pc").is_file() {
                candidates.push(dir.join(".."));
            }
        }
    }
    let Some(dir) = candidates.into_iter().find(|d| d.join("libtensorflow_cc.so.2").exists()) else { return };
    let library = dir.join("libtensorflow_cc.so.2");
    println!("cargo:rerun-if-changed={}", library.display());
    if let Ok(dir) = dir.canonicalize() {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", dir.display());
    }
    let index = std::fs::File::open(&library)
        .ok()
        .and_then(|file| elf_symbol::index_of(&file, "dnnl_threadpool_interop_sgemm"));
    if let Some(index) = index {
        println!("cargo:rustc-env=ISORUN_ONEDNN_SGEMM_INDEX={index}");
    }
}
