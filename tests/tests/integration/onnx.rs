//! `.onnx` models (issue 41): found beside SavedModels with their external
//! data left alone, inspected without ONNX Runtime, and run by workers that
//! load ONNX Runtime's library after their fork, giving what onnxruntime's
//! Python API gives (`expected.json`, written with it at fixture time);
//! files that cannot run end before any worker, naming what is wrong.
//! The fixtures are written by real tools: the `onnx` package, skl2onnx and
//! tf2onnx (`scripts/make_onnx_fixtures.py`, `make_onnx_tf_fixtures.py`).
//! The workers' ONNX Runtime is the one `scripts/fetch-onnxruntime` fetched
//! (`scripts/test` runs it first).

use crate::util::{copy_dir, fixtures, isorun, run};
use serde_json::Value;
use std::io::{BufRead, Write};
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

/// A graph over protobuf's 2 GiB keeps its weights in external data (here
/// a 3 GiB initializer in a sparse `huge.bin`): `ls` lists the model alone,
/// `inspect` reads its signature and names the data file without reading
/// it, and `run` gives its output (ONNX Runtime drops the unused initializer).
#[test]
fn a_graph_over_2_gib_in_external_data_is_listed_inspected_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = models.join("huge_external.onnx");
    std::fs::copy(onnx("huge_external.onnx"), &model).unwrap();
    let data = models.join("huge.bin");
    std::fs::File::create(&data).unwrap().set_len(3 << 30).unwrap();
    let ran = run(isorun().arg("ls").arg(&models));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.stdout, format!("huge_external.onnx\t{}\tonnx\n", model.display()));
    let ran = run(isorun().args(["inspect", "--json"]).arg(&model));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let inspected = &ran.records[0];
    assert_eq!(
        inspected["external_data"],
        serde_json::json!([{"location": "huge.bin", "path": data.to_string_lossy(), "tensors": 1, "present": true}])
    );
    assert_eq!(inspected["inputs"][0]["shape"], serde_json::json!(["batch", 4]), "{inspected}");
    let ran = run(isorun().arg("run").arg(&model).args(["--input", "x=@[[1, 2, 3, 4]]", "--values"]));
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["status"], "ok", "{record}");
    assert_eq!(record["outputs"]["y"]["values"], serde_json::json!([[1.0, 2.0, 3.0, 4.0]]), "{record}");
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

