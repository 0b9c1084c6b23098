//! `isorun inspect`, `isorun ls` and `isorun doctor` on the real binary: what
//! users read (text, snapshotted) and what scripts parse (JSON, ids, tabs,
//! exit codes), and the failures each names.

use crate::util::{bin, fake_models, fixtures, isorun, run, Ran};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn model(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// The text with the fixtures folder written as `[fixtures]`, so snapshots
/// do not depend on where the repository is.
fn without_fixtures_path(text: &str) -> String {
    text.replace(&fixtures().display().to_string(), "[fixtures]")
}

/// Runs a command that prints text (not JSON records) to its end.
fn run_text(command: &mut Command) -> Ran {
    text_output(command.output().expect("run isorun"))
}

fn text_output(output: std::process::Output) -> Ran {
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        records: Vec::new(),
    }
}

fn assert_ok(ran: &Ran, what: &str) {
    assert_eq!(ran.code, Some(0), "{what}\nstdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
}

/// `isorun inspect ARGS --json`, parsed; checks it is one line.
fn inspect_json(args: &[&str]) -> Value {
    let ran = run(isorun().arg("inspect").args(args).arg("--json"));
    assert_ok(&ran, &format!("inspect {args:?} --json"));
    assert_eq!(ran.stdout.lines().count(), 1, "JSON output is one line (for jq): {}", ran.stdout);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", ran.stdout))
}

fn keys(object: &Value) -> Vec<&str> {
    object.as_object().unwrap_or_else(|| panic!("not an object: {object}")).keys().map(String::as_str).collect()
}

/// Runs `command` to its end, failing the test (instead of hanging it) if it
/// takes longer than `limit`.
fn run_within(command: &mut Command, limit: Duration) -> Ran {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start isorun");
    let started = Instant::now();
    while child.try_wait().expect("wait for isorun").is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("isorun did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    text_output(child.wait_with_output().expect("collect output"))
}

// ---------------------------------------------------------------------------
// A hand-made saved_model.pb, for what the fixtures do not have: two meta
// graphs, a dtype isorun cannot carry, an unknown rank, no method name.

fn varint(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn field_varint(tag: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(tag << 3, &mut out);
    varint(value, &mut out);
    out
}

fn field_bytes(tag: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint((tag << 3) | 2, &mut out);
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

fn map_entry(tag: u64, key: &str, value: &[u8]) -> Vec<u8> {
    field_bytes(tag, &[field_bytes(1, key.as_bytes()), field_bytes(2, value)].concat())
}

/// `TensorInfo`: dims `None` for an unknown rank; -1 for an unknown size.
fn tensor_info(name: &str, dtype: u64, dims: Option<&[i64]>) -> Vec<u8> {
    let shape: Vec<u8> = match dims {
        None => field_varint(3, 1),
        Some(dims) => dims.iter().flat_map(|&size| field_bytes(2, &field_varint(1, size as u64))).collect(),
    };
    [field_bytes(1, name.as_bytes()), field_varint(2, dtype), field_bytes(3, &shape)].concat()
}

fn signature_def(inputs: &[(&str, Vec<u8>)], outputs: &[(&str, Vec<u8>)], method: &str) -> Vec<u8> {
    let mut out: Vec<u8> = inputs.iter().flat_map(|(key, info)| map_entry(1, key, info)).collect();
    out.extend(outputs.iter().flat_map(|(key, info)| map_entry(2, key, info)));
    if !method.is_empty() {
        out.extend(field_bytes(3, method.as_bytes()));
    }
    out
}

fn meta_graph(tags: &[&str], signatures: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let meta_info: Vec<u8> = tags.iter().flat_map(|tag| field_bytes(4, tag.as_bytes())).collect();
    let mut out = field_bytes(1, &meta_info);
    out.extend(signatures.iter().flat_map(|(key, signature)| map_entry(5, key, signature)));
    out
}

/// A SavedModel folder with two meta graphs: `[serve]` (one float signature)
/// and `[serve, gpu]` (a resource handle of unknown rank, no method name).
fn two_meta_graph_model(dir: &Path) -> PathBuf {
    let predict = "tensorflow/serving/predict";
    let serve = meta_graph(
        &["serve"],
        &[(
            "serving_default",
            signature_def(
                &[("x", tensor_info("serving_default_x:0", 1, Some(&[-1, 2])))],
                &[("y", tensor_info("Identity:0", 1, Some(&[-1])))],
                predict,
            ),
        )],
    );
    let gpu = meta_graph(
        &["serve", "gpu"],
        &[
            (
                "lookup",
                signature_def(
                    &[("handle", tensor_info("lookup_handle:0", 20, None))],
                    &[("count", tensor_info("Identity:0", 9, Some(&[])))],
                    "",
                ),
            ),
            (
                "__saved_model_init_op",
                signature_def(&[], &[("__saved_model_init_op", tensor_info("NoOp", 0, None))], ""),
            ),
        ],
    );
    let saved_model = [field_varint(1, 1), field_bytes(2, &serve), field_bytes(2, &gpu)].concat();
    let model = dir.join("two_graphs");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("saved_model.pb"), saved_model).unwrap();
    model
}

// ---------------------------------------------------------------------------
// isorun inspect

#[test]
fn inspect_shows_every_signature_of_multi_sig_as_text() {
    let ran = run_text(isorun().arg("inspect").arg(model("multi_sig")));
    assert_ok(&ran, "inspect multi_sig");
    assert_eq!(ran.stderr, "");
    assert!(ran.stdout.starts_with(&format!("{}\n", model("multi_sig").display())), "{}", ran.stdout);
    assert!(!ran.stdout.contains("__saved_model_init_op"), "internal signatures only with --all:\n{}", ran.stdout);
    insta::assert_snapshot!("inspect_multi_sig_text", without_fixtures_path(&ran.stdout));
}

#[test]
fn inspect_shows_keras_mlp_as_text() {
    let ran = run_text(isorun().arg("inspect").arg(model("keras_mlp")));
    assert_ok(&ran, "inspect keras_mlp");
    insta::assert_snapshot!("inspect_keras_mlp_text", without_fixtures_path(&ran.stdout));
}

#[test]
fn inspect_all_adds_the_init_op_to_the_text() {
    let ran = run_text(isorun().arg("inspect").arg(model("multi_sig")).arg("--all"));
    assert_ok(&ran, "inspect multi_sig --all");
    let plain = run_text(isorun().arg("inspect").arg(model("multi_sig")));
    assert!(ran.stdout.contains("\n  signature __saved_model_init_op\n"), "{}", ran.stdout);
    let without_init_op: Vec<&str> = ran
        .stdout
        .split_inclusive('\n')
        .scan(false, |in_init_op, line| {
            if line.starts_with("  signature ") {
                *in_init_op = line == "  signature __saved_model_init_op\n";
            }
            Some((!*in_init_op).then_some(line))
        })
        .flatten()
        .collect();
    assert_eq!(without_init_op.concat(), plain.stdout, "--all adds the internal signature and nothing else");
}

#[test]
fn inspect_json_gives_dtypes_shapes_with_null_for_unknown_sizes_and_methods() {
    let json = inspect_json(&[model("multi_sig").to_str().unwrap()]);
    assert_eq!(keys(&json), ["path", "meta_graphs", "signatures"]);
    assert_eq!(json["path"], model("multi_sig").to_str().unwrap());
    assert_eq!(json["meta_graphs"].as_array().unwrap().len(), 1);
    assert_eq!(json["meta_graphs"][0]["tags"], serde_json::json!(["serve"]));
    let signatures = &json["signatures"];
    assert_eq!(signatures, &json["meta_graphs"][0]["signatures"], "top-level signatures are those of [serve]");
    assert_eq!(keys(signatures), ["add", "mixed", "serving_default"], "sorted, no __saved_model_init_op");
    let serving = &signatures["serving_default"];
    assert_eq!(serving["inputs"]["x"], serde_json::json!({"dtype": "float32", "shape": [null, 3]}));
    assert_eq!(serving["outputs"]["y"], serde_json::json!({"dtype": "float32", "shape": [null, 3]}));
    assert_eq!(serving["method"], "tensorflow/serving/predict");
    assert_eq!(signatures["add"]["inputs"]["a"], serde_json::json!({"dtype": "int64", "shape": [null]}));
    let mixed = &signatures["mixed"];
    assert_eq!(keys(&mixed["inputs"]), ["counts", "flags", "floats", "words"]);
    assert_eq!(mixed["inputs"]["words"], serde_json::json!({"dtype": "string", "shape": [2]}));
    assert_eq!(mixed["inputs"]["floats"], serde_json::json!({"dtype": "float32", "shape": [2, 2]}));
    assert_eq!(mixed["outputs"]["total"], serde_json::json!({"dtype": "int64", "shape": []}));

    let keras = inspect_json(&[model("keras_mlp").to_str().unwrap()]);
    assert_eq!(keys(&keras["signatures"]), ["serve", "serving_default"]);
    assert_eq!(
        keras["signatures"]["serving_default"],
        serde_json::json!({
            "inputs": {"features": {"dtype": "float32", "shape": [null, 8]}},
            "outputs": {"probabilities": {"dtype": "float32", "shape": [null, 4]}},
            "method": "tensorflow/serving/predict",
        })
    );
}

#[test]
fn inspect_json_all_includes_the_init_op() {
    let json = inspect_json(&[model("multi_sig").to_str().unwrap(), "--all"]);
    assert_eq!(keys(&json["signatures"]), ["__saved_model_init_op", "add", "mixed", "serving_default"]);
    assert_eq!(keys(&json["meta_graphs"][0]["signatures"]), keys(&json["signatures"]));
    let init_op = &json["signatures"]["__saved_model_init_op"];
    assert_eq!(init_op["inputs"], serde_json::json!({}));
    assert_eq!(init_op["outputs"]["__saved_model_init_op"]["shape"], Value::Null, "unknown rank is null");
    assert!(init_op.get("method").is_none(), "no method name, no key: {init_op}");
}

#[test]
fn inspect_json_without_a_meta_graph_for_the_tags_leaves_out_signatures() {
    let json = inspect_json(&[model("multi_sig").to_str().unwrap(), "--tag", "nope"]);
    assert_eq!(keys(&json), ["path", "meta_graphs"]);
    assert_eq!(keys(&json["meta_graphs"][0]["signatures"]), ["add", "mixed", "serving_default"]);
}

#[test]
fn inspect_picks_the_meta_graph_by_tag_set_and_names_dtypes_isorun_cannot_carry() {
    let tmp = tempfile::tempdir().unwrap();
    let model = two_meta_graph_model(tmp.path());
    let path = model.to_str().unwrap();

    let json = inspect_json(&[path]);
    let graphs = json["meta_graphs"].as_array().unwrap();
    assert_eq!(graphs.len(), 2);
    assert_eq!(graphs[1]["tags"], serde_json::json!(["serve", "gpu"]));
    assert_eq!(keys(&json["signatures"]), ["serving_default"], "default --tag serve: the [serve] graph");

    for tags in [["--tag", "gpu", "--tag", "serve"], ["--tag", "serve", "--tag", "gpu"]] {
        let json = inspect_json(&[&[path][..], &tags[..]].concat());
        assert_eq!(json["signatures"], graphs[1]["signatures"], "tags {tags:?}: the [serve, gpu] graph");
    }
    let lookup = &graphs[1]["signatures"]["lookup"];
    assert_eq!(lookup["inputs"]["handle"], serde_json::json!({"dtype": "resource", "shape": null}));
    assert_eq!(lookup["outputs"]["count"], serde_json::json!({"dtype": "int64", "shape": []}));
    assert!(lookup.get("method").is_none());
    assert_eq!(json["meta_graphs"], inspect_json(&[path, "--tag", "gpu"])["meta_graphs"]);
    assert!(inspect_json(&[path, "--tag", "gpu"]).get("signatures").is_none(), "[gpu] alone is no tag set here");

    let ran = run_text(isorun().arg("inspect").arg(&model));
    assert_ok(&ran, "inspect two_graphs");
    let text = ran.stdout.replace(&tmp.path().display().to_string(), "[tmp]");
    insta::assert_snapshot!("inspect_two_meta_graphs_text", text);
}

/// Every way a MODEL can be unreadable: exit 2, nothing on stdout, one line
/// naming the path and what is wrong with it.
#[test]
fn inspect_errors_name_the_path_and_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("a-file"), b"not a folder").unwrap();
    std::fs::create_dir(dir.join("no-pb")).unwrap();
    std::fs::create_dir(dir.join("pbtxt-only")).unwrap();
    std::fs::write(dir.join("pbtxt-only/saved_model.pbtxt"), b"saved_model_schema_version: 1\n").unwrap();
    fake_models(dir, &["empty-pb", "garbage-pb", "truncated-pb"]);
    std::fs::write(dir.join("garbage-pb/saved_model.pb"), b"\xff\xff\xff\xff not a protobuf").unwrap();
    let real = std::fs::read(model("keras_mlp").join("saved_model.pb")).unwrap();
    std::fs::write(dir.join("truncated-pb/saved_model.pb"), &real[..real.len() / 2]).unwrap();

    let mut said = String::new();
    for case in ["missing", "a-file", "no-pb", "pbtxt-only", "empty-pb", "garbage-pb", "truncated-pb"] {
        let ran = run_text(isorun().current_dir(dir).args(["inspect", case]));
        assert_eq!(ran.code, Some(2), "{case}: stderr:\n{}", ran.stderr);
        assert_eq!(ran.stdout, "", "{case}");
        assert_eq!(ran.stderr.lines().count(), 1, "{case}: one line:\n{}", ran.stderr);
        assert!(ran.stderr.starts_with(&format!("isorun: error: {case}")), "{case}: names the path: {}", ran.stderr);
        said.push_str(&ran.stderr);
        // JSON or not, the same error.
        let json = run_text(isorun().current_dir(dir).args(["inspect", case, "--json"]));
        assert_eq!((json.code, &json.stdout, &json.stderr), (Some(2), &String::new(), &ran.stderr), "{case} --json");
    }
    insta::assert_snapshot!("inspect_errors", said);
}

// ---------------------------------------------------------------------------
// isorun ls

const FIXTURE_MODELS: [&str; 6] = ["asserting", "dtypes", "dynamic", "fixed_shape", "keras_mlp", "multi_sig"];

#[test]
fn ls_lists_ids_absolute_paths_and_formats_sorted_and_tab_separated() {
    let expected: String = FIXTURE_MODELS
        .iter()
        .map(|id| format!("{id}\t{}\tsaved_model\n", fixtures().join("models").join(id).display()))
        .collect();
    let ran = run_text(isorun().arg("ls").arg(fixtures().join("models")));
    assert_ok(&ran, "ls fixtures");
    assert_eq!(ran.stdout, expected);
    assert_eq!(ran.stderr, "");
    // A relative argument still gives absolute paths.
    let relative = run_text(isorun().current_dir(fixtures()).args(["ls", "models"]));
    assert_ok(&relative, "ls models (relative)");
    assert_eq!(relative.stdout, expected);
}

#[test]
fn ls_json_gives_one_object_per_line() {
    let ran = run(isorun().arg("ls").arg(fixtures().join("models")).arg("--json"));
    assert_ok(&ran, "ls --json");
    assert_eq!(ran.records.len(), FIXTURE_MODELS.len());
    for (record, id) in ran.records.iter().zip(FIXTURE_MODELS) {
        assert_eq!(
            record,
            &serde_json::json!({"id": id, "path": fixtures().join("models").join(id), "format": "saved_model"})
        );
    }
}

/// `serving/mymodel/{1,2,10}`, `serving/other/3` and `serving/plain`.
fn serving_layout(root: &Path) -> PathBuf {
    let serving = root.join("serving");
    fake_models(&serving, &["mymodel/1", "mymodel/2", "mymodel/10", "other/3", "plain"]);
    serving
}

fn ls_ids(args: &[&Path], flags: &[&str]) -> Vec<String> {
    let ran = run_text(isorun().arg("ls").args(args).args(flags));
    assert_ok(&ran, &format!("ls {args:?} {flags:?}"));
    ran.stdout
        .lines()
        .map(|line| {
            let (id, rest) = line.split_once('\t').unwrap_or_else(|| panic!("no tab in {line:?}"));
            let path = rest.strip_suffix("\tsaved_model").unwrap_or_else(|| panic!("no format in {line:?}"));
            assert!(Path::new(path).is_absolute() && Path::new(path).join("saved_model.pb").is_file(), "{line}");
            id.to_string()
        })
        .collect()
}

#[test]
fn ls_tensorflow_serving_layout_and_latest_version() {
    let tmp = tempfile::tempdir().unwrap();
    let serving = serving_layout(tmp.path());
    assert_eq!(ls_ids(&[&serving], &[]), ["mymodel/1", "mymodel/10", "mymodel/2", "other/3", "plain"]);
    assert_eq!(ls_ids(&[&serving], &["--latest-version"]), ["mymodel/10", "other/3", "plain"]);
    let ran = run(isorun().arg("ls").arg(&serving).args(["--latest-version", "--json"]));
    assert_eq!(
        ran.records[0],
        serde_json::json!({"id": "mymodel/10", "path": serving.join("mymodel/10"), "format": "saved_model"})
    );
}

#[test]
fn ls_on_the_model_folder_itself_names_versions_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let serving = serving_layout(tmp.path());
    let mymodel = serving.join("mymodel");
    assert_eq!(ls_ids(&[&mymodel], &[]), ["mymodel/1", "mymodel/10", "mymodel/2"]);
    assert_eq!(ls_ids(&[&mymodel], &["--latest-version"]), ["mymodel/10"]);
    // Two models' versions side by side do not clash.
    assert_eq!(ls_ids(&[&mymodel, &serving.join("other")], &["--latest-version"]), ["mymodel/10", "other/3"],);
    // One version folder given directly.
    assert_eq!(ls_ids(&[&mymodel.join("2")], &[]), ["mymodel/2"]);
}

