//! Workers are killed on kernels before Linux 6.9 too, where
//! `pidfd_send_signal` knows no `PIDFD_SIGNAL_PROCESS_GROUP`: each run here
//! goes through `isorun-deny-pidfd-group`, which makes that call fail as
//! those kernels do (EINVAL), and each test asserts what users rely on: the
//! worker's pid is gone soon after its timeout, memory limit or Ctrl-C.

use crate::util::{bin, fake_models, fault_workers, gone_within, isorun, isorun_fault, parent, ran, write_input, Ran};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--timeout` of the hanging runs.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The supervisor's grace between SIGTERM and SIGKILL (`run.rs`).
const GRACE: Duration = Duration::from_secs(2);
/// What a noisy, shared machine may add to any of these.
const SLACK: Duration = Duration::from_secs(5);

/// `command`, run under the filter that denies `PIDFD_SIGNAL_PROCESS_GROUP`.
fn as_on_an_old_kernel(command: &Command) -> Command {
    let mut wrapped = Command::new(bin("isorun-deny-pidfd-group"));
    wrapped.arg(command.get_program()).args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    wrapped.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    wrapped
}

/// A running `isorun`, killed (and its zygotes and workers with it, by
/// their death signal) if a test fails before it ends.
struct Running(Option<Child>);

impl Running {
    fn start(mut command: Command) -> Running {
        Running(Some(command.spawn().expect("start isorun under isorun-deny-pidfd-group")))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// The pid of the first worker (forked or exec'd, never a zygote)
    /// started with `marker` among its arguments.
    fn wait_for_worker(&self, marker: &str) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pid) = fault_workers(marker, self.pid()).first() {
                return *pid;
            }
            assert!(Instant::now() < deadline, "no worker started in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether `worker` was forked by a zygote (else exec'd by the supervisor).
    fn forked(&self, worker: u32) -> bool {
        parent(worker).is_some_and(|parent| parent != self.pid())
    }

    fn finish(mut self) -> Ran {
        ran(self.0.take().expect("running").wait_with_output().unwrap())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `isorun run` on one fake model under the filter.
fn start(tmp: &Path, model: &str, worker_args: &[&str], extra: &[&str]) -> Running {
    fake_models(&tmp.join("models"), &[model]);
    let input = write_input(tmp);
    let mut command = isorun_fault(worker_args);
    command.arg(tmp.join("models")).arg(format!("--input=x={}", input.display())).args(["-j", "1"]).args(extra);
    Running::start(as_on_an_old_kernel(&command))
}

fn marker(name: &str) -> String {
    format!("old-kernel-{}-{name}", std::process::id())
}

/// A worker that hangs past `--timeout` is gone within the timeout and the
/// grace period (it dies of SIGTERM, or of the SIGKILL after the grace).
fn hung_worker_is_gone_after_the_timeout(spawn: &str, worker_args: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let marker = marker(&format!("timeout-{spawn}-{}", worker_args.len()));
    let mut args = vec![marker.as_str()];
    args.extend_from_slice(worker_args);
    let timeout = TIMEOUT.as_secs().to_string();
    let run = start(tmp.path(), "a-fault-hang", &args, &["--timeout", &timeout, "--spawn", spawn]);
    let worker = run.wait_for_worker(&marker);
    let seen = Instant::now();
    assert_eq!(run.forked(worker), spawn == "zygote", "worker {worker} under --spawn {spawn}");
    let within = TIMEOUT + GRACE + SLACK;
    assert!(gone_within(worker, within), "{spawn} worker {worker} still exists {within:?} after it started");
    let waited = seen.elapsed();
    let ran = run.finish();
    let record = ran.record("a-fault-hang");
    assert_eq!((record["status"].as_str(), record["phase"].as_str()), (Some("timeout"), Some("run")), "{record}");
    eprintln!("{spawn} {worker_args:?}: worker gone {waited:?} after it was seen");
}

#[test]
fn a_forked_worker_past_its_timeout_is_gone() {
    hung_worker_is_gone_after_the_timeout("zygote", &[]);
}

#[test]
fn a_forked_worker_ignoring_sigterm_is_gone_after_the_grace() {
    hung_worker_is_gone_after_the_timeout("zygote", &["--ignore-term"]);
}

#[test]
fn an_execd_worker_past_its_timeout_is_gone() {
    hung_worker_is_gone_after_the_timeout("exec", &[]);
}

#[test]
fn a_forked_worker_over_the_memory_limit_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = marker("memory");
    // Grows by 16 MiB steps to 2 GiB, then hangs; killed at once past 1 GB
    // (a limit that takes a while to reach, so the test sees the worker first).
    let limit = ["--memory-limit", "1G", "--timeout", "60", "--spawn", "zygote"];
    let run = start(tmp.path(), "a-fault-hog-2048", &[&marker], &limit);
    let worker = run.wait_for_worker(&marker);
    assert!(run.forked(worker), "worker {worker} was not forked");
    assert!(gone_within(worker, SLACK + SLACK), "worker {worker} still exists {:?} after it started", SLACK + SLACK);
    let ran = run.finish();
    assert_eq!(ran.record("a-fault-hog-2048")["status"], "memory_limit", "{}", ran.stdout);
}

#[test]
fn ctrl_c_leaves_no_forked_worker_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = marker("ctrl-c");
    let run = start(tmp.path(), "a-fault-hang", &[&marker], &["--spawn", "zygote"]);
    // A worker, not only its zygote, exists before the Ctrl-C.
    let worker = run.wait_for_worker(&marker);
    assert!(run.forked(worker), "worker {worker} was not forked");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(run.pid() as i32, libc::SIGINT) };
    let within = GRACE + SLACK;
    assert!(gone_within(worker, within), "worker {worker} still exists {within:?} after Ctrl-C");
    let ran = run.finish();
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    assert_eq!(ran.record("a-fault-hang")["reason"], "interrupted");
}

/// The `worker signals` detail of `isorun doctor`, run as `command` has it.
fn doctor_signals(command: Command) -> String {
    let output = Running::start(command).finish();
    let line = output.stdout.lines().find(|l| l.starts_with("worker signals  ")).map(str::to_string);
    line.unwrap_or_else(|| panic!("no 'worker signals' line in:\n{}", output.stdout))
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release.trim().split(|c: char| !c.is_ascii_digit()).map(|n| n.parse().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

#[test]
fn doctor_says_how_workers_are_signalled() {
    let mut doctor = isorun();
    doctor.arg("doctor");
    let filtered = doctor_signals(as_on_an_old_kernel(&doctor));
    assert!(filtered.contains("through the zygote"), "{filtered}");
    assert!(filtered.contains("PIDFD_SIGNAL_PROCESS_GROUP unsupported"), "{filtered}");
    doctor.stdout(Stdio::piped()).stderr(Stdio::piped());
    let plain = doctor_signals(doctor);
    if kernel_version() >= (6, 9) {
        assert!(plain.contains("pidfd to the process group"), "{plain}");
    } else {
        assert!(plain.contains("through the zygote"), "{plain}");
    }
}
