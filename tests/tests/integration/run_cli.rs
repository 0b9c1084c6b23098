//! `isorun run` as a shell user meets it: output formats, JSON inputs from
//! files, stdin and the command line, TF Serving versions, a closed stdout,
//! and the generated completions and man page.

use crate::util::{bin, fake_models, fixtures, isorun, isorun_fault, processes_mentioning, run, write_input, Ran};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn table_format_shows_one_row_per_model_under_a_header() {
    let model = fixtures().join("models/multi_sig");
    let inputs = fixtures().join("expected/multi_sig__add/inputs.npz");
    let ran =
        run(isorun().arg("run").arg(&model).args(["--signature", "add", "--format", "table", "--inputs"]).arg(&inputs));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "a header, a row, a blank line and the totals:\n{}", ran.stdout);
    assert!(lines[3].starts_with("1 model: 1 ok, 0 not ok, in "), "{}", lines[3]);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header[..3], ["model", "status", "time"]);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..2], ["multi_sig", "ok"]);
    assert!(lines[1].ends_with("sum int64[3]"), "{}", lines[1]);
}

#[test]
fn json_inputs_inline_from_files_and_from_stdin() {
    let model = fixtures().join("models/multi_sig");
    // Inline, one per input.
    let ran = run(isorun().arg("run").arg(&model).args([
        "--signature",
        "add",
        "--values",
        "--input",
        "a=@[1, 2]",
        "--input",
        "b=@[30, 40]",
    ]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["outputs"]["sum"]["values"], json!([31, 42]));

    // A .json object of input names.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("inputs.json");
    std::fs::write(&file, r#"{"a": [5], "b": [6]}"#).unwrap();
    let ran = run(isorun().arg("run").arg(&model).args(["--signature", "add", "--values", "--inputs"]).arg(&file));
    assert_eq!(ran.records[0]["outputs"]["sum"]["values"], json!([11]));

    // A bare nested list from stdin, for a one-input signature (x float32 [?, 3]).
    let mut child = isorun()
        .arg("run")
        .arg(&model)
        .args(["--values", "--inputs", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"[[1, 2, 3]]").unwrap();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["outputs"]["y"]["values"], json!([[3.0, 5.0, 7.0]]));
}

#[test]
fn inexact_json_values_are_the_models_error_and_bad_json_is_a_usage_error() {
    let model = fixtures().join("models/multi_sig");
    let ran =
        run(isorun().arg("run").arg(&model).args(["--signature", "add", "--input", "a=@[1.5]", "--input", "b=@[1]"]));
    assert_eq!(ran.code, Some(1));
    assert_eq!(ran.records[0]["status"], "error");
    assert_eq!(ran.records[0]["error"]["kind"], "input_mismatch");
    assert_eq!(ran.records[0]["error"]["message"], "input 'a': element 0 is 1.5, which is not exactly a int64");

    let ran = run(isorun().arg("run").arg(&model).args(["--input", "x=@[[1, 2"]));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stdout.is_empty());
    assert!(ran.stderr.starts_with("isorun: error: --input x=@...: not valid JSON"), "{}", ran.stderr);
}

#[test]
fn latest_version_runs_only_the_highest_version_of_each_model() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("serving"), &["alpha/1", "alpha/2", "alpha/10", "beta/3"]);
    let input = write_input(tmp.path());
    let ran = run(isorun_fault(&[])
        .arg(tmp.path().join("serving"))
        .arg(format!("--input=x={}", input.display()))
        .arg("--latest-version"));
    let ids: Vec<&str> = ran.records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, ["alpha/10", "beta/3"]);
}

