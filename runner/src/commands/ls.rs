//! `isorun ls`: the models (SavedModels, Keras and ONNX files) `isorun run` would find, with the ids it
//! would give them, one per line, so scripts can pick, count or split models
//! before running them. Lines go out one at a time and a reader that stops
//! early (`isorun ls models/ | head -1`) ends the listing quietly.

use crate::cli::LsArgs;
use crate::error::CliError;
use isorun_engine::{discover, latest_versions, Model};
use isorun_protocol::exit_code;
use isorun_report::text::one_line;
use std::io::{self, Write};

pub fn main(args: &LsArgs) -> Result<i32, CliError> {
    let models = discover(&args.dirs, &mut |warning| crate::support::warn(warning))
        .map_err(|e| crate::support::with_causes(&e))?;
    let models = if args.latest_version { latest_versions(models) } else { models };
    let mut stdout = io::stdout().lock();
    for model in &models {
        let line = if args.json { json_line(model) } else { text_line(model) };
        match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
            Ok(()) => {}
            // Nobody reads any more: the reader had what it wanted.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(exit_code::OK),
            Err(e) => return Err(format!("cannot write to stdout: {e}").into()),
        }
    }
    Ok(exit_code::OK)
}

/// `id<TAB>path<TAB>format` (`saved_model`, `keras`, `h5`, `onnx`). Ids and paths
/// are folder names anyone who can write the tree chose: a tab, newline or
/// escape sequence in them is shown escaped (`\t`, `\n`, `\x1b`), so a
/// line is always one model of three fields; `--json` keeps the exact names.
pub fn text_line(model: &Model) -> String {
    format!("{}\t{}\t{}", one_line(&model.id), one_line(&model.path.to_string_lossy()), model.format.name())
}

/// `{"id": ..., "path": ..., "format": ...}`.
pub fn json_line(model: &Model) -> String {
    serde_json::json!({"id": model.id, "path": model.path.to_string_lossy(), "format": model.format.name()}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_name_cannot_forge_a_line_or_a_column() {
        let model = Model::saved_model("a\tforged\nb\x1b]0;title\x07", "/models/a\tforged\nb\x1b]0;title\x07");
        let line = text_line(&model);
        assert_eq!(line.split('\t').count(), 3, "{line:?}");
        assert!(!line.contains('\n') && !line.contains('\x1b') && !line.contains('\x07'), "{line:?}");
        assert!(line.starts_with("a\\tforged\\nb\\x1b]0;title\\x07\t"), "{line:?}");
        // JSON keeps the exact name (serde escapes it).
        let json: serde_json::Value = serde_json::from_str(&json_line(&model)).unwrap();
        assert_eq!(json["id"], model.id);
    }
}
