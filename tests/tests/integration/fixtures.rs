//! Every fixture signature through `isorun run`, on the real worker, gives
//! the outputs Python TensorFlow gave (`tests/fixtures/expected`), and every
//! way a model can refuse the inputs or fail to load is reported on that
//! model's own record, naming what was wrong, while the rest of the run goes on.

use crate::util::copy_dir;
use crate::util::{fixtures, isorun, run, Ran};
use isorun_protocol::{DType, Tensor, TensorData};
use isorun_tensors::npy::{read_npy_file, write_npy};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// The manifest

/// One output of a case: its name, the dtype isorun reports, the dtype of the
/// expected `.npy` (float32 for bfloat16) and the shape.
struct OutputSpec {
    name: String,
    dtype: String,
    stored_as: String,
    shape: Vec<u64>,
}

/// One case of `tests/fixtures/manifest.json`.
struct Case {
    name: String,
    model: String,
    signature: String,
    inputs: Vec<String>,
    outputs: Vec<OutputSpec>,
    expect_error: Option<Value>,
}

impl Case {
    fn model_dir(&self) -> PathBuf {
        fixtures().join("models").join(&self.model)
    }

    fn expected_dir(&self) -> PathBuf {
        fixtures().join("expected").join(&self.name)
    }

    fn npz(&self) -> PathBuf {
        self.expected_dir().join("inputs.npz")
    }

    fn input_npy(&self, name: &str) -> PathBuf {
        self.expected_dir().join("inputs").join(format!("{name}.npy"))
    }

    fn expected_output(&self, name: &str) -> Tensor {
        let path = self.expected_dir().join("outputs").join(format!("{name}.npy"));
        read_npy_file(&path).unwrap_or_else(|e| panic!("expected output {}: {e}", path.display()))
    }
}

fn manifest() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("read manifest.json");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("manifest.json is JSON");
    let shape = |v: &Value| -> Vec<u64> { v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect() };
    let cases: Vec<Case> = cases
        .iter()
        .map(|c| Case {
            name: c["case"].as_str().unwrap().to_string(),
            model: c["model"].as_str().unwrap().to_string(),
            signature: c["signature"].as_str().unwrap().to_string(),
            inputs: c["inputs"].as_object().unwrap().keys().cloned().collect(),
            outputs: c["outputs"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(name, o)| {
                    let dtype = o["dtype"].as_str().unwrap().to_string();
                    OutputSpec {
                        name: name.clone(),
                        stored_as: o["stored_as"].as_str().unwrap_or(&dtype).to_string(),
                        dtype,
                        shape: shape(&o["shape"]),
                    }
                })
                .collect(),
            expect_error: Some(c["expect_error"].clone()).filter(|e| !e.is_null()),
        })
        .collect();
    assert!(cases.len() >= 10, "manifest.json lists only {} cases", cases.len());
    cases
}

fn case(name: &str) -> Case {
    manifest().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name} in manifest.json"))
}

// ---------------------------------------------------------------------------
// Elements of tensors

const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-7;

fn close(actual: f64, expected: f64) -> bool {
    if actual.is_nan() || expected.is_nan() {
        return actual.is_nan() && expected.is_nan();
    }
    if actual.is_infinite() || expected.is_infinite() {
        return actual == expected;
    }
    (actual - expected).abs() <= ATOL + RTOL * expected.abs()
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f64::from(bits & 0x3ff);
    match exponent {
        0 => sign * fraction * 2f64.powi(-24),
        31 if fraction == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + fraction / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The elements of a float tensor, `None` for other dtypes.
fn floats(tensor: &Tensor) -> Option<Vec<f64>> {
    let TensorData::Dense(bytes) = &tensor.data else { return None };
    Some(match tensor.dtype {
        DType::Float16 => bytes.chunks_exact(2).map(|c| f16_to_f64(u16::from_le_bytes([c[0], c[1]]))).collect(),
        DType::Float32 => bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::Float64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        _ => return None,
    })
}

/// The elements of an integer tensor (`i128` holds them all) or a bool
/// tensor (0 and 1), `None` for other dtypes.
fn integers(tensor: &Tensor) -> Option<Vec<i128>> {
    let TensorData::Dense(bytes) = &tensor.data else { return None };
    macro_rules! ints {
        ($t:ty) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| i128::from(<$t>::from_le_bytes(c.try_into().unwrap())))
                .collect()
        };
    }
    Some(match tensor.dtype {
        DType::Int8 => ints!(i8),
        DType::Int16 => ints!(i16),
        DType::Int32 => ints!(i32),
        DType::Int64 => ints!(i64),
        DType::UInt8 => ints!(u8),
        DType::UInt16 => ints!(u16),
        DType::UInt32 => ints!(u32),
        DType::UInt64 => ints!(u64),
        DType::Bool => bytes.iter().map(|&b| i128::from(b)).collect(),
        _ => return None,
    })
}

