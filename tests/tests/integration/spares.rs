//! Warm spare workers (`--spares`): each unit still runs in a process of
//! its own that has served no other request, a spare that fails while it
//! warms up costs no model anything, units reserved for a busy slot's spare
//! are run exactly once, and spares die with the run and with the
//! supervisor. A spare preloads its unit's model, and a model that hangs
//! there gets its own outcome in a fresh worker. The real worker's warm-up
//! runs on real models too.

use crate::util::{copy_dir, fake_models, fixtures, gone_within, isorun, isorun_fault, ran, run, write_input};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The pids the fault worker logged as `warm PID` (spares that got their warm-up request).
fn warmed_pids(log: &Path) -> Vec<u32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("warm ")?.parse().ok())
        .collect()
}

/// Units the fault worker computed, by model folder name (its log's other lines).
fn computed(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut models: Vec<String> =
        text.lines().filter(|l| !l.starts_with("warm ") && !l.starts_with("preload ")).map(str::to_string).collect();
    models.sort();
    models
}

/// The models spares preloaded (the fault worker's `preload NAME` lines).
fn preloaded(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut models: Vec<String> = text.lines().filter_map(|l| l.strip_prefix("preload ")).map(str::to_string).collect();
    models.sort();
    models
}

/// Spares preload their unit's model unless a GPU may be used (a device
/// node of NVIDIA's or AMD's driver is here), as `spare::may_preload` says.
fn spares_preload_here() -> bool {
    !["/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"].iter().any(|node| Path::new(node).exists())
}

fn int_output(record: &Value, name: &str) -> i64 {
    record["outputs"][name]["values"].as_i64().unwrap_or_else(|| panic!("no {name} in {record}"))
}

#[test]
fn every_unit_runs_in_a_fresh_process_and_spares_serve_one_unit_each() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("m{i}-fault-pid")).collect();
    fake_models(&tmp.path().join("models"), &names.iter().map(String::as_str).collect::<Vec<_>>());
    let input = write_input(tmp.path());
    let log = tmp.path().join("log");
    let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spawn", "zygote", "--spares", "2", "--sandbox", "off", "--values", "--json"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 6);
    let mut pids: Vec<i64> = ran.records.iter().map(|r| int_output(r, "worker_pid")).collect();
    for record in &ran.records {
        assert_eq!(record["status"], "ok", "{record}");
        // Each worker took exactly one run request: this unit's.
        assert_eq!(int_output(record, "worker_requests"), 1, "{record}");
        let warmed = int_output(record, "worker_warmed") == 1;
        assert_eq!(warmed, record.get("spare").is_some(), "the record says whether its worker was a spare: {record}");
    }
    // The slot's first unit has no spare yet; the rest ran in spares.
    let spared = ran.records.iter().filter(|r| r.get("spare").is_some()).count();
    assert!(spared >= 4, "{spared} of 6 units ran in spares:\n{}", ran.stdout);
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 6, "six units, six processes");
    // Every spare that was warmed ran a unit (none was left over), and none is left.
    let mut warmed = warmed_pids(&log);
    assert_eq!(warmed.len(), spared, "{warmed:?}");
    warmed.sort();
    for pid in &warmed {
        assert!(pids.contains(&i64::from(*pid)), "spare {pid} ran no unit");
        assert!(gone_within(*pid, Duration::from_secs(5)), "spare {pid} left behind");
    }
    assert_eq!(computed(&log).len(), 6, "each unit computed once");
}

/// By default (`--spawn auto`, named here: `scripts/test` sets
/// `ISORUN_SPAWN`) a slot's first worker is exec'd while its
/// zygote loads libtensorflow; the spares for the next units are forked
/// while that first unit runs, so the second unit starts warm too.
#[test]
fn the_unit_after_an_execd_first_unit_runs_in_a_spare() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-slow-1000", "b-fault-pid", "c-fault-pid", "d-fault-pid"]);
    let input = write_input(tmp.path());
    let log = tmp.path().join("log");
    let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spawn", "auto", "--spares", "1", "--sandbox", "off", "--values", "--json"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 4, "{}", ran.stdout);
    let first = &ran.records[0];
    assert!(first["model"].as_str().unwrap().contains("a-fault-slow"), "{first}");
    assert_eq!(first["worker_start"], "exec", "the first worker is exec'd: {first}");
    assert!(first.get("spare").is_none(), "{first}");
    let warmed = warmed_pids(&log);
    for record in &ran.records[1..] {
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["worker_start"], "fork", "{record}");
        assert!(record.get("spare").is_some(), "every unit after the first ran in a spare: {record}");
        let pid = int_output(record, "worker_pid");
        assert_eq!(int_output(record, "worker_warmed"), 1, "{record}");
        assert_eq!(int_output(record, "worker_requests"), 1, "a spare serves one unit: {record}");
        assert!(warmed.contains(&(pid as u32)), "{record}");
    }
    assert_eq!(warmed.len(), 3, "no spare was forked for nothing: {warmed:?}");
    for pid in warmed {
        assert!(gone_within(pid, Duration::from_secs(5)), "spare {pid} left behind");
    }
    assert_eq!(computed(&log).len(), 4, "each unit computed once");
}

