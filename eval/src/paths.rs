//! From the paths a user gave (files, folders, glob patterns) to the list of
//! data files, each with its format, in the order they are read.
//!
//! Decisions: a path that exists is taken literally even if it contains glob
//! characters; otherwise a path with `*`, `?`, `[` or `{` is a pattern
//! (globset syntax, `*` does not cross `/`, `**` does), and one matching
//! nothing is an error. Matches and folder entries are sorted bytewise. A
//! pattern's walk follows symlinked folders but walks each folder once (by
//! device and inode), so a symlink loop cannot multiply it; a folder reached
//! by two paths is listed under the first, in bytewise order. A
//! folder holding `.npy` files is one shard of arrays (`Format::NpyFolder`);
//! any other folder is a folder of shards: its `.tfrecord`/`.tfrecords`/
//! `.tfrec`/`.gz`/`.npz`/`.csv`/`.parquet`/`.pq`/`.arrow`/`.feather`/`.ipc`/`.jsonl`/`.ndjson`(`.gz`) files and its
//! subfolders of `.npy` files, one level deep, other entries (`_SUCCESS`, READMEs, hidden files) ignored. A file
//! named explicitly must have a known extension, unless `--data-format`
//! says its format (which then holds for every file named or matched by a
//! pattern). TFRecord, array, CSV, Parquet/Arrow and JSON Lines files are not mixed in one dataset: they are fed
//! differently.

use crate::error::DataError;
use crate::format::Format;
use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The files of the given paths, in reading order, with their formats.
/// With `forced`, files named or matched are read as that format whatever
/// their names say (a folder's files are still chosen by their endings).
pub fn expand(paths: &[PathBuf], forced: Option<Format>) -> Result<Vec<(PathBuf, Format)>, DataError> {
    let mut files = Vec::new();
    for path in paths {
        if path.exists() {
            resolve(path, true, forced, &mut files)?;
        } else if is_pattern(path) {
            let matches = glob(path)?;
            if matches.is_empty() {
                return Err(DataError::NoMatch { pattern: path.clone() });
            }
            for found in matches {
                resolve(&found, false, forced, &mut files)?;
            }
        } else {
            return Err(DataError::NotFound { path: path.clone() });
        }
    }
    if files.is_empty() {
        return Err(DataError::NoData {
            path: paths.first().cloned().unwrap_or_default(),
            suffixes: crate::format::suffix_list(),
        });
    }
    let family = files[0].1.family();
    if let Some((other, format)) = files.iter().find(|(_, f)| f.family() != family) {
        return Err(DataError::MixedFormats {
            first: files[0].0.clone(),
            first_family: family,
            other: other.clone(),
            other_family: format.family(),
            families: crate::format::family_list(),
        });
    }
    Ok(files)
}

fn is_pattern(path: &Path) -> bool {
    path.as_os_str().as_bytes().iter().any(|b| matches!(b, b'*' | b'?' | b'[' | b'{'))
}

/// The format a file's name says, if any.
pub fn format_of(path: &Path) -> Option<Format> {
    Format::of_file_name(path.file_name()?.as_bytes())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io = |source| DataError::Io { path: dir.to_path_buf(), source };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        entries.push(entry.map_err(io)?.path());
    }
    entries.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(entries)
}

fn has_npy(dir: &Path) -> Result<bool, DataError> {
    Ok(sorted_entries(dir)?.iter().any(|p| p.is_file() && p.extension().is_some_and(|e| e == "npy")))
}

fn resolve(
    path: &Path,
    explicit: bool,
    forced: Option<Format>,
    files: &mut Vec<(PathBuf, Format)>,
) -> Result<(), DataError> {
    if path.is_dir() {
        if has_npy(path)? {
            files.push((path.to_path_buf(), Format::NpyFolder));
            return Ok(());
        }
        let before = files.len();
        for entry in sorted_entries(path)? {
            let hidden = entry.file_name().is_some_and(|n| n.as_bytes().starts_with(b"."));
            if hidden {
                continue;
            }
            if entry.is_dir() {
                if has_npy(&entry)? {
                    files.push((entry, Format::NpyFolder));
                }
            } else if let Some(format) = format_of(&entry) {
                files.push((entry, format));
            }
        }
        if files.len() == before {
            return Err(DataError::NoData { path: path.to_path_buf(), suffixes: crate::format::suffix_list() });
        }
        return Ok(());
    }
    match forced.or_else(|| format_of(path)) {
        Some(format) => files.push((path.to_path_buf(), format)),
        None if explicit || path.extension().is_some_and(|e| e == "npy") => {
            return Err(DataError::UnknownFormat { path: path.to_path_buf(), suffixes: crate::format::suffix_list() })
        }
        // A pattern's match of another kind (`data/*` over a README) is not data.
        None => {}
    }
    Ok(())
}

/// The entries a pattern matches, sorted bytewise.
fn glob(pattern: &Path) -> Result<Vec<PathBuf>, DataError> {
    let text = pattern.to_string_lossy();
    let matcher = globset::GlobBuilder::new(&text)
        .literal_separator(true)
        .build()
        .map_err(|e| DataError::BadPattern { pattern: pattern.to_path_buf(), reason: e.kind().to_string() })?
        .compile_matcher();
    // The folder to walk: the components before the first with a glob character.
    let mut base = PathBuf::new();
    let mut rest = 0;
    let mut recursive = false;
    let mut in_pattern = false;
    for component in pattern.components() {
        let c = Path::new(component.as_os_str());
        if !in_pattern && !is_pattern(c) {
            base.push(component);
        } else {
            in_pattern = true;
            rest += 1;
            recursive |= component.as_os_str() == "**";
        }
    }
    if base.as_os_str().is_empty() {
        base = PathBuf::from(".");
    }
    let strip_dot = !pattern.starts_with(".") && base == Path::new(".");
    let mut found = Vec::new();
    let mut walk = Walk { max_depth: rest, recursive, strip_dot, matcher, visited: HashSet::new(), found: &mut found };
    walk.folder(&base, 1);
    found.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(found)
}

/// One pattern's walk. Symlinked folders are followed, but each folder
/// (by device and inode) is walked once: a `link -> .` loop, or two links
/// to one folder at every level, would otherwise multiply the walk (two
/// loops: 2^40 walks before the kernel's limit of 40 links in a path).
struct Walk<'a> {
    max_depth: usize,
    recursive: bool,
    strip_dot: bool,
    matcher: globset::GlobMatcher,
    visited: HashSet<(u64, u64)>,
    found: &'a mut Vec<PathBuf>,
}

impl Walk<'_> {
    fn folder(&mut self, dir: &Path, depth: usize) {
        let Ok(meta) = std::fs::metadata(dir) else { return };
        if !self.visited.insert((meta.dev(), meta.ino())) {
            return;
        }
        let Ok(entries) = sorted_entries(dir) else { return };
        for entry in entries {
            let shown =
                if self.strip_dot { entry.strip_prefix(".").unwrap_or(&entry).to_path_buf() } else { entry.clone() };
            if self.matcher.is_match(&shown) {
                self.found.push(shown);
            } else if entry.is_dir() && (self.recursive || depth < self.max_depth) {
                self.folder(&entry, depth + 1);
            }
        }
    }
}
