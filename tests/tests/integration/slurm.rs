//! `isorun slurm submit` on a real Slurm cluster: a private single-node one
//! that `scripts/slurm-cluster` starts in a temporary folder. It needs root
//! and slurm-wlm and munge, which `scripts/test-deps` installs before
//! `scripts/test` runs the tests (the test installs nothing); without them
//! the test says loudly that it skipped. Sharded through Slurm, a run must
//! report what the same run reports locally; a lost task's models must show
//! as `not_run` (`shard_task_lost`); submitting again must resume.

use crate::util::{bin, fake_models, fixtures, isorun, run, write_input, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a submitted run may take to be merged (a loaded CI machine with 2 CPUs).
const MERGE_TIMEOUT: Duration = Duration::from_secs(240);

pub(crate) fn skip(why: &str) {
    eprintln!(
        "\n\
         ************************************************************************\n\
         * SKIPPED: the Slurm test needs a private Slurm cluster, and {why}.\n\
         * It runs as root where slurm-wlm and munge are installed:\n\
         * scripts/test-deps (as root; scripts/test runs it) installs them.\n\
         ************************************************************************\n"
    );
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm-cluster")
}

/// One cluster at a time: two would race for ports.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// A running private cluster; dropping it brings the cluster down (also when
/// the test fails), then removes its folder and lets the next test start one.
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

impl Cluster {
    /// [`Cluster::up`] for a test that runs real models: `None` (the test
    /// skipped, saying why) where `isorun doctor` says TensorFlow models
    /// cannot run here.
    pub(crate) fn up_for_real_models() -> Option<Cluster> {
        let worker = crate::util::bin_dir().join("isorun-worker");
        let doctor = run(isorun().arg("doctor"));
        if !worker.is_file() || doctor.code != Some(0) {
            skip("isorun doctor says TensorFlow models cannot run here (no libtensorflow or no worker)");
            return None;
        }
        Cluster::up()
    }

    pub(crate) fn up() -> Option<Cluster> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("this test does not run as root (slurmd and munged run as root here)");
            return None;
        }
        let installed = ["slurmctld", "slurmd", "sbatch", "munged"].iter().all(|p| on_path(p));
        if !installed {
            skip("slurm-wlm and munge are not installed (slurmctld, slurmd, sbatch or munged is not on PATH)");
            return None;
        }
        let turn = ONE_CLUSTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = tempfile::Builder::new().prefix("isorun-slurm-test").tempdir().unwrap();
        // The script names the folder by its physical path.
        let conf = std::fs::canonicalize(dir.path()).unwrap().join("slurm.conf");
        let cluster = Cluster { conf, dir, _turn: turn };
        let output = Command::new(cluster_script()).arg("up").arg(cluster.dir.path()).output().unwrap();
        assert!(
            output.status.success(),
            "scripts/slurm-cluster up failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            format!("export SLURM_CONF={}", cluster.conf.display())
        );
        Some(cluster)
    }

    /// A Slurm command (squeue, scancel, scontrol) of this cluster.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", &self.conf);
        command
    }

    /// `JobState` of a job (or array task, `12_2`) as scontrol shows it.
    pub(crate) fn job_state(&self, job: &str) -> String {
        let output = self.command("scontrol").args(["show", "job", job]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        text.split_whitespace()
            .find_map(|field| field.strip_prefix("JobState="))
            .unwrap_or_else(|| panic!("no JobState for {job}: {text}"))
            .to_string()
    }

    /// `isorun slurm submit ARGS` in `cwd`: the array and merge job ids.
    pub(crate) fn submit(&self, cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> (String, String) {
        let mut command = isorun();
        command.current_dir(cwd).env("SLURM_CONF", &self.conf).args(["slurm", "submit"]).args(args);
        for (name, value) in env {
            command.env(name, value);
        }
        let ran = run(&mut command);
        assert_eq!(ran.code, Some(0), "isorun slurm submit failed:\n{}{}", ran.stdout, ran.stderr);
        let ids = ran
            .stdout
            .trim()
            .strip_prefix("array job ")
            .and_then(|rest| rest.split_once(", merge job "))
            .unwrap_or_else(|| panic!("not `array job A, merge job M`: {}", ran.stdout));
        (ids.0.to_string(), ids.1.to_string())
    }

    /// Waits for the merge job to write `out/report.json` and end; the report.
    pub(crate) fn merged_report(&self, out: &Path, merge_job: &str) -> Value {
        let started = Instant::now();
        let report = out.join("report.json");
        while !report.exists() || !matches!(self.job_state(merge_job).as_str(), "COMPLETED" | "FAILED") {
            if started.elapsed() > MERGE_TIMEOUT {
                let mut logs = String::new();
                for entry in std::fs::read_dir(out.join("logs")).into_iter().flatten().flatten() {
                    let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    logs.push_str(&format!("--- {}\n{text}\n", entry.path().display()));
                }
                let queue = self.command("squeue").output().unwrap();
                panic!(
                    "no merged report after {MERGE_TIMEOUT:?}; squeue:\n{}\nlogs:\n{logs}",
                    String::from_utf8_lossy(&queue.stdout)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(self.job_state(merge_job), "COMPLETED", "the merge job ended badly");
        read_json(&report)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match Command::new(cluster_script()).arg("down").arg(self.dir.path()).output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("scripts/slurm-cluster down failed:\n{}", String::from_utf8_lossy(&output.stderr)),
            Err(e) => eprintln!("cannot run scripts/slurm-cluster down: {e}"),
        }
    }
}

pub(crate) fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The units of a report without what changes from run to run.
fn comparable_units(report: &Value) -> Vec<Value> {
    report["units"].as_array().unwrap().iter().map(crate::util::without_run_details).collect()
}

fn statuses(report: &Value) -> Vec<(String, String)> {
    let units = report["units"].as_array().unwrap();
    units.iter().map(|u| (u["model"].as_str().unwrap().into(), u["status"].as_str().unwrap().into())).collect()
}

/// Every file under `dir`, relative, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            } else {
                files.push((
                    entry.path().strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(entry.path()).unwrap(),
                ));
            }
        }
    }
    files.sort();
    files
}

