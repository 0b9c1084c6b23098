//! `isorun map MODULE:FUNCTION`: a user's Python function, each call in a
//! process forked from a zygote, driven through the real binary with plain
//! `python3` (no TensorFlow): every outcome with a real process (an
//! exception, a segfault through ctypes, an endless loop, a memory hog, a
//! leak into a module global), the items' sources, bad input, retries,
//! the journal and resume after SIGKILL, reports, the hidden flags of the
//! Python API, the sandbox, and the fall-back when the zygote has threads.

use crate::util::{gone_within, isorun, run, Ran};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The functions the tests call, in `fns.py`.
const FNS: &str = r#"
import ctypes, os, sys, time
state = []

def act(item):
    here = os.environ["MAP_TEST_DIR"]
    if item == "ok":
        return {"answer": 42}
    if item == "raise":
        raise ValueError("bad item %r" % (item,))
    if item == "segv":
        ctypes.string_at(0)
    if item in ("loop", "hog"):
        with open(os.path.join(here, item + ".pid"), "w") as f:
            f.write(str(os.getpid()))
        chunks = []
        while True:
            if item == "hog":
                chunks.append(bytearray(4 << 20))
    if item == "leak":
        state.append("leaked")
        return len(state)
    if item == "object":
        return object()
    return item

def log(item):
    here = os.environ["MAP_TEST_DIR"]
    with open(os.path.join(here, "log.txt"), "a") as f:
        f.write("%s\n" % (item,))
    if item == 3 and os.environ.get("MAP_TEST_HANG") == "1":
        while True:
            time.sleep(1)
    return item * 10

def flaky(item):
    path = os.path.join(os.environ["MAP_TEST_DIR"], "tries-%s" % (item,))
    with open(path, "a") as f:
        f.write("x")
    if os.path.getsize(path) < 2:
        os._exit(3)
    return "fine"

def write(item):
    with open(item, "w") as f:
        f.write("written")
    return "wrote"

def noisy(item):
    print("printed by the call")
    return item

def big(item):
    return "x" * item

def pair(item):
    return [type(item).__name__, list(item)]
"#;

/// A folder holding `fns.py`, the working folder of every map test.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fns.py"), FNS).unwrap();
    dir
}

/// `isorun map` run in `dir`, with plain python3 and JSON Lines out.
fn map(dir: &Path, args: &[&str]) -> Ran {
    run(map_command(dir).args(args))
}

fn map_command(dir: &Path) -> std::process::Command {
    let mut command = isorun();
    command
        .current_dir(dir)
        .env("MAP_TEST_DIR", dir)
        .env("ISORUN_PYTHON", "python3")
        .env_remove("ISORUN_SANDBOX")
        .arg("map")
        .arg("--json");
    command
}

fn by_item<'a>(ran: &'a Ran, item: &str) -> &'a Value {
    ran.records
        .iter()
        .find(|r| r["item"] == item)
        .unwrap_or_else(|| panic!("no record for {item}:\n{}\nstderr:\n{}", ran.stdout, ran.stderr))
}

fn pid_in(dir: &Path, name: &str) -> u32 {
    std::fs::read_to_string(dir.join(name)).unwrap().trim().parse().unwrap()
}

#[test]
fn every_outcome_is_closed_and_honest_and_the_next_item_runs_regardless() {
    let tmp = setup();
    let dir = tmp.path();
    let writable = dir.to_str().unwrap();
    let ran = map(
        dir,
        &[
            "fns:act",
            "raise",
            "segv",
            "loop",
            "hog",
            "leak",
            "leak",
            "ok",
            "object",
            "-j",
            "1",
            "--timeout",
            "3",
            "--memory-limit",
            "64M",
            "--writable",
            writable,
        ],
    );
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let items: Vec<&Value> = ran.records.iter().map(|r| &r["item"]).collect();
    assert_eq!(items, ["raise", "segv", "loop", "hog", "leak", "leak", "ok", "object"], "in item order");
    let indexes: Vec<u64> = ran.records.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, (0..8).collect::<Vec<u64>>());

    let error = by_item(&ran, "raise");
    assert_eq!(error["status"], "error");
    assert_eq!(error["error"]["kind"], "exception");
    assert_eq!(error["error"]["message"], "ValueError: bad item 'raise'");
    let traceback = error["error"]["traceback"].as_str().unwrap();
    assert!(traceback.contains("fns.py") && traceback.contains("in act"), "{traceback}");
    assert!(traceback.trim_end().ends_with("ValueError: bad item 'raise'"), "{traceback}");

    let crashed = by_item(&ran, "segv");
    assert_eq!(crashed["status"], "crashed");
    assert_eq!(crashed["signal"], "SIGSEGV");

    assert_eq!(by_item(&ran, "loop")["status"], "timeout");
    assert!(gone_within(pid_in(dir, "loop.pid"), Duration::from_secs(10)), "the endless loop is gone");
    let hog = by_item(&ran, "hog");
    assert_eq!(hog["status"], "memory_limit", "{hog}");
    assert!(hog["peak_rss_bytes"].as_u64().unwrap() > 64 << 20, "{hog}");
    assert!(gone_within(pid_in(dir, "hog.pid"), Duration::from_secs(10)), "the memory hog is gone");

    // A module global mutated by one call is not seen by the next.
    let leaks: Vec<&Value> = ran.records.iter().filter(|r| r["item"] == "leak").map(|r| &r["value"]).collect();
    assert_eq!(leaks, [1, 1]);

    // Exactly the contract's keys: none that do not apply, never null.
    let ok = by_item(&ran, "ok");
    let keys: Vec<&str> = ok.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["item", "index", "function", "status", "value", "value_type", "wall_ms", "peak_rss_bytes"]);
    assert_eq!(ok["value"]["answer"], 42);
    assert_eq!(ok["function"], "fns:act");
    let object = by_item(&ran, "object");
    assert_eq!(
        (object["status"].as_str(), object.get("value"), object["value_type"].as_str()),
        (Some("ok"), None, Some("object"))
    );
}

