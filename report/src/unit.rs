//! A read-only view of one unit record inside a report, so the JUnit, HTML,
//! diff and merge code asks named questions ("did it pass? how long?")
//! instead of poking at JSON keys, and old reports (where `attempts` is a
//! number) read the same as new ones (where it is a list of attempts).

use serde_json::Value;

/// Every status a record can have, in the order summaries list them (the
/// engine's one list).
pub use isorun_engine::STATUSES;

/// How a unit counts in a report: the status, folded into three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `ok`.
    Passed,
    /// Every status but `ok` and `not_run` (an unknown status too).
    Failed,
    /// `not_run`: never run to an end (interrupted, too many failures).
    NotRun,
}

/// One unit record of a report.
#[derive(Debug, Clone, Copy)]
pub struct Unit<'a>(pub &'a Value);

impl<'a> Unit<'a> {
    /// The model id (empty when a record has none).
    pub fn model(&self) -> &'a str {
        self.0["model"].as_str().unwrap_or("")
    }

    /// The status word (`ok`, `crashed`, ...; empty when missing).
    pub fn status(&self) -> &'a str {
        self.0["status"].as_str().unwrap_or("")
    }

    pub fn verdict(&self) -> Verdict {
        match self.status() {
            "ok" => Verdict::Passed,
            "not_run" => Verdict::NotRun,
            _ => Verdict::Failed,
        }
    }

    pub fn wall_ms(&self) -> Option<u64> {
        self.0["wall_ms"].as_u64()
    }

    pub fn load_ms(&self) -> Option<u64> {
        self.0["load_ms"].as_u64()
    }

    pub fn run_ms(&self) -> Option<u64> {
        self.0["run_ms"].as_u64()
    }

    pub fn peak_rss_bytes(&self) -> Option<u64> {
        self.0["peak_rss_bytes"].as_u64()
    }

    /// How many times the unit was started: `attempts` as a number, or the
    /// length of the list of attempts.
    pub fn attempt_count(&self) -> Option<u64> {
        match &self.0["attempts"] {
            Value::Number(number) => number.as_u64(),
            Value::Array(attempts) => Some(attempts.len() as u64),
            _ => None,
        }
    }

    /// The attempts before the last one, when `attempts` is a list (the
    /// last one is the unit's own result).
    pub fn earlier_attempts(&self) -> &'a [Value] {
        match &self.0["attempts"] {
            Value::Array(attempts) if !attempts.is_empty() => &attempts[..attempts.len() - 1],
            _ => &[],
        }
    }

    /// True when the unit failed, was run again and then passed.
    pub fn flaky(&self) -> bool {
        self.0["flaky"].as_bool().unwrap_or(false)
    }

    /// True when the record was taken from a journal (`--resume`).
    pub fn resumed(&self) -> bool {
        self.0["resumed"].as_bool().unwrap_or(false)
    }

    /// Why a `not_run` unit did not run (`interrupted`, `max_failures`).
    pub fn reason(&self) -> Option<&'a str> {
        self.0["reason"].as_str()
    }

    /// The error message of a unit that did not pass.
    pub fn error_message(&self) -> Option<&'a str> {
        self.0["error"]["message"].as_str()
    }

    /// What went wrong, starting with the status: `crashed: killed by
    /// SIGSEGV`, `error: tensorflow (INVALID_ARGUMENT): x must be
    /// non-negative`, or the status alone.
    pub fn failure_text(&self) -> String {
        let error = &self.0["error"];
        match (self.status(), error["kind"].as_str(), self.error_message()) {
            ("error", Some(kind), Some(message)) => match error["code"].as_str() {
                Some(code) => format!("error: {kind} ({code}): {message}"),
                None => format!("error: {kind}: {message}"),
            },
            (status, _, message) => failure_text(status, message),
        }
    }

    /// The last lines the worker wrote on stderr (on failure), without
    /// TensorFlow's start-up banner (records from before it was left out
    /// of the tail still hold it).
    pub fn stderr_tail(&self) -> Vec<&'a str> {
        let lines: Vec<&'a str> = match &self.0["stderr_tail"] {
            Value::Array(lines) => lines.iter().filter_map(Value::as_str).collect(),
            Value::String(text) => text.lines().collect(),
            _ => Vec::new(),
        };
        lines.into_iter().filter(|line| !isorun_protocol::is_tensorflow_banner(line)).collect()
    }
}

