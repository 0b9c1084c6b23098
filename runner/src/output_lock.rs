//! One run at a time per output file. Two runs given the same `--report`
//! (or `--junit`, `--html`, `--journal`) each wrote it at their end, and the
//! last to finish dropped the other's models without a word. So a run locks
//! each of its output files before any work and holds the locks to its end;
//! a second run is refused with a usage error naming the file and the pid
//! of the run that holds it, while a run after the first (or after it was
//! killed) overwrites the file as any output file is.
//!
//! The lock is an advisory `flock` on a sidecar file beside the output,
//! `.NAME.isorun-lock`: the output itself cannot carry it, because reports
//! are written to a temporary file renamed over the target (a new inode at
//! each write). The kernel drops a dead process's lock, so a run that was
//! killed never blocks the next one; its sidecar file, left behind, is taken
//! over. A run that ends removes its sidecar while it still holds the lock,
//! and a run that locked a sidecar since removed opens the new one instead,
//! so two runs never both hold "the" lock.
//!
//! Folders of per-model files (`--output-dir`, eval's `--predictions`) and
//! the files of `report merge -o` and `rescore --report` are locked the
//! same way ([`OutputLocks::lock_folder`] for a folder), with one
//! exception: the model shards of one run (`--shard K/N`, each Slurm array
//! task) write disjoint models side by side into one folder, so a shard
//! takes the folder's lock shared, and the lock of its shard
//! (`.NAME.shard-K-of-N.isorun-lock`) alone. An unsharded writer of the
//! folder still excludes them all, and two runs of the same shard each other.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why an output file could not be locked for this run.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock: another run writes this file (or
    /// folder: `what`).
    #[error(
        "{flag} {}: another isorun ({holder}) is writing this {what}; \
         wait for that run to end, or give this run another path",
        path.display()
    )]
    Held { flag: &'static str, path: PathBuf, holder: String, what: &'static str },
    /// The sidecar lock file could not be made or locked.
    #[error("{flag} {}: cannot lock it for this run (lock file {})", path.display(), lock.display())]
    Io {
        flag: &'static str,
        path: PathBuf,
        lock: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The locks of a run's output files, held until dropped.
#[derive(Debug, Default)]
pub struct OutputLocks {
    held: Vec<HeldLock>,
}

/// One held lock: its sidecar file, open and locked.
#[derive(Debug)]
struct HeldLock {
    path: PathBuf,
    file: File,
    /// Held shared (a model shard's hold on its folder), not alone.
    shared: bool,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        // A shared lock's file may be another shard's still: removed only
        // by the last holder, which alone can make its lock exclusive.
        if self.shared && self.file.try_lock().is_err() {
            return;
        }
        // Removed while still locked, and only if it is still ours (a
        // stale one replaced by hand is someone else's); the lock goes when
        // `file` closes, after this.
        if same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl OutputLocks {
    /// Locks a folder of per-model outputs (`--output-dir`, `--predictions`),
    /// made if missing, as [`lock_outputs`] locks a file; `shard`: this run
    /// is model shard `(K, N)` of a run whose shards share the folder (see
    /// the module docs).
    pub fn lock_folder(
        &mut self,
        flag: &'static str,
        folder: &Path,
        shard: Option<(u64, u64)>,
    ) -> Result<(), LockError> {
        let io_error = |source| LockError::Io { flag, path: folder.to_path_buf(), lock: folder.to_path_buf(), source };
        // Named by its canonical path, so that `.` and `out/` have a name to lock by.
        std::fs::create_dir_all(folder).map_err(io_error)?;
        let canonical = folder.canonicalize().map_err(io_error)?;
        let lock = sidecar(&canonical).map_err(io_error)?;
        let Some((index, count)) = shard else {
            if !self.held.iter().any(|held| held.path == lock) {
                self.held.push(lock_one(flag, folder, "folder", lock, false)?);
            }
            return Ok(());
        };
        let mut shard_name = std::ffi::OsString::from(".");
        shard_name.push(canonical.file_name().unwrap_or_default());
        shard_name.push(format!(".shard-{index}-of-{count}.isorun-lock"));
        let shard_lock = lock.with_file_name(shard_name);
        // Both or neither: a shard refused lets go of the folder at once.
        let folder_held = match self.held.iter().any(|held| held.path == lock) {
            true => None,
            false => Some(lock_one(flag, folder, "folder", lock, true)?),
        };
        let shard_held = match self.held.iter().any(|held| held.path == shard_lock) {
            true => None,
            false => Some(lock_one(flag, folder, "folder", shard_lock, false)?),
        };
        self.held.extend(folder_held.into_iter().chain(shard_held));
        Ok(())
    }
}

/// Locks each `(flag, path)` output for this run; the same file named by
/// two flags is locked once. The first output another run holds is an error.
pub fn lock_outputs(outputs: &[(&'static str, &Path)]) -> Result<OutputLocks, LockError> {
    let mut locks = OutputLocks::default();
    for &(flag, path) in outputs {
        let lock = sidecar(path).map_err(|source| LockError::Io {
            flag,
            path: path.to_path_buf(),
            lock: path.to_path_buf(),
            source,
        })?;
        if locks.held.iter().any(|held| held.path == lock) {
            continue;
        }
        locks.held.push(lock_one(flag, path, "file", lock, false)?);
    }
    Ok(locks)
}

/// The sidecar lock file of `output`: `.NAME.isorun-lock` in its folder,
/// which is made if missing (the report is written there later anyway). The
/// folder is named by its canonical path, so that two spellings of one
/// output (`r.json`, `./out/../r.json`, a linked folder) share a lock.
fn sidecar(output: &Path) -> io::Result<PathBuf> {
    let name = output
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path does not name a file"))?;
    let folder = match output.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder)?;
    let mut lock_name = std::ffi::OsString::from(".");
    lock_name.push(name);
    lock_name.push(".isorun-lock");
    Ok(folder.canonicalize()?.join(lock_name))
}

/// Takes the lock on `lock` for `output` (given as `flag`; `what` it is:
/// a file or a folder), alone or `shared`, or says who holds it.
fn lock_one(
    flag: &'static str,
    output: &Path,
    what: &'static str,
    lock: PathBuf,
    shared: bool,
) -> Result<HeldLock, LockError> {
    let io_error = |source| LockError::Io { flag, path: output.to_path_buf(), lock: lock.clone(), source };
    loop {
        // Never through a link: in a folder others can write, a planted
        // `.r.json.isorun-lock` link must not make isorun write elsewhere.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock)
            .map_err(io_error)?;
        let locked = if shared { file.try_lock_shared() } else { file.try_lock() };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held { flag, path: output.to_path_buf(), holder: holder(&file), what })
            }
            Err(TryLockError::Error(e)) => return Err(io_error(e)),
        }
        // Its holder may have ended and removed it between our open and
        // our lock: that file is no one's any more; lock the one there now.
        if !same_file(&file, &lock) {
            continue;
        }
        // Written over, then cut: a reader never sees it empty, only the
        // old holder's pid or ours (of a shared lock, the last sharer's).
        let me = format!("{}{}\n", std::process::id(), hostname().map(|h| format!(" {h}")).unwrap_or_default());
        file.write_all_at(me.as_bytes(), 0).map_err(io_error)?;
        file.set_len(me.len() as u64).map_err(io_error)?;
        return Ok(HeldLock { path: lock, file, shared });
    }
}

