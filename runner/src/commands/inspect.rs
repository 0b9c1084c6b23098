//! `isorun inspect`: what a SavedModel offers (meta graphs, signatures, the
//! dtype and shape of every input and output), read from `saved_model.pb`
//! with `isorun-tfproto`, so it works where libtensorflow is not installed
//! and shows dtypes isorun cannot carry under TensorFlow's own names and
//! TF1 reference dtypes with `_ref` (`float32_ref`, which `run` carries as
//! `float32`). An `.onnx` file shows its graph's inputs and outputs
//! (symbolic dimensions by name), opsets, producer and external data, read
//! with `isorun-onnxproto` without ONNX Runtime.

use crate::cli::InspectArgs;
use crate::error::CliError;
use isorun_engine::keras::files::{self, KerasFileError, KerasInfo};
use isorun_engine::ModelFormat;
use isorun_onnxproto::{Dim, OnnxModel, ValueInfo};
use isorun_report::text::one_line;
use isorun_tfproto::proto::{MetaGraphDef, SignatureDef, TensorInfo};
use isorun_tfproto::{read_saved_model, SavedModelError};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a model could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{0}: no such file or directory")]
    Missing(PathBuf),
    #[error("{0}: not a folder (MODEL is a SavedModel folder, the one holding saved_model.pb)")]
    NotAFolder(PathBuf),
    #[error("{0}: a SavedModel is the folder that holds saved_model.pb: give the folder, {1}")]
    SavedModelFile(PathBuf, PathBuf),
    #[error("{0}: not a SavedModel (no saved_model.pb in it; `isorun ls` finds SavedModels under a folder)")]
    NoSavedModel(PathBuf),
    #[error(
        "{0}: saved_model.pbtxt (text format) is not supported; isorun reads the binary saved_model.pb \
         (load and save the model again with tf.saved_model.save to get one)"
    )]
    TextFormat(PathBuf),
    #[error("{0}: empty file, not a SavedModel protobuf")]
    Empty(PathBuf),
    #[error("{path}: cannot read")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    SavedModel(#[from] SavedModelError),
}

/// A SavedModel as shown: its meta graphs in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// Absolute path of the SavedModel folder.
    pub path: PathBuf,
    pub meta_graphs: Vec<MetaGraphView>,
}

/// One meta graph: its tag set and its signatures, sorted by key.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaGraphView {
    pub tags: Vec<String>,
    pub signatures: Vec<SignatureView>,
}

/// One signature: inputs and outputs sorted by name, and TensorFlow's method
/// name (`tensorflow/serving/predict`; empty when the model saved none).
#[derive(Debug, Clone, PartialEq)]
pub struct SignatureView {
    pub key: String,
    pub method: String,
    pub inputs: Vec<TensorView>,
    pub outputs: Vec<TensorView>,
}

/// One input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorView {
    pub name: String,
    /// TensorFlow's name of the dtype, also for those isorun cannot carry (`resource`).
    pub dtype: String,
    /// `None`: unknown rank; a `None` dimension: unknown size.
    pub shape: Option<Vec<Option<u64>>>,
}

pub fn main(args: &InspectArgs) -> Result<i32, CliError> {
    let keras = keras_file(&args.model).map_err(|e| crate::support::with_causes(&e))?;
    let text = if is_onnx_file(&args.model) {
        let model = isorun_onnxproto::read_model(&args.model).map_err(|e| crate::support::with_causes(&e))?;
        onnx_text(&model, args.json)
    } else if let Some((format, info)) = keras {
        keras_text(&args.model, format, &info, args.json)
    } else {
        saved_model_text(args)?
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(isorun_protocol::exit_code::OK),
        // Nobody reads any more (`isorun inspect ... | head -3`): not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(isorun_protocol::exit_code::OK),
        Err(e) => Err(format!("cannot write to stdout: {e}").into()),
    }
}

/// A Keras file's config (`.keras`: `config.json` and `metadata.json` in
/// the zip; `.h5`: the `model_config` attribute), read without Python;
/// `None` for anything else.
fn keras_file(model: &Path) -> Result<Option<(ModelFormat, KerasInfo)>, KerasFileError> {
    if model.is_dir() {
        return Ok(None);
    }
    let name = model.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if name.ends_with(".keras") {
        return Ok(Some((ModelFormat::Keras, files::read_keras(model)?)));
    }
    if name.ends_with(".h5") || name.ends_with(".hdf5") {
        return Ok(Some((ModelFormat::H5, files::read_h5(model)?)));
    }
    Ok(None)
}

