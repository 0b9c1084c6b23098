//! The messages and the table a user reads, as a new user meets them in
//! the first hour (issue #26, sections 3 and 4): the table and its totals line, the man pages, a quiet closed pipe, and
//! messages that say what is wrong and what to do instead of misleading.

use crate::util::{bin, fake_models, fixtures, isorun, isorun_fault, run, write_input};
use std::path::Path;
use std::process::Stdio;

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// One usage error: exit 2, nothing on stdout, stderr with its paths shown as `[tmp]`.
fn usage_error(command: &mut std::process::Command, tmp: &Path) -> String {
    let ran = run(command);
    assert_eq!(ran.code, Some(2), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.stdout, "");
    ran.stderr.replace(&tmp.display().to_string(), "[tmp]")
}

// ---------------------------------------------------------------------------
// Section 3: what the README shows

#[test]
fn a_table_ends_with_the_totals_line_and_json_lines_have_none() {
    let models = examples().join("models");
    let inputs = examples().join("inputs.npz");
    let table = run(isorun().arg("run").arg(&models).arg("--inputs").arg(&inputs).args(["--format", "table"]));
    assert_eq!(table.code, Some(1), "must_be_negative fails on purpose: {}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "header, 3 rows, a blank line, the totals:\n{}", table.stdout);
    assert!(lines[0].starts_with("model") && lines[0].contains("peak mem"), "{}", lines[0]);
    assert_eq!(lines[4], "");
    let totals = lines[5];
    assert!(totals.starts_with("3 models: 2 ok, 1 not ok, in "), "{totals}");
    assert!(totals.contains(" s; supervisor peak memory ") && totals.ends_with(" MiB"), "{totals}");
    // Piped (no --format): JSON Lines only, no totals on either stream.
    let piped = run(isorun().arg("run").arg(&models).arg("--inputs").arg(&inputs));
    assert_eq!(piped.records.len(), 3, "{}", piped.stdout);
    assert!(!piped.stdout.contains("models:") && !piped.stderr.contains("models:"), "{}", piped.stderr);
    // --summary with JSON Lines: the same table layout and the totals, on stderr.
    let summary = run(isorun().arg("run").arg(&models).arg("--inputs").arg(&inputs).args(["--json", "--summary"]));
    assert_eq!(summary.records.len(), 3);
    let header = summary.stderr.lines().find(|l| l.starts_with("model")).expect("a header");
    assert_eq!(header, lines[0], "one table layout, not two");
    assert!(summary.stderr.contains("3 models: 2 ok, 1 not ok, in "), "{}", summary.stderr);
}

#[test]
fn on_a_terminal_run_prints_the_table_and_totals_by_default() {
    if std::process::Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIP: no `script` to make a terminal");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("typescript");
    let command = format!(
        "{} run {} --inputs {} -q",
        bin("isorun").display(),
        examples().join("models/linear_regressor").display(),
        examples().join("inputs.npz").display()
    );
    let status = std::process::Command::new("script")
        .args(["-qec", &command])
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    let said = std::fs::read_to_string(&log).unwrap().replace('\r', "");
    assert!(said.contains("\nmodel ") && said.contains("\nlinear_regressor  ok"), "{said}");
    assert!(said.contains("\n1 model: 1 ok, 0 not ok, in "), "{said}");
}

#[test]
fn man_has_a_page_per_command_and_installs_them() {
    let root = run(isorun().arg("man"));
    assert_eq!(root.code, Some(0), "{}", root.stderr);
    assert!(root.stdout.contains(".TH isorun 1"), "{}", &root.stdout[..200.min(root.stdout.len())]);
    assert!(root.stdout.contains("isorun\\-run(1)"), "the root page names the run page");
    let page = run(isorun().args(["man", "run"]));
    assert_eq!(page.code, Some(0), "{}", page.stderr);
    assert!(page.stdout.contains(".TH isorun-run 1"), "{}", &page.stdout[..200.min(page.stdout.len())]);
    assert!(page.stdout.contains("memory\\-limit"), "the run page has run's flags");
    let nested = run(isorun().args(["man", "report", "diff"]));
    assert!(nested.stdout.contains(".TH isorun-report-diff 1"), "{}", nested.stderr);
    let unknown = run(isorun().args(["man", "rnu"]));
    assert_eq!(unknown.code, Some(2));
    assert!(unknown.stderr.contains("no man page for 'rnu'; commands are: run, eval"), "{}", unknown.stderr);

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    let installed = run(isorun().arg("man").arg("--out-dir").arg(&dir));
    assert_eq!(installed.code, Some(0), "{}", installed.stderr);
    for page in ["isorun.1", "isorun-run.1", "isorun-eval.1", "isorun-report-diff.1", "isorun-cache-ls.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie"), "{page} is roff");
        assert!(installed.stdout.contains(&dir.join(page).display().to_string()), "{page} is named");
    }
}

