//! What the worker's ONNX test binaries share: where ONNX Runtime's library
//! and the ONNX fixtures are. Each binary uses some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// ONNX Runtime's library, where `scripts/fetch-onnxruntime` puts it.
pub fn library() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/fetch-onnxruntime"))
        .arg("--print-dir")
        .output()
        .expect("scripts/fetch-onnxruntime --print-dir runs");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let found = std::fs::read_dir(&dir).ok().and_then(|entries| {
        entries
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so.1")))
    });
    found.unwrap_or_else(|| {
        panic!(
            "ONNX Runtime's library (libonnxruntime.so.1.*) is not in {}: run scripts/fetch-onnxruntime first",
            dir.display()
        )
    })
}

/// The ONNX fixture `name` (under tests/fixtures/onnx), as an absolute path.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx").join(name);
    std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_string_lossy().into_owned()
}
