//! `--shard K/N`: a deterministic share of the models for one machine of N.
//! A model belongs to shard `fnv1a64(id bytes) mod N`, FNV-1a 64-bit with
//! its published offset basis and prime: documented, trivial to reimplement,
//! and fixed forever, so a model stays in its shard when others are added.

use std::fmt;

/// Shard K of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Parses `K/N` with 0 <= K < N.
pub fn parse_shard(text: &str) -> Result<Shard, String> {
    let parsed =
        text.split_once('/').and_then(|(k, n)| Some((k.trim().parse::<u64>().ok()?, n.trim().parse::<u64>().ok()?)));
    match parsed {
        Some((index, count)) if count > 0 && index < count => Ok(Shard { index, count }),
        Some((index, count)) => Err(format!("shard {index}/{count}: K must be from 0 to N-1, and N at least 1")),
        None => Err(format!("'{text}': expected K/N, e.g. 0/4")),
    }
}

/// FNV-1a, 64-bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

impl Shard {
    /// True if the model with this id belongs to this shard.
    pub fn owns(&self, id: &str) -> bool {
        fnv1a64(id.as_bytes()) % self.count == self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn every_id_is_in_exactly_one_shard() {
        let shards: Vec<Shard> = (0..4).map(|index| Shard { index, count: 4 }).collect();
        for id in ["a", "b/1", "models/resnet", "x y z"] {
            assert_eq!(shards.iter().filter(|s| s.owns(id)).count(), 1);
        }
        assert_eq!(parse_shard("1/4"), Ok(Shard { index: 1, count: 4 }));
        assert!(parse_shard("4/4").is_err());
        assert!(parse_shard("1-4").is_err());
    }
}
