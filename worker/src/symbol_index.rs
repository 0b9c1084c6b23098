//! Where oneDNN's sgemm is in each libtensorflow a zygote has loaded, kept
//! on disk. The build finds it in the library it links, but most Python
//! users run another build (the `tensorflow` wheel rather than
//! `tensorflow-cpu`), where that index names another symbol. Finding it by
//! name means reading ~200 MB of symbol and string tables, which a zygote
//! cannot afford at its start (and must not do on a second thread): so the
//! zygote asks a process of its own (`isorun-worker --index-symbols LIB
//! DIR`, detached) to scan the library and write the index into `DIR`,
//! one small file per library, named after its identity (device, inode,
//! size, modification time). From then on a zygote reads that file: one
//! open and a read of a few bytes, then the same checks by name as for the
//! build's index (`onednn.rs`).

use crate::elf_symbol::{look_up, Lookup};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The symbol the index is of.
pub const SYMBOL: &str = "dnnl_threadpool_interop_sgemm";

/// Bumped when what an entry says changes meaning.
const FORMAT: &str = "isorun-symbol-index 1";

/// Longest entry read back (an entry is two short lines).
const MAX_ENTRY: u64 = 4096;

/// A scan lock older than this was left by a scan that died.
const STALE_LOCK: Duration = Duration::from_secs(600);

/// What an entry says about a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The symbol is at this index of its symbol table.
    At(u64),
    /// The library has no such symbol, and why.
    Absent(String),
}

/// The folder of the index when the supervisor named none:
/// `$XDG_CACHE_HOME/isorun/symbols`, or `$HOME/.cache/isorun/symbols`.
pub fn default_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join("symbols"))
}

