//! Every fixture signature through `isorun run`, on the real worker, gives
//! the outputs Python TensorFlow gave (`tests/fixtures/expected`), and every
//! way a model can refuse the inputs or fail to load is reported on its own
//! record, naming what was wrong, while the rest of the run goes on.

use crate::util::{fixtures, isorun, run, Ran};
use isorun::npy::{read_npy_file, write_npy};
use isorun_protocol::{DType, Tensor, TensorData};
use serde_json::Value;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// The manifest

/// One case of `tests/fixtures/manifest.json`.
struct Case {
    name: String,
    model: String,
    signature: String,
    inputs: Vec<String>,
    /// Output name, dtype as isorun reports it, dtype of the expected `.npy`, shape.
    outputs: Vec<(String, String, String, Vec<u64>)>,
    expect_error: Option<Value>,
}

impl Case {
    fn model_dir(&self) -> PathBuf {
        fixtures().join("models").join(&self.model)
    }

    fn expected_dir(&self) -> PathBuf {
        fixtures().join("expected").join(&self.name)
    }

    fn npz(&self) -> PathBuf {
        self.expected_dir().join("inputs.npz")
    }

    fn expected_output(&self, name: &str) -> Tensor {
        let path = self.expected_dir().join("outputs").join(format!("{name}.npy"));
        read_npy_file(&path).unwrap_or_else(|e| panic!("expected output {}: {e}", path.display()))
    }
}

fn shape_of(value: &Value) -> Vec<u64> {
    value.as_array().expect("shape is a list").iter().map(|d| d.as_u64().expect("dimension")).collect()
}

fn manifest() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("read manifest.json");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("manifest.json is JSON");
    let cases: Vec<Case> = cases
        .iter()
        .map(|c| Case {
            name: c["case"].as_str().unwrap().to_string(),
            model: c["model"].as_str().unwrap().to_string(),
            signature: c["signature"].as_str().unwrap().to_string(),
            inputs: c["inputs"].as_object().unwrap().keys().cloned().collect(),
            outputs: c["outputs"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(name, o)| {
                    let dtype = o["dtype"].as_str().unwrap().to_string();
                    let stored = o["stored_as"].as_str().map_or_else(|| dtype.clone(), str::to_string);
                    (name.clone(), dtype, stored, shape_of(&o["shape"]))
                })
                .collect(),
            expect_error: Some(c["expect_error"].clone()).filter(|e| !e.is_null()),
        })
        .collect();
    assert!(cases.len() >= 10, "manifest.json lists only {} cases", cases.len());
    cases
}

fn case(name: &str) -> Case {
    manifest().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name} in manifest.json"))
}

// ---------------------------------------------------------------------------
// Comparing tensors

const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-7;

fn close(actual: f64, expected: f64) -> bool {
    if actual.is_nan() || expected.is_nan() {
        return actual.is_nan() && expected.is_nan();
    }
    if actual.is_infinite() || expected.is_infinite() {
        return actual == expected;
    }
    (actual - expected).abs() <= ATOL + RTOL * expected.abs()
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f64::from(bits & 0x3ff);
    match exponent {
        0 => sign * fraction * 2f64.powi(-24),
        31 if fraction == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + fraction / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The elements of a float tensor as `f64`, `None` for other dtypes.
fn floats(tensor: &Tensor) -> Option<Vec<f64>> {
    let TensorData::Dense(bytes) = &tensor.data else { return None };
    Some(match tensor.dtype {
        DType::Float16 => bytes.chunks_exact(2).map(|c| f16_to_f64(u16::from_le_bytes([c[0], c[1]]))).collect(),
        DType::Float32 => bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::Float64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        _ => return None,
    })
}

/// Integers (as `i128`, which holds every integer dtype) and bools (0/1).
fn integers(tensor: &Tensor) -> Option<Vec<i128>> {
    let TensorData::Dense(bytes) = &tensor.data else { return None };
    macro_rules! ints {
        ($t:ty) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| i128::from(<$t>::from_le_bytes(c.try_into().unwrap())))
                .collect()
        };
    }
    Some(match tensor.dtype {
        DType::Int8 => ints!(i8),
        DType::Int16 => ints!(i16),
        DType::Int32 => ints!(i32),
        DType::Int64 => ints!(i64),
        DType::UInt8 => ints!(u8),
        DType::UInt16 => ints!(u16),
        DType::UInt32 => ints!(u32),
        DType::UInt64 => ints!(u64),
        DType::Bool => bytes.iter().map(|&b| i128::from(b)).collect(),
        _ => return None,
    })
}

fn strings(tensor: &Tensor) -> Option<&[serde_bytes_like::ByteBuf]> {
    match &tensor.data {
        TensorData::Strings(s) => Some(s),
        _ => None,
    }
}

/// `serde_bytes::ByteBuf`, named through the protocol's own type.
mod serde_bytes_like {
    pub type ByteBuf = <Vec<super::Strings> as IntoIterator>::Item;
}
type Strings = <isorun_protocol::TensorData as StringsItem>::Item;
trait StringsItem {
    type Item;
}
impl StringsItem for TensorData {
    type Item = serde_bytes_buf::Buf;
}
mod serde_bytes_buf {
    pub type Buf = <std::vec::IntoIter<Buf0> as Iterator>::Item;
    pub type Buf0 = ();
}
