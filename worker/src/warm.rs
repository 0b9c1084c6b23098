//! A spare's warm-up. TensorFlow's per-process first use (op and kernel
//! registries, the session's process-wide thread pools, the SavedModel
//! loader and function runtime, Grappler, oneDNN's set-up) costs a fresh
//! worker more than loading and running a small model does, and none of it
//! can be done in the zygote, which must stay single-threaded to fork. A
//! spare, forked before it is needed, pays it instead while another unit
//! runs: it confines itself with its unit's sandbox, loads and runs the
//! built-in warm-up model (`worker/warmup/model`, made by
//! `scripts/make-fixtures --warmup-only`: a small Keras export with the
//! common kernels) with the unit's session options, drops it, and waits for
//! the unit. Measured in one process: a 40-model zoo MLP loads and runs in
//! ~60 ms after the warm-up and ~155 ms without it.

use crate::tf::SavedModel;
use isorun_protocol::{SessionConfig, SignatureInfo, Tensor};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The warm-up SavedModel's files, embedded so that a worker needs nothing
/// beside itself.
const FILES: &[(&str, &[u8])] = &[
    ("saved_model.pb", include_bytes!("../warmup/model/saved_model.pb")),
    ("fingerprint.pb", include_bytes!("../warmup/model/fingerprint.pb")),
    ("variables/variables.index", include_bytes!("../warmup/model/variables/variables.index")),
    (
        "variables/variables.data-00000-of-00001",
        include_bytes!("../warmup/model/variables/variables.data-00000-of-00001"),
    ),
];

/// Rows given to the warm-up model's unknown dimensions.
const ROWS: u64 = 8;

/// Writes the warm-up model into a new folder of its own (`spare-PID`)
/// under `warm_dir`, before the sandbox forbids writing; its path.
pub fn write_model(warm_dir: &str) -> io::Result<PathBuf> {
    let dir = Path::new(warm_dir).join(format!("spare-{}", std::process::id()));
    fs::DirBuilder::new().mode(0o700).create(&dir)?;
    fs::create_dir(dir.join("variables"))?;
    fs::create_dir(dir.join("assets"))?;
    for (name, bytes) in FILES {
        fs::write(dir.join(name), bytes)?;
    }
    Ok(dir)
}

/// Loads the warm-up model in `dir` with `config` (GPUs hidden with
/// `cpu_only`), runs its `serving_default` once on zeros and drops it.
pub fn warm_up(dir: &Path, config: &SessionConfig, cpu_only: bool) -> Result<(), String> {
    let config_bytes = match cpu_only {
        true => isorun_tfproto::cpu_only_config_proto(config),
        false => isorun_tfproto::session_config_proto(config),
    };
    let model = SavedModel::load_with_config(dir, &["serve".to_string()], &config_bytes).map_err(|e| e.to_string())?;
    let (info, _) = model.signature("serving_default").map_err(|e| e.to_string())?;
    let inputs = zero_inputs(&info, ROWS);
    let with_bytes = with_dense_bytes(&inputs);
    model.run("serving_default", &with_bytes).map(drop).map_err(|e| e.to_string())
}

/// Zeros for every input of a signature, unknown dimensions given `rows`
/// (strings as empty strings).
pub fn zero_inputs(info: &SignatureInfo, rows: u64) -> Vec<Tensor> {
    info.inputs
        .iter()
        .map(|spec| {
            let shape: Vec<u64> = spec.shape.clone().unwrap_or_default().iter().map(|d| d.unwrap_or(rows)).collect();
            let count = Tensor::element_count(&shape).unwrap_or(0) as usize;
            match spec.dtype.element_size() {
                Some(size) => Tensor::dense(spec.dtype, shape, vec![0; count * size]),
                None => Tensor::strings(shape, vec![Vec::new(); count]),
            }
        })
        .collect()
}

/// Each tensor with its dense bytes, as `SavedModel::run` takes them
/// (`None` for strings, which carry their own).
pub fn with_dense_bytes(tensors: &[Tensor]) -> Vec<(&Tensor, Option<&[u8]>)> {
    tensors
        .iter()
        .map(|t| match &t.data {
            isorun_protocol::TensorData::Dense(bytes) => (t, Some(&bytes[..])),
            _ => (t, None),
        })
        .collect()
}
