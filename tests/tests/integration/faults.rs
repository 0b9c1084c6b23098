//! Every way a worker can fail becomes the right outcome, and costs only
//! its own unit: each run mixes faulty models with a good one, whose result
//! must come through unharmed.

use crate::util::{fake_models, isorun, isorun_fault, run, write_input, Ran};
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
