//! `isorun run --warmup-inputs`: each SavedModel runs its own TF Serving
//! warm-up requests (`assets.extra/tf_serving_warmup_requests`), so that a
//! folder of exports is smoke-tested with no inputs to write. It is a
//! [`Feed`]: the engine checks every model's requests against their
//! signatures before any worker starts ([`Feed::check`]), then streams one
//! model's requests at a time into its one worker, so the supervisor holds
//! one request, never a folder's worth of files.
//!
//! Decisions:
//! - One record per model: `ok` only when every request ran; `warmup`
//!   gives the file and the number of requests run, `requests` each one's
//!   kind, signature and outputs (with `--values`, their values; with
//!   `--output-dir`, `DIR/<model id>/<request>/<output>.npy`, request 0 first).
//! - A request runs the signature it names, else `--signature` (TF Serving's
//!   default is `serving_default`, which is `--signature`'s default too).
//!   Classify, regress and multi-inference requests feed their serialized
//!   `tf.Example`s to the signature's one string input (as `isorun eval`'s
//!   raw records do); a signature with another input list is a mismatch.
//! - Tensors are cast to the signature's dtypes by the rules `--inputs`
//!   follow (`isorun_tensors::cast`; `--strict-dtypes` refuses).
//! - The file is untrusted: read as TFRecord with both CRCs checked (the
//!   eval crate's reader, which the supervisor already links; the framing
//!   stays in one place), at most [`MAX_FILE_BYTES`] and, as TF Serving,
//!   [`MAX_RECORDS`] records. Each record has one byte budget
//!   (`isorun_tfproto::serving::record_budget`: 32 MiB and 4 bytes per byte
//!   of the record): decoding it, every tensor and example list made from
//!   it, and the casts of a request's tensors each draw on it before they
//!   are allocated, so a record of a few bytes claiming a hundred 64 MiB
//!   tensors is refused at the first one past the budget, not made. Errors
//!   name the file and the record's byte offset.

use crate::support::with_causes;
use isorun_engine::{Feed, FeedStream, FeedSummary, Model};
use isorun_eval::tfrecord::RecordReader;
use isorun_protocol::{DType, ErrorKind, ModelError, Outcome, SignatureInfo, Tensor, TensorData};
use isorun_tensors::cast;
use isorun_tensors::json_input::signature_of;
use isorun_tfproto::serving::{decode_prediction_log, record_budget, RequestInputs, RequestKind, ServingRequest};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

/// Where TF Serving looks for warm-up requests, inside the SavedModel.
pub const WARMUP_FILE: &str = "assets.extra/tf_serving_warmup_requests";

/// The largest warm-up file read: warm-up requests are a handful of small
/// examples, and the file is read twice (checked, then run).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// TF Serving's own limit on a warm-up file's records.
pub const MAX_RECORDS: u64 = 1000;

/// The settings a warm-up run needs from `run`'s flags.
pub struct WarmupFeed {
    /// `--warmup-limit`: the first N requests of each file.
    pub limit: Option<u64>,
    /// `--signature`: for requests that name none.
    pub signature: String,
    pub tags: Vec<String>,
    pub strict_dtypes: bool,
    /// `--values`.
    pub values: bool,
    /// `--output-dir`.
    pub output_dir: Option<PathBuf>,
}

impl Feed for WarmupFeed {
    fn check(&self, model: &Model) -> Option<Outcome> {
        let mut requests = match Requests::open(model, self.limit) {
            Ok(requests) => requests,
            Err(error) => return Some(Outcome::Error(error)),
        };
        let mut signatures = HashMap::new();
        while let Some(next) = requests.next() {
            if let Err(error) = next.and_then(|request| self.prepare(model, request, &mut signatures)) {
                return Some(Outcome::Error(error));
            }
        }
        None
    }

    fn open(&self, model: &Model) -> Result<Box<dyn FeedStream + '_>, Outcome> {
        let requests = Requests::open(model, self.limit).map_err(Outcome::Error)?;
        Ok(Box::new(WarmupStream {
            feed: self,
            model: model.clone(),
            requests,
            signatures: HashMap::new(),
            current: None,
            ran: Vec::new(),
            examples: 0,
        }))
    }
}

