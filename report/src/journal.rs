//! `--journal PATH` and `--resume`: one JSON line per finished unit,
//! appended and fsynced (after the unit's output files are) before the unit
//! counts as done, so that a run killed at any moment can be resumed with
//! nothing finished computed twice and nothing lost.
//!
//! A unit's key is a SHA-256 over the model (its id, its `saved_model.pb`,
//! or `saved_model.pbtxt` where that is all it has, and every file under
//! `variables/`, names and contents, symlinks followed to what they name, as
//! DVC and Hugging Face caches lay weights out), its inputs (including its
//! own `--inputs-dir` files), the settings that change the result
//! (signature, tags, batch size, libraries, `--expect` with its golden files
//! for the model, `--rtol`, `--atol`) and the runtime: the SHA-256 of the
//! worker binary and what `WORKER --version` prints (the worker's version and
//! the TensorFlow version it loads), both found once per run, before any key
//! is needed. The worker's `Hello` says the TensorFlow version too, but only
//! after work has started, too late to decide what to resume; asking the
//! worker binary itself costs one short process per run and gives the same
//! answer. A model, input, setting, worker or TensorFlow changed since the
//! journal was written makes another key, and the unit runs again.
//!
//! With `--values`, the journal keeps the outputs' values, so that resumed
//! records carry them as computed records do; without it, they are dropped
//! to keep lines small. A torn last line (no newline: a kill in the middle
//! of a write) is ignored and cut off before the next append; any other line
//! that is not a record with a key is an error naming the journal and line.

use isorun_engine::Model;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// An open journal, appended to.
pub struct Journal {
    file: File,
    path: PathBuf,
    /// Keep the outputs' values in each line (`--values`).
    keep_values: bool,
}

impl Journal {
    /// Opens (or creates) the journal for appending; a torn last line is cut
    /// off first, so the next record starts a line of its own.
    pub fn open(path: &Path, keep_values: bool) -> Result<Journal, String> {
        let error = |e: io::Error| format!("--journal {}: cannot open for appending: {e}", path.display());
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(path).map_err(error)?;
        let complete = complete_length(&mut file).map_err(error)?;
        if complete < file.metadata().map_err(error)?.len() {
            file.set_len(complete).and_then(|()| file.sync_data()).map_err(error)?;
        }
        Ok(Journal { file, path: path.to_path_buf(), keep_values })
    }

    /// Appends one record (with its key) and waits until it is on disk.
    pub fn append(&mut self, key: &str, record: &Value) -> Result<(), String> {
        let mut entry = record.clone();
        if let Value::Object(map) = &mut entry {
            map.insert("key".into(), Value::String(key.to_string()));
            // Values can be large and are in the output files; without
            // --values nobody asked for them, and the journal keeps the record.
            if !self.keep_values {
                if let Some(Value::Object(outputs)) = map.get_mut("outputs") {
                    for output in outputs.values_mut() {
                        if let Value::Object(o) = output {
                            o.remove("values");
                        }
                    }
                }
            }
        }
        let line = format!("{entry}\n");
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| format!("--journal {}: cannot write: {e}", self.path.display()))
    }
}

