//! `isorun doctor`: what this machine offers isorun, one line per check, so
//! a user (or a support thread) sees at once why models cannot run here, or
//! what isorun will and will not use. It only looks: it starts the worker
//! with `--version` and `--onednn-warmup` and reads files, and changes
//! nothing but the symbol-index cache a first run would fill.

use crate::cli::DoctorArgs;
use crate::error::CliError;
use isorun_engine::locations::{find_libtensorflow, worker_binary, FoundLibtensorflow, LibtensorflowOrigin};
use isorun_protocol::exit_code;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the worker may take to answer `--version` (loading libtensorflow
/// from a cold network file system can take a while).
const WORKER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Present and working.
    Ok,
    /// Not there.
    Missing,
    /// There, but it did not work.
    Failed,
    /// Not checked, because a check it needs failed.
    Skipped,
    /// The kernel or the system offers it.
    Available,
    /// The kernel or the system does not offer it.
    Unavailable,
    /// Optional hardware or software found.
    Found,
    /// Optional hardware or software not found (not a problem).
    None,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "missing",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
            Status::Available => "available",
            Status::Unavailable => "unavailable",
            Status::Found => "found",
            Status::None => "none",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
        Check { name, status, detail: detail.into() }
    }
}

/// Runs the checks and prints them: 0 when models can run, else 1; `Err`
/// is a stdout that cannot be written (exit 2).
pub fn main(args: &DoctorArgs) -> Result<i32, CliError> {
    let asked_libtensorflow = args.worker.libtensorflow_dir.as_deref();
    let libtensorflow = find_libtensorflow(asked_libtensorflow);
    let worker = worker_binary(args.worker.worker.as_deref());
    let worker_start =
        worker_start_check(worker.as_ref().ok(), libtensorflow.as_ref().ok().map(|found| found.dir.as_path()));
    let can_run_models = worker.is_ok() && worker_start.status == Status::Ok;
    let checks = [
        libtensorflow_check(&libtensorflow),
        onnxruntime_check(),
        worker_check(&worker, args.worker.worker.as_deref()),
        worker_start,
        onednn_warmup_check(worker.as_ref().ok(), libtensorflow.as_ref().ok().map(|f| f.dir.as_path()), can_run_models),
        sandbox_check(),
        memory_limit_check(),
        worker_signals_check(),
        gpu_check(),
        keras_check(args.python.as_deref()),
        slurm_check(),
    ];
    // What the checks quote (a worker's --version output, paths) is escaped
    // in text; JSON escapes it itself.
    let text = if args.json {
        format!("{}\n", json_report(&checks, can_run_models))
    } else {
        isorun_report::text::lines(&report(&checks)).to_string()
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(format!("cannot write to stdout: {e}").into()),
    }
    Ok(if can_run_models { exit_code::OK } else { exit_code::SOME_FAILED })
}

/// The checks as aligned lines: `name  status  detail`.
pub fn report(checks: &[Check]) -> String {
    let name_width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0) + 2;
    let status_width = checks.iter().map(|c| c.status.name().len()).max().unwrap_or(0) + 2;
    checks.iter().map(|c| format!("{:name_width$}{:status_width$}{}\n", c.name, c.status.name(), c.detail)).collect()
}

/// `doctor --json`: the same checks as the text, in its order:
/// `{"can_run_models": bool, "checks": [{"name", "status", "detail"}, ...]}`.
pub fn json_report(checks: &[Check], can_run_models: bool) -> serde_json::Value {
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| serde_json::json!({"name": c.name, "status": c.status.name(), "detail": c.detail}))
        .collect();
    serde_json::json!({"can_run_models": can_run_models, "checks": checks})
}

/// Which libtensorflow the workers get, where it came from and its version;
/// when there is none, where isorun looked and how to get one.
fn libtensorflow_check(found: &Result<FoundLibtensorflow, isorun_engine::locations::LibtensorflowNotFound>) -> Check {
    const NAME: &str = "libtensorflow";
    match found {
        Ok(found) => Check::new(NAME, Status::Ok, libtensorflow_detail(found)),
        Err(missing) => Check::new(NAME, Status::Missing, missing.to_string()),
    }
}

