//! The inputs of a run, prepared once for every worker: large dense tensors
//! are placed in shared memory, which every worker maps instead of copying;
//! JSON inputs wait for each model's signature, which gives their dtypes;
//! `--inputs-dir` adds each model's own files.

use crate::discover::Model;
use isorun_protocol::{ErrorKind, ModelError, Tensor, TensorData};
use isorun_tensors::inputs::Inputs;
use isorun_tensors::json_input::{signature_of, tensors_for_signature};
use isorun_transport::{SharedMemory, SHARED_THRESHOLD};
use std::path::PathBuf;

/// The inputs, prepared once for every worker: large dense tensors are
/// placed in shared memory, which every worker maps instead of copying.
/// JSON inputs wait for each model's signature, which gives their dtypes.
pub struct PreparedInputs {
    tensors: Vec<(String, Tensor)>,
    json: Vec<(String, serde_json::Value)>,
    pub(crate) shared: Vec<SharedMemory>,
    /// `--inputs-dir`: per-model input files, before the shared ones.
    per_model_dir: Option<PathBuf>,
}

/// Moves the large dense tensors into sealed shared memory (appended to
/// `shared`, which their data then names), which workers map instead of
/// reading them through the socket; where no memfd can be made, a tensor
/// stays where it is and is copied to each worker instead.
pub(crate) fn place_shared(tensors: Vec<(String, Tensor)>, shared: &mut Vec<SharedMemory>) -> Vec<(String, Tensor)> {
    tensors
        .into_iter()
        .map(|(name, mut tensor)| {
            if let TensorData::Dense(bytes) = &tensor.data {
                if let Some(region) =
                    (bytes.len() >= SHARED_THRESHOLD).then(|| SharedMemory::from_bytes(bytes).ok()).flatten()
                {
                    shared.push(region);
                    tensor.data = TensorData::Shared(shared.len() as u32 - 1);
                }
            }
            (name, tensor)
        })
        .collect()
}

impl PreparedInputs {
    pub fn new(inputs: Inputs, per_model_dir: Option<PathBuf>) -> PreparedInputs {
        // Regions already made from large `.npy` files come first; their tensors name them.
        let mut shared = inputs.shared;
        let tensors = place_shared(inputs.tensors, &mut shared);
        PreparedInputs { tensors, json: inputs.json, shared, per_model_dir }
    }

    /// A digest of the shared inputs, for journal keys.
    pub fn digest(&self) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for (name, tensor) in &self.tensors {
            hasher.update(name.as_bytes());
            hasher.update([0]);
            hasher.update(tensor.dtype.name().as_bytes());
            hasher.update(format!("{:?}", tensor.shape).as_bytes());
            match &tensor.data {
                TensorData::Dense(bytes) => hasher.update(bytes),
                // Read through the region's descriptor: hashing a large input
                // must not make it resident in the supervisor.
                TensorData::Shared(i) => {
                    if self.shared[*i as usize].read_chunks(|chunk| hasher.update(chunk)).is_err() {
                        hasher.update(&self.shared[*i as usize][..]);
                    }
                }
                TensorData::Strings(strings) => {
                    for s in strings {
                        hasher.update((s.len() as u64).to_le_bytes());
                        hasher.update(s);
                    }
                }
            }
        }
        for (name, value) in &self.json {
            hasher.update(name.as_bytes());
            hasher.update([0]);
            hasher.update(value.to_string().as_bytes());
        }
        hasher.finalize().to_vec()
    }

    /// The inputs for one model: its own files from `--inputs-dir` first,
    /// then the shared ones; JSON converted for its signature.
    pub(crate) fn for_model(
        &self,
        model: &Model,
        signature: &str,
        tags: &[String],
    ) -> Result<Vec<(String, Tensor)>, ModelError> {
        let (own_tensors, own_json) = self.own_inputs(model)?;
        let own = |name: &str| own_tensors.iter().any(|(n, _)| n == name) || own_json.iter().any(|(n, _)| n == name);
        let mut tensors: Vec<(String, Tensor)> = self.tensors.iter().filter(|(name, _)| !own(name)).cloned().collect();
        tensors.extend(own_tensors.iter().cloned());
        let json: Vec<(String, serde_json::Value)> =
            self.json.iter().filter(|(name, _)| !own(name)).cloned().chain(own_json.iter().cloned()).collect();
        if !json.is_empty() {
            let info = signature_of(&model.path, tags, signature)?;
            tensors.extend(tensors_for_signature(&info, &json)?);
        }
        Ok(tensors)
    }

    /// `DIR/<model id>/<input name>.npy` (or `.json`) files, if any.
    #[expect(clippy::type_complexity, reason = "a pair of named lists, used once")]
    fn own_inputs(
        &self,
        model: &Model,
    ) -> Result<(Vec<(String, Tensor)>, Vec<(String, serde_json::Value)>), ModelError> {
        let (mut tensors, mut json) = (Vec::new(), Vec::new());
        let Some(dir) = &self.per_model_dir else { return Ok((tensors, json)) };
        let folder = dir.join(&model.id);
        let Ok(entries) = std::fs::read_dir(&folder) else { return Ok((tensors, json)) };
        let bad = |message: String| ModelError::new(ErrorKind::InputMismatch, message);
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let (Some(stem), Some(ext)) = (path.file_stem(), path.extension()) else { continue };
            let name = stem.to_string_lossy().into_owned();
            match ext.to_string_lossy().as_ref() {
                "npy" => {
                    tensors.push((name, isorun_tensors::npy::read_npy_file(&path).map_err(|e| bad(e.to_string()))?))
                }
                "json" => {
                    let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
                    let value = serde_json::from_str(&text)
                        .map_err(|e| bad(format!("{}: not valid JSON: {e}", path.display())))?;
                    json.push((name, value));
                }
                _ => {}
            }
        }
        Ok((tensors, json))
    }
}
