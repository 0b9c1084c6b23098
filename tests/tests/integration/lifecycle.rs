//! The supervisor's own promises: it never loads TensorFlow, it leaves no
//! process behind when interrupted, it reports every model even then, and
//! its memory does not grow with the number of units.

use crate::util::copy_dir;
use crate::util::{
    bin, fake_models, fixtures, gone_within, isorun, isorun_fault, processes_mentioning, ran, wait_for_fault_workers,
    write_input,
};

/// Live fault workers started with `marker` among their arguments.
fn workers(marker: &str) -> Vec<String> {
    processes_mentioning(marker).into_iter().filter(|p| p.contains("isorun-fault-worker")).collect()
}
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// Starts `isorun` on three hanging models with a marker in the workers'
/// command lines, and waits until two workers (not zygotes: each has
/// received its unit) run; their pids.
fn start_hanging_run(tmp: &std::path::Path, marker: &str, extra_worker_args: &[&str]) -> (Child, Vec<u32>) {
    fake_models(&tmp.join("models"), &["a-fault-hang", "b-fault-hang", "c-fault-hang"]);
    let input = write_input(tmp);
    let mut worker_args = vec![marker];
    worker_args.extend_from_slice(extra_worker_args);
    let mut child = isorun_fault(&worker_args)
        .arg(tmp.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(pids) = wait_for_fault_workers(marker, child.id(), 2) else {
        // Leave nothing running behind a failed test.
        let _ = child.kill();
        let _ = child.wait();
        panic!("timed out waiting for two workers");
    };
    (child, pids)
}

fn interrupted(sig: i32, expected_code: i32) {
    let tmp = tempfile::tempdir().unwrap();
    let marker = format!("marker-{}-{sig}", std::process::id());
    let (child, pids) = start_hanging_run(tmp.path(), &marker, &[]);
    signal(&child, sig);
    let ran = ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(expected_code), "{}", ran.stderr);
    // Every model has its record; the interrupted ones say so.
    assert_eq!(ran.records.len(), 3, "{}", ran.stdout);
    for record in &ran.records {
        assert_eq!(record["status"], "not_run", "{record}");
        assert_eq!(record["reason"], "interrupted");
    }
    assert_eq!(workers(&marker), Vec::<String>::new(), "no worker left behind");
    for pid in pids {
        assert!(gone_within(pid, Duration::ZERO), "worker {pid} left behind");
    }
}

#[test]
fn ctrl_c_reports_every_model_and_leaves_no_process_behind() {
    interrupted(libc::SIGINT, 130);
}

#[test]
fn sigterm_exits_143_and_leaves_no_process_behind() {
    interrupted(libc::SIGTERM, 143);
}

/// A parent that died (a Python program running isorun, killed) leaves
/// isorun with closed stdout and stderr: Ctrl-C must still stop it, though
/// it can no longer say so (the signal thread once died writing to stderr).
#[test]
fn ctrl_c_stops_a_run_whose_stdout_and_stderr_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = format!("marker-{}-closed-pipes", std::process::id());
    let (mut child, pids) = start_hanging_run(tmp.path(), &marker, &[]);
    drop(child.stdout.take());
    drop(child.stderr.take());
    signal(&child, libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = crate::util::wait_until(&mut child, deadline)
        .unwrap_or_else(|| panic!("isorun did not stop within 15 s of Ctrl-C with its stdout and stderr closed"));
    assert!(matches!(status.code(), Some(0 | 130)), "{status:?}");
    assert_eq!(workers(&marker), Vec::<String>::new(), "no worker left behind");
    for pid in pids {
        assert!(gone_within(pid, Duration::from_secs(5)), "worker {pid} left behind");
    }
}

/// The supervisor's grace between SIGTERM and SIGKILL (`runner/src/settings.rs`).
const GRACE: Duration = Duration::from_secs(2);

