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
//!
//! Better still, where the supervisor allows it (see `Preload`), a spare
//! loads its unit's own model as its warm-up ([`preload`]) and holds it:
//! the first use is paid by a load the unit needs anyway, not by a second
//! model (the built-in one costs ~25 ms of its own, its first use ~95 ms;
//! a zoo MLP loaded first ~70 ms), and the unit's path is its run alone.
//! Nothing of the model is *run* ahead: a run on made-up inputs could
//! change a stateful model's answer. oneDNN's JIT of its matrix-product
//! kernels, which any model's first run pays once per process (~30 ms
//! here), the zygote makes before it forks (`onednn.rs`); where it could
//! not (another libtensorflow), the spare pays it on a graph of its own
//! ([`gemm`]), which takes a zoo MLP's first run from ~40 ms to ~14 ms.

use crate::tf::{load_libraries, SavedModel};
use isorun_protocol::{ModelError, Preload, Preloaded, SessionConfig, SignatureInfo, Tensor};
use std::collections::HashSet;
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

/// Loads a spare's unit's model as its `Run` would (its libraries first,
/// noted in `libraries` so that the `Run` does not load them again), with
/// the time it took.
pub fn preload(preload: &Preload, libraries: &mut HashSet<String>) -> Result<(SavedModel, Preloaded), ModelError> {
    let started = std::time::Instant::now();
    load_libraries(&preload.libraries, libraries)?;
    let model = SavedModel::load(Path::new(&preload.model_dir), &preload.tags, &preload.config)?;
    Ok((model, Preloaded { load_ms: started.elapsed().as_millis() as u64, onnx: None }))
}

/// Runs `relu(x · w + b)` on a graph of the worker's own once, with the
/// unit's session options (`tf::warm_gemm`).
pub fn gemm(config: &SessionConfig) -> Result<(), String> {
    crate::tf::warm_gemm(&isorun_tfproto::session_config_proto(config))
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
