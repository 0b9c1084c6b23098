//! What the export process says on its stdout, and how the supervisor
//! holds it to the protocol: each line parsed against where the process
//! is (hello, then each job's start and done, in order), its phases'
//! times checked, Keras's error explained.

use super::job::GraphSource;
use crate::settings::Settings;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

/// The longest line the export process may send.
pub(super) const MAX_LINE: u64 = 1 << 20;

/// One line of the export process, checked against where it is: nothing
/// it says is taken on trust, since model code may have written it.
#[derive(Debug, PartialEq)]
pub(super) enum Answer {
    Hello,
    Start(usize),
    /// `loader` is `Some` (one of [`LOADERS`]) when the file was exported;
    /// `graph` says whether it was traced (also when not said);
    /// `check_in_worker`, a frozen graph's check left to the worker.
    Done {
        index: usize,
        loader: Option<&'static str>,
        graph: GraphSource,
        check_in_worker: bool,
    },
}

/// The loaders an export may name (the `loader` of a record and of `export.json`).
const LOADERS: [&str; 2] = ["keras", "tf_keras"];

impl Answer {
    /// `current`: the job started and not done; `next`: the index the next
    /// `start` must carry; `jobs`: how many the process was given.
    pub(super) fn parse(
        message: &Value,
        said_hello: bool,
        current: Option<usize>,
        next: usize,
        jobs: usize,
    ) -> Result<Answer, String> {
        let Some(object) = message.as_object() else { return Err("a line that is not a JSON object".into()) };
        let index = |key: &str| object.get(key).and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok());
        if object.contains_key("hello") {
            if said_hello {
                return Err("a second hello".into());
            }
            return Ok(Answer::Hello);
        }
        if !said_hello {
            return Err("an answer before its hello".into());
        }
        if object.contains_key("start") {
            let Some(i) = index("start") else { return Err("a start without a job number".into()) };
            if current.is_some() || i != next || i >= jobs {
                return Err(format!(
                    "started job {i}, expected {}",
                    if next < jobs { next.to_string() } else { "none".into() }
                ));
            }
            return Ok(Answer::Start(i));
        }
        if object.contains_key("done") {
            let Some(i) = index("done") else { return Err("a done without a job number".into()) };
            if current != Some(i) {
                return Err(match current {
                    Some(c) => format!("finished job {i} while job {c} was running"),
                    None => format!("finished job {i}, which was not running"),
                });
            }
            if object.get("ok").and_then(Value::as_bool) != Some(true) {
                return Ok(Answer::Done { index: i, loader: None, graph: GraphSource::Traced, check_in_worker: false });
            }
            let graph = match object.get("graph") {
                None => GraphSource::Traced,
                Some(named) => named.as_str().and_then(GraphSource::from_name).ok_or_else(|| {
                    format!(
                        "finished job {i} with an unknown graph {:?}",
                        named.to_string().chars().take(40).collect::<String>()
                    )
                })?,
            };
            let named = object.get("loader").and_then(Value::as_str).unwrap_or_default();
            let Some(loader) = LOADERS.iter().find(|l| **l == named) else {
                return Err(format!(
                    "finished job {i} with an unknown loader {:?}",
                    named.chars().take(40).collect::<String>()
                ));
            };
            let check_in_worker = match object.get("check") {
                None => false,
                Some(Value::String(way)) if way == "worker" && graph == GraphSource::Frozen => true,
                Some(other) => {
                    return Err(format!(
                        "finished job {i} ({}) with a check {:?}",
                        graph.name(),
                        other.to_string().chars().take(40).collect::<String>()
                    ))
                }
            };
            return Ok(Answer::Done { index: i, loader: Some(loader), graph, check_in_worker });
        }
        Err("a line that is none of hello, start, done".into())
    }
}

/// The most phases one answer's `"ms"` may name, and the longest name.
const MAX_PHASES: usize = 32;
const MAX_PHASE_NAME: usize = 32;

