//! The sandbox proves itself: a model that reads a secret, writes outside
//! its folder or lists a folder is stopped under `--sandbox strict` (the
//! default) and succeeds under `--sandbox off`, so the sandbox did it.
//! Attacks a graph cannot express (signalling another process, connecting
//! to a UNIX socket) come from the fault worker, confined by the real
//! worker's sandbox (`--apply-sandbox`, `isorun-sandbox`); each test checks
//! the effect outside: the victim process lives, no connection arrives.

use crate::util::{bin, fake_models, fixtures, isorun, isorun_fault, run, Ran};
use serde_json::json;
use std::io::ErrorKind;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn file_ops(signature: &str, inputs: &[(&str, &str)], sandbox: &str) -> Ran {
    let mut command = isorun();
    command.arg("run").arg(fixtures().join("hostile/file_ops")).args([
        "--signature",
        signature,
        "--values",
        "--json",
        "--sandbox",
        sandbox,
    ]);
    for (name, value) in inputs {
        command.arg("--input").arg(format!("{name}=@{}", json!(value)));
    }
    run(&mut command)
}

fn landlock_in_force(ran: &Ran) -> bool {
    let protections = &ran.records[0]["sandbox"];
    let on = protections.as_array().is_some_and(|p| p.iter().any(|x| x == "landlock"));
    if !on {
        eprintln!("!!! Landlock is not available on this kernel: the sandbox tests check nothing here !!!");
    }
    on
}

