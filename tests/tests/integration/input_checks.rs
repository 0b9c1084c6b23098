//! Inputs checked against the signature before any worker starts, as a
//! new user's first inputs meet them (issue 26, sections 1 and 2): NumPy's default dtypes are cast to the signature's (and recorded), or
//! refused with what to do; inputs that do not fit a signature the
//! supervisor can read are each model's `input_mismatch` before any worker
//! starts; `run` without inputs for a signature that needs some is a usage
//! error listing them.

use crate::util::{copy_dir, fixtures, isorun, isorun_fault, npy_bytes, run};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

fn linear() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models/linear_regressor")
}

fn header(descr: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let dims = if shape.len() == 1 { format!("{},", dims[0]) } else { dims.join(", ") };
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}")
}

fn f64_npy(shape: &[usize], values: impl Fn(usize) -> f64) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| values(i).to_le_bytes()).collect();
    npy_bytes(&header("<f8", shape), &data)
}

fn f32_npy(shape: &[usize], values: impl Fn(usize) -> f64) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| (values(i) as f32).to_le_bytes()).collect();
    npy_bytes(&header("<f4", shape), &data)
}

fn i64_npy(values: &[i64]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy_bytes(&header("<i8", &[values.len()]), &data)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// An `.npz` (stored, as `np.savez` writes it) of these `.npy` entries.
fn npz(dir: &Path, name: &str, entries: &[(&str, Vec<u8>)]) -> PathBuf {
    let path = dir.join(name);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (entry, bytes) in entries {
        zip.start_file(format!("{entry}.npy"), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    path
}

fn input(name: &str, path: &Path) -> String {
    format!("{name}={}", path.display())
}

/// The record was decided in the supervisor: no worker, no time spent.
fn assert_no_worker(record: &Value) {
    for key in ["worker_start", "worker_id", "peak_rss_bytes", "load_ms"] {
        assert!(record.get(key).is_none(), "{key} in a record decided before any worker: {record}");
    }
    // No worker fields says no worker ran; the wall time is only checked to
    // be there and sane (a tight bound failed on a loaded machine: 225 ms
    // for a record decided in the supervisor, 0 ms alone).
    assert!(record["wall_ms"].as_u64().unwrap() < 10_000, "{record}");
}

#[test]
fn a_float64_npy_is_cast_to_float32_said_in_the_record_and_at_v() {
    let tmp = tempfile::tempdir().unwrap();
    let x64 = write(tmp.path(), "x64.npy", &f64_npy(&[2, 4], |i| i as f64 * 0.5));
    let x32 = write(tmp.path(), "x32.npy", &f32_npy(&[2, 4], |i| i as f64 * 0.5));
    let cast = run(isorun().arg("run").arg(linear()).args(["--values", "-v", "--input"]).arg(input("x", &x64)));
    assert_eq!(cast.code, Some(0), "{}", cast.stderr);
    let record = &cast.records[0];
    assert_eq!(record["status"], "ok", "{record}");
    assert_eq!(record["cast"], json!({"x": "float64→float32"}), "{record}");
    assert!(cast.stderr.contains("input 'x': cast float64→float32"), "-v should say so: {}", cast.stderr);
    let plain = run(isorun().arg("run").arg(linear()).args(["--values", "--input"]).arg(input("x", &x32)));
    assert_eq!(plain.records[0]["outputs"], record["outputs"], "a cast input gives the float32 input's outputs");
    assert!(plain.records[0].get("cast").is_none(), "{}", plain.records[0]);
}

#[test]
fn a_large_float64_input_is_cast_into_new_memory_and_the_users_file_is_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    // 40000 × 4 float64 = 1.25 MiB: a view of the file in shared memory, cast into a new region.
    let bytes = f64_npy(&[40000, 4], |i| (i % 7) as f64);
    let x64 = write(tmp.path(), "x64.npy", &bytes);
    let ran = run(isorun().arg("run").arg(linear()).args(["--batch-size", "15000", "--input"]).arg(input("x", &x64)));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["cast"], json!({"x": "float64→float32"}));
    assert_eq!(ran.records[0]["outputs"]["y"]["shape"], json!([40000, 1]));
    assert_eq!(std::fs::read(&x64).unwrap(), bytes, "the user's file must not change");
}

#[test]
fn float64_in_an_npz_is_cast_and_json_floats_need_no_cast() {
    let tmp = tempfile::tempdir().unwrap();
    let file = npz(tmp.path(), "batch.npz", &[("x", f64_npy(&[1, 4], |_| 1.0))]);
    let ran = run(isorun().arg("run").arg(linear()).arg("--inputs").arg(&file));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["cast"], json!({"x": "float64→float32"}));
    // JSON has no dtype: its numbers are made float32 at once (no cast to record).
    let ran = run(isorun().arg("run").arg(linear()).args(["--input", "x=@[[1.5, 2, 3, 4]]"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.records[0].get("cast").is_none(), "{}", ran.records[0]);
}

#[test]
fn strict_dtypes_refuses_a_cast_before_any_worker_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let x64 = write(tmp.path(), "x64.npy", &f64_npy(&[1, 4], |_| 1.0));
    let ran = run(isorun().arg("run").arg(linear()).args(["--strict-dtypes", "--input"]).arg(input("x", &x64)));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["error"]["kind"], "input_mismatch", "{record}");
    assert_eq!(
        record["error"]["message"],
        "input 'x': expected dtype float32, given float64 (--strict-dtypes: no casts); convert it first: \
         x.astype(np.float32)"
    );
    assert_no_worker(record);
}

