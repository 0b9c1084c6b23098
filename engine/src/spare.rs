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

use crate::cancel::CancelToken;
use crate::process::{WorkerEvent, WorkerProcess};
use crate::session::{message_name, wait_hello};
use crate::unit::SpareReport;
use isorun_protocol::{Preloaded, WorkerMessage};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a unit waits for its spare to finish warming up on the
/// built-in model (~0.1 s: one still going after this is stuck, and a
/// fresh worker is the quicker way to the unit). A spare that preloads its
/// unit's model takes as long as that load, so its unit waits for it up to
/// its load limit instead (never longer than a fresh worker would have), or
/// without one, as long again as the spare has been at it.
const PATIENCE: Duration = Duration::from_secs(2);

/// Units a slot took from the queue ahead of need, for a spare. Whoever
/// claims it first runs them: the spare's slot, or an idle slot.
#[derive(Debug)]
pub(crate) struct Reservation {
    pub units: Vec<usize>,
    claimed: AtomicBool,
}

impl Reservation {
    pub fn new(units: Vec<usize>) -> Arc<Reservation> {
        Arc::new(Reservation { units, claimed: AtomicBool::new(false) })
    }

    /// True for the one caller that gets to run the units.
    pub fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::SeqCst)
    }

    pub fn claimed(&self) -> bool {
        self.claimed.load(Ordering::SeqCst)
    }
}

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
                    let preloaded = preloaded.map(|p| Preloaded { load_ms: p.load_ms.min(since_fork) });
                    // Its unit's load limit counts the load it did ahead: one
                    // that took longer gets a fresh worker, as fair a load as
                    // any unit's, rather than a timeout for a contended preload.
                    if let (Some(done), Some(limit)) = (preloaded, load_limit) {
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
