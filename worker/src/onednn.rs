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
//! on the calling thread and starts none), at the address the library's full
//! symbol table gives. `build.rs` finds the symbol's index once in the
//! library it links; here a few positioned reads check that the loaded
//! library's symbol at that index has that name, is a function, and lies in
//! the library's mapped code, whose bytes are the file's at that symbol;
//! and that the file's program headers are the loaded ones. Anything else (another TensorFlow, a stripped library, no index)
//! skips the warm-up: workers then generate the kernels themselves, as
//! before.

use crate::elf_symbol::{symbol_named_at, ElfSymbol, STT_FUNC};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

const LIBRARY: &str = "libtensorflow_cc.so.2";
const SYMBOL: &str = "dnnl_threadpool_interop_sgemm";

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

/// oneDNN's sgemm in the loaded libtensorflow, when every check holds.
fn find() -> Option<Sgemm> {
    let index = built_index()?;
    let lib = loaded(LIBRARY)?;
    let file = File::open(&lib.path).ok()?;
    if !same_program_headers(&file, &lib.headers) {
        return None;
    }
    let symbol = symbol_named_at(&file, index, SYMBOL)?;
    if symbol.kind != STT_FUNC || !same_code(&file, &lib, &symbol) {
        return None;
    }
    let address = lib.bias.checked_add(symbol.value).filter(|&a| a != 0)?;
    // SAFETY: the address is the start of the function named SYMBOL in the
    // loaded library's code, whose C signature oneDNN documents as `Sgemm`.
    Some(unsafe { std::mem::transmute::<usize, Sgemm>(address as usize) })
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

/// Set once this process (or the zygote it was forked from) has made the
/// kernels.
static WARMED: AtomicBool = AtomicBool::new(false);

/// Makes oneDNN generate its sgemm kernels in this process, on this
/// thread: a small product (the no-copy kernels a small model's `MatMul`
/// uses) and a larger one (the packing kernels). Whether it could.
pub fn warm_sgemm() -> bool {
    let Some(sgemm) = find() else { return false };
    let done = [(8, 16, 32), (256, 256, 256)].into_iter().all(|(m, n, k)| {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32).collect();
        multiply(sgemm, &a, &b, m, n, k).is_some()
    });
    WARMED.store(done, Ordering::Relaxed);
    done
}

/// Whether this process has oneDNN's sgemm kernels already: a worker
/// forked from a zygote whose [`warm_sgemm`] worked.
pub fn warmed() -> bool {
    WARMED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onednns_sgemm_is_found_in_the_loaded_libtensorflow_and_multiplies() {
        // The worker links libtensorflow: it is loaded in this test binary.
        let Some(sgemm) = find() else {
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
        assert!(warm_sgemm());
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
}
