//! What must not surprise a nightly job silently (issue 26, section 5):
//! resumed records without their values, a merge of missing shards, only
//! the first breach, colours in a log file, inspect's two forms of an
//! unknown dimension, the GPU a worker never had, `doctor` without `--json`.

use crate::util::eval_fixtures::{self, data, model};
use crate::util::{fake_models, fixtures, isorun, isorun_fault, run, write_input, Ran};
use serde_json::{json, Value};
use std::path::Path;

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// `isorun run` of the fault worker on `root/models` with a journal.
fn journaled(root: &Path, extra: &[&str]) -> Ran {
    let input = write_input(root);
    run(isorun_fault(&[])
        .arg(root.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--json", "--journal"])
        .arg(root.join("journal.jsonl"))
        .args(extra))
}

#[test]
fn resume_with_values_reruns_units_journaled_without_them_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good", "other"]);
    let first = journaled(tmp.path(), &[]);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert!(first.record("good")["outputs"]["x"].get("values").is_none());

    let second = journaled(tmp.path(), &["--resume", "--values"]);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    for id in ["good", "other"] {
        let record = second.record(id);
        assert!(record.get("resumed").is_none(), "a line without values is computed again: {record}");
        assert!(record["outputs"]["x"]["values"].is_array(), "{record}");
    }
    let warnings: Vec<&str> = second.stderr.lines().filter(|l| l.contains("without --values")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {}", second.stderr);
    assert!(warnings[0].contains("2 unit(s)"), "{}", warnings[0]);

    // Now journaled with their values: resumed with them, and no warning.
    let third = journaled(tmp.path(), &["--resume", "--values"]);
    assert_eq!(third.record("good")["resumed"], true, "{}", third.stderr);
    assert!(third.record("good")["outputs"]["x"]["values"].is_array());
    assert!(!third.stderr.contains("without --values"), "{}", third.stderr);
}

#[test]
fn report_merge_of_some_shards_is_refused_naming_the_missing_ones_unless_partial() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let ids = ["alpha", "beta", "delta", "gamma", "zeta"];
    fake_models(&models, &ids);
    let input = write_input(tmp.path());
    let shard0 = tmp.path().join("shard0.json");
    let ran = run(isorun_fault(&[])
        .arg(&models)
        .arg(format!("--input=x={}", input.display()))
        .args(["--json", "--shard", "0/3", "--report"])
        .arg(&shard0));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let half = tmp.path().join("half.json");
    let merge = |extra: &[&str]| run(isorun().args(["report", "merge"]).arg(&shard0).arg("-o").arg(&half).args(extra));

    let refused = merge(&[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.starts_with("isorun: error: missing 1/3, 2/3: 0/3 given;")
            && refused.stderr.contains("--partial"),
        "{}",
        refused.stderr
    );
    assert!(!half.exists(), "nothing is written");

    let partial = merge(&["--partial"]);
    assert_eq!(partial.code, Some(0), "{}", partial.stderr);
    assert!(partial.stderr.contains("isorun: warning: missing 1/3, 2/3 (merged from 0/3)"), "{}", partial.stderr);
    let merged = read_json(&half);
    assert_eq!(merged["settings"]["missing_shards"], json!(["1/3", "2/3"]));
    assert_eq!(merged["settings"]["merged_from"], json!(["0/3"]));

    // With the model list (the Slurm merge job), the lost shards' models are not_run: a warning, exit 0.
    let list = tmp.path().join("models.json");
    let listed: Vec<Value> = ids.iter().map(|id| json!({"model": id})).collect();
    std::fs::write(&list, json!({"shards": 3, "models": listed}).to_string()).unwrap();
    let with_models = merge(&["--models", list.to_str().unwrap()]);
    assert_eq!(with_models.code, Some(0), "{}", with_models.stderr);
    assert!(with_models.stderr.contains("warning: missing 1/3, 2/3"), "{}", with_models.stderr);
    let merged = read_json(&half);
    assert_eq!(merged["summary"]["total"], ids.len());
    let shard_units = read_json(&shard0)["units"].as_array().unwrap().len();
    assert_eq!(merged["summary"]["by_status"]["not_run"], ids.len() - shard_units);
}

#[test]
fn report_merge_refuses_a_run_report_with_an_eval_report() {
    let tmp = tempfile::tempdir().unwrap();
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_714_566_896);
    let info = |settings: Value| isorun_report::RunInfo {
        started_at: at,
        finished_at: at,
        command: vec!["isorun".into()],
        settings,
        tensorflow_version: None,
    };
    let (run_report, eval_report) = (tmp.path().join("run.json"), tmp.path().join("eval.json"));
    let unit = |model: &str| json!({"model": model, "status": "ok", "wall_ms": 5});
    let write = |path: &Path, model: &str, settings: Value| {
        let report = isorun_report::build(&[unit(model)], &info(settings));
        isorun_report::write_files(&report, Some(path), None, None).unwrap();
    };
    write(&run_report, "a", json!({"jobs": 1}));
    write(&eval_report, "b", json!({"jobs": 1, "eval": {"label": "y"}}));
    let output = tmp.path().join("merged.json");
    let ran =
        run(isorun().args(["report", "merge", "--partial"]).arg(&run_report).arg(&eval_report).arg("-o").arg(&output));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(
        ran.stderr.trim_end(),
        format!(
            "isorun: error: cannot merge the run report {} with the eval report {}: they are not shards of one run",
            run_report.display(),
            eval_report.display()
        )
    );
    assert!(!output.exists());
}

