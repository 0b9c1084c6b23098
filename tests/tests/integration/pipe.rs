//! `isorun pipe`: one answer per non-blank line, in order, ids echoed
//! exactly; crashes cost one request; recycling starts fresh workers.

use crate::util::{bin, fixtures, isorun};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Piped {
    code: Option<i32>,
    answers: Vec<Value>,
    stderr: String,
}

/// Starts `command` with stdin, stdout and stderr piped.
fn spawn_piped(command: &mut Command) -> std::process::Child {
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn pipe(command: &mut Command, stdin: &str) -> Piped {
    let mut child = spawn_piped(command);
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(text.as_bytes());
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    Piped {
        code: output.status.code(),
        answers: stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A copy of the multi_sig fixture (serving_default: x float32 [?, 3]) under
/// `name`, so the fault worker takes its orders from the folder name.
fn fault_model(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixtures().join("models/multi_sig/saved_model.pb"), dir.join("saved_model.pb")).unwrap();
    dir
}

fn fault_pipe(model: &Path) -> Command {
    let mut command = isorun();
    command.env("ISORUN_WORKER", bin("isorun-fault-worker")).arg("pipe").arg(model);
    command
}

#[test]
fn every_line_gets_one_answer_in_order_with_its_id() {
    let model = fixtures().join("models/multi_sig");
    let stdin = [
        r#"{"id": 1, "inputs": {"a": [1, 2], "b": [10, 20]}}"#,
        "",
        "   ",
        "this is not json",
        r#"{"id": "two", "inputs": {"a": [1.5], "b": [1]}}"#,
        r#"{"id": {"nested": [1, 2.5]}, "inputs": {"zz": [1]}}"#,
        r#"{"id": 4}"#,
        r#"{"id": 5, "inputs": {"a": [9007199254740993], "b": [0]}}"#,
    ]
    .join("\n");
    let piped = pipe(isorun().arg("pipe").arg(&model).args(["--signature", "add"]), &stdin);
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 6, "one answer per non-blank line: {:?}", piped.answers);
    assert_eq!(
        piped.answers[0],
        json!({"id": 1, "outputs": {"sum": {"dtype": "int64", "shape": [2], "values": [11, 22]}}})
    );
    assert_eq!(piped.answers[1]["id"], Value::Null);
    assert_eq!(piped.answers[1]["error"]["kind"], "bad_request");
    assert_eq!(piped.answers[2]["id"], "two");
    assert_eq!(piped.answers[2]["error"]["kind"], "input_mismatch");
    assert_eq!(piped.answers[2]["error"]["message"], "input 'a': element 0 is 1.5, which is not exactly a int64");
    assert_eq!(piped.answers[3]["id"], json!({"nested": [1, 2.5]}), "ids are echoed exactly");
    assert!(piped.answers[3]["error"]["message"].as_str().unwrap().starts_with("unknown input 'zz'"));
    assert_eq!(piped.answers[4]["error"]["kind"], "bad_request");
    // int64 stays exact through JSON both ways.
    assert_eq!(piped.answers[5]["outputs"]["sum"]["values"], json!([9007199254740993i64]));
}

/// The bench's floors for `pipe` (`isorun-worker --in-process --pipe`, in
/// one process and with the model in a second one) answer every line
/// exactly as `isorun pipe` does: they measure the same work.
#[test]
fn the_benchs_pipe_floors_answer_exactly_as_pipe_does() {
    let model = fixtures().join("models/multi_sig");
    let stdin = [
        r#"{"id": 1, "inputs": {"a": [1, 2], "b": [10, 20]}}"#,
        "this is not json",
        r#"{"id": "two", "inputs": {"a": [1.5], "b": [1]}}"#,
        r#"{"id": 3, "inputs": {"a": [9007199254740993], "b": [0]}}"#,
        r#"{"id": 4, "inputs": {"a": [[1]], "b": [2]}}"#,
    ]
    .join("\n");
    let piped = pipe(isorun().arg("pipe").arg(&model).args(["--signature", "add"]), &stdin);
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 5, "{:?}", piped.answers);
    for floor in [&["--caller-thread"][..], &["--caller-thread", "--across-processes"]] {
        let mut command = Command::new(bin("isorun-worker"));
        command.args(["--in-process", "--pipe"]).args(floor).args(["--signature", "add"]).arg(&model);
        let answered = pipe(&mut command, &stdin);
        assert_eq!(answered.code, Some(0), "{floor:?}: {}", answered.stderr);
        assert_eq!(answered.answers, piped.answers, "{floor:?}");
    }
}

