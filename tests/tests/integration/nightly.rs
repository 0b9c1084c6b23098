//! The nightly evaluation's promises: memory limits, retries, crash
//! bisection, journal and resume, golden outputs, shards, exit policy.

use crate::util::{
    bin, fake_models, fixtures, gone_within, isorun, isorun_fault, run, wait_for_fault_workers, write_input, Ran,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

fn fault_run(root: &Path, models: &[&str], extra: &[&str]) -> Ran {
    fake_models(&root.join("models"), models);
    let input = write_input(root);
    run(isorun_fault(&[]).arg(root.join("models")).arg(format!("--input=x={}", input.display())).args(extra))
}

fn statuses(ran: &Ran) -> Vec<(String, String)> {
    ran.statuses()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn a_memory_hog_is_stopped_at_its_limit_and_costs_only_itself() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["a-fault-hog-2048", "b-fault-slow-2000"]);
    let input = write_input(tmp.path());
    let marker = format!("marker-{}-hog", std::process::id());
    // A limit that takes the hog a few hundred ms to reach, so the test sees its worker first.
    let child = isorun_fault(&[&marker])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["--memory-limit", "1G", "-j", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let workers = wait_for_fault_workers(&marker, child.id(), 1);
    let hog_worker = workers.as_ref().and_then(|w| w.first().copied());
    let seen = std::time::Instant::now();
    // The hog's worker is killed and reaped while the run goes on (the next
    // model sleeps 2 s): the supervisor killed it, not its own exit.
    let gone = hog_worker.map(|pid| gone_within(pid, std::time::Duration::from_secs(10)));
    let took = seen.elapsed();
    let mut child = child;
    let still_running = child.try_wait().unwrap().is_none();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    let hog_worker = hog_worker.unwrap_or_else(|| panic!("no hog worker seen: {}", ran.stderr));
    assert_eq!(gone, Some(true), "the hog's worker {hog_worker} is still there after 10 s");
    assert!(still_running, "the run had ended: the hog's worker may have died with it");
    eprintln!("hog worker gone {took:?} after it was seen");
    assert_eq!(
        statuses(&ran),
        pairs(&[("a-fault-hog-2048", "memory_limit"), ("b-fault-slow-2000", "ok")]),
        "{}",
        ran.stderr
    );
    let hog = ran.record("a-fault-hog-2048");
    let peak = hog["peak_private_bytes"].as_u64().unwrap();
    assert!(peak > 1000 << 20, "stopped above the limit: {peak}");
    assert!(peak < 2000 << 20, "and before it took 2 GiB: {peak}");
    assert_eq!(ran.code, Some(1));
}

#[test]
fn a_flaky_unit_is_retried_and_reported_ok_with_every_attempt() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = fault_run(tmp.path(), &["fault-flaky", "fault-segfault"], &["--retries", "2", "--json"]);
    let flaky = ran.record("fault-flaky");
    assert_eq!(flaky["status"], "ok", "{flaky}");
    assert_eq!(flaky["flaky"], true);
    let attempts: Vec<&str> =
        flaky["attempts"].as_array().unwrap().iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(attempts, ["crashed", "ok"]);
    // A unit that always crashes is tried 1 + 2 times, then reported crashed.
    let crashing = ran.record("fault-segfault");
    assert_eq!(crashing["status"], "crashed");
    assert_eq!(crashing["attempts"].as_array().unwrap().len(), 3);
    assert!(crashing.get("flaky").is_none());
    assert_eq!(ran.code, Some(1));
}

#[test]
fn a_model_error_is_not_retried_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["fault-error"]);
    let input = write_input(tmp.path());
    let computed = |retry_on: &[&str]| {
        let log = tmp.path().join(format!("computed-{}.log", retry_on.len()));
        let ran = run(isorun_fault(&[&format!("--log={}", log.display())])
            .arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .args(["--retries", "2", "--json"])
            .args(retry_on));
        let record = ran.record("fault-error").clone();
        assert_eq!(record["status"], "error", "{record}");
        let runs = std::fs::read_to_string(&log).unwrap_or_default().lines().count();
        (record["attempts"].as_array().unwrap().len(), runs)
    };
    // Deterministic: with the default --retry-on, tried once.
    assert_eq!(computed(&[]), (1, 1), "a model error is not retried by default");
    // Asked for, it is (so the count above is not for lack of retries).
    assert_eq!(computed(&["--retry-on", "error"]), (3, 3));
}

#[test]
fn errors_are_not_retried_unless_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = fault_run(tmp.path(), &["fault-exit3"], &["--retries", "2", "--retry-on", "timeout", "--json"]);
    assert_eq!(ran.record("fault-exit3")["attempts"].as_array().unwrap().len(), 1, "crashed is not in --retry-on");
}

