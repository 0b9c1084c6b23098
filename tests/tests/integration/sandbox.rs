//! The sandbox proves itself: a model that reads a secret, writes outside
//! its folder or lists a folder is stopped under `--sandbox strict` (the
//! default) and succeeds under `--sandbox off`, so the sandbox did it.

use crate::util::{fixtures, isorun, run, Ran};
use serde_json::json;
use std::path::Path;

fn file_ops(signature: &str, inputs: &[(&str, &str)], sandbox: &str) -> Ran {
    let mut command = isorun();
    command.arg("run").arg(fixtures().join("hostile/file_ops")).args([
        "--signature",
        signature,
        "--values",
        "--json",
        "--sandbox",
        sandbox,
    ]);
    for (name, value) in inputs {
        command.arg("--input").arg(format!("{name}=@{}", json!(value)));
    }
    run(&mut command)
}

fn landlock_in_force(ran: &Ran) -> bool {
    let protections = &ran.records[0]["sandbox"];
    let on = protections.as_array().is_some_and(|p| p.iter().any(|x| x == "landlock"));
    if !on {
        eprintln!("!!! Landlock is not available on this kernel: the sandbox tests check nothing here !!!");
    }
    on
}

fn secret(dir: &Path) -> String {
    let path = dir.join("secret.txt");
    std::fs::write(&path, "s3cret").unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn reading_a_file_outside_the_model_is_denied_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let path = secret(tmp.path());
    let strict = file_ops("read", &[("path", &path)], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    assert_eq!(strict.records[0]["status"], "error", "{}", strict.stdout);
    assert_eq!(strict.records[0]["error"]["code"], "PERMISSION_DENIED");
    assert!(strict.records[0]["error"]["message"].as_str().unwrap().contains(&path));
    let shadow = file_ops("read", &[("path", "/etc/shadow")], "strict");
    assert_eq!(shadow.records[0]["error"]["code"], "PERMISSION_DENIED", "not even /etc/shadow as root");

    let off = file_ops("read", &[("path", &path)], "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert_eq!(off.records[0]["outputs"]["contents"]["values"], "s3cret");
    assert!(off.records[0].get("sandbox").is_none());
}

#[test]
fn writing_outside_the_model_is_denied_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("pwned.txt");
    let target_text = target.to_string_lossy().into_owned();
    let strict = file_ops("write", &[("path", &target_text), ("contents", "pwned")], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    assert_eq!(strict.records[0]["error"]["code"], "PERMISSION_DENIED", "{}", strict.stdout);
    assert!(!target.exists(), "nothing was written");

    let off = file_ops("write", &[("path", &target_text), ("contents", "pwned")], "off");
    assert_eq!(off.records[0]["status"], "ok", "{}", off.stdout);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "pwned");
}

#[test]
fn listing_a_folder_outside_the_model_finds_nothing_under_strict() {
    let tmp = tempfile::tempdir().unwrap();
    secret(tmp.path());
    let pattern = format!("{}/*", tmp.path().display());
    let strict = file_ops("list", &[("pattern", &pattern)], "strict");
    if !landlock_in_force(&strict) {
        return;
    }
    // TensorFlow's MatchingFiles treats an unreadable folder as empty.
    let listed = &strict.records[0]["outputs"]["files"]["values"];
    assert_eq!(listed, &json!([]), "{}", strict.stdout);
    let home =
        file_ops("list", &[("pattern", &format!("{}/*", std::env::var("HOME").unwrap_or("/root".into())))], "strict");
    assert_eq!(home.records[0]["outputs"]["files"]["values"], json!([]), "the home folder is not listed");

    let off = file_ops("list", &[("pattern", &pattern)], "off");
    let listed = off.records[0]["outputs"]["files"]["values"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{}", off.stdout);
}

#[test]
fn the_environment_is_cleared_and_every_protection_is_reported() {
    let environ = |sandbox: &str| {
        let mut command = isorun();
        command
            .env("ISORUN_TEST_SECRET_TOKEN", "hunter2")
            .arg("run")
            .arg(fixtures().join("hostile/file_ops"))
            .args(["--signature", "read", "--values", "--json", "--sandbox", sandbox])
            .arg("--input")
            .arg("path=@\"/proc/self/environ\"");
        run(&mut command)
    };
    let strict = environ("strict");
    if !landlock_in_force(&strict) {
        return;
    }
    let record = &strict.records[0];
    let protections: Vec<&str> = record["sandbox"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    for expected in ["landlock", "no_network", "no_new_privs", "no_core_dumps", "clean_env", "work_dir", "fd_limit"] {
        assert!(protections.contains(&expected), "{expected} not in force: {protections:?}");
    }
    let seen = record["outputs"]["contents"]["values"].as_str().unwrap_or_default().to_string();
    assert!(!seen.contains("hunter2"), "the environment reached the model: {seen}");
    let off = environ("off");
    let seen = off.records[0]["outputs"]["contents"]["values"].as_str().unwrap_or_default().to_string();
    assert!(seen.contains("hunter2"), "without the sandbox the model sees the environment");
}
