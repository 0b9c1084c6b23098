//! `isorun ls`: the models (SavedModels and Keras files) `isorun run` would find, with the ids it
//! would give them, one per line, so scripts can pick, count or split models
//! before running them. Lines go out one at a time and a reader that stops
//! early (`isorun ls models/ | head -1`) ends the listing quietly.

use crate::cli::LsArgs;
use isorun_engine::{discover, latest_versions, Model};
use isorun_protocol::exit_code;
use std::io::{self, Write};

pub fn main(args: &LsArgs) -> Result<i32, String> {
    let models = discover(&args.dirs, &mut |warning| eprintln!("isorun: warning: {warning}"))
        .map_err(|e| crate::support::with_causes(&e))?;
    let models = if args.latest_version { latest_versions(models) } else { models };
    let mut stdout = io::stdout().lock();
    for model in &models {
        let line = if args.json { json_line(model) } else { text_line(model) };
        match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
            Ok(()) => {}
            // Nobody reads any more: the reader had what it wanted.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(exit_code::OK),
            Err(e) => return Err(format!("cannot write to stdout: {e}")),
        }
    }
    Ok(exit_code::OK)
}

/// `id<TAB>path<TAB>format` (`saved_model`, `keras`, `h5`).
pub fn text_line(model: &Model) -> String {
    format!("{}\t{}\t{}", model.id, model.path.display(), model.format.name())
}

/// `{"id": ..., "path": ..., "format": ...}`.
pub fn json_line(model: &Model) -> String {
    serde_json::json!({"id": model.id, "path": model.path.to_string_lossy(), "format": model.format.name()}).to_string()
}
