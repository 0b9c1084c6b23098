//! `--batch-size N`: a large input is split along its first dimension into
//! runs of at most N rows, and the outputs of those runs are joined back
//! along their first dimension, so the user sees one result per model.

use isorun_protocol::{Tensor, TensorData};
use isorun_transport::{dense_bytes, SharedMemory};

type Named = Vec<(String, Tensor)>;

/// Splits every input into chunks of at most `batch` rows. All inputs must
/// share their first dimension. One chunk (the inputs as they are) when
/// nothing needs splitting.
pub fn split(inputs: &[(String, Tensor)], shared: &[SharedMemory], batch: usize) -> Result<Vec<Named>, String> {
    let mut rows = None;
    for (name, tensor) in inputs {
        let Some(&first) = tensor.shape.first() else {
            return Err(format!("--batch-size: input '{name}' is a scalar and cannot be split"));
        };
        match rows {
            None => rows = Some((first, name)),
            Some((n, other)) if n != first => {
                return Err(format!(
                    "--batch-size: inputs '{other}' and '{name}' have different first dimensions ({n} and {first})"
                ))
            }
            _ => {}
        }
    }
    let Some((rows, _)) = rows else { return Ok(vec![inputs.to_vec()]) };
    let batch = batch.max(1) as u64;
    if rows <= batch {
        return Ok(vec![inputs.to_vec()]);
    }
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < rows {
        let end = (start + batch).min(rows);
        let chunk =
            inputs.iter().map(|(name, tensor)| (name.clone(), slice_rows(tensor, shared, start, end, rows))).collect();
        chunks.push(chunk);
        start = end;
    }
    Ok(chunks)
}

fn slice_rows(tensor: &Tensor, shared: &[SharedMemory], start: u64, end: u64, rows: u64) -> Tensor {
    let mut shape = tensor.shape.clone();
    shape[0] = end - start;
    let per_row = Tensor::element_count(&tensor.shape[1..]).unwrap_or(0) as usize;
    let (from, to) = (start as usize * per_row, end as usize * per_row);
    match &tensor.data {
        TensorData::Strings(strings) => Tensor::strings(shape, strings[from..to].iter().map(|s| s.to_vec()).collect()),
        _ => {
            let bytes = dense_bytes(tensor, shared).unwrap_or(&[]);
            let size = bytes.len() / (rows as usize * per_row).max(1);
            Tensor::dense(tensor.dtype, shape, bytes[from * size..to * size].to_vec())
        }
    }
}

/// The number of rows of a chunk made by `split`.
pub fn rows(chunk: &[(String, Tensor)]) -> u64 {
    chunk.first().and_then(|(_, t)| t.shape.first().copied()).unwrap_or(0)
}

/// Joins the outputs of several runs along their first dimension. Each
/// part's outputs must have as many rows as its inputs had (`rows`), or the
/// output has no batch dimension and cannot be joined.
pub fn join(mut parts: Vec<Named>, rows: &[u64]) -> Result<Named, String> {
    if parts.len() <= 1 {
        return Ok(parts.pop().unwrap_or_default());
    }
    for (part, &n) in parts.iter().zip(rows) {
        if let Some((name, tensor)) = part.iter().find(|(_, t)| t.shape.first() != Some(&n)) {
            return Err(format!(
                "output '{name}' cannot be joined across batches (shape {:?} for a batch of {n} rows); run without --batch-size",
                tensor.shape
            ));
        }
    }
    let first = parts.remove(0);
    first
        .into_iter()
        .map(|(name, mut joined)| {
            for part in &parts {
                let Some((_, tensor)) = part.iter().find(|(n, _)| *n == name) else {
                    return Err(format!("output '{name}' is missing from one of the batches"));
                };
                if joined.shape.is_empty() || tensor.shape.len() != joined.shape.len() || tensor.shape[1..] != joined.shape[1..] {
                    return Err(format!(
                        "output '{name}' cannot be joined across batches (shapes {:?} and {:?}); run without --batch-size",
                        joined.shape, tensor.shape
                    ));
                }
                if tensor.dtype != joined.dtype {
                    return Err(format!(
                        "output '{name}' changes dtype between batches ({} and {}); run without --batch-size",
                        joined.dtype.name(),
                        tensor.dtype.name()
                    ));
                }
                joined.shape[0] += tensor.shape[0];
                match (&mut joined.data, &tensor.data) {
                    (TensorData::Dense(a), TensorData::Dense(b)) => a.extend_from_slice(b),
                    (TensorData::Strings(a), TensorData::Strings(b)) => a.extend_from_slice(b),
                    _ => return Err(format!("output '{name}' changes layout between batches")),
                }
            }
            Ok((name, joined))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::DType;

    fn table(n: u64) -> Tensor {
        Tensor::dense(DType::UInt8, vec![n, 2], (0..(n * 2) as u8).collect())
    }

    #[test]
    fn split_then_join_gives_back_the_whole() {
        let inputs = vec![
            ("x".to_string(), table(5)),
            ("s".to_string(), Tensor::strings(vec![5], (0..5).map(|i| vec![i]).collect())),
        ];
        let chunks = split(&inputs, &[], 2).unwrap();
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[2][0].1.shape, [1, 2]);
        let rows: Vec<u64> = chunks.iter().map(|c| rows(c)).collect();
        assert_eq!(join(chunks, &rows).unwrap(), inputs);
    }

    #[test]
    fn mismatched_first_dimensions_and_scalars_are_refused() {
        let err = split(&[("a".into(), table(3)), ("b".into(), table(4))], &[], 2).unwrap_err();
        assert_eq!(err, "--batch-size: inputs 'a' and 'b' have different first dimensions (3 and 4)");
        let scalar = Tensor::dense(DType::UInt8, vec![], vec![1]);
        assert!(split(&[("s".into(), scalar.clone())], &[], 2).is_err());
        let parts = vec![vec![("t".into(), scalar.clone())], vec![("t".into(), scalar)]];
        assert!(join(parts, &[1, 1]).unwrap_err().contains("cannot be joined"));
    }
}
