//! One forked process, start to end: a socket pair for it, the fork, then
//! per item (one, or `--items-per-worker` in turn) a length-prefixed
//! request and a watch over the socket and the child's pidfd that enforces
//! the deadline and the memory limit (killing through the pidfd, which
//! reaches the child or nobody), and the outcome made honest: the child's
//! own answer only when a whole answer frame came; a signal is `crashed`,
//! a kill of ours is `timeout` or `memory_limit`.

use crate::fd;
use crate::items::{Item, Payload};
use crate::memory::{vm_rss, PrivateMemory};
use crate::process::{describe_status, ForkRefused, Forked, Zygote};
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

/// How a watched call ended.
enum Watched {
    /// Its answer frame.
    Answered(Vec<u8>),
    /// The process ended without answering, or was killed.
    Ended(Option<Killed>),
}

/// A process forked ahead for a slot's next call, waiting for its first
/// item (`--spares`): the fork's cost is paid while the call before runs.
pub struct Spare {
    forked: Forked,
    stream: UnixStream,
}

/// Forks a spare; `None` when the zygote will not (the next fork says why).
pub fn fork_spare(zygote: &mut Zygote, env: &Value) -> Option<Spare> {
    if zygote.direct {
        return None;
    }
    let (ours, theirs) = fd::socket_pair(libc::SOCK_STREAM).ok()?;
    let forked = zygote.fork(theirs, env).ok()?;
    Some(Spare { forked, stream: UnixStream::from(ours) })
}

/// Runs `items` in turn in one process from `zygote` (one item unless
/// `--items-per-worker`): the spare if there is a live one, else a fresh
/// fork; with `spares`, the next spare is forked once this process has its
/// first item. The attempts are for the items it got to: a call that
/// crashed, timed out or was stopped ends the process, and the items after
/// it are the caller's to run elsewhere.
pub fn run(
    zygote: &mut Zygote,
    spare: &mut Option<Spare>,
    spares: bool,
    items: &[&Item],
    env: &Value,
    limits: &Limits,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<Attempt>, NotStarted> {
    let lost = |e: std::io::Error| NotStarted::Lost(e.to_string());
    let ready = match spare.take() {
        Some(spare)
            if !fd::readable(&zygote.pidfd_of(&spare.forked).map_err(lost)?, Duration::ZERO).unwrap_or(true) =>
        {
            Some(spare)
        }
        Some(dead) => {
            drop(dead.stream);
            let _ = zygote.exited(&dead.forked);
            None
        }
        None => None,
    };
    let (forked, mut stream) = match ready {
        Some(Spare { forked, stream }) => (forked, stream),
        None => {
            let (ours, theirs) = fd::socket_pair(libc::SOCK_STREAM).map_err(lost)?;
            match zygote.fork(theirs, env) {
                Ok(forked) => (forked, UnixStream::from(ours)),
                Err(ForkRefused::Unsafe(why)) => return Err(NotStarted::Unsafe(why)),
                Err(ForkRefused::Failed(e)) => return Err(NotStarted::Lost(e.to_string())),
            }
        }
    };
    let pidfd = zygote.pidfd_of(&forked).map_err(lost)?;
    let pidfd = &pidfd;
    let mut memory = PrivateMemory::new(forked.pid);
    // What a forked process maps of the zygote's is not its own: its peak
    // resident memory (ru_maxrss) less the zygote's, as a floor for a call
    // too short for a poll to see.
    let zygote_rss = if zygote.direct { 0 } else { vm_rss(zygote.hello.pid).unwrap_or(0) };
    let mut attempts = Vec::new();
    let mut ended = None;
    // Its memory as it takes its first item: the floor of that item's peak,
    // read while it is surely alive (a call may end before the first poll).
    let mut before = memory.now();
    for item in items {
        // A process that ended after its last answer takes no more items.
        if fd::readable(pidfd, Duration::ZERO).unwrap_or(true) {
            break;
        }
        let started = Instant::now();
        let request = match &item.payload {
            Payload::Json(value) => json!({"index": item.index, "item": value}),
            Payload::JsonText(text) => json!({"index": item.index, "item_json": text}),
            Payload::Pickle(path) => json!({"index": item.index, "item_file": path}),
        }
        .to_string();
        let mut frame = (request.len() as u64).to_le_bytes().to_vec();
        frame.extend_from_slice(request.as_bytes());
        // A child that never reads its item meets the deadline below.
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(limits.timeout.unwrap_or(Duration::from_secs(3600))));
        let _ = stream.write_all(&frame);
        let _ = stream.set_nonblocking(true);
        if spares && spare.is_none() {
            *spare = fork_spare(zygote, env);
        }
        let mut peak = before.take().unwrap_or(0);
        let watched = watch(&mut stream, pidfd, &mut memory, limits, stop, started, &mut peak);
        let mut attempt = match watched {
            Watched::Answered(answer) => match serde_json::from_slice::<Value>(&answer) {
                Ok(Value::Object(answer)) => answer_fields(answer, limits),
                _ => failed("protocol_error", "protocol_error: the call's answer is not a JSON object".into()),
            },
            Watched::Ended(killed) => {
                ended = Some(killed);
                Map::new()
            }
        };
        attempt.insert("wall_ms".into(), (started.elapsed().as_millis() as u64).into());
        attempt.insert("peak_rss_bytes".into(), peak.into());
        attempts.push(attempt);
        if ended.is_some() {
            break;
        }
    }
    if ended.is_none() {
        // Done with it: the end of its stream ends the process.
        fd::shutdown_write(&stream);
        if !fd::readable(pidfd, EXIT_GRACE).unwrap_or(false) {
            fd::kill_pidfd(pidfd);
        }
    }
    let (status, maxrss) = match zygote.exited(&forked) {
        Ok(exit) => exit,
        Err(e) => {
            // The call took its zygote down (killed or stopped its parent):
            // that is what the call did; an answer that came is kept.
            let why = zygote.lost(&e);
            let message = format!("crashed: the call's zygote {why} during the call (did the call signal its parent?)");
            if attempts.is_empty() {
                let mut attempt = Map::new();
                attempt.insert("wall_ms".into(), 0.into());
                attempts.push(attempt);
            }
            let last = attempts.last_mut().expect("one at least");
            last.insert("status".into(), "crashed".into());
            last.insert("error".into(), json!({"kind": "crashed", "message": message}));
            return Ok(attempts);
        }
    };
    if attempts.is_empty() && !items.is_empty() {
        // It ended before it took its first item: that item's attempt, or
        // the caller would hand the same items to process after process.
        let mut attempt = ended_fields(None, status, limits);
        attempt.insert("wall_ms".into(), 0.into());
        attempt.insert("peak_rss_bytes".into(), maxrss.saturating_sub(zygote_rss).into());
        attempts.push(attempt);
    }
    if let (Some(killed), Some(last)) = (ended, attempts.last_mut()) {
        let mut fields = ended_fields(killed, status, limits);
        fields.extend(std::mem::take(last));
        *last = fields;
    }
    if let [only] = attempts.as_mut_slice() {
        let polled = only["peak_rss_bytes"].as_u64().unwrap_or(0);
        only.insert("peak_rss_bytes".into(), polled.max(maxrss.saturating_sub(zygote_rss)).into());
    }
    Ok(attempts)
}

