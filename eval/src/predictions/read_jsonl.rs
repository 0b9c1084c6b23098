//! A JSON Lines predictions file's lines, each walked straight into the
//! columns of one batch ([`JsonBatch`]): the keys eval wrote are read and
//! checked (each once, the output at its saved width, refused at the first
//! value past it), every other key skipped without being built.

use super::columns::{output_column, slice_column, INDEX, KEY, LABEL, WEIGHT};
use super::json_scalar::Scalar;
use super::meta::Meta;
use super::read_batch::{err, stored_dtype, ReadError, RescoreBatch, READ_ROWS};
use crate::data::{Labels, Targets};
use isorun_protocol::{DType, Tensor};
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::path::Path;

/// A key of a predictions row that is read (the rest are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Index,
    Key,
    Label,
    Weight,
    Output,
    Slice(usize),
}

/// One batch of a JSON Lines predictions file, built a line at a time:
/// each line's values go straight into these columns.
pub(super) struct JsonBatch {
    /// The keys read, by name, and which column each fills.
    fields: Vec<(String, Field)>,
    /// Which of [`JsonBatch::fields`] the current line has had.
    seen: Vec<bool>,
    dtype: DType,
    scalar: bool,
    width: usize,
    labels: Labels,
    weights: Option<Vec<f64>>,
    keys: Option<Vec<String>>,
    slices: Vec<(String, Vec<String>)>,
    /// The scored output's values, in `dtype`'s layout.
    bytes: Vec<u8>,
    first_index: Option<u64>,
    pub(super) rows: usize,
}

