//! A worker's side of the channel: requests from the socket or, once the
//! supervisor shared one, from the `Mailbox`, and each `Finished` answered
//! the way its request came. Both the worker and the test suite's fault
//! worker serve through it, so the faults a test injects cross the mailbox
//! exactly as a real worker's answers do.

use crate::envelope::{RequestEnvelope, RequestReader};
use crate::frame::{encode, write_frame, FrameError};
use crate::mailbox::{Mailbox, Relax};
use crate::shared::SharedMemory;
use isorun_protocol::WorkerMessage;
use std::io;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How often a worker polling its mailbox also reads the socket (`Shutdown`,
/// a request too large for the mailbox or with regions).
const SOCKET_EVERY: Duration = Duration::from_micros(10);

/// Where a worker's requests come from.
pub struct Inbox {
    reader: RequestReader,
    mailbox: Option<Mailbox>,
    /// The number of the last request taken from the mailbox.
    last: u64,
    /// The mailbox request being served, if the last one came from there.
    serving: Option<u64>,
}

impl Inbox {
    /// Requests from the socket only, until [`Inbox::attach`]; frames over
    /// `max_frame` bytes are refused.
    pub fn new(max_frame: u64) -> Inbox {
        Inbox { reader: RequestReader::new(max_frame), mailbox: None, last: 0, serving: None }
    }

    /// Maps the mailbox a `ToWorker::Mailbox` brought (its one region).
    pub fn attach(&mut self, shared: &[SharedMemory]) -> io::Result<()> {
        let region = shared.first().ok_or_else(|| io::Error::other("Mailbox came without its region"))?;
        self.mailbox = Some(Mailbox::attach(region.fd())?);
        Ok(())
    }

    /// The next request. Polled for up to `budget` (no sleeping): in the
    /// mailbox (memory, no system call) and, now and then, on the socket;
    /// then, after saying so in the mailbox and looking there once more,
    /// waited for on the socket. `Closed` when the supervisor has gone.
    pub fn next(&mut self, socket: &UnixStream, budget: Duration) -> Result<RequestEnvelope, FrameError> {
        self.serving = None;
        let Some(mailbox) = self.mailbox.as_ref() else { return self.reader.receive_spinning(socket, budget) };
        let started = Instant::now();
        let mut relax = Relax::default();
        let mut socket_due = started;
        let taken = loop {
            if let Some(taken) = mailbox.take_request(self.last) {
                break taken;
            }
            let now = Instant::now();
            if now >= socket_due {
                if self.reader.poll(socket)? {
                    return self.reader.receive(socket);
                }
                socket_due = now + SOCKET_EVERY;
            }
            if now.duration_since(started) >= budget {
                mailbox.set_worker_waiting(true);
                let again = mailbox.take_request(self.last);
                if again.is_none() {
                    let received = self.reader.receive(socket);
                    mailbox.set_worker_waiting(false);
                    return received;
                }
                mailbox.set_worker_waiting(false);
                break again.expect("checked above");
            }
            relax.pause(now);
        };
        let (seq, message) = taken;
        self.last = seq;
        self.serving = Some(seq);
        Ok(RequestEnvelope::from_message(message))
    }

    /// Whether the request [`Inbox::next`] gave last came through the mailbox.
    pub fn serving_mailbox(&self) -> bool {
        self.serving.is_some()
    }

    /// Sends `message` to the supervisor: a `Finished` for a request that
    /// came through the mailbox goes back there (and a `Wake` on the socket
    /// if the supervisor said it sleeps); everything else, and an answer too
    /// large for the mailbox, on the socket.
    pub fn send(&self, socket: &mut UnixStream, message: &WorkerMessage) -> io::Result<()> {
        if let (Some(seq), Some(mailbox), WorkerMessage::Finished { .. }) = (self.serving, &self.mailbox, message) {
            match mailbox.post_answer(seq, &encode(message)) {
                Some(true) => return write_frame(socket, &WorkerMessage::Wake),
                Some(false) => return Ok(()),
                None => {}
            }
        }
        write_frame(socket, message)
    }
}
