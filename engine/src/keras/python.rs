//! Finding the Python that exports Keras files: `--python` /
//! `ISORUN_PYTHON`, else the Python environment isorun is installed in
//! (`pip install isorun` puts `isorun` beside that environment's `python3`),
//! else `python3` on `PATH`, if it has Keras 3 and TensorFlow. Asking Python costs a process start, so the answer (the
//! versions, which are part of the cache key, and the folders the export
//! sandbox must let it read) is kept in the cache beside the entries and
//! trusted while the interpreter and the installed packages' metadata
//! folders are unchanged (same modification times): a fully cached run
//! starts no Python at all.

use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the probe asks Python: no TensorFlow import, only package metadata.
const PROBE: &str = r#"
import importlib.metadata as md, json, os, sys
def dist(*names):
    for name in names:
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        return d.version, str(getattr(d, "_path", "") or "")
    return None, ""
k = dist("keras")
t = dist("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly", "tensorflow-macos")
tk = dist("tf_keras", "tf-keras")
print(json.dumps({"executable": os.path.realpath(sys.executable),
    "prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix],
    "path": [p for p in sys.path if p], "version": sys.version.split()[0],
    "keras": k[0], "tensorflow": t[0], "tf_keras": tk[0], "dists": [p for p in (k[1], t[1], tk[1]) if p]}))
"#;

/// A Python that can export Keras files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Python {
    /// What was asked for (`--python`, or `python3` found on `PATH`).
    pub program: PathBuf,
    /// `os.path.realpath(sys.executable)`.
    pub executable: PathBuf,
    pub version: String,
    pub keras: String,
    pub tensorflow: String,
    pub tf_keras: Option<String>,
    /// Its prefixes and `sys.path`: what the export sandbox lets it read.
    pub read_paths: Vec<PathBuf>,
    /// Metadata folders of keras, tensorflow, tf_keras, with their times:
    /// a change (an upgrade) means asking again.
    stamps: Vec<(PathBuf, i64)>,
}

#[derive(Deserialize)]
struct ProbeAnswer {
    executable: PathBuf,
    prefixes: Vec<PathBuf>,
    path: Vec<PathBuf>,
    version: String,
    keras: Option<String>,
    tensorflow: Option<String>,
    tf_keras: Option<String>,
    dists: Vec<PathBuf>,
}

/// The interpreter to use: the one asked for, else the one beside this
/// executable (the wheel's environment), else `python3` on `PATH`.
pub fn choose(asked: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = asked {
        return Ok(path.to_path_buf());
    }
    if let Some(beside) = beside_this_executable() {
        return Ok(beside);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join("python3")).find(|p| p.is_file()).ok_or_else(|| {
        "no Python with Keras 3 found (no python3 on PATH): install one (pip install tensorflow-cpu brings Keras 3) \
         and name it with --python or ISORUN_PYTHON"
            .to_string()
    })
}

/// `<prefix>/bin/python3` when this executable is `<prefix>/bin/isorun` of
/// a Python environment (`pyvenv.cfg` at `<prefix>`, or a `lib/python3.*`
/// beside `bin/`), as `pip install isorun` lays it out.
fn beside_this_executable() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    let python = bin.join("python3");
    let prefix = bin.parent()?;
    let environment = prefix.join("pyvenv.cfg").is_file()
        || std::fs::read_dir(prefix.join("lib"))
            .ok()?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("python3"));
    (environment && python.is_file()).then_some(python)
}

/// Finds out what `program` has, from the cache when nothing changed.
pub fn probe(program: &Path, cache: Option<&Path>) -> Result<Python, String> {
    use sha2::Digest;
    // The answer's layout (and what read_paths holds) is part of the name:
    // an older isorun's answer, with a wider read set, is not reused.
    const ANSWER_VERSION: &[u8] = b"\0answer-2";
    let name =
        super::cache::hex(&sha2::Sha256::digest([program.as_os_str().as_encoded_bytes(), ANSWER_VERSION].concat()));
    let remembered = cache.map(|c| c.join(format!("python-{}.json", &name[..16])));
    if let Some(known) = remembered.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if let Ok(python) = serde_json::from_slice::<Python>(&known) {
            if python.program == program && stamps_of(program, &python.executable, &python.dists()) == python.stamps {
                return Ok(python);
            }
        }
    }
    let python = ask(program)?;
    if let Some(path) = remembered {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let staging = path.with_extension(format!("json.{}", std::process::id()));
        let _ = std::fs::remove_file(&staging);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staging)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &serde_json::to_vec(&python).unwrap_or_default()));
        if written.is_ok() {
            let _ = std::fs::rename(&staging, &path);
        }
    }
    Ok(python)
}

impl Python {
    fn dists(&self) -> Vec<PathBuf> {
        self.stamps.iter().skip(2).map(|(p, _)| p.clone()).collect()
    }
}

