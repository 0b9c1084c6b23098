//! `isorun run --config FILE`: a TOML file stands for the flags it names,
//! its paths are relative to its own folder, the command line overrides it
//! (a repeatable flag replacing the file's whole list), and every mistake in
//! it is a usage error naming the file, the line and the key, before
//! anything runs.

use crate::util::copy_dir;
use crate::util::{fake_models, fixtures, isorun, isorun_fault, run, write_input, Ran};
use serde_json::Value;
use std::path::Path;

/// Copies a fixture model folder (a few KiB) to `to`.
fn copy_model(name: &str, to: &Path) {
    copy_dir(&fixtures().join("models").join(name), to);
}

/// Each record's model, status and outputs: what must not depend on how the
/// settings were given.
fn results(ran: &Ran) -> Vec<(String, String, Value)> {
    ran.records
        .iter()
        .map(|r| (r["model"].as_str().unwrap().into(), r["status"].as_str().unwrap().into(), r["outputs"].clone()))
        .collect()
}

/// `isorun run --config NAME` in `dir`.
fn run_config(dir: &Path, name: &str) -> Ran {
    run(isorun().current_dir(dir).args(["run", "--config", name]))
}

/// Asserts a usage error: exit 2, nothing on stdout, exactly `message` on stderr.
fn assert_usage_error(ran: &Ran, message: &str) {
    assert_eq!((ran.code, ran.stdout.as_str(), ran.stderr.as_str()), (Some(2), "", format!("{message}\n").as_str()));
}

#[test]
fn a_config_file_runs_like_the_same_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("conf");
    copy_model("multi_sig", &conf.join("models/multi_sig"));
    copy_model("dynamic", &conf.join("models/dynamic"));
    std::fs::copy(fixtures().join("expected/multi_sig__add/inputs.npz"), conf.join("add.npz")).unwrap();
    std::fs::write(
        conf.join("nightly.toml"),
        r#"# the nightly job
models = ["models/multi_sig", "models/dynamic"]
signature = "add"
inputs = "add.npz"
jobs = 2
values = true
json = true
"#,
    )
    .unwrap();
    // From another folder: the file's paths are relative to its own.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let from_file = run_config(&elsewhere, "../conf/nightly.toml");
    assert_eq!(from_file.code, Some(1), "dynamic has no 'add' signature:\n{}", from_file.stderr);

    let from_flags = run(isorun()
        .arg("run")
        .arg(conf.join("models/multi_sig"))
        .arg(conf.join("models/dynamic"))
        .args(["--signature", "add", "--inputs"])
        .arg(conf.join("add.npz"))
        .args(["-j", "2", "--values", "--json"]));
    assert_eq!(from_flags.code, Some(1), "{}", from_flags.stderr);
    assert_eq!(results(&from_file), results(&from_flags));
    assert_eq!(
        from_file.statuses(),
        [("multi_sig".to_string(), "ok".to_string()), ("dynamic".to_string(), "error".to_string())]
    );
    assert_eq!(from_file.record("multi_sig")["outputs"]["sum"]["values"], serde_json::json!([3, -4, 1090921693184i64]));
    let path = from_file.record("multi_sig")["path"].as_str().unwrap();
    assert!(path.ends_with("/elsewhere/../conf/models/multi_sig"), "{path}");
}

#[test]
fn command_line_flags_override_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    copy_model("multi_sig", &tmp.path().join("multi_sig"));
    let add = fixtures().join("expected/multi_sig__add/inputs");
    let x = fixtures().join("expected/multi_sig__serving_default/inputs/x.npy");
    std::fs::write(
        tmp.path().join("nightly.toml"),
        format!(
            "models = ['multi_sig']\nsignature = 'add'\ninput = ['a={}', 'b={}']\njson = true\n",
            add.join("a.npy").display(),
            add.join("b.npy").display()
        ),
    )
    .unwrap();
    let as_filed = run_config(tmp.path(), "nightly.toml");
    assert_eq!(as_filed.code, Some(0), "{}", as_filed.stderr);
    assert!(as_filed.record("multi_sig")["outputs"].get("sum").is_some(), "{}", as_filed.stdout);

    // --signature beats the file's; --input replaces all of the file's inputs.
    let overridden = run(isorun()
        .current_dir(tmp.path())
        .args(["run", "--config", "nightly.toml", "--signature", "serving_default"])
        .arg(format!("--input=x={}", x.display())));
    assert_eq!(overridden.code, Some(0), "{}", overridden.stderr);
    let outputs = overridden.record("multi_sig")["outputs"].as_object().unwrap();
    assert_eq!(outputs.keys().collect::<Vec<_>>(), ["y"], "{}", overridden.stdout);
}

