//! The one contract of the metric state's parts: a sum, an AUC curve,
//! reliability bins, a top-confusions summary. Each is filled from
//! examples, merged with the same part over other examples (another
//! `--data-shard`, read back from its JSON), and finished into a value;
//! stating that once, with its laws, is what lets `isorun report merge`
//! promise the metrics of one pass. A leaf: every part and the state
//! import it, and it imports nothing of theirs.
//!
//! The shape is datafusion's `Accumulator` (`update_batch`, `state`,
//! `merge_batch`, `evaluate`), with a JSON value for the intermediate
//! state, since ours travels in shard records.

use serde_json::Value;

/// A mergeable summary of examples.
///
/// Multi-phase use: each part of the data is [`add`](Self::add)ed into its
/// own accumulator (on any machine), [`encode`](Self::encode)d, read back
/// with [`decode`](Self::decode), [`merge`](Self::merge)d in any grouping
/// and order, then [`finish`](Self::finish)ed once.
///
/// Laws, for accumulators made alike (`new` with the same settings) and
/// `≡` meaning "the same finished value and the same encoding", up to the
/// exactness the type documents (exact for counts and `ExactSum`s; for
/// plain floating sums, the same terms added in another order):
/// - one pass: adding `a` then `b` ≡ adding `a` into one, `b` into
///   another, and merging the second into the first: any split of the data
///   merges to the one-pass result;
/// - associative: `(x ⊕ y) ⊕ z ≡ x ⊕ (y ⊕ z)`;
/// - commutative: `x ⊕ y ≡ y ⊕ x`;
/// - identity: merging an empty accumulator changes nothing;
/// - round trip: `decode(encode(x)) ≡ x`.
///
/// Where a summary is bounded (a curve past its cap, top confusions past
/// their entries) the laws hold of what the summary promises (the same
/// buckets, the same error bound), as the type's docs say. `merge` returns
/// `Err` (and what is left of `self` is not to be trusted) when the two
/// cannot be merged: different settings, or a count past `u64::MAX`.
/// `crate::state::laws` tests the laws for every implementation.
pub(crate) trait Accumulator: Sized {
    /// One example (or term), as [`add`](Self::add) takes it.
    type Input;
    /// What [`finish`](Self::finish) computes.
    type Output;
    /// What [`decode`](Self::decode) must know of the place the JSON is
    /// read for: the bounds eval keeps there, so that a file claims no more.
    type Bounds;

    /// Adds one example.
    fn add(&mut self, input: Self::Input);

    /// Adds a batch of examples, as one `add` each.
    fn add_batch(&mut self, batch: impl IntoIterator<Item = Self::Input>) {
        for input in batch {
            self.add(input);
        }
    }

    /// Adds `other`, the same accumulator over other examples: what one
    /// pass over both would hold.
    fn merge(&mut self, other: &Self) -> Result<(), String>;

    /// The value of the examples added and merged.
    fn finish(&self) -> Self::Output;

    /// The intermediate state as JSON, for a shard's record.
    fn encode(&self) -> Value;

    /// The accumulator of [`encode`](Self::encode)'s JSON, within `bounds`;
    /// `Err` says what is wrong. The JSON is a file's claim: nothing is
    /// allocated for it that its data does not back.
    fn decode(value: &Value, bounds: Self::Bounds) -> Result<Self, String>;
}

/// `a + b` for counts summed while merging, or why not: a state's counts
/// come from files, and a sum past `u64::MAX` must be an error, not wrap.
pub(crate) fn added(what: &str, a: u64, b: u64) -> Result<u64, String> {
    a.checked_add(b).ok_or_else(|| format!("the summed {what} overflow a 64-bit count ({a} + {b})"))
}
