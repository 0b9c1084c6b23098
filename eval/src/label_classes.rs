//! Class names as labels (`--label-classes cat,dog,bird`): metrics count
//! classes by index, and a model's classes are the indices of its outputs,
//! but a CSV or Parquet file written for people names them (`cat`, `dog`).
//! The order given maps each name to its index (0..k-1); a label that is
//! not one of them is an error naming the file, the row, the value and the
//! classes, never a guess. Without the flag, a string label is refused
//! before any work with an error that says how to give it, showing the first
//! distinct values found ([`missing_classes`]).

use crate::error::DataError;
use std::collections::HashMap;
use std::path::Path;

/// How many distinct label values an error shows.
pub(crate) const SHOWN_VALUES: usize = 5;
/// How many class names an error lists before it says how many there are.
const SHOWN_CLASSES: usize = 20;
/// How many rows are looked at for the distinct values a missing flag's
/// error shows.
pub(crate) const SAMPLED_ROWS: usize = 1024;
/// The longest a shown value may be, in characters.
const SHOWN_CHARS: usize = 40;

/// Class names in the order given: a string label's class is its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelClasses {
    names: Vec<String>,
    index: HashMap<Vec<u8>, i64>,
}

impl LabelClasses {
    /// The classes named in order; at least one, none empty or named twice.
    pub fn new(names: Vec<String>) -> Result<LabelClasses, DataError> {
        let invalid = |reason: String| DataError::InvalidSpec { reason: format!("--label-classes: {reason}") };
        if names.is_empty() {
            return Err(invalid("no class names given; expected NAME,NAME,... in class index order".into()));
        }
        let mut index = HashMap::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() {
                return Err(invalid(format!("class {i} has an empty name")));
            }
            if let Some(first) = index.insert(name.as_bytes().to_vec(), i as i64) {
                return Err(invalid(format!("'{name}' is named twice (classes {first} and {i})")));
            }
        }
        Ok(LabelClasses { names, index })
    }

    /// The names, in class index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The class of a label value, if it is one of the names.
    pub(crate) fn class_of(&self, value: &[u8]) -> Option<i64> {
        self.index.get(value).copied()
    }

    /// What a label that is not a class is told: the value and the classes.
    pub(crate) fn unknown(&self, value: &[u8]) -> String {
        let mut listed: Vec<String> = self.names.iter().take(SHOWN_CLASSES).map(|n| shown(n.as_bytes())).collect();
        if self.names.len() > SHOWN_CLASSES {
            listed.push(format!("... ({} in all)", self.names.len()));
        }
        format!("{} is not one of --label-classes: {}", shown(value), listed.join(", "))
    }
}

/// A value as an error shows it: quoted, cut at [`SHOWN_CHARS`] characters.
pub(crate) fn shown(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let mut out: String = text.chars().take(SHOWN_CHARS).collect();
    if text.chars().nth(SHOWN_CHARS).is_some() {
        out.push_str("...");
    }
    format!("'{}'", out.replace('\'', "\\'"))
}

/// The first [`SHOWN_VALUES`] distinct values of `values`, in the order met.
pub(crate) fn distinct<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for value in values {
        if seen.len() == SHOWN_VALUES {
            break;
        }
        if !seen.iter().any(|s| s == value) {
            seen.push(value.to_vec());
        }
    }
    seen
}

/// The error of a string label read without `--label-classes`: what the
/// label holds and how to name its classes, with the first distinct
/// values found (`values`, from the first rows).
pub(crate) fn missing_classes(path: &Path, what: &str, values: &[Vec<u8>]) -> DataError {
    let example: Vec<String> = values.iter().map(|v| String::from_utf8_lossy(v).replace(',', "")).collect();
    let shown: Vec<String> = values.iter().map(|v| shown(v)).collect();
    let hint = if values.is_empty() {
        "name the classes, in index order, with --label-classes NAME,NAME,...".to_string()
    } else {
        format!(
            "the first rows hold {}{}: name every class, in index order, with --label-classes (e.g. \
             --label-classes {})",
            shown.join(", "),
            if values.len() == SHOWN_VALUES { ", ..." } else { "" },
            example.join(","),
        )
    };
    DataError::Array { path: path.to_path_buf(), reason: format!("labels are numbers, not {what}; {hint}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_their_index_and_others_are_named_with_the_classes() {
        let classes = LabelClasses::new(vec!["cat".into(), "dog".into()]).unwrap();
        assert_eq!(classes.class_of(b"cat"), Some(0));
        assert_eq!(classes.class_of(b"dog"), Some(1));
        assert_eq!(classes.class_of(b"fish"), None);
        assert_eq!(classes.unknown(b"fish"), "'fish' is not one of --label-classes: 'cat', 'dog'");
    }

    #[test]
    fn empty_and_repeated_names_are_refused() {
        let error =
            |names: &[&str]| LabelClasses::new(names.iter().map(|n| n.to_string()).collect()).unwrap_err().to_string();
        assert!(error(&[]).contains("no class names given"));
        assert!(error(&["a", ""]).contains("class 1 has an empty name"));
        assert!(error(&["a", "b", "a"]).contains("'a' is named twice (classes 0 and 2)"));
    }

    #[test]
    fn distinct_keeps_the_first_values_in_order() {
        let values: Vec<&[u8]> = vec![b"b", b"a", b"b", b"c", b"d", b"e", b"f", b"g"];
        assert_eq!(distinct(values), vec![b"b".to_vec(), b"a".to_vec(), b"c".to_vec(), b"d".to_vec(), b"e".to_vec()]);
    }
}
