//! An error and its causes as one line, the way every message isorun
//! prints or records says what went wrong: one function, so the supervisor,
//! the engine and the readers word a chain of causes the same way.

/// An error and its causes, as one line: `file.npy: cannot read: No such file or directory`.
/// A cause whose text the message already ends with is not repeated.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
