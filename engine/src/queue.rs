//! The units waiting for a slot, and the batches slots reserve for their
//! spares. A leaf of its own because both ends use it: the executor's slots
//! take batches from it, and whatever makes units ready while the run goes
//! on (the Keras stage, as its exports land in the cache) pushes them in.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The units waiting for a slot, in order. Units may arrive while the run
/// goes on (a Keras file's unit once its export is in the cache); slots wait
/// for more until the queue is closed. A slot may reserve the next batch
/// for a spare ([`UnitQueue::reserve`]); a slot with nothing else to do
/// takes a reserved batch before it waits.
pub(crate) struct UnitQueue {
    state: Mutex<QueueState>,
    arrived: Condvar,
    per_worker: usize,
    /// Units already decided before the run (their inputs do not fit their
    /// signature, see `inputs::decide_early`): never queued.
    decided: Vec<bool>,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<usize>,
    closed: bool,
    /// Batches reserved for spares, not yet claimed by anyone.
    reserved: Vec<Arc<Reservation>>,
}

impl UnitQueue {
    pub(crate) fn new(per_worker: usize) -> UnitQueue {
        UnitQueue {
            state: Mutex::new(QueueState::default()),
            arrived: Condvar::new(),
            per_worker: per_worker.max(1),
            decided: Vec::new(),
        }
    }

    /// Units already decided before the run, which [`push`](Self::push) skips.
    pub(crate) fn with_decided(mut self, decided: Vec<bool>) -> UnitQueue {
        self.decided = decided;
        self
    }

    /// A unit ready to run (unless it was decided before the run).
    pub(crate) fn push(&self, index: usize) {
        if self.decided.get(index).copied().unwrap_or(false) {
            return;
        }
        self.state.lock().expect("queue").ready.push_back(index);
        self.arrived.notify_one();
    }

    /// No unit comes any more.
    pub(crate) fn close(&self) {
        self.state.lock().expect("queue").closed = true;
        self.arrived.notify_all();
    }

    /// The next batch (up to `models_per_worker` units there are now), or
    /// else a batch reserved for another slot's spare (whose slot is busy,
    /// while this one would wait); `None` once the queue is closed and
    /// nothing is left.
    pub(crate) fn next_batch(&self) -> Option<Vec<usize>> {
        let mut state = self.state.lock().expect("queue");
        loop {
            if !state.ready.is_empty() {
                let take = self.per_worker.min(state.ready.len());
                return Some(state.ready.drain(..take).collect());
            }
            state.reserved.retain(|r| !r.claimed());
            if let Some(position) = state.reserved.iter().position(|r| r.claim()) {
                return Some(state.reserved.remove(position).units.clone());
            }
            if state.closed {
                return None;
            }
            state = self.arrived.wait(state).expect("queue");
        }
    }

    /// True when [`next_batch`](Self::next_batch) would wait now: nothing
    /// ready, nothing reserved to take, and more units may come (a Keras
    /// file's unit, while it exports).
    pub(crate) fn would_wait(&self) -> bool {
        let state = self.state.lock().expect("queue");
        state.ready.is_empty() && !state.closed && state.reserved.iter().all(|r| r.claimed())
    }

    /// Takes the next batch for a spare, if units are ready now.
    pub(crate) fn reserve(&self) -> Option<Arc<Reservation>> {
        let mut state = self.state.lock().expect("queue");
        if state.ready.is_empty() {
            return None;
        }
        let take = self.per_worker.min(state.ready.len());
        let reservation = Reservation::new(state.ready.drain(..take).collect());
        state.reserved.retain(|r| !r.claimed());
        state.reserved.push(Arc::clone(&reservation));
        Some(reservation)
    }

    /// Gives back a reservation whose spare could not be forked: its units
    /// go first in line again, unless another slot claimed them meanwhile.
    pub(crate) fn release(&self, reservation: &Reservation) {
        if reservation.claim() {
            let mut state = self.state.lock().expect("queue");
            for &index in reservation.units.iter().rev() {
                state.ready.push_front(index);
            }
            drop(state);
            self.arrived.notify_one();
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::UnitQueue;

    #[test]
    fn the_queue_hands_out_batches_as_units_arrive_and_ends_when_closed() {
        let queue = UnitQueue::new(2);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        assert_eq!(queue.next_batch(), Some(vec![0, 1]));
        assert_eq!(queue.next_batch(), Some(vec![2]));
        std::thread::scope(|scope| {
            // A slot waits for the next unit rather than ending.
            let waiting = scope.spawn(|| (queue.next_batch(), queue.next_batch()));
            std::thread::sleep(std::time::Duration::from_millis(50));
            queue.push(7);
            queue.close();
            assert_eq!(waiting.join().unwrap(), (Some(vec![7]), None));
        });
    }

    #[test]
    fn an_idle_slot_takes_units_reserved_for_a_busy_slots_spare_and_the_spare_loses_them() {
        let queue = UnitQueue::new(1);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        assert_eq!(queue.next_batch(), Some(vec![0]));
        let first = queue.reserve().unwrap();
        let second = queue.reserve().unwrap();
        assert_eq!((first.units.clone(), second.units.clone()), (vec![1], vec![2]));
        assert!(queue.reserve().is_none(), "nothing is left to reserve");
        // The spare's own slot gets to its first reservation...
        assert!(first.claim());
        queue.close();
        // ...while an idle slot takes the second, and its spare's slot finds it gone.
        assert_eq!(queue.next_batch(), Some(vec![2]));
        assert!(!second.claim());
        assert_eq!(queue.next_batch(), None, "every unit was handed out once");
    }

    #[test]
    fn a_released_reservation_goes_first_in_line_again_unless_it_was_taken() {
        let queue = UnitQueue::new(2);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        let reserved = queue.reserve().unwrap();
        assert_eq!(reserved.units, vec![0, 1]);
        queue.release(&reserved);
        assert_eq!(queue.next_batch(), Some(vec![0, 1]));
        let taken = queue.reserve().unwrap();
        assert!(taken.claim());
        queue.release(&taken);
        queue.close();
        assert_eq!(queue.next_batch(), None, "a claimed reservation is not given back");
    }
}
