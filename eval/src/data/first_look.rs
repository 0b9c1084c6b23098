//! The first look at a dataset, before any batch: the first example's
//! features (or the first file's columns), the label's kind read from them,
//! and the checks a column's type must pass to be a label, a weight or an
//! input. `Dataset::open` and `Dataset::reader` ask it once; the reader
//! asks the column checks again of every later file it opens.

use crate::batch::LabelKind;
use crate::element;
use crate::error::DataError;
use crate::example::Example;
use crate::format::Format;
use crate::label_classes::{self, LabelClasses};
use crate::source::{ColumnInfo, Look, Options, Piece, Values};
use isorun_protocol::DType;
use std::path::{Path, PathBuf};

/// What the first example (or the first file's columns) shows.
#[derive(Debug, Clone)]
pub(super) struct FirstLook {
    pub(super) path: PathBuf,
    pub(super) what: Seen,
}

#[derive(Debug, Clone)]
pub(super) enum Seen {
    /// Feature names with their kind and length.
    Features(Vec<(String, &'static str, usize)>),
    Columns(Vec<ColumnInfo>),
}

impl FirstLook {
    pub(super) fn available(&self) -> String {
        let names: Vec<String> = match &self.what {
            Seen::Features(features) => {
                features.iter().map(|(n, kind, len)| format!("{n} ({kind}, {len} values)")).collect()
            }
            Seen::Columns(columns) => columns.iter().map(|c| format!("{} ({})", c.name, c.describe)).collect(),
        };
        if names.is_empty() {
            "nothing".into()
        } else {
            names.join(", ")
        }
    }

    /// The features' (or columns') names, in the order [`FirstLook::available`] lists them.
    pub(super) fn names(&self) -> Vec<String> {
        match &self.what {
            Seen::Features(features) => features.iter().map(|(n, ..)| n.clone()).collect(),
            Seen::Columns(columns) => columns.iter().map(|c| c.name.clone()).collect(),
        }
    }

    pub(super) fn has(&self, name: &str) -> bool {
        match &self.what {
            Seen::Features(features) => features.iter().any(|(n, ..)| n == name),
            Seen::Columns(columns) => columns.iter().any(|c| c.name == name),
        }
    }

    pub(super) fn column(&self, name: &str) -> Option<&ColumnInfo> {
        match &self.what {
            Seen::Features(_) => None,
            Seen::Columns(columns) => columns.iter().find(|c| c.name == name),
        }
    }
}

/// An example's features, sorted by name: name, kind and value count.
fn feature_list(example: &Example) -> Vec<(String, &'static str, usize)> {
    let mut features: Vec<(String, &'static str, usize)> = example
        .features
        .iter()
        .flat_map(|f| f.feature.iter())
        .map(|(k, f)| (k.clone(), f.kind_name(), f.len()))
        .collect();
    features.sort();
    features
}

/// The first example of the first file that has one (row formats), or the
/// first file's columns (columnar formats, whose files all show columns).
pub(super) fn first_look(files: &[(PathBuf, Format)], options: &Options) -> Result<FirstLook, DataError> {
    for (path, format) in files {
        let what = match format.info().peek(path, options)? {
            None => continue,
            Some(Look::Example(example)) => Seen::Features(feature_list(&example)),
            Some(Look::Columns(columns)) => Seen::Columns(columns),
        };
        return Ok(FirstLook { path: path.clone(), what });
    }
    Err(DataError::Empty { path: files[0].0.clone() })
}

/// Why a label cannot be read: a data error, or a string label without
/// `--label-classes` (whose error shows the first values, read by the caller).
pub(super) enum LabelError {
    Data(DataError),
    Strings { path: PathBuf, what: &'static str },
}

impl From<DataError> for LabelError {
    fn from(e: DataError) -> Self {
        LabelError::Data(e)
    }
}

pub(super) fn label_kind(
    first: &FirstLook,
    label: &str,
    classes: Option<&LabelClasses>,
) -> Result<LabelKind, LabelError> {
    match &first.what {
        Seen::Features(features) => {
            let (_, kind, len) = features.iter().find(|(n, ..)| n == label).expect("checked");
            let problem = match (*kind, *len, classes) {
                (_, 0, _) => "is empty",
                ("bytes_list", 1, Some(_)) => return Ok(LabelKind::Int),
                ("bytes_list", 1, None) => {
                    let path = PathBuf::from(format!("{}: feature '{label}'", first.path.display()));
                    return Err(LabelError::Strings { path, what: "bytes_list" });
                }
                ("bytes_list", _, Some(_)) => "is bytes_list of several values; --label-classes takes one class name",
                ("bytes_list", _, None) => "is bytes_list; labels are numbers (int64_list or float_list)",
                (_, _, Some(_)) => "is numbers, but --label-classes names the classes of a string label",
                (_, n, None) if n > 1 => return Ok(LabelKind::Matrix(n)),
                ("int64_list", _, None) => return Ok(LabelKind::Int),
                _ => return Ok(LabelKind::Float),
            };
            Err(LabelError::Data(DataError::Example {
                path: first.path.clone(),
                example: 0,
                record: 0,
                within: "this file".into(),
                key: label.to_string(),
                problem: format!("(the label) {problem}"),
            }))
        }
        Seen::Columns(_) => column_label_kind(first.column(label).expect("checked"), classes),
    }
}

/// The label kind of a column, checked for every file: numbers, at least
/// one per example, or with `--label-classes` one string per example.
pub(super) fn column_label_kind(column: &ColumnInfo, classes: Option<&LabelClasses>) -> Result<LabelKind, LabelError> {
    let strings = element::number(column.element, &[0; 8]).is_none();
    let fail = |reason: String| LabelError::Data(DataError::Array { path: column.path.clone(), reason });
    match (strings, classes, column.row_elements()) {
        (true, Some(_), 1) => Ok(LabelKind::Int),
        (true, Some(_), n) => {
            Err(fail(format!("--label-classes takes one class name per example, but this label has {n} values")))
        }
        (true, None, _) => Err(LabelError::Strings { path: column.path.clone(), what: "strings" }),
        (false, Some(_), _) => Err(fail(format!(
            "--label-classes names the classes of a string label, but this label is {}",
            column.describe
        ))),
        (false, None, 0) => Err(fail("labels have no values".into())),
        (false, None, 1) if element::is_integer(column.element) => Ok(LabelKind::Int),
        (false, None, 1) => Ok(LabelKind::Float),
        (false, None, n) => Ok(LabelKind::Matrix(n as usize)),
    }
}

/// The first distinct values of a string label, from the first rows of
/// `path` (for the error that asks for `--label-classes`); none when they
/// cannot be read.
pub(super) fn first_label_values(path: &Path, format: Format, label: &str, whole: &Options) -> Vec<Vec<u8>> {
    let options = Options { columns: vec![label.to_string()], ..whole.clone() };
    let Ok(mut source) = format.info().open(path, &options) else { return Vec::new() };
    let mut values: Vec<Vec<u8>> = Vec::new();
    let mut rows = 0;
    while rows < label_classes::SAMPLED_ROWS && values.len() < label_classes::SHOWN_VALUES {
        let piece = match source.next_piece(label_classes::SAMPLED_ROWS - rows) {
            Ok(Some(piece)) => piece,
            _ => break,
        };
        let found: Vec<Vec<u8>> = match piece {
            Piece::Example { example, .. } => {
                rows += 1;
                let feature = example.features.as_ref().and_then(|f| f.feature.get(label));
                match feature.and_then(|f| f.kind.as_ref()) {
                    Some(crate::example::Kind::BytesList(l)) => l.value.clone(),
                    _ => Vec::new(),
                }
            }
            Piece::Columns { rows: taken, mut columns } => {
                rows += taken.max(1);
                match columns.pop().map(|c| c.values) {
                    Some(Values::Strings(strings)) => strings,
                    Some(Values::Elements { element, bytes }) => bytes
                        .chunks_exact(element.item_size().max(1))
                        .filter_map(|chunk| element::string(element, chunk))
                        .collect(),
                    None => Vec::new(),
                }
            }
        };
        values.extend(found);
        values = label_classes::distinct(values.iter().map(Vec::as_slice));
    }
    values
}

/// A column of strings cannot feed a numeric input, nor numbers a string
/// input: refused from the first file's header or schema, before any work.
pub(super) fn check_input_column(column: &ColumnInfo, input: &isorun_protocol::TensorSpec) -> Result<(), DataError> {
    let numbers = element::number(column.element, &[0; 8]).is_some();
    if numbers == (input.dtype != DType::String) {
        return Ok(());
    }
    Err(DataError::Array {
        path: column.path.clone(),
        // A type ("string") is named as a column's; a description that is a
        // phrase of its own (JSON Lines' "an object or value ...") as it is.
        reason: if column.describe.starts_with("a ") || column.describe.starts_with("an ") {
            format!("{} cannot feed input {}", column.describe, input.describe())
        } else {
            format!("a {} column cannot feed input {}", column.describe, input.describe())
        },
    })
}

/// Weights are one number per example, in every file.
pub(super) fn check_weight_column(column: &ColumnInfo) -> Result<(), DataError> {
    if column.row_elements() != 1 || element::number(column.element, &[0; 8]).is_none() {
        return Err(DataError::Array {
            path: column.path.clone(),
            reason: format!("weights must be one number per example, not {}", column.describe),
        });
    }
    Ok(())
}
