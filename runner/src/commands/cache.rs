//! `isorun cache ls|clear`: the SavedModels exported from Keras files,
//! kept by content hash so that a second run pays no export.

use crate::cli::{CacheArgs, CacheCommand};
use isorun_engine::keras::cache;
use isorun_protocol::exit_code;
use std::path::PathBuf;

pub fn main(command: &CacheCommand) -> Result<i32, String> {
    let (CacheCommand::Ls(args) | CacheCommand::Clear(args)) = command;
    let dir = folder(args)?;
    match command {
        CacheCommand::Ls(_) => {
            for entry in cache::list(&dir) {
                let about = &entry.about;
                let text = |key: &str| about.get(key).and_then(|v| v.as_str()).unwrap_or("-").to_string();
                println!("{}\t{}\t{}\t{}\t{}", entry.key, text("from"), text("loader"), entry.bytes, text("source"));
            }
        }
        CacheCommand::Clear(_) => {
            let removed = cache::clear(&dir).map_err(|e| format!("{}: cannot clear: {e}", dir.display()))?;
            eprintln!("isorun: removed {removed} export(s) from {}", dir.display());
        }
    }
    Ok(exit_code::OK)
}

fn folder(args: &CacheArgs) -> Result<PathBuf, String> {
    args.keras_cache
        .clone()
        .or_else(cache::default_cache_dir)
        .ok_or_else(|| "no cache folder (neither XDG_CACHE_HOME nor HOME is set); name one with --keras-cache".into())
}
