//! Output files that must not lose results: a second run writing the same
//! report, JUnit, HTML or journal file is refused before any work, naming
//! the file and the run that writes it, while a run after it (or after one
//! that was killed) overwrites the file; and the models a run did not reach
//! say why it stopped: its stdout closed (`| head -1`), or a signal. Eval's
//! `--predictions` folder and `report merge -o` are locked the same way.

use crate::util::{
    bin, copy_dir, fake_models, fixtures, gone_within, isorun, isorun_fault, processes_mentioning, ran,
    wait_for_fault_workers, write_input,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// `isorun run` on the fault models under `models`, marked with `marker`.
fn start(tmp: &Path, models: &str, marker: &str, extra: &[&str]) -> Child {
    let input = write_input(tmp);
    isorun_fault(&[marker])
        .arg(tmp.join(models))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--spares", "0", "--json"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts a run whose first model hangs, and waits until its worker runs
/// (the run holds its output locks from before its first worker); that
/// worker's pid.
fn start_hanging(tmp: &Path, marker: &str, extra: &[&str]) -> (Child, u32) {
    let mut child = start(tmp, "first", marker, extra);
    match wait_for_fault_workers(marker, child.id(), 1) {
        Some(pids) => (child, pids[0]),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("timed out waiting for the first run's worker");
        }
    }
}

fn report_models(path: &Path) -> Vec<(String, String)> {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    report["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["model"].as_str().unwrap().to_string(), u["status"].as_str().unwrap().to_string()))
        .collect()
}

fn kill(pid: u32) {
    // SAFETY: a signal to a process this test started (or its worker).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn a_second_run_writing_the_same_outputs_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fake_models(&root.join("first"), &["a-fault-hang", "b"]);
    fake_models(&root.join("second"), &["c"]);
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    let (report, junit, html, journal) =
        (out.join("r.json"), out.join("r.xml"), out.join("r.html"), out.join("j.jsonl"));
    let marker = format!("marker-{}-locked-first", std::process::id());
    let outputs: [(&str, &Path); 4] =
        [("--report", &report), ("--junit", &junit), ("--html", &html), ("--journal", &journal)];
    let mut first_args: Vec<String> = Vec::new();
    for (flag, path) in outputs {
        first_args.extend([flag.to_string(), path.display().to_string()]);
    }
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let (first, hanging) = start_hanging(root, &marker, &first_args);

    // Each output alone is enough to refuse the second run, before any worker.
    let second_marker = format!("marker-{}-locked-second", std::process::id());
    for (flag, path) in outputs {
        let second =
            ran(start(root, "second", &second_marker, &[flag, path.to_str().unwrap()]).wait_with_output().unwrap());
        assert_eq!(second.code, Some(2), "{flag}: {}", second.stderr);
        assert!(second.stdout.is_empty(), "{flag}: {}", second.stdout);
        let expected = format!(
            "isorun: error: {flag} {}: another isorun (pid {}) is writing this file",
            path.display(),
            first.id()
        );
        assert!(second.stderr.starts_with(&expected), "{flag}: {}", second.stderr);
    }
    assert!(!journal.exists() || !std::fs::read_to_string(&journal).unwrap().contains("\"c\""));

    // The first run goes on to its end, and its files hold its models.
    kill(hanging);
    let first = ran(first.wait_with_output().unwrap());
    assert_eq!(first.code, Some(1), "{}", first.stderr);
    let statuses = [("a-fault-hang".to_string(), "crashed".to_string()), ("b".to_string(), "ok".to_string())];
    assert_eq!(report_models(&report), statuses);
    assert!(std::fs::read_to_string(&junit).unwrap().contains("name=\"b\""));

    // A run after it overwrites the report, as any output file is.
    let rerun =
        ran(start(root, "second", &second_marker, &["--report", report.to_str().unwrap()]).wait_with_output().unwrap());
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    assert_eq!(report_models(&report), [("c".to_string(), "ok".to_string())]);
    let mut left: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["j.jsonl", "r.html", "r.json", "r.xml"], "no lock file is left by runs that ended");
}

#[test]
fn a_killed_runs_lock_does_not_block_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fake_models(&root.join("first"), &["a-fault-hang"]);
    fake_models(&root.join("second"), &["c"]);
    let report = root.join("r.json");
    let marker = format!("marker-{}-killed-holder", std::process::id());
    let (mut first, hanging) = start_hanging(root, &marker, &["--report", report.to_str().unwrap()]);
    kill(first.id());
    first.wait().unwrap();
    assert!(gone_within(hanging, Duration::from_secs(10)), "the killed run's worker {hanging} lives on");
    assert!(root.join(".r.json.isorun-lock").exists(), "the killed run's lock file is left, unlocked");

    let second =
        ran(start(root, "second", &marker, &["--report", report.to_str().unwrap()]).wait_with_output().unwrap());
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert_eq!(report_models(&report), [("c".to_string(), "ok".to_string())]);
    assert!(processes_mentioning(&marker).iter().all(|p| !p.contains("isorun-fault-worker")));
}

/// The report's `not_run` units of a run whose reader left after one line.
#[test]
fn models_a_closed_stdout_stopped_say_so_in_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("m{i}-fault-slow-300")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fake_models(&tmp.path().join("models"), &names);
    let report = tmp.path().join("r.json");
    let marker = format!("marker-{}-closed-stdout", std::process::id());
    let mut child = start(tmp.path(), "models", &marker, &["--report", report.to_str().unwrap()]);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    drop(stdout); // like `head -1`
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let units = report["units"].as_array().unwrap();
    assert_eq!(units.len(), 6, "{report}");
    let not_run: Vec<&Value> = units.iter().filter(|u| u["status"] == "not_run").collect();
    assert!(!not_run.is_empty(), "{report}");
    for unit in not_run {
        assert_eq!(unit["reason"], "stdout_closed", "{unit}");
        let message = unit["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("not run: stdout closed"), "{message}");
    }
}

