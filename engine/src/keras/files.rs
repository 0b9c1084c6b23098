//! Reading Keras model files in the supervisor, without TensorFlow or
//! Python: what `isorun inspect` shows and what discovery needs to tell a
//! model from a weights file. A `.keras` file is a zip of `metadata.json`,
//! `config.json` and `model.weights.h5`; a full-model HDF5 file keeps the
//! same JSON in its root group's `model_config` attribute.
//!
//! The `.h5` reader here is small and narrow on purpose. `hdf5`/`hdf5-metno`
//! link libhdf5; pure-Rust readers exist (`hdf5-reader`, `hdf5-pure`,
//! `rustyhdf5`) but are young, and each is a whole format parser to run on
//! untrusted files inside the supervisor, for one attribute (not tried
//! here; worth a look if more than the config is ever needed). What the
//! supervisor needs is little: the root group's `model_config` and
//! `keras_version` attributes, found as h5py finds them (from the
//! superblock to the root group's object header, its attribute messages by
//! name, a variable-length string's bytes in the global heap collection its
//! heap ID names, or a fixed-length string's inline), within the first
//! [`H5_SCAN_BYTES`]. Any other JSON in the file (another attribute, a
//! dataset) is not taken: what the supervisor reads is what Keras reads. A
//! file whose attributes it cannot find this way (stored densely, shared,
//! or past the bytes read) is still run (the export process reads it with
//! Keras); only `inspect` has less to say. Whether an `.h5` file is a
//! model at all is decided by the attribute name `model_config` in those
//! first bytes.
//!
//! A `.keras` archive is read with the Rust zip crate, and Keras reads it
//! with Python's `zipfile`, which differ where a name is ambiguous:
//! `zipfile` cuts a name at a NUL byte and lets a later entry of a name win,
//! the zip crate reads a Unicode-path extra field that `zipfile` ignores.
//! An archive whose entry names could be read two ways is refused
//! ([`KerasFileError::AmbiguousEntry`]). Either way the supervisor's
//! reading only proposes which files share a trace: the export process
//! shares one only between files whose configs, as Keras reads them, are
//! the same (`keras_export.py`, `loaded_config_digest`).

use isorun_protocol::DType;
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// How much of an HDF5 file is searched for the model's attributes.
pub const H5_SCAN_BYTES: u64 = 16 << 20;

/// The HDF5 file signature, at offset 0 of every file h5py writes.
const HDF5_SIGNATURE: &[u8] = b"\x89HDF\r\n\x1a\n";

/// What a Keras file says about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KerasInfo {
    /// The model's class (`Functional`, `Sequential`, or a subclass's name).
    pub class_name: String,
    /// The Keras version that saved it, where the file says.
    pub keras_version: Option<String>,
    /// Input layers: name, dtype, shape (`None` for an unknown dimension).
    pub inputs: Vec<KerasTensor>,
    /// Output names, as Keras names them (the output layers').
    pub outputs: Vec<String>,
    /// The first layer whose config carries Python code (a `Lambda`'s
    /// bytecode), named as the error shows it; see [`code_in_config`].
    pub code: Option<String>,
    /// What decides the model's graph, as a digest: files with the same
    /// one (checkpoints of one training run) share one trace; see
    /// [`architecture_digest`]. `None` where the config was not found.
    pub architecture: Option<String>,
    /// Its layers, nested models' included ([`layer_count`]).
    pub layers: usize,
}

/// One input of a Keras model, from its `InputLayer`.
#[derive(Debug, Clone, PartialEq)]
pub struct KerasTensor {
    pub name: String,
    pub dtype: Option<DType>,
    pub shape: Option<Vec<Option<u64>>>,
}

/// Why a Keras file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KerasFileError {
    #[error("{path}: cannot read")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a .keras archive (a zip holding config.json): {reason}")]
    NotAnArchive { path: String, reason: String },
    #[error("{path}: {member} is not valid JSON: {reason}")]
    BadJson { path: String, member: &'static str, reason: String },
    #[error("{path}: not an HDF5 file")]
    NotHdf5 { path: String },
    #[error("{path}: holds weights only (no model_config attribute); a model needs its architecture: save it with model.save(\"model.keras\")")]
    WeightsOnly { path: String },
    #[error("{path}: the model_config attribute is not where isorun looks (the root group's attributes, in the first {} MiB); the export reads it with Keras", H5_SCAN_BYTES >> 20)]
    H5ConfigNotFound { path: String },
    /// `entry`: the name as stored, escaped (`{:?}` of its bytes read lossily).
    #[error("{path}: refused: archive entry {entry} {reason}; a .keras archive's entry names must read one way only (plain, unique, printable paths)")]
    AmbiguousEntry { path: String, entry: String, reason: String },
    #[error("{path}: refused: its zip central directory {reason}; Python's zipfile, which Keras reads with, and isorun's zip reader could read different entries")]
    AmbiguousDirectory { path: String, reason: String },
}

/// True for an HDF5 file whose first bytes name a `model_config`
/// attribute: a model saved whole (`model.save("m.h5")`), not weights.
pub fn h5_is_full_model(path: &Path) -> Result<bool, KerasFileError> {
    let head = read_head(path)?;
    if !head.starts_with(HDF5_SIGNATURE) {
        return Err(KerasFileError::NotHdf5 { path: path.display().to_string() });
    }
    Ok(memchr_find(&head, b"model_config").is_some())
}

/// Reads what a `.keras` archive says of itself.
pub fn read_keras(path: &Path) -> Result<KerasInfo, KerasFileError> {
    let shown = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| KerasFileError::Io { path: shown(), source })?;
    let own = file.try_clone().map_err(|source| KerasFileError::Io { path: shown(), source })?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| KerasFileError::NotAnArchive { path: shown(), reason: e.to_string() })?;
    check_entry_names(path, own, &archive)?;
    // The archive's own size is what was read: a deflated entry may claim
    // (and hold) far more, so what it may inflate to and what its JSON may
    // parse to are both held to the archive's bound (SECURITY.md).
    let archive_len = std::fs::metadata(path).map_err(|source| KerasFileError::Io { path: shown(), source })?.len();
    let most_text = archive_len.saturating_mul(4).clamp(8 << 20, 64 << 20);
    let mut member = |name: &'static str| -> Result<Option<Value>, KerasFileError> {
        let mut entry = match archive.by_name(name) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => return Err(KerasFileError::NotAnArchive { path: shown(), reason: e.to_string() }),
        };
        let mut text = Vec::new();
        // Configs are small; a hostile archive does not get to fill memory.
        (&mut entry)
            .take(most_text + 1)
            .read_to_end(&mut text)
            .map_err(|e| KerasFileError::NotAnArchive { path: shown(), reason: format!("{name}: {e}") })?;
        if text.len() as u64 > most_text {
            return Err(KerasFileError::BadJson {
                path: shown(),
                member: name,
                reason: format!(
                    "it inflates to more than {most_text} bytes from an archive of {archive_len} (a config is far smaller)"
                ),
            });
        }
        isorun_tensors::json_cost::check_json_cost_of(&text, archive_len)
            .map_err(|reason| KerasFileError::BadJson { path: shown(), member: name, reason })?;
        serde_json::from_slice(&text).map(Some).map_err(|e| KerasFileError::BadJson {
            path: shown(),
            member: name,
            reason: e.to_string(),
        })
    };
    let config = member("config.json")?
        .ok_or_else(|| KerasFileError::NotAnArchive { path: shown(), reason: "no config.json in it".into() })?;
    let metadata = member("metadata.json")?;
    let mut info = describe_config(&config);
    info.keras_version = metadata.as_ref().and_then(|m| m.get("keras_version")).and_then(Value::as_str).map(Into::into);
    info.architecture = Some(architecture_digest("keras", &config, info.keras_version.as_deref()));
    Ok(info)
}

