//! The inputs given on the command line, read once before any work starts:
//! a bad file is a usage error (exit 2) naming it, not a failure of every
//! model. `.npy` and `.npz` become tensors at once (a large `.npy` straight
//! into the shared region every worker maps, never through this process's
//! memory); JSON (files, stdin, inline `@JSON`) waits for each model's
//! signature, which gives its dtypes.

use crate::npy::{read_npy_file_shared, read_npz_file_shared, NpyError};
use isorun_protocol::{Tensor, TensorData};
use isorun_transport::{SharedMemory, SHARED_THRESHOLD};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Why the inputs could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--input {0:?}: expected NAME=PATH (.npy or .json) or NAME=@JSON")]
    Syntax(String),
    #[error("input '{name}' is given twice ({first} and {second})")]
    Duplicate { name: String, first: String, second: String },
    #[error("{path}: unsupported input file (expected .npy or .json for --input, .npz or .json or - for --inputs)")]
    Extension { path: PathBuf },
    #[error("--input {name}={json}: inline JSON needs an @ before it: --input '{name}=@{json}'")]
    InlineWithoutAt { name: String, json: String },
    #[error("{source_name}: not valid JSON: {reason}")]
    Json { source_name: String, reason: String },
    #[error("{source_name}: {reason}; give large inputs as .npy")]
    JsonCost { source_name: String, reason: String },
    #[error("{source_name}: expected an object of input name to nested lists, or one nested list")]
    JsonShape { source_name: String },
    #[error("{path}: cannot read")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Npy(#[from] NpyError),
}

/// Named inputs: tensors, and JSON values still to convert. The JSON name
/// `""` is a bare nested list for a one-input signature.
#[derive(Debug, Default)]
pub struct Inputs {
    pub tensors: Vec<(String, Tensor)>,
    pub json: Vec<(String, Value)>,
    /// Regions of the large `.npy` inputs read straight into shared
    /// memory, which their tensors name as `TensorData::Shared(index)`.
    pub shared: Vec<SharedMemory>,
}

/// Reads `--inputs` files (or `-` for stdin) and `--input NAME=...` pairs.
pub fn load_inputs(pairs: &[String], files: &[PathBuf]) -> Result<Inputs, InputError> {
    let mut inputs = Inputs::default();
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut claim = |name: &str, source: String| {
        if let Some((_, first)) = sources.iter().find(|(n, _)| n == name) {
            return Err(InputError::Duplicate { name: name.to_string(), first: first.clone(), second: source });
        }
        sources.push((name.to_string(), source));
        Ok(())
    };
    for file in files {
        let source = file.display().to_string();
        if file.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| InputError::Read { path: file.clone(), source })?;
            for (name, value) in json_inputs(&text, "stdin")? {
                claim(&name, "stdin".into())?;
                inputs.json.push((name, value));
            }
        } else if has_extension(file, "npz") {
            for (name, mut tensor, region) in read_npz_file_shared(file, SHARED_THRESHOLD as u64)? {
                if let Some(region) = region {
                    inputs.shared.push(region);
                    tensor.data = TensorData::Shared(inputs.shared.len() as u32 - 1);
                }
                claim(&name, source.clone())?;
                inputs.tensors.push((name, tensor));
            }
        } else if has_extension(file, "json") {
            let text = read_text(file)?;
            for (name, value) in json_inputs(&text, &source)? {
                claim(&name, source.clone())?;
                inputs.json.push((name, value));
            }
        } else {
            return Err(InputError::Extension { path: file.clone() });
        }
    }
    for pair in pairs {
        let (name, what) = pair
            .split_once('=')
            .filter(|(n, w)| !n.is_empty() && !w.is_empty())
            .ok_or_else(|| InputError::Syntax(pair.clone()))?;
        if let Some(inline) = what.strip_prefix('@') {
            let source = format!("--input {name}=@...");
            let value = parse_json(inline, &source)?;
            claim(name, source)?;
            inputs.json.push((name.to_string(), value));
            continue;
        }
        let path = Path::new(what);
        let source = path.display().to_string();
        if has_extension(path, "npy") {
            let (mut tensor, region) = read_npy_file_shared(path, SHARED_THRESHOLD as u64)?;
            if let Some(region) = region {
                inputs.shared.push(region);
                tensor.data = TensorData::Shared(inputs.shared.len() as u32 - 1);
            }
            claim(name, source)?;
            inputs.tensors.push((name.to_string(), tensor));
        } else if has_extension(path, "json") {
            let value = parse_json(&read_text(path)?, &source)?;
            claim(name, source)?;
            inputs.json.push((name.to_string(), value));
        } else if looks_like_json(what) && !path.exists() {
            return Err(InputError::InlineWithoutAt { name: name.to_string(), json: what.to_string() });
        } else {
            return Err(InputError::Extension { path: path.to_path_buf() });
        }
    }
    Ok(inputs)
}

/// Whether an `--input` value is JSON given without its `@` (`x=[[1, 2]]`).
fn looks_like_json(what: &str) -> bool {
    let what = what.trim_start();
    what.starts_with('[') || what.starts_with('{') || serde_json::from_str::<f64>(what).is_ok()
}

fn read_text(path: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(path).map_err(|source| InputError::Read { path: path.to_path_buf(), source })
}

fn parse_json(text: &str, source: &str) -> Result<Value, InputError> {
    crate::json_cost::check_json_cost(text.as_bytes())
        .map_err(|reason| InputError::JsonCost { source_name: source.to_string(), reason })?;
    serde_json::from_str(text).map_err(|e| InputError::Json { source_name: source.to_string(), reason: e.to_string() })
}

/// An object of input name to nested lists, or one bare nested list (name `""`).
fn json_inputs(text: &str, source: &str) -> Result<Vec<(String, Value)>, InputError> {
    match parse_json(text, source)? {
        Value::Object(map) => Ok(map.into_iter().collect()),
        list @ Value::Array(_) => Ok(vec![(String::new(), list)]),
        _ => Err(InputError::JsonShape { source_name: source.to_string() }),
    }
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}