#[test]
fn items_come_from_arguments_a_file_and_stdin() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(dir.join("items.txt"), "3\n\n{\"a\": [1, 2]}\ndata/x.txt\n").unwrap();
    let ran = map(dir, &["fns:act", "1", "two", "--items-from", "items.txt"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let values: Vec<&Value> = ran.records.iter().map(|r| &r["value"]).collect();
    assert_eq!(
        values,
        [
            &serde_json::json!(1),
            &serde_json::json!("two"),
            &serde_json::json!(3),
            &serde_json::json!({"a": [1, 2]}),
            &serde_json::json!("data/x.txt")
        ]
    );

    let mut child = map_command(dir)
        .args(["fns:act", "--items-from", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"ok\n7\n").unwrap();
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.records.len(), 2);
    assert_eq!(ran.records[1]["value"], 7);
}

#[test]
fn bad_input_is_exit_2_before_any_call_naming_it() {
    let tmp = setup();
    let dir = tmp.path();
    let writable = dir.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["fns:act", "1", "--python", "no-such-python3"], "--python no-such-python3: no such program"),
        (&["nosuchmodule:f", "1"], "nosuchmodule:f: ModuleNotFoundError: No module named 'nosuchmodule'"),
        (&["fns:nosuch", "1"], "fns:nosuch: AttributeError: module fns has no attribute nosuch"),
        (&["fns:write", "--items-from", "missing.txt"], "--items-from missing.txt: cannot read"),
        (&["fns", "1"], "fns: expected MODULE:FUNCTION"),
        (
            &["fns:write", "--items-from", "bad.jsonl", "--items-pickled"],
            "--items-from bad.jsonl line 1: expected {\"file\": PATH, \"repr\": STRING}",
        ),
    ];
    std::fs::write(dir.join("bad.jsonl"), "[1]\n").unwrap();
    for (args, message) in cases {
        let mut all = args.to_vec();
        all.extend(["--writable", writable, "out.txt"]);
        let ran = map(dir, &all);
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(message), "{args:?}: {}", ran.stderr);
        assert!(ran.records.is_empty(), "{args:?}");
        assert!(!dir.join("out.txt").exists(), "{args:?}: no call ran");
    }
}

