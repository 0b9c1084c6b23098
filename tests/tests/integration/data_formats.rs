//! `isorun eval --data` on Parquet written by pandas and Arrow written by
//! Hugging Face `datasets` (`scripts/make_table_fixtures.py`), compressed as
//! pandas and pyarrow compress them by default (lz4 Feather) or on request
//! (zstd Feather; lz4, brotli, zstd, gzip Parquet): the same rows
//! as the TFRecord fixture give the metrics scikit-learn computed for it
//! (`tests/fixtures/eval/expected.json`), and a column that does not fit, a
//! missing column or a corrupt file is an error naming the file, the column
//! and the row.

use crate::util::eval_fixtures::{self, case_flags, dir as eval_dir, model};
use crate::util::{fixtures, isorun, run, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn table(name: &str) -> PathBuf {
    eval_dir().join("data").join("tables").join(name)
}

fn case(name: &str) -> Value {
    let text = std::fs::read_to_string(eval_dir().join("expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    expected["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
}

fn eval(model_name: &str, data: &Path, label: &str, args: &[String]) -> Ran {
    eval_fixtures::eval(&[model(model_name)], data, label, args)
}

fn assert_metrics(got: &Value, expected: &Value, what: &str) {
    for (name, want) in expected.as_object().unwrap() {
        let value = got[name].as_f64().unwrap_or_else(|| panic!("{what}: no metric {name} in {got}"));
        let want = want.as_f64().unwrap();
        assert!((value - want).abs() <= 1e-6 * want.abs().max(1e-12), "{what}: {name} is {value}, expected {want}");
    }
}

#[test]
fn parquet_from_pandas_and_arrow_from_datasets_give_the_tfrecord_s_metrics() {
    let sources = [table("data.parquet"), table("hf"), table("hf/data-00000-of-00001.arrow"), table("data.feather")];
    for name in ["binary", "binary_weighted", "binary_sliced", "multiclass", "regression_weighted"] {
        let case = case(name);
        let id = case["model"].as_str().unwrap();
        for source in &sources {
            let what = format!("{name} on {}", source.display());
            // A batch size that cuts row groups and record batches.
            let mut flags = case_flags(&case);
            flags.extend(["--batch-size".to_string(), "128".to_string()]);
            let ran = eval(id, source, case["label"].as_str().unwrap(), &flags);
            assert_eq!(ran.code, Some(0), "{what}: {}\n{}", ran.stdout, ran.stderr);
            let record = ran.record(id);
            assert_eq!(record["status"], "ok", "{what}: {record}");
            assert_eq!(record["examples"], 1000, "{what}: {record}");
            assert_metrics(&record["metrics"], &case["metrics"], &what);
            for (feature, values) in case["slices"].as_object().unwrap() {
                for (value, metrics) in values.as_object().unwrap() {
                    let slice = &record["slices"][feature][value];
                    assert_metrics(slice, metrics, &format!("{what}: slice {feature}={value}"));
                }
            }
        }
    }
}

#[test]
fn compressed_feather_and_parquet_as_pandas_writes_them_give_the_uncompressed_file_s_metrics() {
    // pandas' to_feather() (lz4, its default), write_feather(compression="zstd"),
    // and to_parquet(compression=...) for each codec pyarrow offers.
    let sources = ["lz4.feather", "zstd.feather", "lz4.parquet", "brotli.parquet", "zstd.parquet", "gzip.parquet"];
    for name in ["binary", "multiclass", "regression_weighted"] {
        let case = case(name);
        let id = case["model"].as_str().unwrap();
        for source in sources {
            let what = format!("{name} on {source}");
            let mut flags = case_flags(&case);
            flags.extend(["--batch-size".to_string(), "128".to_string()]);
            let ran = eval(id, &table(source), case["label"].as_str().unwrap(), &flags);
            assert_eq!(ran.code, Some(0), "{what}: {}\n{}", ran.stdout, ran.stderr);
            let record = ran.record(id);
            assert_eq!(record["status"], "ok", "{what}: {record}");
            assert_eq!(record["examples"], 1000, "{what}: {record}");
            assert_metrics(&record["metrics"], &case["metrics"], &what);
        }
    }
}

#[test]
fn a_data_shard_of_a_parquet_file_reads_its_row_groups() {
    // 4 row groups: shard 0/2 reads groups 0 and 1 (600 rows), 1/2 the rest.
    let mut flags = vec!["--metric".to_string(), "accuracy".into(), "--data-shard".into()];
    for (shard, rows) in [("0/2", 600), ("1/2", 400)] {
        flags.push(shard.into());
        let ran = eval("binary", &table("data.parquet"), "label_bin", &flags);
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        assert_eq!(ran.record("binary")["examples"], rows, "{shard}");
        flags.pop();
    }
}

/// The message of the one model's error record.
fn model_error(ran: &Ran) -> String {
    let record = ran.record("binary");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    record["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn columns_that_do_not_fit_name_the_file_column_and_row() {
    // A string column for a float input: refused from the schema, before
    // any batch (the model's error: another model's signature may take it).
    let ran = eval("binary", &table("wrong_type.parquet"), "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let message = model_error(&ran);
    assert!(message.contains("wrong_type.parquet: column 'x': a string column cannot feed input x"), "{message}");
    assert!(ran.record("binary").get("batches").is_none(), "no batch was read: {}", ran.stdout);
    // Lists of unequal length in one batch, and a null label: the model's
    // dataset error, met mid-stream, naming the row.
    let small = ["--batch-size".to_string(), "4".to_string()];
    let ran = eval("binary", &table("ragged.parquet"), "label_bin", &small);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let message = model_error(&ran);
    assert!(
        message.contains("ragged.parquet: column 'x': row 6") && message.contains("a list of 3 values"),
        "{message}"
    );
    let ran = eval("binary", &table("null_label.parquet"), "label_bin", &small);
    let message = model_error(&ran);
    assert!(message.contains("null_label.parquet: column 'label_bin': row 4") && message.contains("null"), "{message}");
    // A missing column lists the columns there are.
    for source in [table("data.parquet"), table("hf")] {
        let ran = eval("binary", &source, "label", &[]);
        assert_eq!(ran.code, Some(2), "{}", ran.stderr);
        assert!(ran.stderr.contains("no label 'label'"), "{}", ran.stderr);
        assert!(ran.stderr.contains("label_bin (int64)") && ran.stderr.contains("x (float32 ["), "{}", ran.stderr);
    }
}

#[test]
fn a_truncated_or_corrupt_file_is_an_error_naming_it_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, source) in [("cut.parquet", table("data.parquet")), ("cut.arrow", table("hf/data-00000-of-00001.arrow"))]
    {
        let bytes = std::fs::read(&source).unwrap();
        let path = dir.path().join(name);
        // Cut: the footer (Parquet) or the end-of-stream marker (Arrow) is gone.
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let ran = eval("binary", &path, "label_bin", &[]);
        assert_eq!(ran.code, Some(2), "{name}: {}\n{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains(name) && ran.stderr.contains("truncated?"), "{name}: {}", ran.stderr);
        // Bytes flipped in the middle (inside the data): an error or, where
        // the format cannot tell (no checksums), other values; never a crash.
        let mut flipped = bytes.clone();
        for at in (bytes.len() / 3..bytes.len() / 2).step_by(97) {
            flipped[at] ^= 0xa5;
        }
        let path = dir.path().join(format!("flipped-{name}"));
        std::fs::write(&path, &flipped).unwrap();
        let ran = eval("binary", &path, "label_bin", &[]);
        assert!(matches!(ran.code, Some(0..=2)), "{name}: {:?}\n{}", ran.code, ran.stderr);
        if ran.code != Some(0) {
            let text = format!("{}{}", ran.stdout, ran.stderr);
            assert!(text.contains(&format!("flipped-{name}")), "{name}: {text}");
        }
    }
}

/// Rows of `x` (what the echo model returns: a probability) and a label:
/// `dog` (class 1) or `cat` (class 0), as `labels` names them.
const PETS: [(f64, bool); 6] = [(0.9, true), (0.2, false), (0.8, true), (0.6, false), (0.3, true), (0.1, false)];

/// The rows as CSV and as JSON Lines, labels written by `label`.
fn pets(dir: &Path, name: &str, label: impl Fn(usize, bool) -> String) -> [PathBuf; 2] {
    let mut csv = String::from("x,y\n");
    let mut jsonl = String::new();
    for (i, (x, dog)) in PETS.iter().enumerate() {
        let y = label(i, *dog);
        csv.push_str(&format!("{x},{y}\n"));
        let y = y.parse::<i64>().map_or(format!("\"{y}\""), |n| n.to_string());
        jsonl.push_str(&format!("{{\"x\": [{x}], \"y\": {y}}}\n"));
    }
    let paths = [dir.join(format!("{name}.csv")), dir.join(format!("{name}.jsonl"))];
    std::fs::write(&paths[0], csv).unwrap();
    std::fs::write(&paths[1], jsonl).unwrap();
    paths
}

fn eval_echo(data: &Path, args: &[&str]) -> Ran {
    run(isorun()
        .arg("eval")
        .arg(model("echo"))
        .arg("--data")
        .arg(data)
        .args(["--label", "y", "-j", "1", "--json", "--metric", "accuracy", "--metric", "auc", "--metric", "log_loss"])
        .args(args))
}

#[test]
fn string_labels_named_by_label_classes_score_as_their_class_indices_do() {
    let dir = tempfile::tempdir().unwrap();
    let numbers = pets(dir.path(), "numbers", |_, dog| u8::from(dog).to_string());
    let names = pets(dir.path(), "names", |_, dog| if dog { "dog" } else { "cat" }.to_string());
    for (numbers, names) in numbers.iter().zip(&names) {
        let want = eval_echo(numbers, &[]);
        assert_eq!(want.code, Some(0), "{}", want.stderr);
        let got = eval_echo(names, &["--label-classes", "cat,dog"]);
        assert_eq!(got.code, Some(0), "{}: {}\n{}", names.display(), got.stdout, got.stderr);
        let (want, got) = (want.record("echo"), got.record("echo"));
        assert_eq!(got["examples"], 6, "{got}");
        assert_eq!(got["metrics"]["accuracy"].as_f64(), Some(4.0 / 6.0), "{got}");
        assert_eq!(got["metrics"], want["metrics"], "{}", names.display());
        // The other order makes cat the positive class.
        let swapped = eval_echo(names, &["--label-classes", "dog,cat"]);
        assert_eq!(swapped.record("echo")["metrics"]["accuracy"].as_f64(), Some(2.0 / 6.0), "{}", swapped.stdout);
    }
}

#[test]
fn a_string_label_without_label_classes_says_how_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let names = pets(dir.path(), "names", |_, dog| if dog { "dog" } else { "cat" }.to_string());
    for path in &names {
        let ran = eval_echo(path, &[]);
        assert_eq!(ran.code, Some(2), "{}: {}\n{}", path.display(), ran.stdout, ran.stderr);
        assert!(ran.records.is_empty(), "nothing run: {}", ran.stdout);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(
            ran.stderr.contains(name)
                && ran.stderr.contains("labels are numbers, not")
                && ran.stderr.contains("the first rows hold 'dog', 'cat'")
                && ran.stderr.contains("--label-classes (e.g. --label-classes dog,cat)"),
            "{}",
            ran.stderr
        );
    }
}

#[test]
fn a_label_that_is_not_one_of_the_label_classes_names_the_file_row_value_and_classes() {
    let dir = tempfile::tempdir().unwrap();
    let fish = pets(dir.path(), "fish", |i, dog| match (i, dog) {
        (4, _) => "fish".to_string(),
        (_, true) => "dog".to_string(),
        _ => "cat".to_string(),
    });
    for path in &fish {
        let ran = eval_echo(path, &["--label-classes", "cat,dog", "--batch-size", "2"]);
        assert_eq!(ran.code, Some(1), "{}: {}\n{}", path.display(), ran.stdout, ran.stderr);
        let record = ran.record("echo");
        assert_eq!(record["error"]["kind"], "dataset", "{record}");
        let message = record["error"]["message"].as_str().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(
            message.contains(name)
                && message.contains("example 4 (0-based in the dataset; record 4 of this file): feature 'y'")
                && message.contains("'fish' is not one of --label-classes: 'cat', 'dog'"),
            "{message}"
        );
    }
    // Classes for a numeric label, or named twice: usage errors.
    let numbers = pets(dir.path(), "numbers", |_, dog| u8::from(dog).to_string());
    let ran = eval_echo(&numbers[0], &["--label-classes", "cat,dog"]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--label-classes names the classes of a string label"), "{}", ran.stderr);
    let ran = eval_echo(&fish[0], &["--label-classes", "cat,dog,cat"]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("'cat' is named twice (classes 0 and 2)"), "{}", ran.stderr);
}

/// The record was decided in the supervisor: no worker (and no export).
fn assert_no_worker(record: &Value) {
    for key in ["worker_start", "worker_id", "peak_rss_bytes", "load_ms", "export"] {
        assert!(record.get(key).is_none(), "{key} in a record decided before any worker: {record}");
    }
}

/// `iris.keras` with the config of a Keras 3 `Sequential` model, whose
/// input Keras names `input_layer` whatever the data calls it.
fn sequential_keras(dir: &Path) -> PathBuf {
    use std::io::{Read, Write};
    let config = serde_json::json!({
        "module": "keras", "class_name": "Sequential", "registered_name": null,
        "config": {
            "name": "sequential", "trainable": true,
            "layers": [
                {"module": "keras.layers", "class_name": "InputLayer", "registered_name": null,
                 "config": {"batch_shape": [null, 4], "dtype": "float32", "sparse": false, "name": "input_layer"}},
                {"module": "keras.layers", "class_name": "Dense", "registered_name": null,
                 "config": {"name": "dense", "trainable": true, "units": 1, "activation": "sigmoid", "use_bias": true}}
            ],
            "build_input_shape": [null, 4]
        }
    });
    let iris = std::fs::File::open(fixtures().join("keras/iris.keras")).unwrap();
    let mut iris = zip::ZipArchive::new(iris).unwrap();
    let path = dir.join("seq.keras");
    let mut out = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..iris.len() {
        let mut entry = iris.by_index(i).unwrap();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if entry.name() == "config.json" {
            bytes = serde_json::to_vec(&config).unwrap();
        }
        out.start_file(entry.name(), stored).unwrap();
        out.write_all(&bytes).unwrap();
    }
    out.finish().unwrap();
    path
}

#[test]
fn an_input_the_data_lacks_is_decided_before_any_worker_with_the_rename_to_give() {
    // A Keras Sequential model's input_layer, from the file itself: not
    // exported, no worker (no Python needed), the column to rename named.
    let dir = tempfile::tempdir().unwrap();
    let seq = sequential_keras(dir.path());
    let ran = run(isorun().arg("eval").arg(&seq).args(["--data"]).arg(table("data.parquet")).args([
        "--label",
        "label_bin",
        "-j",
        "1",
        "--json",
    ]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("seq.keras");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("signature input 'input_layer' has no feature or array 'input_layer'")
            && message.contains("give --feature input_layer=NAME to feed it from one (e.g. --feature input_layer=x,"),
        "{message}"
    );
    assert_no_worker(record);
    // A SavedModel's signature, read in the supervisor: the same, before any
    // worker. Two columns could feed x: neither is chosen, the rename is named.
    let renamed = dir.path().join("renamed.csv");
    std::fs::write(&renamed, "p,q,y\n0.9,0.1,1\n0.2,0.3,0\n").unwrap();
    let ran = run(isorun()
        .arg("eval")
        .arg(model("echo"))
        .arg("--data")
        .arg(&renamed)
        .args(["--label", "y", "-j", "1", "--json"]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("echo");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("renamed.csv: signature input 'x' has no feature or array 'x'"), "{message}");
    assert!(message.contains("(e.g. --feature x=p, which nothing else uses)"), "{message}");
    assert_no_worker(record);
    assert!(!ran.stderr.contains("is fed from column"), "{}", ran.stderr);
    // And the rename given, it runs.
    let ran = run(isorun().arg("eval").arg(model("echo")).arg("--data").arg(&renamed).args([
        "--label",
        "y",
        "-j",
        "1",
        "--json",
        "--feature",
        "x=p",
        "--metric",
        "accuracy",
    ]));
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.record("echo")["metrics"]["accuracy"].as_f64(), Some(1.0), "{}", ran.stdout);
}

/// An `.npz` (stored) of float32 `p` of shape `[2, width]` and int64 `y`.
fn p_and_y_npz(dir: &Path, width: usize) -> PathBuf {
    use std::io::Write;
    let npy = |descr: &str, shape: &str, data: Vec<u8>| {
        crate::util::npy_bytes(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"), &data)
    };
    // Row 0 above the threshold, row 1 below: as the labels.
    let p: Vec<u8> = (0..2 * width).flat_map(|i| if i < width { 0.9f32 } else { 0.2 }.to_le_bytes()).collect();
    let y: Vec<u8> = [1i64, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = dir.join(format!("p{width}.npz"));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("p.npy", stored).unwrap();
    zip.write_all(&npy("<f4", &format!("(2, {width})"), p)).unwrap();
    zip.start_file("y.npy", stored).unwrap();
    zip.write_all(&npy("<i8", "(2,)", y)).unwrap();
    zip.finish().unwrap();
    path
}

#[test]
fn the_one_input_is_fed_from_the_one_unused_column_that_fits_it_and_said() {
    let dir = tempfile::tempdir().unwrap();
    // The echo model's x ([?, 1]) from p, in a CSV, JSON Lines and an npz.
    let csv = dir.path().join("p.csv");
    std::fs::write(&csv, "p,y\n0.9,1\n0.2,0\n").unwrap();
    let jsonl = dir.path().join("p.jsonl");
    std::fs::write(&jsonl, "{\"p\": 0.9, \"y\": 1}\n{\"p\": 0.2, \"y\": 0}\n").unwrap();
    for data in [csv, jsonl, p_and_y_npz(dir.path(), 1)] {
        let ran = run(isorun()
            .arg("eval")
            .arg(model("echo"))
            .arg("--data")
            .arg(&data)
            .args(["--label", "y", "-j", "1", "--json", "--metric", "accuracy"]));
        assert_eq!(ran.code, Some(0), "{}: {}\n{}", data.display(), ran.stdout, ran.stderr);
        let said: Vec<&str> = ran.stderr.lines().filter(|l| l.contains("is fed from column")).collect();
        assert_eq!(
            said,
            ["isorun: echo: signature input 'x' is fed from column 'p', the one column nothing else uses \
              (--feature x=p says so)"],
            "{}",
            ran.stderr
        );
        let record = ran.record("echo");
        assert_eq!(record["auto_feature"], serde_json::json!({"x": "p"}), "{record}");
        assert_eq!(record["metrics"]["accuracy"].as_f64(), Some(1.0), "{record}");
    }
    // A Keras Sequential model's input_layer ([?, 4]), read from the file:
    // said before any export, whether or not Python is here to export it.
    let seq = sequential_keras(dir.path());
    let eval_seq = |data: &Path| {
        run(isorun().arg("eval").arg(&seq).arg("--data").arg(data).args(["--label", "y", "-j", "1", "--json"]))
    };
    let fits = eval_seq(&p_and_y_npz(dir.path(), 4));
    assert!(
        fits.stderr.contains(
            "isorun: seq.keras: signature input 'input_layer' is fed from column 'p', the one column nothing else uses"
        ),
        "{}",
        fits.stderr
    );
    assert_ne!(fits.record("seq.keras")["error"]["kind"], "dataset", "{}", fits.stdout);
    // A column of 3 values per example does not fit it: not chosen, the rename named, before any worker.
    let narrow = eval_seq(&p_and_y_npz(dir.path(), 3));
    assert!(!narrow.stderr.contains("is fed from column"), "{}", narrow.stderr);
    let record = narrow.record("seq.keras");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    assert!(record["error"]["message"].as_str().unwrap().contains("--feature input_layer=p"), "{record}");
    assert_no_worker(record);
}

#[test]
fn a_signature_the_model_lacks_is_its_signature_not_found_before_any_worker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("x.csv");
    std::fs::write(&data, "x,y\n0.9,1\n0.2,0\n").unwrap();
    let ran = run(isorun().arg("eval").arg(model("echo")).arg("--data").arg(&data).args([
        "--label",
        "y",
        "--signature",
        "classify",
        "-j",
        "1",
        "--json",
    ]));
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("echo");
    assert_eq!(record["error"]["kind"], "signature_not_found", "{record}");
    assert_eq!(record["error"]["message"], "no signature 'classify'; the model has: serving_default", "{record}");
    assert_no_worker(record);
}
