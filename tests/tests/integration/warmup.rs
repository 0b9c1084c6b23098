//! `isorun run --warmup-inputs` on TF Serving exports made by
//! `scripts/make_warmup_fixtures.py` with the `tensorflow-serving-api`
//! protos: every request runs and its outputs equal what TensorFlow
//! computed (`tests/fixtures/warmup/expected.json`); a model without the
//! file, or with a corrupt or hostile one, is that model's error naming the
//! file and the record's offset, and the other models still run.

use crate::util::{copy_dir, fixtures, isorun, run, supervisor_peak_mib, Ran};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

const WARMUP_FILE: &str = "assets.extra/tf_serving_warmup_requests";

fn warmup_dir() -> PathBuf {
    fixtures().join("warmup")
}

fn model(name: &str) -> PathBuf {
    warmup_dir().join("models").join(name)
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(warmup_dir().join("expected.json")).unwrap()).unwrap()
}

fn warmup_run(models: &[&Path], extra: &[&str]) -> Ran {
    let mut command = isorun();
    command.args(["run", "--json", "--warmup-inputs", "-j", "2"]).args(models).args(extra);
    run(&mut command)
}

/// Numbers equal to float32 precision, nested lists alike.
fn assert_close(got: &Value, want: &Value, what: &str) {
    match (got, want) {
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{what}: {got} vs {want}");
            for (g, w) in g.iter().zip(w) {
                assert_close(g, w, what);
            }
        }
        _ => {
            let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{what}: {g} vs {want}");
        }
    }
}

/// The byte offset of the second record of a TFRecord file.
fn second_record(bytes: &[u8]) -> usize {
    12 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 4
}

/// A copy of the predict export whose warm-up file is `bytes`.
fn predict_with(root: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let dir = root.join(name);
    copy_dir(&model("predict"), &dir);
    std::fs::write(dir.join(WARMUP_FILE), bytes).unwrap();
    dir
}

#[test]
fn every_warm_up_request_runs_and_its_outputs_equal_tensorflow_s() {
    let ran = warmup_run(&[&warmup_dir().join("models")], &["--values"]);
    assert_eq!(ran.code, Some(1), "plain has no warm-up file: {}", ran.stderr);
    let expected = expected();
    for (id, examples) in [("predict", 6), ("classify", 5)] {
        let record = ran.record(id);
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["warmup"]["requests"], 3, "{record}");
        assert_eq!(record["warmup"]["file"], WARMUP_FILE);
        assert_eq!(record["examples"], examples, "{record}");
        let requests = record["requests"].as_array().unwrap();
        let wanted = expected[id].as_array().unwrap();
        assert_eq!(requests.len(), wanted.len());
        for (i, (got, want)) in requests.iter().zip(wanted).enumerate() {
            assert_eq!(got["kind"], want["kind"], "{id} request {i}");
            assert_eq!(got["signature"], want["signature"], "{id} request {i}");
            let (outputs, want_outputs) = (got["outputs"].as_object().unwrap(), want["outputs"].as_object().unwrap());
            assert_eq!(outputs.keys().collect::<Vec<_>>(), want_outputs.keys().collect::<Vec<_>>());
            for (name, w) in want_outputs {
                assert_eq!(outputs[name]["dtype"], w["dtype"], "{id} request {i} {name}");
                assert_eq!(outputs[name]["shape"], w["shape"], "{id} request {i} {name}");
                assert_close(&outputs[name]["values"], &w["values"], &format!("{id} request {i} {name}"));
            }
        }
    }
    // The float64 request of `double` was cast, as --inputs would be.
    assert_eq!(ran.record("predict")["requests"][2]["cast"]["x"], "float64→float32");
    let plain = ran.record("plain");
    assert_eq!(plain["status"], "error");
    assert_eq!(plain["error"]["kind"], "dataset");
    let message = plain["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "no TF Serving warm-up requests: the SavedModel has no assets.extra/tf_serving_warmup_requests \
         (--warmup-inputs)"
    );
    assert!(plain.get("worker_id").is_none(), "decided before any worker: {plain}");
}

