//! What a predictions file is made of, apart from how it is written or
//! read: its format, its column names and where a JSON Lines file keeps its
//! metadata. A leaf, so that the writer, the reader and the module that
//! re-exports them do not import each other.

/// How predictions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionsFormat {
    Parquet,
    Jsonl,
}

impl PredictionsFormat {
    /// `parquet` or `jsonl`, as `--predictions-format` takes them.
    pub fn from_name(name: &str) -> Option<PredictionsFormat> {
        match name {
            "parquet" => Some(PredictionsFormat::Parquet),
            "jsonl" => Some(PredictionsFormat::Jsonl),
            _ => None,
        }
    }

    /// The file name's extension.
    pub fn extension(self) -> &'static str {
        match self {
            PredictionsFormat::Parquet => "parquet",
            PredictionsFormat::Jsonl => "jsonl",
        }
    }
}

/// Column names.
pub const INDEX: &str = "index";
pub const KEY: &str = "key";
pub const LABEL: &str = "label";
pub const WEIGHT: &str = "weight";
/// `slice:<feature>`.
pub fn slice_column(feature: &str) -> String {
    format!("slice:{feature}")
}
/// `output:<name>`.
pub fn output_column(output: &str) -> String {
    format!("output:{output}")
}

/// The sidecar that holds a JSON Lines file's [`Meta`](super::Meta).
pub fn sidecar(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".isorun.json");
    std::path::PathBuf::from(name)
}
