//! oneDNN's matrix-product kernels, made once in the zygote rather than in
//! every worker. A worker's first `MatMul` on the CPU makes oneDNN generate
//! (JIT) its whole table of small-matrix sgemm kernels, ~40 ms of CPU per
//! process here: measured with `perf`, the largest first-use cost a forked
//! worker paid over one process that loads the same models one after
//! another. The generated code and its `call_once` are plain memory, which a
//! fork inherits, so the zygote pays it once if it can call oneDNN before it
//! forks.
//!
//! TensorFlow hides oneDNN's C API (the library exports none of it), and a
//! TensorFlow session cannot run in the zygote: it starts threads and seeds
//! TensorFlow's per-process random numbers, which every worker would then
//! share. So the zygote calls oneDNN's documented
//! `dnnl_threadpool_interop_sgemm` itself, with no thread pool (it then runs
//! on the calling thread and starts none), at the address the library's
//! symbol table gives. Which symbol: `build.rs` finds its index once in the
//! library it links; where the library loaded is another build (the
//! `tensorflow` wheel rather than `tensorflow-cpu`), the index comes from
//! the per-library symbol index (`symbol_index.rs`), which a scan in a
//! process of its own fills the first time a zygote meets that library.
//! Either way a few positioned reads check that the loaded library's symbol
//! at that index has that name, is a function, and lies in the library's
//! mapped code, whose bytes are the file's at that symbol; and that the
//! file's program headers are the loaded ones. Anything else skips the
//! warm-up, and says why: every forked worker reports it in its `Hello`
//! (`-v` and `isorun doctor` print it); workers then generate the kernels
//! themselves, as before.

use crate::elf_symbol::{symbol_named_at, ElfSymbol, STT_FUNC};
use crate::symbol_index::{self, Entry, SYMBOL};
use isorun_protocol::{OnednnWarmup, ENV_SYMBOL_CACHE};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const LIBRARY: &str = "libtensorflow_cc.so.2";

/// `dnnl_threadpool_interop_sgemm(transa, transb, M, N, K, alpha, A, lda,
/// B, ldb, beta, C, ldc, threadpool)`: `C = alpha·op(A)·op(B) + beta·C`,
/// row-major, `dnnl_dim_t` being `int64_t`; 0 is `dnnl_success`. C++
/// inside: `C-unwind`, so that an exception (`bad_alloc`) that escapes is
/// an abort, not undefined behaviour.
type Sgemm = unsafe extern "C-unwind" fn(
    c_char,
    c_char,
    i64,
    i64,
    i64,
    f32,
    *const f32,
    i64,
    *const f32,
    i64,
    f32,
    *mut f32,
    i64,
    *mut c_void,
) -> c_int;

/// The symbol's index in the `.symtab` of the libtensorflow this worker was
/// built against (`build.rs`), if it found one.
fn built_index() -> Option<u64> {
    option_env!("ISORUN_ONEDNN_SGEMM_INDEX").and_then(|i| i.parse().ok())
}

/// A loaded shared object: its path, load bias and program headers.
struct Loaded {
    path: String,
    bias: u64,
    headers: Vec<libc::Elf64_Phdr>,
}