#[test]
fn ls_follows_a_symlink_loop_once() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    fake_models(&models, &["a", "deeper/b"]);
    std::os::unix::fs::symlink(&models, models.join("deeper/up")).unwrap();
    std::os::unix::fs::symlink(".", models.join("deeper/here")).unwrap();
    let ran = run_within(isorun().arg("ls").arg(&models), Duration::from_secs(20));
    assert_ok(&ran, "ls with a loop");
    assert_eq!(
        ran.stdout,
        format!(
            "a\t{}\tsaved_model\ndeeper/b\t{}\tsaved_model\n",
            models.join("a").display(),
            models.join("deeper/b").display()
        )
    );
    assert_eq!(ran.stderr, "");
}

#[test]
fn ls_warns_about_an_unreadable_folder_and_lists_the_rest() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("note: skipped ls_warns_about_an_unreadable_folder_and_lists_the_rest: root reads folders chmod 000");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    fake_models(&models, &["a", "locked/b"]);
    let locked = models.join("locked");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let ran = run_text(isorun().arg("ls").arg(&models));
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_ok(&ran, "ls with an unreadable folder");
    assert_eq!(ran.stdout, format!("a\t{}\tsaved_model\n", models.join("a").display()));
    let warning = format!("isorun: warning: {}: skipped, cannot read the folder", locked.display());
    assert!(ran.stderr.starts_with(&warning), "stderr:\n{}", ran.stderr);
}