/// What `inspect` says of a Keras file: its inputs as the exported
/// signature will take them, its outputs by name (shapes come with the export).
fn keras_text(path: &Path, format: ModelFormat, info: &KerasInfo, json: bool) -> String {
    let shape = |s: &Option<Vec<Option<u64>>>| -> Value { s.as_ref().map_or(Value::Null, |dims| json!(dims)) };
    if json {
        let inputs: Map<String, Value> = info
            .inputs
            .iter()
            .map(|t| (t.name.clone(), json!({"dtype": t.dtype.map(|d| d.name()), "shape": shape(&t.shape)})))
            .collect();
        let line = json!({
            "path": std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).to_string_lossy(),
            "format": format.name(),
            "class_name": info.class_name,
            "keras_version": info.keras_version,
            "inputs": inputs,
            "outputs": info.outputs,
        });
        return format!("{line}\n");
    }
    let mut text = format!(
        "{} ({} file, {}, saved by Keras {})\n  inputs:\n",
        one_line(&path.to_string_lossy()),
        format.name(),
        if info.class_name.is_empty() { "model".into() } else { one_line(&info.class_name) },
        one_line(info.keras_version.as_deref().unwrap_or("?"))
    );
    for t in &info.inputs {
        let dims = match &t.shape {
            Some(dims) => {
                format!(
                    "[{}]",
                    dims.iter().map(|d| d.map_or("?".into(), |d| d.to_string())).collect::<Vec<_>>().join(", ")
                )
            }
            None => "unknown rank".into(),
        };
        text.push_str(&format!("    {}: {} {dims}\n", one_line(&t.name), t.dtype.map_or("?", |d| d.name())));
    }
    text.push_str("  outputs:\n");
    for name in &info.outputs {
        text.push_str(&format!("    {}\n", one_line(name)));
    }
    text
}

/// An `.onnx` file (not a folder named so; a missing one is said as for any MODEL).
fn is_onnx_file(model: &Path) -> bool {
    let name = model.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    name.ends_with(".onnx") && model.is_file()
}

