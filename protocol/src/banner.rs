//! TensorFlow's start-up banner: lines every worker prints on stderr
//! whatever its model does. Stderr tails (records, the HTML failure box)
//! leave them out, so the lines that say what went wrong stay in view.

/// What TensorFlow prints on every start, whatever the model does: a
/// tail of these would push out the lines that say what went wrong.
const TENSORFLOW_BANNER: [&str; 11] = [
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
    "cudart_stub.cc",
    "Could not find cuda drivers on your machine",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "TF-TRT Warning: Could not find TensorRT",
    "failed call to cuInit",
];

/// True for a line of TensorFlow's start-up banner (the oneDNN notice, the
/// absl line, the CUDA stubs' lines on a machine without GPU), which
/// `stderr_tail` leaves out.
pub fn is_tensorflow_banner(line: &str) -> bool {
    TENSORFLOW_BANNER.iter().any(|banner| line.contains(banner))
}
