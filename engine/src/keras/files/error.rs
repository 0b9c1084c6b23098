//! Why a Keras file could not be read: the one error of both readers
//! (`archive`, `h5`), and how far into an `.h5` file the reader looks,
//! which its message names.

/// How much of an HDF5 file is searched for the model's attributes.
pub const H5_SCAN_BYTES: u64 = 16 << 20;

/// Why a Keras file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KerasFileError {
    #[error("{path}: cannot read")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a .keras archive (a zip holding config.json): {reason}")]
    NotAnArchive { path: String, reason: String },
    #[error("{path}: {member} is not valid JSON: {reason}")]
    BadJson { path: String, member: &'static str, reason: String },
    #[error("{path}: not an HDF5 file")]
    NotHdf5 { path: String },
    #[error("{path}: holds weights only (no model_config attribute); a model needs its architecture: save it with model.save(\"model.keras\")")]
    WeightsOnly { path: String },
    #[error("{path}: the model_config attribute is not where isorun looks (the root group's attributes, in the first {} MiB); the export reads it with Keras", H5_SCAN_BYTES >> 20)]
    H5ConfigNotFound { path: String },
    /// `entry`: the name as stored, escaped (`{:?}` of its bytes read lossily).
    #[error("{path}: refused: archive entry {entry} {reason}; a .keras archive's entry names must read one way only (plain, unique, printable paths)")]
    AmbiguousEntry { path: String, entry: String, reason: String },
    #[error("{path}: refused: its zip central directory {reason}; Python's zipfile, which Keras reads with, and isorun's zip reader could read different entries")]
    AmbiguousDirectory { path: String, reason: String },
}