/// What onnxruntime's Python API gave for each fixture (`expected.json`).
fn expected() -> Value {
    let text = std::fs::read_to_string(onnx("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every element of `values` (nested lists) as f64, or as text for strings.
fn flat(values: &Value, into: &mut Vec<Value>) {
    match values {
        Value::Array(items) => items.iter().for_each(|v| flat(v, into)),
        other => into.push(other.clone()),
    }
}

/// The elements of an output isorun wrote, as JSON values to compare.
fn elements(tensor: &isorun_protocol::Tensor) -> Vec<Value> {
    use isorun_protocol::{DType, TensorData};
    if let TensorData::Strings(strings) = &tensor.data {
        return strings.iter().map(|s| Value::from(String::from_utf8_lossy(s).into_owned())).collect();
    }
    let TensorData::Dense(bytes) = &tensor.data else { panic!("an output read from a file is dense") };
    let n = tensor.dtype.element_size().unwrap();
    bytes
        .chunks_exact(n)
        .map(|c| match tensor.dtype {
            DType::Float32 => Value::from(f32::from_le_bytes(c.try_into().unwrap()) as f64),
            DType::Float64 => Value::from(f64::from_le_bytes(c.try_into().unwrap())),
            DType::Float16 => Value::from(half::f16::from_le_bytes(c.try_into().unwrap()).to_f64()),
            DType::Int8 => Value::from(c[0] as i8),
            DType::UInt8 => Value::from(c[0]),
            DType::Int16 => Value::from(i16::from_le_bytes(c.try_into().unwrap())),
            DType::UInt16 => Value::from(u16::from_le_bytes(c.try_into().unwrap())),
            DType::Int32 => Value::from(i32::from_le_bytes(c.try_into().unwrap())),
            DType::UInt32 => Value::from(u32::from_le_bytes(c.try_into().unwrap())),
            DType::Int64 => Value::from(i64::from_le_bytes(c.try_into().unwrap())),
            DType::UInt64 => Value::from(u64::from_le_bytes(c.try_into().unwrap())),
            DType::Bool => Value::from(c[0] != 0),
            other => panic!("no comparison for {other}"),
        })
        .collect()
}

/// Whether isorun's element equals onnxruntime's: numbers to float32's
/// precision (the same kernels on the same inputs: only formatting differs),
/// everything else exactly.
fn same(given: &Value, wanted: &Value) -> bool {
    match (given.as_f64(), wanted.as_f64()) {
        (Some(a), Some(b)) => a == b || (a - b).abs() <= 1e-6 * b.abs().max(1.0),
        _ => given == wanted,
    }
}

/// Runs `model` (relative to the fixtures) on its inputs and compares every
/// output with onnxruntime's.
fn assert_outputs_as_onnxruntime(id: &str, case: &Value) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut command = isorun();
    command.arg("run").arg(onnx(id)).arg("--output-dir").arg(&out);
    // NumPy has no bfloat16: those inputs go as JSON (their values are
    // exact in bfloat16), the rest from the NPZ with them left out.
    let inputs = case["inputs"].as_object().unwrap();
    let npz = isorun_tensors::npy::read_npz_file(&onnx(case["inputs_npz"].as_str().unwrap())).unwrap();
    for (name, tensor) in npz {
        let path = tmp.path().join(format!("{name}.npy"));
        if inputs[&name]["dtype"] == "bfloat16" {
            command.arg("--input").arg(format!("{name}=@{}", inputs[&name]["values"]));
        } else {
            isorun_tensors::npy::write_npy(std::fs::File::create(&path).unwrap(), &tensor).unwrap();
            command.arg("--input").arg(format!("{name}={}", path.display()));
        }
    }
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(0), "{id}: {}\n{}", ran.stdout, ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["status"], "ok", "{id}: {record}");
    let outputs = case["outputs"].as_object().unwrap();
    let name = Path::new(id).file_name().unwrap().to_string_lossy().into_owned();
    let mut written: Vec<String> = record["outputs"].as_object().unwrap().keys().cloned().collect();
    written.sort();
    let mut wanted: Vec<String> = outputs.keys().cloned().collect();
    wanted.sort();
    assert_eq!(written, wanted, "{id}: every graph output, no other: {record}");
    for (output, want) in outputs {
        let path = out.join(&name).join(format!("{output}.npy"));
        let tensor = isorun_tensors::npy::read_npy_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let shape: Vec<u64> = want["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(tensor.shape, shape, "{id}: {output}'s shape");
        let mut values = Vec::new();
        flat(&want["values"], &mut values);
        let given = elements(&tensor);
        assert_eq!(given.len(), values.len(), "{id}: {output}");
        for (i, (g, w)) in given.iter().zip(&values).enumerate() {
            assert!(same(g, w), "{id}: {output}[{i}] is {g}, onnxruntime gives {w}");
        }
    }
}

#[test]
fn every_fixture_gives_what_onnxruntime_s_python_api_gives() {
    let expected = expected();
    let mut compared = Vec::new();
    for (id, case) in expected["models"].as_object().unwrap() {
        // Tensors only: a ZipMap's sequence is refused (a_mixed_folder_...).
        let outputs = case.get("outputs").and_then(Value::as_object);
        if outputs.is_some_and(|o| !o.is_empty() && o.values().all(|t| t.get("dtype").is_some())) {
            assert_outputs_as_onnxruntime(id, case);
            compared.push(id.as_str());
        }
    }
    // The tools' own files are among them: not only graphs made by hand.
    for id in ["mlp.onnx", "every_dtype.onnx", "sklearn_classifier.onnx", "keras_tf2onnx.onnx", "two_inputs.onnx"] {
        assert!(compared.contains(&id), "{id} compared: {compared:?}");
    }
}

/// A folder of `fixed_shape` (a SavedModel) beside runnable and broken ONNX
/// files, each model's inputs in `--inputs-dir` under its id.
fn mixed_run(root: &Path) -> (PathBuf, PathBuf) {
    let models = root.join("models");
    copy_dir(&fixtures().join("models/fixed_shape"), &models.join("fixed_shape"));
    for name in ["mlp.onnx", "two_inputs.onnx", "truncated.onnx", "sklearn_zipmap.onnx", "unknown_op.onnx"] {
        std::fs::copy(onnx(name), models.join(name)).unwrap();
    }
    let inputs = root.join("inputs");
    for (id, npz) in [("mlp.onnx", "mlp"), ("two_inputs.onnx", "two_inputs"), ("unknown_op.onnx", "unknown_op")] {
        let dir = inputs.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, tensor) in isorun_tensors::npy::read_npz_file(&onnx(&format!("inputs/{npz}.npz"))).unwrap() {
            let file = std::fs::File::create(dir.join(format!("{name}.npy"))).unwrap();
            isorun_tensors::npy::write_npy(std::io::BufWriter::new(file), &tensor).unwrap();
        }
    }
    let image = inputs.join("fixed_shape");
    std::fs::create_dir_all(&image).unwrap();
    let bytes: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let tensor = isorun_protocol::Tensor::dense(isorun_protocol::DType::Float32, vec![1, 4, 4, 1], bytes);
    isorun_tensors::npy::write_npy(std::fs::File::create(image.join("image.npy")).unwrap(), &tensor).unwrap();
    (models, inputs)
}

#[test]
fn a_mixed_folder_runs_in_one_command_and_each_onnx_file_that_cannot_run_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let (models, inputs) = mixed_run(tmp.path());
    let ran = run(isorun().arg("run").arg(&models).arg("--inputs-dir").arg(&inputs).args(["-j", "2"]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    for id in ["fixed_shape", "mlp.onnx", "two_inputs.onnx"] {
        assert_eq!(ran.record(id)["status"], "ok", "{}", ran.record(id));
    }
    // Each ran in a worker of its own, as a SavedModel does.
    let ran_with = &ran.record("mlp.onnx")["onnxruntime"];
    assert_eq!(ran_with["execution_provider"], "cpu", "{}", ran.record("mlp.onnx"));
    assert!(ran_with["version"].as_str().is_some_and(|v| v.starts_with("1.")), "{ran_with}");
    assert!(ran.record("fixed_shape").get("onnxruntime").is_none(), "a SavedModel ran with TensorFlow");
    let workers: std::collections::HashSet<String> = ["fixed_shape", "mlp.onnx", "two_inputs.onnx"]
        .iter()
        .map(|id| ran.record(id)["worker_id"].to_string())
        .collect();
    assert_eq!(workers.len(), 3, "{}", ran.stdout);
    let error = |id: &str| ran.record(id)["error"].clone();
    // Decided in the supervisor, before any worker.
    for id in ["truncated.onnx", "sklearn_zipmap.onnx"] {
        assert!(ran.record(id).get("worker_id").is_none(), "{}", ran.record(id));
    }
    assert_eq!(error("truncated.onnx")["kind"], "load_failed");
    assert!(error("truncated.onnx")["message"].as_str().unwrap().contains("cut short or not an ONNX model"));
    assert_eq!(error("sklearn_zipmap.onnx")["kind"], "unsupported_dtype", "{}", error("sklearn_zipmap.onnx"));
    let message = error("sklearn_zipmap.onnx")["message"].as_str().unwrap().to_string();
    assert!(message.contains("sequence<map<int64, float32") && message.contains("zipmap"), "{message}");
    // ONNX Runtime's own refusal, in the worker: the op it lacks is named.
    assert_eq!(error("unknown_op.onnx")["kind"], "load_failed", "{}", error("unknown_op.onnx"));
    let message = error("unknown_op.onnx")["message"].as_str().unwrap().to_string();
    assert!(message.contains("Frobnicate") && message.contains("unknown_op.onnx"), "{message}");
}

#[test]
fn an_onnx_unit_runs_sandboxed_and_a_link_to_a_secret_as_external_data_never_reaches_a_worker() {
    let ran = run(isorun().arg("run").arg(onnx("mlp.onnx")).arg("--inputs").arg(onnx("inputs/mlp.npz")));
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let record = &ran.records[0];
    let protections: Vec<&str> = record["sandbox"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert!(protections.contains(&"landlock") && protections.contains(&"no_network"), "{record}");
    assert!(record.get("sandbox_missing").is_none_or(|m| m.as_array().unwrap().is_empty()), "{record}");

    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::copy(onnx("external/external.onnx"), model.join("external.onnx")).unwrap();
    let secret = tmp.path().join("secret.bin");
    std::fs::copy(onnx("external/weights.bin"), &secret).unwrap();
    std::os::unix::fs::symlink(&secret, model.join("weights.bin")).unwrap();
    let ran =
        run(isorun().arg("run").arg(model.join("external.onnx")).arg("--inputs").arg(onnx("inputs/external.npz")));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["error"]["kind"], "load_failed", "{record}");
    assert!(record.get("worker_id").is_none(), "no worker was given the secret: {record}");
    assert!(record["error"]["message"].as_str().unwrap().contains("outside the model's folder"), "{record}");
}

/// Eval's slices, intervals and predictions on an ONNX classifier are
/// what they are on a SavedModel: per-class slices (`--slice label`) from
/// onnxruntime's own predictions, an interval around the accuracy, a
/// predictions file whose rows give those predictions, and `rescore` of
/// that file equal to eval's record.
#[test]
fn an_onnx_classifier_s_slices_interval_and_predictions_are_onnxruntime_s_and_rescore_agrees() {
    let tmp = tempfile::tempdir().unwrap();
    let iris = &expected()["iris"];
    let predicted: Vec<i64> = iris["predicted"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let labels = isorun_tensors::npy::read_npz_file(&onnx("iris.npz"))
        .unwrap()
        .into_iter()
        .find(|(name, _)| name == "label")
        .map(|(_, t)| {
            let isorun_protocol::TensorData::Dense(bytes) = &t.data else { panic!("labels are dense") };
            assert_eq!(t.dtype, isorun_protocol::DType::Int64);
            bytes.chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect::<Vec<i64>>()
        })
        .expect("iris.npz has label");
    assert_eq!(labels.len(), predicted.len());
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(onnx("sklearn_classifier.onnx"), models.join("sklearn_classifier.onnx")).unwrap();
    let predictions = tmp.path().join("predictions");
    let ran = run(isorun()
        .arg("eval")
        .arg(&models)
        .arg("--data")
        .arg(onnx("iris.npz"))
        .args(["--label", "label", "--metric", "accuracy", "--output", "probabilities", "--slice", "label"])
        .args(["--ci", "0.95", "--predictions-format", "jsonl", "--predictions"])
        .arg(&predictions));
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("sklearn_classifier.onnx");
    let accuracy = record["metrics"]["accuracy"].as_f64().unwrap();
    assert!((accuracy - iris["accuracy"].as_f64().unwrap()).abs() < 1e-12, "{record}");
    // Each class's slice: onnxruntime's predictions of that class's rows.
    for class in 0..3i64 {
        let rows: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == class).collect();
        let right = rows.iter().filter(|&&i| predicted[i] == class).count();
        let slice = &record["slices"]["label"][class.to_string()];
        assert_eq!(slice["examples"], rows.len(), "{class}: {record}");
        let got = slice["accuracy"].as_f64().unwrap();
        assert!((got - right as f64 / rows.len() as f64).abs() < 1e-12, "{class}: {slice}");
    }
    let interval = record["ci"]["accuracy"].as_array().unwrap_or_else(|| panic!("no interval: {record}"));
    let (low, high) = (interval[0].as_f64().unwrap(), interval[1].as_f64().unwrap());
    assert!(low <= accuracy && accuracy <= high && low < high, "{low} {accuracy} {high}");
    // The predictions file: one row per example, its probabilities' argmax onnxruntime's label.
    let file = predictions.join("sklearn_classifier.onnx.jsonl");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), predicted.len());
    for (i, row) in rows.iter().enumerate() {
        let p: Vec<f64> = row["output:probabilities"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let argmax = (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap() as i64;
        assert_eq!((row["index"].as_u64(), argmax), (Some(i as u64), predicted[i]), "{row}");
        assert_eq!(row["label"].as_i64(), Some(labels[i]), "{row}");
    }
    let rescored = run(isorun().arg("rescore").arg(&file).args(["--ci", "0.95"]));
    assert_eq!(rescored.code, Some(0), "{}\n{}", rescored.stdout, rescored.stderr);
    let again = &rescored.records[0];
    for key in ["metrics", "slices", "ci", "examples"] {
        assert_eq!(again[key], record[key], "{key}: rescore {again} against eval {record}");
    }
}

/// An ONNX Runtime older than the worker's C API (17) is said once, as
/// each `.onnx` unit's `load_failed` before any worker, while the
/// SavedModels beside them run; doctor's line says it failed and why.
#[test]
fn an_onnx_runtime_older_than_the_worker_s_c_api_ends_onnx_units_before_any_worker_and_doctor_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let (models, inputs) = mixed_run(tmp.path());
    let old = tmp.path().join("old-onnxruntime");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("libonnxruntime.so.1.16.3"), b"").unwrap();
    let ran =
        run(isorun().arg("run").arg(&models).arg("--inputs-dir").arg(&inputs).env("ISORUN_ONNXRUNTIME_DIR", &old));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("fixed_shape")["status"], "ok", "{}", ran.record("fixed_shape"));
    for id in ["mlp.onnx", "two_inputs.onnx", "unknown_op.onnx"] {
        let record = ran.record(id);
        assert_eq!(record["error"]["kind"], "load_failed", "{record}");
        assert!(record.get("worker_id").is_none(), "no worker for a library it cannot use: {record}");
        let message = record["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("ONNX Runtime 1.16.3 at ")
                && message.contains("speaks C API 16, older than the 17 isorun's worker needs")
                && message.ends_with("in ISORUN_ONNXRUNTIME_DIR"),
            "{message}"
        );
    }
    let doctor = run(isorun().arg("doctor").env("ISORUN_ONNXRUNTIME_DIR", &old));
    let line =
        doctor.stdout.lines().find(|l| l.starts_with("onnxruntime ")).unwrap_or_else(|| panic!("{}", doctor.stdout));
    let mut words = line.split_whitespace();
    assert_eq!((words.next(), words.next()), (Some("onnxruntime"), Some("failed")), "{line}");
    assert!(line.contains("older than the 17 isorun's worker needs"), "{line}");
}

