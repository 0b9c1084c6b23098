//! The export cache: a Keras file is exported once per content and
//! toolchain. An entry is a folder named by the SHA-256 of the file's
//! bytes, the Keras, TensorFlow and tf_keras versions, the `--keras-module`
//! files' bytes and `--keras-unsafe`, holding `saved_model/` and
//! `export.json`. The export process writes in a staging folder
//! (`.tmp-PID-N`) that it may write; the supervisor moves the finished
//! `saved_model/` out of it into a folder of its own (`.entry-PID-N`),
//! checks and hashes the tree there, writes `export.json` beside it and
//! renames the whole into place, so a reader sees a complete entry or none,
//! and nothing the export process planted (a link, a FIFO, a hard link to
//! another file of the user's) is followed or kept. Every use checks the
//! tree against the hash in `export.json` again, so an entry changed after
//! it was stored (by an export process still running, or a concurrent run)
//! is exported anew. Temporary folders of processes that are gone (a
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

/// The SavedModel of a complete entry, if there is one: its `export.json`
/// (written by a supervisor, never by an export process) is a regular
/// file naming the SHA-256 of the `saved_model/` tree, and the tree, walked
/// without following links, still hashes to it. An entry that fails the
/// check (cut short, changed after it was stored, or not made by isorun)
/// is removed, so the file is exported again.
pub fn lookup(cache: &Path, key: &str) -> Option<PathBuf> {
    let entry = cache.join(key);
    match verify(&entry) {
        Ok(()) => Some(entry.join("saved_model")),
        Err(EntryProblem::Absent) => None,
        Err(EntryProblem::Bad(why)) => {
            tracing::warn!(entry = %entry.display(), %why, "Keras export cache entry refused; exporting again");
            let _ = std::fs::remove_dir_all(&entry);
            None
        }
    }
}

enum EntryProblem {
    Absent,
    Bad(String),
}

fn verify(entry: &Path) -> Result<(), EntryProblem> {
    let about = entry.join("export.json");
    match std::fs::symlink_metadata(entry) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err(EntryProblem::Bad("not a folder".into())),
        Err(_) => return Err(EntryProblem::Absent),
    }
    let bytes = read_regular(&about, 1 << 20).map_err(|e| EntryProblem::Bad(format!("export.json: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| EntryProblem::Bad(format!("export.json: {e}")))?;
    let claimed = value.get("tree_sha256").and_then(serde_json::Value::as_str).unwrap_or_default();
    let tree = tree_hash(&entry.join("saved_model")).map_err(EntryProblem::Bad)?;
    if claimed != tree {
        return Err(EntryProblem::Bad(format!("saved_model/ hashes to {tree}, export.json says {claimed:?}")));
    }
    Ok(())
}

/// A file's bytes, opened without following a link, refused unless a
/// regular file of at most `limit` bytes.
fn read_regular(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// The most files and folders a staged SavedModel may hold, and how deep.
const MAX_TREE_ENTRIES: usize = 100_000;
const MAX_TREE_DEPTH: usize = 32;

/// The SHA-256 of a staged or stored SavedModel tree: every entry's path
/// (relative, sorted), kind and, for files, length and bytes. The tree must
/// be regular files (one link each) and folders only: a symlink, device,
/// FIFO, socket or hard link anywhere is refused, naming it, since an
/// export process could have planted it to make the supervisor (or a
/// worker loading the entry) read or write somewhere else.
pub fn tree_hash(root: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let mut entries: Vec<(PathBuf, bool)> = Vec::new();
    let mut stack: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err(format!("{}: not a folder (a link or a file)", root.display())),
        Err(e) => return Err(format!("{}: {e}", root.display())),
    }
    while let Some((relative, depth)) = stack.pop() {
        let dir = root.join(&relative);
        let listing = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for item in listing {
            let item = item.map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = relative.join(item.file_name());
            let meta = std::fs::symlink_metadata(item.path()).map_err(|e| format!("{}: {e}", item.path().display()))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if depth + 1 > MAX_TREE_DEPTH {
                    return Err(format!("{}: more than {MAX_TREE_DEPTH} folders deep", item.path().display()));
                }
                stack.push((path.clone(), depth + 1));
                entries.push((path, true));
            } else if kind.is_file() && meta.nlink() == 1 {
                entries.push((path, false));
            } else {
                let what = if kind.is_symlink() {
                    "a symbolic link"
                } else if kind.is_file() {
                    "a hard link"
                } else {
                    "a device, FIFO or socket"
                };
                return Err(format!(
                    "{}: {what}; an exported SavedModel holds regular files and folders only",
                    item.path().display()
                ));
            }
            if entries.len() > MAX_TREE_ENTRIES {
                return Err(format!("{}: more than {MAX_TREE_ENTRIES} files", root.display()));
            }
        }
    }
    entries.sort();
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 16];
    for (path, is_dir) in &entries {
        let name = path.as_os_str().as_encoded_bytes();
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name);
        if *is_dir {
            hasher.update(b"d");
            continue;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let full = root.join(path);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&full)
            .map_err(|e| format!("{}: {e}", full.display()))?;
        let meta = file.metadata().map_err(|e| format!("{}: {e}", full.display()))?;
        if !meta.file_type().is_file() || meta.nlink() != 1 {
            return Err(format!("{}: changed while it was read", full.display()));
        }
        hasher.update(b"f");
        hasher.update(meta.len().to_le_bytes());
        let mut read = 0u64;
        loop {
            let n = file.read(&mut buffer).map_err(|e| format!("{}: {e}", full.display()))?;
            if n == 0 {
                break;
            }
            read += n as u64;
            hasher.update(&buffer[..n]);
        }
        if read != meta.len() {
            return Err(format!("{}: changed while it was read", full.display()));
        }
    }
    Ok(hex(&hasher.finalize()))
}