impl JsonBatch {
    pub(super) fn new(
        path: &Path,
        meta: &Meta,
        output: &str,
        slices: &[String],
        rows: usize,
    ) -> Result<JsonBatch, ReadError> {
        let saved = meta.saved(output).expect("checked by start");
        // Rows hold at most the budget's rows (see `rows_per_batch`); not more than READ_ROWS are reserved.
        let rows = rows.min(READ_ROWS);
        let labels = match meta.label_kind.as_deref().unwrap_or("int") {
            "int" => Labels::Int(Vec::with_capacity(rows)),
            "float" => Labels::Float(Vec::with_capacity(rows)),
            other => {
                let columns = other
                    .strip_prefix("matrix:")
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| err(path, format!("label kind '{other}' is unknown")))?;
                Labels::Matrix { columns, values: Vec::new() }
            }
        };
        let mut fields = vec![(INDEX.to_string(), Field::Index), (LABEL.to_string(), Field::Label)];
        if meta.example_key.is_some() {
            fields.push((KEY.to_string(), Field::Key));
        }
        if meta.weight.is_some() {
            fields.push((WEIGHT.to_string(), Field::Weight));
        }
        fields.extend(slices.iter().enumerate().map(|(i, s)| (slice_column(s), Field::Slice(i))));
        fields.push((output_column(output), Field::Output));
        Ok(JsonBatch {
            seen: vec![false; fields.len()],
            fields,
            dtype: stored_dtype(saved.dtype).0,
            scalar: saved.scalar(),
            width: saved.width(),
            labels,
            weights: meta.weight.as_ref().map(|_| Vec::with_capacity(rows)),
            keys: meta.example_key.as_ref().map(|_| Vec::with_capacity(rows)),
            slices: slices.iter().map(|s| (s.clone(), Vec::new())).collect(),
            // Grown as values are read: the row's width is the file's claim.
            bytes: Vec::new(),
            first_index: None,
            rows: 0,
        })
    }

    /// Reads one line (a JSON object) into the columns; why not, if not.
    pub(super) fn push_line(&mut self, text: &[u8]) -> Result<(), String> {
        self.seen.iter_mut().for_each(|s| *s = false);
        let mut de = serde_json::Deserializer::from_slice(text);
        RowSeed(self).deserialize(&mut de).and_then(|()| de.end()).map_err(|e| e.to_string())?;
        if let Some(i) = self.seen.iter().position(|s| !s) {
            return Err(format!("has no '{}'", self.fields[i].0));
        }
        self.rows += 1;
        Ok(())
    }

    /// Reads the value of `field` (the key `name`).
    fn read_value<'de, A: MapAccess<'de>>(&mut self, map: &mut A, name: &str, field: Field) -> Result<(), A::Error> {
        let fail = |reason: String| A::Error::custom(reason);
        match field {
            Field::Index => {
                let index =
                    map.next_value::<Scalar>()?.as_u64().ok_or_else(|| fail("'index' is not a count".into()))?;
                self.first_index.get_or_insert(index);
            }
            Field::Key => match map.next_value::<Scalar>()? {
                Scalar::Str(key) => self.keys.get_or_insert_with(Vec::new).push(key),
                _ => return Err(fail("'key' is not a string".into())),
            },
            Field::Weight => {
                let weight =
                    map.next_value::<Scalar>()?.as_f64().ok_or_else(|| fail("'weight' is not a number".into()))?;
                self.weights.get_or_insert_with(Vec::new).push(weight);
            }
            Field::Slice(i) => match map.next_value::<Scalar>()? {
                Scalar::Str(value) => self.slices[i].1.push(value),
                _ => return Err(fail(format!("'{name}' is not a string"))),
            },
            Field::Label => match &mut self.labels {
                Labels::Int(v) => v.push(
                    map.next_value::<Scalar>()?.as_i64().ok_or_else(|| fail("'label' is not an integer".into()))?,
                ),
                Labels::Float(v) => {
                    v.push(map.next_value::<Scalar>()?.as_f64().ok_or_else(|| fail("'label' is not a number".into()))?)
                }
                Labels::Matrix { columns, values } => {
                    let mut seed =
                        ListSeed { name, width: *columns, put: |s: &Scalar| s.as_f64().map(|v| values.push(v)) };
                    map.next_value_seed(&mut seed)?;
                }
            },
            Field::Output => {
                let (dtype, bytes) = (self.dtype, &mut self.bytes);
                if self.scalar {
                    let value = map.next_value::<Scalar>()?;
                    put_scalar(dtype, &value, bytes).ok_or_else(|| fail(format!("'{name}' holds {value}")))?;
                } else {
                    let mut seed = ListSeed { name, width: self.width, put: |s: &Scalar| put_scalar(dtype, s, bytes) };
                    map.next_value_seed(&mut seed)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn finish(self, output: &str, row_shape: &[u64]) -> RescoreBatch {
        let mut shape = vec![self.rows as u64];
        shape.extend_from_slice(row_shape);
        let targets = Targets {
            rows: self.rows,
            labels: self.labels,
            weights: self.weights,
            slices: self.slices,
            first_index: self.first_index.unwrap_or(0),
            keys: self.keys,
        };
        RescoreBatch { targets, output: (output.to_string(), Tensor::dense(self.dtype, shape, self.bytes)) }
    }
}

/// Reads one line's object into a [`JsonBatch`].
struct RowSeed<'a>(&'a mut JsonBatch);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (one row of isorun eval --predictions)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let batch = self.0;
        while let Some(at) = map.next_key_seed(KeySeed(&batch.fields))? {
            let Some(at) = at else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let (name, field) = batch.fields[at].clone();
            if std::mem::replace(&mut batch.seen[at], true) {
                return Err(A::Error::custom(format!("'{name}' appears twice")));
            }
            batch.read_value(&mut map, &name, field)?;
        }
        Ok(())
    }
}

/// A key, as its place among the keys read (`None`: skipped); never copied.
struct KeySeed<'a>(&'a [(String, Field)]);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|(name, _)| name == v))
    }
}

/// A list of `width` scalars, each handed to `put` (`None`: not what the
/// column holds), refused at the first value past `width`.
struct ListSeed<'n, F> {
    name: &'n str,
    width: usize,
    put: F,
}

impl<'de, F: FnMut(&Scalar) -> Option<()>> DeserializeSeed<'de> for &mut ListSeed<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(&Scalar) -> Option<()>> Visitor<'de> for &mut ListSeed<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{}' to be a list of {} values", self.name, self.width)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (name, width) = (self.name, self.width);
        let mut count = 0usize;
        while let Some(value) = seq.next_element::<Scalar>()? {
            if count == width {
                return Err(A::Error::custom(format!("'{name}' has more than {width} values, eval wrote {width}")));
            }
            (self.put)(&value).ok_or_else(|| A::Error::custom(format!("'{name}' holds {value}")))?;
            count += 1;
        }
        if count != width {
            return Err(A::Error::custom(format!("'{name}' has {count} values, eval wrote {width}")));
        }
        Ok(())
    }
}

