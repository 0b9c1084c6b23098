//! Problems `isorun run` can find before any work starts: each is a usage
//! error (exit 2) with one `isorun: error: ` line on stderr naming the
//! thing that is wrong, nothing on stdout, and nothing written (the
//! `--output-dir` is not even created).

use crate::util::{fake_models, fixtures, isorun, run, write_input, Ran};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

fn keras_model() -> PathBuf {
    fixtures().join("models/keras_mlp")
}

fn keras_inputs() -> PathBuf {
    fixtures().join("expected/keras_mlp__serving_default/inputs.npz")
}

/// Every path under `dir`, to see that a run wrote nothing there.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            paths.extend(tree(&path));
        }
        paths.push(path);
    }
    paths.sort();
    paths
}

/// Runs `isorun run ARGS --output-dir DIR/out` in `dir` and checks what every
/// usage error must do: exit 2, print nothing on stdout, create no output
/// folder and write nothing else in `dir`. Returns what it printed.
fn usage_error(dir: &Path, args: &[OsString]) -> Ran {
    let before = tree(dir);
    let out = dir.join("out");
    let ran = run(isorun().current_dir(dir).arg("run").args(args).arg("--output-dir").arg(&out));
    assert_eq!(ran.code, Some(2), "args {args:?}\nstdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.stdout, "", "args {args:?}: a usage error prints no records");
    assert!(!out.exists(), "args {args:?}: the output folder was created");
    assert_eq!(tree(dir), before, "args {args:?}: files were written");
    ran
}

/// A usage error that isorun itself reports, on a line naming every one of `names`.
fn assert_usage_error(dir: &Path, args: &[OsString], names: &[&str]) {
    let ran = usage_error(dir, args);
    let line = ran.stderr.lines().find(|l| l.starts_with("isorun: error: "));
    let line = line.unwrap_or_else(|| panic!("args {args:?}: no 'isorun: error: ' line in stderr:\n{}", ran.stderr));
    for name in names {
        assert!(line.contains(name), "args {args:?}: the error line should name {name:?}: {line}");
    }
}

/// A usage error from the argument parser itself, on a line naming every one of `names`.
fn assert_parse_error(dir: &Path, args: &[OsString], names: &[&str]) {
    let ran = usage_error(dir, args);
    let line = ran.stderr.lines().find(|l| l.starts_with("error: ") || l.starts_with("isorun: error: "));
    let line = line.unwrap_or_else(|| panic!("args {args:?}: no error line in stderr:\n{}", ran.stderr));
    for name in names {
        assert!(line.contains(name), "args {args:?}: the error line should name {name:?}: {line}");
    }
}

fn args(parts: &[&dyn AsRefOs]) -> Vec<OsString> {
    parts.iter().map(|p| p.os()).collect()
}

/// Strings and paths alike, for argument lists.
trait AsRefOs {
    fn os(&self) -> OsString;
}

impl AsRefOs for &str {
    fn os(&self) -> OsString {
        OsString::from(self)
    }
}

impl AsRefOs for PathBuf {
    fn os(&self) -> OsString {
        self.clone().into_os_string()
    }
}

impl AsRefOs for String {
    fn os(&self) -> OsString {
        OsString::from(self)
    }
}

/// An `.npy` file with this header dictionary and data bytes.
fn write_npy_raw(path: &Path, header: &str, data: &[u8]) {
    std::fs::write(path, crate::util::npy_bytes(header, data)).unwrap();
}

// ---------------------------------------------------------------------------
// Models

#[test]
fn a_model_path_that_does_not_exist_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    assert_usage_error(
        tmp.path(),
        &args(&[&missing, &keras_model(), &"--inputs", &keras_inputs()]),
        &[missing.to_str().unwrap(), "no such file or directory"],
    );
}

#[test]
fn a_folder_without_a_saved_model_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(empty.join("variables")).unwrap();
    std::fs::write(empty.join("variables/readme.txt"), b"not a model").unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &empty, &"--inputs", &keras_inputs()]),
        &[empty.to_str().unwrap(), "no model found"],
    );
}