fn byte_strings(tensor: &Tensor) -> Option<Vec<Vec<u8>>> {
    match &tensor.data {
        TensorData::Strings(strings) => Some(strings.iter().map(|s| s.to_vec()).collect()),
        _ => None,
    }
}

/// Compares an output file as isorun wrote it with the one Python wrote:
/// floats within tolerance, everything else exactly.
fn compare(what: &str, actual: &Tensor, expected: &Tensor) -> Result<(), String> {
    if actual.dtype != expected.dtype || actual.shape != expected.shape {
        return Err(format!(
            "{what}: {} {:?}, expected {} {:?}",
            actual.dtype, actual.shape, expected.dtype, expected.shape
        ));
    }
    if let (Some(a), Some(e)) = (floats(actual), floats(expected)) {
        if a.len() != e.len() {
            return Err(format!("{what}: {} elements, expected {}", a.len(), e.len()));
        }
        if let Some(i) = (0..a.len()).find(|&i| !close(a[i], e[i])) {
            return Err(format!("{what}: element {i} is {}, expected {} (all: {a:?} vs {e:?})", a[i], e[i]));
        }
        return Ok(());
    }
    if let (Some(a), Some(e)) = (integers(actual), integers(expected)) {
        return if a == e { Ok(()) } else { Err(format!("{what}: {a:?}, expected {e:?}")) };
    }
    if let (Some(a), Some(e)) = (byte_strings(actual), byte_strings(expected)) {
        return if a == e { Ok(()) } else { Err(format!("{what}: {a:?}, expected {e:?}")) };
    }
    Err(format!("{what}: cannot compare {} elements", actual.dtype))
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                text.push('=');
            }
        }
    }
    text
}

/// The elements of nested JSON lists, checking the nesting against `shape`
/// (a scalar is a bare value).
fn flatten<'a>(value: &'a Value, shape: &[u64], out: &mut Vec<&'a Value>) -> Result<(), String> {
    match shape.split_first() {
        None => {
            if value.is_array() {
                return Err(format!("expected a scalar, found {value}"));
            }
            out.push(value);
        }
        Some((&n, rest)) => {
            let items = value.as_array().ok_or_else(|| format!("expected a list of {n}, found {value}"))?;
            if items.len() as u64 != n {
                return Err(format!("expected a list of {n}, found {value}"));
            }
            for item in items {
                flatten(item, rest, out)?;
            }
        }
    }
    Ok(())
}

/// Half the distance between neighbouring values of a float format with
/// `mantissa` stored bits and smallest normal exponent `min_exp`, near `v`.
fn half_ulp(v: f64, mantissa: i32, min_exp: i32) -> f64 {
    let exp = if v == 0.0 { min_exp } else { (v.abs().log2().floor() as i32).max(min_exp) };
    2f64.powi(exp - mantissa - 1)
}

/// A float in JSON: a number, or one of the strings for the values JSON lacks.
fn json_float(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) if s == "NaN" => Some(f64::NAN),
        Value::String(s) if s == "Infinity" => Some(f64::INFINITY),
        Value::String(s) if s == "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Checks `--values` output against the expected tensor: integers, bools and