/// What `inspect` says of an ONNX model: its graph's inputs (initializers
/// left out) and outputs in graph order, with symbolic dimensions by name,
/// its opsets, producer and external-data files.
fn onnx_text(model: &OnnxModel, json: bool) -> String {
    let path = std::path::absolute(&model.path).unwrap_or_else(|_| model.path.clone());
    if json {
        let values = |values: &[ValueInfo]| -> Value {
            values
                .iter()
                .map(|v| {
                    let shape = v.value_type.dims().map(|dims| {
                        dims.iter()
                            .map(|d| match d {
                                Dim::Fixed(size) => json!(size),
                                Dim::Symbolic(name) => json!(name),
                                Dim::Unknown => Value::Null,
                            })
                            .collect::<Vec<_>>()
                    });
                    let dtype = v.value_type.tensor_elem().and_then(|e| e.dtype()).map(|d| d.name());
                    json!({"name": v.name, "type": v.value_type.kind_name(), "dtype": dtype, "shape": shape})
                })
                .collect()
        };
        let opsets: Vec<Value> =
            model.opsets.iter().map(|o| json!({"domain": o.domain_name(), "version": o.version})).collect();
        let external: Vec<Value> = model
            .external_data
            .iter()
            .map(|f| {
                let resolved = path.parent().map_or_else(|| f.path.clone(), |folder| folder.join(&f.location));
                json!({"location": f.location, "path": resolved.to_string_lossy(), "tensors": f.tensors,
                    "present": f.path.is_file()})
            })
            .collect();
        let line = json!({
            "path": path.to_string_lossy(),
            "format": ModelFormat::Onnx.name(),
            "ir_version": model.ir_version,
            "producer_name": model.producer_name,
            "producer_version": model.producer_version,
            "graph_name": model.graph_name,
            "opsets": opsets,
            "inputs": values(&model.inputs),
            "outputs": values(&model.outputs),
            "external_data": external,
        });
        return format!("{line}\n");
    }
    let producer = match (model.producer_name.as_str(), model.producer_version.as_str()) {
        ("", _) => "an unnamed producer".to_string(),
        (name, "") => one_line(name).into_owned(),
        (name, version) => format!("{} {}", one_line(name), one_line(version)),
    };
    let mut text = format!(
        "{} (onnx file, IR version {}, made by {producer})\n  opsets: {}\n  inputs:\n",
        one_line(&path.to_string_lossy()),
        model.ir_version,
        model
            .opsets
            .iter()
            .map(|o| format!("{} {}", one_line(o.domain_name()), o.version))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for input in &model.inputs {
        text.push_str(&format!("    {}: {}\n", one_line(&input.name), one_line(&input.value_type.to_string())));
    }
    if model.initializer_inputs > 0 {
        text.push_str(&format!("    ({} initializers listed as inputs are left out)\n", model.initializer_inputs));
    }
    text.push_str("  outputs:\n");
    for output in &model.outputs {
        text.push_str(&format!("    {}: {}\n", one_line(&output.name), one_line(&output.value_type.to_string())));
    }
    if !model.external_data.is_empty() {
        text.push_str("  external data:\n");
        for file in &model.external_data {
            let tensors = if file.tensors == 1 { "1 tensor".to_string() } else { format!("{} tensors", file.tensors) };
            let missing = if file.path.is_file() { "" } else { ", missing" };
            text.push_str(&format!("    {} ({tensors}{missing})\n", one_line(&file.location)));
        }
    }
    text
}

fn saved_model_text(args: &InspectArgs) -> Result<String, String> {
    let inspection = inspect(&args.model, args.all).map_err(|e| crate::support::with_causes(&e))?;
    Ok(if args.json {
        let mut line = to_json(&inspection, &args.tags).to_string();
        line.push('\n');
        line
    } else {
        to_text(&inspection)
    })
}

/// Reads the SavedModel in `model`; internal signatures only when `include_internal`.
pub fn inspect(model: &Path, include_internal: bool) -> Result<Inspection, InspectError> {
    check_folder(model)?;
    let path = std::path::absolute(model).map_err(|source| InspectError::Io { path: model.to_path_buf(), source })?;
    let meta_graphs = read_saved_model(model)?
        .into_iter()
        .map(|graph| MetaGraphView { signatures: signature_views(&graph.def, include_internal), tags: graph.tags })
        .collect();
    Ok(Inspection { path, meta_graphs })
}

/// The checks that name what is wrong better than a failed read would.
fn check_folder(model: &Path) -> Result<(), InspectError> {
    let meta = std::fs::metadata(model).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => InspectError::Missing(model.to_path_buf()),
        _ => InspectError::Io { path: model.to_path_buf(), source },
    })?;
    if !meta.is_dir() {
        if model.file_name().is_some_and(|n| n == "saved_model.pb" || n == "saved_model.pbtxt") {
            let folder = model.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            return Err(InspectError::SavedModelFile(model.to_path_buf(), folder.to_path_buf()));
        }
        return Err(InspectError::NotAFolder(model.to_path_buf()));
    }
    let protobuf = model.join("saved_model.pb");
    match std::fs::metadata(&protobuf) {
        Ok(meta) if meta.len() == 0 => Err(InspectError::Empty(protobuf)),
        Ok(_) => Ok(()),
        Err(_) if model.join("saved_model.pbtxt").is_file() => Err(InspectError::TextFormat(model.to_path_buf())),
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            Err(InspectError::NoSavedModel(model.to_path_buf()))
        }
        Err(source) => Err(InspectError::Io { path: protobuf, source }),
    }
}

fn signature_views(def: &MetaGraphDef, include_internal: bool) -> Vec<SignatureView> {
    def.signature_keys(include_internal).into_iter().map(|key| signature_view(key, &def.signature_def[key])).collect()
}

fn signature_view(key: &str, signature: &SignatureDef) -> SignatureView {
    SignatureView {
        key: key.to_string(),
        method: signature.method_name.clone(),
        inputs: tensor_views(&signature.inputs),
        outputs: tensor_views(&signature.outputs),
    }
}

