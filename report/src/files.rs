//! Reading and writing report files. Every file is written under a
//! temporary name in its own folder, flushed to disk and then renamed over
//! the target, so a reader (a CI job picking up `report.xml`, a browser)
//! never sees half a file, even when isorun is killed while writing.

use super::document::{OLDEST_SCHEMA_VERSION, SCHEMA_VERSION};
use super::{html, junit, ReportError};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes the report as JSON, JUnit XML and HTML, each where asked.
/// Errors name the file that could not be written.
pub fn write_files(
    report: &Value,
    json: Option<&Path>,
    junit: Option<&Path>,
    html: Option<&Path>,
) -> Result<(), ReportError> {
    if let Some(path) = json {
        let mut text = serde_json::to_string_pretty(report).expect("a JSON value always serializes");
        text.push('\n');
        write_atomically(path, text.as_bytes())?;
    }
    if let Some(path) = junit {
        let xml = junit::junit_xml(report)
            .map_err(|source| ReportError::Junit { path: path.to_path_buf(), source: Box::new(source) })?;
        write_atomically(path, xml.as_bytes())?;
    }
    if let Some(path) = html {
        write_atomically(path, html::html_page(report).as_bytes())?;
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same folder
/// (a rename is atomic only within one file system).
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    write_file_atomically(path, bytes).map_err(|source| ReportError::Write { path: path.to_path_buf(), source })
}

/// Writes `bytes` to `path` whole or not at all, safely in a folder others
/// can write (a Slurm group folder): the temporary file is created anew
/// (`O_EXCL`, a random name beside the target), so a link or file planted
/// under a guessable name (`.report.json.tmp-PID`) is never opened, let alone
/// truncated; the rename then replaces whatever is at `path`, a planted link
/// included, without following it. The file gets the permissions a new file
/// gets (0666 less the umask), as `File::create` gave it.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path does not name a file"))?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder)?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(file_name);
    prefix.push(".tmp-");
    let mut temporary = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(&folder)?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    // On failure the temporary file is removed when dropped.
    temporary.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A file of JSON lines given as a report: a journal (its records have a
/// `key`) or the records a run printed, each said with how to get a report.
fn json_lines(path: &Path, text: &str) -> Option<ReportError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first: Value = serde_json::from_str(lines.next()?).ok()?;
    let second: Value = serde_json::from_str(lines.next()?).ok()?;
    if !(first.is_object() && second.is_object()) {
        return None;
    }
    let shown = path.display();
    let path = path.to_path_buf();
    Some(if first.get("key").is_some() {
        ReportError::JsonLines {
            path: path.clone(),
            what: "a journal (--journal)",
            how: format!("--journal {shown} --resume --report report.json (the models it holds are not run again)"),
        }
    } else {
        ReportError::JsonLines {
            path: path.clone(),
            what: "the records a run printed",
            how: "--report report.json".into(),
        }
    })
}

/// Reads a report file and checks that it is one this isorun understands.
pub fn read_report(path: &Path) -> Result<Value, ReportError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ReportError::Read { path: path.to_path_buf(), source })?;
    // Counted before it is parsed: tiny values (`[0,0,…]`) would cost fifty
    // times the file (a report given to merge or diff is anyone's file).
    isorun_tensors::json_cost::check_record_json_cost(text.as_bytes())
        .map_err(|reason| ReportError::NotAReport { path: path.to_path_buf(), what: reason })?;
    let report: Value = serde_json::from_str(&text).map_err(|source| {
        json_lines(path, &text).unwrap_or(ReportError::NotJson { path: path.to_path_buf(), source })
    })?;
    let not_a_report = |what: &str| ReportError::NotAReport { path: path.to_path_buf(), what: what.to_string() };
    if !report.is_object() {
        return Err(not_a_report("not a JSON object"));
    }
    match report.get("schema_version") {
        None => return Err(not_a_report("no schema_version")),
        Some(version) if !version.as_u64().is_some_and(|v| (OLDEST_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&v)) => {
            return Err(ReportError::SchemaVersion { path: path.to_path_buf(), found: version.to_string() })
        }
        Some(_) => {}
    }
    let Some(units) = report["units"].as_array() else {
        return Err(not_a_report("no units list"));
    };
    if let Some(index) = units.iter().position(|unit| !unit["model"].is_string() || !unit["status"].is_string()) {
        return Err(not_a_report(&format!("unit {index} has no model or no status")));
    }
    Ok(report)
}