fn secret(dir: &Path) -> String {
    let path = dir.join("secret.txt");
    std::fs::write(&path, "s3cret").unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn reading_a_file_outside_the_model_is_denied_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let path = secret(tmp.path());
    let strict = file_ops("read", &[("path", &path)], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    assert_eq!(strict.records[0]["error"]["code"], "PERMISSION_DENIED");
    assert!(strict.records[0]["error"]["message"].as_str().unwrap().contains(&path));
    let shadow = file_ops("read", &[("path", "/etc/shadow")], "strict");
    assert_eq!(shadow.records[0]["error"]["code"], "PERMISSION_DENIED", "not even /etc/shadow as root");

    let off = file_ops("read", &[("path", &path)], "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert_eq!(off.records[0]["outputs"]["contents"]["values"], "s3cret");
    assert!(off.records[0].get("sandbox").is_none());
}

#[test]
fn writing_outside_the_model_is_denied_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("pwned.txt");
    let target_text = target.to_string_lossy().into_owned();
    let strict = file_ops("write", &[("path", &target_text), ("contents", "pwned")], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    assert_eq!(strict.records[0]["error"]["code"], "PERMISSION_DENIED", "{}", strict.stdout);
    assert!(!target.exists(), "nothing was written");

    let off = file_ops("write", &[("path", &target_text), ("contents", "pwned")], "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "pwned");
}

#[test]
fn listing_a_folder_outside_the_model_finds_nothing_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    secret(tmp.path());
    let pattern = format!("{}/*", tmp.path().display());
    let strict = file_ops("list", &[("pattern", &pattern)], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    // TensorFlow's MatchingFiles treats an unreadable folder as empty.
    let listed = &strict.records[0]["outputs"]["files"]["values"];
    assert_eq!(listed, &json!([]), "{}", strict.stdout);
    let home =
        file_ops("list", &[("pattern", &format!("{}/*", std::env::var("HOME").unwrap_or("/root".into())))], "strict");
    assert_eq!(home.records[0]["outputs"]["files"]["values"], json!([]), "the home folder is not listed");

    let off = file_ops("list", &[("pattern", &pattern)], "off");
    let listed = off.records[0]["outputs"]["files"]["values"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{}", off.stdout);
}

#[test]
fn the_environment_is_cleared_and_every_protection_is_reported() {
    let environ = |sandbox: &str| {
        let mut command = isorun();
        command
            .env("ISORUN_TEST_SECRET_TOKEN", "hunter2")
            .arg("run")
            .arg(fixtures().join("hostile/file_ops"))
            .args(["--signature", "read", "--values", "--json", "--sandbox", sandbox])
            .arg("--input")
            .arg("path=@\"/proc/self/environ\"");
        run(&mut command)
    };
    let strict = environ("strict");
    if !landlock_in_force(&strict) {
        return;
    }
    let record = &strict.records[0];
    let protections: Vec<&str> = record["sandbox"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    for expected in [
        "landlock",
        "no_network",
        "no_new_privs",
        "no_core_dumps",
        "clean_env",
        "work_dir",
        "fd_limit",
        "no_unix_sockets",
    ] {
        assert!(protections.contains(&expected), "{expected} not in force: {protections:?}");
    }
    let seen = record["outputs"]["contents"]["values"].as_str().unwrap_or_default().to_string();
    assert!(!seen.contains("hunter2"), "the environment reached the model: {seen}");
    let off = environ("off");
    let seen = off.records[0]["outputs"]["contents"]["values"].as_str().unwrap_or_default().to_string();
    assert!(seen.contains("hunter2"), "without the sandbox the model sees the environment");
}

/// Whether the record says `protection` was in force; if not, says loudly
/// that the test checks nothing on this kernel.
fn in_force(ran: &Ran, protection: &str) -> bool {
    let on = ran.records[0]["sandbox"].as_array().is_some_and(|p| p.iter().any(|x| x == protection));
    if !on {
        eprintln!("!!! {protection} is not in force on this kernel: this test checks nothing here !!!\n{}", ran.stdout);
    }
    on
}

/// One fault-worker attack (`fault-MODE`) on `target`, under `sandbox`.
fn attack(mode: &str, target: &str, sandbox: &str) -> Ran {
    attack_with(mode, target, sandbox, &[])
}

fn attack_with(mode: &str, target: &str, sandbox: &str, worker_args: &[&str]) -> Ran {
    let tmp = tempfile::tempdir().unwrap();
    let model = format!("fault-{mode}");
    fake_models(tmp.path(), &[&model]);
    std::fs::write(tmp.path().join(&model).join("target"), target).unwrap();
    let mut command = isorun_fault(&[&["--apply-sandbox"], worker_args].concat());
    command.arg(tmp.path()).args(["--json", "-j", "1", "--sandbox", sandbox]);
    run(&mut command)
}

/// A process outside the worker, started to be killed.
struct Victim(std::process::Child);

impl Victim {
    fn start() -> Victim {
        Victim(Command::new("sleep").arg("120").stdin(Stdio::null()).spawn().unwrap())
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }

    /// Whether it is still running `within` from now (it is reaped if not).
    fn alive_after(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.0.try_wait().unwrap().is_some() {
                return false;
            }
            if Instant::now() >= deadline {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_worker_cannot_signal_a_process_outside_it_under_strict() {
    let mut victim = Victim::start();
    let strict = attack("kill", &victim.pid(), "strict");
    if !in_force(&strict, "signal_scope") {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    let message = strict.records[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("Operation not permitted"), "{message}");
    assert!(victim.alive_after(Duration::from_millis(500)), "the victim was killed from inside the sandbox");

    let listed = strict.records[0].to_string();
    assert!(!listed.contains("signal_filter"), "the filter stands in only where the scope is missing: {listed}");
    let off = attack("kill", &victim.pid(), "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert!(!victim.alive_after(Duration::from_secs(5)), "without the sandbox the worker can kill it");
}

/// Whether a connection is waiting on `listener` (non-blocking).
fn connection_arrived(listener: &UnixListener) -> bool {
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    }
}

#[test]
fn a_worker_cannot_connect_to_a_pathname_unix_socket_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bus.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let target = path.to_string_lossy().into_owned();
    let strict = attack("connect-path", &target, "strict");
    if !in_force(&strict, "no_unix_sockets") {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    let message = strict.records[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("Permission denied"), "{message}");
    assert!(!connection_arrived(&listener), "a sandboxed worker reached the socket");

    let off = attack("connect-path", &target, "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert!(connection_arrived(&listener), "without the sandbox the worker reaches it");
}

#[test]
fn a_worker_cannot_connect_to_an_abstract_unix_socket_under_strict() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("isorun-test-{}-{:?}", std::process::id(), Instant::now());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&address).unwrap();
    let strict = attack("connect-abstract", &name, "strict");
    if !in_force(&strict, "abstract_unix_scope") {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    assert!(!connection_arrived(&listener), "a sandboxed worker reached the socket");

    let off = attack("connect-abstract", &name, "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert!(connection_arrived(&listener), "without the sandbox the worker reaches it");
}

#[test]
fn landlocks_abstract_scope_alone_stops_a_socket_made_before_the_sandbox() {
    // A socket made before the sandbox is past the seccomp rule and stays
    // in the first network namespace, whose abstract names the test's
    // listener shares: only the Landlock scope is left to refuse it.
    use std::os::linux::net::SocketAddrExt;
    let name = format!("isorun-test-early-{}-{:?}", std::process::id(), Instant::now());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&address).unwrap();
    let early = ["--socket-before-sandbox"];
    let strict = attack_with("connect-abstract", &name, "strict", &early);
    if !in_force(&strict, "abstract_unix_scope") {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    let message = strict.records[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("Operation not permitted"), "{message}");
    assert!(!connection_arrived(&listener), "a sandboxed worker reached the socket");

    let off = attack_with("connect-abstract", &name, "off", &early);
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert!(connection_arrived(&listener), "without the sandbox the worker reaches it");
}

#[test]
fn without_landlock_the_scopes_are_reported_missing_and_unix_sockets_stay_refused() {
    // As on a kernel without Landlock: a real model still runs, says what
    // is missing, and the seccomp rule, which does not need Landlock, holds.
    let mut command = Command::new(bin("isorun-deny-landlock"));
    command
        .arg(bin("isorun"))
        .arg("run")
        .arg(fixtures().join("hostile/file_ops"))
        .args(["--signature", "read", "--values", "--json", "--input"])
        .arg(format!("path=@{}", json!(fixtures().join("hostile/file_ops/saved_model.pb"))))
        .env_remove("ISORUN_WORKER")
        .stdin(Stdio::null());
    let ran = run(&mut command);
    let record = &ran.records[0];
    assert_eq!(record["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    let listed = |key: &str| -> Vec<String> {
        record[key].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect()
    };
    let (protections, missing) = (listed("sandbox"), listed("sandbox_missing"));
    for gone in ["landlock", "signal_scope", "abstract_unix_scope"] {
        assert!(missing.contains(&gone.to_string()), "{gone} not reported missing: {missing:?}");
    }
    for kept in ["no_unix_sockets", "signal_filter", "no_network", "no_new_privs", "clean_env", "work_dir"] {
        assert!(protections.contains(&kept.to_string()), "{kept} not in force: {protections:?}");
    }
    assert!(ran.stderr.contains("not in force") && ran.stderr.contains("signal_scope"), "{}", ran.stderr);
    let mut doctor = Command::new(bin("isorun-deny-landlock"));
    doctor.arg(bin("isorun")).arg("doctor").stdin(Stdio::null());
    let doctor = run(&mut doctor);
    let line = doctor.stdout.lines().find(|l| l.starts_with("sandbox ")).unwrap_or_default().to_string();
    assert!(line.contains("unavailable") && line.contains("missing landlock, signal_scope"), "{}", doctor.stdout);

    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    fake_models(tmp.path(), &["fault-connect-path"]);
    std::fs::write(tmp.path().join("fault-connect-path/target"), path.to_string_lossy().as_bytes()).unwrap();
    let mut command = Command::new(bin("isorun-deny-landlock"));
    command
        .arg(bin("isorun"))
        .args(["run", "--json", "--worker-arg=--apply-sandbox"])
        .arg(tmp.path().join("fault-connect-path"))
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .stdin(Stdio::null());
    let ran = run(&mut command);
    assert_eq!(ran.records[0]["status"], "error", "{}", ran.stdout);
    assert!(!connection_arrived(&listener), "without Landlock the seccomp rule still refuses the socket");

    // And the seccomp signal filter stands in for the missing signal scope.
    let mut victim = Victim::start();
    fake_models(tmp.path(), &["fault-kill"]);
    std::fs::write(tmp.path().join("fault-kill/target"), victim.pid()).unwrap();
    let mut command = Command::new(bin("isorun-deny-landlock"));
    command
        .arg(bin("isorun"))
        .args(["run", "--json", "--worker-arg=--apply-sandbox"])
        .arg(tmp.path().join("fault-kill"))
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .stdin(Stdio::null());
    let ran = run(&mut command);
    assert_eq!(ran.records[0]["status"], "error", "{}", ran.stdout);
    assert!(ran.records[0]["error"]["message"].as_str().unwrap().contains("Operation not permitted"), "{}", ran.stdout);
    assert!(victim.alive_after(Duration::from_millis(500)), "the victim was killed from inside the sandbox");
}

#[test]
fn sandboxed_workers_stand_in_a_private_folder_that_is_removed_after_the_run() {
    // TMPDIR of our own, so that other runs on this machine do not count.
    let tmp = tempfile::tempdir().unwrap();
    let scratch = tmp.path().join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    // A predictable name planted in advance is never used.
    let planted = scratch.join(format!("isorun-empty-{}", unsafe { libc::getuid() }));
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("planted.txt"), "x").unwrap();
    fake_models(tmp.path(), &["fault-cwd"]);
    let mut command = isorun_fault(&["--apply-sandbox"]);
    command.env("TMPDIR", &scratch).arg(tmp.path().join("fault-cwd")).args(["--json", "--values"]);
    let ran = run(&mut command);
    let record = &ran.records[0];
    assert_eq!(record["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    let cwd = record["outputs"]["cwd"]["values"].as_str().unwrap().to_string();
    assert_ne!(Path::new(&cwd), planted, "the planted folder was used");
    assert!(Path::new(&cwd).starts_with(&scratch), "{cwd} is not in TMPDIR");
    let mode = record["outputs"]["cwd_mode"]["values"].as_i64().unwrap();
    assert_eq!(mode & 0o777, 0o700, "{cwd} has mode {mode:o}");
    assert_eq!(record["outputs"]["cwd_entries"]["values"], 0, "the folder is empty");
    assert!(!Path::new(&cwd).exists(), "{cwd} is left behind");
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(left, vec![planted], "only the planted folder remains");
}

/// Where Landlock has no signal scope (kernels before 6.12, most users;
/// here `isorun-deny-landlock` hides it), a worker that moves into its
/// session leader's (or its parent's) process group and sends SIGKILL to
/// "its own" group (`kill(0, ...)`, which the signal filter must allow)
/// reaches nobody: workers start a session of their own, and the sandbox's
/// seccomp filter refuses `setpgid` and `setsid`. The supervisor here leads
/// its own session, as a user's shell does; before workers had sessions of
/// their own, this attack killed it (and, from a terminal, the shell).
#[test]
fn a_worker_cannot_join_the_supervisors_process_group_without_the_signal_scope() {
    use std::os::unix::process::CommandExt;
    for (spawn, sandbox) in [("exec", "strict"), ("zygote", "strict"), ("exec", "off"), ("zygote", "off")] {
        let tmp = tempfile::tempdir().unwrap();
        fake_models(tmp.path(), &["fault-join-session", "good"]);
        std::fs::write(tmp.path().join("fault-join-session/target"), "unused").unwrap();
        let mut command = Command::new(bin("isorun-deny-landlock"));
        command
            .arg(bin("isorun"))
            .args(["run", "--json", "-j", "1", "--spares", "0", "--spawn", spawn, "--sandbox", sandbox])
            .arg("--worker-arg=--apply-sandbox")
            .arg(tmp.path())
            .env("ISORUN_WORKER", bin("isorun-fault-worker"))
            .stdin(Stdio::null());
        // SAFETY: setsid between fork and exec is async-signal-safe.
        unsafe {
            command.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
        }
        let ran = run(&mut command);
        let context = format!("--spawn {spawn} --sandbox {sandbox}: {:?}\n{}\n{}", ran.code, ran.stdout, ran.stderr);
        assert_eq!(ran.code, Some(1), "the supervisor must survive and report: {context}");
        let attacker = ran.record("fault-join-session");
        assert_eq!(attacker["status"], "error", "{context}");
        let message = attacker["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("Operation not permitted"), "{context}");
        assert_eq!(ran.record("good")["status"], "ok", "{context}");
        if sandbox == "strict" {
            assert!(in_force(&ran, "own_session") && in_force(&ran, "signal_filter"), "{context}");
        }
    }
}