fn tensor_views(tensors: &HashMap<String, TensorInfo>) -> Vec<TensorView> {
    let mut views: Vec<TensorView> = tensors
        .iter()
        .map(|(name, info)| TensorView { name: name.clone(), dtype: info.dtype_name(), shape: info.dims() })
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

/// One JSON object: every meta graph, and as top-level `signatures` those of
/// the meta graph whose tag set is `tags` (left out when there is none).
pub fn to_json(inspection: &Inspection, tags: &[String]) -> Value {
    let mut object = Map::new();
    object.insert("path".into(), json!(inspection.path.to_string_lossy()));
    let meta_graphs: Vec<Value> = inspection
        .meta_graphs
        .iter()
        .map(|graph| json!({"tags": graph.tags, "signatures": signatures_json(&graph.signatures)}))
        .collect();
    object.insert("meta_graphs".into(), Value::Array(meta_graphs));
    if let Some(graph) = chosen_meta_graph(inspection, tags) {
        object.insert("signatures".into(), signatures_json(&graph.signatures));
    }
    Value::Object(object)
}

/// The meta graph whose tag set equals `tags` (order ignored), the one
/// `isorun run --tag` would load.
fn chosen_meta_graph<'a>(inspection: &'a Inspection, tags: &[String]) -> Option<&'a MetaGraphView> {
    let wanted = sorted(tags);
    inspection.meta_graphs.iter().find(|graph| sorted(&graph.tags) == wanted)
}

/// A tag set as TensorFlow compares them: order and repeats do not count.
fn sorted(tags: &[String]) -> Vec<&str> {
    let mut tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    tags.sort_unstable();
    tags.dedup();
    tags
}

fn signatures_json(signatures: &[SignatureView]) -> Value {
    let mut object = Map::new();
    for signature in signatures {
        let mut entry = Map::new();
        entry.insert("inputs".into(), tensors_json(&signature.inputs));
        entry.insert("outputs".into(), tensors_json(&signature.outputs));
        if !signature.method.is_empty() {
            entry.insert("method".into(), json!(signature.method));
        }
        object.insert(signature.key.clone(), Value::Object(entry));
    }
    Value::Object(object)
}

fn tensors_json(tensors: &[TensorView]) -> Value {
    let mut object = Map::new();
    for tensor in tensors {
        let shape = match &tensor.shape {
            None => Value::Null,
            // An unknown size is `null`, as for Keras files (`keras_text`); TensorFlow's -1 is not JSON's word for it.
            Some(dims) => dims.iter().map(|dim| dim.map_or(Value::Null, |size| json!(size))).collect(),
        };
        object.insert(tensor.name.clone(), json!({"dtype": tensor.dtype, "shape": shape}));
    }
    Value::Object(object)
}

/// The text form: the path, then each meta graph with its signatures, each
/// input and output on a line with names and dtypes in aligned columns.
pub fn to_text(inspection: &Inspection) -> String {
    let mut text = format!("{}\n", one_line(&inspection.path.to_string_lossy()));
    for graph in &inspection.meta_graphs {
        let tags: Vec<_> = graph.tags.iter().map(|tag| one_line(tag)).collect();
        text.push_str(&format!("meta graph [{}]\n", tags.join(", ")));
        if graph.signatures.is_empty() {
            text.push_str("  no signatures\n");
        }
        for signature in &graph.signatures {
            text.push_str(&signature_text(signature));
        }
    }
    text
}

fn signature_text(signature: &SignatureView) -> String {
    let mut text = match signature.method.as_str() {
        "" => format!("  signature {}\n", one_line(&signature.key)),
        method => format!("  signature {} ({})\n", one_line(&signature.key), one_line(method)),
    };
    text.push_str(&tensors_text("inputs", &signature.inputs));
    text.push_str(&tensors_text("outputs", &signature.outputs));
    text
}

fn tensors_text(heading: &str, tensors: &[TensorView]) -> String {
    if tensors.is_empty() {
        return format!("    {heading}: none\n");
    }
    let shown: Vec<_> = tensors.iter().map(|t| (one_line(&t.name), one_line(&t.dtype), &t.shape)).collect();
    let name_width = shown.iter().map(|(name, _, _)| name.chars().count()).max().unwrap_or(0);
    let dtype_width = shown.iter().map(|(_, dtype, _)| dtype.chars().count()).max().unwrap_or(0);
    let mut text = format!("    {heading}:\n");
    for (name, dtype, shape) in &shown {
        text.push_str(&format!("      {name:name_width$}  {dtype:dtype_width$}  {}\n", shape_text(shape)));
    }
    text
}