/// A request read from the file, with where it was.
struct Located {
    /// Its place among the file's requests (0 first).
    index: u64,
    /// The byte offset of its record.
    offset: u64,
    /// Its record's byte budget, which its casts draw on too.
    budget: u64,
    request: ServingRequest,
}

/// A request ready to send: for its signature, cast and checked.
struct Prepared {
    index: u64,
    kind: RequestKind,
    signature: String,
    tensors: Vec<(String, Tensor)>,
    casts: Vec<(String, String)>,
    /// Examples in it: the first input's first dimension, or the number of `tf.Example`s.
    rows: u64,
}

/// The requests of one model's warm-up file, one record at a time.
struct Requests {
    reader: RecordReader,
    path: PathBuf,
    buffer: Vec<u8>,
    /// The rest of a record that held several requests (multi-inference tasks).
    pending: VecDeque<Located>,
    records: u64,
    given: u64,
    limit: Option<u64>,
    ended: bool,
}

fn dataset_error(message: String) -> ModelError {
    ModelError::new(ErrorKind::Dataset, message)
}

impl Requests {
    /// Opens `MODEL/assets.extra/tf_serving_warmup_requests`, a regular
    /// file of at most [`MAX_FILE_BYTES`]; a missing one is the model's error.
    fn open(model: &Model, limit: Option<u64>) -> Result<Requests, ModelError> {
        let path = model.path.join(WARMUP_FILE);
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The record's `path` names the model; the file is always in the same place.
                return Err(dataset_error(format!(
                    "no TF Serving warm-up requests: the SavedModel has no {WARMUP_FILE} (--warmup-inputs)"
                )));
            }
            Err(e) => return Err(dataset_error(format!("{}: cannot read: {e}", path.display()))),
        };
        if !meta.is_file() {
            return Err(dataset_error(format!("{}: not a regular file", path.display())));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(dataset_error(format!(
                "{}: {} bytes, over the {} a warm-up file may hold",
                path.display(),
                meta.len(),
                isorun_protocol::human_bytes(MAX_FILE_BYTES)
            )));
        }
        let reader = RecordReader::open(&path, false)
            .map_err(|e| dataset_error(format!("{}: cannot read: {e}", path.display())))?;
        Ok(Requests {
            reader,
            path,
            buffer: Vec::new(),
            pending: VecDeque::new(),
            records: 0,
            given: 0,
            limit,
            ended: false,
        })
    }

    /// The next request; a file with none is an error, as is a bad record.
    fn next(&mut self) -> Option<Result<Located, ModelError>> {
        if self.ended || self.limit.is_some_and(|n| self.given >= n) {
            return None;
        }
        if let Some(request) = self.pending.pop_front() {
            self.given += 1;
            return Some(Ok(request));
        }
        let failed = |this: &mut Requests, message: String| {
            this.ended = true;
            Some(Err(dataset_error(message)))
        };
        let offset = match self.reader.next_record(&mut self.buffer) {
            Ok(Some(offset)) => offset,
            Ok(None) if self.given == 0 => {
                let message = format!("{}: holds no warm-up requests", self.path.display());
                return failed(self, message);
            }
            Ok(None) => return None,
            Err((offset, fault)) => {
                let message = format!("{}: record at byte {offset}: {fault}", self.path.display());
                return failed(self, message);
            }
        };
        self.records += 1;
        if self.records > MAX_RECORDS {
            let message = format!(
                "{}: record at byte {offset}: more than {MAX_RECORDS} warm-up records (TF Serving's limit too)",
                self.path.display()
            );
            return failed(self, message);
        }
        let budget = record_budget(self.buffer.len());
        match decode_prediction_log(&self.buffer, budget) {
            Ok(requests) => {
                let first = self.given + self.pending.len() as u64;
                self.pending.extend(requests.into_iter().enumerate().map(|(i, request)| Located {
                    index: first + i as u64,
                    offset,
                    budget,
                    request,
                }));
                self.next()
            }
            Err(e) => {
                let message = format!(
                    "{}: record {} at byte {offset}: {}",
                    self.path.display(),
                    self.records - 1,
                    with_causes(&e)
                );
                failed(self, message)
            }
        }
    }
}