#[test]
fn retries_run_a_crashed_call_again() {
    let tmp = setup();
    let dir = tmp.path();
    let writable = dir.to_str().unwrap();
    let ran = map(dir, &["fns:flaky", "1", "--writable", writable]);
    assert_eq!(ran.code, Some(1));
    assert_eq!(ran.records[0]["status"], "crashed");
    assert!(ran.records[0]["error"]["message"].as_str().unwrap().contains("exited with code 3"), "{}", ran.stdout);

    let ran = map(dir, &["fns:flaky", "2", "--writable", writable, "--retries", "2"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stdout);
    let record = &ran.records[0];
    assert_eq!(
        (record["status"].as_str(), record["attempts"].as_u64(), record["flaky"].as_bool()),
        (Some("ok"), Some(2), Some(true))
    );
}

#[test]
fn resume_after_sigkill_of_the_supervisor_runs_only_what_is_missing() {
    let tmp = setup();
    let dir = tmp.path();
    let writable = dir.to_str().unwrap();
    let args = ["fns:log", "1", "2", "3", "4", "-j", "1", "--journal", "journal.jsonl", "--writable", writable];
    let mut child = map_command(dir).args(args).env("MAP_TEST_HANG", "1").stdout(Stdio::piped()).spawn().unwrap();
    let log = dir.join("log.txt");
    let journaled = || std::fs::read_to_string(dir.join("journal.jsonl")).unwrap_or_default().lines().count();
    // Item 3 may start (from a spare) before item 2's record is journaled:
    // kill once both have happened.
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("3\n") || journaled() < 2 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before item 3");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(journaled(), 2, "items 1 and 2 were done and journaled");
    // The zygote, its spare and the hanging call die with the supervisor.
    let needle = format!("MAP_TEST_DIR={}", dir.display());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !processes_with_env(&needle).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(processes_with_env(&needle), Vec::<u32>::new(), "a process outlived the killed supervisor");

    let ran = run(map_command(dir).args(args).arg("--resume"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let resumed: Vec<bool> = ran.records.iter().map(|r| r["resumed"] == true).collect();
    assert_eq!(resumed, [true, true, false, false]);
    let values: Vec<&Value> = ran.records.iter().map(|r| &r["value"]).collect();
    assert_eq!(values, [10, 20, 30, 40]);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "1\n2\n3\n3\n4\n", "1 and 2 were not run again");

    // Another function's (changed source) records are not this one's.
    std::fs::write(dir.join("fns.py"), FNS.replace("return item * 10", "return item * 100")).unwrap();
    let ran = run(map_command(dir).args(args).arg("--resume"));
    assert!(ran.records.iter().all(|r| r.get("resumed").is_none()), "{}", ran.stdout);
    assert_eq!(ran.records[0]["value"], 100);
}

#[test]
fn reports_junit_html_and_report_diff_take_map_records() {
    let tmp = setup();
    let dir = tmp.path();
    let ran = map(dir, &["fns:act", "ok", "raise", "--report", "a.json", "--junit", "a.xml", "--html", "a.html"]);
    assert_eq!(ran.code, Some(1));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("a.json")).unwrap()).unwrap();
    assert_eq!(report["summary"]["by_status"]["error"], 1);
    assert_eq!(report["units"][1]["model"], "raise");
    let junit = std::fs::read_to_string(dir.join("a.xml")).unwrap();
    assert!(junit.contains("name=\"raise\"") && junit.contains("ValueError"), "{junit}");
    assert!(std::fs::read_to_string(dir.join("a.html")).unwrap().contains("raise"));

    map(dir, &["fns:act", "raise", "ok", "--report", "b.json"]);
    let diff = run(isorun().current_dir(dir).args(["report", "diff", "a.json", "b.json"]));
    assert_eq!(diff.code, Some(0), "{}{}", diff.stdout, diff.stderr);
}

