//! One call, start to end: a socket pair for it, the fork, the item sent,
//! then a watch over the result socket and the child's pidfd that
//! enforces the deadline and the memory limit (killing through the pidfd,
//! which reaches the child or nobody), and the outcome made honest: the
//! child's own answer only when it exited normally after giving one; a
//! signal is `crashed`, a kill of ours is `timeout` or `memory_limit`.

use crate::fd;
use crate::items::{Item, Payload};
use crate::process::{describe_status, ForkRefused, Zygote};
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The most a child's answer may hold (a JSON value up to 1 MiB, a traceback
/// up to 64 KiB, escaped): more is a broken protocol, and the child is killed.
const ANSWER_MAX: usize = 8 << 20;

/// How often a running call's memory is read.
const POLL: Duration = Duration::from_millis(10);

/// A call's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Option<Duration>,
    pub memory_limit: Option<u64>,
    pub value_cap: u64,
}

/// Why the supervisor ended a call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Killed {
    Timeout,
    Memory,
    Stopped,
    TooMuch,
}

/// What one attempt of a call came to: a record's fields (without item,
/// index and function).
pub type Attempt = Map<String, Value>;

/// The call could not start in this zygote.
pub enum NotStarted {
    /// Forking it is not safe any more: use a fresh interpreter.
    Unsafe(String),
    /// The zygote is gone or broke the protocol.
    Lost(String),
}