/// Modification times of the program, the real interpreter and the metadata folders.
fn stamps_of(program: &Path, executable: &Path, dists: &[PathBuf]) -> Vec<(PathBuf, i64)> {
    let stamp = |p: &Path| std::fs::metadata(p).map_or(-1, |m| m.mtime() * 1_000_000_000 + m.mtime_nsec());
    [program.to_path_buf(), executable.to_path_buf()]
        .into_iter()
        .chain(dists.iter().cloned())
        .map(|p| {
            let s = stamp(&p);
            (p, s)
        })
        .collect()
}

/// What the export sandbox lets Python read of its `sys.path`: the
/// interpreter's prefixes (its standard library and site-packages), the
/// `sys.path` entries beneath them, the site folders (`site-packages`,
/// `dist-packages`: a user's `~/.local` one included) and the folders that
/// hold Keras, TensorFlow and tf_keras. Not any other entry: an editable
/// install's source tree or a `PYTHONPATH` of `~/src` would otherwise be
/// open to a model's code; a package there cannot be imported by the export
/// (`--keras-module FILE.py` names the code a model needs).
fn import_paths(prefixes: &[PathBuf], path: &[PathBuf], dists: &[PathBuf]) -> Vec<PathBuf> {
    let is_site = |p: &Path| {
        p.file_name().is_some_and(|n| n == "site-packages" || n == "dist-packages")
            || p.extension().is_some_and(|e| e == "zip")
    };
    let holds_dist = |p: &Path| dists.iter().any(|d| d.parent() == Some(p));
    let mut read: Vec<PathBuf> = prefixes.iter().filter(|p| p.is_absolute()).cloned().collect();
    for entry in path.iter().filter(|p| p.is_absolute() && p.exists()) {
        let beneath = prefixes.iter().any(|prefix| prefix.is_absolute() && entry.starts_with(prefix));
        if (beneath || is_site(entry) || holds_dist(entry)) && !read.contains(entry) {
            read.push(entry.clone());
        }
    }
    read.dedup();
    read
}

fn ask(program: &Path) -> Result<Python, String> {
    let shown = program.display();
    let mut child = std::process::Command::new(program)
        .args(["-c", PROBE])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {shown}: {e}; name a Python with Keras 3 with --python or ISORUN_PYTHON"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not answer which Keras it has within 60 s"));
            }
        }
    };
    let output = child.wait_with_output().map_err(|e| format!("{shown}: {e}"))?;
    if !status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{shown} failed ({status}): {}; isorun exports Keras files with a Python that has Keras 3 and TensorFlow \
             (pip install tensorflow-cpu): name it with --python or ISORUN_PYTHON",
            stderr.lines().last().unwrap_or("")
        ));
    }
    let answer: ProbeAnswer = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("{shown}: unexpected answer to the Keras probe: {e}"))?;
    let install =
        "pip install tensorflow-cpu (it brings Keras 3), or name another Python with --python / ISORUN_PYTHON";
    let keras = answer.keras.ok_or_else(|| format!("{shown} has no Keras: {install}"))?;
    if keras.split('.').next().and_then(|m| m.parse::<u32>().ok()).is_none_or(|major| major < 3) {
        return Err(format!("{shown} has Keras {keras}; isorun needs Keras 3: {install}"));
    }
    let tensorflow =
        answer.tensorflow.ok_or_else(|| format!("{shown} has Keras {keras} but no TensorFlow: {install}"))?;
    let mut read_paths = import_paths(&answer.prefixes, &answer.path, &answer.dists);
    read_paths.extend(answer.executable.parent().map(Path::to_path_buf));
    let stamps = stamps_of(program, &answer.executable, &answer.dists);
    Ok(Python {
        program: program.to_path_buf(),
        executable: answer.executable,
        version: answer.version,
        keras,
        tensorflow,
        tf_keras: answer.tf_keras,
        read_paths,
        stamps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_export_reads_its_prefixes_and_site_folders_not_other_sys_path_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let make = |p: &str| {
            let dir = tmp.path().join(p);
            std::fs::create_dir_all(&dir).unwrap();
            dir
        };
        let (venv, base) = (make("venv"), make("usr"));
        let stdlib = make("usr/lib/python3.11");
        let venv_site = make("venv/lib/python3.11/site-packages");
        let user_site = make("home/.local/lib/python3.11/site-packages");
        let editable = make("home/src/project");
        let pythonpath = make("home/work");
        let tf_here = make("opt/tf");
        let path = [stdlib.clone(), venv_site.clone(), user_site.clone(), editable, pythonpath, tf_here.clone()];
        let read = import_paths(&[venv.clone(), base.clone()], &path, &[tf_here.join("tensorflow-2.21.0.dist-info")]);
        assert_eq!(read, vec![venv, base, stdlib, venv_site, user_site, tf_here]);
    }
}