#[test]
fn warmup_limit_runs_only_the_first_requests_and_output_dir_keeps_each_one() {
    let out = tempfile::tempdir().unwrap();
    let ran = warmup_run(&[&model("predict")], &["--warmup-limit", "2", "--output-dir", out.path().to_str().unwrap()]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let record = ran.record("predict");
    assert_eq!(record["warmup"]["requests"], 2, "{record}");
    assert_eq!(record["requests"].as_array().unwrap().len(), 2);
    assert!(record["requests"][0]["outputs"]["y"].get("values").is_none(), "no --values: {record}");
    let y1 = isorun_tensors::npy::read_npy_file(&out.path().join("predict/1/y.npy")).unwrap();
    assert_eq!(y1.shape, [1, 2]);
    assert!(out.path().join("predict/0/y.npy").is_file());
    assert!(!out.path().join("predict/2").exists(), "the third request is past the limit");
}

#[test]
fn a_corrupt_or_hostile_warm_up_file_is_that_model_s_error_naming_file_and_offset() {
    let root = tempfile::tempdir().unwrap();
    let good = std::fs::read(model("predict").join(WARMUP_FILE)).unwrap();
    let second = second_record(&good);
    let truncated = predict_with(root.path(), "truncated", &good[..second + 20]);
    let mut flipped = good.clone();
    flipped[second + 14] ^= 0x40;
    let bad_crc = predict_with(root.path(), "bad_crc", &flipped);
    let hostile = predict_with(root.path(), "hostile", &std::fs::read(warmup_dir().join("hostile_shape")).unwrap());
    let classify_on_predict =
        predict_with(root.path(), "classify_on_predict", &std::fs::read(model("classify").join(WARMUP_FILE)).unwrap());
    copy_dir(&model("predict"), &root.path().join("good"));
    let ran = warmup_run(&[root.path()], &[]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(ran.record("good")["status"], "ok");
    let error = |id: &str| {
        let record = ran.record(id);
        assert_eq!(record["status"], "error", "{record}");
        assert!(record.get("worker_id").is_none(), "no worker started for {id}: {record}");
        (
            record["error"]["kind"].as_str().unwrap().to_string(),
            record["error"]["message"].as_str().unwrap().to_string(),
        )
    };
    let file = |dir: &Path| dir.join(WARMUP_FILE).display().to_string();
    let (kind, message) = error("truncated");
    assert_eq!(kind, "dataset");
    assert!(
        message.starts_with(&format!("{}: record at byte {second}: truncated record", file(&truncated))),
        "{message}"
    );
    let (_, message) = error("bad_crc");
    assert_eq!(message, format!("{}: record at byte {second}: data CRC32C mismatch (corrupt record)", file(&bad_crc)));
    // A shape of 2^40 float32 elements with one value: refused by its size, not allocated.
    let (_, message) = error("hostile");
    let refused = format!(
        "{}: record 0 at byte 0: input 'x': shape [1048576, 1048576] makes 4398046511104 bytes, over the ",
        file(&hostile)
    );
    assert!(message.starts_with(&refused), "{message}");
    assert!(message.contains(" left of the record's budget of "), "{message}");
    // Examples for a signature that takes a float tensor: a mismatch, found before any worker.
    let (kind, message) = error("classify_on_predict");
    assert_eq!(kind, "input_mismatch");
    assert_eq!(
        message,
        format!(
            "{}: request 0 (record at byte 0): a classify request gives serialized tf.Examples, for a signature with \
             one string input; signature 'serving_default' takes x (float32, [?, 4])",
            file(&classify_on_predict)
        )
    );
}

#[test]
fn warmup_inputs_with_inputs_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = crate::util::write_input(dir.path());
    let mut command = isorun();
    command.args(["run", "--warmup-inputs", "--input"]).arg(format!("x={}", inputs.display())).arg(model("predict"));
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("'--warmup-inputs' cannot be used with '--input <NAME=PATH>'"), "{}", ran.stderr);
    assert!(ran.records.is_empty());
    let ran = run(isorun().args(["run", "--warmup-limit", "1"]).arg(model("predict")));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--warmup-inputs"), "{}", ran.stderr);
}

/// CRC-32C (Castagnoli), bit by bit.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

/// A TFRecord file of one record, its CRCs masked as TensorFlow writes them.
fn tfrecord(data: &[u8]) -> Vec<u8> {
    let masked = |bytes: &[u8]| {
        let crc = crc32c(bytes);
        crc.rotate_right(15).wrapping_add(0xa282_ead8).to_le_bytes()
    };
    let len = (data.len() as u64).to_le_bytes();
    [&len[..], &masked(&len), data, &masked(data)].concat()
}

/// A protobuf field of wire type 2 (its tag, length and bytes).
fn delimited(tag: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(tag << 3 | 2, &mut out);
    varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

/// A protobuf base-128 varint.
fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A `PredictionLog` (encoded by hand, as `tensorflow_serving/apis`
/// defines it) of one predict request whose `count` inputs each claim
/// shape `[len]` of float32 with a single `float_val`.
fn claiming_predict_log(count: usize, len: u64) -> Vec<u8> {
    let mut dim = vec![0x08];
    varint(len, &mut dim);
    // TensorProto: dtype 1 (float32), tensor_shape { dim { size } }, float_val [1.0].
    let tensor = [vec![0x08, 0x01], delimited(2, &delimited(2, &dim)), delimited(5, &1.0f32.to_le_bytes())].concat();
    let inputs: Vec<u8> = (0..count)
        .flat_map(|i| delimited(2, &[delimited(1, format!("input_{i:02}").as_bytes()), delimited(2, &tensor)].concat()))
        .collect();
    // PredictionLog { predict_log (6) { request (1) { inputs (2) } } }.
    delimited(6, &delimited(1, &inputs))
}

#[test]
fn a_warm_up_record_claiming_gigabytes_from_a_few_bytes_is_refused_within_its_budget() {
    // 3 KB: 100 inputs of [16777216] float32 (64 MiB each, 6.4 GiB together) from one value each.
    let root = tempfile::tempdir().unwrap();
    let file = tfrecord(&claiming_predict_log(100, 1 << 24));
    assert!(file.len() < 4096, "{}", file.len());
    let hostile = predict_with(root.path(), "hostile_inputs", &file);
    let mut command = isorun();
    command.args(["run", "--json", "--summary", "--warmup-inputs"]).arg(&hostile);
    // Data segment at most 2 GiB: a supervisor that believed the file aborts here, not the machine.
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("hostile_inputs");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    assert!(record.get("worker_id").is_none(), "refused before any worker: {record}");
    let message = record["error"]["message"].as_str().unwrap();
    let refused = format!(
        "{}: record 0 at byte 0: input 'input_00': shape [16777216] makes 67108864 bytes, over the ",
        hostile.join(WARMUP_FILE).display()
    );
    assert!(message.starts_with(&refused), "{message}");
    assert!(message.contains(" left of the record's budget of "), "{message}");
    // The allocation bound for a 3 KB file is 64 MiB; the supervisor's whole peak stays under it.
    let peak_mib = supervisor_peak_mib(&ran);
    eprintln!("supervisor peak {peak_mib} MiB for a {}-byte warm-up file", file.len());
    assert!(peak_mib < 64.0, "the supervisor peaked at {peak_mib} MiB for a {}-byte warm-up file", file.len());
}