/// Every command that writes on stdout ends quietly when its reader is
/// gone (`isorun man | head -1`): exit 0, nothing on stderr.
#[test]
fn a_closed_stdout_is_a_quiet_exit_0_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let cases: Vec<Vec<String>> = vec![
        vec!["man".into()],
        vec!["man".into(), "run".into()],
        vec!["completions".into(), "bash".into()],
        vec!["ls".into(), fixtures().join("models").display().to_string()],
        vec!["inspect".into(), fixtures().join("models/multi_sig").display().to_string()],
        vec!["cache".into(), "ls".into(), "--keras-cache".into(), cache.display().to_string()],
        vec!["--help".into()],
    ];
    for args in cases {
        let mut child = isorun().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Closed before anything is written: the first write fails with EPIPE.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "isorun {args:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe") && !stderr.contains("panicked"), "isorun {args:?}: {stderr}");
    }
}

// ---------------------------------------------------------------------------
// Section 4: messages that mislead

#[test]
fn pipe_on_a_missing_model_says_no_such_file_like_run() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nonexistent/model");
    let pipe = usage_error(isorun().arg("pipe").arg(&missing), tmp.path());
    assert_eq!(pipe, "isorun: error: [tmp]/nonexistent/model: no such file or directory\n");
    let run_said = usage_error(isorun().arg("run").arg(&missing), tmp.path());
    assert_eq!(pipe, run_said);
}

#[test]
fn a_metric_alias_is_taken_and_a_prefix_is_suggested() {
    let eval = |metric: &str| {
        run(isorun()
            .arg("eval")
            .arg(examples().join("eval/models/iris_e100"))
            .arg("--data")
            .arg(examples().join("eval/iris.tfrecord"))
            .args(["--label", "species", "--metric", metric, "--json"]))
    };
    let alias = eval("acc");
    assert_eq!(alias.code, Some(0), "{}", alias.stderr);
    assert!(alias.records[0]["metrics"]["accuracy"].is_number(), "{}", alias.stdout);
    let prefix = eval("accu");
    assert_eq!(prefix.code, Some(2));
    assert!(prefix.stderr.contains("unknown metric 'accu' (did you mean 'accuracy'?)"), "{}", prefix.stderr);
}

#[test]
fn one_folder_given_twice_is_one_model() {
    let tmp = tempfile::tempdir().unwrap();
    let serving = tmp.path().join("serving");
    fake_models(&serving, &["mymodel/1", "mymodel/2"]);
    let ran = run(isorun().arg("ls").arg(serving.join("mymodel")).arg(&serving));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let ids: Vec<&str> = ran.stdout.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(ids, ["mymodel/1", "mymodel/2"]);
}

/// Each message names what is wrong and what to do; the snapshot holds them all.
#[test]
fn usage_errors_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let model = examples().join("models/linear_regressor");
    let mut said = String::new();
    // The @ forgotten before inline JSON.
    said += &usage_error(isorun().arg("run").arg(&model).args(["--input", "x=[[1,2,3,4]]"]), tmp.path());
    // A bare memory limit below 16 MiB is surely not bytes.
    said += &usage_error(isorun().arg("run").arg(&model).args(["--memory-limit", "4"]), tmp.path())
        .lines()
        .next()
        .map(|l| format!("{l}\n"))
        .unwrap_or_default();
    // A folder with weights only.
    let weights = tmp.path().join("weights");
    std::fs::create_dir(&weights).unwrap();
    std::fs::write(weights.join("x.weights.h5"), b"\x89HDF\r\n\x1a\n").unwrap();
    said += &usage_error(isorun().arg("run").arg(&weights).args(["--input", "x=@[[1,2,3,4]]"]), tmp.path());
    // The protobuf file instead of its folder.
    let copy = tmp.path().join("m");
    crate::util::copy_dir(&model, &copy);
    said += &usage_error(isorun().arg("run").arg(copy.join("saved_model.pb")), tmp.path());
    said += &usage_error(isorun().arg("inspect").arg(copy.join("saved_model.pb")), tmp.path());
    insta::assert_snapshot!("usage_errors", said);
}