/// The `dtypes` fixture's inputs, each of its own dtype, with `i32` given as int64 `values`.
fn dtypes_inputs(dir: &Path, i32_values: &[i64]) -> Vec<String> {
    let one = |descr: &str, bytes: &[u8]| npy_bytes(&header(descr, &[2]), bytes);
    let files = [
        ("f16", one("<f2", &[0, 0x3c, 0, 0x40])),
        ("f64", one("<f8", &[1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())),
        ("i16", one("<i2", &[1, 0, 2, 0])),
        ("i32", i64_npy(i32_values)),
        ("i8", one("|i1", &[1, 2])),
        ("u16", one("<u2", &[1, 0, 2, 0])),
        ("u8", one("|u1", &[1, 2])),
    ];
    files.iter().map(|(name, bytes)| input(name, &write(dir, &format!("{name}.npy"), bytes))).collect()
}

fn run_dtypes(args: &[String]) -> crate::util::Ran {
    let mut command = isorun();
    command.arg("run").arg(fixtures().join("models/dtypes")).arg("--values");
    for arg in args {
        command.arg("--input").arg(arg);
    }
    run(&mut command)
}

#[test]
fn int64_becomes_int32_where_every_value_fits_and_is_refused_with_the_astype_hint_where_not() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_dtypes(&dtypes_inputs(tmp.path(), &[7, -3]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records[0]["cast"], json!({"i32": "int64→int32"}));
    assert_eq!(ran.records[0]["outputs"]["i32_out"]["dtype"], "int32");

    let ran = run_dtypes(&dtypes_inputs(tmp.path(), &[7, 3_000_000_000]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["error"]["kind"], "input_mismatch", "{record}");
    assert_eq!(
        record["error"]["message"],
        "input 'i32': expected dtype int32, given int64 whose element 1 (3000000000) does not fit in int32; \
         give values that fit (i32.astype(np.int32) would wrap them)"
    );
    assert_no_worker(record);
}

#[test]
fn a_float_into_an_integer_input_is_refused_with_the_astype_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.npy", &f64_npy(&[2], |i| i as f64));
    let b = write(tmp.path(), "b.npy", &i64_npy(&[1, 2]));
    let ran = run(isorun()
        .arg("run")
        .arg(fixtures().join("models/multi_sig"))
        .args(["--signature", "add", "--input"])
        .arg(input("a", &a))
        .arg("--input")
        .arg(input("b", &b)));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(
        ran.records[0]["error"]["message"],
        "input 'a': expected dtype int64, given float64; convert it first: a.astype(np.int64)"
    );
    assert_no_worker(&ran.records[0]);
}

/// Three copies of the linear model.
fn three_models(root: &Path) -> PathBuf {
    let models = root.join("models");
    for name in ["a", "b", "c"] {
        copy_dir(&linear(), &models.join(name));
    }
    models
}

#[test]
fn a_wrong_name_dtype_or_rank_is_every_models_input_mismatch_with_no_worker_started() {
    let tmp = tempfile::tempdir().unwrap();
    let models = three_models(tmp.path());
    let wrong_name = input("features", &write(tmp.path(), "f.npy", &f32_npy(&[1, 4], |_| 1.0)));
    let wrong_dtype = input("x", &write(tmp.path(), "s.npy", &npy_bytes(&header("|b1", &[1, 4]), &[1, 0, 1, 0])));
    let wrong_rank = input("x", &write(tmp.path(), "r.npy", &f32_npy(&[4], |_| 1.0)));
    let cases = [
        (wrong_name, "unknown input 'features'; signature 'serving_default' takes: x (float32, [?, 4])"),
        (wrong_dtype, "input 'x': expected dtype float32, given bool; convert it first: x.astype(np.float32)"),
        (wrong_rank, "input 'x': expected shape [?, 4] (rank 2), given [4] (rank 1)"),
    ];
    for (given, message) in cases {
        let journal = tmp.path().join("journal.jsonl");
        let _ = std::fs::remove_file(&journal);
        let ran = run(isorun()
            .arg("run")
            .arg(&models)
            .arg("--journal")
            .arg(&journal)
            .args(["--json", "--input"])
            .arg(&given));
        assert_eq!(ran.code, Some(1), "{}", ran.stderr);
        assert_eq!(ran.records.len(), 3, "{}", ran.stdout);
        for record in &ran.records {
            assert_eq!(record["error"]["kind"], "input_mismatch", "{record}");
            assert_eq!(record["error"]["message"], message, "{record}");
            assert_no_worker(record);
        }
        // Journaled as any record, so `--resume` takes them back.
        assert_eq!(std::fs::read_to_string(&journal).unwrap().lines().count(), 3);
        let resumed = run(isorun()
            .arg("run")
            .arg(&models)
            .arg("--journal")
            .arg(&journal)
            .args(["--resume", "--json", "--input"])
            .arg(&given));
        assert_eq!(resumed.code, Some(1), "{}", resumed.stderr);
        assert_eq!(resumed.records.len(), 3, "{}", resumed.stdout);
    }
}

#[test]
fn a_mismatch_starts_no_worker_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let models = three_models(tmp.path());
    let log = tmp.path().join("worker.log");
    let log_arg = format!("--log={}", log.display());
    let wrong = input("x", &write(tmp.path(), "r.npy", &f32_npy(&[4], |_| 1.0)));
    let ran = run(isorun_fault(&[&log_arg]).arg(&models).args(["--json", "--input"]).arg(&wrong));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 3);
    assert!(!log.exists() || std::fs::read_to_string(&log).unwrap().is_empty(), "a worker ran a unit");
    // The same models with inputs that fit do reach the (fault) workers.
    let right = input("x", &write(tmp.path(), "x.npy", &f32_npy(&[1, 4], |_| 1.0)));
    let ran = run(isorun_fault(&[&log_arg]).arg(&models).args(["--json", "--input"]).arg(&right));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3);
}