#[test]
fn repeatable_flags_replace_and_single_flags_win_with_the_fault_worker() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["one", "two", "three"]);
    write_input(tmp.path());
    std::fs::write(
        tmp.path().join("nightly.toml"),
        "models = ['models']\ninput = ['x=x.npy', 'y=x.npy']\nmodels-per-worker = 1\njobs = 1\nformat = 'table'\n",
    )
    .unwrap();
    let config = tmp.path().join("nightly.toml");
    let as_filed = run(isorun_fault(&[]).arg("--config").arg(&config).arg("--json"));
    assert_eq!(as_filed.code, Some(0), "{}", as_filed.stderr);
    let workers: std::collections::BTreeSet<String> =
        as_filed.records.iter().map(|r| r["worker_id"].to_string()).collect();
    assert_eq!(workers.len(), 3, "one model per worker, as the file says:\n{}", as_filed.stdout);
    let names = |r: &Value| r["outputs"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(as_filed.record("one")), ["x", "y"]);

    // Paths on the command line stay relative to the current directory.
    let overridden = run(isorun_fault(&[]).current_dir(tmp.path()).arg("--config").arg(&config).args([
        "--json",
        "--models-per-worker",
        "3",
        "--input",
        "z=x.npy",
    ]));
    assert_eq!(overridden.code, Some(0), "{}", overridden.stderr);
    let workers: std::collections::BTreeSet<String> =
        overridden.records.iter().map(|r| r["worker_id"].to_string()).collect();
    assert_eq!(workers.len(), 1, "--models-per-worker 3 wins:\n{}", overridden.stdout);
    for record in &overridden.records {
        assert_eq!(names(record), ["z"], "--input replaces the file's inputs:\n{}", overridden.stdout);
    }
}

/// Command line, then environment, then file: `ISORUN_WORKER` (set by
/// `isorun_fault`) beats the file's `worker`, which `--worker` beats too.
#[test]
fn the_environment_beats_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(&tmp.path().join("models"), &["m"]);
    write_input(tmp.path());
    std::fs::write(
        tmp.path().join("nightly.toml"),
        "models = 'models'
input = 'x=x.npy'
worker = 'no-such-worker'
",
    )
    .unwrap();
    let ran = run(isorun_fault(&[]).current_dir(tmp.path()).args(["--config", "nightly.toml"]));
    assert_eq!((ran.code, ran.statuses()), (Some(0), vec![("m".to_string(), "ok".to_string())]), "{}", ran.stderr);

    let ran = run(isorun().current_dir(tmp.path()).args(["run", "--config", "nightly.toml"]));
    assert_eq!((ran.code, ran.stdout.as_str()), (Some(2), ""));
    assert!(ran.stderr.contains("no-such-worker"), "without ISORUN_WORKER the file's worker is used:\n{}", ran.stderr);
    let ran = run(isorun()
        .current_dir(tmp.path())
        .args(["run", "--config", "nightly.toml", "--worker"])
        .arg(crate::util::bin("isorun-fault-worker")));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
}