#[test]
fn a_model_that_cannot_load_exits_2_before_reading_stdin() {
    let model = fixtures().join("models/multi_sig");
    let piped = pipe(isorun().arg("pipe").arg(&model).args(["--signature", "nope"]), "{\"id\": 1}\n");
    assert_eq!(piped.code, Some(2));
    assert!(piped.answers.is_empty());
    assert!(
        piped.stderr.contains("no signature 'nope'; the model has: add, mixed, serving_default"),
        "{}",
        piped.stderr
    );

    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(broken.join("variables")).unwrap();
    std::fs::write(broken.join("saved_model.pb"), b"\x08\x01\x12\xff\xff").unwrap();
    let piped = pipe(isorun().arg("pipe").arg(&broken), "{\"id\": 1}\n");
    assert_eq!(piped.code, Some(2));
    assert!(piped.stderr.contains("broken"), "{}", piped.stderr);
}

#[test]
fn a_crash_in_the_middle_of_100_requests_costs_one_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-crash-at-911");
    let lines: Vec<String> = (0..100)
        .map(|i| {
            let first = if i == 42 { 911 } else { i };
            format!(r#"{{"id": {i}, "inputs": {{"x": [[{first}, 0, 0]]}}}}"#)
        })
        .collect();
    let piped = pipe(&mut fault_pipe(&model), &lines.join("\n"));
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 100);
    for (i, answer) in piped.answers.iter().enumerate() {
        assert_eq!(answer["id"], i, "in order");
        if i == 42 {
            assert_eq!(answer["error"]["kind"], "crashed", "{answer}");
        } else {
            assert_eq!(answer["outputs"]["x"]["values"], json!([[i as f64, 0.0, 0.0]]), "{answer}");
        }
    }
}