/// An answer's `"ms"`: where the export process says its time went, phase
/// by phase (`keras_export.py`'s `Laps`), in the order it names them; none
/// when it says nothing. Refused unless it is an object of at most
/// [`MAX_PHASES`] names of lower-case letters and `_` (at most
/// [`MAX_PHASE_NAME`] long), each a whole number of milliseconds.
pub(super) fn milliseconds(message: &Value) -> Result<Vec<(String, u64)>, String> {
    let Some(ms) = message.get("ms") else { return Ok(Vec::new()) };
    let Some(phases) = ms.as_object().filter(|o| o.len() <= MAX_PHASES) else {
        return Err(format!("\"ms\" is not an object of at most {MAX_PHASES} phases"));
    };
    phases
        .iter()
        .map(|(name, value)| {
            let named = !name.is_empty()
                && name.len() <= MAX_PHASE_NAME
                && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            match value.as_u64() {
                Some(ms) if named => Ok((name.clone(), ms)),
                _ => Err(format!(
                    "a phase {:?} of {} that is not a name and a number of milliseconds",
                    name.chars().take(40).collect::<String>(),
                    value.to_string().chars().take(40).collect::<String>()
                )),
            }
        })
        .collect()
}

/// The export process's stdout as the supervisor takes it, without a
/// process: `stdout` read line by line (each at most `MAX_LINE` bytes, as
/// the reading thread does), each line parsed and held to the protocol for
/// `jobs` files, with the state the supervising loop keeps. What each line
/// came to, in order, ending with the first line refused (then the process
/// would be killed). For the fuzz target `export_answer`; not an API.
pub fn answer_lines(stdout: &[u8], jobs: usize) -> Vec<Result<String, String>> {
    let settings = Settings::builder("worker").build();
    let files: Vec<PathBuf> = (0..jobs).map(|i| PathBuf::from(format!("model{i}.keras"))).collect();
    let mut reader = BufReader::new(stdout);
    let (mut said_hello, mut current, mut next_start) = (false, None::<usize>, 0usize);
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => return seen,
            Ok(_) => {}
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(e) => {
                seen.push(Err(format!("export process sent a bad line: {e}")));
                return seen;
            }
        };
        match Answer::parse(&message, said_hello, current, next_start, jobs).and_then(|a| {
            milliseconds(&message)?;
            Ok(a)
        }) {
            Ok(Answer::Hello) => {
                said_hello = true;
                seen.push(Ok("hello".into()));
            }
            Ok(Answer::Start(index)) => {
                current = Some(index);
                next_start = index + 1;
                seen.push(Ok(format!("start {}", files[index].display())));
            }
            Ok(Answer::Done { index, loader, .. }) => {
                let file = &files[index];
                seen.push(Ok(match loader {
                    Some(loader) => format!("{}: exported with {loader}", file.display()),
                    None => {
                        let text = message.get("error").and_then(Value::as_str).unwrap_or("unknown error");
                        explain(file, text, &settings)
                    }
                }));
                current = None;
            }
            Err(message) => {
                seen.push(Err(format!("export process: {message}")));
                return seen;
            }
        }
    }
}

