//! The socket to one worker, driven from the thread that follows its
//! requests. A request is written by that thread itself and the answer read
//! by it as its bytes arrive (`poll`, then a non-blocking read), so a request
//! costs no thread hand-off on the supervisor's side: the sender and reader
//! threads that used to stand in between were two futex wake-ups per request,
//! as long as a small model's whole run on a loaded machine.
//!
//! Nothing here can block the caller on the worker: a read takes only what
//! the socket has and keeps a partial frame for the next call (deadlines are
//! checked between calls), and a request the socket cannot take at once (a
//! large one, or a worker that stopped reading) is finished by a sender
//! thread started for that worker only then, which every later request of
//! that worker then follows, in order. A worker that stops reading stalls
//! only that thread, until it is killed.

use isorun_protocol::WorkerMessage;
use isorun_transport::{decode, wait_readable, FrameError, FrameReader, RequestEnvelope, SendProgress};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Something a worker did, as seen from the supervisor.
#[derive(Debug)]
pub enum Event {
    Message(WorkerMessage),
    /// The worker closed its socket at a frame boundary.
    Closed,
    /// The worker sent something that is not a valid frame.
    Broken(String),
    /// A request could not be delivered.
    SendFailed(String),
}

/// One worker's socket: its frames read as they come, its requests written
/// from the caller's thread (or, once the socket was full, a sender thread's).
pub(crate) struct Connection {
    pid: i32,
    socket: UnixStream,
    frames: FrameReader,
    /// The sender thread, once a request could not go at once.
    sender: Option<mpsc::Sender<(RequestEnvelope, SendProgress)>>,
    /// What the sender thread could not send.
    send_failures: mpsc::Receiver<String>,
    send_failures_tx: mpsc::Sender<String>,
    /// The stream ended (closed or broken): nothing more will be read.
    ended: bool,
    /// How long a wait polls the socket before it sleeps.
    spin: Duration,
}

impl Connection {
    pub(crate) fn new(pid: i32, socket: UnixStream, max_frame: u64) -> Connection {
        let (send_failures_tx, send_failures) = mpsc::channel();
        Connection {
            pid,
            socket,
            frames: FrameReader::new(max_frame),
            sender: None,
            send_failures,
            send_failures_tx,
            ended: false,
            spin: Duration::ZERO,
        }
    }

    /// Each wait for an event first polls the socket for up to `spin`
    /// (busy, without sleeping): an answer that comes within it costs no
    /// wake-up, which on a virtual machine is most of a tiny request's time.
    pub(crate) fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Sends a request: from this thread as far as the socket takes it, the
    /// rest (if any) from the worker's sender thread.
    pub(crate) fn send(&mut self, envelope: RequestEnvelope) -> Result<(), String> {
        let mut progress = SendProgress::default();
        if self.sender.is_none() {
            match envelope.send_without_blocking(&self.socket, &mut progress) {
                Ok(true) => return Ok(()),
                Ok(false) => self.start_sender()?,
                Err(e) => return Err(format!("cannot send to the worker: {e}")),
            }
        }
        let sender = self.sender.as_ref().expect("started above");
        sender.send((envelope, progress)).map_err(|_| "the worker's sender has stopped".to_string())
    }

