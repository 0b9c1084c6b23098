//! The check of a frozen Keras export, run by the unit's own worker. A
//! frozen export (`export.graph` `frozen`) folds the variables into
//! constants; the export process proves it with one probe row: the traced
//! function's outputs on it must be the frozen graph's. Running the frozen
//! graph there takes a session of its own (ConvNeXtTiny: ~2.5 s of a 5 s
//! export), while the unit's worker loads that graph anyway and runs it a
//! second time for a fraction of that (0.06–0.4 s). So for `run` and `eval`
//! the export process leaves the probe and its expected outputs with the
//! cache entry (`check` `pending` in `export.json`), and the first unit to
//! load the entry runs the probe before its own inputs. A graph that
//! passes is marked so (later runs skip the probe); one that gives other
//! outputs or fails to import or run, or whose check file is missing or
//! unreadable, is exported again the archive's way and the unit runs again
//! in a fresh worker (a second failure ends the unit, `export_failed`), so a
//! unit's outputs never come from a frozen graph that has not passed. Any
//! other failure on the probe (a crash, a timeout, a panic) is the unit's,
//! and the entry waits for the next unit's check.
//!
//! The executor asks through [`FrozenChecks`] (implemented by the export
//! stage, `keras::Staged`), which keeps this module free of the cache.

use crate::cancel::CancelToken;
use crate::settings::Settings;
use isorun_protocol::{Outcome, Tensor};
use isorun_tensors::golden::Expect;

/// Tolerances of the check: those of the export process's own check.
pub(crate) const RTOL: f64 = 1e-5;
pub(crate) const ATOL: f64 = 1e-6;

/// The probe row, by signature input, and the traced function's outputs on
/// it, by signature output.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    pub inputs: Vec<(String, Tensor)>,
    pub expected: Vec<(String, Tensor)>,
}

impl Probe {
    /// A check file's arrays (`input/NAME`, `output/KEY`), split; any other
    /// name, or a side left empty, is a bad file.
    pub(crate) fn from_arrays(arrays: Vec<(String, Tensor)>) -> Result<Probe, String> {
        let mut probe = Probe::default();
        for (name, tensor) in arrays {
            if let Some(input) = name.strip_prefix("input/") {
                probe.inputs.push((input.to_string(), tensor));
            } else if let Some(output) = name.strip_prefix("output/") {
                probe.expected.push((output.to_string(), tensor));
            } else {
                return Err(format!("the check file holds an array {name:?}, neither input/ nor output/"));
            }
        }
        if probe.inputs.is_empty() || probe.expected.is_empty() {
            return Err("the check file lacks its inputs or its outputs".into());
        }
        Ok(probe)
    }

    /// `None` when the worker's `outputs` on the probe are the expected
    /// ones (every expected output there, no other, each within
    /// [`RTOL`]/[`ATOL`], dtypes and shapes equal), else what differs.
    pub(crate) fn differs(&self, outputs: &[(String, Tensor)]) -> Option<String> {
        let rule = Expect { dir: std::path::PathBuf::new(), rtol: RTOL, atol: ATOL };
        for (name, expected) in &self.expected {
            let Some((_, got)) = outputs.iter().find(|(n, _)| n == name) else {
                return Some(format!("the frozen graph gives no output {name:?}"));
            };
            if got.dtype != expected.dtype {
                return Some(format!("output {name:?}: dtype {}, the model's is {}", got.dtype, expected.dtype));
            }
            if let Some(Outcome::Mismatch { message, .. }) = rule.compare_one(name, got, expected) {
                return Some(format!("output {name:?}: {message}"));
            }
        }
        let extra = outputs.iter().find(|(n, _)| !self.expected.iter().any(|(e, _)| e == n));
        extra.map(|(name, _)| format!("the frozen graph gives an output {name:?} the model does not"))
    }
}

/// What the executor asks of the export stage about a unit's model.
pub(crate) trait FrozenChecks: Sync {
    /// The probe unit `index`'s worker must pass before its inputs run:
    /// `None` when there is nothing to check (not a Keras export, a
    /// checked one, or one already exported again), `Err` when the check
    /// file cannot be used (then the unit's model is exported again).
    fn probe(&self, index: usize) -> Option<Result<Probe, String>>;
    /// The unit's worker gave the expected outputs, in `ms`.
    fn passed(&self, index: usize, ms: u64);
    /// The frozen graph failed (`why`): export the file again the
    /// archive's way, into the same cache entry; `Ok` when the unit can run again.
    fn export_again(&self, index: usize, why: &str, settings: &Settings, stop: &CancelToken) -> Result<(), Outcome>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{DType, TensorData};

    fn floats(values: &[f32]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { dtype: DType::Float32, shape: vec![1, values.len() as u64], data: TensorData::Dense(bytes.into()) }
    }

    fn probe(expected: &[f32]) -> Probe {
        Probe::from_arrays(vec![("input/x".into(), floats(&[0.5])), ("output/y".into(), floats(expected))])
            .expect("a probe")
    }

    #[test]
    fn outputs_pass_within_the_tolerances_and_fail_beyond_them() {
        let p = probe(&[1.0, -2.0]);
        assert_eq!(p.inputs[0].0, "x");
        assert_eq!(p.differs(&[("y".into(), floats(&[1.0, -2.0]))]), None);
        assert_eq!(p.differs(&[("y".into(), floats(&[1.000_001, -2.000_01]))]), None);
        let far = p.differs(&[("y".into(), floats(&[1.0, -2.1]))]).expect("a difference");
        assert!(far.starts_with("output \"y\": values differ"), "{far}");
    }

    #[test]
    fn a_missing_extra_or_reshaped_output_fails() {
        let p = probe(&[1.0, 2.0]);
        assert!(p.differs(&[]).expect("missing").contains("no output \"y\""));
        let extra = p.differs(&[("y".into(), floats(&[1.0, 2.0])), ("z".into(), floats(&[0.0]))]);
        assert!(extra.expect("extra").contains("output \"z\""));
        let mut reshaped = floats(&[1.0, 2.0]);
        reshaped.shape = vec![2, 1];
        assert!(p.differs(&[("y".into(), reshaped)]).expect("shape").contains("shape"));
        let ints = Tensor { dtype: DType::Int32, shape: vec![1, 2], data: TensorData::Dense(vec![0; 8].into()) };
        assert!(p.differs(&[("y".into(), ints)]).expect("dtype").contains("dtype"));
    }

    #[test]
    fn a_name_with_control_characters_is_quoted_in_what_differs() {
        let p =
            Probe::from_arrays(vec![("input/x".into(), floats(&[0.5])), ("output/\u{1b}[2Jy".into(), floats(&[1.0]))])
                .expect("a probe");
        let why = p.differs(&[]).expect("missing");
        assert!(why.contains("\\u{1b}[2Jy") && !why.contains('\u{1b}'), "{why}");
    }

    #[test]
    fn a_check_file_with_a_stray_array_or_an_empty_side_is_refused() {
        let stray = Probe::from_arrays(vec![("weights".into(), floats(&[1.0]))]).expect_err("stray");
        assert!(stray.contains("\"weights\""), "{stray}");
        let one_side = Probe::from_arrays(vec![("input/x".into(), floats(&[1.0]))]).expect_err("no outputs");
        assert!(one_side.contains("lacks"), "{one_side}");
    }
}
