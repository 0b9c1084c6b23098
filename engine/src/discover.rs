//! Finding models: each MODEL argument is a SavedModel folder (it holds
//! `saved_model.pb`), a Keras model file (`.keras`, or a full-model
//! `.h5`/`.hdf5`), an ONNX file (`.onnx`; the external-data files beside it
//! are its own, never models), or a folder searched recursively for them (a
//! weights-only HDF5 file, such as a `.weights.h5`, is skipped there). A
//! file's id keeps its extension, so `m.keras`, `m.h5` and `m.onnx` do not
//! collide. Ids are
//! paths relative to the argument they were found under, so they stay the
//! same on every machine and make good keys for outputs and reports. In
//! TensorFlow Serving's layout (`mymodel/1`, `mymodel/2`) a version's id
//! keeps its model's name whichever folder was the argument, so versions of
//! two models never share an id.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A model to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Its path relative to the folder argument it was found under, or the
    /// folder's (file's) own name when the argument is the model itself.
    pub id: String,
    /// Absolute path of the SavedModel folder or the Keras file.
    pub path: PathBuf,
    /// What the path holds; Keras files are exported to SavedModels before a worker runs them.
    pub format: ModelFormat,
}

impl Model {
    /// A SavedModel folder.
    pub fn saved_model(id: impl Into<String>, path: impl Into<PathBuf>) -> Model {
        Model { id: id.into(), path: path.into(), format: ModelFormat::SavedModel }
    }
}

/// The file formats isorun reads models from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelFormat {
    /// A TensorFlow SavedModel folder.
    SavedModel,
    /// A Keras 3 `.keras` archive.
    Keras,
    /// A full-model HDF5 file (`model.save("m.h5")`, Keras 3 or Keras 2).
    H5,
    /// An ONNX model file (`.onnx`), its external data beside it. Listed and
    /// inspected; no worker runs one yet (issue 41): a run ends its unit
    /// with `load_failed` before any worker starts.
    Onnx,
}

impl ModelFormat {
    /// The name in records and listings: `saved_model`, `keras`, `h5`, `onnx`.
    pub fn name(self) -> &'static str {
        match self {
            ModelFormat::SavedModel => "saved_model",
            ModelFormat::Keras => "keras",
            ModelFormat::H5 => "h5",
            ModelFormat::Onnx => "onnx",
        }
    }

    /// True for Keras files, which are exported before they run.
    pub fn is_keras_file(self) -> bool {
        matches!(self, ModelFormat::Keras | ModelFormat::H5)
    }
}

/// The model format a file's name says, if any: `.keras`, `.h5`/`.hdf5`
/// (which may still hold weights only), `.onnx`.
fn keras_file_format(path: &Path) -> Option<ModelFormat> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".onnx") {
        Some(ModelFormat::Onnx)
    } else if name.ends_with(".keras") {
        Some(ModelFormat::Keras)
    } else if name.ends_with(".h5") || name.ends_with(".hdf5") {
        Some(ModelFormat::H5)
    } else {
        None
    }
}

/// Whether a model-named file is a model: `.keras` and `.onnx` always (a
/// broken one is that model's error later), `.h5` when it holds a `model_config`.
fn keras_model_file(path: &Path) -> Result<Option<ModelFormat>, DiscoverError> {
    match keras_file_format(path) {
        Some(ModelFormat::H5) => {
            let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
            if name.ends_with(".weights.h5") {
                return Err(DiscoverError::WeightsOnly(path.to_path_buf()));
            }
            match crate::keras::files::h5_is_full_model(path) {
                Ok(true) => Ok(Some(ModelFormat::H5)),
                Ok(false) => Err(DiscoverError::WeightsOnly(path.to_path_buf())),
                Err(crate::keras::files::KerasFileError::NotHdf5 { .. }) => {
                    Err(DiscoverError::NotHdf5(path.to_path_buf()))
                }
                Err(e) => {
                    Err(DiscoverError::Io { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })
                }
            }
        }
        other => Ok(other),
    }
}