#[test]
fn eval_records_every_breach_and_the_first_as_breach() {
    let thresholds = ["--threshold", "accuracy>=0.99", "--threshold", "auc>=0", "--threshold", "log_loss<=0.0001"];
    let ran = eval_fixtures::eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &thresholds);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("binary");
    assert_eq!(record["status"], "below_threshold", "{record}");
    let rules: Vec<&str> = record["breaches"].as_array().unwrap().iter().map(|b| b["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["accuracy>=0.99", "log_loss<=0.0001"], "{record}");
    assert_eq!(record["breach"], record["breaches"][0], "the first is today's breach");
    assert_eq!(record["breaches"][1]["metric"], "log_loss");
    assert_eq!(record["breaches"][1]["bound"], 0.0001);
}

#[test]
fn verbose_logs_are_coloured_only_on_a_terminal_or_when_forced() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["good"]);
    let input = write_input(tmp.path());
    let verbose = |env: &[(&str, &str)]| {
        let mut command = isorun_fault(&[]);
        for var in ["NO_COLOR", "CLICOLOR_FORCE", "CLICOLOR"] {
            command.env_remove(var);
        }
        command.env("TERM", "xterm-256color").envs(env.iter().copied());
        run(command
            .arg("-v")
            .arg(tmp.path().join("models"))
            .arg(format!("--input=x={}", input.display()))
            .arg("--json"))
    };
    let piped = verbose(&[]);
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert!(piped.stderr.contains("starting"), "-v logs: {}", piped.stderr);
    assert!(!piped.stderr.contains('\x1b'), "no ANSI colours into a file: {:?}", piped.stderr);
    let forced = verbose(&[("CLICOLOR_FORCE", "1")]);
    assert!(forced.stderr.contains("\x1b["), "CLICOLOR_FORCE colours: {:?}", forced.stderr);
    let no_color = verbose(&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]);
    assert!(!no_color.stderr.contains('\x1b'), "NO_COLOR wins: {:?}", no_color.stderr);
}

#[test]
fn inspect_json_writes_an_unknown_size_as_null_for_saved_models_and_keras_files() {
    let saved_model = run(isorun().args(["inspect", "--json"]).arg(fixtures().join("models/multi_sig")));
    assert_eq!(saved_model.code, Some(0), "{}", saved_model.stderr);
    let x = &saved_model.records[0]["signatures"]["serving_default"]["inputs"]["x"];
    assert_eq!(x["shape"], json!([null, 3]), "{x}");
    let keras = run(isorun().args(["inspect", "--json"]).arg(fixtures().join("keras/multi.keras")));
    assert_eq!(keras.code, Some(0), "{}", keras.stderr);
    assert_eq!(keras.records[0]["inputs"]["a"]["shape"], json!([null, 3]), "the same form");
}