#[test]
fn limits_are_named_and_memory_is_in_mib() {
    let model = examples().join("models/linear_regressor");
    let inputs = examples().join("inputs.npz");
    let over = run(isorun().arg("run").arg(&model).arg("--inputs").arg(&inputs).args(["--memory-limit", "20M"]));
    assert_eq!(over.code, Some(1), "{}", over.stderr);
    let record = &over.records[0];
    assert_eq!(record["status"], "memory_limit", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("memory limit exceeded (peak ") && message.contains(" MiB)"), "{message}");
    assert!(message.ends_with("(limit: --memory-limit 20.0 MiB)"), "{message}");
    assert!(!message.contains("bytes"), "{message}");

    let late = run(isorun().arg("run").arg(&model).arg("--inputs").arg(&inputs).args(["--timeout", "0.05"]));
    assert_eq!(late.code, Some(1), "{}", late.stderr);
    let message = late.records[0]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("timeout while in phase "), "{message}");
    assert!(message.ends_with("(limit: --timeout 0.05 s)"), "{message}");
}

#[test]
fn the_stderr_tail_shows_no_tensorflow_start_up_banner() {
    let ran = run(isorun()
        .arg("run")
        .arg(examples().join("models/must_be_negative"))
        .arg("--inputs")
        .arg(examples().join("inputs.npz"))
        .arg("--json"));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["status"], "error", "{record}");
    let tail = record["stderr_tail"].to_string();
    for banner in ["absl::InitializeLog", "oneDNN custom operations", "cudart_stub", "Could not find cuda drivers"] {
        assert!(!tail.contains(banner), "{banner} in {tail}");
    }
}

