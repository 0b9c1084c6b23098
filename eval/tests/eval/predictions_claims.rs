//! A predictions file (what `isorun rescore` reads) is untrusted: its
//! description's sizes (eval's first batch, the row shape) are claims, and
//! its Parquet is read through the dataset reader's hardened path. Each
//! lying file here is refused with an error naming the file and the lie.

use isorun_eval::predictions::{Meta, PredictionsReader, PredictionsWriter};
use isorun_eval::{Labels, Targets};
use isorun_protocol::{DType, Tensor};
use std::path::{Path, PathBuf};

fn meta(width: u64) -> Meta {
    Meta {
        model: "m".into(),
        output: "p".into(),
        output_shape: Some(vec![None, Some(width)]),
        // The writer fills in the outputs from the first batch (and first_batch_rows).
        metrics: vec!["accuracy".into()],
        data_digest: "dddddddddddddddddddddddd".into(),
        ..Meta::new("y")
    }
}

/// A Parquet predictions file of `batches` batches of `rows` rows of a
/// `width`-wide output of zeros (it compresses to almost nothing).
fn write(dir: &Path, width: u64, rows: usize, batches: usize) -> PathBuf {
    let format = isorun_eval::predictions::PredictionsFormat::Parquet;
    let mut writer = PredictionsWriter::create(dir, format, meta(width), false).unwrap();
    for b in 0..batches {
        let targets = Targets {
            rows,
            labels: Labels::Int(vec![1; rows]),
            weights: None,
            slices: vec![],
            first_index: (b * rows) as u64,
            keys: None,
        };
        let bytes = vec![0u8; rows * width as usize * 4];
        let output = Tensor::dense(DType::Float32, vec![rows as u64, width], bytes);
        writer.append(&targets, &[("p".into(), output)]).unwrap();
    }
    writer.finish(Some("multiclass".into()), 0).unwrap()
}

/// Replaces `from` by `to` in the file, and `pad_from` by `pad_to`, the two
/// changes of one length together (the footer's offsets stay right).
fn patch(path: &Path, (from, to): (&str, &str), (pad_from, pad_to): (&str, &str)) {
    assert_eq!(from.len() + pad_from.len(), to.len() + pad_to.len());
    let mut bytes = std::fs::read(path).unwrap();
    for (old, new) in [(from, to), (pad_from, pad_to)] {
        let at = bytes
            .windows(old.len())
            .position(|w| w == old.as_bytes())
            .unwrap_or_else(|| panic!("{old} not in {}", String::from_utf8_lossy(&bytes)));
        bytes.splice(at..at + old.len(), new.bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn eval_s_first_batch_is_a_claim_refused_past_the_batch_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 4, 3, 2);
    patch(
        &path,
        ("\"first_batch_rows\":3", "\"first_batch_rows\":1000000000000"),
        ("dddddddddddddddddddddddd", "dddddddddddd"),
    );
    let mut reader = PredictionsReader::open(&path).unwrap();
    assert_eq!(reader.meta.first_batch_rows, 1_000_000_000_000);
    let error = reader.start("p", &[]).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: eval's first batch, 1000000000000 rows of 48 bytes", path.display())));
    let len = std::fs::metadata(&path).unwrap().len();
    let end = format!("is more than the 4194304 bytes rescore reads at once from a file of {len} bytes");
    assert!(error.ends_with(&end), "{error}");
}

#[test]
fn rows_per_batch_come_from_the_bytes_a_row_holds() {
    // 100,000 columns of zeros: 400 KB a row, in a file of a few KB.
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 100_000, 8, 12);
    // Snappy: about 20 times smaller than its 38 MB, so the budget is the 4 MiB floor.
    assert!(std::fs::metadata(&path).unwrap().len() < 4 << 20);
    let mut reader = PredictionsReader::open(&path).unwrap();
    reader.start("p", &[]).unwrap();
    let mut sizes = Vec::new();
    while let Some(batch) = reader.next_batch() {
        sizes.push(batch.unwrap().targets.rows);
    }
    // Eval's first batch, the rest of that read, then as many 400,024-byte rows as 4 MiB holds.
    assert_eq!(sizes, [8, 2, 10, 10, 10, 10, 10, 10, 10, 10, 6]);
}

#[test]
fn a_row_shape_past_a_count_and_a_lying_footer_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), 4, 3, 1);
    patch(&path, ("\"row_shape\":[4]", "\"row_shape\":[4294967296,4294967296]"), ("dddddddddddddddddddddddd", "dddd"));
    let error = PredictionsReader::open(&path).err().unwrap().to_string();
    assert!(
        error.ends_with("output 'p': row_shape [4294967296, 4294967296] is more values than a count holds"),
        "{error}"
    );

    let path = write(dir.path(), 4, 3, 1);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 8;
    bytes[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let error = PredictionsReader::open(&path).err().unwrap().to_string();
    assert_eq!(
        error,
        format!(
            "{}: not a valid Parquet file: the footer claims 4294967280 bytes, but the file is {} bytes long",
            path.display(),
            bytes.len()
        )
    );
}