#[test]
fn bisection_names_the_one_crashing_model_among_five() {
    let tmp = tempfile::tempdir().unwrap();
    let models = ["a", "b-fault-crash-if-not-first", "c", "d-fault-segfault", "e"];
    let ran = fault_run(tmp.path(), &models, &["--models-per-worker", "5", "-j", "1", "--json"]);
    assert_eq!(
        statuses(&ran),
        pairs(&[
            ("a", "ok"),
            ("b-fault-crash-if-not-first", "ok"),
            ("c", "ok"),
            ("d-fault-segfault", "crashed"),
            ("e", "ok")
        ])
    );
    // b crashed only because it shared a worker: run alone, it passes, and the record says what happened.
    let b = ran.record("b-fault-crash-if-not-first");
    let attempts = b["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["status"], "crashed");
    assert_eq!(attempts[0]["shared_worker"], true);
    assert_eq!(attempts.last().unwrap()["status"], "ok");
    // d crashes alone too, so it is blamed.
    let d = ran.record("d-fault-segfault");
    assert_eq!(d["attempts"].as_array().unwrap().last().unwrap()["status"], "crashed");
}

#[test]
fn sigkill_then_resume_gives_every_model_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("m{i}-fault-slow-400")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fake_models(&tmp.path().join("models"), &names);
    let input = write_input(tmp.path());
    let journal = tmp.path().join("journal.jsonl");
    let log = tmp.path().join("computed.log");
    let command = |resume: bool| {
        let log_arg = format!("--worker-arg=--log={}", log.display());
        let mut c = isorun_fault(&[]);
        c.arg(&log_arg);
        c.arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .args(["-j", "1", "--json", "--journal"])
            .arg(&journal);
        if resume {
            c.arg("--resume");
        }
        c
    };
    let mut first = command(false).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        lines.next().unwrap().unwrap();
    }
    // SAFETY: killing our own child.
    unsafe { libc::kill(first.id() as i32, libc::SIGKILL) };
    first.wait().unwrap();
    let journaled: Vec<Value> =
        std::fs::read_to_string(&journal).unwrap().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(journaled.len() >= 2 && journaled.len() < 6, "{} journaled", journaled.len());

    let second = run(&mut command(true));
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    let ids: Vec<&str> = second.records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, names, "every model exactly once, in order");
    let computed = std::fs::read_to_string(&log).unwrap();
    for record in &journaled {
        let id = record["model"].as_str().unwrap();
        assert_eq!(second.record(id)["resumed"], true, "{id} comes from the journal");
        assert_eq!(computed.lines().filter(|l| *l == id).count(), 1, "{id} was computed once");
    }
    let resumed = second.records.iter().filter(|r| r["resumed"] == true).count();
    assert_eq!(resumed, journaled.len());

    // A model changed since: runs again.
    std::fs::write(tmp.path().join("models/m0-fault-slow-400/saved_model.pb"), b"changed").unwrap();
    let third = run(&mut command(true));
    assert!(third.record("m0-fault-slow-400").get("resumed").is_none());
    assert_eq!(third.record("m1-fault-slow-400")["resumed"], true);
}

/// A run of the fault worker on `root/models` with a journal (and `--resume` after the first).
fn journaled_run(root: &Path, worker: &Path, extra: &[&str], env: &[(&str, &str)]) -> Ran {
    let input = write_input(root);
    let mut command = isorun_fault(&[]);
    command
        .env("ISORUN_WORKER", worker)
        .envs(env.iter().copied())
        .arg(root.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--json", "--journal"])
        .arg(root.join("journal.jsonl"))
        .args(extra);
    if root.join("journal.jsonl").exists() {
        command.arg("--resume");
    }
    run(&mut command)
}

#[test]
fn resumed_records_keep_their_values_and_another_worker_or_tensorflow_reruns() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good"]);
    let worker = tmp.path().join("worker");
    std::fs::copy(bin("isorun-fault-worker"), &worker).unwrap();
    let tf = |version| [("TF_FAULT_VERSION", version)];
    let values = ["--values"];
    let first = journaled_run(tmp.path(), &worker, &values, &tf("2.21.0"));
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let computed = first.record("good")["outputs"]["x"]["values"].clone();
    assert!(computed.is_array(), "{}", first.stdout);

    let second = journaled_run(tmp.path(), &worker, &values, &tf("2.21.0"));
    assert_eq!(second.record("good")["resumed"], true, "{}", second.stderr);
    assert_eq!(second.record("good")["outputs"]["x"]["values"], computed, "--values with --resume keeps the values");

    let other_tensorflow = journaled_run(tmp.path(), &worker, &values, &tf("2.22.0"));
    assert!(other_tensorflow.record("good").get("resumed").is_none(), "another TensorFlow computes again");

    // Another worker binary (same version line): computes again, then resumes.
    let mut bytes = std::fs::read(&worker).unwrap();
    bytes.extend_from_slice(b"rebuilt");
    std::fs::write(&worker, bytes).unwrap();
    let other_worker = journaled_run(tmp.path(), &worker, &values, &tf("2.22.0"));
    assert!(other_worker.record("good").get("resumed").is_none(), "another worker computes again");
    let again = journaled_run(tmp.path(), &worker, &values, &tf("2.22.0"));
    assert_eq!(again.record("good")["resumed"], true);
}