#[test]
fn report_diff_with_a_journal_says_it_is_one_and_how_to_make_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    fake_models(tmp.path(), &["models/a", "models/b"]);
    let input = write_input(tmp.path());
    let report = tmp.path().join("r.json");
    let journal = tmp.path().join("j.jsonl");
    let ran = run(isorun_fault(&[])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", input.display()))
        .arg("--report")
        .arg(&report)
        .arg("--journal")
        .arg(&journal)
        .arg("--json"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let said = usage_error(isorun().args(["report", "diff"]).arg(&report).arg(&journal), tmp.path());
    insta::assert_snapshot!("report_diff_with_a_journal", said);
    // The records a run printed, given as a report.
    let printed = tmp.path().join("printed.jsonl");
    std::fs::write(&printed, &ran.stdout).unwrap();
    let said = usage_error(isorun().args(["report", "diff"]).arg(&report).arg(&printed), tmp.path());
    assert!(said.contains("printed.jsonl: not an isorun report but the records a run printed"), "{said}");
}

#[test]
fn a_breach_says_its_status_once_and_its_numbers_short() {
    let tmp = tempfile::tempdir().unwrap();
    let html = tmp.path().join("r.html");
    let ran = run(isorun()
        .arg("eval")
        .arg(examples().join("eval/models/iris_e002"))
        .arg("--data")
        .arg(examples().join("eval/iris.tfrecord"))
        .args(["--label", "species", "--metric", "accuracy", "--threshold", "accuracy>=0.999", "--json", "--html"])
        .arg(&html));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["status"], "below_threshold", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    let value = message.rsplit("not met: ").next().unwrap();
    assert!(value.len() <= 8 && value.parse::<f64>().is_ok(), "a short number: {message}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("below threshold: accuracy&gt;=0.999 not met"), "the breach in the failure box");
    assert!(!page.contains("below_threshold: below threshold"), "the status said twice");
}

#[test]
fn pipe_s_keras_export_error_is_not_prefixed_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("broken.keras");
    std::fs::write(&model, b"PK\x03\x04not a zip").unwrap();
    let python = tmp.path().join("python");
    std::fs::write(&python, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let said = usage_error(
        isorun()
            .arg("pipe")
            .arg(&model)
            .arg("--keras-cache")
            .arg(tmp.path().join("cache"))
            .env("ISORUN_PYTHON", &python),
        tmp.path(),
    );
    assert!(
        said.starts_with("isorun: error: [tmp]/broken.keras: cannot export the Keras file: [tmp]/python "),
        "{said}"
    );
    assert!(!said.contains("error: export_failed"), "{said}");
}

// ---------------------------------------------------------------------------
// Issue 42 §2: the table keeps the part of an error that says what to do

/// A stand-in Python answering isorun's Keras probe with `keras` and
/// `tensorflow` (versions, or `null`): a Keras file's refusals are met
/// without Keras on this machine.
fn probe_python(dir: &Path, name: &str, keras: &str, tensorflow: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let answer = format!(
        r#"{{"executable": "/usr/bin/python3", "prefixes": [], "path": [], "version": "3.12.0", "keras": {keras}, "tensorflow": {tensorflow}, "tf_keras": null, "dists": []}}"#
    );
    std::fs::write(&path, format!("#!/bin/sh\necho '{answer}'\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A folder for the issue's three errors: `iris.keras` and `lambda.keras`,
/// and `models/dynamic`, whose warm-up requests feed an input `x` it lacks.
fn three_errors() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["iris.keras", "lambda.keras"] {
        std::fs::copy(fixtures().join("keras").join(file), tmp.path().join(file)).unwrap();
    }
    let dynamic = tmp.path().join("models/dynamic");
    crate::util::copy_dir(&fixtures().join("models/dynamic"), &dynamic);
    std::fs::create_dir_all(dynamic.join("assets.extra")).unwrap();
    std::fs::copy(
        fixtures().join("warmup/models/predict/assets.extra/tf_serving_warmup_requests"),
        dynamic.join("assets.extra/tf_serving_warmup_requests"),
    )
    .unwrap();
    tmp
}

/// The table as `run --format table` prints it in `dir`, under `env`.
fn table_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> crate::util::Ran {
    let mut command = isorun();
    command.current_dir(dir).env_remove("COLUMNS").arg("run").args(args).args(["--format", "table", "-j", "1"]);
    command.arg("--keras-cache").arg(dir.join("cache"));
    for (name, value) in env {
        command.env(name, value);
    }
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(1), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    ran
}

/// `stdout` with the columns that change from run to run (time, memory) as `[time]`, `[mem]`.
fn steady_table(stdout: &str) -> String {
    let id_width = stdout.lines().next().and_then(|h| h.find("status")).expect("a header") - 2;
    let mut rows = true;
    let mut text = String::new();
    for (i, line) in stdout.lines().enumerate() {
        if line.is_empty() {
            rows = false;
        }
        let line = if i > 0 && rows {
            format!("{}[time]  [mem]  {}", &line[..id_width + 18], &line[id_width + 39..])
        } else if line.contains(" models: ") || line.contains(" model: ") {
            format!("{} in [time]", &line[..line.find(" in ").unwrap()])
        } else {
            line.to_string()
        };
        text += &line;
        text += "\n";
    }
    text
}

#[test]
fn a_table_row_keeps_the_end_of_an_error_and_the_whole_message_follows_the_totals() {
    let tmp = three_errors();
    let no_keras = probe_python(tmp.path(), "python-without-keras", "null", "null");
    let keras = probe_python(tmp.path(), "python-with-keras", "\"3.5.0\"", "\"2.17.0\"");
    let inputs = examples().join("inputs.npz");
    let first = table_in(
        tmp.path(),
        &["iris.keras", "models/dynamic", "--warmup-inputs", "--python", no_keras.to_str().unwrap()],
        &[("COLUMNS", "100")],
    );
    let second = table_in(
        tmp.path(),
        &["lambda.keras", "--inputs", inputs.to_str().unwrap(), "--python", keras.to_str().unwrap()],
        &[("COLUMNS", "100")],
    );
    let said = format!("{}\n{}", first.stdout, second.stdout);
    // Paths relative to the working folder; every row within the 100 columns.
    assert!(!said.contains(&tmp.path().display().to_string()), "{said}");
    for row in said.lines().filter(|l| l.contains(" error ")) {
        assert!(row.chars().count() <= 100, "{} columns: {row}", row.chars().count());
        assert!(row.contains('…'), "cut in the middle: {row}");
    }
    let row = |id: &str| first.stdout.lines().find(|l| l.starts_with(id)).unwrap().to_string();
    assert!(row("iris.keras").ends_with("--python / ISORUN_PYTHON"), "{}", row("iris.keras"));
    // What a row could not hold follows the totals, whole.
    assert!(said.contains("  dynamic: models/dynamic/assets.extra/tf_serving_warmup_requests: request 0 (record at byte 0): unknown input 'x'; signature 'serving_default' takes: m (float32, [?, ?])\n"), "{said}");
    assert!(said.contains("refused without --keras-unsafe (pass it to run that code"), "{said}");
    insta::assert_snapshot!(
        "table_keeps_the_end_of_errors",
        format!("{}\n{}", steady_table(&first.stdout), steady_table(&second.stdout))
    );

    // -v: the rows hold the messages whole, and nothing follows the totals.
    let verbose = table_in(
        tmp.path(),
        &["-v", "models/dynamic", "--warmup-inputs", "--python", no_keras.to_str().unwrap()],
        &[("COLUMNS", "100")],
    );
    assert!(
        verbose.stdout.contains("unknown input 'x'; signature 'serving_default' takes: m (float32, [?, ?])\n"),
        "{}",
        verbose.stdout
    );
    assert!(!verbose.stdout.contains('…') && !verbose.stdout.contains("messages cut"), "{}", verbose.stdout);
    // A file (no terminal, no COLUMNS) holds the rows whole.
    let file = table_in(tmp.path(), &["models/dynamic", "--warmup-inputs"], &[]);
    assert!(file.stdout.contains("(record at byte 0): unknown input 'x'; signature"), "{}", file.stdout);
    assert!(!file.stdout.contains('…'), "{}", file.stdout);
}

/// A narrow terminal (66 columns, 20 left for the message): the row fits it, and keeps a
/// third of the room for the message's start (it kept 40 characters, 10 of them the start).
#[test]
fn on_a_narrow_terminal_a_row_still_fits_and_keeps_the_message_s_start_and_end() {
    let tmp = three_errors();
    let ran = table_in(tmp.path(), &["models/dynamic", "--warmup-inputs"], &[("COLUMNS", "66")]);
    let row = ran.stdout.lines().find(|l| l.starts_with("dynamic ")).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert_eq!(row.chars().count(), 66, "{row}");
    assert!(row.ends_with("  models…at32, [?, ?])"), "{row}");
    assert!(ran.stdout.contains("  dynamic: models/dynamic/assets.extra/"), "{}", ran.stdout);
}

/// On a terminal (no `COLUMNS`), the rows fit its width.
#[test]
fn on_a_terminal_the_table_fits_its_width() {
    if std::process::Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIP: no `script` to make a terminal");
        return;
    }
    let tmp = three_errors();
    let log = tmp.path().join("typescript");
    let command = format!("stty cols 90 rows 40 && {} run models/dynamic --warmup-inputs -q", bin("isorun").display());
    let status = std::process::Command::new("script")
        .args(["-qec", &command])
        .arg(&log)
        .current_dir(tmp.path())
        .env_remove("COLUMNS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
    let said = std::fs::read_to_string(&log).unwrap().replace('\r', "");
    let row = said.lines().find(|l| l.starts_with("dynamic ")).unwrap_or_else(|| panic!("{said}"));
    assert!(row.chars().count() <= 90 && row.contains('…'), "{row}");
    assert!(row.ends_with("takes: m (float32, [?, ?])"), "{row}");
    assert!(said.contains("  dynamic: models/dynamic/assets.extra/"), "{said}");
}

// ---------------------------------------------------------------------------
// Issue 42 §8: a data shard's row

#[test]
fn a_data_shard_row_shows_its_examples_and_that_metrics_come_at_report_merge() {
    let eval = fixtures().join("eval");
    let ran = run(isorun()
        .arg("eval")
        .arg(eval.join("models/binary"))
        .arg("--data")
        .arg(eval.join("data/data.tfrecord"))
        .args(["--label", "label_bin", "--metric", "accuracy", "--data-shard", "0/2", "-q", "--format", "table"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let row = ran.stdout.lines().find(|l| l.starts_with("binary ")).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert!(row.ends_with("  500 examples of data shard 0/2, metrics at report merge"), "{row}");
}