impl WarmupFeed {
    /// `located` for its signature: tensors cast where the rules allow,
    /// examples as the one string input, all checked as the worker would.
    fn prepare(
        &self,
        model: &Model,
        located: Located,
        signatures: &mut HashMap<String, SignatureInfo>,
    ) -> Result<Prepared, ModelError> {
        let Located { index, offset, budget, request } = located;
        let path = model.path.join(WARMUP_FILE);
        let context = |error: ModelError| ModelError {
            message: format!("{}: request {index} (record at byte {offset}): {}", path.display(), error.message),
            ..error
        };
        let key = request.signature.clone().unwrap_or_else(|| self.signature.clone());
        if !signatures.contains_key(&key) {
            let info = signature_of(&model.path, &self.tags, &key).map_err(context)?;
            signatures.insert(key.clone(), info);
        }
        let info = &signatures[&key];
        let mismatch = |message: String| context(ModelError::new(ErrorKind::InputMismatch, message));
        let (tensors, casts, rows) = match request.inputs {
            RequestInputs::Tensors(tensors) => {
                let rows = tensors.first().map_or(1, |(_, t)| t.shape.first().copied().unwrap_or(1));
                let (tensors, casts) = self.cast_for(info, tensors, budget).map_err(mismatch)?;
                (tensors, casts, rows)
            }
            RequestInputs::Examples(examples) => {
                let [spec] = info.inputs.as_slice() else {
                    return Err(mismatch(examples_refusal(request.kind, info)));
                };
                if spec.dtype != DType::String {
                    return Err(mismatch(examples_refusal(request.kind, info)));
                }
                let rows = examples.len() as u64;
                (vec![(spec.name.clone(), Tensor::strings(vec![rows], examples))], Vec::new(), rows)
            }
        };
        isorun_protocol::matching::match_inputs(info, &tensors).map_err(context)?;
        Ok(Prepared { index, kind: request.kind, signature: key, tensors, casts, rows })
    }

    /// Each tensor as its input's dtype, where `isorun_tensors::cast`
    /// allows; what the casts make (up to 8 bytes for each byte of an int8
    /// tensor) is within what the record's `budget` leaves beside the
    /// tensors themselves (alive while their casts are made), checked
    /// before each is made.
    #[expect(clippy::type_complexity, reason = "the tensors and the casts made, used once")]
    fn cast_for(
        &self,
        info: &SignatureInfo,
        tensors: Vec<(String, Tensor)>,
        budget: u64,
    ) -> Result<(Vec<(String, Tensor)>, Vec<(String, String)>), String> {
        let held: u64 = tensors
            .iter()
            .map(|(_, tensor)| match &tensor.data {
                TensorData::Dense(bytes) => bytes.len() as u64,
                TensorData::Strings(strings) => {
                    strings.iter().map(|s| (std::mem::size_of::<Vec<u8>>() + s.len()) as u64).sum()
                }
                TensorData::Shared(_) => 0,
            })
            .sum();
        let mut left = budget.saturating_sub(held);
        let mut casts = Vec::new();
        let mut out = Vec::with_capacity(tensors.len());
        for (name, tensor) in tensors {
            let Some(spec) = info.inputs.iter().find(|s| s.name == name).filter(|s| s.dtype != tensor.dtype) else {
                out.push((name, tensor));
                continue;
            };
            let (given, wanted) = (tensor.dtype, spec.dtype);
            if self.strict_dtypes {
                return Err(format!(
                    "input '{name}': expected dtype {wanted}, given {given} (--strict-dtypes: no casts)"
                ));
            }
            cast::allowed(&name, given, wanted)?;
            let TensorData::Dense(bytes) = &tensor.data else {
                return Err(format!("input '{name}': expected dtype {wanted}, given {given}"));
            };
            let (Some(given_size), Some(wanted_size)) = (given.element_size(), wanted.element_size()) else {
                return Err(format!("input '{name}': expected dtype {wanted}, given {given}"));
            };
            let made = (bytes.len() / given_size) as u64 * wanted_size as u64;
            if made > left {
                return Err(format!(
                    "input '{name}': the cast from {given} to {wanted} makes {made} bytes, over the {left} left of \
                     the record's budget of {budget}"
                ));
            }
            left -= made;
            let mut converted = Vec::with_capacity(made as usize);
            cast::convert(&name, given, wanted, bytes, 0, &mut converted)?;
            casts.push((name.clone(), cast::describe(given, wanted)));
            out.push((name, Tensor::dense(wanted, tensor.shape, converted)));
        }
        Ok((out, casts))
    }
}