#[test]
fn eval_records_give_slice_examples_as_integers_and_only_the_settings_of_their_task() {
    let eval = fixtures().join("eval");
    let record = |model: &str, label: &str| {
        let ran = run(isorun()
            .arg("eval")
            .arg(eval.join("models").join(model))
            .arg("--data")
            .arg(eval.join("data/data.tfrecord"))
            .args(["--label", label, "--slice", "country", "-j", "1", "--json"]));
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        ran.record(model).clone()
    };
    let multiclass = record("multiclass", "label_cls");
    let binary = record("binary", "label_bin");
    for record in [&multiclass, &binary] {
        let slices = record["slices"]["country"].as_object().unwrap();
        assert!(!slices.is_empty(), "{record}");
        for (value, metrics) in slices {
            assert!(metrics["examples"].is_u64(), "slice {value}'s examples is an integer: {metrics}");
        }
    }
    assert_eq!(multiclass["top_k"], 5, "{multiclass}");
    assert!(multiclass.get("threshold").is_none(), "the binary threshold is not multiclass's: {multiclass}");
    assert_eq!(binary["threshold"], 0.5, "{binary}");
    assert!(binary.get("top_k").is_none(), "top_k is not binary's: {binary}");
}

#[test]
fn gpus_on_a_machine_without_any_record_no_device_and_bind_the_workers_to_none() {
    let has_gpu = std::fs::read_dir("/dev").unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.strip_prefix("nvidia").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if has_gpu {
        eprintln!("this machine has a GPU: the GPU-less case is not tested here");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["fault-env", "good"]);
    let input = write_input(tmp.path());
    let ran = run(isorun_fault(&[])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["--values", "--json", "--gpus", "0,1"])
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("ISORUN_ASSUME_GPUS"));
    let nvml_absent = ran.stderr.contains("this machine has no GPU") || ran.stderr.contains("NVML (libnvidia-ml.so.1");
    if !nvml_absent {
        eprintln!("NVML is present here without a /dev/nvidiaN: not the GPU-less case: {}", ran.stderr);
        return;
    }
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let warnings: Vec<&str> = ran.stderr.lines().filter(|l| l.contains("no GPU")).collect();
    assert_eq!(warnings.len(), 1, "{}", ran.stderr);
    assert!(warnings[0].starts_with("isorun: warning: --gpus 0,1: this machine has no GPU"), "{}", warnings[0]);
    for record in &ran.records {
        assert!(record.get("gpu").is_none(), "the worker had no GPU: {record}");
    }
    let env = ran.record("fault-env");
    assert_eq!(env["outputs"]["CUDA_VISIBLE_DEVICES"]["values"][0], "", "the worker was shown no device: {env}");
}

#[test]
fn doctor_json_gives_the_facts_of_the_text_as_one_object() {
    let text = isorun().arg("doctor").output().unwrap();
    let json = isorun().args(["doctor", "--json"]).output().unwrap();
    assert_eq!(json.status.code(), text.status.code(), "the same exit code");
    let stdout = String::from_utf8(json.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["can_run_models"], text.status.code() == Some(0), "{report}");
    let checks = report["checks"].as_array().unwrap();
    let lines: Vec<String> = String::from_utf8(text.stdout).unwrap().lines().map(str::to_string).collect();
    assert_eq!(checks.len(), lines.len(), "one check per text line: {report}");
    for (check, line) in checks.iter().zip(&lines) {
        let (name, status, detail) =
            (check["name"].as_str().unwrap(), check["status"].as_str().unwrap(), check["detail"].as_str().unwrap());
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(line.starts_with(name) && words.contains(&status), "{check} against {line:?}");
        // The detail is the rest of the line, as the text aligns it (the keras check's Python answers anew, so
        // only its start is compared).
        let rest = line[name.len()..].trim_start()[status.len()..].trim_start();
        let same = |a: &str, b: &str| a.split_whitespace().take(3).eq(b.split_whitespace().take(3));
        assert!(same(rest, detail), "{name}: {detail:?} against {rest:?}");
    }
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for name in ["libtensorflow", "worker", "worker start", "sandbox", "gpu"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}
