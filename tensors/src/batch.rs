//! `--batch-size N`: a large input is split along its first dimension into
//! runs of at most N rows, and the outputs of those runs are joined back
//! along their first dimension, so the user sees one result per model.
//!
//! A chunk is made when its run starts ([`chunk`]), not all up front, and
//! a dense input held in a shared region (the user's own `.npy` mapped as
//! a view, or a sealed memfd) becomes a view of the same descriptor at the
//! chunk's offset and length: the supervisor copies none of it and never
//! reads the bytes, so its memory does not grow with the input and a user
//! file truncated mid-run cannot fault it (the worker checks each view
//! against the file's size; a view past the end is that unit's error).

use isorun_protocol::{Tensor, TensorData};
use isorun_transport::SharedMemory;

type Named = Vec<(String, Tensor)>;

/// The row ranges (`start..end`) of at most `batch` rows each that the
/// inputs are cut into. All inputs must share their first dimension. One
/// range, or none for inputs without rows, means nothing needs splitting:
/// the inputs go as they are.
pub fn ranges(inputs: &[(String, Tensor)], batch: usize) -> Result<Vec<(u64, u64)>, String> {
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
    let Some((rows, _)) = rows else { return Ok(Vec::new()) };
    let batch = batch.max(1) as u64;
    Ok((0..rows.div_ceil(batch)).map(|i| (i * batch, ((i + 1) * batch).min(rows))).collect())
}

/// Rows `start..end` of every input, with the shared regions the chunk's
/// tensors name (`TensorData::Shared(i)` is the chunk's own region `i`):
/// views of the inputs' regions, made here, read by nobody but the worker.
pub fn chunk(
    inputs: &[(String, Tensor)],
    shared: &[SharedMemory],
    start: u64,
    end: u64,
) -> Result<(Named, Vec<SharedMemory>), String> {
    let mut regions = Vec::new();
    let mut named = Vec::with_capacity(inputs.len());
    for (name, tensor) in inputs {
        let rows = tensor.shape.first().copied().unwrap_or(0);
        if start > end || end > rows {
            return Err(format!("input '{name}': rows {start}..{end} of {rows}"));
        }
        let mut shape = tensor.shape.clone();
        shape[0] = end - start;
        let per_row = Tensor::element_count(&tensor.shape[1..]).ok_or_else(|| format!("input '{name}': too large"))?;
        let elements = |row: u64| row.checked_mul(per_row).ok_or_else(|| format!("input '{name}': too large"));
        let (from, to) = (elements(start)?, elements(end)?);
        let sliced = match &tensor.data {
            TensorData::Strings(strings) => {
                let (from, to) = (from as usize, to as usize);
                let Some(part) = strings.get(from..to) else {
                    return Err(format!("input '{name}': {} strings for {} elements", strings.len(), elements(rows)?));
                };
                Tensor::strings(shape, part.iter().map(|s| s.to_vec()).collect())
            }
            TensorData::Dense(bytes) => {
                let size = element_size(bytes.len() as u64, elements(rows)?, name)?;
                Tensor::dense(tensor.dtype, shape, bytes[(from * size) as usize..(to * size) as usize].to_vec())
            }
            TensorData::Shared(i) => {
                let region = shared.get(*i as usize).ok_or_else(|| format!("input '{name}': no shared region {i}"))?;
                let size = element_size(region.view().1, elements(rows)?, name)?;
                let view = region.sub_view(from * size, (to - from) * size).map_err(|e| {
                    format!("input '{name}': rows {start}..{end}: {e} (did the file change during the run?)")
                })?;
                regions.push(view);
                Tensor { dtype: tensor.dtype, shape, data: TensorData::Shared(regions.len() as u32 - 1) }
            }
        };
        named.push((name.clone(), sliced));
    }
    Ok((named, regions))
}

/// Bytes per element of a dense tensor of `elements` held in `bytes`.
fn element_size(bytes: u64, elements: u64, name: &str) -> Result<u64, String> {
    if elements == 0 {
        return Ok(0);
    }
    if !bytes.is_multiple_of(elements) {
        return Err(format!("input '{name}': {bytes} bytes for {elements} elements"));
    }
    Ok(bytes / elements)
}

/// The number of rows of a chunk made by [`chunk`].
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

