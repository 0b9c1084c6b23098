//! A [`BatchReader`]: one model's stream of batches, read from the files
//! on the caller's thread or on a prefetch thread (a panic or a thread that
//! stops early is the file's error, never the end of the data), or replayed
//! from a kept pass. What `Dataset::reader` decided (the feeding, the input
//! plans) comes in; batches, built with the conversions in `batch`, go out.

use super::first_look::{check_weight_column, column_label_kind, LabelError};
use super::kept::{Keeping, KeptPass};
use super::spec::{options, Feeding, Inner};
use crate::batch::{
    add_columns, add_example, check_batch_cost, Batch, Column, ExamplePlace, InputPlan, Labels, Roles, Targets,
    TargetsOut, MAX_BATCH_BYTES, MISSING_SLICE, PREALLOCATE_BYTES,
};
use crate::error::DataError;
use crate::label_classes;
use crate::source::{Piece, Source};
use isorun_protocol::{DType, Tensor, TensorData};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The reader itself, on the caller's thread or the prefetch thread.
struct Direct {
    data: Arc<Inner>,
    feeding: Feeding,
    inputs: Vec<InputPlan>,
    next_file: usize,
    /// `next_file`, shared with the reader's owner while prefetching.
    reading: Arc<AtomicUsize>,
    source: Option<Box<dyn Source>>,
    /// Rows the open columnar source has handed (what its rows count from).
    source_row: u64,
    produced: u64,
    example_index: u64,
    skipped: Arc<AtomicU64>,
    /// Nanoseconds spent decoding batches, summed (shared with the owner).
    decoding: Arc<AtomicU64>,
    /// [`Dataset::keep_decoded`](super::Dataset::keep_decoded): this pass's batches so far, while under the cap.
    keeping: Option<Keeping>,
}

enum Mode {
    /// The reader, and whether it is finished.
    Direct(Box<Direct>, bool),
    Prefetch {
        batches: mpsc::Receiver<FromThread>,
        done: bool,
        /// The file the thread reads, for an error when it stops without a word.
        reading: Arc<AtomicUsize>,
        data: Arc<Inner>,
    },
    /// A kept pass replayed ([`Dataset::keep_decoded`](super::Dataset::keep_decoded)): the next batch's index.
    Replay { pass: Arc<KeptPass>, next: usize },
}

/// What the prefetch thread sends: a channel that closes without `End`
/// means the thread died, which is an error, not the end of the data.
enum FromThread {
    Batch(Result<Batch, DataError>),
    End,
}

/// A stream of batches for one model.
pub struct BatchReader {
    feeding: Feeding,
    skipped: Arc<AtomicU64>,
    /// Nanoseconds spent decoding, on whichever thread decodes.
    decoding: Arc<AtomicU64>,
    mode: Mode,
}

impl std::fmt::Debug for BatchReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchReader").field("feeding", &self.feeding).field("skipped", &self.skipped()).finish()
    }
}

impl BatchReader {
    /// A reader that replays a pass an earlier reader kept.
    pub(super) fn replay(feeding: Feeding, pass: Arc<KeptPass>) -> BatchReader {
        let skipped = Arc::new(AtomicU64::new(pass.skipped));
        let decoding = Arc::new(AtomicU64::new(0));
        BatchReader { feeding, skipped, decoding, mode: Mode::Replay { pass, next: 0 } }
    }

    /// A reader of `data`'s files from the first, on the caller's thread
    /// until [`BatchReader::prefetch`], keeping its pass with `keeping`.
    pub(super) fn direct(
        data: Arc<Inner>,
        feeding: Feeding,
        inputs: Vec<InputPlan>,
        keeping: Option<Keeping>,
    ) -> BatchReader {
        let decoding = Arc::new(AtomicU64::new(0));
        let direct = Direct {
            data,
            feeding: feeding.clone(),
            inputs,
            next_file: 0,
            reading: Arc::new(AtomicUsize::new(0)),
            source: None,
            source_row: 0,
            produced: 0,
            example_index: 0,
            skipped: Arc::new(AtomicU64::new(0)),
            decoding: Arc::clone(&decoding),
            keeping,
        };
        let skipped = Arc::clone(&direct.skipped);
        BatchReader { feeding, skipped, decoding, mode: Mode::Direct(Box::new(direct), false) }
    }