/// Why examples cannot feed a signature.
fn examples_refusal(kind: RequestKind, info: &SignatureInfo) -> String {
    let takes: Vec<String> = info.inputs.iter().map(isorun_protocol::TensorSpec::describe).collect();
    format!(
        "a {} request gives serialized tf.Examples, for a signature with one string input; signature '{}' takes {}",
        kind.name(),
        info.key,
        if takes.is_empty() { "none".to_string() } else { takes.join(", ") }
    )
}

/// One model's run through its warm-up requests.
struct WarmupStream<'a> {
    feed: &'a WarmupFeed,
    model: Model,
    requests: Requests,
    signatures: HashMap<String, SignatureInfo>,
    /// The request the worker has.
    current: Option<Prepared>,
    /// The record's entry of every request that ran.
    ran: Vec<Value>,
    examples: u64,
}

impl FeedStream for WarmupStream<'_> {
    fn next_batch(&mut self) -> Option<Result<Vec<(String, Tensor)>, Outcome>> {
        let next = self.requests.next()?.and_then(|r| self.feed.prepare(&self.model, r, &mut self.signatures));
        Some(match next {
            Ok(mut prepared) => {
                let tensors = std::mem::take(&mut prepared.tensors);
                self.current = Some(prepared);
                Ok(tensors)
            }
            Err(error) => Err(Outcome::Error(error)),
        })
    }

    fn signature(&self) -> Option<&str> {
        self.current.as_ref().map(|p| p.signature.as_str())
    }

    fn accept(&mut self, outputs: Vec<(String, Tensor)>) -> Result<(), Outcome> {
        let Some(request) = self.current.take() else {
            return Err(Outcome::ProtocolError { message: "outputs for a request that was not sent".into() });
        };
        let output_error = |message: String| Outcome::Error(ModelError::new(ErrorKind::OutputWrite, message));
        if let Some(dir) = &self.feed.output_dir {
            let id = format!("{}/{}", self.model.id, request.index);
            isorun_tensors::output::write_outputs(dir, &id, &outputs).map_err(|e| output_error(e.to_string()))?;
        }
        let mut described = Map::new();
        for (name, tensor) in &outputs {
            let mut o = Map::new();
            o.insert("dtype".into(), json!(tensor.dtype.name()));
            o.insert("shape".into(), json!(tensor.shape));
            if self.feed.values {
                let values = isorun_tensors::values::tensor_values(tensor)
                    .map_err(|message| output_error(format!("output {name}: {message}")))?;
                o.insert("values".into(), values);
            }
            described.insert(name.clone(), Value::Object(o));
        }
        let mut entry = json!({"kind": request.kind.name(), "signature": request.signature, "outputs": described});
        if !request.casts.is_empty() {
            let casts: Map<String, Value> = request.casts.into_iter().map(|(n, c)| (n, json!(c))).collect();
            entry["cast"] = Value::Object(casts);
        }
        self.ran.push(entry);
        self.examples += request.rows;
        Ok(())
    }

    fn finish(&mut self, _ok: bool) -> FeedSummary {
        let mut fields = Map::new();
        fields.insert("warmup".into(), json!({"file": WARMUP_FILE, "requests": self.ran.len()}));
        fields.insert("requests".into(), Value::Array(std::mem::take(&mut self.ran)));
        FeedSummary { examples: self.examples, fields, outcome: None }
    }
}