/// Reads the `model_config` (and Keras version) of a full-model `.h5` file:
/// its root group's attributes of those names, as h5py reads them.
pub fn read_h5(path: &Path) -> Result<KerasInfo, KerasFileError> {
    if !h5_is_full_model(path)? {
        return Err(KerasFileError::WeightsOnly { path: path.display().to_string() });
    }
    let head = read_head(path)?;
    let attribute = |name: &[u8]| h5::root_string_attribute(&head, name);
    let text = attribute(b"model_config")
        .ok_or_else(|| KerasFileError::H5ConfigNotFound { path: path.display().to_string() })?;
    // Counted before it is parsed: its bytes were read from the file, so the
    // bound is the attribute's own length's.
    isorun_tensors::json_cost::check_json_cost(text).map_err(|reason| KerasFileError::BadJson {
        path: path.display().to_string(),
        member: "model_config",
        reason,
    })?;
    let config: Value = serde_json::from_slice(text).map_err(|e| KerasFileError::BadJson {
        path: path.display().to_string(),
        member: "model_config",
        reason: e.to_string(),
    })?;
    if !config.is_object() {
        return Err(KerasFileError::BadJson {
            path: path.display().to_string(),
            member: "model_config",
            reason: "expected a JSON object".into(),
        });
    }
    let mut info = describe_config(&config);
    info.keras_version =
        attribute(b"keras_version").and_then(|v| std::str::from_utf8(v).ok()).map(|v| v.trim().to_string());
    info.architecture = Some(architecture_digest("h5", &config, info.keras_version.as_deref()));
    Ok(info)
}

/// The most entries a `.keras` archive's central directory is walked for
/// (Keras writes three, and one per asset file).
const MAX_ENTRIES: usize = 100_000;

/// Refuses an archive whose entry names could be read two ways: a NUL,
/// control or DEL byte (Python's `zipfile` cuts a name at NUL), a
/// backslash, a name that is not a plain relative path (`/x`, `./x`,
/// `a//b`, `..`), non-ASCII without the UTF-8 flag (`zipfile` and the zip
/// crate decode it each their own way), a Unicode-path extra field (read by
/// the zip crate, not by `zipfile`), or two entries of one name, a trailing
/// slash aside (`zipfile` takes the later, the zip crate's index hides the
/// earlier). The names are the central directory's, walked here as
/// `zipfile` walks it (every `PK\x01\x02` header from the directory's
/// start), and must be as many as the zip crate read.
fn check_entry_names<R: Read + std::io::Seek>(
    path: &Path,
    file: std::fs::File,
    archive: &zip::ZipArchive<R>,
) -> Result<(), KerasFileError> {
    use std::io::{Seek, SeekFrom};
    let shown = || path.display().to_string();
    let broken = |reason: String| KerasFileError::NotAnArchive { path: shown(), reason };
    let start = archive.central_directory_start();
    let expected = archive.len();
    let mut reader = std::io::BufReader::new(file);
    reader.seek(SeekFrom::Start(start)).map_err(|e| broken(format!("central directory: {e}")))?;
    let mut seen: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut count = 0usize;
    let mut walked = 0u64;
    loop {
        let mut header = [0u8; 46];
        match reader.read_exact(&mut header[..4]) {
            Ok(()) if header[..4] == *b"PK\x01\x02" => {}
            _ => break,
        }
        reader.read_exact(&mut header[4..]).map_err(|e| broken(format!("central directory: {e}")))?;
        count += 1;
        if count > MAX_ENTRIES.max(expected) {
            return Err(broken(format!("more than {} entries in its central directory", MAX_ENTRIES.max(expected))));
        }
        let field = |at: usize| usize::from(u16::from_le_bytes([header[at], header[at + 1]]));
        let utf8_flag = field(8) & (1 << 11) != 0;
        // Each as long as its 16-bit length says, in the bytes that are there.
        let mut field_bytes = |length: usize| -> Result<Vec<u8>, KerasFileError> {
            let mut bytes = Vec::new();
            (&mut reader)
                .take(length as u64)
                .read_to_end(&mut bytes)
                .map_err(|e| broken(format!("central directory: {e}")))?;
            if bytes.len() != length {
                return Err(broken("central directory: cut short".into()));
            }
            Ok(bytes)
        };
        let name = field_bytes(field(28))?;
        let extra = field_bytes(field(30))?;
        reader.seek_relative(field(32) as i64).map_err(|e| broken(format!("central directory: {e}")))?;
        walked += (46 + field(28) + field(30) + field(32)) as u64;
        let refuse = |reason: String| KerasFileError::AmbiguousEntry {
            path: shown(),
            entry: format!("{:?}", String::from_utf8_lossy(&name)),
            reason,
        };
        if let Some(reason) = ambiguous_name(&name, utf8_flag) {
            return Err(refuse(reason));
        }
        if extra_fields(&extra).any(|id| id == 0x7075) {
            return Err(refuse(
                "carries a Unicode path of its own (extra field 0x7075), which only one of the zip readers takes"
                    .into(),
            ));
        }
        let key = name.strip_suffix(b"/").unwrap_or(&name).to_vec();
        if !seen.insert(key) {
            return Err(refuse(
                "is named twice (Python's zipfile, which Keras reads with, takes the later entry)".into(),
            ));
        }
    }
    if count != expected {
        return Err(KerasFileError::AmbiguousDirectory {
            path: shown(),
            reason: format!("holds {count} entries where isorun's zip reader read {expected}"),
        });
    }
    // Python's zipfile takes the directory to end where the end records
    // start (the last end-of-directory signature in the file's tail); the
    // zip crate seeks the offset the record states. One directory only if
    // they agree: the directory walked ends at the end records, which end
    // the file, state its size, and hold no second signature.
    reader.seek(SeekFrom::Start(start + walked)).map_err(|e| broken(format!("central directory: {e}")))?;
    let mut tail = Vec::new();
    (&mut reader).take(END_RECORDS_MAX + 1).read_to_end(&mut tail).map_err(|e| broken(format!("end records: {e}")))?;
    end_records(&tail, walked).map_err(|reason| KerasFileError::AmbiguousDirectory { path: shown(), reason })
}