/// The inverse of [`join`]: `joined`'s first dimension cut into parts of
/// `rows` rows each (their sum must be that dimension), every output cut
/// alike. An output whose first dimension is not the rows' sum (a scalar, a
/// per-batch statistic) cannot be cut: an error naming it.
pub fn split(joined: Named, rows: &[u64]) -> Result<Vec<Named>, String> {
    let total: u64 = rows.iter().sum();
    let mut parts: Vec<Named> = rows.iter().map(|_| Vec::with_capacity(joined.len())).collect();
    for (name, tensor) in joined {
        if tensor.shape.first() != Some(&total) {
            return Err(format!(
                "output '{name}' has shape {:?}, not one row per input row ({total}): it cannot be split by request",
                tensor.shape
            ));
        }
        let per_row =
            Tensor::element_count(&tensor.shape[1..]).ok_or_else(|| format!("output '{name}' is too large"))?;
        let mut start = 0u64;
        for (part, &n) in parts.iter_mut().zip(rows) {
            let (from, to) = (start * per_row, (start + n) * per_row);
            start += n;
            let mut shape = tensor.shape.clone();
            shape[0] = n;
            let data = match &tensor.data {
                TensorData::Dense(bytes) => {
                    let size = tensor
                        .dtype
                        .element_size()
                        .ok_or_else(|| format!("output '{name}' has no fixed element size"))?
                        as u64;
                    let (a, b) = ((from * size) as usize, (to * size) as usize);
                    let slice =
                        bytes.get(a..b).ok_or_else(|| format!("output '{name}' holds fewer bytes than its shape"))?;
                    TensorData::Dense(slice.to_vec().into())
                }
                TensorData::Strings(strings) => TensorData::Strings(
                    strings
                        .get(from as usize..to as usize)
                        .ok_or_else(|| format!("output '{name}' holds fewer strings than its shape"))?
                        .to_vec(),
                ),
                TensorData::Shared(_) => return Err(format!("output '{name}' is not held in the message")),
            };
            part.push((name.clone(), Tensor { dtype: tensor.dtype, shape, data }));
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::DType;

    fn table(n: u64) -> Tensor {
        Tensor::dense(DType::UInt8, vec![n, 2], (0..(n * 2) as u8).collect())
    }

    /// Every chunk of `inputs`, as the executor makes them one by one.
    fn split(inputs: &[(String, Tensor)], shared: &[SharedMemory], batch: usize) -> Result<Vec<Named>, String> {
        let ranges = ranges(inputs, batch)?;
        Ok(ranges.iter().map(|&(a, b)| chunk(inputs, shared, a, b).unwrap().0).collect())
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
        assert_eq!(ranges(&inputs, 5).unwrap(), [(0, 5)], "one range: nothing to split");
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

    /// A user's file, as a whole input goes: a view of the file itself.
    fn file_view(bytes: &[u8]) -> (tempfile::NamedTempFile, SharedMemory) {
        use std::io::Write;
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        let view = SharedMemory::from_file_view(file.as_file(), 0, bytes.len() as u64).unwrap();
        (file, view)
    }

    #[test]
    fn a_shared_input_is_cut_into_views_of_the_same_file_with_no_copy() {
        let bytes: Vec<u8> = (0..40u8).collect();
        let (_file, region) = file_view(&bytes);
        let input =
            vec![("x".to_string(), Tensor { dtype: DType::Float32, shape: vec![5, 2], data: TensorData::Shared(0) })];
        let (part, regions) = chunk(&input, std::slice::from_ref(&region), 2, 4).unwrap();
        assert_eq!(part[0].1.shape, [2, 2]);
        assert_eq!(part[0].1.data, TensorData::Shared(0));
        assert_eq!(regions.len(), 1);
        assert_eq!(regions[0].view(), (16, 16), "rows 2..4 of 8-byte rows");
        assert_eq!(&regions[0][..], &bytes[16..32]);
    }

    #[test]
    fn a_file_truncated_mid_run_is_an_error_not_a_fault() {
        let bytes = vec![7u8; 1 << 20];
        let (file, region) = file_view(&bytes);
        let input = vec![(
            "x".to_string(),
            Tensor { dtype: DType::UInt8, shape: vec![1024, 1024], data: TensorData::Shared(0) },
        )];
        // As `np.save` over the same path does: the file shrinks first.
        file.as_file().set_len(100).unwrap();
        let ranges = ranges(&input, 256).unwrap();
        assert_eq!(ranges.len(), 4);
        let first = chunk(&input, std::slice::from_ref(&region), ranges[0].0, ranges[0].1);
        let error = first.unwrap_err();
        assert!(error.contains("input 'x': rows 0..256") && error.contains("in a file of 100 bytes"), "{error}");
    }
}