#[test]
fn a_closed_stdout_ends_the_run_quietly_with_no_worker_left() {
    let tmp = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("m{i}-fault-slow-300")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    fake_models(&tmp.path().join("models"), &names);
    let input = write_input(tmp.path());
    let marker = format!("marker-{}-pipe", std::process::id());
    let mut child = isorun_fault(&[&marker])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .args(["-j", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"m0-fault-slow-300\""), "{first}");
    drop(stdout); // like `head -1`
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let left: Vec<String> =
        processes_mentioning(&marker).into_iter().filter(|p| p.contains("isorun-fault-worker")).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn completions_and_man_page_are_generated() {
    let ran = run(isorun().args(["completions", "bash"]));
    assert_eq!(ran.code, Some(0));
    assert!(ran.stdout.contains("_isorun()") && ran.stdout.contains("--models-per-worker"));
    let man = std::process::Command::new(bin("isorun")).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(page.starts_with(".ie") || page.contains(".TH isorun"), "{}", &page[..page.len().min(200)]);
}

#[test]
fn batch_size_splits_the_input_and_joins_the_outputs() {
    let model = fixtures().join("models/keras_mlp");
    let inputs = fixtures().join("expected/keras_mlp__serving_default/inputs.npz");
    let whole = run(isorun().arg("run").arg(&model).arg("--inputs").arg(&inputs).args(["--values", "--json"]));
    let split = run(isorun().arg("run").arg(&model).arg("--inputs").arg(&inputs).args([
        "--values",
        "--json",
        "--batch-size",
        "2",
    ]));
    assert_eq!(split.code, Some(0), "{}", split.stderr);
    let probabilities = |ran: &crate::util::Ran| ran.records[0]["outputs"]["probabilities"].clone();
    assert_eq!(probabilities(&split)["shape"], json!([3, 4]));
    let (a, b) = (probabilities(&whole)["values"].clone(), probabilities(&split)["values"].clone());
    for (row_a, row_b) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
        for (x, y) in row_a.as_array().unwrap().iter().zip(row_b.as_array().unwrap()) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1e-6), "{x} vs {y}");
        }
    }
    // An output without a batch dimension cannot be joined: that model's error.
    let mixed = fixtures().join("expected/dynamic__serving_default__3x5/inputs.npz");
    let ran = run(isorun().arg("run").arg(fixtures().join("models/dynamic")).arg("--inputs").arg(&mixed).args([
        "--batch-size",
        "2",
        "--json",
    ]));
    assert_eq!(ran.records[0]["status"], "error");
    assert!(
        ran.records[0]["error"]["message"].as_str().unwrap().contains("output 'shape' cannot be joined"),
        "{}",
        ran.stdout
    );
}

#[test]
fn inputs_dir_gives_each_model_its_own_inputs_before_the_shared_ones() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["own", "shared"]);
    let shared = write_input(tmp.path());
    // The fault worker echoes its inputs, so the dtype of x says which file it got.
    std::fs::create_dir_all(tmp.path().join("per-model/own")).unwrap();
    std::fs::copy(fixtures().join("expected/multi_sig__add/inputs/a.npy"), tmp.path().join("per-model/own/x.npy"))
        .unwrap();
    let ran = run(isorun_fault(&[])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", shared.display()))
        .arg("--inputs-dir")
        .arg(tmp.path().join("per-model"))
        .arg("--json"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.record("own")["outputs"]["x"]["dtype"], "int64", "the model's own file wins");
    assert_eq!(ran.record("shared")["outputs"]["x"]["dtype"], "float32", "the others fall back to the shared input");
}

