//! The inputs of a run, prepared once for every worker: large dense tensors
//! are placed in shared memory, which every worker maps instead of copying;
//! JSON inputs wait for each model's signature, which gives their dtypes;
//! `--inputs-dir` adds each model's own files. Where the signature is
//! known, inputs are cast to its dtypes here (`isorun_tensors::cast`), once
//! per input and dtype for every model, and checked against it, so that a
//! mismatch needs no worker.

use crate::discover::Model;
use isorun_protocol::{DType, ErrorKind, ModelError, SignatureInfo, Tensor, TensorData};
use isorun_tensors::cast;
use isorun_tensors::inputs::Inputs;
use isorun_tensors::json_input::{signature_of, tensors_for_signature};
use isorun_transport::{SharedMemory, SHARED_THRESHOLD};
use std::collections::HashMap;

use std::path::PathBuf;
use std::sync::Mutex;

/// One model's inputs, ready for its request: tensors, the regions their
/// `TensorData::Shared` indices name, and the casts made (name, `from→to`).
#[derive(Default)]
pub(crate) struct ModelInputs {
    pub tensors: Vec<(String, Tensor)>,
    pub shared: Vec<SharedMemory>,
    pub casts: Vec<(String, String)>,
}

/// A cast shared input: the tensor, with its own region when large.
type CastResult = Result<(Tensor, Option<SharedMemory>), String>;

/// The inputs, prepared once for every worker: large dense tensors are
/// placed in shared memory, which every worker maps instead of copying.
/// JSON inputs wait for each model's signature, which gives their dtypes.
pub struct PreparedInputs {
    tensors: Vec<(String, Tensor)>,
    json: Vec<(String, serde_json::Value)>,
    pub(crate) shared: Vec<SharedMemory>,
    /// `--inputs-dir`: per-model input files, before the shared ones.
    per_model_dir: Option<PathBuf>,
    /// Shared inputs cast for a signature, by name and dtype: made once for every model.
    casts: Mutex<HashMap<(String, DType), CastResult>>,
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
        PreparedInputs { tensors, json: inputs.json, shared, per_model_dir, casts: Mutex::default() }
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