/// Moves a finished export (`staging` holds `saved_model/`, written by a
/// sandboxed process that may still be running) into place, with its
/// `export.json`. The supervisor trusts nothing the export process could
/// write: `saved_model/` is first moved out of its reach into a folder only
/// the supervisor made (Landlock's rules follow paths, so the process can
/// no longer write beneath it), then walked without following links and
/// hashed (regular files and folders only, see [`tree_hash`]); the entry's
/// `export.json` is created there new (`O_EXCL`, no link followed), never
/// in the staging folder. Another run that finished first wins; ours goes.
pub fn commit(cache: &Path, key: &str, staging: &Path, about: &serde_json::Value) -> std::io::Result<PathBuf> {
    let invalid = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidData, message);
    let staged = staging.join("saved_model");
    match std::fs::symlink_metadata(&staged) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err(invalid(format!("{}: not a folder (a link or a file)", staged.display()))),
        Err(e) => return Err(e),
    }
    let ours = new_private_dir(cache, "entry")?;
    let result = (|| {
        std::fs::rename(&staged, ours.join("saved_model"))?;
        let tree = tree_hash(&ours.join("saved_model")).map_err(invalid)?;
        let mut about = about.clone();
        if let Some(map) = about.as_object_mut() {
            map.insert("tree_sha256".into(), serde_json::Value::String(tree));
        }
        // A check left to the worker: its file comes along, moved out of
        // reach as `saved_model/` was, and its hash goes in `export.json`
        // (a missing or odd file leaves no hash: the check then fails, and
        // the file is exported again).
        if is_pending(&about) {
            let moved = std::fs::rename(staging.join(CHECK_FILE), ours.join(CHECK_FILE));
            let hash = moved.ok().and_then(|()| read_regular(&ours.join(CHECK_FILE), MAX_CHECK_FILE).ok());
            if let (Some(bytes), Some(map)) = (hash, about.as_object_mut()) {
                map.insert("check_sha256".into(), serde_json::Value::String(hex(&Sha256::digest(&bytes))));
            }
        }
        write_new(&ours.join("export.json"), &serde_json::to_vec_pretty(&about).unwrap_or_default())?;
        let entry = cache.join(key);
        if let Err(e) = std::fs::rename(&ours, &entry) {
            if lookup(cache, key).is_none() {
                return Err(e);
            }
        }
        Ok(entry.join("saved_model"))
    })();
    let _ = std::fs::remove_dir_all(&ours);
    result
}

/// The file beside `saved_model/` holding a frozen graph's probe and the
/// traced function's outputs on it, while its check is left to a worker
/// (`keras_export.py` writes it; see `frozen_check`), and the most it may take.
pub const CHECK_FILE: &str = "frozen-check.npz";
const MAX_CHECK_FILE: u64 = 64 << 20;

/// `export.json`'s `check` of a frozen graph: not checked yet, checked by a
/// unit's worker, checked by the export process.
pub const CHECK_PENDING: &str = "pending";
pub const CHECK_WORKER: &str = "worker";
pub const CHECK_EXPORT: &str = "export";