/// `DIR (TensorFlow 2.21.0, from the tensorflow-cpu package of this Python
/// environment)`, or `(TensorFlow 2.21.0, cpu; the fetch-libtensorflow cache)`.
pub fn libtensorflow_detail(found: &FoundLibtensorflow) -> String {
    let dir = found.dir.display();
    match &found.origin {
        LibtensorflowOrigin::PythonPackage(package) => format!(
            "{dir} (TensorFlow {}, from the {} package of the Python environment)",
            package.version.as_deref().unwrap_or("version unknown"),
            package.distribution
        ),
        LibtensorflowOrigin::Cache => {
            format!("{dir} ({}; the fetch-libtensorflow cache)", libtensorflow_version(&found.dir))
        }
        LibtensorflowOrigin::Asked => {
            format!(
                "{dir} ({}; from --libtensorflow-dir or ISORUN_LIBTENSORFLOW_DIR)",
                libtensorflow_version(&found.dir)
            )
        }
    }
}

/// Which ONNX Runtime library workers would load for `.onnx` files, its C
/// API version and where it came from; when there is none, where isorun
/// looked and what to run. Optional: SavedModels do not need it.
fn onnxruntime_check() -> Check {
    const NAME: &str = "onnxruntime";
    use isorun_engine::locations::{onnxruntime_library, OnnxruntimeOrigin};
    match onnxruntime_library() {
        Ok(found) if found.too_old().is_some() => Check::new(NAME, Status::Failed, found.too_old().unwrap_or_default()),
        Ok(found) => {
            let origin = match &found.origin {
                OnnxruntimeOrigin::Asked => "from ISORUN_ONNXRUNTIME_DIR".to_string(),
                OnnxruntimeOrigin::PythonPackage(package) => {
                    format!("from the {} package of the Python environment", package.distribution)
                }
                OnnxruntimeOrigin::Cache => "the fetch-onnxruntime cache".to_string(),
            };
            let version = found.version.as_deref().unwrap_or("version unknown");
            Check::new(
                NAME,
                Status::Found,
                format!(
                    "{} (ONNX Runtime {version}, C API {}; {origin}; {}; {})",
                    found.library.display(),
                    found.api_version,
                    match found.cuda_provider() {
                        Some(_) => "CUDA provider beside it, tried where a worker sees a GPU (else the CPU's, with onnxruntime.cuda_error in the record)",
                        None => "CPU provider only",
                    },
                    isorun_engine::onnxruntime_telemetry()
                ),
            )
        }
        Err(missing) => Check::new(NAME, Status::None, format!("{missing} (only .onnx files need it)")),
    }
}

/// `TensorFlow 2.21.0, cpu` from the `.complete` marker that
/// scripts/fetch-libtensorflow writes (`2.21.0 cpu`), else from
/// `tensorflow.pc`'s `Version:` line.
pub fn libtensorflow_version(dir: &Path) -> String {
    if let Ok(marker) = std::fs::read_to_string(dir.join(".complete")) {
        let mut words = marker.split_whitespace();
        if let Some(version) = words.next() {
            return match words.next() {
                Some(variant) => format!("TensorFlow {version}, {variant}"),
                None => format!("TensorFlow {version}"),
            };
        }
    }
    let pc_version = [dir.join("tensorflow.pc"), dir.join("pkgconfig/tensorflow.pc")].iter().find_map(|pc| {
        let text = std::fs::read_to_string(pc).ok()?;
        text.lines().find_map(|line| line.strip_prefix("Version:")).map(|v| v.trim().to_string())
    });
    match pc_version {
        Some(version) if !version.is_empty() => format!("TensorFlow {version}"),
        _ => "version unknown: no .complete marker or tensorflow.pc".to_string(),
    }
}

fn worker_check(worker: &Result<PathBuf, String>, asked: Option<&Path>) -> Check {
    const NAME: &str = "worker";
    match (worker, asked) {
        (Ok(path), _) => Check::new(NAME, Status::Ok, path.display().to_string()),
        (Err(_), Some(asked)) => Check::new(
            NAME,
            Status::Missing,
            format!("no file at {} (from --worker or ISORUN_WORKER)", asked.display()),
        ),
        (Err(message), None) => Check::new(NAME, Status::Missing, message.clone()),
    }
}