#[test]
fn a_model_that_is_a_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let file = other.path().join("notes.txt");
    std::fs::write(&file, b"not a model").unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&file, &"--inputs", &keras_inputs()]),
        &[file.to_str().unwrap(), "not a model"],
    );
    // A SavedModel's protobuf file: its folder is suggested.
    let pb = keras_model().join("saved_model.pb");
    assert_usage_error(
        tmp.path(),
        &args(&[&pb, &"--inputs", &keras_inputs()]),
        &[pb.to_str().unwrap(), "give the folder", keras_model().to_str().unwrap()],
    );
}

#[test]
fn two_models_with_the_same_id_are_both_named() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    fake_models(models.path(), &["a/m", "b/m"]);
    let (a, b) = (models.path().join("a/m"), models.path().join("b/m"));
    assert_usage_error(
        tmp.path(),
        &args(&[&a, &b, &"--inputs", &keras_inputs()]),
        &["'m'", a.to_str().unwrap(), b.to_str().unwrap()],
    );
}

// ---------------------------------------------------------------------------
// Inputs

#[test]
fn an_input_file_that_does_not_exist_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    assert_usage_error(tmp.path(), &args(&[&keras_model(), &"--input", &"features=missing.npy"]), &["missing.npy"]);
}

#[test]
fn a_truncated_npy_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    // The header claims 3 x 8 float32 (96 bytes); the file holds 8.
    let path = tmp.path().join("short.npy");
    write_npy_raw(&path, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", &[0; 8]);
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--input", &"features=short.npy"]),
        &["short.npy", "96 bytes", "holds 8 bytes"],
    );
}

#[test]
fn a_file_with_a_wrong_magic_number_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    // A real .npz renamed to .npy: a zip archive, not an array.
    std::fs::copy(keras_inputs(), tmp.path().join("features.npy")).unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--input", &"features=features.npy"]),
        &["features.npy", "wrong magic number"],
    );
}

#[test]
fn an_input_without_a_name_is_a_syntax_error() {
    let tmp = tempfile::tempdir().unwrap();
    write_input(tmp.path());
    assert_usage_error(tmp.path(), &args(&[&keras_model(), &"--input", &"x.npy"]), &["x.npy", "NAME=PATH"]);
    assert_usage_error(tmp.path(), &args(&[&keras_model(), &"--input", &"=x.npy"]), &["=x.npy", "NAME=PATH"]);
}

#[test]
fn an_npz_that_is_not_a_zip_archive_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("inputs.npz"), b"features,1,2,3\n").unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &"inputs.npz"]),
        &["inputs.npz", "not a valid .npz"],
    );
}

#[test]
fn the_same_input_given_twice_names_both_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let x = write_input(tmp.path());
    std::fs::copy(&x, tmp.path().join("y.npy")).unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--input", &"features=x.npy", &"--input", &"features=y.npy"]),
        &["'features'", "x.npy", "y.npy"],
    );
    // Once in an .npz and once on its own.
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &keras_inputs(), &"--input", &"features=y.npy"]),
        &["'features'", keras_inputs().to_str().unwrap(), "y.npy"],
    );
}

#[test]
fn an_object_array_is_refused_with_the_file_named() {
    let tmp = tempfile::tempdir().unwrap();
    write_npy_raw(
        &tmp.path().join("pickled.npy"),
        "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
        &[0; 16],
    );
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--input", &"features=pickled.npy"]),
        &["pickled.npy", "object arrays"],
    );
}

// ---------------------------------------------------------------------------
// Settings

#[test]
fn zero_jobs_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &keras_inputs(), &"--jobs", &"0"]),
        &["--jobs 0"],
    );
}

#[test]
fn a_timeout_that_is_not_positive_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // `--timeout -1` looks like a flag to the parser, which refuses it.
    assert_parse_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &keras_inputs(), &"--timeout", &"-1"]),
        &["-1"],
    );
    for value in ["-1", "0", "NaN"] {
        assert_usage_error(
            tmp.path(),
            &args(&[&keras_model(), &"--inputs", &keras_inputs(), &format!("--timeout={value}")]),
            &["--timeout", value, "positive number of seconds"],
        );
    }
}

#[test]
fn zero_models_per_worker_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    assert_parse_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &keras_inputs(), &"--models-per-worker", &"0"]),
        &["--models-per-worker", "0"],
    );
}

#[test]
fn a_worker_binary_that_does_not_exist_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    assert_usage_error(
        tmp.path(),
        &args(&[&keras_model(), &"--inputs", &keras_inputs(), &"--worker", &"/nonexistent"]),
        &["/nonexistent"],
    );
}
