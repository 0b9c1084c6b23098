//! What a run does with an `.onnx` model while no worker can run one
//! (issue 41: ONNX Runtime in the workers comes next): its unit ends
//! `load_failed` before any worker starts, with the file's own error when
//! it is not a readable ONNX model and otherwise a sentence saying ONNX
//! Runtime support is not built yet, never a crash or a silent skip.

use crate::discover::{Model, ModelFormat};
use crate::unit::UnitReport;
use isorun_protocol::{ErrorKind, ModelError, Outcome};

/// The outcome of a model no worker can run yet; `None` for other formats.
pub(crate) fn not_runnable(model: &Model) -> Option<Outcome> {
    if model.format != ModelFormat::Onnx {
        return None;
    }
    Some(Outcome::Error(ModelError::new(ErrorKind::LoadFailed, onnx_not_runnable(&model.path))))
}

/// Why the ONNX model at `path` cannot run: its own error when it is not a
/// readable ONNX model, else that ONNX Runtime support is not built yet.
pub fn onnx_not_runnable(path: &std::path::Path) -> String {
    match isorun_onnxproto::read_model(path) {
        Err(e) => with_causes(&e),
        Ok(_) => format!(
            "{}: ONNX models cannot run yet: ONNX Runtime support is not built (issue 41); \
             `isorun inspect {}` reads its inputs and outputs",
            path.display(),
            path.display()
        ),
    }
}

/// Ends every unit of a model no worker can run (marking it in `decided`),
/// reporting each through `finish`.
pub(crate) fn decide(models: &[Model], decided: &mut [bool], finish: &mut dyn FnMut(UnitReport)) {
    for (index, model) in models.iter().enumerate() {
        if decided[index] {
            continue;
        }
        let began = std::time::Instant::now();
        if let Some(outcome) = not_runnable(model) {
            let mut report = UnitReport::new(index, outcome);
            report.wall = began.elapsed();
            decided[index] = true;
            finish(report);
        }
    }
}

/// An error and its causes, one sentence.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}