    fn start_sender(&mut self) -> Result<(), String> {
        let socket = self.socket.try_clone().map_err(|e| format!("cannot send to the worker: {e}"))?;
        let failures = self.send_failures_tx.clone();
        let (tx, queued) = mpsc::channel::<(RequestEnvelope, SendProgress)>();
        thread::Builder::new()
            .name(format!("sender-{}", self.pid))
            .spawn(move || {
                for (envelope, mut progress) in queued {
                    if let Err(e) = envelope.send_rest(&socket, &mut progress) {
                        let _ = failures.send(format!("cannot send to the worker: {e}"));
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start a sender thread: {e}"))?;
        self.sender = Some(tx);
        Ok(())
    }

    /// The next event, waiting at most `timeout` for it.
    pub(crate) fn next_event(&mut self, timeout: Duration) -> Option<Event> {
        if let Ok(reason) = self.send_failures.try_recv() {
            return Some(Event::SendFailed(reason));
        }
        if self.ended {
            // As a closed channel that still waits: only a send failure can come.
            return self.send_failures.recv_timeout(timeout).ok().map(Event::SendFailed);
        }
        let deadline = Instant::now() + timeout;
        let spin_until = Instant::now() + self.spin.min(timeout);
        loop {
            match self.frames.read_available(&self.socket) {
                Ok(Some(payload)) => return Some(message_event(&payload)),
                Ok(None) => {}
                Err(FrameError::Closed) => {
                    self.ended = true;
                    return Some(Event::Closed);
                }
                Err(e) => {
                    self.ended = true;
                    return Some(Event::Broken(e.to_string()));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return self.send_failures.try_recv().ok().map(Event::SendFailed);
            }
            if now < spin_until {
                // Yield rather than spin on: a UNIX socket's wake-up asks the
                // scheduler to run the worker on the waker's CPU, and a
                // caller spinning there would hold it off its own answer.
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
                continue;
            }
            wait_readable(self.socket.as_raw_fd(), deadline - now);
        }
    }
}

/// A whole frame as an event: the message, or why it is none.
fn message_event(payload: &[u8]) -> Event {
    match catch_unwind(AssertUnwindSafe(|| decode::<WorkerMessage>(payload))) {
        Ok(Ok(message)) => Event::Message(message),
        Ok(Err(e)) => Event::Broken(e.to_string()),
        Err(_) => Event::Broken("the message decoder panicked".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{DType, Tensor, ToWorker};
    use isorun_transport::write_frame;
    use std::io::Write;

    fn loaded(unit: u64) -> WorkerMessage {
        WorkerMessage::Loaded { unit, load_ms: 1 }
    }

    #[test]
    fn a_half_frame_waits_no_longer_than_asked_and_frames_come_one_per_call_in_order() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &loaded(1)).unwrap();
        write_frame(&mut bytes, &loaded(2)).unwrap();
        theirs.write_all(&bytes[..bytes.len() - 4]).unwrap();
        assert!(matches!(connection.next_event(Duration::ZERO), Some(Event::Message(m)) if m == loaded(1)));
        let started = Instant::now();
        assert!(connection.next_event(Duration::from_millis(50)).is_none(), "half a frame is no event");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(5), "{waited:?}");
        // The rest arrives while the caller waits: it wakes for it.
        let rest = bytes[bytes.len() - 4..].to_vec();
        let writer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            theirs.write_all(&rest).unwrap();
            theirs
        });
        assert!(matches!(connection.next_event(Duration::from_secs(10)), Some(Event::Message(m)) if m == loaded(2)));
        drop(writer.join().unwrap());
        assert!(matches!(connection.next_event(Duration::from_secs(1)), Some(Event::Closed)));
        // After the end, a wait is still a wait.
        let started = Instant::now();
        assert!(connection.next_event(Duration::from_millis(30)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn garbage_and_undecodable_frames_break_the_connection() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        theirs.write_all(b"ISR1").unwrap();
        theirs.write_all(&4u64.to_le_bytes()).unwrap();
        theirs.write_all(&[0xff; 4]).unwrap();
        assert!(matches!(connection.next_event(Duration::from_secs(1)), Some(Event::Broken(_))));
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        theirs.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(matches!(connection.next_event(Duration::from_secs(1)), Some(Event::Broken(m)) if m.contains("magic")));
    }

    fn big_request(bytes: usize) -> RequestEnvelope {
        let request = isorun_protocol::RunRequest {
            unit: 3,
            model_dir: "/m".into(),
            tags: Vec::new(),
            signature: "serving_default".into(),
            inputs: vec![("x".into(), Tensor::dense(DType::UInt8, vec![bytes as u64], vec![1; bytes]))],
            config: isorun_protocol::SessionConfig::default(),
            load_only: false,
            libraries: Vec::new(),
            sandbox: None,
        };
        RequestEnvelope::new(&ToWorker::Run(request), Vec::new())
    }

    #[test]
    fn a_worker_that_does_not_read_never_blocks_the_caller_and_requests_arrive_in_order() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        // Nobody reads: the first request fills the socket, the rest queue
        // behind it on the sender thread; no call blocks.
        let started = Instant::now();
        for _ in 0..3 {
            connection.send(big_request(1 << 20)).unwrap();
        }
        connection.send(RequestEnvelope::new(&ToWorker::Shutdown, Vec::new())).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(connection.sender.is_some(), "the full socket handed the rest to a sender thread");
        let mut reader = isorun_transport::RequestReader::new(8 << 20);
        for _ in 0..3 {
            let (message, _) = reader.receive(&theirs).unwrap().open().unwrap();
            assert!(matches!(message, ToWorker::Run(r) if r.unit == 3));
        }
        let (message, _) = reader.receive(&theirs).unwrap().open().unwrap();
        assert!(matches!(message, ToWorker::Shutdown));
        // A worker gone mid-request: the sender's failure is an event.
        connection.send(big_request(4 << 20)).unwrap();
        drop(theirs);
        let event = connection.next_event(Duration::from_secs(5));
        assert!(matches!(event, Some(Event::Closed) | Some(Event::SendFailed(_))), "{event:?}");
    }
}
