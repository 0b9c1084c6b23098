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

use isorun_protocol::{ToWorker, WorkerMessage};
use isorun_transport::{decode, wait_readable, FrameError, FrameReader, Mailbox, RequestEnvelope, SendProgress};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Something a worker did, as seen from the supervisor: what the engine
/// reads off one worker, not the [`crate::Event`] it tells its caller.
#[derive(Debug)]
pub enum WorkerEvent {
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
    /// The mailbox shared with the worker (`pipe`), once sent to it.
    mailbox: Option<Mailbox>,
    /// The next request may go through the mailbox: the caller knows that
    /// no other request is on its way.
    mailbox_allowed: bool,
    /// The number of the last request posted there, and whether its answer
    /// is still to come.
    mailbox_seq: u64,
    mailbox_pending: bool,
    /// The socket's end, found while reading what came before a mailbox
    /// answer: reported after that answer.
    ended_after_answer: Option<WorkerEvent>,
    /// `Wake`s since the last request posted: an honest worker sends at most
    /// one for each, so more are a worker flooding the socket to keep the
    /// caller reading (and off its deadlines).
    wakes: u32,
}

/// `Wake`s a worker may send for one posted request before its stream
/// counts as broken.
const WAKES_PER_REQUEST: u32 = 2;

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
            mailbox: None,
            mailbox_allowed: false,
            mailbox_seq: 0,
            mailbox_pending: false,
            ended_after_answer: None,
            wakes: 0,
        }
    }

    /// Shares `mailbox` with the worker: sends it (the worker maps it and
    /// says so in it). Requests go there only once the worker has.
    pub(crate) fn set_mailbox(&mut self, mailbox: Mailbox) -> Result<(), String> {
        let region = mailbox
            .fd()
            .try_clone_to_owned()
            .and_then(isorun_transport::SharedMemory::from_fd)
            .map_err(|e| format!("cannot share a mailbox with the worker: {e}"))?;
        self.send(RequestEnvelope::new(&ToWorker::Mailbox, vec![region]))?;
        self.mailbox = Some(mailbox);
        Ok(())
    }

    /// The next request may go through the mailbox, if it fits there: the
    /// caller sends it when the worker has answered every request before it.
    pub(crate) fn allow_mailbox_once(&mut self) {
        self.mailbox_allowed = true;
    }

    /// Posts the request in the mailbox where it may go: whether it went.
    fn post(&mut self, envelope: &RequestEnvelope) -> Result<bool, String> {
        let allowed = std::mem::take(&mut self.mailbox_allowed);
        let Some(mailbox) = self.mailbox.as_ref() else { return Ok(false) };
        let Some(message) = envelope.message_alone() else { return Ok(false) };
        if !allowed || self.sender.is_some() || self.mailbox_pending || !mailbox.worker_attached() {
            return Ok(false);
        }
        let seq = self.mailbox_seq + 1;
        let Some(worker_sleeps) = mailbox.post_request(seq, message) else { return Ok(false) };
        self.mailbox_seq = seq;
        self.mailbox_pending = true;
        self.wakes = 0;
        if worker_sleeps {
            self.send(RequestEnvelope::new(&ToWorker::Wake, Vec::new()))?;
        }
        Ok(true)
    }

    /// The answer in the mailbox, if it has come. Frames the worker wrote on
    /// the socket before it posted (`Loaded`) come first: the answer then
    /// stays posted for the next call.
    fn mailbox_answer(&mut self) -> Option<WorkerEvent> {
        if !self.mailbox_pending {
            return None;
        }
        let answer = self.mailbox.as_ref()?.take_answer(self.mailbox_seq)?;
        while !self.ended {
            match self.frames.read_available(&self.socket) {
                Ok(Some(payload)) => match self.socket_event(&payload) {
                    // Bounded: past its budget a `Wake` is a broken stream.
                    None => {}
                    Some(event) => return Some(event),
                },
                Ok(None) => break,
                // The worker ended after it answered: the answer first.
                Err(FrameError::Closed) => {
                    self.ended = true;
                    self.ended_after_answer = Some(WorkerEvent::Closed);
                }
                // Garbage before the answer: the stream is broken, whatever the mailbox holds.
                Err(e) => {
                    self.ended = true;
                    return Some(WorkerEvent::Broken(e.to_string()));
                }
            }
        }
        self.mailbox_pending = false;
        Some(message_event(&answer))
    }

    /// A frame from the socket as an event; `None` for a `Wake` within its
    /// budget (the answer it announces is in the mailbox). A `Finished` here
    /// (an answer too large for the mailbox, or a worker answering twice)
    /// ends the wait on the mailbox: the first answer from either side wins.
    fn socket_event(&mut self, payload: &[u8]) -> Option<WorkerEvent> {
        match message_event(payload) {
            WorkerEvent::Message(WorkerMessage::Wake) => {
                self.wakes += 1;
                (self.wakes > WAKES_PER_REQUEST).then(|| {
                    self.ended = true;
                    WorkerEvent::Broken(format!("{} Wake messages for one request", self.wakes))
                })
            }
            event => {
                if matches!(event, WorkerEvent::Message(WorkerMessage::Finished { .. })) {
                    self.mailbox_pending = false;
                }
                Some(event)
            }
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
        if self.post(&envelope)? {
            return Ok(());
        }
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
    pub(crate) fn next_event(&mut self, timeout: Duration) -> Option<WorkerEvent> {
        if let Some(event) = self.ended_after_answer.take() {
            return Some(event);
        }
        if let Ok(reason) = self.send_failures.try_recv() {
            return Some(WorkerEvent::SendFailed(reason));
        }
        if let Some(event) = self.mailbox_answer() {
            return Some(event);
        }
        if self.ended {
            // As a closed channel that still waits: only a send failure can come.
            return self.send_failures.recv_timeout(timeout).ok().map(WorkerEvent::SendFailed);
        }
        let deadline = Instant::now() + timeout;
        let spin_until = Instant::now() + self.spin.min(timeout);
        let mut relax = isorun_transport::Relax::default();
        loop {
            if let Some(event) = self.mailbox_answer() {
                return Some(event);
            }
            // While an answer is due in the mailbox, polling reads memory
            // only; the socket is read once the poll is over.
            let now = Instant::now();
            if self.mailbox_pending && now < spin_until {
                relax.pause(now);
                continue;
            }
            match self.frames.read_available(&self.socket) {
                Ok(Some(payload)) => match self.socket_event(&payload) {
                    // The worker's `Wake`: its answer is in the mailbox.
                    None => continue,
                    Some(event) => return Some(event),
                },
                Ok(None) => {}
                Err(FrameError::Closed) => {
                    self.ended = true;
                    return Some(WorkerEvent::Closed);
                }
                Err(e) => {
                    self.ended = true;
                    return Some(WorkerEvent::Broken(e.to_string()));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return self.send_failures.try_recv().ok().map(WorkerEvent::SendFailed);
            }
            if now < spin_until {
                // Yield rather than spin on: a UNIX socket's wake-up asks the
                // scheduler to run the worker on the waker's CPU, and a
                // caller spinning there would hold it off its own answer.
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
                continue;
            }
            match self.mailbox.as_ref().filter(|_| self.mailbox_pending) {
                // Say so before sleeping, then look once more: a worker that
                // posts after this sends a `Wake`. A worker that does not
                // (it is untrusted) costs only the rest of this wait.
                Some(mailbox) => {
                    mailbox.set_supervisor_waiting(true);
                    if !mailbox.answer_ready(self.mailbox_seq) {
                        wait_readable(self.socket.as_raw_fd(), deadline - now);
                    }
                    mailbox.set_supervisor_waiting(false);
                }
                None => {
                    wait_readable(self.socket.as_raw_fd(), deadline - now);
                }
            }
        }
    }
}

/// A whole frame as an event: the message, or why it is none.
fn message_event(payload: &[u8]) -> WorkerEvent {
    match catch_unwind(AssertUnwindSafe(|| decode::<WorkerMessage>(payload))) {
        Ok(Ok(message)) => WorkerEvent::Message(message),
        Ok(Err(e)) => WorkerEvent::Broken(e.to_string()),
        Err(_) => WorkerEvent::Broken("the message decoder panicked".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{DType, Tensor, ToWorker};
    use isorun_transport::write_frame;
    use std::io::Write;

    fn loaded(unit: u64) -> WorkerMessage {
        WorkerMessage::Loaded { unit, load_ms: 1, onnx: None }
    }

    #[test]
    fn a_half_frame_waits_no_longer_than_asked_and_frames_come_one_per_call_in_order() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &loaded(1)).unwrap();
        write_frame(&mut bytes, &loaded(2)).unwrap();
        theirs.write_all(&bytes[..bytes.len() - 4]).unwrap();
        assert!(matches!(connection.next_event(Duration::ZERO), Some(WorkerEvent::Message(m)) if m == loaded(1)));
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
        assert!(
            matches!(connection.next_event(Duration::from_secs(10)), Some(WorkerEvent::Message(m)) if m == loaded(2))
        );
        drop(writer.join().unwrap());
        assert!(matches!(connection.next_event(Duration::from_secs(1)), Some(WorkerEvent::Closed)));
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
        assert!(matches!(connection.next_event(Duration::from_secs(1)), Some(WorkerEvent::Broken(_))));
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        theirs.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(
            matches!(connection.next_event(Duration::from_secs(1)), Some(WorkerEvent::Broken(m)) if m.contains("magic"))
        );
    }

    trait WithUnit {
        fn with_unit(self, unit: u64) -> RequestEnvelope;
    }

    impl WithUnit for RequestEnvelope {
        /// The same request, numbered `unit`.
        fn with_unit(self, unit: u64) -> RequestEnvelope {
            let (message, shared) = self.open().unwrap();
            let ToWorker::Run(mut run) = message else { panic!("a Run") };
            run.unit = unit;
            RequestEnvelope::new(&ToWorker::Run(run), shared)
        }
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
            runtime: isorun_protocol::Runtime::TensorFlow,
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
        assert!(matches!(event, Some(WorkerEvent::Closed) | Some(WorkerEvent::SendFailed(_))), "{event:?}");
    }

    /// Neither side polls (`spin` 0): each says in the mailbox that it
    /// sleeps on the socket, so the other, after posting, sends a `Wake`
    /// there. A lost wake-up would leave the supervisor waiting out its
    /// whole 20 s; the answer comes at once instead, from the mailbox.
    #[test]
    fn a_side_asleep_on_the_socket_is_woken_for_what_the_other_posted() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut connection = Connection::new(0, ours, 1 << 20);
        connection.set_mailbox(Mailbox::create().unwrap()).unwrap();
        let worker = thread::spawn(move || {
            let mut inbox = isorun_transport::Inbox::new(1 << 20);
            let mut via_mailbox = Vec::new();
            loop {
                let (message, shared) = inbox.next(&theirs, Duration::ZERO).unwrap().open().unwrap();
                match message {
                    ToWorker::Mailbox => inbox.attach(&shared).unwrap(),
                    ToWorker::Wake => {}
                    ToWorker::Run(run) => {
                        via_mailbox.push(inbox.serving_mailbox());
                        // Long enough for the supervisor to go to sleep first.
                        thread::sleep(Duration::from_millis(50));
                        let finished = WorkerMessage::Finished {
                            unit: run.unit,
                            run_us: 1,
                            result: isorun_protocol::UnitResult::Ok { outputs: Vec::new() },
                        };
                        inbox.send(&mut theirs, &finished).unwrap();
                    }
                    _ => return via_mailbox,
                }
            }
        });
        // The worker maps the mailbox before the first request can go there.
        thread::sleep(Duration::from_millis(200));
        for unit in 1..=3 {
            // Sent while the worker sleeps on the socket: it needs a `Wake`.
            thread::sleep(Duration::from_millis(20));
            connection.allow_mailbox_once();
            connection.send(big_request(16).with_unit(unit)).unwrap();
            let started = Instant::now();
            let event = connection.next_event(Duration::from_secs(20));
            assert!(
                matches!(&event, Some(WorkerEvent::Message(WorkerMessage::Finished { unit: u, .. })) if *u == unit),
                "{event:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(10), "woken, not timed out: {:?}", started.elapsed());
        }
        connection.send(RequestEnvelope::new(&ToWorker::Shutdown, Vec::new())).unwrap();
        assert_eq!(worker.join().unwrap(), [true, true, true], "every request went through the mailbox");
    }
}
