//! What the supervisor does for an `.onnx` model, without ONNX Runtime:
//! finds the library its worker will load (once per process, as
//! `locate::onnxruntime_library` says), ends a unit before any worker
//! starts when the file cannot run (unreadable, external data missing, a
//! sequence or map it would have to carry, no ONNX Runtime found), and
//! names what a sandboxed worker must read: the model, its external data
//! and the library's folder.

use crate::discover::{Model, ModelFormat};
use crate::locate::{onnxruntime_library, FoundOnnxruntime};
use crate::unit::UnitReport;
use isorun_protocol::{ErrorKind, ModelError, Outcome, Runtime};
use std::sync::OnceLock;

/// The ONNX Runtime this process's workers load, or why there is none (or
/// why the one found is too old for them): looked up once (the
/// environment does not change under a run).
pub fn onnxruntime() -> Result<&'static FoundOnnxruntime, String> {
    static FOUND: OnceLock<Result<FoundOnnxruntime, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let found = onnxruntime_library().map_err(|e| e.to_string())?;
            match found.too_old() {
                Some(why) => Err(why),
                None => Ok(found),
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The runtime a worker loads `model` with.
pub(crate) fn runtime_for(model: &Model) -> Runtime {
    runtime_for_path(&model.path)
}

/// The runtime a worker loads the model at `path` with: ONNX Runtime for
/// an `.onnx` file (when one is found: else the unit ended before), else
/// TensorFlow.
pub fn runtime_for_path(path: &std::path::Path) -> Runtime {
    match onnxruntime() {
        Ok(found) if isorun_tensors::json_input::is_onnx_file(path) => {
            Runtime::Onnx { library: found.library.to_string_lossy().into_owned() }
        }
        _ => Runtime::TensorFlow,
    }
}

/// Why the ONNX model at `path` cannot run, or `None` when a worker can
/// run it: its own error when it is not a readable ONNX model or its
/// external data is missing, `unsupported_dtype` for an input or output
/// that is no dense tensor of isorun's dtypes, and `load_failed` when no
/// ONNX Runtime is found (saying where isorun looked).
pub fn onnx_not_runnable(path: &std::path::Path) -> Option<ModelError> {
    let load_failed = |message: String| ModelError::new(ErrorKind::LoadFailed, message);
    let model = match isorun_onnxproto::read_model(path) {
        Ok(model) => model,
        Err(e) => return Some(load_failed(isorun_protocol::with_causes(&e))),
    };
    if let Err(why) = external_data_files(&model) {
        return Some(load_failed(why));
    }
    if let Err(error) = model.signature() {
        return Some(error);
    }
    match onnxruntime() {
        Ok(_) => None,
        Err(why) => Some(load_failed(format!("{}: cannot run an ONNX model: {why}", path.display()))),
    }
}

/// Ends every unit of an ONNX model no worker can run (marking it in
/// `decided`), reporting each through `finish`.
pub(crate) fn decide(models: &[Model], decided: &mut [bool], finish: &mut dyn FnMut(UnitReport)) {
    for (index, model) in models.iter().enumerate() {
        if decided[index] || model.format != ModelFormat::Onnx {
            continue;
        }
        let began = std::time::Instant::now();
        if let Some(error) = onnx_not_runnable(&model.path) {
            let mut report = UnitReport::new(index, Outcome::Error(error));
            report.wall = began.elapsed();
            decided[index] = true;
            finish(report);
        }
    }
}

/// What a sandboxed worker must read for `model` beyond the model itself:
/// for an ONNX file, its external-data files and ONNX Runtime's folder
/// (the library and the ones beside it that it loads).
pub(crate) fn read_paths(model: &Model) -> Vec<String> {
    onnx_read_paths(&model.path)
}

/// What a sandboxed worker must read for the model at `path` beyond the
/// model itself: for an ONNX file, its external-data files (as the files
/// they resolve to) and ONNX Runtime's folder; nothing for a SavedModel.
pub fn onnx_read_paths(path: &std::path::Path) -> Vec<String> {
    if !isorun_tensors::json_input::is_onnx_file(path) {
        return Vec::new();
    }
    let mut paths = Vec::new();
    if let Ok(found) = onnxruntime() {
        if let Some(folder) = found.library.parent() {
            paths.push(folder.to_string_lossy().into_owned());
        }
    }
    if let Ok(Ok(files)) = isorun_onnxproto::read_model(path).map(|model| external_data_files(&model)) {
        paths.extend(files.iter().map(|p| p.to_string_lossy().into_owned()));
    }
    paths
}

/// The files an ONNX model keeps its tensors' bytes in, each once, as the
/// file it resolves to, or why the model may not have them read: a file
/// that is missing or is not a regular file (a FIFO, a folder, a device:
/// never opened), a `location` with a hidden component (`.env`,
/// `.ssh/id_rsa`, `.git/config`: the model's folder is often a project's
/// or a home folder, and what a model names as weights comes back as a
/// tensor), or one that resolves outside the model's folder (a link beside
/// the model; the reader already refuses `..` and absolute locations). The
/// sandbox then lets a worker read exactly these files, and journals key
/// on them. Many spellings of one file (`w.bin`, `./w.bin`) are one file.
pub fn external_data_files(model: &isorun_onnxproto::OnnxModel) -> Result<Vec<std::path::PathBuf>, String> {
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    if model.external_data.is_empty() {
        return Ok(files);
    }
    // The location as the file spells it, control characters escaped (a
    // newline in it would forge a line of the message).
    let name = |external: &isorun_onnxproto::ExternalFile| {
        format!("{}: its external data '{}'", model.path.display(), external.location.escape_debug())
    };
    // A path the location made, escaped as the location is.
    let shown = |path: &std::path::Path| path.display().to_string().escape_debug().to_string();
    // A hidden component (`.env`, `.ssh`), in `path` below the model's folder.
    let hidden = |path: &std::path::Path| {
        path.components()
            .any(|c| matches!(c, std::path::Component::Normal(part) if part.as_encoded_bytes().starts_with(b".")))
    };
    let folder = std::fs::canonicalize(model.folder()).map_err(|e| {
        format!("{}: cannot resolve its folder {}: {e}", model.path.display(), model.folder().display())
    })?;
    for external in &model.external_data {
        if hidden(std::path::Path::new(&external.location)) {
            return Err(format!(
                "{} names a hidden file or folder: isorun does not read hidden files as weights",
                name(external)
            ));
        }
        let resolved = match std::fs::canonicalize(&external.path) {
            Ok(resolved) => resolved,
            Err(_) => {
                return Err(format!(
                    "{} is missing (expected at {}; {} tensor(s) keep their bytes there)",
                    name(external),
                    shown(&external.path),
                    external.tensors
                ))
            }
        };
        if !resolved.starts_with(&folder) {
            return Err(format!(
                "{} resolves to {}, outside the model's folder {}: isorun reads external data only beside the model",
                name(external),
                shown(&resolved),
                folder.display()
            ));
        }
        // A link beside the model to a hidden file of its folder is that hidden file.
        if resolved.strip_prefix(&folder).is_ok_and(hidden) {
            return Err(format!(
                "{} resolves to {}, a hidden file or folder: isorun does not read hidden files as weights",
                name(external),
                shown(&resolved)
            ));
        }
        match std::fs::metadata(&resolved) {
            Ok(metadata) if metadata.is_file() => {}
            _ => return Err(format!("{} ({}) is not a regular file", name(external), shown(&resolved))),
        }
        if !files.contains(&resolved) {
            files.push(resolved);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture_copy(dir: &Path) -> std::path::PathBuf {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/external");
        std::fs::copy(fixtures.join("external.onnx"), dir.join("external.onnx")).unwrap();
        dir.join("external.onnx")
    }

    /// Why the model at `path` cannot run: `load_failed`, decided here.
    fn refused(path: &Path) -> ModelError {
        let error = onnx_not_runnable(path).expect("refused before any worker");
        assert_eq!(error.kind, ErrorKind::LoadFailed, "{}", error.message);
        error
    }

    #[test]
    fn external_data_linked_from_outside_the_folder_is_refused_before_any_worker() {
        let tmp = tempfile::tempdir().unwrap();
        let model_dir = tmp.path().join("model");
        std::fs::create_dir(&model_dir).unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, vec![7u8; 4096]).unwrap();
        let path = fixture_copy(&model_dir);
        std::os::unix::fs::symlink(&secret, model_dir.join("weights.bin")).unwrap();
        let error = refused(&path);
        assert!(error.message.contains("outside the model's folder"), "{}", error.message);
        assert!(error.message.contains("secret"), "names where it resolves: {}", error.message);
    }

    #[test]
    fn missing_external_data_is_load_failed_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = fixture_copy(tmp.path());
        let error = refused(&path);
        assert!(error.message.contains("external data 'weights.bin' is missing"), "{}", error.message);
    }

    /// A location with a hidden component (`.env`, `.ssh/...`) is refused
    /// before any worker: what a model names as weights comes back as a
    /// tensor, and a model's folder is often a project's or a home folder.
    #[test]
    fn hidden_external_data_is_refused_before_any_worker() {
        let tmp = tempfile::tempdir().unwrap();
        let path = fixture_copy(tmp.path());
        // The same model with its location renamed `.eights.bin` (same length, so the protobuf stays whole).
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes.windows(11).position(|w| w == b"weights.bin").expect("the location is in the file");
        let mut hidden = bytes.clone();
        hidden[at] = b'.';
        std::fs::write(&path, hidden).unwrap();
        std::fs::write(tmp.path().join(".eights.bin"), vec![0u8; 512]).unwrap();
        let error = refused(&path);
        assert!(error.message.contains("'.eights.bin' names a hidden file"), "{}", error.message);
    }

    /// A plain location that is a link to a hidden file of the model's
    /// folder is refused as the hidden file would be, and a location
    /// holding a newline is escaped in the message, not a second line.
    #[test]
    fn a_link_to_a_hidden_file_and_a_newline_in_a_location_are_refused_as_they_are() {
        let tmp = tempfile::tempdir().unwrap();
        let path = fixture_copy(tmp.path());
        std::fs::write(tmp.path().join(".env"), b"TOKEN=secret").unwrap();
        std::os::unix::fs::symlink(".env", tmp.path().join("weights.bin")).unwrap();
        let error = refused(&path);
        assert!(
            error.message.contains("resolves to") && error.message.contains(".env, a hidden file"),
            "{}",
            error.message
        );
        assert!(onnx_read_paths(&path).iter().all(|p| !p.ends_with(".env")), "never given to a worker");
        // The same model with its location spelled `weights\nbin` (same length).
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes.windows(11).position(|w| w == b"weights.bin").expect("the location is in the file");
        let mut newline = bytes.clone();
        newline[at + 7] = b'\n';
        std::fs::write(&path, newline).unwrap();
        let error = refused(&path);
        assert!(error.message.contains("external data 'weights\\nbin' is missing"), "{}", error.message);
        assert!(!error.message.contains('\n'), "{}", error.message);
    }

    /// External data that exists but is no regular file (a FIFO, which a
    /// reader would wait on forever) is said to be so, not "missing".
    #[test]
    fn external_data_that_is_not_a_regular_file_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let path = fixture_copy(tmp.path());
        let fifo = std::ffi::CString::new(tmp.path().join("weights.bin").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let error = refused(&path);
        assert!(error.message.contains("is not a regular file"), "{}", error.message);
        assert!(onnx_read_paths(&path).iter().all(|p| !p.ends_with("weights.bin")), "never given to a worker");
    }
}
