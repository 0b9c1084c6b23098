//! Gives `isorun-worker` a fallback RUNPATH to the libtensorflow folder it
//! was linked against, so that running it straight from `target/` works.
//! The supervisor does not rely on it: it sets the library path of every
//! worker it starts from `ISORUN_LIBTENSORFLOW_DIR` or the default cache, so
//! the binaries keep working when moved (RUNPATH yields to that path).

use std::path::PathBuf;

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
    if let Some(dir) =
        candidates.into_iter().filter(|d| d.join("libtensorflow_cc.so.2").exists()).find_map(|d| d.canonicalize().ok())
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", dir.display());
    }
}
