//! What the build scripts that build `isorun-worker` (its own, and the
//! `isorun` package's for the wheel, `runner/build.rs`) need from the
//! libtensorflow it links: the library's folder, and the index of oneDNN's
//! `dnnl_threadpool_interop_sgemm` in its full symbol table
//! (`ISORUN_ONEDNN_SGEMM_INDEX`), which the zygote checks and calls before
//! it forks (see `src/onednn.rs`).

use std::path::{Path, PathBuf};

// Only `index_of` is used here; the worker uses the rest.
#[allow(dead_code)]
#[path = "src/elf_symbol.rs"]
mod elf_symbol;

/// The folder of the libtensorflow the worker will run with, as the build
/// knows it: `ISORUN_LIBTENSORFLOW_DIR`, else the one `PKG_CONFIG_PATH`
/// names (which `tensorflow-sys` links against). Where the library the
/// zygote loads is another, the zygote's check of the symbol refuses it.
pub fn library_dir() -> Option<PathBuf> {
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
    candidates.into_iter().find(|d| d.join("libtensorflow_cc.so.2").exists())
}

/// Sets `ISORUN_ONEDNN_SGEMM_INDEX` for the crate when the library in `dir`
/// has the symbol (reads its `.symtab` and `.strtab` whole, ~200 MB, when
/// the library changes).
pub fn emit_sgemm_index(dir: &Path) {
    let library = dir.join("libtensorflow_cc.so.2");
    println!("cargo:rerun-if-changed={}", library.display());
    let index = std::fs::File::open(&library)
        .ok()
        .and_then(|file| elf_symbol::index_of(&file, "dnnl_threadpool_interop_sgemm"));
    if let Some(index) = index {
        println!("cargo:rustc-env=ISORUN_ONEDNN_SGEMM_INDEX={index}");
    }
}
