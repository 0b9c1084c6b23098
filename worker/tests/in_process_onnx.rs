//! The bench's in-process floor for `.onnx` models (`isorun-worker
//! --in-process --onnxruntime PATH MODEL.onnx...`): it must run a real
//! ONNX model through ONNX Runtime's C API in its one process, or
//! scripts/bench_onnx.py has nothing to measure isorun against.

mod common;

use common::library;
use std::process::Command;

fn mlp() -> String {
    common::fixture("mlp.onnx")
}

/// The library's opening, then two sessions of mlp.onnx, one after the
/// other, each with its line, then the total; `--repeat` adds its line.
#[test]
fn in_process_runs_an_onnx_model_and_prints_its_line() {
    let model = mlp();
    let out = Command::new(env!("CARGO_BIN_EXE_isorun-worker"))
        // As isorun starts its workers: ONNX Runtime writes nothing into the home folder.
        .env("ORT_DISABLE_TELEMETRY", "1")
        .args(["--in-process", "--batch", "8", "--repeat", "2", "--onnxruntime"])
        .arg(library())
        .args([&model, &model])
        .output()
        .expect("isorun-worker starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\nstdout: {stdout}\nstderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let loads = stdout.lines().filter(|l| l.starts_with(&format!("{model}\tload ")) && l.contains("\ttotal ")).count();
    assert_eq!(loads, 2, "one line per model: {stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with(&format!("{model}\trepeat 2 runs\t"))).count(), 2, "{stdout}");
    let library = library();
    let opened = format!("{}\topen ", library.display());
    assert!(stdout.lines().next().is_some_and(|l| l.starts_with(&opened) && l.ends_with(" ms")), "{stdout}");
    let total = stdout.lines().last().unwrap_or_default();
    assert!(total.starts_with("total\t") && total.ends_with("\t2 models"), "{stdout}");
}

/// Without the library's path it says which flag is missing, for which file.
#[test]
fn in_process_onnx_without_a_library_names_the_flag() {
    let model = mlp();
    let out = Command::new(env!("CARGO_BIN_EXE_isorun-worker"))
        // As isorun starts its workers: ONNX Runtime writes nothing into the home folder.
        .env("ORT_DISABLE_TELEMETRY", "1")
        .args(["--in-process", &model])
        .output()
        .expect("isorun-worker starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&model) && stderr.contains("--onnxruntime PATH"), "{stderr}");
}