/// An entry's `export.json`, if it is a readable one (a regular file of at
/// most 1 MiB, no link followed, JSON).
pub fn about(entry: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&read_regular(&entry.join("export.json"), 1 << 20).ok()?).ok()
}

/// Whether an `export.json` says its frozen graph still waits for its check.
pub fn is_pending(about: &serde_json::Value) -> bool {
    about.get("check").and_then(serde_json::Value::as_str) == Some(CHECK_PENDING)
}

/// Whether the entry's frozen graph still waits for its check.
pub fn check_pending(entry: &Path) -> bool {
    about(entry).is_some_and(|a| is_pending(&a))
}

/// The arrays of a pending entry's check file, whose bytes must hash to
/// `export.json`'s `check_sha256`: read without following a link, a
/// regular file with one link, at most 64 MiB, every array stored as it is
/// (as `np.savez` writes them: a compressed entry could claim gigabytes the
/// supervisor would then inflate), then parsed as any untrusted `.npz`.
pub fn read_check(entry: &Path) -> Result<Vec<(String, isorun_protocol::Tensor)>, String> {
    use std::os::unix::fs::MetadataExt;
    let path = entry.join(CHECK_FILE);
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let claimed = about(entry)
        .and_then(|a| a.get("check_sha256")?.as_str().map(String::from))
        .ok_or("export.json names no check file")?;
    let links = std::fs::symlink_metadata(&path).map_err(|e| at(&e))?.nlink();
    if links != 1 {
        return Err(at(&format!("{links} links to it (a hard link to another file?)")));
    }
    let bytes = read_regular(&path, MAX_CHECK_FILE).map_err(|e| at(&e))?;
    let hash = hex(&Sha256::digest(&bytes));
    if hash != claimed {
        return Err(at(&format!("hashes to {hash}, export.json says {claimed}")));
    }
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).map_err(|e| at(&e))?;
    for i in 0..archive.len() {
        let file = archive.by_index_raw(i).map_err(|e| at(&e))?;
        if file.compression() != zip::CompressionMethod::Stored || file.size() != file.compressed_size() {
            return Err(at(&format!("entry {:?} is compressed (only stored arrays are read)", file.name())));
        }
    }
    isorun_tensors::npy::read_npz(std::io::Cursor::new(bytes), &path).map_err(|e| e.to_string())
}

/// Removes an entry that still waits for its check: moved aside first (a
/// reader then sees it whole or not at all), never one that was checked
/// or exported again meanwhile. True when it went.
pub fn remove_pending(cache: &Path, key: &str) -> bool {
    let entry = cache.join(key);
    if !check_pending(&entry) {
        return false;
    }
    let Ok(aside) = new_private_dir(cache, "stale") else { return false };
    let moved = std::fs::rename(&entry, aside.join(key)).is_ok();
    let _ = std::fs::remove_dir_all(&aside);
    moved
}

