//! `phases_ms` in a record (`--report`, or `-vv`): where a unit's wall time
//! went, measured by the real supervisor and worker. The phases must add up
//! to the wall time (nothing counted twice, nothing negative), the sandbox
//! steps must be the worker's own, and a record without `--report` or
//! `-vv` stays as it was.

use crate::util::{isorun, run};
use serde_json::Value;
use std::path::Path;

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn number(phases: &Value, key: &str) -> f64 {
    phases[key].as_f64().unwrap_or_else(|| panic!("phases_ms.{key} in {phases}"))
}

/// The parts of `wall_ms` a record has: `sandbox` is one (the worker's
/// requests less it are `ipc`), `spare_wait` came before the unit began
/// and `data_decode` ran beside it, so neither is.
fn parts_of_wall(phases: &Value) -> f64 {
    ["spawn", "hello", "sandbox", "load", "run", "ipc", "data", "score", "exit", "other"]
        .iter()
        .filter_map(|k| phases[*k].as_f64())
        .sum()
}

#[test]
fn phases_add_up_to_the_wall_time_and_name_the_sandbox_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let ran = run(isorun()
        .arg("run")
        .arg(examples().join("models/linear_regressor"))
        .arg(examples().join("models/iris_classifier"))
        .arg("--inputs")
        .arg(examples().join("inputs.npz"))
        .args(["-j", "1", "--spares", "0", "--report"])
        .arg(&report));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    for record in &ran.records {
        let phases = &record["phases_ms"];
        assert!(phases.is_object(), "{record}");
        let wall = record["wall_ms"].as_f64().unwrap();
        // Started for the unit (no spares): its start and its sandbox are its own.
        for key in ["spawn", "hello", "sandbox", "load", "run", "ipc", "exit", "other"] {
            let value = number(phases, key);
            assert!(value >= 0.0, "{key} {value} in {phases}");
        }
        let sum = parts_of_wall(phases);
        // The worker's load and run are whole milliseconds: allow a millisecond each, and wall_ms's rounding.
        assert!((sum - wall).abs() <= 3.0, "phases sum to {sum} ms, wall {wall} ms: {phases}");
        assert!(number(phases, "load") == record["load_ms"].as_f64().unwrap());
        let steps = phases["sandbox_steps"].as_object().expect("sandbox steps");
        let names: Vec<&str> = steps.keys().map(String::as_str).collect();
        for step in ["limits_env", "network", "landlock", "seccomp"] {
            assert!(names.contains(&step), "{names:?}");
        }
        let steps_sum: f64 = steps.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((steps_sum - number(phases, "sandbox")).abs() < 0.01, "{phases}");
    }
    // The report file holds the same records.
    let written: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert!(written["units"].as_array().unwrap().iter().all(|u| u["phases_ms"].is_object()));

    // Without --report or -vv: no phases; with -vv and --sandbox off: no sandbox steps.
    let plain = run(isorun()
        .arg("run")
        .arg(examples().join("models/linear_regressor"))
        .arg("--inputs")
        .arg(examples().join("inputs.npz")));
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(plain.records[0].get("phases_ms").is_none(), "{}", plain.records[0]);
    let verbose = run(isorun()
        .arg("run")
        .arg(examples().join("models/linear_regressor"))
        .arg("--inputs")
        .arg(examples().join("inputs.npz"))
        .args(["-vv", "--sandbox", "off", "--spares", "0"]));
    assert_eq!(verbose.code, Some(0), "{}", verbose.stderr);
    let phases = &verbose.records[0]["phases_ms"];
    assert!(phases.is_object() && phases.get("sandbox").is_none(), "{phases}");
}

#[test]
fn an_eval_unit_s_time_is_split_into_data_model_ipc_and_scoring() {
    let fixtures = crate::util::fixtures().join("eval");
    let ran = run(isorun()
        .arg("eval")
        .arg(fixtures.join("models/binary"))
        .arg("--data")
        .arg(fixtures.join("data/data.tfrecord"))
        .args(["--label", "label_bin", "-vv", "--batch-size", "100"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let record = &ran.records[0];
    let phases = &record["phases_ms"];
    let wall = record["wall_ms"].as_f64().unwrap();
    for key in ["data", "score", "load", "run", "ipc", "other"] {
        number(phases, key);
    }
    let parts = parts_of_wall(phases);
    // Ten batches: ten whole-millisecond run times.
    assert!((parts - wall).abs() <= 12.0, "{parts} against {wall}: {phases}");
    assert!(number(phases, "data") > 0.0 && number(phases, "score") > 0.0, "{phases}");
}

/// Several models over one small dataset: the first unit decodes it on its
/// prefetch thread (`data_decode`, beside the parts that add up to the wall
/// time), the later ones replay its batches (nothing decoded), with the
/// same metrics to the last bit.
#[test]
fn an_eval_of_several_models_decodes_the_data_once_beside_the_worker() {
    let fixtures = crate::util::fixtures().join("eval");
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    for name in ["a", "b", "c"] {
        let dir = models.join(name);
        std::fs::create_dir_all(dir.join("variables")).unwrap();
        let from = fixtures.join("models/binary");
        std::fs::copy(from.join("saved_model.pb"), dir.join("saved_model.pb")).unwrap();
        for entry in std::fs::read_dir(from.join("variables")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join("variables").join(entry.file_name())).unwrap();
        }
    }
    let ran = run(isorun().arg("eval").arg(&models).arg("--data").arg(fixtures.join("data/data.tfrecord")).args([
        "--label",
        "label_bin",
        "-vv",
        "--batch-size",
        "100",
        "-j",
        "1",
    ]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let mut records = ran.records.clone();
    records.sort_by_key(|r| r["model"].as_str().unwrap().to_string());
    assert_eq!(records.len(), 3);
    for record in &records {
        let phases = &record["phases_ms"];
        let wall = record["wall_ms"].as_f64().unwrap();
        for key in ["data", "score", "load", "run", "ipc", "other"] {
            number(phases, key);
        }
        // `spare_wait` came before the unit began; `data_decode` was beside it.
        let parts = parts_of_wall(phases);
        assert!((parts - wall).abs() <= 12.0, "{parts} against {wall}: {phases}");
        assert!(number(phases, "data_decode") >= 0.0, "{phases}");
        assert_eq!(record["metrics"], records[0]["metrics"], "the same batches, the same metrics");
        assert_eq!(record["examples"], records[0]["examples"]);
    }
    let decoded: Vec<f64> = records.iter().map(|r| number(&r["phases_ms"], "data_decode")).collect();
    assert_eq!(decoded.iter().filter(|d| **d > 0.0).count(), 1, "decoded once, replayed twice: {decoded:?}");
}