/// Starts the worker with `--version`, as `isorun run` would start it (the
/// library folder first on `LD_LIBRARY_PATH`), and reads its answer.
fn worker_start_check(worker: Option<&PathBuf>, libtensorflow: Option<&Path>) -> Check {
    const NAME: &str = "worker start";
    let Some(worker) = worker else {
        return Check::new(NAME, Status::Skipped, "no worker binary");
    };
    let mut command = Command::new(worker);
    command.arg("--version").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(dir) = libtensorflow {
        command.env("LD_LIBRARY_PATH", isorun_engine::library_path(dir));
    }
    match run_with_timeout(&mut command, WORKER_START_TIMEOUT) {
        Err(e) => Check::new(NAME, Status::Failed, format!("cannot start {}: {e}", worker.display())),
        Ok(None) => Check::new(
            NAME,
            Status::Failed,
            format!("{} --version gave no answer in {} s", worker.display(), WORKER_START_TIMEOUT.as_secs()),
        ),
        Ok(Some(ran)) => match (ran.status.success(), first_line(&ran.stdout)) {
            (true, Some(line)) if line.starts_with("isorun-worker ") => Check::new(NAME, Status::Ok, line),
            (true, _) => Check::new(
                NAME,
                Status::Failed,
                format!("{} --version did not say it is isorun-worker", worker.display()),
            ),
            (false, _) => Check::new(NAME, Status::Failed, failure_text(&ran)),
        },
    }
}

/// Whether the zygote makes oneDNN's sgemm kernels once for its workers
/// (the worker's `--onednn-warmup`, with the library `isorun run` gives
/// it): where the library is another build than the one linked, the worker
/// indexes it into the symbol-index cache now, as a zygote would.
fn onednn_warmup_check(worker: Option<&PathBuf>, libtensorflow: Option<&Path>, worker_starts: bool) -> Check {
    const NAME: &str = "onednn warm-up";
    let Some(worker) = worker.filter(|_| worker_starts) else {
        return Check::new(NAME, Status::Skipped, "the worker does not start");
    };
    let mut command = Command::new(worker);
    command.arg("--onednn-warmup").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(dir) = libtensorflow {
        command.env("LD_LIBRARY_PATH", isorun_engine::library_path(dir));
    }
    if let Some(dir) = isorun_engine::locations::symbol_cache_dir() {
        command.env(isorun_protocol::ENV_SYMBOL_CACHE, dir);
    }
    match run_with_timeout(&mut command, WORKER_START_TIMEOUT) {
        Err(e) => Check::new(NAME, Status::Failed, format!("cannot start {}: {e}", worker.display())),
        Ok(None) => Check::new(NAME, Status::Failed, format!("no answer in {} s", WORKER_START_TIMEOUT.as_secs())),
        Ok(Some(ran)) => match first_line(&ran.stdout) {
            Some(line) if line.starts_with("in force") => Check::new(NAME, Status::Available, line),
            Some(line) if line.starts_with("not in force") => Check::new(NAME, Status::Unavailable, line),
            _ => Check::new(NAME, Status::Failed, failure_text(&ran).replacen("--version", "--onednn-warmup", 1)),
        },
    }
}

/// What a finished child said.
struct Finished {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `command` to its end, or kills it after `timeout` (`Ok(None)`).
fn run_with_timeout(command: &mut Command, timeout: Duration) -> std::io::Result<Option<Finished>> {
    let mut child = command.spawn()?;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // Already gone or not: either way it is reaped below.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(status.map(|status| Finished { status, stdout, stderr }))
}

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            // A read error leaves what was read so far, which is all a report needs.
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

fn first_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes).lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

fn last_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes).lines().map(str::trim).rfind(|l| !l.is_empty()).map(str::to_string)
}

/// `exit code 127: ...: error while loading shared libraries: ...`.
fn failure_text(ran: &Finished) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match (ran.status.code(), ran.status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by {}", isorun_protocol::signal_name(signal)),
        (None, None) => "ended".to_string(),
    };
    match last_line(&ran.stderr).or_else(|| last_line(&ran.stdout)) {
        Some(said) => format!("--version failed ({how}): {said}"),
        None => format!("--version failed ({how}) and printed nothing"),
    }
}

/// Landlock confines sandboxed workers (`--sandbox strict`, the default) to
/// the model and the files TensorFlow needs, and (ABI 6) keeps their
/// signals and abstract-socket connections inside. Asks the kernel for its ABI.
fn sandbox_check() -> Check {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute and size 0, this only returns the ABI version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    let abi = if abi > 0 { Ok(abi) } else { Err(std::io::Error::last_os_error().to_string()) };
    sandbox_detail(abi)
}

