//! Keras model files (`.keras`, full-model `.h5`) run like SavedModels:
//! found in folders, exported once by a sandboxed Python process into a
//! cache, run by the real worker, with outputs equal to what
//! `model.predict` gave when the fixtures were made
//! (`scripts/make-fixtures --keras-only`). The export Python is the
//! fixtures venv's (`scripts/make-fixtures` makes it; `ISORUN_KERAS_PYTHON`
//! names another); without it these tests say SKIPPED and return.

use crate::util::{fixtures, isorun, run, Ran};
use isorun_protocol::TensorData;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn keras_fixtures() -> PathBuf {
    fixtures().join("keras")
}

/// The Python with Keras 3 and TensorFlow, or `None` (after saying SKIPPED).
fn python(test: &str) -> Option<PathBuf> {
    crate::util::fixtures_python(&format!("keras::{test}"))
}

/// `isorun run` with this Python and a cache of the test's own.
fn keras_run(python: &Path, cache: &Path, args: &[&str]) -> Ran {
    run(isorun()
        .arg("run")
        .args(args)
        .arg("--python")
        .arg(python)
        .arg("--keras-cache")
        .arg(cache)
        .args(["--load-timeout", "300"]))
}

fn floats(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let tensor = isorun_tensors::npy::read_npy_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let TensorData::Dense(bytes) = tensor.data else { panic!("{}: not dense", path.display()) };
    (tensor.shape, bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
}

/// The outputs isorun wrote for `id` equal `model.predict`'s, under Keras's names.
fn assert_outputs_equal_predict(out: &Path, id: &str, case: &str, names: &[&str]) {
    for name in names {
        let (shape, got) = floats(&out.join(id).join(format!("{name}.npy")));
        let (expected_shape, expected) =
            floats(&keras_fixtures().join("expected").join(case).join(format!("{name}.npy")));
        assert_eq!(shape, expected_shape, "{id}/{name}");
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() <= 1e-6, "{id}/{name}: {got:?} != {expected:?}");
        }
    }
}

/// A checkpoint folder as users have them: `.keras`, Keras-3 `.h5`, a weights file, a SavedModel.
fn mixed_folder(root: &Path) -> PathBuf {
    let ckpts = root.join("ckpts");
    crate::util::copy_dir(&keras_fixtures().join("ckpts"), &ckpts);
    crate::util::copy_dir(&fixtures().join("models/keras_mlp"), &ckpts.join("saved"));
    ckpts
}

#[test]
fn ls_finds_the_models_of_a_checkpoint_folder_with_their_format() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = mixed_folder(tmp.path());
    let ran = run(isorun().arg("ls").arg(&ckpts));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let listed: Vec<(String, String)> = ran
        .stdout
        .lines()
        .map(|l| {
            let fields: Vec<&str> = l.split('\t').collect();
            (fields[0].to_string(), fields[2].to_string())
        })
        .collect();
    let expected = [("dense.keras", "keras"), ("saved", "saved_model"), ("seq.h5", "h5")];
    assert_eq!(listed, expected.map(|(a, b)| (a.to_string(), b.to_string())), "{}", ran.stdout);
    // A weights file given directly is a usage error that says what it lacks.
    let ran = run(isorun().arg("ls").arg(ckpts.join("dense.weights.h5")));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("dense.weights.h5: holds weights only"), "{}", ran.stderr);
    let ran = run(isorun().args(["run", "--inputs", "x.npz"]).arg(ckpts.join("dense.weights.h5")));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
}

#[test]
fn a_mixed_folder_runs_with_keras_names_and_predict_outputs_then_comes_from_the_cache() {
    let Some(python) = python("a_mixed_folder_runs_with_keras_names_and_predict_outputs_then_comes_from_the_cache")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = mixed_folder(tmp.path());
    let inputs = tmp.path().join("inputs");
    // Per-model inputs: the two Keras models and the SavedModel take different ones.
    for (id, name, from) in [
        ("dense.keras", "features", keras_fixtures().join("inputs/dense.npz")),
        ("seq.h5", "input_layer", keras_fixtures().join("inputs/seq.npz")),
    ] {
        std::fs::create_dir_all(inputs.join(id)).unwrap();
        let npz = isorun_tensors::npy::read_npz_file(&from).unwrap();
        let (_, tensor) = npz.into_iter().next().unwrap();
        let file = std::fs::File::create(inputs.join(id).join(format!("{name}.npy"))).unwrap();
        isorun_tensors::npy::write_npy(file, &tensor).unwrap();
    }
    std::fs::create_dir_all(inputs.join("saved")).unwrap();
    std::fs::copy(
        fixtures().join("expected/keras_mlp__serving_default/inputs/features.npy"),
        inputs.join("saved/features.npy"),
    )
    .unwrap();
    // A wrapper that counts every Python start (the probe runs it unsandboxed).
    let starts = tmp.path().join("starts.log");
    let wrapper = tmp.path().join("python");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\necho start >> '{}' 2>/dev/null\nexec '{}' \"$@\"\n", starts.display(), python.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out");
    let args =
        ["--inputs-dir", inputs.to_str().unwrap(), "--output-dir", out.to_str().unwrap(), ckpts.to_str().unwrap()];
    let first = keras_run(&wrapper, &cache, &args);
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    assert_eq!(first.statuses().len(), 3);
    assert_outputs_equal_predict(&out, "dense.keras", "dense", &["logits"]);
    assert_outputs_equal_predict(&out, "seq.h5", "seq", &["dense_1"]);
    assert_eq!(first.record("dense.keras")["export"]["from"], "keras");
    assert_eq!(first.record("dense.keras")["export"]["cached"], false);
    assert_eq!(first.record("seq.h5")["export"]["from"], "h5");
    assert!(first.record("saved").get("export").is_none());
    let started = std::fs::read_to_string(&starts).unwrap_or_default().lines().count();
    assert!(started >= 1, "the wrapper counts Python starts");
    // Second run: from the cache, no Python at all, the same outputs.
    std::fs::remove_dir_all(&out).unwrap();
    let second = keras_run(&wrapper, &cache, &args);
    assert_eq!(second.code, Some(0), "{}\n{}", second.stdout, second.stderr);
    for id in ["dense.keras", "seq.h5"] {
        assert_eq!(second.record(id)["export"]["cached"], true, "{id}");
    }
    assert_outputs_equal_predict(&out, "dense.keras", "dense", &["logits"]);
    let after = std::fs::read_to_string(&starts).unwrap_or_default().lines().count();
    assert_eq!(after, started, "a cached run started Python");
    // The cache lists both entries; clearing empties it.
    let listed = run(isorun().args(["cache", "ls", "--keras-cache"]).arg(&cache));
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    assert!(listed.stdout.contains("dense.keras") && listed.stdout.contains("seq.h5"), "{}", listed.stdout);
    let cleared = run(isorun().args(["cache", "clear", "--keras-cache"]).arg(&cache));
    assert_eq!(cleared.code, Some(0), "{}", cleared.stderr);
    assert!(run(isorun().args(["cache", "ls", "--keras-cache"]).arg(&cache)).stdout.trim().is_empty());
}

