//! Every way a worker can fail becomes the right outcome, and costs only
//! its own unit: each run mixes faulty models with a good one, whose result
//! must come through unharmed.

use crate::util::{fake_models, gone_within, isorun, isorun_fault, run, wait_for_fault_workers, write_input, Ran};
use serde_json::Value;
use std::path::Path;

fn run_faults(root: &Path, worker_args: &[&str], extra: &[&str]) -> Ran {
    let input = write_input(root);
    let mut command = isorun_fault(worker_args);
    command.arg(root.join("models")).arg(format!("--input=x={}", input.display())).args(extra);
    run(&mut command)
}

fn assert_good(ran: &Ran, id: &str) {
    let good = ran.record(id);
    assert_eq!(good["status"], "ok", "{good}");
    assert_eq!(good["outputs"]["x"]["dtype"], "float32");
    assert_eq!(good["outputs"]["x"]["shape"], serde_json::json!([2, 3]));
}

#[test]
fn each_run_fault_is_its_own_outcome_and_the_good_model_still_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let models = [
        "fault-abort",
        "fault-alloc-512",
        "fault-bad-shape",
        "fault-exit3",
        "fault-garbage",
        "fault-half",
        "fault-hang",
        "fault-hang-load",
        "fault-huge",
        "fault-segfault",
        "fault-slow-50",
        "fault-wrong-unit",
        "good",
    ];
    fake_models(&tmp.path().join("models"), &models);
    let ran = run_faults(tmp.path(), &[], &["-j", "2", "--timeout", "3", "--values"]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let ids: Vec<&str> = ran.records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, models, "one record per model, in sorted order");

    let segfault = ran.record("fault-segfault");
    assert_eq!(segfault["status"], "crashed");
    assert_eq!(segfault["signal"], 11);
    assert_eq!(segfault["signal_name"], "SIGSEGV");
    assert_eq!(segfault["error"]["message"], "crashed: killed by SIGSEGV");
    let abort = ran.record("fault-abort");
    assert_eq!((abort["status"].as_str(), abort["signal"].as_i64()), (Some("crashed"), Some(6)));
    let exit3 = ran.record("fault-exit3");
    assert_eq!((exit3["status"].as_str(), exit3["exit_code"].as_i64()), (Some("crashed"), Some(3)));
    assert!(exit3.get("signal").is_none(), "keys that do not apply are left out: {exit3}");

    let hang = ran.record("fault-hang");
    assert_eq!((hang["status"].as_str(), hang["phase"].as_str()), (Some("timeout"), Some("run")));
    let hang_load = ran.record("fault-hang-load");
    assert_eq!((hang_load["status"].as_str(), hang_load["phase"].as_str()), (Some("timeout"), Some("load")));
    // Half a frame, then silence: only the deadline can end it.
    let half = ran.record("fault-half");
    assert_eq!((half["status"].as_str(), half["phase"].as_str()), (Some("timeout"), Some("run")));

    for id in ["fault-garbage", "fault-huge", "fault-wrong-unit", "fault-bad-shape"] {
        assert_eq!(ran.record(id)["status"], "protocol_error", "{}", ran.record(id));
    }
    assert!(ran.record("fault-huge")["error"]["message"].as_str().unwrap().contains("more than the cap"));
    assert!(ran.record("fault-bad-shape")["error"]["message"].as_str().unwrap().contains("output x"));

    let hog = ran.record("fault-alloc-512");
    assert_eq!(hog["status"], "ok");
    assert!(hog["peak_rss_bytes"].as_u64().unwrap() >= 512 << 20, "peak memory is the worker's: {hog}");
    assert_eq!(ran.record("fault-slow-50")["status"], "ok");

    assert_good(&ran, "good");
    let values = &ran.record("good")["outputs"]["x"]["values"];
    assert_eq!(values, &serde_json::json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]));
    for record in &ran.records {
        for key in ["wall_ms", "attempts", "worker_id"] {
            assert!(record.get(key).is_some(), "{key} missing in {record}");
        }
        assert!(record.as_object().unwrap().values().all(|v| !v.is_null()), "no nulls: {record}");
    }
}

/// A start fault in the first worker only (`--once`), then a good model.
fn start_fault(mode: &str) -> (Value, Ran) {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-first", "b-good"]);
    let marker = tmp.path().join("marker");
    let marker = marker.to_str().unwrap();
    let ran = run_faults(
        tmp.path(),
        &["--start", mode, "--once", marker],
        &["-j", "1", "--start-timeout", "2", "--timeout", "10"],
    );
    assert_good(&ran, "b-good");
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    (ran.record("a-first").clone(), ran)
}

#[test]
fn worker_that_never_connects_or_stalls_at_start_times_out() {
    for mode in ["never-connect", "half"] {
        let (first, _) = start_fault(mode);
        assert_eq!(
            (first["status"].as_str(), first["phase"].as_str()),
            (Some("timeout"), Some("start")),
            "{mode}: {first}"
        );
    }
}

#[test]
fn worker_that_dies_or_babbles_before_hello_is_reported() {
    let (first, _) = start_fault("exit-early");
    assert_eq!((first["status"].as_str(), first["exit_code"].as_i64()), (Some("crashed"), Some(3)), "{first}");
    for mode in ["garbage", "huge", "close", "hello-twice"] {
        let (first, _) = start_fault(mode);
        assert_eq!(first["status"], "protocol_error", "{mode}: {first}");
    }
    let (first, _) = start_fault("wrong-version");
    assert_eq!(first["status"], "protocol_error");
    assert!(first["error"]["message"].as_str().unwrap().contains("protocol version 999"), "{first}");
}

