//! Reading a `.keras` archive in the supervisor: its `config.json` and
//! `metadata.json`, each held to a bound on what it inflates to and what
//! its JSON parses to.
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

use super::architecture::architecture_digest;
use super::error::KerasFileError;
use super::model_config::{describe_config, KerasInfo};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keras::files::fixtures::decoy_config;

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