/// The length of the file up to and including its last newline.
fn complete_length(file: &mut File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut buffer = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(buffer.len() as u64);
        let chunk = &mut buffer[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The records of a journal by key (the last one wins). A torn last line
/// (one with no newline after it), left by a kill in the middle of a
/// write, is ignored; any other line that is not a JSON record with a key
/// is an error naming the line.
pub fn read_journal(path: &Path) -> Result<HashMap<String, Value>, String> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(format!("--journal {}: cannot read: {e}", path.display())),
    };
    let mut records = HashMap::new();
    let mut lines = text.split_inclusive(|&b| b == b'\n').enumerate().peekable();
    while let Some((number, line)) = lines.next() {
        let torn = lines.peek().is_none() && !line.ends_with(b"\n");
        let parsed =
            serde_json::from_slice::<Value>(line).map_err(|e| e.to_string()).and_then(|mut record| {
                match record.as_object_mut().map(|m| m.remove("key")) {
                    Some(Some(Value::String(key))) => Ok((key, record)),
                    Some(_) => Err("a record without a \"key\"".to_string()),
                    None => Err("not a JSON object".to_string()),
                }
            });
        match parsed {
            Ok((key, record)) => {
                records.insert(key, record);
            }
            Err(_) if torn => {}
            Err(_) if line.iter().all(u8::is_ascii_whitespace) => {}
            Err(e) => {
                return Err(format!(
                    "--journal {} line {}: not a journal record ({e}); fix or remove the line, or start a new journal",
                    path.display(),
                    number + 1
                ))
            }
        }
    }
    Ok(records)
}

/// What, besides the model, decides a unit's result.
pub struct KeyParts<'a> {
    /// Digest of the shared inputs (`PreparedInputs::digest`).
    pub inputs: &'a [u8],
    /// Signature, tags, batch size, libraries, `--rtol`, `--atol`.
    pub settings: &'a str,
    /// `--inputs-dir`, whose files for this model are part of its inputs.
    pub inputs_dir: Option<&'a Path>,
    /// `--expect`, whose golden files for this model decide `mismatch`.
    pub expect_dir: Option<&'a Path>,
    /// The worker and TensorFlow that compute the result (`runtime_identity`).
    pub runtime: &'a str,
}

/// The runtime part of every key: the SHA-256 of the worker binary and what
/// it says of its versions (`Err`: why it said nothing, which is keyed too,
/// so that records made by a worker that could not say run again once it can).
pub fn runtime_identity(worker: &Path, version: &Result<String, String>) -> Result<String, String> {
    let mut hasher = Sha256::new();
    hash_file(&mut hasher, worker, "worker")
        .map_err(|e| format!("{}: cannot read the worker: {e}", worker.display()))?;
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(match version {
        Ok(version) => format!("worker sha256 {digest}\0{version}"),
        Err(_) => format!("worker sha256 {digest}\0no version"),
    })
}

/// The key of one unit.
pub fn unit_key(model: &Model, parts: &KeyParts) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(b"isorun journal key v2\0");
    // Two models with the same files are still two units.
    hasher.update(model.id.as_bytes());
    hasher.update([0]);
    hasher.update(parts.settings.as_bytes());
    hasher.update([0]);
    hasher.update(parts.runtime.as_bytes());
    hasher.update([0]);
    hasher.update(parts.inputs);
    let binary = model.path.join("saved_model.pb");
    if model.format.is_keras_file() {
        // A Keras file: its own bytes (its export is a function of them and the settings).
        hash_file(&mut hasher, &model.path, "keras file")?;
    } else if binary.exists() {
        hash_file(&mut hasher, &binary, "saved_model.pb")?;
    } else {
        hash_file(&mut hasher, &model.path.join("saved_model.pbtxt"), "saved_model.pbtxt")?;
    }
    if !model.format.is_keras_file() {
        hash_tree(&mut hasher, &model.path.join("variables"), "variables")?;
    }
    if let Some(dir) = parts.inputs_dir {
        hash_tree(&mut hasher, &dir.join(&model.id), "inputs")?;
    }
    if let Some(dir) = parts.expect_dir {
        hasher.update(b"expect\0");
        hasher.update(dir.as_os_str().as_encoded_bytes());
        hasher.update([0]);
        hash_tree(&mut hasher, &dir.join(&model.id), "expected")?;
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn hash_file(hasher: &mut Sha256, path: &Path, name: &str) -> io::Result<()> {
    let mut file = File::open(path)?;
    hasher.update(name.as_bytes());
    hasher.update([0]);
    hasher.update(file.metadata()?.len().to_le_bytes());
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buffer[..n]);
    }
}

