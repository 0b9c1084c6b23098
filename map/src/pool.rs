//! The slots of a map run: one zygote per slot, one call at a time per
//! slot, items taken from a shared queue in order, records handed back as
//! each call ends. Retries, the fall-back to a fresh interpreter per call
//! (said once), a zygote lost and replaced, and the stop (Ctrl-C) are
//! decided here; what a single call came to is `call`'s.

use crate::call::{self, failed, Attempt, Limits, NotStarted};
use crate::items::{hex, Item};
use crate::process::{ProcessError, Zygote};
use crate::{MapError, MapSettings};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

/// What the function is, for journal keys and reports.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `MODULE:FUNCTION` as given.
    pub name: String,
    pub qualname: String,
    /// SHA-256 of the function's source (or its module's file), or of the
    /// `--function-pickle` bytes; `None` when Python could not say.
    pub code_sha256: Option<String>,
    pub python: String,
    pub executable: String,
}

impl Identity {
    /// A call's journal key: the function's identity and the item's key.
    pub fn unit_key(&self, item: &Item) -> String {
        let text =
            format!("{}\0{}\0{}\0{}", self.name, self.qualname, self.code_sha256.as_deref().unwrap_or(""), item.key);
        hex(&Sha256::digest(text.as_bytes()))
    }
}

/// A map run's supervisor, with its first zygote started.
pub struct Pool {
    settings: MapSettings,
    first: Option<Zygote>,
    temp: tempfile::TempDir,
    pub identity: Identity,
    /// What the first zygote said once its imports were done.
    pub hello: crate::process::Hello,
    /// Every call now starts a fresh interpreter.
    direct: AtomicBool,
    /// The function's module was found but its import raised, crashed or
    /// hung (no zygote): every item's attempt is this.
    pub import_failure: Option<Attempt>,
}

impl Pool {
    /// Starts the first zygote: a function that cannot be loaded is bad
    /// input, found here before any call. `stop` ends the wait for its
    /// imports (`MapError::Stopped`), the temporary folder removed.
    pub fn start(settings: MapSettings, stop: &(dyn Fn() -> bool + Sync)) -> Result<Pool, MapError> {
        let name = format!("{}:{}", settings.module, settings.function);
        let pickle_hash = match &settings.function_pickle {
            Some(path) => Some(hex(&Sha256::digest(
                std::fs::read(path).map_err(|source| MapError::ReadFunction { path: path.clone(), source })?,
            ))),
            None => None,
        };
        let temp = tempfile::Builder::new().prefix("isorun-map-").tempdir().map_err(MapError::TempDir)?;
        let started = match Zygote::start(&settings, temp.path(), false, stop) {
            // The module was found but its import raised, crashed or hung:
            // that is the run's outcome, not bad input. Every item is a
            // failed record and the reports are written.
            Err(e) => match import_failure(&e, &settings) {
                Some(failure) => {
                    eprintln!("isorun: error: {name}: {}", visible(failure["error"]["message"].as_str().unwrap_or("")));
                    let hello = crate::process::Hello {
                        pid: 0,
                        python: String::new(),
                        executable: String::new(),
                        source_sha256: None,
                        qualname: settings.function.clone(),
                        threads: 0,
                        cuda: None,
                        sandbox_missing: None,
                    };
                    let identity = Identity {
                        name,
                        qualname: settings.function.clone(),
                        code_sha256: pickle_hash,
                        python: String::new(),
                        executable: String::new(),
                    };
                    return Ok(Pool {
                        settings,
                        first: None,
                        temp,
                        identity,
                        hello,
                        direct: AtomicBool::new(false),
                        import_failure: Some(failure),
                    });
                }
                None => Err(e),
            },
            ok => ok,
        };
        let zygote = started.map_err(|e| match e {
            ProcessError::Stopped => MapError::Stopped,
            ProcessError::Load { message, traceback, kind } => {
                let hint = match kind.as_str() {
                    "no_module" => " (MODULE is a dotted module importable from here, or a .py file)",
                    "no_function" => " (FUNCTION is a name defined in MODULE)",
                    _ => "",
                };
                let detail =
                    if kind == "import_failed" { format!("\n{}", traceback.trim_end()) } else { String::new() };
                MapError::Function { function: name.clone(), message: format!("{message}{hint}{detail}") }
            }
            ProcessError::Spawn { source, .. } if settings.sandbox.is_none() => {
                MapError::Python { python: settings.python.clone(), source }
            }
            other => MapError::Start(other.to_string()),
        })?;
        if let Some(missing) = &zygote.hello.sandbox_missing {
            eprintln!("isorun: warning: the map sandbox is incomplete here; not in force: {}", visible(missing));
        }
        let identity = Identity {
            name,
            qualname: zygote.hello.qualname.clone(),
            code_sha256: pickle_hash.or_else(|| zygote.hello.source_sha256.clone()),
            python: zygote.hello.python.clone(),
            executable: zygote.hello.executable.clone(),
        };
        let hello = zygote.hello.clone();
        Ok(Pool {
            settings,
            first: Some(zygote),
            temp,
            identity,
            hello,
            direct: AtomicBool::new(false),
            import_failure: None,
        })
    }

