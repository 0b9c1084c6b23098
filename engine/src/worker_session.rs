//! One long-lived worker serving request after request: what `isorun pipe`
//! uses, and what an embedder would use to keep a model loaded. The worker
//! is started on the first request, recycled after a number of requests or
//! past a memory size, and started again after it crashes (the request it
//! was running gets the crash as its outcome).

use crate::cancel::CancelToken;
use crate::process::{SpawnSpec, WorkerProcess, Zygote};
use crate::session::{run_request, shutdown, terminate, wait_hello, Deadlines};
use isorun_protocol::{Outcome, RunRequest, Tensor, ToWorker};
use isorun_transport::RequestEnvelope;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker serving a model, started on demand.
pub struct WorkerSession {
    spawn: SpawnSpec,
    grace: Duration,
    start_timeout: Duration,
    recycle_after: Option<u64>,
    recycle_rss: Option<u64>,
    worker: Option<WorkerProcess>,
    served_by_worker: u64,
    /// How long a wait for the worker's answer polls before it sleeps.
    spin: Duration,
    /// The model folder and tags of the worker's last request that ended
    /// well (`None` for a worker that has served none).
    worker_model: Option<(String, Vec<String>)>,
    next_unit: u64,
    /// Fork replacement workers from a zygote (`fork_from_zygote`).
    fork: bool,
    zygote: Option<Arc<Zygote>>,
    /// Set once a zygote failed: every later worker is exec'd.
    zygote_failed: bool,
}

/// How one request ended: `Ok` with its checked outputs, the model's
/// `Error`, or what became of the worker (crash, timeout, ...).
#[derive(Debug)]
pub struct Answer {
    pub outcome: Outcome,
    pub outputs: Vec<(String, Tensor)>,
}

impl WorkerSession {
    /// A session whose workers start as `spawn` says (exec'd). Defaults:
    /// 2 s between SIGTERM and SIGKILL, 60 s for a worker to start, never
    /// recycled.
    pub fn new(spawn: SpawnSpec) -> WorkerSession {
        WorkerSession {
            spawn,
            grace: Duration::from_secs(2),
            start_timeout: Duration::from_secs(60),
            recycle_after: None,
            recycle_rss: None,
            worker: None,
            served_by_worker: 0,
            spin: Duration::ZERO,
            worker_model: None,
            next_unit: 0,
            fork: false,
            zygote: None,
            zygote_failed: false,
        }
    }

    /// Fork workers from a zygote: the first worker is exec'd (the first
    /// answer does not wait for a zygote) while the zygote starts; every
    /// worker after it (recycled, or restarted after a crash) is forked,
    /// which costs milliseconds instead of an exec. Where forking fails the
    /// session execs from then on. Call `run` from a thread that lives as
    /// long as the session (the zygote dies with the thread that started it).
    pub fn fork_from_zygote(mut self, fork: bool) -> Self {
        self.fork = fork;
        self
    }

    /// A new worker: forked where a zygote is ready, else exec'd (starting
    /// the zygote beside it the first time).
    fn start_worker(&mut self) -> std::io::Result<WorkerProcess> {
        if self.fork && !self.zygote_failed {
            match self.zygote.as_ref() {
                Some(zygote) if zygote.alive() => match WorkerProcess::spawn_forked(zygote, &self.spawn) {
                    Ok(worker) => return Ok(worker),
                    Err(e) => {
                        tracing::warn!("cannot fork a worker from the zygote ({e}); exec'ing workers instead");
                        self.zygote = None;
                        self.zygote_failed = true;
                    }
                },
                Some(_) => {
                    tracing::warn!("the zygote died; exec'ing workers instead");
                    self.zygote = None;
                    self.zygote_failed = true;
                }
                None => match Zygote::start(&self.spawn) {
                    Ok(zygote) => self.zygote = Some(Arc::new(zygote)),
                    Err(e) => {
                        tracing::warn!("cannot start a zygote ({e}); exec'ing workers instead");
                        self.zygote_failed = true;
                    }
                },
            }
        }
        WorkerProcess::spawn(&self.spawn)
    }