/// strings exactly (non-UTF-8 strings as `{"base64": ...}`); floats must
/// read back, at the output's own width, to a value close to the expected one.
fn compare_values(what: &str, values: &Value, dtype: &str, expected: &Tensor) -> Result<(), String> {
    let mut flat = Vec::new();
    flatten(values, &expected.shape, &mut flat).map_err(|e| format!("{what}: values {e}"))?;
    let mismatch =
        |i: usize, want: String| format!("{what}: value {i} is {}, expected {want} (all: {values})", flat[i]);
    if let Some(e) = byte_strings(expected) {
        for (i, bytes) in e.iter().enumerate() {
            let want = match std::str::from_utf8(bytes) {
                Ok(s) => Value::String(s.to_string()),
                Err(_) => serde_json::json!({ "base64": base64(bytes) }),
            };
            if *flat[i] != want {
                return Err(mismatch(i, want.to_string()));
            }
        }
    } else if let Some(e) = integers(expected) {
        for (i, &want) in e.iter().enumerate() {
            let ok = if dtype == "bool" {
                *flat[i] == Value::Bool(want != 0)
            } else {
                flat[i].as_i64().map(i128::from).or_else(|| flat[i].as_u64().map(i128::from)) == Some(want)
            };
            if !ok {
                return Err(mismatch(i, want.to_string()));
            }
        }
    } else if let Some(e) = floats(expected) {
        for (i, &want) in e.iter().enumerate() {
            let got = json_float(flat[i]).ok_or_else(|| mismatch(i, want.to_string()))?;
            let ok = match dtype {
                "float32" => close(f64::from(got as f32), want),
                "float64" => close(got, want),
                "float16" => got == want || (got - want).abs() <= half_ulp(want, 10, -14) + RTOL * want.abs(),
                "bfloat16" => got == want || (got - want).abs() <= half_ulp(want, 7, -126) + RTOL * want.abs(),
                other => return Err(format!("{what}: unexpected float dtype {other}")),
            };
            if !ok {
                return Err(mismatch(i, want.to_string()));
            }
        }
    } else {
        return Err(format!("{what}: cannot compare {} values", expected.dtype));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Running cases

/// How a case's inputs are given.
#[derive(Clone, Copy, PartialEq)]
enum Inputs {
    /// `--inputs inputs.npz`
    Npz,
    /// `--input NAME=inputs/NAME.npy`, one per input
    Files,
}

fn run_case(case: &Case, out: &Path, inputs: Inputs, values: bool) -> Ran {
    let mut command = isorun();
    command.arg("run").arg(case.model_dir()).args(["--signature", &case.signature]);
    match inputs {
        Inputs::Npz => {
            command.arg("--inputs").arg(case.npz());
        }
        Inputs::Files => {
            for name in &case.inputs {
                let mut pair = OsString::from(format!("{name}="));
                pair.push(case.input_npy(name));
                command.arg("--input").arg(pair);
            }
        }
    }
    command.arg("--output-dir").arg(out).args(["-j", "1"]);
    if values {
        command.arg("--values");
    }
    run(&mut command)
}

fn sorted_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Checks an ok case: its record, and every output file against Python's.
fn check_ok(case: &Case, ran: &Ran, out: &Path, values: bool) -> Result<(), String> {
    let context = || format!("stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    if ran.code != Some(0) || ran.records.len() != 1 {
        return Err(format!("exit {:?} with {} records, expected 0 and 1\n{}", ran.code, ran.records.len(), context()));
    }
    let record = &ran.records[0];
    if record["model"] != case.model.as_str()
        || record["status"] != "ok"
        || record["path"] != case.model_dir().to_str().unwrap()
        || record.get("error").is_some()
    {
        return Err(format!("record is not an ok record of {}: {record}", case.model));
    }
    let outputs = record["outputs"].as_object().ok_or_else(|| format!("record has no outputs: {record}"))?;
    let mut got: Vec<&str> = outputs.keys().map(String::as_str).collect();
    got.sort();
    let mut want: Vec<&str> = case.outputs.iter().map(|o| o.name.as_str()).collect();
    want.sort();
    if got != want {
        return Err(format!("record has outputs {got:?}, expected {want:?}"));
    }
    let files: Vec<String> = want.iter().map(|n| format!("{n}.npy")).collect();
    let folder = out.join(&case.model);
    if !folder.is_dir() || sorted_names(&folder) != files {
        return Err(format!(
            "{} holds {:?}, expected exactly {files:?}",
            folder.display(),
            folder.is_dir().then(|| sorted_names(&folder))
        ));
    }
    for spec in &case.outputs {
        let what = format!("{}: output '{}'", case.name, spec.name);
        let o = &outputs[&spec.name];
        if o["dtype"] != spec.dtype.as_str() || o["shape"] != serde_json::json!(spec.shape) {
            return Err(format!("{what}: record says {o}, expected dtype {} shape {:?}", spec.dtype, spec.shape));
        }
        if o.get("values").is_some() != values {
            return Err(format!("{what}: record {o} should {}have values", if values { "" } else { "not " }));
        }
        let expected = case.expected_output(&spec.name);
        assert_eq!(
            expected.dtype.name(),
            spec.stored_as,
            "{what}: the expected file's dtype disagrees with the manifest"
        );
        let path = folder.join(format!("{}.npy", spec.name));
        let actual = read_npy_file(&path).map_err(|e| format!("{what}: isorun wrote an unreadable file: {e}"))?;
        compare(&what, &actual, &expected)?;
        if values {
            compare_values(&what, &o["values"], &spec.dtype, &expected)?;
        }
    }
    Ok(())
}

/// Checks a case that must fail: its record names the error the manifest
/// expects, and nothing is written for it.
fn check_error(case: &Case, ran: &Ran, out: &Path, expect: &Value) -> Result<(), String> {
    let record = ran.records.first().ok_or_else(|| format!("no record; stderr:\n{}", ran.stderr))?;
    let error = &record["error"];
    let message = error["message"].as_str().unwrap_or_default();
    let contains = expect["message_contains"].as_str().unwrap();
    if ran.code != Some(1)
        || ran.records.len() != 1
        || record["model"] != case.model.as_str()
        || record["status"] != "error"
        || error["kind"] != expect["kind"]
        || error["code"] != expect["code"]
        || !message.contains(contains)
        || record.get("outputs").is_some()
    {
        return Err(format!(
            "exit {:?}, expected 1 and one error record with kind {}, code {} and a message containing {contains:?}:\n{}",
            ran.code, expect["kind"], expect["code"], ran.stdout
        ));
    }
    if out.join(&case.model).exists() {
        return Err(format!("an output folder was written for a failed model: {:?}", sorted_names(out)));
    }
    Ok(())
}

fn check_case(case: &Case, inputs: Inputs, values: bool) -> Result<(), String> {
    let out = tempfile::tempdir().unwrap();
    let ran = run_case(case, out.path(), inputs, values);
    match &case.expect_error {
        None => check_ok(case, &ran, out.path(), values),
        Some(expect) => check_error(case, &ran, out.path(), expect),
    }
    .map_err(|e| format!("case {}: {e}", case.name))
}

fn check_cases(names: &[&str], inputs: Inputs, values: bool) {
    let failures: Vec<String> = names.iter().filter_map(|name| check_case(&case(name), inputs, values).err()).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), names.len(), failures.join("\n\n"));
}

