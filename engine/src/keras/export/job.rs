//! What the export stage hands an export process and gets back: one
//! file to export ([`Job`]), how it ended ([`JobEnd`]), and where its graph
//! came from ([`GraphSource`]).

use isorun_protocol::Outcome;
use std::path::PathBuf;

/// One file to export, into `out` (which must not exist yet); `id` is the
/// caller's, handed back with its end. Jobs with the same `graph` (the
/// key of their architecture, [`crate::keras::files::architecture_digest`] with
/// the toolchain) that one process exports in a row share one trace.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: usize,
    pub file: PathBuf,
    pub out: PathBuf,
    pub graph: Option<String>,
    /// May be frozen (false: the archive's way, after a frozen graph failed its check).
    pub freeze: bool,
    /// A frozen graph's check may be left to the unit's worker (see `frozen_check`).
    pub check_in_worker: bool,
}

/// How one job ended.
#[derive(Debug, Clone)]
pub enum JobEnd {
    /// `check_in_worker`: a frozen graph whose check the export process left to the worker.
    /// `phases`: where the export process says the job's time went, in
    /// order (`keras_export.py`'s laps, from its start to its done); `before`:
    /// what it spent before the job's start (for the first job of a process,
    /// `process_start` from the spawn to its hello, `imports` within that,
    /// `turn` from the hello to the start; for a later one, `cleanup` after
    /// the job before it).
    Exported {
        loader: String,
        ms: u64,
        graph: GraphSource,
        check_in_worker: bool,
        phases: Vec<(String, u64)>,
        before: Vec<(String, u64)>,
    },
    Failed {
        outcome: Outcome,
        stderr: Vec<String>,
    },
}

/// Where an export's graph came from: traced from the file (`Traced`, with
/// Keras's `ExportArchive`; `Frozen`, traced once with the variables folded
/// into constants, for a file no later file shares a graph with: a fraction
/// of the archive's time on a big model, and nothing to restore at load), or
/// the trace of an earlier file of the same architecture with this file's
/// weights written into a copy (`export.graph` of the record and of
/// `export.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphSource {
    Traced,
    Frozen,
    Shared,
}

impl GraphSource {
    pub fn name(self) -> &'static str {
        match self {
            GraphSource::Traced => "traced",
            GraphSource::Frozen => "frozen",
            GraphSource::Shared => "shared",
        }
    }

    pub fn from_name(name: &str) -> Option<GraphSource> {
        [GraphSource::Traced, GraphSource::Frozen, GraphSource::Shared].into_iter().find(|g| g.name() == name)
    }
}