    /// Calls the function on every item, `jobs` at a time; `on_record`
    /// gets each call's record (by item index) as it ends. Items not
    /// started when `stop` says so get no record.
    pub fn run(mut self, items: &[Item], stop: &(dyn Fn() -> bool + Sync), on_record: &mut dyn FnMut(usize, Value)) {
        if let Some(failure) = &self.import_failure {
            for item in items {
                on_record(item.index, self.record(item, failure.clone(), 1));
            }
            return;
        }
        let queue: Mutex<VecDeque<Queued>> = Mutex::new(items.iter().map(|item| Queued { item, tries: 0 }).collect());
        let slots = self.settings.jobs.clamp(1, items.len().max(1));
        // Bounded: a slot whose records (each up to a 1 MiB value) come
        // faster than they are printed waits, rather than the supervisor
        // holding every record printed late.
        let (sender, receiver) = mpsc::sync_channel::<(usize, Value)>(slots);
        let first = self.first.take();
        let this = &self;
        std::thread::scope(|scope| {
            let mut first = first;
            for slot in 0..slots {
                let sender = sender.clone();
                let queue = &queue;
                let worker = if slot == 0 { first.take() } else { None };
                std::thread::Builder::new()
                    .name(format!("map-slot-{slot}"))
                    .spawn_scoped(scope, move || this.slot(slot, worker, queue, &sender, stop))
                    .expect("a thread");
            }
            drop(sender);
            for (index, record) in receiver {
                on_record(index, record);
            }
        });
    }

    fn slot(
        &self,
        slot: usize,
        mut worker: Option<Zygote>,
        queue: &Mutex<VecDeque<Queued<'_>>>,
        sender: &mpsc::SyncSender<(usize, Value)>,
        stop: &(dyn Fn() -> bool + Sync),
    ) {
        let per_worker = self.settings.items_per_worker.max(1);
        let mut spare = None;
        loop {
            if stop() {
                return;
            }
            let batch: Vec<Queued> = match queue.lock() {
                Ok(mut queue) => {
                    let n = per_worker.min(queue.len());
                    queue.drain(..n).collect()
                }
                Err(_) => return,
            };
            if batch.is_empty() {
                return;
            }
            let items: Vec<&Item> = batch.iter().map(|q| q.item).collect();
            let attempts = self.attempt(slot, &mut worker, &mut spare, &items, stop);
            let mut again = Vec::new();
            for (queued, attempt) in batch.iter().zip(attempts.iter()) {
                let tries = queued.tries + 1;
                let status = attempt["status"].as_str().unwrap_or("");
                let retry = status != "ok"
                    && status != "not_run"
                    && tries <= self.settings.retries
                    && self.settings.retry_on.iter().any(|s| s == status)
                    && !stop();
                if retry {
                    again.push(Queued { item: queued.item, tries });
                } else if sender.send((queued.item.index, self.record(queued.item, attempt.clone(), tries))).is_err() {
                    return;
                }
            }
            // Items the process did not get to, then retries, go first.
            if let Ok(mut queue) = queue.lock() {
                let unreached = batch.iter().skip(attempts.len()).copied();
                for queued in unreached.chain(again).collect::<Vec<_>>().into_iter().rev() {
                    queue.push_front(queued);
                }
            }
        }
    }

    /// The record: item, index, function, then the attempt's fields.
    fn record(&self, item: &Item, attempt: Attempt, attempts: u32) -> Value {
        let mut record = Map::new();
        record.insert("item".into(), item.shown.clone());
        record.insert("index".into(), item.index.into());
        record.insert("function".into(), self.identity.name.clone().into());
        let ok = attempt.get("status") == Some(&json!("ok"));
        record.extend(attempt);
        if attempts > 1 {
            record.insert("attempts".into(), attempts.into());
            if ok {
                record.insert("flaky".into(), true.into());
            }
        }
        Value::Object(record)
    }