/// A spare loads its unit's model as its warm-up (the fault worker logs
/// `preload NAME`), and the unit's run finds it loaded: each model is
/// computed once, in its own process, and the record says the load was
/// done ahead (`spare.preload_ms`, no `load` on the unit's path). Under
/// `--memory-limit` (which the supervisor enforces only once a unit has
/// started) spares warm up on the built-in model and load nothing.
#[test]
fn a_spare_preloads_its_units_model_unless_a_memory_limit_is_set() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..5).map(|i| format!("m{i}-fault-pid")).collect();
    fake_models(&tmp.path().join("models"), &names.iter().map(String::as_str).collect::<Vec<_>>());
    let input = write_input(tmp.path());
    let with = |log: &Path, extra: &[&str]| {
        run(isorun_fault(&[&format!("--log={}", log.display())])
            .arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .args(["-j", "1", "--spawn", "zygote", "--spares", "2", "--sandbox", "off", "--values", "--json"])
            .args(extra))
    };
    let log = tmp.path().join("log");
    let ran = with(&log, &["--report", &tmp.path().join("report.json").to_string_lossy()]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(computed(&log), names, "each unit computed once");
    let spared: Vec<&Value> = ran.records.iter().filter(|r| r.get("spare").is_some()).collect();
    assert!(spared.len() >= 3, "{}", ran.stdout);
    let mut pids: Vec<i64> = ran.records.iter().map(|r| int_output(r, "worker_pid")).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 5, "five units, five processes");
    let expect = spares_preload_here();
    for record in &spared {
        assert_eq!(int_output(record, "worker_requests"), 1, "{record}");
        assert_eq!(int_output(record, "worker_preloaded") == 1, expect, "{record}");
        assert_eq!(record["spare"].get("preload_ms").is_some(), expect, "{record}");
        if expect {
            assert_eq!(record["phases_ms"]["load"], 0.0, "the load was done ahead: {record}");
            assert!(record["load_ms"].is_u64(), "the record keeps the model's load time: {record}");
        }
    }
    let mut spared_models: Vec<String> = spared.iter().map(|r| r["model"].as_str().unwrap().to_string()).collect();
    spared_models.sort();
    assert_eq!(
        preloaded(&log),
        if expect { spared_models } else { Vec::new() },
        "each spare preloaded its unit's model"
    );

    let log = tmp.path().join("log-limited");
    let ran = with(&log, &["--memory-limit", "1G"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.records.iter().filter(|r| r.get("spare").is_some()).count() >= 3, "{}", ran.stdout);
    assert!(preloaded(&log).is_empty(), "no preload under a memory limit");
    for record in &ran.records {
        assert_eq!(int_output(record, "worker_preloaded"), 0, "{record}");
        assert!(record.get("spare").is_none_or(|s| s.get("preload_ms").is_none()), "{record}");
    }
}

