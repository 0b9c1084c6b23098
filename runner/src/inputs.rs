//! The inputs given on the command line (`--input NAME=PATH`, `--inputs
//! FILE.npz`), read once before any work starts: a bad file is a usage
//! error (exit 2) naming it, not a failure of every model.

use crate::npy::{read_npy_file, read_npz_file, NpyError};
use isorun_protocol::Tensor;
use std::path::{Path, PathBuf};

/// Why the inputs could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--input {0:?}: expected NAME=PATH")]
    Syntax(String),
    #[error("input '{name}' is given twice ({first} and {second})")]
    Duplicate { name: String, first: String, second: String },
    #[error("{path}: unsupported input file (expected .npy for --input, .npz for --inputs)")]
    Extension { path: PathBuf },
    #[error(transparent)]
    Npy(#[from] NpyError),
}

/// Named input tensors, in the order given.
pub fn load_inputs(pairs: &[String], npz_files: &[PathBuf]) -> Result<Vec<(String, Tensor)>, InputError> {
    let mut inputs: Vec<(String, Tensor, String)> = Vec::new();
    let mut add = |name: String, tensor: Tensor, source: String| {
        if let Some((_, _, first)) = inputs.iter().find(|(n, _, _)| *n == name) {
            return Err(InputError::Duplicate { name, first: first.clone(), second: source });
        }
        inputs.push((name, tensor, source));
        Ok(())
    };
    for file in npz_files {
        if !has_extension(file, "npz") {
            return Err(InputError::Extension { path: file.clone() });
        }
        for (name, tensor) in read_npz_file(file)? {
            let source = file.display().to_string();
            add(name, tensor, source)?;
        }
    }
    for pair in pairs {
        let (name, path) = pair
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| InputError::Syntax(pair.clone()))?;
        let path = Path::new(path);
        if !has_extension(path, "npy") {
            return Err(InputError::Extension { path: path.to_path_buf() });
        }
        add(name.to_string(), read_npy_file(path)?, path.display().to_string())?;
    }
    Ok(inputs.into_iter().map(|(n, t, _)| (n, t)).collect())
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}