/// Runs `item` in a process from `zygote`.
pub fn run(
    zygote: &mut Zygote,
    item: &Item,
    env: &Value,
    limits: &Limits,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Attempt, NotStarted> {
    let started = Instant::now();
    let (ours, theirs) = fd::socket_pair(libc::SOCK_STREAM).map_err(|e| NotStarted::Lost(e.to_string()))?;
    let forked = match zygote.fork(theirs, env) {
        Ok(forked) => forked,
        Err(ForkRefused::Unsafe(why)) => return Err(NotStarted::Unsafe(why)),
        Err(ForkRefused::Failed(e)) => return Err(NotStarted::Lost(e.to_string())),
    };
    let pidfd = zygote.pidfd_of(&forked);
    let mut stream = UnixStream::from(ours);
    let request = match &item.payload {
        Payload::Json(value) => json!({"index": item.index, "item": value}),
        Payload::Pickle(path) => json!({"index": item.index, "item_file": path}),
    };
    // A child that never reads its item meets the deadline below.
    let _ = stream.set_write_timeout(Some(limits.timeout.unwrap_or(Duration::from_secs(3600))));
    let _ = stream.write_all(request.to_string().as_bytes());
    fd::shutdown_write(&stream);
    let _ = stream.set_nonblocking(true);

    let mut answer = Vec::new();
    let mut answered = false;
    let mut killed = None;
    let mut peak_private = 0u64;
    loop {
        let ready = fd::poll(&[stream.as_raw_fd(), pidfd.as_raw_fd()], POLL).unwrap_or_default();
        if ready.first() == Some(&true) && !answered {
            answered = drain(&mut stream, &mut answer);
            if answer.len() > ANSWER_MAX && killed.is_none() {
                fd::kill_pidfd(pidfd);
                killed = Some(Killed::TooMuch);
            }
        }
        if ready.get(1) == Some(&true) {
            // Ended: whatever it wrote is in the socket (a process it left
            // behind may hold the socket open: no waiting for the end).
            if !answered && killed.is_none() {
                drain(&mut stream, &mut answer);
                answered = true;
            }
            break;
        }
        if killed.is_some() {
            continue;
        }
        if let Some(private) = private_memory(forked.pid) {
            peak_private = peak_private.max(private);
        }
        killed = if limits.timeout.is_some_and(|t| started.elapsed() >= t) {
            Some(Killed::Timeout)
        } else if limits.memory_limit.is_some_and(|limit| peak_private > limit) {
            Some(Killed::Memory)
        } else if stop() {
            Some(Killed::Stopped)
        } else {
            None
        };
        if killed.is_some() {
            fd::kill_pidfd(pidfd);
        }
    }
    let wall_ms = started.elapsed().as_millis() as u64;
    let exit = zygote.exited().map_err(|e| NotStarted::Lost(format!("after the call: {e}")))?;
    let (status, maxrss) = exit;
    let mut attempt = Map::new();
    let signaled = libc::WIFSIGNALED(status);
    let mut fail = |status: &str, kind: &str, message: String| {
        attempt.insert("status".into(), status.into());
        attempt.insert("error".into(), json!({"kind": kind, "message": message}));
    };
    match killed {
        Some(Killed::Timeout) => {
            let limit = limits.timeout.unwrap_or_default().as_secs_f64();
            fail("timeout", "timeout", format!("timeout: the call ran past {limit} s (limit: --timeout {limit} s)"))
        }
        Some(Killed::Memory) => {
            let limit = isorun_protocol::human_bytes(limits.memory_limit.unwrap_or(0));
            fail(
                "memory_limit",
                "memory_limit",
                format!("memory limit: the call's private memory passed {limit} (limit: --memory-limit {limit})"),
            )
        }
        Some(Killed::Stopped) => {
            attempt.insert("status".into(), "not_run".into());
            attempt.insert("reason".into(), "interrupted".into());
            attempt.insert("error".into(), json!({"kind": "not_run", "message": "not run: interrupted"}));
        }
        Some(Killed::TooMuch) => fail(
            "protocol_error",
            "protocol_error",
            format!("the call's answer passed {} MiB; the process was killed", ANSWER_MAX >> 20),
        ),
        None if signaled => {
            let signal = isorun_protocol::signal_name(libc::WTERMSIG(status));
            fail("crashed", "crashed", format!("crashed: killed by {signal}"));
            attempt.insert("signal".into(), signal.into());
        }
        None => match answered.then(|| serde_json::from_slice::<Value>(&answer).ok()).flatten() {
            Some(Value::Object(answer)) if libc::WEXITSTATUS(status) == 0 => attempt = answer_fields(answer, limits),
            _ => fail(
                "crashed",
                "crashed",
                format!("crashed: the call {} before it answered", describe_status((status, 0))),
            ),
        },
    }
    attempt.insert("wall_ms".into(), wall_ms.into());
    attempt.insert("peak_rss_bytes".into(), maxrss.max(peak_private).into());
    Ok(attempt)
}

/// The child's answer, checked: only the keys a record takes, and a value
/// file over the cap is the call's error (the file removed).
fn answer_fields(mut answer: Map<String, Value>, limits: &Limits) -> Attempt {
    let mut attempt = Map::new();
    let status = if answer.get("status") == Some(&json!("ok")) { "ok" } else { "error" };
    attempt.insert("status".into(), status.into());
    for key in ["value", "value_type", "value_file", "error"] {
        if let Some(value) = answer.remove(key) {
            attempt.insert(key.into(), value);
        }
    }
    if status == "error" && !attempt.contains_key("error") {
        attempt.insert("error".into(), json!({"kind": "exception", "message": "the call failed without saying why"}));
    }
    if let Some(path) = attempt.get("value_file").and_then(Value::as_str).map(std::path::PathBuf::from) {
        let size = std::fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
        if size > limits.value_cap {
            let _ = std::fs::remove_file(&path);
            attempt.remove("value_file");
            attempt.remove("value");
            attempt.insert("status".into(), "error".into());
            attempt.insert(
                "error".into(),
                json!({"kind": "value_too_large", "message": format!(
                    "value_too_large: the pickled value is {} (limit: --value-cap {})",
                    isorun_protocol::human_bytes(size), isorun_protocol::human_bytes(limits.value_cap))}),
            );
        }
    }
    attempt
}

/// Reads what is there; true at end of stream.
fn drain(stream: &mut UnixStream, into: &mut Vec<u8>) -> bool {
    let mut buffer = [0u8; 64 * 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(n) => {
                into.extend_from_slice(&buffer[..n]);
                if into.len() > ANSWER_MAX {
                    return false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// A process's private memory (RssAnon + RssShmem), as `run` limits workers'.
fn private_memory(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut total = 0;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("RssAnon:").or_else(|| line.strip_prefix("RssShmem:")) {
            total += rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024;
        }
    }
    Some(total)
}