#[test]
fn golden_files_and_tolerances_are_part_of_the_journal_key() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good"]);
    let golden = tmp.path().join("golden");
    std::fs::create_dir_all(golden.join("good")).unwrap();
    let expect =
        |rtol: &'static str| ["--expect".to_string(), golden.display().to_string(), "--rtol".into(), rtol.into()];
    let worker = bin("isorun-fault-worker");
    let with =
        |rtol| journaled_run(tmp.path(), &worker, &expect(rtol).iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let first = with("0.1");
    assert_eq!(first.record("good")["status"], "mismatch", "no golden output yet: {}", first.stdout);
    assert_eq!(with("0.1").record("good")["resumed"], true);
    assert!(with("0.2").record("good").get("resumed").is_none(), "another --rtol computes again");
    assert_eq!(with("0.2").record("good")["resumed"], true);
    std::fs::write(golden.join("good/x.npy"), b"new golden output").unwrap();
    assert!(with("0.2").record("good").get("resumed").is_none(), "a new golden file computes again");
}

#[test]
fn a_damaged_journal_line_is_a_usage_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good"]);
    let journal = tmp.path().join("journal.jsonl");
    std::fs::write(&journal, "{\"key\": \"k\", \"model\": \"good\"}\nnot a record\n{\"key\": \"k2\"}\n").unwrap();
    let ran = journaled_run(tmp.path(), &bin("isorun-fault-worker"), &[], &[]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains(&format!("{} line 2:", journal.display())), "{}", ran.stderr);
    assert!(ran.records.is_empty(), "nothing runs: {}", ran.stdout);
}

#[test]
fn a_text_only_saved_model_is_journaled_and_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("models/text");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("saved_model.pbtxt"), "saved_model_schema_version: 1\n").unwrap();
    let worker = bin("isorun-fault-worker");
    let first = journaled_run(tmp.path(), &worker, &[], &[]);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert_eq!(first.record("text")["status"], "ok");
    assert_eq!(journaled_run(tmp.path(), &worker, &[], &[]).record("text")["resumed"], true);
}

#[test]
fn golden_outputs_catch_a_difference_with_its_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures().join("models/keras_mlp");
    let inputs = fixtures().join("expected/keras_mlp__serving_default/inputs.npz");
    let golden = tmp.path().join("golden");
    let night =
        |extra: &[&str]| run(isorun().arg("run").arg(&model).arg("--inputs").arg(&inputs).arg("--json").args(extra));
    assert_eq!(night(&["--output-dir", golden.to_str().unwrap()]).code, Some(0));
    let same = night(&["--expect", golden.to_str().unwrap()]);
    assert_eq!(same.records[0]["status"], "ok", "{}", same.stdout);

    // Change one value of the golden file by 0.01.
    crate::util::nudge_f32_npy(&golden.join("keras_mlp/probabilities.npy"), 5, 0.01);
    let differs = night(&["--expect", golden.to_str().unwrap()]);
    assert_eq!(differs.code, Some(1));
    let record = &differs.records[0];
    assert_eq!(record["status"], "mismatch", "{record}");
    assert_eq!(record["mismatch"]["output"], "probabilities");
    assert_eq!(record["mismatch"]["index"], serde_json::json!([1, 1]), "element 5 of a [3, 4] output");
    let abs = record["mismatch"]["max_abs_error"].as_f64().unwrap();
    assert!((abs - 0.01).abs() < 1e-4, "{abs}");
    // A loose enough tolerance accepts it.
    let loose = night(&["--expect", golden.to_str().unwrap(), "--atol", "0.02"]);
    assert_eq!(loose.records[0]["status"], "ok");
}

#[test]
fn shards_cover_every_model_once() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("model-{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fake_models(&tmp.path().join("models"), &names);
    let input = write_input(tmp.path());
    let mut seen = Vec::new();
    for k in 0..3 {
        let ran = run(isorun_fault(&[])
            .arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .args(["--json", "--shard", &format!("{k}/3")]));
        seen.extend(ran.records.iter().map(|r| r["model"].as_str().unwrap().to_string()));
    }
    seen.sort();
    assert_eq!(seen, names);
    let bad = run(isorun_fault(&[]).arg(tmp.path().join("models")).args(["--shard", "3/3"]));
    assert_eq!(bad.code, Some(2));
}

#[test]
fn fail_on_and_max_failures_set_the_exit_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = fault_run(tmp.path(), &["a-fault-exit3", "b", "c", "d"], &["--json", "--fail-on", "timeout"]);
    assert_eq!(ran.code, Some(0), "a crash does not fail the run when only timeouts do");
    let tmp = tempfile::tempdir().unwrap();
    let ran = fault_run(
        tmp.path(),
        &["a-fault-exit3", "b-fault-exit3", "c", "d"],
        &["--json", "-j", "1", "--max-failures", "1"],
    );
    assert_eq!(ran.code, Some(1));
    assert_eq!(ran.record("a-fault-exit3")["status"], "crashed");
    for id in ["c", "d"] {
        assert_eq!(ran.record(id)["status"], "not_run");
        assert_eq!(ran.record(id)["reason"], "max_failures");
    }
}
