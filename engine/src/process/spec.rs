//! How a worker or zygote process is started: the binary, its library
//! path, its arguments and its environment. A leaf shared by the exec path
//! (`worker.rs`) and the zygote client (`zygote.rs`), so neither imports
//! the other for it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to start workers.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub worker: PathBuf,
    /// Folder holding libtensorflow, put first on the worker's library path.
    pub lib_dir: Option<PathBuf>,
    /// Extra arguments (the fault-injection worker in tests takes its orders this way).
    pub args: Vec<String>,
    /// Largest frame accepted from a worker.
    pub max_frame: u64,
    /// Start workers with an environment cleared down to an allow-list
    /// (`--sandbox strict`): a model can read its process's initial
    /// environment through `/proc/self/environ`, so it must be clean from exec.
    pub clean_env: bool,
    /// The GPUs the worker sees, as `CUDA_VISIBLE_DEVICES`: one device (a
    /// slot's, from `--gpus`, with `CUDA_DEVICE_ORDER=PCI_BUS_ID`), `""` for
    /// none, or `None` to leave the variable as the environment has it.
    pub gpu: Option<String>,
}

/// Environment variables a sandboxed worker keeps: prefixes and names.
const ENV_PREFIXES: &[&str] = &["TF_", "CUDA_", "LC_", "OMP_", "KMP_"];
const ENV_NAMES: &[&str] = &["LANG", "LANGUAGE", "TZ"];

/// Applies the spec's environment to a worker or zygote command.
pub fn worker_environment(command: &mut Command, spec: &SpawnSpec) {
    if spec.clean_env {
        command.env_clear();
        for (name, value) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if ENV_NAMES.contains(&text.as_ref()) || ENV_PREFIXES.iter().any(|p| text.starts_with(p)) {
                command.env(&name, value);
            }
        }
    }
    if let Some(lib_dir) = &spec.lib_dir {
        command.env("LD_LIBRARY_PATH", library_path(lib_dir));
    }
    if let Some(devices) = &spec.gpu {
        command.env("CUDA_VISIBLE_DEVICES", devices);
        if !devices.is_empty() {
            // Indexes as nvidia-smi (NVML) numbers devices, not fastest first.
            command.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        }
    }
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        command.env("TF_CPP_MIN_LOG_LEVEL", "2");
    }
}

/// `LD_LIBRARY_PATH` with `lib_dir` first, then its `cuda/` folder if it
/// has one (the CUDA libraries of `scripts/fetch-libtensorflow --gpu`).
pub fn library_path(lib_dir: &Path) -> std::ffi::OsString {
    let mut value = lib_dir.as_os_str().to_owned();
    let cuda = lib_dir.join("cuda");
    if cuda.is_dir() {
        value.push(":");
        value.push(cuda);
    }
    if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}
