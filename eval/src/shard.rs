//! Data shards: one dataset read by `N` machines, each reading shard `K`,
//! so that the `N` shards together hold every example exactly once.
//!
//! Selection, decided from the sorted file list alone (no file is read to
//! decide it, so every machine decides the same):
//! - a dataset of at least `N` files: whole files, round robin; file `i`
//!   (0-based, in reading order: sorted bytewise within each folder or
//!   glob) belongs to shard `i mod N`;
//! - fewer files than `N`: every file is split into `N` parts and shard `K`
//!   reads part `K` of each file. What a part is depends on the format:
//!   TFRecord, the records that *start* in the bytes `[K*len/N,
//!   (K+1)*len/N)`, found by one walk of the record headers from the file's
//!   start (each length checked by its CRC, the data seeked over), so a
//!   damaged record, or the fault that stops the reading, is in exactly the
//!   part its offset is in, as the unsharded reader meets it; gzip TFRecord,
//!   which cannot be entered midway, the records `[K*n/N, (K+1)*n/N)`
//!   counted from the start; `.npz`, `.npy` folders, CSV and Arrow IPC
//!   (file or stream: the rows are counted from the message headers,
//!   without reading bodies; the batches before a part are read and
//!   dropped unconverted), the rows `[K*rows/N, (K+1)*rows/N)`; Parquet, the
//!   row groups `[K*g/N, (K+1)*g/N)` of its `g` (a file of fewer row groups
//!   than `N` leaves some parts empty); plain JSON Lines, the lines that *start*
//!   in the bytes `[K*len/N, (K+1)*len/N)` (a part entered midway skips to
//!   the next line start); gzip JSON Lines, the non-blank lines `[K*n/N,
//!   (K+1)*n/N)` counted from the start. A part may be empty (a file with fewer
//!   examples than `N`): that shard reads nothing of it.
//!
//! Within a shard, examples come in file order; concatenating the shards'
//! examples gives the unsharded dataset's, as a multiset, and in order
//! within each file. `--limit` counts the shard's own examples. The
//! dataset's digest (journal key) includes the shard.

use crate::source::Part;
use std::fmt;
use std::path::PathBuf;

/// Shard `index` of `count` (`0 <= index < count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataShard {
    pub index: u64,
    pub count: u64,
}

impl fmt::Display for DataShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for DataShard {
    type Err = String;

    fn from_str(text: &str) -> Result<DataShard, String> {
        DataShard::parse(text)
    }
}

impl DataShard {
    /// Parses `K/N` with `0 <= K < N` (the messages of `--shard`'s parser).
    pub fn parse(text: &str) -> Result<DataShard, String> {
        let parsed = text
            .split_once('/')
            .and_then(|(k, n)| Some((k.trim().parse::<u64>().ok()?, n.trim().parse::<u64>().ok()?)));
        match parsed {
            Some((index, count)) if count > 0 && index < count => Ok(DataShard { index, count }),
            Some((index, count)) => Err(format!("shard {index}/{count}: K must be from 0 to N-1, and N at least 1")),
            None => Err(format!("'{text}': expected K/N, e.g. 0/4")),
        }
    }

    /// This shard's files and the part of each it reads (see the module docs).
    pub(crate) fn select<T: Clone>(self, files: &[(PathBuf, T)]) -> (Vec<(PathBuf, T)>, Part) {
        if files.len() as u64 >= self.count {
            let mine = files.iter().enumerate().filter(|(i, _)| *i as u64 % self.count == self.index);
            (mine.map(|(_, f)| f.clone()).collect(), Part::WHOLE)
        } else {
            (files.to_vec(), Part { index: self.index, count: self.count })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_k_of_n() {
        assert_eq!(DataShard::parse("1/4"), Ok(DataShard { index: 1, count: 4 }));
        assert_eq!(DataShard::parse(" 0 / 1 ").map(|s| s.to_string()), Ok("0/1".to_string()));
        assert_eq!(DataShard::parse("4/4").unwrap_err(), "shard 4/4: K must be from 0 to N-1, and N at least 1");
        assert_eq!(DataShard::parse("0/0").unwrap_err(), "shard 0/0: K must be from 0 to N-1, and N at least 1");
        assert_eq!(DataShard::parse("1-4").unwrap_err(), "'1-4': expected K/N, e.g. 0/4");
    }

    #[test]
    fn many_files_go_round_robin_and_few_are_split() {
        let files: Vec<(PathBuf, ())> = (0..5).map(|i| (PathBuf::from(format!("f{i}")), ())).collect();
        let names = |shard: DataShard| -> Vec<String> {
            let (mine, part) = shard.select(&files);
            assert_eq!(part, Part::WHOLE);
            mine.iter().map(|(p, _)| p.display().to_string()).collect()
        };
        assert_eq!(names(DataShard { index: 1, count: 2 }), ["f1", "f3"]);
        assert_eq!(names(DataShard { index: 4, count: 5 }), ["f4"]);
        let (mine, part) = DataShard { index: 2, count: 7 }.select(&files);
        assert_eq!((mine.len(), part), (5, Part { index: 2, count: 7 }));
    }

    #[test]
    fn row_ranges_cover_every_row_once() {
        for count in [1, 2, 3, 7] {
            for rows in [0, 1, 2, 5, 6, 100] {
                let mut next = 0;
                for index in 0..count {
                    let (lo, hi) = Part { index, count }.rows(rows);
                    assert_eq!(lo, next, "{index}/{count} of {rows}");
                    next = hi;
                }
                assert_eq!(next, rows);
            }
        }
    }
}