#[test]
fn every_fixture_case_matches_pythons_outputs() {
    let cases = manifest();
    assert!(cases.iter().any(|c| c.expect_error.is_some()), "the manifest should hold an error case");
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    check_cases(&names, Inputs::Npz, false);
}

#[test]
fn separate_npy_inputs_give_the_same_outputs_as_the_npz() {
    // The mixed signature takes int64, bool, float32 and string inputs (one
    // of them not UTF-8); dtypes takes seven more dtypes.
    check_cases(&["multi_sig__mixed", "dtypes__serving_default", "keras_mlp__serving_default"], Inputs::Files, false);
}

#[test]
fn values_in_the_json_lines_equal_pythons_outputs() {
    let mixed = case("multi_sig__mixed");
    let upper = byte_strings(&mixed.expected_output("upper")).unwrap();
    assert!(
        upper.iter().any(|s| std::str::from_utf8(s).is_err()) && upper.iter().any(|s| std::str::from_utf8(s).is_ok()),
        "multi_sig__mixed's 'upper' should hold UTF-8 and non-UTF-8 strings: {upper:?}"
    );
    check_cases(
        &[
            "multi_sig__add",
            "multi_sig__mixed",
            "dtypes__serving_default",
            "dtypes__bf16",
            "keras_mlp__serving_default",
        ],
        Inputs::Npz,
        true,
    );

    // And exactly as a user reads them: int64 sums and strings, the non-UTF-8 one in base64.
    let out = tempfile::tempdir().unwrap();
    let ran = run_case(&mixed, out.path(), Inputs::Npz, true);
    let expected_upper: Vec<Value> = upper
        .iter()
        .map(|s| match std::str::from_utf8(s) {
            Ok(s) => Value::String(s.into()),
            Err(_) => serde_json::json!({ "base64": base64(s) }),
        })
        .collect();
    assert_eq!(ran.record("multi_sig")["outputs"]["upper"]["values"], Value::Array(expected_upper), "{}", ran.stdout);
    let add = case("multi_sig__add");
    let ran = run_case(&add, out.path(), Inputs::Npz, true);
    let sums: Vec<Value> =
        integers(&add.expected_output("sum")).unwrap().iter().map(|&v| Value::from(v as i64)).collect();
    assert_eq!(ran.record("multi_sig")["outputs"]["sum"]["values"], Value::Array(sums), "{}", ran.stdout);
}