/// Why the models could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("{0}: no such file or directory")]
    Missing(PathBuf),
    #[error(
        "{0}: not a model (a MODEL is a SavedModel folder, a .keras, full-model .h5 or .onnx file, or a folder holding them)"
    )]
    NotAFolder(PathBuf),
    #[error("{0}: holds weights only (no model_config); a model needs its architecture too: save it with model.save(\"model.keras\"), or load the weights into the model in Python and save that")]
    WeightsOnly(PathBuf),
    #[error("{0}: not an HDF5 file (no HDF5 signature)")]
    NotHdf5(PathBuf),
    #[error("{0}: no model found (no SavedModel folder, .keras, full-model .h5 or .onnx file under it){1}")]
    NoneFound(PathBuf, SkippedFiles),
    #[error("{0}: a SavedModel is the folder that holds saved_model.pb: give the folder, {1}")]
    SavedModelFile(PathBuf, PathBuf),
    #[error("two models have the id '{id}': {first} and {second}")]
    DuplicateId { id: String, first: PathBuf, second: PathBuf },
    #[error("{path}: cannot read")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The weights-only files a search skipped, named in its `no model found`.
#[derive(Debug, Default)]
pub struct SkippedFiles(pub Vec<PathBuf>);

impl std::fmt::Display for SkippedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(first) = self.0.first() else { return Ok(()) };
        write!(f, "; skipped {} (weights only: a model needs its architecture too", first.display())?;
        if self.0.len() > 1 {
            write!(f, ", and {} more like it", self.0.len() - 1)?;
        }
        write!(f, "; save it with model.save(\"model.keras\"))")
    }
}

/// True if `dir` is a SavedModel folder.
pub fn is_saved_model(dir: &Path) -> bool {
    dir.join("saved_model.pb").is_file() || dir.join("saved_model.pbtxt").is_file()
}

/// A SavedModel folder whose graph carries its weights as constants: a
/// `saved_model.pb` and no checkpoint (`variables/variables.index`), as a
/// frozen Keras export (#25) or a TF1 frozen graph is written. Only the
/// files' presence is looked at.
pub fn is_frozen_graph(dir: &Path) -> bool {
    dir.join("saved_model.pb").is_file() && !dir.join("variables").join("variables.index").exists()
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
        let root = std::path::absolute(arg).map_err(|e| DiscoverError::Io { path: arg.clone(), source: e })?;
        let mut found = Vec::new();
        if !meta.is_dir() {
            let name = root.file_name().unwrap_or_default();
            if name == "saved_model.pb" || name == "saved_model.pbtxt" {
                let folder = arg.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                return Err(DiscoverError::SavedModelFile(arg.clone(), folder.to_path_buf()));
            }
            let Some(format) = keras_model_file(&root)? else {
                return Err(DiscoverError::NotAFolder(arg.clone()));
            };
            let id = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
            found.push(Model { id, path: root, format });
        } else if is_saved_model(&root) {
            found.push(Model::saved_model(own_name(&root), root));
        } else {
            // A folder below the argument that cannot be read is skipped with
            // a warning; the argument itself is an error, not "no model found".
            if let Err(source) = std::fs::read_dir(&root) {
                return Err(DiscoverError::Io { path: arg.clone(), source });
            }
            let mut visited = HashSet::new();
            let mut skipped = SkippedFiles::default();
            walk(&root, &root, &mut visited, &mut found, &mut skipped, warn);
            if found.is_empty() {
                for path in &mut skipped.0 {
                    *path = arg.join(path.strip_prefix(&root).unwrap_or(path));
                }
                return Err(DiscoverError::NoneFound(arg.clone(), skipped));
            }
            found.sort_by(|a, b| a.path.as_os_str().as_encoded_bytes().cmp(b.path.as_os_str().as_encoded_bytes()));
            name_versions_after_their_model(&root, &mut found);
        }
        for model in found {
            if let Some(other) = models.iter().find(|m| m.id == model.id) {
                // The same model reached twice (`serving/mymodel serving/`) is one model.
                if same_file(&other.path, &model.path) {
                    continue;
                }
                return Err(DiscoverError::DuplicateId { id: model.id, first: other.path.clone(), second: model.path });
            }
            models.push(model);
        }
    }
    Ok(models)
}