    /// Each wait for an answer first polls for up to `spin` (busy) before
    /// it sleeps: an answer within it costs no wake-up. Pass the same as the
    /// requests' `SessionConfig::spin_us`, which makes the worker wait for
    /// the next request the same way. Zero (the default): sleep at once.
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Start a fresh worker after this many requests.
    pub fn recycle_after(mut self, requests: Option<u64>) -> Self {
        self.recycle_after = requests;
        self
    }

    /// Start a fresh worker once the worker's resident memory passes this many bytes.
    pub fn recycle_rss(mut self, bytes: Option<u64>) -> Self {
        self.recycle_rss = bytes;
        self
    }

    /// Runs one request in the worker (starting one if needed), under
    /// `timeout` from now; `request.unit` is set by the session.
    pub fn run(&mut self, mut request: RunRequest, cancel: &CancelToken, timeout: Option<Duration>) -> Answer {
        let started = Instant::now();
        let answer = |outcome| Answer { outcome, outputs: Vec::new() };
        // A worker that died while it waited (the OOM killer, a kill from
        // outside) had no request: the next one goes to a fresh worker.
        if let Some(mut idle) = self.worker.take() {
            match idle.try_exit() {
                Some(exit) => {
                    tracing::info!(pid = idle.pid, status = ?exit.status, "the idle worker died; starting another")
                }
                None => self.worker = Some(idle),
            }
        }
        let mut worker = match self.worker.take() {
            Some(worker) => worker,
            None => match self.start_worker() {
                Ok(mut worker) => {
                    worker.set_spin(self.spin);
                    if let Err(outcome) = wait_hello(&mut worker, cancel, started + self.start_timeout) {
                        terminate(&mut worker, self.grace, cancel);
                        return answer(outcome);
                    }
                    self.served_by_worker = 0;
                    self.worker_model = None;
                    if !self.spin.is_zero() {
                        // Requests and answers then cross without a system call while both poll.
                        if let Err(message) = worker.share_mailbox() {
                            tracing::debug!("{message}");
                        }
                    }
                    worker
                }
                Err(e) => {
                    let message = format!("{}: {e}", self.spawn.worker.display());
                    return answer(Outcome::SpawnFailed { message });
                }
            },
        };
        let unit = self.next_unit;
        self.next_unit += 1;
        request.unit = unit;
        let request_model = (request.model_dir.clone(), request.tags.clone());
        let envelope = RequestEnvelope::new(&ToWorker::Run(request), Vec::new());
        let deadlines = Deadlines {
            unit: timeout.map(|t| started + t),
            load: None,
            run: None,
            grace: self.grace,
            memory_limit: None,
        };
        // The model this worker last ran well is the request's: it holds it.
        let loaded = self.worker_model.as_ref() == Some(&request_model);
        // One request at a time: the worker has answered every one before.
        worker.allow_mailbox_once();
        let end = run_request(&mut worker, envelope, unit, cancel, deadlines, loaded);
        self.worker_model = end.worker_usable.then_some(request_model);
        if end.worker_usable {
            self.served_by_worker += 1;
            let recycle_count = self.recycle_after.is_some_and(|n| self.served_by_worker >= n);
            let recycle_rss = self.recycle_rss.is_some_and(|limit| worker.rss_now().is_some_and(|rss| rss > limit));
            if recycle_count || recycle_rss {
                tracing::info!(requests = self.served_by_worker, "recycling the worker");
                shutdown(&mut worker, self.grace);
            } else {
                self.worker = Some(worker);
            }
        }
        Answer { outcome: end.outcome, outputs: end.outputs }
    }

    /// Asks the worker (if one is running) to leave, and makes sure it
    /// does; the zygote, if any, goes with the session.
    pub fn close(&mut self) {
        if let Some(mut worker) = self.worker.take() {
            shutdown(&mut worker, self.grace);
        }
        self.zygote = None;
    }
}

impl Drop for WorkerSession {
    fn drop(&mut self) {
        self.close();
    }
}