#[test]
fn the_python_api_flags_pickled_function_items_and_values() {
    let tmp = setup();
    let dir = tmp.path();
    let make = r#"
import pickle, fns
open("fn.pkl", "wb").write(pickle.dumps(fns.pair))
open("item0.pkl", "wb").write(pickle.dumps((1, 2)))
open("items.jsonl", "w").write('{"file": "item0.pkl", "repr": "(1, 2)"}\n')
"#;
    let made = std::process::Command::new("python3").current_dir(dir).args(["-c", make]).status().unwrap();
    assert!(made.success());
    std::fs::create_dir(dir.join("values")).unwrap();
    let ran = map(
        dir,
        &[
            "__main__:pair",
            "--function-pickle",
            "fn.pkl",
            "--items-from",
            "items.jsonl",
            "--items-pickled",
            "--values-dir",
            "values",
        ],
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["item"], "(1, 2)");
    assert_eq!(record["function"], "__main__:pair");
    assert_eq!(record["value"], serde_json::json!(["tuple", [1, 2]]), "the item arrived a tuple");
    let file = record["value_file"].as_str().unwrap();
    assert!(file.ends_with("values/0.pkl"), "{file}");
    let read = std::process::Command::new("python3")
        .args(["-c", &format!("import pickle; print(pickle.load(open({file:?}, 'rb')))")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "['tuple', [1, 2]]");

    // A value over the cap is that item's error, its file removed.
    let ran = map(dir, &["fns:big", "10", "100000", "--values-dir", "values", "--value-cap", "10K"]);
    assert_eq!(ran.records[0]["status"], "ok");
    let over = &ran.records[1];
    assert_eq!(
        (over["status"].as_str(), over["error"]["kind"].as_str()),
        (Some("error"), Some("value_too_large")),
        "{over}"
    );
    assert!(!dir.join("values/1.pkl").exists());
}

#[test]
fn the_sandbox_lets_calls_write_only_beneath_writable_folders() {
    let tmp = setup();
    let dir = tmp.path();
    let target = dir.join("out.txt");
    let target = target.to_str().unwrap();
    let ran = map(dir, &["fns:write", target]);
    assert_eq!(ran.records[0]["status"], "error", "{}", ran.stdout);
    assert!(ran.records[0]["error"]["message"].as_str().unwrap().starts_with("PermissionError"), "{}", ran.stdout);
    assert!(!Path::new(target).exists());

    let ran = map(dir, &["fns:write", target, "--sandbox", "off"]);
    assert_eq!(ran.records[0]["status"], "ok", "{}", ran.stdout);
    std::fs::remove_file(target).unwrap();
    let ran = map(dir, &["fns:write", target, "--writable", dir.to_str().unwrap()]);
    assert_eq!(ran.records[0]["status"], "ok", "{}", ran.stdout);
}

#[test]
fn a_zygote_with_threads_falls_back_to_a_fresh_interpreter_per_call_saying_why_once() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("threaded.py"),
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n\
         def f(x):\n    return x + 1\n",
    )
    .unwrap();
    let ran = map(dir, &["threaded:f", "1", "2", "-j", "1"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let values: Vec<&Value> = ran.records.iter().map(|r| &r["value"]).collect();
    assert_eq!(values, [2, 3]);
    assert_eq!(ran.stderr.matches("cannot fork safely (it runs 2 threads)").count(), 1, "{}", ran.stderr);
}

#[test]
fn the_zygote_runs_one_thread_and_maps_no_cuda_library() {
    let tmp = setup();
    let ran = map(tmp.path(), &["fns:act", "ok", "-v"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.stderr.contains("1 thread(s), no CUDA library mapped"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("cannot fork safely"), "{}", ran.stderr);
}

#[test]
fn gpus_pin_a_device_per_slot_in_the_call_not_the_zygote() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("gpu.py"),
        "import os\nat_import = os.environ.get('CUDA_VISIBLE_DEVICES')\n\
         def f(x):\n    return [at_import, os.environ.get('CUDA_VISIBLE_DEVICES')]\n",
    )
    .unwrap();
    let ran =
        run(map_command(dir).args(["gpu:f", "1", "2", "-j", "1", "--gpus", "3"]).env_remove("CUDA_VISIBLE_DEVICES"));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    for record in &ran.records {
        assert_eq!(record["value"], serde_json::json!([null, "3"]), "{record}");
    }
}

#[test]
fn a_table_with_totals_when_asked_for() {
    let tmp = setup();
    let ran = run(isorun()
        .current_dir(tmp.path())
        .env("MAP_TEST_DIR", tmp.path())
        .args(["map", "fns:act", "ok", "raise", "--format", "table"]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(lines[0].starts_with("item") && lines[0].contains("status"), "{}", ran.stdout);
    assert!(lines[1].starts_with("ok ") && lines[1].contains("{\"answer\":42}"), "{}", ran.stdout);
    assert!(lines[2].starts_with("raise") && lines[2].contains("ValueError: bad item 'raise'"), "{}", ran.stdout);
    assert!(ran.stdout.contains("2 items: 1 ok, 1 not ok"), "{}", ran.stdout);
}

#[test]
fn no_network_unless_asked_for() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("net.py"),
        "import socket\ndef f(port):\n    socket.create_connection(('127.0.0.1', port), timeout=5).close()\n    return 'connected'\n",
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let ran = map(dir, &["net:f", &port]);
    assert_eq!(ran.records[0]["status"], "error", "{}", ran.stdout);
    let ran = map(dir, &["net:f", &port, "--network"]);
    assert_eq!(ran.records[0]["value"], "connected", "{}", ran.stdout);
}

#[test]
fn ctrl_c_stops_the_run_and_its_calls() {
    let tmp = setup();
    let dir = tmp.path();
    let writable = dir.to_str().unwrap();
    let mut child = map_command(dir)
        .args(["fns:act", "loop", "ok", "-j", "1", "--writable", writable])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !dir.join("loop.pid").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its call started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    let statuses: Vec<&Value> = ran.records.iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, ["not_run", "not_run"], "{}", ran.stdout);
    assert!(gone_within(pid_in(dir, "loop.pid"), Duration::from_secs(10)), "the call is gone");
}

#[test]
fn items_per_worker_share_a_process_until_a_call_ends_it() {
    let tmp = setup();
    let dir = tmp.path();
    let ran =
        map(dir, &["fns:act", "leak", "leak", "leak", "segv", "leak", "leak", "-j", "1", "--items-per-worker", "3"]);
    let values: Vec<&Value> = ran.records.iter().map(|r| r.get("value").unwrap_or(&r["status"])).collect();
    // 1-3 share a process; the crash ends the second one, and the items after it get a fresh one.
    assert_eq!(
        values,
        [
            &serde_json::json!(1),
            &serde_json::json!(2),
            &serde_json::json!(3),
            &serde_json::json!("crashed"),
            &serde_json::json!(1),
            &serde_json::json!(2)
        ],
        "{}",
        ran.stdout
    );
    assert!(ran.records.iter().all(|r| r["peak_rss_bytes"].as_u64().unwrap() > 0), "{}", ran.stdout);
}

#[test]
fn what_the_function_prints_goes_to_stderr_not_among_the_records() {
    let tmp = setup();
    let ran = map(tmp.path(), &["fns:noisy", "1"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.stdout.lines().count(), 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("printed by the call"), "{}", ran.stderr);
}

/// Live processes whose environment holds `needle` (`MAP_TEST_DIR=...`).
fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|&b| b == 0).any(|var| var == needle.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn spares_keep_calls_isolated_and_leave_no_process_behind() {
    for spares in ["0", "1"] {
        let tmp = setup();
        let dir = tmp.path();
        let ran = map(dir, &["fns:act", "leak", "leak", "leak", "leak", "-j", "2", "--spares", spares]);
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        let values: Vec<&Value> = ran.records.iter().map(|r| &r["value"]).collect();
        assert_eq!(values, [1, 1, 1, 1], "--spares {spares}");
        let needle = format!("MAP_TEST_DIR={}", dir.display());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !processes_with_env(&needle).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(processes_with_env(&needle), Vec::<u32>::new(), "--spares {spares}: a process outlived the run");
    }
}

#[test]
fn a_resumed_value_file_is_copied_into_this_run_s_values_dir_or_the_call_runs_again() {
    let tmp = setup();
    let dir = tmp.path();
    for name in ["v1", "v2", "v3"] {
        std::fs::create_dir(dir.join(name)).unwrap();
    }
    let args = |values: &'static str| ["fns:act", "ok", "--journal", "j.jsonl", "--resume", "--values-dir", values];
    let first = map(dir, &args("v1"));
    assert!(first.records[0]["value_file"].as_str().unwrap().ends_with("v1/0.pkl"), "{}", first.stdout);
    let second = map(dir, &args("v2"));
    let record = &second.records[0];
    assert_eq!(record["resumed"], true, "{}", second.stdout);
    let file = record["value_file"].as_str().unwrap();
    assert!(file.ends_with("v2/0.pkl") && Path::new(file).is_file(), "{}", second.stdout);

    std::fs::remove_file(dir.join("v1/0.pkl")).unwrap();
    std::fs::remove_file(dir.join("v2/0.pkl")).unwrap();
    let third = map(dir, &args("v3"));
    let record = &third.records[0];
    assert!(record.get("resumed").is_none(), "the value is gone: the call runs again: {}", third.stdout);
    assert!(dir.join("v3/0.pkl").is_file());
}

#[test]
fn a_process_that_dies_before_it_takes_its_item_is_that_item_s_crash() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("atfork.py"),
        "import os\nos.register_at_fork(after_in_child=lambda: os._exit(5))\ndef f(x):\n    return x\n",
    )
    .unwrap();
    for spares in ["0", "1"] {
        let ran = map(dir, &["atfork:f", "1", "2", "-j", "1", "--spares", spares]);
        assert_eq!(ran.code, Some(1), "{}", ran.stderr);
        for record in &ran.records {
            assert_eq!(record["status"], "crashed", "{record}");
            assert!(record["error"]["message"].as_str().unwrap().contains("exited with code 5"), "{record}");
        }
        assert_eq!(ran.records.len(), 2);
    }
}

