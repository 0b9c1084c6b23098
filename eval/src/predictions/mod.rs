//! Per-example predictions (`isorun eval --predictions DIR`) and reading
//! them back (`isorun rescore`): one file per model, one row per example,
//! so that metrics can be recomputed, and two runs compared example by
//! example, in a process that never loads TensorFlow.
//!
//! Columns (Parquet; the same names as keys of each JSON Lines object):
//! `index` (uint64, the example's 0-based index in what was read), `key`
//! (string, with `--example-key`), `label` (int64, float64, or a list of
//! float64 for multi-value labels, as read), `weight` (float64, with
//! `--weight`), `slice:<feature>` (string, per `--slice`), and
//! `output:<name>` for the scored output (all outputs with
//! `--predictions-all`): a scalar column of the output's dtype for `[N]`
//! and `[N, 1]`, a list column for wider rows (bfloat16 is stored as
//! float32, which holds it exactly; strings as binary).
//!
//! [`Meta`] says what the file holds and how eval scored it: Parquet keeps
//! it as the file's key-value metadata `isorun` (JSON), JSON Lines in a
//! sidecar `<file>.isorun.json`, so that every line of the `.jsonl` is a row
//! and pandas reads it as it is.

mod columns;
mod diff;
mod json_scalar;
mod meta;
mod pair;
mod read;
mod read_arrow;
mod read_batch;
mod read_jsonl;
mod write;

pub use columns::{output_column, sidecar, slice_column, PredictionsFormat, INDEX, KEY, LABEL, WEIGHT};
pub use diff::{mcnemar_exact_p, Changed, DiffError, DiffOptions, DiffSummary, Differ, Prediction};
pub use meta::{Meta, SavedOutput, META_KEY};
pub use pair::{discordant, replicate_values};
pub use read::{list_files, PredictionsReader, ReadError, RescoreBatch};
pub use write::{BackgroundWriter, ChangedWriter, PredictionsWriter, WriteError, BACKGROUND_BATCHES, ROW_GROUP_ROWS};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Labels, Targets};
    use isorun_protocol::{DType, Tensor};

    fn meta() -> Meta {
        Meta {
            model: "nested/m".into(),
            output: "p".into(),
            output_shape: Some(vec![None, Some(2)]),
            weight: Some("w".into()),
            slices: vec!["c".into()],
            example_key: Some("id".into()),
            data_digest: "d".into(),
            ..Meta::new("y")
        }
    }

    fn batch(first: u64, rows: usize, dtype: DType) -> (Targets, Vec<(String, Tensor)>) {
        let values: Vec<f32> = (0..rows * 2).map(|i| (i as f32 + first as f32) / 7.0).collect();
        let bytes: Vec<u8> = match dtype {
            DType::Float32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::Float16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
            DType::BFloat16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
            _ => unreachable!(),
        };
        let targets = Targets {
            rows,
            labels: Labels::Matrix { columns: 2, values: (0..rows * 2).map(|i| (i % 2) as f64).collect() },
            weights: Some((0..rows).map(|i| 0.5 + i as f64).collect()),
            slices: vec![("c".into(), (0..rows).map(|i| format!("v{}", i % 3)).collect())],
            first_index: first,
            keys: Some((0..rows).map(|i| format!("k{}", first + i as u64)).collect()),
        };
        let other =
            Tensor::dense(DType::Int32, vec![rows as u64], (0..rows as i32).flat_map(|i| i.to_le_bytes()).collect());
        (targets, vec![("other".into(), other), ("p".into(), Tensor::dense(dtype, vec![rows as u64, 2], bytes))])
    }

    #[test]
    fn every_format_and_dtype_reads_back_as_written() {
        for format in [PredictionsFormat::Parquet, PredictionsFormat::Jsonl] {
            for dtype in [DType::Float32, DType::Float16, DType::BFloat16] {
                let dir = tempfile::tempdir().unwrap();
                let mut writer = PredictionsWriter::create(dir.path(), format, meta(), true).unwrap();
                let written = [batch(0, 3, dtype), batch(3, 5, dtype)];
                for (targets, outputs) in &written {
                    writer.append(targets, outputs).unwrap();
                }
                let path = writer.finish(Some("multiclass".into()), 0).unwrap();
                assert_eq!(path, dir.path().join("nested").join(format!("m.{}", format.extension())));
                let mut reader = PredictionsReader::open(&path).unwrap();
                assert_eq!(reader.meta.first_batch_rows, 3);
                assert_eq!(reader.meta.examples, 8);
                assert_eq!(reader.meta.task.as_deref(), Some("multiclass"));
                reader.start("p", &["c".to_string()]).unwrap();
                let first = reader.next_batch().unwrap().unwrap();
                assert_eq!(first.targets, written[0].0, "{format:?} {dtype}: eval's first batch first");
                let stored = if dtype == DType::BFloat16 { DType::Float32 } else { dtype };
                assert_eq!(first.output.1.dtype, stored);
                assert_eq!(first.output.1.shape, vec![3, 2]);
                let mut expected = Vec::new();
                crate::predictions::read::values_f64(&written[0].1[1].1, &mut expected).unwrap();
                let mut got = Vec::new();
                crate::predictions::read::values_f64(&first.output.1, &mut got).unwrap();
                assert_eq!(got, expected, "{format:?} {dtype}: values exact");
                let rest = reader.next_batch().unwrap().unwrap();
                assert_eq!(rest.targets, written[1].0);
                assert!(reader.next_batch().is_none());
                // Only the file (and a JSON Lines file's description) is left.
                let left: Vec<_> = std::fs::read_dir(dir.path().join("nested")).unwrap().flatten().collect();
                assert_eq!(left.len(), if format == PredictionsFormat::Jsonl { 2 } else { 1 });
                // The other output is there too, and an unsaved slice is refused, naming the columns.
                let mut reader = PredictionsReader::open(&path).unwrap();
                reader.start("other", &[]).unwrap();
                let e = reader.start("p", &["nope".to_string()]).unwrap_err().to_string();
                assert!(e.contains("slice:nope") && e.contains("slice:c, output:other, output:p"), "{e}");
            }
        }
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing() {
        for format in [PredictionsFormat::Parquet, PredictionsFormat::Jsonl] {
            let dir = tempfile::tempdir().unwrap();
            let mut writer = PredictionsWriter::create(dir.path(), format, meta(), false).unwrap();
            let (targets, outputs) = batch(0, 4, DType::Float32);
            writer.append(&targets, &outputs).unwrap();
            drop(writer);
            let left: Vec<_> = std::fs::read_dir(dir.path().join("nested")).unwrap().flatten().collect();
            assert!(left.is_empty(), "{left:?}");
        }
    }
}