    /// How the model is fed.
    pub fn feeding(&self) -> &Feeding {
        &self.feeding
    }

    /// The next batch, or `None` at the end (or at the limit). Data errors
    /// come as `Err`; after an `Err` the reader is finished.
    pub fn next_batch(&mut self) -> Option<Result<Batch, DataError>> {
        match &mut self.mode {
            Mode::Direct(_, true) | Mode::Prefetch { done: true, .. } => None,
            Mode::Replay { pass, next } => {
                let batch = pass.batches.get(*next).cloned()?;
                *next += 1;
                Some(Ok(batch))
            }
            Mode::Direct(direct, finished) => {
                let result = direct.fill_timed().transpose();
                if !matches!(result, Some(Ok(_))) {
                    *finished = true;
                }
                result
            }
            Mode::Prefetch { batches, done, reading, data } => {
                let result = match batches.recv() {
                    Ok(FromThread::Batch(result)) => Some(result),
                    Ok(FromThread::End) => None,
                    Err(mpsc::RecvError) => Some(Err(DataError::Reader {
                        path: data.file_path(reading.load(Ordering::Relaxed)),
                        reason: "the prefetch thread stopped before the end of the data".into(),
                    })),
                };
                if !matches!(result, Some(Ok(_))) {
                    *done = true;
                }
                result
            }
        }
    }

    /// Corrupt records skipped so far (with `skip_corrupt`): one per bad
    /// record, and one for a file whose rest was skipped (bad length CRC,
    /// truncation). With prefetching it may count a batch or two ahead.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The time spent decoding the batches read so far (and, prefetching,
    /// the one or two ahead), on the prefetch thread when there is one:
    /// there it overlapped the caller's work. A replayed pass decodes nothing.
    pub fn decode_time(&self) -> Duration {
        Duration::from_nanos(self.decoding.load(Ordering::Relaxed))
    }

    /// True when the batches come from a pass kept by an earlier reader
    /// ([`Dataset::keep_decoded`](super::Dataset::keep_decoded)), not from the files.
    pub fn replays(&self) -> bool {
        matches!(self.mode, Mode::Replay { .. })
    }

    /// Moves reading to a thread that keeps up to `depth` batches ready
    /// (double buffering: `prefetch(2)`); same interface. `depth` 0 counts as 1.
    /// Dropping the reader stops the thread after the batch it is reading.
    pub fn prefetch(self, depth: usize) -> BatchReader {
        let BatchReader { feeding, skipped, decoding, mode } = self;
        let Mode::Direct(mut direct, finished) = mode else {
            return BatchReader { feeding, skipped, decoding, mode };
        };
        let (sender, batches) = mpsc::sync_channel(depth.max(1) - 1);
        let reading = Arc::clone(&direct.reading);
        let data = Arc::clone(&direct.data);
        if !finished {
            std::thread::Builder::new()
                .name("isorun-eval-prefetch".into())
                .spawn(move || loop {
                    let message = match direct.fill_timed().transpose() {
                        Some(result) => FromThread::Batch(result),
                        None => FromThread::End,
                    };
                    let last = !matches!(message, FromThread::Batch(Ok(_)));
                    if sender.send(message).is_err() || last {
                        break;
                    }
                })
                .expect("spawn the prefetch thread");
        }
        BatchReader { feeding, skipped, decoding, mode: Mode::Prefetch { batches, done: finished, reading, data } }
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic".into(),
    }
}

impl Direct {
    /// [`Direct::fill_caught`], its time added to `decoding`, and the batch
    /// kept when the dataset keeps decoded passes: a whole pass's batches
    /// are kept at its end, a failed pass's dropped.
    fn fill_timed(&mut self) -> Result<Option<Batch>, DataError> {
        let started = Instant::now();
        let result = self.fill_caught();
        self.decoding.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match &result {
            Ok(Some(batch)) => {
                if let Some(keeping) = &mut self.keeping {
                    if !keeping.keep(batch) {
                        self.keeping = None;
                    }
                }
            }
            Ok(None) => {
                if let Some(keeping) = self.keeping.take() {
                    keeping.finish(self.skipped.load(Ordering::Relaxed));
                }
            }
            Err(_) => self.keeping = None,
        }
        result
    }

