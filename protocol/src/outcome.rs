//! How a unit of work (one model run in a worker) ended. `Outcome` is the
//! closed set of endings every report is built from; `ModelError` is what a
//! worker says when the model or its inputs are at fault, which is
//! deterministic and so never retried.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What was wrong with a model or its inputs, as the worker found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The SavedModel could not be loaded (missing, corrupt, wrong tags).
    LoadFailed,
    /// No signature with the requested key.
    SignatureNotFound,
    /// Input names, dtypes or shapes do not fit the signature.
    InputMismatch,
    /// TensorFlow failed while running the signature.
    Tensorflow,
    /// The signature uses a dtype isorun cannot carry.
    UnsupportedDtype,
    /// The worker panicked (a bug in isorun, reported rather than hidden).
    WorkerPanic,
    /// The supervisor could not write the outputs (disk full, permissions).
    OutputWrite,
    /// The evaluation data could not be read or does not fit the model
    /// (corrupt record, missing feature): `isorun eval`; a missing or
    /// corrupt TF Serving warm-up file: `isorun run --warmup-inputs`.
    Dataset,
    /// The outputs cannot be scored against the labels (shape, a label
    /// outside the classes): `isorun eval`.
    Evaluation,
    /// A Keras model file could not be exported to a SavedModel (unreadable
    /// file, unknown custom class, a Lambda in safe mode, no Python with Keras).
    ExportFailed,
    /// ONNX Runtime failed while running an ONNX model (protocol 14).
    Onnxruntime,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::LoadFailed => "load_failed",
            ErrorKind::SignatureNotFound => "signature_not_found",
            ErrorKind::InputMismatch => "input_mismatch",
            ErrorKind::Tensorflow => "tensorflow",
            ErrorKind::UnsupportedDtype => "unsupported_dtype",
            ErrorKind::WorkerPanic => "worker_panic",
            ErrorKind::OutputWrite => "output_write",
            ErrorKind::Dataset => "dataset",
            ErrorKind::Evaluation => "evaluation",
            ErrorKind::ExportFailed => "export_failed",
            ErrorKind::Onnxruntime => "onnxruntime",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error about one model, reported by the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelError {
    pub kind: ErrorKind,
    /// TensorFlow's status code name (`INVALID_ARGUMENT`, ...), or ONNX
    /// Runtime's (`ORT_FAIL`, ...), when the runtime said it.
    pub code: Option<String>,
    pub message: String,
}

impl ModelError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ModelError {
        ModelError { kind, code: None, message: message.into() }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} ({}): {}", self.kind, code, self.message),
            None => write!(f, "{}: {}", self.kind, self.message),
        }
    }
}

/// Where a unit was when its time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Starting the worker, before its `Hello`.
    Start,
    /// Loading the SavedModel.
    Load,
    /// Running the signature.
    Run,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::Load => "load",
            Phase::Run => "run",
        }
    }
}

/// Why a unit never ran to an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotRunReason {
    /// isorun was interrupted (Ctrl-C, SIGTERM; the record's message names
    /// the signal), or stopped as its journal could not be written.
    Interrupted,
    /// `--max-failures` was reached.
    MaxFailures,
    /// The shard task that owned it was lost.
    ShardTaskLost,
    /// Nobody read isorun's output any more (`isorun run ... | head -1`):
    /// the run stopped, though nobody interrupted it. Set by the CLI; the
    /// engine, which knows no stdout, says `Interrupted`.
    StdoutClosed,
}

impl NotRunReason {
    pub fn name(self) -> &'static str {
        match self {
            NotRunReason::Interrupted => "interrupted",
            NotRunReason::MaxFailures => "max_failures",
            NotRunReason::ShardTaskLost => "shard_task_lost",
            NotRunReason::StdoutClosed => "stdout_closed",
        }
    }
}

/// A rule an evaluation does not meet (`--threshold`, `--max-drop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breach {
    pub metric: String,
    /// The rule as written: `accuracy>=0.9` or `max drop accuracy=2%`.
    pub rule: String,
    /// The value the metric had to reach.
    pub bound: f64,
    /// The value it had (NaN when the evaluation lacks it).
    pub value: f64,
    /// The baseline's value, for drops.
    pub baseline: Option<f64>,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {} (rule {}, bound {}", self.metric, self.value, self.rule, self.bound)?;
        if let Some(b) = self.baseline {
            write!(f, ", baseline {b}")?;
        }
        f.write_str(")")
    }
}

impl Outcome {
    /// The outcome of an evaluation that missed `breaches` (the first is the
    /// one the outcome names); `None` when it missed none.
    pub fn below_threshold(mut breaches: Vec<Breach>) -> Option<Outcome> {
        if breaches.is_empty() {
            return None;
        }
        let first = breaches.remove(0);
        Some(Outcome::BelowThreshold {
            metric: first.metric,
            rule: first.rule,
            bound: first.bound,
            value: first.value,
            baseline: first.baseline,
            others: breaches,
        })
    }
}

