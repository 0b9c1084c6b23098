//! The capped tail of a child's stderr, shared by exec'd workers
//! (`worker.rs`) and the zygotes that fork them (`zygote.rs`). It is a leaf of
//! its own so that neither of those two modules has to import the other for
//! it.

use isorun_protocol::is_tensorflow_banner;
use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::Mutex;

/// The last lines a worker wrote to stderr, capped in lines and bytes.
#[derive(Debug, Default)]
pub struct StderrTail {
    lines: VecDeque<String>,
}

const STDERR_LINES: usize = 20;
const STDERR_LINE_BYTES: usize = 2000;

impl StderrTail {
    fn push(&mut self, line: &[u8]) {
        if is_tensorflow_banner(&String::from_utf8_lossy(&line[..line.len().min(STDERR_LINE_BYTES)])) {
            return;
        }
        let mut text = String::from_utf8_lossy(&line[..line.len().min(STDERR_LINE_BYTES)]).into_owned();
        if line.len() > STDERR_LINE_BYTES {
            text.push_str(" [...]");
        }
        if self.lines.len() == STDERR_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(text.trim_end().to_string());
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

pub(super) fn collect_stderr(pipe: impl Read, tail: &Mutex<StderrTail>) {
    // Reads lines of any length without holding more than a capped prefix
    // of each, so a worker that floods stderr neither blocks nor bloats us.
    let mut reader = BufReader::with_capacity(64 * 1024, pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        loop {
            let buf = match reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if buf.is_empty() {
                if !line.is_empty() {
                    if let Ok(mut t) = tail.lock() {
                        t.push(&line);
                    }
                }
                return;
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            if line.len() < STDERR_LINE_BYTES + 1 {
                let room = STDERR_LINE_BYTES + 1 - line.len();
                line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            let consumed = done.unwrap_or(buf.len());
            reader.consume(consumed);
            if done.is_some() {
                break;
            }
        }
        if let Ok(mut t) = tail.lock() {
            t.push(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_leaves_out_tensorflow_s_start_up_banner() {
        let said = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1733000000.000000   12 cuda_executor.cc:1015] failed call to cuInit: INTERNAL: CUDA error
2026-12-02 06:00:00.000000: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers on your machine, GPU will not be used.
2026-12-02 06:00:00.000000: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
2026-12-02 06:00:00.000000: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
Traceback: the model's own error
";
        let tail = Mutex::new(StderrTail::default());
        collect_stderr(said.as_bytes(), &tail);
        assert_eq!(tail.lock().unwrap().lines(), ["Traceback: the model's own error"]);
        // Still bounded: 20 lines at most.
        let flood = "line\n".repeat(100);
        let tail = Mutex::new(StderrTail::default());
        collect_stderr(flood.as_bytes(), &tail);
        assert_eq!(tail.lock().unwrap().lines().len(), 20);
    }
}