    /// Whether any input was given at all (`--inputs-dir` counts: its
    /// files are each model's own).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty() && self.json.is_empty() && self.per_model_dir.is_none()
    }

    /// The inputs for one unit: cast and checked against its signature
    /// where this process can read it ([`for_signature`](Self::for_signature));
    /// as given where it cannot (an unusual `saved_model.pb`), for the
    /// worker to decide.
    pub(crate) fn for_unit(&self, model: &Model, settings: &crate::Settings) -> Result<ModelInputs, ModelError> {
        match signature_here(model, settings) {
            Some(info) => self.for_signature(model, &info, settings.strict_dtypes),
            None => Ok(ModelInputs {
                tensors: self.for_model(model, &settings.signature, &settings.tags)?,
                shared: self.shared.clone(),
                casts: Vec::new(),
            }),
        }
    }

    /// The inputs for one model whose signature is known: as
    /// [`for_model`](Self::for_model), each cast to the signature's dtype
    /// where that is allowed (never with `strict`), then checked against
    /// the signature (names, dtypes, shapes), as the worker would.
    pub(crate) fn for_signature(
        &self,
        model: &Model,
        info: &SignatureInfo,
        strict: bool,
    ) -> Result<ModelInputs, ModelError> {
        let mismatch = |message: String| ModelError::new(ErrorKind::InputMismatch, message);
        let (own_tensors, own_json) = self.own_inputs(model)?;
        let own = |name: &str| own_tensors.iter().any(|(n, _)| n == name) || own_json.iter().any(|(n, _)| n == name);
        let mut inputs = ModelInputs { shared: self.shared.clone(), ..ModelInputs::default() };
        for (name, tensor) in self.tensors.iter().filter(|(name, _)| !own(name)) {
            let Some(spec) = info.inputs.iter().find(|s| &s.name == name) else {
                inputs.tensors.push((name.clone(), tensor.clone()));
                continue;
            };
            if spec.dtype == tensor.dtype {
                inputs.tensors.push((name.clone(), tensor.clone()));
                continue;
            }
            if strict {
                return Err(mismatch(strict_refusal(name, spec.dtype, tensor.dtype)));
            }
            let mut cache = self.casts.lock().expect("casts");
            let made = cache.entry((name.clone(), spec.dtype)).or_insert_with(|| {
                let made = cast_tensor(name, tensor, spec.dtype, &self.shared);
                if made.is_ok() {
                    tracing::info!(
                        "input '{name}': cast {} for the signature",
                        cast::describe(tensor.dtype, spec.dtype)
                    );
                }
                made
            });
            let (mut cast, region) = made.clone().map_err(mismatch)?;
            if let Some(region) = region {
                inputs.shared.push(region);
                cast.data = TensorData::Shared(inputs.shared.len() as u32 - 1);
            }
            inputs.casts.push((name.clone(), cast::describe(tensor.dtype, spec.dtype)));
            inputs.tensors.push((name.clone(), cast));
        }
        for (name, tensor) in own_tensors.iter().cloned() {
            match info.inputs.iter().find(|s| s.name == name) {
                Some(spec) if spec.dtype != tensor.dtype => {
                    if strict {
                        return Err(mismatch(strict_refusal(&name, spec.dtype, tensor.dtype)));
                    }
                    let (cast, _) = cast_tensor(&name, &tensor, spec.dtype, &[]).map_err(mismatch)?;
                    tracing::info!(
                        "input '{name}' of {}: cast {} for the signature",
                        model.id,
                        cast::describe(tensor.dtype, spec.dtype)
                    );
                    inputs.casts.push((name.clone(), cast::describe(tensor.dtype, spec.dtype)));
                    inputs.tensors.push((name, cast));
                }
                _ => inputs.tensors.push((name, tensor)),
            }
        }
        let json: Vec<(String, serde_json::Value)> =
            self.json.iter().filter(|(name, _)| !own(name)).cloned().chain(own_json.iter().cloned()).collect();
        if !json.is_empty() {
            inputs.tensors.extend(tensors_for_signature(info, &json)?);
        }
        isorun_protocol::matching::match_inputs(info, &inputs.tensors)?;
        Ok(inputs)
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

/// Why `--strict-dtypes` refuses an input whose dtype is not the signature's.
fn strict_refusal(name: &str, wanted: DType, given: DType) -> String {
    format!(
        "input '{name}': expected dtype {wanted}, given {given} (--strict-dtypes: no casts){}",
        cast::hint(name, wanted)
    )
}

/// `tensor` as `wanted`: in memory when it is small, into a new sealed
/// region when it lives in one (read and converted a chunk at a time, so
/// that neither the user's file nor this process's memory holds a copy).
fn cast_tensor(name: &str, tensor: &Tensor, wanted: DType, shared: &[SharedMemory]) -> CastResult {
    cast::allowed(name, tensor.dtype, wanted)?;
    let given = tensor.dtype;
    let size = given.element_size().unwrap_or(1);
    let convert_all = |bytes: &[u8]| {
        let mut out = Vec::with_capacity(bytes.len() / size * wanted.element_size().unwrap_or(1));
        cast::convert(name, given, wanted, bytes, 0, &mut out).map(|()| out)
    };
    match &tensor.data {
        TensorData::Dense(bytes) => Ok((Tensor::dense(wanted, tensor.shape.clone(), convert_all(bytes)?), None)),
        TensorData::Shared(index) => {
            let source = &shared[*index as usize];
            #[derive(Debug)]
            enum Failed {
                Io(std::io::Error),
                Value(String),
            }
            impl From<std::io::Error> for Failed {
                fn from(e: std::io::Error) -> Failed {
                    Failed::Io(e)
                }
            }
            let made = SharedMemory::from_writes(|out| {
                let (mut carry, mut done, mut failed) = (Vec::new(), 0u64, None::<Failed>);
                let mut converted = Vec::new();
                source.read_chunks(|chunk| {
                    if failed.is_some() {
                        return;
                    }
                    carry.extend_from_slice(chunk);
                    let whole = carry.len() / size * size;
                    converted.clear();
                    if let Err(message) = cast::convert(name, given, wanted, &carry[..whole], done, &mut converted) {
                        failed = Some(Failed::Value(message));
                        return;
                    }
                    if let Err(e) = out.write_all(&converted) {
                        failed = Some(Failed::Io(e));
                        return;
                    }
                    done += (whole / size) as u64;
                    carry.drain(..whole);
                })?;
                failed.map_or(Ok(()), Err)
            });
            match made {
                Ok(region) => {
                    let tensor = Tensor { dtype: wanted, shape: tensor.shape.clone(), data: TensorData::Shared(0) };
                    Ok((tensor, Some(region)))
                }
                Err(Failed::Value(message)) => Err(message),
                Err(Failed::Io(e)) => Err(format!("input '{name}': cannot cast to {wanted}: {e}")),
            }
        }
        TensorData::Strings(_) => Err(format!("input '{name}': expected dtype {wanted}, given {given}")),
    }
}

/// The units whose inputs do not fit their signature, decided before any
/// worker starts: each one's `input_mismatch` report (no worker, its wall
/// time the check's), or its `signature_not_found` when the model has no
/// signature of that key (`run --signature classify` on models without
/// one: a worker would load each model only to say so). Only SavedModels
/// whose `saved_model.pb` this process can read are checked; Keras files
/// (whose SavedModel is made during the run) and unreadable signatures are
/// left to the worker, as are units whose inputs fit (their casts are made
/// here once, for the run to reuse).
pub(crate) fn decide_early(
    models: &[Model],
    inputs: &PreparedInputs,
    settings: &crate::Settings,
) -> Vec<Option<crate::UnitReport>> {
    models
        .iter()
        .enumerate()
        .map(|(index, model)| {
            if !matches!(model.format, crate::discover::ModelFormat::SavedModel | crate::discover::ModelFormat::Onnx) {
                return None;
            }
            let began = std::time::Instant::now();
            let error = match signature_or_missing(model, settings) {
                Ok(info) => inputs.for_signature(model, &info?, settings.strict_dtypes).err()?,
                Err(missing) => missing,
            };
            let mut report = crate::UnitReport::new(index, isorun_protocol::Outcome::Error(error));
            report.wall = began.elapsed();
            Some(report)
        })
        .collect()
}

/// A `saved_model.pb` larger than this (a graph with its weights frozen in)
/// is not parsed in the supervisor for its signature alone: its worker
/// checks the inputs, as it always did (JSON inputs still need it read).
const SIGNATURE_READ_LIMIT: u64 = 64 << 20;

/// The signature `settings` name, read without TensorFlow where that is
/// cheap and possible; `None` leaves the inputs to the worker (an unusual
/// or very large `saved_model.pb`, a missing signature: the worker says).
pub fn signature_here(model: &Model, settings: &crate::Settings) -> Option<SignatureInfo> {
    signature_or_missing(model, settings).ok().flatten()
}

/// As [`signature_here`], with a signature the model does not have as the
/// error: `signature_not_found`, naming the signatures it has, as its
/// worker would say after loading it. Every other failure to read is
/// `Ok(None)`, left to the worker (which loads with TensorFlow and says
/// what is wrong in its words).
fn signature_or_missing(model: &Model, settings: &crate::Settings) -> Result<Option<SignatureInfo>, ModelError> {
    if model.format == crate::discover::ModelFormat::Onnx {
        // Read without ONNX Runtime, however large (its weights are skipped,
        // never read); a file that cannot run is `onnx::decide`'s.
        return Ok(signature_of(&model.path, &settings.tags, &settings.signature).ok());
    }
    let Ok(metadata) = std::fs::metadata(model.path.join("saved_model.pb")) else { return Ok(None) };
    if metadata.len() > SIGNATURE_READ_LIMIT {
        return Ok(None);
    }
    match signature_of(&model.path, &settings.tags, &settings.signature) {
        Ok(info) => Ok(Some(info)),
        Err(error) if error.kind == ErrorKind::SignatureNotFound => Err(error),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::TensorSpec;
    use std::os::fd::AsRawFd;

    fn signature(dtype: DType) -> SignatureInfo {
        SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![TensorSpec { name: "x".into(), dtype, shape: Some(vec![None, Some(4)]) }],
            outputs: vec![],
        }
    }

    fn prepared(rows: usize) -> PreparedInputs {
        let bytes: Vec<u8> = (0..rows * 4).flat_map(|i| (i as f64).to_le_bytes()).collect();
        let tensor = Tensor::dense(DType::Float64, vec![rows as u64, 4], bytes);
        PreparedInputs::new(Inputs { tensors: vec![("x".into(), tensor)], ..Inputs::default() }, None)
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn a_large_input_is_cast_once_into_a_region_of_its_own_for_every_model() {
        // 4096 × 4 float64 = 128 KiB: in shared memory.
        let inputs = prepared(4096);
        let model = Model::saved_model("m", "/nonexistent");
        let first = inputs.for_signature(&model, &signature(DType::Float32), false).unwrap();
        assert_eq!(first.casts, [("x".to_string(), "float64→float32".to_string())]);
        let TensorData::Shared(index) = first.tensors[0].1.data else { panic!("not in shared memory") };
        assert_eq!(index as usize, inputs.shared.len(), "a new region after the inputs' own");
        let region = &first.shared[index as usize];
        assert_eq!(region.len(), 4096 * 4 * 4);
        assert_eq!(floats(&region[..16]), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(floats(&region[region.len() - 4..]), [16383.0]);
        let again = inputs.for_signature(&model, &signature(DType::Float32), false).unwrap();
        assert_eq!(again.shared[index as usize].fd().as_raw_fd(), region.fd().as_raw_fd(), "made once");
        assert_eq!(inputs.casts.lock().unwrap().len(), 1);
    }

    #[test]
    fn strict_refuses_and_a_matching_dtype_is_no_cast() {
        let inputs = prepared(2);
        let model = Model::saved_model("m", "/nonexistent");
        let err = inputs.for_signature(&model, &signature(DType::Float32), true).err().unwrap();
        assert_eq!(err.kind, ErrorKind::InputMismatch);
        assert!(err.message.contains("--strict-dtypes"), "{}", err.message);
        let same = inputs.for_signature(&model, &signature(DType::Float64), true).unwrap();
        assert!(same.casts.is_empty());
        let TensorData::Dense(bytes) = &same.tensors[0].1.data else { panic!("small inputs stay in the message") };
        assert_eq!(bytes.len(), 2 * 4 * 8);
    }
}