#[test]
fn models_may_be_globs() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(tmp.path(), &["zoo/beta", "zoo/alpha", "zoo/gamma", "zoo/.hidden", "other/delta"]);
    write_input(tmp.path());
    std::fs::write(tmp.path().join("nightly.toml"), "models = ['zoo/[ab]*', '*/d?lta']\ninput = 'x=x.npy'\n").unwrap();
    let ran = run(isorun_fault(&[]).current_dir(tmp.path()).args(["--config", "nightly.toml"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let ids: Vec<&str> = ran.records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, ["alpha", "beta", "delta"]);

    std::fs::write(tmp.path().join("nothing.toml"), "input = 'x=x.npy'\nmodels = ['zoo/*', 'zoo/x*']\n").unwrap();
    let ran = run(isorun_fault(&[]).current_dir(tmp.path()).args(["--config", "nothing.toml"]));
    assert_usage_error(&ran, "isorun: error: nothing.toml:2: models: 'zoo/x*' matches nothing");
}

#[test]
fn paths_are_relative_to_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("conf");
    fake_models(&conf.join("models"), &["m"]);
    std::fs::create_dir_all(conf.join("data")).unwrap();
    write_input(&conf.join("data"));
    std::fs::write(
        conf.join("nightly.toml"),
        "models = 'models/m'\ninput = 'x=data/x.npy'\noutput-dir = 'out'\nreport = 'report.json'\n",
    )
    .unwrap();
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let ran = run(isorun_fault(&[]).current_dir(&cwd).args(["--config", "../conf/nightly.toml"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(conf.join("out/m/x.npy").is_file(), "outputs go next to the file");
    assert!(conf.join("report.json").is_file(), "the report goes next to the file");
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "nothing written in the current directory");
}

#[test]
fn an_unknown_key_names_the_file_line_and_a_suggestion() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(tmp.path(), &["m"]);
    std::fs::write(
        tmp.path().join("nightly.toml"),
        "# nightly\nmodels = ['m']\n\njobs = 2\nvalues = true\n\ntimeout_secs = 60\n",
    )
    .unwrap();
    let ran = run_config(tmp.path(), "nightly.toml");
    assert_usage_error(&ran, "isorun: error: nightly.toml:7: unknown key 'timeout_secs' (did you mean 'timeout'?)");
}

#[test]
fn wrong_values_bad_toml_and_missing_files_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(tmp.path(), &["m"]);
    let cases = [
        (
            "models = 'm'\njobs = \"two\"\n",
            "nightly.toml:2: jobs: expected a non-negative integer, found string \"two\"",
        ),
        ("models = 'm'\n\nvalues = 3\n", "nightly.toml:3: values: expected true or false, found integer 3"),
        ("models = 'm'\nsignature = \"unclosed\n", "nightly.toml:2:22: invalid TOML: invalid basic string"),
        ("[run]\nmodels = 'm'\n", "nightly.toml:1: table 'run' is not supported: settings are top-level keys"),
    ];
    for (text, message) in cases {
        std::fs::write(tmp.path().join("nightly.toml"), text).unwrap();
        let ran = run_config(tmp.path(), "nightly.toml");
        assert_usage_error(&ran, &format!("isorun: error: {message}"));
    }
    let ran = run_config(tmp.path(), "absent.toml");
    assert_usage_error(
        &ran,
        "isorun: error: cannot read config file absent.toml: No such file or directory (os error 2)",
    );
}

#[test]
fn only_run_takes_a_config_file() {
    let ran = run(isorun().args(["ls", "--config", "nightly.toml", "."]));
    assert_eq!((ran.code, ran.stdout.as_str()), (Some(2), ""));
    assert!(ran.stderr.contains("unexpected argument '--config'"), "{}", ran.stderr);
}

/// What each kind of mistake says, in one place.
#[test]
fn config_error_messages() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(tmp.path(), &["m"]);
    let config = tmp.path().join("nightly.toml");
    let cases = [
        "models = ['m']\nmoddels_per_worker = 2\n",
        "models = ['m']\nframes = 2\n",
        "models = ['m']\nbatch-size = 0\n",
        "models = ['m']\nmemory-limit = 'lots'\n",
        "models = ['m']\nformat = 'xml'\n",
        "models = ['m']\ntag = ['serve',\n  7]\n",
        "models = ['m']\njson = true\nformat = 'table'\n",
        "models = ['m']\nretries = 1\nretries = 2\n",
        "models = ['m']\njobs = 1\njobs_ = 2\n",
        "models = ['m']\nconfig = 'other.toml'\n",
        "models = ['m', 'n*']\n",
    ];
    let mut said = String::new();
    for text in cases {
        std::fs::write(&config, text).unwrap();
        let ran = run(isorun().arg("run").arg("--config").arg(&config));
        assert_eq!((ran.code, ran.stdout.as_str()), (Some(2), ""), "{text}");
        said.push_str(&format!("--- {}\n{}", text.replace('\n', "\\n"), ran.stderr));
    }
    let ran = run(isorun().arg("run").arg("--config").arg(tmp.path().join("absent.toml")));
    said.push_str(&format!("--- (no file)\n{}", ran.stderr));
    insta::assert_snapshot!("config_errors", said.replace(&tmp.path().display().to_string(), "[tmp]"));
}