/// Whether two paths name one file or folder.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => a == b,
    }
}

/// The id of a SavedModel given directly: the folder's own name, or
/// `model/version` for a version folder of TensorFlow Serving's layout
/// (`serving/mymodel/2` is `mymodel/2`), so versions of different models
/// do not share an id.
fn own_name(dir: &Path) -> String {
    let canonical = dir.canonicalize().ok();
    let name = canonical.as_deref().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
    let Some(name) = name else { return "model".into() };
    if !is_version(&name) {
        return name;
    }
    match canonical.as_deref().and_then(Path::parent).and_then(Path::file_name) {
        Some(model) => format!("{}/{name}", model.to_string_lossy()),
        None => name,
    }
}

/// With a model folder of TensorFlow Serving's layout as the argument
/// (`serving/mymodel` holding `1/`, `2/`), the ids found are bare version
/// numbers; they get the model folder's name in front (`mymodel/1`), as
/// they would have with `serving/` as the argument.
fn name_versions_after_their_model(root: &Path, found: &mut [Model]) {
    let canonical = root.canonicalize().ok();
    let Some(model) = canonical.as_deref().and_then(Path::file_name) else { return };
    let model = model.to_string_lossy();
    for found in found.iter_mut().filter(|m| is_version(&m.id)) {
        found.id = format!("{model}/{}", found.id);
    }
}