/// Keras's own message, with the file, and what to do where isorun knows.
pub(super) fn explain(file: &std::path::Path, error: &str, settings: &Settings) -> String {
    let mut message = format!("{}: {error}", file.display());
    if let Some(class) = error.split("Could not locate class '").nth(1).and_then(|rest| rest.split('\'').next()) {
        message.push_str(&format!(
            " (custom class {class}: pass the Python file that defines and registers it with --keras-module FILE.py)"
        ));
    } else if error.contains("`Lambda` layer") && !settings.keras.unsafe_code {
        message.push_str(
            " (a Lambda layer holds Python code; --keras-unsafe runs it, inside the export sandbox, if you trust the file)",
        );
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(line: &str, said_hello: bool, current: Option<usize>, next: usize) -> Result<Answer, String> {
        Answer::parse(&serde_json::from_str(line).unwrap(), said_hello, current, next, 2)
    }

    #[test]
    fn answer_lines_end_at_the_first_refused_line() {
        let stdout = b"{\"hello\": {}}\n{\"start\": 0}\n{\"done\": 0, \"ok\": true, \"loader\": \"keras\"}\n{\"start\": 3}\n{\"start\": 1}\n";
        let answers = answer_lines(stdout, 2);
        assert_eq!(answers.len(), 4, "{answers:?}");
        assert_eq!(answers[2], Ok("model0.keras: exported with keras".into()));
        assert_eq!(answers[3], Err("export process: started job 3, expected 1".into()));
        let bad = answer_lines(b"{\"hello\": {}}\nnot json\n{\"start\": 0}\n", 1);
        assert!(
            matches!(bad.as_slice(), [Ok(_), Err(e)] if e.starts_with("export process sent a bad line")),
            "{bad:?}"
        );
    }

    #[test]
    fn an_answer_s_phases_are_read_in_order_and_held_to_names_and_numbers() {
        let ms = |line: &str| milliseconds(&serde_json::from_str(line).unwrap());
        assert_eq!(ms(r#"{"start": 0}"#), Ok(Vec::new()));
        assert_eq!(
            ms(r#"{"done": 0, "ms": {"load_model": 7, "archive": 3, "keep": 0}}"#),
            Ok(vec![("load_model".into(), 7), ("archive".into(), 3), ("keep".into(), 0)])
        );
        for bad in [
            r#"{"ms": [1]}"#,
            r#"{"ms": {"load": -1}}"#,
            r#"{"ms": {"load": 1.5}}"#,
            r#"{"ms": {"Load": 1}}"#,
            r#"{"ms": {"": 1}}"#,
            r#"{"ms": {"\u001b[2J": 1}}"#,
        ] {
            assert!(ms(bad).is_err(), "{bad}");
        }
        let many: serde_json::Map<String, Value> =
            (0..=MAX_PHASES).map(|i| (format!("p{}", "a".repeat(i % 20)) + &"_".repeat(i / 20), json!(1))).collect();
        assert!(milliseconds(&json!({ "ms": many })).is_err());
        let long = "a".repeat(MAX_PHASE_NAME + 1);
        assert!(milliseconds(&json!({ "ms": { long: 1 } })).is_err());
        // A line the supervisor refuses for its phases ends the process's answers.
        let answers = answer_lines(b"{\"hello\": {}, \"ms\": {\"imports\": \"soon\"}}\n", 1);
        assert!(matches!(answers.as_slice(), [Err(e)] if e.contains("imports")), "{answers:?}");
    }

    #[test]
    fn the_export_process_is_held_to_its_protocol() {
        assert_eq!(parse(r#"{"hello": {}}"#, false, None, 0), Ok(Answer::Hello));
        assert_eq!(parse(r#"{"start": 0}"#, true, None, 0), Ok(Answer::Start(0)));
        let ok = r#"{"done": 0, "ok": true, "loader": "tf_keras"}"#;
        assert_eq!(
            parse(ok, true, Some(0), 1),
            Ok(Answer::Done { index: 0, loader: Some("tf_keras"), graph: GraphSource::Traced, check_in_worker: false })
        );
        let deferred = r#"{"done": 0, "ok": true, "loader": "keras", "graph": "frozen", "check": "worker"}"#;
        assert_eq!(
            parse(deferred, true, Some(0), 1),
            Ok(Answer::Done { index: 0, loader: Some("keras"), graph: GraphSource::Frozen, check_in_worker: true })
        );
        let failed = r#"{"done": 1, "ok": false, "error": "x"}"#;
        assert_eq!(
            parse(failed, true, Some(1), 2),
            Ok(Answer::Done { index: 1, loader: None, graph: GraphSource::Traced, check_in_worker: false })
        );
        let refused = [
            (r#"{"done": 0, "ok": true, "loader": "keras"}"#, true, None, 1, "not running"),
            (r#"{"done": 1, "ok": true, "loader": "keras"}"#, true, Some(0), 1, "while job 0"),
            (r#"{"done": 7, "ok": true, "loader": "keras"}"#, true, Some(0), 1, "while job 0"),
            (r#"{"start": 0}"#, true, None, 1, "expected 1"),
            (r#"{"start": 1}"#, true, Some(0), 1, "started job 1"),
            (r#"{"start": 2}"#, true, None, 2, "expected none"),
            (r#"{"done": 0, "ok": true, "loader": "keras\n\u001b[2J"}"#, true, Some(0), 1, "unknown loader"),
            (r#"{"done": 0, "ok": true, "loader": "keras", "graph": "borrowed"}"#, true, Some(0), 1, "unknown graph"),
            (
                r#"{"done": 0, "ok": true, "loader": "keras", "check": "worker"}"#,
                true,
                Some(0),
                1,
                "(traced) with a check",
            ),
            (
                r#"{"done": 0, "ok": true, "loader": "keras", "graph": "frozen", "check": "skipped"}"#,
                true,
                Some(0),
                1,
                "with a check \"\\\"skipped",
            ),
            (r#"{"hello": {}}"#, true, None, 0, "second hello"),
            (r#"{"start": 0}"#, false, None, 0, "before its hello"),
            (r#"{"queued": 0}"#, true, None, 0, "none of"),
            (r#"[1]"#, true, None, 0, "not a JSON object"),
        ];
        for (line, hello, current, next, expected) in refused {
            let error = parse(line, hello, current, next).unwrap_err();
            assert!(error.contains(expected), "{line}: {error}");
        }
    }
}
