//! `.onnx` models on the supervisor's side (issue 41, before ONNX Runtime
//! is in the workers): found beside SavedModels with their external data
//! left alone, inspected without ONNX Runtime, and ended `load_failed`
//! before any worker by the commands that would run them, naming the file.
//! The fixtures are written by the `onnx` package (`scripts/make_onnx_fixtures.py`).

use crate::util::{copy_dir, fixtures, isorun, run};
use std::path::{Path, PathBuf};

fn onnx(name: &str) -> PathBuf {
    fixtures().join("onnx").join(name)
}

/// A folder of `fixed_shape` (a SavedModel), `mlp.onnx`, `truncated.onnx`
/// and `external/` (`external.onnx` and its `weights.bin`).
fn mixed_folder(root: &Path) -> PathBuf {
    let models = root.join("models");
    copy_dir(&fixtures().join("models/fixed_shape"), &models.join("fixed_shape"));
    copy_dir(&onnx("external"), &models.join("external"));
    for name in ["mlp.onnx", "truncated.onnx"] {
        std::fs::copy(onnx(name), models.join(name)).unwrap();
    }
    models
}

#[test]
fn ls_lists_onnx_files_beside_a_saved_model_and_not_their_external_data() {
    let tmp = tempfile::tempdir().unwrap();
    let models = mixed_folder(tmp.path());
    let ran = run(isorun().arg("ls").arg(&models));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let line = |id: &str, format: &str| format!("{id}\t{}\t{format}\n", models.join(id).display());
    let expected = [
        line("external/external.onnx", "onnx"),
        line("fixed_shape", "saved_model"),
        line("mlp.onnx", "onnx"),
        line("truncated.onnx", "onnx"),
    ]
    .concat();
    assert_eq!(ran.stdout, expected);
    // A file given alone is a model too.
    let ran = run(isorun().arg("ls").arg("--json").arg(onnx("mlp.onnx")));
    assert_eq!(ran.records.len(), 1, "{}{}", ran.stdout, ran.stderr);
    assert_eq!((ran.records[0]["id"].as_str(), ran.records[0]["format"].as_str()), (Some("mlp.onnx"), Some("onnx")));
}

#[test]
fn inspect_shows_dtypes_symbolic_dims_opsets_and_producer() {
    let path = onnx("dtypes.onnx");
    let ran = run(isorun().arg("inspect").arg(&path));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let expected = format!(
        "{} (onnx file, IR version 8, made by isorun-fixtures 1.0)
  opsets: ai.onnx 18, ai.onnx.ml 3
  inputs:
    half: float16[batch, 8]
    brain: bfloat16[2, seq]
    text: string[?]
    flag: bool[]
    ids: int64 (unknown rank)
    small: uint8[batch, 3, 3]
  outputs:
    half_out: float16[batch, 8]
    brain_out: bfloat16[2, seq]
    text_out: string[?]
    flag_out: bool[]
    ids_out: int64 (unknown rank)
    small_out: uint8[batch, 3, 3]
",
        path.display()
    );
    assert_eq!(ran.stdout, expected);
    // Sequences of maps (a scikit-learn classifier's ZipMap) are named as such.
    let ran = run(isorun().arg("inspect").arg(onnx("sequence_map.onnx")));
    assert!(ran.stdout.contains("    probabilities: sequence<map<int64, float32[]>>\n"), "{}", ran.stdout);
}

#[test]
fn inspect_json_gives_shapes_opsets_and_external_data() {
    let path = onnx("external/external.onnx");
    let ran = run(isorun().args(["inspect", "--json"]).arg(&path));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let model = &ran.records[0];
    assert_eq!(model["format"], "onnx");
    assert_eq!(model["opsets"], serde_json::json!([{"domain": "ai.onnx", "version": 17}]));
    assert_eq!(
        model["inputs"],
        serde_json::json!([{"name": "x", "type": "float32", "dtype": "float32", "shape": ["batch", 16]}])
    );
    let weights = path.parent().unwrap().join("weights.bin");
    assert_eq!(
        model["external_data"],
        serde_json::json!([{"location": "weights.bin", "path": weights.to_string_lossy(), "tensors": 1, "present": true}])
    );
    // IR 3 lists initializers as inputs: they are left out.
    let ran = run(isorun().args(["inspect", "--json"]).arg(onnx("ir3_initializer_inputs.onnx")));
    let names: Vec<&str> =
        ran.records[0]["inputs"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["x"]);
}

#[test]
fn a_truncated_onnx_file_is_a_usage_error_of_inspect_naming_it() {
    let path = onnx("truncated.onnx");
    let ran = run(isorun().arg("inspect").arg(&path));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(ran.stdout, "");
    assert_eq!(
        ran.stderr,
        format!(
            "isorun: error: {}: cut short or not an ONNX model: graph at byte 25 claims 175 bytes, but 111 are left\n",
            path.display()
        )
    );
}

#[test]
fn run_ends_onnx_models_load_failed_before_any_worker_and_runs_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let models = mixed_folder(tmp.path());
    let ran = run(isorun()
        .arg("run")
        .arg(&models)
        .arg("--input")
        .arg("image=@[[[[1],[2],[3],[4]],[[1],[2],[3],[4]],[[1],[2],[3],[4]],[[1],[2],[3],[4]]]]"));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("fixed_shape")["status"], "ok", "{}", ran.stdout);
    for id in ["mlp.onnx", "external/external.onnx", "truncated.onnx"] {
        let record = ran.record(id);
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["error"]["kind"], "load_failed", "{record}");
        // Decided in the supervisor: no worker, no attempt.
        assert!(record.get("worker_id").is_none() && record.get("attempts").is_none(), "{record}");
        let message = record["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{}: ", models.join(id).display())), "{message}");
    }
    let message = ran.record("mlp.onnx")["error"]["message"].as_str().unwrap();
    assert!(message.contains("ONNX models cannot run yet: ONNX Runtime support is not built (issue 41)"), "{message}");
    let message = ran.record("truncated.onnx")["error"]["message"].as_str().unwrap();
    assert!(message.contains("cut short or not an ONNX model: graph at byte 25"), "{message}");
}

#[test]
fn pipe_on_an_onnx_file_is_a_usage_error_naming_it() {
    let path = onnx("mlp.onnx");
    let ran = run(isorun().arg("pipe").arg(&path));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(
        ran.stderr,
        format!(
            "isorun: error: {0}: ONNX models cannot run yet: ONNX Runtime support is not built (issue 41); \
             `isorun inspect {0}` reads its inputs and outputs\n",
            path.display()
        )
    );
}

#[test]
fn eval_ends_onnx_models_load_failed_and_scores_the_saved_model_beside_them() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    copy_dir(&fixtures().join("eval/models/binary"), &models.join("binary"));
    std::fs::copy(onnx("mlp.onnx"), models.join("mlp.onnx")).unwrap();
    let data = fixtures().join("eval/data/data.npz");
    let ran = run(isorun().arg("eval").arg(&models).arg("--data").arg(&data).args(["--label", "label_bin"]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("binary")["status"], "ok", "{}", ran.stdout);
    let record = ran.record("mlp.onnx");
    assert_eq!(record["error"]["kind"], "load_failed", "{record}");
    assert!(record.get("worker_id").is_none(), "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    let expected = format!(
        "{}: ONNX models cannot run yet: ONNX Runtime support is not built (issue 41)",
        models.join("mlp.onnx").display()
    );
    assert!(message.starts_with(&expected), "{message}");
}