#[test]
fn ls_errors_are_usage_errors_naming_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("empty")).unwrap();
    std::fs::write(dir.join("a-file"), b"").unwrap();
    fake_models(dir, &["x/m", "y/m"]);
    let cases: [(&[&str], &str); 4] = [
        (&["missing"], "isorun: error: missing: no such file or directory\n"),
        (&["empty"], "isorun: error: empty: no model found (no SavedModel folder, .keras, full-model .h5 or .onnx file under it)\n"),
        (
            &["a-file"],
            "isorun: error: a-file: not a model (a MODEL is a SavedModel folder, a .keras, full-model .h5 or .onnx file, or a folder holding them)\n",
        ),
        (&["x/m", "y/m"], "isorun: error: two models have the id 'm': "),
    ];
    for (args, expected) in cases {
        let ran = run_text(isorun().current_dir(dir).arg("ls").args(args));
        assert_eq!(ran.code, Some(2), "ls {args:?}: {}", ran.stderr);
        assert_eq!(ran.stdout, "", "ls {args:?}");
        assert!(ran.stderr.starts_with(expected), "ls {args:?}: stderr:\n{}", ran.stderr);
    }
}

/// `isorun ls models/ | head -1`: the reader leaves after one line while
/// isorun still has lines to write; isorun ends quietly with 0.
#[test]
fn ls_into_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    // About 200 KB of lines, more than a pipe holds, so isorun is still
    // writing when the reader leaves.
    let names: Vec<String> =
        (0..2000).map(|i| format!("a-model-with-a-name-long-enough-to-fill-the-pipe-{i:04}")).collect();
    fake_models(&models, &names.iter().map(String::as_str).collect::<Vec<_>>());
    let mut child =
        isorun().arg("ls").arg(&models).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start isorun");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with(&format!("{}\t", names[0])), "{first}");
    drop(stdout);
    let output = child.wait_with_output().expect("wait for isorun");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(0), "stderr:\n{stderr}");
    assert_eq!(stderr, "");
}

