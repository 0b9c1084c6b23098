//! A slot's reaper: a passed unit's worker is told to exit, and its report
//! completed from the exit (wall time, CPU time, peak memory), on a thread
//! of the slot's own while the slot's next unit starts, since a worker's
//! exit (unmapping TensorFlow) takes ~10 ms. Apart from the executor because
//! it is the one place besides the slot's loop where a unit's report goes out.

use crate::attempt::finish_metrics;
use crate::event::Event;
use crate::process::WorkerProcess;
use crate::session::shutdown;
use crate::unit::{Attempt, UnitReport};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A passed unit's worker, to be told to exit, and its report, which the
/// worker's exit completes (wall time, CPU time, peak memory).
pub(crate) struct Reap {
    pub worker: WorkerProcess,
    pub report: UnitReport,
    pub begun: Instant,
    pub before: (Duration, Duration),
    /// The unit's earlier attempts.
    pub attempts: Vec<Attempt>,
    pub shared: bool,
    pub gpu: Option<String>,
    /// How long it may take to exit before it is killed.
    pub grace: Duration,
}

/// A slot's reaper: ends each worker it is given as the slot would
/// (`shutdown`: `Shutdown`, the grace, SIGTERM, SIGKILL), then sends its unit's report.
pub(crate) fn start_reaper<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    events: mpsc::Sender<Event>,
) -> (mpsc::Sender<Reap>, std::thread::ScopedJoinHandle<'scope, ()>) {
    let (tx, rx) = mpsc::channel::<Reap>();
    let thread = std::thread::Builder::new()
        .name("reaper".into())
        .spawn_scoped(scope, move || {
            for mut reap in rx {
                let leaving = Instant::now();
                let exit = shutdown(&mut reap.worker, reap.grace);
                let mut report = reap.report;
                if let Some(phases) = report.phases.as_mut() {
                    phases.exit = Some(leaving.elapsed());
                }
                finish_metrics(&mut report, &reap.worker, Some(exit), reap.begun, reap.before);
                report.gpu = reap.gpu;
                reap.attempts.push(Attempt::of(&report, reap.shared));
                report.attempts = reap.attempts;
                let _ = events.send(Event::Finished(Box::new(report)));
            }
        })
        .expect("spawn a reaper thread");
    (tx, thread)
}
