//! What the eval tests build again and again: a model's signature (its
//! inputs and outputs), the scores signature of the scikit-learn reference
//! cases, a dataset spec with every option at its default, and the numbers
//! of a reference file. Held once here so that a change to `SignatureInfo`
//! or `DataSpec` is one edit, not one per test file. The allocation-bound
//! binary (`tests/bounds/`) includes this file too.

use isorun_eval::DataSpec;
use isorun_protocol::{DType, SignatureInfo, TensorSpec};
use serde_json::Value;
use std::path::PathBuf;

/// A tensor of the signature: its name, dtype and shape (`None` a
/// dimension of any size).
pub fn tensor(name: &str, dtype: DType, shape: &[Option<u64>]) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: Some(shape.to_vec()) }
}

/// The `serving_default` signature with these inputs and outputs.
pub fn signature(inputs: Vec<TensorSpec>, outputs: Vec<TensorSpec>) -> SignatureInfo {
    SignatureInfo { key: "serving_default".into(), inputs, outputs }
}

/// A model with one float64 output `out`: one score per example
/// (`columns` 1) or a row of `columns` (the reference cases' shape).
pub fn scores(columns: u64) -> SignatureInfo {
    let shape = if columns == 1 { vec![None] } else { vec![None, Some(columns)] };
    signature(vec![], vec![tensor("out", DType::Float64, &shape)])
}

/// A reference file's array of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

/// Reads `paths` with `label` as the label, `batch_size` examples a batch,
/// and every other option at its default (no weight, slices, renames,
/// limit, shard or format; corrupt records are errors).
pub fn data_spec(paths: Vec<PathBuf>, label: &str, batch_size: usize) -> DataSpec {
    DataSpec::new(paths, label, batch_size)
}

/// An `.npy` file's bytes: `dtype` as NumPy writes it (`<f4`, `|S1`), `shape`, `data` as given
/// (not checked against them: tests write lying files with it).
pub fn npy(dtype: &str, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape_text}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}