/// A model whose load hangs, or takes longer than the unit's load limit,
/// while its spare preloads it: the spare is given up by then, and the
/// unit's fresh worker loads it under the unit's own limits (here a load
/// timeout), as without spares; the next unit is untouched.
fn a_preload_over_the_load_limit(slow_model: &str) {
    if !spares_preload_here() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-pid", slow_model, "c-fault-pid"]);
    let input = write_input(tmp.path());
    let log = tmp.path().join("log");
    let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spawn", "zygote", "--spares", "2", "--sandbox", "off", "--values", "--json"])
        .args(["--load-timeout", "1"]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert!(preloaded(&log).contains(&slow_model.to_string()), "its spare preloaded it: {:?}", preloaded(&log));
    let slow = ran.records.iter().find(|r| r["model"] == slow_model).unwrap();
    assert_eq!(slow["status"], "timeout", "{slow}");
    assert_eq!(slow["phase"], "load", "{slow}");
    assert!(slow.get("spare").is_none(), "its spare ran nothing: {slow}");
    let others: Vec<&Value> = ran.records.iter().filter(|r| r["model"] != slow_model).collect();
    assert!(others.iter().all(|r| r["status"] == "ok"), "{}", ran.stdout);
    for pid in warmed_pids(&log) {
        assert!(gone_within(pid, Duration::from_secs(5)), "spare {pid} left behind");
    }
}

#[test]
fn a_model_that_hangs_in_its_spares_preload_gets_its_own_timeout_in_a_fresh_worker() {
    a_preload_over_the_load_limit("b-fault-hang-load");
}

#[test]
fn a_preload_slower_than_the_load_limit_gets_the_unit_a_fresh_worker() {
    a_preload_over_the_load_limit("b-fault-slow-start-1500");
}

#[test]
fn a_preloaded_unit_keeps_its_whole_timeout_counted_from_its_load() {
    // --timeout covers a unit's load and run. A model that takes 1.4 s to
    // load and 1.4 s to run is over 2 s whether a spare loaded it ahead or
    // a fresh worker did; one that takes 0.4 + 0.4 s is not.
    if !spares_preload_here() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-pid", "b-fault-slow-both-1400", "c-fault-slow-both-400"]);
    let input = write_input(tmp.path());
    for spares in ["2", "0"] {
        let log = tmp.path().join(format!("log-{spares}"));
        let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
            .arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .args(["-j", "1", "--spawn", "zygote", "--spares", spares, "--sandbox", "off", "--json"])
            .args(["--timeout", "2"]));
        assert_eq!(ran.code, Some(1), "--spares {spares}: {}", ran.stderr);
        let record = |model: &str| ran.records.iter().find(|r| r["model"] == model).unwrap().clone();
        let (slow, quick) = (record("b-fault-slow-both-1400"), record("c-fault-slow-both-400"));
        assert_eq!((slow["status"].as_str(), slow["phase"].as_str()), (Some("timeout"), Some("run")), "{slow}");
        assert_eq!(quick["status"], "ok", "{quick}");
        if spares == "2" {
            // Both ran in the spare that preloaded them: the timeout was the
            // spare's unit's, not a fresh worker's.
            assert!(preloaded(&log).contains(&"b-fault-slow-both-1400".to_string()), "{:?}", preloaded(&log));
            assert_eq!(slow["spare"]["preload_ms"], 1400, "{slow}");
            assert_eq!(quick["spare"]["preload_ms"], 400, "{quick}");
        }
    }
}

/// A spare that crashes, hangs or fails while it warms up is nobody's
/// fault: its units run in fresh workers, once each, and pass.
fn a_failed_warm_up(mode: &str) -> (crate::util::Ran, Vec<u32>) {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-pid", "b-fault-pid", "c-fault-pid"]);
    let input = write_input(tmp.path());
    let log = tmp.path().join("log");
    let ran = run(isorun_fault(&[&format!("--log={}", log.display()), "--warm", mode])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spawn", "zygote", "--spares", "1", "--sandbox", "off", "--values", "--json"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 3);
    assert_eq!(computed(&log), ["a-fault-pid", "b-fault-pid", "c-fault-pid"], "each unit computed once");
    for record in &ran.records {
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["attempts"].as_array().unwrap().len(), 1, "no attempt was lost to a spare: {record}");
        assert_eq!(int_output(record, "worker_requests"), 1, "{record}");
    }
    let warmed = warmed_pids(&log);
    assert!(!warmed.is_empty(), "spares were forked and asked to warm up");
    for pid in &warmed {
        assert!(gone_within(*pid, Duration::from_secs(5)), "spare {pid} left behind");
    }
    (ran, warmed)
}

#[test]
fn a_spare_that_crashes_while_warming_up_is_blamed_on_no_model() {
    let (ran, warmed) = a_failed_warm_up("crash");
    for record in &ran.records {
        assert!(record.get("spare").is_none(), "a crashed spare ran nothing: {record}");
        assert!(!warmed.contains(&(int_output(record, "worker_pid") as u32)), "{record}");
    }
}