// ---------------------------------------------------------------------------
// isorun cache

/// The cache's own `python-*.json` files (what a Python was found to have)
/// are not entries: `cache ls` passes them by without a word, while a
/// folder that is not a complete entry is still refused, naming it.
#[test]
fn cache_ls_passes_its_own_python_files_by_and_refuses_a_broken_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let remembered = cache.join("python-0123456789abcdef.json");
    std::fs::write(&remembered, b"{}").unwrap();
    std::fs::write(cache.join("python-fedcba9876543210.json"), b"{}").unwrap();
    let quiet = run_text(isorun().args(["cache", "ls", "--keras-cache"]).arg(cache));
    assert_ok(&quiet, "cache ls");
    assert_eq!(quiet.stdout, "");
    assert_eq!(quiet.stderr, "", "no warning about the cache's own files");
    assert!(remembered.is_file(), "kept");

    std::fs::create_dir(cache.join("0123456789abcdef0123456789abcdef")).unwrap();
    let refused = run_text(isorun().args(["cache", "ls", "--keras-cache"]).arg(cache));
    assert_ok(&refused, "cache ls");
    assert!(
        refused.stderr.contains("refused") && refused.stderr.contains("0123456789abcdef0123456789abcdef"),
        "{}",
        refused.stderr
    );
    assert!(!refused.stderr.contains("python-"), "{}", refused.stderr);
}

