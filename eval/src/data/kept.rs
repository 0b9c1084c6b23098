//! Reading once for several models ([`Dataset::keep_decoded`](super::Dataset::keep_decoded)):
//! a pass's decoded batches kept, up to a cap, for later readers with the
//! same plan to replay. Apart from the reading itself, which only hands
//! each batch to a [`Keeping`] and says when the pass ended.

use super::spec::Feeding;
use crate::batch::{Batch, InputPlan, Labels};
use isorun_protocol::{DType, TensorData};
use std::sync::{Arc, Mutex};

/// The cap `isorun eval` gives [`Dataset::keep_decoded`](super::Dataset::keep_decoded) for a run of
/// several models: a dataset that decodes to more is read again per model.
pub const KEEP_DECODED_BYTES: u64 = 256 << 20;

/// A whole pass's decoded batches, kept to be replayed (see
/// [`Dataset::keep_decoded`](super::Dataset::keep_decoded)).
pub(super) struct Kept {
    /// The most bytes of decoded batches kept.
    cap: u64,
    state: Mutex<KeptState>,
}

#[derive(Default)]
struct KeptState {
    /// The first pass that read everything, and for which plan.
    pass: Option<(PlanKey, Arc<KeptPass>)>,
    /// A pass went over the cap: no later one keeps anything either.
    over_cap: bool,
    /// A reader is keeping its pass now: readers started meanwhile (the
    /// slots of `-j N`) read without keeping, so that at most one pass's
    /// batches, up to the cap, are held at a time.
    keeping: bool,
}

/// A kept pass: its batches and the records it skipped as corrupt.
pub(super) struct KeptPass {
    pub(super) batches: Vec<Batch>,
    pub(super) skipped: u64,
}

/// What a new reader does with a dataset that keeps decoded passes.
pub(super) enum Start {
    /// Replays this kept pass, reading no file.
    Replay(Arc<KeptPass>),
    /// Reads the files and keeps its pass.
    Keep(Keeping),
    /// Reads the files and keeps nothing: a pass for another plan is kept,
    /// or one went over the cap.
    Read,
}

impl Kept {
    /// Keeps up to `cap` bytes of decoded batches.
    pub(super) fn new(cap: u64) -> Kept {
        Kept { cap, state: Mutex::default() }
    }

    /// What a reader fed as `feeding`, with these inputs, does: replays the
    /// kept pass when it was kept for the same plan, else keeps its own
    /// pass unless another was kept or one went over the cap.
    pub(super) fn start(self: &Arc<Self>, feeding: &Feeding, inputs: &[InputPlan]) -> Start {
        let key: PlanKey = (
            feeding.clone(),
            inputs.iter().map(|p| (p.input.clone(), p.source.clone(), p.dtype, p.dims.clone())).collect(),
        );
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &state.pass {
            Some((kept_key, pass)) if *kept_key == key => Start::Replay(Arc::clone(pass)),
            Some(_) => Start::Read,
            None if state.over_cap || state.keeping => Start::Read,
            None => {
                state.keeping = true;
                Start::Keep(Keeping { kept: Arc::clone(self), key, batches: Vec::new(), bytes: 0 })
            }
        }
    }
}

/// What makes two readers' batches the same: how the model is fed, and
/// each input's name, data column, dtype and signature dims.
type PlanKey = (Feeding, Vec<(String, String, DType, Option<Vec<Option<u64>>>)>);

/// A pass being kept, on the thread that decodes it.
pub(super) struct Keeping {
    kept: Arc<Kept>,
    key: PlanKey,
    batches: Vec<Batch>,
    bytes: u64,
}

/// The bytes a decoded batch holds (its tensors' elements, its labels,
/// weights, slice values and keys), what [`Kept::cap`] counts.
fn batch_bytes(batch: &Batch) -> u64 {
    let tensors: usize = batch
        .inputs
        .iter()
        .map(|(_, t)| match &t.data {
            TensorData::Dense(bytes) => bytes.len(),
            TensorData::Strings(strings) => strings.iter().map(|s| s.len() + 24).sum(),
            TensorData::Shared(_) => 0,
        })
        .sum();
    let t = &batch.targets;
    let labels = match &t.labels {
        Labels::Int(v) => v.len() * 8,
        Labels::Float(v) => v.len() * 8,
        Labels::Matrix { values, .. } => values.len() * 8,
    };
    let texts = |v: &[String]| v.iter().map(|s| s.len() + 24).sum::<usize>();
    let slices: usize = t.slices.iter().map(|(_, v)| texts(v)).sum();
    let keys = t.keys.as_deref().map_or(0, texts);
    (tensors + labels + t.weights.as_ref().map_or(0, |w| w.len() * 8) + slices + keys) as u64
}

impl Keeping {
    /// Keeps a batch just decoded; false (and nothing kept, by this pass or
    /// any later one) when it would take the pass over the cap.
    pub(super) fn keep(&mut self, batch: &Batch) -> bool {
        self.bytes = self.bytes.saturating_add(batch_bytes(batch));
        if self.bytes > self.kept.cap {
            self.kept.state.lock().unwrap_or_else(|e| e.into_inner()).over_cap = true;
            return false;
        }
        self.batches.push(batch.clone());
        true
    }

    /// The pass read everything: its batches are kept for later readers
    /// (unless another pass was kept first).
    pub(super) fn finish(mut self, skipped: u64) {
        let mut state = self.kept.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.pass.is_none() && !state.over_cap {
            let batches = std::mem::take(&mut self.batches);
            state.pass = Some((self.key.clone(), Arc::new(KeptPass { batches, skipped })));
        }
    }
}

impl Drop for Keeping {
    /// Finished, over the cap, failed or abandoned: the next reader may keep.
    fn drop(&mut self) {
        self.kept.state.lock().unwrap_or_else(|e| e.into_inner()).keeping = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers started while one keeps its pass (the slots of `-j N`) keep
    /// nothing, so one pass's batches at most are held; once the keeping
    /// reader is done without a kept pass (over the cap it would not be
    /// kept; here dropped part-way), the next reader may keep.
    #[test]
    fn one_reader_keeps_its_pass_at_a_time() {
        let kept = Arc::new(Kept::new(1 << 20));
        let first = kept.start(&Feeding::Features, &[]);
        assert!(matches!(first, Start::Keep(_)));
        assert!(matches!(kept.start(&Feeding::Features, &[]), Start::Read), "a second reader meanwhile keeps nothing");
        drop(first);
        let Start::Keep(keeping) = kept.start(&Feeding::Features, &[]) else { panic!("the next reader keeps") };
        keeping.finish(0);
        assert!(matches!(kept.start(&Feeding::Features, &[]), Start::Replay(_)), "the kept pass is replayed");
    }
}
