//! Data shards of one plain TFRecord file with damage in it: every record,
//! damaged or not, belongs to exactly one shard, so the shards of a file
//! together see what one unsharded reader sees (the same examples, the same
//! corrupt records skipped, the same error), wherever the damage falls; and
//! finding where a shard starts costs reads in proportion to the file, not
//! to its square, however hostile the bytes.

use isorun_eval::example::{Example, Feature};
use isorun_eval::tfrecord::{masked_crc32c, write_record};
use isorun_eval::{DataShard, DataSpec, Dataset, Labels};
use isorun_protocol::DType;
use prost::Message;
use std::path::Path;

use super::util::{self, data_spec, tensor};

fn spec(path: &Path, shard: Option<DataShard>, skip_corrupt: bool) -> DataSpec {
    DataSpec { skip_corrupt, shard, ..data_spec(vec![path.to_path_buf()], "label", 1) }
}

/// What reading a dataset gave: the example ids up to the first error, the
/// corrupt records skipped, and the error's message.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    ids: Vec<i64>,
    skipped: u64,
    error: Option<String>,
}

fn read(spec: DataSpec) -> Seen {
    let dataset = Dataset::open(spec).unwrap();
    let signature = util::signature(vec![tensor("label", DType::Int64, &[None])], vec![]);
    let mut reader = dataset.reader(&signature).unwrap();
    let mut seen = Seen::default();
    while let Some(batch) = reader.next_batch() {
        match batch {
            Ok(batch) => {
                let Labels::Int(labels) = &batch.targets.labels else { panic!("int labels") };
                seen.ids.extend_from_slice(labels);
            }
            Err(error) => {
                seen.error = Some(error.to_string());
                break;
            }
        }
    }
    seen.skipped = reader.skipped();
    seen
}

/// One record per id, of different sizes (so that shard boundaries fall
/// inside records, and on their starts); the records' start offsets.
fn tfrecords(ids: &[i64]) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for &id in ids {
        starts.push(out.len());
        let example = Example::new([
            ("label".to_string(), Feature::ints(vec![id])),
            ("pad".to_string(), Feature::bytes(vec![vec![b'p'; (id as usize * 37) % 101]])),
        ]);
        write_record(&mut out, &example.encode_to_vec());
    }
    (out, starts)
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    /// A byte of the record's data changed: its data CRC fails.
    Data,
    /// A byte of the record's length CRC changed: nothing after it can be located.
    LengthCrc,
    /// The file ends inside the record.
    Truncated,
}

/// Every shard count from 1 to 4 of the file at `path`, with and without
/// `--skip-corrupt`, against the unsharded read: the shards in order give
/// the unsharded examples, each once, skip as many corrupt records in all,
/// and exactly the shard that owns a fatal fault reports it, in the same
/// words (the damaged record's offset in the file).
fn assert_shards_see_what_one_reader_sees(path: &Path, what: &str) {
    for skip_corrupt in [false, true] {
        let whole = read(spec(path, None, skip_corrupt));
        for count in 1..=4 {
            let what = format!("{what}, {count} shards, skip_corrupt {skip_corrupt}");
            let shards: Vec<Seen> =
                (0..count).map(|index| read(spec(path, Some(DataShard { index, count }), skip_corrupt))).collect();
            let errors: Vec<&String> = shards.iter().filter_map(|s| s.error.as_ref()).collect();
            assert_eq!(errors, whole.error.iter().collect::<Vec<_>>(), "{what}: the errors; {shards:?}");
            assert_eq!(
                shards.iter().map(|s| s.skipped).sum::<u64>(),
                whole.skipped,
                "{what}: the corrupt records skipped; {shards:?}"
            );
            // Up to the shard that fails (if one does), the shards read what one reader reads.
            let until = shards.iter().position(|s| s.error.is_some()).map_or(shards.len(), |i| i + 1);
            let ids: Vec<i64> = shards[..until].iter().flat_map(|s| s.ids.iter().copied()).collect();
            assert_eq!(ids, whole.ids, "{what}: the examples; {shards:?}");
            if whole.error.is_none() {
                assert_eq!(until, shards.len());
            }
        }
    }
}