#[test]
fn pipe_serves_an_onnx_file_request_after_request() {
    use std::process::Stdio;
    let mut child = isorun()
        .arg("pipe")
        .arg(onnx("two_inputs.onnx"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    for k in [1, 2] {
        writeln!(stdin, r#"{{"id": {k}, "inputs": {{"a": [[1, 2, 3]], "b": [[{k}, {k}, {k}]]}}}}"#).unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(answer["id"], serde_json::json!(k), "{answer}");
        let values = |name: &str| answer["outputs"][name]["values"].clone();
        let k = k as f64;
        assert_eq!(values("sum"), serde_json::json!([[1.0 + k, 2.0 + k, 3.0 + k]]), "{answer}");
        assert_eq!(values("product"), serde_json::json!([[k, 2.0 * k, 3.0 * k]]), "{answer}");
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn pipe_on_an_onnx_file_that_cannot_run_is_a_usage_error_naming_it() {
    let path = onnx("sklearn_zipmap.onnx");
    let ran = run(isorun().arg("pipe").arg(&path));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.starts_with(&format!("isorun: error: {}: output ", path.display())), "{}", ran.stderr);
    assert!(ran.stderr.contains("zipmap"), "{}", ran.stderr);
}

#[test]
fn eval_scores_onnx_classifiers_as_onnxruntime_predicts_from_npz_and_csv() {
    let tmp = tempfile::tempdir().unwrap();
    let wanted = expected()["iris"]["accuracy"].as_f64().expect("expected.json's iris accuracy");
    // One [N, 4] input from an NPZ array; four [N, 1] inputs from CSV columns.
    for (model, data) in [("sklearn_classifier.onnx", "iris.npz"), ("sklearn_columns.onnx", "iris.csv")] {
        let models = tmp.path().join(model).with_extension("d");
        std::fs::create_dir_all(&models).unwrap();
        std::fs::copy(onnx(model), models.join(model)).unwrap();
        let ran = run(isorun().arg("eval").arg(&models).arg("--data").arg(onnx(data)).args([
            "--label",
            "label",
            "--metric",
            "accuracy",
            "--output",
            "probabilities",
        ]));
        assert_eq!(ran.code, Some(0), "{model}: {}\n{}", ran.stdout, ran.stderr);
        let record = ran.record(model);
        assert_eq!(record["status"], "ok", "{record}");
        let accuracy = record["metrics"]["accuracy"].as_f64().unwrap();
        assert!((accuracy - wanted).abs() < 1e-9, "{model}: isorun {accuracy}, onnxruntime {wanted}: {record}");
    }
}

/// A folder `models` holding `bad` (a model that misbehaves on the `bad_input`
/// given as its `input`) beside `mlp.onnx`, and an `--inputs-dir` folder
/// with each one's input: `(models, inputs)`.
fn bad_model_beside_mlp(root: &Path, bad: &str, input: &str, bad_input: isorun_protocol::Tensor) -> (PathBuf, PathBuf) {
    use isorun_protocol::{DType, Tensor};
    let models = root.join("models");
    std::fs::create_dir_all(&models).unwrap();
    for name in [bad, "mlp.onnx"] {
        std::fs::copy(onnx(name), models.join(name)).unwrap();
    }
    let inputs = root.join("inputs");
    let write = |id: &str, name: &str, tensor: Tensor| {
        std::fs::create_dir_all(inputs.join(id)).unwrap();
        let file = std::fs::File::create(inputs.join(id).join(format!("{name}.npy"))).unwrap();
        isorun_tensors::npy::write_npy(file, &tensor).unwrap();
    };
    write(bad, input, bad_input);
    let ones: Vec<u8> = [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    write("mlp.onnx", "x", Tensor::dense(DType::Float32, vec![1, 4], ones));
    (models, inputs)
}

#[test]
fn an_onnx_model_that_eats_memory_is_its_own_memory_limit_and_the_next_model_runs() {
    // grow.onnx: 137 bytes whose ConstantOfShape takes what its input asks for (8 GB here).
    use isorun_protocol::{DType, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let shape = Tensor::dense(DType::Int64, vec![1], 2_000_000_000i64.to_le_bytes().to_vec());
    let (models, inputs) = bad_model_beside_mlp(tmp.path(), "grow.onnx", "shape", shape);
    let ran = run(isorun().arg("run").arg(&models).arg("--inputs-dir").arg(&inputs).args([
        "--memory-limit",
        "1G",
        "-j",
        "1",
    ]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let grow = ran.record("grow.onnx");
    assert_eq!(grow["status"], "memory_limit", "{grow}");
    assert!(grow["peak_private_bytes"].as_u64().unwrap() >= 1 << 30, "{grow}");
    assert_eq!(ran.record("mlp.onnx")["status"], "ok", "{}", ran.record("mlp.onnx"));
    assert_ne!(ran.record("mlp.onnx")["worker_id"], grow["worker_id"], "a fresh worker after the killed one");
}

/// A model that runs as long as its input asks (spin.onnx: a Loop of 10^12
/// turns, days of work) is its own `timeout` in the run phase: its worker is
/// killed, the model after it runs in a fresh one, and the run ends within
/// the timeout and the grace rather than waiting the loop out.
#[test]
fn an_onnx_model_that_hangs_is_its_own_timeout_and_the_next_model_runs() {
    use isorun_protocol::{DType, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let turns = Tensor::dense(DType::Int64, vec![], 1_000_000_000_000i64.to_le_bytes().to_vec());
    let (models, inputs) = bad_model_beside_mlp(tmp.path(), "spin.onnx", "n", turns);
    let started = std::time::Instant::now();
    let ran =
        run(isorun().arg("run").arg(&models).arg("--inputs-dir").arg(&inputs).args(["--timeout", "2", "-j", "1"]));
    let took = started.elapsed();
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let spin = ran.record("spin.onnx");
    assert_eq!((spin["status"].as_str(), spin["phase"].as_str()), (Some("timeout"), Some("run")), "{spin}");
    assert_eq!(ran.record("mlp.onnx")["status"], "ok", "{}", ran.record("mlp.onnx"));
    assert_ne!(ran.record("mlp.onnx")["worker_id"], spin["worker_id"], "a fresh worker after the killed one");
    // Timeout 2 s, grace, the other model and what a loaded machine adds; the loop alone would take days.
    assert!(took < std::time::Duration::from_secs(60), "the run took {took:?}");
}

/// ONNX units behind a spare find their model loaded: the spare opened
/// ONNX Runtime and made its session after its fork (`spare.preload_ms`, no
/// `load` on the unit's path), and each unit still gives onnxruntime's
/// outputs in a process of its own. (Spares preload only where no GPU
/// device node is present, as `spare::may_preload` says: skipped there.)
#[test]
fn onnx_units_behind_a_spare_find_their_model_loaded() {
    let gpu = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"].iter().any(|p| Path::new(p).exists());
    if gpu {
        eprintln!("SKIP: a GPU device node is present, so spares do not preload");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for i in 0..4 {
        std::fs::copy(onnx("mlp.onnx"), models.join(format!("mlp{i}.onnx"))).unwrap();
    }
    let ran = run(isorun()
        .arg("run")
        .arg(&models)
        .args(["--input", "x=@[[1, 2, 3, 4]]", "--values", "--json"])
        .args(["-j", "1", "--spawn", "zygote", "--spares", "1"])
        .arg("--report")
        .arg(tmp.path().join("report.json")));
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let spared: Vec<&Value> = ran.records.iter().filter(|r| r.get("spare").is_some()).collect();
    assert!(spared.len() >= 2, "{}", ran.stdout);
    for record in &ran.records {
        assert_eq!(record["outputs"]["y"]["values"], serde_json::json!([[0.0, 5.3694177, 0.0]]), "{record}");
    }
    for record in &spared {
        assert!(record["spare"].get("preload_ms").is_some(), "the spare preloaded the ONNX model: {record}");
        assert_eq!(record["onnxruntime"]["execution_provider"], "cpu", "the preload said its provider: {record}");
        assert_eq!(record["phases_ms"]["load"], 0.0, "the load was done ahead: {record}");
    }
    let workers: std::collections::HashSet<String> = ran.records.iter().map(|r| r["worker_id"].to_string()).collect();
    assert_eq!(workers.len(), 4, "four units, four workers: {}", ran.stdout);
}

/// The variables ONNX Runtime 1.32 reads to tell a CI service, where it
/// keeps no database (`CI`, which `.ci/run` sets, and the strings beside
/// its telemetry code in `libonnxruntime.so`).
const ONNX_RUNTIME_CI_VARIABLES: [&str; 12] = [
    "CI",
    "TF_BUILD",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "CIRCLECI",
    "TRAVIS",
    "JENKINS_URL",
    "CODEBUILD_BUILD_ID",
    "BUILDKITE",
    "TEAMCITY_VERSION",
    "APPVEYOR",
    "BITBUCKET_BUILD_NUMBER",
];

/// ONNX Runtime 1.32's telemetry keeps a SQLite database under
/// `~/.cache/Microsoft/DeveloperTools` (and queues events for Microsoft)
/// whenever it makes an environment, unless `ORT_DISABLE_TELEMETRY` says
/// not to. isorun's workers get `ORT_DISABLE_TELEMETRY=1` unless the user
/// set it, so neither a sandboxed worker nor an open one writes it; a user
/// who turns telemetry on (`=0`) gets it with `--sandbox off` (the check can
/// fail), and a sandboxed worker still may not write into the home folder.
#[test]
fn onnx_runtime_s_telemetry_is_off_in_workers_and_a_sandboxed_one_writes_nothing_into_the_home_folder() {
    let cache = |home: &Path| home.join(".cache/Microsoft");
    let real_cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
        .join("isorun");
    let tmp = tempfile::tempdir().unwrap();
    let home_after = |name: &str, sandbox: &str, telemetry: Option<&str>| {
        let home = tmp.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        let mut command = isorun();
        // The runtimes where the suite found them, whatever HOME says.
        for (var, folder) in
            [("ISORUN_ONNXRUNTIME_DIR", "onnxruntime-1.32.0"), ("ISORUN_LIBTENSORFLOW_DIR", "libtensorflow-2.21.0-cpu")]
        {
            if std::env::var_os(var).is_none() {
                command.env(var, real_cache.join(folder));
            }
        }
        // CI runs this test too: the worker sees no CI service.
        for var in ONNX_RUNTIME_CI_VARIABLES {
            command.env_remove(var);
        }
        command.env_remove("ORT_DISABLE_TELEMETRY");
        if let Some(value) = telemetry {
            command.env("ORT_DISABLE_TELEMETRY", value);
        }
        let ran = run(command.env("HOME", &home).env_remove("XDG_CACHE_HOME").arg("run").arg(onnx("mlp.onnx")).args([
            "--input",
            "x=@[[1, 2, 3, 4]]",
            "--sandbox",
            sandbox,
        ]));
        assert_eq!(ran.code, Some(0), "{name}: {}\n{}", ran.stdout, ran.stderr);
        cache(&home).exists()
    };
    assert!(!home_after("strict", "strict", None), "a sandboxed worker wrote ONNX Runtime's database");
    assert!(!home_after("off", "off", None), "an open worker's ONNX Runtime kept its telemetry database");
    assert!(
        home_after("off-telemetry-on", "off", Some("0")),
        "the user's ORT_DISABLE_TELEMETRY=0 reaches ONNX Runtime, which then writes its database (the checks above can fail)"
    );
    assert!(
        !home_after("strict-telemetry-on", "strict", Some("0")),
        "a sandboxed worker wrote into the home folder with telemetry on"
    );
}

/// With `--journal`, an ONNX model whose external data may not be read (a
/// FIFO here) is that unit's `load_failed`, keyed without being opened;
/// the run goes on and the other model's result is kept.
#[test]
fn a_journaled_run_keeps_going_past_external_data_it_may_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(models.join("fifo")).unwrap();
    std::fs::copy(onnx("external/external.onnx"), models.join("fifo/external.onnx")).unwrap();
    let fifo = std::ffi::CString::new(models.join("fifo/weights.bin").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a path the test owns.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::copy(onnx("mlp.onnx"), models.join("mlp.onnx")).unwrap();
    let inputs = tmp.path().join("inputs");
    std::fs::create_dir_all(inputs.join("mlp.onnx")).unwrap();
    let x = isorun_protocol::Tensor::dense(
        isorun_protocol::DType::Float32,
        vec![1, 4],
        [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    isorun_tensors::npy::write_npy(std::fs::File::create(inputs.join("mlp.onnx/x.npy")).unwrap(), &x).unwrap();
    let ran = run(isorun()
        .arg("run")
        .arg(&models)
        .arg("--inputs-dir")
        .arg(&inputs)
        .arg("--journal")
        .arg(tmp.path().join("journal.jsonl")));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("mlp.onnx")["status"], "ok", "{}", ran.stdout);
    let refused = ran.record("fifo/external.onnx");
    assert_eq!(refused["error"]["kind"], "load_failed", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("is not a regular file"), "{refused}");
}

/// A large input reaches ONNX Runtime where the worker mapped it, not
/// copied into a tensor of ONNX Runtime's: a 256 MiB `.npy` input to a
/// `ReduceSum` raises the worker's peak memory by about its size (the
/// mapped pages), not twice that. Measured against the same model on a
/// small input, in the same kind of worker.
#[test]
fn a_large_onnx_input_is_read_where_it_is_mapped_not_copied_in_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let npy = |name: &str, rows: u64| {
        let path = dir.path().join(name);
        let header = crate::util::npy_bytes(
            &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, 1024), }}"),
            &[],
        );
        std::fs::write(&path, &header).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(header.len() as u64 + rows * 1024 * 4).unwrap();
        path
    };
    let peak = |input: &Path| {
        let ran = run(isorun()
            .arg("run")
            .arg(onnx("total.onnx"))
            .arg("--input")
            .arg(format!("x={}", input.display()))
            .args(["-j", "1", "--json"]));
        assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
        let record = &ran.records[0];
        assert_eq!(record["outputs"]["total"]["shape"], serde_json::json!([]), "{record}");
        record["peak_rss_bytes"].as_u64().unwrap()
    };
    let small = peak(&npy("small.npy", 1));
    let big = peak(&npy("big.npy", 65536));
    let input: u64 = 256 << 20;
    let grew = big.saturating_sub(small);
    assert!(grew >= input / 2, "the worker read the input: its peak grew by {grew} bytes ({small} -> {big})");
    assert!(
        grew < input + input / 2,
        "the worker's peak grew by {grew} bytes for a {input}-byte input ({small} -> {big}): it was copied"
    );
}

/// The nightly options on ONNX files: `--batch-size` splits the rows and
/// joins the outputs to the unsplit run's; `--journal --resume` skips a model
/// whose bytes are unchanged and runs again one whose bytes changed;
/// `--expect` compares with golden outputs written by `--output-dir`.
#[test]
fn onnx_files_take_batch_size_journals_and_golden_outputs_as_saved_models_do() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(onnx("mlp.onnx"), models.join("mlp.onnx")).unwrap();
    let rows = "x=@[[1, 2, 3, 4], [-1, 0.5, -2, 0.25], [0.5, -1.5, 2, -0.75], [3, 1, -1, 2], [0, 0, 1, 1]]";
    let night = |extra: &[&str]| {
        let ran = run(isorun().arg("run").arg(&models).args(["--input", rows, "--json", "--values"]).args(extra));
        assert!(matches!(ran.code, Some(0 | 1)), "{}\n{}", ran.stdout, ran.stderr);
        ran
    };
    let whole = night(&[]);
    let split = night(&["--batch-size", "2"]);
    assert_eq!(split.record("mlp.onnx")["status"], "ok", "{}", split.stdout);
    assert_eq!(split.record("mlp.onnx")["outputs"]["y"]["shape"], serde_json::json!([5, 3]));
    // Three requests of at most two rows give the five rows' outputs.
    let values = |ran: &crate::util::Ran| {
        let mut numbers = Vec::new();
        flat(&ran.record("mlp.onnx")["outputs"]["y"]["values"], &mut numbers);
        numbers.iter().map(|v| v.as_f64().unwrap()).collect::<Vec<f64>>()
    };
    let (joined, unsplit) = (values(&split), values(&whole));
    assert_eq!(joined.len(), 15);
    for (a, b) in joined.iter().zip(&unsplit) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} against {b} unsplit");
    }

    let journal = tmp.path().join("night.journal");
    let journal = journal.to_str().unwrap();
    assert_eq!(night(&["--journal", journal]).record("mlp.onnx")["status"], "ok");
    let again = night(&["--journal", journal, "--resume"]);
    assert_eq!(again.record("mlp.onnx")["resumed"], true, "{}", again.stdout);
    // Other weights, same size and name: `w[0][1]`'s float (bytes 83..87
    // of the file, its raw data starting at 79) times 4 or a quarter.
    let mut bytes = std::fs::read(models.join("mlp.onnx")).unwrap();
    bytes[86] ^= 0x01;
    std::fs::write(models.join("mlp.onnx"), &bytes).unwrap();
    let changed = night(&["--journal", journal, "--resume"]);
    let record = changed.record("mlp.onnx");
    assert!(record.get("resumed").is_none_or(|r| r == false), "{}", changed.stdout);
    assert_eq!(record["status"], "ok", "{}", changed.stdout);
    assert_ne!(
        record["outputs"]["y"]["values"],
        whole.record("mlp.onnx")["outputs"]["y"]["values"],
        "other weights ran"
    );

    std::fs::copy(onnx("mlp.onnx"), models.join("mlp.onnx")).unwrap();
    let golden = tmp.path().join("golden");
    assert_eq!(night(&["--output-dir", golden.to_str().unwrap()]).record("mlp.onnx")["status"], "ok");
    assert_eq!(night(&["--expect", golden.to_str().unwrap()]).record("mlp.onnx")["status"], "ok");
    // Row 0's second output (5.37) off by 0.01 in the golden file.
    crate::util::nudge_f32_npy(&golden.join("mlp.onnx/y.npy"), 1, 0.01);
    let differs = night(&["--expect", golden.to_str().unwrap()]);
    let record = differs.record("mlp.onnx");
    assert_eq!(record["status"], "mismatch", "{}", differs.stdout);
    assert_eq!(record["mismatch"]["output"], "y");
    assert_eq!(record["mismatch"]["index"], serde_json::json!([0, 1]));
}