/// A TensorFlow Serving version folder name: all ASCII digits.
fn is_version(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

/// For models in TensorFlow Serving's layout (ids that differ only in a final
/// all-digits component: `mymodel/1`, `mymodel/2`, `mymodel/10`), only the
/// highest version of each, by numeric value; other models are kept as they
/// are, and the order is unchanged.
pub fn latest_versions(models: Vec<Model>) -> Vec<Model> {
    let mut latest: HashMap<String, usize> = HashMap::new();
    for (index, model) in models.iter().enumerate() {
        let Some((group, version)) = split_version(&model.id) else { continue };
        let newer = match latest.get(group) {
            Some(&best) => split_version(&models[best].id).is_some_and(|(_, best)| newer_version(version, best)),
            None => true,
        };
        if newer {
            latest.insert(group.to_string(), index);
        }
    }
    models
        .into_iter()
        .enumerate()
        .filter(|(index, model)| match split_version(&model.id) {
            Some((group, _)) => latest.get(group) == Some(index),
            None => true,
        })
        .map(|(_, model)| model)
        .collect()
}

/// `mymodel/10` is `("mymodel", "10")`, `7` is `("", "7")`; `None` when the
/// last component is not a version number.
fn split_version(id: &str) -> Option<(&str, &str)> {
    let (group, version) = id.rsplit_once('/').unwrap_or(("", id));
    is_version(version).then_some((group, version))
}

/// Numeric comparison of digit strings of any length (`10` > `9`, `010` = `10`).
fn newer_version(candidate: &str, best: &str) -> bool {
    let candidate = candidate.trim_start_matches('0');
    let best = best.trim_start_matches('0');
    (candidate.len(), candidate) > (best.len(), best)
}

fn walk(
    root: &Path,
    dir: &Path,
    visited: &mut HashSet<(u64, u64)>,
    found: &mut Vec<Model>,
    skipped: &mut SkippedFiles,
    warn: &mut dyn FnMut(String),
) {
    // Symbolic links are followed, but a folder is entered once: no loops.
    let Ok(meta) = std::fs::metadata(dir) else { return };
    if !visited.insert((meta.dev(), meta.ino())) {
        return;
    }
    if dir != root && is_saved_model(dir) {
        let id = dir.strip_prefix(root).unwrap_or(dir).to_string_lossy().into_owned();
        found.push(Model::saved_model(id, dir));
        return; // never descend into a SavedModel's variables/ or assets/
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            warn(format!("{}: skipped, cannot read the folder ({e})", dir.display()));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    children.sort();
    for child in children {
        if child.is_dir() {
            walk(root, &child, visited, found, skipped, warn);
            continue;
        }
        // Keras and ONNX files beside the folders; weights-only HDF5 files
        // are not models, nor are ONNX external-data files (not `.onnx`).
        match keras_model_file(&child) {
            Ok(Some(format)) => {
                let id = child.strip_prefix(root).unwrap_or(&child).to_string_lossy().into_owned();
                found.push(Model { id, path: child, format });
            }
            Ok(None) => {}
            Err(DiscoverError::WeightsOnly(path)) => skipped.0.push(path),
            Err(e) => warn(format!("skipped: {e}")),
        }
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
    fn a_frozen_graph_is_a_saved_model_pb_without_a_checkpoint_index_and_only_presence_counts() {
        let tmp = tempfile::tempdir().unwrap();
        // A name with control characters and a newline: only paths are looked at.
        let frozen = tmp.path().join("frozen\n\u{1b}[31m");
        touch_model(&frozen);
        assert!(is_frozen_graph(&frozen));
        // A checkpoint, even an empty one (its size is not read), makes it not frozen.
        let with_variables = tmp.path().join("variables");
        touch_model(&with_variables);
        std::fs::write(with_variables.join("variables/variables.index"), b"").unwrap();
        assert!(!is_frozen_graph(&with_variables));
        // A symlinked index counts where it leads; a dangling one is no checkpoint.
        let linked = tmp.path().join("linked");
        touch_model(&linked);
        std::os::unix::fs::symlink(
            with_variables.join("variables/variables.index"),
            linked.join("variables/variables.index"),
        )
        .unwrap();
        assert!(!is_frozen_graph(&linked));
        let dangling = tmp.path().join("dangling");
        touch_model(&dangling);
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), dangling.join("variables/variables.index")).unwrap();
        assert!(is_frozen_graph(&dangling));
        // A saved_model.pb that is a folder or a dangling link is no graph at all.
        let odd = tmp.path().join("odd");
        std::fs::create_dir_all(odd.join("saved_model.pb")).unwrap();
        assert!(!is_frozen_graph(&odd));
        let gone = tmp.path().join("gone");
        std::fs::create_dir_all(&gone).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), gone.join("saved_model.pb")).unwrap();
        assert!(!is_frozen_graph(&gone));
    }

    #[test]
    fn keras_files_keep_their_extension_and_weights_are_not_models() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        touch_model(&root.join("m"));
        std::fs::write(root.join("m.keras"), b"PK").unwrap();
        std::fs::write(root.join("m.h5"), b"\x89HDF\r\n\x1a\n attrs: model_config").unwrap();
        std::fs::write(root.join("m.weights.h5"), b"\x89HDF\r\n\x1a\n model_config").unwrap();
        std::fs::write(root.join("w.h5"), b"\x89HDF\r\n\x1a\n layer_names").unwrap();
        std::fs::write(root.join("notes.txt"), b"").unwrap();
        let models = discover(&[root.to_path_buf()], &mut |w| panic!("{w}")).unwrap();
        let found: Vec<(&str, &str)> = models.iter().map(|m| (m.id.as_str(), m.format.name())).collect();
        assert_eq!(found, [("m", "saved_model"), ("m.h5", "h5"), ("m.keras", "keras")]);
        for weights in ["m.weights.h5", "w.h5"] {
            let err = discover(&[root.join(weights)], &mut |_| {}).unwrap_err();
            assert!(matches!(err, DiscoverError::WeightsOnly(_)), "{err}");
            assert!(err.to_string().contains("holds weights only"), "{err}");
        }
        let err = discover(&[root.join("notes.txt")], &mut |_| {}).unwrap_err();
        assert!(matches!(err, DiscoverError::NotAFolder(_)), "{err}");
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

    fn ids(models: &[Model]) -> Vec<&str> {
        models.iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn serving_layout_ids_carry_the_model_name() {
        let tmp = tempfile::tempdir().unwrap();
        let serving = tmp.path().join("serving");
        for version in ["1", "2", "10"] {
            touch_model(&serving.join("mymodel").join(version));
        }
        let from_root = discover(std::slice::from_ref(&serving), &mut |w| panic!("{w}")).unwrap();
        assert_eq!(ids(&from_root), ["mymodel/1", "mymodel/10", "mymodel/2"]);
        let from_model = discover(&[serving.join("mymodel")], &mut |w| panic!("{w}")).unwrap();
        assert_eq!(from_model, from_root);
        // Only bare version numbers get the name in front.
        touch_model(&serving.join("mymodel/draft"));
        let mixed = discover(&[serving.join("mymodel")], &mut |w| panic!("{w}")).unwrap();
        assert_eq!(ids(&mixed), ["mymodel/1", "mymodel/10", "mymodel/2", "draft"]);
        let one_version = discover(&[serving.join("mymodel/2")], &mut |w| panic!("{w}")).unwrap();
        assert_eq!(ids(&one_version), ["mymodel/2"]);
    }

    #[test]
    fn the_same_model_reached_twice_is_one_model() {
        let tmp = tempfile::tempdir().unwrap();
        let serving = tmp.path().join("serving");
        touch_model(&serving.join("mymodel/1"));
        touch_model(&serving.join("mymodel/2"));
        let models = discover(&[serving.join("mymodel"), serving.clone()], &mut |w| panic!("{w}")).unwrap();
        assert_eq!(ids(&models), ["mymodel/1", "mymodel/2"]);
        // Two different folders with one id are still refused.
        touch_model(&tmp.path().join("other/mymodel/1"));
        let err = discover(&[serving.clone(), tmp.path().join("other")], &mut |_| {}).unwrap_err();
        assert!(matches!(err, DiscoverError::DuplicateId { .. }), "{err}");
    }

    #[test]
    fn no_model_found_names_the_weights_file_it_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("x.weights.h5"), b"\x89HDF\r\n\x1a\n").unwrap();
        let err = discover(&[tmp.path().to_path_buf()], &mut |_| {}).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no model found") && text.contains("skipped") && text.contains("x.weights.h5"), "{text}");
        let empty = tempfile::tempdir().unwrap();
        let text = discover(&[empty.path().to_path_buf()], &mut |_| {}).unwrap_err().to_string();
        assert!(!text.contains("skipped"), "{text}");
    }

    #[test]
    fn a_saved_model_pb_given_as_the_model_suggests_its_folder() {
        let tmp = tempfile::tempdir().unwrap();
        touch_model(&tmp.path().join("m"));
        let err = discover(&[tmp.path().join("m/saved_model.pb")], &mut |_| {}).unwrap_err();
        let text = err.to_string();
        assert!(text.ends_with(&format!("give the folder, {}", tmp.path().join("m").display())), "{text}");
    }

    #[test]
    fn versions_of_two_models_given_directly_do_not_clash() {
        let tmp = tempfile::tempdir().unwrap();
        touch_model(&tmp.path().join("a/1"));
        touch_model(&tmp.path().join("b/1"));
        let models = discover(&[tmp.path().join("a"), tmp.path().join("b")], &mut |w| panic!("{w}")).unwrap();
        assert_eq!(ids(&models), ["a/1", "b/1"]);
    }

    fn model(id: &str) -> Model {
        Model::saved_model(id, PathBuf::from("/models").join(id))
    }

    #[test]
    fn latest_versions_compare_numbers_not_strings() {
        let models = ["alpha", "m/1", "m/10", "m/2", "m/9", "n/3", "other/v1", "x/007", "x/7", "z/0"].map(model);
        let latest = latest_versions(models.to_vec());
        assert_eq!(ids(&latest), ["alpha", "m/10", "n/3", "other/v1", "x/007", "z/0"]);
    }

    #[test]
    fn latest_versions_group_by_everything_before_the_version() {
        let models = ["a/b/1", "a/b/2", "a/c/3", "b/2", "1", "4"].map(model);
        let latest = latest_versions(models.to_vec());
        assert_eq!(ids(&latest), ["a/b/2", "a/c/3", "b/2", "4"]);
        assert!(latest_versions(Vec::new()).is_empty());
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
        assert!(err
            .to_string()
            .ends_with("empty: no model found (no SavedModel folder, .keras, full-model .h5 or .onnx file under it)"));
        let err = discover(&[tmp.path().join("nope")], &mut |_| {}).unwrap_err();
        assert!(err.to_string().ends_with("nope: no such file or directory"));
    }
}
