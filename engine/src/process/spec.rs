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

/// Applies the spec's environment to a worker or zygote command.
pub fn worker_environment(command: &mut Command, spec: &SpawnSpec) {
    if spec.clean_env {
        command.env_clear();
        for (name, value) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if isorun_sandbox::keeps_user_variable(&text) {
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
    if user_telemetry_setting().is_none() {
        command.env(ORT_TELEMETRY, "1");
    }
}

/// `ORT_DISABLE_TELEMETRY` as the user set it; empty is not set.
fn user_telemetry_setting() -> Option<std::ffi::OsString> {
    std::env::var_os(ORT_TELEMETRY).filter(|v| !v.is_empty())
}

/// What workers' ONNX Runtime is told of its telemetry, for `isorun doctor`:
/// `ORT_DISABLE_TELEMETRY` as the user set it, else isorun's `1`.
pub fn onnxruntime_telemetry() -> String {
    match user_telemetry_setting() {
        None => format!("telemetry off in workers ({ORT_TELEMETRY}=1)"),
        Some(value) => format!("{ORT_TELEMETRY}={} as you set it", value.to_string_lossy()),
    }
}

/// ONNX Runtime 1.32's own opt-out of its telemetry on Linux. Unless told
/// otherwise, each environment it makes starts a thread, opens a SQLite
/// database under `~/.cache/Microsoft/DeveloperTools` and queues events for
/// `mobile.events.data.microsoft.com` (the strings in `libonnxruntime.so`);
/// `ort`'s `with_telemetry(false)` only disables events after all that.
/// isorun's workers send nothing anywhere, and every ONNX unit makes its
/// environment afresh, so it is off unless the user set the variable.
const ORT_TELEMETRY: &str = "ORT_DISABLE_TELEMETRY";

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

/// What `WORKER --version` prints, run as a worker would be (same library
/// path and environment): the worker's own version and the TensorFlow
/// version it loads. `Err` says why there is no answer (it failed to start,
/// exited with an error, or took more than `timeout`).
pub fn worker_version(spec: &SpawnSpec, timeout: std::time::Duration) -> Result<String, String> {
    use std::io::Read;
    let mut command = Command::new(&spec.worker);
    command
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    worker_environment(&mut command, spec);
    let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", spec.worker.display()))?;
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} --version took more than {timeout:?}", spec.worker.display()));
            }
            Err(e) => return Err(format!("{} --version: {e}", spec.worker.display())),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if !status.success() {
        return Err(format!("{} --version failed ({status})", spec.worker.display()));
    }
    Ok(out.trim().to_string())
}