/// Everything a unit of work can end as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// The signature ran and returned every output.
    Ok,
    /// The model or its inputs are at fault.
    Error(ModelError),
    /// The worker died: by a signal, or with an exit code it should not have.
    Crashed { signal: Option<i32>, core_dumped: bool, exit_code: Option<i32> },
    /// A deadline passed.
    Timeout { phase: Phase },
    /// The worker went over its memory limit.
    MemoryLimit { peak_bytes: u64 },
    /// The worker broke the protocol (garbage, wrong version, out of order).
    ProtocolError { message: String },
    /// The worker could not be started.
    SpawnFailed { message: String },
    /// Outputs differ from the golden ones: `message` says how; for values
    /// out of tolerance, the largest errors and where the worst one is.
    Mismatch {
        output: String,
        message: String,
        max_abs_error: Option<f64>,
        max_rel_error: Option<f64>,
        index: Option<Vec<u64>>,
    },
    /// A metric of an evaluation missed its bound (`--threshold`) or fell
    /// further than allowed below the baseline's (`--max-drop`).
    BelowThreshold {
        metric: String,
        /// The rule as given: `accuracy>=0.9`, `max drop accuracy=2%`.
        rule: String,
        /// The value the metric had to reach.
        bound: f64,
        value: f64,
        /// The baseline's value, for a drop.
        baseline: Option<f64>,
        /// The rules missed after this first one, in the order they were checked.
        #[serde(default)]
        others: Vec<Breach>,
    },
    /// The unit was never run to an end.
    NotRun { reason: NotRunReason },
}

impl Outcome {
    /// The `status` field of records: one word per variant.
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error(_) => "error",
            Outcome::Crashed { .. } => "crashed",
            Outcome::Timeout { .. } => "timeout",
            Outcome::MemoryLimit { .. } => "memory_limit",
            Outcome::ProtocolError { .. } => "protocol_error",
            Outcome::SpawnFailed { .. } => "spawn_failed",
            Outcome::Mismatch { .. } => "mismatch",
            Outcome::BelowThreshold { .. } => "below_threshold",
            Outcome::NotRun { .. } => "not_run",
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }
}

/// A number for people: at most 6 significant digits, no float noise
/// (`-0.09000000000000008` is `-0.09`, `0.912345678` is `0.912346`).
pub fn short_number(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return x.to_string();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (5 - magnitude).clamp(0, 15) as usize;
    let text = format!("{x:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    if text == "-0" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// A size for people: `512 B`, `27.3 MiB`, `2.00 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    match bytes {
        b if b < 1 << 20 => format!("{b} B"),
        b if b < 1 << 30 => format!("{:.1} MiB", b as f64 / MIB),
        b => format!("{:.2} GiB", b as f64 / GIB),
    }
}

/// The conventional name of a signal number (`SIGSEGV`), for records and messages.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok => f.write_str("ok"),
            Outcome::Error(e) => write!(f, "error: {e}"),
            Outcome::Crashed { signal: Some(s), core_dumped, .. } => {
                write!(f, "crashed: killed by {}{}", signal_name(*s), if *core_dumped { " (core dumped)" } else { "" })
            }
            Outcome::Crashed { exit_code: Some(c), .. } => write!(f, "crashed: exited with code {c}"),
            Outcome::Crashed { .. } => f.write_str("crashed"),
            Outcome::Timeout { phase } => write!(f, "timeout while in phase {}", phase.name()),
            Outcome::MemoryLimit { peak_bytes } => {
                write!(f, "memory limit exceeded (peak {})", human_bytes(*peak_bytes))
            }
            Outcome::ProtocolError { message } => write!(f, "protocol error: {message}"),
            Outcome::SpawnFailed { message } => write!(f, "worker could not be started: {message}"),
            Outcome::Mismatch { output, message, .. } => write!(f, "mismatch in output {output}: {message}"),
            Outcome::BelowThreshold { rule, value, baseline: Some(baseline), .. } => {
                let (value, baseline) = (short_number(*value), short_number(*baseline));
                write!(f, "below threshold: {rule} not met: {value} against the baseline's {baseline}")
            }
            Outcome::BelowThreshold { rule, value, .. } => {
                write!(f, "below threshold: {rule} not met: {}", short_number(*value))
            }
            Outcome::NotRun { reason } => write!(f, "not run: {}", reason.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_what_happened() {
        let crashed = Outcome::Crashed { signal: Some(11), core_dumped: false, exit_code: None };
        assert_eq!(crashed.to_string(), "crashed: killed by SIGSEGV");
        assert_eq!(crashed.status(), "crashed");
        let error = Outcome::Error(ModelError {
            kind: ErrorKind::Tensorflow,
            code: Some("INVALID_ARGUMENT".into()),
            message: "x must be non-negative".into(),
        });
        assert_eq!(error.to_string(), "error: tensorflow (INVALID_ARGUMENT): x must be non-negative");
        assert_eq!(Outcome::Timeout { phase: Phase::Load }.to_string(), "timeout while in phase load");
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn numbers_in_messages_have_no_float_noise() {
        assert_eq!(short_number(-0.09000000000000008), "-0.09");
        assert_eq!(short_number(0.912345678), "0.912346");
        assert_eq!(short_number(1234.5), "1234.5");
        assert_eq!(short_number(3.0), "3");
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(f64::NAN), "NaN");
        let breach = Outcome::BelowThreshold {
            metric: "accuracy".into(),
            rule: "max drop accuracy=0.01".into(),
            bound: 0.89,
            value: 0.8000000000000002,
            baseline: Some(0.9),
            others: Vec::new(),
        };
        assert_eq!(
            breach.to_string(),
            "below threshold: max drop accuracy=0.01 not met: 0.8 against the baseline's 0.9"
        );
    }

    #[test]
    fn memory_is_shown_in_mib_and_gib() {
        let over = Outcome::MemoryLimit { peak_bytes: 28_598_272 };
        assert_eq!(over.to_string(), "memory limit exceeded (peak 27.3 MiB)");
        assert_eq!(human_bytes(4), "4 B");
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
    }
}