#[test]
fn load_library_loads_into_the_worker_and_names_a_bad_library() {
    let model = fixtures().join("models/multi_sig");
    let tmp = tempfile::tempdir().unwrap();
    let not_a_library = tmp.path().join("ops.so");
    std::fs::write(&not_a_library, b"not a shared object").unwrap();
    let ran = run(isorun()
        .arg("run")
        .arg(&model)
        .args(["--signature", "add", "--input", "a=@[1]", "--input", "b=@[2]", "--json", "--load-library"])
        .arg(&not_a_library));
    assert_eq!(ran.code, Some(1));
    assert_eq!(ran.records[0]["error"]["kind"], "load_failed");
    assert!(ran.records[0]["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with(&format!("cannot load library {}", not_a_library.display())));
    let ran = run(isorun().arg("run").arg(&model).args(["--json", "--load-library", "/nonexistent/ops.so"]));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("--load-library /nonexistent/ops.so: no such file"), "{}", ran.stderr);
}

#[test]
fn a_large_input_travels_through_shared_memory_intact() {
    // 1.2 MB, far above the 64 KiB from which inputs go through shared
    // memory (which the worker's TF_Tensor borrows without a copy).
    let tmp = tempfile::tempdir().unwrap();
    let values: Vec<f32> = (0..300_000).map(|i| i as f32).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = tmp.path().join("x.npy");
    let tensor = isorun_protocol::Tensor::dense(isorun_protocol::DType::Float32, vec![100_000, 3], bytes);
    isorun_tensors::npy::write_npy(std::fs::File::create(&input).unwrap(), &tensor).unwrap();
    let out = tmp.path().join("out");
    let ran = run(isorun()
        .arg("run")
        .arg(fixtures().join("models/multi_sig"))
        .arg(format!("--input=x={}", input.display()))
        .arg("--output-dir")
        .arg(&out)
        .arg("--json"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let y = isorun_tensors::npy::read_npy_file(&out.join("multi_sig/y.npy")).unwrap();
    assert_eq!(y.shape, [100_000, 3]);
    let isorun_protocol::TensorData::Dense(y) = &y.data else { panic!("dense") };
    for (i, chunk) in y.chunks_exact(4).enumerate() {
        assert_eq!(f32::from_le_bytes(chunk.try_into().unwrap()), values[i] * 2.0 + 1.0, "element {i}");
    }
}

/// How each unit's worker started, in model order.
fn worker_starts(ran: &Ran) -> Vec<String> {
    ran.records.iter().map(|r| r["worker_start"].as_str().unwrap_or("?").to_string()).collect()
}

#[test]
fn spawn_auto_execs_a_lone_model_and_forks_the_rest_after_the_first() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let inputs = examples.join("inputs.npz");
    let spawn = |models: &[PathBuf], mode: Option<&str>| {
        let mut command = isorun();
        command.arg("run").args(models).arg("--inputs").arg(&inputs).args(["-j", "1", "--json"]);
        match mode {
            Some(mode) => command.args(["--spawn", mode]),
            // The default, whatever pass of the tests this is (scripts/test sets ISORUN_SPAWN).
            None => command.env_remove("ISORUN_SPAWN"),
        };
        run(&mut command)
    };
    let one = [examples.join("models/linear_regressor")];
    let three = [examples.join("models")];
    // The default: one model, one slot: exec'd, no zygote on the first result's path.
    assert_eq!(worker_starts(&spawn(&one, None)), ["exec"]);
    // More models than slots: the first exec'd while the zygote starts, the rest forked.
    assert_eq!(worker_starts(&spawn(&three, None)), ["exec", "fork", "fork"]);
    // --spawn still forces either.
    assert_eq!(worker_starts(&spawn(&one, Some("zygote"))), ["fork"]);
    assert_eq!(worker_starts(&spawn(&three, Some("exec"))), ["exec", "exec", "exec"]);
}

/// `DIR/m.npy`, float32 [262144, 1024] of zeros: a header, then a 1 GiB
/// hole (sparse, so cheap to make).
fn sparse_gib_npy(dir: &Path) -> PathBuf {
    let path = dir.join("m.npy");
    let header = crate::util::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (262144, 1024), }", &[]);
    std::fs::write(&path, &header).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(header.len() as u64 + (1 << 30)).unwrap();
    path
}

#[test]
fn a_one_gib_npy_input_goes_to_the_worker_without_passing_through_the_supervisor_s_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_gib_npy(dir.path());
    let ran = run(isorun()
        .arg("run")
        .arg(fixtures().join("models/dynamic"))
        .arg("--input")
        .arg(format!("m={}", path.display()))
        .args(["-j", "1", "--json", "--summary"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["outputs"]["row_sums"]["shape"], json!([262144]), "{record}");
    let peak_mib = crate::util::supervisor_peak_mib(&ran);
    // The worker mapped the whole gibibyte; the supervisor never held it (it peaks at ~8 MiB here).
    assert!(record["peak_rss_bytes"].as_u64().unwrap() > 1 << 30, "{record}");
    assert!(peak_mib < 64.0, "the supervisor peaked at {peak_mib} MiB with a 1 GiB input");
}

#[test]
fn with_batch_size_a_one_gib_npy_input_still_never_passes_through_the_supervisor() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_gib_npy(dir.path());
    // Four chunks of 256 MiB, each a view of the same file; the outputs
    // (row sums, 1 MiB in all) are what the supervisor holds.
    let ran = run(isorun()
        .arg("run")
        .arg(fixtures().join("batch/row_sums"))
        .arg("--input")
        .arg(format!("m={}", path.display()))
        .args(["--batch-size", "65536", "-j", "2", "--json", "--summary"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["outputs"]["row_sums"]["shape"], json!([262144]), "{record}");
    let peak_mib = crate::util::supervisor_peak_mib(&ran);
    assert!(peak_mib < 64.0, "the supervisor peaked at {peak_mib} MiB with a 1 GiB input and --batch-size");
}

#[test]
fn an_npy_input_truncated_mid_run_is_each_later_units_error_not_the_supervisors_death() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    fake_models(&models, &["a-fault-slow-1000", "b-fault-slow-10"]);
    // float32 [1024, 1024]: 4 MiB, data 64-byte aligned, so it goes as a view of the file.
    let path = dir.path().join("x.npy");
    let header = crate::util::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 1024), }", &[]);
    std::fs::write(&path, [header.clone(), vec![0u8; 4 << 20]].concat()).unwrap();
    let log = dir.path().join("served.log");
    let child = isorun_fault(&[&format!("--log={}", log.display())])
        .arg(&models)
        .arg("--input")
        .arg(format!("x={}", path.display()))
        .args(["--batch-size", "400", "-j", "1", "--spares", "0", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the first unit's first chunk runs, the file is rewritten as `np.save` does: truncated first.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("a-fault-slow-1000") {
        assert!(Instant::now() < deadline, "the first unit never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(header.len() as u64).unwrap();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(1), "the supervisor must survive a truncated input: {}\n{}", ran.stdout, ran.stderr);
    // The first unit's worker may touch the chunk it already has (SIGBUS:
    // its crash); its next chunk, and every chunk of the next unit, is an
    // error naming the input, before anything is sent.
    let first = ran.record("a-fault-slow-1000");
    assert!(first["status"] == "error" || first["status"] == "crashed", "{first}");
    let record = ran.record("b-fault-slow-10");
    assert_eq!(record["status"], "error", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("input 'x'") && message.contains("in a file of") && message.contains("did the file change"),
        "{message}"
    );
}

/// `run` runs each model once: a frozen graph (a `saved_model.pb` with no
/// checkpoint, as a frozen Keras export is written) goes without Grappler,
/// whose first-run rewrites of its constant weights cost more than the one
/// run gains; a SavedModel with its variables in a checkpoint keeps it.
#[test]
fn run_turns_grappler_off_for_a_frozen_graph_and_only_there() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    fake_models(&models, &["a-frozen-fault-pid", "b-variables-fault-pid"]);
    let variables = models.join("b-variables-fault-pid/variables");
    std::fs::create_dir_all(&variables).unwrap();
    std::fs::write(variables.join("variables.index"), b"").unwrap();
    let input = write_input(tmp.path());
    let ran = run(isorun_fault(&[]).arg(&models).arg(format!("--input=x={}", input.display())).args([
        "--sandbox",
        "off",
        "--values",
        "--json",
    ]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let skipped = |id: &str| ran.record(id)["outputs"]["request_skip_grappler"]["values"].as_i64();
    assert_eq!(skipped("a-frozen-fault-pid"), Some(1), "{}", ran.stdout);
    assert_eq!(skipped("b-variables-fault-pid"), Some(0), "{}", ran.stdout);
}