/// Functions that start processes of their own and leave them running.
const SPAWNS: &str = r#"
import os, subprocess

def spawn(item):
    here = os.environ["MAP_TEST_DIR"]
    if item == "hang":
        sleep = subprocess.Popen(["sleep", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(here, "hang.pids"), "w") as f:
            f.write("%d %d" % (os.getpid(), sleep.pid))
        while True:
            pass
    if item.startswith("check "):
        # Which of the processes an earlier call wrote down still run.
        running = []
        for pid in open(os.path.join(here, item[6:])).read().split():
            try:
                state = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                running.append(int(pid))
        return running
    # A shell that puts sleep in the background and ends: the sleep is an orphan.
    pid = subprocess.check_output(["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"], stderr=subprocess.DEVNULL)
    with open(os.path.join(here, "left.pids"), "w") as f:
        f.write("%d %s" % (os.getpid(), pid.decode().strip()))
    return "left it running"
"#;

fn pids_in(dir: &Path, name: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    text.split_whitespace().map(|pid| pid.parse().unwrap()).collect()
}

#[test]
fn what_a_call_started_dies_with_it_on_timeout_and_when_it_returns() {
    for sandbox in ["strict", "off"] {
        let tmp = setup();
        let dir = tmp.path();
        std::fs::write(dir.join("spawns.py"), SPAWNS).unwrap();
        let writable = dir.to_str().unwrap();
        let ran = map(
            dir,
            &[
                "spawns:spawn",
                "hang",
                "check hang.pids",
                "-j",
                "1",
                "--timeout",
                "2",
                "--writable",
                writable,
                "--sandbox",
                sandbox,
            ],
        );
        assert_eq!(by_item(&ran, "hang")["status"], "timeout", "{}", ran.stderr);
        // The next call (one slot: after the record) finds neither running.
        let check = by_item(&ran, "check hang.pids");
        assert_eq!(check["value"], serde_json::json!([]), "--sandbox {sandbox}: {check}");
        for pid in pids_in(dir, "hang.pids") {
            assert!(gone_within(pid, Duration::from_secs(10)), "--sandbox {sandbox}: {pid} outlived the call");
        }

        let ran = map(
            dir,
            &["spawns:spawn", "left", "check left.pids", "-j", "1", "--writable", writable, "--sandbox", sandbox],
        );
        assert_eq!(by_item(&ran, "left")["status"], "ok", "{}", ran.stderr);
        let check = by_item(&ran, "check left.pids");
        assert_eq!(check["value"], serde_json::json!([]), "--sandbox {sandbox}: {check}");
        for pid in pids_in(dir, "left.pids") {
            assert!(gone_within(pid, Duration::from_secs(10)), "--sandbox {sandbox}: {pid} outlived the call");
        }
    }
}

/// A module that holds 200 MiB from its import on (in the zygote, shared
/// copy-on-write with every call it forks).
const HEAVY: &str = r#"
BLOB = b"\x01" * (200 << 20)

def f(item):
    if item == "big":
        mine = b"\x02" * (300 << 20)
        return len(mine)
    return len(BLOB)
"#;

#[test]
fn a_call_s_memory_is_its_own_not_what_it_shares_with_the_zygote() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(dir.join("heavy.py"), HEAVY).unwrap();
    let ran = map(dir, &["heavy:f", "small", "big", "-j", "1", "--memory-limit", "100M"]);
    let small = by_item(&ran, "small");
    assert_eq!(small["status"], "ok", "{small}\n{}", ran.stderr);
    let peak = small["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak < 100 << 20, "the zygote's 200 MiB is not the call's: {small}");
    let big = by_item(&ran, "big");
    assert_eq!(big["status"], "memory_limit", "{big}");
    assert!(big["peak_rss_bytes"].as_u64().unwrap() > 100 << 20, "{big}");
}

#[test]
fn a_closed_stdout_stops_the_run_at_once_and_leaves_no_process_or_temp_folder() {
    let tmp = setup();
    let dir = tmp.path();
    let temp = dir.join("tmp");
    std::fs::create_dir(&temp).unwrap();
    let writable = dir.to_str().unwrap();
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into fds (close-on-exec: no
    // other process may hold the read end open).
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and ours.
    let (read, write) = unsafe {
        use std::os::fd::FromRawFd;
        (std::fs::File::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1]))
    };
    let mut child = map_command(dir)
        .env("TMPDIR", &temp)
        .args(["fns:act", "ok", "loop", "ok", "-j", "1", "--writable", writable, "--report", "report.json"])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: the first record read, then the reader gone.
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&read), &mut first).unwrap();
    assert!(first.contains("\"ok\""), "{first}");
    while !dir.join("loop.pid").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its long call started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(read);
    // The call never ends by itself and there is no --timeout: only the
    // closed stdout can end the run.
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(gone_within(pid_in(dir, "loop.pid"), Duration::from_secs(10)), "the call is gone");
    let report = std::fs::read_to_string(dir.join("report.json")).unwrap();
    assert!(report.contains("stdout_closed"), "{report}");
    let left: Vec<_> = std::fs::read_dir(&temp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
}