/// The most bytes after a central directory: a Zip64 end record and its
/// locator, the end record and the longest comment.
const END_RECORDS_MAX: u64 = 56 + 20 + 22 + 65_535;

/// Checks the bytes after a central directory of `size` bytes: an
/// optional Zip64 end record (its plain 56 bytes) and locator, then the end
/// record, whose comment ends the file and holds no end signature, and
/// which (or the Zip64 record) states the directory's size.
fn end_records(tail: &[u8], size: u64) -> Result<(), String> {
    let u16_at = |at: usize| tail.get(at..at + 2).map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])));
    let u32_at = |at: usize| tail.get(at..at + 4).map(|b| u64::from(u32::from_le_bytes(b.try_into().expect("4"))));
    let u64_at = |at: usize| tail.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let mut at = 0;
    let mut zip64_size = None;
    if tail.starts_with(b"PK\x06\x06") {
        if u64_at(4) != Some(44) {
            return Err("has a Zip64 end record of another size than 56 bytes".into());
        }
        zip64_size = u64_at(40);
        if tail.get(56..60) != Some(b"PK\x06\x07") {
            return Err("has a Zip64 end record without its locator after it".into());
        }
        at = 76;
    }
    if tail.get(at..at + 4) != Some(b"PK\x05\x06") {
        return Err("is followed by something else than its end records".into());
    }
    let comment = u16_at(at + 20).ok_or("ends inside its end record")? as usize;
    if tail.len() != at + 22 + comment {
        return Err(format!(
            "has {} bytes after its end record, which states a comment of {comment}",
            tail.len() - (at + 22).min(tail.len())
        ));
    }
    if tail[at + 22..].windows(4).any(|w| w == b"PK\x05\x06") {
        return Err("has a second end-of-directory signature in its comment".into());
    }
    let stated = match u32_at(at + 12) {
        Some(0xffff_ffff) => zip64_size,
        other => other,
    };
    if stated != Some(size) {
        return Err(format!(
            "is {size} bytes where its end record states {}",
            stated.map_or("none".into(), |s| s.to_string())
        ));
    }
    Ok(())
}

/// Why an archive entry's name (its stored bytes) could be read two ways, or `None`.
fn ambiguous_name(name: &[u8], utf8_flag: bool) -> Option<String> {
    if name.is_empty() {
        return Some("has an empty name".into());
    }
    if let Some(&byte) = name.iter().find(|&&b| b < 0x20 || b == 0x7f) {
        return Some(match byte {
            0 => "holds a NUL byte (Python's zipfile cuts the name there)".into(),
            _ => format!("holds the control byte 0x{byte:02x}"),
        });
    }
    if name.contains(&b'\\') {
        return Some("holds a backslash (a folder separator to some readers)".into());
    }
    if !name.is_ascii() && !utf8_flag {
        return Some("is not ASCII and not flagged as UTF-8 (each zip reader decodes it its own way)".into());
    }
    if std::str::from_utf8(name).is_err() {
        return Some("is flagged as UTF-8 but is not (one zip reader refuses it, another replaces bytes)".into());
    }
    let body = name.strip_suffix(b"/").unwrap_or(name);
    let parts: Vec<&[u8]> = body.split(|&b| b == b'/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == b"." || *p == b"..") {
        let normalised: Vec<&[u8]> =
            parts.iter().copied().filter(|p| !p.is_empty() && *p != b"." && *p != b"..").collect();
        return Some(format!(
            "changes when normalised (expected a plain relative path such as {:?})",
            String::from_utf8_lossy(&normalised.join(&b'/'))
        ));
    }
    None
}

/// The ids of the extra fields of a central directory header (each a
/// 2-byte id, a 2-byte length and that many bytes; a cut one ends the walk).
fn extra_fields(extra: &[u8]) -> impl Iterator<Item = u16> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let header = extra.get(at..at + 4)?;
        let id = u16::from_le_bytes([header[0], header[1]]);
        at += 4 + usize::from(u16::from_le_bytes([header[2], header[3]]));
        Some(id)
    })
}

/// The SHA-256 (hex) of what decides the graph a Keras file loads into:
/// its format, the Keras version that saved it and its model config (the
/// `config.json` of a `.keras` archive, the `model_config` of an `.h5`),
/// written with sorted keys and each `shared_object_id` renumbered in the
/// order of first appearance (Keras writes a Python `id()` there, an address
/// that differs in every process, to mark objects the config shares), less
/// the top-level `compile_config` (the
/// optimizer and loss, which a callback may change between checkpoints and
/// the export, loading with `compile=False`, never uses). Weights are not
/// in a config; the `date_saved` of `metadata.json` is not taken. Two files
/// with the same digest build the same model, so the export traces it once
/// and writes each file's weights into a copy (`keras_export.py` checks
/// that the weights fit before it does).
pub fn architecture_digest(format: &str, config: &Value, keras_version: Option<&str>) -> String {
    use sha2::Digest;
    let mut graph = config.clone();
    if let Some(map) = graph.as_object_mut() {
        map.remove("compile_config");
    }
    renumber_shared_objects(&mut graph, &mut Vec::new());
    let mut text = String::new();
    canonical_json(&graph, &mut text);
    let mut hasher = sha2::Sha256::new();
    for part in [format, keras_version.unwrap_or("-"), &text] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    super::cache::hex(&hasher.finalize())
}

/// Replaces every `shared_object_id` by its index among the distinct ids
/// met so far, depth first in the file's key order: two configs that share
/// the same objects in the same places get the same numbers.
fn renumber_shared_objects(value: &mut Value, seen: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                if key == "shared_object_id" {
                    let index = seen.iter().position(|s| s == item).unwrap_or_else(|| {
                        seen.push(item.clone());
                        seen.len() - 1
                    });
                    *item = Value::from(index as u64);
                } else {
                    renumber_shared_objects(item, seen);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| renumber_shared_objects(item, seen)),
        _ => {}
    }
}