#[test]
fn a_hello_naming_a_channel_cannot_steer_the_supervisor() {
    // Protocol 4's Hello named a path for the supervisor to connect to (one
    // with a NUL in it panicked a thread inside ipc-channel); now a Hello
    // names nothing, and one that tries is a protocol error of its unit.
    let (first, ran) = start_fault("old-hello");
    assert_eq!(first["status"], "protocol_error", "{first}");
    assert!(first["error"]["message"].as_str().unwrap().contains("left over"), "{first}");
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
}

#[test]
fn a_crash_with_several_models_per_worker_costs_only_its_model() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a", "b", "c-fault-segfault", "d", "e"]);
    let ran = run_faults(tmp.path(), &[], &["-j", "1", "--models-per-worker", "5"]);
    assert_eq!(
        ran.statuses(),
        [("a", "ok"), ("b", "ok"), ("c-fault-segfault", "crashed"), ("d", "ok"), ("e", "ok")]
            .map(|(m, s)| (m.to_string(), s.to_string()))
    );
    // a, b and the crash share the first worker; after a crash the rest of the
    // batch runs one model per worker (crash bisection), and c is run again
    // alone before it is blamed.
    let worker = |id: &str| ran.record(id)["worker_id"].as_u64().unwrap();
    assert_eq!(worker("a"), worker("b"));
    assert_ne!(worker("a"), worker("d"));
    assert_ne!(worker("d"), worker("e"));
    let attempts = ran.record("c-fault-segfault")["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["shared_worker"], true);
    assert!(attempts[1].get("shared_worker").is_none());
}

#[test]
fn a_worker_that_cannot_be_started_is_spawn_failed() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["m1", "m2"]);
    let not_executable = tmp.path().join("worker");
    std::fs::write(&not_executable, b"not a program").unwrap();
    let input = write_input(tmp.path());
    let ran = run(isorun()
        .arg("run")
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .arg("--worker")
        .arg(&not_executable));
    assert_eq!(ran.code, Some(1));
    assert_eq!(
        ran.statuses(),
        [("m1", "spawn_failed"), ("m2", "spawn_failed")].map(|(m, s)| (m.to_string(), s.to_string()))
    );
    assert!(ran.record("m1")["error"]["message"].as_str().unwrap().contains("worker"), "{}", ran.stdout);
}

#[test]
fn a_zygote_that_fails_says_why_and_workers_are_exec_d_instead() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good"]);
    let ran = run_faults(tmp.path(), &["--zygote-fail"], &["--spawn", "zygote", "--json"]);
    assert_good(&ran, "good");
    // The fallback's warning carries the zygote's own words, from its stderr.
    assert!(ran.stderr.contains("exec'ing each worker instead"), "{}", ran.stderr);
    assert!(ran.stderr.contains("this zygote fails at once, as asked"), "{}", ran.stderr);
}

/// A worker past `--timeout 1` (hanging; with `--ignore-term`, also deaf to
/// SIGTERM) is gone, reaped, while the run goes on, within the timeout and
/// the grace; returns how long after it was first seen.
fn timed_out_worker_is_gone(spawn: &str, worker_args: &[&str]) -> std::time::Duration {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-hang", "b-fault-slow-800"]);
    let input = write_input(tmp.path());
    let marker = format!("marker-{}-timeout-{spawn}-{}", std::process::id(), worker_args.len());
    let mut args = vec![marker.as_str()];
    args.extend_from_slice(worker_args);
    let mut child = isorun_fault(&args)
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["--timeout", "1", "-j", "1", "--json", "--spawn", spawn])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let worker = wait_for_fault_workers(&marker, child.id(), 1).and_then(|w| w.first().copied());
    let seen = Instant::now();
    // Timeout 1 s + grace 2 s, and what a loaded machine adds.
    let gone = worker.map(|pid| gone_within(pid, Duration::from_secs(1 + 2 + 5)));
    let took = seen.elapsed();
    let still_running = child.try_wait().unwrap().is_none();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    let worker = worker.unwrap_or_else(|| panic!("no worker seen: {}", ran.stderr));
    assert_eq!(gone, Some(true), "{spawn} worker {worker} still there {took:?} after it was seen");
    assert!(still_running, "the run had ended: the worker may have died with it");
    let hang = ran.record("a-fault-hang");
    assert_eq!((hang["status"].as_str(), hang["phase"].as_str()), (Some("timeout"), Some("run")), "{hang}");
    assert_eq!(ran.record("b-fault-slow-800")["status"], "ok");
    eprintln!("{spawn} {worker_args:?}: timed-out worker gone {took:?} after it was seen");
    took
}

#[test]
fn a_timed_out_worker_is_gone_while_the_run_goes_on() {
    for spawn in ["zygote", "exec"] {
        let took = timed_out_worker_is_gone(spawn, &[]);
        // It dies of the SIGTERM at the timeout, long before the grace ends.
        assert!(took < std::time::Duration::from_secs(1 + 2), "{spawn}: {took:?}");
    }
}

#[test]
fn a_timed_out_worker_deaf_to_sigterm_is_killed_after_the_grace() {
    for spawn in ["zygote", "exec"] {
        let took = timed_out_worker_is_gone(spawn, &["--ignore-term"]);
        // SIGKILL comes only when the grace (2 s) after the timeout (1 s) is over.
        assert!(took >= std::time::Duration::from_millis(2500), "{spawn}: killed before the grace ended: {took:?}");
    }
}