#[test]
fn a_tf1_signature_with_reference_dtypes_is_checked_before_any_worker() {
    let ran = run(isorun().arg("run").arg(fixtures().join("tf1/counter")).args([
        "--signature",
        "incr_counter_by",
        "--input",
        "step=@1.0",
    ]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(
        ran.records[0]["error"]["message"],
        "unknown input 'step'; signature 'incr_counter_by' takes: delta (float32, [])"
    );
    assert_no_worker(&ran.records[0]);
}

#[test]
fn run_without_inputs_for_a_signature_that_needs_some_exits_2_listing_them() {
    let tmp = tempfile::tempdir().unwrap();
    let models = three_models(tmp.path());
    let ran = run(isorun().arg("run").arg(&models));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    assert_eq!(
        ran.stderr,
        "isorun: error: no inputs given (--inputs FILE.npz|FILE.json, --input NAME=PATH.npy or --input \
         'NAME=@[[...]]'), and signature 'serving_default' takes some:\n  a: x (float32, [?, 4])\n  \
         b: x (float32, [?, 4])\n  c: x (float32, [?, 4])\n"
    );
    // A signature that takes no inputs still runs without any.
    let ran = run(isorun().arg("run").arg(fixtures().join("tf1/counter")).args(["--signature", "get_counter"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
}

#[test]
fn a_keras_file_is_cast_after_its_export_and_checked_before_any_worker_once_cached() {
    let Some(python) = crate::util::fixtures_python("input_checks keras test") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures().join("keras/iris.keras");
    let cache = tmp.path().join("cache");
    let keras_run = |given: &str| {
        run(isorun().arg("run").arg(&model).arg("--python").arg(&python).arg("--keras-cache").arg(&cache).args([
            "--load-timeout",
            "300",
            "--json",
            "--input",
            given,
        ]))
    };
    let x64 = input("x", &write(tmp.path(), "x64.npy", &f64_npy(&[1, 4], |i| i as f64)));
    let first = keras_run(&x64);
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    assert_eq!(first.records[0]["cast"], json!({"x": "float64→float32"}), "{}", first.records[0]);
    let wrong = input("x", &write(tmp.path(), "r.npy", &f32_npy(&[4], |_| 1.0)));
    let second = keras_run(&wrong);
    assert_eq!(second.code, Some(1), "{}", second.stderr);
    let record = &second.records[0];
    assert_eq!(record["error"]["message"], "input 'x': expected shape [?, 4] (rank 2), given [4] (rank 1)");
    assert_eq!(record["export"]["cached"], true, "{record}");
    assert_no_worker(record);
}

#[test]
fn a_signature_the_models_lack_is_each_models_signature_not_found_with_no_worker_started() {
    // `run --signature classify` on regressors: read from saved_model.pb in
    // the supervisor, as input mismatches are, not by a worker loading each
    // model (0.45 s and 304 MiB each) only to say so.
    let tmp = tempfile::tempdir().unwrap();
    let models = three_models(tmp.path());
    let log = tmp.path().join("worker.log");
    let log_arg = format!("--log={}", log.display());
    let x = input("x", &write(tmp.path(), "x.npy", &f32_npy(&[1, 4], |_| 1.0)));
    let with_inputs = ["--input", x.as_str()];
    for given in [&with_inputs[..], &[]] {
        let ran = run(isorun_fault(&[&log_arg]).arg(&models).args(["--signature", "classify", "--json"]).args(given));
        assert_eq!(ran.code, Some(1), "{given:?}: {}", ran.stderr);
        assert_eq!(ran.records.len(), 3, "{given:?}: {}", ran.stdout);
        for record in &ran.records {
            assert_eq!(record["status"], "error", "{record}");
            assert_eq!(record["error"]["kind"], "signature_not_found", "{record}");
            assert_eq!(record["error"]["message"], "no signature 'classify'; the model has: serving_default");
            assert_no_worker(record);
        }
        assert!(!log.exists() || std::fs::read_to_string(&log).unwrap().is_empty(), "a worker ran a unit");
    }
    // The signature they have reaches the (fault) workers.
    let ran = run(isorun_fault(&[&log_arg]).arg(&models).args(["--json"]).args(with_inputs));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3);
}
