//! Frames come from workers, which may be broken or hostile: any bytes
//! decode to messages or to an error; never a panic, an abort or an
//! allocation the bytes do not pay for. A decoded message encodes back to
//! itself.

#![no_main]

mod common;

use isorun_protocol::WorkerMessage;
use isorun_transport::{decode, encode, read_frame, DEFAULT_MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fn round_trip(message: &WorkerMessage) {
    let again: WorkerMessage = decode(&encode(message)).expect("a message decodes from its own encoding");
    assert_eq!(&again, message);
}

fuzz_target!(|data: &[u8]| common::bounded("frame", data, || run(data)));

fn run(data: &[u8]) {
    // A stream of frames, as the supervisor reads it: until the first error.
    let mut stream = data;
    while let Ok(message) = read_frame::<WorkerMessage>(&mut stream, DEFAULT_MAX_FRAME) {
        round_trip(&message);
    }
    // And the bytes as one frame's payload.
    if let Ok(message) = decode::<WorkerMessage>(data) {
        round_trip(&message);
    }
}
