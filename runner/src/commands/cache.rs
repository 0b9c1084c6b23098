//! `isorun cache ls|clear`: the SavedModels exported from Keras files,
//! kept by content hash so that a second run pays no export.

use crate::cli::{CacheArgs, CacheCommand};
use crate::error::CliError;
use isorun_engine::keras::cache;
use isorun_protocol::exit_code;
use std::path::PathBuf;

pub fn main(command: &CacheCommand) -> Result<i32, CliError> {
    let (CacheCommand::Ls(args) | CacheCommand::Clear(args)) = command;
    let dir = folder(args)?;
    match command {
        CacheCommand::Ls(_) => {
            for entry in cache::list(&dir) {
                let about = &entry.about;
                let text = |key: &str| about.get(key).and_then(|v| v.as_str()).unwrap_or("-").to_string();
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    entry.key,
                    text("from"),
                    text("loader"),
                    entry.bytes,
                    text("source"),
                    key_parts(about)
                );
            }
        }
        CacheCommand::Clear(_) => {
            let removed = cache::clear(&dir).map_err(|e| format!("{}: cannot clear: {e}", dir.display()))?;
            eprintln!("isorun: removed {removed} export(s) from {}", dir.display());
        }
    }
    Ok(exit_code::OK)
}

/// What made an entry's key beside the file's bytes: `keras 3.10.0,
/// tensorflow 2.21.0, modules layers.py (sha256 0a1b2c3d4e5f), unsafe`.
/// Two entries for one file differ in one of these.
fn key_parts(about: &serde_json::Value) -> String {
    let text = |key: &str| about.get(key).and_then(|v| v.as_str()).unwrap_or("-").to_string();
    let mut parts = vec![format!("keras {}", text("keras")), format!("tensorflow {}", text("tensorflow"))];
    if let Some(tf_keras) = about.get("tf_keras").and_then(|v| v.as_str()) {
        parts.push(format!("tf_keras {tf_keras}"));
    }
    let modules: Vec<String> = about
        .get("keras_modules")
        .and_then(|m| m.as_array())
        .into_iter()
        .flatten()
        .map(|m| {
            let name = m["path"].as_str().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or("?");
            let sha: String = m["sha256"].as_str().unwrap_or("").chars().take(12).collect();
            format!("{name} (sha256 {sha})")
        })
        .collect();
    match about.get("keras_unsafe").and_then(|v| v.as_bool()) {
        // An entry from before the key's parts were written down.
        None => parts.push("modules and safe mode not recorded".into()),
        Some(unsafe_code) => {
            parts.push(if modules.is_empty() { "no modules".into() } else { format!("modules {}", modules.join(" ")) });
            parts.push(if unsafe_code { "unsafe" } else { "safe mode" }.into());
        }
    }
    parts.join(", ")
}

fn folder(args: &CacheArgs) -> Result<PathBuf, String> {
    args.keras_cache
        .clone()
        .or_else(cache::default_cache_dir)
        .ok_or_else(|| "no cache folder (neither XDG_CACHE_HOME nor HOME is set); name one with --keras-cache".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_shows_every_part_of_its_key() {
        let about = serde_json::json!({"keras": "3.10.0", "tensorflow": "2.21.0", "tf_keras": null,
            "keras_modules": [{"path": "/src/layers.py", "sha256": "0a1b2c3d4e5f60718293a4b5"}], "keras_unsafe": true});
        assert_eq!(
            key_parts(&about),
            "keras 3.10.0, tensorflow 2.21.0, modules layers.py (sha256 0a1b2c3d4e5f), unsafe"
        );
        let plain =
            serde_json::json!({"keras": "3.10.0", "tensorflow": "2.21.0", "keras_modules": [], "keras_unsafe": false});
        assert_eq!(key_parts(&plain), "keras 3.10.0, tensorflow 2.21.0, no modules, safe mode");
        let old = serde_json::json!({"keras": "3.10.0", "tensorflow": "2.21.0"});
        assert_eq!(key_parts(&old), "keras 3.10.0, tensorflow 2.21.0, modules and safe mode not recorded");
    }
}