#[test]
fn a_spare_that_hangs_while_warming_up_is_replaced_by_a_fresh_worker() {
    let started = Instant::now();
    let (ran, _) = a_failed_warm_up("hang");
    for record in &ran.records {
        assert!(record.get("spare").is_none(), "a hung spare ran nothing: {record}");
    }
    // Each of the two spares is given up after the 2 s a unit waits for one, not the 30 s start limit.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
}

#[test]
fn a_spare_whose_warm_up_failed_runs_its_unit_and_says_so() {
    let (ran, warmed) = a_failed_warm_up("error");
    let spared: Vec<&Value> = ran.records.iter().filter(|r| r.get("spare").is_some()).collect();
    assert!(!spared.is_empty(), "{}", ran.stdout);
    for record in spared {
        assert_eq!(record["spare"]["warm_error"], "the warm-up failed on purpose", "{record}");
        assert_eq!(int_output(record, "worker_warmed"), 1);
        assert!(warmed.contains(&(int_output(record, "worker_pid") as u32)), "{record}");
    }
}

#[test]
fn units_reserved_for_a_busy_slots_spare_run_exactly_once() {
    // Two slots, one spare each; one unit keeps its slot busy for 2 s while the
    // quick units drain the queue: an idle slot takes units reserved for the
    // busy slot's spare (which then dies unused), or the spare runs them.
    // Either way, each unit runs once, and no spare is left.
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-slow-2000", "b", "c", "d", "e", "f"]);
    let input = write_input(tmp.path());
    let log = tmp.path().join("log");
    let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "2", "--spawn", "zygote", "--spares", "1", "--sandbox", "off", "--json"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let statuses: Vec<(String, String)> = ran.statuses();
    assert_eq!(statuses.len(), 6, "{statuses:?}");
    assert!(statuses.iter().all(|(_, s)| s == "ok"), "{statuses:?}");
    assert_eq!(computed(&log), ["a-fault-slow-2000", "b", "c", "d", "e", "f"]);
    for pid in warmed_pids(&log) {
        assert!(gone_within(pid, Duration::from_secs(5)), "spare {pid} left behind");
    }
}

/// Starts a run of hanging units with spares (`--spawn` as given) and
/// waits until two spares have been asked to warm up; the child and the
/// spares' pids.
fn start_run_with_spares(tmp: &Path, spawn: &str) -> (std::process::Child, Vec<u32>) {
    fake_models(&tmp.join("models"), &["a-fault-hang", "b-fault-hang", "c-fault-hang", "d-fault-hang"]);
    let input = write_input(tmp);
    let log = tmp.join("log");
    let child = isorun_fault(&[&format!("--log={}", log.display())])
        .arg(tmp.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spawn", spawn, "--spares", "2", "--sandbox", "off", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while warmed_pids(&log).len() < 2 {
        if Instant::now() > deadline {
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            panic!("no two spares within 20 s (--spawn {spawn})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let spares = warmed_pids(&log);
    for pid in &spares {
        assert!(Path::new(&format!("/proc/{pid}")).exists(), "spare {pid} is there while its units wait");
    }
    (child, spares)
}

/// Ctrl-C while the first unit hangs and two spares wait: the spares die,
/// every unit has its record, reserved ones too.
fn interrupted_run_with_spares(spawn: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (child, spares) = start_run_with_spares(tmp.path(), spawn);
    // The first unit hangs in its worker: it computed, no other unit did.
    assert_eq!(computed(&tmp.path().join("log")), ["a-fault-hang"]);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let ran = ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 4, "every unit has its record, reserved ones too:\n{}", ran.stdout);
    for record in &ran.records {
        assert_eq!((&record["status"], &record["reason"]), (&"not_run".into(), &"interrupted".into()), "{record}");
    }
    for pid in spares {
        assert!(gone_within(pid, Duration::ZERO), "spare {pid} outlived the run");
    }
}

#[test]
fn spares_die_with_an_interrupted_run_and_their_units_are_reported() {
    interrupted_run_with_spares("zygote");
}

/// The same with the first worker exec'd (`--spawn auto`): its spares were
/// forked beside it, from a helper thread.
#[test]
fn spares_forked_beside_an_execd_first_unit_die_with_an_interrupted_run() {
    interrupted_run_with_spares("auto");
}

#[test]
fn spares_die_with_a_killed_supervisor() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, spares) = start_run_with_spares(tmp.path(), "zygote");
    child.kill().unwrap();
    child.wait().unwrap();
    for pid in spares {
        assert!(gone_within(pid, Duration::from_secs(10)), "spare {pid} outlived a SIGKILLed supervisor");
    }
}