/// JSON with every object's keys sorted: one text for one value, whatever
/// order the file wrote its keys in.
fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn read_head(path: &Path) -> Result<Vec<u8>, KerasFileError> {
    let file =
        std::fs::File::open(path).map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    let mut head = Vec::new();
    file.take(H5_SCAN_BYTES)
        .read_to_end(&mut head)
        .map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    Ok(head)
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The root group's attributes of an HDF5 file, read as h5py reads them
/// (HDF5 File Format Specification, version 3: superblock versions 0 to 3,
/// object header versions 1 and 2, attribute messages versions 1 to 3,
/// continuation blocks, scalar string attributes, fixed-length or
/// variable-length in a global heap collection). Every address is checked
/// against the bytes at hand; nothing is allocated from a size the file
/// states; a walk that cannot go on (dense attribute storage, a shared
/// message, an unknown version, an address past the bytes) finds nothing.
mod h5 {
    /// The most header messages and continuation blocks one walk visits.
    const MAX_MESSAGES: usize = 65_536;
    const MAX_BLOCKS: usize = 1_024;
    const ATTRIBUTE: u16 = 0x000c;
    const CONTINUATION: u16 = 0x0010;

    struct File<'a> {
        bytes: &'a [u8],
        offsets: usize,
        lengths: usize,
        base: u64,
    }

    impl<'a> File<'a> {
        fn uint(&self, at: usize, size: usize) -> Option<u64> {
            uint(self.bytes, at, size)
        }

        /// Where an address of the file points in `bytes` (addresses count from the base).
        fn at(&self, address: u64) -> Option<usize> {
            if address == u64::MAX >> (64 - 8 * self.offsets as u32) {
                return None; // the undefined address
            }
            usize::try_from(self.base.checked_add(address)?).ok().filter(|&at| at < self.bytes.len())
        }
    }

    fn uint(bytes: &[u8], at: usize, size: usize) -> Option<u64> {
        let field = bytes.get(at..at.checked_add(size)?)?;
        Some(field.iter().rev().fold(0u64, |n, &b| (n << 8) | u64::from(b)))
    }

    /// The superblock, and where the root group's object header starts.
    fn superblock(bytes: &[u8]) -> Option<(File<'_>, usize)> {
        if !bytes.starts_with(super::HDF5_SIGNATURE) {
            return None;
        }
        let sizes = |offsets: u8, lengths: u8| [2, 4, 8].contains(&offsets) && [2, 4, 8].contains(&lengths);
        let (offsets, lengths, base_at, root_at) = match *bytes.get(8)? {
            version @ (0 | 1) => {
                let (o, l) = (*bytes.get(13)?, *bytes.get(14)?);
                sizes(o, l).then_some(())?;
                let base_at = if version == 0 { 24 } else { 28 };
                // Base, free space, end of file, driver info, then the root's
                // symbol table entry: its link name offset, its object header.
                (o as usize, l as usize, base_at, base_at + 5 * o as usize)
            }
            2 | 3 => {
                let (o, l) = (*bytes.get(9)?, *bytes.get(10)?);
                sizes(o, l).then_some(())?;
                // Base, superblock extension, end of file, the root's object header.
                (o as usize, l as usize, 12, 12 + 3 * o as usize)
            }
            _ => return None,
        };
        let mut file = File { bytes, offsets, lengths, base: 0 };
        file.base = file.uint(base_at, offsets)?;
        let root = file.uint(root_at, offsets)?;
        let root = file.at(root)?;
        Some((file, root))
    }

    /// The data of every message of the object header at `at`, with its
    /// type, in order, continuation blocks followed (each once).
    fn messages<'a>(file: &File<'a>, at: usize) -> Option<Vec<(u16, &'a [u8])>> {
        let bytes = file.bytes;
        let mut found = Vec::new();
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        let version2 = bytes.get(at..at + 4)? == b"OHDR";
        let mut creation_order = false;
        if version2 {
            (*bytes.get(at + 4)? == 2).then_some(())?;
            let flags = *bytes.get(at + 5)?;
            creation_order = flags & 0x04 != 0;
            let mut p = at + 6;
            if flags & 0x20 != 0 {
                p += 16;
            }
            if flags & 0x10 != 0 {
                p += 4;
            }
            let width = 1usize << (flags & 0x03);
            let size = usize::try_from(uint(bytes, p, width)?).ok()?;
            blocks.push((p + width, size));
        } else {
            (*bytes.get(at)? == 1).then_some(())?;
            let size = usize::try_from(uint(bytes, at + 8, 4)?).ok()?;
            blocks.push((at + 16, size));
        }
        let mut next = 0;
        while next < blocks.len() {
            let (start, size) = blocks[next];
            next += 1;
            let end = start.checked_add(size)?;
            (end <= bytes.len()).then_some(())?;
            let mut p = start;
            loop {
                let (kind, length, flags, data) = if version2 {
                    let head = 4 + if creation_order { 2 } else { 0 };
                    if p + head > end {
                        break; // a gap too small for a message
                    }
                    let length = uint(bytes, p + 1, 2)? as usize;
                    (u16::from(bytes[p]), length, bytes[p + 3], p + head)
                } else {
                    if p + 8 > end {
                        break;
                    }
                    (uint(bytes, p, 2)? as u16, uint(bytes, p + 2, 2)? as usize, bytes[p + 4], p + 8)
                };
                let stop = data.checked_add(length)?;
                (stop <= end).then_some(())?;
                // A shared message holds a reference to its data elsewhere: not followed.
                if flags & 0x02 == 0 {
                    found.push((kind, &bytes[data..stop]));
                }
                if kind == CONTINUATION {
                    let address = file.uint(data, file.offsets)?;
                    let size = usize::try_from(file.uint(data + file.offsets, file.lengths)?).ok()?;
                    let start = file.at(address)?;
                    let block = if version2 {
                        (bytes.get(start..start + 4)? == b"OCHK").then_some(())?;
                        // The signature first, the checksum last.
                        (start + 4, size.checked_sub(8)?)
                    } else {
                        (start, size)
                    };
                    if blocks.iter().all(|&(s, _)| s != block.0) {
                        blocks.push(block);
                    }
                    (blocks.len() <= MAX_BLOCKS).then_some(())?;
                }
                (found.len() <= MAX_MESSAGES).then_some(())?;
                p = if version2 { stop } else { data + length.div_ceil(8) * 8 };
            }
        }
        Some(found)
    }

    /// The value of the scalar string attribute `name` of the root group:
    /// its bytes, a fixed-length string's trailing NULs cut (as numpy does).
    pub(super) fn root_string_attribute<'a>(bytes: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        let (file, root) = superblock(bytes)?;
        let messages = messages(&file, root)?;
        let mut named = messages.iter().filter(|(kind, _)| *kind == ATTRIBUTE).filter_map(|(_, data)| {
            let attribute = attribute(data)?;
            (attribute.name == name).then_some(attribute)
        });
        let found = named.next()?;
        if named.next().is_some() {
            return None; // two attributes of one name: not a file h5py wrote
        }
        scalar(found.dataspace)?;
        string(&file, found.datatype, found.value)
    }

    /// An attribute message's parts, each the bytes of its field.
    struct Attribute<'a> {
        /// Less its NUL.
        name: &'a [u8],
        datatype: &'a [u8],
        dataspace: &'a [u8],
        value: &'a [u8],
    }

    /// An attribute message's name, datatype, dataspace and data.
    fn attribute(data: &[u8]) -> Option<Attribute<'_>> {
        let version = *data.first()?;
        let flags = *data.get(1)?;
        let (name_size, type_size, space_size) =
            (uint(data, 2, 2)? as usize, uint(data, 4, 2)? as usize, uint(data, 6, 2)? as usize);
        let (pad, mut p): (fn(usize) -> usize, usize) = match version {
            1 => (|n| n.div_ceil(8) * 8, 8),
            2 => (|n| n, 8),
            3 => (|n| n, 9),
            _ => return None,
        };
        // A shared datatype or dataspace is a reference elsewhere: not followed.
        (version == 1 || flags & 0x03 == 0).then_some(())?;
        let name = data.get(p..p + name_size)?;
        let name = name.split(|&b| b == 0).next().unwrap_or(name);
        p += pad(name_size);
        let datatype = data.get(p..p + type_size)?;
        p += pad(type_size);
        let dataspace = data.get(p..p + space_size)?;
        p += pad(space_size);
        Some(Attribute { name, datatype, dataspace, value: data.get(p..)? })
    }

    /// A dataspace of one element, as h5py reads into a `str` (rank 0).
    fn scalar(dataspace: &[u8]) -> Option<()> {
        match (*dataspace.first()?, *dataspace.get(1)?) {
            (1, 0) => Some(()),
            (2, 0) if *dataspace.get(3)? == 0 => Some(()),
            _ => None,
        }
    }

    /// A string attribute's bytes: fixed-length (class 3) inline, or
    /// variable-length (class 9, type string) in a global heap collection.
    fn string<'a>(file: &File<'a>, datatype: &[u8], value: &'a [u8]) -> Option<&'a [u8]> {
        let class = *datatype.first()? & 0x0f;
        let size = usize::try_from(uint(datatype, 4, 4)?).ok()?;
        match class {
            3 => {
                let text = value.get(..size)?;
                let end = text.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                Some(&text[..end])
            }
            9 if *datatype.get(1)? & 0x0f == 1 => {
                // The element: the string's length, then its global heap ID
                // (the collection's address and the object's index).
                let length = usize::try_from(uint(value, 0, 4)?).ok()?;
                let address = uint(value, 4, file.offsets)?;
                let index = uint(value, 4 + file.offsets, 4)?;
                let object = heap_object(file, file.at(address)?, index)?;
                object.get(..length)
            }
            _ => None,
        }
    }

    /// [`heap_object`] in `bytes` read as a file with 8-byte offsets and lengths.
    #[cfg(test)]
    pub(super) fn heap_object_in(bytes: &[u8], at: usize, index: u64) -> Option<&[u8]> {
        heap_object(&File { bytes, offsets: 8, lengths: 8, base: 0 }, at, index)
    }

    /// Object `index` of the global heap collection at `at` ("Global Heap":
    /// `GCOL`, version 1, 3 reserved bytes, the collection's size, then
    /// objects of a 2-byte index, a 2-byte reference count, 4 reserved
    /// bytes, a size and the data padded to 8; index 0 is free space).
    fn heap_object<'a>(file: &File<'a>, at: usize, index: u64) -> Option<&'a [u8]> {
        let bytes = file.bytes;
        (bytes.get(at..at + 4)? == b"GCOL" && *bytes.get(at + 4)? == 1).then_some(())?;
        let size = usize::try_from(file.uint(at + 8, file.lengths)?).ok()?;
        let end = at.checked_add(size)?.min(bytes.len());
        let mut object = at + 8 + file.lengths;
        while object + 8 + file.lengths <= end {
            let id = uint(bytes, object, 2)?;
            let length = usize::try_from(file.uint(object + 8, file.lengths)?).ok()?;
            if id == 0 {
                return None; // free space: the rest of the collection
            }
            let data = object + 8 + file.lengths;
            let stop = data.checked_add(length).filter(|&s| s <= end)?;
            if id == index {
                return Some(&bytes[data..stop]);
            }
            object = data + length.div_ceil(8) * 8;
        }
        None
    }
}