/// `[?, 8]`, `[]` for a scalar, `<unknown rank>`.
pub fn shape_text(shape: &Option<Vec<Option<u64>>>) -> String {
    match shape {
        None => "<unknown rank>".to_string(),
        Some(dims) => {
            let dims: Vec<String> =
                dims.iter().map(|dim| dim.map_or("?".to_string(), |size| size.to_string())).collect();
            format!("[{}]", dims.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, dtype: &str, shape: Option<Vec<Option<u64>>>) -> TensorView {
        TensorView { name: name.into(), dtype: dtype.into(), shape }
    }

    fn inspection() -> Inspection {
        let signature = |key: &str, method: &str| SignatureView {
            key: key.into(),
            method: method.into(),
            inputs: vec![tensor("images", "uint8", Some(vec![None, Some(224), Some(224), Some(3)]))],
            outputs: vec![tensor("h", "resource", None), tensor("logits", "float32", Some(vec![]))],
        };
        Inspection {
            path: PathBuf::from("/models/m"),
            meta_graphs: vec![
                MetaGraphView { tags: vec!["serve".into()], signatures: vec![signature("cpu", "predict")] },
                MetaGraphView { tags: vec!["serve".into(), "gpu".into()], signatures: vec![signature("gpu", "")] },
            ],
        }
    }

    #[test]
    fn shapes_show_unknown_sizes_and_ranks() {
        assert_eq!(shape_text(&Some(vec![None, Some(8)])), "[?, 8]");
        assert_eq!(shape_text(&Some(vec![])), "[]");
        assert_eq!(shape_text(&None), "<unknown rank>");
    }

    #[test]
    fn text_aligns_names_and_dtypes_within_each_list() {
        let text = to_text(&inspection());
        assert!(
            text.starts_with(
                "/models/m\nmeta graph [serve]\n  signature cpu (predict)\n    inputs:\n      images  uint8  [?, 224, 224, 3]\n    \
                 outputs:\n      h       resource  <unknown rank>\n      logits  float32   []\nmeta graph [serve, gpu]\n  \
                 signature gpu\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn json_top_level_signatures_follow_the_tag_set_in_any_order() {
        let tags = |tags: &[&str]| tags.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        let json = to_json(&inspection(), &tags(&["gpu", "serve", "gpu"]));
        assert_eq!(json["signatures"], json["meta_graphs"][1]["signatures"]);
        assert_eq!(json["signatures"]["gpu"]["outputs"]["h"], json!({"dtype": "resource", "shape": null}));
        assert_eq!(json["signatures"]["gpu"]["inputs"]["images"]["shape"], json!([null, 224, 224, 3]));
        assert!(json["signatures"]["gpu"].get("method").is_none());
        assert_eq!(to_json(&inspection(), &tags(&["serve"]))["signatures"]["cpu"]["method"], "predict");
        assert!(to_json(&inspection(), &tags(&["gpu"])).get("signatures").is_none());
    }

    #[test]
    fn names_from_the_model_cannot_forge_lines_or_escape_sequences() {
        let mut inspection = inspection();
        inspection.path = PathBuf::from("/models/m\x1b]0;title\x07");
        let signature = &mut inspection.meta_graphs[0].signatures[0];
        signature.key = "cpu\n  signature forged".into();
        signature.method = "\r\x1b[2K".into();
        signature.inputs[0].name = "images\u{9b}31m".into();
        signature.outputs[0].dtype = "a\tb".into();
        inspection.meta_graphs[0].tags = vec!["serve\x1b[8m".into()];
        let text = to_text(&inspection);
        let bad: Vec<char> = text.chars().filter(|c| c.is_control() && *c != '\n').collect();
        assert!(bad.is_empty(), "{bad:?} in {text}");
        assert!(text.contains("  signature cpu\\n  signature forged (\\r\\x1b[2K)\n"), "{text}");
        assert!(!text.contains("\n  signature forged"), "{text}");
    }
}