// ---------------------------------------------------------------------------
// isorun doctor

/// The line of `check` in doctor's report, split into status and detail.
fn doctor_line<'a>(ran: &'a Ran, check: &str) -> (&'a str, &'a str) {
    let line = ran
        .stdout
        .lines()
        .find(|line| line.strip_prefix(check).is_some_and(|rest| rest.starts_with("  ")))
        .unwrap_or_else(|| panic!("no '{check}' line in:\n{}", ran.stdout));
    let rest = line[check.len()..].trim_start();
    rest.split_once(' ').map_or((rest, ""), |(status, detail)| (status, detail.trim_start()))
}

#[test]
fn doctor_says_this_machine_can_run_models() {
    let ran = run_text(isorun().arg("doctor"));
    assert_ok(&ran, "doctor");
    let (status, detail) = doctor_line(&ran, "libtensorflow");
    assert_eq!(status, "ok", "{}", ran.stdout);
    assert!(detail.contains("(TensorFlow 2.21.0"), "{detail}");
    assert_eq!(doctor_line(&ran, "worker"), ("ok", bin("isorun-worker").to_str().unwrap()));
    let (status, detail) = doctor_line(&ran, "worker start");
    assert_eq!(status, "ok", "{}", ran.stdout);
    assert!(detail.starts_with("isorun-worker 0.1.0 (TensorFlow 2.21.0)"), "{detail}");
    for check in ["onnxruntime", "onednn warm-up", "sandbox", "memory limit", "worker signals", "gpu", "keras", "slurm"]
    {
        doctor_line(&ran, check);
    }
    let sandbox = doctor_line(&ran, "sandbox").1;
    assert!(sandbox.contains("Landlock"), "{sandbox}");
    // Every protection a strict worker gets here is named as records name it.
    assert!(sandbox.contains("no_unix_sockets"), "{sandbox}");
    assert_eq!(ran.stdout.lines().count(), 11, "{}", ran.stdout);
}