#[test]
fn dict_inputs_and_outputs_keep_their_names() {
    let Some(python) = python("dict_inputs_and_outputs_keep_their_names") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let model = keras_fixtures().join("multi.keras");
    let npz = keras_fixtures().join("inputs/multi.npz");
    let ran = keras_run(
        &python,
        &tmp.path().join("cache"),
        &[model.to_str().unwrap(), "--inputs", npz.to_str().unwrap(), "--output-dir", out.to_str().unwrap()],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let outputs: Vec<&String> = ran.record("multi.keras")["outputs"].as_object().unwrap().keys().collect();
    assert_eq!(outputs, ["probs", "score"]);
    assert_outputs_equal_predict(&out, "multi.keras", "multi", &["score", "probs"]);
}

#[test]
fn a_sequential_model_takes_the_bare_list_json_form() {
    let Some(python) = python("a_sequential_model_takes_the_bare_list_json_form") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("x.json");
    std::fs::write(&input, "[[1, 2, 3, 4], [0, 0, 0, 0]]").unwrap();
    let model = keras_fixtures().join("ckpts/seq.h5");
    let ran = keras_run(
        &python,
        &tmp.path().join("cache"),
        &[model.to_str().unwrap(), "--inputs", input.to_str().unwrap(), "--values"],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let values = &ran.record("seq.h5")["outputs"]["dense_1"]["values"];
    assert_eq!(values.as_array().unwrap().len(), 2, "{values}");
    // tanh(bias) for the zero row: inside (-1, 1).
    assert!(values[1].as_array().unwrap().iter().all(|v| v.as_f64().unwrap().abs() < 1.0), "{values}");
}

#[test]
fn custom_layers_need_their_module_and_lambdas_need_keras_unsafe() {
    let Some(python) = python("custom_layers_need_their_module_and_lambdas_need_keras_unsafe") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("out");
    let k = keras_fixtures();
    let (custom, lambda, truncated, dense) =
        (k.join("custom.keras"), k.join("lambda.keras"), k.join("truncated.keras"), k.join("ckpts/dense.keras"));
    let values = k.join("inputs/custom.npz");
    let models = [custom.to_str().unwrap(), lambda.to_str().unwrap(), truncated.to_str().unwrap()];
    let ran = keras_run(&python, &cache, &[&models[..], &["--inputs", values.to_str().unwrap()]].concat());
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let error = |id: &str| ran.record(id)["error"].clone();
    assert_eq!(error("custom.keras")["kind"], "export_failed");
    let message = error("custom.keras")["message"].as_str().unwrap().to_string();
    assert!(message.contains("Scale") && message.contains("--keras-module"), "{message}");
    assert!(message.contains("custom.keras"), "names the file: {message}");
    let message = error("lambda.keras")["message"].as_str().unwrap().to_string();
    assert!(message.contains("Lambda") && message.contains("--keras-unsafe"), "{message}");
    let message = error("truncated.keras")["message"].as_str().unwrap().to_string();
    assert!(message.contains("truncated.keras") && message.contains("not a .keras archive"), "{message}");
    // One file's failure is not another's: dense runs beside a truncated file.
    let ran = keras_run(
        &python,
        &cache,
        &[
            truncated.to_str().unwrap(),
            dense.to_str().unwrap(),
            "--inputs",
            k.join("inputs/dense.npz").to_str().unwrap(),
        ],
    );
    assert_eq!(ran.record("dense.keras")["status"], "ok", "{}", ran.stdout);
    assert_eq!(ran.record("truncated.keras")["status"], "error", "{}", ran.stdout);
    // With the module, and with --keras-unsafe: predict's outputs.
    let module = k.join("custom_layers.py");
    let ran = keras_run(
        &python,
        &cache,
        &[
            custom.to_str().unwrap(),
            lambda.to_str().unwrap(),
            "--inputs",
            values.to_str().unwrap(),
            "--keras-module",
            module.to_str().unwrap(),
            "--keras-unsafe",
            "--output-dir",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_outputs_equal_predict(&out, "custom.keras", "custom", &["scaled"]);
    assert_outputs_equal_predict(&out, "lambda.keras", "lambda", &["doubled"]);
}

#[test]
fn a_keras_module_gets_the_packages_the_exporter_holds_off_while_it_imports_keras() {
    // The export process keeps Keras from importing pandas and scikit-learn
    // at start-up (a second of every export); a module the user passes may
    // still import them (the fixtures' Python has both).
    let Some(python) = python("a_keras_module_gets_the_packages_the_exporter_holds_off_while_it_imports_keras") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let k = keras_fixtures();
    let uses = tmp.path().join("uses_pandas.py");
    std::fs::write(&uses, "import pandas, sklearn.base\nassert pandas.DataFrame({'a': [1]}).shape == (1, 1)\n")
        .unwrap();
    let ran = keras_run(
        &python,
        &tmp.path().join("cache"),
        &[
            k.join("custom.keras").to_str().unwrap(),
            "--inputs",
            k.join("inputs/custom.npz").to_str().unwrap(),
            "--keras-module",
            uses.to_str().unwrap(),
            "--keras-module",
            k.join("custom_layers.py").to_str().unwrap(),
        ],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("custom.keras")["status"], "ok", "{}", ran.stdout);
}

/// Where the escaping Lambda writes (baked into the fixture).
const ESCAPED: &str = "/tmp/isorun-keras-lambda-escaped";

#[test]
fn unsafe_lambda_code_runs_inside_the_sandbox_and_writes_nothing_outside() {
    let Some(python) = python("unsafe_lambda_code_runs_inside_the_sandbox_and_writes_nothing_outside") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let model = keras_fixtures().join("lambda_escape.keras");
    let values = keras_fixtures().join("inputs/custom.npz");
    let args = [model.to_str().unwrap(), "--inputs", values.to_str().unwrap(), "--keras-unsafe"];
    let _ = std::fs::remove_file(ESCAPED);
    let ran = keras_run(&python, &tmp.path().join("cache"), &args);
    assert!(!Path::new(ESCAPED).exists(), "the Lambda wrote outside its sandbox: {}", ran.stdout);
    assert_eq!(ran.record("lambda_escape.keras")["status"], "error", "{}", ran.stdout);
    // The test can fail: without the sandbox the same code does write the file.
    let ran = keras_run(&python, &tmp.path().join("cache2"), &[&args[..], &["--sandbox", "off"]].concat());
    assert!(Path::new(ESCAPED).exists(), "without the sandbox the Lambda writes: {}\n{}", ran.stdout, ran.stderr);
    let _ = std::fs::remove_file(ESCAPED);
}

const DENSE_INPUTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/keras/inputs/dense.npz");

/// Export processes of this test: their environment names its cache.
fn exporters_of(cache: &Path) -> Vec<String> {
    let needle = format!("KERAS_HOME={}", cache.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if String::from_utf8_lossy(&environ).contains(&needle) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

#[test]
fn a_hanging_export_hits_the_load_timeout_and_leaves_no_process() {
    let Some(python) = python("a_hanging_export_hits_the_load_timeout_and_leaves_no_process") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let dense = keras_fixtures().join("ckpts/dense.keras");
    let hang = keras_fixtures().join("hang_layers.py");
    let began = Instant::now();
    let ran = run(isorun()
        .args(["run", dense.to_str().unwrap(), "--inputs", DENSE_INPUTS, "--load-timeout", "20", "--keras-module"])
        .arg(&hang)
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(&cache));
    assert_eq!(ran.record("dense.keras")["status"], "timeout", "{}\n{}", ran.stdout, ran.stderr);
    assert!(began.elapsed() < Duration::from_secs(120));
    assert!(exporters_of(&cache).is_empty(), "export processes left: {:?}", exporters_of(&cache));
}

#[test]
fn sigkill_of_the_supervisor_during_an_export_leaves_no_process_and_no_entry() {
    let Some(python) = python("sigkill_of_the_supervisor_during_an_export_leaves_no_process_and_no_entry") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let dense = keras_fixtures().join("ckpts/dense.keras");
    let hang = keras_fixtures().join("hang_layers.py");
    let mut child = isorun()
        .args(["run", dense.to_str().unwrap(), "--inputs", DENSE_INPUTS, "--keras-module"])
        .arg(&hang)
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(&cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while exporters_of(&cache).is_empty() {
        assert!(Instant::now() < deadline, "no export process started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = exporters_of(&cache);
    child.kill().unwrap();
    child.wait().unwrap();
    for pid in &pids {
        assert!(
            crate::util::gone_within(pid.parse().unwrap(), Duration::from_secs(10)),
            "export process {pid} outlived the supervisor"
        );
    }
    let entries: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".tmp-") && !n.starts_with("python-"))
        .collect();
    assert!(entries.is_empty(), "a cache entry appeared: {entries:?}");
}

/// A folder of two Keras files, `a.keras` and `b.keras`, of other bytes
/// each (the same bytes export once), so that each has an export of its own.
fn two_files(root: &Path) -> PathBuf {
    let models = root.join("models");
    std::fs::create_dir_all(&models).unwrap();
    for (name, from) in [("a.keras", "ckpts/dense.keras"), ("b.keras", "multi.keras")] {
        std::fs::copy(keras_fixtures().join(from), models.join(name)).unwrap();
    }
    models
}

/// The export process after the running one is started early (it imports
/// TensorFlow while the one before it exports, then waits its turn): Ctrl-C
/// while one exports and the next waits stops both, leaves no cache entry
/// and no scratch folder, and each file's record says it was not run.
#[test]
fn ctrl_c_stops_the_running_export_and_the_one_waiting_its_turn() {
    let Some(python) = python("ctrl_c_stops_the_running_export_and_the_one_waiting_its_turn") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    // --keras-unsafe: one process per file, so the second file's process is the one that waits.
    let models = two_files(tmp.path());
    let hang = keras_fixtures().join("hang_layers.py");
    let mut child = isorun()
        .args(["run", models.to_str().unwrap(), "--inputs", DENSE_INPUTS, "--json", "--keras-unsafe", "-j", "1"])
        .arg("--keras-module")
        .arg(&hang)
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(&cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first process hangs importing the module after its hello; the
    // second starts at that hello and waits once it has imported TensorFlow.
    let deadline = Instant::now() + Duration::from_secs(90);
    while exporters_of(&cache).len() < 2 {
        if Instant::now() >= deadline {
            // SAFETY: our own child, not yet reaped: Ctrl-C, so it stops its export process too.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
            panic!("the second export process was not started early: {:?}", exporters_of(&cache));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = exporters_of(&cache);
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert!(matches!(ran.code, Some(130)), "{}\n{}", ran.stdout, ran.stderr);
    for pid in &pids {
        assert!(
            crate::util::gone_within(pid.parse().unwrap(), Duration::from_secs(10)),
            "export process {pid} outlived the run"
        );
    }
    assert_eq!(ran.records.len(), 2, "{}\n{}", ran.stdout, ran.stderr);
    for id in ["a.keras", "b.keras"] {
        assert_eq!(ran.record(id)["status"], "not_run", "{}", ran.stdout);
    }
    let left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("python-"))
        .collect();
    assert!(left.is_empty(), "left in the cache: {left:?}");
}

#[test]
fn without_python_keras_files_are_errors_and_saved_models_still_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = mixed_folder(tmp.path());
    std::fs::remove_file(ckpts.join("seq.h5")).unwrap();
    let no_keras = tmp.path().join("python");
    std::fs::write(&no_keras, "#!/bin/sh\necho 'ModuleNotFoundError: No module named keras' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&no_keras, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let inputs = fixtures().join("expected/keras_mlp__serving_default/inputs.npz");
    let ran = keras_run(
        &no_keras,
        &tmp.path().join("cache"),
        &[ckpts.to_str().unwrap(), "--inputs", inputs.to_str().unwrap()],
    );
    assert_eq!(ran.record("saved")["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    let error = &ran.record("dense.keras")["error"];
    assert_eq!(error["kind"], "export_failed");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("--python"), "{message}");
}

#[test]
fn inspect_reads_keras_configs_without_tensorflow() {
    let k = keras_fixtures();
    let ran = run(isorun().args(["inspect", "--json"]).arg(k.join("multi.keras")));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let shown = &ran.records[0];
    assert_eq!(shown["format"], "keras");
    assert!(shown["keras_version"].as_str().unwrap().starts_with("3."), "{shown}");
    assert_eq!(shown["inputs"]["a"], serde_json::json!({"dtype": "float32", "shape": [null, 3]}));
    assert_eq!(shown["inputs"]["b"], serde_json::json!({"dtype": "float32", "shape": [null, 2]}));
    assert_eq!(shown["outputs"], serde_json::json!(["score", "probs"]));
    // A full-model .h5: its model_config attribute, by the small HDF5 reader.
    let ran = run(isorun().args(["inspect", "--json"]).arg(k.join("ckpts/seq.h5")));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["format"], "h5");
    assert_eq!(ran.records[0]["class_name"], "Sequential");
    assert_eq!(ran.records[0]["inputs"]["input_layer"]["shape"], serde_json::json!([null, 4]));
    assert_eq!(ran.records[0]["outputs"], serde_json::json!(["dense_1"]));
    for (file, says) in [("ckpts/dense.weights.h5", "holds weights only"), ("truncated.keras", "not a .keras archive")]
    {
        let ran = run(isorun().arg("inspect").arg(k.join(file)));
        assert_eq!(ran.code, Some(2), "{file}");
        assert!(ran.stderr.contains(says), "{file}: {}", ran.stderr);
    }
}

#[test]
fn keras_2_files_load_with_keras_3_or_else_with_tf_keras() {
    let Some(python) = python("keras_2_files_load_with_keras_3_or_else_with_tf_keras") else { return };
    let has_tf_keras = std::process::Command::new(&python)
        .args(["-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('tf_keras') is None)"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_tf_keras {
        eprintln!(
            "NOTE: keras::keras_2_files_load_with_keras_3_or_else_with_tf_keras SKIPPED: no tf_keras in {}",
            python.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let k = keras_fixtures();
    let cache = tmp.path().join("cache");
    for (model, output, loader) in [("k2_seq", "out", "keras"), ("k2_local", "flat", "tf_keras")] {
        let out = tmp.path().join(model);
        let file = k.join("keras2").join(format!("{model}.h5"));
        let inputs = k.join("inputs").join(format!("{model}.npz"));
        let ran = keras_run(
            &python,
            &cache,
            &[file.to_str().unwrap(), "--inputs", inputs.to_str().unwrap(), "--output-dir", out.to_str().unwrap()],
        );
        let id = format!("{model}.h5");
        assert_eq!(ran.record(&id)["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
        assert_eq!(ran.record(&id)["export"]["loader"], loader, "{}", ran.stdout);
        assert_outputs_equal_predict(&out, &id, model, &[output]);
    }
}

#[test]
fn doctor_names_the_python_keras_and_tensorflow_it_found() {
    let Some(python) = python("doctor_names_the_python_keras_and_tensorflow_it_found") else { return };
    let ran = run(isorun().arg("doctor").arg("--python").arg(&python));
    let line = ran.stdout.lines().find(|l| l.starts_with("keras ")).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert!(line.contains("found") && line.contains("Keras 3.") && line.contains("TensorFlow 2."), "{line}");
    let ran = run(isorun().args(["doctor", "--python", "/bin/false"]));
    let line = ran.stdout.lines().find(|l| l.starts_with("keras ")).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert!(line.contains("none") && line.contains("--python"), "{line}");
}

#[test]
fn isorun_eval_scores_a_keras_file_like_a_saved_model() {
    let Some(python) = python("isorun_eval_scores_a_keras_file_like_a_saved_model") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let ran = run(isorun()
        .arg("eval")
        .arg(keras_fixtures().join("iris.keras"))
        .arg(repo.join("examples/eval/models/iris_e100"))
        .arg("--data")
        .arg(repo.join("examples/eval/iris.tfrecord"))
        .args(["--label", "species", "--python"])
        .arg(&python)
        .arg("--keras-cache")
        .arg(tmp.path()));
    let record = ran.record("iris.keras");
    assert_eq!(record["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(record["examples"], 150);
    assert_eq!(record["export"]["from"], "keras");
    assert!(record["metrics"]["accuracy"].is_number(), "{record}");
    assert_eq!(ran.record("iris_e100")["status"], "ok");
}

#[test]
fn pipe_serves_a_keras_file_and_refuses_a_broken_one() {
    let Some(python) = python("pipe_serves_a_keras_file_and_refuses_a_broken_one") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut child = isorun()
        .arg("pipe")
        .arg(keras_fixtures().join("ckpts/dense.keras"))
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(tmp.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"{\"id\": 1, \"inputs\": {\"features\": [[1, 2, 3, 4]]}}\n").unwrap();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["outputs"]["logits"]["shape"], serde_json::json!([1, 3]), "{}", ran.stdout);
    let ran = run(isorun()
        .arg("pipe")
        .arg(keras_fixtures().join("truncated.keras"))
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(tmp.path()));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("truncated.keras") && ran.stderr.contains("not a .keras archive"), "{}", ran.stderr);
}

/// Saves, with tf_keras (Keras 2), a full-model `.h5` at `path` taking
/// `features` `[?, 4]` through a Lambda whose bytecode runs `code` (Python
/// source, run with `exec` each time the layer is called: also when the
/// file is loaded, but not while it is made).
fn keras2_lambda_h5(python: &Path, path: &Path, code: &str) {
    let script = format!(
        r#"
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tf_keras as k2
x = k2.Input((4,), name="features")
y = k2.layers.Lambda(
    lambda v: (None if __import__("os").environ.get("ISORUN_MAKING_FIXTURE") else exec({code:?}), v)[1],
    output_shape=(4,), name="sneaky")(x)
k2.Model(x, y).save({path:?})
"#,
        code = code,
        path = path.display().to_string()
    );
    // The string is a constant of the lambda's own bytecode (a loaded
    // lambda sees none of this script's globals); it does nothing while
    // the fixture is made.
    let made = Command::new(python)
        .args(["-c", &script])
        .env("ISORUN_MAKING_FIXTURE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
}

#[test]
fn a_keras2_h5_lambda_is_refused_before_any_python_runs_without_keras_unsafe() {
    let Some(python) = python("a_keras2_h5_lambda_is_refused_before_any_python_runs_without_keras_unsafe") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("code-ran");
    let model = tmp.path().join("k2_lambda.h5");
    keras2_lambda_h5(&python, &model, &format!("open({:?}, 'w').write('ran')", marker.display().to_string()));
    let _ = std::fs::remove_file(&marker);
    // Unsandboxed, so that code which runs leaves its mark: tf_keras
    // ignores safe_mode for HDF5 files and ran the bytecode after Keras 3
    // had refused it.
    let args = [model.to_str().unwrap(), "--inputs", DENSE_INPUTS, "--sandbox", "off", "-j", "1"];
    let ran = keras_run(&python, &tmp.path().join("cache"), &args);
    assert!(!marker.exists(), "the Lambda's code ran without --keras-unsafe: {}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("k2_lambda.h5");
    assert_eq!(record["status"], "error", "{}", ran.stdout);
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("layer 'sneaky'") && message.contains("--keras-unsafe"), "{message}");
    assert_eq!(record["export"]["ms"], 0, "refused before any export process: {record}");
    // The test can fail: with --keras-unsafe the same file's code runs.
    let ran = keras_run(&python, &tmp.path().join("cache"), &[&args[..], &["--keras-unsafe"]].concat());
    assert!(marker.exists(), "the fixture's code did not run even when allowed: {}\n{}", ran.stdout, ran.stderr);
}

/// Every `path` below `root` named `name`.
fn files_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return found };
    for entry in entries.flatten() {
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            found.extend(files_named(&entry.path(), name));
        } else if entry.file_name() == name {
            found.push(entry.path());
        }
    }
    found
}

#[test]
fn one_files_code_cannot_write_another_files_export() {
    let Some(python) = python("one_files_code_cannot_write_another_files_export") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    // File A's code plants a file in every staging folder of the run it
    // can reach (`.tmp-<supervisor pid>-N`), where file B's export is written.
    let plant = format!(
        "import os\nfor n in range(64):\n  d = f'{}/.tmp-{{os.getppid()}}-{{n}}/saved_model/assets'\n  try:\n    os.makedirs(d, exist_ok=True)\n    open(d + '/planted', 'w').write('x')\n  except Exception:\n    pass\n",
        cache.display()
    );
    keras2_lambda_h5(&python, &models.join("a_lambda.h5"), &plant);
    std::fs::copy(keras_fixtures().join("ckpts/dense.keras"), models.join("b_dense.keras")).unwrap();
    let b_entry_planted = |cache: &Path| -> Vec<PathBuf> {
        files_named(cache, "planted")
            .into_iter()
            .filter(|p| {
                let entry = p.ancestors().find(|a| a.join("export.json").is_file());
                entry.is_some_and(|e| std::fs::read_to_string(e.join("export.json")).unwrap().contains("b_dense.keras"))
            })
            .collect()
    };
    // Safe mode (one export process for both files, -j 1): A is refused
    // before Python starts, so nothing of it runs beside B's export.
    let ran = keras_run(&python, &cache, &[models.to_str().unwrap(), "--inputs", DENSE_INPUTS, "-j", "1"]);
    assert!(files_named(&cache, "planted").is_empty(), "A's code planted {:?}", files_named(&cache, "planted"));
    assert_eq!(ran.record("b_dense.keras")["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("a_lambda.h5")["status"], "error", "{}", ran.stdout);
    // With --keras-unsafe A's code runs, in a process of its own whose
    // sandbox can write only A's staging folder, never B's.
    let cache2 = tmp.path().join("cache2");
    let plant2 = plant.replace(&cache.display().to_string(), &cache2.display().to_string());
    keras2_lambda_h5(&python, &models.join("a_lambda.h5"), &plant2);
    let ran =
        keras_run(&python, &cache2, &[models.to_str().unwrap(), "--inputs", DENSE_INPUTS, "-j", "1", "--keras-unsafe"]);
    assert_eq!(ran.record("b_dense.keras")["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    assert!(b_entry_planted(&cache2).is_empty(), "A's code wrote B's export: {:?}", b_entry_planted(&cache2));
}

/// A stand-in for the export's Python (no TensorFlow): answers the probe,
/// then "exports" the first job by copying a SavedModel and says what
/// `ISORUN_FAKE_EXPORT` asks: `twice` (its `done` twice), `unstarted` (a
/// `done` with no `start`).
fn fake_export_python(dir: &Path) -> PathBuf {
    let real = real_python3();
    let saved_model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models/linear_regressor");
    let script = format!(
        r#"#!{real}
import json, os, shutil, sys
code = sys.argv[2] if len(sys.argv) > 2 else ""
if "importlib.metadata" in code:
    print(json.dumps({{"executable": os.path.realpath(sys.executable), "prefixes": [sys.prefix], "path": [],
        "version": "3.11.0", "keras": "3.99.0", "tensorflow": "2.21.0", "tf_keras": None, "dists": []}}))
    sys.exit(0)
request = json.loads(sys.stdin.readline())
marker = os.environ.get("ISORUN_FAKE_MARKER", "")
if os.environ["ISORUN_FAKE_EXPORT"] == "die-once":
    # The first export process leaves a mark; the next one, started early
    # while the first works, is killed while it waits its turn, before its
    # hello (as the OOM killer would), once.
    try:
        os.close(os.open(marker + ".first", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), 9)
sys.stdin.read()
shutil.copytree({saved_model:?}, request["jobs"][0]["out"])
def say(m):
    print(json.dumps(m), flush=True)
say({{"hello": {{"keras": "3.99.0", "tensorflow": "2.21.0", "python": "3.11.0"}}}})
done = {{"done": 0, "ok": True, "loader": "keras", "inputs": ["x"], "outputs": ["y"]}}
if os.environ["ISORUN_FAKE_EXPORT"] == "twice":
    say({{"start": 0}}); say(done); say(done)
elif os.environ["ISORUN_FAKE_EXPORT"] == "die-once":
    say({{"start": 0}}); say(done)
else:
    say(done)
"#,
        saved_model = saved_model.canonicalize().unwrap().display().to_string()
    );
    let path = dir.join("python");
    std::fs::write(&path, script).unwrap();
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).unwrap();
    path
}

/// The real interpreter behind `python3` on `PATH` (not a pyenv shim).
fn real_python3() -> String {
    let found = Command::new("python3")
        .args(["-c", "import os, sys; print(os.path.realpath(sys.executable))"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(found.stdout).unwrap().trim().to_string()
}

#[test]
fn an_export_process_that_finishes_a_file_twice_or_unstarted_is_a_protocol_error_not_a_unit_run_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let python = fake_export_python(tmp.path());
    let model = keras_fixtures().join("ckpts/dense.keras");
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/inputs.npz");
    for mode in ["twice", "unstarted"] {
        let cache = tmp.path().join(format!("cache-{mode}"));
        let ran = run(isorun()
            .args(["run", model.to_str().unwrap(), "--inputs", inputs.to_str().unwrap(), "--json", "-j", "1"])
            .args(["--sandbox", "off", "--python"])
            .arg(&python)
            .arg("--keras-cache")
            .arg(&cache)
            .env("ISORUN_FAKE_EXPORT", mode));
        let context = format!("{mode}: {}\n{}", ran.stdout, ran.stderr);
        assert_eq!(ran.records.len(), 1, "one record for one file: {context}");
        if mode == "unstarted" {
            assert_eq!(ran.records[0]["status"], "protocol_error", "{context}");
            let message = ran.records[0]["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("finished job 0, which was not running"), "{context}");
        }
    }
}

/// An export process started early, while the one before it worked, that
/// dies before it starts its file (the OOM killer's first pick while it
/// waited) is none of that file's doing: the file is exported again in a
/// fresh process, and runs.
#[test]
fn a_file_whose_early_export_process_died_before_starting_it_is_exported_again() {
    let tmp = tempfile::tempdir().unwrap();
    let python = fake_export_python(tmp.path());
    // --keras-unsafe: a process per file.
    let models = two_files(tmp.path());
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/inputs.npz");
    let marker = tmp.path().join("died");
    let ran = run(isorun()
        .args(["run", models.to_str().unwrap(), "--inputs", inputs.to_str().unwrap(), "--json", "-j", "1"])
        .args(["--keras-unsafe", "--sandbox", "off", "--python"])
        .arg(&python)
        .arg("--keras-cache")
        .arg(tmp.path().join("cache"))
        .env("ISORUN_FAKE_EXPORT", "die-once")
        .env("ISORUN_FAKE_MARKER", &marker));
    assert!(marker.exists(), "the second file's first export process did not die: {}\n{}", ran.stdout, ran.stderr);
    for id in ["a.keras", "b.keras"] {
        assert_eq!(ran.record(id)["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    }
}

/// The export process, like a worker, starts in a session of its own and
/// cannot change its process group: where Landlock has no signal scope
/// (kernels before 6.12; `isorun-deny-landlock` hides it here), a Lambda
/// run with `--keras-unsafe` that moves into the supervisor's group and
/// sends SIGKILL to "its own" group used to kill the supervisor (which
/// leads its own session here, as a user's shell does).
#[test]
fn a_lambda_cannot_join_the_supervisors_process_group_from_the_export_process() {
    use std::os::unix::process::CommandExt;
    let Some(python) = python("a_lambda_cannot_join_the_supervisors_process_group_from_the_export_process") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("joiner.h5");
    let code = "import os\nfor g in (os.getsid(0), os.getpgid(os.getppid())):\n  if g != os.getpid():\n    try:\n      os.setpgid(0, g)\n      os.kill(0, 9)\n    except PermissionError:\n      pass\nraise PermissionError('setpgid refused')\n";
    keras2_lambda_h5(&python, &model, code);
    let mut command = Command::new(crate::util::bin("isorun-deny-landlock"));
    command
        .arg(crate::util::bin("isorun"))
        .args(["run", model.to_str().unwrap(), "--inputs", DENSE_INPUTS, "--json", "--keras-unsafe", "--python"])
        .arg(&python)
        .arg("--keras-cache")
        .arg(tmp.path().join("cache"))
        .stdin(Stdio::null());
    // SAFETY: setsid between fork and exec is async-signal-safe.
    unsafe {
        command.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
    }
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(1), "the supervisor must survive: {:?}\n{}\n{}", ran.code, ran.stdout, ran.stderr);
    let record = ran.record("joiner.h5");
    assert_eq!(record["status"], "error", "{record}");
    assert!(record["error"]["message"].as_str().unwrap().contains("setpgid refused"), "{record}");
}

/// The checkpoints fixture's training run copied to `dir/run`, its inputs
/// file, and the Keras cache folder to use (`dir/cache`, not made yet).
fn checkpoints_run(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run_dir = dir.join("run");
    crate::util::copy_dir(&keras_fixtures().join("checkpoints/run"), &run_dir);
    (run_dir, keras_fixtures().join("checkpoints/inputs.npz"), dir.join("cache"))
}

/// Where a first run's exports went, per file (issue 44 §1): each exported
/// record's `export.phases_ms` names the export process's phases of that
/// file in order (`load_model` for a file traced, `load_weights`, `write`
/// and `verify` for one that shares its trace) and `other`, the rest of
/// `export.ms`, so that they add up to it; `export.before_ms` says what the
/// process spent before the file (its start and imports for the first,
/// the clean-up after a traced file before it). A cached run has none.
#[test]
fn export_phases_are_in_the_records_and_add_up_to_the_export_time() {
    let Some(python) = python("export_phases_are_in_the_records_and_add_up_to_the_export_time") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (run_dir, inputs, cache) = checkpoints_run(tmp.path());
    let args = ["-j", "1", "--inputs", inputs.to_str().unwrap(), run_dir.to_str().unwrap()];
    let first = keras_run(&python, &cache, &args);
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    assert_eq!(first.records.len(), 5, "{}", first.stdout);
    let mut graphs = Vec::new();
    let mut process_starts = 0;
    for record in &first.records {
        let export = &record["export"];
        let phases = export["phases_ms"].as_object().unwrap_or_else(|| panic!("no phases_ms: {record}"));
        let names: Vec<&str> = phases.keys().map(String::as_str).collect();
        assert_eq!(names.last(), Some(&"other"), "{record}");
        let ms = |value: &serde_json::Value| value.as_u64().unwrap_or_else(|| panic!("not a number: {record}"));
        let said: u64 = phases.iter().filter(|(name, _)| *name != "other").map(|(_, v)| ms(v)).sum();
        let all: u64 = phases.values().map(ms).sum();
        // The process's phases and the rest add up to the export's time (or
        // are the process's own sum, when its clock saw more than the supervisor's).
        assert_eq!(all, ms(&export["ms"]).max(said), "{record}");
        let graph = export["graph"].as_str().unwrap().to_string();
        let wanted: &[&str] = match graph.as_str() {
            "shared" => &["config", "layout", "load_weights", "write", "verify"],
            _ => &["config", "load_model"],
        };
        for name in wanted {
            assert!(phases.contains_key(*name), "{name} missing: {record}");
        }
        // Only where the process spent something before the file: its start, or a clean-up after a traced file.
        if let Some(before) = export.get("before_ms") {
            let before = before.as_object().unwrap_or_else(|| panic!("before_ms not an object: {record}"));
            if before.contains_key("process_start") {
                process_starts += 1;
                for name in ["imports", "turn"] {
                    assert!(before[name].is_u64(), "{name} missing: {record}");
                }
            } else {
                assert!(before["cleanup"].is_u64(), "{record}");
            }
        }
        graphs.push(graph);
    }
    assert!(graphs.iter().any(|g| g == "shared"), "{graphs:?}");
    // One process at -j 1 for these five small files: one start, one import.
    assert_eq!(process_starts, 1, "{}", first.stdout);
    let second = keras_run(&python, &cache, &args);
    assert_eq!(second.code, Some(0), "{}\n{}", second.stdout, second.stderr);
    for record in &second.records {
        assert_eq!(record["export"]["cached"], true, "{record}");
        assert!(record["export"].get("phases_ms").is_none(), "{record}");
    }
}

/// One training run's checkpoints share one trace: the first file of an
/// architecture is traced, the later ones get only their weights written
/// into a copy of its export; a file one unit wider gets its own trace, and
/// one whose weights are not laid out as its config's graph is exported in
/// full. Every output equals that file's own `model.predict` (so a shared
/// export carries its own weights and BatchNorm statistics, not the traced
/// file's), and the cached second run gives the same.
#[test]
fn checkpoints_of_one_architecture_share_one_trace_and_each_gives_its_own_predict() {
    let Some(python) = python("checkpoints_of_one_architecture_share_one_trace_and_each_gives_its_own_predict") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (run_dir, inputs, cache) = checkpoints_run(tmp.path());
    let out = tmp.path().join("out");
    let args = [
        "-j",
        "1",
        "--inputs",
        inputs.to_str().unwrap(),
        "--output-dir",
        out.to_str().unwrap(),
        run_dir.to_str().unwrap(),
    ];
    let first = keras_run(&python, &cache, &args);
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    let files = ["epoch_01.keras", "epoch_02.keras", "epoch_02_extra.keras", "epoch_02_wider.keras", "epoch_03.keras"];
    assert_eq!(first.statuses().len(), files.len(), "{}", first.stdout);
    let graph = |ran: &Ran, id: &str| ran.record(id)["export"]["graph"].as_str().map(str::to_string);
    let graphs: Vec<Option<String>> = files.iter().map(|id| graph(&first, id)).collect();
    let own = graphs.iter().filter(|g| matches!(g.as_deref(), Some("traced" | "frozen"))).count();
    let shared = graphs.iter().filter(|g| g.as_deref() == Some("shared")).count();
    // epoch_01 (or whichever of its group comes first) is traced with the
    // archive the others need, two more share it; the wider one (alone in
    // its group: frozen) and the re-laid one get graphs of their own.
    assert_eq!((own, shared), (3, 2), "{graphs:?}");
    assert_eq!(
        graphs.iter().filter(|g| g.as_deref() == Some("traced")).count(),
        1 + usize::from(graph(&first, "epoch_02_extra.keras").as_deref() == Some("traced")),
        "{graphs:?}"
    );
    assert_eq!(graph(&first, "epoch_02_wider.keras").as_deref(), Some("frozen"));
    assert!(matches!(graph(&first, "epoch_02_extra.keras").as_deref(), Some("traced" | "frozen")), "{graphs:?}");
    for id in files {
        let case = format!("../checkpoints/expected/{id}");
        assert_outputs_equal_predict(&out, id, &case, &["score", "probs"]);
    }
    // The three epochs' outputs differ: each export carries its own weights.
    let (_, one) = floats(&out.join("epoch_01.keras/score.npy"));
    let (_, three) = floats(&out.join("epoch_03.keras/score.npy"));
    assert!(one.iter().zip(&three).any(|(a, b)| (a - b).abs() > 1e-4), "{one:?} {three:?}");
    // Second run: every file from the cache, outputs unchanged.
    std::fs::remove_dir_all(&out).unwrap();
    let second = keras_run(&python, &cache, &args);
    assert_eq!(second.code, Some(0), "{}\n{}", second.stdout, second.stderr);
    for id in files {
        assert_eq!(second.record(id)["export"]["cached"], true, "{id}");
        assert_outputs_equal_predict(&out, id, &format!("../checkpoints/expected/{id}"), &["score", "probs"]);
    }
}

/// A file the frozen export cannot take (a string input looked up in a
/// vocabulary: a table, not variables) is exported with Keras's archive
/// instead, and answers as `model.predict` does; a plain file is frozen.
#[test]
fn a_model_that_cannot_be_frozen_is_exported_with_the_archive_and_answers_the_same() {
    let Some(python) = python("a_model_that_cannot_be_frozen_is_exported_with_the_archive_and_answers_the_same") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let make = r#"
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras
inp = keras.Input((1,), dtype="string", name="word")
out = keras.layers.StringLookup(vocabulary=["a", "b", "c"], name="index")(inp)
keras.Model(inp, out).save(os.path.join(sys.argv[1], "lookup.keras"))
"#;
    let made = std::process::Command::new(&python).args(["-c", make]).arg(&models).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let ran = keras_run(
        &python,
        &tmp.path().join("cache"),
        &[
            models.join("lookup.keras").to_str().unwrap(),
            "--input",
            r#"word=@[["b"], ["zz"], ["a"]]"#,
            "--json",
            "--values",
        ],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("lookup.keras");
    assert_eq!(record["export"]["graph"], "traced", "{record}");
    assert_eq!(record["outputs"]["index"]["values"], serde_json::json!([[2], [0], [1]]), "{record}");
    let npz = keras_fixtures().join("inputs/multi.npz");
    let ran = keras_run(
        &python,
        &tmp.path().join("cache"),
        &[keras_fixtures().join("multi.keras").to_str().unwrap(), "--inputs", npz.to_str().unwrap(), "--json"],
    );
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("multi.keras")["export"]["graph"], "frozen", "{}", ran.stdout);
}

/// The cache's entries (folders holding an `export.json`).
fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    found.sort();
    found
}

fn export_json(entry: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(entry.join("export.json")).unwrap()).unwrap()
}

/// A frozen graph's check runs in the unit's worker, on the probe, before
/// the unit's inputs: the record says so with its time, the entry
/// remembers it (and drops the check file), and a later run from the
/// cache runs no probe; the outputs are `model.predict`'s. `eval` checks
/// the same way.
#[test]
fn a_frozen_graph_is_checked_once_by_the_first_worker_that_loads_it() {
    let Some(python) = python("a_frozen_graph_is_checked_once_by_the_first_worker_that_loads_it") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (cache, out) = (tmp.path().join("cache"), tmp.path().join("out"));
    let npz = keras_fixtures().join("inputs/multi.npz");
    let args = [
        keras_fixtures().join("multi.keras").to_str().unwrap().to_string(),
        "--inputs".into(),
        npz.to_str().unwrap().into(),
        "--json".into(),
        "--output-dir".into(),
        out.to_str().unwrap().into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = keras_run(&python, &cache, &args);
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    let export = &first.record("multi.keras")["export"];
    assert_eq!((export["graph"].as_str(), export["check"].as_str()), (Some("frozen"), Some("worker")), "{export}");
    assert!(export["check_ms"].as_u64().is_some(), "{export}");
    assert_outputs_equal_predict(&out, "multi.keras", "multi", &["probs", "score"]);
    let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
    assert_eq!(export_json(&entry)["check"], "worker");
    assert!(!entry.join("frozen-check.npz").exists(), "the check file stays after its check");

    std::fs::remove_dir_all(&out).unwrap();
    let second = keras_run(&python, &cache, &args);
    assert_eq!(second.code, Some(0), "{}\n{}", second.stdout, second.stderr);
    let export = &second.record("multi.keras")["export"];
    assert_eq!((export["cached"].as_bool(), export["check"].as_str()), (Some(true), Some("worker")), "{export}");
    assert!(export.get("check_ms").is_none(), "a checked entry was checked again: {export}");
    assert_outputs_equal_predict(&out, "multi.keras", "multi", &["probs", "score"]);

    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let eval = run(isorun()
        .arg("eval")
        .arg(keras_fixtures().join("iris.keras"))
        .arg("--data")
        .arg(repo.join("examples/eval/iris.tfrecord"))
        .args(["--label", "species", "--json", "--python"])
        .arg(&python)
        .arg("--keras-cache")
        .arg(&cache));
    let record = eval.record("iris.keras");
    assert_eq!(record["status"], "ok", "{}\n{}", eval.stdout, eval.stderr);
    assert_eq!(record["export"]["check"], "worker", "{record}");
    assert!(record["export"]["check_ms"].as_u64().is_some(), "{record}");
    assert_eq!(record["examples"], 150);
}

/// An entry left waiting for its check (its unit failed before the
/// probe ran: inputs that do not fit) is checked by the next run; a check
/// file whose outputs were changed (and rehashed) fails the check, one
/// whose bytes no longer hash to `export.json`'s is refused: either way the
/// file is exported again the archive's way into the same entry and the
/// unit runs again, in a fresh worker, with `model.predict`'s outputs.
/// A failure on the probe that is not the graph's leaves the entry waiting.
/// `pipe`, which has no unit to check with, exports a waiting entry again
/// and checks it in the export process.
#[test]
fn a_frozen_graph_that_fails_its_check_is_exported_again_and_its_unit_runs_again() {
    let Some(python) = python("a_frozen_graph_that_fails_its_check_is_exported_again_and_its_unit_runs_again") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (cache, out) = (tmp.path().join("cache"), tmp.path().join("out"));
    let model = keras_fixtures().join("multi.keras");
    let tamper = r#"
import hashlib, json, sys
import numpy as np
entry, how = sys.argv[1], sys.argv[2]
path = entry + "/frozen-check.npz"
if how == "values":
    arrays = dict(np.load(path))
    for key in arrays:
        if key.startswith("output/"):
            arrays[key] = arrays[key] + np.ones_like(arrays[key])
    np.savez(path, **arrays)
    about = json.load(open(entry + "/export.json"))
    about["check_sha256"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    json.dump(about, open(entry + "/export.json", "w"))
else:
    with open(path, "r+b") as f:
        f.seek(-64, 2)
        f.write(b"\x7f" * 8)
"#;
    for (how, error) in [("values", "values differ"), ("bytes", "hashes to")] {
        let _ = std::fs::remove_dir_all(&cache);
        let _ = std::fs::remove_dir_all(&out);
        let wrong = keras_fixtures().join("inputs/dense.npz");
        let ran = keras_run(&python, &cache, &[model.to_str().unwrap(), "--inputs", wrong.to_str().unwrap(), "--json"]);
        let export = &ran.record("multi.keras")["export"];
        assert_eq!(export["check"], "pending", "{how}: {}\n{}", ran.stdout, ran.stderr);
        let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
        assert_eq!(export_json(&entry)["check"], "pending");
        let tampered = Command::new(&python).args(["-c", tamper]).arg(&entry).arg(how).output().unwrap();
        assert!(tampered.status.success(), "{}", String::from_utf8_lossy(&tampered.stderr));

        let npz = keras_fixtures().join("inputs/multi.npz");
        let ran = keras_run(
            &python,
            &cache,
            &[
                model.to_str().unwrap(),
                "--inputs",
                npz.to_str().unwrap(),
                "--json",
                "--output-dir",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(ran.code, Some(0), "{how}: {}\n{}", ran.stdout, ran.stderr);
        let record = ran.record("multi.keras");
        let export = &record["export"];
        assert_eq!(
            (export["graph"].as_str(), export["check"].as_str()),
            (Some("traced"), Some("failed")),
            "{how}: {export}"
        );
        assert!(export["check_error"].as_str().unwrap_or_default().contains(error), "{how}: {export}");
        assert_eq!(record["attempts"].as_array().map(Vec::len), Some(1), "{how}: {record}");
        // The worker that held the frozen graph went; a second one ran the unit.
        assert_eq!(record["worker_id"], 1, "{how}: {record}");
        assert_outputs_equal_predict(&out, "multi.keras", "multi", &["probs", "score"]);
        let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
        let about = export_json(&entry);
        assert_eq!((about["graph"].as_str(), about.get("check")), (Some("traced"), None), "{how}: {about}");
    }

    // pipe and an entry waiting for its check.
    let _ = std::fs::remove_dir_all(&cache);
    let wrong = keras_fixtures().join("inputs/dense.npz");
    let ran = keras_run(&python, &cache, &[model.to_str().unwrap(), "--inputs", wrong.to_str().unwrap(), "--json"]);
    assert_eq!(ran.record("multi.keras")["export"]["check"], "pending", "{}", ran.stdout);
    // A failure on the probe that is not the graph's (the worker over its
    // memory limit) is the unit's own: the entry stays pending, not exported again.
    let npz = keras_fixtures().join("inputs/multi.npz");
    let ran = keras_run(
        &python,
        &cache,
        &[model.to_str().unwrap(), "--inputs", npz.to_str().unwrap(), "--json", "--memory-limit", "4M"],
    );
    let record = ran.record("multi.keras");
    assert_eq!(
        (record["status"].as_str(), record["export"]["check"].as_str()),
        (Some("memory_limit"), Some("pending")),
        "{record}"
    );
    let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
    let about = export_json(&entry);
    assert_eq!((about["graph"].as_str(), about["check"].as_str()), (Some("frozen"), Some("pending")), "{about}");
    let mut child = isorun()
        .arg("pipe")
        .arg(&model)
        .arg("--python")
        .arg(&python)
        .arg("--keras-cache")
        .arg(&cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let line = b"{\"id\": 1, \"inputs\": {\"a\": [[1, 2, 3]], \"b\": [[0.5, 1.5]]}}\n";
    child.stdin.take().unwrap().write_all(line).unwrap();
    let piped = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(piped.code, Some(0), "{}\n{}", piped.stdout, piped.stderr);
    assert_eq!(piped.records[0]["outputs"]["probs"]["shape"], serde_json::json!([1, 4]), "{}", piped.stdout);
    let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
    assert_eq!(export_json(&entry)["check"], "export", "{}", export_json(&entry));
    assert!(!entry.join("frozen-check.npz").exists());
}

/// Saves `victim.keras` (`x` [?, 2] → Dense `out`, linear) in `dir`, a
/// later checkpoint of it (`victim_later.keras`: other weights),
/// `cousin.keras` (the same layers with a `relu`, its own weights) and
/// `attacker.keras`: the victim's `config.json` for isorun's zip reader,
/// then an entry named `config.json\0x` holding the cousin's config for
/// Keras (Python's zipfile cuts the name at the NUL and lets the later
/// entry win), and the cousin's weights. Returns the victim's
/// `model.predict` on `[[1, 2]]` and the attacker's.
fn victim_and_attacker(python: &Path, dir: &Path) -> (Vec<f64>, Vec<f64>) {
    let script = r#"
import json, os, sys, zipfile
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import keras
dir = sys.argv[1]
def model(activation, seed):
    x = keras.Input((2,), name="x")
    y = keras.layers.Dense(3, activation=activation, name="out",
                           kernel_initializer=keras.initializers.RandomNormal(seed=seed),
                           bias_initializer=keras.initializers.Constant(-1.0))(x)
    return keras.Model(x, y, name="m")
victim, attacker = model("linear", 1), model("relu", 2)
victim.save(os.path.join(dir, "victim.keras"))
attacker.save(os.path.join(dir, "own.keras"))
# A later checkpoint of the victim: its config, other weights.
later = model("linear", 1)
later.set_weights([w * 2 + 0.5 for w in victim.get_weights()])
later.save(os.path.join(dir, "victim_later.keras"))
with zipfile.ZipFile(os.path.join(dir, "victim.keras")) as v:
    victim_config = v.read("config.json")
placeholder = "config.jsonZx"  # as long as config.json\0x: renamed in the bytes below
with zipfile.ZipFile(os.path.join(dir, "own.keras")) as own, \
        zipfile.ZipFile(os.path.join(dir, "attacker.zip"), "w") as out:
    out.writestr("metadata.json", own.read("metadata.json"))
    out.writestr("config.json", victim_config)
    out.writestr(placeholder, own.read("config.json"))
    out.writestr("model.weights.h5", own.read("model.weights.h5"))
data = open(os.path.join(dir, "attacker.zip"), "rb").read()
assert data.count(placeholder.encode()) == 2
open(os.path.join(dir, "attacker.keras"), "wb").write(data.replace(placeholder.encode(), b"config.json\0x"))
os.rename(os.path.join(dir, "own.keras"), os.path.join(dir, "cousin.keras"))
os.remove(os.path.join(dir, "attacker.zip"))
# What Keras itself makes of the attacker's file: its own relu model.
loaded = keras.models.load_model(os.path.join(dir, "attacker.keras"), compile=False)
assert loaded.get_layer("out").activation.__name__ == "relu"
x = np.array([[1.0, 2.0]], np.float32)
print(json.dumps([victim.predict(x, verbose=0)[0].tolist(), attacker.predict(x, verbose=0)[0].tolist()]))
"#;
    let made = Command::new(python).args(["-c", script]).arg(dir).stdin(Stdio::null()).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let stdout = String::from_utf8_lossy(&made.stdout);
    let [victim, attacker]: [Vec<f64>; 2] = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (victim, attacker)
}

fn assert_close(got: &serde_json::Value, expected: &[f64], what: &str) {
    let got: Vec<f64> = got.as_array().unwrap_or_else(|| panic!("{what}: {got}"))[0]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: {got}"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), expected.len(), "{what}: {got:?} != {expected:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= 1e-5, "{what}: {got:?} != {expected:?}");
    }
}

/// A `.keras` file cannot give another file its graph: the attacker's
/// archive shows isorun's zip reader the victim's config and Keras its own
/// (an entry named `config.json\0x`). The victim runs its own model, in a
/// graph of its own, and a later run of the victim alone from the cache
/// gives the same; the attacker's archive is refused, naming the entry.
#[test]
fn a_keras_archive_cannot_lend_its_graph_to_another_file_through_an_ambiguous_entry_name() {
    let Some(python) = python("a_keras_archive_cannot_lend_its_graph_to_another_file_through_an_ambiguous_entry_name")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (victim, attacker) = victim_and_attacker(&python, tmp.path());
    assert!(victim.iter().zip(&attacker).any(|(v, a)| (v - a).abs() > 1e-3), "{victim:?} {attacker:?}");
    let cache = tmp.path().join("cache");
    let (attacker_file, victim_file) = (tmp.path().join("attacker.keras"), tmp.path().join("victim.keras"));
    let args = [
        attacker_file.to_str().unwrap(),
        victim_file.to_str().unwrap(),
        "--input",
        "x=@[[1,2]]",
        "--values",
        "-j",
        "1",
    ];
    let ran = keras_run(&python, &cache, &args);
    let record = ran.record("victim.keras");
    assert_eq!(record["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    assert_ne!(record["export"]["graph"], "shared", "{record}");
    assert_close(&record["outputs"]["out"]["values"], &victim, "the victim's outputs");
    let refused = ran.record("attacker.keras");
    assert_eq!(refused["status"], "error", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("attacker.keras") && message.contains(r#""config.json\0x""#), "{message}");
    // The victim alone, from the cache: its own outputs still.
    let again = keras_run(&python, &cache, &[victim_file.to_str().unwrap(), "--input", "x=@[[1,2]]", "--values"]);
    let record = again.record("victim.keras");
    assert_eq!(record["status"], "ok", "{}\n{}", again.stdout, again.stderr);
    assert_eq!(record["export"]["cached"], true, "{record}");
    assert_close(&record["outputs"]["out"]["values"], &victim, "the victim's outputs from the cache");
}

/// The supervisor's grouping only proposes which files share a trace: the
/// export process, asked to share one graph among the victim, its cousin
/// (another activation, weights laid out the same) and a later checkpoint
/// of the victim, shares it with the checkpoint only, since the cousin's
/// config, as Keras reads it, is not the traced file's.
#[test]
fn the_export_process_shares_a_trace_only_with_files_whose_config_as_keras_reads_it_matches() {
    let Some(python) =
        python("the_export_process_shares_a_trace_only_with_files_whose_config_as_keras_reads_it_matches")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    victim_and_attacker(&python, tmp.path());
    let files = ["victim.keras", "cousin.keras", "victim_later.keras"];
    let (done, stdout, stderr) = export_in_one_process(&python, tmp.path(), &files);
    assert_eq!(done.len(), files.len(), "{stdout}\n{stderr}");
    let graphs: Vec<&str> = done.iter().map(|d| d["graph"].as_str().unwrap_or("failed")).collect();
    assert_eq!(graphs, ["traced", "traced", "shared"], "{stdout}\n{stderr}");
    assert!(
        stderr.contains("cousin.keras: exported in full: its config, as Keras reads it, is not the traced file's"),
        "{stderr}"
    );
}

/// An entry a vulnerable isorun left in the cache (another file's graph
/// under the victim's key: the key of a file's bytes and the toolchain's
/// versions, as it was made before the export script was part of it) is
/// not taken for the victim: the key now holds the export script's digest,
/// so the victim is exported again and runs its own model.
#[test]
fn an_entry_made_by_another_export_script_is_not_taken_from_the_cache() {
    let Some(python) = python("an_entry_made_by_another_export_script_is_not_taken_from_the_cache") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (victim, _) = victim_and_attacker(&python, tmp.path());
    let cache = tmp.path().join("cache");
    let cousin = tmp.path().join("cousin.keras");
    let ran = keras_run(&python, &cache, &[cousin.to_str().unwrap(), "--input", "x=@[[1,2]]", "--values"]);
    let cousin_outputs = ran.record("cousin.keras")["outputs"]["out"]["values"].clone();
    let [entry] = entries(&cache).try_into().unwrap_or_else(|e| panic!("one entry, got {e:?}"));
    // The victim's key as it was made before: SHA-256 of the file's bytes,
    // Keras's, TensorFlow's and tf_keras's versions, each and then the
    // unsafe flag after a NUL; its first 32 hex digits.
    let about = export_json(&entry);
    let script = r#"
import hashlib, sys
file, keras, tf, tf_keras = sys.argv[1:5]
h = hashlib.sha256()
for part in [hashlib.sha256(open(file, "rb").read()).hexdigest(), keras, tf, tf_keras]:
    h.update(part.encode() + b"\0")
h.update(b"\0")
print(h.hexdigest()[:32])
"#;
    let version = |name: &str| about[name].as_str().unwrap_or("-").to_string();
    let old_key = Command::new(&python)
        .args(["-c", script])
        .arg(tmp.path().join("victim.keras"))
        .args([version("keras"), version("tensorflow"), version("tf_keras")])
        .output()
        .unwrap();
    assert!(old_key.status.success(), "{}", String::from_utf8_lossy(&old_key.stderr));
    let old_key = String::from_utf8(old_key.stdout).unwrap().trim().to_string();
    crate::util::copy_dir(&entry, &cache.join(&old_key));
    let victim_file = tmp.path().join("victim.keras");
    let ran = keras_run(&python, &cache, &[victim_file.to_str().unwrap(), "--input", "x=@[[1,2]]", "--values"]);
    let record = ran.record("victim.keras");
    assert_eq!(record["status"], "ok", "{}\n{}", ran.stdout, ran.stderr);
    assert_ne!(record["outputs"]["out"]["values"], cousin_outputs, "the cousin's graph was taken: {record}");
    assert_eq!(record["export"]["cached"], false, "{record}");
    assert_close(&record["outputs"]["out"]["values"], &victim, "the victim's outputs");
}

/// Four `.keras` files built in one Python session in `dir` (so Keras
/// names their layers on: `dense`, `dense_1`, ... then `dense_2`,
/// `dense_3`, ...): `a` and `b`, one architecture (input `x` [4], two
/// hidden layers with automatic names, output layer `out`) with other
/// weights; `c`, the same but one activation `tanh`; `d`, the same but its
/// output layer's name automatic too. Returns each file's `model.predict`
/// on `[[1, 2, 3, 4]]` and its output's name.
fn built_separately(python: &Path, dir: &Path) -> std::collections::BTreeMap<String, (String, Vec<f64>)> {
    let script = r#"
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import keras
dir = sys.argv[1]
x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
made = {}
for file, seed, activation, out in [("a", 1, "relu", "out"), ("b", 2, "relu", "out"),
                                    ("c", 3, "tanh", "out"), ("d", 4, "relu", None)]:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), name="x")
    h = keras.layers.Dense(6, activation="relu", bias_initializer="random_normal")(inputs)
    h = keras.layers.Dense(5, activation=activation, bias_initializer="random_normal")(h)
    y = keras.layers.Dense(3, name=out, bias_initializer="random_normal")(h)
    model = keras.Model(inputs, y)
    model.save(os.path.join(dir, f"{file}.keras"))
    made[f"{file}.keras"] = [model.output_names[0], model.predict(x, verbose=0)[0].tolist()]
assert made["a.keras"][0] == made["b.keras"][0] == "out" and made["d.keras"][0] != "out", made
print(json.dumps(made))
"#;
    let made = Command::new(python).args(["-c", script]).arg(dir).stdin(Stdio::null()).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let stdout = String::from_utf8_lossy(&made.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// Models of one architecture built separately share one trace as one
/// training run's checkpoints do (issue 44 §1): Keras's automatic names of
/// their hidden layers differ, but a `.keras` archive's weights are bound
/// by position and class, so `b` gets only its weights written beside `a`'s
/// graph, and each gives its own `model.predict`. A file whose architecture
/// differs in an activation (`c`) or whose output's name differs (`d`: the
/// signature speaks it) is exported on its own, under its own names.
#[test]
fn models_of_one_architecture_built_separately_share_one_trace_and_each_gives_its_own_predict() {
    let Some(python) =
        python("models_of_one_architecture_built_separately_share_one_trace_and_each_gives_its_own_predict")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let made = built_separately(&python, &models);
    let cache = tmp.path().join("cache");
    let args = [models.to_str().unwrap(), "--input", "x=@[[1,2,3,4]]", "--values", "-j", "1"];
    let ran = keras_run(&python, &cache, &args);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let graph = |id: &str| ran.record(id)["export"]["graph"].as_str().unwrap_or("none").to_string();
    let mut pair = [graph("a.keras"), graph("b.keras")];
    pair.sort();
    assert_eq!(pair, ["shared", "traced"], "{}", ran.stdout);
    for id in ["c.keras", "d.keras"] {
        assert_ne!(graph(id), "shared", "{}", ran.stdout);
    }
    for (id, (output, predicted)) in &made {
        let record = ran.record(id);
        assert_eq!(record["status"], "ok", "{record}");
        assert_close(&record["outputs"][output]["values"], predicted, &format!("{id}'s outputs"));
    }
    // a and b have other weights: b does not run a's.
    let (a, b) = (&made["a.keras"].1, &made["b.keras"].1);
    assert!(a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-3), "{a:?} {b:?}");
}

/// The export process, asked to share one graph among all four files of
/// [`built_separately`], shares it with `b` only: `c`'s config (another
/// activation) and `d`'s (another output name), as Keras reads them, are
/// not `a`'s whatever the layers' automatic names.
#[test]
fn the_export_process_shares_a_trace_across_automatic_names_only_where_the_rest_matches() {
    let Some(python) = python("the_export_process_shares_a_trace_across_automatic_names_only_where_the_rest_matches")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    built_separately(&python, tmp.path());
    let files = ["a.keras", "b.keras", "c.keras", "d.keras"];
    let (done, stdout, stderr) = export_in_one_process(&python, tmp.path(), &files);
    assert_eq!(done.len(), files.len(), "{stdout}\n{stderr}");
    let graphs: Vec<&str> = done.iter().map(|d| d["graph"].as_str().unwrap_or("failed")).collect();
    // c is traced with the archive (d, later, was proposed the same graph); d, last, is frozen.
    assert_eq!(graphs, ["traced", "shared", "traced", "frozen"], "{stdout}\n{stderr}");
    for file in ["c.keras", "d.keras"] {
        let said = format!("{file}: exported in full: its config, as Keras reads it, is not the traced file's");
        assert!(stderr.contains(&said), "{stderr}");
    }
    assert_eq!(done[1]["outputs"], serde_json::json!(["out"]), "{stdout}");
}

/// Runs the export script itself (one process, as the export stage starts
/// it) on `files` in `dir`, each proposed the same graph, frozen and checked
/// here; returns its `done` answers, stdout and stderr.
fn export_in_one_process(python: &Path, dir: &Path, files: &[&str]) -> (Vec<serde_json::Value>, String, String) {
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src/keras/keras_export.py"))
            .unwrap();
    let jobs: Vec<serde_json::Value> = files
        .iter()
        .enumerate()
        .map(|(i, file)| {
            std::fs::create_dir(dir.join(format!("stage{i}"))).unwrap();
            serde_json::json!({"file": dir.join(file), "out": dir.join(format!("stage{i}/saved_model")),
                "graph": "one-proposed-architecture", "freeze": true, "check": "here"})
        })
        .collect();
    let request = serde_json::json!({"modules": [], "unsafe": false, "jobs": jobs});
    let mut child = Command::new(python)
        .args(["-c", &script])
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(format!("{request}\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let done = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|answer| answer.get("done").is_some())
        .collect();
    (done, stdout, stderr)
}
