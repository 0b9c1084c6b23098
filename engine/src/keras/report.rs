//! What a unit's record says of its Keras export (how its SavedModel was
//! got, and where its frozen graph was checked): a leaf of its own, so that
//! a unit's report can carry it without reaching into the Keras stage that
//! fills it.

use super::cache;
use super::export::GraphSource;
use crate::discover::ModelFormat;

/// How a Keras file's unit got its SavedModel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    pub from: ModelFormat,
    /// Found in the cache: no Python started for it.
    pub cached: bool,
    /// Time to export it (or to find it in the cache).
    pub ms: u64,
    /// What read it: `keras`, or `tf_keras` for a Keras 2 file Keras 3 cannot read.
    pub loader: Option<String>,
    /// Whether its graph was traced from it or shared with an earlier file
    /// of the same architecture (only its variables written).
    pub graph: Option<GraphSource>,
    /// A frozen graph's check against the traced model (see `frozen_check`).
    pub check: Option<ExportCheck>,
    /// Where `ms` went, phase by phase as the export process measured them,
    /// then `other` (the rest of `ms`: the answers' way through the pipe,
    /// the supervisor's turn), so they add up to `ms`; empty when cached or
    /// not exported (the record's `export.phases_ms`).
    pub phases_ms: Vec<(String, u64)>,
    /// What the export process spent before this file's start: for the
    /// first file of a process its start (`process_start`, the spawn to its
    /// hello, and `imports` within it) and `turn` (the hello to this file's
    /// start: waiting for the process before it, the `--keras-module`s); for
    /// a later one, the `cleanup` after the file before it (the record's
    /// `export.before_ms`).
    pub before_ms: Vec<(String, u64)>,
}

/// Where a frozen graph was checked against the traced model on a probe row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportCheck {
    /// By the export process.
    Export,
    /// By a unit's worker; `ms` when in this run, before the unit's inputs.
    Worker { ms: Option<u64> },
    /// Left to a worker, which has not run it (the unit did not get that far).
    Pending,
    /// It failed in the unit's worker (`why`), and the file was exported
    /// again the archive's way (`graph` `traced`) before the unit ran again.
    Failed { why: String },
}

impl ExportCheck {
    pub fn name(&self) -> &'static str {
        match self {
            ExportCheck::Export => cache::CHECK_EXPORT,
            ExportCheck::Worker { .. } => cache::CHECK_WORKER,
            ExportCheck::Pending => cache::CHECK_PENDING,
            ExportCheck::Failed { .. } => "failed",
        }
    }

    /// The check of an entry from its `export.json`: a frozen graph made
    /// before checks were recorded was checked by its export process.
    pub(super) fn of_entry(about: &serde_json::Value) -> Option<ExportCheck> {
        if about.get("graph").and_then(serde_json::Value::as_str) != Some(GraphSource::Frozen.name()) {
            return None;
        }
        Some(match about.get("check").and_then(serde_json::Value::as_str) {
            Some(cache::CHECK_PENDING) => ExportCheck::Pending,
            Some(cache::CHECK_WORKER) => ExportCheck::Worker { ms: None },
            _ => ExportCheck::Export,
        })
    }
}