/// The first place in a model config that holds Python code which runs
/// when the model is loaded, described (`layer 'NAME' (Lambda)`), or
/// `None`. Keras 3 writes a `lambda` as `{"class_name": "__lambda__",
/// "config": {"code": BASE64...}}`; Keras 2 (`tf_keras`, and `.h5` files)
/// as a Lambda config with `"function_type": "lambda"` (or
/// `"output_shape_type": "lambda"`) and the bytecode in a list. A Lambda
/// naming a registered function by name holds no code and passes. Anything
/// nested (a layer inside a `Sequential` inside a `TimeDistributed`...) is
/// searched, to a bounded depth; a config nested deeper counts as code,
/// since it cannot be checked.
pub fn code_in_config(config: &Value) -> Option<String> {
    fn search(value: &Value, layer: Option<&str>, depth: usize) -> Option<String> {
        let described = |what: &str| match layer {
            Some(name) => format!("layer '{name}' ({what})"),
            None => what.to_string(),
        };
        if depth > 64 {
            return Some(described("a config nested too deep to check"));
        }
        match value {
            Value::Object(map) => {
                let class = map.get("class_name").and_then(Value::as_str);
                let name = map
                    .get("config")
                    .and_then(|c| c.get("name"))
                    .or_else(|| map.get("name"))
                    .and_then(Value::as_str)
                    .or(layer);
                if class == Some("__lambda__") {
                    return Some(described("Lambda with Python bytecode"));
                }
                for key in ["function_type", "output_shape_type", "mask_type"] {
                    if map.get(key).and_then(Value::as_str) == Some("lambda") {
                        return Some(described("Lambda with Python bytecode"));
                    }
                }
                map.values().find_map(|v| search(v, name, depth + 1))
            }
            Value::Array(items) => items.iter().find_map(|v| search(v, layer, depth + 1)),
            _ => None,
        }
    }
    search(config, None, 0)
}