#[test]
fn doctor_without_a_worker_exits_1_and_says_it_is_missing() {
    let ran = run_text(isorun().args(["doctor", "--worker", "/nonexistent"]));
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    let (status, detail) = doctor_line(&ran, "worker");
    assert_eq!(status, "missing");
    assert!(detail.contains("/nonexistent"), "{detail}");
    assert_eq!(doctor_line(&ran, "worker start").0, "skipped");
    // The environment variable is the same setting.
    let from_env = run_text(isorun().arg("doctor").env("ISORUN_WORKER", "/nonexistent"));
    assert_eq!(from_env.code, Some(1));
    assert_eq!(doctor_line(&from_env, "worker").0, "missing");
}

#[test]
fn doctor_reports_a_worker_that_cannot_start() {
    let ran = run_text(isorun().args(["doctor", "--worker", "/bin/false"]));
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    assert_eq!(doctor_line(&ran, "worker"), ("ok", "/bin/false"));
    let (status, detail) = doctor_line(&ran, "worker start");
    assert_eq!(status, "failed");
    assert!(detail.contains("exit code 1"), "{detail}");

    // It starts, but is not isorun-worker.
    let ran = run_text(isorun().args(["doctor", "--worker", "/bin/echo"]));
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    assert_eq!(doctor_line(&ran, "worker start").0, "failed");
}