/// The loaded object whose path ends in `/name`.
fn loaded(name: &str) -> Option<Loaded> {
    struct Search<'a> {
        suffix: String,
        name: &'a str,
        found: Option<Loaded>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the dynamic linker passes a valid info for the duration of
        // the call, and `data` is the `Search` below, borrowed mutably for it.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated path owned by the dynamic linker.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
        if !(path.ends_with(&search.suffix) || path == search.name) || info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_phnum` headers at `dlpi_phdr`, as the linker says.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        search.found = Some(Loaded { path: path.into_owned(), bias: info.dlpi_addr, headers: headers.to_vec() });
        1
    }
    let mut search = Search { suffix: format!("/{name}"), name, found: None };
    // SAFETY: `each` only reads what the linker passes and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut search as *mut Search as *mut c_void) };
    search.found
}

/// Whether `file`'s program headers are, byte for byte, those loaded.
fn same_program_headers(file: &File, loaded: &[libc::Elf64_Phdr]) -> bool {
    let mut header = [0u8; 64];
    if file.read_exact_at(&mut header, 0).is_err() {
        return false;
    }
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().unwrap_or_default());
    let phentsize = usize::from(u16::from_le_bytes([header[0x36], header[0x37]]));
    let phnum = usize::from(u16::from_le_bytes([header[0x38], header[0x39]]));
    let size = std::mem::size_of::<libc::Elf64_Phdr>();
    if phentsize != size || phnum != loaded.len() {
        return false;
    }
    let mut in_file = vec![0u8; size * phnum];
    if file.read_exact_at(&mut in_file, phoff).is_err() {
        return false;
    }
    // SAFETY: `loaded` is a slice of plain-data headers; viewed as bytes.
    let in_memory = unsafe { std::slice::from_raw_parts(loaded.as_ptr() as *const u8, size * phnum) };
    in_file == in_memory
}

/// The longest function whose code [`same_code`] compares.
const MAX_CODE: u64 = 1 << 20;

/// Whether the code `symbol` names, as mapped in this process, is byte for
/// byte the code at that symbol in `file`: wholly inside the file-backed
/// part of a readable, executable `PT_LOAD` segment of the loaded object,
/// and equal there (a shared library's code has no relocations). This is
/// what the call relies on, whatever the path, a link on it or the file
/// system (`/proc/self/maps` names an overlayfs file by another device).
fn same_code(file: &File, lib: &Loaded, symbol: &ElfSymbol) -> bool {
    let Some(end) = symbol.value.checked_add(symbol.size) else { return false };
    if symbol.size == 0 || symbol.size > MAX_CODE {
        return false;
    }
    let Some(segment) = lib.headers.iter().find(|h| {
        h.p_type == libc::PT_LOAD
            && h.p_flags & libc::PF_X != 0
            && h.p_flags & libc::PF_R != 0
            && h.p_vaddr <= symbol.value
            && end <= h.p_vaddr.saturating_add(h.p_filesz)
    }) else {
        return false;
    };
    let Some(offset) = segment.p_offset.checked_add(symbol.value - segment.p_vaddr) else { return false };
    let mut in_file = vec![0u8; symbol.size as usize];
    if file.read_exact_at(&mut in_file, offset).is_err() {
        return false;
    }
    let Some(address) = lib.bias.checked_add(symbol.value) else { return false };
    // SAFETY: the range lies in a readable segment the dynamic linker
    // mapped for this object (its program headers, checked above).
    let in_memory = unsafe { std::slice::from_raw_parts(address as usize as *const u8, symbol.size as usize) };
    in_file == in_memory
}

/// What to do where neither the build's index nor the symbol index knows
/// the loaded library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Start a scan in a detached process and go on without: a zygote,
    /// which must start at once and stay single-threaded.
    Detached,
    /// Scan here and wait (`--onednn-warmup`, for `isorun doctor`).
    Here,
    /// Only look: a zygote's look before a fork, while its scan runs.
    No,
}

/// Why the sgemm was not found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NotFound {
    /// The symbol index is being made: a later look may find it.
    Pending(String),
    /// Not in this library, or not callable safely: why.
    Never(String),
}

/// oneDNN's sgemm in the loaded libtensorflow, when every check holds, and
/// where its index came from.
fn find(dir: Option<&Path>, scan: Scan) -> Result<(Sgemm, String), NotFound> {
    let never = |why: String| NotFound::Never(why);
    let lib = loaded(LIBRARY).ok_or_else(|| never(format!("no {LIBRARY} is loaded")))?;
    let file = File::open(&lib.path).map_err(|e| never(format!("cannot open {}: {e}", lib.path)))?;
    if !same_program_headers(&file, &lib.headers) {
        return Err(never(format!("{} is not the library loaded (its program headers differ)", lib.path)));
    }
    let built = built_index().filter(|&index| symbol_named_at(&file, index, SYMBOL).is_some());
    let (index, from) = match built {
        Some(index) => (index, "the index its build found".to_string()),
        None => index_of_loaded(dir, scan, &lib.path, &file)?,
    };
    let symbol = symbol_named_at(&file, index, SYMBOL)
        .ok_or_else(|| never(format!("symbol {index} of {} is not {SYMBOL} ({from})", lib.path)))?;
    if symbol.kind != STT_FUNC {
        return Err(never(format!("{SYMBOL} of {} is not a function", lib.path)));
    }
    if !same_code(&file, &lib, &symbol) {
        return Err(never(format!("the code of {SYMBOL} mapped is not {}'s", lib.path)));
    }
    let address = lib.bias.checked_add(symbol.value).filter(|&a| a != 0);
    let address = address.ok_or_else(|| never(format!("{SYMBOL} of {} has no address", lib.path)))?;
    // SAFETY: the address is the start of the function named SYMBOL in the
    // loaded library's code, whose C signature oneDNN documents as `Sgemm`.
    let sgemm = unsafe { std::mem::transmute::<usize, Sgemm>(address as usize) };
    Ok((sgemm, format!("{SYMBOL}, symbol {index} of {}, from {from}", lib.path)))
}

/// The symbol's index in the loaded library `path`, open as `file`, from
/// the symbol index in `dir` (made as `scan` says where it is missing),
/// with where it came from.
fn index_of_loaded(dir: Option<&Path>, scan: Scan, path: &str, file: &File) -> Result<(u64, String), NotFound> {
    let Some(dir) = dir else {
        return Err(NotFound::Never(format!(
            "{path} is not the build isorun-worker was linked with, and there is no folder for its symbol index \
             ({ENV_SYMBOL_CACHE}, XDG_CACHE_HOME and HOME are unset)"
        )));
    };
    let pending = || {
        NotFound::Pending(format!(
            "{path} is not the build isorun-worker was linked with, and its symbol index (in {}) is being made, \
             the first time this library is used: workers forked once it is ready get the warm-up",
            dir.display()
        ))
    };
    let absent = |why: String| NotFound::Never(format!("{why} (another TensorFlow build)"));
    match symbol_index::read(dir, file) {
        Some(Entry::At(index)) => return Ok((index, format!("the symbol index in {}", dir.display()))),
        Some(Entry::Absent(why)) => return Err(absent(why)),
        None => {}
    }
    match scan {
        Scan::No => Err(pending()),
        Scan::Detached => match symbol_index::start_scan(dir, Path::new(path), file) {
            Ok(_) => Err(pending()),
            Err(e) => Err(NotFound::Never(format!("cannot start a scan of {path} for its symbol index: {e}"))),
        },
        Scan::Here => match symbol_index::scan_and_store(dir, Path::new(path)) {
            Ok(Entry::At(index)) => Ok((index, format!("a scan of it, now in the symbol index in {}", dir.display()))),
            Ok(Entry::Absent(why)) => Err(absent(why)),
            Err(e) => Err(NotFound::Never(format!("cannot index {path} into {}: {e}", dir.display()))),
        },
    }
}

/// The folder of the symbol index: the supervisor's, else the default.
fn index_dir() -> Option<PathBuf> {
    std::env::var_os(ENV_SYMBOL_CACHE).filter(|d| !d.is_empty()).map(PathBuf::from).or_else(symbol_index::default_dir)
}

/// `C = A·B` (row-major, `m`×`k` by `k`×`n`) through `sgemm` with no thread
/// pool; whether oneDNN said it succeeded.
fn multiply(sgemm: Sgemm, a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Option<Vec<f32>> {
    assert!(a.len() == m * k && b.len() == k * n);
    let mut c = vec![0f32; m * n];
    let (m, n, k) = (m as i64, n as i64, k as i64);
    // SAFETY: the buffers are m×k, k×n and m×n floats with those leading
    // dimensions; a null thread pool makes oneDNN compute on this thread.
    let status = unsafe {
        sgemm(
            b'N' as c_char,
            b'N' as c_char,
            m,
            n,
            k,
            1.0,
            a.as_ptr(),
            k,
            b.as_ptr(),
            n,
            0.0,
            c.as_mut_ptr(),
            n,
            std::ptr::null_mut(),
        )
    };
    (status == 0).then_some(c)
}

/// Whether this process (or the zygote it was forked from) has made the
/// kernels, and why not; `NotForked` until a zygote tried. A fork inherits it.
static STATE: Mutex<OnednnWarmup> = Mutex::new(OnednnWarmup::NotForked);

/// Whether the zygote should look for the symbol index again before a fork.
static PENDING: Mutex<bool> = Mutex::new(false);

fn set_state(state: OnednnWarmup) {
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = state;
}

/// Makes oneDNN generate its sgemm kernels in this process, on this
/// thread: a small product (the no-copy kernels a small model's `MatMul`
/// uses) and a larger one (the packing kernels). What it found, or why not.
fn warm_with(scan: Scan) -> Result<String, String> {
    let found = find(index_dir().as_deref(), scan);
    *PENDING.lock().unwrap_or_else(|e| e.into_inner()) = matches!(found, Err(NotFound::Pending(_)));
    let (sgemm, what) = found.map_err(|e| match e {
        NotFound::Pending(why) | NotFound::Never(why) => why,
    })?;
    let done = [(8, 16, 32), (256, 256, 256)].into_iter().all(|(m, n, k)| {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32).collect();
        multiply(sgemm, &a, &b, m, n, k).is_some()
    });
    match done {
        true => Ok(what),
        false => Err(format!("oneDNN's sgemm ({what}) said it failed")),
    }
}

/// The zygote's warm-up, before it serves: where the loaded library is not
/// yet in the symbol index, starts its scan and goes on without
/// ([`warm_if_indexed`] looks again before each fork). Whether it worked.
pub fn warm_sgemm() -> bool {
    let result = warm_with(Scan::Detached);
    let done = result.is_ok();
    set_state(result.map_or_else(OnednnWarmup::NotInForce, |_| OnednnWarmup::InForce));
    done
}

/// Before a fork: while the zygote's scan of its library runs, whether its
/// index is there now, and if so the warm-up (~40 ms, once).
pub fn warm_if_indexed() {
    if !*PENDING.lock().unwrap_or_else(|e| e.into_inner()) {
        return;
    }
    if let Some(dir) = index_dir() {
        let Some(lib) = loaded(LIBRARY) else { return };
        let ready = File::open(&lib.path).ok().and_then(|file| symbol_index::read(&dir, &file)).is_some();
        if !ready {
            return;
        }
    }
    let result = warm_with(Scan::No);
    set_state(result.map_or_else(OnednnWarmup::NotInForce, |_| OnednnWarmup::InForce));
}

/// `isorun-worker --onednn-warmup`: whether a zygote with the library
/// this process loaded would make oneDNN's kernels (indexing the library
/// now where it is not yet), as one line (`in force: …` or `not in force:
/// …`) for `isorun doctor`.
pub fn probe() -> String {
    match warm_with(Scan::Here) {
        Ok(what) => format!("in force: the zygote makes oneDNN's sgemm kernels once for its workers ({what})"),
        Err(why) => format!("not in force: {why}; each worker makes oneDNN's sgemm kernels itself (~40 ms of CPU)"),
    }
}

/// What this worker says in its `Hello`: whether it has oneDNN's sgemm
/// kernels from its zygote.
pub fn state() -> OnednnWarmup {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether this process has oneDNN's sgemm kernels already: a worker
/// forked from a zygote whose [`warm_sgemm`] worked.
pub fn warmed() -> bool {
    state() == OnednnWarmup::InForce
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onednns_sgemm_is_found_in_the_loaded_libtensorflow_and_multiplies() {
        // The worker links libtensorflow: it is loaded in this test binary.
        let Ok((sgemm, _)) = find(None, Scan::No) else {
            assert!(built_index().is_none(), "build.rs found the symbol, but the loaded library's check failed");
            eprintln!("NOTE: no oneDNN sgemm in this libtensorflow's symbol table; the zygote skips its warm-up");
            return;
        };
        let (m, n, k) = (3, 2, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32) - 3.0).collect();
        let want: Vec<f32> =
            (0..m * n).map(|ij| (0..k).map(|l| a[(ij / n) * k + l] * b[l * n + ij % n]).sum()).collect();
        assert_eq!(multiply(sgemm, &a, &b, m, n, k), Some(want));
        // Never `Scan::Detached` here: a test binary has threads, so it must not fork.
        assert!(warm_with(Scan::No).is_ok());
    }

    #[test]
    fn a_wrong_index_or_name_is_refused() {
        let Some(lib) = loaded(LIBRARY) else { return };
        let file = File::open(&lib.path).unwrap();
        assert!(same_program_headers(&file, &lib.headers));
        let Some(index) = built_index() else { return };
        assert!(symbol_named_at(&file, index, SYMBOL).is_some());
        assert!(symbol_named_at(&file, index + 1, SYMBOL).is_none(), "another symbol's name");
        assert!(symbol_named_at(&file, index, "dnnl_threadpool_interop_sgemm2").is_none());
        assert!(symbol_named_at(&file, u64::MAX / 24, SYMBOL).is_none(), "past the table");
        let symbol = symbol_named_at(&file, index, SYMBOL).unwrap();
        assert!(same_code(&file, &lib, &symbol), "the mapped code is the file's");
        // Another file has neither its headers nor its code there.
        let other = File::open(std::env::current_exe().unwrap()).unwrap();
        assert!(!same_program_headers(&other, &lib.headers));
        assert!(!same_code(&other, &lib, &symbol));
        // A copy of the library whose function differs by one byte, reached
        // through a link: same headers, same symbol, but not the code mapped.
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("libtensorflow_cc.so.2");
        std::fs::copy(&lib.path, &copy).unwrap();
        let segment = lib.headers.iter().find(|h| h.p_flags & libc::PF_X != 0 && h.p_vaddr <= symbol.value).unwrap();
        let at = segment.p_offset + (symbol.value - segment.p_vaddr) + symbol.size / 2;
        let changed = std::fs::OpenOptions::new().read(true).write(true).open(&copy).unwrap();
        let mut byte = [0u8];
        changed.read_exact_at(&mut byte, at).unwrap();
        changed.write_all_at(&[byte[0] ^ 0xff], at).unwrap();
        std::os::unix::fs::symlink(&copy, tmp.path().join("link")).unwrap();
        let copy = File::open(tmp.path().join("link")).unwrap();
        assert!(same_program_headers(&copy, &lib.headers), "a copy has the same headers");
        assert_eq!(symbol_named_at(&copy, index, SYMBOL), Some(symbol), "and the same symbol");
        assert!(!same_code(&copy, &lib, &symbol), "but not the code mapped");
        // A symbol that claims more code than its segment holds, or none.
        assert!(!same_code(&file, &lib, &ElfSymbol { size: u64::MAX - symbol.value, ..symbol }));
        assert!(!same_code(&file, &lib, &ElfSymbol { size: 0, ..symbol }));
    }

    #[test]
    fn another_builds_index_comes_from_the_symbol_index_or_says_why_not() {
        // The library loaded here stands for another build: its index is
        // looked up in a fresh symbol index, as for one the build never saw.
        let Some(lib) = loaded(LIBRARY) else { return };
        let file = File::open(&lib.path).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("symbols");
        let Err(NotFound::Pending(why)) = index_of_loaded(Some(&dir), Scan::No, &lib.path, &file) else {
            panic!("an empty index is a pending scan")
        };
        assert!(why.contains("is being made"), "{why}");
        let Err(NotFound::Never(why)) = index_of_loaded(None, Scan::No, &lib.path, &file) else {
            panic!("no folder for the index")
        };
        assert!(why.contains("no folder for its symbol index"), "{why}");
        let (index, from) = match index_of_loaded(Some(&dir), Scan::Here, &lib.path, &file) {
            Ok(found) => found,
            Err(NotFound::Never(why)) if built_index().is_none() => {
                eprintln!("NOTE: {why}");
                return;
            }
            Err(e) => panic!("{e:?}"),
        };
        assert!(from.contains("a scan of it"), "{from}");
        assert_eq!(symbol_named_at(&file, index, SYMBOL).map(|s| s.kind), Some(STT_FUNC));
        if let Some(built) = built_index() {
            assert_eq!(index, built, "the scan finds what the build found");
        }
        let (again, from) = index_of_loaded(Some(&dir), Scan::No, &lib.path, &file).unwrap();
        assert_eq!((again, from.contains("the symbol index in")), (index, true), "{from}");
        // A library the index says has no such symbol: never, and why.
        let (entry, identity) = symbol_index::entry_path(&dir, &file).unwrap();
        std::fs::write(&entry, format!("{identity}\nabsent {} has no {SYMBOL} in its symbol table\n", lib.path))
            .unwrap();
        let Err(NotFound::Never(why)) = index_of_loaded(Some(&dir), Scan::No, &lib.path, &file) else {
            panic!("an absent entry is final")
        };
        assert!(why.contains("has no dnnl_threadpool_interop_sgemm in its symbol table"), "{why}");
    }
}