#[test]
fn helpers_decode_what_numpy_writes() {
    assert_eq!(base64(b"\xff\xfeOK"), "//5PSw==");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(f16_to_f64(0x3c00), 1.0);
    assert_eq!(f16_to_f64(0xc100), -2.5);
    assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
    assert!(close(1.0 + 5e-6, 1.0) && !close(1.0 + 5e-5, 1.0) && close(5e-8, 0.0));
}

// ---------------------------------------------------------------------------
// Several models in one run

fn is_saved_model(dir: &Path) -> bool {
    dir.join("saved_model.pb").is_file()
}

#[test]
fn all_fixture_models_in_one_run_report_each_in_sorted_order() {
    let models = fixtures().join("models");
    let mut ids: Vec<String> = sorted_names(&models).into_iter().filter(|n| is_saved_model(&models.join(n))).collect();
    ids.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    assert!(ids.len() >= 3 && ids.iter().any(|i| i == "keras_mlp"), "{ids:?}");
    let keras = case("keras_mlp__serving_default");
    let out = tempfile::tempdir().unwrap();
    let ran = run(isorun()
        .arg("run")
        .arg(&models)
        .args(["--signature", "serving_default"])
        .arg("--inputs")
        .arg(keras.npz())
        .arg("--output-dir")
        .arg(out.path())
        .args(["-j", "3"]));
    let got: Vec<String> = ran.statuses().into_iter().map(|(id, _)| id).collect();
    assert_eq!(got, ids, "records must come out in bytewise-sorted id order\n{}", ran.stdout);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);

    let keras_record = ran.record("keras_mlp");
    assert_eq!(keras_record["status"], "ok", "{keras_record}");
    let actual = read_npy_file(&out.path().join("keras_mlp/probabilities.npy")).unwrap();
    compare("keras_mlp probabilities", &actual, &keras.expected_output("probabilities")).unwrap();

    for id in ids.iter().filter(|i| *i != "keras_mlp") {
        let record = ran.record(id);
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["error"]["kind"], "input_mismatch", "{record}");
        let message = record["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("unknown input 'features'; signature 'serving_default' takes: "),
            "{id}: the message should name the input that does not fit: {message}"
        );
    }
    assert_eq!(sorted_names(out.path()), ["keras_mlp"], "only the ok model has outputs");
}

// ---------------------------------------------------------------------------
// Inputs a model refuses, and models that do not load

fn f32_tensor(shape: Vec<u64>) -> Tensor {
    let n = Tensor::element_count(&shape).unwrap() as usize;
    Tensor::dense(DType::Float32, shape, (0..n).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect())
}

fn i64_tensor(shape: Vec<u64>) -> Tensor {
    let n = Tensor::element_count(&shape).unwrap() as usize;
    Tensor::dense(DType::Int64, shape, (0..n).flat_map(|i| (i as i64).to_le_bytes()).collect())
}

/// Writes `tensor` to `dir/file` and returns `NAME=PATH` for `--input`.
fn input_file(dir: &Path, name: &str, file: &str, tensor: &Tensor) -> OsString {
    let path = dir.join(file);
    let mut writer = std::fs::File::create(&path).unwrap();
    write_npy(&mut writer, tensor).unwrap();
    let mut pair = OsString::from(format!("{name}="));
    pair.push(&path);
    pair
}

/// Runs one fixture model with `args` and an output folder; expects it to
/// fail with `kind` and exactly `message`, exit 1, and write nothing.
fn assert_refused(model: &str, args: &[OsString], kind: &str, message: &str) {
    let out = tempfile::tempdir().unwrap();
    let ran = run(isorun()
        .arg("run")
        .arg(fixtures().join("models").join(model))
        .args(args)
        .arg("--output-dir")
        .arg(out.path().join("out"))
        .args(["-j", "1"]));
    assert_eq!(ran.code, Some(1), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.records.len(), 1, "{}", ran.stdout);
    let record = ran.record(model);
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], kind, "{record}");
    assert_eq!(record["error"]["message"], message, "{record}");
    assert!(record.get("outputs").is_none(), "{record}");
    assert!(!out.path().join("out").join(model).exists(), "outputs were written for a failed model");
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

#[test]
fn an_unknown_input_name_is_named_with_what_the_signature_takes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = os(&["--inputs"]);
    args.push(case("keras_mlp__serving_default").npz().into());
    args.push("--input".into());
    args.push(input_file(tmp.path(), "bogus", "bogus.npy", &f32_tensor(vec![3, 8])));
    assert_refused(
        "keras_mlp",
        &args,
        "input_mismatch",
        "unknown input 'bogus'; signature 'serving_default' takes: features (float32, [?, 8])",
    );
}

