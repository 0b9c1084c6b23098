//! Helpers that drive the real binaries: locate them next to this test
//! binary's target folder, run `isorun` with arguments, and parse what it
//! prints. Binaries come from `cargo build --workspace` (scripts/test).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `target/<profile>/`, where cargo put the binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/..").to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace; scripts/test does)",
        path.display()
    );
    path
}

/// The repository's `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The fixtures venv's Python (TensorFlow, Keras, pandas, pyarrow; made by
/// `scripts/make-fixtures`, or `ISORUN_KERAS_PYTHON`), or `None` after
/// saying that `what` is skipped.
pub fn fixtures_python(what: &str) -> Option<PathBuf> {
    let python = std::env::var_os("ISORUN_KERAS_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache"));
        cache.join("isorun/fixtures-venv/bin/python")
    });
    if python.is_file() {
        return Some(python);
    }
    eprintln!(
        "NOTE: {what} SKIPPED: no fixtures Python at {} (run scripts/make-fixtures, or set ISORUN_KERAS_PYTHON)",
        python.display()
    );
    None
}

/// `isorun` with a clean environment for the settings it reads.
pub fn isorun() -> Command {
    let mut command = Command::new(bin("isorun"));
    for var in ["ISORUN_WORKER", "ISORUN_JOBS", "ISORUN_TIMEOUT"] {
        command.env_remove(var);
    }
    command.stdin(Stdio::null());
    command
}

/// `isorun run` using the fault-injection worker.
pub fn isorun_fault(worker_args: &[&str]) -> Command {
    let mut command = isorun();
    command.env("ISORUN_WORKER", bin("isorun-fault-worker")).arg("run");
    for arg in worker_args {
        command.arg(format!("--worker-arg={arg}"));
    }
    command
}

/// What a finished `isorun` said.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub records: Vec<Value>,
}

impl Ran {
    /// The record of model `id`.
    pub fn record(&self, id: &str) -> &Value {
        self.records
            .iter()
            .find(|r| r["model"] == id)
            .unwrap_or_else(|| panic!("no record for {id} in:\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }

    pub fn statuses(&self) -> Vec<(String, String)> {
        self.records
            .iter()
            .map(|r| (r["model"].as_str().unwrap().to_string(), r["status"].as_str().unwrap().to_string()))
            .collect()
    }
}

pub fn ran(output: Output) -> Ran {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    // JSON Lines output is parsed strictly; other outputs (tables, scripts) have no records.
    let records = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}")))
        .collect();
    Ran { code: output.status.code(), stdout, stderr, records }
}

/// Runs a command to its end.
pub fn run(command: &mut Command) -> Ran {
    ran(command.output().expect("run isorun"))
}

/// Makes placeholder model folders (a `saved_model.pb` each) for the fault
/// worker, which reads its orders from the folder name.
pub fn fake_models(root: &Path, names: &[&str]) {
    for name in names {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("saved_model.pb"), b"").unwrap();
    }
}

/// The bytes of an `.npy` file (version 1.0) with this header dictionary and data.
/// Adds `delta` to element `index` of a float32 `.npy` file, in place (a
/// golden output made to differ).
pub fn nudge_f32_npy(path: &Path, index: usize, delta: f32) {
    let mut tensor = isorun_tensors::npy::read_npy_file(path).unwrap();
    let isorun_protocol::TensorData::Dense(bytes) = &mut tensor.data else { panic!("{}: not dense", path.display()) };
    let at = index * 4..index * 4 + 4;
    let value = f32::from_le_bytes(bytes[at.clone()].try_into().unwrap()) + delta;
    bytes[at].copy_from_slice(&value.to_le_bytes());
    isorun_tensors::npy::write_npy(std::fs::File::create(path).unwrap(), &tensor).unwrap();
}

pub fn npy_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// A small float32 input file `x.npy` of shape [2, 3].
pub fn write_input(dir: &Path) -> PathBuf {
    let path = dir.join("x.npy");
    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", &data)).unwrap();
    path
}

/// Copies a folder (a fixture model, a few KiB) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Processes whose command line mentions `needle` (other than this test).
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!("{pid}: {cmdline}"));
        }
    }
    found
}

