//! Warm spare workers (`--spares N`). A worker forked from a zygote still
//! pays TensorFlow's first use (kernel registry, thread pools, the loader
//! and function runtime, oneDNN's set-up: ~90 ms of a small model's ~150 ms
//! here), which the zygote cannot do before it forks without starting
//! threads. A spare is forked ahead of need, while the slot's current unit
//! runs (also the first, exec'd while the zygote loads libtensorflow: the
//! fork then waits for the zygote on a helper thread), and warms up on the
//! other core; its unit then starts in a process that has done all of that
//! and has never seen another model.
//!
//! Each spare is bound to the units it will run, taken from the queue when
//! the spare is forked (a [`Reservation`]), because its sandbox must be
//! applied before TensorFlow starts its first thread: Landlock confines the
//! calling thread and the threads it starts later, not threads that exist
//! already (and `LANDLOCK_RESTRICT_SELF_TSYNC` is newer than this machine's
//! ABI 7), and the sandbox names the unit's model folders. So a spare's
//! whole life runs under its unit's sandbox, as a fresh worker's does. A
//! slot that runs out of work takes a batch another slot reserved rather
//! than sit idle; the spare left without its units is killed, unused.
//!
//! Where [`may_preload`] allows it, a spare warms up by loading its first
//! unit's model rather than the built-in one (the worker's `warm.rs`): the
//! load the unit needs anyway is the first use, one model's worth of CPU
//! less per unit, and the unit starts with its model loaded. The load is
//! still the unit's: its time and CPU in the unit's record, its limits
//! counting it (see [`Spare::ready`]'s `load_limit`).
//!
//! A spare is used once, for its own units. It dies unused when its warm-up
//! fails (crash, hang past the start limit, a bad message: logged, blamed on
//! no model, and its units get a fresh worker), when memory is short
//! ([`memory_short`]), when the run ends or is interrupted, and with the
//! supervisor (`PR_SET_PDEATHSIG`, as every forked worker).
//!
//! All spare forking lives here ([`Forking`]): topping up a slot's spares
//! from its zygote, and forking them on a helper thread beside a first
//! worker exec'd while the zygote still loads.

use crate::attempt::UnitRunner;
use crate::cancel::CancelToken;
use crate::discover::ModelFormat;
use crate::process::{SpawnSpec, WorkerEvent, WorkerProcess, Zygote};
use crate::queue::{Reservation, UnitQueue};
use crate::session::{message_name, wait_hello};
use crate::unit::SpareReport;
use isorun_protocol::{Preload, Preloaded, ToWorker, WarmRequest, WorkerMessage};
use isorun_transport::RequestEnvelope;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long a unit waits for its spare to finish warming up on the
/// built-in model (~0.1 s: one still going after this is stuck, and a
/// fresh worker is the quicker way to the unit). A spare that preloads its
/// unit's model takes as long as that load, so its unit waits for it up to
/// its load limit instead (never longer than a fresh worker would have), or
/// without one, as long again as the spare has been at it.
const PATIENCE: Duration = Duration::from_secs(2);

/// A forked worker warming up for its reserved units.
pub(crate) struct Spare {
    pub worker: WorkerProcess,
    pub reservation: Arc<Reservation>,
    pub worker_id: u64,
    /// When it was forked: its start limit counts from here.
    pub forked: Instant,
    /// It loads its unit's model as its warm-up (a preload).
    pub preloading: bool,
}

impl Spare {
    /// Waits for the spare's `Hello` and `Warmed`, then hands its worker
    /// over with what its record says of it: `None` (the spare discarded,
    /// saying why) if it cannot be used. `load_limit`: the most its unit's
    /// load may take (`--load-timeout`, `--timeout`), which a preload must
    /// have kept to.
    pub fn ready(
        mut self,
        start_timeout: Duration,
        memory_limit: Option<u64>,
        load_limit: Option<Duration>,
        stop: &CancelToken,
    ) -> Option<(WorkerProcess, u64, SpareReport)> {
        match self.wait_warm(start_timeout, memory_limit, load_limit, stop) {
            Ok(report) => Some((self.worker, self.worker_id, report)),
            Err(why) => {
                self.discard(&format!("{why}; its units get a fresh worker"));
                None
            }
        }
    }