/// A local, unsharded `isorun run` with the fault worker: its report.
fn local_fault_run(root: &Path, output_dir: &Path) -> Value {
    let report = root.join("local.json");
    let ran: Ran = run(isorun()
        .current_dir(root)
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .args(["run", "models", "--input=x=x.npy", "--timeout", "60", "--json", "--report"])
        .arg(&report)
        .arg("--output-dir")
        .arg(output_dir));
    assert_eq!(ran.code, Some(1), "a crash and an exit 3 fail the local run:\n{}", ran.stderr);
    read_json(&report)
}

#[test]
fn a_sharded_run_through_slurm_reports_what_a_local_run_reports() {
    let Some(cluster) = Cluster::up() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // Two models in each of 3 shards (FNV-1a of the id, mod 3), one crashing and one exiting 3.
    let models = ["alpha", "beta-fault-segfault", "delta-fault-exit3", "gamma", "phi", "pi"];
    fake_models(&root.join("models"), &models);
    let shard_of = |id: &str| (0..3).find(|&k| isorun_report::shard::Shard { index: k, count: 3 }.owns(id)).unwrap();
    let shards: Vec<u64> = models.iter().map(|id| shard_of(id)).collect();
    assert_eq!(shards, [0, 0, 2, 2, 1, 1], "the models spread over the shards as this test expects");
    std::fs::rename(write_input(root), root.join("x.npy")).unwrap();
    let local = local_fault_run(root, &root.join("local-outputs"));
    let fault_worker = bin("isorun-fault-worker");

    // 1. The whole run through Slurm (relative paths, resolved at submit): the same units and outputs.
    let (array, merge) = cluster.submit(
        root,
        &[("ISORUN_WORKER", &fault_worker)],
        &["--shards", "3", "--out", "night", "--", "models", "--input=x=x.npy", "--timeout", "60"],
    );
    let out = root.join("night");
    let script = std::fs::read_to_string(out.join("array.sbatch")).unwrap();
    assert!(script.contains(&format!("--input=x={}", root.join("x.npy").display())), "{script}");
    assert!(script.starts_with("#!/bin/bash\n") && script.contains("set -euo pipefail"), "{script}");
    let merged = cluster.merged_report(&out, &merge);
    assert_eq!(comparable_units(&merged), comparable_units(&local), "the units of the merged and the local run");
    assert_eq!(merged["summary"], local["summary"]);
    assert_eq!(merged["settings"]["merged_from"], serde_json::json!(["0/3", "1/3", "2/3"]));
    assert_eq!(statuses(&merged)[1], ("beta-fault-segfault".to_string(), "crashed".to_string()));
    for (k, state) in ["FAILED", "COMPLETED", "FAILED"].iter().enumerate() {
        // `isorun run` exits 1 when a model is not ok: shards 0 and 2 each have one.
        assert_eq!(cluster.job_state(&format!("{array}_{k}")), *state, "task {k}");
        for file in [format!("{k}.json"), format!("{k}.jsonl"), format!("{k}.journal.jsonl")] {
            assert!(out.join("shards").join(&file).is_file(), "shards/{file}");
        }
    }
    let listed = read_json(&out.join("models.json"));
    assert_eq!(listed["shards"], 3);
    let listed: Vec<(String, u64)> = listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["model"].as_str().unwrap().to_string(), m["shard"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(String, u64)> = models.iter().map(|id| (id.to_string(), shard_of(id))).collect();
    assert_eq!(listed, expected);
    assert!(out.join("report.xml").is_file() && out.join("report.html").is_file());

    // The outputs the shard tasks wrote are the local run's, byte for byte.
    let (array, merge) = cluster.submit(
        root,
        &[("ISORUN_WORKER", &fault_worker)],
        &["--shards", "3", "--out", "with-outputs", "models", "--input=x=x.npy", "--output-dir", "slurm-outputs"],
    );
    let with_outputs = cluster.merged_report(&root.join("with-outputs"), &merge);
    assert_eq!(statuses(&with_outputs), statuses(&local), "array job {array}");
    let local_files = files_under(&root.join("local-outputs"));
    assert_eq!(local_files.len(), 4, "x.npy of each of the four ok models");
    assert_eq!(files_under(&root.join("slurm-outputs")), local_files);

    // 2. A task cancelled before it ran: its models are not_run (shard_task_lost), the others are there.
    // Both jobs are submitted held, so task 2 is surely pending when it is cancelled.
    let args = ["--shards", "3", "--cpus-per-task", "1", "--out", "lost", "models", "--input=x=x.npy"];
    let env = [("ISORUN_WORKER", fault_worker.as_path())];
    let (array, merge) = cluster.submit(root, &env, &[&["--sbatch-arg=--hold"][..], &args].concat());
    let cancel = cluster.command("scancel").arg(format!("{array}_2")).output().unwrap();
    assert!(cancel.status.success(), "scancel: {}", String::from_utf8_lossy(&cancel.stderr));
    let release = cluster.command("scontrol").args(["release", &array, &merge]).output().unwrap();
    assert!(release.status.success(), "scontrol release: {}", String::from_utf8_lossy(&release.stderr));
    let out = root.join("lost");
    let merged = cluster.merged_report(&out, &merge);
    // (A pending task that is cancelled leaves no job record here, so the files say it never ran.)
    assert!(!out.join(format!("logs/array-{array}_2.out")).exists(), "task 2 never started");
    assert!(!out.join("shards/2.json").exists(), "task 2 wrote no report");
    for unit in merged["units"].as_array().unwrap() {
        let id = unit["model"].as_str().unwrap();
        if shard_of(id) == 2 {
            assert_eq!(unit["status"], "not_run", "{unit}");
            assert_eq!(unit["reason"], "shard_task_lost", "{unit}");
            assert_eq!(unit["error"], serde_json::json!({"kind": "not_run", "message": "not run: shard_task_lost"}));
            assert_eq!(unit["shard"], "2/3");
            assert_eq!(unit["path"], root.join("models").join(id).to_str().unwrap());
        } else {
            let local_unit = local["units"].as_array().unwrap().iter().find(|u| u["model"] == id).unwrap();
            assert_eq!(unit["status"], local_unit["status"], "{id}");
        }
    }
    assert_eq!(merged["summary"]["total"], 6);
    assert_eq!(merged["summary"]["by_status"]["not_run"], 2);

    // 3. Submitted again into the same folder: the journals skip what tasks 0 and 1 finished,
    // task 2 runs now, and the report is the local run's; every model was computed once
    // (a journal gets one line per unit computed).
    let journal_lines = |k: u64| {
        let journal = out.join(format!("shards/{k}.journal.jsonl"));
        std::fs::read_to_string(journal).map_or(0, |text| text.lines().count())
    };
    assert_eq!([journal_lines(0), journal_lines(1), journal_lines(2)], [2, 2, 0]);
    let (_, merge) = cluster.submit(root, &env, &args);
    let resumed = cluster.merged_report(&out, &merge);
    assert_eq!(comparable_units(&resumed), comparable_units(&local));
    for unit in resumed["units"].as_array().unwrap() {
        let from_journal = unit["resumed"] == true;
        assert_eq!(from_journal, shard_of(unit["model"].as_str().unwrap()) != 2, "{unit}");
    }
    assert_eq!([journal_lines(0), journal_lines(1), journal_lines(2)], [2, 2, 2], "each model computed once");
    for k in 0..3 {
        let lines = std::fs::read_to_string(out.join(format!("shards/{k}.jsonl"))).unwrap();
        assert_eq!(lines.lines().count(), 2, "shards/{k}.jsonl holds the JSON lines of this submit's task {k}");
    }
}

/// `isorun run ARGS --output-dir --report` locally, then the same run
/// through Slurm in two shards: the merged report's units equal the local
/// ones, and so do the outputs, file for file. The merged report.
fn runs_through_slurm_as_locally(cluster: &Cluster, tmp: &Path, args: &[&str]) -> Value {
    let local_report = tmp.join("local.json");
    let local = run(isorun()
        .arg("run")
        .args(args)
        .arg("--output-dir")
        .arg(tmp.join("local-outputs"))
        .arg("--report")
        .arg(&local_report)
        .arg("--json"));
    assert_eq!(local.code, Some(0), "{}", local.stderr);
    let out = tmp.join("night");
    let slurm_outputs = tmp.join("slurm-outputs");
    let mut submitted = vec!["--shards", "2", "--out", out.to_str().unwrap(), "--"];
    submitted.extend_from_slice(args);
    submitted.extend_from_slice(&["--output-dir", slurm_outputs.to_str().unwrap()]);
    let (_, merge) = cluster.submit(tmp, &[], &submitted);
    let merged = cluster.merged_report(&out, &merge);
    assert_eq!(comparable_units(&merged), comparable_units(&read_json(&local_report)));
    assert_eq!(files_under(&slurm_outputs), files_under(&tmp.join("local-outputs")));
    merged
}

/// ONNX files go through Slurm as SavedModels do: two copies of the
/// example's classifier, one per shard, merge to what a local run reports,
/// outputs included.
#[test]
fn onnx_models_run_through_slurm_as_they_run_locally() {
    let Some(cluster) = Cluster::up_for_real_models() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/onnx");
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for name in ["iris_a.onnx", "iris_b.onnx"] {
        std::fs::copy(examples.join("iris_logistic.onnx"), models.join(name)).unwrap();
    }
    let inputs = examples.join("inputs.npz");
    let args = [models.to_str().unwrap(), "--inputs", inputs.to_str().unwrap()];
    let merged = runs_through_slurm_as_locally(&cluster, tmp.path(), &args);
    assert_eq!(statuses(&merged), [("iris_a.onnx".into(), "ok".into()), ("iris_b.onnx".into(), "ok".into())]);
}

#[test]
fn a_real_model_runs_through_slurm_as_it_runs_locally() {
    let Some(cluster) = Cluster::up_for_real_models() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures().join("models/multi_sig");
    let inputs = fixtures().join("expected/multi_sig__add/inputs.npz");
    let args = [model.to_str().unwrap(), "--signature", "add", "--inputs", inputs.to_str().unwrap()];
    let merged = runs_through_slurm_as_locally(&cluster, tmp.path(), &args);
    assert_eq!(merged["units"][0]["status"], "ok");
}

#[test]
fn a_map_through_slurm_shards_its_items_and_merges_every_one() {
    let Some(cluster) = Cluster::up() else { return };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("fns.py"), "def f(x):\n    return x * 10\n").unwrap();
    let out = tmp.path().join("night");
    let (_, merge) = cluster.submit(
        tmp.path(),
        &[("ISORUN_PYTHON", Path::new("python3"))],
        &["--shards", "2", "--out", out.to_str().unwrap(), "map", "fns:f", "1", "2", "3", "4"],
    );
    let merged = cluster.merged_report(&out, &merge);
    let units: Vec<(String, String)> = statuses(&merged);
    let ok = |item: &str| (item.to_string(), "ok".to_string());
    assert_eq!(units, [ok("1"), ok("2"), ok("3"), ok("4")], "{merged:#}");
    // Both shards ran items (the four split 1/3 between them), and their JSON lines hold the values.
    let listing = read_json(&out.join("models.json"));
    let shards: Vec<u64> = listing["models"].as_array().unwrap().iter().map(|m| m["shard"].as_u64().unwrap()).collect();
    assert!(shards.contains(&0) && shards.contains(&1), "{listing:#}");
    let mut values: Vec<(i64, i64)> = Vec::new();
    for shard in 0..2 {
        let lines = std::fs::read_to_string(out.join(format!("shards/{shard}.jsonl"))).unwrap();
        for line in lines.lines() {
            let record: Value = serde_json::from_str(line).unwrap();
            assert_eq!(listing["models"][record["item"].as_i64().unwrap() as usize - 1]["shard"], shard);
            values.push((record["item"].as_i64().unwrap(), record["value"].as_i64().unwrap()));
        }
    }
    values.sort();
    assert_eq!(values, [(1, 10), (2, 20), (3, 30), (4, 40)]);

    // Task 1's report lost: the merge reports its items not_run (shard_task_lost), from models.json.
    let lost = tmp.path().join("lost.json");
    let merged = run(isorun()
        .args(["report", "merge"])
        .arg(out.join("shards/0.json"))
        .arg("--models")
        .arg(out.join("models.json"))
        .arg("-o")
        .arg(&lost));
    assert_eq!(merged.code, Some(0), "{}", merged.stderr);
    let lost = read_json(&lost);
    for unit in lost["units"].as_array().unwrap() {
        let shard = listing["models"].as_array().unwrap().iter().find(|m| m["model"] == unit["model"]).unwrap()
            ["shard"]
            .as_u64()
            .unwrap();
        let expected = if shard == 0 { ["ok", ""] } else { ["not_run", "shard_task_lost"] };
        assert_eq!([unit["status"].as_str().unwrap(), unit["reason"].as_str().unwrap_or("")], expected, "{unit:#}");
    }
    assert_eq!(lost["units"].as_array().unwrap().len(), 4);
}
