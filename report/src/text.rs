//! Text a model controls, made safe to print. A model's error message, its
//! stderr, its output names and the folder names of a shared model tree
//! reach the user's terminal and the reports' text: an escape sequence in
//! them could rewrite a row (`\r\x1b[2K... ok`), set the terminal's title or
//! hide text, and a newline or tab could forge a line of `ls`, `report diff`
//! or the table. Every such string passes [`one_line`] (or [`lines`], where a
//! message may span lines) before it is printed. JSON output needs none of
//! this: serde escapes control characters there.
//!
//! A leaf module with no dependencies, so that the report crate and the CLI
//! (which depends on it) share the one helper.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` for a one-line field (an id, a path, a status, a table cell):
/// every C0 control character (tab, newline and carriage return included),
/// DEL and every C1 control character becomes a visible escape (`\n`,
/// `\x1b`, `\u{9b}`). Everything else, backslashes included, is kept.
pub fn one_line(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// `text` that may span lines (a message, a stderr tail): as [`one_line`],
/// but newlines and tabs are kept. A carriage return is escaped, since it
/// lets a line overwrite the one before it on a terminal.
pub fn lines(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    // `char::is_control` is exactly Unicode's Cc: C0, DEL and C1.
    let kept = |c: char| !c.is_control() || (keep_newlines && (c == '\n' || c == '\t'));
    if text.chars().all(kept) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if kept(c) => escaped.push(c),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if (c as u32) < 0x80 => {
                let _ = write!(escaped, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(escaped, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_escapes() {
        let forged = "\r\x1b[2Kfake  ok  0.02 s  70 MiB\x1b[8m";
        assert_eq!(one_line(forged), "\\r\\x1b[2Kfake  ok  0.02 s  70 MiB\\x1b[8m");
        assert_eq!(one_line("a\tb\nc\x7f\u{9b}31m\u{85}"), "a\\tb\\nc\\x7f\\u{9b}31m\\u{85}");
        assert_eq!(lines("one\n\ttwo\r\x1b]0;title\x07"), "one\n\ttwo\\r\\x1b]0;title\\x07");
        assert!(matches!(one_line("models/résumé \\x1b"), Cow::Borrowed(_)), "plain text is not copied");
    }
}