#[test]
fn a_worker_ignoring_sigterm_is_killed_and_a_second_ctrl_c_does_not_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = format!("marker-{}-stubborn", std::process::id());
    let (mut child, pids) = start_hanging_run(tmp.path(), &marker, &["--ignore-term"]);
    signal(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(100));
    signal(&child, libc::SIGINT);
    let second = Instant::now();
    let status = child.wait().unwrap();
    let took = second.elapsed();
    assert_eq!(status.code(), Some(130));
    // The workers ignore SIGTERM: waiting out the grace would take another
    // 1.9 s; the second Ctrl-C kills them at once.
    eprintln!("second Ctrl-C to exit: {took:?}");
    assert!(took < GRACE * 3 / 4, "the second Ctrl-C waited {took:?}, near the {GRACE:?} grace");
    assert_eq!(workers(&marker), Vec::<String>::new(), "no worker left behind");
    for pid in pids {
        assert!(gone_within(pid, Duration::ZERO), "worker {pid} left behind");
    }
}

#[test]
fn the_supervisor_never_maps_libtensorflow() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = format!("marker-{}-maps", std::process::id());
    let (mut child, _) = start_hanging_run(tmp.path(), &marker, &[]);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();
    assert!(maps.contains("isorun"), "maps were read");
    assert!(!maps.contains("libtensorflow"), "the supervisor mapped libtensorflow");
    // Its workers die with it (PR_SET_PDEATHSIG), even after a SIGKILL.
    wait_for("workers to die with the supervisor", Duration::from_secs(10), || workers(&marker).is_empty());
}

/// VmRSS of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn two_hundred_real_units_do_not_grow_the_supervisor() {
    // 200 copies of a small real model: each unit is a real TensorFlow worker.
    let tmp = tempfile::tempdir().unwrap();
    let source = fixtures().join("models/multi_sig");
    for i in 0..200 {
        copy_dir(&source, &tmp.path().join(format!("models/m{i:03}")));
    }
    let inputs = fixtures().join("expected/multi_sig__add/inputs.npz");
    let mut child = isorun()
        .arg("run")
        .arg(tmp.path().join("models"))
        .args(["--signature", "add", "--inputs"])
        .arg(&inputs)
        .args(["-j", "2"])
        .env("ISORUN_WORKER", bin("isorun-worker"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (mut after_ten, mut late, mut lines) = (0, 0, 0);
    for line in stdout.lines() {
        let record: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        assert_eq!(record["status"], "ok", "{record}");
        lines += 1;
        if lines == 10 {
            after_ten = rss(pid);
        }
        if lines == 195 {
            late = rss(pid);
        }
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(lines, 200);
    // A leak bound, not a timing: 185 more units may not add 16 MiB.
    assert!(late < after_ten + (16 << 20), "supervisor grew from {after_ten} to {late} bytes");
}

#[test]
fn the_real_zygote_stays_single_threaded_after_warming_up_and_forks_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for i in 0..12 {
        crate::util::copy_dir(&examples.join("models/iris_classifier"), &dir.path().join(format!("m{i:02}")));
    }
    let mut child = crate::util::isorun()
        .arg("run")
        .arg(dir.path())
        .arg("--inputs")
        .arg(examples.join("inputs.npz"))
        .args(["--spawn", "zygote", "-j", "1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let supervisor = child.id();
    // The zygote: the supervisor's child running `isorun-worker --zygote`.
    let mut threads_seen = Vec::new();
    while child.try_wait().unwrap().is_none() {
        for line in crate::util::processes_mentioning("--zygote") {
            let Some(pid) = line.split_once(':').and_then(|(pid, _)| pid.parse::<u32>().ok()) else { continue };
            if line.contains("isorun-worker") && crate::util::parent(pid) == Some(supervisor) {
                if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                    threads_seen.push(tasks.count());
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let forked = stdout.lines().filter(|l| l.contains("\"worker_start\":\"fork\"")).count();
    assert_eq!(forked, 12, "every worker forked: {stdout}");
    assert!(!threads_seen.is_empty(), "the zygote was never seen");
    assert!(threads_seen.iter().all(|&n| n == 1), "the zygote had more than one thread: {threads_seen:?}");
}
