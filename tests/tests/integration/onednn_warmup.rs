//! The zygote's oneDNN warm-up (`worker/src/onednn.rs`) with libtensorflow
//! builds other than the one the worker linked: the `tensorflow` wheel of
//! the fixtures venv (what most Python users have: its library is another
//! build of 2.21.0), where the sgemm is found through the symbol index a
//! scan fills, and forked workers say in their `Hello` that they got it
//! (`-v` prints it); and a copy of the linked library whose symbol table no
//! longer names the sgemm, where `isorun doctor` and `-v` say the warm-up
//! is not in force, and why, and the models still run.

use crate::util::{copy_dir, fixtures, isorun, run, Ran};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The symbol the warm-up calls.
const SYMBOL: &[u8] = b"dnnl_threadpool_interop_sgemm";

/// The fixtures venv's `tensorflow` package folder, holding its
/// libtensorflow (made by `scripts/make-fixtures`), or `None` after saying
/// that `what` is skipped.
fn wheel_tensorflow(what: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let lib = cache.join("isorun/fixtures-venv/lib");
    let found = std::fs::read_dir(&lib).ok().into_iter().flatten().flatten().find_map(|python| {
        let dir = python.path().join("site-packages/tensorflow");
        dir.join("libtensorflow_cc.so.2").is_file().then_some(dir)
    });
    if found.is_none() {
        eprintln!("NOTE: {what} SKIPPED: no TensorFlow wheel with libtensorflow in {}", lib.display());
    }
    found
}

/// The libtensorflow the worker was built against: `ISORUN_LIBTENSORFLOW_DIR`,
/// else the `fetch-libtensorflow` cache, or `None` after saying that
/// `what` is skipped.
fn linked_libtensorflow(what: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("ISORUN_LIBTENSORFLOW_DIR").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache/isorun/libtensorflow-2.21.0-cpu")
    });
    if dir.join("libtensorflow_cc.so.2").is_file() {
        return Some(dir);
    }
    eprintln!("NOTE: {what} SKIPPED: no libtensorflow in {}", dir.display());
    None
}

/// `count` copies of the Keras MLP fixture, so that a slot forks workers.
fn mlps(root: &Path, count: usize) -> PathBuf {
    let models = root.join("models");
    for i in 0..count {
        copy_dir(&fixtures().join("models/keras_mlp"), &models.join(format!("mlp{i}")));
    }
    models
}

/// `isorun` with `XDG_CACHE_HOME` (where the symbol index goes) at `cache`.
fn isorun_cached(cache: &Path) -> Command {
    let mut command = isorun();
    command.env("XDG_CACHE_HOME", cache).env_remove("ISORUN_SYMBOL_CACHE").env_remove("ISORUN_LIBTENSORFLOW_DIR");
    command
}

/// `isorun run -v` of the models in `models` with `lib`, one slot, forking.
fn run_verbose(cache: &Path, lib: &Path, models: &Path) -> Ran {
    let inputs = fixtures().join("expected/keras_mlp__serving_default/inputs.npz");
    let ran = run(isorun_cached(cache)
        .args(["run", "-v", "--json", "-j", "1", "--spawn", "auto", "--libtensorflow-dir"])
        .arg(lib)
        .arg(models)
        .arg("--inputs")
        .arg(inputs));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let forked = ran.records.iter().filter(|r| r["worker_start"] == "fork").count();
    assert!(forked >= 2, "workers were forked from the zygote: {}", ran.stdout);
    ran
}

/// `isorun doctor`'s `onednn warm-up` line: status and detail.
fn doctor_warmup(cache: &Path, lib: &Path) -> (String, String) {
    let out = isorun_cached(cache).arg("doctor").arg("--libtensorflow-dir").arg(lib).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = stdout.lines().find_map(|l| l.strip_prefix("onednn warm-up")).unwrap_or_else(|| panic!("{stdout}"));
    let (status, detail) = line.trim_start().split_once(' ').unwrap();
    (status.to_string(), detail.trim_start().to_string())
}

/// The `-v` lines that say whether the warm-up is in force.
fn warmup_lines(ran: &Ran) -> Vec<&str> {
    ran.stderr.lines().filter(|l| l.contains("oneDNN warm-up")).collect()
}