#[test]
fn a_missing_input_is_named_with_its_dtype_and_shape() {
    let add = case("multi_sig__add");
    let mut a = OsString::from("a=");
    a.push(add.input_npy("a"));
    let args = vec!["--signature".into(), "add".into(), "--input".into(), a];
    assert_refused(
        "multi_sig",
        &args,
        "input_mismatch",
        "missing input 'b' (int64, [?]); signature 'add' takes: a (int64, [?]), b (int64, [?])",
    );
}

#[test]
fn a_wrong_dtype_names_the_expected_and_the_given() {
    let tmp = tempfile::tempdir().unwrap();
    // int64 into float32 is cast where exact (input_checks.rs); --strict-dtypes refuses it.
    let mut args = vec!["--input".into(), input_file(tmp.path(), "features", "f.npy", &i64_tensor(vec![3, 8]))];
    args.push("--strict-dtypes".into());
    assert_refused(
        "keras_mlp",
        &args,
        "input_mismatch",
        "input 'features': expected dtype float32, given int64 (--strict-dtypes: no casts); convert it first: \
         features.astype(np.float32)",
    );
}

#[test]
fn a_wrong_rank_names_the_expected_and_the_given_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let args = vec!["--input".into(), input_file(tmp.path(), "features", "f.npy", &f32_tensor(vec![8]))];
    assert_refused(
        "keras_mlp",
        &args,
        "input_mismatch",
        "input 'features': expected shape [?, 8] (rank 2), given [8] (rank 1)",
    );
}

#[test]
fn a_wrong_fixed_dimension_names_the_dimension() {
    let tmp = tempfile::tempdir().unwrap();
    let args = vec!["--input".into(), input_file(tmp.path(), "image", "image.npy", &f32_tensor(vec![1, 4, 5, 1]))];
    assert_refused(
        "fixed_shape",
        &args,
        "input_mismatch",
        "input 'image': expected shape [1, 4, 4, 1], given [1, 4, 5, 1] (dimension 2 is 5, expected 4)",
    );
}

#[test]
fn an_unknown_signature_lists_the_models_signatures() {
    let mut args = os(&["--signature", "nope", "--inputs"]);
    args.push(case("multi_sig__add").npz().into());
    assert_refused(
        "multi_sig",
        &args,
        "signature_not_found",
        "no signature 'nope'; the model has: add, mixed, serving_default",
    );
}

#[test]
fn a_corrupt_saved_model_fails_to_load_and_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("broken");
    copy_dir(&fixtures().join("models/keras_mlp"), &broken);
    std::fs::write(broken.join("saved_model.pb"), b"\x0a\xff\xff\xff\xff this is not a SavedModel protocol buffer")
        .unwrap();
    let keras = case("keras_mlp__serving_default");
    let out = tmp.path().join("out");
    let ran = run(isorun()
        .arg("run")
        .arg(&broken)
        .arg(keras.model_dir())
        .arg("--inputs")
        .arg(keras.npz())
        .arg("--output-dir")
        .arg(&out)
        .args(["-j", "1"]));
    assert_eq!(ran.code, Some(1), "a model that does not load is a failed model, not a usage error\n{}", ran.stderr);
    assert_eq!(
        ran.statuses(),
        [("broken".to_string(), "error".to_string()), ("keras_mlp".to_string(), "ok".to_string())],
        "{}",
        ran.stdout
    );
    let record = ran.record("broken");
    assert_eq!(record["error"]["kind"], "load_failed", "{record}");
    assert!(!record["error"]["message"].as_str().unwrap().is_empty(), "{record}");
    assert_eq!(record["path"], broken.to_str().unwrap(), "{record}");
    assert_eq!(sorted_names(&out), ["keras_mlp"]);
}

#[test]
fn a_tag_the_model_lacks_fails_to_load() {
    let keras = case("keras_mlp__serving_default");
    let out = tempfile::tempdir().unwrap();
    let ran = run(isorun()
        .arg("run")
        .arg(keras.model_dir())
        .args(["--tag", "nope", "--inputs"])
        .arg(keras.npz())
        .arg("--output-dir")
        .arg(out.path().join("out"))
        .args(["-j", "1"]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("keras_mlp");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "load_failed", "{record}");
    assert!(record["error"]["message"].as_str().unwrap().contains("nope"), "the message should name the tag: {record}");
    assert!(!out.path().join("out/keras_mlp").exists());
}