/// Ctrl-C's records name the signal, apart from a closed stdout's.
#[test]
fn models_a_signal_stopped_name_it() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("first"), &["a-fault-hang", "b"]);
    let marker = format!("marker-{}-signalled", std::process::id());
    let (child, _) = start_hanging(tmp.path(), &marker, &[]);
    // SAFETY: a signal to the run this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let ran = ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 2, "{}", ran.stdout);
    for record in &ran.records {
        assert_eq!((&record["status"], &record["reason"]), (&"not_run".into(), &"interrupted".into()), "{record}");
        assert_eq!(record["error"]["message"], "not run: interrupted by SIGINT (Ctrl-C)", "{record}");
    }
}

/// `isorun eval` of the echo models under `models` (fault workers, marked
/// with `marker`, echo their inputs as the echo model does) on a CSV of x and y.
fn start_eval(tmp: &Path, models: &str, marker: &str, extra: &[&str]) -> Child {
    let data = tmp.join("data.csv");
    std::fs::write(&data, "x,y\n0.9,1\n0.2,0\n").unwrap();
    isorun()
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .arg("eval")
        .arg(format!("--worker-arg={marker}"))
        .arg(tmp.join(models))
        .arg("--data")
        .arg(&data)
        .args(["--label", "y", "--metric", "accuracy", "-j", "1", "--spares", "0", "--json"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn echo_models(root: &Path, names: &[&str]) {
    for name in names {
        copy_dir(&fixtures().join("eval/models/echo"), &root.join(name));
    }
}

fn names_in(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_second_eval_writing_the_same_predictions_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    echo_models(&root.join("first"), &["a-fault-hang", "b"]);
    echo_models(&root.join("second"), &["c"]);
    let preds = root.join("preds");
    let preds_arg = ["--predictions", preds.to_str().unwrap()];
    let marker = format!("marker-{}-predictions-first", std::process::id());
    let mut first = start_eval(root, "first", &marker, &preds_arg);
    let Some(hanging) = wait_for_fault_workers(&marker, first.id(), 1) else {
        let _ = first.kill();
        let _ = first.wait();
        panic!("timed out waiting for the first eval's worker");
    };

    let second_marker = format!("marker-{}-predictions-second", std::process::id());
    let second = ran(start_eval(root, "second", &second_marker, &preds_arg).wait_with_output().unwrap());
    assert_eq!(second.code, Some(2), "{}", second.stderr);
    assert!(second.stdout.is_empty(), "{}", second.stdout);
    let expected = format!(
        "isorun: error: --predictions {}: another isorun (pid {}) is writing this folder",
        preds.display(),
        first.id()
    );
    assert!(second.stderr.starts_with(&expected), "{}", second.stderr);

    // The first eval goes on to its end and writes its predictions.
    kill(hanging[0]);
    let first = ran(first.wait_with_output().unwrap());
    assert_eq!(first.code, Some(1), "{}", first.stderr);
    assert_eq!(names_in(&preds), ["b.parquet"]);

    // An eval after it writes into the folder, as any output is written.
    let rerun = ran(start_eval(root, "second", &second_marker, &preds_arg).wait_with_output().unwrap());
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    assert_eq!(names_in(&preds), ["b.parquet", "c.parquet"]);
    assert!(!names_in(root).iter().any(|name| name.ends_with(".isorun-lock")), "{:?}", names_in(root));
}

#[test]
fn a_merge_into_a_report_another_run_writes_is_refused_and_a_later_one_overwrites_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let all = ["m0", "m1", "m2", "m3", "m4", "m5"];
    fake_models(&root.join("all"), &all);
    let marker = format!("marker-{}-merge", std::process::id());
    let shards = [root.join("s0.json"), root.join("s1.json")];
    for (k, report) in shards.iter().enumerate() {
        let shard = format!("{k}/2");
        let args = ["--shard", shard.as_str(), "--report", report.to_str().unwrap()];
        let done = ran(start(root, "all", &marker, &args).wait_with_output().unwrap());
        assert_eq!(done.code, Some(0), "{}", done.stderr);
    }
    fake_models(&root.join("first"), &["a-fault-hang"]);
    let merged = root.join("merged.json");
    let (first, hanging) = start_hanging(root, &marker, &["--report", merged.to_str().unwrap()]);
    let merge = || ran(isorun().args(["report", "merge"]).args(&shards).arg("-o").arg(&merged).output().unwrap());

    let refused = merge();
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    let expected =
        format!("isorun: error: -o {}: another isorun (pid {}) is writing this file", merged.display(), first.id());
    assert!(refused.stderr.starts_with(&expected), "{}", refused.stderr);

    kill(hanging);
    let first = ran(first.wait_with_output().unwrap());
    assert_eq!(first.code, Some(1), "{}", first.stderr);
    assert_eq!(report_models(&merged), [("a-fault-hang".to_string(), "crashed".to_string())]);

    let merged_again = merge();
    assert_eq!(merged_again.code, Some(0), "{}", merged_again.stderr);
    let mut models: Vec<String> = report_models(&merged).into_iter().map(|(model, _)| model).collect();
    models.sort();
    assert_eq!(models, all);
    assert!(!names_in(root).iter().any(|name| name.ends_with(".isorun-lock")), "{:?}", names_in(root));
}
