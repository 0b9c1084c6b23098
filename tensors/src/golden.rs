//! Golden outputs (`--expect DIR`, the layout `--output-dir` writes): each
//! output is compared with `DIR/<model id>/<output>.npy`. Floats agree when
//! `|a - b| <= atol + rtol * |b|` (NumPy's `allclose`; NaN matches NaN);
//! integers, bools and strings must be equal. Any difference makes the unit
//! `mismatch`, naming the output, the largest errors and where the worst is.

use crate::npy::read_npy_file;
use half::{bf16, f16};
use isorun_protocol::{DType, Outcome, Tensor, TensorData};
use std::path::PathBuf;

/// The golden folder and tolerances.
#[derive(Debug, Clone)]
pub struct Expect {
    pub dir: PathBuf,
    pub rtol: f64,
    pub atol: f64,
}

fn mismatch(output: &str, message: String) -> Outcome {
    Outcome::Mismatch { output: output.to_string(), message, max_abs_error: None, max_rel_error: None, index: None }
}

impl Expect {
    /// `None` when every output matches its golden file, else the first mismatch.
    pub fn compare(&self, model_id: &str, outputs: &[(String, Tensor)]) -> Option<Outcome> {
        let folder = self.dir.join(model_id);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return Some(mismatch(
                "*",
                format!("no expected outputs for this model ({} is not a folder)", folder.display()),
            ));
        };
        let mut expected: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".npy").map(str::to_string))
            .filter(|name| !name.starts_with('.'))
            .collect();
        expected.sort();
        for name in &expected {
            let Some((_, actual)) = outputs.iter().find(|(n, _)| n == name) else {
                return Some(mismatch(name, "expected output is missing from the result".into()));
            };
            let path = folder.join(format!("{name}.npy"));
            let golden = match read_npy_file(&path) {
                Ok(golden) => golden,
                Err(e) => return Some(mismatch(name, format!("cannot read the expected output: {e}"))),
            };
            if let Some(outcome) = self.compare_one(name, actual, &golden) {
                return Some(outcome);
            }
        }
        outputs
            .iter()
            .find(|(name, _)| !expected.contains(name))
            .map(|(name, _)| mismatch(name, format!("output is not among the expected ones in {}", folder.display())))
    }

    /// `None` when `actual` matches `golden` (the rule above), else why not.
    pub fn compare_one(&self, name: &str, actual: &Tensor, golden: &Tensor) -> Option<Outcome> {
        if actual.shape != golden.shape {
            return Some(mismatch(name, format!("shape {:?}, expected {:?}", actual.shape, golden.shape)));
        }
        match (&actual.data, &golden.data) {
            (TensorData::Strings(a), TensorData::Strings(b)) => {
                let at = a.iter().zip(b).position(|(x, y)| x != y)?;
                Some(Outcome::Mismatch {
                    output: name.into(),
                    message: format!("string element {at} differs"),
                    max_abs_error: None,
                    max_rel_error: None,
                    index: Some(unravel(at, &actual.shape)),
                })
            }
            (TensorData::Dense(_), TensorData::Dense(_)) => {
                let exact = !is_float(actual.dtype) || !is_float(golden.dtype);
                if exact && actual.dtype != golden.dtype {
                    return Some(mismatch(name, format!("dtype {}, expected {}", actual.dtype, golden.dtype)));
                }
                let (a, b) = (as_f64(actual), as_f64(golden));
                let (rtol, atol) = if exact { (0.0, 0.0) } else { (self.rtol, self.atol) };
                let (mut max_abs, mut max_rel, mut worst) = (0.0f64, 0.0f64, None);
                let mut worst_excess = 0.0f64;
                for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
                    if x.is_nan() && y.is_nan() || x == y {
                        continue;
                    }
                    let abs = (x - y).abs();
                    let rel = if y != 0.0 { abs / y.abs() } else { f64::INFINITY };
                    let excess = abs - (atol + rtol * y.abs());
                    if abs.is_nan() || excess > 0.0 {
                        max_abs = max_abs.max(abs);
                        max_rel = max_rel.max(rel);
                        if worst.is_none() || excess > worst_excess || abs.is_nan() {
                            worst = Some(i);
                            worst_excess = excess;
                        }
                    }
                }
                let at = worst?;
                Some(Outcome::Mismatch {
                    output: name.into(),
                    message: format!(
                        "values differ beyond rtol {rtol}, atol {atol}: max abs error {max_abs:e}, max rel error {max_rel:e}, worst at {:?} ({} vs {} expected)",
                        unravel(at, &actual.shape),
                        a[at],
                        b[at]
                    ),
                    max_abs_error: Some(max_abs),
                    max_rel_error: Some(max_rel),
                    index: Some(unravel(at, &actual.shape)),
                })
            }
            _ => Some(mismatch(name, format!("dtype {}, expected {}", actual.dtype, golden.dtype))),
        }
    }
}

fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::Float16 | DType::BFloat16 | DType::Float32 | DType::Float64)
}

/// Elements as f64 (exact for every dtype but 64-bit integers beyond 2^53).
fn as_f64(tensor: &Tensor) -> Vec<f64> {
    let TensorData::Dense(bytes) = &tensor.data else { return Vec::new() };
    macro_rules! each {
        ($n:expr, $f:expr) => {
            bytes.chunks_exact($n).map(|c| $f(c.try_into().unwrap())).collect()
        };
    }
    match tensor.dtype {
        DType::Float32 => each!(4, |c| f64::from(f32::from_le_bytes(c))),
        DType::Float64 => each!(8, f64::from_le_bytes),
        DType::Float16 => each!(2, |c| f16::from_le_bytes(c).to_f64()),
        DType::BFloat16 => each!(2, |c| bf16::from_le_bytes(c).to_f64()),
        DType::Int8 => each!(1, |c| f64::from(i8::from_le_bytes(c))),
        DType::Int16 => each!(2, |c| f64::from(i16::from_le_bytes(c))),
        DType::Int32 => each!(4, |c| f64::from(i32::from_le_bytes(c))),
        DType::Int64 => each!(8, |c| i64::from_le_bytes(c) as f64),
        DType::UInt8 | DType::Bool => each!(1, |c| f64::from(u8::from_le_bytes(c))),
        DType::UInt16 => each!(2, |c| f64::from(u16::from_le_bytes(c))),
        DType::UInt32 => each!(4, |c| f64::from(u32::from_le_bytes(c))),
        DType::UInt64 => each!(8, |c| u64::from_le_bytes(c) as f64),
        DType::String => Vec::new(),
    }
}

/// The multi-dimensional index of flat element `i`.
fn unravel(mut i: usize, shape: &[u64]) -> Vec<u64> {
    let mut index = vec![0; shape.len()];
    for (axis, &dim) in shape.iter().enumerate().rev() {
        let dim = dim.max(1) as usize;
        index[axis] = (i % dim) as u64;
        i /= dim;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32], shape: Vec<u64>) -> Tensor {
        Tensor::dense(DType::Float32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn expect() -> Expect {
        Expect { dir: PathBuf::from("/nonexistent"), rtol: 1e-5, atol: 1e-8 }
    }

    #[test]
    fn within_tolerance_matches_and_the_worst_difference_is_named() {
        let golden = f32s(&[1.0, 2.0, f32::NAN, 4.0], vec![2, 2]);
        assert!(expect().compare_one("y", &f32s(&[1.000001, 2.0, f32::NAN, 4.0], vec![2, 2]), &golden).is_none());
        let Some(Outcome::Mismatch { max_abs_error, index, message, .. }) =
            expect().compare_one("y", &f32s(&[1.0, 2.0, f32::NAN, 4.5], vec![2, 2]), &golden)
        else {
            panic!("expected a mismatch")
        };
        assert_eq!(max_abs_error, Some(0.5));
        assert_eq!(index, Some(vec![1, 1]));
        assert!(message.contains("worst at [1, 1] (4.5 vs 4 expected)"), "{message}");
    }

    #[test]
    fn integers_are_exact_and_shapes_must_agree() {
        let ints = |v: i64| Tensor::dense(DType::Int64, vec![1], v.to_le_bytes().to_vec());
        assert!(expect().compare_one("n", &ints(3), &ints(3)).is_none());
        assert!(expect().compare_one("n", &ints(3), &ints(4)).is_some());
        let Some(Outcome::Mismatch { message, .. }) =
            expect().compare_one("y", &f32s(&[1.0], vec![1]), &f32s(&[1.0, 2.0], vec![2]))
        else {
            panic!()
        };
        assert_eq!(message, "shape [1], expected [2]");
    }
}