/// Records that the entry's frozen graph passed its check in a worker:
/// `export.json` is replaced (written new beside it, then renamed over it)
/// with `check` `worker`, and the check file goes.
pub fn mark_checked(entry: &Path) -> std::io::Result<()> {
    let mut about = about(entry).ok_or_else(|| std::io::Error::other("export.json is unreadable"))?;
    if let Some(map) = about.as_object_mut() {
        map.insert("check".into(), serde_json::Value::String(CHECK_WORKER.into()));
        map.remove("check_sha256");
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let new = entry.join(format!(".export.json-{}-{n}", std::process::id()));
    write_new(&new, &serde_json::to_vec_pretty(&about).unwrap_or_default())?;
    std::fs::rename(&new, entry.join("export.json")).inspect_err(|_| {
        let _ = std::fs::remove_file(&new);
    })?;
    let _ = std::fs::remove_file(entry.join(CHECK_FILE));
    Ok(())
}

/// Creates `path` (which must not exist; no link followed) with `bytes`.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// A new folder `.NAME-PID-N` in the cache, made by this process (never one
/// that was there before).
fn new_private_dir(cache: &Path, name: &str) -> std::io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = cache.join(format!(".{name}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A new temporary folder in the cache, named after this process.
pub fn staging_dir(cache: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(cache)?;
    new_private_dir(cache, "tmp")
}

/// Removes temporary folders whose process is gone.
pub fn remove_stale(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = [".tmp-", ".entry-", ".stale-"]
            .iter()
            .find_map(|p| name.strip_prefix(p))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
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
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.') && !is_python_answer(&name)
        })
        .filter_map(|e| {
            let key = e.file_name().to_string_lossy().into_owned();
            lookup(cache, &key)?;
            let about = about(&e.path())?;
            Some(CacheEntry { bytes: tree_bytes(&e.path()), key, path: e.path(), about })
        })
        .collect();
    found.sort_by(|a, b| a.key.cmp(&b.key));
    found
}

/// Whether a name in the cache folder is a Python's remembered answer
/// (`python-<16 hex>.json`, written by `python::probe`) rather than an
/// entry: the cache's own file, neither listed nor refused.
fn is_python_answer(name: &str) -> bool {
    name.starts_with("python-") && name.ends_with(".json")
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
        } else if is_python_answer(&name) {
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
        assert!(!staging.join("saved_model").exists(), "moved out of the export process's reach");
        // A dead process's staging folder is removed, a live one's kept.
        std::fs::create_dir(cache.join(".tmp-999999999-0")).unwrap();
        let ours = staging_dir(cache).unwrap();
        remove_stale(cache);
        assert!(!cache.join(".tmp-999999999-0").exists());
        assert!(ours.exists());
        // A Python's remembered answer beside the entries is no entry.
        std::fs::write(cache.join("python-0123456789abcdef.json"), b"{}").unwrap();
        assert_eq!(list(cache).len(), 1);
        assert!(cache.join("python-0123456789abcdef.json").is_file(), "left alone by ls");
        assert_eq!(clear(cache).unwrap(), 1);
        assert!(list(cache).is_empty());
        assert!(!cache.join("python-0123456789abcdef.json").exists(), "removed by clear");
    }

    /// A check file's life: moved in with its hash, read back while it
    /// still hashes to it, refused once changed or when the export process
    /// planted a link in its place (never followed), gone once checked.
    #[test]
    fn a_check_file_is_stored_with_its_hash_and_read_only_while_it_matches() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let npz = |dir: &Path| {
            let tensor = isorun_protocol::Tensor {
                dtype: isorun_protocol::DType::Float32,
                shape: vec![1],
                data: isorun_protocol::TensorData::Dense(1.5f32.to_le_bytes().to_vec().into()),
            };
            let mut file = zip::ZipWriter::new(std::fs::File::create(dir.join(CHECK_FILE)).unwrap());
            let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
            for name in ["input/x.npy", "output/y.npy"] {
                file.start_file(name, stored).unwrap();
                isorun_tensors::npy::write_npy(&mut file, &tensor).unwrap();
            }
            file.finish().unwrap();
        };
        let pending = serde_json::json!({"graph": "frozen", "check": CHECK_PENDING});
        let staging = staged(cache);
        npz(&staging);
        let entry = commit(cache, "k", &staging, &pending).unwrap().parent().unwrap().to_path_buf();
        assert!(check_pending(&entry));
        let arrays = read_check(&entry).unwrap();
        assert_eq!(arrays.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["input/x", "output/y"]);
        let mut bytes = std::fs::read(entry.join(CHECK_FILE)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(entry.join(CHECK_FILE), &bytes).unwrap();
        assert!(read_check(&entry).unwrap_err().contains("export.json says"));
        mark_checked(&entry).unwrap();
        assert!(!check_pending(&entry) && !entry.join(CHECK_FILE).exists());
        assert_eq!(about(&entry).unwrap()["check"], CHECK_WORKER);
        assert!(lookup(cache, "k").is_some(), "the entry still verifies after its export.json was replaced");

        // A compressed array (it could inflate to gigabytes) and a hard link are refused.
        let staging = staged(cache);
        let mut file = zip::ZipWriter::new(std::fs::File::create(staging.join(CHECK_FILE)).unwrap());
        let deflated = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        file.start_file("output/y.npy", deflated).unwrap();
        std::io::Write::write_all(&mut file, &[0u8; 4096]).unwrap();
        file.finish().unwrap();
        let entry = commit(cache, "m", &staging, &pending).unwrap().parent().unwrap().to_path_buf();
        assert!(read_check(&entry).unwrap_err().contains("is compressed"));
        std::fs::hard_link(entry.join(CHECK_FILE), tmp.path().join("other")).unwrap();
        assert!(read_check(&entry).unwrap_err().contains("2 links"));
        // Only a pending entry is removed, and it goes whole.
        assert!(remove_pending(cache, "m") && !entry.exists());
        assert!(!remove_pending(cache, "k"), "a checked entry stays");
        assert!(lookup(cache, "k").is_some());

        // A link where the check file should be: moved as a link, never read through.
        let secret = tmp.path().join("secret.npz");
        npz(tmp.path());
        std::fs::rename(tmp.path().join(CHECK_FILE), &secret).unwrap();
        let staging = staged(cache);
        std::os::unix::fs::symlink(&secret, staging.join(CHECK_FILE)).unwrap();
        let entry = commit(cache, "l", &staging, &pending).unwrap().parent().unwrap().to_path_buf();
        assert!(check_pending(&entry));
        assert!(about(&entry).unwrap().get("check_sha256").is_none());
        assert!(read_check(&entry).unwrap_err().contains("names no check file"));
    }

    /// A staging folder as a finished export leaves it.
    fn staged(cache: &Path) -> PathBuf {
        let staging = staging_dir(cache).unwrap();
        std::fs::create_dir_all(staging.join("saved_model/variables")).unwrap();
        std::fs::write(staging.join("saved_model/saved_model.pb"), b"pb").unwrap();
        std::fs::write(staging.join("saved_model/variables/variables.index"), b"index").unwrap();
        staging
    }

    #[test]
    fn an_export_json_link_planted_in_staging_is_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let victim = tmp.path().join("bashrc");
        std::fs::write(&victim, b"the user's own file").unwrap();
        let staging = staged(&cache);
        std::os::unix::fs::symlink(&victim, staging.join("export.json")).unwrap();
        let stored = commit(&cache, "k", &staging, &serde_json::json!({"loader": "keras"})).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"the user's own file", "written through the planted link");
        assert_eq!(lookup(&cache, "k"), Some(stored));
        let about: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cache.join("k/export.json")).unwrap()).unwrap();
        assert_eq!(about["loader"], "keras");
        assert_eq!(about["tree_sha256"].as_str().unwrap().len(), 64);
    }

    #[test]
    fn a_staged_tree_with_a_link_fifo_or_hard_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let outside = tmp.path().join("secret");
        std::fs::write(&outside, b"secret").unwrap();
        type Plant = fn(&Path, &Path);
        let plants: [(&str, Plant); 4] = [
            ("symbolic link", |sm, outside| std::os::unix::fs::symlink(outside, sm.join("variables/data")).unwrap()),
            ("hard link", |sm, outside| std::fs::hard_link(outside, sm.join("assets.txt")).unwrap()),
            ("FIFO", |sm, _| {
                let path = std::ffi::CString::new(sm.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: mkfifo with a valid path.
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
            }),
            ("folder link", |sm, outside| {
                std::os::unix::fs::symlink(outside.parent().unwrap(), sm.join("up")).unwrap()
            }),
        ];
        for (what, plant) in plants {
            let staging = staged(&cache);
            plant(&staging.join("saved_model"), &outside);
            let error = commit(&cache, "k", &staging, &serde_json::json!({})).unwrap_err().to_string();
            assert!(error.contains("regular files and folders only"), "{what}: {error}");
            assert!(lookup(&cache, "k").is_none(), "{what} stored");
            std::fs::remove_dir_all(&staging).unwrap();
        }
        // saved_model itself a link to a folder elsewhere.
        let staging = staging_dir(&cache).unwrap();
        std::os::unix::fs::symlink(tmp.path(), staging.join("saved_model")).unwrap();
        let error = commit(&cache, "k", &staging, &serde_json::json!({})).unwrap_err().to_string();
        assert!(error.contains("not a folder"), "{error}");
        assert!(lookup(&cache, "k").is_none());
        assert_eq!(std::fs::read(&outside).unwrap(), b"secret");
    }

    #[test]
    fn an_entry_changed_after_it_was_stored_is_refused_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let staging = staged(cache);
        commit(cache, "k", &staging, &serde_json::json!({})).unwrap();
        assert!(lookup(cache, "k").is_some());
        // A process that kept the file open writes after the commit.
        std::fs::write(cache.join("k/saved_model/variables/variables.index"), b"backdoor").unwrap();
        assert!(lookup(cache, "k").is_none(), "a changed entry was used");
        assert!(!cache.join("k").exists(), "the refused entry stays");
        // An entry nobody hashed (an older isorun's, or made by hand) is not used either.
        let plain = cache.join("p/saved_model");
        std::fs::create_dir_all(&plain).unwrap();
        std::fs::write(plain.join("saved_model.pb"), b"pb").unwrap();
        std::fs::write(cache.join("p/export.json"), b"{}").unwrap();
        assert!(lookup(cache, "p").is_none());
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