/// Whether `path` is still the file `file` has open.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(open), Ok(there)) => open.dev() == there.dev() && open.ino() == there.ino(),
        _ => false,
    }
}

/// Who holds a lock, from its sidecar's `PID [HOST]` line: `pid 1234`, or
/// `pid 1234 on node7` when it runs on another machine (a shared folder).
fn holder(file: &File) -> String {
    // The holder writes its pid just after it locks a new sidecar: a
    // moment's wait, bounded, before saying the pid is unknown.
    for _ in 0..50 {
        // At most a line's worth: the file is anyone's in a shared folder.
        let mut line = [0u8; 256];
        let read = file.read_at(&mut line, 0).unwrap_or(0);
        let text = String::from_utf8_lossy(&line[..read]);
        let mut words = text.split_whitespace();
        if let Some(pid) = words.next().and_then(|pid| pid.parse::<u32>().ok()) {
            return match words.next() {
                Some(host) if Some(host) != hostname().as_deref() => format!("pid {pid} on {host}"),
                _ => format!("pid {pid}"),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    "pid unknown".to_string()
}

/// This machine's name, for lock files in a folder several machines share.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty() && !name.contains(char::is_whitespace)).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(folder: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_second_writer_is_refused_naming_the_file_and_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let report = tmp.path().join("r.json");
        let first = lock_outputs(&[("--report", &report)]).unwrap();
        // flock locks belong to an open file, so this process's second open is refused too.
        let error = lock_outputs(&[("--junit", tmp.path().join("r.xml").as_path()), ("--report", &report)])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            format!(
                "--report {}: another isorun (pid {}) is writing this file; \
                 wait for that run to end, or give this run another path",
                report.display(),
                std::process::id()
            )
        );
        // The refused run's other lock was let go with it.
        assert_eq!(names(tmp.path()), [".r.json.isorun-lock"]);
        drop(first);
        assert_eq!(names(tmp.path()), Vec::<String>::new(), "an ended run leaves no lock file");
        let again = lock_outputs(&[("--report", &report)]).unwrap();
        drop(again);
    }

    #[test]
    fn one_file_named_twice_or_spelled_twice_is_locked_once() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let plain = tmp.path().join("r.json");
        let spelled = tmp.path().join("sub/../r.json");
        let locks = lock_outputs(&[("--report", &plain), ("--junit", &spelled)]).unwrap();
        assert_eq!(locks.held.len(), 1);
        assert!(matches!(lock_outputs(&[("--html", &spelled)]), Err(LockError::Held { flag: "--html", .. })));
    }

    #[test]
    fn a_stale_lock_file_is_taken_over_and_a_missing_folder_made() {
        let tmp = tempfile::tempdir().unwrap();
        let report = tmp.path().join("new/r.json");
        std::fs::create_dir(tmp.path().join("new")).unwrap();
        // A killed run's sidecar: a pid, no lock.
        std::fs::write(tmp.path().join("new/.r.json.isorun-lock"), "4000000000 elsewhere\n").unwrap();
        let locks = lock_outputs(&[("--report", &report)]).unwrap();
        let text = std::fs::read_to_string(tmp.path().join("new/.r.json.isorun-lock")).unwrap();
        assert!(text.starts_with(&format!("{} ", std::process::id())) && text.ends_with('\n'), "{text:?}");
        drop(locks);
        let deeper = tmp.path().join("a/b/r.json");
        drop(lock_outputs(&[("--report", &deeper)]).unwrap());
        assert!(tmp.path().join("a/b").is_dir());
    }

    #[test]
    fn a_holder_on_another_machine_is_named_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join(".r.json.isorun-lock");
        std::fs::write(&lock, "1234 node7\n").unwrap();
        let held = File::open(&lock).unwrap();
        held.try_lock().unwrap();
        let error = lock_outputs(&[("--journal", &tmp.path().join("r.json"))]).unwrap_err().to_string();
        assert!(error.contains("another isorun (pid 1234 on node7) is writing this file"), "{error}");
    }

    #[test]
    fn a_folder_is_locked_alone_or_shared_by_the_shards_of_one_run() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let mut alone = OutputLocks::default();
        alone.lock_folder("--output-dir", &out, None).unwrap();
        assert!(out.is_dir(), "the folder is made");
        let mut second = OutputLocks::default();
        let error = second.lock_folder("--predictions", &out.join("."), None).unwrap_err();
        let said = format!("another isorun (pid {}) is writing this folder;", std::process::id());
        assert!(error.to_string().contains(&said), "{error}");
        assert!(matches!(error, LockError::Held { flag: "--predictions", .. }));
        let mut shard = OutputLocks::default();
        let error = shard.lock_folder("--output-dir", &out, Some((0, 2))).unwrap_err();
        assert!(error.to_string().contains(" is writing this folder;"), "a shard's folder: {error}");
        drop(alone);
        // Shards 0 and 1 of one run write side by side; shard 0 twice, or a run of the whole, is refused.
        let mut zero = OutputLocks::default();
        zero.lock_folder("--output-dir", &out, Some((0, 2))).unwrap();
        let mut one = OutputLocks::default();
        one.lock_folder("--output-dir", &out, Some((1, 2))).unwrap();
        let mut zero_again = OutputLocks::default();
        assert!(matches!(zero_again.lock_folder("--output-dir", &out, Some((0, 2))), Err(LockError::Held { .. })));
        let mut whole = OutputLocks::default();
        assert!(matches!(whole.lock_folder("--output-dir", &out, None), Err(LockError::Held { .. })));
        assert_eq!(
            names(tmp.path()),
            [".out.isorun-lock", ".out.shard-0-of-2.isorun-lock", ".out.shard-1-of-2.isorun-lock", "out"]
        );
        // The first shard to end leaves the folder's lock to the other; the last removes it.
        drop(zero);
        assert_eq!(names(tmp.path()), [".out.isorun-lock", ".out.shard-1-of-2.isorun-lock", "out"]);
        assert!(matches!(whole.lock_folder("--output-dir", &out, None), Err(LockError::Held { .. })));
        drop(one);
        assert_eq!(names(tmp.path()), ["out"], "the shards leave no lock file");
        whole.lock_folder("--output-dir", &out, None).unwrap();
    }

    #[test]
    fn a_planted_link_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim.txt");
        std::fs::write(&victim, "the user's own file").unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join(".r.json.isorun-lock")).unwrap();
        let error = lock_outputs(&[("--report", &tmp.path().join("r.json"))]).unwrap_err();
        assert!(matches!(error, LockError::Io { .. }), "{error}");
        assert!(error.to_string().contains(".r.json.isorun-lock"), "{error}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file");
    }
}
