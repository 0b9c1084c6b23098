//! Scoring beside the worker: a unit's batches are scored (metrics updated,
//! `--output-dir` and `--predictions` rows appended) on a thread of the
//! stream's own, so the slot sends the next batch as soon as one comes
//! back instead of waiting while the supervisor scores it. The queue is
//! bounded ([`QUEUE`] batches), so a slow scorer holds the slot back rather
//! than letting outputs pile up in memory; batches are scored one at a
//! time, in the order sent, so metrics and files are those of scoring them
//! on the slot. A scoring error stops the thread and is given by the next
//! [`Scorer::send`] or by [`Scorer::finish`]: the unit ends with it one
//! batch later at most.

use isorun_protocol::{ErrorKind, ModelError, Outcome};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Batches sent and not yet scored, at most, beside the one being scored.
pub(crate) const QUEUE: usize = 2;

/// What scores a unit's batches, in order, on the scoring thread.
pub(crate) trait Score: Send + 'static {
    /// One batch: its outputs and what they are scored against.
    type Batch: Send + 'static;
    /// Scores one batch; an `Err` ends the unit with that outcome.
    fn score(&mut self, batch: Self::Batch) -> Result<(), Outcome>;
}

/// The scoring thread of one stream, and what it owns once it has ended.
pub(crate) struct Scorer<S: Score> {
    state: State<S>,
}

enum State<S: Score> {
    Running {
        queue: SyncSender<S::Batch>,
        thread: JoinHandle<(S, Option<Outcome>)>,
        failed: Arc<AtomicBool>,
    },
    /// Joined: the scorer back (`None` if its thread panicked) and its error.
    Ended(Option<S>, Option<Outcome>),
    /// Its result taken by [`Scorer::finish`].
    Taken,
}

fn panicked() -> Outcome {
    Outcome::Error(ModelError::new(ErrorKind::Evaluation, "the scoring thread panicked"))
}

impl<S: Score> Scorer<S> {
    /// Starts the thread; `Err` when the system refuses one.
    pub(crate) fn start(mut scorer: S) -> std::io::Result<Scorer<S>> {
        let (queue, batches) = sync_channel::<S::Batch>(QUEUE);
        let failed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&failed);
        let thread = std::thread::Builder::new().name("isorun-score".into()).spawn(move || {
            for batch in batches {
                if let Err(outcome) = scorer.score(batch) {
                    flag.store(true, Ordering::Release);
                    return (scorer, Some(outcome));
                }
            }
            (scorer, None)
        })?;
        Ok(Scorer { state: State::Running { queue, thread, failed } })
    }

    /// Queues one batch and returns, waiting only while the queue is full.
    /// `Err`: an earlier batch could not be scored (its outcome); nothing
    /// more is scored.
    pub(crate) fn send(&mut self, batch: S::Batch) -> Result<(), Outcome> {
        if let State::Running { queue, failed, .. } = &self.state {
            if !failed.load(Ordering::Acquire) && queue.send(batch).is_ok() {
                return Ok(());
            }
        }
        self.join();
        match &self.state {
            State::Ended(_, Some(outcome)) => Err(outcome.clone()),
            State::Ended(None, None) => Err(panicked()),
            _ => Err(Outcome::ProtocolError { message: "a batch sent after the stream ended".into() }),
        }
    }

    /// Waits for every batch sent to be scored (or for the thread to end).
    fn join(&mut self) {
        if let State::Running { .. } = self.state {
            let State::Running { queue, thread, .. } = std::mem::replace(&mut self.state, State::Taken) else {
                unreachable!()
            };
            drop(queue);
            self.state = match thread.join() {
                Ok((scorer, error)) => State::Ended(Some(scorer), error),
                Err(_) => State::Ended(None, Some(panicked())),
            };
        }
    }

    /// Waits for the batches sent to be scored and gives the scorer back
    /// (`None` if its thread panicked) with the error that stopped it, if
    /// any (also one [`send`](Self::send) gave already).
    pub(crate) fn finish(&mut self) -> (Option<S>, Option<Outcome>) {
        self.join();
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Ended(scorer, error) => (scorer, error),
            _ => (None, Some(Outcome::ProtocolError { message: "the stream was finished twice".into() })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// Scores a number per batch once the test lets it (one token a batch),
    /// keeping the numbers in order; a negative number cannot be scored.
    struct Gated {
        tokens: Receiver<()>,
        scored: Vec<i64>,
    }

    impl Score for Gated {
        type Batch = i64;
        fn score(&mut self, batch: i64) -> Result<(), Outcome> {
            self.tokens.recv().expect("the test lets each batch be scored");
            if batch < 0 {
                return Err(Outcome::Error(ModelError::new(ErrorKind::Evaluation, format!("batch {batch}"))));
            }
            self.scored.push(batch);
            Ok(())
        }
    }

    fn gated() -> (Scorer<Gated>, Sender<()>) {
        let (let_go, tokens) = channel();
        (Scorer::start(Gated { tokens, scored: Vec::new() }).unwrap(), let_go)
    }

    #[test]
    fn send_returns_before_the_batch_is_scored_and_order_is_kept() {
        let (mut scorer, let_go) = gated();
        // Nothing can be scored yet: the first batch waits on the scoring
        // thread, two more in the queue, and every send has returned.
        for batch in 0..=QUEUE as i64 {
            scorer.send(batch).unwrap();
        }
        for _ in 0..=QUEUE {
            let_go.send(()).unwrap();
        }
        scorer.send(3).unwrap();
        let_go.send(()).unwrap();
        let (scored, error) = scorer.finish();
        assert_eq!(error, None);
        assert_eq!(scored.unwrap().scored, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_scoring_error_is_given_by_a_later_send_and_by_finish() {
        let (mut scorer, let_go) = gated();
        scorer.send(0).unwrap();
        scorer.send(-1).unwrap();
        let_go.send(()).unwrap();
        let_go.send(()).unwrap();
        // The thread ends at the error; a later send may be queued before
        // it does, but not two more than the queue holds.
        let error = (2..).find_map(|batch| scorer.send(batch).err()).unwrap();
        let expected = Outcome::Error(ModelError::new(ErrorKind::Evaluation, "batch -1"));
        assert_eq!(error, expected);
        let (scored, error) = scorer.finish();
        assert_eq!(error, Some(expected));
        assert_eq!(scored.unwrap().scored, vec![0]);
    }

    #[test]
    fn finish_gives_an_error_no_send_saw() {
        let (mut scorer, let_go) = gated();
        scorer.send(-7).unwrap();
        let_go.send(()).unwrap();
        let (scored, error) = scorer.finish();
        assert_eq!(error, Some(Outcome::Error(ModelError::new(ErrorKind::Evaluation, "batch -7"))));
        assert!(scored.unwrap().scored.is_empty());
    }
}
