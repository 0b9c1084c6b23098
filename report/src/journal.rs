//! `--journal PATH` and `--resume`: one JSON line per finished unit,
//! appended and fsynced (after the unit's output files are) before the unit
//! counts as done, so that a run killed at any moment can be resumed with
//! nothing finished computed twice and nothing lost.
//!
//! A unit's key is a SHA-256 over the model (its id and every entry of its
//! SavedModel tree, sorted: `saved_model.pb`/`.pbtxt`, `variables/`,
//! `assets/`, `assets.extra/`, `fingerprint.pb`, names and contents; below
//! the model's folder no link is followed, a link is keyed by the path it
//! names, which for DVC's and Hugging Face's content-addressed blobs changes
//! with the weights, and a FIFO or device by its kind, unread), its inputs (including its
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
//! to keep lines small (a `--values` run does not resume a line without
//! them: `runner/src/drive.rs` runs the unit again and warns once). A torn last line (no newline: a kill in the middle
//! of a write) is ignored and cut off before the next append; any other line
//! that is not a record with a key is an error naming the journal and line.
//! A resumed record keeps nothing the current run knows better: its model
//! and path are the run's, and a status outside the closed set runs the
//! unit again ([`resumed_record`]). A journal that is a symbolic link is
//! refused, neither read nor appended to.

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
        use std::os::unix::fs::OpenOptionsExt;
        let error = |e: io::Error| open_error(path, "open for appending", e);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(error)?;
        if !file.metadata().map_err(error)?.file_type().is_file() {
            return Err(format!("--journal {}: not a regular file", path.display()));
        }
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
    let mut text = Vec::new();
    match open_regular(path, true).and_then(|mut file| file.read_to_end(&mut text)) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(open_error(path, "read", e)),
    };
    // Parsed whole, its records are held together: counted first, so that
    // tiny values (`[0,0,…]`) cannot cost fifty times the file.
    isorun_tensors::json_cost::check_record_json_cost(&text)
        .map_err(|reason| format!("--journal {}: {reason}; start a new journal", path.display()))?;
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

/// A journal's record of `model`, as a resumed run prints it, or `None`
/// when the record cannot be one (the unit then runs again). The journal is
/// a file anyone who can write its folder may edit: its `model` and `path`
/// are taken from the current run (an edited `"model"` made one model's
/// record appear twice and hid the real one), and its `status` must be one
/// of the closed set a finished unit ends with.
pub fn resumed_record(mut record: Value, model: &Model) -> Option<Value> {
    let status = record.get("status")?.as_str()?;
    // `not_run` is never journaled: a unit not run to its end is not done.
    if status == "not_run" || !isorun_engine::STATUSES.contains(&status) {
        return None;
    }
    let fields = record.as_object_mut()?;
    fields.insert("model".into(), Value::String(model.id.clone()));
    fields.insert("path".into(), Value::String(model.path.to_string_lossy().into_owned()));
    fields.insert("resumed".into(), Value::Bool(true));
    Some(record)
}

