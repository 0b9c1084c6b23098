//! TF1 SavedModels (`tests/fixtures/tf1`), as TF Serving runs them: the
//! counter's signatures return a reference variable (`DT_FLOAT_REF`), which
//! `inspect` names `float32_ref` and `run` fetches as float32, and a signature
//! with a dtype isorun cannot carry refuses that signature only.

use crate::util::{fixtures, isorun, npy_bytes, run, Ran};
use isorun_protocol::{DType, Tensor};
use isorun_tensors::npy::read_npy_file;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The value `counter` was saved with (`scripts/make_fixtures.py`).
const SAVED_VALUE: f32 = 42.0;

fn counter() -> PathBuf {
    fixtures().join("tf1").join("counter")
}

/// `isorun run counter --signature SIGNATURE ARGS --values` with an output folder.
fn run_counter(signature: &str, args: &[OsString], out: &Path) -> Ran {
    run(isorun()
        .arg("run")
        .arg(counter())
        .args(["--signature", signature, "--values", "-j", "1"])
        .args(args)
        .arg("--output-dir")
        .arg(out))
}

fn ok_output(ran: &Ran) -> &Value {
    assert_eq!(ran.code, Some(0), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let record = ran.record("counter");
    assert_eq!(record["status"], "ok", "{record}");
    &record["outputs"]["output"]
}

/// The scalar float32 the run wrote to `OUT/counter/output.npy`.
fn written_scalar(out: &Path) -> f32 {
    let tensor: Tensor = read_npy_file(&out.join("counter").join("output.npy")).unwrap();
    assert_eq!((tensor.dtype, tensor.shape.as_slice()), (DType::Float32, &[][..]), "{tensor:?}");
    let isorun_protocol::TensorData::Dense(bytes) = &tensor.data else { panic!("dense: {tensor:?}") };
    f32::from_le_bytes(bytes.as_slice().try_into().unwrap())
}

/// `delta=PATH` for a scalar float32 `.npy` holding `value`.
fn delta_npy(dir: &Path, value: f32) -> OsString {
    let path = dir.join("delta.npy");
    let bytes = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", &value.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let mut pair = OsString::from("delta=");
    pair.push(&path);
    pair
}

#[test]
fn inspect_names_reference_dtypes_float32_ref() {
    let ran = run(isorun().arg("inspect").arg(counter()).arg("--json"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let json: Value = serde_json::from_str(&ran.stdout).unwrap();
    let signatures = &json["signatures"];
    let scalar = |dtype: &str| json!({"dtype": dtype, "shape": []});
    assert_eq!(signatures["get_counter"]["inputs"], json!({}));
    assert_eq!(signatures["get_counter"]["outputs"]["output"], scalar("float32_ref"));
    assert_eq!(signatures["incr_counter_by"]["inputs"]["delta"], scalar("float32"));
    assert_eq!(signatures["incr_counter_by"]["outputs"]["output"], scalar("float32_ref"));
    assert_eq!(signatures["as_complex"]["outputs"]["output"], scalar("complex64"));

    let text = run(isorun().arg("inspect").arg(counter()));
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout.contains(
            "  signature get_counter (tensorflow/serving/predict)\n    inputs: none\n    \
             outputs:\n      output  float32_ref  []\n"
        ),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("tensorflow dtype"), "every dtype has a name:\n{}", text.stdout);
}

#[test]
fn get_counter_fetches_the_reference_variable_as_float32() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_counter("get_counter", &[], out.path());
    assert_eq!(ok_output(&ran), &json!({"dtype": "float32", "shape": [], "values": SAVED_VALUE}));
    assert_eq!(written_scalar(out.path()), SAVED_VALUE, "the value restored from variables/");
}

#[test]
fn incr_counter_by_adds_a_json_or_npy_delta_to_the_saved_value() {
    let tmp = tempfile::tempdir().unwrap();
    // JSON inputs take their dtype from saved_model.pb in the supervisor;
    // .npy inputs go to the worker as they are: both read the signature.
    for (how, delta) in [("json", OsString::from("delta=@1.5")), ("npy", delta_npy(tmp.path(), 1.5))] {
        let out = tmp.path().join(how);
        let ran = run_counter("incr_counter_by", &["--input".into(), delta], &out);
        assert_eq!(ok_output(&ran), &json!({"dtype": "float32", "shape": [], "values": SAVED_VALUE + 1.5}), "{how}");
        assert_eq!(written_scalar(&out), SAVED_VALUE + 1.5, "{how}");
    }
}

#[test]
fn a_signature_isorun_cannot_carry_refuses_only_itself() {
    let tmp = tempfile::tempdir().unwrap();
    for (how, delta) in [("json", OsString::from("delta=@1.5")), ("npy", delta_npy(tmp.path(), 1.5))] {
        let out = tmp.path().join(how);
        let ran = run_counter("as_complex", &["--input".into(), delta], &out);
        assert_eq!(ran.code, Some(1), "{how}: stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
        let record = ran.record("counter");
        assert_eq!(record["status"], "error", "{how}: {record}");
        assert_eq!(
            record["error"],
            json!({
                "kind": "unsupported_dtype",
                "message": "signature as_complex: output has dtype complex64, which isorun cannot carry",
            }),
            "{how}"
        );
        assert!(!out.join("counter").exists(), "{how}: outputs were written for a refused signature");
    }
}
