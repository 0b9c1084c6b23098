//! The sandbox launcher: a program started as `LAUNCHER __isorun-export-sandbox SPEC`
//! (the `isorun` binary is one) applies `isorun-sandbox` to itself while
//! single-threaded, then execs Python with the environment the spec gives.
//! Landlock, seccomp, the network namespace and the limits outlive
//! `execve`, so Python is confined before it reads a byte of a model file.
//! The launcher links no TensorFlow, so starting it costs milliseconds.

use isorun_protocol::SandboxSpec;
use serde::{Deserialize, Serialize};

/// The first argument that makes a program the launcher.
pub const LAUNCH_ARG: &str = "__isorun-export-sandbox";

/// What the launcher is told (as JSON, in one argument).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub read_paths: Vec<String>,
    pub writable: Vec<String>,
    pub work_dir: String,
    pub core_dumps: bool,
    pub env: Vec<(String, String)>,
    pub program: String,
    pub args: Vec<String>,
}

/// Confines this process and execs the spec's program; returns only on
/// failure, with what to say (the caller exits non-zero). Call it first
/// thing in `main`, before any thread starts, when `args[1]` is [`LAUNCH_ARG`].
pub fn launch(spec_json: &str) -> String {
    let spec: LaunchSpec = match serde_json::from_str(spec_json) {
        Ok(spec) => spec,
        Err(e) => return format!("{LAUNCH_ARG}: bad spec: {e}"),
    };
    let sandbox = SandboxSpec {
        read_paths: spec.read_paths.clone(),
        work_dir: Some(spec.work_dir.clone()),
        core_dumps: spec.core_dumps,
    };
    let writable: Vec<std::path::PathBuf> = spec.writable.iter().map(Into::into).collect();
    let applied = isorun_sandbox::apply_with_writable(&sandbox, &writable);
    let error = isorun_sandbox::exec_confined(&applied, &[], &spec.program, &spec.args, &spec.env);
    format!("{LAUNCH_ARG}: cannot start {}: {error}", spec.program)
}