/// What `isorun doctor` says of a kernel with this Landlock ABI (or without
/// Landlock, and why): the protections a strict worker gets, by the names
/// records use, and those it will report missing.
fn sandbox_detail(abi: Result<i64, String>) -> Check {
    const NAME: &str = "sandbox";
    const ALWAYS: &str = "no_unix_sockets, own_session (seccomp), no_network, no_new_privs, clean_env, work_dir";
    const SCOPES: &str = "signal_scope, abstract_unix_scope (Landlock ABI 6, Linux 6.12)";
    match abi {
        Ok(abi) if abi >= 6 => Check::new(
            NAME,
            Status::Available,
            format!("Landlock ABI {abi}: landlock, signal_scope, abstract_unix_scope, {ALWAYS} (--sandbox strict)"),
        ),
        Ok(abi) => {
            let files = if abi >= 5 { "landlock" } else { "landlock_partial" };
            Check::new(
                NAME,
                Status::Available,
                format!("Landlock ABI {abi}: {files}, {ALWAYS}, signal_filter (seccomp); missing {SCOPES} (--sandbox strict warns)"),
            )
        }
        Err(why) => Check::new(
            NAME,
            Status::Unavailable,
            format!(
                "Landlock unavailable ({why}): {ALWAYS}, signal_filter (seccomp); missing landlock, {SCOPES} (--sandbox strict warns)"
            ),
        ),
    }
}

/// How a worker's memory is watched, and whether a cgroup could do it.
fn memory_limit_check() -> Check {
    const NAME: &str = "memory limit";
    const CONTROLLERS: &str = "/sys/fs/cgroup/cgroup.controllers";
    let cgroup = match std::fs::read_to_string(CONTROLLERS) {
        Ok(controllers) if controllers.split_whitespace().any(|c| c == "memory") => {
            "cgroup v2 memory controller available, not used"
        }
        Ok(_) => "cgroup v2 without the memory controller",
        Err(_) => "no cgroup v2 at /sys/fs/cgroup",
    };
    Check::new(NAME, Status::Ok, format!("worker RSS polling (no delegated cgroup; {cgroup})"))
}

/// How forked workers are signalled (timeouts, memory limit, Ctrl-C):
/// either way works, and a support thread needs to know which is in force.
fn worker_signals_check() -> Check {
    const NAME: &str = "worker signals";
    if isorun_engine::pidfd_signals_process_group() {
        Check::new(NAME, Status::Ok, "pidfd to the process group (Linux ≥ 6.9)")
    } else {
        Check::new(
            NAME,
            Status::Ok,
            "through the zygote (kill of the process group; PIDFD_SIGNAL_PROCESS_GROUP unsupported)",
        )
    }
}

/// NVIDIA devices and driver library; never a problem when absent.
fn gpu_check() -> Check {
    const NAME: &str = "gpu";
    let mut found = Vec::new();
    let devices = nvidia_devices();
    if !devices.is_empty() {
        found.push(format!("{} NVIDIA device(s) ({})", devices.len(), devices.join(", ")));
    }
    let models = nvidia_models();
    if !models.is_empty() {
        found.push(models.join(", "));
    }
    if let Some(library) = find_libcuda() {
        found.push(format!("libcuda.so.1 at {}", library.display()));
    }
    if found.is_empty() {
        Check::new(NAME, Status::None, "none found (no /dev/nvidia*, no libcuda.so.1)")
    } else {
        Check::new(NAME, Status::Found, found.join("; "))
    }
}

/// `/dev/nvidia0`, `/dev/nvidia1`, ... (not `nvidiactl` or `nvidia-uvm`).
fn nvidia_devices() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/dev") else { return Vec::new() };
    let mut devices: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.strip_prefix("nvidia").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|name| format!("/dev/{name}"))
        .collect();
    devices.sort_by_key(|d| (d.len(), d.clone()));
    devices
}

/// GPU model names from the NVIDIA driver (`/proc/driver/nvidia/gpus/*/information`).
fn nvidia_models() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc/driver/nvidia/gpus") else { return Vec::new() };
    let mut models: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("information")).ok())
        .filter_map(|text| text.lines().find_map(|l| l.strip_prefix("Model:")).map(|m| m.trim().to_string()))
        .collect();
    models.sort();
    models
}

/// `libcuda.so.1` in `LD_LIBRARY_PATH` or the usual library folders; looked
/// for, never loaded (the supervisor loads no GPU library).
fn find_libcuda() -> Option<PathBuf> {
    let from_env = std::env::var_os("LD_LIBRARY_PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    let usual = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/lib/wsl/lib",
    ]
    .map(PathBuf::from);
    from_env.into_iter().chain(usual).map(|dir| dir.join("libcuda.so.1")).find(|path| path.exists())
}