/// Live fault workers with `marker` in their command line, never zygotes:
/// a forked worker has its zygote's command line (`--zygote` included) but
/// the zygote as its parent; zygotes are children of the supervisor.
pub fn fault_workers(marker: &str, supervisor: u32) -> Vec<u32> {
    processes_mentioning(marker)
        .into_iter()
        .filter(|line| line.contains("isorun-fault-worker"))
        .filter_map(|line| line.split_once(':').and_then(|(pid, _)| pid.parse::<u32>().ok()).map(|pid| (pid, line)))
        .filter(|(pid, line)| !(line.contains("--zygote") && parent(*pid) == Some(supervisor)))
        .map(|(pid, _)| pid)
        .collect()
}

/// Waits until `count` fault workers (never zygotes) with `marker` run
/// under `supervisor`; their pids, or `None` after 20 s.
pub fn wait_for_fault_workers(marker: &str, supervisor: u32, count: usize) -> Option<Vec<u32>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let found = fault_workers(marker, supervisor);
        if found.len() >= count {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the state).
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()
}

/// Waits until no process has pid `pid` (not even a zombie: it was
/// reaped); false if it still exists after `within`.
pub fn gone_within(pid: u32, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while Path::new(&format!("/proc/{pid}")).exists() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// The supervisor's peak memory, in MiB, from `--summary`'s last line on stderr.
pub fn supervisor_peak_mib(ran: &Ran) -> f64 {
    ran.stderr
        .split("supervisor peak memory ")
        .nth(1)
        .and_then(|rest| rest.split(" MiB").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no supervisor peak in:\n{}", ran.stderr))
}

/// A unit record without what changes from run to run, in the unit and in
/// each of its attempts: times, memory, the worker (its id, and whether it
/// was forked or exec'd, which depends on how the models were split into
/// shards and slots) and whether it was resumed from a journal.
pub fn without_run_details(unit: &Value) -> Value {
    let mut unit = unit.clone();
    let forget = |record: &mut Value| {
        let volatile = [
            "wall_ms",
            "phases_ms",
            "load_ms",
            "run_ms",
            "user_ms",
            "sys_ms",
            "peak_rss_bytes",
            "worker_id",
            "worker_start",
            "spare",
            "resumed",
        ];
        for key in volatile {
            record.as_object_mut().unwrap().remove(key);
        }
    };
    forget(&mut unit);
    if let Some(attempts) = unit.get_mut("attempts").and_then(Value::as_array_mut) {
        attempts.iter_mut().for_each(forget);
    }
    unit
}

/// Waits for `child` until `deadline`; past it, kills and reaps it and
/// returns `None` (the caller says what did not end in time).
pub fn wait_until(child: &mut std::process::Child, deadline: std::time::Instant) -> Option<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The evaluation fixtures (`tests/fixtures/eval`: models, data and the
/// expected metrics scikit-learn gives), as the eval-side modules name them.
pub mod eval_fixtures {
    use std::path::PathBuf;

    pub fn dir() -> PathBuf {
        super::fixtures().join("eval")
    }

    pub fn model(name: &str) -> PathBuf {
        dir().join("models").join(name)
    }

    pub fn data(name: &str) -> PathBuf {
        dir().join("data").join(name)
    }

    /// `expected.json`: each case's model, label, flags and metrics.
    pub fn expected() -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
    }

    /// A case's `flags`, as arguments.
    pub fn case_flags(case: &serde_json::Value) -> Vec<String> {
        case["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect()
    }

    /// `isorun eval MODELS --data DATA --label LABEL -j 1 --json ARGS`.
    pub fn eval<S: AsRef<std::ffi::OsStr>>(
        models: &[PathBuf],
        data: &std::path::Path,
        label: &str,
        args: &[S],
    ) -> super::Ran {
        super::run(
            super::isorun()
                .arg("eval")
                .args(models)
                .arg("--data")
                .arg(data)
                .args(["--label", label, "-j", "1", "--json"])
                .args(args),
        )
    }
}
