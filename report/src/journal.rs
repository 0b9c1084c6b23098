//! `--journal PATH` and `--resume`: one JSON line per finished unit,
//! appended and fsynced (after the unit's output files are) before the unit
//! counts as done, so that a run killed at any moment can be resumed with
//! nothing finished computed twice and nothing lost.
//!
//! A unit's key is a SHA-256 over the model (its id, its `saved_model.pb` and every
//! file under `variables/`, names and contents), its inputs (including its
//! own `--inputs-dir` files) and the settings that change the result
//! (signature, tags, batch size, libraries). A model changed since the
//! journal was written has another key, and runs again.

use isorun_engine::Model;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Read, Write};
use std::path::{Path, PathBuf};

/// An open journal, appended to.
pub struct Journal {
    file: File,
    path: PathBuf,
}

impl Journal {
    pub fn open(path: &Path) -> Result<Journal, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--journal {}: cannot open for appending: {e}", path.display()))?;
        Ok(Journal { file, path: path.to_path_buf() })
    }

    /// Appends one record (with its key) and waits until it is on disk.
    pub fn append(&mut self, key: &str, record: &Value) -> Result<(), String> {
        let mut entry = record.clone();
        if let Value::Object(map) = &mut entry {
            map.insert("key".into(), Value::String(key.to_string()));
            // Values can be large and are in the output files; the journal keeps the record.
            if let Some(Value::Object(outputs)) = map.get_mut("outputs") {
                for output in outputs.values_mut() {
                    if let Value::Object(o) = output {
                        o.remove("values");
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

/// The records of a journal by key (the last one wins). A torn last line,
/// left by a kill in the middle of a write, is ignored.
pub fn read_journal(path: &Path) -> Result<HashMap<String, Value>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(format!("--journal {}: cannot read: {e}", path.display())),
    };
    let mut records = HashMap::new();
    for line in io::BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("--journal {}: cannot read: {e}", path.display()))?;
        let Ok(mut record) = serde_json::from_str::<Value>(&line) else { continue };
        let Some(Value::String(key)) = record.as_object_mut().and_then(|m| m.remove("key")) else { continue };
        records.insert(key, record);
    }
    Ok(records)
}

/// What, besides the model, decides a unit's result.
pub struct KeyParts<'a> {
    /// Digest of the shared inputs (`PreparedInputs::digest`).
    pub inputs: &'a [u8],
    /// Signature, tags, batch size, libraries.
    pub settings: &'a str,
    /// `--inputs-dir`, whose files for this model are part of its inputs.
    pub inputs_dir: Option<&'a Path>,
}

/// The key of one unit.
pub fn unit_key(model: &Model, parts: &KeyParts) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(b"isorun journal key v1\0");
    // Two models with the same files are still two units.
    hasher.update(model.id.as_bytes());
    hasher.update([0]);
    hasher.update(parts.settings.as_bytes());
    hasher.update([0]);
    hasher.update(parts.inputs);
    hash_file(&mut hasher, &model.path.join("saved_model.pb"), "saved_model.pb")?;
    hash_tree(&mut hasher, &model.path.join("variables"), "variables")?;
    if let Some(dir) = parts.inputs_dir {
        hash_tree(&mut hasher, &dir.join(&model.id), "inputs")?;
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

/// Every file under `dir` (if it exists), sorted by relative path.
fn hash_tree(hasher: &mut Sha256, dir: &Path, prefix: &str) -> io::Result<()> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    for file in files {
        let relative = file.strip_prefix(dir).unwrap_or(&file).to_string_lossy().into_owned();
        hash_file(hasher, &file, &format!("{prefix}/{relative}"))?;
    }
    Ok(())
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_files(&entry.path(), out)?;
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_the_model_and_the_torn_line_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        std::fs::create_dir_all(dir.join("variables")).unwrap();
        std::fs::write(dir.join("saved_model.pb"), b"graph").unwrap();
        std::fs::write(dir.join("variables/variables.data-00000-of-00001"), b"weights").unwrap();
        let model = Model { id: "m".into(), path: dir.clone() };
        let parts = KeyParts { inputs: b"in", settings: "serving_default", inputs_dir: None };
        let first = unit_key(&model, &parts).unwrap();
        assert_eq!(first, unit_key(&model, &parts).unwrap());
        std::fs::write(dir.join("variables/variables.data-00000-of-00001"), b"weights2").unwrap();
        assert_ne!(first, unit_key(&model, &parts).unwrap(), "new weights, new key");
        let other_settings = KeyParts { settings: "other", ..parts };
        assert_ne!(unit_key(&model, &other_settings).unwrap(), unit_key(&model, &parts).unwrap());

        let journal_path = tmp.path().join("journal.jsonl");
        let mut journal = Journal::open(&journal_path).unwrap();
        journal.append("k1", &serde_json::json!({"model": "m", "status": "ok"})).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&journal_path)
            .unwrap()
            .write_all(b"{\"model\": \"n\", \"sta")
            .unwrap();
        let records = read_journal(&journal_path).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records["k1"]["status"], "ok");
        assert!(records["k1"].get("key").is_none());
    }
}
