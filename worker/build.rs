//! Gives `isorun-worker` a fallback RUNPATH to the libtensorflow folder it
//! was linked against, so that running it straight from `target/` works.
//! The supervisor does not rely on it: it sets the library path of every
//! worker it starts from `ISORUN_LIBTENSORFLOW_DIR` or the default cache, so
//! the binaries keep working when moved (RUNPATH yields to that path). And
//! the index of oneDNN's sgemm in that library (`libtensorflow_build.rs`).

mod libtensorflow_build;

fn main() {
    let Some(dir) = libtensorflow_build::library_dir() else { return };
    if let Ok(canonical) = dir.canonicalize() {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", canonical.display());
    }
    libtensorflow_build::emit_sgemm_index(&dir);
}
