//! The map sandbox launcher: a program started as
//! `LAUNCHER __isorun-map-sandbox SPEC` (the `isorun` binary is one)
//! confines itself with `isorun-sandbox` while single-threaded, then execs
//! the Python zygote. Landlock, seccomp, the network namespace and the
//! limits outlive `execve` and `fork`, so the zygote and every call it
//! forks are confined before the user's module is imported. Unlike a
//! model worker, a call may read whatever the user can (the code is the
//! user's; the files it loads need not be), keeps the user's environment
//! and working folder, and may write beneath the spec's folders only.

use serde::{Deserialize, Serialize};

/// The first argument that makes a program the launcher.
pub const LAUNCH_ARG: &str = "__isorun-map-sandbox";

/// What the launcher is told (as JSON, in one argument).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Folders writes are allowed beneath.
    pub writable: Vec<String>,
    /// Keep the network (no new network namespace).
    pub network: bool,
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
    let work_dir = std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned());
    let sandbox = isorun_protocol::SandboxSpec { read_paths: vec!["/".into()], work_dir, core_dumps: false };
    let writable: Vec<std::path::PathBuf> = spec.writable.iter().map(Into::into).collect();
    let options = isorun_sandbox::Options { network: spec.network };
    let applied = isorun_sandbox::apply_with_options(&sandbox, &writable, &options);
    // The environment is the user's, kept on purpose: not a protection here.
    let error = isorun_sandbox::exec_confined(&applied, &["clean_env"], &spec.program, &spec.args, &spec.env);
    format!("{LAUNCH_ARG}: cannot start {}: {error}", spec.program)
}