#[test]
fn a_damaged_record_is_seen_by_exactly_one_shard_wherever_it_falls() {
    let ids: Vec<i64> = (0..9).collect();
    let (clean, starts) = tfrecords(&ids);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecord");
    std::fs::write(&path, &clean).unwrap();
    assert_eq!(read(spec(&path, None, false)), Seen { ids: ids.clone(), ..Seen::default() });
    assert_shards_see_what_one_reader_sees(&path, "no damage");
    for damage in [Damage::Data, Damage::LengthCrc, Damage::Truncated] {
        // From the second record on: opening a dataset reads its first
        // example, so damage to the first record fails every shard's open alike.
        for (record, &start) in starts.iter().enumerate().skip(1) {
            let mut bytes = clean.clone();
            match damage {
                Damage::Data => bytes[start + 14] ^= 0x40,
                Damage::LengthCrc => bytes[start + 9] ^= 0x01,
                Damage::Truncated => bytes.truncate(start + 13),
            }
            std::fs::write(&path, &bytes).unwrap();
            let whole = read(spec(&path, None, false));
            let error = whole.error.as_deref().unwrap_or_else(|| panic!("{damage:?} {record}: no error"));
            assert!(error.contains(&format!("at byte offset {start}")), "{damage:?} {record}: {error}");
            assert_shards_see_what_one_reader_sees(&path, &format!("{damage:?} in record {record}"));
        }
    }
}

#[test]
fn a_record_with_a_bad_data_crc_first_in_its_shard_is_that_shard_s_error() {
    // The report's case: 8 records, 2 shards, and the first record to start
    // in the second shard's bytes has a bad data CRC. One reader fails on
    // it; so must the second shard, and with --skip-corrupt skip it.
    let ids: Vec<i64> = (0..8).collect();
    let (mut bytes, starts) = tfrecords(&ids);
    let half = bytes.len() / 2;
    let first = starts.iter().position(|&s| s >= half).unwrap();
    bytes[starts[first] + 14] ^= 0x40;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecord");
    std::fs::write(&path, &bytes).unwrap();
    let second = |skip| read(spec(&path, Some(DataShard { index: 1, count: 2 }), skip));
    let error = second(false).error.expect("the second shard meets the corrupt record");
    assert!(error.contains("data CRC32C mismatch") && error.contains(&format!("offset {}", starts[first])), "{error}");
    let skipping = second(true);
    assert_eq!(skipping.skipped, 1);
    assert_eq!(skipping.ids, (first as i64 + 1..8).collect::<Vec<_>>());
}

/// Bytes this thread has read (read(2), pread(2) and the like) so far.
fn bytes_read_by_this_thread() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    let line = io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap();
    line.trim().parse().unwrap()
}

#[test]
fn finding_where_shards_start_reads_in_proportion_to_the_file() {
    // Good records, then a second half of length headers whose length CRCs
    // check, each claiming the rest of the file, over data whose CRC does
    // not: one record with a bad data CRC, read from the start; a resync that
    // checked every candidate header's data would read the rest of the file
    // at each of them (quadratic). Bytes read are counted, not timed.
    let mut bytes = tfrecords(&(0..1200).collect::<Vec<_>>()).0;
    let size = 2 * bytes.len() as u64;
    while (bytes.len() as u64) + 16 <= size {
        let len = (size - bytes.len() as u64 - 16).to_le_bytes();
        bytes.extend_from_slice(&len);
        bytes.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    }
    bytes.resize(size as usize, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.tfrecord");
    std::fs::write(&path, &bytes).unwrap();
    let whole = read(spec(&path, None, true));
    assert_eq!((whole.ids.len(), whole.skipped), (1200, 1));
    for count in 2..=4 {
        let before = bytes_read_by_this_thread();
        let shards: Vec<Seen> =
            (0..count).map(|index| read(spec(&path, Some(DataShard { index, count }), true))).collect();
        let read_bytes = bytes_read_by_this_thread() - before;
        // Each shard: its walk over the headers before it (at most twice the
        // file), its own records, and a few read buffers.
        let bound = count * (3 * size + (2 << 20));
        assert!(read_bytes <= bound, "{count} shards of {size} bytes read {read_bytes} bytes (bound {bound})");
        let ids: Vec<i64> = shards.iter().flat_map(|s| s.ids.iter().copied()).collect();
        assert_eq!((ids, shards.iter().map(|s| s.skipped).sum::<u64>()), (whole.ids.clone(), 1), "{count} shards");
    }
}