/// Appends a JSON number in `dtype`'s layout; `None` when it does not fit.
fn put_scalar(dtype: DType, value: &Scalar, out: &mut Vec<u8>) -> Option<()> {
    match dtype {
        DType::Float32 => out.extend_from_slice(&(value.as_f64()? as f32).to_le_bytes()),
        DType::Float64 => out.extend_from_slice(&value.as_f64()?.to_le_bytes()),
        DType::Float16 => out.extend_from_slice(&half::f16::from_f64(value.as_f64()?).to_le_bytes()),
        DType::Int8 => out.extend_from_slice(&i8::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int16 => out.extend_from_slice(&i16::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int32 => out.extend_from_slice(&i32::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int64 => out.extend_from_slice(&value.as_i64()?.to_le_bytes()),
        DType::UInt8 => out.push(u8::try_from(value.as_u64()?).ok()?),
        DType::UInt16 => out.extend_from_slice(&u16::try_from(value.as_u64()?).ok()?.to_le_bytes()),
        DType::UInt32 => out.extend_from_slice(&u32::try_from(value.as_u64()?).ok()?.to_le_bytes()),
        DType::UInt64 => out.extend_from_slice(&value.as_u64()?.to_le_bytes()),
        DType::Bool => out.push(u8::from(value.as_bool()?)),
        DType::BFloat16 | DType::String => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            model: "m".into(),
            output: "p".into(),
            output_shape: Some(vec![None, Some(2)]),
            outputs: vec![super::super::SavedOutput { name: "p".into(), dtype: DType::Float32, row_shape: vec![2] }],
            label_kind: Some("int".into()),
            slices: vec!["s".into()],
            metrics: vec!["accuracy".into()],
            data_digest: "d".into(),
            ..Meta::new("y")
        }
    }

    fn push(lines: &[&str]) -> Result<RescoreBatch, String> {
        let mut batch = JsonBatch::new(Path::new("m.jsonl"), &meta(), "p", &["s".into()], 8).map_err(|e| e.reason)?;
        for line in lines {
            batch.push_line(line.as_bytes())?;
        }
        Ok(batch.finish("p", &[2]))
    }

    #[test]
    fn a_line_is_walked_into_its_columns_and_a_lie_is_named() {
        let good = r#"{"index":7,"label":1,"slice:s":"a","output:p":[0.5,2],"other":[[1,2],{"x":3}]}"#;
        let batch = push(&[good, good]).unwrap();
        assert_eq!(batch.targets.rows, 2);
        assert_eq!(batch.targets.first_index, 7);
        assert!(matches!(&batch.targets.labels, Labels::Int(v) if v == &[1, 1]));
        assert_eq!(batch.targets.slices, vec![("s".to_string(), vec!["a".to_string(), "a".to_string()])]);
        let isorun_protocol::TensorData::Dense(bytes) = &batch.output.1.data else { panic!("dense") };
        let expected: Vec<u8> = [0.5f32, 2.0, 0.5, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(batch.output.1.shape, vec![2, 2]);
        assert_eq!(bytes, &expected);
        for (line, says) in [
            (
                r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,1,2]}"#,
                "'output:p' has more than 2 values, eval wrote 2",
            ),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0]}"#, "'output:p' has 1 values, eval wrote 2"),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,null]}"#, "'output:p' holds null"),
            (r#"{"index":0,"label":1.5,"slice:s":"a","output:p":[0,1]}"#, "'label' is not an integer"),
            (r#"{"index":-1,"label":1,"slice:s":"a","output:p":[0,1]}"#, "'index' is not a count"),
            (r#"{"index":0,"label":1,"slice:s":3,"output:p":[0,1]}"#, "'slice:s' is not a string"),
            (r#"{"index":0,"label":1,"output:p":[0,1]}"#, "has no 'slice:s'"),
            (r#"{"index":0,"label":1,"label":2,"slice:s":"a","output:p":[0,1]}"#, "'label' appears twice"),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,1]} x"#, "trailing characters"),
            (r#"[1]"#, "expected a JSON object"),
        ] {
            let error = push(&[line]).err().unwrap_or_default();
            assert!(error.contains(says), "{line}: {error}");
        }
    }
}
