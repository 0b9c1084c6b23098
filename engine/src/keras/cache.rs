//! The export cache: a Keras file is exported once per content and
//! toolchain. An entry is a folder named by the SHA-256 of the file's
//! bytes, the Keras, TensorFlow and tf_keras versions, the `--keras-module`
//! files' bytes and `--keras-unsafe`, holding `saved_model/` and
//! `export.json`. Entries are written in a temporary folder beside them
//! (`.tmp-PID-N`) and renamed into place whole, so a reader sees a complete
//! entry or none; temporary folders of processes that are gone (a
//! supervisor killed mid-export) are removed by the next run.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// `$XDG_CACHE_HOME/isorun/keras` (else `~/.cache/isorun/keras`): beside
/// the libtensorflow that `scripts/fetch-libtensorflow` caches.
pub fn default_cache_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join("keras"))
}

/// The SHA-256 of a file's bytes, in hex.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 16];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The entry's name: everything that decides what the export writes.
pub fn entry_key(file_hash: &str, toolchain: &[&str], module_hashes: &[String], unsafe_code: bool) -> String {
    let mut hasher = Sha256::new();
    for part in [file_hash].into_iter().chain(toolchain.iter().copied()).chain(module_hashes.iter().map(String::as_str))
    {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.update([u8::from(unsafe_code)]);
    hex(&hasher.finalize())[..32].to_string()
}

/// The SavedModel of a complete entry, if there is one.
pub fn lookup(cache: &Path, key: &str) -> Option<PathBuf> {
    let saved_model = cache.join(key).join("saved_model");
    (saved_model.join("saved_model.pb").is_file() && cache.join(key).join("export.json").is_file())
        .then_some(saved_model)
}

/// Moves a finished export (`staging` holds `saved_model/`) into place,
/// with its `export.json`. Another run that finished first wins; ours goes.
pub fn commit(cache: &Path, key: &str, staging: &Path, about: &serde_json::Value) -> std::io::Result<PathBuf> {
    std::fs::write(staging.join("export.json"), serde_json::to_vec_pretty(about).unwrap_or_default())?;
    let entry = cache.join(key);
    if let Err(e) = std::fs::rename(staging, &entry) {
        if lookup(cache, key).is_none() {
            return Err(e);
        }
        let _ = std::fs::remove_dir_all(staging);
    }
    Ok(entry.join("saved_model"))
}

/// A new temporary folder in the cache, named after this process.
pub fn staging_dir(cache: &Path) -> std::io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    std::fs::create_dir_all(cache)?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = cache.join(format!(".tmp-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// Removes temporary folders whose process is gone.
pub fn remove_stale(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(".tmp-").and_then(|rest| rest.split('-').next()) else { continue };
        let alive = pid.parse::<u32>().is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One cache entry, as `isorun cache ls` lists it.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub key: String,
    pub path: PathBuf,
    /// What `export.json` says: source file, format, loader, versions, time.
    pub about: serde_json::Value,
    pub bytes: u64,
}

/// Every complete entry, by key.
pub fn list(cache: &Path) -> Vec<CacheEntry> {
    let Ok(entries) = std::fs::read_dir(cache) else { return Vec::new() };
    let mut found: Vec<CacheEntry> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let key = e.file_name().to_string_lossy().into_owned();
            lookup(cache, &key)?;
            let about =
                std::fs::read(e.path().join("export.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())?;
            Some(CacheEntry { bytes: tree_bytes(&e.path()), key, path: e.path(), about })
        })
        .collect();
    found.sort_by(|a, b| a.key.cmp(&b.key));
    found
}

/// Removes every entry and temporary folder; returns how many entries went.
pub fn clear(cache: &Path) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(cache) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            std::fs::remove_dir_all(entry.path())?;
            removed += usize::from(!name.starts_with('.'));
        } else if name.starts_with("python-") {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(removed)
}

fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_appear_whole_and_stale_staging_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let staging = staging_dir(cache).unwrap();
        std::fs::create_dir(staging.join("saved_model")).unwrap();
        std::fs::write(staging.join("saved_model/saved_model.pb"), b"pb").unwrap();
        assert!(lookup(cache, "k").is_none());
        commit(cache, "k", &staging, &serde_json::json!({"from": "keras"})).unwrap();
        assert_eq!(lookup(cache, "k"), Some(cache.join("k/saved_model")));
        assert!(!staging.exists());
        // A dead process's staging folder is removed, a live one's kept.
        std::fs::create_dir(cache.join(".tmp-999999999-0")).unwrap();
        let ours = staging_dir(cache).unwrap();
        remove_stale(cache);
        assert!(!cache.join(".tmp-999999999-0").exists());
        assert!(ours.exists());
        assert_eq!(list(cache).len(), 1);
        assert_eq!(clear(cache).unwrap(), 1);
        assert!(list(cache).is_empty());
    }

    #[test]
    fn keys_change_with_every_part() {
        let base = entry_key("h", &["3.15", "2.21"], &[], false);
        assert_ne!(base, entry_key("h2", &["3.15", "2.21"], &[], false));
        assert_ne!(base, entry_key("h", &["3.16", "2.21"], &[], false));
        assert_ne!(base, entry_key("h", &["3.15", "2.21"], &["m".into()], false));
        assert_ne!(base, entry_key("h", &["3.15", "2.21"], &[], true));
    }
}
