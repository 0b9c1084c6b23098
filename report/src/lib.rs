//! Reports of a whole run, for people and machines that were not watching
//! it: a JSON document to keep and compare (`--report`), JUnit XML for CI
//! (`--junit`), a self-contained HTML page (`--html`), and the commands
//! that read reports back: [`diff`] (what changed since last time, for
//! `isorun report diff`) and [`merge`] (shard reports joined into one;
//! [`merge_data_shards`] first, for the data shards of `eval --data-shard`).
//!
//! Reports are built from the same unit records `run` prints
//! ([`record::unit_record`], the one place a record's keys are decided), so
//! a report never knows more or less than the JSON lines did. The journal
//! ([`journal`]) and shards ([`shard`]) keep and split those records across
//! runs and machines.

pub mod change;
mod data_merge;
mod diff;
mod document;
mod escape;
pub mod eval_record;
mod files;
mod html;
pub mod journal;
mod junit;
mod merge;
pub mod record;
mod reliability;
pub mod shard;
pub mod table;
pub mod text;
mod timestamp;
mod unit;

pub use data_merge::{data_shard_of, merge_data_shards, DataMerge};
pub use diff::{diff, Finding, Thresholds};
pub use document::{build, summary, RunInfo, OLDEST_SCHEMA_VERSION, SCHEMA_VERSION};
pub use files::{read_report, write_file_atomically, write_files};
pub use html::{escape_html, html_page};
pub use junit::junit_xml;
pub use merge::{given_shards, merge, merge_with_models, missing_shards, read_model_list};
pub use timestamp::{format_rfc3339, parse_rfc3339, unix_milliseconds};

use std::path::PathBuf;

/// Why a report could not be read, merged or written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not JSON", path.display())]
    NotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: not an isorun report: {what}", path.display())]
    NotAReport { path: PathBuf, what: String },
    #[error(
        "{}: not an isorun report but {what} (JSON Lines); to make a report, run the same command again with {how}",
        path.display()
    )]
    JsonLines { path: PathBuf, what: &'static str, how: String },
    #[error("{}: report schema_version {found}, but this isorun reads versions {OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION}", path.display())]
    SchemaVersion { path: PathBuf, found: String },
    #[error("model {model} is in two reports: {} and {}", first.display(), second.display())]
    DuplicateModel { model: String, first: PathBuf, second: PathBuf },
    #[error("model {model} is in the {which} report twice")]
    TwiceInReport { model: String, which: &'static str },
    #[error("no report to merge")]
    NothingToMerge,
    #[error("cannot merge the run report {} with the eval report {}: they are not shards of one run", run.display(), eval.display())]
    MixedKinds { run: PathBuf, eval: PathBuf },
    #[error("{} is shard {first} but {} is shard {second}: not shards of one run", first_path.display(), second_path.display())]
    ShardCounts { first: String, first_path: PathBuf, second: String, second_path: PathBuf },
    #[error(
        "missing {}: {} given; give every shard's report, or --partial to merge these anyway \
         (or --models models.json, which adds the missing shards' models as not_run)",
        missing.join(", "), given.join(", ")
    )]
    MissingShards { missing: Vec<String>, given: Vec<String> },
    #[error("{} is a data shard (eval --data-shard) but {} is not: not shards of one evaluation", sharded.display(), other.display())]
    NotADataShard { sharded: PathBuf, other: PathBuf },
    #[error(
        "{} and {} are not data shards of one evaluation: their settings.{key} differ ({values}); {hint}",
        first.display(), second.display()
    )]
    DataSettings {
        first: PathBuf,
        second: PathBuf,
        key: String,
        /// `FIRST against SECOND`.
        values: String,
        hint: &'static str,
    },
    #[error("{shard} is in two reports: {} and {}", first.display(), second.display())]
    DataShardTwice { shard: String, first: PathBuf, second: PathBuf },
    #[error("{}: model {model}: {reason}", path.display())]
    BadState { path: PathBuf, model: String, reason: String },
    #[error("{}: settings.eval rule '{rule}': {reason}", path.display())]
    BadRule { path: PathBuf, rule: String, reason: String },
    #[error("{}: not a model list (the models.json of isorun slurm submit): {what}", path.display())]
    NotAModelList { path: PathBuf, what: String },
    #[error("{}: settings.{key} is {shard}: not a shard K/N (K must be from 0 to N-1, and N at least 1)", path.display())]
    BadShard { path: PathBuf, key: &'static str, shard: String },
    #[error("{}: model {model}: the summed {what} of its data shards overflow a 64-bit count", path.display())]
    Overflow { path: PathBuf, model: String, what: String },
    #[error("{flag} {value}: expected a positive number")]
    BadRatio { flag: &'static str, value: f64 },
    #[error("{}: cannot write", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot make the JUnit XML", path.display())]
    Junit {
        path: PathBuf,
        #[source]
        source: Box<quick_junit::SerializeError>,
    },
}
