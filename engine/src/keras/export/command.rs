//! How an export process is started: the script it runs, its
//! environment and scratch folders, and, where the run is sandboxed, the
//! launcher's spec of what it may read and write.

use super::job::Job;
use crate::keras::launch::{LaunchSpec, LAUNCH_ARG};
use crate::keras::python::Python;
use crate::process::set_child_safety;
use crate::settings::Settings;
use std::process::{Command, Stdio};

/// The script the export process runs (`python -c`).
const SCRIPT: &str = include_str!("../keras_export.py");

/// The SHA-256 (hex) of the export script, part of every cache key: what
/// the export writes depends on it, so an entry written by another script
/// (one that shared traces on the supervisor's grouping alone, say) is not
/// taken for this one's.
pub(crate) fn script_sha256() -> String {
    use sha2::Digest;
    crate::keras::cache::hex(&sha2::Sha256::digest(SCRIPT.as_bytes()))
}

/// The command of an export process over `jobs`, with `scratch` its home,
/// temporary files and working folder.
pub(super) fn command(
    python: &Python,
    settings: &Settings,
    jobs: &[&Job],
    scratch: &std::path::Path,
) -> Result<Command, String> {
    let program = &python.program;
    let home = scratch.join("home");
    let tmp = scratch.join("tmp");
    for dir in [&home, &tmp] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), home.display().to_string()),
        ("KERAS_HOME".into(), home.join(".keras").display().to_string()),
        ("TMPDIR".into(), tmp.display().to_string()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        // A trace needs no GPU; a SavedModel runs on whatever the worker has.
        ("CUDA_VISIBLE_DEVICES".into(), "".into()),
        ("TF_CPP_MIN_LOG_LEVEL".into(), std::env::var("TF_CPP_MIN_LOG_LEVEL").unwrap_or_else(|_| "2".into())),
    ];
    for name in ["PATH", "PYTHONPATH", "LANG", "LC_ALL", "TF_ENABLE_ONEDNN_OPTS", "ISORUN_EXPORT_HANG"] {
        if let Ok(value) = std::env::var(name) {
            env.push((name.into(), value));
        }
    }
    let args = vec!["-c".to_string(), SCRIPT.to_string()];
    let launcher = settings.keras.launcher.as_ref().filter(|_| settings.sandbox.is_some());
    let mut command = match (launcher, &settings.sandbox) {
        (Some(launcher), Some(sandbox)) => {
            let mut read_paths: Vec<String> = sandbox.read_paths.clone();
            read_paths.extend(python.read_paths.iter().map(|p| p.display().to_string()));
            read_paths.push(program.display().to_string());
            read_paths.extend(["/usr/bin", "/bin", "/etc/ssl"].map(String::from));
            read_paths.extend(jobs.iter().map(|j| j.file.display().to_string()));
            read_paths.extend(settings.keras.modules.iter().map(|m| m.display().to_string()));
            let spec = LaunchSpec {
                read_paths,
                writable: std::iter::once(scratch)
                    .chain(jobs.iter().filter_map(|j| j.out.parent()))
                    .map(|p| p.display().to_string())
                    .collect(),
                work_dir: scratch.display().to_string(),
                core_dumps: sandbox.core_dumps,
                env,
                program: program.display().to_string(),
                args,
            };
            let mut command = Command::new(launcher);
            command.arg(LAUNCH_ARG).arg(serde_json::to_string(&spec).map_err(|e| e.to_string())?);
            command.env_clear();
            command
        }
        _ => {
            let mut command = Command::new(program);
            command.args(&args).envs(env).current_dir(scratch);
            command
        }
    };
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Its own session (set_child_safety): see `process::set_child_safety`.
    set_child_safety(&mut command);
    Ok(command)
}