/// Without libtensorflow, where the only Python is a launcher with no
/// site-packages beside it (a pyenv shim), the libtensorflow line names
/// that python3 instead of saying there is none on PATH.
#[test]
fn doctor_without_libtensorflow_names_the_python3_on_path_it_found() {
    let tmp = tempfile::tempdir().unwrap();
    let shims = tmp.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let shim = shims.join("python3");
    std::fs::write(&shim, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", shims.display());
    let mut command = isorun();
    command.arg("doctor").env("PATH", &path).env("HOME", tmp.path()).env("XDG_CACHE_HOME", tmp.path().join("cache"));
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX", "ISORUN_LIBTENSORFLOW_DIR", "ISORUN_PYTHON"] {
        command.env_remove(var);
    }
    let ran = run_text(&mut command);
    let (status, detail) = doctor_line(&ran, "libtensorflow");
    assert_eq!(status, "missing", "{}", ran.stdout);
    assert!(!detail.contains("no python3 on PATH"), "{detail}");
    assert!(detail.contains(&format!("beside {}, the python3 on PATH", shim.display())), "{detail}");
}

/// The onnxruntime line names the library in ISORUN_ONNXRUNTIME_DIR with
/// its C API version, whether the CUDA provider is beside it, and whether
/// workers have ONNX Runtime's telemetry off;
/// a folder without one is named, with what to run.
#[test]
fn doctor_names_the_onnxruntime_library_given_by_isorun_onnxruntime_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_text(isorun().arg("doctor").env("ISORUN_ONNXRUNTIME_DIR", tmp.path()));
    let (status, detail) = doctor_line(&ran, "onnxruntime");
    assert_eq!(status, "none", "{}", ran.stdout);
    assert!(
        detail.starts_with(&format!("no ONNX Runtime in {} (ISORUN_ONNXRUNTIME_DIR)", tmp.path().display())),
        "{detail}"
    );
    assert!(detail.contains("scripts/fetch-onnxruntime"), "{detail}");
    let library = tmp.path().join("libonnxruntime.so.1.23");
    std::fs::write(&library, b"").unwrap();
    let ran =
        run_text(isorun().arg("doctor").env("ISORUN_ONNXRUNTIME_DIR", tmp.path()).env_remove("ORT_DISABLE_TELEMETRY"));
    assert_eq!(
        doctor_line(&ran, "onnxruntime"),
        (
            "found",
            format!(
                "{} (ONNX Runtime version unknown, C API 23; from ISORUN_ONNXRUNTIME_DIR; CPU provider only; \
                 telemetry off in workers (ORT_DISABLE_TELEMETRY=1))",
                library.display()
            )
            .as_str()
        )
    );
    let ran =
        run_text(isorun().arg("doctor").env("ISORUN_ONNXRUNTIME_DIR", tmp.path()).env("ORT_DISABLE_TELEMETRY", "0"));
    let (_, detail) = doctor_line(&ran, "onnxruntime");
    assert!(detail.ends_with("; ORT_DISABLE_TELEMETRY=0 as you set it)"), "{detail}");
    // The onnxruntime-gpu wheel's CUDA provider beside the library is named.
    std::fs::write(tmp.path().join("libonnxruntime_providers_cuda.so"), b"").unwrap();
    let ran = run_text(isorun().arg("doctor").env("ISORUN_ONNXRUNTIME_DIR", tmp.path()));
    let (_, detail) = doctor_line(&ran, "onnxruntime");
    assert!(detail.contains("; CUDA provider beside it, tried where a worker sees a GPU (else the CPU's"), "{detail}");
}

#[test]
fn doctor_says_how_to_fetch_a_missing_libtensorflow() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_text(isorun().arg("doctor").arg("--libtensorflow-dir").arg(tmp.path()));
    let (status, detail) = doctor_line(&ran, "libtensorflow");
    assert_eq!(status, "missing", "{}", ran.stdout);
    assert!(detail.contains(&tmp.path().display().to_string()), "{detail}");
    assert!(detail.contains("scripts/fetch-libtensorflow"), "{detail}");
    // The exit code follows whether the worker starts (it may find the library on its own).
    let started = doctor_line(&ran, "worker start").0 == "ok";
    assert_eq!(ran.code, Some(if started { 0 } else { 1 }), "{}", ran.stdout);
}