#[cfg(test)]
mod files_given_in_place_of_a_report_tests {
    use super::*;

    #[test]
    fn a_journal_given_as_a_report_is_said_to_be_one() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("j.jsonl");
        std::fs::write(&journal, "{\"key\": \"a\", \"model\": \"m\"}\n{\"key\": \"b\", \"model\": \"n\"}\n").unwrap();
        let text = read_report(&journal).unwrap_err().to_string();
        assert!(text.contains("j.jsonl: not an isorun report but a journal (--journal)"), "{text}");
        assert!(text.contains("--resume --report report.json"), "{text}");
        let records = tmp.path().join("r.jsonl");
        std::fs::write(&records, "{\"model\": \"m\"}\n{\"model\": \"n\"}\n").unwrap();
        let text = read_report(&records).unwrap_err().to_string();
        assert!(text.contains("but the records a run printed"), "{text}");
        let broken = tmp.path().join("b.json");
        std::fs::write(&broken, "{\"units\": [").unwrap();
        assert!(matches!(read_report(&broken), Err(ReportError::NotJson { .. })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({"schema_version": 1, "started_at": "2024-01-01T00:00:00.000Z", "wall_ms": 5,
               "units": [{"model": "a", "status": "ok", "wall_ms": 5}]})
    }

    #[test]
    fn every_file_is_written_whole_and_no_temporary_file_is_left() {
        let folder = tempfile::tempdir().unwrap();
        let (json, junit, html) =
            (folder.path().join("r.json"), folder.path().join("deeper/r.xml"), folder.path().join("r.html"));
        write_files(&sample(), Some(&json), Some(&junit), Some(&html)).unwrap();
        assert_eq!(read_report(&json).unwrap(), sample());
        assert!(std::fs::read_to_string(&junit).unwrap().contains("<testcase name=\"a\""));
        assert!(std::fs::read_to_string(&html).unwrap().starts_with("<!DOCTYPE html>"));
        let mut names: Vec<String> = std::fs::read_dir(folder.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["deeper", "r.html", "r.json"]);
    }

    #[test]
    fn a_planted_temporary_link_is_not_followed() {
        let folder = tempfile::tempdir().unwrap();
        let victim = folder.path().join("victim.txt");
        std::fs::write(&victim, "the user's own file").unwrap();
        let shared = folder.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        // Anyone who can write the shared folder guesses the pid (or plants many).
        for name in ["merged.json", "merged.xml", "merged.html"] {
            let planted = shared.join(format!(".{name}.tmp-{}", std::process::id()));
            std::os::unix::fs::symlink(&victim, planted).unwrap();
        }
        // A planted target is replaced, not written through, too.
        std::os::unix::fs::symlink(&victim, shared.join("merged.html")).unwrap();
        let (json, junit, html) = (shared.join("merged.json"), shared.join("merged.xml"), shared.join("merged.html"));
        write_files(&sample(), Some(&json), Some(&junit), Some(&html)).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file");
        assert_eq!(read_report(&json).unwrap(), sample());
        assert!(!std::fs::symlink_metadata(&html).unwrap().file_type().is_symlink());
        assert!(std::fs::read_to_string(&html).unwrap().starts_with("<!DOCTYPE html>"));
    }

    #[test]
    fn errors_name_the_file() {
        let folder = tempfile::tempdir().unwrap();
        let blocker = folder.path().join("a-file");
        std::fs::write(&blocker, "").unwrap();
        let unwritable = blocker.join("r.json");
        let error = write_files(&sample(), Some(&unwritable), None, None).unwrap_err();
        let error = format!("{error}: {}", std::error::Error::source(&error).unwrap());
        assert!(error.starts_with(&format!("{}: cannot write: ", unwritable.display())), "{error}");

        let old = folder.path().join("old.json");
        std::fs::write(&old, r#"{"schema_version": 3, "units": []}"#).unwrap();
        let error = read_report(&old).unwrap_err().to_string();
        assert_eq!(error, format!("{}: report schema_version 3, but this isorun reads versions 1 to 2", old.display()));
        std::fs::write(&old, r#"{"units": []}"#).unwrap();
        let error = read_report(&old).unwrap_err().to_string();
        assert_eq!(error, format!("{}: not an isorun report: no schema_version", old.display()));
        let error = read_report(&folder.path().join("missing.json")).unwrap_err().to_string();
        assert!(error.ends_with("missing.json: cannot read"), "{error}");
    }
}
