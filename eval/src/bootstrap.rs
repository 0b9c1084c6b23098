//! Poisson-bootstrap weights drawn from a counter-based generator, so that an
//! example gets the same weights in every model, every run, every shard and
//! every process (`eval --ci`, `rescore --ci`, paired comparisons): nothing
//! is stored, the weight of replicate `r` for an example is a pure function
//! of (seed, the example's identity, r).
//!
//! The Poisson bootstrap (each example weighted Poisson(1) times per
//! replicate, as TFMA's `ConfidenceIntervalOptions` and Hanley & MacGibbon's
//! streaming bootstrap do) needs no pass over the data to resample: every
//! replicate is one more metric state updated in the same streaming pass.
//!
//! An example's identity is its `--example-key` value when given (stable when
//! the data is reordered, re-sharded or filtered), else its 0-based index in
//! the dataset's order. The two are hashed in separate domains.

/// Replicates when `--ci` is given without `--bootstrap`.
pub const DEFAULT_REPLICATES: u32 = 200;
/// The most replicates a run may ask for: each is one more metric state.
pub const MAX_REPLICATES: u32 = 10_000;

/// How confidence intervals are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bootstrap {
    /// Replicates, 1..=[`MAX_REPLICATES`].
    pub replicates: u32,
    /// The generator's seed (`--bootstrap-seed`, default 0).
    pub seed: u64,
}

/// SplitMix64's finalizer: a bijection of u64 whose outputs of consecutive
/// inputs pass BigCrush (Steele, Lea & Flood 2014).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const INDEX_DOMAIN: u64 = 0x6973_6f72_756e_6978; // "isorunix"
const KEY_DOMAIN: u64 = 0x6973_6f72_756e_6b79; // "isorunky"
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The identity of the example at this 0-based index of the dataset.
pub fn id_of_index(index: u64) -> u64 {
    mix64(index ^ INDEX_DOMAIN)
}

/// The identity of the example whose `--example-key` is `key` (its text,
/// as [`crate::Targets::keys`] holds it): 64-bit FNV-1a of its bytes, mixed.
pub fn id_of_key(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h ^ KEY_DOMAIN)
}

