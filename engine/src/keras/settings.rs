//! How Keras files are exported (`--python`, `--keras-module`,
//! `--keras-unsafe`, the export cache, the launcher): a leaf of its own, so
//! that the run's [`Settings`](crate::Settings) can hold it without
//! reaching into the Keras stage that reads it.

use std::path::PathBuf;

/// The most files one export process converts by default (memory that
/// `clear_session` does not give back grows with them).
pub const MAX_FILES_PER_PROCESS: usize = 32;

/// How Keras files are exported.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct KerasSettings {
    /// The Python to export with (`--python`, `ISORUN_PYTHON`); else `python3` on `PATH`.
    pub python: Option<PathBuf>,
    /// Python files imported before each model loads (`--keras-module`): custom layers.
    pub modules: Vec<PathBuf>,
    /// Load with `safe_mode=False` (`--keras-unsafe`): Lambda layers' code runs (in the sandbox).
    pub unsafe_code: bool,
    /// The export cache; `None` for the default ([`super::cache::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// A program that applies the sandbox and execs Python ([`launch`](super::launch()));
    /// without one, the export process runs unsandboxed.
    pub launcher: Option<PathBuf>,
    /// Files one export process traces in a row (0: the default, the
    /// files shared out over `jobs` processes, at most [`MAX_FILES_PER_PROCESS`] each);
    /// the files that share a traced file's graph come with it.
    pub files_per_process: usize,
}

impl KerasSettings {
    pub fn new() -> KerasSettings {
        KerasSettings::default()
    }
    pub fn python(mut self, python: Option<PathBuf>) -> Self {
        self.python = python;
        self
    }
    pub fn modules(mut self, modules: Vec<PathBuf>) -> Self {
        self.modules = modules;
        self
    }
    pub fn unsafe_code(mut self, unsafe_code: bool) -> Self {
        self.unsafe_code = unsafe_code;
        self
    }
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }
    pub fn launcher(mut self, launcher: Option<PathBuf>) -> Self {
        self.launcher = launcher;
        self
    }
    pub fn files_per_process(mut self, n: usize) -> Self {
        self.files_per_process = n;
        self
    }
}