#[test]
fn after_max_restarts_crashes_in_a_row_every_line_gets_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-crash-at-911");
    let lines: Vec<String> = (0..6).map(|i| format!(r#"{{"id": {i}, "inputs": {{"x": [[911, 0, 0]]}}}}"#)).collect();
    let piped = pipe(fault_pipe(&model).args(["--max-restarts", "2"]), &lines.join("\n"));
    assert_eq!(piped.code, Some(1));
    let kinds: Vec<&str> = piped.answers.iter().map(|a| a["error"]["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["crashed", "crashed", "gave_up", "gave_up", "gave_up", "gave_up"]);
}

fn worker_pids(piped: &Piped) -> Vec<i64> {
    piped.answers.iter().map(|a| a["outputs"]["worker_pid"]["values"].as_i64().unwrap()).collect()
}

#[test]
fn workers_are_recycled_after_n_requests_or_past_a_memory_size() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-pid");
    let lines: Vec<String> = (0..6).map(|i| format!(r#"{{"id": {i}, "inputs": {{"x": [[{i}, 0, 0]]}}}}"#)).collect();
    let stdin = lines.join("\n");

    let kept = worker_pids(&pipe(&mut fault_pipe(&model), &stdin));
    assert!(kept.iter().all(|&p| p == kept[0]), "one worker serves all: {kept:?}");

    let recycled = worker_pids(&pipe(fault_pipe(&model).args(["--recycle-after", "2"]), &stdin));
    // The first worker also did the load check, so it serves one request.
    let mut distinct = recycled.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{recycled:?}");
    assert!(recycled.windows(2).filter(|w| w[0] == w[1]).count() >= 2, "{recycled:?}");

    let by_memory = worker_pids(&pipe(fault_pipe(&model).args(["--recycle-rss", "1K"]), &stdin));
    let mut distinct = by_memory.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "every worker is over 1 KiB, so each serves one request: {by_memory:?}");
}

#[test]
fn an_output_of_zero_elements_in_two_to_the_forty_rows_gets_an_error_line_and_pipe_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-zero-huge");
    let lines = [r#"{"id": 1, "inputs": {"x": [[1, 2, 3]]}}"#, r#"{"id": 2, "inputs": {"x": [[4, 5, 6]]}}"#];
    let piped = pipe(&mut fault_pipe(&model), &lines.join("\n"));
    assert_eq!(piped.code, Some(0), "the supervisor survives: {}", piped.stderr);
    assert_eq!(piped.answers.len(), 2);
    for (answer, id) in piped.answers.iter().zip([1, 2]) {
        assert_eq!(answer["id"], id);
        assert_eq!(answer["error"]["kind"], "output_write", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("output y: shape [1099511627776, 0]"), "{message}");
    }
}

/// Whether process `pid` is gone (or only a zombie nobody has reaped yet).
fn gone(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// `isorun pipe` on the fault-pid model, stdin, stdout and stderr piped,
/// once it has answered one request: the child, its stdin (open), its
/// stdout (the first answer read) and the pid of the worker that answered.
fn pipe_after_one_answer(
    dir: &Path,
) -> (std::process::Child, std::process::ChildStdin, std::io::BufReader<std::process::ChildStdout>, i64) {
    use std::io::BufRead;
    let model = fault_model(dir, "fault-pid");
    let mut child = spawn_piped(&mut fault_pipe(&model));
    let mut input = child.stdin.take().unwrap();
    writeln!(input, r#"{{"id": 1, "inputs": {{"x": [[1, 0, 0]]}}}}"#).unwrap();
    let mut answers = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    answers.read_line(&mut line).unwrap();
    let answer: Value = serde_json::from_str(&line).unwrap();
    let worker = answer["outputs"]["worker_pid"]["values"].as_i64().unwrap();
    (child, input, answers, worker)
}

/// `isorun pipe` waiting for its next line (stdin open, nothing written)
/// gets `signal`: it ends promptly with `code`, and its worker is gone.
fn interrupted_while_waiting(signal: i32, code: i32) {
    let tmp = tempfile::tempdir().unwrap();
    // Its stdout is read on to the end: a closed stdout would stop it.
    let (mut child, input, _answers, worker) = pipe_after_one_answer(tmp.path());
    assert!(!gone(worker), "the worker waits for the next request");
    // stdin stays open: isorun is blocked waiting for a line.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let sent = std::time::Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let deadline = sent + std::time::Duration::from_secs(10);
    let status = crate::util::wait_until(&mut child, deadline)
        .unwrap_or_else(|| panic!("isorun pipe did not end within 10 s of signal {signal} while waiting for a line"));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(code));
    assert!(gone(worker), "worker {worker} is left behind");
    eprintln!("signal {signal} to exit: {took:?}");
    drop(input);
}

#[test]
fn ctrl_c_while_waiting_for_a_line_exits_130_and_stops_the_worker() {
    interrupted_while_waiting(libc::SIGINT, 130);
}

#[test]
fn sigterm_while_waiting_for_a_line_exits_143_and_stops_the_worker() {
    interrupted_while_waiting(libc::SIGTERM, 143);
}

/// `pipe` with `stdin`, and the supervisor's pid.
fn pipe_with_pid(command: &mut Command, stdin: &str) -> (i64, Piped) {
    let mut child = spawn_piped(command);
    let supervisor = i64::from(child.id());
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let piped = Piped {
        code: output.status.code(),
        answers: String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    (supervisor, piped)
}

fn parents_of(piped: &Piped) -> Vec<i64> {
    piped.answers.iter().map(|a| a["outputs"]["worker_ppid"]["values"].as_i64().unwrap()).collect()
}

#[test]
fn pipe_forks_every_worker_after_the_first_from_a_zygote() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-pid");
    let lines: Vec<String> = (0..4).map(|i| format!(r#"{{"id": {i}, "inputs": {{"x": [[{i}, 0, 0]]}}}}"#)).collect();
    let stdin = lines.join("\n");
    // A fresh worker per request; the first worker, exec'd, did only the load check.
    let (supervisor, piped) =
        pipe_with_pid(fault_pipe(&model).env_remove("ISORUN_SPAWN").args(["--recycle-after", "1"]), &stdin);
    let pids = worker_pids(&piped);
    let mut distinct = pids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{pids:?}");
    let parents = parents_of(&piped);
    assert!(
        parents.iter().all(|&p| p == parents[0] && p != supervisor),
        "every answering worker forked from one zygote, not isorun ({supervisor}): {parents:?}"
    );
    // --spawn exec: every worker is isorun's own child.
    let (supervisor, piped) =
        pipe_with_pid(fault_pipe(&model).args(["--recycle-after", "1", "--spawn", "exec"]), &stdin);
    assert_eq!(parents_of(&piped), vec![supervisor; 4]);
}

/// A worker killed while it waits between requests (the OOM killer, a kill
/// from outside) had no request running: the next request goes to a fresh
/// worker and succeeds.
#[test]
fn a_worker_killed_between_requests_is_replaced_before_the_next_one() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-pid");
    let mut child = spawn_piped(&mut fault_pipe(&model));
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |id: u32| -> serde_json::Value {
        writeln!(input, r#"{{"id": {id}, "inputs": {{"x": [[1, 2, 3]]}}}}"#).unwrap();
        input.flush().unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let first = ask(1);
    let pid = first["outputs"]["worker_pid"]["values"].as_i64().unwrap_or_else(|| panic!("{first}"));
    // SAFETY: a signal to the pipe's own worker.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone(pid) {
        assert!(std::time::Instant::now() < deadline, "worker {pid} did not die");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let second = ask(2);
    assert!(second.get("error").is_none(), "the request after an idle worker's death failed: {second}");
    assert_ne!(second["outputs"]["worker_pid"]["values"].as_i64(), Some(pid), "{second}");
    drop(input);
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Request lines of 1 to 3 rows each for an `x` float32 [?, 3] input.
fn rows_requests(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let rows: Vec<String> = (0..1 + i % 3)
                .map(|r| format!("[{}, {}, {}]", i as f32 * 0.5, r as f32 - 1.25, (i * r) as f32))
                .collect();
            format!(r#"{{"id": {i}, "inputs": {{"x": [{}]}}}}"#, rows.join(", "))
        })
        .collect()
}

#[test]
fn with_max_batch_queued_requests_run_together_and_each_answer_holds_its_own_rows() {
    let tmp = tempfile::tempdir().unwrap();
    // Real TensorFlow: the batched answers equal the one-by-one ones.
    let model = fixtures().join("models/multi_sig");
    let mut lines = rows_requests(40);
    lines.insert(7, "not json".into());
    lines.insert(20, r#"{"id": "w", "inputs": {"x": [[1, 2]]}}"#.into());
    let stdin = lines.join("\n");
    let alone = pipe(isorun().arg("pipe").arg(&model), &stdin);
    let batched = pipe(isorun().arg("pipe").arg(&model).args(["--max-batch", "16", "--batch-wait", "2000"]), &stdin);
    assert_eq!(alone.code, Some(0), "{}", alone.stderr);
    assert_eq!(batched.code, Some(0), "{}", batched.stderr);
    assert_eq!(batched.answers.len(), 42);
    assert_eq!(batched.answers, alone.answers, "the same answers, batched or not");
    for answer in batched.answers.iter().filter(|a| a["id"].is_i64()) {
        let i = answer["id"].as_u64().unwrap() as usize;
        assert_eq!(answer["outputs"].as_object().unwrap().values().next().unwrap()["shape"][0], 1 + i % 3, "{answer}");
    }
    assert_eq!(batched.answers[7]["error"]["kind"], "bad_request");
    assert_eq!(batched.answers[20]["error"]["kind"], "input_mismatch");

    // The fault worker logs each run: 40 requests that were all waiting
    // ran as a few batches, not 40 runs; each echo is its own rows.
    let echo = fault_model(tmp.path(), "fault-slow-0");
    let log = tmp.path().join("runs.log");
    let lines = rows_requests(40);
    let piped = pipe(
        fault_pipe(&echo).arg(format!("--worker-arg=--log={}", log.display())).args(["--max-batch", "16"]),
        &lines.join("\n"),
    );
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    for (i, answer) in piped.answers.iter().enumerate() {
        let sent: serde_json::Value = serde_json::from_str(&lines[i]).unwrap();
        let rows: Vec<Vec<f64>> = serde_json::from_value(sent["inputs"]["x"].clone()).unwrap();
        assert_eq!(answer["outputs"]["x"]["values"], json!(rows), "{answer}");
    }
    let runs = std::fs::read_to_string(&log).unwrap().lines().count();
    assert!((3..=10).contains(&runs), "40 waiting requests in batches of at most 16 ran {runs} times");
}

#[test]
fn a_batch_that_crashes_or_cannot_be_split_is_run_again_one_request_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    // The crash line first, so that the batch it is in crashes as a whole:
    // only its own answer says so.
    let crash = fault_model(tmp.path(), "fault-crash-at-911");
    let mut lines = rows_requests(10);
    lines[0] = r#"{"id": 0, "inputs": {"x": [[911, 0, 0]]}}"#.into();
    let piped = pipe(fault_pipe(&crash).args(["--max-batch", "16"]), &lines.join("\n"));
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 10);
    assert_eq!(piped.answers[0]["error"]["kind"], "crashed");
    assert!(piped.answers[1..].iter().all(|a| a["outputs"]["x"].is_object()), "{:?}", piped.answers);

    // A scalar output (the worker's pid) has no row per request: the batch
    // cannot be split, so each request runs alone and gets its own.
    let pid = fault_model(tmp.path(), "fault-pid");
    let piped = pipe(fault_pipe(&pid).args(["--max-batch", "16"]), &rows_requests(6).join("\n"));
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    let requests: Vec<i64> =
        piped.answers.iter().map(|a| a["outputs"]["worker_requests"]["values"].as_i64().unwrap()).collect();
    // The load check, the batch, then each request alone.
    assert_eq!(requests, [3, 4, 5, 6, 7, 8], "{:?}", piped.answers);
}

#[test]
fn ctrl_c_during_a_batch_answers_its_lines_without_starting_a_worker_for_each() {
    // A batch of 20 lines whose run takes 2 s; Ctrl-C while it runs. The
    // batch's worker is stopped and every line of it is answered
    // `not_run`: none is run alone (that would start a worker each).
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-slow-2000");
    let log = tmp.path().join("runs.log");
    let mut child = fault_pipe(&model)
        .arg(format!("--worker-arg=--log={}", log.display()))
        .args(["--max-batch", "32", "--sandbox", "off"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    for line in rows_requests(20) {
        writeln!(input, "{line}").unwrap();
    }
    input.flush().unwrap();
    // The batch is running once the log names it (the load check is not logged).
    let started = std::time::Instant::now();
    while std::fs::read_to_string(&log).map_or(true, |l| l.is_empty()) {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the batch never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let sent = std::time::Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    drop(input);
    let took = sent.elapsed();
    assert_eq!(output.status.code(), Some(130));
    let answers: Vec<Value> =
        String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 20, "{answers:?}");
    assert!(answers.iter().all(|a| a["error"]["kind"] == "not_run"), "{answers:?}");
    let runs = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(runs, 1, "only the batch ran");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
}

/// Where each answered request came from: 1 through the mailbox, 0 the socket.
fn via_mailbox(piped: &Piped) -> Vec<i64> {
    piped.answers.iter().map(|a| a["outputs"]["via_mailbox"]["values"].as_i64().unwrap_or(-1)).collect()
}

/// While both sides poll (`--spin-us`, on by default), every request after
/// the first crosses the shared-memory mailbox, not the socket; a request
/// too large for it crosses the socket, and the next small one the mailbox
/// again. With `--spin-us 0` (no polling) nothing does.
#[test]
fn small_requests_cross_the_mailbox_while_both_sides_poll_and_a_large_one_the_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-pid");
    let small = |i: u32| format!(r#"{{"id": {i}, "inputs": {{"x": [[{i}, 2, 3]]}}}}"#);
    // 10,000 rows: 120 KB of float32, more than the mailbox's 64 KiB.
    let rows = vec!["[1, 2, 3]"; 10_000].join(", ");
    let large = format!(r#"{{"id": "large", "inputs": {{"x": [{rows}]}}}}"#);
    let lines = [small(0), small(1), small(2), large, small(3), small(4)].join("\n");
    let piped = pipe(&mut fault_pipe(&model), &lines);
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 6, "{}", piped.stderr);
    // The first may go either way (the worker maps the mailbox while it comes).
    assert_eq!(via_mailbox(&piped)[1..], [1, 1, 0, 1, 1], "{:?}", piped.answers);
    let pids: Vec<_> = piped.answers.iter().map(|a| a["outputs"]["worker_pid"]["values"].clone()).collect();
    assert!(pids.iter().all(|p| *p == pids[0] && p.is_i64()), "one worker served them all: {pids:?}");
    assert_eq!(piped.answers[3]["outputs"]["x"]["shape"], json!([10_000, 3]));
    assert_eq!(piped.answers[4]["outputs"]["x"]["values"], json!([[3.0, 2.0, 3.0]]), "answers stay in order");
    let piped = pipe(fault_pipe(&model).args(["--spin-us", "0"]), &lines);
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(via_mailbox(&piped), [0; 6], "no polling, no mailbox");
}

/// A small request whose answer does not fit the mailbox is answered on the
/// socket, and the supervisor, waiting on the mailbox, takes it from there.
#[test]
fn an_answer_too_large_for_the_mailbox_comes_on_the_socket() {
    let tmp = tempfile::tempdir().unwrap();
    // 10,000 named scalars: over 100 KB encoded.
    let model = fault_model(tmp.path(), "fault-many-names-10000");
    let lines: Vec<String> = (0..4).map(|i| format!(r#"{{"id": {i}, "inputs": {{"x": [[1, 2, 3]]}}}}"#)).collect();
    let piped = pipe(&mut fault_pipe(&model), &lines.join("\n"));
    assert_eq!(piped.code, Some(0), "{}", piped.stderr);
    assert_eq!(piped.answers.len(), 4);
    for (i, answer) in piped.answers.iter().enumerate() {
        assert_eq!(answer["id"], i, "{}", piped.stderr);
        let outputs = answer["outputs"].as_object().unwrap_or_else(|| panic!("{answer}"));
        assert_eq!(outputs.len(), 10_001, "x and its 10,000 names");
    }
}

/// A worker that floods the socket with `Wake` messages (each valid, each
/// announcing an answer that never comes) is a protocol error: the
/// supervisor takes at most two a request, so it never reads on past its
/// deadlines. `pipe` checks that the model loads before it reads stdin, so
/// here the flood meets that first request: exit 2, saying why.
#[test]
fn a_worker_flooding_wake_messages_is_a_protocol_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fault_model(tmp.path(), "fault-wake-flood");
    let mut child = spawn_piped(fault_pipe(&model).args(["--timeout", "600"]));
    let mut input = child.stdin.take().unwrap();
    writeln!(input, r#"{{"id": 1, "inputs": {{"x": [[1, 2, 3]]}}}}"#).unwrap();
    drop(input);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("pipe still reading Wake messages after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("protocol error: 3 Wake messages for one request"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// `child`'s end, or a panic naming `what` if it has not come within 20 s
/// (a guard against a hang, not a timing).
fn ended(mut child: std::process::Child, what: &str) -> std::process::Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("{what}: pipe still runs after 20 s; stderr:\n{}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `isorun pipe m | head -1` (issue 42 §5): when stdout's reader leaves,
/// pipe stops then, whether it waits for a line (stdin still open) or runs
/// a request, exits 0, and says on stderr that stdout closed, not that it
/// was interrupted; its worker is gone.
#[test]
fn a_closed_stdout_stops_pipe_at_once_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    // Waiting for the next line, stdin open: before, it waited for ever.
    let (child, input, answers, worker) = pipe_after_one_answer(tmp.path());
    drop(answers); // as `head -1` leaves
    let output = ended(child, "waiting for a line");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "isorun: stdout closed after 1 answer: nobody reads isorun's output any more (as after `| head -1`), so \
         pipe stopped; the lines after it were not answered"
    );
    assert!(gone(worker), "worker {worker} is left behind");
    drop(input);

    // Running a request: it is stopped, not run to its end for nobody, and
    // its answer is not_run for stdout_closed (before: a quiet exit when
    // the answer could not be written).
    let model = fault_model(tmp.path(), "fault-slow-3000");
    let log = tmp.path().join("requests.log");
    let mut child =
        spawn_piped(fault_pipe(&model).arg(format!("--worker-arg=--log={}", log.display())).args(["--timeout", "600"]));
    let mut input = child.stdin.take().unwrap();
    writeln!(input, r#"{{"id": 1, "inputs": {{"x": [[1, 0, 0]]}}}}"#).unwrap();
    writeln!(input, r#"{{"id": 2, "inputs": {{"x": [[1, 0, 0]]}}}}"#).unwrap();
    // The worker logs a request as it starts it (after its 3 s load check), then takes 3 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(&log).map_or(true, |l| l.is_empty()) {
        assert!(std::time::Instant::now() < deadline, "no request started within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(child.stdout.take());
    let output = ended(child, "running a request");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("isorun: stdout closed before any answer: nobody reads isorun's output"), "{stderr}");
    assert!(!stderr.contains("interrupted"), "{stderr}");
    drop(input);
}
