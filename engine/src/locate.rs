//! Where the worker binary and libtensorflow are. The supervisor passes the
//! library folder to every worker it starts, so nobody sets
//! `LD_LIBRARY_PATH` and the binaries keep working when moved.

use std::path::{Path, PathBuf};

/// The TensorFlow version `scripts/fetch-libtensorflow` fetches.
pub const TENSORFLOW_VERSION: &str = "2.21.0";

/// The default cache folder of libtensorflow.
pub fn default_libtensorflow_dir() -> Option<PathBuf> {
    default_libtensorflow_dir_for("cpu")
}

/// The cache folder of one build of libtensorflow: `cpu`, or `gpu`
/// (`scripts/fetch-libtensorflow --gpu`, with the CUDA libraries in `cuda/`).
pub fn default_libtensorflow_dir_for(variant: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join(format!("libtensorflow-{TENSORFLOW_VERSION}-{variant}")))
}

/// The libtensorflow folder to give workers: the one asked for, else the
/// default cache, if it holds the library.
pub fn libtensorflow_dir(asked: Option<&Path>) -> Option<PathBuf> {
    let dir = asked.map(Path::to_path_buf).or_else(default_libtensorflow_dir)?;
    dir.join("libtensorflow_cc.so.2").exists().then_some(dir)
}

/// The worker binary: the one asked for, else `isorun-worker` next to this
/// executable (or one folder up, for a program cargo built into
/// `target/<profile>/examples/` or `deps/`, such as an embedding example).
pub fn worker_binary(asked: Option<&Path>) -> Result<PathBuf, String> {
    let path = match asked {
        Some(path) => path.to_path_buf(),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable's folder: {e}"))?;
            let beside = exe.with_file_name("isorun-worker");
            let in_cargo_subfolder =
                exe.parent().and_then(Path::file_name).is_some_and(|name| name == "examples" || name == "deps");
            match exe.parent().and_then(Path::parent) {
                Some(up) if in_cargo_subfolder && !beside.is_file() => up.join("isorun-worker"),
                _ => beside,
            }
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "worker binary not found at {}; build it (cargo build -p isorun-worker) or name one with --worker / ISORUN_WORKER",
            path.display()
        ))
    }
}