/// Real TensorFlow: units in warm spares (their model preloaded) give the
/// same outputs as fresh workers, under the same sandbox, and their
/// warm-up worked.
#[test]
fn real_models_in_warm_spares_answer_as_fresh_workers_do() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    for i in 0..4 {
        copy_dir(&fixtures().join("models/keras_mlp"), &models.join(format!("mlp{i}")));
    }
    let inputs = fixtures().join("expected/keras_mlp__serving_default/inputs.npz");
    let with = |spares: &str| {
        run(isorun()
            .arg("run")
            .arg(&models)
            .arg("--inputs")
            .arg(&inputs)
            .args(["-j", "1", "--spawn", "zygote", "--spares", spares, "--values", "--json"]))
    };
    let (spared, fresh) = (with("2"), with("0"));
    assert_eq!((spared.code, fresh.code), (Some(0), Some(0)), "{}\n{}", spared.stderr, fresh.stderr);
    let in_spares: Vec<&Value> = spared.records.iter().filter(|r| r.get("spare").is_some()).collect();
    assert!(in_spares.len() >= 2, "{}", spared.stdout);
    for record in in_spares {
        assert!(record["spare"]["warm_ms"].as_u64().unwrap() > 0, "{record}");
        assert!(record["spare"].get("warm_error").is_none(), "the warm-up worked: {record}");
        // The spare loaded the unit's own model as its warm-up.
        assert_eq!(record["spare"].get("preload_ms").is_some(), spares_preload_here(), "{record}");
    }
    assert!(fresh.records.iter().all(|r| r.get("spare").is_none()), "--spares 0 has none");
    for (a, b) in spared.records.iter().zip(&fresh.records) {
        assert_eq!(a["model"], b["model"]);
        assert_eq!(a["outputs"], b["outputs"], "same answers in a spare");
        assert_eq!(a["sandbox"], b["sandbox"], "same protections in a spare");
    }
}

/// Makes a SavedModel whose `serving_default` returns four draws of an
/// unseeded `tf.random.uniform` (TensorFlow seeds those from its process's
/// own random seed, made once per process on first use).
fn draws_model(python: &Path, dir: &Path) {
    let script = r#"
import sys, tensorflow as tf
class Draws(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(self, x):
        return {"draws": tf.random.uniform([4]) + 0.0 * tf.reduce_sum(x)}
m = Draws()
tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.serve})
"#;
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .unwrap();
    assert!(out.status.success(), "making the draws model failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_worker_draws_its_own_random_numbers_forked_warmed_or_started() {
    // What the zygote sets up before it forks is shared by every worker; if
    // it ever seeded TensorFlow's random numbers (a session or a device
    // does), every unit of a stochastic model would draw the same ones.
    let Some(python) = crate::util::fixtures_python("spares::every_worker_draws_its_own_random_numbers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    draws_model(&python, &models.join("d0"));
    for i in 1..3 {
        copy_dir(&models.join("d0"), &models.join(format!("d{i}")));
    }
    let mut seen: Vec<(String, Value)> = Vec::new();
    for (spawn, spares) in [("zygote", "2"), ("zygote", "0"), ("exec", "0")] {
        let ran = run(isorun()
            .arg("run")
            .arg(&models)
            .args(["--input", "x=@[1]", "-j", "1", "--spawn", spawn, "--spares", spares, "--values", "--json"]));
        assert_eq!(ran.code, Some(0), "{spawn} --spares {spares}: {}", ran.stderr);
        assert_eq!(ran.records.len(), 3, "{}", ran.stdout);
        for record in &ran.records {
            let draws = record["outputs"]["draws"]["values"].clone();
            assert_eq!(draws.as_array().map(Vec::len), Some(4), "{record}");
            let what = format!("{} ({spawn}, --spares {spares}, worker {})", record["model"], record["worker_id"]);
            if let Some((other, _)) = seen.iter().find(|(_, d)| *d == draws) {
                panic!("{what} drew the same numbers as {other}: {draws}");
            }
            seen.push((what, draws));
        }
    }
}