/// How long a process that answered every item may take to exit.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Watches one call until its answer frame is in, or the process ended:
/// the deadline, the memory limit and the stop kill it through its pidfd.
fn watch(
    stream: &mut UnixStream,
    pidfd: &std::os::fd::OwnedFd,
    memory: &mut PrivateMemory,
    limits: &Limits,
    stop: &(dyn Fn() -> bool + Sync),
    started: Instant,
    peak: &mut u64,
) -> Watched {
    let mut answer = Vec::new();
    let mut killed = None;
    loop {
        let ready = fd::poll(&[stream.as_raw_fd(), pidfd.as_raw_fd()], POLL).unwrap_or_default();
        if (ready.first() == Some(&true) || ready.get(1) == Some(&true)) && killed.is_none() {
            drain(stream, &mut answer);
            match frame(&answer) {
                Frame::Complete(body) => {
                    if let Some(private) = memory.now() {
                        *peak = (*peak).max(private);
                    }
                    return Watched::Answered(body.to_vec());
                }
                Frame::TooLarge => {
                    fd::kill_pidfd(pidfd);
                    killed = Some(Killed::TooMuch);
                }
                Frame::Partial => {}
            }
        }
        if ready.get(1) == Some(&true) {
            return Watched::Ended(killed);
        }
        if killed.is_some() {
            continue;
        }
        if let Some(mut private) = memory.now() {
            if limits.memory_limit.is_some_and(|limit| private > limit) {
                // Exact before a kill (the estimate misses no allocation,
                // but may hold pages shared when the last rollup was read).
                private = memory.exact().unwrap_or(private);
            }
            *peak = (*peak).max(private);
        }
        killed = if limits.timeout.is_some_and(|t| started.elapsed() >= t) {
            Some(Killed::Timeout)
        } else if limits.memory_limit.is_some_and(|limit| *peak > limit) {
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
}

/// What a buffer holds of an answer frame (8 bytes of little-endian
/// length, then that much JSON).
enum Frame<'a> {
    Complete(&'a [u8]),
    Partial,
    /// It says it is longer than an answer may be.
    TooLarge,
}

fn frame(buffer: &[u8]) -> Frame<'_> {
    let Some(header) = buffer.get(..8) else { return Frame::Partial };
    let length = u64::from_le_bytes(header.try_into().expect("8 bytes"));
    if length > ANSWER_MAX as u64 {
        return Frame::TooLarge;
    }
    match buffer.get(8..8 + length as usize) {
        Some(body) => Frame::Complete(body),
        None => Frame::Partial,
    }
}

/// The fields of a call that ended without answering.
fn ended_fields(killed: Option<Killed>, status: i32, limits: &Limits) -> Attempt {
    match killed {
        Some(Killed::Timeout) => {
            let limit = limits.timeout.unwrap_or_default().as_secs_f64();
            failed("timeout", format!("timeout: the call ran past {limit} s (limit: --timeout {limit} s)"))
        }
        Some(Killed::Memory) => {
            let limit = isorun_protocol::human_bytes(limits.memory_limit.unwrap_or(0));
            failed(
                "memory_limit",
                format!("memory limit: the call's private memory passed {limit} (limit: --memory-limit {limit})"),
            )
        }
        Some(Killed::Stopped) => {
            let mut attempt = failed("not_run", "not run: interrupted".into());
            attempt.insert("reason".into(), "interrupted".into());
            attempt
        }
        Some(Killed::TooMuch) => failed(
            "protocol_error",
            format!("protocol_error: the call's answer passed {} MiB; the process was killed", ANSWER_MAX >> 20),
        ),
        None if libc::WIFSIGNALED(status) => {
            let signal = isorun_protocol::signal_name(libc::WTERMSIG(status));
            let mut attempt = failed("crashed", format!("crashed: killed by {signal}"));
            attempt.insert("signal".into(), signal.into());
            attempt
        }
        None => failed("crashed", format!("crashed: the call {} before it answered", describe_status((status, 0)))),
    }
}

/// `{"status": S, "error": {"kind": S, "message": M}}`.
pub fn failed(status: &str, message: String) -> Attempt {
    let mut attempt = Map::new();
    attempt.insert("status".into(), status.into());
    attempt.insert("error".into(), json!({"kind": status, "message": message}));
    attempt
}

/// The child's answer, checked: only the keys a record takes, and a value
/// file over the cap is the call's error (the file removed).
fn answer_fields(mut answer: Map<String, Value>, limits: &Limits) -> Attempt {
    let mut attempt = Map::new();
    let status = if answer.get("status") == Some(&json!("ok")) { "ok" } else { "error" };
    attempt.insert("status".into(), status.into());
    for key in ["value", "value_omitted", "value_type", "value_file", "error"] {
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
            attempt.remove("value_omitted");
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

/// Reads what is there now (at most a little past the largest answer).
fn drain(stream: &mut UnixStream, into: &mut Vec<u8>) {
    let mut buffer = [0u8; 64 * 1024];
    while into.len() <= ANSWER_MAX + 8 {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => into.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_frame_is_whole_or_not_taken_and_never_sized_by_its_claim_past_the_cap() {
        let mut buffer = 5u64.to_le_bytes().to_vec();
        assert!(matches!(frame(&buffer), Frame::Partial));
        buffer.extend_from_slice(b"{}");
        assert!(matches!(frame(&buffer), Frame::Partial));
        buffer.extend_from_slice(b"abc");
        assert!(matches!(frame(&buffer), Frame::Complete(b"{}abc")));
        assert!(matches!(frame(&u64::MAX.to_le_bytes()), Frame::TooLarge));
        assert!(matches!(frame(&[1, 2, 3]), Frame::Partial));
    }

    #[test]
    fn a_value_file_over_the_cap_is_the_call_s_error_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.pkl");
        std::fs::write(&path, [0u8; 100]).unwrap();
        let answer = json!({"status": "ok", "value_type": "bytes", "value_file": path, "extra": 1});
        let limits = Limits { timeout: None, memory_limit: None, value_cap: 10 };
        let Value::Object(answer) = answer else { unreachable!() };
        let attempt = answer_fields(answer, &limits);
        assert_eq!(attempt["status"], "error");
        assert_eq!(attempt["error"]["kind"], "value_too_large");
        assert!(attempt.get("value_file").is_none() && attempt.get("extra").is_none());
        assert!(!path.exists());
    }
}