#[test]
fn workers_forked_with_the_tensorflow_wheels_library_get_the_onednn_warm_up() {
    let Some(wheel) = wheel_tensorflow("the oneDNN warm-up with the tensorflow wheel") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (cache, models) = (tmp.path().join("cache"), mlps(tmp.path(), 4));
    // The first run meets the library: its zygote starts the scan and goes
    // on; workers forked before the index is there say so, those after it
    // have the kernels.
    let first = run_verbose(&cache, &wheel, &models);
    let lines = warmup_lines(&first);
    assert!(!lines.is_empty(), "-v says whether the warm-up is in force: {}", first.stderr);
    for line in &lines {
        assert!(line.contains("warm-up in force") || line.contains("is being made"), "{}", first.stderr);
    }
    let symbols = cache.join("isorun/symbols");
    let started = Instant::now();
    let entry = loop {
        let entries: Vec<PathBuf> = std::fs::read_dir(&symbols)
            .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_none()).collect())
            .unwrap_or_default();
        if let [entry] = &entries[..] {
            break entry.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(300), "no symbol index in {}", symbols.display());
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&entry).unwrap();
    assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("at ")), "{text}");
    // From then on every forked worker has them.
    let second = run_verbose(&cache, &wheel, &models);
    let lines = warmup_lines(&second);
    assert_eq!(lines.len(), 1, "{}", second.stderr);
    assert!(lines[0].contains("oneDNN warm-up in force"), "{}", second.stderr);
    let (status, detail) = doctor_warmup(&cache, &wheel);
    assert_eq!(status, "available", "{detail}");
    assert!(detail.starts_with("in force") && detail.contains("from the symbol index in"), "{detail}");
}

/// Replaces the last byte of every `\0dnnl_threadpool_interop_sgemm\0` in
/// `path` (the name in its string table): its symbol table then names no
/// such symbol, and nothing the dynamic linker loads changes. How many.
fn rename_the_sgemm(path: &Path) -> usize {
    let file = File::options().read(true).write(true).open(path).unwrap();
    let needle: Vec<u8> = [&[0u8][..], SYMBOL, &[0]].concat();
    let m = needle.len();
    // Horspool's search, which reads one byte in ~20: 800 MB unoptimised.
    let mut shift = [m; 256];
    for (i, &b) in needle[..m - 1].iter().enumerate() {
        shift[usize::from(b)] = m - 1 - i;
    }
    let (chunk, len) = (1usize << 24, file.metadata().unwrap().len());
    let mut buffer = vec![0u8; chunk + m];
    let (mut start, mut renamed) = (0u64, 0);
    while start < len {
        let n = ((chunk + m) as u64).min(len - start) as usize;
        file.read_exact_at(&mut buffer[..n], start).unwrap();
        let mut at = 0;
        while at + m <= n && at < chunk {
            let last = buffer[at + m - 1];
            if last == 0 && buffer[at..at + m] == needle[..] {
                file.write_all_at(b"X", start + (at + m - 2) as u64).unwrap();
                renamed += 1;
            }
            at += shift[usize::from(last)];
        }
        start += chunk as u64;
    }
    renamed
}

#[test]
fn a_libtensorflow_without_the_sgemm_says_the_warm_up_is_not_in_force_and_why() {
    let Some(linked) = linked_libtensorflow("the oneDNN warm-up without its symbol") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (cache, models, lib) = (tmp.path().join("cache"), mlps(tmp.path(), 3), tmp.path().join("lib"));
    std::fs::create_dir(&lib).unwrap();
    std::fs::copy(linked.join("libtensorflow_cc.so.2"), lib.join("libtensorflow_cc.so.2")).unwrap();
    std::os::unix::fs::symlink(linked.join("libtensorflow_framework.so.2"), lib.join("libtensorflow_framework.so.2"))
        .unwrap();
    assert!(rename_the_sgemm(&lib.join("libtensorflow_cc.so.2")) >= 1, "the name is in the library's strings");
    let why = "has no dnnl_threadpool_interop_sgemm in its symbol table";
    let (status, detail) = doctor_warmup(&cache, &lib);
    assert_eq!(status, "unavailable", "{detail}");
    assert!(detail.starts_with("not in force: ") && detail.contains(why), "{detail}");
    let ran = run_verbose(&cache, &lib, &models);
    let lines = warmup_lines(&ran);
    assert_eq!(lines.len(), 1, "{}", ran.stderr);
    assert!(lines[0].contains("oneDNN warm-up not in force: ") && lines[0].contains(why), "{}", ran.stderr);
    for record in &ran.records {
        assert_eq!(record["status"], "ok", "the models run all the same: {record}");
    }
}