/// Why the journal at `path` cannot be opened: a symbolic link (`O_NOFOLLOW`
/// gives `ELOOP`) is said as such. A journal in a shared folder could be
/// planted as a link to a file of the user's, which appending (and cutting a
/// torn last line off) would damage.
fn open_error(path: &Path, doing: &str, e: io::Error) -> String {
    if e.raw_os_error() == Some(libc::ELOOP) {
        format!(
            "--journal {}: is a symbolic link; isorun does not {doing} through one (name the file itself)",
            path.display()
        )
    } else {
        format!("--journal {}: cannot {doing}: {e}", path.display())
    }
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
    hasher.update(b"isorun journal key v3\0");
    // Two models with the same files are still two units.
    hasher.update(model.id.as_bytes());
    hasher.update([0]);
    hasher.update(parts.settings.as_bytes());
    hasher.update([0]);
    hasher.update(parts.runtime.as_bytes());
    hasher.update([0]);
    hasher.update(parts.inputs);
    if model.format.is_keras_file() {
        // A Keras file: its own bytes (its export is a function of them and the settings).
        hash_file(&mut hasher, &model.path, "keras file")?;
    } else if model.format == isorun_engine::ModelFormat::Onnx {
        hash_onnx_model(&mut hasher, &model.path)?;
    } else {
        hash_model_tree(&mut hasher, &model.path)?;
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

/// An ONNX file: its own bytes, each external-data file it keeps tensors
/// in (each once, in the model's order: new weights beside an unchanged
/// graph are a new key), and the ONNX Runtime that runs it (its library's
/// file name carries its version; the worker's identity is keyed apart).
/// External data the model may not have read (missing, not a regular file,
/// hidden, outside its folder: `engine::external_data_files`) is keyed by
/// that reason and never opened: the unit ends `load_failed` before any
/// worker, and one such model is never a reason for the run to stop.
fn hash_onnx_model(hasher: &mut Sha256, path: &Path) -> io::Result<()> {
    hash_file(hasher, path, "onnx file")?;
    if let Ok(model) = isorun_onnxproto::read_model(path) {
        match isorun_engine::external_data_files(&model) {
            Ok(files) => {
                // Keyed by where each lies in the model's folder, so a copied folder keeps its keys.
                let folder = std::fs::canonicalize(model.folder()).unwrap_or_default();
                for file in files {
                    hasher.update(file.strip_prefix(&folder).unwrap_or(&file).as_os_str().as_encoded_bytes());
                    hasher.update([0]);
                    if let Err(e) = hash_file(hasher, &file, "onnx external data") {
                        hasher.update(format!("unreadable: {:?}", e.kind()).as_bytes());
                    }
                }
            }
            Err(why) => {
                hasher.update(b"onnx external data refused\0");
                hasher.update(why.as_bytes());
            }
        }
    }
    hasher.update(b"onnxruntime\0");
    match isorun_engine::onnxruntime() {
        Ok(found) => hasher.update(found.library.file_name().unwrap_or_default().as_encoded_bytes()),
        Err(_) => hasher.update(b"none"),
    }
    Ok(())
}

fn hash_file(hasher: &mut Sha256, path: &Path, name: &str) -> io::Result<()> {
    let file = open_regular(path, false)?;
    hasher.update(name.as_bytes());
    hasher.update([0]);
    hash_contents(hasher, file)
}

/// Opens `path` for reading if it is a regular file, and refuses anything
/// else before reading a byte: a FIFO (opened without blocking, so a FIFO
/// nobody writes cannot hang the supervisor), a device (`/dev/zero` would be
/// read forever), a socket. With `no_follow`, a symbolic link is refused too
/// (`O_NOFOLLOW`), closing the gap between listing a folder and opening.
fn open_regular(path: &Path, no_follow: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = libc::O_NONBLOCK | libc::O_NOCTTY | if no_follow { libc::O_NOFOLLOW } else { 0 };
    let file = OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a regular file; isorun does not read it", path.display()),
        ));
    }
    Ok(file)
}

/// Every entry of a SavedModel's tree (`saved_model.pb` or `.pbtxt`,
/// `variables/`, `assets/`, `assets.extra/`, `fingerprint.pb`, anything
/// else beside them: a lookup table's `assets/vocab.txt` changes results as
/// much as a weight does), sorted by relative path so the key does not
/// depend on the order the file system lists them in. The model's own
/// folder is the user's choice and may be a link; below it nothing is
/// followed: a symbolic link is keyed by the path it names (its text) and a
/// FIFO, socket or device by its kind, none of them read. A link cannot
/// send the supervisor out of the tree (a link to `/` walked the whole disk,
/// one to a FIFO hung it), and content-addressed caches (Hugging Face's
/// `blobs/<sha256>`, DVC's `cache/<md5>`) still get a new key with new
/// weights, since the link then names another blob.
fn hash_model_tree(hasher: &mut Sha256, root: &Path) -> io::Result<()> {
    let mut entries: Vec<(PathBuf, std::fs::FileType)> = Vec::new();
    // An explicit stack: a hostile tree may be deep.
    let mut folders = vec![PathBuf::new()];
    while let Some(relative) = folders.pop() {
        let folder = root.join(&relative);
        let listing =
            std::fs::read_dir(&folder).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", folder.display())))?;
        for entry in listing {
            let entry = entry?;
            // `file_type` does not follow links.
            let kind = entry.file_type()?;
            let path = relative.join(entry.file_name());
            if kind.is_dir() {
                folders.push(path.clone());
            }
            entries.push((path, kind));
        }
    }
    entries.sort_by(|a, b| a.0.as_os_str().as_encoded_bytes().cmp(b.0.as_os_str().as_encoded_bytes()));
    hasher.update(b"saved model tree\0");
    for (relative, kind) in entries {
        let name = relative.as_os_str().as_encoded_bytes();
        let tag: &[u8] = if kind.is_dir() {
            b"folder"
        } else if kind.is_file() {
            b"file"
        } else if kind.is_symlink() {
            b"link"
        } else {
            b"special"
        };
        hasher.update(tag);
        hasher.update([0]);
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name);
        let path = root.join(&relative);
        if kind.is_file() {
            hash_contents(hasher, open_regular(&path, true)?)?;
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&path)?;
            let target = target.as_os_str().as_encoded_bytes();
            hasher.update((target.len() as u64).to_le_bytes());
            hasher.update(target);
        }
    }
    Ok(())
}