/// The journal's part of a warm-up run's settings.
pub fn key_settings(limit: Option<u64>) -> String {
    format!("\0warmup_inputs\0{limit:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_eval::tfrecord::write_record;
    use std::path::Path;

    fn model_with(file: Option<&[u8]>) -> (tempfile::TempDir, Model) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(bytes) = file {
            std::fs::create_dir_all(dir.path().join("assets.extra")).unwrap();
            std::fs::write(dir.path().join(WARMUP_FILE), bytes).unwrap();
        }
        let model = Model::saved_model("m", dir.path());
        (dir, model)
    }

    fn error_of(model: &Model) -> String {
        let mut requests = match Requests::open(model, None) {
            Ok(requests) => requests,
            Err(e) => return e.message,
        };
        loop {
            match requests.next() {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return e.message,
                None => panic!("no error"),
            }
        }
    }

    /// The predict fixture's warm-up file: three PredictRequests.
    fn fixture() -> Vec<u8> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/warmup/models/predict").join(WARMUP_FILE);
        std::fs::read(path).unwrap()
    }

    #[test]
    fn a_good_file_gives_every_request_and_the_limit_stops_early() {
        let (_dir, model) = model_with(Some(&fixture()));
        let mut requests = Requests::open(&model, None).unwrap();
        let mut offsets = Vec::new();
        while let Some(next) = requests.next() {
            let located = next.unwrap();
            assert_eq!(located.index, offsets.len() as u64);
            offsets.push(located.offset);
        }
        assert_eq!(offsets.len(), 3);
        assert_eq!(offsets[0], 0);
        let mut limited = Requests::open(&model, Some(1)).unwrap();
        assert!(limited.next().unwrap().is_ok());
        assert!(limited.next().is_none());
    }

    #[test]
    fn casts_make_only_what_the_record_s_budget_allows() {
        let feed = WarmupFeed {
            limit: None,
            signature: "serving_default".into(),
            tags: Vec::new(),
            strict_dtypes: false,
            values: false,
            output_dir: None,
        };
        let spec = |name: &str| isorun_protocol::TensorSpec { name: name.into(), dtype: DType::Float64, shape: None };
        let info =
            SignatureInfo { key: "serving_default".into(), inputs: vec![spec("a"), spec("b")], outputs: Vec::new() };
        // Two int8 inputs of 100 elements (200 bytes, alive meanwhile): 800 bytes each as float64.
        let tensors = || {
            vec![
                ("a".into(), Tensor::dense(DType::Int8, vec![100], vec![1; 100])),
                ("b".into(), Tensor::dense(DType::Int8, vec![100], vec![2; 100])),
            ]
        };
        let (cast, casts) = feed.cast_for(&info, tensors(), 1800).unwrap();
        assert_eq!(casts.len(), 2);
        let TensorData::Dense(bytes) = &cast[1].1.data else { panic!("dense") };
        assert_eq!((bytes.len(), bytes.capacity()), (800, 800));
        let err = feed.cast_for(&info, tensors(), 1799).unwrap_err();
        assert_eq!(err, "input 'b': the cast from int8 to float64 makes 800 bytes, over the 799 left of the record's budget of 1799");
    }

    #[test]
    fn bad_files_are_errors_that_name_the_file_and_the_offset() {
        let (_dir, missing) = model_with(None);
        let message = error_of(&missing);
        assert!(message.starts_with("no TF Serving warm-up requests: "), "{message}");
        assert!(message.ends_with("has no assets.extra/tf_serving_warmup_requests (--warmup-inputs)"), "{message}");
        let (_dir, empty) = model_with(Some(b""));
        assert!(error_of(&empty).ends_with("tf_serving_warmup_requests: holds no warm-up requests"));
        let mut garbage = Vec::new();
        write_record(&mut garbage, b"");
        let (_dir, no_request) = model_with(Some(&garbage));
        let message = error_of(&no_request);
        assert!(message.ends_with("record 0 at byte 0: a PredictionLog with no request in it"), "{message}");
        let good = fixture();
        let second = 12 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize + 4;
        let mut corrupt = good.clone();
        corrupt[second + 12] ^= 1;
        let (_dir, corrupt) = model_with(Some(&corrupt));
        let message = error_of(&corrupt);
        assert!(
            message.ends_with(&format!("record at byte {second}: data CRC32C mismatch (corrupt record)")),
            "{message}"
        );
        let (_dir, truncated) = model_with(Some(&good[..second + 20]));
        let message = error_of(&truncated);
        assert!(
            message.contains(&format!("tf_serving_warmup_requests: record at byte {second}: truncated record")),
            "{message}"
        );
        // Over the cap: refused by its size, not read (a sparse file).
        let (_dir, big) = model_with(Some(b""));
        std::fs::File::options()
            .write(true)
            .open(big.path.join(WARMUP_FILE))
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let message = error_of(&big);
        assert!(message.ends_with("67108865 bytes, over the 64.0 MiB a warm-up file may hold"), "{message}");
    }
}
