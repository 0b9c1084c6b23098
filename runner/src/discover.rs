//! Finding SavedModels: each MODEL argument is a SavedModel folder (it holds
//! `saved_model.pb`) or a folder searched recursively for them. Ids are
//! paths relative to the argument they were found under, so they stay the
//! same on every machine and make good keys for outputs and reports.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A SavedModel to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Its path relative to the folder argument it was found under, or the
    /// folder's own name when the argument is the SavedModel itself.
    pub id: String,
    /// Absolute path of the SavedModel folder.
    pub path: PathBuf,
}

/// Why the models could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("{0}: no such file or directory")]
    Missing(PathBuf),
    #[error("{0}: not a folder (a MODEL is a SavedModel folder or a folder holding SavedModels)")]
    NotAFolder(PathBuf),
    #[error("{0}: no SavedModel found (no folder under it holds saved_model.pb)")]
    NoneFound(PathBuf),
    #[error("two models have the id '{id}': {first} and {second}")]
    DuplicateId { id: String, first: PathBuf, second: PathBuf },
    #[error("{path}: cannot read")]
    Io { path: PathBuf, source: std::io::Error },
}

/// True if `dir` is a SavedModel folder.
pub fn is_saved_model(dir: &Path) -> bool {
    dir.join("saved_model.pb").is_file() || dir.join("saved_model.pbtxt").is_file()
}

/// Every SavedModel under the arguments, sorted bytewise by path within
/// each argument, arguments in the order given. Unreadable folders below an
/// argument are reported through `warn` and skipped.
pub fn discover(args: &[PathBuf], warn: &mut dyn FnMut(String)) -> Result<Vec<Model>, DiscoverError> {
    let mut models: Vec<Model> = Vec::new();
    for arg in args {
        let meta = std::fs::metadata(arg).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DiscoverError::Missing(arg.clone()),
            _ => DiscoverError::Io { path: arg.clone(), source: e },
        })?;
        if !meta.is_dir() {
            return Err(DiscoverError::NotAFolder(arg.clone()));
        }
        let root = std::path::absolute(arg).map_err(|e| DiscoverError::Io { path: arg.clone(), source: e })?;
        let mut found = Vec::new();
        if is_saved_model(&root) {
            let name = root
                .canonicalize()
                .ok()
                .and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "model".into());
            found.push(Model { id: name, path: root });
        } else {
            let mut visited = HashSet::new();
            walk(&root, &root, &mut visited, &mut found, warn);
            if found.is_empty() {
                return Err(DiscoverError::NoneFound(arg.clone()));
            }
            found.sort_by(|a, b| a.path.as_os_str().as_encoded_bytes().cmp(b.path.as_os_str().as_encoded_bytes()));
        }
        for model in found {
            if let Some(other) = models.iter().find(|m| m.id == model.id) {
                return Err(DiscoverError::DuplicateId { id: model.id, first: other.path.clone(), second: model.path });
            }
            models.push(model);
        }
    }
    Ok(models)
}

fn walk(
    root: &Path,
    dir: &Path,
    visited: &mut HashSet<(u64, u64)>,
    found: &mut Vec<Model>,
    warn: &mut dyn FnMut(String),
) {
    // Symbolic links are followed, but a folder is entered once: no loops.
    let Ok(meta) = std::fs::metadata(dir) else { return };
    if !visited.insert((meta.dev(), meta.ino())) {
        return;
    }
    if dir != root && is_saved_model(dir) {
        let id = dir.strip_prefix(root).unwrap_or(dir).to_string_lossy().into_owned();
        found.push(Model { id, path: dir.to_path_buf() });
        return; // never descend into a SavedModel's variables/ or assets/
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            warn(format!("{}: skipped, cannot read the folder ({e})", dir.display()));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    children.sort();
    for child in children {
        walk(root, &child, visited, found, warn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch_model(dir: &Path) {
        std::fs::create_dir_all(dir.join("variables")).unwrap();
        std::fs::write(dir.join("saved_model.pb"), b"").unwrap();
    }

    #[test]
    fn finds_nested_models_with_relative_ids_and_no_loops() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        touch_model(&root.join("b/model"));
        touch_model(&root.join("a"));
        // A SavedModel inside another's variables/ is not a separate model.
        touch_model(&root.join("a/variables/inner"));
        std::os::unix::fs::symlink(root, root.join("b/loop")).unwrap();
        let models = discover(&[root.to_path_buf()], &mut |w| panic!("{w}")).unwrap();
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "b/model"]);
        let direct = discover(&[root.join("b/model")], &mut |_| {}).unwrap();
        assert_eq!(direct[0].id, "model");
    }

    #[test]
    fn duplicate_ids_and_empty_folders_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        touch_model(&tmp.path().join("x/m"));
        touch_model(&tmp.path().join("y/m"));
        std::fs::create_dir_all(tmp.path().join("empty")).unwrap();
        let err = discover(&[tmp.path().join("x/m"), tmp.path().join("y/m")], &mut |_| {}).unwrap_err();
        assert!(matches!(err, DiscoverError::DuplicateId { ref id, .. } if id == "m"), "{err}");
        let err = discover(&[tmp.path().join("empty")], &mut |_| {}).unwrap_err();
        assert!(err.to_string().ends_with("empty: no SavedModel found (no folder under it holds saved_model.pb)"));
        let err = discover(&[tmp.path().join("nope")], &mut |_| {}).unwrap_err();
        assert!(err.to_string().ends_with("nope: no such file or directory"));
    }
}