/// Every file under `dir` (if it exists), symlinks followed, sorted by
/// relative path.
fn hash_tree(hasher: &mut Sha256, dir: &Path, prefix: &str) -> io::Result<()> {
    let mut files = Vec::new();
    let mut folders = HashSet::new();
    collect_files(dir, &mut files, &mut folders)?;
    files.sort();
    for file in files {
        let relative = file.strip_prefix(dir).unwrap_or(&file).to_string_lossy().into_owned();
        hash_file(hasher, &file, &format!("{prefix}/{relative}"))?;
    }
    Ok(())
}

/// The files under `dir`, following symlinks to files and folders; a folder
/// already on the way down (a symlink loop) is not entered again.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>, on_the_way: &mut HashSet<(u64, u64)>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let meta = std::fs::metadata(dir)?;
    let identity = (meta.dev(), meta.ino());
    if !on_the_way.insert(identity) {
        return Ok(());
    }
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        // `metadata` follows symlinks; a dangling one is an error, as a missing weight file is.
        let kind = std::fs::metadata(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
            .file_type();
        if kind.is_dir() {
            collect_files(&path, out, on_the_way)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    on_the_way.remove(&identity);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>() -> KeyParts<'a> {
        KeyParts { inputs: b"in", settings: "serving_default", inputs_dir: None, expect_dir: None, runtime: "w1" }
    }

    fn model(root: &Path) -> Model {
        let dir = root.join("m");
        std::fs::create_dir_all(dir.join("variables")).unwrap();
        std::fs::write(dir.join("saved_model.pb"), b"graph").unwrap();
        std::fs::write(dir.join("variables/variables.data-00000-of-00001"), b"weights").unwrap();
        Model::saved_model("m", dir)
    }

    #[test]
    fn keys_change_with_the_model_settings_and_runtime() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        let first = unit_key(&model, &parts()).unwrap();
        assert_eq!(first, unit_key(&model, &parts()).unwrap());
        std::fs::write(model.path.join("variables/variables.data-00000-of-00001"), b"weights2").unwrap();
        let second = unit_key(&model, &parts()).unwrap();
        assert_ne!(first, second, "new weights, new key");
        assert_ne!(unit_key(&model, &KeyParts { settings: "other", ..parts() }).unwrap(), second);
        assert_ne!(unit_key(&model, &KeyParts { runtime: "w2", ..parts() }).unwrap(), second, "another worker");
    }

    #[test]
    fn a_keras_file_key_is_its_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("epoch_01.keras");
        std::fs::write(&file, b"zip v1").unwrap();
        let model =
            Model { id: "epoch_01.keras".into(), path: file.clone(), format: isorun_engine::ModelFormat::Keras };
        let first = unit_key(&model, &parts()).unwrap();
        assert_eq!(first, unit_key(&model, &parts()).unwrap());
        std::fs::write(&file, b"zip v2").unwrap();
        assert_ne!(first, unit_key(&model, &parts()).unwrap(), "a new checkpoint in the same file, a new key");
    }

    #[test]
    fn golden_files_are_part_of_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        let expect = tmp.path().join("golden");
        std::fs::create_dir_all(expect.join("m")).unwrap();
        std::fs::write(expect.join("m/y.npy"), b"one").unwrap();
        let with = |dir: &Path| unit_key(&model, &KeyParts { expect_dir: Some(dir), ..parts() }).unwrap();
        let golden = with(&expect);
        assert_ne!(golden, unit_key(&model, &parts()).unwrap(), "--expect changes the key");
        std::fs::write(expect.join("m/y.npy"), b"two").unwrap();
        assert_ne!(with(&expect), golden, "new golden outputs, new key");
    }

    #[test]
    fn weights_reached_through_symlinks_are_hashed_and_loops_end() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        let cache = tmp.path().join("cache");
        std::fs::create_dir_all(cache.join("blobs")).unwrap();
        std::fs::write(cache.join("blob"), b"linked weights").unwrap();
        std::fs::write(cache.join("blobs/shard"), b"shard").unwrap();
        let variables = model.path.join("variables");
        std::os::unix::fs::symlink(cache.join("blob"), variables.join("variables.index")).unwrap();
        std::os::unix::fs::symlink(cache.join("blobs"), variables.join("more")).unwrap();
        // A loop: a folder that links to its own parent.
        std::os::unix::fs::symlink(&variables, variables.join("more-loop")).unwrap();
        let first = unit_key(&model, &parts()).unwrap();
        std::fs::write(cache.join("blob"), b"changed weights").unwrap();
        let second = unit_key(&model, &parts()).unwrap();
        assert_ne!(first, second, "a symlinked file's new contents make a new key");
        std::fs::write(cache.join("blobs/shard"), b"changed shard").unwrap();
        assert_ne!(second, unit_key(&model, &parts()).unwrap(), "so do a symlinked folder's");
    }

    #[test]
    fn a_text_only_saved_model_has_a_key_from_its_pbtxt() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        std::fs::remove_file(model.path.join("saved_model.pb")).unwrap();
        std::fs::write(model.path.join("saved_model.pbtxt"), b"saved_model_schema_version: 1").unwrap();
        let first = unit_key(&model, &parts()).unwrap();
        std::fs::write(model.path.join("saved_model.pbtxt"), b"saved_model_schema_version: 2").unwrap();
        assert_ne!(first, unit_key(&model, &parts()).unwrap());
    }

    #[test]
    fn the_torn_last_line_is_ignored_then_cut_off() {
        let tmp = tempfile::tempdir().unwrap();
        let journal_path = tmp.path().join("journal.jsonl");
        let mut journal = Journal::open(&journal_path, false).unwrap();
        journal.append("k1", &serde_json::json!({"model": "m", "status": "ok"})).unwrap();
        drop(journal);
        OpenOptions::new().append(true).open(&journal_path).unwrap().write_all(b"{\"model\": \"n\", \"sta").unwrap();
        let records = read_journal(&journal_path).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records["k1"]["status"], "ok");
        assert!(records["k1"].get("key").is_none());
        // The next run appends on a line of its own, and the journal stays readable.
        let mut journal = Journal::open(&journal_path, false).unwrap();
        journal.append("k2", &serde_json::json!({"model": "n", "status": "ok"})).unwrap();
        let records = read_journal(&journal_path).unwrap();
        assert_eq!(records.len(), 2, "{}", std::fs::read_to_string(&journal_path).unwrap());
    }

    #[test]
    fn a_bad_line_before_the_last_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let journal_path = tmp.path().join("journal.jsonl");
        for (text, line) in [
            ("{\"key\": \"k1\"}\nnot json\n{\"key\": \"k2\"}\n", 2),
            ("{\"key\": \"k1\"}\n{\"model\": \"no key\"}\n", 2),
            // Complete (newline-ended) but not JSON: not torn.
            ("{\"key\": \"k1\"}\n{\"key\": \"k2\", \"sta\n", 2),
            ("[1]\n", 1),
        ] {
            std::fs::write(&journal_path, text).unwrap();
            let error = read_journal(&journal_path).unwrap_err();
            assert!(error.contains(&format!("{} line {line}:", journal_path.display())), "{text:?}: {error}");
        }
    }

    #[test]
    fn values_are_kept_only_when_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let record = serde_json::json!({"model": "m", "outputs": {"y": {"dtype": "float32", "values": [1.0]}}});
        for keep in [false, true] {
            let journal_path = tmp.path().join(format!("journal-{keep}.jsonl"));
            Journal::open(&journal_path, keep).unwrap().append("k", &record).unwrap();
            let records = read_journal(&journal_path).unwrap();
            assert_eq!(records["k"]["outputs"]["y"].get("values").is_some(), keep);
        }
    }
}