/// A uniform number in [0, 1) for (seed, id, replicate): 53 random bits.
pub fn uniform(seed: u64, id: u64, replicate: u32) -> f64 {
    let z = mix64(seed.wrapping_add(GOLDEN) ^ mix64(id ^ mix64(u64::from(replicate).wrapping_mul(GOLDEN))));
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Poisson(1)'s CDF at 0..=20, summed as P(k) = e⁻¹/k! term by term in
/// f64 (a test checks the table against that sum), so the lookup gives the
/// k the inversion loop would.
#[allow(clippy::excessive_precision)]
const POISSON1_CDF: [f64; 21] = [
    0.36787944117144233,
    0.7357588823428847,
    0.9196986029286058,
    0.9810118431238463,
    0.9963401531726563,
    0.9994058151824183,
    0.999916758850712,
    0.9999897508033253,
    0.999998874797402,
    0.9999998885745216,
    0.9999999899522336,
    0.9999999991683892,
    0.9999999999364022,
    0.9999999999954802,
    0.9999999999997,
    0.9999999999999813,
    0.9999999999999989,
    0.9999999999999999,
    1.0,
    1.0,
    1.0,
];

/// Poisson(1) by inversion of its CDF (P(k) = e⁻¹/k!) at `u`: the first k
/// with u < CDF(k), at most 20 (P(k > 20) < 1e-19, below the 2⁻⁵³
/// resolution of `u`).
#[inline]
pub fn poisson1_at(u: f64) -> u32 {
    // Branch-free over the first 8 steps (a branch on a draw mispredicts
    // about half the time); u ≥ CDF(7) is 1 draw in 10⁵.
    let k: u32 = POISSON1_CDF[..8].iter().map(|c| u32::from(u >= *c)).sum();
    if k < 8 {
        return k;
    }
    POISSON1_CDF[8..20].iter().position(|c| u < *c).map_or(20, |k| k as u32 + 8)
}

impl Bootstrap {
    /// The weight (how many times it is counted) of the example `id` in
    /// replicate `replicate`.
    pub fn weight(&self, id: u64, replicate: u32) -> u32 {
        poisson1_at(uniform(self.seed, id, replicate))
    }

    /// The example's weights in every replicate, into `out` (cleared): the
    /// same as [`Bootstrap::weight`] for each, with what does not depend on
    /// the example (the replicate's and the seed's mixing) done once.
    pub fn weights(&self, id: u64, out: &mut Vec<u32>) {
        static REPLICATE_MIX: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
        let mixes = REPLICATE_MIX
            .get_or_init(|| (0..MAX_REPLICATES).map(|r| mix64(u64::from(r).wrapping_mul(GOLDEN))).collect());
        let seed = self.seed.wrapping_add(GOLDEN);
        out.clear();
        out.extend(mixes[..self.replicates as usize].iter().map(|m| {
            let u = (mix64(seed ^ mix64(id ^ m)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            poisson1_at(u)
        }));
    }
}

/// The interval `[low, high]` at `level` (e.g. 0.95) of replicate values:
/// percentiles (1 − level)/2 and (1 + level)/2 with linear interpolation
/// between order statistics (NumPy's default `np.quantile`, "linear").
/// NaN replicates (a metric a replicate could not compute) are left out;
/// `None` when none is left.
pub fn percentile_interval(values: &[f64], level: f64) -> Option<(f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let position = q * (sorted.len() - 1) as f64;
        let below = position.floor() as usize;
        let above = (below + 1).min(sorted.len() - 1);
        let fraction = position - below as f64;
        sorted[below] + (sorted[above] - sorted[below]) * fraction
    };
    Some((quantile((1.0 - level) / 2.0), quantile((1.0 + level) / 2.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_poisson_one_and_a_function_of_seed_id_and_replicate() {
        let b = Bootstrap { replicates: 200, seed: 7 };
        let (mut sum, mut squares, mut zeros, n) = (0.0, 0.0, 0u32, 200_000u64);
        for i in 0..n {
            let w = f64::from(b.weight(id_of_index(i), (i % 200) as u32));
            sum += w;
            squares += w * w;
            zeros += u32::from(w == 0.0);
        }
        let mean = sum / n as f64;
        let variance = squares / n as f64 - mean * mean;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        assert!((variance - 1.0).abs() < 0.02, "variance {variance}");
        // P(0) = e^-1 = 0.3679.
        assert!((f64::from(zeros) / n as f64 - 0.3679).abs() < 0.005);
        assert_eq!(b.weight(id_of_key("a"), 3), b.weight(id_of_key("a"), 3));
        let mut all = Vec::new();
        for i in 0..500 {
            b.weights(id_of_index(i), &mut all);
            assert!(all.iter().enumerate().all(|(r, w)| *w == b.weight(id_of_index(i), r as u32)));
        }
        // The inversion by table is the loop's, at each CDF step and one ulp below it.
        let by_loop = |u: f64| {
            let (mut k, mut p) = (0u32, (-1.0f64).exp());
            let mut cdf = p;
            while u >= cdf && k < 20 {
                k += 1;
                p /= f64::from(k);
                cdf += p;
            }
            k
        };
        let (mut p, mut cdf) = ((-1.0f64).exp(), (-1.0f64).exp());
        for (k, &c) in POISSON1_CDF.iter().enumerate() {
            if k > 0 {
                p /= k as f64;
                cdf += p;
            }
            assert_eq!(c.to_bits(), cdf.to_bits(), "CDF({k})");
            for u in [c, f64::from_bits(c.to_bits() - 1), uniform(1, c.to_bits(), 0)] {
                assert_eq!(poisson1_at(u), by_loop(u), "u = {u}");
            }
        }
        let other_seed = Bootstrap { seed: 8, ..b };
        let differs = (0..1000).filter(|i| b.weight(id_of_index(*i), 0) != other_seed.weight(id_of_index(*i), 0));
        assert!(differs.count() > 300);
        let across_replicates = (0..1000).filter(|r| b.weight(id_of_index(5), *r) != b.weight(id_of_index(5), 0));
        assert!(across_replicates.count() > 300);
    }

    #[test]
    fn keys_and_indices_are_separate_domains() {
        assert_ne!(id_of_index(0), id_of_key("0"));
        assert_ne!(id_of_key("a"), id_of_key("b"));
    }

    #[test]
    fn percentiles_interpolate_as_numpy_does() {
        // np.quantile([1, 2, 3, 4], [0.025, 0.975]) = [1.075, 3.925]
        let (low, high) = percentile_interval(&[4.0, 1.0, 3.0, 2.0, f64::NAN], 0.95).unwrap();
        assert!((low - 1.075).abs() < 1e-12 && (high - 3.925).abs() < 1e-12, "{low} {high}");
        assert_eq!(percentile_interval(&[f64::NAN], 0.95), None);
        assert_eq!(percentile_interval(&[2.0], 0.9), Some((2.0, 2.0)));
    }
}