    fn wait_warm(
        &mut self,
        start_timeout: Duration,
        memory_limit: Option<u64>,
        load_limit: Option<Duration>,
        stop: &CancelToken,
    ) -> Result<SpareReport, String> {
        let waiting = Instant::now();
        let started = (self.forked + start_timeout).min(waiting + PATIENCE);
        let deadline = match (self.preloading, load_limit) {
            // Its load limit counts from the preload's start, about its fork.
            (true, Some(limit)) => self.forked + PATIENCE + limit,
            // No limit on the load: as long again as it has been at it (a
            // fresh worker would start the load from nothing), at least the
            // 2 s that give up a warm-up that hangs.
            (true, None) => waiting + PATIENCE.max(waiting - self.forked),
            (false, _) => started,
        };
        if let Err(outcome) = wait_hello(&mut self.worker, stop, started.max(deadline)) {
            return Err(format!("before its hello: {}", outcome.status()));
        }
        loop {
            if stop.requested() {
                return Err("the run was interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!("it was still warming up {:?} after it was needed", waiting.elapsed()));
            }
            match self.worker.next_event(Duration::from_millis(20)) {
                Some(WorkerEvent::Message(WorkerMessage::Sandboxed { protections, missing, steps_us })) => {
                    self.worker.set_sandbox(protections, missing, steps_us);
                }
                Some(WorkerEvent::Message(WorkerMessage::Warmed { warm_ms, error, preloaded })) => {
                    if let Some(error) = &error {
                        tracing::info!(pid = self.worker.pid, "a spare's warm-up failed ({error}); using it anyway");
                    }
                    let private = self.worker.private_memory_now().unwrap_or(0);
                    if let Some(limit) = memory_limit.filter(|&limit| private > limit) {
                        return Err(format!("it holds {private} bytes after its warm-up, over the limit {limit}"));
                    }
                    // The worker's word on its load's time, no more than the
                    // time since its fork: its unit's deadlines count it.
                    let since_fork = self.forked.elapsed().as_millis() as u64;
                    let preloaded = preloaded.map(|p| Preloaded { load_ms: p.load_ms.min(since_fork), ..p });
                    // Its unit's load limit counts the load it did ahead: one
                    // that took longer gets a fresh worker, as fair a load as
                    // any unit's, rather than a timeout for a contended preload.
                    if let (Some(done), Some(limit)) = (&preloaded, load_limit) {
                        if Duration::from_millis(done.load_ms) >= limit {
                            return Err(format!("its preload took {} ms, over its unit's load limit", done.load_ms));
                        }
                    }
                    // A spare holding a model takes memory the running unit
                    // may need: given up when memory has become short.
                    if preloaded.is_some() && memory_short(None) {
                        return Err("memory is short after its preload".into());
                    }
                    let waited_ms = waiting.elapsed().as_millis() as u64;
                    let report = SpareReport { warm_ms, waited_ms, warm_error: error, preloaded };
                    return Ok(report);
                }
                Some(WorkerEvent::Message(other)) => {
                    return Err(format!("it sent {} during its warm-up", message_name(&other)));
                }
                Some(WorkerEvent::Broken(reason)) => return Err(reason),
                Some(WorkerEvent::SendFailed(reason)) => return Err(reason),
                Some(WorkerEvent::Closed) => return Err("it died during its warm-up".into()),
                None => {
                    if self.worker.try_exit().is_some() {
                        return Err("it died during its warm-up".into());
                    }
                }
            }
        }
    }

    /// Kills an unused spare and waits for it; says why at info level (no
    /// model is blamed, and its units, if still its own, get a fresh worker).
    pub fn discard(mut self, why: &str) {
        tracing::info!(pid = self.worker.pid, "discarding a spare worker: {why}");
        self.worker.kill();
    }
}

/// Whether a spare may load its unit's model as its warm-up (a preload):
/// not under `--memory-limit`, which the supervisor enforces only on a
/// worker whose unit has started (a preload before then would be
/// unwatched), and not where a GPU may be used (`--gpus`, or a device node
/// of NVIDIA's or AMD's driver): a spare holds no device memory before its
/// unit runs. Then spares warm up on the built-in model.
pub(crate) fn may_preload(memory_limit: Option<u64>, gpus: &[String]) -> bool {
    let gpu_nodes = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"];
    memory_limit.is_none() && gpus.is_empty() && !gpu_nodes.iter().any(|node| std::path::Path::new(node).exists())
}

/// Whether a spare may hold the SavedModel in `dir` beside the slot's
/// running unit and its other spares: `saved_model.pb` and `variables/`
/// (what a load keeps in memory, about) times `spares + 1`, twice over, fit
/// in `MemAvailable`. A bigger model warms up on the built-in one, as
/// before. Sizes from `stat` (a link counts as what it points to, which the
/// load would read; nothing is opened); a folder that cannot be read, or a
/// `variables/` of more than 4,096 files, is not preloaded.
pub(crate) fn fits_beside(dir: &std::path::Path, spares: usize) -> bool {
    let Some(available) = mem_available() else { return false };
    fits_in(dir, spares, available)
}

fn fits_in(dir: &std::path::Path, spares: usize, available: u64) -> bool {
    let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    if isorun_tensors::json_input::is_onnx_file(dir) {
        // An ONNX file and the external data beside it (read without their bytes).
        let Ok(Ok(files)) = isorun_onnxproto::read_model(dir).map(|m| crate::onnx::external_data_files(&m)) else {
            return false;
        };
        let bytes = files.iter().fold(size(dir), |sum, f| sum.saturating_add(size(f)));
        return bytes.saturating_mul(2).saturating_mul(spares as u64 + 1) < available;
    }
    let mut bytes = size(&dir.join("saved_model.pb"));
    match std::fs::read_dir(dir.join("variables")) {
        Ok(entries) => {
            for (n, entry) in entries.enumerate() {
                let Ok(entry) = entry else { return false };
                if n >= 4096 {
                    return false;
                }
                bytes = bytes.saturating_add(size(&entry.path()));
            }
        }
        // No variables (a frozen graph): the graph is the model.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return false,
    }
    bytes.saturating_mul(2).saturating_mul(spares as u64 + 1) < available
}

/// `MemAvailable` in bytes, if the kernel says.
fn mem_available() -> Option<u64> {
    available_in(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn available_in(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemAvailable:"))?;
    line.split_whitespace().next()?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Memory is too short to keep a spare: `MemAvailable` is under 1 GiB, or
/// under the memory limit a unit may use (`--memory-limit`).
pub(crate) fn memory_short(memory_limit: Option<u64>) -> bool {
    match std::fs::read_to_string("/proc/meminfo") {
        Ok(meminfo) => short_in(&meminfo, memory_limit),
        Err(_) => false,
    }
}

fn short_in(meminfo: &str, memory_limit: Option<u64>) -> bool {
    let available = available_in(meminfo);
    let floor = memory_limit.unwrap_or(0).max(1 << 30);
    available.is_some_and(|available| available < floor)
}

/// How a slot forks its spares: the run's units (each spare's warm-up
/// carries its units' sandbox and session), the slot's spawn spec, where
/// spares write the warm-up model, and whether they may preload.
pub(crate) struct Forking<'a> {
    pub runner: &'a UnitRunner<'a>,
    pub spawn: &'a SpawnSpec,
    /// `None`: no spares.
    pub warm_dir: Option<&'a str>,
    /// Spares may load their unit's model as their warm-up ([`may_preload`]).
    pub preload: bool,
    pub worker_ids: &'a AtomicU64,
}

/// A spare just forked: its worker, when it was forked (its start limit
/// and warm-up time count from there), and whether it preloads its unit's model.
type Forked = (WorkerProcess, Instant, bool);

/// Forks a spare from `zygote` and asks it to warm up.
fn fork(zygote: &Arc<Zygote>, spawn: &SpawnSpec, reap_timeout: Duration, warm: WarmRequest) -> std::io::Result<Forked> {
    let mut worker = WorkerProcess::spawn_forked(zygote, spawn)?;
    let forked = Instant::now();
    worker.set_reap_timeout(reap_timeout);
    let preloading = warm.preload.is_some();
    worker.send(RequestEnvelope::new(&ToWorker::Warm(warm), Vec::new())).map_err(std::io::Error::other)?;
    Ok((worker, forked, preloading))
}

/// Spares being forked on a helper thread ([`Forking::fork_early`]):
/// their reservations, in order, and the forks' results as they come.
pub(crate) struct EarlySpares {
    reservations: Vec<Arc<Reservation>>,
    results: mpsc::Receiver<std::io::Result<Forked>>,
}

impl Forking<'_> {
    /// Forks spares for the next units in line until the slot has
    /// `--spares` of them, while units are ready, the zygote lives and
    /// memory is not short (then its spares go). Called once a forked
    /// worker is up: the slot forks (an exec'd worker means it does not, or
    /// not yet), and its zygote is ready.
    pub fn refill(&self, spares: &mut VecDeque<Spare>, queue: &UnitQueue, zygote: &Option<Arc<Zygote>>) {
        let Some(warm_dir) = self.warm_dir else { return };
        let Some(zygote) = zygote.as_ref().filter(|z| z.alive()) else { return };
        if memory_short(self.runner.settings.memory_limit) {
            for spare in spares.drain(..) {
                let reservation = Arc::clone(&spare.reservation);
                spare.discard("memory is short");
                queue.release(&reservation);
            }
            return;
        }
        while spares.len() < self.runner.settings.spares && self.runner.stop.not_starting().is_none() {
            let Some(reservation) = queue.reserve() else { return };
            let warm = self.warm_request(&reservation, warm_dir);
            match fork(zygote, self.spawn, self.runner.settings.reap_timeout, warm) {
                Ok((worker, forked, preloading)) => {
                    let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
                    spares.push_back(Spare { worker, reservation, worker_id, forked, preloading });
                }
                Err(e) => {
                    tracing::info!("cannot fork a spare worker: {e}");
                    queue.release(&reservation);
                    return;
                }
            }
        }
    }

    /// Reserves the next units for spares and forks them on a helper
    /// thread, beside a first worker that was exec'd because the slot's
    /// zygote was still loading libtensorflow: the fork waits for the
    /// zygote there, not on this slot's path, so the unit after the first
    /// starts in a warm spare too. `None` when the slot has no spares to make.
    pub fn fork_early(
        &self,
        spares: &VecDeque<Spare>,
        queue: &UnitQueue,
        zygote: &Option<Arc<Zygote>>,
    ) -> Option<EarlySpares> {
        let warm_dir = self.warm_dir?;
        let zygote = Arc::clone(zygote.as_ref().filter(|z| z.alive())?);
        if memory_short(self.runner.settings.memory_limit) {
            return None;
        }
        let mut reservations = Vec::new();
        while spares.len() + reservations.len() < self.runner.settings.spares
            && self.runner.stop.not_starting().is_none()
        {
            let Some(reservation) = queue.reserve() else { break };
            reservations.push(reservation);
        }
        if reservations.is_empty() {
            return None;
        }
        let requests: Vec<WarmRequest> = reservations.iter().map(|r| self.warm_request(r, warm_dir)).collect();
        let (spawn, reap_timeout) = (self.spawn.clone(), self.runner.settings.reap_timeout);
        let (tx, results) = mpsc::channel();
        let forking = std::thread::Builder::new().name("early-spares".into()).spawn(move || {
            for warm in requests {
                let started = fork(&zygote, &spawn, reap_timeout, warm);
                let failed = started.is_err();
                // Nobody waits any more (the unit ended, the run stops): the
                // worker is dropped with the message, which kills it.
                if tx.send(started).is_err() || failed {
                    return;
                }
            }
        });
        match forking {
            Ok(_) => Some(EarlySpares { reservations, results }),
            Err(e) => {
                tracing::info!("cannot start a thread to fork spares: {e}");
                for reservation in &reservations {
                    queue.release(reservation);
                }
                None
            }
        }
    }

    /// Takes in the spares [`Forking::fork_early`] forked, in the order
    /// of their reservations, waiting for the zygote if the first unit was
    /// quicker; gives back the units of those that could not be forked, and
    /// of all of them when the run stops meanwhile.
    pub fn collect_early(&self, early: EarlySpares, spares: &mut VecDeque<Spare>, queue: &UnitQueue) {
        let EarlySpares { reservations, results } = early;
        for reservation in reservations {
            let forked = loop {
                if self.runner.stop.not_starting().is_some() {
                    break None;
                }
                match results.recv_timeout(Duration::from_millis(20)) {
                    Ok(forked) => break Some(forked),
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                }
            };
            match forked {
                Some(Ok((worker, forked, preloading))) => {
                    let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
                    spares.push_back(Spare { worker, reservation, worker_id, forked, preloading });
                }
                Some(Err(e)) => {
                    tracing::info!("cannot fork a spare worker: {e}");
                    queue.release(&reservation);
                }
                None => queue.release(&reservation),
            }
        }
    }

    /// A spare's warm-up request for its reserved units: their sandbox, the
    /// run's session, and the first unit's model to load where spares may.
    fn warm_request(&self, reservation: &Reservation, warm_dir: &str) -> WarmRequest {
        let first = reservation.units.first().filter(|_| self.preload);
        // A SavedModel or an ONNX file (its spare makes ONNX Runtime's
        // environment and session after its fork); a Keras file's export
        // is a SavedModel by the time its unit is reserved.
        let preload = first
            .filter(|&&index| matches!(self.runner.models[index].format, ModelFormat::SavedModel | ModelFormat::Onnx))
            .filter(|&&index| fits_beside(&self.runner.models[index].path, self.runner.settings.spares))
            .map(|&index| Preload {
                model_dir: self.runner.models[index].path.to_string_lossy().into_owned(),
                tags: self.runner.settings.tags.clone(),
                config: self.runner.session_for(index),
                libraries: self.runner.settings.libraries.clone(),
                runtime: crate::onnx::runtime_for(&self.runner.models[index]),
            });
        WarmRequest {
            sandbox: self.runner.sandbox_for(&reservation.units),
            config: self.runner.settings.session,
            warm_dir: warm_dir.to_string(),
            cpu_only: true,
            preload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model folder is untrusted: a sparse file that claims a terabyte,
    /// a link to a big file (counted as the file), a link in place of
    /// `variables/` to a folder of many files, and a file named with
    /// control characters are all taken at what they would cost to load.
    #[test]
    fn a_model_is_preloaded_only_when_its_files_fit_whatever_they_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let model = |name: &str| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(dir.join("variables")).unwrap();
            std::fs::write(dir.join("saved_model.pb"), vec![0u8; 1000]).unwrap();
            std::fs::write(dir.join("variables/variables.index"), vec![0u8; 1000]).unwrap();
            dir
        };
        let small = model("small");
        assert!(fits_in(&small, 2, 1 << 20), "2 KB x 3 x 2 fits in 1 MiB");
        assert!(!fits_in(&small, 2, 10_000), "not in 10 kB");
        let frozen = tmp.path().join("frozen");
        std::fs::create_dir(&frozen).unwrap();
        std::fs::write(frozen.join("saved_model.pb"), vec![0u8; 1000]).unwrap();
        assert!(fits_in(&frozen, 2, 1 << 20), "no variables/: the graph is the model");

        let sparse = model("sparse");
        let file = std::fs::File::create(sparse.join("variables/variables.data-00000-of-00001\u{1b}[2J")).unwrap();
        file.set_len(1 << 40).unwrap();
        assert!(!fits_in(&sparse, 2, 64 << 30), "a file that claims a terabyte does not fit");

        let linked = model("linked");
        std::os::unix::fs::symlink(
            sparse.join("variables/variables.data-00000-of-00001\u{1b}[2J"),
            linked.join("variables/big"),
        )
        .unwrap();
        assert!(!fits_in(&linked, 2, 64 << 30), "a link counts as what it points to");

        let many = tmp.path().join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..4100 {
            std::fs::write(many.join(i.to_string()), b"").unwrap();
        }
        let redirected = model("redirected");
        std::fs::remove_dir_all(redirected.join("variables")).unwrap();
        std::os::unix::fs::symlink(&many, redirected.join("variables")).unwrap();
        assert!(!fits_in(&redirected, 2, 64 << 30), "more than 4,096 files are not counted, nor preloaded");
    }

    #[test]
    fn memory_is_short_under_a_gibibyte_or_under_the_memory_limit() {
        let meminfo = |kib: u64| format!("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   {kib} kB\n");
        assert!(!short_in(&meminfo(8 << 20), None));
        assert!(short_in(&meminfo(512 << 10), None));
        assert!(short_in(&meminfo(3 << 20), Some(4 << 30)));
        assert!(!short_in(&meminfo(5 << 20), Some(4 << 30)));
        // A kernel that does not say is not taken for short.
        assert!(!short_in("MemTotal: 100 kB\n", None));
    }

    #[test]
    fn a_reservation_is_claimed_once() {
        let reservation = Reservation::new(vec![3]);
        assert!(!reservation.claimed());
        assert!(reservation.claim());
        assert!(!reservation.claim());
        assert!(reservation.claimed());
    }
}
