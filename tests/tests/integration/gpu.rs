//! `--gpus` on any machine, a GPU-less one included: each slot's workers
//! see their device through `CUDA_VISIBLE_DEVICES` (the fault worker's `env`
//! models answer what they saw), records name it, and without NVML or
//! libcuda nothing breaks: records just have no GPU memory fields.

use crate::util::{fake_models, isorun_fault, run, write_input, Ran};
use serde_json::Value;
use std::path::Path;

/// `isorun run` over `names` with the fault worker, `--values --json`,
/// no `CUDA_VISIBLE_DEVICES` of the test's own environment, and
/// `ISORUN_ASSUME_GPUS=1`.
fn run_gpu(root: &Path, names: &[&str], extra: &[&str], env: Option<&str>) -> Ran {
    fake_models(&root.join("models"), names);
    let input = write_input(root);
    let mut command = isorun_fault(&[]);
    command.arg(root.join("models")).arg(format!("--input=x={}", input.display())).args(["--values", "--json"]);
    command.args(extra).env_remove("CUDA_VISIBLE_DEVICES").env_remove("CUDA_DEVICE_ORDER");
    // Bind slots to devices as on a GPU machine, also on one without (where a
    // run binds none: nightly_surprises.rs tests that).
    command.env("ISORUN_ASSUME_GPUS", "1");
    if let Some(devices) = env {
        command.env("CUDA_VISIBLE_DEVICES", devices);
    }
    run(&mut command)
}

/// What an `env` model's worker saw in one of its variables.
fn saw<'a>(record: &'a Value, name: &str) -> &'a str {
    record["outputs"][name]["values"][0].as_str().unwrap_or_else(|| panic!("no {name} output: {record}"))
}

fn nvml_absent(ran: &Ran) -> bool {
    ran.stderr.contains("NVML (libnvidia-ml.so.1, from the NVIDIA driver) is not available here")
}

#[test]
fn gpus_0_binds_the_slot_to_device_0_and_records_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_gpu(tmp.path(), &["fault-env", "good"], &["--gpus", "0"], None);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    for record in &ran.records {
        assert_eq!(record["status"], "ok", "{record}");
    }
    let env = ran.record("fault-env");
    // The device as CUDA_VISIBLE_DEVICES names it: "0" here, its UUID where NVML is present.
    let device = env["gpu"].as_str().expect("a gpu field");
    assert_eq!(saw(env, "CUDA_VISIBLE_DEVICES"), device);
    assert_eq!(saw(env, "CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    assert_eq!(ran.record("good")["gpu"], device);
    if nvml_absent(&ran) {
        assert_eq!(device, "0");
        for record in &ran.records {
            let gpu_keys: Vec<&String> = record.as_object().unwrap().keys().filter(|k| k.starts_with("gpu")).collect();
            assert_eq!(gpu_keys, ["gpu"], "nothing measured without NVML: {record}");
        }
    } else {
        assert!(device.starts_with("GPU-") || device.starts_with("MIG-"), "{device}");
    }
}

#[test]
fn without_gpus_workers_see_no_gpu_unless_the_environment_names_some() {
    let tmp = tempfile::tempdir().unwrap();
    let hidden = run_gpu(tmp.path(), &["fault-env"], &[], None);
    assert_eq!(hidden.code, Some(0), "{}", hidden.stderr);
    let record = hidden.record("fault-env");
    assert_eq!(saw(record, "CUDA_VISIBLE_DEVICES"), "", "set, and empty: no GPU");
    assert_eq!(saw(record, "CUDA_DEVICE_ORDER"), "<unset>");
    assert!(record.get("gpu").is_none(), "no device without --gpus: {record}");
    assert!(!hidden.stderr.contains("NVML"), "NVML is not even loaded without --gpus: {}", hidden.stderr);

    let tmp = tempfile::tempdir().unwrap();
    let inherited = run_gpu(tmp.path(), &["fault-env"], &[], Some("2,3"));
    let record = inherited.record("fault-env");
    assert_eq!(saw(record, "CUDA_VISIBLE_DEVICES"), "2,3", "the user's environment passes through");
    assert!(record.get("gpu").is_none());
}

#[test]
fn workers_per_gpu_sets_the_jobs_and_slots_spread_over_the_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("report.json");
    let names = ["a-fault-env", "b-fault-env", "c-fault-env", "d-fault-env", "e-fault-env", "f-fault-env"];
    let extra = ["--gpus", "0,1", "--workers-per-gpu", "2", "--report", report.to_str().unwrap()];
    let ran = run_gpu(tmp.path(), &names, &extra, None);
    if !nvml_absent(&ran) && ran.code == Some(2) {
        eprintln!("this machine has NVML but not two GPUs: {}", ran.stderr);
        return;
    }
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["settings"]["jobs"], 4, "2 devices x 2 workers each");
    assert_eq!(report["settings"]["workers_per_gpu"], 2);
    let devices: Vec<&str> =
        report["settings"]["gpus"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(devices.len(), 2);
    for name in names {
        let record = ran.record(name);
        let device = record["gpu"].as_str().unwrap();
        assert!(devices.contains(&device), "{record}");
        assert_eq!(saw(record, "CUDA_VISIBLE_DEVICES"), device, "the worker sees its slot's device only");
    }
    // The report keeps the device too.
    assert!(report["units"].as_array().unwrap().iter().all(|u| u["gpu"].is_string()));
}

#[test]
fn gpu_hold_without_libcuda_fails_its_unit_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = run_gpu(tmp.path(), &["fault-gpu-hold-1", "good"], &["--gpus", "0", "-j", "1"], None);
    assert_eq!(ran.record("good")["status"], "ok");
    let hold = ran.record("fault-gpu-hold-1");
    if hold["status"] == "ok" {
        eprintln!("libcuda is here and took 1 GiB: {hold}");
        return;
    }
    assert_eq!(hold["status"], "error", "{hold}");
    assert_eq!(ran.code, Some(1));
    let message = hold["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot load libcuda.so.1"), "{message}");
    assert!(hold.get("gpu_peak_bytes").is_none());
}

#[test]
fn gpu_usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--workers-per-gpu", "2"], "--gpus"),
        (&["--gpus", "0,0"], "named twice"),
        (&["--gpus", "gpu0"], "is not a device"),
        (&["--gpus", "0", "--gpu-memory-fraction", "0"], "--gpu-memory-fraction 0"),
        (&["--gpus", "0", "--gpu-memory-fraction", "1.5"], "at most 1"),
    ];
    for (args, expected) in cases {
        let ran = run_gpu(tmp.path(), &["good"], args, None);
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(expected), "{args:?}: {}", ran.stderr);
        assert!(ran.records.is_empty());
    }
    let all = run_gpu(tmp.path(), &["good"], &["--gpus", "all"], None);
    if !Path::new("/dev/nvidiactl").exists() {
        // No NVIDIA driver, so no NVML: `all` cannot be listed.
        assert_eq!(all.code, Some(2), "{}", all.stderr);
        assert!(all.stderr.contains("--gpus all: cannot list this machine's GPUs: NVML"), "{}", all.stderr);
    }
}