    /// One attempt of each item, in a process of this slot's zygote
    /// (started again if it is gone), or of a fresh interpreter once
    /// forking is not safe; the attempts are for the items it got to.
    fn attempt(
        &self,
        slot: usize,
        worker: &mut Option<Zygote>,
        spare: &mut Option<call::Spare>,
        items: &[&Item],
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Vec<Attempt> {
        let limits = Limits {
            timeout: self.settings.timeout,
            memory_limit: self.settings.memory_limit,
            value_cap: self.settings.value_cap,
        };
        let env = match self.settings.gpus.len() {
            0 => json!({}),
            n => json!({"CUDA_VISIBLE_DEVICES": self.settings.gpus[slot % n]}),
        };
        loop {
            let direct = self.direct.load(Ordering::SeqCst);
            if direct || worker.is_none() {
                // A spare belongs to the zygote that forked it.
                *spare = None;
                match Zygote::start(&self.settings, self.temp.path(), direct, stop) {
                    Ok(zygote) => *worker = Some(zygote),
                    Err(ProcessError::Stopped) => {
                        let mut attempt = failed("not_run", "not run: interrupted".into());
                        attempt.insert("reason".into(), "interrupted".into());
                        return vec![attempt];
                    }
                    Err(e) => {
                        return vec![failed(
                            "spawn_failed",
                            format!("spawn failed: the interpreter did not start: {e}"),
                        )]
                    }
                }
            }
            let zygote = worker.as_mut().expect("started above");
            let spares = self.settings.spares > 0;
            match call::run(zygote, spare, spares, items, &env, &limits, stop) {
                Ok(attempts) => {
                    if direct || zygote.is_gone() {
                        // A call may take its zygote down (a signal to its parent).
                        *spare = None;
                        *worker = None;
                    }
                    return attempts;
                }
                Err(NotStarted::Unsafe(why)) => {
                    *spare = None;
                    *worker = None;
                    if !self.direct.swap(true, Ordering::SeqCst) {
                        eprintln!(
                            "isorun: warning: the zygote cannot fork safely ({}); each call starts a fresh \
                             interpreter instead (slower). Keep the function's module from starting threads or \
                             CUDA at import (isorun sets OPENBLAS_NUM_THREADS=1 and the like for the zygote)",
                            visible(&why)
                        );
                    }
                }
                Err(NotStarted::Lost(why)) => {
                    *spare = None;
                    *worker = None;
                    return vec![failed("spawn_failed", format!("spawn failed: the zygote was lost: {why}"))];
                }
            }
        }
    }
}

/// A zygote start that failed in the function's import (it raised, the
/// interpreter died, or it hung past --start-timeout), as every item's
/// attempt: status `error` (it raised; with the traceback) or
/// `spawn_failed`, error kind `import_failed`. `None` for anything else
/// (no such module or function, a bad pickle: bad input, exit 2).
fn import_failure(error: &ProcessError, settings: &MapSettings) -> Option<Attempt> {
    let module = &settings.module;
    let (status, message, traceback, signal) = match error {
        ProcessError::Load { kind, message, traceback } if kind == "import_failed" => {
            ("error", format!("import_failed: importing {module} raised {message}"), Some(traceback), None)
        }
        ProcessError::DiedAtStart { status, signal } => (
            "spawn_failed",
            format!("import_failed: the zygote {status} while it imported {module}, before it said hello"),
            None,
            signal.as_ref(),
        ),
        ProcessError::Silent(seconds) => (
            "spawn_failed",
            format!(
                "import_failed: the zygote was still importing {module} after {seconds} s (limit: --start-timeout \
                 {seconds})"
            ),
            None,
            None,
        ),
        _ => return None,
    };
    let mut attempt = failed(status, message);
    attempt["error"]["kind"] = "import_failed".into();
    if let Some(traceback) = traceback {
        attempt["error"]["traceback"] = traceback.clone().into();
    }
    if let Some(signal) = signal {
        attempt.insert("signal".into(), signal.clone().into());
    }
    Some(attempt)
}

/// An item waiting in the queue, with the attempts it has had.
#[derive(Clone, Copy)]
struct Queued<'a> {
    item: &'a Item,
    tries: u32,
}

/// Text from the zygote as a terminal should show it: control characters
/// escaped (a library's file name is anyone's to choose).
fn visible(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_debug().collect::<Vec<_>>() } else { vec![c] }).collect()
}