/// Slurm's `sbatch`, to spread runs over a cluster; never a problem when absent.
/// The Python that would export Keras files, and its Keras and TensorFlow
/// (asked anew, without the cache: the doctor reports what is there now).
fn keras_check(asked: Option<&Path>) -> Check {
    const NAME: &str = "keras";
    use isorun_engine::keras::python;
    let program = match python::choose(asked) {
        Ok(program) => program,
        Err(reason) => return Check::new(NAME, Status::None, reason),
    };
    match python::probe(&program, None) {
        Ok(found) => Check::new(
            NAME,
            Status::Found,
            format!(
                "{} (Python {}): Keras {}, TensorFlow {}{}; .keras and .h5 files run",
                found.program.display(),
                found.version,
                found.keras,
                found.tensorflow,
                found.tf_keras.as_deref().map(|v| format!(", tf_keras {v} (Keras 2 files)")).unwrap_or_default()
            ),
        ),
        Err(reason) => Check::new(NAME, Status::None, format!("{reason} (SavedModels are unaffected)")),
    }
}

fn slurm_check() -> Check {
    const NAME: &str = "slurm";
    match find_on_path("sbatch") {
        Some(path) => Check::new(NAME, Status::Found, format!("sbatch at {}", path.display())),
        None => Check::new(NAME, Status::None, "sbatch not on PATH"),
    }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_aligns_the_columns() {
        let checks = [
            Check::new("libtensorflow", Status::Ok, "/lib (TensorFlow 2.21.0, cpu)"),
            Check::new("gpu", Status::None, "none found"),
            Check::new("sandbox", Status::Unavailable, "no"),
        ];
        assert_eq!(
            report(&checks),
            "libtensorflow  ok           /lib (TensorFlow 2.21.0, cpu)\n\
             gpu            none         none found\n\
             sandbox        unavailable  no\n"
        );
    }

    #[test]
    fn json_report_has_every_check_in_order() {
        let checks = [
            Check::new("libtensorflow", Status::Ok, "/lib (TensorFlow 2.21.0, cpu)"),
            Check::new("gpu", Status::None, "none \x1b found"),
        ];
        assert_eq!(
            json_report(&checks, true),
            serde_json::json!({"can_run_models": true, "checks": [
                {"name": "libtensorflow", "status": "ok", "detail": "/lib (TensorFlow 2.21.0, cpu)"},
                {"name": "gpu", "status": "none", "detail": "none \x1b found"},
            ]})
        );
        assert!(!json_report(&checks, false).to_string().contains('\x1b'), "escaped by JSON");
    }

    #[test]
    fn the_sandbox_line_names_what_each_landlock_abi_gives_and_lacks() {
        let said = |abi| sandbox_detail(abi).detail;
        let new = said(Ok(7));
        assert!(new.contains("signal_scope, abstract_unix_scope") && !new.contains("missing"), "{new}");
        let six_ten = said(Ok(5));
        assert!(six_ten.starts_with("Landlock ABI 5: landlock,"), "{six_ten}");
        assert!(six_ten.contains("missing signal_scope, abstract_unix_scope"), "{six_ten}");
        assert!(said(Ok(3)).contains("landlock_partial"));
        let none = said(Err("Function not implemented".into()));
        assert!(
            none.contains("missing landlock, signal_scope")
                && none.contains("no_unix_sockets")
                && none.contains("own_session"),
            "{none}"
        );
        assert!(none.contains("signal_filter") && six_ten.contains("signal_filter") && !new.contains("signal_filter"));
        assert_eq!(sandbox_detail(Err(String::new())).status, Status::Unavailable);
    }

    #[test]
    fn version_comes_from_the_marker_else_from_tensorflow_pc() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(libtensorflow_version(tmp.path()).starts_with("version unknown"));
        std::fs::create_dir(tmp.path().join("pkgconfig")).unwrap();
        std::fs::write(tmp.path().join("pkgconfig/tensorflow.pc"), "Name: tensorflow\nVersion: 2.20.0\n").unwrap();
        assert_eq!(libtensorflow_version(tmp.path()), "TensorFlow 2.20.0");
        std::fs::write(tmp.path().join(".complete"), "2.21.0 cpu\n").unwrap();
        assert_eq!(libtensorflow_version(tmp.path()), "TensorFlow 2.21.0, cpu");
    }

    #[test]
    fn a_child_that_hangs_is_killed_at_the_timeout() {
        let started = Instant::now();
        let mut command = Command::new("sleep");
        command.arg("30").stdout(Stdio::piped()).stderr(Stdio::piped());
        assert!(run_with_timeout(&mut command, Duration::from_millis(200)).unwrap().is_none());
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