/// `status: message`, without saying the status twice when the message
/// already starts with it (`crashed: killed by SIGSEGV`).
pub fn failure_text(status: &str, message: Option<&str>) -> String {
    match message {
        // `below_threshold` is said `below threshold: ...` in its message.
        Some(message) if message.starts_with(status) || message.starts_with(&status.replace('_', " ")) => {
            message.to_string()
        }
        Some(message) if !message.is_empty() => format!("{status}: {message}"),
        _ => status.to_string(),
    }
}

/// Milliseconds as seconds: `1.20 s`.
pub fn seconds_text(milliseconds: u64) -> String {
    format!("{:.2} s", milliseconds as f64 / 1000.0)
}

/// Bytes in binary units: `2.3 MiB`, `303 MiB`, `1.25 GiB`.
pub fn bytes_text(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let bytes = bytes as f64;
    if bytes >= KIB * KIB * KIB {
        format!("{:.2} GiB", bytes / (KIB * KIB * KIB))
    } else if bytes >= 10.0 * KIB * KIB {
        format!("{:.0} MiB", bytes / (KIB * KIB))
    } else if bytes >= KIB * KIB {
        format!("{:.1} MiB", bytes / (KIB * KIB))
    } else if bytes >= KIB {
        format!("{:.0} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attempts_are_read_as_a_number_or_a_list() {
        let old = json!({"model": "a", "status": "ok", "attempts": 2});
        assert_eq!(Unit(&old).attempt_count(), Some(2));
        assert!(Unit(&old).earlier_attempts().is_empty());
        let new = json!({"model": "a", "status": "ok", "attempts": [
            {"status": "crashed", "error": {"kind": "crashed", "message": "crashed: killed by SIGSEGV"}, "wall_ms": 5},
            {"status": "ok", "wall_ms": 7}
        ]});
        assert_eq!(Unit(&new).attempt_count(), Some(2));
        assert_eq!(Unit(&new).earlier_attempts().len(), 1);
        assert_eq!(Unit(&json!({})).attempt_count(), None);
    }

    #[test]
    fn failures_say_the_status_once() {
        assert_eq!(failure_text("crashed", Some("crashed: killed by SIGSEGV")), "crashed: killed by SIGSEGV");
        assert_eq!(failure_text("error", Some("x must be non-negative")), "error: x must be non-negative");
        assert_eq!(failure_text("timeout", None), "timeout");
        let banner = json!({"stderr_tail": [
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
            "I0000 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results",
            "F0000 the cause"]});
        assert_eq!(Unit(&banner).stderr_tail(), ["F0000 the cause"], "the banner is left out");
        let breach = "below threshold: max drop accuracy=0.01 not met: 0.8";
        assert_eq!(failure_text("below_threshold", Some(breach)), breach, "the status is not said twice");
        let error =
            json!({"status": "error", "error": {"kind": "tensorflow", "code": "INVALID_ARGUMENT", "message": "x < 0"}});
        assert_eq!(Unit(&error).failure_text(), "error: tensorflow (INVALID_ARGUMENT): x < 0");
        let error = json!({"status": "error", "error": {"kind": "load_failed", "message": "no such file"}});
        assert_eq!(Unit(&error).failure_text(), "error: load_failed: no such file");
        let unit = json!({"status": "weird"});
        assert_eq!(Unit(&unit).verdict(), Verdict::Failed);
    }

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(seconds_text(1200), "1.20 s");
        assert_eq!(bytes_text(2_428_928), "2.3 MiB");
        assert_eq!(bytes_text(317_718_528), "303 MiB");
        assert_eq!(bytes_text(1_342_177_280), "1.25 GiB");
        assert_eq!(bytes_text(512), "512 B");
    }
}