    /// [`Direct::fill`], with a panic (a bug, but one an untrusted file may
    /// find) turned into the file's error: never a silent end of the data,
    /// and never the supervisor's crash.
    fn fill_caught(&mut self) -> Result<Option<Batch>, DataError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fill())).unwrap_or_else(|payload| {
            Err(DataError::Reader {
                path: self.data.file_path(self.next_file),
                reason: format!("panicked: {}", panic_text(payload.as_ref())),
            })
        })
    }

    /// Reads the next batch; `Ok(None)` at the end.
    fn fill(&mut self) -> Result<Option<Batch>, DataError> {
        let data = Arc::clone(&self.data);
        let spec = &data.spec;
        let want = match spec.limit {
            Some(limit) => (limit.saturating_sub(self.produced)).min(spec.batch_size as u64) as usize,
            None => spec.batch_size,
        };
        if want == 0 {
            return Ok(None);
        }
        let first_index = self.example_index;
        let text_features = spec.text_features();
        let mut columns: Vec<Column> = match &self.feeding {
            Feeding::RawRecords { .. } => vec![Column::Strings(Vec::with_capacity(want.min(PREALLOCATE_BYTES / 24)))],
            Feeding::Features => self
                .inputs
                .iter()
                .map(|p| {
                    // Never more than PREALLOCATE_BYTES from the dims a header claims.
                    let per_row = p.resolved.as_ref().map_or(1, |r| r.1);
                    let elements = want.saturating_mul(per_row);
                    if p.dtype == DType::String {
                        Column::Strings(Vec::with_capacity(elements.min(PREALLOCATE_BYTES / 24)))
                    } else {
                        let bytes = elements.saturating_mul(p.dtype.element_size().unwrap_or(1));
                        Column::Dense(Vec::with_capacity(bytes.min(PREALLOCATE_BYTES)))
                    }
                })
                .collect(),
        };
        let mut targets = TargetsOut {
            labels: Labels::empty(data.label, want),
            weights: spec.weight.as_ref().map(|_| Vec::with_capacity(want)),
            slices: text_features.iter().map(|_| Vec::with_capacity(want)).collect(),
        };
        let roles = Roles {
            label: &spec.label,
            classes: data.classes.as_ref(),
            weight: spec.weight.as_deref(),
            slices: &text_features,
        };
        let raw_feeding = matches!(self.feeding, Feeding::RawRecords { .. });
        // Serialized record bytes in the batch being filled.
        let mut batch_bytes = 0u64;
        let mut rows = 0;
        while rows < want {
            if self.source.is_none() && !self.open_next()? {
                break;
            }
            let path = data.files[self.next_file - 1].0.as_path();
            let source = self.source.as_mut().expect("opened");
            let within = source.within().to_string();
            match source.next_piece(want - rows)? {
                None => {
                    self.source = None;
                }
                Some(Piece::Example { example, record, raw }) => {
                    if let Some(raw) = raw {
                        batch_bytes += raw.bytes.len() as u64;
                        if batch_bytes > MAX_BATCH_BYTES {
                            return Err(DataError::Unsupported {
                                path: path.to_path_buf(),
                                reason: format!(
                                    "record {record} at byte offset {} brings this batch's records to {batch_bytes} \
                                     bytes, more than the {MAX_BATCH_BYTES} a batch may hold; use a smaller \
                                     --batch-size",
                                    raw.offset
                                ),
                            });
                        }
                    }
                    let place = ExamplePlace { path, example: self.example_index, record, within: &within };
                    self.example_index += 1;
                    let raw = if raw_feeding { Some(raw.map_or(&[][..], |r| r.bytes)) } else { None };
                    add_example(&mut self.inputs, example, raw, &place, roles, &mut columns, &mut targets)?;
                    rows += 1;
                }
                Some(Piece::Columns { rows: taken, columns: chunks }) => {
                    let place =
                        ExamplePlace { path, example: self.example_index, record: self.source_row, within: &within };
                    add_columns(&mut self.inputs, taken, chunks, &place, roles, &mut columns, &mut targets)?;
                    self.example_index += taken as u64;
                    self.source_row += taken as u64;
                    rows += taken;
                }
            }
        }
        if rows == 0 {
            return Ok(None);
        }
        self.produced += rows as u64;
        let inputs = match &self.feeding {
            Feeding::RawRecords { input } => {
                let column = columns.pop().expect("one column");
                let Column::Strings(strings) = column else { unreachable!("raw records are strings") };
                vec![(
                    input.clone(),
                    Tensor { dtype: DType::String, shape: vec![rows as u64], data: TensorData::Strings(strings) },
                )]
            }
            Feeding::Features => self
                .inputs
                .iter()
                .zip(columns)
                .map(|(plan, column)| (plan.input.clone(), plan.tensor(rows, column)))
                .collect(),
        };
        let mut texts = targets.slices;
        let keys = match &spec.example_key {
            Some(key) => {
                let keys = texts.pop().expect("the key is the last text feature");
                if let Some(row) = keys.iter().position(|k| k == MISSING_SLICE) {
                    return Err(DataError::Example {
                        path: data.files[self.next_file.max(1) - 1].0.clone(),
                        example: first_index + row as u64,
                        record: first_index + row as u64,
                        within: "the data".into(),
                        key: key.clone(),
                        problem: "(the example key) is missing".into(),
                    });
                }
                Some(keys)
            }
            None => None,
        };
        let slices = spec.slices.iter().cloned().zip(texts).collect();
        let targets = Targets { rows, labels: targets.labels, weights: targets.weights, slices, first_index, keys };
        Ok(Some(Batch { inputs, targets }))
    }

    /// Opens the next file's source; false when there is none. A columnar
    /// file's columns are checked as the first file's were: a later file's
    /// string label or empty weight is its error, not a panic.
    fn open_next(&mut self) -> Result<bool, DataError> {
        let Some((path, format)) = self.data.files.get(self.next_file).cloned() else { return Ok(false) };
        self.next_file += 1;
        self.reading.store(self.next_file, Ordering::Relaxed);
        let spec = &self.data.spec;
        let columns: Vec<String> = self
            .inputs
            .iter()
            .map(|p| p.source.clone())
            .chain(std::iter::once(spec.label.clone()))
            .chain(spec.weight.clone())
            .chain(spec.text_features())
            .collect();
        let options = options(spec, self.data.part, columns, Arc::clone(&self.skipped));
        let source = format.info().open(&path, &options)?;
        let infos = source.columns();
        if !infos.is_empty() {
            let label = &infos[self.inputs.len()];
            column_label_kind(label, self.data.classes.as_ref()).map_err(|e| match e {
                LabelError::Data(e) => e,
                LabelError::Strings { path, what } => label_classes::missing_classes(&path, what, &[]),
            })?;
            if spec.weight.is_some() {
                check_weight_column(&infos[self.inputs.len() + 1])?;
            }
            let rows = spec.limit.unwrap_or(u64::MAX).min(spec.batch_size as u64).max(1);
            check_batch_cost(&self.inputs, infos, spec.weight.is_some(), rows)?;
        }
        self.source = Some(source);
        self.source_row = 0;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataSpec, Dataset};
    use crate::example::{Example, Feature};
    use crate::format::Format;
    use crate::source::Part;
    use isorun_protocol::SignatureInfo;
    use isorun_protocol::TensorSpec;
    use std::path::Path;

    /// A dataset of one TFRecord file of `n` examples, and its signature.
    fn tfrecord_dataset(dir: &Path, n: i64) -> (Dataset, SignatureInfo) {
        let path = dir.join("data.tfrecord");
        let mut bytes = Vec::new();
        for i in 0..n {
            let example = Example::new([
                ("x".to_string(), Feature::floats(vec![i as f32])),
                ("label".to_string(), Feature::ints(vec![i % 2])),
            ]);
            crate::tfrecord::write_record(&mut bytes, &prost::Message::encode_to_vec(&example));
        }
        std::fs::write(&path, bytes).unwrap();
        let spec = DataSpec::new(vec![path], "label", 2);
        let signature = SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![TensorSpec { name: "x".into(), dtype: DType::Float32, shape: Some(vec![None]) }],
            outputs: vec![],
        };
        (Dataset::open(spec).unwrap(), signature)
    }

    /// A reader whose next `fill` panics (a file being read, but none opened).
    fn panicking_reader(dataset: &Dataset, signature: &SignatureInfo) -> BatchReader {
        let mut reader = dataset.reader(signature).unwrap();
        let Mode::Direct(direct, _) = &mut reader.mode else { unreachable!("direct") };
        let path = &dataset.files()[0].0;
        let options = options(dataset.spec(), Part::WHOLE, Vec::new(), Arc::default());
        direct.source = Some(Format::TfRecord.info().open(path, &options).unwrap());
        reader
    }

    #[test]
    fn a_panic_while_reading_is_a_data_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 5);
        for prefetch in [false, true] {
            let mut reader = panicking_reader(&dataset, &signature);
            if prefetch {
                reader = reader.prefetch(2);
            }
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next_batch()));
            let message = match result {
                Ok(Some(Err(e))) => e.to_string(),
                Ok(other) => panic!("prefetch {prefetch}: {other:?}"),
                Err(_) => panic!("prefetch {prefetch}: the panic reached the caller"),
            };
            assert!(message.contains("data.tfrecord") && message.contains("panicked"), "{message}");
            assert!(reader.next_batch().is_none(), "finished after the error");
        }
    }

    /// A file's source whose second batch's decoding waits until the
    /// worker has the first (`sent`), and then says it began (`decoding`).
    struct Gated {
        inner: Box<dyn Source>,
        handed: usize,
        second_batch: usize,
        sent: mpsc::Receiver<()>,
        decoding: mpsc::Sender<()>,
    }

    impl Source for Gated {
        fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
            if self.handed == self.second_batch {
                self.sent.recv().expect("the worker's request");
                self.decoding.send(()).expect("the worker waits");
            }
            self.handed += 1;
            self.inner.next_piece(max_rows)
        }
    }

    /// The next batch is decoded while the worker runs this one, not after:
    /// the second batch's decoding starts only once the first was sent, and
    /// the "worker" ends its run only once that decoding began, which in
    /// series (decoding in `next_batch`) would never happen.
    #[test]
    fn the_next_batch_is_decoded_while_the_worker_runs_this_one() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 6);
        let mut reader = dataset.reader(&signature).unwrap();
        let (sent, sent_here) = mpsc::channel();
        let (decoding_here, decoding) = mpsc::channel();
        let Mode::Direct(direct, _) = &mut reader.mode else { unreachable!("direct") };
        let options = options(dataset.spec(), Part::WHOLE, Vec::new(), Arc::default());
        let inner = Format::TfRecord.info().open(&dataset.files()[0].0, &options).unwrap();
        direct.source =
            Some(Box::new(Gated { inner, handed: 0, second_batch: 2, sent: sent_here, decoding: decoding_here }));
        direct.next_file = 1;
        let mut reader = reader.prefetch(2);
        let mut labels = Vec::new();
        let first = reader.next_batch().unwrap().unwrap();
        // The request is sent; the worker runs batch 1, during which batch 2 is decoded.
        sent.send(()).unwrap();
        decoding
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("batch 2 was not decoded while the worker ran batch 1: reading in series");
        let Labels::Int(first) = first.targets.labels else { unreachable!("int labels") };
        labels.extend(first);
        while let Some(batch) = reader.next_batch() {
            let Labels::Int(batch) = batch.unwrap().targets.labels else { unreachable!("int labels") };
            labels.extend(batch);
        }
        assert_eq!(labels, [0, 1, 0, 1, 0, 1], "every batch, in order");
        assert!(reader.decode_time() > std::time::Duration::ZERO, "the decoding is timed");
    }

    #[test]
    fn a_prefetch_thread_that_stops_without_an_end_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 5);
        let reader = dataset.reader(&signature).unwrap();
        let (sender, batches) = mpsc::sync_channel(1);
        sender.send(FromThread::Batch(Err(DataError::InvalidSpec { reason: "first".into() }))).unwrap();
        drop(sender);
        let mut reader = BatchReader {
            mode: Mode::Prefetch {
                batches,
                done: false,
                reading: Arc::new(AtomicUsize::new(1)),
                data: Arc::clone(&dataset.inner),
            },
            ..reader
        };
        assert!(matches!(reader.next_batch(), Some(Err(DataError::InvalidSpec { .. }))));
        assert!(reader.next_batch().is_none(), "finished after an error");
        if let Mode::Prefetch { done, .. } = &mut reader.mode {
            *done = false;
        }
        let message = reader.next_batch().unwrap().unwrap_err().to_string();
        assert!(message.contains("data.tfrecord") && message.contains("stopped before the end"), "{message}");
    }
}