/// A file's length and bytes.
fn hash_contents(hasher: &mut Sha256, mut file: File) -> io::Result<()> {
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
    fn an_onnx_key_is_its_bytes_and_its_external_data() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/external");
        let tmp = tempfile::tempdir().unwrap();
        for name in ["external.onnx", "weights.bin"] {
            std::fs::copy(fixtures.join(name), tmp.path().join(name)).unwrap();
        }
        let file = tmp.path().join("external.onnx");
        let model = Model { id: "external.onnx".into(), path: file.clone(), format: isorun_engine::ModelFormat::Onnx };
        let first = unit_key(&model, &parts()).unwrap();
        assert_eq!(first, unit_key(&model, &parts()).unwrap());
        let weights = tmp.path().join("weights.bin");
        let mut bytes = std::fs::read(&weights).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&weights, &bytes).unwrap();
        let second = unit_key(&model, &parts()).unwrap();
        assert_ne!(first, second, "new external weights beside the same graph, a new key");
        let mut graph = std::fs::read(&file).unwrap();
        graph.push(0);
        std::fs::write(&file, &graph).unwrap();
        assert_ne!(second, unit_key(&model, &parts()).unwrap(), "a new graph, a new key");
    }

    /// External data an ONNX model may not have read (a FIFO, a hidden
    /// file) is keyed by why, never opened and never an error of the run;
    /// two spellings of one file are hashed once.
    #[test]
    fn onnx_external_data_that_cannot_be_read_is_keyed_not_opened() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/external");
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(fixtures.join("external.onnx"), tmp.path().join("external.onnx")).unwrap();
        let fifo = std::ffi::CString::new(tmp.path().join("weights.bin").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let file = tmp.path().join("external.onnx");
        let model = Model { id: "external.onnx".into(), path: file, format: isorun_engine::ModelFormat::Onnx };
        // A FIFO nobody writes would hang a reader: the key is made at once.
        let key = unit_key(&model, &parts()).expect("a key, not an error");
        assert_eq!(key, unit_key(&model, &parts()).unwrap());
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
    fn links_in_the_tree_are_keyed_by_what_they_name_and_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        let blobs = tmp.path().join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::write(blobs.join("sha-1"), b"linked weights").unwrap();
        std::fs::write(blobs.join("sha-2"), b"new weights").unwrap();
        let variables = model.path.join("variables");
        std::os::unix::fs::symlink(blobs.join("sha-1"), variables.join("variables.index")).unwrap();
        // A loop (a folder that links to its own parent) is not entered.
        std::os::unix::fs::symlink(&variables, variables.join("more-loop")).unwrap();
        let first = unit_key(&model, &parts()).unwrap();
        // A content-addressed cache: new weights are another blob, another link.
        std::fs::remove_file(variables.join("variables.index")).unwrap();
        std::os::unix::fs::symlink(blobs.join("sha-2"), variables.join("variables.index")).unwrap();
        let second = unit_key(&model, &parts()).unwrap();
        assert_ne!(first, second, "a link that names another blob, a new key");
        std::fs::write(blobs.join("sha-2"), b"edited in place").unwrap();
        assert_eq!(second, unit_key(&model, &parts()).unwrap(), "what a link points to is not read");
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

    #[test]
    fn every_file_of_the_saved_model_is_part_of_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        for (file, contents) in [
            ("assets/vocab.txt", "a\nb\n"),
            ("assets/nested/table.tsv", "x\t1\n"),
            ("assets.extra/tf_serving_warmup_requests", "warm"),
            ("fingerprint.pb", "fp"),
            ("keras_metadata.pb", "meta"),
        ] {
            let path = model.path.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, contents).unwrap();
            let before = unit_key(&model, &parts()).unwrap();
            std::fs::write(&path, format!("{contents} edited")).unwrap();
            assert_ne!(before, unit_key(&model, &parts()).unwrap(), "{file} edited, a new key");
        }
        // A file moved within the tree is another tree.
        let before = unit_key(&model, &parts()).unwrap();
        std::fs::rename(model.path.join("assets/vocab.txt"), model.path.join("assets/vocab2.txt")).unwrap();
        assert_ne!(before, unit_key(&model, &parts()).unwrap(), "a renamed asset, a new key");
    }

    #[test]
    fn hashing_reads_no_device_or_fifo_and_follows_no_link_out_of_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        let assets = model.path.join("assets");
        std::fs::create_dir_all(&assets).unwrap();
        // A FIFO nobody writes would block the open (or the read) forever;
        // /dev/zero would be read forever; a link to / walks the whole disk.
        let fifo = std::ffi::CString::new(assets.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/dev/zero", assets.join("zero")).unwrap();
        std::os::unix::fs::symlink("/", model.path.join("variables/root")).unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        let for_thread = model.clone();
        std::thread::spawn(move || sender.send(unit_key(&for_thread, &parts()).map_err(|e| e.to_string())));
        let key = receiver
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("hashing the model ends (no FIFO, device or / read)");
        let first = key.expect("the FIFO and the links are keyed, not read");
        // What a link names is keyed; what it points to is not read.
        std::fs::remove_file(assets.join("zero")).unwrap();
        std::os::unix::fs::symlink("/dev/null", assets.join("zero")).unwrap();
        assert_ne!(first, unit_key(&model, &parts()).unwrap(), "a link that names another file, a new key");
    }

    #[test]
    fn a_keras_file_that_is_not_a_regular_file_is_refused_unread() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("model.keras");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let model = Model { id: "model.keras".into(), path: fifo, format: isorun_engine::ModelFormat::Keras };
        let error = unit_key(&model, &parts()).unwrap_err().to_string();
        assert!(error.contains("not a regular file"), "{error}");
    }

    #[test]
    fn a_journal_planted_as_a_link_is_neither_read_nor_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "line one\nno newline at the end").unwrap();
        let journal_path = tmp.path().join("journal.jsonl");
        std::os::unix::fs::symlink(&victim, &journal_path).unwrap();
        let error = Journal::open(&journal_path, false).err().expect("a linked journal is refused");
        assert!(error.contains("symbolic link"), "{error}");
        assert!(read_journal(&journal_path).unwrap_err().contains("symbolic link"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "line one\nno newline at the end");
    }

    #[test]
    fn a_resumed_record_is_the_current_run_s_model_with_a_known_status() {
        let tmp = tempfile::tempdir().unwrap();
        let model = model(tmp.path());
        // An edited line: another model's name and path, to duplicate its row and hide this one.
        let edited = serde_json::json!({"model": "other", "path": "/elsewhere", "status": "ok", "wall_ms": 5});
        let record = resumed_record(edited, &model).expect("a known status is resumed");
        assert_eq!(record["model"], "m");
        assert_eq!(record["path"], model.path.to_string_lossy().as_ref());
        assert_eq!(record["resumed"], true);
        assert_eq!(record["wall_ms"], 5);
        for status in [serde_json::json!("fine"), serde_json::json!(1), serde_json::json!("not_run"), Value::Null] {
            let forged = serde_json::json!({"model": "m", "status": status});
            assert!(resumed_record(forged, &model).is_none(), "status {status} runs again");
        }
    }
}