/// The first line of a library's entry: what identifies the open `file`.
fn identity(file: &File) -> io::Result<String> {
    let m = file.metadata()?;
    Ok(format!(
        "{FORMAT} {SYMBOL} dev {} ino {} size {} mtime {}.{:09}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// FNV-1a: a short, stable name for an identity (the entry repeats the
/// identity, so two that share a name are told apart).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The entry's path for the library open as `file`, and its identity.
pub fn entry_path(dir: &Path, file: &File) -> io::Result<(PathBuf, String)> {
    let identity = identity(file)?;
    Ok((dir.join(format!("sgemm-{:016x}", fnv1a(&identity))), identity))
}

/// The entry for the library open as `file`, if one was written for it.
pub fn read(dir: &Path, file: &File) -> Option<Entry> {
    let (path, identity) = entry_path(dir, file).ok()?;
    let mut text = String::new();
    File::open(path).ok()?.take(MAX_ENTRY).read_to_string(&mut text).ok()?;
    let mut lines = text.lines();
    if lines.next() != Some(identity.as_str()) {
        return None;
    }
    let what = lines.next()?;
    if let Some(index) = what.strip_prefix("at ") {
        return index.parse().ok().map(Entry::At);
    }
    what.strip_prefix("absent ").map(|why| Entry::Absent(why.to_string()))
}

/// Scans the library at `library` for the symbol and writes its entry into
/// `dir` (made if missing; written whole or not at all); the entry.
pub fn scan_and_store(dir: &Path, library: &Path) -> io::Result<Entry> {
    let file = File::open(library)?;
    let entry = match look_up(&file, SYMBOL)? {
        Lookup::At(index) => Entry::At(index),
        Lookup::Absent => Entry::Absent(format!("{} has no {SYMBOL} in its symbol table", library.display())),
        Lookup::NoTable => Entry::Absent(format!(
            "{} has no symbol table to search (not an ELF64 little-endian library with a .symtab or .dynsym)",
            library.display()
        )),
    };
    std::fs::create_dir_all(dir)?;
    let (path, identity) = entry_path(dir, &file)?;
    let what = match &entry {
        Entry::At(index) => format!("at {index}"),
        Entry::Absent(why) => format!("absent {}", why.replace('\n', " ")),
    };
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let written = File::create(&temporary)
        .and_then(|mut f| f.write_all(format!("{identity}\n{what}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&temporary, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map(|()| entry)
}

/// `isorun-worker --index-symbols LIB DIR`: scans LIB and writes its entry
/// into DIR, then removes the scan's lock; the exit code.
pub fn main(args: &[String]) -> i32 {
    let [library, dir] = args else {
        eprintln!("isorun-worker: --index-symbols takes a library and a folder, got {} arguments", args.len());
        return 2;
    };
    let (library, dir) = (Path::new(library), Path::new(dir));
    let code = match scan_and_store(dir, library) {
        Ok(Entry::At(index)) => {
            println!("{SYMBOL} is symbol {index} of {}", library.display());
            0
        }
        Ok(Entry::Absent(why)) => {
            println!("{why}");
            0
        }
        Err(e) => {
            eprintln!("isorun-worker: cannot index {} into {}: {e}", library.display(), dir.display());
            1
        }
    };
    if let Ok(path) = File::open(library).and_then(|f| entry_path(dir, &f)).map(|(p, _)| lock_path(&p)) {
        let _ = std::fs::remove_file(path);
    }
    code
}

fn lock_path(entry: &Path) -> PathBuf {
    entry.with_extension("scanning")
}

/// Takes the scan lock of the library open as `file`: false where another
/// scan holds it (a lock older than [`STALE_LOCK`] is taken over).
fn lock(dir: &Path, file: &File) -> io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let (entry, _) = entry_path(dir, file)?;
    let lock = lock_path(&entry);
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let age = std::fs::metadata(&lock)?.modified()?;
                if SystemTime::now().duration_since(age).unwrap_or_default() < STALE_LOCK {
                    return Ok(false);
                }
                std::fs::remove_file(&lock)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Starts `isorun-worker --index-symbols LIBRARY DIR` (this executable),
/// detached (its own session, stdio on `/dev/null`, not this process's
/// child once it runs), unless another scan of the library is under way:
/// whether one was started. Forks: only from a single-threaded process.
pub fn start_scan(dir: &Path, library: &Path, file: &File) -> io::Result<bool> {
    if !lock(dir, file)? {
        return Ok(false);
    }
    let exe = CString::new("/proc/self/exe").map_err(io::Error::other)?;
    let args: Vec<CString> = [
        std::ffi::OsStr::new("isorun-worker"),
        std::ffi::OsStr::new("--index-symbols"),
        library.as_os_str(),
        dir.as_os_str(),
    ]
    .iter()
    .map(|a| CString::new(a.as_bytes()))
    .collect::<Result<_, _>>()
    .map_err(io::Error::other)?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // Without the zygote's eager binding of every symbol, which only a
    // process that forks gains from.
    let environment: Vec<CString> = std::env::vars_os()
        .filter(|(name, _)| name != "LD_BIND_NOW")
        .filter_map(|(name, value)| {
            let mut pair = name.into_vec();
            pair.push(b'=');
            pair.extend(value.into_vec());
            CString::new(pair).ok()
        })
        .collect();
    let mut envp: Vec<*const libc::c_char> = environment.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: fork in a single-threaded process (the caller's promise);
    // between fork and exec the children call only async-signal-safe
    // functions on memory prepared before the fork, and never return.
    unsafe {
        let middle = libc::fork();
        if middle < 0 {
            return Err(io::Error::last_os_error());
        }
        if middle == 0 {
            libc::setsid();
            if libc::fork() == 0 {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    for fd in 0..3 {
                        libc::dup2(null, fd);
                    }
                }
                // A background job: below the workers, which it must not slow.
                libc::setpriority(libc::PRIO_PROCESS, 0, 10);
                libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            libc::_exit(0);
        }
        let mut status = 0;
        libc::waitpid(middle, &mut status, 0);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_read_back_only_for_the_same_library() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("lib.so");
        std::fs::write(&library, b"not an ELF file").unwrap();
        let entries = dir.path().join("symbols");
        assert_eq!(read(&entries, &File::open(&library).unwrap()), None, "nothing written yet");
        let entry = scan_and_store(&entries, &library).unwrap();
        assert!(matches!(&entry, Entry::Absent(why) if why.contains("no symbol table")), "{entry:?}");
        assert_eq!(read(&entries, &File::open(&library).unwrap()), Some(entry));
        // Another library at the same path (another size): another entry.
        std::fs::write(&library, b"not an ELF file either").unwrap();
        assert_eq!(read(&entries, &File::open(&library).unwrap()), None);
        // An entry whose identity line is another library's is not believed.
        let file = File::open(&library).unwrap();
        let (path, _) = entry_path(&entries, &file).unwrap();
        std::fs::write(&path, "isorun-symbol-index 1 dnnl_threadpool_interop_sgemm dev 0 ino 0\nat 5\n").unwrap();
        assert_eq!(read(&entries, &file), None);
        let (_, identity) = entry_path(&entries, &file).unwrap();
        std::fs::write(&path, format!("{identity}\nat 5\n")).unwrap();
        assert_eq!(read(&entries, &file), Some(Entry::At(5)));
        std::fs::write(&path, format!("{identity}\nat five\n")).unwrap();
        assert_eq!(read(&entries, &file), None, "an index that is no number");
    }

    #[test]
    fn one_scan_holds_a_librarys_lock_until_it_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("lib.so");
        std::fs::write(&library, b"x").unwrap();
        let file = File::open(&library).unwrap();
        let entries = dir.path().join("symbols");
        assert!(lock(&entries, &file).unwrap());
        assert!(!lock(&entries, &file).unwrap(), "a second scan waits for the first");
        let (entry, _) = entry_path(&entries, &file).unwrap();
        let old = SystemTime::now() - STALE_LOCK - Duration::from_secs(1);
        File::options().write(true).open(lock_path(&entry)).unwrap().set_modified(old).unwrap();
        assert!(lock(&entries, &file).unwrap(), "a dead scan's lock is taken over");
    }
}