#[test]
fn sigterm_while_the_zygote_imports_ends_the_run_and_removes_its_temp_folder() {
    let tmp = setup();
    let dir = tmp.path();
    let temp = dir.join("tmp");
    std::fs::create_dir(&temp).unwrap();
    std::fs::write(
        dir.join("slow.py"),
        "import os, time\nopen(os.path.join(os.environ['MAP_TEST_DIR'], 'importing.pid'), 'w').write(str(os.getpid()))\n\
         time.sleep(1000)\ndef f(x):\n    return x\n",
    )
    .unwrap();
    let mut child = map_command(dir)
        .env("TMPDIR", &temp)
        .args(["slow:f", "1", "--writable", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !dir.join("importing.pid").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the zygote imported");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let ran = crate::util::ran(child.wait_with_output().unwrap());
    assert_eq!(ran.code, Some(143), "{}", ran.stderr);
    assert!(gone_within(pid_in(dir, "importing.pid"), Duration::from_secs(10)), "the zygote is gone");
    let left: Vec<_> = std::fs::read_dir(&temp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
}

#[test]
fn a_module_whose_import_crashes_hangs_or_raises_is_every_item_s_failure_with_reports() {
    let tmp = setup();
    let dir = tmp.path();
    let modules = [
        ("crash", "import ctypes\nctypes.string_at(0)\ndef f(x):\n    return x\n"),
        ("hang", "import time\ntime.sleep(1000)\ndef f(x):\n    return x\n"),
        ("raises", "raise ValueError('no config here')\ndef f(x):\n    return x\n"),
        ("nested", "import no_such_dependency_here\ndef f(x):\n    return x\n"),
    ];
    for (name, source) in modules {
        std::fs::write(dir.join(format!("{name}.py")), source).unwrap();
        let target = format!("{name}:f");
        let report = format!("{name}.json");
        let junit = format!("{name}.xml");
        let args = [&target, "1", "2", "--start-timeout", "2", "--report", &report, "--junit", &junit];
        let ran = map(dir, &args);
        assert_eq!(ran.code, Some(1), "{name}: {}", ran.stderr);
        assert_eq!(ran.records.len(), 2, "{name}: {}", ran.stdout);
        for record in &ran.records {
            assert_eq!(record["error"]["kind"], "import_failed", "{name}: {record}");
            assert!(record.get("attempts").is_none(), "{name}: {record}");
            let message = record["error"]["message"].as_str().unwrap();
            match name {
                "crash" => {
                    assert_eq!(record["status"], "spawn_failed", "{record}");
                    assert_eq!(record["signal"], "SIGSEGV", "{record}");
                    assert!(message.contains("killed by SIGSEGV"), "{record}");
                }
                "hang" => {
                    assert_eq!(record["status"], "spawn_failed", "{record}");
                    assert!(message.contains("--start-timeout 2"), "{record}");
                }
                "raises" => {
                    assert_eq!(record["status"], "error", "{record}");
                    assert!(message.contains("ValueError: no config here"), "{record}");
                    assert!(record["error"]["traceback"].as_str().unwrap().contains("raises.py"), "{record}");
                }
                _ => {
                    assert_eq!(record["status"], "error", "{record}");
                    assert!(message.contains("no_such_dependency_here"), "{record}");
                }
            }
        }
        assert!(!ran.stderr.contains("its stderr above says why"), "{name}: {}", ran.stderr);
        assert!(std::fs::read_to_string(dir.join(&report)).unwrap().contains("import_failed"), "{name}");
        assert!(std::fs::read_to_string(dir.join(&junit)).unwrap().contains("<testsuite"), "{name}");
    }
}

#[test]
fn value_cap_stops_the_value_s_writing_at_the_cap() {
    let tmp = setup();
    let dir = tmp.path();
    // Each chunk of the value says when pickle reaches it: a write that
    // stops at the cap reaches about 10 of the 100 (1 MiB each).
    std::fs::write(
        dir.join("chunks.py"),
        "import os\nclass Chunk:\n    def __reduce__(self):\n\
         \x20       with open(os.path.join(os.environ['MAP_TEST_DIR'], 'reduced.txt'), 'a') as f:\n\
         \x20           f.write('x')\n\
         \x20       return (bytes, (b'x' * (1 << 20),))\n\
         def f(n):\n    return [Chunk() for _ in range(n)]\n",
    )
    .unwrap();
    let writable = dir.to_str().unwrap();
    let ran = map(dir, &["chunks:f", "100", "--values-dir", "values", "--value-cap", "10M", "--writable", writable]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["error"]["kind"], "value_too_large", "{record}");
    assert!(record.get("value_file").is_none(), "{record}");
    let reduced = std::fs::read_to_string(dir.join("reduced.txt")).unwrap().len();
    assert!(reduced < 20, "pickled {reduced} of 100 chunks past a 10 MiB cap");
    let left: Vec<_> = std::fs::read_dir(dir.join("values")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in --values-dir: {left:?}");
}

/// `import tensorflow` reaches pyarrow through pandas where pyarrow is
/// installed, and pyarrow's jemalloc starts a background thread at import:
/// the zygote keeps it from starting, so it still forks (and the call gets
/// the caller's setting back).
#[test]
fn a_zygote_that_imports_pyarrow_still_forks() {
    let Some(python) = crate::util::fixtures_python("map with pyarrow preloaded") else {
        return;
    };
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("arrow.py"),
        "import os, pyarrow\n\
         def f(x):\n    return [len(os.listdir('/proc/self/task')), os.environ.get('JE_ARROW_MALLOC_CONF')]\n",
    )
    .unwrap();
    let ran = run(map_command(dir)
        .env("ISORUN_PYTHON", &python)
        .env_remove("JE_ARROW_MALLOC_CONF")
        .args(["arrow:f", "1", "-j", "1", "-v"]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(!ran.stderr.contains("cannot fork safely"), "{}", ran.stderr);
    assert!(ran.stderr.contains("1 thread(s), no CUDA library mapped"), "{}", ran.stderr);
    assert_eq!(ran.records[0]["value"][1], Value::Null, "{}", ran.records[0]);
}

#[test]
fn the_supervisor_keeps_no_value_once_printed() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(dir.join("items.txt"), "1000000\n".repeat(150)).unwrap();
    // The totals line says the supervisor's own peak (VmHWM); 150 values
    // of 1 MB held would pass 150 MiB.
    let ran = run(isorun().current_dir(dir).env("ISORUN_PYTHON", "python3").args([
        "map",
        "fns:big",
        "--items-from",
        "items.txt",
        "-j",
        "1",
        "--format",
        "table",
        "--report",
        "r.json",
    ]));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let totals = ran.stdout.lines().last().unwrap();
    let peak: f64 = totals
        .split("supervisor peak memory ")
        .nth(1)
        .and_then(|rest| rest.trim_end_matches(" MiB").parse().ok())
        .unwrap_or_else(|| panic!("no peak in {totals:?}"));
    assert!(peak < 64.0, "{totals}");
}

#[test]
fn json_items_arrive_as_python_reads_them_and_broken_json_is_refused() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(dir.join("show.py"), "def f(x):\n    return repr(x)\n").unwrap();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let lines = ["12345678901234567890123", "1e999", r#""\ud800""#, &deep, "a/path.txt", "2024-01-01", "3d.txt"];
    std::fs::write(dir.join("items.txt"), lines.join("\n")).unwrap();
    let ran = map(dir, &["show:f", "--items-from", "items.txt"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let values: Vec<&str> = ran.records.iter().map(|r| r["value"].as_str().unwrap()).collect();
    let python_deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let expected =
        ["12345678901234567890123", "inf", r"'\ud800'", &python_deep, "'a/path.txt'", "'2024-01-01'", "'3d.txt'"];
    assert_eq!(values, expected);
    std::fs::write(dir.join("broken.txt"), "1\n\n{\"a\": \n").unwrap();
    let ran = map(dir, &["fns:act", "--items-from", "broken.txt"]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--items-from broken.txt line 3: starts like JSON but is not JSON"), "{}", ran.stderr);
    assert!(ran.records.is_empty());
}

#[test]
fn a_call_that_kills_or_stops_its_zygote_is_its_own_crash_with_its_answer_kept() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("parent.py"),
        "import os, signal, time\ndef f(x):\n    if x == 'kill':\n        os.kill(os.getppid(), signal.SIGKILL)\n\
         \x20       time.sleep(30)\n    if x == 'stop':\n        os.kill(os.getppid(), signal.SIGSTOP)\n\
         \x20       return 7\n    return x\n",
    )
    .unwrap();
    let ran = map(dir, &["parent:f", "kill", "stop", "after", "-j", "1", "--sandbox", "off"]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let killed = by_item(&ran, "kill");
    assert_eq!(killed["status"], "crashed", "{killed}");
    assert!(killed["error"]["message"].as_str().unwrap().contains("zygote was killed by SIGKILL"), "{killed}");
    let stopped = by_item(&ran, "stop");
    assert_eq!(stopped["status"], "crashed", "{stopped}");
    assert_eq!(stopped["value"], 7, "the answer that came is kept: {stopped}");
    assert!(stopped["error"]["message"].as_str().unwrap().contains("zygote was stopped"), "{stopped}");
    assert_eq!(by_item(&ran, "after")["status"], "ok");
    assert!(ran.records.iter().all(|r| r.get("attempts").is_none()), "{}", ran.stdout);
}

#[test]
fn an_ok_value_left_out_of_its_record_says_why() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(
        dir.join("values.py"),
        "def f(x):\n    return {'nan': float('nan'), 'big': 'x' * 2000000}.get(x, x)\n",
    )
    .unwrap();
    let ran = map(dir, &["values:f", "nan", "big", "small"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let omitted = |item: &str| by_item(&ran, item).get("value_omitted").cloned();
    assert_eq!(omitted("nan"), Some("not JSON".into()), "{}", ran.stdout.chars().take(500).collect::<String>());
    assert_eq!(omitted("big"), Some("over 1 MiB".into()));
    assert_eq!(omitted("small"), None);
    assert_eq!(by_item(&ran, "small")["value"], "small");
    assert_eq!(by_item(&ran, "nan")["value_type"], "float");
}

#[test]
fn a_table_fits_columns_and_prints_the_messages_it_cut_whole() {
    let tmp = setup();
    let dir = tmp.path();
    std::fs::write(dir.join("long.py"), "def f(x):\n    raise ValueError('start ' + 'x' * 200 + ' END')\n").unwrap();
    let ran = run(isorun()
        .current_dir(dir)
        .env("ISORUN_PYTHON", "python3")
        .env("COLUMNS", "70")
        .args(["map", "long:f", "one", "--format", "table"]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let row = ran.stdout.lines().find(|line| line.starts_with("one")).unwrap();
    assert!(row.chars().count() <= 70 && row.contains('…') && row.contains("END"), "{}", ran.stdout);
    let below = ran.stdout.split("messages cut above").nth(1).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert!(below.contains(&format!("one: ValueError: start {} END", "x".repeat(200))), "{}", ran.stdout);
}