/// How many layers a model config holds, a nested model's (a layer whose
/// config has layers of its own) included: what loading and tracing a
/// file costs grows with it (`load_model` and a trace of DenseNet121's 429
/// layers take 4.8 s here, of ConvNeXtTiny's 153 layers 2.1 s). The
/// config is the file's, so the walk stops 32 models deep.
pub fn layer_count(config: &Value) -> usize {
    fn count(model: &Value, depth: usize) -> usize {
        let layers = model.get("config").and_then(|c| c.get("layers")).and_then(Value::as_array);
        match layers {
            Some(layers) if depth < 32 => layers.iter().map(|layer| 1 + count(layer, depth + 1)).sum(),
            _ => 0,
        }
    }
    count(config, 0)
}

/// Inputs, outputs and class of a Keras model config (`config.json`, or
/// the `model_config` attribute; Keras 3 and Keras 2 spellings).
pub fn describe_config(config: &Value) -> KerasInfo {
    let class_name = config.get("class_name").and_then(Value::as_str).unwrap_or("").to_string();
    let body = config.get("config").unwrap_or(&Value::Null);
    let layers: Vec<&Value> =
        body.get("layers").and_then(Value::as_array).map(|l| l.iter().collect()).unwrap_or_default();
    let layer_name = |layer: &Value| -> Option<String> {
        layer
            .get("name")
            .or_else(|| layer.get("config").and_then(|c| c.get("name")))
            .and_then(Value::as_str)
            .map(Into::into)
    };
    let input_layer = |layer: &Value| -> Option<KerasTensor> {
        (layer.get("class_name").and_then(Value::as_str) == Some("InputLayer")).then_some(())?;
        let c = layer.get("config")?;
        let shape = c
            .get("batch_shape")
            .or_else(|| c.get("batch_input_shape"))
            .and_then(Value::as_array)
            .map(|dims| dims.iter().map(Value::as_u64).collect::<Vec<_>>());
        let dtype = match c.get("dtype") {
            Some(Value::String(s)) => Some(s.as_str()),
            Some(policy) => policy.get("config").and_then(|c| c.get("name")).and_then(Value::as_str),
            None => None,
        }
        .and_then(DType::from_name);
        Some(KerasTensor { name: layer_name(layer)?, dtype, shape })
    };
    // `input_layers` / `output_layers`: `[[name, 0, 0], ...]`, one `[name, 0, 0]`, or a dict of them.
    let references = |key: &str| -> Vec<(Option<String>, String)> {
        let node_name = |v: &Value| v.as_array().and_then(|a| a.first()).and_then(Value::as_str).map(String::from);
        match body.get(key) {
            Some(Value::Object(map)) => {
                map.iter().filter_map(|(k, v)| node_name(v).map(|n| (Some(k.clone()), n))).collect()
            }
            Some(Value::Array(list)) if list.first().is_some_and(Value::is_string) => {
                node_name(&Value::Array(list.clone())).map(|n| vec![(None, n)]).unwrap_or_default()
            }
            Some(Value::Array(list)) => list.iter().filter_map(|v| node_name(v).map(|n| (None, n))).collect(),
            _ => Vec::new(),
        }
    };
    let mut info =
        KerasInfo { class_name, code: code_in_config(config), layers: layer_count(config), ..KerasInfo::default() };
    let named_inputs = references("input_layers");
    if named_inputs.is_empty() {
        info.inputs = layers.iter().filter_map(|l| input_layer(l)).take(1).collect();
        if info.inputs.is_empty() {
            // A Sequential model built from an input shape (Keras 2): its first layer's.
            if let Some(first) = layers.first().and_then(|l| l.get("config")) {
                if let Some(shape) = first.get("batch_input_shape").and_then(Value::as_array) {
                    info.inputs.push(KerasTensor {
                        name: "input".into(),
                        dtype: None,
                        shape: Some(shape.iter().map(Value::as_u64).collect()),
                    });
                }
            }
        }
        info.outputs =
            layers.iter().rev().find(|l| input_layer(l).is_none()).and_then(|l| layer_name(l)).into_iter().collect();
    } else {
        for (key, node) in named_inputs {
            let found = layers.iter().find(|l| layer_name(l).as_deref() == Some(&node)).and_then(|l| input_layer(l));
            let mut tensor = found.unwrap_or(KerasTensor { name: node.clone(), dtype: None, shape: None });
            if let Some(key) = key {
                tensor.name = key;
            }
            info.inputs.push(tensor);
        }
        info.outputs = references("output_layers").into_iter().map(|(key, node)| key.unwrap_or(node)).collect();
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_code_in_a_config_is_found_in_every_spelling() {
        let keras3 = serde_json::json!({"class_name": "Functional", "config": {"layers": [
            {"class_name": "InputLayer", "config": {"name": "x"}},
            {"class_name": "Lambda", "config": {"name": "doubled", "function":
                {"class_name": "__lambda__", "config": {"code": "4wEAAA==", "defaults": null}}}},
        ]}});
        assert_eq!(code_in_config(&keras3).as_deref(), Some("layer 'doubled' (Lambda with Python bytecode)"));
        let keras2 = serde_json::json!({"class_name": "Sequential", "config": {"layers": [
            {"class_name": "TimeDistributed", "config": {"name": "outer", "layer":
                {"class_name": "Lambda", "config": {"name": "inner", "function": ["4wEAAA==", null, null],
                    "function_type": "lambda", "output_shape_type": "raw"}}}},
        ]}});
        assert_eq!(code_in_config(&keras2).as_deref(), Some("layer 'inner' (Lambda with Python bytecode)"));
        let shape = serde_json::json!({"config": {"layers": [{"class_name": "Lambda", "config":
            {"name": "s", "function": "registered_fn", "function_type": "function", "output_shape_type": "lambda"}}]}});
        assert!(code_in_config(&shape).is_some());
        // A Lambda naming a registered function holds no code.
        let named = serde_json::json!({"config": {"layers": [{"class_name": "Lambda", "config":
            {"name": "n", "function": {"module": "builtins", "class_name": "function", "config": "my_fn"}}}]}});
        assert_eq!(code_in_config(&named), None);
        // Nesting past the bound cannot be checked: it counts as code.
        let mut deep = serde_json::json!({"class_name": "Dense"});
        for _ in 0..80 {
            deep = serde_json::json!({"config": {"layer": deep}});
        }
        assert!(code_in_config(&deep).is_some());
    }

    #[test]
    fn layers_are_counted_with_a_nested_models_and_a_deep_nest_stops() {
        let nested = serde_json::json!({"class_name": "Functional", "config": {"layers": [
            {"class_name": "InputLayer", "config": {"name": "x"}},
            {"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense"}, {"class_name": "Dense"}]}},
            {"class_name": "Dense", "config": {"name": "y", "dtype": {"class_name": "DTypePolicy", "config": {}}}}
        ]}});
        assert_eq!(layer_count(&nested), 5);
        assert_eq!(layer_count(&serde_json::json!({"config": {}})), 0);
        let mut deep = serde_json::json!({"class_name": "Dense"});
        for _ in 0..100 {
            deep = serde_json::json!({"config": {"layers": [deep]}});
        }
        assert_eq!(layer_count(&deep), 32);
    }

    #[test]
    fn functional_dict_and_sequential_configs() {
        let functional: Value = serde_json::from_str(
            r#"{"class_name": "Functional", "config": {"layers": [
                {"class_name": "InputLayer", "name": "a", "config": {"batch_shape": [null, 3], "dtype": "float32", "name": "a"}},
                {"class_name": "Dense", "name": "score", "config": {"name": "score"}}],
              "input_layers": {"a": ["a", 0, 0]}, "output_layers": {"score": ["score", 0, 0]}}}"#,
        )
        .unwrap();
        let info = describe_config(&functional);
        assert_eq!(
            info.inputs,
            [KerasTensor { name: "a".into(), dtype: Some(DType::Float32), shape: Some(vec![None, Some(3)]) }]
        );
        assert_eq!(info.outputs, ["score"]);
        let sequential: Value = serde_json::from_str(
            r#"{"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "dtype": "float32", "name": "input_layer"}},
                {"class_name": "Dense", "config": {"name": "dense"}}]}}"#,
        )
        .unwrap();
        let info = describe_config(&sequential);
        assert_eq!(info.inputs[0].name, "input_layer");
        assert_eq!(info.outputs, ["dense"]);
    }

    #[test]
    fn the_architecture_leaves_out_compile_settings_and_key_order_but_not_a_unit() {
        let config = |units: u64, lr: f64| {
            serde_json::json!({"class_name": "Functional", "config": {"name": "run", "layers": [
                {"class_name": "Dense", "config": {"name": "hidden", "units": units}}]},
                "compile_config": {"optimizer": {"config": {"learning_rate": lr}}}})
        };
        let base = architecture_digest("keras", &config(8, 0.001), Some("3.15.1"));
        // Checkpoints of one run: a learning rate changed by a callback shares the graph.
        assert_eq!(base, architecture_digest("keras", &config(8, 0.0001), Some("3.15.1")));
        let reordered: Value = serde_json::from_str(
            r#"{"config": {"layers": [{"config": {"units": 8, "name": "hidden"}, "class_name": "Dense"}], "name": "run"},
                "class_name": "Functional"}"#,
        )
        .unwrap();
        assert_eq!(base, architecture_digest("keras", &reordered, Some("3.15.1")));
        assert_ne!(base, architecture_digest("keras", &config(9, 0.001), Some("3.15.1")), "one unit more");
        assert_ne!(base, architecture_digest("h5", &config(8, 0.001), Some("3.15.1")), "another format");
        assert_ne!(base, architecture_digest("keras", &config(8, 0.001), Some("3.16.0")), "another Keras");
    }

    #[test]
    fn shared_object_ids_count_by_first_appearance_not_by_address() {
        let config = |first: u64, second: u64| {
            serde_json::json!({"class_name": "Functional", "config": {"layers": [
                {"class_name": "Dense", "config": {"dtype": {"class_name": "DTypePolicy", "shared_object_id": first}}},
                {"class_name": "Dense", "config": {"dtype": {"class_name": "DTypePolicy", "shared_object_id": second}}}]}})
        };
        let digest = |c: Value| architecture_digest("keras", &c, Some("3.15.1"));
        // Another process saved the same model: other addresses, the same sharing.
        assert_eq!(digest(config(140090043142160, 140090043142160)), digest(config(140089953923920, 140089953923920)));
        assert_eq!(digest(config(1, 2)), digest(config(7, 5)));
        // One object shared by both layers is not two objects.
        assert_ne!(digest(config(1, 1)), digest(config(1, 2)));
    }

    #[test]
    fn heap_objects_are_bounded_by_their_collection() {
        let mut bytes = b"xxxxGCOL\x01\0\0\0".to_vec();
        bytes.extend_from_slice(&(16u64 + 16 + 8 + 16).to_le_bytes());
        bytes.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"3.1.0\0\0\0");
        // A lying size runs past the collection: not found.
        bytes.extend_from_slice(&[2, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(h5::heap_object_in(&bytes, 4, 1), Some(&b"3.1.0"[..]));
        assert_eq!(h5::heap_object_in(&bytes, 4, 2), None);
        assert_eq!(h5::heap_object_in(&bytes, 4, 3), None);
        assert_eq!(h5::heap_object_in(&bytes, 5, 1), None, "no collection there");
    }

    fn testdata(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/keras/testdata").join(name)
    }

    /// The config of `testdata/make_h5_decoys.py` whose output is `output`.
    fn decoy_config(output: &str) -> Value {
        serde_json::json!({"class_name": "Functional", "config": {"name": output, "layers": [
            {"class_name": "InputLayer", "name": "x",
             "config": {"batch_shape": [null, 2], "dtype": "float32", "name": "x"}},
            {"class_name": "Dense", "name": output, "config": {"name": output, "units": 3}}],
            "input_layers": [["x", 0, 0]], "output_layers": [[output, 0, 0]]}})
    }

    #[test]
    fn an_h5_model_config_is_the_root_attribute_h5py_reads_not_a_decoy_elsewhere() {
        // Each file holds another model config in a dataset written first
        // (first in the global heap), in another root attribute and in a
        // nested group's model_config; h5py's default layout and "latest",
        // variable- and fixed-length strings.
        for file in ["h5_decoys_v0.h5", "h5_decoys_latest.h5"] {
            let info = read_h5(&testdata(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(info.outputs, ["real_out"], "{file}");
            assert_eq!(info.keras_version.as_deref(), Some("3.15.1"), "{file}");
            let real = architecture_digest("h5", &decoy_config("real_out"), Some("3.15.1"));
            assert_eq!(info.architecture.as_deref(), Some(real.as_str()), "{file}");
        }
        // Files Keras 3 and tf_keras wrote.
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/keras");
        let keras3 = read_h5(&fixtures.join("ckpts/seq.h5")).unwrap();
        assert_eq!(
            (keras3.class_name.as_str(), keras3.outputs.as_slice()),
            ("Sequential", &["dense_1".to_string()][..])
        );
        assert!(keras3.keras_version.as_deref().is_some_and(|v| v.starts_with("3.")), "{keras3:?}");
        for file in ["keras2/k2_seq.h5", "keras2/k2_local.h5"] {
            let keras2 = read_h5(&fixtures.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(keras2.keras_version.as_deref().is_some_and(|v| v.starts_with("2.")), "{file}: {keras2:?}");
            assert!(!keras2.inputs.is_empty(), "{file}: {keras2:?}");
        }
    }

    #[test]
    fn an_h5_file_cut_or_changed_anywhere_finds_the_real_config_or_nothing() {
        let bytes = std::fs::read(testdata("h5_decoys_v0.h5")).unwrap();
        let real = h5::root_string_attribute(&bytes, b"model_config").unwrap().to_vec();
        for cut in (0..bytes.len()).step_by(7) {
            let found = h5::root_string_attribute(&bytes[..cut], b"model_config");
            assert!(found.is_none() || found == Some(&real[..]), "cut at {cut}");
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut changed = bytes.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % changed.len() as u64) as usize;
                changed[at] = (state >> 32) as u8;
            }
            // Any answer or none, never a panic.
            let _ = h5::root_string_attribute(&changed, b"model_config");
        }
    }

    /// A `.keras` archive with these (raw) entry names and bytes.
    fn archive(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let mut placeholders = Vec::new();
        for (i, (name, data)) in entries.iter().enumerate() {
            // Written under a placeholder of the same length, renamed in the bytes after.
            let placeholder = char::from(b'A' + i as u8).to_string().repeat(name.len().max(2));
            zip.start_file(placeholder.clone(), stored).unwrap();
            zip.write_all(data).unwrap();
            placeholders.push(placeholder);
        }
        let mut bytes = zip.finish().unwrap().into_inner();
        for (placeholder, (name, _)) in placeholders.iter().zip(entries) {
            let needle = placeholder.as_bytes();
            let mut at = 0;
            while let Some(found) = bytes[at..].windows(needle.len()).position(|w| w == needle) {
                let start = at + found;
                bytes[start..start + needle.len()].copy_from_slice(name);
                at = start + needle.len();
            }
        }
        bytes
    }

    #[test]
    fn a_keras_archive_whose_entry_names_read_two_ways_is_refused_naming_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::to_vec(&decoy_config("out")).unwrap();
        let write = |name: &str, entries: &[(&[u8], &[u8])]| {
            let path = dir.path().join(name);
            std::fs::write(&path, archive(entries)).unwrap();
            path
        };
        // Every archive Keras wrote for the integration tests reads.
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/keras");
        let mut read = 0;
        let mut folders = vec![fixtures];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "keras") && !path.ends_with("truncated.keras") {
                    read_keras(&path).unwrap_or_else(|e| panic!("{e}"));
                    read += 1;
                }
            }
        }
        assert!(read >= 8, "{read} archives");
        let plain =
            write("plain.keras", &[(b"metadata.json", b"{}"), (b"config.json", &config), (b"assets/a/v.txt", b"x")]);
        assert_eq!(read_keras(&plain).unwrap().outputs, ["out"]);
        let cases: [(&[u8], &str); 9] = [
            (b"config.json\0x", "holds a NUL byte"),
            (b"config.json\x1b", "control byte 0x1b"),
            (b"./config.json", "changes when normalised (expected a plain relative path such as \"config.json\")"),
            (b"assets//v.txt", "changes when normalised"),
            (b"/config.json", "changes when normalised"),
            (b"assets/../config.json", "changes when normalised"),
            (b"assets\\config.json", "backslash"),
            (b"config.json/", "is named twice"),
            (b"config.json", "is named twice"),
        ];
        for (name, says) in cases {
            let path = write("hostile.keras", &[(b"config.json", &config), (name, &config)]);
            let error = read_keras(&path).unwrap_err();
            assert!(matches!(error, KerasFileError::AmbiguousEntry { .. }), "{name:?}: {error}");
            let text = error.to_string();
            let shown = format!("{:?}", String::from_utf8_lossy(name));
            assert!(text.contains("hostile.keras") && text.contains(&shown) && text.contains(says), "{text}");
        }
        // A comment holding a second end record (Python's zipfile takes the
        // last one in the file), whole or cut short, and a record that states
        // another directory size.
        let mut fake_end = archive(&[(b"config.json", &config)]);
        let comment_len = fake_end.len() - 2;
        fake_end[comment_len..].copy_from_slice(&22u16.to_le_bytes());
        fake_end.extend_from_slice(b"PK\x05\x06");
        fake_end.extend_from_slice(&[0; 18]);
        let path = dir.path().join("second_end.keras");
        std::fs::write(&path, &fake_end).unwrap();
        // Both readers take the last: an empty archive.
        let text = read_keras(&path).unwrap_err().to_string();
        assert!(text.contains("second_end.keras") && text.contains("no config.json"), "{text}");
        // One cut short: Python's zipfile fails on it, the zip crate reads the one before.
        let mut comment = archive(&[(b"config.json", &config)]);
        let comment_len = comment.len() - 2;
        comment[comment_len..].copy_from_slice(&8u16.to_le_bytes());
        comment.extend_from_slice(b"xPK\x05\x06xyz");
        std::fs::write(&path, &comment).unwrap();
        let text = read_keras(&path).unwrap_err().to_string();
        assert!(text.contains("second end-of-directory signature in its comment"), "{text}");
        let mut size = archive(&[(b"config.json", &config)]);
        let at = size.len() - 22 + 12;
        size[at] = size[at].wrapping_sub(1);
        std::fs::write(&path, &size).unwrap();
        let text = read_keras(&path).unwrap_err().to_string();
        assert!(text.contains("its zip central directory is 57 bytes where its end record states 56"), "{text}");
        // Bytes after the end record.
        let mut trailing = archive(&[(b"config.json", &config)]);
        trailing.extend_from_slice(b"junk");
        std::fs::write(&path, &trailing).unwrap();
        let text = read_keras(&path).unwrap_err().to_string();
        assert!(text.contains("4 bytes after its end record"), "{text}");
        // Cut anywhere: an error or the archive, never a panic.
        let whole = archive(&[(b"config.json", &config), (b"assets/a.txt", b"x")]);
        for cut in 0..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let _ = read_keras(&path);
        }
        // Non-ASCII without the UTF-8 flag: each zip reader decodes it its own way.
        let path = write("latin.keras", &[(b"config.json", &config), (b"assets/caf\xe9.txt", b"x")]);
        assert!(read_keras(&path).unwrap_err().to_string().contains("not flagged as UTF-8"));
    }
}
